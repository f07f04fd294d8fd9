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
Returns (gemm, attention, elementwise, communication, overhead, latency, interval, flops, bytes):
latency is one micro-batch through every pipeline stage; interval is the time until the
first stage can take the next micro-batch (the bottleneck stage). With PP = 1 they are equal.

The engine (``CostParams`` from an engine profile) decides how the GPU work is launched. A batch of
T tokens at most the largest captured CUDA-graph size is padded to the next captured size (the
GEMMs, elementwise kernels and all-reduces run on the padded tokens; attention on the real
sequences) and replayed: one launch for a full graph, and for a piecewise graph one per layer for
the graph pieces plus one per layer for attention, which runs outside them. Larger batches run
eagerly, one launch per kernel. The GPU cannot run ahead of the launches, so the forward takes
max(GPU time, launches x launch cost). Host work per step (scheduling, input preparation, sampling
and output processing: a fixed and a per-sequence time) adds to it, or overlaps it when the
engine schedules asynchronously; the part of the launch cost the GPU did not hide and the host
work are reported together as overhead.
"""
from __future__ import annotations

from numba import njit

from .collectives import allreduce_time_nb, custom_allreduce_time_nb, p2p_time_nb, reduce_scatter_time_nb
from .params import GRAPH_FULL, GRAPH_FULL_AND_PIECEWISE, GRAPH_NONE, GRAPH_PIECEWISE
from .roofline import gemm_efficiency_nb, gemm_time_nb, roofline_time_nb


@njit(cache=True)
def _gemms_nb(p, m, ks, ns):
    t = 0.0
    for i in range(ks.shape[0]):
        t += gemm_time_nb(m, ks[i], ns[i], p.w_bytes, p.a_bytes, p.peak, p.hbm_bw,
                          p.gemm_max, p.gemm_half, p.hbm_frac, p.latency)
    return t


@njit(cache=True)
def expected_experts_nb(tokens, experts, top_k):
    """Expected distinct experts hit by `tokens` tokens each picking top_k of `experts` uniformly:
    E * (1 - (1 - k/E)^T) (occupancy of E bins; Feller, vol. 1, ch. IV)."""
    if tokens <= 0.0:
        return 0.0
    return experts * (1.0 - (1.0 - top_k / experts) ** tokens)


@njit(cache=True)
def _experts_nb(p, tokens):
    """Routed-expert GEMMs of one MoE layer as a grouped GEMM over the experts the batch touches."""
    touched = expected_experts_nb(tokens, p.experts, p.top_k)
    if touched <= 0.0:
        return 0.0
    m = tokens * p.top_k / touched
    t = 0.0
    for i in range(p.exp_k.shape[0]):
        k = p.exp_k[i]
        n = p.exp_n[i]
        flops = touched * 2.0 * m * k * n
        nbytes = touched * (k * n * p.w_bytes + m * (k + n) * p.a_bytes)
        t_c = flops / (p.peak * gemm_efficiency_nb(m, p.gemm_max, p.gemm_half))
        t_m = nbytes / (p.hbm_bw * p.hbm_frac)
        t += max(t_c, t_m) + p.latency
    return t


@njit(cache=True)
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


@njit(cache=True)
def launches_nb(p, n_pf, n_layers, padded):
    """Kernel launches the CPU issues for one forward: 1 for a full graph, 2 per layer (+1) for a
    piecewise graph, every kernel when eager."""
    if padded > 0.0 and p.graph_mode != GRAPH_NONE:
        if p.graph_mode == GRAPH_FULL or (p.graph_mode == GRAPH_FULL_AND_PIECEWISE and n_pf == 0.0):
            return 1.0
        if p.graph_mode == GRAPH_PIECEWISE or p.graph_mode == GRAPH_FULL_AND_PIECEWISE:
            return 2.0 * n_layers + 1.0
    return n_layers * p.kernels_layer + 3.0


@njit(cache=True)
def iteration_components_nb(p, tp_tok, n_pf, n_logit, pairs, kv_pf, n_dec, kv_dec):
    tokens = tp_tok + n_dec
    seqs = n_pf + n_dec
    if tokens <= 0.0:
        return 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
    padded = graph_tokens_nb(p.graph_sizes, tokens)
    m = padded if padded > 0.0 else tokens
    # GEMMs per layer
    g_attn = _gemms_nb(p, m, p.attn_k, p.attn_n)
    g_dense = _gemms_nb(p, m, p.mlp_k, p.mlp_n)
    g_moe = 0.0
    if p.n_moe_layers > 0.0:
        g_moe = _experts_nb(p, m) + _gemms_nb(p, m, p.sh_k, p.sh_n)
        g_moe += gemm_time_nb(m, p.hidden, p.router_n, 2.0, 2.0, p.attn_peak, p.hbm_bw,
                              p.gemm_max, p.gemm_half, p.hbm_frac, p.latency)
    gemm = p.n_dense_layers * (g_attn + g_dense) + p.n_moe_layers * (g_attn + g_moe)
    # LM head for the sampled sequences (vocab-parallel) + gather of logits across TP
    gemm += gemm_time_nb(n_logit, p.hidden, p.vocab_gpu, 2.0, 2.0, p.attn_peak, p.hbm_bw,
                         p.gemm_max, p.gemm_half, p.hbm_frac, p.latency)
    n_layers = p.n_dense_layers + p.n_moe_layers
    # attention per layer, on the real sequences
    a = 0.0
    if tp_tok > 0.0:
        a += roofline_time_nb(pairs * p.attn_flops_pair, kv_pf * p.kv_bytes_tok_layer + tp_tok * p.q_bytes_tok_layer,
                              p.attn_peak, p.attn_prefill_max, p.hbm_bw, p.hbm_frac, p.attn_pf_latency)
    if n_dec > 0.0:
        a += roofline_time_nb(kv_dec * p.attn_flops_kv_decode, kv_dec * p.kv_bytes_tok_layer + n_dec * p.q_bytes_tok_layer,
                              p.attn_peak, p.attn_prefill_max, p.hbm_bw, p.attn_decode_frac, p.attn_dec_latency)
    attn = n_layers * a
    elem = n_layers * (m * p.elem_s_tok_layer + p.elem_kernels * p.elem_latency)
    # tensor parallelism: two all-reduces of the hidden state per layer (Shoeybi et al. 2019, sec. 3)
    comm_tp = 0.0
    if p.tp > 1.0:
        msg = m * p.hidden * 2.0
        if p.ar_custom > 0.0 and msg <= p.ar_max_bytes:
            ar = custom_allreduce_time_nb(msg, p.tp, p.ar_bw, p.ar_alpha)
        else:
            ar = p.coll_base + allreduce_time_nb(msg, p.tp, p.tp_bw, p.tp_alpha, int(p.tp_algorithm))
        comm_tp = 2.0 * n_layers * ar + p.coll_base + reduce_scatter_time_nb(
            n_logit * p.vocab_gpu * p.tp * 4.0, p.tp, p.tp_bw, p.tp_alpha)
    send = 0.0
    if p.pp > 1.0:
        send = p2p_time_nb(tokens * p.hidden * 2.0, p.pp_bw, p.pp_alpha, p.pp_bw_large, p.pp_large_bytes)
    body = gemm + attn + elem + comm_tp
    cpu = launches_nb(p, n_pf, n_layers, padded) * p.launch
    busy = max(body, cpu)
    host = p.overhead + p.overhead_seq * seqs
    if p.host_overlap > 0.0:
        step = max(busy, host)
    else:
        step = busy + host
    overhead = step - body
    latency = step + (p.pp - 1.0) * send
    interval = body / p.pp + send + overhead
    flops = 2.0 * p.active_params_gpu * p.tp * p.pp * tokens + n_layers * p.tp * (
        pairs * p.attn_flops_pair + kv_dec * p.attn_flops_kv_decode)
    nbytes = p.active_params_gpu * p.tp * p.pp * p.w_bytes + n_layers * p.tp * p.kv_bytes_tok_layer * (kv_pf + kv_dec)
    return gemm, attn, elem, comm_tp + (p.pp - 1.0) * send, overhead, latency, interval, flops, nbytes


@njit(cache=True)
def iteration_time_nb(p, tp_tok, n_pf, n_logit, pairs, kv_pf, n_dec, kv_dec):
    """(latency, interval) of one iteration; see iteration_components_nb."""
    r = iteration_components_nb(p, tp_tok, n_pf, n_logit, pairs, kv_pf, n_dec, kv_dec)
    return r[5], r[6]
