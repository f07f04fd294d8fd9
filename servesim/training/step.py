"""Step time of one training iteration on a layout, on the serving cost model's rooflines.

Per layer and micro-batch on one GPU (T = micro_batch x seq_len / CP tokens):

- GEMMs: ``gemm_time_nb`` (roofline with eff(M) = gemm_max M / (M + half)) on the shapes of
  ``flops.layer_gemms``; backward = 2 x forward (data and weight gradients; Kaplan et al. 2020).
  fp8 (``--dtype fp8``): the layer's GEMMs run at the fp8 peak and ``fp8_gemm_ratio`` (the
  architecture's fp8 fraction of the fp8 peak over bf16's fraction of the bf16 peak, measured on
  H100, ``data/architectures.toml``) x the bf16 efficiency; the router, the attention core and --
  unless the framework says otherwise -- the LM head stay in bf16. Overheads: a cast kernel for
  every fp8 GEMM input not produced in fp8 by its producer (Transformer Engine's LayerNormLinear
  emits the QKV and fc1 inputs in fp8), writing a row-wise and a column-wise (transposed) copy;
  the backward casts every output gradient likewise; the weights are cast once per step with a
  weight cache, else once per micro-batch; ``current`` scaling reads each tensor once more for its
  amax; two small scale/amax kernels per fp8 GEMM and pass.
- Attention core: causal FLOPs at the architecture's measured curve e(s) = attn_max s / (s +
  attn_half_seq) of the bf16 peak (``data/architectures.toml``, fitted on measured FlashAttention-
  class kernels by experiments/fit_training_kernels.py), s the keys of one kernel call (the
  sequence; s / CP per ring step), ``fa2_attention_max`` in place of attn_max for FlashAttention-2,
  times a fitted factor for a framework whose kernel has no measurement (``TrainingFit.attn_scale``);
  an architecture without a curve: the profile's ``attn_prefill_max`` times n / (n + 1) for n = s /
  128 key blocks. Backward 2.5 x forward (FlashAttention-2 runs 5 matmuls to the forward's 2) at the
  forward's efficiency (an assumption: no backward measurement). ``unfused`` (Megatron-LM before
  FlashAttention): QK^T and AV as batched GEMMs over the whole s x s score matrix, plus the softmax
  (read and write 2 B per score; with dropout, its mask and output, 5 B more) in HBM; backward 2x.
- Elementwise (norms, residuals, activation, dropout): memory-bound passes over the activations,
  16 passes of T h (T h / TP with SP) plus 3 of T x FFN / TP, forward; 2 x backward.
- Recompute adds forward work before the backward (Korthikanti et al. 2022): ``selective`` the
  recomputed modules (``core_attn``: the attention core; MaxText's remat policies map to modules),
  ``full`` the whole layer forward including its TP collectives, for every layer or the
  ``--recompute-layers`` N of each chunk; torchtitan's per-op checkpointing the elementwise kernels,
  every second matmul and the SP all-gathers (``_op_sac_time``), its per-layer one every N-th layer.
- Offloaded activations (``--offload-activations N``): each of N layers per chunk copies its saved
  tensors to the host over PCIe (NVLink-C2C on GB200) behind its own forward and back behind its
  own backward; what the copy exceeds the layer's compute by is exposed.
- TP: two all-reduces of T h 16-bit values per layer forward and two backward (Shoeybi et al. 2019
  sec. 3); with SP each becomes an all-gather + reduce-scatter of the same buffer, the same bytes
  (Korthikanti et al. 2022 sec. 4.2.2). Exposed, unless ``tp_overlap`` (with SP) pipelines them
  with the layer's GEMMs: then only max(0, comm - GEMM time) is exposed.
- CP, ring (``--cp-comm ring``; Liu et al. 2023, ring attention; Megatron-Core / Transformer
  Engine's load-balanced variant, two sequence chunks per rank so that causal work is equal):
  CP - 1 ring steps each passing one KV block, hidden behind the attention of the block before:
  exposed = max(0, send - attention / CP) per step; backward passes K, V and their gradients.
  CP all-to-all (``--cp-comm a2a``; DeepSpeed-Ulysses, Jacobs et al. 2023): Q, K, V are re-split
  from sequence to heads before attention and O back after it, each an all-to-all over the CP
  group on the critical path; the backward moves the same volume.
- CP all-gather (``--cp-comm allgather``; Llama 3 report sec. 3.3.2): the whole sequence's K, V
  gathered before attention, dK, dV reduce-scattered after it, on the critical path.
- EP: dispatch and combine all-to-alls per MoE layer forward, two more backward (Lepikhin et al.
  2020), each rank sending its T x top_k token rows; with ``--ep-overlap`` beside another
  micro-batch's compute, exposed beyond it.

Per step: each pipeline rank's time t_r is the forward + backward of one micro-batch over its model
chunks (``pipeline.pipeline_chunks``: even, uneven or account-for splits); the slowest rank sets the
steady-state period and the others fill the ramp: m t_max + (sum_r t_r - t_max) / v, which is
Narayanan et al. 2021's (m + (p - 1)/v) t for even stages; the bubble is the second term. PP sends:
steady-state sends overlap compute; the warm-up and cool-down cross p v - 1 stage boundaries
forward and backward, exposed 2 (p v - 1) sends of T h / TP values (scatter-gather, Narayanan et
al. 2021 sec. 4.1).

DP overlap rule (the framework's ``overlap_grad_reduce`` / ``overlap_param_gather``, or
``--dp-overlap``): gradients are reduced in per-layer buckets as the last micro-batch's backward
produces them, so they can hide behind that backward; parameters (ZeRO 1/2, distributed optimiser)
are all-gathered behind the next step's first forward. Exposed = max(one bucket, comm - overlap x
hiding compute); without overlap the whole reduction is exposed. Gradients travel in the
framework's ``grad_bytes`` (fp32 for Megatron's bf16 training). ZeRO-3 / FSDP gathers each
layer's weights in every micro-batch's forward and backward and reduce-scatters its gradients,
prefetched one layer ahead: per layer exposed = max(0, comm - overlap x that layer's compute), over
NCCL's hierarchy (the framework's ``hierarchical``) or a flat ring at each rank's own NIC
(DeepSpeed ZeRO-3); in fp8 with ``fp8_all_gather``; without the backward gather when the
parameters are not resharded after the forward. Hybrid sharding (``--dp-shard``) runs these inside
the shard group and adds one all-reduce of the gradient shard across the replicas per step. Optimiser: Adam, memory-bound over the local shard, 28 B/param (read grad 2 +
master/m/v 12, write master/m/v 12 + 16-bit weight 2).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from servesim.costmodel.roofline import gemm_time_nb, roofline_time_nb
from servesim.errors import InfeasibleError

from . import comm
from .flops import (attention_core_flops, attn_dims, ffn_gemms, gemm_flops, hardware_flops_per_token, layer_gemms,
                    model_flops_per_token)
from .framework import (architecture_of, borrows_efficiency, efficiency_architecture, extrapolation_note,
                        load_framework, training_hardware)
from .layout import TrainLayout, check_layout, resolve_with_defaults
from .memory import GiB, as_gib, fp8_element_bytes, layer_recompute_flags, memory_by_rank, stage_params
from .params import FITTED, TrainingFit
from .pipeline import layout_text, pipeline_chunks

BYTES_16 = 2.0
ATTN_TILE = 128.0  # key/query block of FlashAttention-2/3 kernels (Dao 2023; Shah et al. 2024)


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

    @property
    def mfu_fp8_peak(self) -> float | None:
        return self.extra.get("mfu_fp8_peak")

    def as_dict(self) -> dict:
        return {
            "model": self.model, "hardware": self.hardware, "gpus": self.gpus,
            "layout": self.layout.as_dict(),
            "step_time_s": self.step_time_s, "tokens_per_s": self.tokens_per_s,
            "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu, "mfu": self.mfu, "hfu": self.hfu,
            "mfu_peak": "bf16",
            "mfu_fp8_peak": self.extra.get("mfu_fp8_peak"),
            "bottleneck": self.bottleneck, "bubble_fraction": self.bubble_fraction,
            "model_flops_per_token": self.model_flops_per_token,
            "breakdown_s": self.breakdown_s,
            "memory_gib_per_gpu": {"parts": {k: v for k, v in as_gib(self.memory_bytes).items() if k != "total"},
                                   "total": self.memory_bytes["total"] / GiB,
                                   "device": self.extra.get("device_bytes", 0.0) / GiB,
                                   "pipeline_rank": int(self.memory_bytes.get("stage", 0))},
            "framework": self.extra.get("framework"),
            "from_profile": self.extra.get("from_profile", {}),
            "extrapolation": self.extra.get("extrapolation", ""),
        }


class _Kern:
    """Hardware, framework and fitted numbers a layer needs, read once."""

    def __init__(self, hw, lay: TrainLayout, fit: TrainingFit, fw):
        e = hw.efficiency
        arch = architecture_of(hw)
        self.hw, self.e, self.fw, self.lay = hw, e, fw, lay
        self.peak16 = hw.peak_flops["bf16"]
        self.fp8 = lay.dtype == "fp8"
        self.peak8 = hw.peak_flops.get("fp8", 0.0)
        scale = fit.scale_for(efficiency_architecture(hw))
        if borrows_efficiency(hw):
            scale *= arch.gemm_vs_source   # measured on this architecture's kernels relative to the source's
        self.gemm_max = min(1.0, e.gemm_max * scale)
        self.gemm8_max = min(1.0, self.gemm_max * arch.fp8_gemm_ratio)
        self.arch = arch
        self.attn_fit = fit.attn_for(fw.name)
        kernel = lay.attention
        if kernel == "fa2" and arch.fa2_attention_max is not None:
            base = arch.fa2_attention_max
        else:
            base = e.attn_prefill_max
        self.attn_max = min(1.0, base)
        self.g = fp8_element_bytes(lay) if self.fp8 else BYTES_16

    def gemms(self, gemms, fp8: bool = False) -> float:
        e = self.e
        if fp8 and self.fp8:
            peak, wb, eff = self.peak8, 1.0, self.gemm8_max
        else:
            peak, wb, eff = self.peak16, BYTES_16, self.gemm_max
        t = 0.0
        for c, m, k, n in gemms:
            t += c * gemm_time_nb(m, k, n, wb, wb, peak, self.hw.hbm_bw, eff, e.gemm_half_tokens, e.hbm_fraction,
                                  e.kernel_latency_s)
        return t

    def batched(self, count: float, m: float, k: float, n: float) -> float:
        """One batched GEMM kernel of ``count`` (m x k) @ (k x n) products (16-bit): one launch."""
        e = self.e
        one = gemm_time_nb(m, k, n, BYTES_16, BYTES_16, self.peak16, self.hw.hbm_bw, self.gemm_max,
                           e.gemm_half_tokens, e.hbm_fraction, 0.0)
        return count * one + e.kernel_latency_s

    def elementwise(self, nbytes: float, kernels: float) -> float:
        e = self.e
        return roofline_time_nb(0.0, nbytes, self.peak16, 1.0, self.hw.hbm_bw, e.hbm_fraction,
                                kernels * e.kernel_latency_s)

    def flash(self, flops: float, seq: float) -> float:
        """A fused attention kernel over ``seq`` keys per call: the architecture's measured curve
        (``Architecture.attention``), else the profile's fraction with FlashAttention's 128-row tiles."""
        eff = self.arch.attention(self.lay.attention, seq, self.attn_max)
        if eff is None:
            n = max(1.0, seq / ATTN_TILE)
            eff = self.attn_max * n / (n + 1.0)
        eff *= self.attn_fit
        return roofline_time_nb(flops, 0.0, self.peak16, min(1.0, eff), self.hw.hbm_bw,
                                self.e.hbm_fraction, self.e.kernel_latency_s)

    def cast(self, elements: float, kernels: float) -> float:
        """fp8 casts: read 16 bits, write a row-wise and a column-wise fp8 copy (+ an amax read for
        current scaling)."""
        if not self.fp8 or elements <= 0:
            return 0.0
        # dynamic scaling (TE current, torchao tensorwise / rowwise) reads each tensor once more for its amax
        dynamic = self.lay.fp8_recipe in ("current", "tensorwise", "rowwise")
        per = BYTES_16 + 2.0 * self.g + (BYTES_16 if dynamic else 0.0)
        return self.elementwise(per * elements, kernels)


def _attention_gemm_split(model, tokens: float, tp: int) -> tuple[list, list]:
    """(all attention GEMMs, the MLA up-projections among them) for one GPU."""
    h, heads = model.hidden_size, model.num_attention_heads
    if model.mla is None:
        return [(1, tokens, h, (model.q_dim + 2 * model.kv_dim) / tp), (1, tokens, model.q_dim / tp, h)], []
    m = model.mla
    d_qk, d_v = attn_dims(model)
    up = [(1, tokens, m.kv_lora_rank, heads * (m.qk_nope_head_dim + d_v) / tp)]
    if m.q_lora_rank > 0:
        down = [(1, tokens, h, m.q_lora_rank)]
        up = [(1, tokens, m.q_lora_rank, heads * d_qk / tp)] + up
    else:
        down = [(1, tokens, h, heads * d_qk / tp)]
    down.append((1, tokens, h, m.kv_lora_rank + m.qk_rope_head_dim))
    return down + up + [(1, tokens, heads * d_v / tp, h)], up


def _layer_times(model, hw, lay, k: _Kern, moe_layer: bool) -> dict:
    """Forward/backward pieces of one layer for one micro-batch on one GPU (seconds)."""
    t, cp = lay.tp, lay.cp
    tokens = lay.micro_batch * lay.seq_len / cp
    h = model.hidden_size
    sp = lay.sp and t > 1
    attn_g, mla_up = _attention_gemm_split(model, tokens, t)
    ffn = ffn_gemms(model, moe_layer, tokens, t, lay.ep)
    router = ffn[:1] if moe_layer else []
    ffn_rest = ffn[1:] if moe_layer else ffn
    t_attn_g = k.gemms(attn_g, fp8=True)
    t_mla_up = k.gemms(mla_up, fp8=True)
    t_router = k.gemms(router)
    t_ffn_g = k.gemms(ffn_rest, fp8=True)
    shared_g = []
    if moe_layer and model.moe.num_shared_experts > 0:
        shared_g = ffn_rest[-2:]
    t_shared = k.gemms(shared_g, fp8=True)
    gemm_f = t_attn_g + t_router + t_ffn_g
    d_qk, d_v = attn_dims(model)
    heads = model.num_attention_heads
    if lay.attention == "unfused":
        s_q, s_kv = lay.seq_len / cp, float(lay.seq_len)
        count = lay.micro_batch * heads / t
        scores = count * s_q * s_kv
        attn_f = k.batched(count, s_q, d_qk, s_kv) + k.batched(count, s_q, s_kv, d_v)
        attn_f += k.elementwise(scores * (4.0 + (5.0 if lay.dropout else 0.0)), 2 + (1 if lay.dropout else 0))
        attn_b = 2.0 * attn_f
    else:
        flops = tokens * attention_core_flops(model, lay.seq_len, causal=True) / t
        # ring CP runs one kernel per KV block of s / CP keys; all-to-all CP one over the whole sequence
        call_seq = lay.seq_len / cp if (cp > 1 and lay.cp_comm == "ring") else lay.seq_len
        attn_f = k.flash(flops, call_seq)
        attn_b = 2.5 * attn_f
    if moe_layer:
        m = model.moe
        ffn_w = m.experts_per_token * m.expert_ffn_hidden_size + m.num_shared_experts * m.shared_expert_ffn_hidden_size
    else:
        ffn_w = model.ffn_hidden_size
    tok_elem = tokens / t if sp else tokens
    norm_f = k.elementwise(BYTES_16 * 4.0 * tok_elem * h, 2)
    act_f = k.elementwise(BYTES_16 * 3.0 * tokens * ffn_w / t, 1)
    other_f = k.elementwise(BYTES_16 * 12.0 * tok_elem * h, 5)
    elem_f = norm_f + act_f + other_f
    # fp8 casts (see the module docstring)
    cast_f = cast_b = 0.0
    if k.fp8:
        n_gemm = len(attn_g) + len(ffn_rest)
        fwd_el = tokens * heads * d_v / t + tokens * ffn_w / t
        if not k.fw.fp8_norm_cast_fused:
            fwd_el += 2.0 * tok_elem * h
        bwd_el = sum(c * m_ * n_ for c, m_, _, n_ in attn_g + ffn_rest)
        cast_f = k.cast(fwd_el, 4) + k.elementwise(0.0, 2 * n_gemm)
        cast_b = k.cast(bwd_el, n_gemm) + k.elementwise(0.0, 2 * n_gemm)
        if not k.fw.fp8_weight_cache:
            w_el = sum(c * k_ * n_ for c, _, k_, n_ in attn_g + ffn_rest)
            if lay.fp8_all_gather:
                w_el /= lay.dp * lay.cp   # each rank casts its shard before the fp8 all-gather (torchao)
            cast_f += k.cast(w_el, n_gemm)
    if lay.zero >= 3 and lay.fsdp_param_bytes == 4:
        # fp32 parameters under autocast (Composer's mixed_precision DEFAULT): every matmul casts its
        # fp32 weight to bf16 in the forward (read 4 B, write 2 B) and its bf16 weight gradient back
        # to fp32 in the backward (PyTorch docs, "Automatic Mixed Precision": autocast casts fp32
        # inputs, parameters included, of ops that run in lower precision)
        w_el = sum(c * k_ * n_ for c, _, k_, n_ in attn_g + ffn)
        cast_f += k.elementwise(6.0 * w_el, len(attn_g) + len(ffn))
        cast_b += k.elementwise(6.0 * w_el, len(attn_g) + len(ffn))
    compute_f = gemm_f + attn_f + elem_f + cast_f
    compute_b = 2.0 * gemm_f + attn_b + 2.0 * elem_f + cast_b

    tp_f = 0.0
    if t > 1:
        buf = tokens * h * BYTES_16
        if sp:
            ag = comm.reduce_scatter(hw, buf, t)
            if k.fp8 and lay.tp_overlap:
                # Transformer Engine's userbuffer overlap gathers the norm output already in fp8
                ag = comm.reduce_scatter(hw, buf * k.g / BYTES_16, t)
            tp_f = 2.0 * (ag + comm.reduce_scatter(hw, buf, t))  # AG + RS, twice
        else:
            tp_f = 2.0 * comm.allreduce(hw, buf, t)
    tp_b = tp_f
    if lay.tp_overlap and sp:
        # Megatron-Core --tp-comm-overlap: the AG/RS are split into chunks pipelined with the
        # GEMMs that consume/produce them (Wang et al. 2023, "Overlap communication with
        # dependent computation"); what exceeds the GEMM time stays exposed.
        tp_f = max(0.0, tp_f - gemm_f)
        tp_b = max(0.0, tp_b - 2.0 * gemm_f)

    cp_f = cp_b = 0.0
    if cp > 1:
        if model.mla is not None:
            kv_w = heads * (d_qk + d_v) / t
        else:
            kv_w = 2.0 * model.kv_dim / t
        if lay.cp_comm == "a2a":
            q_w = heads * d_qk / t
            nbytes = tokens * (2.0 * q_w + kv_w) * BYTES_16  # Q, K, V in and O out
            cp_f = comm.all_to_all(hw, nbytes, cp, stride=t)
            cp_b = cp_f
        elif lay.cp_comm == "allgather":
            # Llama 3 report (Dubey et al. 2024, sec. 3.3.2): K and V of the whole sequence all-gathered
            # before the attention of the local Q chunks, on the critical path; the backward
            # reduce-scatters dK, dV. The buffer is the whole sequence's K, V (GQA keeps it small).
            full = tokens * cp * kv_w * BYTES_16
            cp_f = comm.reduce_scatter(hw, full, cp, stride=t)
            cp_b = cp_f
        else:
            step = comm.p2p(hw, tokens * kv_w * BYTES_16, t)
            per_block_f = attn_f / cp
            cp_f = (cp - 1) * max(0.0, step - per_block_f)
            cp_b = (cp - 1) * max(0.0, 2.0 * step - attn_b / cp)

    ep_f = 0.0
    if moe_layer and (lay.ep > 1):
        rows = tokens / t if sp else tokens
        ep_f = 2.0 * comm.all_to_all(hw, rows * model.moe.experts_per_token * h * BYTES_16, lay.ep,
                                     stride=t * cp)
    ep_b = ep_f
    if lay.ep_overlap and ep_f > 0:
        # Megatron-Core --overlap-moe-expert-parallel-comm (DeepSeek-V3 report sec. 3.2.1's idea: the
        # dispatch / combine of one micro-batch run beside the computation of another): what the
        # layer's compute cannot cover stays exposed, and the collective's SMs slow that compute
        share = min(1.0, COMM_SMS / max(1, hw.sm_count))
        ep_f = _hidden(ep_f, compute_f, 1.0, share)
        ep_b = _hidden(ep_b, compute_b, 1.0, share)

    # selective recompute: forward time of each recomputed module
    mods = set(lay.modules)
    sel = 0.0
    if "core_attn" in mods or "context" in mods:
        sel += attn_f
    if "layernorm" in mods:
        sel += norm_f
    if "qkv_proj" in mods:
        sel += k.gemms(attn_g[:-1], fp8=True)
    if "out_proj" in mods:
        sel += k.gemms(attn_g[-1:], fp8=True)
    if "mlp_fc1" in mods:
        sel += k.gemms(ffn_rest[0::2], fp8=True) + act_f
    elif "mlp_act" in mods:
        sel += act_f
    if lay.op_sac:
        sel += _op_sac_time(model, lay, k, tokens, attn_g, ffn_rest, moe_layer, norm_f + act_f + other_f)
        if sp:
            sel += 0.5 * tp_f   # the all-gathers of the recomputed norm outputs
    if "mla_up_proj" in mods:
        sel += t_mla_up
    if moe_layer:
        if "moe" in mods:
            sel += t_router + t_ffn_g + act_f + ep_f
        else:
            if "moe_act" in mods:
                sel += act_f
            if "shared_experts" in mods:
                sel += t_shared
    elif "mlp" in mods:
        sel += t_ffn_g + act_f
    full_f = compute_f + tp_f + ep_f + cp_f  # a fully recomputed layer repeats its forward and collectives
    return {"compute_f": compute_f, "compute_b": compute_b, "tp": tp_f + tp_b, "ep": ep_f + ep_b,
            "cp": cp_f + cp_b, "selective": sel, "full": full_f, "full_comm": tp_f + ep_f + cp_f,
            "cast": cast_f + cast_b}


def _op_sac_matmuls(model, tp: int, tokens: float, attn_g, ffn_rest, moe_layer: bool) -> list:
    """The matmuls torchtitan's per-op selective checkpointing recomputes: every second one, counted in
    the order the forward runs them (wq, wk, wv, wo, w1, w3, w2: wk, wo and w3 for a gated MLP;
    wk, wo and w2 for a plain one). MoE experts run grouped GEMMs, not counted matmuls."""
    h = model.hidden_size
    if model.mla is None:
        q, kv = model.q_dim / tp, model.kv_dim / tp
        mms = [(1, tokens, h, q), (1, tokens, h, kv), (1, tokens, h, kv), attn_g[-1]]
    else:
        mms = list(attn_g)
    if not moe_layer:
        up, down = ffn_rest
        if model.gated_mlp:
            half = (up[0], up[1], up[2], up[3] / 2.0)
            mms += [half, half, down]
        else:
            mms += [up, down]
    return mms[1::2]


def _op_sac_time(model, lay, k: _Kern, tokens, attn_g, ffn_rest, moe_layer: bool, elem_f: float) -> float:
    """Forward time per-op selective checkpointing repeats in the backward: every elementwise kernel
    (norms, rope, activation) and the matmuls of ``_op_sac_matmuls``."""
    return elem_f + k.gemms(_op_sac_matmuls(model, lay.tp, tokens, attn_g, ffn_rest, moe_layer), fp8=True)


def _offload_time(hw, nbytes: float, layer_f: float, layer_b: float) -> float:
    """Exposed host copy of one layer's saved tensors: out behind its forward, back behind its backward."""
    if nbytes <= 0:
        return 0.0
    bw = hw.pcie_bw * hw.efficiency.pcie_bw_fraction
    tx = nbytes / bw + hw.efficiency.pcie_latency_s
    return max(0.0, tx - layer_f) + max(0.0, tx - layer_b)


