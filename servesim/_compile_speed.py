"""Two ways servesim has numba compile faster on a cold start, neither changing what it compiles
(`servesim.jit` installs both when the first module with jitted functions is imported).

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

Together ~2.5 CPU s of a cold first simulate (README, Speed).
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


# the youngest generation's threshold while numba compiles a servesim function (Python's default: 700)
COMPILE_GC_THRESHOLD = 50_000
_gc_state = {"installed": False, "depth": 0, "saved": None}


def fewer_collections_while_compiling() -> None:
    """From now on, raise the youngest generation's collection threshold to `COMPILE_GC_THRESHOLD` while
    the outermost compilation of a servesim function runs; idempotent."""
    if _gc_state["installed"]:
        return
    import gc

    from numba.core import event

    class _Collections(event.Listener):
        def on_start(self, ev):
            _gc_state["depth"] += 1
            if _gc_state["depth"] != 1:
                return
            func = getattr(ev.data.get("dispatcher"), "py_func", None)
            if (getattr(func, "__module__", None) or "").startswith("servesim."):
                t = gc.get_threshold()
                if t[0] < COMPILE_GC_THRESHOLD:
                    _gc_state["saved"] = t
                    gc.set_threshold(COMPILE_GC_THRESHOLD, *t[1:])

        def on_end(self, ev):
            _gc_state["depth"] -= 1
            if _gc_state["depth"] == 0 and _gc_state["saved"] is not None:
                gc.set_threshold(*_gc_state["saved"])
                _gc_state["saved"] = None

    event.register("numba:compile", _Collections())
    _gc_state["installed"] = True
