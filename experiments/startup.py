"""Start-up of a cached command: `servesim simulate --num-requests 10000` and `import servesim`, wall
time of whole fresh processes (median of N), with the numba cache warm; then where a run's time goes:
timers around its phases (median of N, no profiler), and one run under cProfile (cumulative seconds
of the largest parts).

    python experiments/startup.py [--repeats 7] [--root DIR]   # DIR: a checkout to time (default: this one)
    python experiments/startup.py --vs DIR [--repeats 10]      # whole processes in turn against checkout DIR

With --vs, the cached command runs alternately here (A) and in DIR (B), after one uncounted run of
each; it prints the medians of wall and CPU (user + system) seconds and of the pair-by-pair ratio A/B.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import pstats
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLI = ["-m", "servesim", "simulate", "--num-requests", "10000"]
PARTS = {   # what the profile's cumulative times are read for
    "import servesim": "servesim/__init__.py:(<module>)",
    "numba import": "numba/__init__.py:(<module>)",
    "numba's first cache load (target set-up)": "numba/core/base.py:(refresh)",
    "of it, numba's BLAS probe (none: servesim._numba_start)": "scipy/linalg/__init__.py:(<module>)",
    "scipy.special import (none: the intervals' t table)": "scipy/special/__init__.py:(<module>)",
    "pandas import (none: a summarised run does not load it)": "pandas/__init__.py:(<module>)",
    "the CLI's other commands (none: loaded when looked up)": "servesim/cli/plan.py:(<module>)",
    "the kernel run (10,000 requests)": "servesim/engine/run.py:(run)",
    "the summary": "servesim/metrics.py:(summarize)",
}


def wall(args: list[str], root: Path, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats + 1):        # the first run warms the cache and is not counted
        t0 = time.perf_counter()
        subprocess.run([sys.executable] + args, cwd=root, check=True, stdout=subprocess.DEVNULL)
        out.append(time.perf_counter() - t0)
    return out[1:]


def one_run(root: Path) -> tuple[float, float]:
    """(wall s, CPU s) of one whole cached run in `root`."""
    before = os.times()
    t0 = time.perf_counter()
    subprocess.run([sys.executable] + CLI, cwd=root, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    after = os.times()
    return wall, (after.children_user - before.children_user) + (after.children_system - before.children_system)


def pairs(a: Path, b: Path, n: int) -> None:
    one_run(a), one_run(b)                  # warm-up, not counted
    runs = [(one_run(a), one_run(b)) for _ in range(n)]
    for i, what in enumerate(("wall", "CPU")):
        ra, rb = [r[0][i] for r in runs], [r[1][i] for r in runs]
        ratio = [x / y for x, y in zip(ra, rb)]
        print(f"{what} s, median of {n} pairs: A {statistics.median(ra):.3f} ({min(ra):.3f}-{max(ra):.3f}), "
              f"B {statistics.median(rb):.3f} ({min(rb):.3f}-{max(rb):.3f}), A/B {statistics.median(ratio):.3f}")


# a fresh process timing its own phases: the imports, then the API's steps as the CLI calls them
PHASES = """
import json, sys, time
t0 = time.perf_counter()
marks = {}
import numpy
marks["numpy import"] = time.perf_counter() - t0
import servesim
from servesim.cli import main
marks["servesim + CLI import (not numba)"] = time.perf_counter() - t0 - marks["numpy import"]
t = time.perf_counter()
import numba
marks["numba import"] = time.perf_counter() - t
t = time.perf_counter()
from servesim import api
marks["simulator modules (dispatchers made)"] = time.perf_counter() - t
for name in ("resolve", "lower_deployment", "run", "summarize"):
    def timed(*a, _f=getattr(api, name), _n=name, **k):
        t = time.perf_counter()
        try:
            return _f(*a, **k)
        finally:
            marks[_n] = marks.get(_n, 0.0) + time.perf_counter() - t
    setattr(api, name, timed)
try:
    main(sys.argv[1:])
except SystemExit:
    pass
marks["all in the process (from its first line)"] = time.perf_counter() - t0
print(json.dumps(marks), file=sys.stderr)
"""
PHASE_NAMES = {"resolve": "workload and profiles (api.resolve)",
               "lower_deployment": "lowering (numba's target set up at its first load)",
               "run": "kernel: cache load + run", "summarize": "summary"}


def phases(root: Path, repeats: int) -> dict:
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        r = subprocess.run([sys.executable, "-c", PHASES] + CLI[2:], cwd=root, check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        m = json.loads(r.stderr.strip().splitlines()[-1])     # the dict the child printed
        m["interpreter start and exit"] = time.perf_counter() - t0 - m["all in the process (from its first line)"]
        runs.append(m)
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def parts(root: Path) -> dict:
    prof = root / ".startup.prof"
    subprocess.run([sys.executable, "-m", "cProfile", "-o", str(prof)] + CLI, cwd=root, check=True,
                   stdout=subprocess.DEVNULL)
    s = io.StringIO()
    stats = pstats.Stats(str(prof), stream=s)
    prof.unlink()
    got = {}
    for (file, line, fn), (_, _, _, cum, _) in stats.stats.items():
        key = f"{file}:({fn})"      # the function, wherever its line is
        for name, tail in PARTS.items():
            if key.endswith(tail):
                got[name] = max(got.get(name, 0.0), cum)
    return got


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--root", type=Path, default=ROOT)
    ap.add_argument("--vs", type=Path, default=None, help="another checkout: time whole runs in turn against it")
    args = ap.parse_args()
    if args.vs is not None:
        print(f"A = {args.root}, B = {args.vs}: {' '.join(CLI[1:])}, load average {os.getloadavg()[0]:.2f}")
        pairs(args.root, args.vs, args.repeats)
        print(f"load average after: {os.getloadavg()[0]:.2f}")
        return
    cli = wall(CLI, args.root, args.repeats)
    imp = wall(["-c", "import servesim"], args.root, args.repeats)
    print(f"servesim simulate --num-requests 10000, cached: median {statistics.median(cli):.2f} s wall "
          f"({min(cli):.2f}-{max(cli):.2f}, {args.repeats} runs)")
    print(f"import servesim: median {statistics.median(imp):.2f} s wall ({min(imp):.2f}-{max(imp):.2f})")
    print(f"phases, median of {args.repeats} runs, s:")
    for name, v in phases(args.root, args.repeats).items():
        print(f"  {PHASE_NAMES.get(name, name):56s} {v:.3f}")
    print("one run under cProfile (its overhead included), cumulative s:")
    got = parts(args.root)
    for name in PARTS:
        print(f"  {name:56s} {got.get(name, 0.0):.2f}")


if __name__ == "__main__":
    main()
