"""Ways servesim has numba compile faster on a cold start, none changing what the compiled code computes
(`servesim.jit` installs them when the first module with jitted functions is imported). Each is
installed only where numba's code is the one described here (numba 0.68; else numba is left as it
is), and none where the environment sets `SERVESIM_NUMBA_PATCHES=0` (`PATCHES_ENV`; README, Speed).

**Compile flags compared in O(1) Python steps, not 22 property reads** (`speed_up_flags`). numba
types each `a[i]`, `x + y`, `max(...)` by trying every overload template registered for the operator;
each try looks up the template's compiled implementation in a cache keyed by the current compile
flags (`numba.core.typing.templates._OverloadFunctionTemplate._get_impl`, numba 0.58-0.68), and
lowering asks again. The key's hash and equality call `TargetConfig.values()`, which builds a dict of
every option through its property (~11 us; a compare builds two): a cold first simulate does ~35,000
such lookups and ~55,000 compares. `values`, `__hash__` and `__eq__` of numba's `TargetConfig` are
replaced by versions that give the same results: `values()` the same dict (the options' defaults, in
the options' order, overridden by the values set), the hash numba's own (of the sorted option names,
fixed per class), equality numba's own (equal `values()`; an object equals itself).
`tests/test_compile_speed.py` checks each against numba's. They are installed only where numba's
`TargetConfig` is the one described here (its options a mapping of `Option`, each set value kept in
`_values`), else numba is left as it is.

**Fewer garbage collections while compiling** (`fewer_collections_while_compiling`). A compile
allocates millions of small objects (numba's IR, types, llvmlite's IR), and Python's collector runs
its youngest generation every 700 net allocations, scanning them again and again. From the start to
the end of compiling a servesim function (numba's "numba:compile" event, outermost), the youngest
generation's threshold is `COMPILE_GC_THRESHOLD`; it is put back after. Garbage is still collected,
in larger batches: the peak memory of a cold first simulate rises by ~20 MiB.

The next six act only while a servesim function compiles (the same event, outermost).

**A call's type found once per compile** (`cache_call_types`). numba types a call of a function
type (`a[i]`, `x + y`, `min(a, b)`, `np.empty(n)`) by trying its overload templates in turn
(`BaseFunction.get_call_type`); a cold first simulate asks ~6,000 times for ~330 distinct
(function, argument types). A found signature is kept, keyed by everything numba's search reads
(the function type, the typing context, the argument types, the target and the compile flags), and
given again, with the implementation key numba would record; a search that fails is not kept, and
the cache is emptied when the outermost servesim compile ends.

**No failing lookup of `__array__` per array struct** (`skip_missing_array_lowering`). Lowering makes
a struct for each array value it touches (`numba.np.arrayobj.make_array`), and each first asks the
target context for an `__array__` lowering, which numba itself never registers: the lookup fails,
and a failing lookup reloads every registry (`BaseContext.refresh`) before failing again (~1,300
times on a cold first simulate). While no `__array__` lowering is installed, the lookup fails at
once, with numba's error; the registries are reloaded at the start of every compile as before.

**A function optimised once, in its library's final module** (`optimise_in_final_module`). numba
runs LLVM's O3 function passes over each function as its module is added to a library
(`CPUCodeLibrary._optimize_functions`), and then LLVM's O3 module pipeline, which runs the same
function simplification after inlining, over the library's final module. The first is skipped: the
final module's pipeline optimises every function (the callees already optimised in their own
library), with the same IEEE semantics (no fast-math flags), so the same results; the event loop
is not slower (README, Speed).

**IR inlining copies a callee's blocks in one deep copy** (`copy_inlined_blocks_once`). numba's
`InlineWorker.inline_ir` copies the callee's IR (twice) block by block, each block with a fresh copy
memo, so the callee's whole scope (every variable) is copied again for each block: O(blocks x
variables) for the engine's large inlined handlers. The blocks are copied in one deep copy instead,
so the scope once; the copies are equal, and numba renames their variables in the caller as before.

**An LLVM type's ABI size found once per compile** (`cache_abi_sizes`). numba asks for the ABI size
of an LLVM type (`BaseContext.get_abi_sizeof`: each variable's stack slot, each record array's
item) ~1,100 times on a cold first simulate, and llvmlite answers each time by writing a module that
holds one global of the type and having LLVM parse it (~0.15 ms). The size is kept, keyed by the
target data and that module's text (all the answer depends on), and emptied when the outermost
servesim compile ends.

**Machine code made when first needed** (`defer_machine_code`). numba turns each library's final
module into machine code as soon as it is optimised (`CPUCodeLibrary._finalize_final_module`), though
most are never run: the engine's handlers, and numba's own overload implementations, have no Python
entry point, and each caller links their optimised IR into its own module and calls its own copy.
While a servesim function compiles, the library of the function compiling innermost (or one read
from the cache's bitcode) is optimised and checked as before, and its machine code made only when a
pointer to one of its functions is asked for (a Python entry point) or its object code; the cache
then keeps its bitcode (numba's other kind of entry, which numba reads the same way, compiling it when
loaded). An environment numba sets in a library not compiled yet is set in the first module added
that defines it. A cold first simulate makes the machine code of 20 of its 74 libraries, not all:
machine code 1.7 -> 0.9 CPU s (`experiments/compile_phases.py`). One difference in what callers
link: LLVM's code generation rewrites a module's IR in place (29 of the 72 deferred modules), and
numba links a callee's IR as it is then; a caller of a library not compiled links the optimiser's
IR instead (the same program: results identical; README, Speed).

All of them together: a cold first simulate 17.8 -> 12.1 CPU s (medians of 4 alternating runs each,
under other jobs' load); the last two (ABI sizes, machine code) 12.5 -> 11.9 CPU s (medians of 4
alternating pairs at a load average of 3.0-4.5; README, Speed).
"""
from __future__ import annotations

