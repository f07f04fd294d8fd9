"""The engine's handlers and the reference simulator's methods correspond by name (issue #18)."""
from __future__ import annotations

import inspect

from servesim.engine import events, schedule
from servesim.reference import sim

# kernel-only mechanics with no reference counterpart: the reference uses a deque and a list; the
# decode fast-forward's handlers (engine/span.py: the reference, like --no-fast-forward, runs step by step);
# the pricing half of the reference's `launch` (`price`: a decision prices its batch, the loop launches it)
MECHANICS = {"drop_running", "push_back", "push_front", "insert_after", "pop_front", "log_iteration", "span_finish",
             "span_decide", "price"}


def _handlers(module):
    """The jitted functions defined in `module` (with NUMBA_DISABLE_JIT=1, the plain functions)."""
    funcs = {name: getattr(f, "py_func", f) for name, f in vars(module).items() if name.endswith("_nb")}
    return {name[:-3] for name, f in funcs.items() if inspect.isfunction(f) and inspect.getmodule(f) is module}


def test_every_handler_has_a_reference_method_of_the_same_name():
    names = _handlers(events) | _handlers(schedule)
    assert {"complete", "arrive", "route", "schedule", "launch", "static_batch", "continuous_batch",
            "preempt", "cached", "transfer", "to_decode", "retry_held"} <= names
    reference = set(vars(sim.ReferenceSimulator)) | set(vars(sim))
    missing = {n for n in names - MECHANICS if n not in reference}
    assert not missing, f"handlers without a reference method of the same name: {sorted(missing)}"
