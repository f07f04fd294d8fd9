"""Python-side view of one iteration: aggregates from a batch, per-class breakdown, bottleneck."""
from __future__ import annotations

from dataclasses import dataclass, field

from .fields import table
from .iteration import iteration_components
from .kernels import gemm_ridge_tokens_nb


@dataclass(frozen=True)
class Batch:
    """prefill: (chunk tokens, tokens already cached) per sequence; decode: context length per sequence."""
    prefill: tuple = ()
    decode: tuple = ()
    prefill_final: bool = True   # the chunks finish their prompts (they sample a token)

    def aggregates(self):
        tp_tok = float(sum(c for c, _ in self.prefill))
        n_pf = float(len(self.prefill))
        pairs = float(sum(c * (ctx + (c + 1) / 2.0) for c, ctx in self.prefill))
        kv_pf = float(sum(ctx + c for c, ctx in self.prefill))
        n_dec = float(len(self.decode))
        kv_dec = float(sum(self.decode))
        n_logit = n_dec + (n_pf if self.prefill_final else 0.0)
        return tp_tok, n_pf, n_logit, pairs, kv_pf, n_dec, kv_dec


@dataclass
class Breakdown:
    time_s: float
    interval_s: float
    parts_s: dict = field(default_factory=dict)
    bound: dict = field(default_factory=dict)
    bottleneck: str = ""
    flops: float = 0.0
    bytes: float = 0.0

    def as_dict(self) -> dict:
        return {"time_ms": self.time_s * 1e3, "interval_ms": self.interval_s * 1e3,
                "parts_ms": {k: v * 1e3 for k, v in self.parts_s.items()},
                "bound": dict(self.bound), "bottleneck": self.bottleneck,
                "flops": self.flops, "bytes": self.bytes}


def breakdown(params, batch: Batch) -> Breakdown:
    agg = batch.aggregates()
    cost = iteration_components(table(params), *agg)
    gemm, attn, elem, comm, over = cost.gemm, cost.attention, cost.elementwise, cost.communication, cost.overhead
    tokens = agg[0] + agg[5]
    p = params
    bound = {}
    if tokens > 0:
        ridge = gemm_ridge_tokens_nb(p.mlp_k[0], p.mlp_n[0], p.w_bytes, p.a_bytes, p.peak, p.g_max, p.hbm_bw,
                                     p.g_hbm)
        bound["gemm"] = "compute" if tokens >= ridge else "memory"
    if agg[0] > 0:
        c = agg[3] * p.attn_flops_pair / (p.attn_peak * p.attn_pf_max)
        m = (agg[4] * p.kv_bytes_tok_layer + agg[0] * p.q_bytes_tok_layer) / (p.hbm_bw * p.attn_pf_hbm)
        bound["attention_prefill"] = "compute" if c >= m else "memory"
    if agg[5] > 0:
        bound["attention_decode"] = "memory"
    bound["elementwise"] = "memory"
    if comm > 0:
        bound["communication"] = "network"
    parts = {"gemm": gemm, "attention": attn, "elementwise": elem, "communication": comm, "overhead": over}
    top = max(parts, key=parts.get) if tokens > 0 else ""
    kind = bound.get(top, "")
    if top == "attention":
        kind = bound.get("attention_prefill", bound.get("attention_decode", ""))
    label = f"{top} ({kind})" if kind else top
    return Breakdown(cost.latency, cost.interval, parts, bound, label, cost.flops, cost.nbytes)
