"""Execution backends: run independent tasks on a local process pool (default, all cores) or on an
existing Dask cluster. Results always come back in the order of the inputs, whichever backend ran them.

A task is a top-level function and a picklable argument; it must not raise for user errors (it returns
an error record instead), so one bad point never loses the others.
"""
from __future__ import annotations

import os
import time
from typing import Callable, Sequence

from ..errors import ConfigError, ServesimError


class Backend:
    """map(fn, items, progress, on_result) -> list of results in input order; ``on_result(i, result)``
    is called as each item finishes (in completion order), e.g. to save it at once."""
    name = "serial"

    def map(self, fn: Callable, items: Sequence, progress: Callable[[int], None] | None = None,
            on_result: Callable[[int, object], None] | None = None) -> list:
        out = []
        for i, x in enumerate(items):
            out.append(fn(x))
            if on_result:
                on_result(i, out[-1])
            if progress:
                progress(1)
        return out

    def close(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, etype, exc, tb):
        if exc is not None:
            self.abort()
        self.close()

    def abort(self):
        """Stop running work at once (an error or an interrupt in the caller)."""


class LocalBackend(Backend):
    """concurrent.futures.ProcessPoolExecutor over `workers` processes (default: every core)."""
    name = "local"

    def __init__(self, workers: int | None = None):
        self.workers = workers or os.cpu_count() or 1
        self._pool = None

    def map(self, fn, items, progress=None, on_result=None):
        items = list(items)
        if self.workers <= 1 or len(items) <= 1:
            return super().map(fn, items, progress, on_result)
        from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
        import multiprocessing
        if self._pool is None:
            self._sims = multiprocessing.Value("q", 0)      # simulations the workers finished (servesim.progress)
            self._pool = ProcessPoolExecutor(max_workers=self.workers, initializer=_worker_init,
                                             initargs=(os.getpid(), self._sims, self.workers))
        futures = {self._pool.submit(fn, x): i for i, x in enumerate(items)}
        out = [None] * len(items)
        pending = set(futures)
        while pending:
            done, pending = wait(pending, timeout=0.1, return_when=FIRST_COMPLETED)
            self._forward()
            for fut in done:
                i = futures[fut]
                out[i] = fut.result()
                if on_result:
                    on_result(i, out[i])
                if progress:
                    progress(1)
        return out

    def _forward(self) -> None:
        """Hand the simulations the workers finished since the last call to this process's listener."""
        from .. import progress as P
        with self._sims.get_lock():
            n, self._sims.value = self._sims.value, 0
        if n:
            P.tick(n)

    def abort(self):
        """Kill the workers (SIGTERM, then SIGKILL): none outlives the caller or holds its pipes."""
        if self._pool is None:
            return
        procs = list((getattr(self._pool, "_processes", None) or {}).values())
        self._pool.shutdown(wait=False, cancel_futures=True)
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(timeout=2)
            if p.is_alive():
                p.kill()
                p.join(timeout=2)

    def close(self):
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None


class ClusterError(ServesimError):
    """The Dask cluster was lost (scheduler gone, no workers left) before every point was computed."""


