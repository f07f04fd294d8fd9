"""The options every jitted servesim function is compiled with (`JIT`; the engine's handlers add to
them in `engine/jit.py`).

Cached on disk (`_jitcache.py` keeps the cache honest). No C-callable wrapper (numba's `cfunc`
wrapper, which every function gets by default): servesim never passes a jitted function as a
first-class function value or takes its C address, and each wrapper is lowered, optimised and turned
into machine code on a cold start (~1 CPU s of a cold first simulate; README, Speed). Python still
calls a jitted function through its CPython wrapper, and jitted code calls it directly.

Importing this module (as every module with jitted functions does, before defining them) also
installs numba's speed-ups for a cold start (`_compile_speed.install`: compile flags compared
cheaply, fewer collections, call types found once, no failing `__array__` lookups, functions
optimised once, inlined blocks copied once, ABI sizes found once, machine code made when first
needed; none where `SERVESIM_NUMBA_PATCHES=0`).
"""
from ._compile_ahead import wanted
from ._compile_speed import install

JIT = dict(cache=True, no_cfunc_wrapper=True)

install()
wanted()    # (a bad SERVESIM_COMPILE_AHEAD refused before anything compiles: `_compile_ahead`)