_DEFAULTS: dict = {}
_HASHES: dict = {}
_TC = []        # numba's TargetConfig, once installed


def _defaults(cls) -> dict:
    d = _DEFAULTS.get(cls)
    if d is None:
        d = _DEFAULTS[cls] = {name: opt.default for name, opt in cls.options.items()}
    return d


def values(self):
    """numba's `TargetConfig.values()`: every option's value (set, else its default)."""
    out = dict(_defaults(type(self)))     # (update keeps the options' order)
    out.update(self._values)
    return out


def hash_(self):
    """numba's `TargetConfig.__hash__`: of the sorted option names (the keys of `values()`)."""
    cls = type(self)
    h = _HASHES.get(cls)
    if h is None:
        h = _HASHES[cls] = hash(tuple(sorted(cls.options)))
    return h


def eq(self, other):
    """numba's `TargetConfig.__eq__`: equal `values()`."""
    if self is other:
        return True
    if isinstance(other, _TC[0]):
        return values(self) == values(other)
    return NotImplemented


def _fits(tc) -> bool:
    """Whether numba's TargetConfig is the one these replace (numba 0.58-0.68)."""
    try:
        from numba.core.compiler import Flags
        f = Flags()
        names = list(Flags.options)
        if not names or set(f._values) - set(names):
            return False
        f.nrt = True
        return (f.values() == {k: getattr(f, k) for k in names} and set(f._values) <= set(names)
                and hash(f) == hash(tuple(sorted(f.values()))))
    except Exception:       # another numba: leave it alone
        return False


def speed_up_flags() -> bool:
    """Install the replacements once; returns whether they are in place."""
    from numba.core import targetconfig as t
    tc = t.TargetConfig
    if tc.values is values:
        return True
    if not _fits(tc):
        return False
    _TC.append(tc)
    tc.values = values
    tc.__hash__ = hash_
    tc.__eq__ = eq
    return True


PATCHES_ENV = "SERVESIM_NUMBA_PATCHES"


