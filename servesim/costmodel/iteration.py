"""Time of one engine step from a few batch aggregates. Jitted; callable from Python too.

Batch aggregates (all per replica, per step):
  tp_tok   prefill tokens in this step (sum of chunk sizes)
  n_pf     prefill chunks (sequences being prefilled)
  n_logit  sequences that sample a token (decodes + prefills finishing their prompt)
  pairs    causal attention pairs of the prefill chunks: sum c * (ctx + (c + 1) / 2),
           ctx = tokens already cached for that sequence (FlashAttention with a prefix)
  kv_pf    KV tokens the prefill chunks read: sum (ctx + c)
  n_dec    decode sequences (one token each)
  kv_dec   KV tokens the decodes read: sum of their context lengths
Returns an `IterationCost` (seconds by operator class, latency, interval, FLOPs, bytes; read by
name): latency is one micro-batch through every pipeline stage; interval is the time until the
first stage can take the next micro-batch (the bottleneck stage). With PP = 1 they are equal.

Kernel costs are the engine's (``servesim/costmodel/kernels.py``, fitted per engine and GPU): GEMMs
as rooflines with tile and wave quantisation, FlashAttention prefill and paged decode attention,
the engine's all-reduce inside the NVLink domain (NCCL elsewhere), fused MoE. The engine decides
how the GPU work is launched. A batch of T tokens at most the largest captured CUDA-graph size is
padded to the next captured size (the GEMMs, elementwise kernels and all-reduces run on the padded
tokens; attention on the real sequences) and replayed: one launch for a full graph, and for a
piecewise graph one per layer for the graph pieces plus one per layer for attention, which runs
outside them. Larger batches run eagerly, one launch per kernel (and the engine's all-reduce in
its eager form). The GPU cannot run ahead of the launches, so the forward takes
max(GPU time, launches x launch cost). Host work per step (scheduling, input preparation, sampling
and output processing: a fixed and a per-sequence time) adds to it, or overlaps it when the
engine schedules asynchronously; the part of the launch cost the GPU did not hide and the host work
are reported together as overhead.

Everything that depends only on the (padded) token count -- every layer's GEMMs, elementwise
kernels and all-reduces -- is tabulated per token count when the replica is lowered
(``layer_tables_nb``), so a step reads it instead of recomputing it.

Every function here takes the replica's cost parameters as one float64 array ``p``, the table of
`fields.py` (``p[F.hidden]``, ``array_nb(p, F.attn_k)``); Python callers pack a CostParams with
``fields.table`` once per configuration. The functions that branch into an optional part of the model
also take its marker (``moe``, ``ep``, ``mla``, ``wo``: None, and that part is not compiled; see
`features.py`); Python callers use `iteration_components`, which passes the table's own shape. Small
helpers with one call site in the step cost are IR-inlined there (``inline="always"``), here and in
`kernels.py` and `collectives.py`: each would otherwise be a compile unit of its own (~50 ms cold).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from .collectives import allreduce_time_nb, p2p_time_nb, reduce_scatter_time_nb
from .kernels import (decode_attention_time_nb, engine_allreduce_time_nb, gemm_bytes_nb,
                      gemm_time_nb, mla_decode_time_nb, mla_prefill_time_nb, moe_experts_time_nb,
                      prefill_attention_time_nb, weight_only_gemm_time_nb)
from . import fields as F
from .ep import busiest_share_nb, dispatch_combine_nb, masked_pairs_time_nb, rank_load_of_nb, wide_ep_nb
from .features import features
from .fields import array_nb
from .moe_tiles import pick_tile_nb
from .graphs import GRAPH_FULL, GRAPH_FULL_AND_PIECEWISE, GRAPH_NONE, GRAPH_PIECEWISE
from ..jit import JIT


@njit(**JIT)
def _gemm_nb(p, wo, m, k, n):
    """One GEMM at the weight dtype (weight-only: dequantising at the 16-bit peak)."""
    if wo is not None and p[F.g_wo] > 0.0:
        return weight_only_gemm_time_nb(m, k, n, p[F.w_bytes], p[F.peak], p[F.hbm_bw], p[F.sms], p[F.g_max],
                                        p[F.g_hbm], p[F.g_latency], p[F.g_splitk], p[F.g_tile_k], p[F.g_mem_latency])
    return gemm_time_nb(m, k, n, p[F.w_bytes], p[F.a_bytes], p[F.peak], p[F.hbm_bw], p[F.sms], p[F.g_max], p[F.g_hbm],
                        p[F.g_latency], p[F.g_splitk], p[F.g_tile_k],
                        p[F.g_mem_latency]) + m * k * p[F.g_quant]   # (W8A8: quantise X)


@njit(inline="always", **JIT)
def _gemm16_nb(p, m, k, n):
    """One 16-bit GEMM (LM head, MoE router: kept unquantised, as vLLM and TensorRT-LLM do)."""
    return gemm_time_nb(m, k, n, 2.0, 2.0, p[F.attn_peak], p[F.hbm_bw], p[F.sms], p[F.g16_max], p[F.g_hbm],
                        p[F.g16_latency], p[F.g_splitk], p[F.g_tile_k], p[F.g_mem_latency])


@njit(**JIT)
def _gemms_nb(p, wo, m, ks, ns):
    t = 0.0
    for i in range(ks.shape[0]):
        t += _gemm_nb(p, wo, m, ks[i], ns[i])
    return t


@njit(**JIT)
def expected_experts_nb(tokens, experts, top_k):
    """Expected distinct experts hit by `tokens` tokens each picking top_k of `experts` uniformly:
    E * (1 - (1 - k/E)^T) (occupancy of E bins; Feller, vol. 1, ch. IV)."""
    if tokens <= 0.0:
        return 0.0
    return experts * (1.0 - (1.0 - top_k / experts) ** tokens)


@njit(**JIT)
def routed_experts_nb(p, ep, tokens):
    """The routed experts of one MoE layer on the slowest GPU for the ``tokens`` the layer routes (the
    step's tokens; with DP attention every rank's together): without EP the fused MoE over the experts
    the batch touches (uniform routing); with EP the slowest EP rank's pairs and touched experts
    (costmodel/ep.py), plus the remote pairs a masked kernel walks. The fused-MoE kernel's tile for
    ``tokens``: moe_tiles.pick_tile_nb over the table's tiles."""
    tile_m, tile_n, tile_k = pick_tile_nb(array_nb(p, F.moe_tile_keys), array_nb(p, F.moe_tile_m),
                                          array_nb(p, F.moe_tile_n), array_nb(p, F.moe_tile_k), tokens)
    if ep is None or p[F.ep] <= 1.0:
        pairs = tokens * p[F.top_k]
        return moe_experts_time_nb(pairs, expected_experts_nb(tokens, p[F.experts], p[F.top_k]), pairs, p[F.hidden],
                                   p[F.exp_inter], p[F.gated] > 0.0, p[F.w_bytes], p[F.a_bytes], p[F.peak],
                                   p[F.hbm_bw], p[F.sms], p[F.g16_max], p[F.g_hbm], p[F.g_tile_k], p[F.moe_eff],
                                   p[F.moe_latency], p[F.moe_pair], tile_m, tile_n, p[F.moe_ridge], tile_k,
                                   p[F.moe_stream])   # (moe_eff: of gemm_max)
    rank, touched = rank_load_of_nb(p, tokens)
    walked = tokens * p[F.top_k] if p[F.ep_masked] > 0.0 else rank
    t = moe_experts_time_nb(rank, touched, walked, p[F.hidden], p[F.exp_inter], p[F.gated] > 0.0, p[F.w_bytes],
                            p[F.a_bytes], p[F.peak], p[F.hbm_bw], p[F.sms], p[F.g16_max], p[F.g_hbm], p[F.g_tile_k],
                            p[F.moe_eff], p[F.moe_latency], p[F.moe_pair], tile_m, tile_n, p[F.moe_ridge], tile_k,
                            p[F.moe_stream])
    return t + masked_pairs_time_nb(p, walked - rank)


