"""Model FLOPs per training step, by one stated convention, and MFU. Standard library only (no torch), so the
convention can be checked by hand without a device.

Convention (the one MindSpeed-LLM's Qwen3-MoE estimator uses, `mindspeed_llm/fsdp2/utils/flops/qwen3_flops.py`,
read 2026-11-30 via docs/bench.md):
- a matmul with a weight of N parameters costs 2 N FLOPs per token forward and 4 N backward: 6 N per token a step;
- only *activated* weights count: for a mixture of experts, top_k experts' SwiGLU weights and the router;
- the LM head counts (it is a matmul); the embedding does not (a lookup) -- MindSpeed's published figure
  counts it as 6 x vocab x hidden too, so `count_embedding=True` reproduces theirs;
- attention scores: QK^T and AV cost 2 x 2 x seq x heads x head_dim per token forward, x 3 for a step:
  12 x heads x head_dim x seq per token and layer, NOT halved for the causal mask (the kernels may skip the
  masked half; the convention does not), so MFU here compares with MindSpeed's;
- norms, rotary, softmax, activation functions and the loss are not counted; recompute is not counted.
"""

from __future__ import annotations

CONVENTION = (
    "6 x activated matmul parameters x tokens (LM head counted, embedding not) + attention "
    "12 x heads x head_dim x seq per token and layer (causal not halved); norms/softmax/rotary not counted"
)


def attention_params(hidden: int, heads: int, kv_heads: int, head_dim: int, **_) -> int:
    """q, k, v, o projection weights (no biases, as in Qwen3)."""
    return hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim + heads * head_dim * hidden


def activated_params(name: str, sizes: dict, count_embedding: bool = False, layers: int = 1) -> int:
    """Matmul parameters one token passes through in a forward, for the benchmark's models."""
    if name == "mlp":
        dims = [sizes["in_features"]] + [sizes["hidden"]] * sizes["layers"] + [sizes["classes"]]
        return sum(a * b for a, b in zip(dims, dims[1:]))
    head = sizes["hidden"] * sizes["vocab"] * (2 if count_embedding else 1)
    if name == "qwen3-block":
        mlp = 3 * sizes["hidden"] * sizes["intermediate"]
        return layers * (attention_params(**sizes) + mlp) + head
    if name == "qwen3-moe":
        router = sizes["hidden"] * sizes["experts"]
        experts = sizes["top_k"] * 3 * sizes["hidden"] * sizes["expert_width"]
        return layers * (attention_params(**sizes) + router + experts) + head
    raise ValueError(f"no FLOPs convention for model {name!r}")


def flops_per_token(name: str, sizes: dict, count_embedding: bool = False, layers: int = 1) -> int:
    dense = 6 * activated_params(name, sizes, count_embedding, layers)
    if name == "mlp":
        return dense
    return dense + layers * 12 * sizes["heads"] * sizes["head_dim"] * sizes["seq"]


def flops_per_step(name: str, sizes: dict) -> int:
    """Model FLOPs of one optimizer step on one process's batch (samples for mlp, batch x seq tokens otherwise)."""
    tokens = sizes["batch"] * (1 if name == "mlp" else sizes["seq"])
    return flops_per_token(name, sizes) * tokens


def mfu(flops: int, step_seconds: float, peak: float | None) -> float | None:
    """Achieved FLOP/s over the peak, as a fraction."""
    if not peak or step_seconds <= 0:
        return None
    return flops / step_seconds / peak
