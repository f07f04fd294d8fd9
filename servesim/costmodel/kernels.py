"""Kernel-level cost of an engine on a GPU: GEMM, attention, all-reduce, fused MoE. Scalar, jitted.

These are the formulas fitted to NVIDIA AIConfigurator's per-kernel latencies measured inside vLLM,
SGLang and TensorRT-LLM under CUDA graphs (``servesim/calibrate/engine_kernels.py``; report in
``experiments/results/engine_kernels_validation.md``). Every argument is passed explicitly, in SI
units (seconds, bytes, bytes/s, FLOP/s); fractions are of a datasheet figure of the hardware
profile. Nothing here reads a profile or a global parameter: only the fixed tile shapes below,
which are constants of the kernels, not fitted values.

Sources of the forms:

- Roofline: Williams, Waterman & Patterson, "Roofline", CACM 52(4), 2009: a kernel takes the larger
  of its compute and its memory time.
- Tile and wave quantisation: NVIDIA, "Matrix Multiplication Background User's Guide" (Deep
  Learning Performance documentation), sections "Tile quantization" and "Wave quantization": the
  output is cut into Tm x Tn tiles, one thread block each, run in waves of one block per SM; a
  partial last wave costs a whole wave.
- Split-K: CUTLASS documentation, "Efficient GEMM in CUDA" (parallelized reductions, split-K
  across thread blocks), and the same in cuBLAS heuristics: when the output tiles do not fill the
  SMs the K loop is cut into slices whose partial sums are reduced afterwards.
- FlashAttention: Dao et al., "FlashAttention", NeurIPS 2022 (one thread block per (sequence,
  head, query block), looping over key blocks; causal masking skips the blocks above the diagonal);
  Shah et al., "FlashAttention-3", 2024 (query and key blocks of 128 for head_dim 128 on Hopper).
- Decode attention: Kwon et al., "PagedAttention", SOSP 2023, and Dao et al. "Flash-Decoding"
  (2023): one query per sequence, bound by reading the cached K and V.
- All-reduce: one-shot / two-shot custom all-reduce over NVLink peer memory (vLLM
  ``csrc/custom_all_reduce.cuh``, TensorRT-LLM ``customAllReduceKernels``); two-shot and ring move
  2(n-1)/n of the message per GPU (Patarasuk & Yuan, JPDC 2009; Thakur et al., IJHPCA 2005).
- Fused MoE: the routed experts as one grouped GEMM over the experts that received tokens
  (vLLM ``fused_moe`` Triton kernel, TensorRT-LLM CUTLASS MoE GEMM).
"""
from __future__ import annotations

import math

from numba import njit
from ..jit import JIT

# GEMM arguments are (m, k, n) as in servesim.costmodel.roofline: X[m, k] W[n, k]^T, m = tokens.
# Output tile of a GEMM thread block: Tn = 128 columns and Tm = 64 or 128 rows, whichever is faster
# (cuBLAS and CUTLASS ship both; Hopper's warpgroup MMA is 64 rows per warpgroup, Ampere's CUTLASS
# default threadblock tile is 128 x 128). Chosen from the AIConfigurator data: this pair fits the
# H100 and A100 bf16 tables better than 128 x 128 alone or 128 x 256 (experiments/results/
# engine_kernels_validation.md), and it is not a fitted continuum.
GEMM_TILE_N = 128.0
GEMM_TILE_M_SMALL = 64.0
GEMM_TILE_M = 128.0
# Fused-MoE kernels also run 16-row tiles when each expert gets few tokens (vLLM fused_moe.py
# get_default_config: BLOCK_SIZE_M = 16 for small batches; TensorRT-LLM's grouped GEMM likewise).
MOE_TILE_M_SMALL = 16.0
# Split-K never makes a K slice shorter than this (a few pipeline stages of 64-wide K steps).
SPLITK_MIN_K = 256.0
# Weight-only (int4 weight, 16-bit activation) GEMMs run a 16-row tile up to 16 tokens: Marlin's
# m-block is one 16-row mma tile (Frantar et al. 2024; IST-DASLab/marlin thread_m_blocks), TensorRT-LLM
# runs its weight-only batched GEMV; AIConfigurator's A100 int4 rows step up between m = 16 and 32
# (experiments/results/weight_only_validation.md).
WO_TILE_M = 16.0
WO_SMALL_M = 16.0
# FlashAttention query and key block for head_dim 128 (FlashAttention-2/3: kBlockM = 128).
ATTN_BLOCK = 128.0


