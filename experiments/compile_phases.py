"""Where a cold compile's CPU time goes, by phase of numba's pipeline.

    python experiments/compile_phases.py [-- CODE]

Runs CODE (default: a 100-request `servesim.simulate`) in a fresh interpreter with an empty
`NUMBA_CACHE_DIR` and charges the process's CPU time (`time.process_time`) to the phase running at
each moment: numba's type inference, its IR inlining (``inline="always"``), its lowering to LLVM IR
(the CPython wrappers, which let Python call a function, apart),
LLVM's optimisation of each function as it is added to a library, LLVM's optimisation of a library's
final module (its code with every callee library linked in), LLVM's machine-code generation of that
module, and the cache's save. Phases nest (typing a function compiles its callees; lowering
finalises the library): each is charged its own time, less the phases nested in it. Prints the
phases, the libraries whose finalising (final-module optimisation + machine code) took longest,
how many functions all final modules define against the distinct ones, and how many libraries were
turned into machine code.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = "import servesim; servesim.simulate(num_requests=100)"

CHILD = r"""
import json, sys, time
from numba.core import caching, codegen, cpu, inline_closurecall, typed_passes

spent, stack, libs, wrappers, compiled = {}, [], [], [0], [0]

def timed(cls, name, phase):
    orig = getattr(cls, name)
    def wrapper(*a, **k):
        stack.append(0.0)
        t0 = time.process_time()
        try:
            return orig(*a, **k)
        finally:
            dt = time.process_time() - t0
            nested = stack.pop()
            spent[phase] = spent.get(phase, 0.0) + dt - nested
            if stack:
                stack[-1] += dt
            if name == "create_cpython_wrapper":
                wrappers[0] += 1
            if name == "_finalize_specific":
                compiled[0] += 1
            if name == "finalize":
                lib = a[0]
                libs.append((lib.name, dt, sum(1 for f in lib._final_module.functions if not f.is_declaration),
                             sorted(f.name for f in lib._final_module.functions if not f.is_declaration)))
    setattr(cls, name, wrapper)

timed(typed_passes.BaseTypeInference, "run_pass", "numba: type inference")
timed(inline_closurecall.InlineWorker, "inline_function", "numba: IR inlining (inline='always')")
timed(typed_passes.NativeLowering, "run_pass", "numba: lowering to LLVM IR")
timed(cpu.CPUContext, "create_cpython_wrapper", "numba: lowering the CPython wrappers")
timed(codegen.CPUCodeLibrary, "_optimize_functions", "LLVM: optimising each function as it is added")
timed(codegen.CPUCodeLibrary, "finalize", "numba: linking libraries (finalize, rest)")
timed(codegen.CPUCodeLibrary, "_optimize_final_module", "LLVM: optimising each library's final module")
timed(codegen.JITCodeLibrary, "_finalize_specific", "LLVM: machine code of each final module")
timed(caching.Cache, "save_overload", "numba: cache save")
t0 = time.process_time()
exec(compile(sys.argv[1], "<bench>", "exec"))
total = time.process_time() - t0
distinct = set()
for _, _, _, names in libs:
    distinct.update(names)
json.dump({"total": total, "spent": spent, "wrappers": wrappers[0], "compiled": compiled[0],
           "libs": [l[:3] for l in libs],
           "defined": sum(l[2] for l in libs), "distinct": len(distinct)}, open(sys.argv[2], "w"))
"""


def measure(code: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="servesim-phases-") as tmp:
        out = Path(tmp) / "phases.json"
        env = dict(os.environ, NUMBA_CACHE_DIR=str(Path(tmp) / "cache"))
        subprocess.run([sys.executable, "-c", CHILD, code, str(out)], check=True, cwd=ROOT, env=env)
        return json.loads(out.read_text())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("code", nargs="?", default=DEFAULT)
    args = ap.parse_args()
    r = measure(args.code)
    total = r["total"]
    print(f"cold run: {total:.1f} CPU s in the interpreter's code")
    for phase, s in sorted(r["spent"].items(), key=lambda kv: -kv[1]):
        print(f"  {phase:50s} {s:6.1f} s  {s / total:4.0%}")
    rest = total - sum(r["spent"].values())
    print(f"  {'the rest (bytecode analysis, untyped passes, imports, runs)':50s} {rest:6.1f} s  {rest / total:4.0%}")
    print(f"{r['wrappers']} CPython wrappers lowered (functions callable from Python)")
    libs = sorted(r["libs"], key=lambda lib: -lib[1])
    print(f"{len(libs)} libraries finalised; their final modules define {r['defined']} functions, "
          f"{r['distinct']} distinct (the rest are callees linked into each caller again); "
          f"{r['compiled']} turned into machine code (the rest only linked into callers)")
    for name, s, n in libs[:8]:
        print(f"  {name:32s} {s:5.2f} s, {n} functions")


if __name__ == "__main__":
    main()