@njit(**JIT)
def alltoall_layer_nb(p, m, tokens):
    """Dispatch + combine of one MoE layer (DP attention with EP; 0 otherwise): the busiest DP rank
    sends its ``m`` tokens, the slowest EP rank receives its pairs of the step's ``tokens``."""
    if not wide_ep_nb(p):
        return 0.0
    rank, _ = rank_load_of_nb(p, tokens)
    return dispatch_combine_nb(p, m, rank)


@njit(**JIT)
def _moe_nb(p, ep, wo, m):
    """One MoE layer on a rank's m tokens: the routed experts (fused MoE over the experts the batch
    touches; with wide EP priced per step on every rank's tokens instead, `_rank_components_nb`),
    shared experts and router."""
    t = 0.0
    if ep is None or not wide_ep_nb(p):
        t = routed_experts_nb(p, ep, m)
    t += _gemms_nb(p, wo, m, array_nb(p, F.sh_k), array_nb(p, F.sh_n))
    return t + _gemm16_nb(p, m, p[F.hidden], p[F.router_n])


@njit(**JIT)
def _gemms_bytes_nb(p, m, ks, ns):
    b = 0.0
    for i in range(ks.shape[0]):
        b += gemm_bytes_nb(m, ks[i], ns[i], p[F.w_bytes], p[F.a_bytes])
    return b


