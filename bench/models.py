"""The benchmark's models: the seed's MLP, a decoder block shaped like Qwen3 (GQA attention, RMSNorm, SwiGLU) and
one decoder layer shaped like Qwen3-30B-A3B (the same attention + a top-k router over SwiGLU experts).

Sizes scale with `scale` so one script fits a 2-core CPU (scale 0.25) and an accelerator (scale 4). Standard
library + torch only.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F


def _round(value: float, multiple: int) -> int:
    return max(multiple, round(value / multiple) * multiple)


def mlp_sizes(scale: float) -> dict:
    return {
        "batch": _round(256 * scale, 8),
        "in_features": 1024,
        "hidden": _round(4096 * scale, 64),
        "layers": 3,
        "classes": 1000,
    }


def qwen3_sizes(scale: float) -> dict:
    heads = max(2, _round(16 * scale, 2))
    kv_heads = max(
        1, heads // 4
    )  # grouped-query attention: 4 query heads share one KV head, as in Qwen3
    head_dim = 128 if scale >= 1 else 64
    hidden = heads * head_dim
    return {
        "batch": max(1, _round(8 * scale, 1)),
        "seq": _round(512 * min(scale, 1.0), 16),
        "hidden": hidden,
        "heads": heads,
        "kv_heads": kv_heads,
        "head_dim": head_dim,
        "intermediate": _round(hidden * 3, 64),
        "vocab": _round(8192 * scale, 64),
    }


def moe_sizes(scale: float) -> dict:
    """Qwen3-30B-A3B's layer at scale 1 (hidden 2048, 32 query heads x 128, 4 KV heads, 128 experts of width 768,
    top-8, vocabulary 151,936, sequence 4096 as in MindSpeed-LLM's recipe); smaller scales shrink every width."""
    heads = max(2, _round(32 * scale, 2))
    experts = max(4, _round(128 * scale, 4))
    return {
        "batch": max(1, round(scale)),
        "seq": _round(4096 * min(scale, 1.0), 16),
        "hidden": _round(2048 * scale, 64),
        "heads": heads,
        "kv_heads": max(1, heads // 8),
        "head_dim": 128 if scale >= 1 else 64,
        "experts": experts,
        "top_k": min(experts, max(2, round(8 * min(scale, 1.0)))),
        "expert_width": _round(768 * scale, 32),
        "vocab": _round(151936 * scale, 64),
        "aux_loss_coef": 0.001,
    }


class MLP(nn.Module):
    def __init__(self, in_features: int, hidden: int, layers: int, classes: int, **_: int) -> None:
        super().__init__()
        dims = [in_features] + [hidden] * layers
        self.body = nn.Sequential(
            *[m for a, b in zip(dims, dims[1:]) for m in (nn.Linear(a, b), nn.GELU())]
        )
        self.head = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(variance + self.eps)).to(x.dtype) * self.weight


