"""Part of a cold compile in a second process: a function's largest callees compiled there while this
process compiles the rest (used for the event loop, `engine.kernel.compile_ahead`).

numba compiles on one thread, so a cold first run uses one core. Before a function (``loop``) is
called for argument types that numba has neither in memory nor in its disk cache, `start` starts one
background Python process (`command`, `compile_jobs`) that compiles the callees it is given, for the
exact types of their example arguments (pickled on its stdin), each saved in numba's cache as any
compile is (the child inherits the environment: the same `NUMBA_CACHE_DIR` and source folders), and
says each function's name on its stdout once saved. Meanwhile this process compiles its own list
first (`Child.compile_own`), then ``loop``. When ``loop``'s typing reaches a callee the child
compiles, numba looks in the disk cache before compiling (`Dispatcher.compile`), and that look-up
first waits for the child's word (`_WaitFirst`): numba loads what the child compiled. The same source
compiled for the same types gives the same code, so no result changes.

On a process's first run, where ``loop`` was never compiled nor cached for any types, the child is
started before the run is lowered (`prestart`, from `servesim.simulate`): it imports numba and
servesim (~1.4 s) while this process lowers the run, and takes `start`'s jobs then; a child started
early that no run takes is ended (at `start`, at exit, or by itself after `SPARE_WAIT_S`).

Only where it can pay (`can_pay`): the JIT on, numba's cache on and writable, a POSIX system, two
usable cores, most of one idle (on cores busy with other jobs a child only slows the run down);
``loop``'s signature not cached; one child per process at a time. `SERVESIM_COMPILE_AHEAD=1` starts it
whether a core is idle or not, 0 never (unset: the default; any other value is refused, `wanted`). A
child that fails, or has not answered `WAIT_S` after its start, is killed and reaped, and this process
compiles what it lacks, as without a child; the child's output goes nowhere. A function is loaded
only once the child has said it is saved or has ended: numba writes each cache file under a
temporary name and renames it (`numba.core.caching.IndexDataCacheFile._open_for_write`), so no process
reads a partial file; an entry compiled for other types than asked is not used (`_WaitFirst`).
"""
from __future__ import annotations

import atexit
import inspect
import os
import pickle
import select
import subprocess
import sys
import time
from contextlib import contextmanager

ENV = "SERVESIM_COMPILE_AHEAD"
# the longest this process waits for the child, s from its start: ~5 CPU s of compiling on a free core,
# ~12 s wall with both cores busy with other jobs (README, Speed); a slower child is killed
WAIT_S = 30.0
_active: list = []      # the child running, if any (one per process)
_spare: list = []       # a child started early (`prestart`), importing while this process lowers the run
# the longest a child started early waits for its jobs, s; then it ends
SPARE_WAIT_S = 120.0


def wanted() -> str:
    """`SERVESIM_COMPILE_AHEAD`: "auto" (unset or empty, the default: where a core is idle, `can_pay`),
    "on" (1: wherever two cores are usable) or "off" (0); any other value refused."""
    value = os.environ.get(ENV, "").strip()
    if value in ("", "0", "1"):
        return {"": "auto", "0": "off", "1": "on"}[value]
    from .errors import ConfigError
    raise ConfigError(f"{ENV} = {value!r}: use 1 (part of a cold compile in a second process), 0 (all in "
                      f"this process) or leave it unset (a second process where a core is idle)")


def params(dispatcher) -> list:
    return list(inspect.signature(dispatcher.py_func).parameters)


def by_name(dispatcher, ex: dict) -> tuple:
    """``dispatcher``'s arguments from ``ex`` (parameter name -> value), by its parameters' names."""
    return tuple(ex[p] for p in params(dispatcher))


def signature(args) -> tuple:
    from numba import typeof
    return tuple(typeof(a) for a in args)


def cached(dispatcher, sig: tuple) -> bool:
    """Whether ``dispatcher`` has ``sig`` compiled in memory or in its disk cache (numba's index key)."""
    if sig in dispatcher.overloads:
        return True
    cache = dispatcher._cache
    return cache._index_key(sig, dispatcher.targetctx.codegen()) in cache._cache_file._load_index()