@njit(inline="always", **JIT)
def _bytes_counts_nb(p, moe, ep, m, moe_tok):
    """The HBM bytes one step moves on a whole replica, the bytes the cost above prices, their terms
    that depend on the token counts alone: (every layer's GEMMs at the priced token count ``m``
    (weights once, activations in and out: ``gemm_bytes_nb``), for a MoE layer the routed experts the
    batch touches (``expected_experts_nb`` of them, each running its share of the m x top_k rows, as
    ``_moe_nb`` prices them), the shared experts and the 16-bit router; `_lm_head_nb` gives the LM
    head's on the sampled rows). `_bytes_kv_nb` adds the elementwise kernels' bytes per token and
    attention's: the KV cache of the prefill chunks and decodes and the queries and outputs of the
    step's tokens. Per GPU, summed over the layers of every pipeline stage, times the TP group.
    ``moe_tok``: the tokens the MoE layers route (m; with wide EP every DP rank's real tokens)."""
    attn = _gemms_bytes_nb(p, m, array_nb(p, F.attn_k), array_nb(p, F.attn_n))
    b = p[F.n_dense_layers] * (attn + _gemms_bytes_nb(p, m, array_nb(p, F.mlp_k), array_nb(p, F.mlp_n)))
    if moe is not None and p[F.n_moe_layers] > 0.0:
        # with EP the slowest EP rank's experts (every rank counted as it: an upper bound)
        if ep is not None and p[F.ep] > 1.0:
            pairs, touched = rank_load_of_nb(p, moe_tok)
            rows = pairs / touched if touched > 0.0 else 0.0
        else:
            touched = expected_experts_nb(m, p[F.experts], p[F.top_k])
            rows = m * p[F.top_k] / touched
        up_n = 2.0 * p[F.exp_inter] if p[F.gated] > 0.0 else p[F.exp_inter]
        experts = touched * (gemm_bytes_nb(rows, p[F.hidden], up_n, p[F.w_bytes], p[F.a_bytes])
                             + gemm_bytes_nb(rows, p[F.exp_inter], p[F.hidden], p[F.w_bytes], p[F.a_bytes]))
        router = gemm_bytes_nb(m, p[F.hidden], p[F.router_n], 2.0, 2.0)
        shared = _gemms_bytes_nb(p, m, array_nb(p, F.sh_k), array_nb(p, F.sh_n))
        b += p[F.n_moe_layers] * (attn + experts + shared + router)
    return b


@njit(inline="always", **JIT)
def _lm_head_nb(p, n_logit):
    """The LM head on the ``n_logit`` sampled rows (vocab-parallel, 16-bit): (seconds, HBM bytes)."""
    return (_gemm16_nb(p, n_logit, p[F.hidden], p[F.vocab_gpu]),
            gemm_bytes_nb(n_logit, p[F.hidden], p[F.vocab_gpu], 2.0, 2.0))


