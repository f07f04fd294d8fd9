"""numba compiling faster (servesim/_compile_speed.py): the compile flags compared cheaply, installed and
giving the same results as numba's own `TargetConfig.values`, `__hash__` and `__eq__` (written out below
as numba 0.68 has them); the collector's threshold raised while a servesim function compiles, and only
then."""
import gc
import itertools
from types import SimpleNamespace

import pytest
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


def _compiling(module, qualname="f"):
    """numba's event around a compilation, for a dispatcher of a function defined in `module`."""
    def f():
        pass
    f.__module__ = module
    f.__qualname__ = qualname
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


# ------------------------------------------------------------------ the patches that act while servesim compiles
def test_installed_here_and_numbas_kept_underneath():
    from numba.core import base, codegen, inline_closurecall
    from numba.core.types import functions
    assert nf.install() == {"flags": True, "call types": True, "array lowering": True,
                            "function passes": True, "inline copy": True, "abi sizes": True, "machine code": True}
    lib, cg = codegen.JITCodeLibrary, codegen.JITCPUCodegen
    for patched in (functions.BaseFunction.get_call_type, base.BaseContext.get_function,
                    codegen.CPUCodeLibrary._optimize_functions, inline_closurecall.InlineWorker.inline_ir,
                    base.BaseContext.get_abi_sizeof,
                    lib._finalize_final_module, lib.get_pointer_to_function, lib._get_compiled_object,
                    lib.serialize_using_object_code, cg.set_env, cg.unserialize_library):
        assert patched._servesim and patched.__wrapped__.__module__.startswith("numba.")


def _typing_cases():
    import operator

    import numpy as np
    from numba.core import types
    from numba.core.registry import cpu_target
    ctx = cpu_target.typing_context
    ctx.refresh()
    arr = types.Array(types.float64, 1, "C")
    rec = types.Array(types.Record.make_c_struct([("a", types.int64), ("b", types.float64)]), 1, "C")
    cases = [(operator.getitem, (arr, types.int64)), (operator.getitem, (arr, types.intp)),
             (operator.getitem, (rec, types.int64)), (operator.add, (types.int64, types.float64)),
             (operator.lt, (types.float64, types.float64)), (min, (types.int64, types.int64)),
             (max, (types.float64, types.int64)), (np.empty, (types.int64,)), (abs, (types.float64,)),
             (operator.setitem, (arr, types.int64, types.float64))]
    return ctx, [(ctx.resolve_value_type(f), args) for f, args in cases]


def test_a_call_type_given_again_is_the_one_numba_finds():
    ctx, cases = _typing_cases()
    for fnty, args in cases:
        numbas = type(fnty).get_call_type.__wrapped__(fnty, ctx, args, {})
        key = fnty._impl_keys[numbas.args]
        with _compiling("servesim.engine.kernel"):
            first = fnty.get_call_type(ctx, args, {})
            fnty._impl_keys.clear()
            again = fnty.get_call_type(ctx, args, {})             # from the cache
            assert fnty._impl_keys[again.args] == key             # what numba records, recorded
            assert len(nf._call_types) > 0
        assert first == again == numbas, (fnty, args)
        assert again.return_type == numbas.return_type and again.pysig == numbas.pysig
    assert nf._call_types == {}                                   # emptied as the compile ends


def test_a_call_numba_refuses_is_refused_every_time_and_not_kept():
    import pytest
    from numba.core import errors, types
    ctx, cases = _typing_cases()
    fnty = cases[0][0]
    with _compiling("servesim.engine.kernel"):
        for _ in range(2):
            with pytest.raises(errors.TypingError):
                fnty.get_call_type(ctx, (types.unicode_type, types.float64), {})
        assert nf._call_types == {}


