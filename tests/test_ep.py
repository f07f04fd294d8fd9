"""Expert parallelism with DP attention (servesim/costmodel/ep.py): routing, all-to-all, memory, checks,
each against a hand derivation."""
import math

import numpy as np
import pytest

from clihelp import one_line_error
from servesim.config import load_hardware, load_model
from servesim.config.engine import load_engine
from servesim.costmodel import Layout, build_replica, lower
from servesim.costmodel import ep as E
from servesim.costmodel.features import FULL
from servesim.costmodel.fields import table
from servesim.costmodel.iteration import (alltoall_layer_nb, iteration_components, moe_parts_nb,
                                          routed_experts_nb)
from servesim.costmodel.kernels import moe_experts_time_nb
from servesim.costmodel.memory import weight_bytes_per_gpu
from servesim.errors import InfeasibleError

DSV3 = "deepseek-v3"


def replica(tp=1, dp=1, ep=1, hw="h200-sxm", dtype="fp8", skew=None, engine="vllm", model=DSV3):
    return build_replica(load_model(model), load_hardware(hw),
                         Layout(tp=tp, attn_dp=dp, ep=ep, dtype=dtype, expert_skew=skew),
                         max_tokens=2048, max_seqs=256, engine=load_engine(engine))


def params(tp=1, dp=1, ep=1, hw="h200-sxm", dtype="fp8", skew=None, engine="vllm", model=DSV3):
    """The cost bundle alone (no memory check)."""
    return lower(load_model(model), load_hardware(hw), Layout(tp=tp, attn_dp=dp, ep=ep, dtype=dtype, expert_skew=skew),
                 load_engine(engine), max_tokens=2048)


def test_balanced_rank_load_is_even():
    a, t = E.rank_load_nb(100.0, 256.0, 8.0, 8.0, np.zeros(0), np.zeros(0), np.zeros(0))
    assert a == 100.0 * 8 / 8 and t == 32.0           # 800 pairs over 8 ranks; all 32 local experts hit
    a, t = E.rank_load_nb(2.0, 256.0, 8.0, 8.0, np.zeros(0), np.zeros(0), np.zeros(0))
    assert a == 2.0 and t == 2.0


def test_power_law_counts_are_whole_pairs_summing_to_t_k_under_the_cap():
    u = np.random.default_rng(1).random(256)
    c = E.power_law_counts_nb(u, 4096.0, 8.0, 1.0, 0.8 * 4096, 1.01, 8.0, E.DEFICIT_SPREAD)
    assert np.all(c == np.round(c)) and c.max() <= 4096.0
    assert c.sum() == 4096 * 8                                # the rounding's leftover dealt out; no cap binds


def test_few_tokens_the_leftover_pairs_go_where_the_generator_puts_them():
    # 1 token x 8 experts of 256: every weight on [0.01, 2] scales to < 0.5 pair and rounds to 0, so all
    # 8 pairs are the leftover: "first" puts them on experts 0..7 (one EP-8 rank of 32 holds all 8),
    # "spread" one on each rank (rank r's first expert)
    u = np.random.default_rng(2).random(256)
    first = E.power_law_counts_nb(u, 1.0, 8.0, 0.01, 2.0, 1.01, 8.0, E.DEFICIT_FIRST)
    spread = E.power_law_counts_nb(u, 1.0, 8.0, 0.01, 2.0, 1.01, 8.0, E.DEFICIT_SPREAD)
    assert np.array_equal(np.nonzero(first)[0], np.arange(8))
    assert np.array_equal(np.nonzero(spread)[0], np.arange(8) * 32)
    assert E.slowest_rank_nb(first, 8) == (8.0, 8.0)
    assert E.slowest_rank_nb(spread, 8) == (1.0, 1.0)
    g, pairs, touched = E.skew_table(256, 8, 8, 1.01, 8192, deficit="first")
    assert pairs[0] == 8.0 and touched[0] == 8.0 and g[0] == 1.0