@njit(inline="always", **JIT)
def _bytes_kv_nb(p, b, lm, m, tokens, kv_pf, kv_dec):
    """The step's HBM bytes from their count terms ``b``, ``lm`` (`_bytes_counts_nb`)."""
    n_layers = p[F.n_dense_layers] + p[F.n_moe_layers]
    b += n_layers * (m * p[F.elem_bytes_tok_layer] + p[F.kv_bytes_tok_layer] * (kv_pf + kv_dec)
                     + p[F.q_bytes_tok_layer] * tokens)
    b += lm
    return b * p[F.tp]


@njit(inline="always", **JIT)
def allreduce_nb(p, m, graphed):
    """One all-reduce of the hidden state of m tokens over the TP group."""
    if p[F.tp] <= 1.0:
        return 0.0
    msg = m * p[F.hidden] * 2.0
    if p[F.ar_custom] > 0.0 and msg <= p[F.ar_max_bytes]:
        t = engine_allreduce_time_nb(msg, p[F.tp], p[F.ar_link_bw], p[F.ar_frac], p[F.ar_latency], p[F.ar_step])
        if graphed:
            return t
        # eager: the GPU also copies the input into the registered buffer; the call's host time
        # (ar_eager) is the CPU's, counted with the launches in iteration_components_nb
        return t + 2.0 * msg / (p[F.hbm_bw] * p[F.g_hbm])     # (kernels.engine_allreduce_eager_time_nb's copy)
    return p[F.coll_base] + allreduce_time_nb(msg, p[F.tp], p[F.tp_bw], p[F.tp_alpha], int(p[F.tp_algorithm]))


@njit(**JIT)
def layer_costs_nb(p, moe, ep, wo, m, graphed):
    """(GEMMs, elementwise, all-reduces) of every layer of one forward over m tokens (with wide EP
    without the routed experts and the all-to-all: they see every DP rank's tokens)."""
    g_attn = _gemms_nb(p, wo, m, array_nb(p, F.attn_k), array_nb(p, F.attn_n))
    gemm = p[F.n_dense_layers] * (g_attn + _gemms_nb(p, wo, m, array_nb(p, F.mlp_k), array_nb(p, F.mlp_n)))
    if moe is not None and p[F.n_moe_layers] > 0.0:
        gemm += p[F.n_moe_layers] * (g_attn + _moe_nb(p, ep, wo, m))
    n_layers = p[F.n_dense_layers] + p[F.n_moe_layers]
    elem = n_layers * (m * p[F.elem_s_tok_layer] + p[F.elem_kernels] * p[F.elem_latency])
    # tensor parallelism: two all-reduces of the hidden state per layer (Shoeybi et al. 2019, sec. 3)
    comm = 2.0 * n_layers * allreduce_nb(p, m, graphed)
    return gemm, elem, comm


@njit(**JIT)
def layer_tables_nb(p, moe, ep, wo, n):
    """For m = 0 .. n - 1: layer_costs_nb of m tokens (graphed where the engine captures m) and the LM head
    on m sampled rows (`_lm_head_nb`: seconds, bytes); `counts_part_nb` reads them instead of
    recomputing them (the same functions of the same values, so the same floats)."""
    tg = np.zeros(n)
    te = np.zeros(n)
    tc = np.zeros(n)
    tl = np.zeros(n)
    tlb = np.zeros(n)
    for m in range(n):
        x = float(m)
        tl[m], tlb[m] = _lm_head_nb(p, x)
        if m > 0:
            graphed = p[F.graph_mode] != GRAPH_NONE and m <= p[F.graph_max]
            tg[m], te[m], tc[m] = layer_costs_nb(p, moe, ep, wo, x, graphed)
    return tg, te, tc, tl, tlb


@njit(inline="always", **JIT)
def graph_tokens_nb(sizes, tokens):
    """The smallest captured size >= tokens (binary search), or -1.0 above the largest."""
    n = sizes.shape[0]
    if n == 0 or tokens > sizes[n - 1]:
        return -1.0
    lo = 0
    hi = n - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if sizes[mid] >= tokens:
            hi = mid
        else:
            lo = mid + 1
    return sizes[lo]