def patches_wanted() -> bool:
    """Whether the environment lets servesim patch numba: `SERVESIM_NUMBA_PATCHES` unset, empty or 1
    (the default), or 0 (numba left exactly as it is)."""
    import os
    value = os.environ.get(PATCHES_ENV, "").strip()
    if value in ("", "1"):
        return True
    if value == "0":
        return False
    from .errors import ConfigError
    raise ConfigError(f"{PATCHES_ENV} = {value!r}: use 1 (numba patched to compile faster, the default) "
                      f"or 0 (numba left as it is)")


# the youngest generation's threshold while numba compiles a servesim function (Python's default: 700)
COMPILE_GC_THRESHOLD = 50_000
# while the outermost compilation running is a servesim function's: its depth, the collector's
# threshold to put back, whether it is servesim's, and the call types found in it
_state = {"installed": False, "depth": 0, "saved": None, "servesim": False, "gc": False}
_call_types: dict = {}
_compiling_now: list = []     # the functions compiling, innermost last


def _listen() -> None:
    """Follow numba's "numba:compile" event: which compilation is outermost, and whether it is a
    servesim function's; raise the collector's threshold then (if asked), and empty the call-type
    cache when it ends. Idempotent."""
    if _state["installed"]:
        return
    import gc

    from numba.core import event

    class _Compilations(event.Listener):
        def on_start(self, ev):
            _state["depth"] += 1
            func = getattr(ev.data.get("dispatcher"), "py_func", None)
            _compiling_now.append(func)
            if _state["depth"] != 1:
                return
            if not (getattr(func, "__module__", None) or "").startswith("servesim."):
                return
            _state["servesim"] = True
            t = gc.get_threshold()
            if _state["gc"] and t[0] < COMPILE_GC_THRESHOLD:
                _state["saved"] = t
                gc.set_threshold(COMPILE_GC_THRESHOLD, *t[1:])

        def on_end(self, ev):
            _state["depth"] -= 1
            _compiling_now.pop()
            if _state["depth"] != 0:
                return
            _state["servesim"] = False
            _call_types.clear()
            _abi_sizes.clear()
            if _state["saved"] is not None:
                gc.set_threshold(*_state["saved"])
                _state["saved"] = None

    event.register("numba:compile", _Compilations())
    _state["installed"] = True


def fewer_collections_while_compiling() -> None:
    """From now on, raise the youngest generation's collection threshold to `COMPILE_GC_THRESHOLD` while
    the outermost compilation of a servesim function runs; idempotent."""
    _state["gc"] = True
    _listen()


def _source(func) -> str:
    """numba's source of `func` ('' where it cannot be read: then nothing is patched)."""
    import inspect
    try:
        return inspect.getsource(func)
    except (OSError, TypeError):
        return ""


def cache_call_types() -> bool:
    """While a servesim function compiles, give a call's signature found before for the same function
    type, typing context, argument types, target and flags (numba's `BaseFunction.get_call_type`,
    searched again otherwise); returns whether it is installed."""
    from numba.core import targetconfig
    from numba.core.target_extension import get_local_target
    from numba.core.types import functions as F
    search = F.BaseFunction.get_call_type
    if getattr(search, "_servesim", False):
        return True
    if not (callable(getattr(targetconfig.ConfigStack, "top_or_none", None))
            and "self._impl_keys[sig.args] = temp.get_impl_key(sig)" in _source(search)):
        return False

    def get_call_type(self, context, args, kws):
        if not _state["servesim"]:
            return search(self, context, args, kws)
        try:
            key = (self, context, tuple(args), tuple(kws.items()), get_local_target(context),
                   targetconfig.ConfigStack.top_or_none())
            found = _call_types.get(key)
        except TypeError:       # an unhashable argument: numba's search
            return search(self, context, args, kws)
        if found is not None:
            sig, impl_key = found
            self._impl_keys[sig.args] = impl_key
            return sig
        sig = search(self, context, args, kws)
        if sig is not None:
            _call_types[key] = (sig, self._impl_keys[sig.args])
        return sig

    get_call_type._servesim = True
    get_call_type.__wrapped__ = search
    F.BaseFunction.get_call_type = get_call_type
    return True


