"""`servesim plan --disaggregated`: the capacity bound per role, the chosen P:D plan and its checks,
and the user errors. Small: llama-3.1-8b on h100-sxm, TP 1, a few hundred requests."""
import json
import math
from dataclasses import replace

import pytest
from click.testing import CliRunner

from clihelp import stderr_error
from servesim.costmodel.fields import table
import servesim
from servesim.cli import main
from servesim.errors import ConfigError, InfeasibleError
from servesim.options import SimConfig

SLO = "ttft_p99=1s,tpot_p99=60ms"
SMALL = ["--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--tp", "1", "--num-requests", "200", "--workers", "1"]


def _params(hardware, tp, **kw):
    from servesim.api import replica_of, resolve
    cfg, m, hw, _ = resolve(SimConfig(hardware=hardware, tp=tp, **kw))
    return cfg, replica_of(cfg, m, hw)


def _interval(p, tokens, n_pf, pairs, kv_pf, n_dec, kv_dec):
    from servesim.costmodel.iteration import iteration_components
    return iteration_components(table(p), float(tokens), float(n_pf), float(n_dec + n_pf), float(pairs), float(kv_pf),
                                float(n_dec), float(kv_dec))


def test_capacity_bounds_are_the_hand_computation_from_the_cost_model():
    from servesim.planning.disagg import capacity_bounds
    # fixed lengths: the mean prompt is 512, the mean output 64; a 4096-token budget holds 8 prompts
    opts = dict(model="llama-3.1-8b", isl=512, osl=64, max_num_batched_tokens=4096, max_num_seqs=64)
    rate = 200.0
    _, rc = _params("h100-sxm", 1, **opts)
    p = rc.params
    t8 = float(_interval(p, 8 * 512, 8, 8 * 512 * 513 / 2, 8 * 512, 0, 0).interval)
    prefill_tok_s = 8 * 512 / t8
    # decode: 64 sequences (max_num_seqs; the KV cache of an H100 holds far more 544-token contexts)
    assert rc.memory.kv_capacity_tokens / (512 + 32) > 64
    t64 = float(_interval(p, 0, 0, 0, 0, 64, 64 * (512 + 32)).interval)
    decode_tok_s = 64 / t64
    lay = {"hardware": "h100-sxm", "dtype": "bf16", "tp": 1, "pp": 1}
    b = capacity_bounds(SimConfig(rate=rate, **opts), lay, lay, slo={})
    assert b["prefill"]["prompts_per_iteration"] == 8
    assert b["prefill"]["tokens_per_s"] == pytest.approx(prefill_tok_s, rel=1e-9)
    assert b["prefill"]["replicas_bound"] == math.ceil(rate * 512 / prefill_tok_s)
    assert b["decode"]["batch_bound"] == 64 and b["decode"]["batch_limited_by"] == "max_num_seqs"
    assert b["decode"]["tokens_per_s"] == pytest.approx(decode_tok_s, rel=1e-9)
    # the first output token comes from the prefill: 63 decode steps per request
    assert b["decode"]["replicas_bound"] == math.ceil(rate * 63 / decode_tok_s)
    assert b["prefill"]["replicas_bound"] >= 2     # the case is not trivially one replica


def test_decode_batch_is_lowered_to_meet_a_tight_tpot_target():
    from servesim.planning.disagg import capacity_bounds
    opts = dict(model="llama-3.1-8b", isl=512, osl=64, max_num_seqs=256)
    _, rc = _params("h100-sxm", 1, **opts)
    p = rc.params
    ctx = 512 + 32

    def lat(b):
        return float(_interval(p, 0, 0, 0, 0, b, b * ctx).latency)
    target = 0.5 * (lat(1) + lat(256))       # between one decode and a full batch: the batch must shrink
    lay = {"hardware": "h100-sxm", "dtype": "bf16", "tp": 1, "pp": 1}
    b = capacity_bounds(SimConfig(rate=10.0, **opts), lay, lay, slo={"tpot_p99": target})["decode"]
    n = b["batch_bound"]
    assert b["batch_limited_by"] == "tpot" and 1 <= n < 256
    assert lat(n) <= target < lat(n + 1)     # the largest batch whose step meets the target
    assert b["tokens_per_s"] == pytest.approx(n / float(_interval(p, 0, 0, 0, 0, n, n * ctx).interval))


@pytest.fixture(scope="module")
def small_plan():
    # 60 req/s: more than one prefill replica is needed, so the one-fewer check runs
    return servesim.plan(disaggregated=True, hardware="h100-sxm", tp=[1], model="llama-3.1-8b", rate=60,
                         slo=SLO, num_requests=300, workers=1)


