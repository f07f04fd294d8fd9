"""The cost parameters of one replica: `CostParams`, the typed record Python code reads, and `table`,
the same values as one float64 array, the form every jitted cost function takes.

Numba passes a NamedTuple as one argument per field (this one's ~125 floats and ~20 arrays became
~265 LLVM arguments at every call, and the event loop carried one per pool), which made the cold
compile slow; one array is one argument. The table holds the scalar fields at fixed indices (in
`CostParams` order), then two slots per array field (its start in the table and its length), then
the arrays' values one after another. This module's attributes name the indices: a scalar field's
value is ``p[F.g_max]`` and an array field is ``array_nb(p, F.attn_k)``, a view (``F`` this module;
numba reads a module's int attributes as compile-time constants). The arrays that hold counts (tile
and CUDA-graph sizes) are small integers, exact in float64.
"""
from __future__ import annotations

from typing import NamedTuple, get_type_hints

import numpy as np
from numba import njit
from ..jit import JIT


class CostParams(NamedTuple):
    """Everything the jitted step cost needs, per replica, per GPU, in SI units."""
    tp: float
    pp: float
    peak: float                  # FLOP/s of the GEMM compute dtype
    attn_peak: float             # FLOP/s for attention and 16-bit GEMMs (LM head, router)
    hbm_bw: float
    sms: float                   # streaming multiprocessors (wave quantisation)
    g_max: float                 # the engine's GEMMs (kernels.gemm_time_nb) at the weight dtype
    g_latency: float
    g_wo: float                  # 1: weight-only GEMMs (kernels.weight_only_gemm_time_nb)
    g_quant: float               # W8A8: seconds per activation element of its quantisation (0: none)
    g16_max: float               # ... and in 16 bits (LM head, router)
    g16_latency: float
    g_hbm: float
    g_splitk: float
    g_tile_k: float
    g_mem_latency: float
    w_bytes: float               # per weight element
    a_bytes: float               # per activation element
    hidden: float
    n_dense_layers: float
    n_moe_layers: float
    heads: float                 # attention heads per GPU
    kv_heads: float              # KV heads per GPU
    head_dim: float
    kv_elem_bytes: float         # bytes per KV-cache element
    mla: float                   # 1: multi-head latent attention (priced by its FLOPs and latent bytes)
    kv_bytes_tok_layer: float    # per GPU
    q_bytes_tok_layer: float     # query + output per token per layer per GPU (16-bit)
    attn_flops_pair: float       # prefill FLOPs per (query, key) pair per layer per GPU
    attn_flops_kv_decode: float  # decode FLOPs per cached token per layer per GPU
    attn_pf_max: float           # engine prefill attention (kernels.prefill_attention_time_nb)
    attn_pf_hbm: float
    attn_pf_block: float
    attn_pf_latency: float
    attn_dec_hbm: float          # engine decode attention (kernels.decode_attention_time_nb)
    attn_dec_block: float
    attn_dec_latency: float
    attn_dec_split: float        # the split-KV combine kernel at small batches
    attn_dec_split_seqs: float   # split-KV: sequences x splits per KV head (kernels.decode_splits_nb)
    attn_dec_block_bw: float     # bytes/s one decode thread block reads (0: no cap)
    attn_dec_max: float          # MLA: absorbed decode's fraction of the 16-bit peak (the attn_* keys above are
    mla_latent: float            # then the engine's MLA kernel fit: attention_kernel_params); the latent width
    mla_rope: float              # ... the shared rope key width
    mla_v: float                 # ... and the value head width (head_dim is the query/key width)
    elem_s_tok_layer: float      # bandwidth time per token of a layer's elementwise kernels
    elem_bytes_tok_layer: float  # ... and their HBM bytes per token (per GPU)
    elem_kernels: float          # elementwise kernels per layer
    elem_latency: float          # fixed time per elementwise kernel
    coll_base: float             # NCCL: base latency per collective call (not point-to-point sends)
    experts: float
    top_k: float
    router_n: float
    moe_eff: float               # fused MoE kernels (kernels.moe_experts_time_nb)
    moe_latency: float
    moe_pair: float
    moe_ridge: float             # tile intensity cap of the fused MoE (kernels.moe_tile_fraction_nb)
    moe_stream: float            # weight bytes per K step at the full streaming rate (kernels.moe_stream_fraction_nb)
    exp_inter: float             # one expert's FFN width per GPU
    gated: float
    vocab_gpu: float
    tp_bw: float                 # NCCL over the TP group's link
    tp_alpha: float
    tp_algorithm: float
    ar_custom: float             # 1: the engine's own all-reduce serves this TP group (up to ar_max_bytes)
    ar_link_bw: float            # one direction of the scale-up link, B/s
    ar_frac: float
    ar_latency: float
    ar_step: float
    ar_eager: float              # extra host time of an eager call of it
    ar_max_bytes: float
    pp_bw: float
    pp_alpha: float
    pp_bw_large: float           # PP send rate above pp_large_bytes (collectives.p2p_link)
    pp_large_bytes: float
    swap_bw: float
    swap_alpha: float
    step_gpu: float              # GPU time per step outside the forward (engine profile)
    overhead: float              # host time per engine step (engine profile)
    overhead_seq: float          # host time per scheduled sequence per step
    host_overlap: float          # 1: host work overlaps the GPU (the step is the longer of the two)
    graph_mode: float            # GRAPH_* code of the engine's CUDA-graph mode
    graph_max: float             # largest captured batch, tokens (0: none)
    launch: float                # CPU time per kernel launched outside a CUDA graph
    kernels_layer: float         # kernels one layer launches when eager
    active_params_gpu: float     # weights touched per token (for MFU)
    ep: float                    # expert parallelism (costmodel/ep.py); 1: experts split by TP only
    attn_dp: float               # data-parallel attention ranks (each runs its own whole requests)
    ep_masked: float             # 1: the fused MoE walks the remote experts' pairs (attn_dp = 1)
    a2a_bw: float                # all-to-all inside the scale-up domain: B/s, latency (ep.alltoall_link)
    a2a_alpha: float
    a2a_bw_out: float            # ... and over the NIC
    a2a_alpha_out: float
    a2a_domain: float            # EP ranks per scale-up domain
    a2a_dispatch_bytes: float    # bytes per element of the dispatch (1: fp8, W8A8 and fp4 models)
    attn_k: np.ndarray           # GEMM shapes per layer, per GPU
    attn_n: np.ndarray
    mlp_k: np.ndarray
    mlp_n: np.ndarray
    sh_k: np.ndarray
    sh_n: np.ndarray
    moe_tile_keys: np.ndarray    # the fused-MoE kernel's tile per batch-size key (costmodel/moe_tiles.py);
    moe_tile_m: np.ndarray       # empty: the kernel formula's own tile choice
    moe_tile_n: np.ndarray
    moe_tile_k: np.ndarray
    graph_sizes: np.ndarray      # captured batch sizes (tokens), increasing
    skew_grid: np.ndarray        # the slowest EP rank's pairs and touched experts per token count
    skew_pairs: np.ndarray       # (ep.skew_table; empty: balanced)
    skew_touched: np.ndarray
    tab_gemm: np.ndarray         # per (padded) token count m: all layers' GEMMs, elementwise kernels and
    tab_elem: np.ndarray         # all-reduces of one forward (layer_costs_nb), filled by lower()
    tab_comm: np.ndarray
    tab_lm: np.ndarray           # per sampled rows: the LM head's seconds and HBM bytes
    tab_lm_bytes: np.ndarray     # (iteration._lm_head_nb), filled by lower() too


