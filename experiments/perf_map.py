"""The standard case under `perf`, with the jitted functions named: writes perf's map of JIT code.

    perf record -F 999 -g -o /tmp/perf.data python experiments/perf_map.py [--requests 1000000]
    perf report -i /tmp/perf.data --no-children --sort sym

perf shows numba's compiled code as bare addresses. At its end this script writes
/tmp/perf-<pid>.map, the format perf reads for JIT code ("START SIZE name" per line, hex; perf's
tools/perf/Documentation/jit-interface.txt), from the address of every function of every compiled
numba dispatcher in the process (`get_function_address` of each function its library defines, the
size the gap to the next one), named `module.function` (numba's mangled names shortened). Runs the
case of experiments/bench_speed.py: a 20,000-request offline run for the capacity, then the timed run.
"""
from __future__ import annotations

import argparse
import gc
import os
import re
import time

import servesim


def short(name: str) -> str:
    """`servesim.engine.kernel.run_nb` for numba's `_ZN8servesim6engine6kernel6run_nbB...` (Itanium-style
    nested name: length-prefixed parts)."""
    prefix = ""
    if name.startswith("cfunc."):
        prefix, name = "cfunc.", name[6:]
    if not name.startswith("_ZN"):
        return prefix + name
    rest, parts = name[3:], []
    while rest[:1].isdigit():
        digits = re.match(r"\d+", rest).group()
        k = int(digits)
        parts.append(rest[len(digits):len(digits) + k])
        rest = rest[len(digits) + k:]
    return prefix + ".".join(parts)


def jit_symbols() -> dict[int, str]:
    """{address: name} of the functions of every compiled numba dispatcher in this process."""
    from numba.core.registry import CPUDispatcher
    out = {}
    for obj in gc.get_objects():
        if not isinstance(obj, CPUDispatcher):
            continue
        for cres in obj.overloads.values():
            lib = cres.library
            engine = lib._codegen._engine
            for module in (getattr(lib, "_shared_module", None), getattr(lib, "_final_module", None)):
                for fn in (module.functions if module is not None else ()):
                    if not fn.is_declaration:
                        address = engine.get_function_address(fn.name)
                        if address:
                            out[address] = short(fn.name)
    return out


def write_map(symbols: dict[int, str], path: str) -> None:
    starts = sorted(symbols)
    with open(path, "w") as f:
        for k, a in enumerate(starts):
            gap = starts[k + 1] - a if k + 1 < len(starts) else 0
            size = gap if 0 < gap < 1 << 20 else (a | 0xFFF) + 1 - a    # the last: to its page's end
            f.write(f"{a:x} {size:x} {symbols[a]}\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=1_000_000)
    args = ap.parse_args()
    cap = servesim.simulate(replicas=4, offline=True, num_requests=20000, seed=1).summary
    rate = 0.8 * cap["throughput"]["requests_per_s"]
    t0 = time.perf_counter()
    servesim.simulate(replicas=4, rate=rate, num_requests=args.requests, seed=0)
    wall = time.perf_counter() - t0
    symbols = jit_symbols()
    path = f"/tmp/perf-{os.getpid()}.map"
    write_map(symbols, path)
    print(f"{args.requests:,} requests in {wall:.2f} s; {len(symbols)} jitted functions named in {path}")


if __name__ == "__main__":
    main()
