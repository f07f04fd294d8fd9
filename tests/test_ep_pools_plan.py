"""Per-pool expert parallelism (--pool HW:tpN:epN:dpN:xR) and planning over EP / DP attention and
speculative decoding (servesim plan --ep, --attn-dp, --speculative-grid)."""
import pytest

import servesim
from clihelp import one_line_error
from servesim.planning.plan import PlanSpec, _parallel
from servesim.pools import parse_pool


def test_pool_spec_with_ep_and_dp():
    s = parse_pool("b200:tp1:ep8:dp8:x2:decode")
    assert (s.tp, s.ep, s.attn_dp, s.replicas, s.role) == (1, 8, 8, 2, "decode")
    assert s.gpus == 16
    assert parse_pool(s.text) == s
    assert parse_pool("h100-sxm:tp2:x1").text == "h100-sxm:tp2:x1"


def test_pool_ep_not_dividing_the_experts_is_one_line():
    one_line_error("simulate", "--model", "deepseek-v3", "--dtype", "fp8", "--num-requests", "4",
                   "--pool", "h200-sxm:tp1:ep3:dp3:x1", must_contain=("--pool h200-sxm:tp1:ep3:dp3:x1", "--ep 3"))


def test_pd_with_a_wide_ep_decode_pool():
    s = servesim.simulate(model="deepseek-v3", dtype="fp8", isl=512, osl=64, num_requests=64, rate=8,
                          pool=("h200-sxm:tp8:x1:prefill", "h200-sxm:tp1:ep8:dp8:x1:decode")).summary
    pools = {p["role"]: p for p in s["pools"]}
    assert pools["decode"]["num_gpus"] == 8 and pools["prefill"]["num_gpus"] == 8
    assert s["config"]["num_gpus"] == 16
    assert s["num_completed"] == 64
    from servesim.render import summary_table
    assert "1 x TP=1 PP=1 EP=8 attn-DP=8 on h200-sxm (decode)" in summary_table(s)


def test_plan_parallel_pairs():
    spec = PlanSpec(base=None, eps=(0,), attn_dps=(1, 8))
    assert _parallel(spec, 8, True) == [(1, 1), (8, 1), (64, 8)]      # DP without EP: more replicas instead
    assert _parallel(spec, 1, True) == [(1, 1), (8, 8)]
    assert _parallel(spec, 8, False) == [(1, 1)]
    assert _parallel(PlanSpec(base=None, eps=(4,), attn_dps=(1,)), 4, True) == [(4, 1)]


@pytest.mark.slow
def test_plan_searches_ep_for_a_moe_model():
    res = servesim.plan(model="mixtral-8x7b", hardware="h100-sxm", tp=(2,), rate=2, num_requests=200,
                        slo="ttft_p99=2s,tpot_p99=100ms", workload="chat")
    eps = set(res.candidates["ep"])
    assert eps == {1, 2}
    assert res.best["ep"] in (1, 2)


@pytest.mark.slow
def test_plan_speculative_grid_explains_itself():
    res = servesim.plan(model="llama-3.1-8b", hardware="h100-sxm", tp=(1,), rate=2, num_requests=200,
                        slo="ttft_p99=1s,tpot_p99=9ms", speculative_grid="none,eagle:k=3:acceptance=0.7")
    specs = {v if isinstance(v, str) else None for v in res.candidates["speculative"]}
    assert specs == {None, "eagle:k=3:acceptance=0.7"}
    assert res.best["speculative"] == "eagle:k=3:acceptance=0.7"
    assert "only speculative decoding" in res.best["speculation"]     # plain decoding cannot reach 9 ms here


def test_plan_speculative_grid_checks():
    one_line_error("plan", "--model", "llama-3.1-8b", "--rate", "2", "--slo", "ttft_p99=1s", "--speculative-grid",
                   "eagle:k=0:acceptance=0.5", must_contain=("k=0",))
    one_line_error("plan", "--model", "llama-3.1-8b", "--rate", "2", "--slo", "ttft_p99=1s", "--speculative-grid",
                   "none,mtp:k=1", "--speculative", "mtp:k=1", must_contain=("contradict",))


