"""Instructions a run executes, counted by valgrind's cachegrind: a figure the machine's load does not change.

    python experiments/count_instructions.py [CODE]

Runs CODE (default: 200,000 requests of the standard case on one thread) in a fresh interpreter under
`valgrind --tool=cachegrind --cache-sim=no` and prints the instructions of the whole process and of
the code without a symbol, which is numba's jitted code (and any other library without symbols,
listed by cg_annotate under `???:???`). With numba's cache warm for valgrind's CPU this counts the
run; with it cold, the compile too (valgrind's CPU has other features than the machine's, so numba
compiles once for it and caches that: run it twice to count a warm run). Needs valgrind and
cg_annotate on the PATH; ~10 s warm, ~3 min cold.
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = ("import servesim; servesim.simulate(replicas=4, rate=71.677, num_requests=200000, seed=0, "
           "threads=1)")


def count(code: str) -> tuple:
    """(the process's instructions, those of code without a symbol) running ``code``."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "cg.out"
        subprocess.run(["valgrind", "--tool=cachegrind", "--cache-sim=no", f"--cachegrind-out-file={out}",
                        sys.executable, "-c", code], check=True, cwd=ROOT, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        text = subprocess.run(["cg_annotate", str(out)], check=True, capture_output=True, text=True).stdout
    total = re.search(r"^\s*([\d,]+) \([\d.]+%\)\s+PROGRAM TOTALS", text, re.M)
    jit = re.search(r"^\s*([\d,]+) \([\d.]+%\)\s+\?\?\?:\?\?\?\s*$", text, re.M)
    return int(total.group(1).replace(",", "")), int(jit.group(1).replace(",", "")) if jit else 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("code", nargs="?", default=DEFAULT)
    args = ap.parse_args()
    total, jit = count(args.code)
    print(f"instructions: {total:.4g} in the process, {jit:.4g} in code without a symbol (numba's jitted code)")


if __name__ == "__main__":
    main()