def test_slowest_rank_is_the_largest_block():
    loads = np.array([1.0, 0.0, 5.0, 0.2, 3.0, 3.0])
    a, t = E.slowest_rank_nb(loads, 3)
    assert a == 6.0 and t == 2.0
    a, t = E.slowest_rank_nb(loads, 2)
    assert a == 6.2 and t == 2.0                            # 0.2 < 0.5 pair: not a touched expert


def test_power_law_slowest_rank_is_above_the_mean_and_deterministic():
    g1 = E.skew_table(256, 8, 8, 1.01, 8192)
    g2 = E.skew_table(256, 8, 8, 1.01, 8192)
    for a, b in zip(g1, g2):
        assert np.array_equal(a, b)
    grid, pairs, _ = g1
    big = grid > 64
    assert np.all(pairs[big] > grid[big] * 8 / 8)             # slower than balanced
    assert np.all(pairs <= grid * 32)                        # a rank's 32 experts take each token at most once


def test_higher_skew_loads_the_slowest_rank_more_at_scale():
    t = 4096.0
    loads = [E.rank_load_nb(t, 256.0, 8.0, 8.0, *E.skew_table(256, 8, 8, a, 8192))[0] for a in (0.0, 1.01, 1.2)]
    assert loads[0] < loads[1] < loads[2]


def test_dispatch_combine_inside_one_node_by_hand():
    rc = replica(tp=1, dp=8, ep=8, skew=0.0)
    p, hw = rc.params, load_hardware("h200-sxm")
    frac, lat = hw.alltoall
    bw = hw.scaleup_bw * frac
    m = 64.0
    rows = m * 8                                             # balanced: the rank receives what it sends
    s_disp, s_comb = rows * 7168 * 1.0, rows * 7168 * 2.0    # fp8 dispatch, bf16 combine
    want = 2 * lat + 7 / 8 * (s_disp + s_comb) / bw
    assert alltoall_layer_nb(table(p), m, m * 8) == pytest.approx(want, rel=1e-12)   # 8 ranks of m tokens


def test_dispatch_combine_across_nodes_takes_the_slower_link():
    rc = replica(tp=1, dp=16, ep=16, skew=0.0, hw="h100-sxm", dtype="fp8")
    p, hw = rc.params, load_hardware("h100-sxm")
    frac, lat = hw.alltoall
    bw_in, bw_out = hw.scaleup_bw * frac, hw.scaleout_bw * hw.efficiency.scaleout_bw_fraction
    alpha = max(lat, hw.efficiency.scaleout_latency_s)
    m = 32.0
    want = 0.0
    for b in (1.0, 2.0):
        s = m * 8 * 7168 * b
        want += alpha + max(7 / 16 * s / bw_in, 8 / 16 * s / bw_out)
    assert alltoall_layer_nb(table(p), m, m * 16) == pytest.approx(want, rel=1e-12)


def test_no_alltoall_without_dp_attention():
    assert alltoall_layer_nb(table(replica(tp=8, ep=8).params), 64.0, 64.0) == 0.0


def test_dp_attention_prices_each_rank_on_its_share():
    wide = replica(tp=1, dp=8, ep=8).params
    one = params()
    a8 = iteration_components(table(wide), 0.0, 0.0, 64.0, 0.0, 0.0, 64.0, 64.0 * 2048)
    a1 = iteration_components(table(one), 0.0, 0.0, 8.0, 0.0, 0.0, 8.0, 8.0 * 2048)
    # 64 decodes over 8 ranks: each rank's attention is that of 8 decodes on one GPU
    assert a8.attention == pytest.approx(a1.attention, rel=1e-12)
    # ... and its MoE layers route all 64 tokens: the slowest rank's pairs at T = 8 ranks x 8
    a, t = E.rank_load_nb(64.0, 256.0, 8.0, 8.0, wide.skew_grid, wide.skew_pairs, wide.skew_touched)
    assert a > 64.0 * 8 / 8
    # a ragged split: 65 decodes put 9 on the busiest rank
    a9 = iteration_components(table(wide), 0.0, 0.0, 65.0, 0.0, 0.0, 65.0, 65.0 * 2048)
    r9 = iteration_components(table(wide), 0.0, 0.0, 72.0, 0.0, 0.0, 72.0, 72.0 * 2048)
    assert a9.attention == pytest.approx(r9.attention, rel=1e-12)


