"""Start-up of a cached command: `servesim simulate --num-requests 10000` and `import servesim`, wall
time of whole fresh processes (median of N), with the numba cache warm; then where one run's time goes
(cProfile, cumulative seconds of the largest parts).

    python experiments/startup.py [--repeats 7] [--root DIR]   # DIR: a checkout to time (default: this one)
"""
from __future__ import annotations

import argparse
import io
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
    args = ap.parse_args()
    cli = wall(CLI, args.root, args.repeats)
    imp = wall(["-c", "import servesim"], args.root, args.repeats)
    print(f"servesim simulate --num-requests 10000, cached: median {statistics.median(cli):.2f} s wall "
          f"({min(cli):.2f}-{max(cli):.2f}, {args.repeats} runs)")
    print(f"import servesim: median {statistics.median(imp):.2f} s wall ({min(imp):.2f}-{max(imp):.2f})")
    print("one run under cProfile (its overhead included), cumulative s:")
    got = parts(args.root)
    for name in PARTS:
        print(f"  {name:56s} {got.get(name, 0.0):.2f}")


if __name__ == "__main__":
    main()
