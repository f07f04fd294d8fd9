"""Resumable sweeps: each finished point saved at once, skipped by a rerun with identical inputs.

`PointStore` keeps one JSON file per point under ``<output>/points/``, named by a hash of everything
the point's result depends on: the task, its arguments (every SimConfig field, price included, and
the bisection's tolerance and margin), the content of the files named by path (model, hardware,
engine, workload) and servesim's code and shipped data. `Checkpointed` wraps a backend: points found
in the store are not run again; the others are saved as each finishes. User-error points are not
saved (they are quick to find again). Fresh and resumed rows pass through the same JSON round trip,
so a resumed sweep writes the same table as an uninterrupted one.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
from pathlib import Path

from ..version import __version__

POINTS = "points"


@functools.lru_cache(maxsize=1)
def code_digest() -> str:
    """servesim's Python sources and shipped data files (hardware, engines, workloads, models, traces)."""
    from .. import paths
    h = hashlib.sha256(__version__.encode())
    root = Path(__file__).resolve().parent.parent
    files = sorted(root.rglob("*.py"))
    for d in (paths.hardware_dir(), paths.engines_dir(), paths.workloads_dir()):
        files += sorted(p for p in Path(d).rglob("*") if p.is_file() and p.suffix in (".toml", ".json", ".csv"))
    for p in files:
        h.update(str(p.name).encode())
        h.update(p.read_bytes())
    return h.hexdigest()


def _file_digest(value) -> str | None:
    try:
        p = Path(value)
        if p.is_file():
            return hashlib.sha256(p.read_bytes()).hexdigest()
    except (OSError, TypeError, ValueError):
        pass
    return None


def _plain(x):
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return {f.name: _plain(getattr(x, f.name)) for f in dataclasses.fields(x)}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, float) and not math.isfinite(x):
        return repr(x)
    return x


def _json_default(x):
    if hasattr(x, "item"):
        return x.item()
    if isinstance(x, Path):
        return str(x)
    raise TypeError(f"not JSON: {type(x).__name__}")


def roundtrip(row: dict) -> dict:
    return json.loads(json.dumps(row, default=_json_default))


class PointStore:
    def __init__(self, folder):
        self.folder = Path(folder)

    def key(self, fn, args: tuple) -> str:
        files = {}
        for a in args:
            if dataclasses.is_dataclass(a):
                for name in ("model", "hardware", "engine", "workload"):
                    v = getattr(a, name, None)
                    d = _file_digest(v) if isinstance(v, str) else None
                    if d:
                        files[f"{name}={v}"] = d
        blob = {"task": f"{fn.__module__}.{fn.__qualname__}", "args": _plain(list(args)), "files": files,
                "code": code_digest()}
        return hashlib.sha256(json.dumps(blob, sort_keys=True, default=str).encode()).hexdigest()[:32]

    def path(self, key: str) -> Path:
        return self.folder / f"{key}.json"

    def get(self, key: str) -> dict | None:
        try:
            return json.loads(self.path(key).read_text())
        except (OSError, ValueError):
            return None      # absent, or unreadable: run the point again

    def put(self, key: str, row: dict) -> None:
        from ..outputs.atomic import write_text_atomic   # no partial file on an interrupt mid-write
        write_text_atomic(self.path(key), json.dumps(row, default=_json_default) + "\n")

    def count(self) -> int:
        return sum(1 for _ in self.folder.glob("*.json")) if self.folder.is_dir() else 0


class Checkpointed:
    """A backend wrapper: items are (point index, *task arguments); cached points are not run."""

    def __init__(self, inner, store: PointStore):
        self.inner, self.store = inner, store
        self.total = self.reused = self.saved = 0

    def map(self, fn, items, progress=None, on_result=None):
        items = list(items)
        keys = [self.store.key(fn, tuple(x[1:])) for x in items]
        out: list = [None] * len(items)
        todo = []
        for i, (x, k) in enumerate(zip(items, keys)):
            row = self.store.get(k)
            if row is not None and row.get("status") != "error":
                out[i] = row | {"point": x[0]}
                self.reused += 1
                if progress:
                    progress(1)
            else:
                todo.append(i)
        self.total += len(items)

        def finished(j, row):
            i = todo[j]
            if row.get("status") != "error":
                self.store.put(keys[i], row)
                self.saved += 1
            out[i] = roundtrip(row)
            if on_result:
                on_result(i, out[i])

        self.inner.map(fn, [items[i] for i in todo], progress, on_result=finished)
        return out

    def describe(self) -> tuple[list[str], list[str]]:
        done = self.reused + self.saved
        present = [f"{done} of {self.total or '?'} points computed, one file each in {POINTS}/ "
                   f"({self.saved} by this run)"]
        return present, []
