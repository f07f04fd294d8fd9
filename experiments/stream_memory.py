"""Peak memory of streamed runs (`--stream`) against the number of requests, and the exact path's.

The standard case of bench_speed.py (llama-3.1-8b, 4 H100 replicas, chat at ~80% of capacity);
each run in a fresh process, whose peak resident set (VmHWM, after the imports and a warm-up run
that fills the JIT cache) is reported with its wall time. A streamed run's memory should not grow
with the request count; the exact path's grows ~480 B per request (engine/budget.py).

    python experiments/stream_memory.py 1e6 1e7 3e7 [--exact 1e6] [--out experiments/results/stream_memory.md]
"""
from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, sys, time, resource
import servesim
n, rate, stream = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3] == "1"
servesim.simulate(replicas=4, rate=rate, num_requests=2000, seed=0, stream=stream)     # warm: imports, JIT
def hwm():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM"):
            return int(line.split()[1]) * 1024
base = hwm()
t0 = time.perf_counter()
res = servesim.simulate(replicas=4, rate=rate, num_requests=n, seed=0, stream=stream)
wall = time.perf_counter() - t0
s = res.summary
print(json.dumps({"n": n, "stream": stream, "wall_s": wall, "peak_bytes": hwm(), "base_bytes": base,
                  "verdict": s["saturation_verdict"], "ttft_p99_ms": s["ttft_ms"]["p99"],
                  "chunks": s.get("stream", {}).get("chunks"), "held": s.get("stream", {}).get("peak_requests_held")}))
"""

RATE = 80.0    # ~80% of the 4 replicas' offline capacity on chat (bench_speed.py measures it: ~100 req/s)


def run(n: int, stream: bool) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, str(n), str(RATE), "1" if stream else "0"], cwd=ROOT,
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("n", nargs="+", type=float, help="request counts of the streamed runs")
    ap.add_argument("--exact", nargs="*", type=float, default=[], help="request counts of exact-path runs")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    rows = []
    for n, stream in [(int(x), False) for x in args.exact] + [(int(x), True) for x in args.n]:
        r = run(n, stream)
        rows.append(r)
        print(json.dumps(r), flush=True)
    lines = [f"# Peak memory of streamed runs ({datetime.date.today()}, this 2-core machine)", "",
             f"llama-3.1-8b, 4 x h100-sxm, chat at {RATE:g} req/s, seed 0; peak resident set (VmHWM) of a fresh "
             "process after a warm-up run (`experiments/stream_memory.py`).", "",
             "| requests | path | wall s | peak RSS MB | after warm-up MB | requests held at most | verdict |",
             "|---:|---|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['n']:,} | {'stream' if r['stream'] else 'exact'} | {r['wall_s']:.1f} | "
                     f"{r['peak_bytes'] / 1e6:.0f} | {r['base_bytes'] / 1e6:.0f} | "
                     f"{r['held'] if r['held'] is not None else '-'} | {r['verdict']} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
