#!/usr/bin/env bash
# One step of the CUDA build benchmark of docs/building.md ("NVIDIA apex on CUDA"): upstream NVIDIA apex's own
# command against `apexkit build --backend cuda`, on the same sources, torch and toolkit. Each step is one process to
# time from outside (/usr/bin/time -v bench/cuda_build_bench.sh ARM STEP): the steps leave the state the next needs.
#
#   bench/cuda_build_bench.sh setup                # once: the work folder, a venv for upstream's command, a source copy
#   bench/cuda_build_bench.sh ARM cold             # ARM: upstream | apexkit; no objects, no wheel cache
#   bench/cuda_build_bench.sh ARM change           # after cold: one .cu file changed (a comment line appended)
#   bench/cuda_build_bench.sh ARM noop             # after change: nothing changed
#   bench/cuda_build_bench.sh ARM kill SECONDS     # a cold build killed after SECONDS (not a figure: sets up resume)
#   bench/cuda_build_bench.sh ARM resume           # after kill: the same build run again to the end
#
# Environment: BENCH_DIR (work folder, default /tmp/apex-cuda-bench), APEX_GIT (NVIDIA apex, a git URL or path;
# default https://github.com/NVIDIA/apex.git), APEX_REF (master), PYTHON (python3.11), TORCH (2.14.1),
# ARCH (9.0: TORCH_CUDA_ARCH_LIST of both arms), CUDA_HOME (/usr/local/cuda).
# Upstream's command, from its README: APEX_CPP_EXT=1 APEX_CUDA_EXT=1 pip install -v --no-build-isolation .
# With a toolkit that lacks the math libraries (nvcc 13.0 alone) it stops at torch's `#include <cusparse.h>`;
# UPSTREAM_CPATH=1 adds the fix a user finds by hand: CPATH=the venv's nvidia/*/include (what apexkit sets itself).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
work=${BENCH_DIR:-/tmp/apex-cuda-bench}
git_url=${APEX_GIT:-https://github.com/NVIDIA/apex.git}
ref=${APEX_REF:-master}
python=${PYTHON:-python3.11}
torch=${TORCH:-2.14.1}
arch=${ARCH:-9.0}
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
kernel=csrc/multi_tensor_scale_kernel.cu

usage() { echo "usage: $0 setup | {upstream|apexkit} {cold|change|noop|kill SECONDS|resume}" >&2; exit 2; }

change_kernel() {  # $1: a checkout; one line appended to one kernel, committed
  echo "// bench: changed $(date +%s%N)" >> "$1/$kernel"
  git -C "$1" -c user.name=bench -c user.email=bench@example.invalid commit -qam "bench: change one kernel"
}

upstream() {  # upstream's own command in its own checkout (pip >= 21.3 builds in the tree: build/ stays there)
  cd "$work/upstream-src"
  if [ "${UPSTREAM_CPATH:-0}" = 1 ]; then
    CPATH=$(printf '%s:' "$work"/upstream-venv/lib/python*/site-packages/nvidia/*/include)
    export CPATH=${CPATH%:}
  fi
  TORCH_CUDA_ARCH_LIST=$arch APEX_CPP_EXT=1 APEX_CUDA_EXT=1 \
    "$work/upstream-venv/bin/pip" install -v --no-build-isolation . >> "$work/upstream.log" 2>&1
}

apexkit() {  # $@: more build options
  APEXKIT_CACHE_DIR=$work/cache "$here/.venv/bin/python" -m apexkit build "${python#python}" --backend cuda \
    --cuda-arch "$arch" --torch "$torch" --apex-ref "$ref" --nvidia-apex-url "file://$work/apexkit-src" \
    --dist "$work/dist" --build-dir "$work/build" --force "$@" >> "$work/apexkit.log" 2>&1
}

fresh() {  # $1: arm; no objects and no wheel for it
  case $1 in
    upstream) rm -rf "$work/upstream-src/build" "$work/upstream-src/"*.egg-info ;;
    apexkit) rm -rf "$work/build" "$work/dist" "$work/cache/wheels" ;;
  esac
}

step=${2:-}
case ${1:-} in
  setup)
    mkdir -p "$work"
    for side in upstream-src apexkit-src; do
      [ -d "$work/$side/.git" ] || git clone -q --branch "$ref" "$git_url" "$work/$side"
    done
    [ -x "$work/upstream-venv/bin/pip" ] || "$python" -m venv "$work/upstream-venv"
    "$work/upstream-venv/bin/pip" install -q "torch==$torch" setuptools wheel ninja packaging
    fresh apexkit
    apexkit --no-smoke-test --dry-run  # the plan, and the apexkit build venv made on the first cold run
    ;;
  upstream|apexkit)
    arm=$1
    case $step in
      cold) fresh "$arm"; if [ "$arm" = upstream ]; then upstream; else apexkit; fi ;;
      change) change_kernel "$work/$arm-src"; if [ "$arm" = upstream ]; then upstream; else apexkit; fi ;;
      noop|resume) if [ "$arm" = upstream ]; then upstream; else apexkit; fi ;;
      kill)
        seconds=${3:?kill needs SECONDS}
        fresh "$arm"
        setsid "$0" "$arm" resume &  # its own session: the kill reaches pip, setup.py, ninja and every nvcc
        pid=$!
        sleep "$seconds"
        kill -KILL -- "-$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
        ;;
      *) usage ;;
    esac
    ;;
  *) usage ;;
esac
