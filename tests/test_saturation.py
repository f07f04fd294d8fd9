"""The saturated flag separates loads below capacity from loads above it."""
import pytest

import servesim


@pytest.fixture(scope="module")
def capacity():
    # offline throughput of the default deployment on the default workload, requests/s
    return servesim.simulate(offline=True, num_requests=3000, seed=3).summary["throughput"]["requests_per_s"]


@pytest.mark.parametrize("seed", [0, 1])
def test_below_capacity_is_stable(capacity, seed):
    s = servesim.simulate(rate=0.6 * capacity, num_requests=3000, seed=seed).summary
    assert not s["saturated"]
    assert s["queue_growth"]["late_window_departures_per_arrival"] > 0.9


@pytest.mark.parametrize("seed", [0, 1])
def test_above_capacity_is_saturated(capacity, seed):
    s = servesim.simulate(rate=1.3 * capacity, num_requests=3000, seed=seed).summary
    assert s["saturated"]
    assert s["queue_growth"]["queue_delay_slope"] > 0.05
    # achieved throughput stays near capacity, well below the offered rate
    assert s["throughput"]["requests_per_s"] < 1.1 * capacity
