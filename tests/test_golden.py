"""Golden baselines: fixed-seed scenarios whose summaries must not change by accident, one per path
of the engine (defaults, mixed pools, prefill/decode pools, prefix caching, sessions, PP, MoE).

If a change of results is intended, regenerate with `python experiments/update_golden.py [NAME]` and
commit the diff of tests/golden/NAME.json with it.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import servesim

GOLDEN = Path(__file__).parent / "golden"
NAMES = ["baseline", "pools", "pd", "prefix", "sessions", "pp", "moe"]


def test_every_golden_file_is_checked():
    assert sorted(p.stem for p in GOLDEN.glob("*.json")) == sorted(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_golden_summary_unchanged(name):
    golden = json.loads((GOLDEN / f"{name}.json").read_text())
    summary = json.loads(servesim.simulate(**golden["scenario"]).to_json())
    if summary != golden["summary"]:
        changed = sorted(k for k in set(summary) | set(golden["summary"])
                         if summary.get(k) != golden["summary"].get(k))
        raise AssertionError(f"{name}: summary differs from the golden baseline in {changed}; if intended, run "
                             f"`python experiments/update_golden.py {name}` and commit the diff")
