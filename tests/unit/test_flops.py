"""bench/flops.py, the FLOPs convention of the MoE benchmark, against a hand computation and MindSpeed-LLM's figure;
bench/device_peaks.json's sources. The benchmark's runs are in tests/e2e/test_bench_moe.py."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from conftest import ROOT

BENCH = ROOT / "bench"


def load_flops():
    spec = importlib.util.spec_from_file_location("bench_flops", BENCH / "flops.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SMALL = {
    "batch": 3,
    "seq": 10,
    "hidden": 64,
    "heads": 4,
    "kv_heads": 2,
    "head_dim": 16,
    "experts": 8,
    "top_k": 2,
    "expert_width": 32,
    "vocab": 100,
}


def test_flops_convention_matches_a_hand_computation():
    flops = load_flops()
    # activated matmul weights per token:
    #   q 64*64 + k 64*32 + v 64*32 + o 64*64 = 12288; router 64*8 = 512;
    #   2 experts x (gate + up + down) = 2 * 3 * 64*32 = 12288; LM head 64*100 = 6400 -> 31488
    assert flops.activated_params("qwen3-moe", SMALL) == 31488
    # 6 x 31488 + attention 12 x heads 4 x head_dim 16 x seq 10 (causal not halved) = 188928 + 7680
    assert flops.flops_per_token("qwen3-moe", SMALL) == 196608
    assert flops.flops_per_step("qwen3-moe", SMALL) == 196608 * 3 * 10  # batch x seq tokens
    # the dense block: the same attention + SwiGLU 3 * 64 * 96 + LM head
    dense = dict(SMALL, intermediate=96)
    assert flops.flops_per_token("qwen3-block", dense) == 6 * (12288 + 3 * 64 * 96 + 6400) + 7680
    # mlp: 6 x sum(in x out) per sample, biases not counted
    mlp = {"batch": 4, "in_features": 8, "hidden": 16, "layers": 2, "classes": 5}
    assert flops.flops_per_step("mlp", mlp) == 6 * (8 * 16 + 16 * 16 + 16 * 5) * 4
    assert flops.mfu(1000, 0.5, 4000.0) == 0.5 and flops.mfu(1000, 0.5, None) is None


def test_flops_convention_reproduces_mindspeeds_figure_for_qwen3_30b_a3b():
    """48 layers at the real shape, seq 4096, the embedding counted as MindSpeed-LLM does: about 2.98e10 per token
    (reference/FIELD.md); the bench's own convention leaves the embedding lookup out."""
    flops = load_flops()
    real = {
        "batch": 1,
        "seq": 4096,
        "hidden": 2048,
        "heads": 32,
        "kv_heads": 4,
        "head_dim": 128,
        "experts": 128,
        "top_k": 8,
        "expert_width": 768,
        "vocab": 151936,
    }
    per_token = flops.flops_per_token("qwen3-moe", real, count_embedding=True, layers=48)
    assert abs(per_token / 2.98e10 - 1) < 0.005
    assert flops.flops_per_token("qwen3-moe", real, layers=48) == per_token - 6 * 2048 * 151936


def test_every_peak_in_the_table_has_a_source():
    table = json.loads((Path(BENCH) / "device_peaks.json").read_text())
    for entry in table["devices"]:
        assert entry["match"] and entry["source"] and entry["peaks"]
        assert all(value > 1e12 for value in entry["peaks"].values())