class DaskBackend(Backend):
    """dask.distributed.Client(address).map; gathered back in input order.

    ``timeout`` (seconds, or a dask duration string) bounds how long a sweep waits while the cluster
    cannot make progress -- the scheduler unreachable, or no worker connected -- and the connection
    (unless ``connect_timeout`` is given); then `ClusterError` says so in one line, after every
    point finished so far was handed to ``on_result``. Losing some of the workers is not an error: the scheduler reruns their tasks on
    the others. While the backend is open, distributed's own log messages (reconnect attempts,
    CommClosedError tracebacks) are silenced: the error is the one line."""
    name = "dask"
    _QUIET = ("distributed", "tornado", "asyncio")

    def __init__(self, address: str, timeout: float | str = 60.0, connect_timeout: float | str | None = None):
        try:
            from dask.distributed import Client
            from dask.utils import parse_timedelta
        except ImportError:
            raise ConfigError("--dask-scheduler needs dask.distributed; pip install 'servesim[dask]'") from None
        self.address = address
        self.timeout = float(parse_timedelta(timeout, default="s"))
        self._levels = {}
        self.failed = False
        try:
            connect = self.timeout if connect_timeout is None else float(parse_timedelta(connect_timeout, default="s"))
            self.client = Client(address, timeout=connect)
        except (OSError, TimeoutError, ValueError) as e:
            raise ConfigError(f"--dask-scheduler: cannot connect to {address!r} ({e}); "
                              "give the scheduler address, e.g. tcp://127.0.0.1:8786") from None
        self._quiet(True)

    def _quiet(self, on: bool) -> None:
        """Silence (or restore) distributed's loggers and their children (dask configures the children's
        levels one by one, so each is set)."""
        import logging
        if not on:
            for name, level in self._levels.items():
                logging.getLogger(name).setLevel(level)
            self._levels = {}
            return
        names = set(self._QUIET) | {n for n in logging.root.manager.loggerDict
                                    if n.split(".")[0] in self._QUIET}
        for name in names:
            log = logging.getLogger(name)
            self._levels.setdefault(name, log.level)
            log.setLevel(logging.CRITICAL + 1)

    def _lost(self, why: str, done: int, total: int) -> ClusterError:
        self.failed = True
        return ClusterError(f"--dask-scheduler {self.address}: {why}; {done} of {total} points were completed "
                            "(kept); check the cluster and rerun")

    def _unhealthy(self) -> str | None:
        """Why the cluster cannot make progress now, or None: the scheduler unreachable, or no workers."""
        if self.client.status != "running":
            return "lost the connection to the scheduler"
        try:
            workers = self.client.sync(self.client.scheduler.ncores, callback_timeout=min(5.0, self.timeout))
        except Exception:   # any failure to ask is the same answer: the scheduler does not respond
            return "the scheduler does not respond"
        return None if workers else "no worker is connected"

    def map(self, fn, items, progress=None, on_result=None):
        from dask.distributed import wait
        from distributed import KilledWorker
        from distributed.comm.core import CommClosedError
        from concurrent.futures import CancelledError
        items = list(items)
        if not items:
            return []
        n = len(items)
        try:
            futures = self.client.map(fn, items, pure=False)
        except (CommClosedError, OSError, ValueError, CancelledError) as e:
            raise self._lost(f"cannot submit work ({type(e).__name__})", 0, n) from None
        index = {f.key: i for i, f in enumerate(futures)}
        out = [None] * n
        pending, finished, stalled = set(futures), 0, None
        poll = min(1.0, max(self.timeout / 4.0, 0.05))
        while pending:
            try:
                done, _ = wait(list(pending), timeout=poll, return_when="FIRST_COMPLETED")
            except TimeoutError:
                done = ()
            except (CommClosedError, OSError, ValueError, CancelledError) as e:   # the client lost its scheduler
                raise self._lost(f"lost the scheduler ({type(e).__name__})", finished, n) from None
            progressed = False
            for fut in done:
                i = index[fut.key]
                try:
                    out[i] = fut.result(timeout=poll)
                except TimeoutError:   # its result went with a lost worker: the scheduler computes it again
                    continue
                except KilledWorker:
                    raise self._lost(f"point {i} killed every worker that ran it (KilledWorker)", finished,
                                     n) from None
                except (CancelledError, CommClosedError):
                    raise self._lost("lost the scheduler (the points were cancelled)", finished, n) from None
                pending.discard(fut)
                finished += 1
                progressed = True
                if on_result:
                    on_result(i, out[i])
                if progress:
                    progress(1)
                from .. import progress as P
                P.tick(1)     # a cluster's workers count nothing here: a finished task counts as one simulation
            if progressed:
                stalled = None
                continue
            why = self._unhealthy()
            if why is None:
                stalled = None
            elif stalled is None:
                stalled = (time.monotonic(), why)
            elif time.monotonic() - stalled[0] >= self.timeout:
                raise self._lost(f"{why} for {self.timeout:g} s (--dask-timeout)", finished, n)
        return out

    def close(self):
        try:
            self.client.close(timeout=min(5.0, self.timeout))
        except Exception:   # a lost scheduler: nothing left to close cleanly
            pass
        finally:
            if not self.failed:   # after a loss the client keeps logging its reconnects: stay quiet
                self._quiet(False)


def _worker_init(parent: int, sims=None, workers: int = 1) -> None:
    """In each pool worker: die with the parent (Linux: PR_SET_PDEATHSIG), leave SIGINT to the parent
    (a Ctrl-C reaches the whole process group; the parent stops the workers), default SIGTERM, no
    repeated one-line warnings (the parent checked the points), count finished simulations in
    ``sims``, which the parent reads for its progress bar, and take a 1 / ``workers`` share of the cores
    for a simulation's default ``--threads`` (engine/split.py)."""
    import signal
    import warnings
    from .. import progress as P
    from ..engine import split
    from ..errors import ServesimWarning
    P.share(sims)
    split.share_cores(workers)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    warnings.simplefilter("ignore", ServesimWarning)
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)     # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:                          # the parent died before prctl took effect
        os._exit(1)


def make_backend(dask_scheduler: str | None = None, workers: int | None = None,
                 dask_timeout: float | None = None) -> Backend:
    if dask_timeout is not None and not (0 < dask_timeout < float("inf")):
        raise ConfigError(f"--dask-timeout must be a finite number of seconds > 0, got {dask_timeout}; "
                          "e.g. --dask-timeout 60")
    if dask_scheduler:
        if dask_timeout is None:   # 60 s without progress; a wrong address is reported after 10 s
            return DaskBackend(dask_scheduler, 60.0, connect_timeout=10.0)
        return DaskBackend(dask_scheduler, dask_timeout)
    if dask_timeout is not None:
        raise ConfigError(f"--dask-timeout {dask_timeout:g} does nothing without --dask-scheduler; "
                          "give the scheduler address or drop --dask-timeout")
    if workers is not None and workers < 1:
        raise ConfigError(f"--workers must be >= 1, got {workers}")
    return LocalBackend(workers)