def skip_missing_array_lowering() -> bool:
    """While a servesim function compiles and no `__array__` lowering is installed, a lookup of one
    fails at once with numba's error, without reloading every registry first; returns whether it is
    installed."""
    from numba.core import base
    lookup = base.BaseContext.get_function
    if getattr(lookup, "_servesim", False):
        return True
    src = _source(lookup)
    if "self.refresh()" not in src or "_firstcall" not in src:
        return False

    def get_function(self, fn, sig, _firstcall=True):
        if fn == "__array__" and _state["servesim"]:
            defns = self._defns
            if "__array__" not in defns or not defns["__array__"].versions:
                raise NotImplementedError("No definition for lowering %s%s" % (fn, sig.as_function()))
        return lookup(self, fn, sig, _firstcall)

    get_function._servesim = True
    get_function.__wrapped__ = lookup
    base.BaseContext.get_function = get_function
    return True


def optimise_in_final_module() -> bool:
    """While a servesim function compiles, a module added to a library is not run through LLVM's
    function passes first (its library's final module is optimised as before); returns whether it is
    installed."""
    from numba.core import codegen
    lib = codegen.CPUCodeLibrary
    first = lib._optimize_functions
    if getattr(first, "_servesim", False):
        return True
    if not (callable(getattr(lib, "_optimize_final_module", None)) and callable(getattr(lib, "add_llvm_module", None))):
        return False

    def _optimize_functions(self, ll_module):
        if not _state["servesim"]:
            return first(self, ll_module)
        ll_module.data_layout = self._codegen._data_layout     # (what numba's sets first)

    _optimize_functions._servesim = True
    _optimize_functions.__wrapped__ = first
    lib._optimize_functions = _optimize_functions
    return True


# numba 0.68's copy of a callee's IR in `InlineWorker.inline_ir`, and what replaces it
_BLOCKWISE_COPY = """            kernel_copy.blocks = {}
            for block_label, block in the_ir.blocks.items():
                new_block = copy.deepcopy(the_ir.blocks[block_label])
                kernel_copy.blocks[block_label] = new_block
"""
_ONE_COPY = """            kernel_copy.blocks = copy.deepcopy(the_ir.blocks)
"""


def copy_inlined_blocks_once() -> bool:
    """numba's `InlineWorker.inline_ir` with its callee copy made in one deep copy of the blocks
    (`_ONE_COPY`) where numba copies block by block (`_BLOCKWISE_COPY`, which must appear in numba's
    source exactly once); the rest of numba's method as it is. Used only while a servesim function
    compiles; returns whether it is installed."""
    import textwrap

    from numba.core import inline_closurecall as icc
    worker = icc.InlineWorker
    numbas = worker.inline_ir
    if getattr(numbas, "_servesim", False):
        return True
    src = _source(numbas)
    if src.count(_BLOCKWISE_COPY) != 1 or not src.startswith("    def inline_ir(self,"):
        return False
    import types
    module = compile(textwrap.dedent(src.replace(_BLOCKWISE_COPY, _ONE_COPY)), icc.__file__, "exec")
    code = next(c for c in module.co_consts if isinstance(c, types.CodeType) and c.co_name == "inline_ir")
    once = types.FunctionType(code, vars(icc), "inline_ir", numbas.__defaults__)   # numba's module globals
    once.__kwdefaults__ = numbas.__kwdefaults__

    def inline_ir(self, *args, **kwargs):
        return (once if _state["servesim"] else numbas)(self, *args, **kwargs)

    inline_ir._servesim = True
    inline_ir.__wrapped__ = numbas
    worker.inline_ir = inline_ir
    return True


