"""The second process of a cold compile (`servesim._compile_ahead`, `engine.kernel.ahead_plan`): the types it compiles for are the
ones the runs compile, its word is waited for, and a child that fails or hangs changes nothing."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest
from numba import config, njit
from numba.core import types

from servesim.api import WARMUP_RUNS
from servesim import _compile_ahead as A
from servesim.engine.kernel import ahead_plan, run_nb
from servesim.errors import ConfigError

jit_only = pytest.mark.skipif(config.DISABLE_JIT, reason="the child compiles: nothing to do with the JIT off")


def _runs_args(monkeypatch, run):
    """The `run_nb` arguments each `ahead` of ``run()`` was asked about: compiled by the run for their
    types, or loaded from numba's disk cache, where an earlier run compiled them (`ahead.cached`: in
    memory or in the cache's index)."""
    seen = []
    monkeypatch.setattr(A, "start", lambda loop, args, plan: seen.append(args))
    run()
    assert seen
    return seen


RICH = [name for name in WARMUP_RUNS if name.count(",") >= 3] + ["one pool"]   # (every feature, plain)


@jit_only
@pytest.mark.parametrize("name", ["one pool", "static batching", next(n for n in RICH if "speculative" in n),
                                  next(n for n in RICH if "static" in n), "prefix cache, MoE/MLA/EP/int4"])
def test_predicted_types_are_the_ones_the_run_compiled(monkeypatch, name):
    import servesim
    for args in _runs_args(monkeypatch, lambda: servesim.simulate(num_requests=20, seed=0, **WARMUP_RUNS[name])):
        assert A.cached(run_nb, A.signature(args) + (types.float64, types.float64))
        child, own = ahead_plan(args)
        for d, a in child + own:     # (compiled now, or loaded with the loop)
            assert A.cached(d, A.signature(a)), (d.py_func.__name__, d.signatures)


@jit_only
def test_split_and_streamed_runs_predict_too(monkeypatch):
    import servesim
    for opts in (dict(threads=2, replicas=2, num_requests=2100), dict(stream=True, num_requests=50)):
        for args in _runs_args(monkeypatch, lambda: servesim.simulate(seed=0, **opts)):
            child, own = ahead_plan(args)
            for d, a in child + own:
                assert A.cached(d, A.signature(a)), (opts, d.py_func.__name__)


def test_the_environment_turns_it_off_and_a_bad_value_is_refused(monkeypatch):
    for value, mode in (("", "auto"), ("1", "on"), (" 1", "on"), ("0", "off"), (" 0 ", "off")):
        monkeypatch.setenv(A.ENV, value)
        assert A.wanted() == mode
    monkeypatch.setenv(A.ENV, "2")
    with pytest.raises(ConfigError, match="SERVESIM_COMPILE_AHEAD = '2': use 1 .*, 0 .* or leave it unset"):
        A.wanted()
    monkeypatch.setenv(A.ENV, "0")
    assert A.start(run_nb, (), ahead_plan) is None


@jit_only
def test_by_default_only_where_a_core_is_idle(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    for load, auto, pays in ((1.4, True, True), (1.5, True, False), (3.5, False, True)):
        monkeypatch.setattr(os, "getloadavg", lambda: (load, 0.0, 0.0))
        assert A.can_pay(run_nb, auto) is pays
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    assert not A.can_pay(run_nb, False)


@jit_only
def test_a_compile_loads_what_the_child_compiled(tmp_path):
    """In a fresh cache: the child compiles a handler, and this process's compile of it is a cache hit."""
    script = textwrap.dedent("""
        import sys
        from numba.core import types
        from servesim import _compile_ahead as A
        from servesim.engine.span import gap_bin_nb
        child = A.Child([("servesim.engine.span", "gap_bin_nb", (types.float64,))], [gap_bin_nb])
        gap_bin_nb.compile((types.float64,))
        child.close(wait=True)
        print(child.said, child.proc.returncode, gap_bin_nb.stats.cache_hits[(types.float64,)],
              gap_bin_nb.stats.cache_misses[(types.float64,)], type(gap_bin_nb._cache).__name__)
    """)
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path))
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["{'gap_bin_nb'}", "0", "1", "0", "FunctionCache"]
    assert r.stderr == ""