_types = get_type_hints(CostParams)
SCALARS = tuple(f for f in CostParams._fields if _types[f] is float)
ARRAYS = tuple(f for f in CostParams._fields if _types[f] is np.ndarray)
assert len(SCALARS) + len(ARRAYS) == len(CostParams._fields), "CostParams: a field neither float nor np.ndarray"
HEADER = len(SCALARS) + 2 * len(ARRAYS)     # where the arrays' values start
for _i, _name in enumerate(SCALARS + ARRAYS):
    assert _name not in globals(), f"CostParams field {_name} shadows fields.{_name}"
    globals()[_name] = _i if _i < len(SCALARS) else len(SCALARS) + 2 * (_i - len(SCALARS))
del _i, _name, _types


def table(p: CostParams) -> np.ndarray:
    """``p`` as one float64 array (the layout above); pack once per configuration, not per call."""
    arrays = [np.asarray(getattr(p, a), dtype=np.float64).reshape(-1) for a in ARRAYS]
    out = np.empty(HEADER + sum(a.shape[0] for a in arrays))
    out[:len(SCALARS)] = [getattr(p, s) for s in SCALARS]
    at = HEADER
    for j, a in enumerate(arrays):
        out[len(SCALARS) + 2 * j] = at
        out[len(SCALARS) + 2 * j + 1] = a.shape[0]
        out[at:at + a.shape[0]] = a
        at += a.shape[0]
    return out


def tables(ps) -> np.ndarray:
    """The tables of several CostParams (one per pool) as the rows of one 2-D array, each row padded
    with zeros to the longest (a row's own slots say where its arrays end)."""
    rows = [table(p) for p in ps]
    out = np.zeros((len(rows), max(r.shape[0] for r in rows)))
    for k, r in enumerate(rows):
        out[k, :r.shape[0]] = r
    return out


@njit(**JIT)
def array_nb(p, field):
    """The array field at slot ``field`` of the table ``p`` (e.g. ``F.attn_k``): a view, no copy."""
    start = int(p[field])
    return p[start:start + int(p[field + 1])]
