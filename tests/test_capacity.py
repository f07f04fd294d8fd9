"""Busy fraction and capacity headroom against queueing theory.

With max_num_seqs = 1 and fixed lengths the engine is an M/D/1 queue: Poisson arrivals, one request
at a time, each served for the same S seconds. Then (Kleinrock 1975, vol. 1, sec. 2.1 and 5.5):
the server is busy a fraction rho = lambda S of the time (the utilisation law), the queue is
stable for lambda < 1 / S and grows without bound above, so the maximum sustainable rate is 1 / S
and the capacity headroom at lambda is 1 - rho.
"""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import servesim
from servesim.api import SimConfig
from servesim.cli import main
from servesim.planning.capacity import capacity

MD1 = dict(isl=128, osl=8, max_num_seqs=1)


@pytest.fixture(scope="module")
def service_s():
    """S: scheduled to finished of one request alone."""
    r = servesim.simulate(offline=True, num_requests=1, **MD1).requests.iloc[0]
    return r.finish_s - r.scheduled_s


@pytest.mark.parametrize("rho", [0.3, 0.6])
def test_md1_busy_and_headroom(service_s, rho):
    rate = rho / service_s
    s = servesim.simulate(rate=rate, num_requests=2000, **MD1).summary
    assert s["utilization"]["busy_fraction"] == pytest.approx(rho, abs=0.03)   # well under 100% at low load
    cap = capacity(SimConfig(rate=rate, num_requests=2000, **MD1), rate)
    # the saturation test resolves growth down to ~5% overload, the bisection to 5%
    assert 0.95 / service_s <= cap["max_sustainable_rate"] <= 1.1 / service_s
    assert cap["first_saturated_rate"] > cap["max_sustainable_rate"]
    assert cap["capacity_headroom"] == pytest.approx(1.0 - rho, abs=0.05)


def test_batching_keeps_a_batch_in_flight_at_low_load():
    """Continuous batching: at a quarter of capacity some request is nearly always in flight, so the
    busy fraction says little about load; the capacity headroom does."""
    res = CliRunner().invoke(main, ["simulate", "--num-requests", "600", "--rate", "5.5", "--capacity",
                                    "--format", "json"])
    assert res.exit_code == 0, res.output
    s = json.loads(res.output)
    assert s["utilization"]["busy_fraction"] > 0.95
    assert s["capacity"]["capacity_headroom"] > 0.5
    assert s["capacity"]["offered_rate"] == 5.5


def test_capacity_table_line_and_bad_combination():
    r = CliRunner().invoke(main, ["simulate", "--num-requests", "300", "--rate", "2", "--capacity"])
    assert r.exit_code == 0, r.output
    assert "capacity    max sustainable" in r.output and "headroom" in r.output
    r = CliRunner().invoke(main, ["simulate", "--offline", "--capacity"])
    assert r.exit_code == 2
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and "--capacity" in lines[0] and "--offline" in lines[0]
    assert "Traceback" not in r.output