# the ABI sizes found while the outermost servesim compile runs, by target data and LLVM text
_abi_sizes: dict = {}


def cache_abi_sizes() -> bool:
    """While a servesim function compiles, an LLVM type's ABI size found once per target data and
    text (numba's `BaseContext.get_abi_sizeof` parses a module holding one global of the type each
    time); returns whether it is installed."""
    from llvmlite import ir

    from numba.core import base
    numbas = base.BaseContext.get_abi_sizeof
    if getattr(numbas, "_servesim", False):
        return True
    if not ("ty.get_abi_size(self.target_data)" in _source(numbas)
            and "self._get_ll_global_value_type(target_data, context)" in _source(ir.Type.get_abi_size)
            and 'GlobalVariable(m, self, name="foo")' in _source(ir.Type._get_ll_global_value_type)):
        return False

    def get_abi_sizeof(self, ty):
        if not (_state["servesim"] and isinstance(ty, ir.Type)):
            return numbas(self, ty)
        m = ir.Module()                             # the module llvmlite parses, as it writes it
        ir.GlobalVariable(m, ty, name="foo")
        key = (self.target_data, str(m))
        size = _abi_sizes.get(key)
        if size is None:
            size = _abi_sizes[key] = numbas(self, ty)
        return size

    get_abi_sizeof._servesim = True
    get_abi_sizeof.__wrapped__ = numbas
    base.BaseContext.get_abi_sizeof = get_abi_sizeof
    return True


# ------------------------------------------------------------------ machine code made when first needed
_deferred_globals = None        # a global variable (an environment) a deferred library defines -> the library
_pending_envs = None            # such a global's name -> numba's Environment, set when a module defining it is added
_loading_bitcode: list = []     # a cached library read from bitcode while a servesim function compiles
# numba 0.68's code the patch below relies on, by function
_NUMBAS = {"_finalize_final_module": ("self._finalize_dynamic_globals()", "self._verify_declare_only_symbols()",
                                      "self._codegen._add_module(self._final_module)", "self._finalize_specific()",
                                      "self._finalized = True"),
           "serialize_using_object_code": ("self._get_compiled_object()",),
           "_unserialize": ("if kind == 'bitcode':", "self._final_module = ll.parse_bitcode(data)",
                            "self._finalize_final_module()"),
           "get_pointer_to_function": ("ee.is_symbol_defined(name)",),
           "set_env": ("self._engine.get_global_value_address(env_name)",)}


def _is_deferred(lib) -> bool:
    return lib.__dict__.get("_servesim_deferred", False)


def _defines(lib, name: str) -> bool:
    try:
        return not lib._final_module.get_function(name).is_declaration
    except NameError:
        return False


def _may_defer(lib) -> bool:
    """Whether `lib` is the library of the servesim function compiling innermost (numba names it after
    the function's qualified name), or one read from the cache's bitcode while a servesim function
    compiles, and nothing waits for a symbol at run time (numba's recursion stubs)."""
    from numba.core import config
    if (not _state["servesim"] or config.DUMP_OPTIMIZED or config.DUMP_ASSEMBLY
            or getattr(lib._codegen, "_rtlinker", None) is None or lib._codegen._rtlinker._unresolved):
        return False
    if _loading_bitcode:
        return True
    func = _compiling_now[-1] if _compiling_now else None
    return func is not None and lib.name == getattr(func, "__qualname__", None)