@njit(inline="always", **JIT)
def launches_nb(p, n_pf, n_layers, padded):
    """Kernel launches the CPU issues for one forward: 1 for a full graph, 2 per layer (+1) for a
    piecewise graph, every kernel when eager."""
    if padded > 0.0 and p[F.graph_mode] != GRAPH_NONE:
        if p[F.graph_mode] == GRAPH_FULL or (p[F.graph_mode] == GRAPH_FULL_AND_PIECEWISE and n_pf == 0.0):
            return 1.0
        if p[F.graph_mode] == GRAPH_PIECEWISE or p[F.graph_mode] == GRAPH_FULL_AND_PIECEWISE:
            return 2.0 * n_layers + 1.0
    return n_layers * p[F.kernels_layer] + 3.0


@njit(**JIT)
def attention_nb(p, mla, tp_tok, n_pf, pairs, kv_pf, n_dec, kv_dec):
    """Attention of one layer on the real sequences: the prefill chunks (as n_pf chunks of their mean
    length after their mean cached prefix) and the decodes."""
    a = 0.0
    if mla is not None and p[F.mla] > 0.0:
        return mla_attention_nb(p, tp_tok, n_pf, kv_pf, n_dec, kv_dec)
    if tp_tok > 0.0:
        chunk = tp_tok / n_pf
        ctx = max(kv_pf / n_pf - chunk, 0.0)
        a += prefill_attention_time_nb(n_pf, chunk, ctx, p[F.heads], p[F.kv_heads], p[F.head_dim], 2.0,
                                       p[F.kv_elem_bytes], p[F.attn_peak], p[F.hbm_bw], p[F.sms], p[F.attn_pf_max],
                                       p[F.attn_pf_hbm], p[F.attn_pf_block], p[F.attn_pf_latency])
    if n_dec > 0.0:
        a += decode_attention_time_nb(n_dec, kv_dec, p[F.heads], p[F.kv_heads], p[F.head_dim], 2.0,
                                      p[F.kv_elem_bytes], p[F.hbm_bw], p[F.sms], p[F.attn_dec_hbm],
                                      p[F.attn_dec_block], p[F.attn_dec_latency], p[F.attn_dec_split],
                                      p[F.attn_dec_split_seqs], p[F.attn_dec_block_bw])
    return a


@njit(**JIT)
def mla_attention_nb(p, tp_tok, n_pf, kv_pf, n_dec, kv_dec):
    """MLA attention of one layer (kernels.mla_decode_time_nb, mla_prefill_time_nb with the engine's
    MLA fit): the decodes through the absorbed kernel over the latent; the prefill chunks (n_pf of
    their mean length after their mean cached prefix) through whichever of the two kernels is faster
    at that length, as the engines route them: vLLM sends chunks of up to 128 (FlashMLA) or 512
    (FlashAttention MLA) query tokens down the absorbed decode path (``reorder_batch_threshold`` in
    vllm/v1/attention/backends/mla/, v0.15.1), which is where a speculative verification goes."""
    a = 0.0
    kv_b = p[F.kv_elem_bytes]
    if tp_tok > 0.0:
        chunk = tp_tok / n_pf
        ctx = max(kv_pf / n_pf - chunk, 0.0)
        pf = mla_prefill_time_nb(n_pf, chunk, ctx, p[F.heads], p[F.head_dim], p[F.mla_v],
                                 (p[F.mla_latent] + p[F.mla_rope]) * kv_b, p[F.attn_peak], p[F.hbm_bw], p[F.sms],
                                 p[F.attn_pf_max], p[F.attn_pf_hbm], p[F.attn_pf_block], p[F.attn_pf_latency])
        ab = mla_decode_time_nb(n_pf, chunk, kv_pf, p[F.heads], p[F.mla_latent], p[F.mla_rope], kv_b, p[F.attn_peak],
                                p[F.hbm_bw], p[F.sms], p[F.attn_dec_max], p[F.attn_dec_hbm], p[F.attn_dec_block],
                                p[F.attn_dec_latency])
        a += min(pf, ab)
    if n_dec > 0.0:
        a += mla_decode_time_nb(n_dec, 1.0, kv_dec, p[F.heads], p[F.mla_latent], p[F.mla_rope], kv_b, p[F.attn_peak],
                                p[F.hbm_bw], p[F.sms], p[F.attn_dec_max], p[F.attn_dec_hbm], p[F.attn_dec_block],
                                p[F.attn_dec_latency])
    return a


