"""Compile time of each jitted function on a cold start, from numba's event API.

    python experiments/compile_times.py [--top 10] [--out experiments/results/compile_times.md] [-- CODE]

Runs CODE (default: a 100-request `servesim.simulate`) in a fresh interpreter with an empty
`NUMBA_CACHE_DIR`, with a listener on numba's ``"numba:compile"`` event (`numba.core.event`,
numba >= 0.52), which is broadcast around each dispatcher's compilation of one signature. A
function's compilation includes the typing, and so the compilation, of the jitted functions it
calls; its *self* time is its inclusive time less that of the compilations nested in it. Times are
CPU seconds of the process (`time.process_time`: compiling is single-threaded, and CPU time is less
disturbed than wall time by other work on a shared machine). Prints
the functions by self time, the total and the wall time of the whole process; with ``--out``
writes the same table as Markdown (with the date and the machine's core count).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = "import servesim; servesim.simulate(num_requests=100)"

CHILD = r"""
import json, sys, time
from numba.core import event as ev

rows = []
stack = []

class L(ev.Listener):
    def on_start(self, event):
        d = event.data["dispatcher"]
        stack.append([d.py_func.__module__ + "." + d.py_func.__qualname__, time.process_time(), 0.0])
    def on_end(self, event):
        name, t0, nested = stack.pop()
        dt = time.process_time() - t0
        if stack:
            stack[-1][2] += dt
        rows.append((name, dt, dt - nested))

ev.register("numba:compile", L())
t0 = time.process_time()
exec(compile(sys.argv[1], "<bench>", "exec"))
wall = time.process_time() - t0
json.dump({"rows": rows, "wall": wall}, open(sys.argv[2], "w"))
"""


def measure(code: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="servesim-compile-") as tmp:
        out = Path(tmp) / "rows.json"
        env = dict(os.environ, NUMBA_CACHE_DIR=str(Path(tmp) / "cache"))
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", CHILD, code, str(out)], check=True, cwd=ROOT, env=env)
        res = json.loads(out.read_text())
        res["process"] = time.perf_counter() - t0
        return res


def table(res: dict, top: int) -> list[str]:
    agg: dict[str, list[float]] = {}
    for name, incl, self_ in res["rows"]:
        a = agg.setdefault(name, [0, 0.0, 0.0])
        a[0] += 1
        a[1] += incl
        a[2] += self_
    total = sum(a[2] for a in agg.values())
    lines = ["| function | signatures | self s | inclusive s |", "|---|---|---|---|"]
    for name, (n, incl, self_) in sorted(agg.items(), key=lambda kv: -kv[1][2])[:top]:
        lines.append(f"| `{name.removeprefix('servesim.')}` | {n} | {self_:.2f} | {incl:.2f} |")
    lines.append("")
    lines.append(f"{len(agg)} functions, {len(res['rows'])} compilations, {total:.1f} s compiling (sum of self "
                 f"times); {res['wall']:.1f} CPU s in the interpreter's code; {res['process']:.1f} s wall, the whole process.")
    return lines


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--top", type=int, default=10)
    ap.add_argument("--out", type=Path)
    ap.add_argument("code", nargs="?", default=DEFAULT)
    args = ap.parse_args()
    res = measure(args.code)
    lines = table(res, args.top)
    print("\n".join(lines))
    if args.out:
        head = [f"# Cold compile, per jitted function ({datetime.date.today()}, {os.cpu_count()} cores)", "",
                f"`python experiments/compile_times.py` running `{args.code}` with an empty NUMBA_CACHE_DIR; "
                "self time = a compilation less the compilations nested in it (numba's \"numba:compile\" event).", ""]
        tmp = args.out.with_suffix(".tmp")
        tmp.write_text("\n".join(head + lines) + "\n")
        os.replace(tmp, args.out)


if __name__ == "__main__":
    main()
