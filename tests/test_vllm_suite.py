"""The real-vLLM validation suite: how a deployment becomes a simulation, the saturation verdict at the
edge of simulated capacity, and the CLI."""
from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from servesim.api import simulate
from servesim.calibrate import vllm_serving as vs
from servesim.cli import main


@pytest.fixture(scope="module")
def deps():
    return vs.deployments(vs.load())


def test_thirteen_deployments_with_their_stage_rows(deps):
    df = vs.load()
    assert len(deps) == 13
    for e, part in df.groupby("experiment"):
        n_stages = len(str(part.stages.iloc[0]).split(";"))
        assert sorted(part.stage) == [-1] + (list(range(n_stages)) if n_stages > 1 else [0])


def test_outputs_and_itl_per_generated_token(deps):
    # the client sets ignore_eos: every request generates output_len tokens, and the suite compares ITL
    # per generated token, (E2E mean - TTFT mean) / (output_len - 1); the data's ITL column divides by
    # the client's re-tokenised count, 1 + (E2E - TTFT) / ITL (checked on two rows by hand)
    r = deps[deps.experiment == "64-qwen2-5-7b-instruct-tp1-roleplay-1-1"].iloc[0]
    assert r.output_used == 251
    assert vs.implied_output(vs.load())[r.experiment] == round(1 + (1771.800 - 26.716) / 7.023)   # 249
    df = vs.load()
    row = df[(df.experiment == "67-llama-2-7b-hf-tp1-reasoning-lite-1-1") & (df.stage == -1)].iloc[0]
    assert vs.itl_per_generated_token(df)[row.name] == pytest.approx((17062.127 - 55.096) / 1447)
    assert vs.implied_output(df)[row.experiment] == round(1 + (17062.127 - 55.096) / 15.202)    # 1120 of 1448


def test_config_reproduces_the_workload(deps):
    r = deps[deps.experiment == "62-mistral-nemo-12b-tp2-general-lite-2-1"].iloc[0]
    res = simulate(vs.config_of(r))
    req = res.requests
    assert (req.prompt_tokens == 100 + 447 + vs.TEMPLATE_TOKENS).all()
    assert res.summary["config"]["kv_blocks_per_replica"] == 48009
    st = res.summary["stages"]
    assert [s["rate"] for s in st] == [2.5, 6.0] and [s["duration_s"] for s in st] == [600.0, 600.0]
    # Poisson counts: 2.5 x 600 = 1500 and 6 x 600 = 3600, within 4 standard deviations
    for s, lam in zip(st, (1500, 3600)):
        assert abs(s["num_requests"] - lam) < 4 * np.sqrt(lam)


def _capacity_rps(row) -> float:
    """Simulated capacity: the requests per second an overloaded open-loop run delivers (offered 1.5x
    the throughput of every request queued at t = 0). The all-at-once run alone reads low where its
    KV cache is the limit: Llama-4-Scout reasoning (1,448 output tokens) completes 2.28 req/s with
    1,500 requests queued at once and 2.58 req/s under a sustained overload; the others agree within
    3%."""
    off = simulate(vs.config_of(row, stages=None, offline=True, num_requests=1500)).summary["throughput"]["requests_per_s"]
    over = simulate(vs.config_of(row, stages=f"{1.5 * off:.4f}x{max(300.0, 3000.0 / off):.0f}s")).summary
    assert over["saturated"], (row.experiment, off)
    return over["throughput"]["requests_per_s"]


@pytest.mark.slow   # ~15 s (52 simulations): kept out of the default run for time (CI runs it)
def test_saturation_verdict_at_the_edge_of_capacity(deps):
    """At 80% of the simulated capacity every workload is stable; at 120% it is saturated."""
    for row in deps.itertuples(index=False):
        mu = _capacity_rps(row)
        dur = max(300.0, 3000.0 / mu)
        below = simulate(vs.config_of(row, stages=f"{0.8 * mu:.4f}x{dur:.0f}s")).summary
        above = simulate(vs.config_of(row, stages=f"{1.2 * mu:.4f}x{dur:.0f}s")).summary
        assert not below["saturated"], (row.experiment, mu)
        assert above["saturated"], (row.experiment, mu)


def test_validate_vllm_check_reports_every_split_and_passes():
    """The shipped vllm profile reproduces the 13 deployments within the issue's tolerances (E2E
    mean 10%, TTFT mean 15%, ITL 10% median, in sample and left out one deployment at a time), and
    no stable deployment is called saturated. --check also checks the stage extrapolation (fit on
    stage 0, predict stage 1) and the signed bias per load stage (+-5%, LODO); all are met, so
    --check passes."""
    r = CliRunner().invoke(main, ["validate", "--suite", "vllm", "--check", "--format", "json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out[0]["suite"] == "vllm" and set(out[0]["checked"]) == {"e2e_mean", "ttft_mean", "itl_mean"}
    assert all(v["median"] <= v["tolerance"] for v in out[0]["checked"].values())
    held = out[0]["heldout"]
    assert set(held["splits"]) == {"fitted", "lodo", "stage", "workload", "family"} and not held["stale"]
    lodo = held["splits"]["lodo"]["whole"]
    assert lodo["n"] == 13 and lodo["e2e_mean"] <= 0.10 and lodo["ttft_mean"] <= 0.15 and lodo["itl_mean"] <= 0.10
    assert held["splits"]["stage"]["stages"]["n"] == 8      # the 8 deployments with a second, faster stage
    assert "validation failed" not in r.stderr
    c = vs.run_suite()
    assert not c.saturated.any() and c.predicted.notna().all()