@njit
def _plus_one(x):
    return x + 1


@jit_only
@pytest.mark.parametrize("command", ["import time; time.sleep(60)",
                                     "import sys; print('noise'); print('x', file=sys.stderr); sys.exit(3)"])
def test_a_child_that_hangs_or_fails_is_ended_and_this_process_compiles(monkeypatch, capfd, command):
    monkeypatch.setattr(A, "WAIT_S", 1.0)
    monkeypatch.setattr(A, "command", lambda *warm: [sys.executable, "-c", command])
    cache = _plus_one._cache
    t0 = time.perf_counter()
    child = A.Child([], [_plus_one])
    assert isinstance(_plus_one._cache, A._WaitFirst)
    assert _plus_one(41) == 42           # (compiled here after the wait)
    child.close(wait=True)
    assert time.perf_counter() - t0 < 30
    assert child.proc.returncode is not None and _plus_one._cache is cache and not A._active
    assert capfd.readouterr() == ("", "")


def test_an_entry_for_other_types_is_compiled_again():
    """numba's index can name another process's entry for other types (two saves at once): not used."""
    from numba.core.typing import signature as of

    class Child:
        def wait_for(self, name):
            pass

    class Cache:
        def load_overload(self, sig, ctx):
            return Entry()

    class Entry:
        signature = of(types.none, types.int64)

    wait = A._WaitFirst(Cache(), Child(), "f")
    assert isinstance(wait.load_overload((types.int64,), None), Entry)
    assert wait.load_overload((types.float64,), None) is None


class _Loop:
    """A loop function as `prestart` reads it: compiled here for ``overloads``, cached for ``index``."""

    def __init__(self, overloads=(), index=()):
        self.overloads = dict.fromkeys(overloads)
        self.py_func = run_nb.py_func
        self._cache = self
        self._cache_file = self
        self._index = dict.fromkeys(index)

    def _load_index(self):
        return self._index


@pytest.mark.parametrize("taken", [True, False])
def test_a_child_started_early_is_taken_by_the_run_or_ended(monkeypatch, taken):
    monkeypatch.setattr(A, "can_pay", lambda loop, auto: True)
    warmed = []
    monkeypatch.setattr(A, "command", lambda *warm: warmed.extend(warm) or [sys.executable, "-c",
                                                                             "import sys; sys.stdin.read()"])
    monkeypatch.setattr(A, "cached", lambda d, sig: not taken)
    A.prestart(_Loop())
    assert len(A._spare) == 1 and warmed == ["servesim.engine.kernel"]     # (it imports the loop's module)
    spare = A._spare[0]
    A.prestart(_Loop())                     # (one at a time)
    assert A._spare == [spare]
    child = A.start(_Loop(), (1,), lambda args: ([(_plus_one, (1,))], []))
    assert not A._spare
    if taken:                               # the run's jobs went to the child started early
        assert child.proc is spare
        child.close(wait=False)
    else:                                   # nothing to compile there: ended and reaped
        assert child is None
    assert spare.poll() is not None and not A._active


def test_no_child_is_started_early_for_a_loop_compiled_or_cached(monkeypatch):
    monkeypatch.setattr(A, "can_pay", lambda loop, auto: True)
    monkeypatch.setattr(A, "spawn", lambda: pytest.fail("started"))
    A.prestart(_Loop(overloads=["sig"]))
    A.prestart(_Loop(index=["key"]))
    monkeypatch.setenv(A.ENV, "0")
    A.prestart(_Loop())
    assert not A._spare


def test_a_child_started_early_ends_when_no_job_comes(monkeypatch):
    import io
    monkeypatch.setattr(A, "SPARE_WAIT_S", 0.2)
    r, w = os.pipe()
    out = io.StringIO()
    with open(r, "rb") as stream:
        A.compile_jobs(stream, out)         # (returns: nothing was written)
    os.close(w)
    assert out.getvalue() == ""
