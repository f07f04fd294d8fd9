"""Golden baselines: fixed-seed scenarios whose summaries must not change by accident, one per path
of the engine (defaults, mixed pools, prefill/decode pools, prefix caching, sessions, PP, MoE).

If a change of results is intended, regenerate with `python experiments/update_golden.py [NAME]` and
commit the diff of tests/golden/NAME.json with it.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
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


@pytest.mark.slow
def test_golden_summaries_with_the_pruned_kernels():
    """The suite runs a feature scenario on the kernel compiled with the prefix cache, session turns, KV
    transfers and static batching (SERVESIM_KERNEL_UNION, conftest.py); a user's run compiles only the
    features it uses. Both give the golden summaries."""
    code = ("import json, sys, servesim\n"
            "from pathlib import Path\n"
            "bad = []\n"
            "for name in sys.argv[1:]:\n"
            "    g = json.loads((Path(%r) / f'{name}.json').read_text())\n"
            "    if json.loads(servesim.simulate(**g['scenario']).to_json()) != g['summary']:\n"
            "        bad.append(name)\n"
            "print(json.dumps(bad))") % str(GOLDEN)
    env = dict(os.environ, SERVESIM_KERNEL_UNION="0")
    r = subprocess.run([sys.executable, "-c", code, *NAMES], capture_output=True, text=True, env=env, timeout=1200)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == []
