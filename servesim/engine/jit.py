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
