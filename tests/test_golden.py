"""Golden baseline: a fixed-seed scenario whose summary must not change by accident.

If a change of results is intended, regenerate with `python experiments/update_golden.py` and
commit the diff of tests/golden/baseline.json with it.
"""
from __future__ import annotations

import json
from pathlib import Path

import servesim

GOLDEN = Path(__file__).parent / "golden" / "baseline.json"


def test_golden_summary_unchanged():
    golden = json.loads(GOLDEN.read_text())
    summary = json.loads(servesim.simulate(**golden["scenario"]).to_json())
    if summary != golden["summary"]:
        changed = sorted(k for k in set(summary) | set(golden["summary"])
                         if summary.get(k) != golden["summary"].get(k))
        raise AssertionError(f"summary differs from the golden baseline in {changed}; if intended, run "
                             f"`python experiments/update_golden.py` and commit the diff")
