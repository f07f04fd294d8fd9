"""The cold first call, whole processes, alternating A/B runs: each run a fresh interpreter with a new,
empty `NUMBA_CACHE_DIR`, its wall seconds, CPU seconds (user + system, with every process it started:
`os.wait4`'s counts include the children it waited for), the CPU seconds of the interpreter alone
(not with ``--cli``) and peak resident MiB (the largest process).

    python experiments/cold_pair.py [--pairs 3] [--vs DIR] [--env-a KEY=VALUE ...] [--env-b KEY=VALUE ...] [--cli]

A is this checkout; B is checkout DIR (default: this one); ``--env-a``, ``--env-b`` change their
environments (e.g. ``SERVESIM_COMPILE_AHEAD=0``). The code run is `import servesim;
servesim.simulate(num_requests=100)`, or with ``--cli`` the command `servesim simulate --num-requests
100`. Prints each pair, the medians and the median of the pair-by-pair ratios A/B, and the load
average before and after.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CODE = ["-c", "import servesim; servesim.simulate(num_requests=100); import resource, sys; "
              "r = resource.getrusage(resource.RUSAGE_SELF); print('self', r.ru_utime + r.ru_stime, file=sys.stderr)"]
CLI = ["-m", "servesim", "simulate", "--num-requests", "100"]


def cold_run(root: Path, args: list[str], env_extra: dict) -> tuple[float, float, float, float]:
    """(wall s, CPU s with children, peak MiB, CPU s of the interpreter alone or nan) of one cold run
    in checkout ``root``."""
    with tempfile.TemporaryDirectory(prefix="servesim-cold-") as tmp:
        env = dict(os.environ, NUMBA_CACHE_DIR=tmp, PYTHONPATH=str(root), **env_extra)
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, *args], cwd=root, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        err = proc.stderr.read()
        _, status, ru = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode:
            raise SystemExit(f"{root}: exit {proc.returncode}: {err}")
        own = [float(line.split()[1]) for line in err.splitlines() if line.startswith("self ")]
        return wall, ru.ru_utime + ru.ru_stime, ru.ru_maxrss / 1024, own[0] if own else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--vs", type=Path, default=ROOT)
    ap.add_argument("--env-a", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--env-b", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--cli", action="store_true")
    a = ap.parse_args()
    env_a, env_b = (dict(kv.split("=", 1) for kv in e) for e in (a.env_a, a.env_b))
    args = CLI if a.cli else CODE
    print(f"load average before: {os.getloadavg()}")
    rows = {"A": [], "B": []}
    for k in range(a.pairs):
        for side in ("A", "B") if k % 2 == 0 else ("B", "A"):
            root, extra = (ROOT, env_a) if side == "A" else (a.vs.resolve(), env_b)
            rows[side].append(cold_run(root, args, extra))
        print(f"pair {k + 1}: " + " | ".join(f"{s} {w:.2f} s wall {c:.2f} CPU s ({o:.2f} own) {m:.0f} MiB"
                                             for s, (w, c, m, o) in ((s, rows[s][-1]) for s in "AB"))
              + f" | load {os.getloadavg()[0]:.2f}", flush=True)
    for j, what in enumerate(("wall s", "CPU s", "peak MiB", "CPU s of the interpreter alone")):
        ma, mb = (statistics.median(r[j] for r in rows[s]) for s in ("A", "B"))
        ratio = statistics.median(x[j] / y[j] for x, y in zip(rows["A"], rows["B"]))
        print(f"{what}: A {ma:.2f}  B {mb:.2f}  (ratio A/B {ratio:.2f})")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