def test_closed_loop_points_hold_twice_the_clients():
    from servesim.planning.grid import expand
    pts = expand(servesim.SimConfig(), [("concurrency", [4, 1000, 4096])], None)
    assert [p.num_requests for p in pts] == [None, None, 8192]       # None: the default 2,000
    given = expand(servesim.SimConfig(num_requests=300), [("concurrency", [4096])], None)
    assert given[0].num_requests == 300


def test_closed_loop_sweep_over_concurrency():
    res = servesim.sweep(None, grid={"concurrency": [2, 8]}, num_requests=40, isl=128, osl=16, workers=1)
    pts = res.points
    assert list(pts["concurrency"]) == [2, 8] and set(pts["status"]) == {"ok"}
    assert pts["throughput_output_tokens_per_s_per_gpu"].iloc[1] > pts["throughput_output_tokens_per_s_per_gpu"].iloc[0]
    one_line_error("sweep", "--rates", "1,2", "--grid", "concurrency=2,4", "--num-requests", "10",
                   must_contain=("contradict",))


def test_single_pool_shorthand_runs_ep_and_dp_attention():
    # --tp 1 --attn-dp 8 --ep 8 is the pool h200-sxm:tp1:ep8:dp8:x1, request by request (DeepSeek-V3 fp8
    # does not fit one H200 at TP 1 without EP: a shorthand that dropped --ep would be refused)
    kw = dict(model="deepseek-v3", dtype="fp8", isl=256, osl=16, num_requests=24, rate=4, seed=2)
    a = servesim.simulate(hardware="h200-sxm", tp=1, attn_dp=8, ep=8, **kw)
    b = servesim.simulate(pool=("h200-sxm:tp1:ep8:dp8:x1",), **kw)
    assert a.summary["config"]["num_gpus"] == 8 and a.summary["config"]["ep"] == 8
    assert a.requests["finish_s"].equals(b.requests["finish_s"])
    from servesim.render import summary_table
    assert "EP=8 attn-DP=8" in summary_table(a.summary)


@pytest.mark.slow
def test_plan_says_when_speculation_stops_paying():
    # a decode-heavy load: at 2 req/s a replica's steps are nearly empty and verifying 4 tokens per
    # sequence costs little more than one; at 40 req/s the batches fill the steps (~100 sequences)
    # and the verification competes with batching: the plan takes speculation at the low rate only
    import re
    kw = dict(model="llama-3.1-8b", hardware="h100-sxm", tp=(1,), num_requests=2000, isl=200, osl=800, workers=1,
              slo="ttft_p99=3s,tpot_p99=100ms", speculative_grid="none,eagle:k=3:acceptance=0.7")
    notes = {}
    for rate in (2, 40):
        res = servesim.plan(rate=rate, **kw)
        notes[rate] = res.best["speculation"]
        gain = [float(x) for x in re.findall(r"([\d.]+)x at", notes[rate])]
        assert len(gain) == 2 and gain[1] < gain[0], notes[rate]      # batch 1, then the load's mean batch
        if rate == 2:
            assert res.best["speculative"] == "eagle:k=3:acceptance=0.7"
    assert notes[2].startswith("speculation pays") and "competes with batching" not in notes[2]
    assert notes[40].startswith("speculation does not pay") and "competes with batching" in notes[40]


def test_capacity_runs_hold_twice_the_batch_slots():
    # a DP-attention 8 replica batches 8 x 256 sequences: 2,000 requests would all run at once and an
    # overload never queue; the capacity search runs 2 x 2,048 of them. One H100 replica (256 slots)
    # keeps its 2,000, and a duration fixes the count
    from servesim.planning.capacity import long_enough
    wide = servesim.SimConfig(model="deepseek-v3", hardware="b200", dtype="fp4", tp=1, attn_dp=8, ep=8)
    assert long_enough(wide).num_requests == 2 * 8 * 256
    assert long_enough(servesim.SimConfig(replicas=2, max_num_seqs=600)).num_requests == 2 * 2 * 600
    plain = servesim.SimConfig()
    assert long_enough(plain) is plain
    timed = servesim.SimConfig(replicas=16, duration=60.0)
    assert long_enough(timed) is timed