def test_the_missing_array_lowering_fails_with_numbas_error():
    import pytest
    from numba.core import types
    from numba.core.registry import cpu_target
    from numba.core.typing import signature
    ctx = cpu_target.target_context
    sig = signature(types.Array(types.float64, 1, "C"), types.Array(types.float64, 1, "C"))
    with pytest.raises(NotImplementedError) as numbas:
        type(ctx).get_function.__wrapped__(ctx, "__array__", sig)
    with _compiling("servesim.engine.kernel"):
        with pytest.raises(NotImplementedError) as ours:
            ctx.get_function("__array__", sig)
        assert ctx.get_function(abs, signature(types.float64, types.float64))    # others: numba's lookup
    assert str(ours.value) == str(numbas.value)


def test_function_passes_skipped_only_while_servesim_compiles():
    import llvmlite.binding as ll
    from numba.core.registry import cpu_target
    text = """define i64 @f(i64 %x) {
entry:
  %p = alloca i64
  store i64 %x, i64* %p
  %v = load i64, i64* %p
  %w = add i64 %v, 0
  ret i64 %w
}"""
    cg = cpu_target.target_context.codegen()
    lib = cg.create_library("test")
    with _compiling("servesim.engine.kernel"):
        m = ll.parse_assembly(text)
        lib._optimize_functions(m)
        assert "alloca" in str(m) and str(m.data_layout) == cg._data_layout   # left to the final module
    m = ll.parse_assembly(text)
    lib._optimize_functions(m)                                                  # numba's: optimised now
    assert "alloca" not in str(m) and "add" not in str(m)


def _multi_block(n, a):
    s = 0.0
    for i in range(n):
        if a[i] > 0:
            s += a[i]
        else:
            s -= 1.0
    return s


def test_the_one_copy_of_a_callees_blocks_equals_numbas_blockwise_copy():
    import copy
    import io

    from numba.core.compiler import run_frontend
    the_ir = run_frontend(_multi_block)
    blockwise = {label: copy.deepcopy(block) for label, block in the_ir.blocks.items()}   # numba's
    once = copy.deepcopy(the_ir.blocks)                                                  # ours

    def dump(blocks):
        out = io.StringIO()
        for label, block in sorted(blocks.items()):
            print(label, file=out)
            block.dump(file=out)
        return out.getvalue()

    assert dump(once) == dump(blockwise) == dump(the_ir.blocks)
    scopes = {id(b.scope) for b in once.values()}
    assert len(scopes) == 1 and len({id(b.scope) for b in blockwise.values()}) == len(blockwise) > 1
    scope = next(iter(once.values())).scope
    assert scope == the_ir.blocks[min(the_ir.blocks)].scope and scope is not the_ir.blocks[min(the_ir.blocks)].scope
    assert sorted(scope.localvars._con) == sorted(the_ir.blocks[min(the_ir.blocks)].scope.localvars._con)


def test_numba_left_as_it_is_when_the_environment_says_0(monkeypatch):
    import pytest

    from servesim.errors import ConfigError
    for value, wanted in (("", True), ("1", True), ("0", False), (" 0 ", False)):
        monkeypatch.setenv(nf.PATCHES_ENV, value)
        assert nf.patches_wanted() is wanted
    monkeypatch.setenv(nf.PATCHES_ENV, "yes")
    with pytest.raises(ConfigError, match="SERVESIM_NUMBA_PATCHES = 'yes': use 1 .* or 0"):
        nf.patches_wanted()


@pytest.mark.parametrize("env, message", [
    ("SERVESIM_NUMBA_PATCHES", "use 1 (numba patched to compile faster, the default) or 0 (numba left as it is)"),
    ("SERVESIM_COMPILE_AHEAD", "use 1 (part of a cold compile in a second process), 0 (all in this process) or "
                               "leave it unset (a second process where a core is idle)")])