@njit(inline="always", **JIT)
def gemm_waves_nb(m, n, tile_m, tile_n, sm_count, splits):
    """Waves of thread blocks: ceil(ceil(m / Tm) * ceil(n / Tn) * splits / SMs) (NVIDIA GEMM guide,
    wave quantization). 133 tiles on 132 SMs take 2 waves."""
    tiles = math.ceil(m / tile_m) * math.ceil(n / tile_n)
    return float(math.ceil(tiles * splits / sm_count))


@njit(**JIT)
def gemm_wave_efficiency_nb(m, n, tile_m, tile_n, sm_count, splits):
    """q = m n splits / (waves * SMs * Tm * Tn) <= 1: the useful fraction of the tensor-core work the
    waves pay for (tile quantisation of m and n, wave quantisation over the SMs)."""
    if m <= 0.0 or n <= 0.0:
        return 0.0
    waves = gemm_waves_nb(m, n, tile_m, tile_n, sm_count, splits)
    return m * n * splits / (waves * sm_count * tile_m * tile_n)


@njit(inline="always", **JIT)
def gemm_splits_nb(m, k, n, tile_m, tile_n, sm_count):
    """Split-K slices when the output tiles do not fill the SMs: floor(SMs / tiles), at most
    k / SPLITK_MIN_K; 1 when the tiles already fill a wave."""
    tiles = math.ceil(m / tile_m) * math.ceil(n / tile_n)
    if tiles >= sm_count:
        return 1.0
    return float(max(1, min(int(sm_count // tiles), int(k // SPLITK_MIN_K))))


@njit(**JIT)
def gemm_compute_time_nb(m, k, n, tile_m, tile_n, splits, sm_count, peak, gemm_max, tile_overhead_k):
    """Tensor-core time of one tile choice: waves x the time one SM spends on a tile,
    2 Tm Tn (k / splits + k0 rows / Tm) / (peak * gemm_max / SMs). k0 = ``tile_overhead_k`` is the
    fixed work of a full tile besides its K loop (the epilogue that stores the output tile, the
    pipeline fill) in units of K steps, scaled by the tile's valid rows, rows = m / ceil(m / Tm)
    (a tile of a 1-token GEMM stores one row); with k0 = 0 and full waves this is exactly
    2mnk / (peak * gemm_max)."""
    waves = gemm_waves_nb(m, n, tile_m, tile_n, sm_count, splits)
    per_sm = peak * gemm_max / sm_count
    rows = m / math.ceil(m / tile_m)          # valid rows per tile: the epilogue stores only these
    return waves * 2.0 * tile_m * tile_n * (k / splits + tile_overhead_k * rows / tile_m) / per_sm


@njit(**JIT)
def gemm_bytes_nb(m, k, n, w_bytes, a_bytes):
    """HBM bytes of X[m, k] W[n, k]^T: the weights once, activations in and out."""
    return n * k * w_bytes + m * (n + k) * a_bytes


@njit(**JIT)
def gemm_time_nb(m, k, n, w_bytes, a_bytes, peak, hbm_bw, sm_count, gemm_max, hbm_fraction, latency,
                 splitk_latency, tile_overhead_k, mem_latency):
    """One GEMM X[m, k] W[n, k]^T (m = tokens; arguments in the order of ``roofline.gemm_time_nb``:
    m, k, n) under a CUDA graph, in seconds:

        latency + max(tensor-core time, mem_latency + bytes / (hbm_bw * hbm_fraction))      (roofline)

    tensor-core time from ``gemm_compute_time_nb``, minimised over the tile rows Tm in {64, 128}
    (Tn = 128) and, when the tiles do not fill the SMs, over split-K (``gemm_splits_nb``), which
    adds ``splitk_latency`` (the reduction of the partial sums). bytes = n k w + m (n + k) a.
    At small m the weights dominate and the GEMM is bandwidth-bound until 2mnk / bytes crosses the
    ridge peak * gemm_max / (hbm_bw * hbm_fraction); at large m it is compute-bound at gemm_max of
    ``peak`` less tile and wave quantisation. ``mem_latency`` is the ramp of a bandwidth-bound kernel
    (the first loads' DRAM latency before the stream reaches its rate, Little's law), which a
    compute-bound kernel hides under its math.
    """
    if m <= 0.0 or n <= 0.0 or k <= 0.0:
        return 0.0
    t_mem = mem_latency + gemm_bytes_nb(m, k, n, w_bytes, a_bytes) / (hbm_bw * hbm_fraction)
    best = math.inf
    for i in range(2):
        tile_m = GEMM_TILE_M_SMALL if i == 0 else GEMM_TILE_M
        t = max(gemm_compute_time_nb(m, k, n, tile_m, GEMM_TILE_N, 1.0, sm_count, peak, gemm_max,
                                     tile_overhead_k), t_mem)
        best = min(best, t)
        splits = gemm_splits_nb(m, k, n, tile_m, GEMM_TILE_N, sm_count)
        if splits > 1.0:
            t = max(gemm_compute_time_nb(m, k, n, tile_m, GEMM_TILE_N, splits, sm_count, peak, gemm_max,
                                         tile_overhead_k), t_mem) + splitk_latency
            best = min(best, t)
    return latency + best


@njit(**JIT)
def weight_only_gemm_time_nb(m, k, n, w_bytes, peak, hbm_bw, sm_count, gemm_max, hbm_fraction, latency,
                             splitk_latency, tile_overhead_k, mem_latency):
    """A weight-only quantised GEMM (int4 weights, 16-bit activations: AWQ/GPTQ Marlin in vLLM,
    TensorRT-LLM's fpA_intB), in seconds. The kernel streams the packed weights (``w_bytes`` per
    element, with their scales), dequantises them in registers and multiplies at the 16-bit
    tensor-core ``peak`` (Frantar et al., "MARLIN", 2024). Up to ``WO_SMALL_M`` tokens it runs one
    16-row tile per output column block (Marlin's 16-row m-block; TensorRT-LLM's batched GEMV), so a
    decode step is bound by the weight bytes, not by a 64-row tile of padded tensor-core work; above,
    the dense GEMM's tiles (``gemm_time_nb``). The dequantisation shows as a longer fixed time
    (``latency``, fitted: experiments/fit_weight_only.py); on AIConfigurator's A100 TensorRT-LLM int4
    rows the compute and bandwidth fractions are the bf16 GEMM's within 3%."""
    if m <= 0.0 or n <= 0.0 or k <= 0.0:
        return 0.0
    if m > WO_SMALL_M:
        return gemm_time_nb(m, k, n, w_bytes, 2.0, peak, hbm_bw, sm_count, gemm_max, hbm_fraction, latency,
                            splitk_latency, tile_overhead_k, mem_latency)
    t_mem = mem_latency + gemm_bytes_nb(m, k, n, w_bytes, 2.0) / (hbm_bw * hbm_fraction)
    t = max(gemm_compute_time_nb(m, k, n, WO_TILE_M, GEMM_TILE_N, 1.0, sm_count, peak, gemm_max, tile_overhead_k),
            t_mem)
    splits = gemm_splits_nb(m, k, n, WO_TILE_M, GEMM_TILE_N, sm_count)
    if splits > 1.0:
        t = min(t, max(gemm_compute_time_nb(m, k, n, WO_TILE_M, GEMM_TILE_N, splits, sm_count, peak, gemm_max,
                                            tile_overhead_k), t_mem) + splitk_latency)
    return latency + t


@njit(**JIT)
def gemm_ridge_tokens_nb(k, n, w_bytes, a_bytes, peak, gemm_max, hbm_bw, hbm_fraction):
    """The m where 2mnk / (peak gemm_max) = (nk w + m (n + k) a) / (hbm_bw hbm_fraction): below it a
    full-wave GEMM is bandwidth-bound, above it compute-bound (inf if never compute-bound)."""
    rate_c = 2.0 * n * k / (peak * gemm_max)
    rate_m = (n + k) * a_bytes / (hbm_bw * hbm_fraction)
    if rate_c <= rate_m:
        return math.inf
    return n * k * w_bytes / (hbm_bw * hbm_fraction) / (rate_c - rate_m)


@njit(**JIT)
def grouped_gemm_time_nb(groups, m, k, n, w_bytes, a_bytes, peak, hbm_bw, sm_count, compute_fraction,
                         hbm_fraction, tile_overhead_k):
    """``groups`` independent GEMMs (m, k, n as in ``gemm_time_nb``) in one launch (no latency): the roofline of
    ``gemm_time_nb`` over all their tiles together, groups * ceil(m / Tm) * ceil(n / Tn) tiles in
    waves over the SMs, at ``compute_fraction`` of ``peak``; bytes = groups (n k w + m (n + k) a).
    No split-K (the groups fill the SMs)."""
    if groups <= 0.0 or m <= 0.0:
        return 0.0
    t_mem = groups * gemm_bytes_nb(m, k, n, w_bytes, a_bytes) / (hbm_bw * hbm_fraction)
    per_sm = peak * compute_fraction / sm_count
    best = math.inf
    for i in range(3):
        tile_m = MOE_TILE_M_SMALL if i == 0 else (GEMM_TILE_M_SMALL if i == 1 else GEMM_TILE_M)
        tiles = groups * math.ceil(m / tile_m) * math.ceil(n / GEMM_TILE_N)
        waves = math.ceil(tiles / sm_count)
        t_c = waves * 2.0 * tile_m * GEMM_TILE_N * (k + tile_overhead_k) / per_sm
        best = min(best, max(t_c, t_mem))
    return best


@njit(**JIT)
def moe_tile_fraction_nb(tile_m, tile_n, ridge):
    """Fraction of the tensor-core rate a fused-MoE tile of tile_m x tile_n outputs can feed:
    min(1, I / ridge), I = tile_m tile_n / (tile_m + tile_n) the multiply-adds per operand element
    a K step loads (both operands streamed through shared memory from L2, the weights not reused
    across tiles). ``ridge`` is the intensity at which the L2 feed matches the tensor cores
    (roofline over the L2 level, Williams et al. 2009); 0 switches the cap off."""
    if ridge <= 0.0:
        return 1.0
    return min(1.0, tile_m * tile_n / (tile_m + tile_n) / ridge)


@njit(**JIT)
def moe_stream_fraction_nb(tile_k, w_bytes, stream_bytes):
    """Fraction of the GEMM's weight-streaming rate a fused-MoE tile reaches when each K step reads
    ``tile_k`` contiguous weights of every row of its weight tile: min(1, tile_k w_bytes /
    ``stream_bytes``), ``stream_bytes`` the contiguous run at which HBM streams at the full rate (fitted:
    vLLM's default 64 x 64 config reads 32-element, 64-byte runs and streams its weights at ~0.66 of
    the datasheet bandwidth where the tuned tiles' 64-256-element runs reach ~0.88;
    experiments/results/engine_kernels_validation.md). 0 (or tile_k unknown): no cap."""
    if stream_bytes <= 0.0 or tile_k <= 0.0:
        return 1.0
    return min(1.0, tile_k * w_bytes / stream_bytes)


@njit(**JIT)
def moe_experts_time_nb(assignments, touched, routed_pairs, hidden, inter, gated, w_bytes, a_bytes, peak, hbm_bw,
                        sm_count, gemm_max, hbm_fraction, tile_overhead_k, moe_efficiency, moe_latency, pair_time,
                        tile_m, tile_n, ridge, tile_k, stream_bytes):
    """The routed experts of one MoE layer on one GPU, in seconds:

        moe_latency + routed_pairs x pair_time + grouped(up) + grouped(down)

    ``assignments`` = token-expert pairs this GPU computes (tokens x top_k / EP), ``touched`` = the
    distinct local experts that received at least one (the caller's routing model: for uniform
    random routing E (1 - (1 - k/E)^T) experts, Feller vol. 1 ch. IV; for a balanced router
    min(E, T k)); each touched expert runs m = assignments / touched rows. ``inter`` is the expert
    width on this GPU (intermediate / TP); the up projection is 2 x inter wide when ``gated``.

    Tiles: ``tile_m`` x ``tile_n`` > 0 is the block the engine's kernel runs for this batch (vLLM's
    Triton ``fused_moe`` reads it from its tuned config for (experts, width, device, dtype), or
    takes its default; ``servesim/costmodel/moe_tiles.py``), at ``moe_efficiency`` x ``gemm_max``
    of ``peak`` times ``moe_tile_fraction_nb(tile_m, tile_n, ridge)``; ``tile_m`` <= 0: the faster
    of 16, 64 and 128 rows x 128 columns at ``moe_efficiency`` x ``gemm_max`` (engines whose tiles are
    not known). Bytes as the dense GEMM's (``gemm_bytes_nb``) at ``hbm_fraction``; a known tile's
    weights stream at ``moe_stream_fraction_nb(tile_k, w_bytes, stream_bytes)`` of that rate (the
    kernel's K step, ``tile_k`` elements, is the contiguous run it reads of each weight row).
    The routing, sort/align, permute and un-permute kernels cost ``moe_latency`` plus ``pair_time``
    per routed token-expert pair they see, ``routed_pairs`` = tokens x top_k of the whole layer
    input (under EP the fused kernels still walk every routed pair and skip the remote experts'
    blocks: vLLM ``moe_align_block_size`` / ``expert_map``).
    """
    if assignments <= 0.0 or touched <= 0.0:
        return 0.0
    m = assignments / touched
    up_n = 2.0 * inter if gated else inter
    frac = gemm_max * moe_efficiency
    if tile_m > 0.0:
        frac *= moe_tile_fraction_nb(tile_m, tile_n, ridge)
        w_eff = w_bytes / moe_stream_fraction_nb(tile_k, w_bytes, stream_bytes)
        t = tiled_group_time_nb(touched, m, hidden, up_n, w_eff, a_bytes, peak, hbm_bw, sm_count, frac,
                                hbm_fraction, tile_overhead_k, tile_m, tile_n)
        t += tiled_group_time_nb(touched, m, inter, hidden, w_eff, a_bytes, peak, hbm_bw, sm_count, frac,
                                 hbm_fraction, tile_overhead_k, tile_m, tile_n)
    else:
        t = grouped_gemm_time_nb(touched, m, hidden, up_n, w_bytes, a_bytes, peak, hbm_bw, sm_count, frac,
                                 hbm_fraction, tile_overhead_k)
        t += grouped_gemm_time_nb(touched, m, inter, hidden, w_bytes, a_bytes, peak, hbm_bw, sm_count, frac,
                                  hbm_fraction, tile_overhead_k)
    return moe_latency + routed_pairs * pair_time + t


@njit(**JIT)
def tiled_group_time_nb(groups, m, k, n, w_bytes, a_bytes, peak, hbm_bw, sm_count, compute_fraction, hbm_fraction,
                        tile_overhead_k, tile_m, tile_n):
    """``groups`` GEMMs of m x k x n in one launch with a given tile: groups ceil(m / Tm) ceil(n / Tn)
    tiles in waves over the SMs, each 2 Tm Tn (k + k0) FLOPs at ``compute_fraction`` of ``peak``,
    against the bytes of all groups at ``hbm_fraction`` (the roofline of ``grouped_gemm_time_nb``
    with the engine's tile instead of the best of three)."""
    if groups <= 0.0 or m <= 0.0:
        return 0.0
    t_mem = groups * gemm_bytes_nb(m, k, n, w_bytes, a_bytes) / (hbm_bw * hbm_fraction)
    tiles = groups * math.ceil(m / tile_m) * math.ceil(n / tile_n)
    waves = math.ceil(tiles / sm_count)
    t_c = waves * 2.0 * tile_m * tile_n * (k + tile_overhead_k) / (peak * compute_fraction / sm_count)
    return max(t_c, t_mem)


@njit(**JIT)
def balanced_experts_nb(assignments, experts):
    """Distinct experts touched when a router spreads ``assignments`` token-expert pairs evenly over
    ``experts`` (AIConfigurator's ``balanced`` distribution): min(E, assignments)."""
    return min(experts, assignments)


@njit(inline="always", **JIT)
def prefill_attention_compute_nb(seqs, chunk, ctx, heads, head_dim, peak, sm_count, attn_max, block_overhead):
    """Tensor-core time of causal FlashAttention over ``seqs`` chunks of ``chunk`` new tokens with
    ``ctx`` tokens already cached each. One thread block per (sequence, head, query block of 128);
    query block j (1-based) attends to ctx + min(128 j, chunk) keys and costs
    (keys / 128 + ``block_overhead``) key blocks of 4 x 128 x 128 x head_dim FLOPs at
    ``attn_max`` of ``peak`` / SMs. Blocks run heaviest first (FlashAttention-2/3 causal
    scheduling) in waves of one per SM; a wave lasts as long as its heaviest block."""
    if seqs <= 0.0 or chunk <= 0.0:
        return 0.0
    nb = math.ceil(chunk / ATTN_BLOCK)
    bh = seqs * heads
    units = bh * nb
    waves = int(math.ceil(units / sm_count))
    per_block = 4.0 * ATTN_BLOCK * ATTN_BLOCK * head_dim / (peak * attn_max / sm_count)
    t = 0.0
    for w in range(waves):
        level = math.floor(w * sm_count / bh)   # 0 = the last (heaviest) query block
        j = nb - level
        keys = ctx + min(j * ATTN_BLOCK, chunk)
        t += per_block * (keys / ATTN_BLOCK + block_overhead)
    return t


@njit(inline="always", **JIT)
def prefill_attention_bytes_nb(seqs, chunk, ctx, heads, kv_heads, head_dim, q_bytes, kv_bytes):
    """HBM bytes of a prefill attention: per new token q read and o written (2 heads d q_bytes),
    its k and v read and written to the cache (4 kv_heads d kv_bytes); the cached prefix's k and v
    read (2 kv_heads d kv_bytes per cached token)."""
    return seqs * (chunk * (2.0 * heads * head_dim * q_bytes + 4.0 * kv_heads * head_dim * kv_bytes)
                   + ctx * 2.0 * kv_heads * head_dim * kv_bytes)


@njit(**JIT)
def prefill_attention_time_nb(seqs, chunk, ctx, heads, kv_heads, head_dim, q_bytes, kv_bytes, peak, hbm_bw,
                              sm_count, attn_max, hbm_fraction, block_overhead, latency):
    """Prefill (context) attention of one layer on one GPU, in seconds:

        latency + compute (``prefill_attention_compute_nb``) + bytes / (hbm_bw * hbm_fraction)

    Compute and memory add rather than overlap: the engines' attention op runs its memory-side
    kernels (q/k/v layout, rope, KV-cache write) and the FlashAttention kernel one after the other,
    and the AIConfigurator tables are fitted better by the sum (see the report). Useful causal
    FLOPs are 4 heads head_dim pairs, pairs = chunk (ctx + (chunk + 1) / 2) per sequence."""
    if seqs <= 0.0 or chunk <= 0.0:
        return 0.0
    t_c = prefill_attention_compute_nb(seqs, chunk, ctx, heads, head_dim, peak, sm_count, attn_max, block_overhead)
    nbytes = prefill_attention_bytes_nb(seqs, chunk, ctx, heads, kv_heads, head_dim, q_bytes, kv_bytes)
    return latency + t_c + nbytes / (hbm_bw * hbm_fraction)


# FlashAttention's decode splits the KV of each (sequence, KV head) over several blocks, and adds a
# kernel combining their partial results, when fewer than 0.8 x SMs blocks would run unsplit
# (flash-attention csrc/flash_attn/flash_api.cpp, num_splits_heuristic).
DECODE_SPLIT_SM_SHARE = 0.8
# Keys per split-KV chunk: the split heuristic counts the KV in kBlockN-key blocks (128 for head
# dimension 128: flash_fwd_launch_template.h, run_mha_fwd_splitkv_dispatch) and never splits a
# sequence of one block (num_splits_heuristic's is_split_eligible).
DECODE_SPLIT_KEYS = 128.0


@njit(inline="always", **JIT)
def decode_splits_nb(seqs, kv_tokens, split_seqs):
    """Split-KV chunks per (sequence, KV head): at most one per DECODE_SPLIT_KEYS keys of the mean
    context, and, where ``split_seqs`` > 0, about split_seqs / seqs (at least 1): the split count is
    sized by the number of sequences, not by the KV heads (FlashAttention 3's varlen scheduler takes
    batch 1 for its upper bound and divides the splits among the sequences, flash_api.cpp
    get_num_splits and flash_prepare_scheduler.cu; measured: vLLM's H100 table takes 29.5 us for 8
    sequences x 1 KV head and 16.9 us for 1 x 8 at 4,095 cached tokens, the same bytes)."""
    chunks = max(math.ceil(kv_tokens / seqs / DECODE_SPLIT_KEYS), 1.0)
    if split_seqs <= 0.0:
        return chunks
    return min(max(split_seqs / seqs, 1.0), chunks)


@njit(**JIT)
def decode_attention_time_nb(seqs, kv_tokens, heads, kv_heads, head_dim, q_bytes, kv_bytes, hbm_bw, sm_count,
                             hbm_fraction, block_time, latency, split_latency=0.0, split_seqs=0.0, block_bw=0.0):
    """Decode (generation) attention of one layer on one GPU, in seconds: one query per sequence over
    ``kv_tokens`` cached tokens in all (the sum over the batch):

        latency + seqs kv_heads block_time / SMs + bytes / min(hbm_bw hbm_fraction, blocks block_bw)
        + split_latency when the KV is split (splits > 1) and seqs kv_heads < DECODE_SPLIT_SM_SHARE SMs
          (the combine kernel)

    bytes = kv_tokens 2 kv_heads d kv_bytes (K and V read once per KV head, GQA) + seqs 2 heads d
    q_bytes (q in, o out). One thread block per (sequence, KV head) costs ``block_time`` of one SM
    besides its bytes (launch, page-table walk, the final reduction), spread over the SMs; the
    tables show it as a floor proportional to seqs x kv_heads at short contexts. The KV streams
    through blocks = seqs kv_heads splits thread blocks (``decode_splits_nb``), each reading at
    most ``block_bw`` (bytes/s: the loads one SM keeps in flight, Little's law); too few blocks
    leave HBM idle. ``block_bw`` 0: no cap. FLOPs (4 heads d per cached token) are below the ridge
    for any GQA group and are not charged."""
    if seqs <= 0.0:
        return 0.0
    nbytes = kv_tokens * 2.0 * kv_heads * head_dim * kv_bytes + seqs * 2.0 * heads * head_dim * q_bytes
    splits = decode_splits_nb(seqs, kv_tokens, split_seqs)
    split = split_latency if splits > 1.0 and seqs * kv_heads < DECODE_SPLIT_SM_SHARE * sm_count else 0.0
    bw = hbm_bw * hbm_fraction
    if block_bw > 0.0:
        bw = min(bw, seqs * kv_heads * splits * block_bw)
    return latency + split + seqs * kv_heads * block_time / sm_count + nbytes / bw


# MLA (DeepSeek-V2/V3) decode kernels pack the query heads of one sequence, times its query tokens, into
# the rows of MMA tiles: vLLM's FlashMLA backend schedules max_query_len x num_q_heads query rows per
# sequence against its single latent KV head (vllm/v1/attention/backends/mla/flashmla.py, v0.15.1:
# num_q_tokens_per_head_k, "MQA for the decode path"), and Hopper's warpgroup MMA is 64 rows (PTX ISA,
# wgmma.mma_async shapes m64nNk16), so a sequence with fewer query rows still pays a 64-row tile.
MLA_HEAD_TILE = 64.0


@njit(**JIT)
def mla_decode_time_nb(seqs, q_rows, kv_tokens, heads, latent, rope, kv_bytes, peak, hbm_bw, sm_count,
                       compute_fraction, hbm_fraction, block_time, latency):
    """Absorbed MLA decode attention of one layer on one GPU (DeepSeek-V2, arXiv:2405.04434, sec. 2.1
    and app. C: W_UK folded into the query, W_UV into the output, so every head attends over the one
    cached latent), in seconds:

        latency + seqs g block_time / SMs + max(FLOPs / (peak compute_fraction), bytes / (hbm_bw hbm_fraction))

    ``q_rows`` query tokens per sequence (1 for a decode, K + 1 for a speculative verification),
    ``kv_tokens`` cached tokens summed over the batch, ``latent`` = kv_lora_rank, ``rope`` =
    qk_rope_head_dim. Each sequence's heads x q_rows query rows run as g = ceil(heads q_rows /
    MLA_HEAD_TILE) row tiles, each tile paying ``block_time`` of one SM (launch, page walk, the split
    combine) and the tensor-core work of full tiles: FLOPs = kv_tokens 2 g MLA_HEAD_TILE (2 latent +
    rope) (scores over latent + rope, values over the latent, for every padded row); bytes =
    the latent and rope key of every cached token once (``kv_bytes`` per element) + per query row
    heads (latent + rope) in and heads latent out (16-bit). Compute and bandwidth overlap (roofline:
    FlashMLA pipelines the KV loads under the MMAs)."""
    if seqs <= 0.0:
        return 0.0
    tiles = math.ceil(heads * q_rows / MLA_HEAD_TILE)
    flops = kv_tokens * 2.0 * tiles * MLA_HEAD_TILE * (2.0 * latent + rope)
    nbytes = kv_tokens * (latent + rope) * kv_bytes + seqs * q_rows * heads * (2.0 * latent + rope) * 2.0
    return (latency + seqs * tiles * block_time / sm_count
            + max(flops / (peak * compute_fraction), nbytes / (hbm_bw * hbm_fraction)))


@njit(**JIT)
def mla_prefill_time_nb(seqs, chunk, ctx, heads, qk_dim, v_dim, latent_bytes, peak, hbm_bw, sm_count, attn_max,
                        hbm_fraction, block_overhead, latency):
    """MLA prefill attention of one layer on one GPU, the non-absorbed form the engines run for prompts
    (DeepSeek-V2 sec. 2.1.2: K and V decompressed per head from the latent, then FlashAttention with
    ``qk_dim`` = qk_nope + qk_rope query/key width and ``v_dim`` value width), in seconds:

        latency + compute + bytes / (hbm_bw hbm_fraction)

    compute: ``prefill_attention_compute_nb`` at head width (qk_dim + v_dim) / 2 (its key block costs
    4 x 128 x 128 x d FLOPs, QK^T and PV, = 2 x 128 x 128 (qk_dim + v_dim)); bytes: per new token its
    q and o, its per-head k and v read (16-bit, heads (qk_dim + v_dim) each) and its latent written to
    the cache (``latent_bytes``); per cached-prefix token its decompressed k and v read. Compute and
    memory add, as in ``prefill_attention_time_nb``."""
    if seqs <= 0.0 or chunk <= 0.0:
        return 0.0
    width = heads * (qk_dim + v_dim) * 2.0
    t_c = prefill_attention_compute_nb(seqs, chunk, ctx, heads, 0.5 * (qk_dim + v_dim), peak, sm_count, attn_max,
                                       block_overhead)
    nbytes = seqs * (chunk * (2.0 * width + latent_bytes) + ctx * width)
    return latency + t_c + nbytes / (hbm_bw * hbm_fraction)


@njit(inline="always", **JIT)
def engine_allreduce_time_nb(nbytes, n, link_bw, bw_fraction, latency, step_latency):
    """The engine's own all-reduce of ``nbytes`` per GPU over ``n`` GPUs of one NVLink/NVSwitch
    domain, under a CUDA graph, in seconds: latency + the faster of

        one-shot: each GPU reads the n - 1 peer buffers       (n - 1) S / B
        two-shot: reduce-scatter + all-gather, one more step  step_latency + 2 (n - 1) / n S / B

    with B = link_bw (one direction per GPU) x bw_fraction. Large messages, where the engines hand
    over to NCCL's ring, move the same 2 (n - 1) / n S, so one form covers both. 0 for n <= 1."""
    if n <= 1.0 or nbytes <= 0.0:
        return 0.0
    bw = link_bw * bw_fraction
    one_shot = (n - 1.0) * nbytes / bw
    two_shot = step_latency + 2.0 * (n - 1.0) / n * nbytes / bw
    return latency + min(one_shot, two_shot)


@njit(**JIT)
def engine_allreduce_eager_time_nb(nbytes, n, link_bw, bw_fraction, latency, step_latency, launch, hbm_bw,
                                   hbm_fraction):
    """The same all-reduce called eagerly (outside a CUDA graph): the graph time + ``launch`` (the host
    launch and the IPC-handle bookkeeping) + a copy of the input into the registered buffer
    (2 S bytes at hbm_bw * hbm_fraction; vLLM/SGLang copy an unregistered tensor before reducing)."""
    if n <= 1.0 or nbytes <= 0.0:
        return 0.0
    return (engine_allreduce_time_nb(nbytes, n, link_bw, bw_fraction, latency, step_latency) + launch
            + 2.0 * nbytes / (hbm_bw * hbm_fraction))


__all__ = ["ATTN_BLOCK", "DECODE_SPLIT_KEYS", "DECODE_SPLIT_SM_SHARE", "GEMM_TILE_M", "GEMM_TILE_M_SMALL", "GEMM_TILE_N", "SPLITK_MIN_K", "balanced_experts_nb",
           "decode_attention_time_nb", "decode_splits_nb", "engine_allreduce_eager_time_nb", "engine_allreduce_time_nb",
           "gemm_bytes_nb", "gemm_compute_time_nb", "gemm_ridge_tokens_nb", "gemm_splits_nb", "gemm_time_nb",
           "gemm_wave_efficiency_nb", "gemm_waves_nb", "grouped_gemm_time_nb", "MLA_HEAD_TILE", "mla_decode_time_nb",
           "mla_prefill_time_nb", "moe_experts_time_nb", "moe_stream_fraction_nb", "moe_tile_fraction_nb",
           "tiled_group_time_nb",
           "prefill_attention_bytes_nb", "prefill_attention_compute_nb", "prefill_attention_time_nb",
           "WO_SMALL_M", "WO_TILE_M", "weight_only_gemm_time_nb"]