def test_slowest_rank_experts_by_hand_balanced():
    rc = replica(tp=1, dp=8, ep=8, skew=0.0)
    p = rc.params
    m = 128.0
    tokens = m * 8
    a = tokens * 8 / 8
    want = moe_experts_time_nb(a, min(32.0, a), a, 7168.0, 2048.0, True, p.w_bytes, p.a_bytes, p.peak, p.hbm_bw,
                               p.sms, p.g16_max, p.g_hbm, p.g_tile_k, p.moe_eff, p.moe_latency, p.moe_pair,
                               0.0, 0.0, p.moe_ridge, 0.0, p.moe_stream)
    assert p.exp_inter == 2048.0 and p.moe_tile_keys.size == 0     # fp8: no tuned Triton tiles
    assert routed_experts_nb(table(p), FULL.ep, tokens) == pytest.approx(want, rel=1e-12)


def _experts_by_hand(p, tokens):
    """58 MoE layers of the slowest EP rank, balanced routing over EP 8: T x 8 / 8 pairs on
    min(32, pairs) of its 32 experts (no masked pairs with DP attention, no tuned tiles at fp8)."""
    a = tokens * 8 / 8
    return 58 * moe_experts_time_nb(a, min(32.0, a), a, 7168.0, 2048.0, True, p.w_bytes, p.a_bytes, p.peak,
                                    p.hbm_bw, p.sms, p.g16_max, p.g_hbm, p.g_tile_k, p.moe_eff, p.moe_latency,
                                    p.moe_pair, 0.0, 0.0, p.moe_ridge, 0.0, p.moe_stream)


def _a2a_by_hand(p, rank_tokens, tokens):
    """58 layers' dispatch (fp8) + combine (bf16) inside one node: the busiest rank sends its tokens x 8
    rows (or the slowest rank receives T x 8 / 8, whichever is more), 7/8 of them to other GPUs."""
    frac, lat = load_hardware("h200-sxm").alltoall
    rows = max(rank_tokens * 8, tokens * 8 / 8)
    return 58 * (2 * lat + 7 / 8 * rows * 7168 * (1.0 + 2.0) / (load_hardware("h200-sxm").scaleup_bw * frac))


def test_lone_prefill_on_dp_attention_routes_only_its_own_tokens():
    """One 2,048-token prompt on DP 8 + EP 8: its MoE layers route 2,048 tokens (not 8 x 2,048), the
    dispatch sends 2,048 x 8 rows from the one busy rank; the rank's attention and dense layers are
    those of that chunk, the same as when each of the 8 ranks holds one such chunk."""
    p = replica(tp=1, dp=8, ep=8, skew=0.0).params
    assert p.n_moe_layers == 58 and p.exp_inter == 2048.0 and p.moe_tile_keys.size == 0 and p.ep_masked == 0.0
    c = 2048.0
    one = (c, 1.0, 1.0, c * (c + 1) / 2, c, 0.0, 0.0)
    eight = (8 * c, 8.0, 8.0, 8 * c * (c + 1) / 2, 8 * c, 0.0, 0.0)
    e1, a1 = moe_parts_nb(table(p), FULL.ep, c, 1.0, 0.0)
    e8, a8 = moe_parts_nb(table(p), FULL.ep, 8 * c, 8.0, 0.0)
    assert e1 == pytest.approx(_experts_by_hand(p, c), rel=1e-12)
    assert a1 == pytest.approx(_a2a_by_hand(p, c, c), rel=1e-12)
    # D x k sequences evenly: as the even split priced it, every rank's m tokens routed, m x D
    assert e8 == pytest.approx(_experts_by_hand(p, 8 * c), rel=1e-12)
    assert a8 == pytest.approx(_a2a_by_hand(p, c, 8 * c), rel=1e-12)
    r1, r8 = iteration_components(table(p), *one), iteration_components(table(p), *eight)
    assert r1.attention == r8.attention                          # the busiest rank holds one chunk either way
    assert r1.gemm - e1 == pytest.approx(r8.gemm - e8, rel=1e-12)
    assert r1.communication == pytest.approx(a1, rel=1e-12)      # TP 1: the all-to-all alone
    assert r8.communication == pytest.approx(a8, rel=1e-12)
    assert r8.flops == pytest.approx(8 * r1.flops, rel=1e-12)    # the replica's real work
    assert e1 < e8 / 4 and r1.latency < r8.latency / 2


