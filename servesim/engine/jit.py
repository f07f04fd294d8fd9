"""How the engine's jitted functions are compiled.

The kernel (`kernel.simulate_pools`) owns the state arrays; the event loop and its handlers borrow
them. They are compiled with `HANDLER`: without numba's reference counting (as numba's own string
and sort helpers are), since counting every array of every NamedTuple in and out of each call
(~11 ns an array here) tripled the time per iteration; and without a Python entry point, which they
never need; and, as every jitted function, with `servesim.jit.JIT`. A handler must not allocate an
array (numba refuses to compile one that does).
"""
from ..jit import JIT

HANDLER = dict(JIT, _nrt=False, no_cpython_wrapper=True)

# A handler LLVM is told to inline into its callers (its `alwaysinline` attribute): LLVM inlines a
# callee whose cost is under a threshold, and counts each argument of the call towards the threshold.
# These handlers were inlined while they took whole bundles (100-200 arguments); taking the arrays
# they touch, they would be called instead, and the calls made the event loop ~20% slower
# (`experiments/profile_speed.py`, measured 2026-12-07). Not numba's IR inlining (`inline="always"`):
# LLVM inlines the compiled function, nothing is typed or lowered again.
INLINED = dict(HANDLER, forceinline=True)