def test_chosen_plan_meets_the_slo_on_another_seed_and_is_the_cheapest(small_plan):
    b = small_plan.best
    assert b["disaggregated"] and len(b["pools"]) == 2
    assert b["pools"][0].endswith(":prefill") and b["pools"][1].endswith(":decode")
    assert b["num_gpus"] == b["prefill"]["num_gpus"] + b["decode"]["num_gpus"]
    assert b["usd_per_hour"] == pytest.approx(b["prefill"]["usd_per_hour"] + b["decode"]["usd_per_hour"])
    assert b["checks"]["other_seed"]["meets_slo"] and b["checks"]["other_seed"]["seed"] == 1
    # re-simulated independently, on the re-check seed: every SLO target is met
    s = servesim.simulate(pool=tuple(b["pools"]), model="llama-3.1-8b", rate=60, slo=SLO, num_requests=300,
                          seed=1).summary
    assert all(v["met"] for v in s["slo"].values()) and not s["saturated"]
    assert s["kv_transfer_ms"]["count"] > 0
    # one replica fewer of a role with more than one misses
    assert b["prefill"]["replicas"] + b["decode"]["replicas"] > 2
    assert any(k in b["checks"] for k in ("one_prefill_replica_fewer", "one_decode_replica_fewer"))
    for key in ("one_prefill_replica_fewer", "one_decode_replica_fewer"):
        if key in b["checks"]:
            assert not b["checks"][key]["meets_slo"]
    # nothing simulated and cheaper meets the SLO
    rows = small_plan.summary["candidates"]
    cheaper = [r for r in rows if r.get("usd_per_hour") is not None and r["usd_per_hour"] < b["usd_per_hour"] - 1e-9]
    assert all(r["status"] != "meets_slo" for r in cheaper)


def test_cli_disaggregated_json_and_text():
    r = CliRunner().invoke(main, ["plan", "--disaggregated", *SMALL, "--rate", "16", "--slo", SLO,
                                  "--format", "json"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    pools = d["best"]["pools"]
    assert d["best"]["pool_args"] == f"--pool {pools[0]} --pool {pools[1]}"
    t = CliRunner().invoke(main, ["plan", "--disaggregated", *SMALL, "--rate", "16", "--slo", SLO],
                           catch_exceptions=False)
    assert t.exit_code == 0 and t.stdout.startswith(f"best: --pool {pools[0]} --pool {pools[1]}")
    assert "checks: seed 1 meets every SLO" in t.stdout


def test_engine_limits_reach_the_candidates():
    # --max-num-seqs 8: the decode batch bound is 8 (an H100 holds far more 8B contexts), and every
    # simulated candidate runs with it
    res = servesim.plan(disaggregated=True, hardware="h100-sxm", tp=[1], model="llama-3.1-8b", rate=8, slo=SLO,
                        num_requests=200, max_num_seqs=[8], workers=1)
    b = res.best
    assert b["decode"]["capacity_bound"]["batch_bound"] == 8
    assert b["decode"]["capacity_bound"]["batch_limited_by"] == "max_num_seqs"
    assert max(p["mean_batch_size"] for p in b["metrics"]["pools"]) <= 8


def test_no_configuration_meets_is_exit_2_with_reason():
    r = stderr_error("plan", "--disaggregated", *SMALL, "--rate", "8", "--slo", "tpot_p99=2ms",
                   must_contain=["no configuration meets", "prefill/decode", "tpot_p99"])
    assert "no plan" in r.stdout


@pytest.mark.parametrize("args,words", [
    (["--pool", "h100-sxm:tp1:x1:prefill", "--pool", "h100-sxm:tp1:x1:decode"],
     ["--pool", "h100-sxm:tp1:x1:prefill", "drop --pool"]),
    (["--daily-rates", "1,2"], ["--daily-rates", "--disaggregated"]),
    (["--max-num-seqs", "64,128"], ["--max-num-seqs", "64,128", "one value"]),
    (["--tp", "3"], ["--tp"]),
])
def test_disaggregated_user_errors(args, words):
    stderr_error("plan", "--disaggregated", "--rate", "4", "--slo", SLO, "--num-requests", "100", "--workers", "1",
               *args, must_contain=words)


def test_plan_without_disaggregated_refuses_pool_too():
    stderr_error("plan", "--rate", "4", "--slo", SLO, "--pool", "h100-sxm:tp1:x2", must_contain=["--pool", "--disaggregated"])


def test_api_errors():
    with pytest.raises(ConfigError, match="pool"):
        servesim.plan(disaggregated=True, pool=("h100-sxm:tp1:x1:prefill", "h100-sxm:tp1:x1:decode"), rate=4, slo=SLO)
    with pytest.raises(InfeasibleError, match="no configuration meets"):
        servesim.plan(disaggregated=True, hardware="h100-sxm", tp=[1], rate=4, slo="tpot_p99=2ms",
                      num_requests=100, workers=1)


def test_spec_text_round_trips():
    from servesim.planning.disagg import pool_specs
    from servesim.pools import parse_pool
    lp = {"hardware": "h100-sxm", "dtype": "bf16", "tp": 2, "pp": 1}
    ld = {"hardware": "a100-sxm-80gb", "dtype": "fp8", "tp": 4, "pp": 2}
    a, b = pool_specs(lp, ld, 3, 5, ("bf16", "fp8"))
    assert a == "h100-sxm:tp2:x3:prefill:dtype=bf16" and b == "a100-sxm-80gb:tp4:pp2:x5:decode:dtype=fp8"
    assert parse_pool(b) == replace(parse_pool(b), hardware="a100-sxm-80gb", tp=4, pp=2, replicas=5, role="decode")
