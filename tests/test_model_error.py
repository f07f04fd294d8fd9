"""Model-error intervals (servesim/model_error.py): from held-out residuals, covering what they claim.

The coverage test rebuilds each interval without the deployment it is checked on (the residuals of
every other deployment, in the class `model_error` would pick for that row) and counts how many of
that deployment's held-out rows the stated 80% interval covers: 70-90% per metric, as an 80%
interval should on rows it did not see."""
import json
import math

import numpy as np
import pytest

from clihelp import one_line_error
from servesim import model_error as me
from servesim.api import SimConfig, simulate
from servesim.paths import results_dir

RHO = {"low": 0.3, "mid": 0.65, "high": 0.9, "unknown": None}
METRICS = {"e2e_mean": "e2e_ms", "ttft_mean": "ttft_ms", "itl_mean": "itl_ms"}


def _data():
    return json.loads((results_dir() / me.FILE).read_text())


def test_interval_covers_70_to_90_percent_of_held_out_rows(monkeypatch):
    data = _data()
    lat = data["latency"]
    assert len({r["key"] for r in lat}) == 34     # 13 whole runs + 21 load stages, each in several splits
    inside = {m: [] for m in METRICS}
    for exp in sorted({r["experiment"] for r in lat}):
        mine = [r for r in lat if r["experiment"] == exp]
        others = dict(data, latency=[r for r in lat if r["experiment"] != exp])
        monkeypatch.setattr(me, "residuals", lambda d=others: d)
        for key in sorted({r["key"] for r in mine}):
            rows = [r for r in mine if r["key"] == key]
            summary = {b: {"mean": 100.0} for b in METRICS.values()}   # predicted 100 ms
            block = me.model_error(summary, family=rows[0]["family"], tables=True, rho=RHO[rows[0]["load"]])
            for r in rows:
                measured = 100.0 / (1.0 + r["rel_error"])
                lo, hi = block[f"{METRICS[r['metric']]}_mean"]
                inside[r["metric"]].append(lo <= measured <= hi)
    for metric, hits in inside.items():
        share = sum(hits) / len(hits)
        assert 0.70 <= share <= 0.90, (metric, share, len(hits))


def test_bounds_invert_the_residual():
    # predicted / measured - 1 in [-0.1, +0.25] -> measured in [predicted / 1.25, predicted / 0.9]
    assert me.bounds(100.0, (-0.1, 0.25)) == pytest.approx([80.0, 100.0 / 0.9])
    assert me.bounds(None, (-0.1, 0.25)) is None


def test_carry_over_widens_the_interval():
    q_own = me.quantiles([-0.1, 0.0, 0.1] * 10)
    q_carry = me.quantiles(me.combine([-0.1, 0.0, 0.1] * 10, [-0.2, 0.2]))
    assert q_carry[0] < q_own[0] and q_carry[1] > q_own[1]
    # (1 + a)(1 + c) - 1 for a = 0.1, c = 0.2
    assert max(me.combine([0.1], [0.2])) == pytest.approx(0.32)


def test_load_classes_split_at_the_stated_edges():
    assert [me.load_class(x) for x in (0.0, 0.49, 0.5, 0.79, 0.8, 3.0, None, math.nan)] == \
        ["low", "low", "mid", "mid", "high", "high", "unknown", "unknown"]


@pytest.fixture(scope="module")
def run():
    return simulate(SimConfig(model="llama-3.1-8b", hardware="h100-sxm", workload="chat", rate=5.0,
                              num_requests=400))


def test_simulate_summary_carries_model_error_with_its_source(run):
    m = run.summary["model_error"]
    assert m["level"] == 0.8 and m["count"] == 34 and m["class"]["used"] == {"family": "all", "load": "all"}
    assert m["class"]["family"] == "dense" and m["class"]["kernel_tables"] is True
    assert "vllm_validation_rows.csv" in m["source"]["latency"]
    for block in METRICS.values():
        lo, hi = m[f"{block}_mean"]
        assert lo < run.summary[block]["mean"] * 1.5 and hi > run.summary[block]["mean"] / 1.5 and lo < hi
    # a stable open-loop run's throughput is the offered load: no model interval on it
    assert m["engine_bound"] is False and m["output_tokens_per_s"] is None
    assert m["near_capacity"] is None      # no capacity simulated


def test_offline_throughput_gets_the_max_throughput_interval():
    s = simulate(SimConfig(model="llama-3.1-8b", hardware="h100-sxm", workload="chat", offline=True,
                           num_requests=300)).summary
    lo, hi = s["model_error"]["output_tokens_per_s"]
    assert lo < s["throughput"]["output_tokens_per_s"] < hi
    assert s["model_error"]["throughput_count"] > 100


def test_gpu_without_kernel_tables_gets_a_wider_interval():
    a = simulate(SimConfig(model="llama-3.1-8b", hardware="h100-sxm", workload="chat", rate=2.0, num_requests=200))
    b = simulate(SimConfig(model="llama-3.1-8b", hardware="l40s", workload="chat", rate=2.0, num_requests=200))
    ma, mb = a.summary["model_error"], b.summary["model_error"]
    assert mb["class"]["kernel_tables"] is False

    def width(m, s):
        lo, hi = m["e2e_ms_mean"]
        return (hi - lo) / s["e2e_ms"]["mean"]
    assert width(mb, b.summary) > width(ma, a.summary)


def test_near_capacity_when_offered_load_is_inside_the_capacity_band(run):
    s = run.summary
    block = s["model_error"]
    near = me.with_capacity(block, s, {"max_sustainable_rate": 5.1, "offered_rate": 5.0})
    far = me.with_capacity(block, s, {"max_sustainable_rate": 50.0, "offered_rate": 5.0})
    assert near["near_capacity"] is True and near["class"]["load"] == "high"
    assert far["near_capacity"] is False and far["class"]["load"] == "low"
    lo, hi = far["capacity"]["max_sustainable_rate"]
    assert lo < 50.0 < hi or lo <= 50.0 <= hi
    assert far["capacity"]["capacity_headroom"][0] == pytest.approx(1 - 5.0 / lo)


def test_text_table_prints_the_model_interval(run):
    from servesim.render import summary_table
    text = summary_table(run.summary)
    assert "model 80%" in text and "held-out runs/stages" in text


def test_model_margin_out_of_range_is_one_line_exit_2():
    for bad in ("-0.1", "1", "1.5"):
        one_line_error("plan", "--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--rate", "2",
                       "--model-margin", bad, must_contain=("--model-margin", bad))


def test_effective_margin_keeps_the_slo_margin_after_the_model_margin():
    from servesim.planning.plan import effective_margin
    # value (1 + 0.2) <= target (1 - 0.1)  <=>  value <= target (1 - m): m = 1 - 0.9 / 1.2 = 0.25
    assert effective_margin(0.1, 0.2) == pytest.approx(0.25)
    assert effective_margin(0.1, 0.0) == pytest.approx(0.1)


def test_default_model_margin_is_the_pooled_under_prediction():
    # the suite's 13 deployments are fewer than a class needs, so the margin comes from all residuals:
    # the worst of 1 / (1 + q10) - 1 over mean E2E, TTFT and ITL
    rows = _data()["latency"]
    assert len({r["experiment"] for r in rows}) < me.MIN_CLASS
    worst = max(1 / (1 + float(np.quantile([r["rel_error"] for r in rows if r["metric"] == m], 0.1))) - 1
                for m in METRICS)
    assert me.margin_default("dense") == pytest.approx(min(worst, 0.9))
    assert me.margin_default("moe") == me.margin_default("dense")
