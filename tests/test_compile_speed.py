"""numba compiling faster (servesim/_compile_speed.py): the compile flags compared cheaply, installed and
giving the same results as numba's own `TargetConfig.values`, `__hash__` and `__eq__` (written out below
as numba 0.68 has them); the collector's threshold raised while a servesim function compiles, and only
then."""
import gc
import itertools
from types import SimpleNamespace

from numba.core import event

from numba.core.compiler import Flags
from numba.core.targetconfig import TargetConfig

import servesim.jit  # noqa: F401  (installs them)
from servesim import _compile_speed as nf


def numba_values(self):
    return {k: getattr(self, k) for k in self.options}


def numba_hash(self):
    return hash(tuple(sorted(numba_values(self))))


def numba_eq(self, other):
    return numba_values(self) == numba_values(other)


def _flags():
    """Flags as numba makes them for a compile: some set to their defaults, some to other values, copies."""
    out = [Flags()]
    settings = [("nrt", True), ("nrt", False), ("no_cpython_wrapper", True), ("no_cfunc_wrapper", True),
                ("boundscheck", True), ("inline", "always"), ("enable_looplift", True), ("error_model", "numpy")]
    for a, b in itertools.combinations(settings, 2):
        f = Flags()
        for name, value in (a, b):
            setattr(f, name, value)
        out.append(f)
        out.append(Flags(f))            # numba's copy
    d = Flags()
    d.nrt = Flags().nrt                 # set, to its default: equal to one left unset
    out.append(d)
    return out


def test_installed_on_numbas_targetconfig():
    assert nf.speed_up_flags()
    assert TargetConfig.values is nf.values and TargetConfig.__eq__ is nf.eq and TargetConfig.__hash__ is nf.hash_


def test_values_hash_and_equality_are_numbas():
    flags = _flags()
    for f in flags:
        v = f.values()
        assert v == numba_values(f) and list(v) == list(numba_values(f))   # same items, same order
        assert hash(f) == numba_hash(f)
    pairs = 0
    for f, g in itertools.product(flags, repeat=2):
        assert (f == g) is numba_eq(f, g)
        assert (f != g) is (not numba_eq(f, g))
        pairs += numba_eq(f, g) and f is not g
    assert pairs > 0                    # distinct objects that are equal were compared
    assert Flags() != 3 and Flags().__eq__(3) is NotImplemented


def test_a_cache_keyed_by_flags_finds_equal_flags():
    a, b = Flags(), Flags()
    a.nrt = b.nrt = True
    c = Flags()
    c.nrt = False
    cache = {("ctx", (1,), a): "impl"}
    assert cache.get(("ctx", (1,), b)) == "impl" and cache.get(("ctx", (1,), c)) is None


def _compiling(module):
    """numba's event around a compilation, for a dispatcher of a function defined in `module`."""
    def f():
        pass
    f.__module__ = module
    return event.trigger_event("numba:compile", data={"dispatcher": SimpleNamespace(py_func=f)})


def test_fewer_collections_only_while_a_servesim_function_compiles():
    before = gc.get_threshold()
    assert before[0] < nf.COMPILE_GC_THRESHOLD
    with _compiling("servesim.engine.kernel"):
        assert gc.get_threshold() == (nf.COMPILE_GC_THRESHOLD, *before[1:])
        with _compiling("numba.np.arrayobj"):       # what it compiles on the way: still raised
            assert gc.get_threshold()[0] == nf.COMPILE_GC_THRESHOLD
        assert gc.get_threshold()[0] == nf.COMPILE_GC_THRESHOLD
    assert gc.get_threshold() == before
    with _compiling("mypackage.kernels"):           # someone else's jitted code: left alone
        assert gc.get_threshold() == before
    with _compiling(None):                          # (a function made by exec: no module)
        assert gc.get_threshold() == before
    try:
        with _compiling("servesim.engine.kernel"):
            raise RuntimeError("a failed compile")
    except RuntimeError:
        pass
    assert gc.get_threshold() == before


def test_the_kernels_config_record_holds_every_field_exactly():
    import math

    import numpy as np
    import pytest

    from servesim.engine.state import EngineConfig, config_dtype, config_record
    cfg = EngineConfig(policy=2, router=1, preemption=0, replicas=4, pp=2, max_num_seqs=256,
                       max_batched_tokens=8192, max_chunk_tokens=512, block_size=16, num_blocks=27905,
                       watermark_blocks=279, concurrency=0, max_time=math.inf, warmup_time=0.25,
                       kv_bytes_per_token=131072.0, log_size=4096, frontend=1e-3, prefix_caching=1,
                       layerwise=0, fast_forward=1)
    rec = config_record(cfg)
    assert rec.dtype == config_dtype and rec.dtype.names == EngineConfig._fields
    for name in EngineConfig._fields:
        assert rec[name] == getattr(cfg, name) == getattr(rec, name), name   # (as attributes: the JIT-off run)
        assert rec.dtype[name] == (np.float64 if name in ("max_time", "warmup_time", "kv_bytes_per_token",
                                                          "frontend") else np.int64), name
    with pytest.raises(ValueError, match="max_num_seqs = 2.5"):
        config_record(cfg._replace(max_num_seqs=2.5))
