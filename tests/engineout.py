"""What the engine tests that compare two ways of running the same inputs share: the lowered inputs of a
`servesim.simulate` call, and a field-by-field, byte-for-byte comparison of two EngineOutputs."""
from __future__ import annotations

import numpy as np

import servesim
import servesim.api as api
from servesim.engine.run import run


def lowered_inputs(monkeypatch, **kw):
    """The lowered inputs (`lower.KernelInputs`) of ``servesim.simulate(**kw)``, run on one thread (this
    undoes ``monkeypatch``'s earlier changes: patch after it)."""
    got = []
    monkeypatch.setattr(api, "run", lambda inputs, threads=1: (got.append(inputs), run(inputs))[1])
    servesim.simulate(**kw)
    monkeypatch.undo()
    return got[0]


def assert_same_output(a, b, skip=()):
    """Every field of EngineOutputs ``a`` and ``b`` but ``skip``: arrays of the same dtype, shape and bytes."""
    for name in a._fields:
        if name in skip:
            continue
        x, y = getattr(a, name), getattr(b, name)
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype and x.shape == y.shape, name
            assert x.tobytes() == y.tobytes(), f"{name} differs at {np.flatnonzero(x != y)[:5]}"
        else:
            assert x == y, name
