#!/usr/bin/env bash
# The CUDA table of docs/bench.md, in one run (a few minutes on an H100/H200): mlp, qwen3-block and qwen3-moe at
# scale 1 (qwen3-moe = one Qwen3-30B-A3B layer at seq 4096), fp32 / apex-O1 / apex-O2 / autocast-fp16 /
# autocast-bf16 / pure bf16, and the optimizer arms torch AdamW vs torch's fused AdamW vs NVIDIA apex's FusedAdam.
# The apex arms need the NVIDIA apex wheel in the venv (apexkit build 3.11 --backend cuda, then
# pip install torch==2.14.1 dist/<target>/apex-*.whl); without it they are rows saying so. MFU is against
# device_peaks.json (A100/H100/H200) or, on another GPU, against a GEMM sweep measured at the start.
#
#   PYTHON=/path/to/venv/bin/python bench/cuda_table.sh [OUT_DIR]     # venv: a CUDA build of torch + matplotlib
#
# Then paste OUT_DIR/results.md and OUT_DIR/gpu.txt into docs/bench.md ("CUDA").
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-cuda-table}
python=${PYTHON:-python3}
"$python" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else
  f"error: torch {torch.__version__} sees no CUDA device; run on a GPU host with a CUDA build of torch")'
mkdir -p "$out"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
fi
exec "$python" "$here/amp_bench.py" --device cuda --model all --scale 1 \
  --modes fp32,apex-O1,apex-O2,autocast-fp16,autocast-bf16,bf16 \
  --optimizers torch-adamw,torch-adamw-fused,apex-fused-adam \
  --warmup 3 --repeats 5 --steps 5 --out "$out"