class IterationCost(NamedTuple):
    """One engine step, by operator class (seconds), with its time and work."""
    gemm: float
    attention: float
    elementwise: float
    communication: float       # TP collectives and PP sends
    overhead: float            # launch cost the GPU did not hide, and host work
    latency: float             # one micro-batch through every pipeline stage
    interval: float            # until the first stage can take the next micro-batch
    flops: float
    nbytes: float


@njit(**JIT)
def rank_share_nb(p, tp_tok, n_pf, n_logit, pairs, kv_pf, n_dec, kv_dec):
    """The busiest DP attention rank's aggregates: whole sequences, ceil(n_pf / D) prefill chunks of the
    mean chunk and ceil(n_dec / D) decodes (`ep.busiest_share_nb`), the sampled rows its decodes and
    its chunks' mean share of the prefills' ones. D = 1: the step itself."""
    if p[F.attn_dp] <= 1.0:
        return tp_tok, n_pf, n_logit, pairs, kv_pf, n_dec, kv_dec
    r_pf = busiest_share_nb(n_pf, p[F.attn_dp])
    r_dec = busiest_share_nb(n_dec, p[F.attn_dp])
    fp = r_pf / n_pf if n_pf > 0.0 else 0.0
    fd = r_dec / n_dec if n_dec > 0.0 else 0.0
    return (tp_tok * fp, r_pf, r_dec + max(n_logit - n_dec, 0.0) * fp, pairs * fp, kv_pf * fp, r_dec,
            kv_dec * fd)


@njit(**JIT)
def iteration_components_nb(p, moe, ep, mla, wo, tp_tok, n_pf, n_logit, pairs, kv_pf, n_dec, kv_dec):
    """The step's `IterationCost` from its batch aggregates (module docstring), on the cost table ``p``
    compiled for the markers ``moe, ep, mla, wo`` (`features.py`; they must cover ``p``)."""
    if ep is not None and p[F.attn_dp] > 1.0:
        # DP attention: the busiest rank's own sequences (rank_share_nb); its MoE layers route the
        # step's real tokens, every rank's together (wide EP); FLOPs those of the whole replica,
        # bytes every rank's counted as the busiest's (an upper bound)
        d = p[F.attn_dp]
        a = rank_share_nb(p, tp_tok, n_pf, n_logit, pairs, kv_pf, n_dec, kv_dec)
        r = _rank_components_nb(p, moe, ep, mla, wo, a[0], a[1], a[2], a[3], a[4], a[5], a[6], tp_tok + n_dec)
        return IterationCost(r.gemm, r.attention, r.elementwise, r.communication, r.overhead, r.latency, r.interval,
                             flops_nb(p, tp_tok + n_dec, pairs, kv_dec), r.nbytes * d)
    return _rank_components_nb(p, moe, ep, mla, wo, tp_tok, n_pf, n_logit, pairs, kv_pf, n_dec, kv_dec, 0.0)


def iteration_components(p, tp_tok, n_pf, n_logit, pairs, kv_pf, n_dec, kv_dec) -> IterationCost:
    """`iteration_components_nb` for Python callers: compiled for the shape of the table ``p``."""
    return iteration_components_nb(p, *features(p), tp_tok, n_pf, n_logit, pairs, kv_pf, n_dec, kv_dec)


@njit(inline="always", **JIT)
def flops_nb(p, tokens, pairs, kv_dec):
    """FLOPs of a step: every active weight twice per token, attention's pairs and decode KV."""
    n_layers = p[F.n_dense_layers] + p[F.n_moe_layers]
    return 2.0 * p[F.active_params_gpu] * p[F.tp] * p[F.pp] * tokens + n_layers * p[F.tp] * (
        pairs * p[F.attn_flops_pair] + kv_dec * p[F.attn_flops_kv_decode])


