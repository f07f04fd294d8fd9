"""Progress of long commands: every finished simulation ticks a counter, and a terminal bar follows it.

``tick()`` is called once per simulation (`api.simulate`). In the process that draws the bar a
listener receives it (``listen``); in a pool worker it bumps a counter shared with the parent
(``share``, set by the pool's initializer), which the parent's backend forwards to its listener as it
waits for results (`planning.backends.LocalBackend`). Nothing listens, nothing happens.

``Bar`` is a small tqdm-style bar on standard error, drawn only when standard error is a terminal
(nothing on a pipe or a file): with a known number of tasks (points of a sweep)
``sweep  45%|#########           | 9/20 points [00:03<00:04, 9 simulations, 2.90/s]``, else
``plan: 37 simulations [00:12, 3.08/s]``; redrawn at most every 0.1 s, and once more at the end.
"""
from __future__ import annotations

import sys
import time
from contextlib import contextmanager

_listener = None     # callable(n) of the process drawing a bar
_shared = None       # multiprocessing.Value("q") of a pool worker, shared with its parent


def tick(n: int = 1) -> None:
    """``n`` simulations finished."""
    if _shared is not None:
        with _shared.get_lock():
            _shared.value += n
    elif _listener is not None:
        _listener(n)


def share(value) -> None:
    """In a pool worker: ticks go to ``value``, a counter the parent reads."""
    global _shared
    _shared = value


@contextmanager
def listen(fn):
    """Within the block, ``fn(n)`` receives this process's ticks (and those its backend forwards)."""
    global _listener
    old, _listener = _listener, fn
    try:
        yield fn
    finally:
        _listener = old


def _clock(s: float) -> str:
    s = int(s)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60:02d}:{s % 60:02d}"


class Bar:
    """A progress bar on ``stream`` (default standard error) when it is a terminal; a no-op otherwise.
    ``total``: tasks (``unit``) whose completion fills the bar, or None (a counter of simulations)."""

    WIDTH = 20
    EVERY = 0.1      # seconds between redraws

    def __init__(self, label: str, total: int | None = None, unit: str = "points", stream=None):
        self.stream = sys.stderr if stream is None else stream
        self.on = bool(getattr(self.stream, "isatty", lambda: False)())
        self.label, self.total, self.unit = label, total, unit
        self.done = self.sims = 0
        self.start = self.last = time.monotonic()
        self.drawn = False

    def task(self, n: int = 1) -> None:
        """``n`` tasks finished (the backends' progress callback)."""
        self.done += n
        self._draw()

    def simulation(self, n: int = 1) -> None:
        """``n`` simulations finished (the ``tick`` listener)."""
        self.sims += n
        self._draw()

    def line(self) -> str:
        el = time.monotonic() - self.start
        rate = f"{self.sims / el:.2f}/s" if el > 0 else "?/s"
        if not self.total:
            return f"{self.label}: {self.sims} simulations [{_clock(el)}, {rate}]"
        frac = min(self.done / self.total, 1.0)
        fill = int(frac * self.WIDTH)
        eta = _clock(el / frac - el) if frac > 0 else "?"
        return (f"{self.label} {100 * frac:3.0f}%|{'#' * fill}{' ' * (self.WIDTH - fill)}| {self.done}/{self.total} "
                f"{self.unit} [{_clock(el)}<{eta}, {self.sims} simulations, {rate}]")

    def _draw(self, force: bool = False) -> None:
        if not self.on:
            return
        now = time.monotonic()
        if not force and now - self.last < self.EVERY and self.drawn:
            return
        self.last, self.drawn = now, True
        self.stream.write("\r" + self.line() + "\x1b[K")
        self.stream.flush()

    def close(self) -> None:
        if self.on and self.drawn:
            self._draw(force=True)
            self.stream.write("\n")
            self.stream.flush()

    def __enter__(self):
        self._listening = listen(self.simulation)
        self._listening.__enter__()
        self._draw(force=True)
        return self

    def __exit__(self, *exc):
        self._listening.__exit__(*exc)
        self.close()