def rotary(x: torch.Tensor, base: float = 1_000_000.0) -> torch.Tensor:
    """Rotary position embedding over the last dimension (Qwen3 uses theta 1e6)."""
    seq, dim = x.shape[-2], x.shape[-1]
    inv = 1.0 / (base ** (torch.arange(0, dim, 2, device=x.device, dtype=torch.float32) / dim))
    angles = torch.outer(torch.arange(seq, device=x.device, dtype=torch.float32), inv)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(d) + causal mask) v, in one dtype.

    The q/k RMSNorms return float32 (their weight is float32), v comes from a Linear in the autocast dtype. CPU
    autocast in torch 2.13 casts scaled_dot_product_attention's inputs to one dtype itself; in torch 2.1 it does
    not, and the kernel refuses mixed dtypes (measured). Casting q and k to v's dtype does what the newer one does.
    """
    q, k = q.to(v.dtype), k.to(v.dtype)
    sdpa = getattr(F, "scaled_dot_product_attention", None)  # torch >= 2.0
    if sdpa is not None:
        return sdpa(q, k, v, is_causal=True)
    seq = q.shape[-2]
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    mask = torch.ones(seq, seq, dtype=torch.bool, device=q.device).triu(1)
    return torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1) @ v


class Qwen3Block(nn.Module):
    """One decoder layer shaped like Qwen3's (pre-norm GQA attention with q/k RMSNorm, SwiGLU MLP) + an LM head."""

    def __init__(
        self,
        hidden: int,
        heads: int,
        kv_heads: int,
        head_dim: int,
        intermediate: int,
        vocab: int,
        **_: int,
    ) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.embed = nn.Embedding(vocab, hidden)
        self.input_norm = RMSNorm(hidden)
        self.q = nn.Linear(hidden, heads * head_dim, bias=False)
        self.k = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.v = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.o = nn.Linear(heads * head_dim, hidden, bias=False)
        self.q_norm, self.k_norm = RMSNorm(head_dim), RMSNorm(head_dim)
        self.post_norm = RMSNorm(hidden)
        self.gate = nn.Linear(hidden, intermediate, bias=False)
        self.up = nn.Linear(hidden, intermediate, bias=False)
        self.down = nn.Linear(intermediate, hidden, bias=False)
        self.final_norm = RMSNorm(hidden)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        batch, seq = tokens.shape
        x = self.embed(tokens)
        h = self.input_norm(x)
        q = self.q_norm(self.q(h).view(batch, seq, self.heads, self.head_dim)).transpose(1, 2)
        k = self.k_norm(self.k(h).view(batch, seq, self.kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v(h).view(batch, seq, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = rotary(q), rotary(k)
        group = self.heads // self.kv_heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        attn = causal_attention(q, k, v)
        x = x + self.o(attn.transpose(1, 2).reshape(batch, seq, self.heads * self.head_dim))
        h = self.post_norm(x)
        x = x + self.down(F.silu(self.gate(h)) * self.up(h))
        return self.lm_head(self.final_norm(x))


class Qwen3MoELayer(nn.Module):
    """One Qwen3-MoE decoder layer + embedding and LM head: GQA attention with q/k RMSNorm and rotary, a router
    (softmax over E experts, top-k, weights renormalised as norm_topk_prob=True), SwiGLU experts, and the
    Switch-style load-balancing loss E * sum_e(fraction of tokens routed to e * mean router probability of e).

    After each forward `aux_loss` holds that loss and `expert_counts` the tokens per expert (top-k slots).
    """

    def __init__(
        self,
        hidden: int,
        heads: int,
        kv_heads: int,
        head_dim: int,
        experts: int,
        top_k: int,
        expert_width: int,
        vocab: int,
        **_,
    ) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim, self.top_k = heads, kv_heads, head_dim, top_k
        self.embed = nn.Embedding(vocab, hidden)
        self.input_norm = RMSNorm(hidden)
        self.q = nn.Linear(hidden, heads * head_dim, bias=False)
        self.k = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.v = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.o = nn.Linear(heads * head_dim, hidden, bias=False)
        self.q_norm, self.k_norm = RMSNorm(head_dim), RMSNorm(head_dim)
        self.post_norm = RMSNorm(hidden)
        self.router = nn.Linear(hidden, experts, bias=False)
        self.gate = nn.ModuleList(
            nn.Linear(hidden, expert_width, bias=False) for _ in range(experts)
        )
        self.up = nn.ModuleList(nn.Linear(hidden, expert_width, bias=False) for _ in range(experts))
        self.down = nn.ModuleList(
            nn.Linear(expert_width, hidden, bias=False) for _ in range(experts)
        )
        self.final_norm = RMSNorm(hidden)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)
        self.aux_loss = None
        self.expert_counts = None

    def moe(self, h: torch.Tensor) -> torch.Tensor:
        tokens = h.reshape(-1, h.shape[-1])
        experts = len(self.gate)
        probs = torch.softmax(
            self.router(tokens).float(), dim=-1
        )  # routing in float32, as Qwen3 does
        weights, chosen = probs.topk(self.top_k, dim=-1)
        weights = (weights / weights.sum(-1, keepdim=True)).to(tokens.dtype)
        counts = torch.bincount(chosen.flatten(), minlength=experts)
        self.expert_counts = counts.detach()
        fraction = counts.float() / chosen.numel()
        self.aux_loss = experts * (fraction * probs.mean(0)).sum()
        out = torch.zeros_like(tokens)
        for e in range(
            experts
        ):  # each expert on the tokens routed to it (a loop, not grouped GEMM: stated in docs)
            rows, slot = (chosen == e).nonzero(as_tuple=True)
            if rows.numel() == 0:
                continue
            x = tokens.index_select(0, rows)
            y = self.down[e](F.silu(self.gate[e](x)) * self.up[e](x))
            out = out.index_add(0, rows, (y * weights[rows, slot].unsqueeze(-1)).to(out.dtype))
        return out.view_as(h)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        batch, seq = tokens.shape
        x = self.embed(tokens)
        h = self.input_norm(x)
        q = self.q_norm(self.q(h).view(batch, seq, self.heads, self.head_dim)).transpose(1, 2)
        k = self.k_norm(self.k(h).view(batch, seq, self.kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v(h).view(batch, seq, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = rotary(q), rotary(k)
        group = self.heads // self.kv_heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        attn = causal_attention(q, k, v)
        x = x + self.o(attn.transpose(1, 2).reshape(batch, seq, self.heads * self.head_dim))
        h = self.post_norm(x)
        x = x + self.moe(h).to(x.dtype)
        return self.lm_head(self.final_norm(x))


MODELS = ("mlp", "qwen3-block", "qwen3-moe")


def sizes(name: str, scale: float) -> dict:
    """The sizes `build` uses for this model and scale, without building it."""
    if name == "mlp":
        return mlp_sizes(scale)
    if name == "qwen3-block":
        return qwen3_sizes(scale)
    if name == "qwen3-moe":
        return moe_sizes(scale)
    raise ValueError(f"unknown model {name!r}; choose from {', '.join(MODELS)}")


def build(name: str, scale: float, seed: int):
    """(model, sizes, batch maker, loss function, tokens per sample); the same seed gives the same weights and data."""
    torch.manual_seed(seed)
    if name == "mlp":
        sizes = mlp_sizes(scale)
        model = MLP(**sizes)
        generator = torch.Generator().manual_seed(seed + 1)
        x = torch.randn(sizes["batch"], sizes["in_features"], generator=generator)
        y = torch.randint(0, sizes["classes"], (sizes["batch"],), generator=generator)
        return model, sizes, (x, y), lambda out, target: F.cross_entropy(out.float(), target), 1
    if name in ("qwen3-block", "qwen3-moe"):
        sizes = qwen3_sizes(scale) if name == "qwen3-block" else moe_sizes(scale)
        model = (Qwen3Block if name == "qwen3-block" else Qwen3MoELayer)(**sizes)
        for module in model.modules():  # small init keeps logits sane at any size
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=1 / math.sqrt(module.in_features))
        generator = torch.Generator().manual_seed(seed + 1)
        tokens = torch.randint(
            0, sizes["vocab"], (sizes["batch"], sizes["seq"] + 1), generator=generator
        )

        def loss(out, target):
            value = F.cross_entropy(out.float().flatten(0, 1), target.flatten())
            if getattr(model, "aux_loss", None) is not None:  # qwen3-moe: the load-balancing loss
                value = value + sizes["aux_loss_coef"] * model.aux_loss
            return value

        return model, sizes, (tokens[:, :-1], tokens[:, 1:]), loss, sizes["seq"]
    raise ValueError(f"unknown model {name!r}; choose from {', '.join(MODELS)}")
