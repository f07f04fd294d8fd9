"""The options every jitted servesim function is compiled with (`JIT`; the engine's handlers add to
them in `engine/jit.py`).

Cached on disk (`_jitcache.py` keeps the cache honest). No C-callable wrapper (numba's `cfunc`
wrapper, which every function gets by default): servesim never passes a jitted function as a
first-class function value or takes its C address, and each wrapper is lowered, optimised and turned
into machine code on a cold start (~1 CPU s of a cold first simulate; README, Speed). Python still
calls a jitted function through its CPython wrapper, and jitted code calls it directly.

Importing this module (as every module with jitted functions does, before defining them) also has
numba compare its compile flags cheaply and collect garbage less often while it compiles
(`_compile_speed.py`: the same compiled code, ~2.5 CPU s less on a cold start).
"""
from ._compile_speed import fewer_collections_while_compiling, speed_up_flags

JIT = dict(cache=True, no_cfunc_wrapper=True)

speed_up_flags()
fewer_collections_while_compiling()
