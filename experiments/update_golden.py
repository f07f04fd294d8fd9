"""Regenerate the golden baselines, on purpose: `python experiments/update_golden.py [NAME ...]`.

tests/test_golden.py re-runs the scenario stored in each tests/golden/NAME.json and demands the
same summary exactly. When a change of results is intended, run this script (all scenarios, or the
named ones) and commit the diff of the JSON files together with the change, so every change of
numbers is reviewed.

The scenarios cover each path of the engine: the defaults (`baseline`), two mixed pools of
different hardware, prefill/decode pools with layer-wise transfers, prefix caching (shared system
prompts on a CPU tier with the prefix-aware router; sessions), pipeline parallelism with
preemption, and a mixture-of-experts model.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import servesim  # noqa: E402

GOLDEN = ROOT / "tests" / "golden"
SCENARIOS = {
    "baseline": {"num_requests": 300, "seed": 1},
    "pools": {"num_requests": 300, "seed": 2, "pool": ["h100-sxm:tp1:x2", "a100-sxm-80gb:tp2:x1"],
              "router": "least-requests", "rate": 30},
    "pd": {"num_requests": 300, "seed": 3, "pool": ["h100-sxm:tp2:x1:prefill", "h100-sxm:tp1:x2:decode"],
           "layerwise_transfer": True, "rate": 20},
    "prefix": {"num_requests": 300, "seed": 4, "num_system_prompts": 4, "users_per_system_prompt": 10,
               "system_prompt_len": 512, "cpu_kv_gib": 2.0, "router": "prefix-aware", "replicas": 2,
               "num_gpu_blocks": 600, "rate": 20},
    "sessions": {"num_requests": 300, "seed": 5, "workload": "sessions", "replicas": 2, "router": "prefix-aware"},
    "pp": {"num_requests": 300, "seed": 6, "model": "llama-3.1-70b", "tp": 2, "pp": 2, "num_gpu_blocks": 1200,
           "preemption": "swap", "rate": 8},
    "moe": {"num_requests": 300, "seed": 7, "model": "mixtral-8x7b", "tp": 2, "rate": 10},
}


def write(name: str) -> None:
    scenario = SCENARIOS[name]
    result = servesim.simulate(**scenario)
    doc = {"scenario": scenario, "summary": json.loads(result.to_json())}
    path = GOLDEN / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n")
    s = doc["summary"]
    print(f"wrote {path.relative_to(ROOT)}: {s['num_completed']} requests completed, "
          f"duration {s['duration_s']:.3f} s, {s['preemptions']} preemptions")


def main(argv: list[str]) -> None:
    names = argv or list(SCENARIOS)
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        sys.exit(f"unknown scenario {unknown[0]!r}; use one of {', '.join(SCENARIOS)}")
    for name in names:
        write(name)


if __name__ == "__main__":
    main(sys.argv[1:])
