"""Saturation verdict (issue #16): no false alarms on short stable runs, "undetermined" when the run is
too short to tell, saturated with enough requests above capacity, all-rejected runs are errors, and
closed loops with more clients than requests are reported as in effect offline."""
import json

import pytest
from click.testing import CliRunner

import servesim
from servesim.cli import main
from servesim.errors import InfeasibleError

VERDICTS = {"stable", "saturated", "undetermined"}


@pytest.fixture(scope="module")
def capacity():
    """Offline throughput of the default deployment on the default workload, requests/s."""
    return servesim.simulate(offline=True, num_requests=3000, seed=3).summary["throughput"]["requests_per_s"]


def test_short_stable_runs_are_never_saturated(capacity):
    # 27% load, 100 requests: before, 4 of 20 seeds were flagged (requests in flight at the last arrival)
    verdicts = []
    for seed in range(20):
        s = servesim.simulate(rate=0.27 * capacity, num_requests=100, seed=seed).summary
        assert not s["saturated"], (seed, s["saturation_reason"], s["queue_growth"])
        verdicts.append(s["saturation_verdict"])
    assert set(verdicts) <= {"stable", "undetermined"}
    assert verdicts.count("stable") >= 15, verdicts


@pytest.mark.parametrize("seed", range(4))
def test_above_capacity_with_enough_requests_is_saturated(capacity, seed):
    s = servesim.simulate(rate=1.2 * capacity, num_requests=3000, seed=seed).summary
    assert s["saturated"] and s["saturation_verdict"] == "saturated", s["saturation_reason"]
    g = s["queue_growth"]
    assert g["late_window_admissions_per_arrival"] < 0.9 or g["queue_delay_slope"] > 0.05


@pytest.mark.parametrize("frac", [0.8, 1.2])
def test_too_short_to_tell_is_undetermined_not_saturated(capacity, frac):
    # 100 requests of ~2 s each at 80-120% load: the batch is still filling when the arrivals stop
    s = servesim.simulate(rate=frac * capacity, num_requests=100, seed=0).summary
    assert s["saturation_verdict"] == "undetermined" and not s["saturated"]
    assert s["saturation_reason"].startswith("too few requests")


@pytest.mark.parametrize("n", [10, 60])
def test_fewer_than_the_window_minimum_is_undetermined(n):
    s = servesim.simulate(num_requests=n, seed=1).summary
    assert s["saturation_verdict"] == "undetermined" and "too few requests" in s["saturation_reason"]


def test_duration_cutoff_is_saturated_with_the_reason(capacity):
    s = servesim.simulate(rate=2 * capacity, num_requests=3000, duration=20.0, seed=0).summary
    assert s["saturated"] and s["saturation_verdict"] == "saturated"
    assert s["saturation_reason"].startswith("stopped by --duration")


def test_stage_verdicts_and_the_decisive_stage(capacity):
    s = servesim.simulate(stages=f"{0.3 * capacity:.3f}x60s,{1.5 * capacity:.3f}x120s", seed=0).summary
    assert [st["saturation_verdict"] for st in s["stages"]] == ["stable", "saturated"]
    assert s["saturated"] and s["saturation_reason"].startswith("stage 1:")
    assert s["queue_growth"]["stage"] == 1


@pytest.mark.parametrize("args, verdict, words", [
    (["--concurrency", "50", "--num-requests", "20"], "undetermined", ["50 clients for 20 requests", "offline"]),
    (["--concurrency", "4", "--num-requests", "40"], "stable", ["closed loop", "at most 4"]),
    (["--offline", "--num-requests", "40"], "undetermined", ["offline"]),
])
def test_closed_loop_and_offline_verdicts(args, verdict, words):
    r = CliRunner().invoke(main, ["simulate", "--format", "json"] + args)
    assert r.exit_code == 0, r.output
    s = json.loads(r.output)
    assert s["saturation_verdict"] == verdict and not s["saturated"]
    for w in words:
        assert w in s["saturation_reason"], s["saturation_reason"]


def test_table_shows_the_verdict_and_the_in_effect_offline_closed_loop():
    r = CliRunner().invoke(main, ["simulate", "--concurrency", "50", "--num-requests", "20"])
    assert r.exit_code == 0, r.output
    assert "closed loop, 50 clients (more clients than the 20 requests: in effect offline)" in r.output
    status = next(line for line in r.output.splitlines() if line.startswith("status"))
    assert "undetermined" in status and "stable" not in status
    r = CliRunner().invoke(main, ["simulate", "--num-requests", "300", "--rate", "2"])
    assert r.exit_code == 0 and ", stable," in r.output


ALL_REJECTED = ["--gpu-memory-utilization", "0.3", "--isl", "120000", "--osl", "1000", "--num-requests", "5"]


@pytest.mark.parametrize("extra", [[], ["--concurrency", "2"], ["--offline"]])
def test_every_request_rejected_is_an_error(extra):
    r = CliRunner().invoke(main, ["simulate"] + ALL_REJECTED + extra)
    assert r.exit_code == 2, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.output
    assert lines[0].startswith("servesim: error: every request would be rejected")
    for w in ("121000 tokens", "KV blocks", "--gpu-memory-utilization"):
        assert w in lines[0]


def test_every_request_rejected_raises_in_the_api():
    with pytest.raises(InfeasibleError, match="every request would be rejected"):
        servesim.simulate(gpu_memory_utilization=0.3, isl=120000, osl=1000, num_requests=5)


def test_some_rejected_still_runs():
    # a mixed workload: the long prompts are rejected, the others served; counted, not an error
    s = servesim.simulate(gpu_memory_utilization=0.3, workload="long-context", num_requests=200, seed=0).summary
    assert s["num_completed"] > 0
    assert s["saturation_verdict"] in VERDICTS