def defer_machine_code() -> bool:
    """While a servesim function compiles, its library's final module is optimised and checked as
    before but turned into machine code only when a pointer to one of its functions is asked for
    (or its object code); a cache entry of a library not yet compiled holds its bitcode (numba's
    other kind of entry). Returns whether it is installed."""
    global _deferred_globals, _pending_envs
    import weakref

    from numba.core import codegen
    from numba.core.compiler_lock import global_compiler_lock
    lib, cg = codegen.JITCodeLibrary, codegen.JITCPUCodegen
    final = lib._finalize_final_module
    if getattr(final, "_servesim", False):
        return True
    numbas = {name: getattr(lib if name != "set_env" else cg, name) for name in _NUMBAS}
    for name, parts in _NUMBAS.items():
        src = _source(numbas[name])
        if not all(part in src for part in parts):
            return False
    prefix = getattr(codegen.RuntimeLinker, "PREFIX", None)
    if prefix is None:
        return False
    numbas_final, numbas_pointer = final, lib.get_pointer_to_function
    numbas_object, numbas_serialize = lib._get_compiled_object, lib.serialize_using_object_code
    numbas_env, numbas_load = cg.set_env, cg.unserialize_library
    _deferred_globals, _pending_envs = weakref.WeakValueDictionary(), weakref.WeakValueDictionary()

    def set_pending_envs(self):
        if not _pending_envs:
            return
        for gv in self._final_module.global_variables:
            env = _pending_envs.pop(gv.name, None)
            if env is not None:
                numbas_env(self._codegen, gv.name, env)

    def make_machine_code(self):
        """numba's finalising of a deferred library, now."""
        with global_compiler_lock:
            if not _is_deferred(self):
                return
            self._servesim_deferred = False
            self._dynamic_globals = []          # (numba's scan again)
            numbas_final(self)
            set_pending_envs(self)
            for gv in self._final_module.global_variables:
                _deferred_globals.pop(gv.name, None)

    def _finalize_final_module(self):
        module = self._final_module
        if any(gv.name.startswith(prefix) for gv in module.global_variables):
            for other in list(_deferred_globals.values()):
                make_machine_code(other)       # (numba's recursion stubs may want any symbol)
        if not _may_defer(self):
            numbas_final(self)
            set_pending_envs(self)
            return
        self._finalize_dynamic_globals()
        self._verify_declare_only_symbols()
        self._servesim_deferred = True
        self._finalized = True
        for gv in module.global_variables:
            if not gv.is_declaration:
                _deferred_globals[gv.name] = self

    def get_pointer_to_function(self, name):
        self._ensure_finalized()
        if _is_deferred(self) and _defines(self, name):
            make_machine_code(self)
        return numbas_pointer(self, name)

    def _get_compiled_object(self):
        make_machine_code(self)
        return numbas_object(self)

    def serialize_using_object_code(self):
        if _is_deferred(self):
            return self.serialize_using_bitcode()
        return numbas_serialize(self)

    def set_env(self, env_name, env):
        owner = _deferred_globals.get(env_name)
        if owner is not None and _is_deferred(owner) and not self._engine.is_symbol_defined(env_name):
            _pending_envs[env_name] = env
            return
        numbas_env(self, env_name, env)

    def unserialize_library(self, serialized):
        if not (_state["servesim"] and serialized[1] == "bitcode"):
            return numbas_load(self, serialized)
        _loading_bitcode.append(True)
        try:
            return numbas_load(self, serialized)
        finally:
            _loading_bitcode.pop()

    for f, numbas_f in ((_finalize_final_module, numbas_final), (get_pointer_to_function, numbas_pointer),
                        (_get_compiled_object, numbas_object), (serialize_using_object_code, numbas_serialize)):
        f._servesim = True
        f.__wrapped__ = numbas_f
        setattr(lib, f.__name__, f)
    for f, numbas_f in ((set_env, numbas_env), (unserialize_library, numbas_load)):
        f._servesim = True
        f.__wrapped__ = numbas_f
        setattr(cg, f.__name__, f)
    return True


def install() -> dict:
    """Install every speed-up the environment allows (`patches_wanted`); returns which are in place."""
    if not patches_wanted():
        return {}
    fewer_collections_while_compiling()
    return {"flags": speed_up_flags(), "call types": cache_call_types(),
            "array lowering": skip_missing_array_lowering(), "function passes": optimise_in_final_module(),
            "inline copy": copy_inlined_blocks_once(), "abi sizes": cache_abi_sizes(),
            "machine code": defer_machine_code()}