def can_pay(dispatcher, auto: bool) -> bool:
    """Whether a child can shorten ``dispatcher``'s compile: the JIT and its cache on, a POSIX system,
    two usable cores, and with ``auto`` most of one idle: the load average of the last minute below
    their number less a half. (On 2 cores the cold first call took 10.4 s of wall with a child against
    12.9 s without at load 1.2-1.6, 22.1 against 16.6 s at load 3.0-4.4; README, Speed.)"""
    from numba.core import config
    from numba.core.caching import FunctionCache
    if config.DISABLE_JIT or os.name != "posix" or not isinstance(getattr(dispatcher, "_cache", None), FunctionCache):
        return False
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    idle = not auto or os.getloadavg()[0] < cores - 0.5
    return cores >= 2 and idle and os.access(dispatcher._cache.cache_path, os.W_OK)


def command(*warm) -> list:
    """The child's command line: this Python, importing this servesim first, then the modules ``warm``
    (a child started early: the functions it will compile), then `compile_jobs`."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # (above servesim/)
    code = "import sys, importlib; sys.path.insert(0, sys.argv[1]); [importlib.import_module(m) for m in sys.argv[2:]]; " \
           "from servesim._compile_ahead import compile_jobs; compile_jobs(sys.stdin.buffer, sys.stdout)"
    return [sys.executable, "-c", code, root, *warm]


class _WaitFirst:
    """Stands for a dispatcher's cache while the child compiles its function: a load waits for the
    child's word first; everything else is the cache's own."""

    def __init__(self, cache, child, name):
        self._cache, self._child, self._name = cache, child, name

    def load_overload(self, sig, target_context):
        self._child.wait_for(self._name)
        cres = self._cache.load_overload(sig, target_context)
        # (numba's index is rewritten whole by each save: two processes saving one function for other
        # types at once can leave a key naming the other's data; then it is compiled here)
        return cres if cres is None or tuple(cres.signature.args) == tuple(sig) else None

    def __getattr__(self, name):
        return getattr(self._cache, name)


class Child:
    """The background compile of ``jobs`` ((module, function, argument types), in order) for the
    dispatchers ``disps``, and ``own`` to compile here meanwhile; `close` ends it."""

    def __init__(self, jobs, disps, own=()):
        self.own = own
        self.deadline = time.monotonic() + WAIT_S
        self.proc = _spare.pop() if _spare else spawn()
        self.said, self._buf, self.ended = set(), b"", False
        self.disps = disps
        for d in disps:
            d._cache = _WaitFirst(d._cache, self, d.py_func.__name__)
        try:
            self.proc.stdin.write(pickle.dumps(jobs))
            self.proc.stdin.close()
        except OSError:
            self.ended = True     # (it died: nothing to wait for)

    def compile_own(self, loop) -> None:
        """Compile ``own`` ((dispatcher, example arguments)) here meanwhile, as callees of ``loop``: under
        its compile flags, which a callee inherits where it sets none (numba's `Flags.inherit_if_not_set`:
        ``nrt``, ``fastmath``, ``error_model``, ``forceinline``), so compiled as in ``loop``'s typing; a
        failure is left for the run's own compile to meet."""
        from numba.core.compiler import Flags
        from numba.core.targetconfig import ConfigStack
        flags = Flags()
        loop.targetdescr.options.parse_as_flags(flags, loop.targetoptions)
        for d, a in self.own:
            try:
                with ConfigStack().enter(flags.copy()):
                    d.compile(signature(a))
            except Exception:       # (a speed-up only, never the run's error)
                pass

    def wait_for(self, name: str) -> None:
        """Until the child says ``name`` is saved, ends, or its time is up."""
        fd = self.proc.stdout.fileno()
        while name not in self.said and not self.ended:
            left = self.deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                self.proc.kill()        # (late: killed before anything of its is read)
                self.proc.wait()
                self.ended = True
                return
            chunk = os.read(fd, 4096)
            if not chunk:
                self.ended = True
            self._buf += chunk
            *lines, self._buf = self._buf.split(b"\n")
            self.said.update(s.decode() for s in lines)

    def close(self, wait: bool) -> None:
        """With ``wait``, let the child finish (within its time); then kill it if it runs, reap it, and
        give the dispatchers their caches back."""
        try:
            if wait:
                self.wait_for("\0")     # (a name never said: until it ends)
                self.proc.wait(max(self.deadline - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            pass
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self.proc.stdout.close()
            for d in self.disps:
                if isinstance(d._cache, _WaitFirst):
                    d._cache = d._cache._cache
            _active.clear()


def spawn(*warm) -> subprocess.Popen:
    return subprocess.Popen(command(*warm), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)


def prestart(loop) -> None:
    """Start the child now, before the run is lowered, where ``loop`` has never been compiled here nor
    cached for any types (a first run) and a child can pay: it imports numba and servesim (~1 s) while
    this process lowers the run, and then waits for `start`'s jobs. A child `start` does not take is
    ended there, or at this process's exit."""
    mode = wanted()
    if _spare or _active or mode == "off":
        return
    try:
        if loop.overloads or not can_pay(loop, mode == "auto") or loop._cache._cache_file._load_index():
            return
        _spare.append(spawn(loop.py_func.__module__))
    except Exception:       # (a speed-up only)
        return


def drop_spare() -> None:
    """End a child started early that no run took."""
    while _spare:
        proc = _spare.pop()
        proc.kill()
        proc.wait()
        proc.stdin.close()
        proc.stdout.close()


atexit.register(drop_spare)     # (a child started early that no run took: ended at exit)


def start(loop, args, plan) -> Child | None:
    """A child compiling the first list of ``plan(args)`` ((dispatcher, example arguments), the second
    compiled here meanwhile), where it can pay: before ``loop`` is called with ``args`` (without its
    last two, float64, arguments) for types numba has not compiled; else None, and a child started
    early (`prestart`) ended."""
    child = _child_for(loop, args, plan)
    if child is None:
        drop_spare()
    return child


def _child_for(loop, args, plan) -> Child | None:
    from numba.core import types
    mode = wanted()
    if mode == "off" or _active or not can_pay(loop, mode == "auto" and not _spare):
        return None
    try:
        if cached(loop, signature(args) + (types.float64, types.float64)):
            return None
        calls, own = plan(args)
        jobs, disps = [], []
        for d, a in calls:
            sig = signature(a)
            if not cached(d, sig):
                jobs.append((d.py_func.__module__, d.py_func.__name__, sig))
                disps.append(d)
    except Exception:       # (numba's cache not as described, a parameter renamed: a speed-up only,
        return None         # never the run's error; tests/test_ahead.py fails on a prediction gone wrong)
    if not jobs:
        return None
    try:
        _active.append(Child(jobs, disps, own))
    except OSError:
        return None     # (no child could start: all compiled here)
    return _active[0]


@contextmanager
def ahead(loop, args, plan):
    """Around a call of ``loop`` with ``args`` (`start`'s): `start`, the second list of ``plan(args)``
    compiled, and at the end the child closed (waited for, at most until its time is up; killed at
    once on an error)."""
    child = start(loop, args, plan)
    ok = False
    try:
        if child is not None:
            child.compile_own(loop)
        yield
        ok = True
    finally:
        if child is not None:
            child.close(wait=ok)


def compile_jobs(stream, out) -> None:
    """The child: compile each (module, function, argument types) pickled on ``stream``, saying each
    function's name on ``out`` once numba has saved it. It loads numba's registries first (a child
    started early does it while its parent lowers the run), and ends if no jobs come in `SPARE_WAIT_S`."""
    import importlib

    from numba.core.registry import cpu_target
    cpu_target.typing_context.refresh()     # (numba's registries, loaded by a first compile anyway)
    cpu_target.target_context.refresh()
    if not select.select([stream], [], [], SPARE_WAIT_S)[0]:
        return
    for module, name, sig in pickle.load(stream):
        getattr(importlib.import_module(module), name).compile(sig)
        out.write(name + "\n")
        out.flush()
