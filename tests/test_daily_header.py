"""Headers that describe what ran: a daily run's window of the day and delivered rate; a whole day."""
import numpy as np
import pytest

import servesim
from servesim.render import summary_table
from servesim.workload.arrivals import DIURNAL_CURVE, clock_of_day, daily_window


def test_window_rate_is_the_curve_over_the_window():
    # inside 00:00-01:00 the intensity is rate x the first hourly multiplier (curve / its mean)
    t = np.array([0.0, 600.0, 1800.0])
    d = daily_window(t, 12.0)
    assert d["window"] == "00:00:00-00:30:00"
    assert d["window_rate"] == pytest.approx(12.0 * DIURNAL_CURVE[0] / np.mean(DIURNAL_CURVE))
    assert d["delivered_rate"] == pytest.approx(2 / 1800.0)
    # a window across hours 01:30-03:00: half an hour at m[1], an hour at m[2]
    m = np.asarray(DIURNAL_CURVE) / np.mean(DIURNAL_CURVE)
    d = daily_window(np.array([5400.0, 10800.0]), 2.0)
    assert d["window_rate"] == pytest.approx(2.0 * (0.5 * m[1] + m[2]) / 1.5)
    assert clock_of_day(86400.0, end=True) == "24:00:00" and clock_of_day(90061.0) == "01:01:01+1d"


def test_short_daily_run_header_shows_the_trough_it_delivered():
    r = servesim.simulate(arrival="daily", rate=12, num_requests=300, isl=128, osl=16)
    t = r.requests.arrival_s.to_numpy()
    delivered = (t.size - 1) / (t[-1] - t[0])
    d = r.summary["config"]["daily"]
    assert d["delivered_rate"] == pytest.approx(delivered)
    assert d["window_rate"] == pytest.approx(12.0 * DIURNAL_CURVE[0] / np.mean(DIURNAL_CURVE))  # ~5.5
    load = summary_table(r.summary).splitlines()[1]
    assert f"daily arrivals over 00:00:00-{clock_of_day(t[-1], end=True)} of the day" in load
    assert f"delivered {delivered:.3g} req/s" in load and "at 12 req/s" not in load


def test_duration_24h_sends_a_whole_day():
    r = servesim.simulate(arrival="daily", rate=0.5, duration=86400.0, isl=64, osl=4)
    s, t = r.summary, r.requests.arrival_s.to_numpy()
    n = t.size
    assert abs(n - 43200) < 5 * np.sqrt(43200)          # Poisson(rate x 24 h)
    assert t.min() >= 0.0 and t.max() < 86400.0
    assert s["num_completed"] == n and s["saturation_verdict"] == "stable"   # the clock ran on past 24 h
    d = s["config"]["daily"]
    assert d["window"] == "00:00:00-24:00:00" and d["delivered_rate"] == pytest.approx(n / 86400.0)
    assert d["window_rate"] == pytest.approx(0.5)
    hours = np.bincount((t // 3600).astype(int), minlength=24)
    assert hours[3] < 0.5 * hours[14]                   # the night trough and the afternoon peak