def test_dp_attention_ranks_hold_whole_sequences():
    """The busiest rank: ceil(n_pf / 8) chunks and ceil(n_dec / 8) decodes, not a fraction of a chunk."""
    wide = replica(tp=1, dp=8, ep=8, skew=0.0).params
    one = params()
    # 1 chunk of 1,024 + 64 decodes: the busiest rank runs the whole chunk and 8 decodes
    mixed = iteration_components(table(wide), 1024.0, 1.0, 65.0, 1024 * 1025 / 2, 1024.0, 64.0, 64 * 2048.0)
    own = iteration_components(table(one), 1024.0, 1.0, 9.0, 1024 * 1025 / 2, 1024.0, 8.0, 8 * 2048.0)
    assert mixed.attention == pytest.approx(own.attention, rel=1e-12)
    e, _ = moe_parts_nb(table(wide), FULL.ep, 1024.0, 1.0, 64.0)
    assert e == pytest.approx(_experts_by_hand(wide, 1024.0 + 64.0), rel=1e-12)
    # 9 decodes: 2 on the busiest rank, 9 tokens routed (not 2 x 8)
    e9, a9 = moe_parts_nb(table(wide), FULL.ep, 0.0, 0.0, 9.0)
    assert e9 == pytest.approx(_experts_by_hand(wide, 9.0), rel=1e-12)
    assert a9 == pytest.approx(_a2a_by_hand(wide, 2.0, 9.0), rel=1e-12)
    d9 = iteration_components(table(wide), 0.0, 0.0, 9.0, 0.0, 0.0, 9.0, 9 * 2048.0)
    d2 = iteration_components(table(one), 0.0, 0.0, 2.0, 0.0, 0.0, 2.0, 2 * 2048.0)
    assert d9.attention == pytest.approx(d2.attention, rel=1e-12)


def test_busiest_rank_share():
    assert [E.busiest_share_nb(n, 8.0) for n in (0.0, 1.0, 8.0, 9.0, 16.0, 17.0)] == [0, 1, 1, 2, 2, 3]
    # a mean over steps interpolates between the integer counts either side
    assert E.busiest_share_nb(0.5, 8.0) == 0.5
    assert E.busiest_share_nb(8.5, 8.0) == 1.5
    assert E.busiest_share_nb(10.25, 8.0) == 2.0


def test_masked_kernel_pays_the_remote_pairs():
    masked = params(tp=8, ep=8, skew=0.0, dtype="bf16")          # vLLM: expert map, zeros written
    plain = params(tp=8, ep=8, skew=0.0, dtype="bf16", engine="trtllm")
    assert masked.ep_masked == 1.0 and plain.ep_masked == 0.0
    m = 256.0
    remote = m * 8 - m * 8 / 8
    inter = 2048.0                                           # moe_tp = 8 x 1 / 8 = 1: whole experts
    want_bytes = remote * 2.0 * (2 * 2 * inter + inter + 2 * 7168)
    assert E.masked_pairs_time_nb(table(masked), remote) == pytest.approx(want_bytes / (masked.hbm_bw * masked.g_hbm))