@njit(inline="always", **JIT)     # (two calls in iteration_components_nb, each a call of the two parts)
def _rank_components_nb(p, moe, ep, mla, wo, tp_tok, n_pf, n_logit, pairs, kv_pf, n_dec, kv_dec, moe_tok):
    """One step of one (DP attention) rank: its own prefill chunks and decodes; with wide EP its MoE
    layers route ``moe_tok`` tokens, every rank's (the routed experts and all-to-all outside the
    per-token tables)."""
    if tp_tok + n_dec <= 0.0:
        return IterationCost(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    c = counts_part_nb(p, moe, ep, wo, tp_tok, n_pf, n_logit, n_dec, moe_tok)
    return kv_part_nb(p, mla, c, tp_tok, n_pf, pairs, kv_pf, n_dec, kv_dec)


# `counts_part_nb`'s terms, in its tuple's order (`decode_cost_nb` keeps them per decode count)
N_COUNT_TERMS = 12


@njit(**JIT)
def counts_part_nb(p, moe, ep, wo, tp_tok, n_pf, n_logit, n_dec, moe_tok):
    """The terms of `_rank_components_nb` that depend on the step's token and sequence counts alone, not
    on the KV it reads or its attention pairs: (m, gemm, elem, comm, send, cpu, host, the weights'
    FLOPs, the bytes' count terms (`_bytes_counts_nb`), tokens, seqs). Tokens > 0."""
    tokens = tp_tok + n_dec
    seqs = n_pf + n_dec
    padded = graph_tokens_nb(array_nb(p, F.graph_sizes), tokens) if p[F.graph_mode] != GRAPH_NONE else -1.0
    m = padded if padded > 0.0 else tokens
    mi = int(m)
    tab_gemm = array_nb(p, F.tab_gemm)
    if mi < tab_gemm.shape[0] and mi == m:
        gemm = tab_gemm[mi]
        elem = array_nb(p, F.tab_elem)[mi]
        comm_tp = array_nb(p, F.tab_comm)[mi]
    else:
        gemm, elem, comm_tp = layer_costs_nb(p, moe, ep, wo, m, padded > 0.0)
    if ep is not None and wide_ep_nb(p) and p[F.n_moe_layers] > 0.0:
        gemm += p[F.n_moe_layers] * routed_experts_nb(p, ep, moe_tok)
        comm_tp += p[F.n_moe_layers] * alltoall_layer_nb(p, tokens, moe_tok)
    else:
        moe_tok = m
    # LM head on the sampled rows (vocab-parallel, outside the graph) + gather of logits across TP
    tab_lm = array_nb(p, F.tab_lm)
    li = int(n_logit)
    if li < tab_lm.shape[0] and li == n_logit:
        lm_s = tab_lm[li]
        lm = array_nb(p, F.tab_lm_bytes)[li]
    else:
        lm_s, lm = _lm_head_nb(p, n_logit)
    gemm += lm_s
    if p[F.tp] > 1.0 and n_logit > 0.0:
        comm_tp += p[F.coll_base] + reduce_scatter_time_nb(n_logit * p[F.vocab_gpu] * p[F.tp] * 4.0, p[F.tp],
                                                           p[F.tp_bw], p[F.tp_alpha])
    n_layers = p[F.n_dense_layers] + p[F.n_moe_layers]
    send = 0.0
    if p[F.pp] > 1.0:
        send = p2p_time_nb(tokens * p[F.hidden] * 2.0, p[F.pp_bw], p[F.pp_alpha], p[F.pp_bw_large], p[F.pp_large_bytes])
    cpu = launches_nb(p, n_pf, n_layers, padded) * p[F.launch]
    if padded <= 0.0 and p[F.tp] > 1.0 and p[F.ar_custom] > 0.0 and m * p[F.hidden] * 2.0 <= p[F.ar_max_bytes]:
        cpu += 2.0 * n_layers * p[F.ar_eager]    # host time of each eager call of the engine's all-reduce
    host = p[F.overhead] + p[F.overhead_seq] * seqs
    flops_w = 2.0 * p[F.active_params_gpu] * p[F.tp] * p[F.pp] * tokens    # (flops_nb's first term)
    b = _bytes_counts_nb(p, moe, ep, m, moe_tok)
    return m, gemm, elem, comm_tp, send, cpu, host, flops_w, b, lm, tokens, seqs


@njit(**JIT)
def kv_part_nb(p, mla, c, tp_tok, n_pf, pairs, kv_pf, n_dec, kv_dec):
    """`_rank_components_nb` from its count terms ``c`` (`counts_part_nb`) and the KV the step reads:
    attention, the step's time, FLOPs and bytes."""
    m, gemm, elem, comm_tp, send, cpu, host, flops_w, b, lm, tokens, seqs = c
    n_layers = p[F.n_dense_layers] + p[F.n_moe_layers]
    attn = n_layers * attention_nb(p, mla, tp_tok, n_pf, pairs, kv_pf, n_dec, kv_dec)
    body = gemm + attn + elem + comm_tp
    busy = max(body, cpu) + p[F.step_gpu]
    if p[F.host_overlap] > 0.0:
        step = max(busy, host)
    else:
        step = busy + host
    overhead = step - body
    latency = step + (p[F.pp] - 1.0) * send
    interval = body / p[F.pp] + send + overhead
    # flops_nb, its first term from the counts
    flops = flops_w + n_layers * p[F.tp] * (pairs * p[F.attn_flops_pair] + kv_dec * p[F.attn_flops_kv_decode])
    nbytes = _bytes_kv_nb(p, b, lm, m, tokens, kv_pf, kv_dec)
    return IterationCost(gemm, attn, elem, comm_tp + (p[F.pp] - 1.0) * send, overhead, latency, interval, flops, nbytes)


@njit(**JIT)     # (called: inlined in the event loop it cost ~1 CPU s more cold compile, README, Speed)
def decode_cost_nb(p, moe, ep, mla, wo, memo, n, kv):
    """`iteration_components_nb` of a step of ``n`` decodes alone reading ``kv`` KV tokens (a decode
    span's iteration, engine/span.py), its count terms kept in ``memo`` row n (`counts_part_nb`'s
    tuple after a flag 1.0; zeros: not yet computed) for the steps of the same count; the same
    floating-point operations, so the same result. With DP attention (`rank_share_nb`) the step cost
    computed whole."""
    x = float(n)
    if ep is not None and p[F.attn_dp] > 1.0:
        return iteration_components_nb(p, moe, ep, mla, wo, 0.0, 0.0, x, 0.0, 0.0, x, float(kv))
    if memo[n, 0] == 0.0:
        c = counts_part_nb(p, moe, ep, wo, 0.0, 0.0, x, x, 0.0)
        for j in range(N_COUNT_TERMS):
            memo[n, 1 + j] = c[j]
        memo[n, 0] = 1.0
    c = (memo[n, 1], memo[n, 2], memo[n, 3], memo[n, 4], memo[n, 5], memo[n, 6], memo[n, 7], memo[n, 8],
         memo[n, 9], memo[n, 10], memo[n, 11], memo[n, 12])
    return kv_part_nb(p, mla, c, 0.0, 0.0, 0.0, 0.0, x, float(kv))


@njit(**JIT)
def moe_parts_nb(p, ep, tp_tok, n_pf, n_dec):
    """(routed experts, dispatch + combine) of one step's MoE layers, seconds, inside the gemm and
    communication of `iteration_components_nb` (the same busiest rank, tokens and CUDA-graph padding);
    ``ep``: the table's marker (`features.py`)."""
    if p[F.n_moe_layers] <= 0.0:
        return 0.0, 0.0
    a = rank_share_nb(p, tp_tok, n_pf, n_pf + n_dec, 0.0, 0.0, n_dec, 0.0)
    tokens = a[0] + a[5]
    if tokens <= 0.0:
        return 0.0, 0.0
    if wide_ep_nb(p):
        t = tp_tok + n_dec
        return p[F.n_moe_layers] * routed_experts_nb(p, ep, t), p[F.n_moe_layers] * alltoall_layer_nb(p, tokens, t)
    padded = graph_tokens_nb(array_nb(p, F.graph_sizes), tokens) if p[F.graph_mode] != GRAPH_NONE else -1.0
    m = padded if padded > 0.0 else tokens
    return p[F.n_moe_layers] * routed_experts_nb(p, ep, m), 0.0