def test_a_bad_value_is_one_line_and_exit_2_from_the_cli(env, message):
    """Each of the compile's environment variables (`_compile_speed.PATCHES_ENV`, `_compile_ahead.ENV`)."""
    import os
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "servesim", "simulate", "--num-requests", "10"],
                       capture_output=True, text=True, env=dict(os.environ, **{env: "yes"}), timeout=120)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.splitlines() == [f"servesim: error: {env} = 'yes': {message}"]


def test_an_abi_size_given_again_is_the_one_numba_finds():
    import llvmlite.ir as ir
    from numba.core import types
    from numba.core.registry import cpu_target
    ctx = cpu_target.target_context
    rec = types.Record.make_c_struct([("a", types.int64), ("b", types.float32), ("c", types.int8)])
    tys = [ctx.get_value_type(t) for t in (types.Array(types.float64, 1, "C"), types.Array(rec, 2, "A"),
                                           types.UniTuple(types.int8, 3), types.Tuple((types.int64, types.float32)),
                                           rec, types.boolean)]
    tys += [ir.IntType(8), ir.LiteralStructType([ir.IntType(8), ir.DoubleType()]), ir.ArrayType(ir.IntType(16), 5)]
    numbas = [type(ctx).get_abi_sizeof.__wrapped__(ctx, ty) for ty in tys]
    assert len(set(numbas)) > 4 and numbas[-3:] == [1, 16, 10]
    with _compiling("servesim.engine.kernel"):
        assert [ctx.get_abi_sizeof(ty) for ty in tys] == numbas
        assert len(nf._abi_sizes) == len({str(ty) for ty in tys})
        assert [ctx.get_abi_sizeof(ty) for ty in tys] == numbas         # from the cache
    assert nf._abi_sizes == {}

# ------------------------------------------------------------------ machine code made when first needed
_CALLEE = """define i64 @{name}(i64 %x) {{
  %y = add i64 %x, 1
  ret i64 %y
}}
@{env} = common global i8* null
"""
_CALLER = """declare i64 @{callee}(i64)
define i64 @{name}(i64 %x) {{
  %y = call i64 @{callee}(i64 %x)
  %z = mul i64 %y, 2
  ret i64 %z
}}
"""


def _library(text, name, **names):
    """A library of numba's JIT holding `text` (functions named uniquely in this process)."""
    import llvmlite.binding as ll
    from numba.core.registry import cpu_target
    cg = cpu_target.target_context.codegen()
    lib = cg.create_library(name)
    lib.enable_object_caching()                  # (as numba's lowering does)
    lib.add_llvm_module(ll.parse_assembly(text.format(name=name, **names)))
    return cg, lib


def _finalize(lib):
    from numba.core.compiler_lock import global_compiler_lock
    with global_compiler_lock:
        lib.finalize()


def _unique(stem):
    import uuid
    return f"servesim_test_{stem}_{uuid.uuid4().hex}"


def _call(ptr, x):
    import ctypes
    return ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64)(ptr)(x)


def test_machine_code_made_when_a_pointer_to_a_function_is_asked_for():
    name, env = _unique("f"), _unique("env")
    cg, lib = _library(_CALLEE, name, env=env)
    with _compiling("servesim.engine.kernel", qualname=name):
        _finalize(lib)
        assert nf._is_deferred(lib) and not cg._engine.is_symbol_defined(name)    # optimised, not compiled
        assert "alloca" not in str(lib._final_module)
        assert lib.get_pointer_to_function(_unique("other")) == 0 and nf._is_deferred(lib)
        ptr = lib.get_pointer_to_function(name)
    assert not nf._is_deferred(lib) and cg._engine.is_symbol_defined(name) and ptr
    assert _call(ptr, 41) == 42


def test_other_libraries_compiled_at_once_as_numba_does():
    for module, qualname in (("servesim.engine.kernel", "another_function"), (None, None)):
        name, env = _unique("f"), _unique("env")
        cg, lib = _library(_CALLEE, name, env=env)
        if module is None:
            _finalize(lib)                          # no servesim function compiling
        else:
            with _compiling(module, qualname=qualname):
                _finalize(lib)
        assert not nf._is_deferred(lib) and cg._engine.is_symbol_defined(name)
        kind = lib.serialize_using_object_code()[1]
        assert kind == "object" == type(lib).serialize_using_object_code.__wrapped__(lib)[1]


