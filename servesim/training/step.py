"""Step time of one training iteration on a layout, on the serving cost model's rooflines.

Per layer and micro-batch on one GPU (T = micro_batch x seq_len / CP tokens):

- GEMMs: ``gemm_time_nb`` (roofline with eff(M) = gemm_max M / (M + half)) on the shapes of
  ``flops.layer_gemms``; backward = 2 x forward (data and weight gradients; Kaplan et al. 2020).
- Attention core: causal FLOPs at ``attn_prefill_max`` of the bf16 peak; backward 2.5 x forward
  (FlashAttention-2 backward runs 5 matmuls to the forward's 2 and recomputes S; Dao 2023).
- Elementwise (norms, residuals, activation, dropout): memory-bound passes over the activations,
  16 passes of T h (T h / TP with SP) plus 3 of T x FFN / TP, forward; 2 x backward.
- Recompute adds forward work before the backward (Korthikanti et al. 2022): ``selective`` the
  attention core, ``full`` the whole layer forward including its TP collectives.
- TP: two all-reduces of T h 16-bit values per layer forward and two backward (Shoeybi et al. 2019
  sec. 3); with SP each becomes an all-gather + reduce-scatter of the same buffer, the same bytes
  (Korthikanti et al. 2022 sec. 4.2.2). Exposed, unless ``tp_overlap`` (with SP) pipelines them
  with the layer's GEMMs: then only max(0, comm - GEMM time) is exposed.
- CP ring attention (Liu et al. 2023): CP - 1 ring steps each passing the local K and V; a step
  hides behind the attention of the previous block, exposed = max(0, comm - attention).
  Backward passes K, V and their gradients (2 x bytes).
- EP: dispatch and combine all-to-alls per MoE layer forward, two more backward (Lepikhin et al.
  2020), each rank sending its T x top_k token rows.

Per step: 1F1B (Narayanan et al. 2021): (m + (p - 1)/v) x t_stage, where t_stage is the fullest
stage's forward + backward of one micro-batch and m = global_batch / (micro_batch x dp); the bubble
is (p - 1)/v x t_stage, a fraction (p - 1)/(v m + p - 1) of the pipeline time ((p-1)/(m+p-1) for
v = 1). PP sends: steady-state sends overlap compute; the warm-up and cool-down cross p v - 1 stage
boundaries forward and backward, exposed 2 (p v - 1) sends of T h / TP values (scatter-gather,
Narayanan et al. 2021 sec. 4.1).

DP overlap rule: gradients are reduced in per-layer buckets as the last micro-batch's backward
produces them, so they can hide behind that backward; parameters (ZeRO 1/2, distributed optimiser)
are all-gathered behind the next step's first forward. Exposed = max(one bucket, comm - overlap x
hiding compute). ZeRO-3 gathers each layer's weights in every micro-batch's forward and backward
and reduce-scatters its gradients, prefetched one layer ahead: per layer exposed = max(0, comm -
overlap x that layer's compute). Optimiser: Adam, memory-bound over the local shard, 28 B/param
(read grad 2 + master/m/v 12, write master/m/v 12 + 16-bit weight 2).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from servesim.costmodel.roofline import gemm_time_nb, roofline_time_nb
from servesim.errors import InfeasibleError

from . import comm
from .flops import attention_core_flops, attn_dims, layer_gemms, model_flops_per_token
from .layout import TrainLayout, check_layout
from .memory import GiB, as_gib, local_params, memory_per_gpu
from .params import FITTED, TrainingFit

BYTES_16 = 2.0


@dataclass
class TrainResult:
    model: str
    hardware: str
    layout: TrainLayout
    step_time_s: float
    tokens_per_s: float
    tokens_per_s_per_gpu: float
    mfu: float
    hfu: float
    breakdown_s: dict
    memory_bytes: dict
    bottleneck: str
    bubble_fraction: float
    model_flops_per_token: float
    extra: dict = field(default_factory=dict)

    @property
    def gpus(self) -> int:
        return self.layout.gpus

    def as_dict(self) -> dict:
        return {
            "model": self.model, "hardware": self.hardware, "gpus": self.gpus,
            "layout": self.layout.as_dict(),
            "step_time_s": self.step_time_s, "tokens_per_s": self.tokens_per_s,
            "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu, "mfu": self.mfu, "hfu": self.hfu,
            "bottleneck": self.bottleneck, "bubble_fraction": self.bubble_fraction,
            "model_flops_per_token": self.model_flops_per_token,
            "breakdown_s": self.breakdown_s,
            "memory_gib_per_gpu": {"parts": {k: v for k, v in as_gib(self.memory_bytes).items() if k != "total"},
                                   "total": self.memory_bytes["total"] / GiB,
                                   "hbm": self.extra.get("hbm_bytes", 0.0) / GiB},
        }


class _Kern:
    """Hardware numbers a layer needs, read once."""

    def __init__(self, hw, lay: TrainLayout, fit: TrainingFit):
        e = hw.efficiency
        self.hw = hw
        self.peak = hw.peak_flops[lay.dtype]
        self.peak16 = hw.peak_flops["bf16"]
        self.wb = 1.0 if lay.dtype == "fp8" else BYTES_16
        self.gemm_max = min(1.0, e.gemm_max * fit.compute_scale)
        self.attn_max = min(1.0, e.attn_prefill_max * fit.compute_scale)
        self.e = e

    def gemms(self, gemms) -> float:
        e = self.e
        t = 0.0
        for c, m, k, n in gemms:
            t += c * gemm_time_nb(m, k, n, self.wb, self.wb, self.peak, self.hw.hbm_bw, self.gemm_max,
                                  e.gemm_half_tokens, e.hbm_fraction, e.kernel_latency_s)
        return t

    def elementwise(self, nbytes: float, kernels: int) -> float:
        e = self.e
        return roofline_time_nb(0.0, nbytes, self.peak16, 1.0, self.hw.hbm_bw, e.hbm_fraction,
                                kernels * e.kernel_latency_s)

    def attention(self, flops: float) -> float:
        return roofline_time_nb(flops, 0.0, self.peak16, self.attn_max, self.hw.hbm_bw,
                                self.e.hbm_fraction, self.e.kernel_latency_s)


def _layer_times(model, hw, lay, k: _Kern, moe_layer: bool) -> dict:
    """Forward/backward pieces of one layer for one micro-batch on one GPU (seconds)."""
    t, cp = lay.tp, lay.cp
    tokens = lay.micro_batch * lay.seq_len / cp
    h = model.hidden_size
    gemm_f = k.gemms(layer_gemms(model, moe_layer, tokens, t, lay.ep))
    # causal attention of the local queries against the whole sequence: total pairs / CP
    attn_flops = tokens * attention_core_flops(model, lay.seq_len, causal=True) / t
    attn_f = k.attention(attn_flops)
    if moe_layer:
        m = model.moe
        ffn_w = m.experts_per_token * m.expert_ffn_hidden_size + m.num_shared_experts * m.shared_expert_ffn_hidden_size
    else:
        ffn_w = model.ffn_hidden_size
    tok_elem = tokens / t if (lay.sp and t > 1) else tokens
    elem_f = k.elementwise(BYTES_16 * (16.0 * tok_elem * h + 3.0 * tokens * ffn_w / t), 8)
    compute_f = gemm_f + attn_f + elem_f
    compute_b = 2.0 * gemm_f + 2.5 * attn_f + 2.0 * elem_f

    tp_f = 0.0
    if t > 1:
        buf = tokens * h * BYTES_16
        if lay.sp:
            tp_f = 2.0 * (comm.reduce_scatter(hw, buf, t) * 2.0)  # AG + RS, twice
        else:
            tp_f = 2.0 * comm.allreduce(hw, buf, t)
    tp_b = tp_f
    if lay.tp_overlap and lay.sp and t > 1:
        # Megatron-Core --tp-comm-overlap: the AG/RS are split into chunks pipelined with the
        # GEMMs that consume/produce them (Wang et al. 2023, "Overlap communication with
        # dependent computation"); what exceeds the GEMM time stays exposed.
        tp_f = max(0.0, tp_f - gemm_f)
        tp_b = max(0.0, tp_b - 2.0 * gemm_f)

    cp_f = cp_b = 0.0
    if cp > 1:
        d_qk, d_v = attn_dims(model)
        if model.mla is not None:
            kv_w = model.num_attention_heads * (d_qk + d_v) / t
        else:
            kv_w = 2.0 * model.kv_dim / t
        step = comm.p2p(hw, tokens * kv_w * BYTES_16, t)
        per_block_f = attn_f / cp
        cp_f = (cp - 1) * max(0.0, step - per_block_f)
        cp_b = (cp - 1) * max(0.0, 2.0 * step - 2.5 * per_block_f)

    ep_f = 0.0
    if moe_layer and (lay.ep > 1):
        rows = tokens / t if (lay.sp and t > 1) else tokens
        ep_f = 2.0 * comm.all_to_all(hw, rows * model.moe.experts_per_token * h * BYTES_16, lay.ep,
                                     stride=t * cp)
    ep_b = ep_f

    recompute = 0.0
    if lay.recompute == "selective":
        recompute = attn_f
    elif lay.recompute == "full":
        recompute = compute_f
    full = lay.recompute == "full"  # full recompute repeats the forward collectives too
    return {"compute_f": compute_f, "compute_b": compute_b + recompute,
            "tp": tp_f + tp_b + (tp_f if full else 0.0),
            "ep": ep_f + ep_b + (ep_f if full else 0.0),
            "cp": cp_f + cp_b + (cp_f if full else 0.0),
            "recompute": recompute}


def _stage_times(model, hw, lay, k: _Kern, stage: int) -> dict:
    per = model.num_layers // lay.pp
    if lay.vp > 1:  # stage holds vp chunks of L/(p v) layers: chunk c covers stage + c p
        chunk = per // lay.vp
        layers = [c * lay.pp * chunk + stage * chunk + j for c in range(lay.vp) for j in range(chunk)]
    else:
        layers = list(range(stage * per, (stage + 1) * per))
    cache = {}
    tot = {"compute_f": 0.0, "compute_b": 0.0, "tp": 0.0, "ep": 0.0, "cp": 0.0,
           "recompute": 0.0}
    for i in layers:
        kind = model.is_moe_layer(i)
        if kind not in cache:
            cache[kind] = _layer_times(model, hw, lay, k, kind)
        for key, v in cache[kind].items():
            tot[key] += v
    tot["layer_f"] = tot["compute_f"] / max(1, len(layers))
    tot["layer_b"] = tot["compute_b"] / max(1, len(layers))
    tot["layers"] = len(layers)
    if stage == lay.pp - 1:
        tokens = lay.micro_batch * lay.seq_len / lay.cp
        head = k.gemms([(1, tokens, model.hidden_size, model.vocab_size / lay.tp)])
        xent = k.elementwise(3.0 * 4.0 * tokens * model.vocab_size / lay.tp, 4)
        tot["compute_f"] += head + xent
        tot["compute_b"] += 2.0 * head + xent
    tot["total"] = tot["compute_f"] + tot["compute_b"] + tot["tp"] + tot["ep"] + tot["cp"]
    return tot


def _dp_times(model, hw, lay, k: _Kern, fit: TrainingFit, st: dict, m: int) -> float:
    """Exposed data-parallel time per step under the overlap rule in the module docstring."""
    n_dense = lay.dp * lay.cp
    n_exp = max(1, n_dense // lay.ep)
    if n_dense <= 1 and n_exp <= 1:
        return 0.0
    pd_, pe = local_params(model, lay, 0)
    stride_d = lay.tp
    stride_e = lay.tp * lay.cp * lay.ep
    g_dense, g_exp = pd_ * BYTES_16, pe * BYTES_16
    layers = max(1, st["layers"])
    if lay.zero >= 3:
        ag = comm.reduce_scatter(hw, g_dense, n_dense, stride_d) + comm.reduce_scatter(hw, g_exp, n_exp, stride_e)
        per_layer = ag / layers
        fwd = max(0.0, per_layer - fit.overlap * st["layer_f"])
        bwd = max(0.0, 2.0 * per_layer - fit.overlap * st["layer_b"])
        return m * (layers * (fwd + bwd) + per_layer)
    if lay.zero == 0:
        grad = comm.allreduce(hw, g_dense, n_dense, stride_d) + comm.allreduce(hw, g_exp, n_exp, stride_e)
        par = 0.0
    else:
        grad = comm.reduce_scatter(hw, g_dense, n_dense, stride_d) + comm.reduce_scatter(hw, g_exp, n_exp, stride_e)
        par = grad
    hide_b = st["compute_b"] + st["tp"] / 2.0
    hide_f = st["compute_f"] + st["tp"] / 2.0
    exposed = max(grad / layers, grad - fit.overlap * hide_b)
    if par > 0:
        exposed += max(par / layers, par - fit.overlap * hide_f)
    return exposed


def _optimizer_time(model, hw, lay, k: _Kern) -> float:
    pd_, pe = local_params(model, lay, 0)
    n_dense = lay.dp * lay.cp
    n_exp = max(1, n_dense // lay.ep)
    if lay.zero >= 1:
        p = pd_ / n_dense + pe / n_exp
    else:
        p = pd_ + pe
    e = hw.efficiency
    return roofline_time_nb(12.0 * p, 28.0 * p, hw.peak_flops["fp32"] or k.peak16, 1.0, hw.hbm_bw,
                            e.hbm_fraction, 4 * e.kernel_latency_s)


def train_step(model, hw, lay: TrainLayout, gpus: int | None = None, fit: TrainingFit = FITTED,
               check_memory: bool = True) -> TrainResult:
    """Price one training step of ``model`` on ``hw`` with layout ``lay`` (see module docstring)."""
    check_layout(model, hw, lay, gpus)
    mem = memory_per_gpu(model, hw, lay)
    if check_memory and mem["total"] > hw.hbm_bytes:
        big = max(("weights", "gradients", "optimizer", "activations", "logits"), key=lambda p: mem[p])
        hint = {"activations": "use --recompute full, --sp, a smaller --micro-batch, or more --tp/--pp/--cp",
                "logits": "use a smaller --micro-batch or more --tp"}.get(
            big, "use a higher --zero, or more --tp/--pp/--ep")
        raise InfeasibleError(
            f"layout needs {mem['total'] / GiB:.1f} GiB per GPU ({big} {mem[big] / GiB:.1f} GiB) but "
            f"{hw.name} holds {hw.hbm_bytes / GiB:.1f} GiB (tp={lay.tp} pp={lay.pp} dp={lay.dp} "
            f"cp={lay.cp} zero={lay.zero} recompute={lay.recompute} micro-batch={lay.micro_batch}); {hint}")
    k = _Kern(hw, lay, fit)
    stages = [_stage_times(model, hw, lay, k, s) for s in sorted({0, lay.pp - 1})]
    st = max(stages, key=lambda x: x["total"])
    m = lay.num_microbatches
    p, v = lay.pp, lay.vp
    t_stage = st["total"]
    bubble = (p - 1) / v * t_stage
    pp_comm = 0.0
    if p > 1:
        tokens = lay.micro_batch * lay.seq_len / lay.cp
        send = comm.p2p(hw, tokens * model.hidden_size * BYTES_16 / lay.tp, lay.tp * lay.cp * lay.dp)
        pp_comm = 2.0 * (p * v - 1) * send
    dp_exposed = _dp_times(model, hw, lay, k, fit, stages[0], m)
    opt = _optimizer_time(model, hw, lay, k)
    breakdown = {
        "compute": m * (st["compute_f"] + st["compute_b"]),
        "recompute": m * st["recompute"],
        "tp_comm": m * st["tp"],
        "cp_comm": m * st["cp"],
        "ep_comm": m * st["ep"],
        "pp_bubble": bubble,
        "pp_comm": pp_comm,
        "dp_comm": dp_exposed,
        "optimizer": opt,
    }
    step = sum(v_ for key, v_ in breakdown.items() if key != "recompute")
    tokens_step = lay.global_batch * lay.seq_len
    mf = model_flops_per_token(model, lay.seq_len)
    peak = hw.peak_flops["bf16"]
    mfu = mf * tokens_step / step / (lay.gpus * peak)
    re_frac = _recompute_flops_fraction(model, lay)
    hfu = mfu * (1.0 + re_frac)
    parts = {key: val for key, val in breakdown.items() if key not in ("compute", "recompute")}
    parts["compute"] = breakdown["compute"] - breakdown["recompute"]
    parts["recompute"] = breakdown["recompute"]
    bottleneck = max(parts, key=parts.get)
    return TrainResult(
        model=model.name, hardware=hw.name, layout=lay, step_time_s=step,
        tokens_per_s=tokens_step / step, tokens_per_s_per_gpu=tokens_step / step / lay.gpus,
        mfu=mfu, hfu=hfu, breakdown_s=breakdown, memory_bytes=mem, bottleneck=bottleneck,
        bubble_fraction=bubble / (m * t_stage + bubble), model_flops_per_token=mf,
        extra={"hbm_bytes": hw.hbm_bytes, "num_microbatches": m, "stage_time_s": t_stage},
    )


def _recompute_flops_fraction(model, lay) -> float:
    """Recomputed FLOPs as a fraction of model FLOPs (same non-causal convention as MFU)."""
    mf = model_flops_per_token(model, lay.seq_len)
    attn = model.num_layers * attention_core_flops(model, lay.seq_len, causal=False)
    if lay.recompute == "selective":
        return attn / mf
    if lay.recompute == "full":
        head = 2.0 * model.hidden_size * model.vocab_size
        return (mf / 3.0 - head) / mf
    return 0.0

