"""Execution backends: run independent tasks on a local process pool (default, all cores) or on an
existing Dask cluster. Results always come back in the order of the inputs, whichever backend ran them.

A task is a top-level function and a picklable argument; it must not raise for user errors (it returns
an error record instead), so one bad point never loses the others.
"""
from __future__ import annotations

import os
from typing import Callable, Sequence

from ..errors import ConfigError


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
        from concurrent.futures import ProcessPoolExecutor, as_completed
        if self._pool is None:
            self._pool = ProcessPoolExecutor(max_workers=self.workers, initializer=_worker_init,
                                             initargs=(os.getpid(),))
        futures = {self._pool.submit(fn, x): i for i, x in enumerate(items)}
        out = [None] * len(items)
        for fut in as_completed(futures):
            i = futures[fut]
            out[i] = fut.result()
            if on_result:
                on_result(i, out[i])
            if progress:
                progress(1)
        return out

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


class DaskBackend(Backend):
    """dask.distributed.Client(address).map; gathered back in input order."""
    name = "dask"

    def __init__(self, address: str, timeout: str = "10s"):
        try:
            from dask.distributed import Client
        except ImportError:
            raise ConfigError("--dask-scheduler needs dask.distributed; pip install 'servesim[dask]'") from None
        try:
            self.client = Client(address, timeout=timeout)
        except (OSError, TimeoutError, ValueError) as e:
            raise ConfigError(f"--dask-scheduler: cannot connect to {address!r} ({e}); "
                              "give the scheduler address, e.g. tcp://127.0.0.1:8786") from None

    def map(self, fn, items, progress=None, on_result=None):
        from dask.distributed import as_completed
        items = list(items)
        if not items:
            return []
        futures = self.client.map(fn, items, pure=False)
        index = {f.key: i for i, f in enumerate(futures)}
        out = [None] * len(items)
        for fut in as_completed(futures):
            i = index[fut.key]
            out[i] = fut.result()
            if on_result:
                on_result(i, out[i])
            if progress:
                progress(1)
        return out

    def close(self):
        self.client.close()


def _worker_init(parent: int) -> None:
    """In each pool worker: die with the parent (Linux: PR_SET_PDEATHSIG), leave SIGINT to the parent
    (a Ctrl-C reaches the whole process group; the parent stops the workers), default SIGTERM, and
    no repeated one-line warnings (the parent checked the points)."""
    import signal
    import warnings
    from ..errors import ServesimWarning
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


def make_backend(dask_scheduler: str | None = None, workers: int | None = None) -> Backend:
    if dask_scheduler:
        return DaskBackend(dask_scheduler)
    if workers is not None and workers < 1:
        raise ConfigError(f"--workers must be >= 1, got {workers}")
    return LocalBackend(workers)
