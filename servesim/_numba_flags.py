"""numba's compile flags compared in O(1) Python steps, not 22 property reads (~1.5 CPU s of a cold
first simulate; README, Speed).

numba types each `a[i]`, `x + y`, `max(...)` by trying every overload template registered for the
operator; each try looks up the template's compiled implementation in a cache keyed by the current
compile flags (`numba.core.typing.templates._OverloadFunctionTemplate._get_impl`, numba 0.58-0.68),
and lowering asks again. The key's hash and equality call `TargetConfig.values()`, which builds a
dict of every option through its property (~11 us; a compare builds two): a cold first simulate does
~35,000 such lookups and ~55,000 compares.

`speed_up_flags()` replaces `values`, `__hash__` and `__eq__` of numba's `TargetConfig` with versions
that give the same results: `values()` the same dict (the options' defaults, in the options' order,
overridden by the values set), the hash numba's own (of the sorted option names, fixed per class),
equality numba's own (equal `values()`; an object equals itself). Nothing numba compiles changes;
`tests/test_numba_flags.py` checks each against numba's originals. It is applied only where numba's
`TargetConfig` is the one described here (its options a mapping of `Option`, each set value kept in
`_values`), else numba is left as it is.
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
