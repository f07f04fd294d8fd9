"""experiments/api_tour.py, the notebook-style tour of the Python API, runs start to end (~6 s)."""
import runpy
from pathlib import Path

import pytest

TOUR = Path(__file__).resolve().parent.parent / "experiments" / "api_tour.py"


@pytest.mark.slow   # ~6 s of simulations, the first of which pays the kernel's cold compile in a fresh clone
def test_api_tour_runs(capsys):
    ns = runpy.run_path(str(TOUR), run_name="__main__")
    out = capsys.readouterr().out
    for cell in ("simulate:", "sweep:", "find_max_rate:", "plan:", "cost:", "train:", "compare:"):
        assert cell in out
    # what the cells print holds together: the plan is the cheapest candidate meeting the SLO, and the
    # max-rate search brackets a rate far above the sweep's highest (all four points stable)
    meets = ns["pl"].candidates.query("status == 'meets_slo'")
    assert ns["pl"].best["usd_per_hour"] == meets.usd_per_hour.min()
    assert not ns["sw"].points.saturated.any()
    assert ns["mr"].points.max_rate.iloc[0] > ns["sw"].points.rate.max()
