"""Regenerate the golden baseline, on purpose: `python experiments/update_golden.py`.

tests/test_golden.py re-runs the scenario stored in tests/golden/baseline.json and demands the
same summary exactly. When a change of results is intended, run this script and commit the diff
of baseline.json together with the change, so every change of numbers is reviewed.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import servesim  # noqa: E402

GOLDEN = ROOT / "tests" / "golden" / "baseline.json"
SCENARIO = {"num_requests": 300, "seed": 1}


def main() -> None:
    result = servesim.simulate(**SCENARIO)
    doc = {"scenario": SCENARIO, "summary": json.loads(result.to_json())}
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    GOLDEN.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {GOLDEN.relative_to(ROOT)}: {doc['summary']['num_completed']} requests completed, "
          f"duration {doc['summary']['duration_s']:.3f} s")


if __name__ == "__main__":
    main()