def _rank_times(model, hw, lay, k: _Kern, chunks, cache: dict) -> dict:
    """Forward + backward of one micro-batch over one rank's chunks."""
    from .memory import activation_bytes_per_layer
    tot = {"compute_f": 0.0, "compute_b": 0.0, "tp": 0.0, "ep": 0.0, "cp": 0.0, "recompute": 0.0,
           "offload": 0.0, "cast": 0.0}
    n_layers = 0
    for ch in chunks:
        flags = layer_recompute_flags(lay, len(ch.layers))
        for j, i in enumerate(ch.layers):
            kind = model.is_moe_layer(i)
            if kind not in cache:
                cache[kind] = _layer_times(model, hw, lay, k, kind)
            lt = cache[kind]
            n_layers += 1
            tot["compute_f"] += lt["compute_f"]
            tot["compute_b"] += lt["compute_b"]
            tot["tp"] += lt["tp"]
            tot["ep"] += lt["ep"]
            tot["cp"] += lt["cp"]
            tot["cast"] += lt["cast"]
            if flags[j]:
                tot["recompute"] += lt["full"] - lt["full_comm"]
                tot["tp"] += lt["full_comm"]  # repeated forward collectives, shown as communication
            else:
                tot["recompute"] += lt["selective"]
            if j < lay.offload_layers:
                key = ("act", kind, flags[j])
                if key not in cache:
                    cache[key] = activation_bytes_per_layer(model, lay, kind, full=flags[j])
                tot["offload"] += _offload_time(hw, cache[key], lt["compute_f"], lt["compute_b"])
        if ch.embedding:
            tokens = lay.micro_batch * lay.seq_len / lay.cp
            tot["compute_f"] += k.elementwise(BYTES_16 * 2.0 * tokens * model.hidden_size, 1)
            tot["compute_b"] += k.elementwise(BYTES_16 * 3.0 * tokens * model.hidden_size, 1)
        tokens = lay.micro_batch * lay.seq_len / lay.cp
        heads = int(ch.loss) + ch.mtp
        if heads:
            head = k.gemms([(1, tokens, model.hidden_size, model.vocab_size / lay.tp)], fp8=k.fw.fp8_lm_head)
            xent = k.elementwise(3.0 * 4.0 * tokens * model.vocab_size / lay.tp, 4)
            tot["compute_f"] += heads * (head + xent)
            tot["compute_b"] += heads * (2.0 * head + xent)
        if ch.mtp:
            # DeepSeek-V3 sec. 2.2: embed the shifted tokens, norm both inputs, project 2h -> h, then a
            # layer of the last layer's kind (its LM head and loss are counted above)
            kind = model.is_moe_layer(model.num_layers - 1)
            if kind not in cache:
                cache[kind] = _layer_times(model, hw, lay, k, kind)
            lt = cache[kind]
            h = model.hidden_size
            proj = k.gemms([(1, tokens, 2 * h, h)], fp8=True)
            extra = k.elementwise(BYTES_16 * 6.0 * tokens * h, 3)
            n_layers += ch.mtp
            tot["compute_f"] += ch.mtp * (lt["compute_f"] + proj + extra)
            tot["compute_b"] += ch.mtp * (lt["compute_b"] + 2.0 * proj + 2.0 * extra)
            tot["tp"] += ch.mtp * lt["tp"]
            tot["ep"] += ch.mtp * lt["ep"]
            tot["cp"] += ch.mtp * lt["cp"]
            tot["cast"] += ch.mtp * lt["cast"]
            tot["recompute"] += ch.mtp * (lt["full"] - lt["full_comm"] if lay.recompute == "full" else lt["selective"])
    tot["layers"] = n_layers
    tot["layer_f"] = tot["compute_f"] / max(1, n_layers)
    tot["layer_b"] = tot["compute_b"] / max(1, n_layers)
    tot["total"] = (tot["compute_f"] + tot["compute_b"] + tot["recompute"] + tot["tp"] + tot["ep"] + tot["cp"]
                    + tot["offload"])
    return tot


# SMs a collective running beside compute occupies: DeepSeek-AI 2024 (DeepSeek-V3 report,
# arXiv:2412.19437, sec. 3.2.2) dedicate 20 SMs of an H800 to saturate its IB and NVLink bandwidth
# while computing; the overlapped communication's time slows compute by that share of the SMs.
COMM_SMS = 20.0


def _hidden(comm_t: float, compute_t: float, ov: float, share: float) -> float:
    """Exposed time of ``comm_t`` overlapped with ``compute_t``: what the hidden part cannot cover,
    plus the compute the collective's SMs slow down while it runs beside it."""
    cover = ov * compute_t
    return max(0.0, comm_t - cover) + share * min(comm_t, cover)


def _dp_times(model, hw, lay, k: _Kern, fit: TrainingFit, st: dict, chunks, m: int) -> float:
    """Exposed data-parallel time per step of one rank under the overlap rule in the module docstring."""
    n_dense, r_dense, n_exp, r_exp = lay.shard_groups()
    if lay.zero == 0:
        n_dense, r_dense, n_exp, r_exp = lay.dp * lay.cp, 1, max(1, lay.dp * lay.cp // lay.ep), 1
    if n_dense * r_dense <= 1 and n_exp * r_exp <= 1:
        return 0.0
    dense, expert, _, _ = stage_params(model, lay, chunks)
    pd_, pe = dense / lay.tp, expert / (lay.tp * lay.ep)
    stride_d = lay.tp
    stride_e = lay.tp * lay.cp * lay.ep
    gb = k.fw.grad_bytes
    ov = fit.overlap if lay.dp_overlap else 0.0
    share = min(1.0, COMM_SMS / max(1, hw.sm_count))
    layers = max(1, st["layers"])
    hide_b = st["compute_b"] + st["tp"] / 2.0
    # hybrid sharding: the replicas all-reduce their shard of the gradients once per step, behind the
    # last backward like the gradient reduction
    rep = (comm.allreduce(hw, pd_ * gb / n_dense, r_dense, stride_d * n_dense)
           + comm.allreduce(hw, pe * gb / n_exp, r_exp, stride_e * n_exp))
    rep_exposed = max(rep / layers, _hidden(rep, hide_b, ov, share)) if rep > 0 else 0.0
    if lay.zero >= 3:
        hier = k.fw.hierarchical
        pb = 1.0 if lay.fp8_all_gather else lay.fsdp_param_bytes
        ag = (comm.reduce_scatter(hw, pd_ * pb, n_dense, stride_d, hier)
              + comm.reduce_scatter(hw, pe * pb, n_exp, stride_e, hier))
        rs = (comm.reduce_scatter(hw, pd_ * gb, n_dense, stride_d, hier)
              + comm.reduce_scatter(hw, pe * gb, n_exp, stride_e, hier))
        ag_l, rs_l = ag / layers, rs / layers
        # resharded after the forward, the backward gathers each layer again; kept, it does not
        ag_b = 0.0 if lay.reshard_after_forward == "never" else ag_l
        fwd = _hidden(ag_l, st["layer_f"], ov, share)
        bwd = _hidden(ag_b + rs_l, st["layer_b"], ov, share)
        return m * (layers * (fwd + bwd) + ag_l) + rep_exposed
    if lay.zero == 0:
        grad = comm.allreduce(hw, pd_ * gb, n_dense, stride_d) + comm.allreduce(hw, pe * gb, n_exp, stride_e)
        par = 0.0
    else:
        grad = (comm.reduce_scatter(hw, pd_ * gb, n_dense, stride_d)
                + comm.reduce_scatter(hw, pe * gb, n_exp, stride_e))
        par = (comm.reduce_scatter(hw, pd_ * BYTES_16, n_dense, stride_d)
               + comm.reduce_scatter(hw, pe * BYTES_16, n_exp, stride_e))
    hide_f = st["compute_f"] + st["tp"] / 2.0
    exposed = max(grad / layers, _hidden(grad, hide_b, ov, share))
    if par > 0:
        exposed += max(par / layers, _hidden(par, hide_f, ov, share))
    return exposed + rep_exposed


def _optimizer_time(model, hw, lay, k: _Kern, chunks) -> float:
    dense, expert, _, _ = stage_params(model, lay, chunks)
    pd_, pe = dense / lay.tp, expert / (lay.tp * lay.ep)
    n_dense, _, n_exp, _ = lay.shard_groups()
    if lay.zero >= 1:
        p = pd_ / n_dense + pe / n_exp
    else:
        p = pd_ + pe
    e = hw.efficiency
    t = roofline_time_nb(12.0 * p, 28.0 * p, hw.peak_flops["fp32"] or k.peak16, 1.0, hw.hbm_bw,
                         e.hbm_fraction, 4 * e.kernel_latency_s)
    if k.fp8 and k.fw.fp8_weight_cache:
        t += k.cast(pd_ + pe, 1)  # the weight cache is refreshed once per step
    return t


# --recompute auto: from the least to the most recomputation (each tried until one fits), in the
# framework's own vocabulary
def _auto_candidates(model, lay, fw):
    from .framework import REMAT_POLICIES
    if fw.ac_style == "maxtext":
        for policy in ("minimal", "save_dot_with_context_except_mlp", "save_dot_except_mlp", "save_qkv_proj",
                       "full"):
            rc, mods, offload = REMAT_POLICIES[policy]
            yield dataclasses.replace(lay, recompute=rc, recompute_modules=mods, remat_policy=policy,
                                      offload_layers=(1 << 30) if offload else lay.offload_layers)
        return
    yield dataclasses.replace(lay, recompute="none", recompute_modules=(), recompute_layers=None, selective_ac=None)
    if fw.ac_style == "torchtitan":
        yield dataclasses.replace(lay, recompute="selective", selective_ac="op")
        # every 4th layer (a quarter of the layers recomputed), per-op (about 3 of 7 matmuls and the
        # elementwise kernels of every layer), every 2nd layer, all
        for opt in ("4", "op", "2"):
            yield dataclasses.replace(lay, recompute="selective", selective_ac=opt)
        yield dataclasses.replace(lay, recompute="full", selective_ac=None)
        return
    mods = [("core_attn",)]
    if model.mla is not None:
        mods.append(("core_attn", "mla_up_proj"))
    if model.moe is not None:
        mods.append(mods[-1] + ("moe_act",))
    mods.append(mods[-1] + ("layernorm",))
    for mo in mods:
        yield dataclasses.replace(lay, recompute="selective", recompute_modules=mo, recompute_layers=None)
    chunks = pipeline_chunks(model, lay)
    biggest = max(len(c.layers) for rank in chunks for c in rank)
    for n in range(1, biggest):
        yield dataclasses.replace(lay, recompute="full", recompute_modules=(), recompute_layers=n)
    yield dataclasses.replace(lay, recompute="full", recompute_modules=(), recompute_layers=None)


def _fullest(ranks):
    r = max(range(len(ranks)), key=lambda i: ranks[i]["total"])
    out = dict(ranks[r])
    out["stage"] = float(r)
    return out


def _memory_error(model, hw, lay, mem) -> InfeasibleError:
    parts = ("weights", "gradients", "optimizer", "gathered_params", "fp8_weight_cache", "activations",
             "recompute_buffer", "logits")
    big = max(parts, key=lambda p: mem[p])
    hint = {"activations": "use --recompute auto or full, --offload-activations, --sp, a smaller --micro-batch, "
                           "or more --tp/--pp/--cp",
            "logits": "use a smaller --micro-batch or more --tp",
            "gathered_params": "use a smaller --fsdp-prefetch or more --tp",
            "recompute_buffer": "use a smaller --micro-batch or more --tp/--cp"}.get(
        big, "use a higher --zero" + (", a larger --dp-shard" if lay.dp_shard else "") + ", or more --tp/--pp/--ep")
    rc = lay.recompute + (f" {lay.recompute_layers} layers/chunk" if lay.recompute_layers else "") + (
        f" ({','.join(lay.modules)})" if lay.modules else "")
    shown = [f"{big} {mem[big] / GiB:.1f} GiB"]
    if big != "activations":
        shown.append(f"activations {mem['activations'] / GiB:.1f}")
    if big not in ("weights", "gradients", "optimizer"):
        shown.append(f"model states {(mem['weights'] + mem['gradients'] + mem['optimizer']) / GiB:.1f}")
    return InfeasibleError(
        f"layout needs {mem['total'] / GiB:.1f} GiB per GPU on pipeline rank {int(mem['stage'])} "
        f"({', '.join(shown)}) but {hw.name} holds "
        f"{hw.device_bytes / GiB:.1f} GiB (tp={lay.tp} pp={lay.pp} dp={lay.dp} cp={lay.cp} zero={lay.zero} "
        f"recompute={rc} micro-batch={lay.micro_batch} seq={lay.seq_len}); {hint}")


def fit_memory(model, hw, lay: TrainLayout, fw=None, limit: float | None = None) -> tuple[TrainLayout, dict]:
    """(layout, memory of its fullest rank); ``--recompute auto`` becomes the least recomputation
    that fits in ``limit`` bytes (default ``hw.device_bytes``; or full recomputation when nothing fits)."""
    fw = fw or load_framework(lay.framework)
    limit = hw.device_bytes if limit is None else limit
    if lay.recompute != "auto":
        return lay, _fullest(memory_by_rank(model, hw, lay, fw))
    mem = None
    for cand in _auto_candidates(model, lay, fw):
        mem = _fullest(memory_by_rank(model, hw, cand, fw))
        if mem["total"] <= limit:
            return cand, mem
    return cand, mem


def train_step(model, hw, lay: TrainLayout, gpus: int | None = None, fit: TrainingFit = FITTED,
               check_memory: bool = True, memory_limit: float | None = None) -> TrainResult:
    """Price one training step of ``model`` on ``hw`` with layout ``lay`` (see module docstring).
    ``memory_limit``: bytes a rank may use (default the device's memory; the layout search keeps a margin)."""
    fw = load_framework(lay.framework)
    hw = training_hardware(hw)
    lay, from_profile = resolve_with_defaults(lay, hw, fw)
    check_layout(model, hw, lay, gpus)
    asked = lay.recompute
    lay, mem = fit_memory(model, hw, lay, fw, memory_limit)
    if check_memory and mem["total"] > (hw.device_bytes if memory_limit is None else memory_limit):
        raise _memory_error(model, hw, lay, mem)
    k = _Kern(hw, lay, fit, fw)
    chunks = pipeline_chunks(model, lay)
    cache: dict = {}
    rank_cache: dict = {}
    ranks = []
    for ch in chunks:
        key = (tuple((c.layers[0] if (c.layers and model.moe is not None) else -1, len(c.layers), c.embedding, c.loss,
                      c.mtp) for c in ch))
        if key not in rank_cache:
            rank_cache[key] = _rank_times(model, hw, lay, k, ch, cache)
        ranks.append(rank_cache[key])
    slow = max(range(len(ranks)), key=lambda i: ranks[i]["total"])
    st = ranks[slow]
    m = lay.num_microbatches
    p, v = lay.pp, lay.vp
    t_stage = st["total"]
    bubble = (sum(r["total"] for r in ranks) - t_stage) / v
    pp_comm = 0.0
    if p > 1:
        tokens = lay.micro_batch * lay.seq_len / lay.cp
        send = comm.p2p(hw, tokens * model.hidden_size * BYTES_16 / lay.tp, lay.tp * lay.cp * lay.dp)
        pp_comm = 2.0 * (p * v - 1) * send
    dp_exposed = 0.0
    opt = 0.0
    seen = {}
    for r, ch in enumerate(chunks):
        key = id(ranks[r])
        if key not in seen:
            seen[key] = (_dp_times(model, hw, lay, k, fit, ranks[r], ch, m), _optimizer_time(model, hw, lay, k, ch))
        dp_exposed = max(dp_exposed, seen[key][0])
        opt = max(opt, seen[key][1])
    breakdown = {
        "compute": m * (st["compute_f"] + st["compute_b"] + st["recompute"]),
        "recompute": m * st["recompute"],
        "tp_comm": m * st["tp"],
        "cp_comm": m * st["cp"],
        "ep_comm": m * st["ep"],
        "offload": m * st["offload"],
        "pp_bubble": bubble,
        "pp_comm": pp_comm,
        "dp_comm": dp_exposed,
        "optimizer": opt,
    }
    step = sum(v_ for key, v_ in breakdown.items() if key != "recompute")
    tokens_step = lay.global_batch * lay.seq_len
    mtp = sum(c.mtp for rank in chunks for c in rank)
    mf = model_flops_per_token(model, lay.seq_len, mtp_layers=mtp)
    mfu = mf * tokens_step / step / (lay.gpus * hw.peak_flops["bf16"])
    mfu8 = None
    if lay.dtype == "fp8":
        mfu8 = mf * tokens_step / step / (lay.gpus * hw.peak_flops["fp8"])
    hf = hardware_flops_per_token(model, lay.seq_len, mtp_layers=mtp) + _recompute_flops(model, lay)
    hfu = hf * tokens_step / step / (lay.gpus * hw.peak_flops["bf16"])
    parts = {key: val for key, val in breakdown.items() if key not in ("compute", "recompute")}
    parts["compute"] = breakdown["compute"] - breakdown["recompute"]
    parts["recompute"] = breakdown["recompute"]
    bottleneck = max(parts, key=parts.get)
    return TrainResult(
        model=model.name, hardware=hw.name, layout=lay, step_time_s=step,
        tokens_per_s=tokens_step / step, tokens_per_s_per_gpu=tokens_step / step / lay.gpus,
        mfu=mfu, hfu=hfu, breakdown_s=breakdown, memory_bytes=mem, bottleneck=bottleneck,
        bubble_fraction=bubble / (m * t_stage + bubble), model_flops_per_token=mf,
        extra={"device_bytes": hw.device_bytes, "num_microbatches": m, "stage_time_s": t_stage,
               "slowest_rank": slow, "mfu_fp8_peak": mfu8, "framework": fw.name,
               "recompute_asked": asked, "extrapolation": extrapolation_note(hw), "from_profile": from_profile,
               "stage_times_s": [r["total"] for r in ranks], "pipeline_layout": layout_text(model, lay),
               "layers_per_rank": [sum(len(c.layers) for c in ch) for ch in chunks]},
    )


def _recompute_flops(model, lay) -> float:
    """Recomputed FLOPs per token, causal attention counted as computed (for HFU)."""
    per_layer_attn = attention_core_flops(model, lay.seq_len, causal=True)
    chunks = pipeline_chunks(model, lay)
    rec = 0.0
    for rank in chunks:
        for ch in rank:
            flags = layer_recompute_flags(lay, len(ch.layers))
            for j, i in enumerate(ch.layers):
                moe = model.is_moe_layer(i)
                if flags[j]:
                    rec += gemm_flops(layer_gemms(model, moe, 1.0)) + per_layer_attn
                    continue
                mods = set(lay.modules)
                attn_g = _attention_gemm_split(model, 1.0, 1)[0]
                ffn = ffn_gemms(model, moe, 1.0, 1, 1)
                ffn_rest = ffn[1:] if moe else ffn
                if "core_attn" in mods or "context" in mods:
                    rec += per_layer_attn
                if ("mlp" in mods and not moe) or ("moe" in mods and moe):
                    rec += gemm_flops(ffn)
                if "mla_up_proj" in mods:
                    rec += gemm_flops(_attention_gemm_split(model, 1.0, 1)[1])
                if "qkv_proj" in mods:
                    rec += gemm_flops(attn_g[:-1])
                if "out_proj" in mods:
                    rec += gemm_flops(attn_g[-1:])
                if "mlp_fc1" in mods:
                    rec += gemm_flops(ffn_rest[0::2])
                if lay.op_sac:
                    rec += gemm_flops(_op_sac_matmuls(model, 1, 1.0, attn_g, ffn_rest, moe))
    return rec


__all__ = ["TrainResult", "fit_memory", "train_step"]
