"""Kernel cost formulas (servesim/costmodel/kernels.py): hand-checkable limits and slow, obvious twins."""
from __future__ import annotations

import math
import re

import numpy as np
import pytest

from servesim.config import load_hardware
from servesim.costmodel import kernels as kn
from servesim.errors import ConfigError
from servesim.paths import hardware_dir

PEAK = 989e12      # H100 SXM bf16 dense
BW = 3.35e12       # H100 SXM HBM3
SMS = 132
GMAX, HF, LAT, LAT_SK, K0 = 0.85, 0.8, 2e-6, 3e-6, 200.0


def gemm(m, n, k, *, w=2.0, a=2.0, peak=PEAK, bw=BW, sms=SMS, gmax=GMAX, hf=HF, lat=LAT, lat_sk=LAT_SK, k0=K0):
    return kn.gemm_time_nb(float(m), float(k), float(n), w, a, peak, bw, float(sms), gmax, hf, lat, lat_sk, k0, 0.0)


# -- slow twins ---------------------------------------------------------------------------------

def gemm_twin(m, n, k, w, a, peak, bw, sms, gmax, hf, lat, lat_sk, k0):
    """Enumerate the tile choices and split-K counts the way the docstring says, in plain Python."""
    t_mem = (n * k * w + m * (n + k) * a) / (bw * hf)
    options = []
    for tm in (64, 128):
        tiles = math.ceil(m / tm) * math.ceil(n / 128)
        choices = [1]
        if tiles < sms:
            s = max(1, min(sms // tiles, int(k // 256)))
            if s > 1:
                choices.append(s)
        for s in choices:
            units = tiles * s
            waves = math.ceil(units / sms)
            rows = m / math.ceil(m / tm)
            per_tile = 2 * tm * 128 * (k / s + k0 * rows / tm) / (peak * gmax / sms)
            options.append(max(waves * per_tile, t_mem) + (lat_sk if s > 1 else 0.0))
    return lat + min(options)


def prefill_compute_twin(seqs, chunk, ctx, heads, d, peak, sms, amax, overhead):
    """Every (sequence, head, query block) as a unit with its work, sorted heaviest first, cut into
    waves of `sms` units; a wave costs its heaviest unit."""
    nb = math.ceil(chunk / 128)
    work = []
    for _ in range(seqs * heads):
        for j in range(1, nb + 1):
            work.append((ctx + min(128 * j, chunk)) / 128 + overhead)
    work.sort(reverse=True)
    per_block = 4 * 128 * 128 * d / (peak * amax / sms)
    return sum(max(work[i:i + sms]) for i in range(0, len(work), sms)) * per_block


# -- GEMM ---------------------------------------------------------------------------------------

def test_waves_and_wave_efficiency():
    assert kn.gemm_waves_nb(128.0 * 132, 128.0, 128.0, 128.0, 132.0, 1.0) == 1.0
    assert kn.gemm_waves_nb(128.0 * 133, 128.0, 128.0, 128.0, 132.0, 1.0) == 2.0   # 133 tiles, 132 SMs
    assert kn.gemm_wave_efficiency_nb(128.0 * 133, 128.0, 128.0, 128.0, 132.0, 1.0) == pytest.approx(133 / 264)
    assert kn.gemm_wave_efficiency_nb(128.0 * 132, 128.0, 128.0, 128.0, 132.0, 1.0) == 1.0
    # tile quantisation: 129 rows need two 128-row tiles
    assert kn.gemm_wave_efficiency_nb(129.0, 128.0, 128.0, 128.0, 132.0, 1.0) == pytest.approx(129 / (132 * 128))
    assert kn.gemm_splits_nb(128.0, 65536.0, 128.0, 128.0, 128.0, 132.0) == 132.0   # 1 tile, split to fill
    assert kn.gemm_splits_nb(128.0, 1024.0, 128.0, 128.0, 128.0, 132.0) == 4.0      # no slice below 256
    assert kn.gemm_splits_nb(128.0 * 132, 65536.0, 128.0, 128.0, 128.0, 132.0) == 1.0


def test_tiny_m_gemm_is_latency_plus_bytes():
    m, n, k = 1.0, 4096.0, 4096.0
    expected = LAT + (n * k * 2 + m * (n + k) * 2) / (BW * HF)
    assert gemm(m, n, k) == pytest.approx(expected, rel=1e-12)


def test_huge_square_gemm_with_full_waves_is_compute_bound():
    # 12 x 11 = 132 tiles of 128 x 128 (and 264 of 64 x 128): whole waves, q = 1
    m, n, k = 128.0 * 12, 128.0 * 11, 16384.0
    flops = 2 * m * n * k
    assert gemm(m, n, k, k0=0.0) == pytest.approx(LAT + flops / (PEAK * GMAX), rel=1e-12)
    # the tile prologue/epilogue costs k0 more K steps per tile
    assert gemm(m, n, k) == pytest.approx(LAT + flops / (PEAK * GMAX) * (k + K0) / k, rel=1e-12)


def test_roofline_crosses_at_the_ridge_computed_by_hand():
    # n = 128 x 132: one row of 64- or 128-row tiles fills the SMs, so every m that is a multiple
    # of 64 runs whole waves (q = 1) and no split-K.
    n = k = 128.0 * 132
    peak, gmax, bw, hf = 1e15, 1.0, 2e12, 1.0
    ridge = (n * k * 2 / (bw * hf)) / (2 * n * k / (peak * gmax) - (n + k) * 2 / (bw * hf))   # by hand
    assert kn.gemm_ridge_tokens_nb(k, n, 2.0, 2.0, peak, gmax, bw, hf) == pytest.approx(ridge, rel=1e-12)
    assert 512 < ridge < 576
    below, above = 64 * math.floor(ridge / 64), 64 * math.ceil(ridge / 64)
    kw = dict(peak=peak, gmax=gmax, bw=bw, hf=hf, k0=0.0)
    mem = lambda m: LAT + (n * k * 2 + m * (n + k) * 2) / (bw * hf)   # noqa: E731
    comp = lambda m: LAT + 2 * m * n * k / (peak * gmax)               # noqa: E731
    assert gemm(below, n, k, **kw) == pytest.approx(mem(below), rel=1e-12)
    assert mem(below) > comp(below)
    assert gemm(above, n, k, **kw) == pytest.approx(comp(above), rel=1e-12)
    assert comp(above) > mem(above)


def test_split_k_for_a_skinny_long_k_gemm():
    # 128 x 128 output: two 64-row tiles on 132 SMs, so K is cut into 132 // 2 = 66 slices
    m, n, k = 128.0, 128.0, 65536.0
    no_split = LAT + 2 * 64 * 128 * (k + K0) / (PEAK * GMAX / SMS)   # the two tiles in one wave
    splits = 132 // 2
    expected = LAT + LAT_SK + max(2 * 64 * 128 * (k / splits + K0) / (PEAK * GMAX / SMS),
                                  (n * k * 2 + m * (n + k) * 2) / (BW * HF))
    assert gemm(m, n, k) == pytest.approx(expected, rel=1e-12)
    assert expected < no_split


def test_gemm_matches_its_twin_over_random_shapes():
    rng = np.random.default_rng(7)
    for _ in range(400):
        m = int(rng.choice([1, 3, 16, 33, 64, 100, 129, 257, 777, 1024, 4097, 8192]))
        n, k = (int(rng.choice([64, 128, 384, 1000, 4096, 5120, 14336, 65536])) for _ in range(2))
        w = float(rng.choice([1.0, 2.0]))
        args = (m, n, k, w, w, PEAK, BW, SMS, GMAX, HF, LAT, LAT_SK, K0)
        assert gemm(m, n, k, w=w, a=w) == pytest.approx(gemm_twin(*args), rel=1e-12), (m, n, k, w)


def test_gemm_monotone_in_tokens_at_full_waves_and_zero_for_empty():
    ts = [gemm(m, 8192, 8192) for m in (64, 128, 256, 512, 1024, 2048, 4096, 8192)]
    assert all(b >= a for a, b in zip(ts, ts[1:]))
    assert gemm(0, 4096, 4096) == 0.0


# -- attention ----------------------------------------------------------------------------------

def test_prefill_compute_one_unit_per_sm_per_level_is_the_padded_causal_triangle():
    nb = 16
    per_block = 4 * 128 * 128 * 128 / (PEAK * 0.6 / SMS)
    t = kn.prefill_attention_compute_nb(float(SMS), 128.0 * nb, 0.0, 1.0, 128.0, PEAK, float(SMS), 0.6, 0.0)
    assert t == pytest.approx(per_block * nb * (nb + 1) / 2, rel=1e-12)
    # with a cached prefix of 1024 tokens every query block also reads 8 more key blocks
    t = kn.prefill_attention_compute_nb(float(SMS), 128.0, 1024.0, 1.0, 128.0, PEAK, float(SMS), 0.6, 0.0)
    assert t == pytest.approx(per_block * (1024 / 128 + 1), rel=1e-12)


def test_prefill_compute_matches_its_twin():
    rng = np.random.default_rng(3)
    for _ in range(60):
        seqs = int(rng.choice([1, 2, 3, 8, 33]))
        heads = int(rng.choice([1, 4, 8, 40]))
        chunk = int(rng.choice([1, 16, 100, 128, 129, 1000, 2048, 3000]))
        ctx = int(rng.choice([0, 0, 77, 4096]))
        ov = float(rng.choice([0.0, 0.7]))
        got = kn.prefill_attention_compute_nb(float(seqs), float(chunk), float(ctx), float(heads), 128.0, PEAK,
                                              float(SMS), 0.6, ov)
        assert got == pytest.approx(prefill_compute_twin(seqs, chunk, ctx, heads, 128, PEAK, SMS, 0.6, ov),
                                    rel=1e-12), (seqs, chunk, ctx, heads, ov)


def test_prefill_large_work_tends_to_useful_flops_at_attn_max():
    # long sequences, many heads: waves are full and the diagonal padding is small
    seqs, chunk, heads, d, amax = 4.0, 16384.0, 66.0, 128.0, 0.6
    t = kn.prefill_attention_compute_nb(seqs, chunk, 0.0, heads, d, PEAK, float(SMS), amax, 0.0)
    useful = 4 * heads * d * seqs * chunk * (chunk + 1) / 2 / (PEAK * amax)
    assert 1.0 < t / useful < 1.02


def test_prefill_time_adds_latency_compute_and_bytes():
    args = dict(seqs=2.0, chunk=512.0, ctx=256.0, heads=32.0, kv_heads=8.0, d=128.0)
    t_c = kn.prefill_attention_compute_nb(2.0, 512.0, 256.0, 32.0, 128.0, PEAK, float(SMS), 0.6, 0.5)
    nbytes = 2 * (512 * (2 * 32 * 128 * 2 + 4 * 8 * 128 * 2) + 256 * 2 * 8 * 128 * 2)   # by hand
    assert kn.prefill_attention_bytes_nb(2.0, 512.0, 256.0, 32.0, 8.0, 128.0, 2.0, 2.0) == nbytes
    t = kn.prefill_attention_time_nb(args["seqs"], args["chunk"], args["ctx"], args["heads"], args["kv_heads"],
                                     args["d"], 2.0, 2.0, PEAK, BW, float(SMS), 0.6, 0.4, 0.5, 7e-6)
    assert t == pytest.approx(7e-6 + t_c + nbytes / (BW * 0.4), rel=1e-12)
    assert kn.prefill_attention_time_nb(0.0, 512.0, 0.0, 32.0, 8.0, 128.0, 2.0, 2.0, PEAK, BW, 132.0,
                                        0.6, 0.4, 0.5, 7e-6) == 0.0


def test_decode_attention_is_linear_in_kv_tokens():
    def t(tokens):
        return kn.decode_attention_time_nb(64.0, tokens, 32.0, 8.0, 128.0, 2.0, 2.0, BW, float(SMS), 0.9, 3e-6, 1e-5)
    slope = 2 * 8 * 128 * 2 / (BW * 0.9)
    for x in (1e3, 1e5, 1e7):
        assert t(2 * x) - t(x) == pytest.approx(slope * x, rel=1e-9)
        assert (t(3 * x) - t(2 * x)) == pytest.approx(t(2 * x) - t(x), rel=1e-9)
    base = 1e-5 + 64 * 8 * 3e-6 / SMS + 64 * 2 * 32 * 128 * 2 / (BW * 0.9)
    assert t(0.0) == pytest.approx(base, rel=1e-12)



def test_decode_split_kv_is_sized_by_sequences_not_kv_heads():
    # 8 sequences x 1 KV head and 1 sequence x 8 KV heads read the same bytes at 4,096 keys each;
    # split_seqs 16: 16 / 8 = 2 splits per sequence (16 blocks) against min(16, 4096 / 128) = 16 splits
    # of the one sequence (8 x 16 = 128 blocks); at 60 GB/s a block, 16 blocks read 0.96 TB/s
    frac, blk, lat, split, sseq, bbw = 0.95, 3e-6, 1e-5, 2e-6, 16.0, 60e9
    assert kn.decode_splits_nb(8.0, 8 * 4096.0, sseq) == 2.0
    assert kn.decode_splits_nb(1.0, 4096.0, sseq) == 16.0
    assert kn.decode_splits_nb(1.0, 1024.0, sseq) == 8.0          # 1,024 keys: 8 chunks of 128
    assert kn.decode_splits_nb(64.0, 64 * 4096.0, sseq) == 1.0     # never below one split
    assert kn.decode_splits_nb(8.0, 8 * 4096.0, 0.0) == 32.0       # 0: every 128-key chunk

    def t(seqs, kv):
        return kn.decode_attention_time_nb(seqs, seqs * 4096.0, 4.0 * kv, kv, 128.0, 2.0, 2.0, BW, float(SMS),
                                           frac, blk, lat, split, sseq, bbw)
    kv_bytes = 8 * 4096 * 2 * 128 * 2
    q_bytes = 8 * 2 * 4 * 128 * 2          # q in, o out: 8 (sequence, KV head) pairs x 4 heads each
    fixed = lat + split + 8 * blk / SMS    # 8 blocks < 0.8 SMs: split, combine kernel charged
    assert t(8.0, 1.0) == pytest.approx(fixed + (kv_bytes + q_bytes) / (16 * bbw), rel=1e-12)
    assert t(1.0, 8.0) == pytest.approx(fixed + (kv_bytes + q_bytes) / min(BW * frac, 128 * bbw), rel=1e-12)
    assert t(8.0, 1.0) > 1.5 * t(1.0, 8.0)


def test_decode_one_chunk_is_not_split_and_no_block_cap_is_the_hbm_roofline():
    # 128 keys or fewer: one chunk, no split-KV, no combine kernel
    one = kn.decode_attention_time_nb(1.0, 128.0, 32.0, 8.0, 128.0, 2.0, 2.0, BW, float(SMS), 0.9, 3e-6, 1e-5,
                                      2e-6, 16.0, 60e9)
    two = kn.decode_attention_time_nb(1.0, 129.0, 32.0, 8.0, 128.0, 2.0, 2.0, BW, float(SMS), 0.9, 3e-6, 1e-5,
                                      2e-6, 16.0, 60e9)
    nb1 = 128 * 2 * 8 * 128 * 2 + 2 * 32 * 128 * 2
    assert one == pytest.approx(1e-5 + 8 * 3e-6 / SMS + nb1 / min(BW * 0.9, 8 * 60e9), rel=1e-12)
    nb2 = 129 * 2 * 8 * 128 * 2 + 2 * 32 * 128 * 2     # 129 keys: 2 chunks, 16 blocks, combine kernel
    assert two == pytest.approx(1e-5 + 2e-6 + 8 * 3e-6 / SMS + nb2 / min(BW * 0.9, 16 * 60e9), rel=1e-12)
    # block_bw 0 (a profile without the key): HBM bound alone, whatever the parallelism
    t = kn.decode_attention_time_nb(1.0, 65536.0, 4.0, 1.0, 128.0, 2.0, 2.0, BW, float(SMS), 0.9, 3e-6, 1e-5)
    nb = 65536 * 2 * 128 * 2 + 2 * 4 * 128 * 2
    assert t == pytest.approx(1e-5 + 3e-6 / SMS + nb / (BW * 0.9), rel=1e-12)

# -- all-reduce ---------------------------------------------------------------------------------

def test_allreduce_limits_and_monotone_in_size():
    link, frac, lat, step = 450e9, 0.7, 4e-6, 6e-6
    bw = link * frac
    assert kn.engine_allreduce_time_nb(1e6, 1.0, link, frac, lat, step) == 0.0
    # 2 GPUs: one-shot and two-shot move the same bytes, one-shot skips the extra step
    assert kn.engine_allreduce_time_nb(1e6, 2.0, link, frac, lat, step) == pytest.approx(lat + 1e6 / bw, rel=1e-12)
    # 8 GPUs, small: one-shot; large: two-shot (ring volume 2 (n - 1) / n)
    assert kn.engine_allreduce_time_nb(1e3, 8.0, link, frac, lat, step) == pytest.approx(lat + 7e3 / bw, rel=1e-12)
    assert kn.engine_allreduce_time_nb(1e9, 8.0, link, frac, lat, step) == pytest.approx(
        lat + step + 1.75e9 / bw, rel=1e-12)
    for n in (2.0, 4.0, 8.0):
        sizes = np.logspace(2, 10, 60)
        ts = [kn.engine_allreduce_time_nb(s, n, link, frac, lat, step) for s in sizes]
        assert all(b >= a for a, b in zip(ts, ts[1:]))
    eager = kn.engine_allreduce_eager_time_nb(1e6, 4.0, link, frac, lat, step, 15e-6, BW, 0.8)
    assert eager == pytest.approx(kn.engine_allreduce_time_nb(1e6, 4.0, link, frac, lat, step) + 15e-6
                                  + 2e6 / (BW * 0.8), rel=1e-12)


# -- MoE ----------------------------------------------------------------------------------------

def test_grouped_gemm_of_one_group_is_at_most_the_gemm_without_latency():
    # the grouped (fused-MoE) kernel may also run 16-row tiles, so one group is never slower than the
    # dense GEMM without its latency; in the bandwidth-bound regime both are the weight stream
    m, n, k = 4096.0, 4096.0, 7168.0
    g = kn.grouped_gemm_time_nb(1.0, m, k, n, 2.0, 2.0, PEAK, BW, float(SMS), GMAX, HF, K0)
    assert g + LAT <= gemm(m, n, k) * (1 + 1e-12)
    g1 = kn.grouped_gemm_time_nb(1.0, 1.0, k, n, 2.0, 2.0, PEAK, BW, float(SMS), GMAX, HF, K0)
    assert g1 == pytest.approx((n * k * 2.0 + (n + k) * 2.0) / (BW * HF), rel=1e-12)


def test_moe_is_latency_plus_routing_plus_up_and_down_grouped_gemms():
    assign, touched, hidden, inter = 2048.0, 64.0, 7168.0, 2048.0
    eff, lat, pairs, pair_time = 0.3, 20e-6, 16384.0, 0.02e-6
    frac = GMAX * eff
    up = kn.grouped_gemm_time_nb(touched, assign / touched, hidden, 2 * inter, 2.0, 2.0, PEAK, BW, 132.0, frac, HF, K0)
    down = kn.grouped_gemm_time_nb(touched, assign / touched, inter, hidden, 2.0, 2.0, PEAK, BW, 132.0, frac, HF, K0)
    t = kn.moe_experts_time_nb(assign, touched, pairs, hidden, inter, True, 2.0, 2.0, PEAK, BW, 132.0, GMAX, HF, K0,
                               eff, lat, pair_time, 0.0, 0.0, 0.0, 0.0, 0.0)
    assert t == pytest.approx(lat + pairs * pair_time + up + down, rel=1e-12)
    assert kn.moe_experts_time_nb(0.0, 0.0, 0.0, hidden, inter, True, 2.0, 2.0, PEAK, BW, 132.0, GMAX, HF, K0, eff,
                                  lat, pair_time, 0.0, 0.0, 0.0, 0.0, 0.0) == 0.0


def test_moe_with_one_token_per_expert_streams_the_touched_weights():
    hidden, inter = 7168.0, 2048.0
    def t(touched):
        return kn.moe_experts_time_nb(touched, touched, touched, hidden, inter, True, 2.0, 2.0, PEAK, BW, 132.0, GMAX,
                                      HF, K0, 0.3, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    per_expert = (3 * hidden * inter * 2 + (2 * inter + hidden) * 2 + (hidden + inter) * 2) / (BW * HF)
    assert t(8.0) == pytest.approx(8 * per_expert, rel=1e-12)
    assert t(64.0) == pytest.approx(8 * t(8.0), rel=1e-12)
    assert kn.balanced_experts_nb(16.0, 256.0) == 16.0 and kn.balanced_experts_nb(4096.0, 256.0) == 256.0


def test_moe_weights_of_a_short_k_step_stream_at_the_run_over_stream_bytes():
    # one token per expert, 16-row tiles: weight-bound. A 32-element K step of bf16 reads 64-byte runs of
    # each weight row: with stream_bytes 96 the weights take 96 / 64 as long; a 64-element step (128 bytes)
    # streams at the full rate, as does any step with stream_bytes 0
    hidden, inter, touched = 7168.0, 2048.0, 8.0
    def t(tile_k, stream):
        return kn.moe_experts_time_nb(touched, touched, touched, hidden, inter, True, 2.0, 2.0, PEAK, BW, 132.0,
                                      GMAX, HF, K0, 0.3, 0.0, 0.0, 16.0, 64.0, 0.0, tile_k, stream)
    w = touched * 3 * hidden * inter * 2 / (BW * HF)
    act = touched * ((2 * inter + hidden) * 2 + (hidden + inter) * 2) / (BW * HF)
    assert t(64.0, 0.0) == pytest.approx(w + act, rel=1e-12)
    assert t(64.0, 96.0) == pytest.approx(w + act, rel=1e-12)
    assert t(32.0, 96.0) == pytest.approx(w * 96.0 / 64.0 + act, rel=1e-12)
    assert kn.moe_stream_fraction_nb(32.0, 1.0, 96.0) == pytest.approx(32.0 / 96.0)   # fp8: 32-byte runs


# -- sm_count in the hardware profiles ----------------------------------------------------------

def test_every_profile_has_an_sm_count():
    expected = {"h100-sxm": 132, "a100-sxm-80gb": 108, "h100-pcie": 114, "mi300x": 304, "tpu-v5e": 4}
    for name, count in expected.items():
        assert load_hardware(name).sm_count == count
    for path in sorted(hardware_dir().glob("*.toml")):
        hw = load_hardware(path.stem)
        assert isinstance(hw.sm_count, int) and hw.sm_count >= 1


@pytest.mark.parametrize("line, message", [("sm_count = 0", "must be >= 1"), ("sm_count = 13.5", "integer"),
                                           (None, "sm_count")])
def test_bad_or_missing_sm_count_is_an_error(tmp_path, line, message):
    text = (hardware_dir() / "h100-sxm.toml").read_text()
    text = text.replace('name = "h100-sxm"', 'name = "bad-sm"')
    new = re.sub(r"^sm_count = .*$", line if line else "", text, flags=re.M)
    assert new != text
    path = tmp_path / "bad-sm.toml"
    path.write_text(new)
    with pytest.raises(ConfigError, match=message):
        load_hardware(str(path))