def test_weights_per_gpu_with_ep_by_hand():
    m = load_model(DSV3)
    experts = sum(m.moe.num_experts * m.expert_params() for i in range(m.num_layers) if m.is_moe_layer(i))
    rest = m.param_count() - experts - m.embedding_params() - m.lm_head_params() - m.final_norm_params()
    got = weight_bytes_per_gpu(m, 1, 1, "fp8", ep=8, attn_dp=8)
    want = (rest + experts / 8) * 1.0 + (m.embedding_params() + m.lm_head_params()) * 2.0
    assert got == pytest.approx(want, rel=1e-9)
    assert weight_bytes_per_gpu(m, 8, 1, "fp8") < got        # TP 8 shards attention too


def test_kv_capacity_counts_every_dp_rank():
    wide = replica(tp=1, dp=8, ep=8)
    assert wide.memory.kv_capacity_tokens % 8 == 0
    assert wide.num_gpus == 8


def test_where_the_time_goes_adds_up():
    p = replica(tp=1, dp=8, ep=8).params
    experts, a2a = moe_parts_nb(table(p), FULL.ep, 0.0, 0.0, 256.0)
    c = iteration_components(table(p), 0.0, 0.0, 256.0, 0.0, 0.0, 256.0, 256.0 * 2048)
    assert 0 < experts < c.gemm
    assert a2a > 0 and a2a == pytest.approx(c.communication, rel=1e-12)   # TP 1: no all-reduce besides


def test_ep_checks():
    with pytest.raises(InfeasibleError, match="does not divide the 256 experts"):
        replica(tp=8, ep=3)
    with pytest.raises(InfeasibleError, match="must divide"):
        replica(tp=1, dp=4, ep=8)
    with pytest.raises(InfeasibleError, match="has no experts"):
        replica(model="llama-3.1-8b", ep=2, tp=2, dtype="bf16", hw="h100-sxm")


@pytest.mark.parametrize("args,phrase", [
    (["--ep", "7", "--tp", "8"], "--ep 7 does not divide the 256 experts"),
    (["--ep", "0"], "--ep"),
    (["--attn-dp", "2", "--ep", "4", "--tp", "1"], "must divide"),
    (["--expert-skew", "-1", "--ep", "8", "--tp", "8"], "--expert-skew"),
])
def test_cli_bad_ep(args, phrase):
    one_line_error("cost", "--model", DSV3, "--hardware", "h200-sxm", "--dtype", "fp8", "--decode-seqs", "8",
                   *args, must_contain=(phrase,))


def test_cli_dense_model_refuses_ep():
    one_line_error("cost", "--ep", "2", "--tp", "2", "--decode-seqs", "8", must_contain=("has no experts",))


def test_cost_reports_moe_parts():
    import servesim
    r = servesim.cost(model=DSV3, hardware="h200-sxm", dtype="fp8", tp=1, attn_dp=8, ep=8, decode_seqs=512)
    mo = r.summary["moe"]
    assert mo["expert_skew"] == E.SKEW_DEEPSEEK and mo["alltoall_ms"] > 0 and mo["experts_ms"] > 0
    assert r.summary["num_gpus"] == 8
    assert math.isfinite(r.summary["time_ms"])


@pytest.mark.slow
def test_every_ep_row_of_the_moe_tables_is_held_out_under_15_percent_median():
    # issue #27's target: the engines' fused-MoE fits are made on EP = 1 rows only, so every shipped EP > 1
    # moe_perf row is held out (experiments/fit_ep.py writes the same figures to ep_validation.md: 14.9%)
    from servesim.calibrate import ep_fit
    err = np.abs(ep_fit.held_out_ep_rows()["err"].to_numpy())
    assert err.size == 59296
    assert np.median(err) < 0.15
