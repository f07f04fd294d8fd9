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
    """map(fn, items, progress) -> list of results in input order."""
    name = "serial"

    def map(self, fn: Callable, items: Sequence, progress: Callable[[int], None] | None = None) -> list:
        out = []
        for x in items:
            out.append(fn(x))
            if progress:
                progress(1)
        return out

    def close(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class LocalBackend(Backend):
    """concurrent.futures.ProcessPoolExecutor over `workers` processes (default: every core)."""
    name = "local"

    def __init__(self, workers: int | None = None):
        self.workers = workers or os.cpu_count() or 1
        self._pool = None

    def map(self, fn, items, progress=None):
        items = list(items)
        if self.workers <= 1 or len(items) <= 1:
            return super().map(fn, items, progress)
        from concurrent.futures import ProcessPoolExecutor, as_completed
        if self._pool is None:
            self._pool = ProcessPoolExecutor(max_workers=self.workers)
        futures = {self._pool.submit(fn, x): i for i, x in enumerate(items)}
        out = [None] * len(items)
        for fut in as_completed(futures):
            out[futures[fut]] = fut.result()
            if progress:
                progress(1)
        return out

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

    def map(self, fn, items, progress=None):
        from dask.distributed import as_completed
        items = list(items)
        if not items:
            return []
        futures = self.client.map(fn, items, pure=False)
        index = {f.key: i for i, f in enumerate(futures)}
        out = [None] * len(items)
        for fut in as_completed(futures):
            out[index[fut.key]] = fut.result()
            if progress:
                progress(1)
        return out

    def close(self):
        self.client.close()


def make_backend(dask_scheduler: str | None = None, workers: int | None = None) -> Backend:
    if dask_scheduler:
        return DaskBackend(dask_scheduler)
    if workers is not None and workers < 1:
        raise ConfigError(f"--workers must be >= 1, got {workers}")
    return LocalBackend(workers)