def test_a_deferred_librarys_cache_entry_is_its_bitcode_and_loads_as_numba_reads_it():
    name, env = _unique("f"), _unique("env")
    cg, lib = _library(_CALLEE, name, env=env)
    with _compiling("servesim.engine.kernel", qualname=name):
        _finalize(lib)
        state = lib.serialize_using_object_code()
    assert state == (lib.name, "bitcode", lib._final_module.as_bitcode()) and nf._is_deferred(lib)
    loaded = cg.unserialize_library(state)          # numba's reading, outside a servesim compile
    assert not nf._is_deferred(loaded) and _call(loaded.get_pointer_to_function(name), 1) == 2
    with _compiling("servesim.engine.kernel", qualname="run_nb"):
        again = cg.unserialize_library(state)
        assert nf._is_deferred(again)               # read while servesim compiles: compiled when needed


def test_an_environment_set_before_the_machine_code_lands_in_the_module_that_defines_it():
    import ctypes

    class Env:
        pass
    e, e2 = Env(), Env()
    callee, env = _unique("f"), _unique("env")
    cg, lib = _library(_CALLEE, callee, env=env)
    with _compiling("servesim.engine.kernel", qualname=callee):
        _finalize(lib)
        cg.set_env(env, e)                          # numba's would write through an address not there yet
        assert nf._pending_envs[env] is e
    caller = _unique("g")
    _, top = _library(_CALLER, caller, callee=callee)
    top.add_linking_library(lib)
    _finalize(top)                                  # links its own copy of the callee, and its environment
    assert nf._is_deferred(lib) and not cg._engine.is_symbol_defined(callee)
    assert _call(top.get_pointer_to_function(caller), 20) == 42
    assert ctypes.c_void_p.from_address(cg._engine.get_global_value_address(env)).value == id(e)
    name2, env2 = _unique("f"), _unique("env")
    _, lib2 = _library(_CALLEE, name2, env=env2)
    with _compiling("servesim.engine.kernel", qualname=name2):
        _finalize(lib2)
        cg.set_env(env2, e2)
        lib2.get_pointer_to_function(name2)         # compiled now: its own environment set
    assert ctypes.c_void_p.from_address(cg._engine.get_global_value_address(env2)).value == id(e2)
    assert env not in nf._pending_envs and env2 not in nf._pending_envs


_RUN = ("import hashlib, servesim\n"
        "r = servesim.simulate(num_requests=200, replicas=2, prefix_caching=True)\n"
        "print(hashlib.sha256(r.requests.to_csv().encode() + repr(sorted(r.summary.items())).encode()).hexdigest())")


@pytest.mark.slow
def test_cold_partly_cached_and_cached_runs_agree(tmp_path):
    """A cold compile (handlers' cache entries: bitcode), the kernel compiled again against the cached
    handlers, a cached run, and numba left as it is reading the same cache: the same requests."""
    import os
    import subprocess
    import sys
    cache = tmp_path / "cache"

    def run(**env):
        e = dict(os.environ, NUMBA_CACHE_DIR=str(cache), **env)
        return subprocess.run([sys.executable, "-c", _RUN], capture_output=True, text=True, env=e,
                              check=True, timeout=600).stdout.strip()
    def drop_kernel():
        kernel = list(cache.rglob("kernel.run_nb*"))
        assert kernel
        for p in kernel:
            p.unlink()
    cold = run()
    drop_kernel()
    assert run() == cold                            # the handlers read from their bitcode
    assert run() == cold                            # all cached
    drop_kernel()
    assert run(**{nf.PATCHES_ENV: "0"}) == cold     # numba's own reading of the bitcode entries
