"""Rows of one run's per-request columns (`metrics.requests_columns`), selected without pandas: a
selection keeps the row numbers and takes a column the first time it is read."""
from __future__ import annotations

import numpy as np


class Rows:
    """Some rows of ``cols`` (a dict of equally long arrays): all of them (``index`` None) or those
    at ``index`` (increasing row numbers). ``rows["ttft_s"]`` is that column's values at these rows."""

    def __init__(self, cols: dict, index: np.ndarray | None = None):
        self.cols, self.index, self._taken = cols, index, {}

    def __len__(self) -> int:
        return len(self.cols["arrival_s"]) if self.index is None else int(self.index.size)

    def __contains__(self, name: str) -> bool:
        return name in self.cols

    def __getitem__(self, name: str) -> np.ndarray:
        if self.index is None:
            return self.cols[name]
        col = self._taken.get(name)
        if col is None:
            col = self._taken[name] = self.cols[name][self.index]
        return col

    def where(self, mask: np.ndarray) -> Rows:
        """The rows of these at which ``mask`` (one bool per row of these) is true (these, when all)."""
        if mask.all():
            return self
        return Rows(self.cols, np.flatnonzero(mask) if self.index is None else self.index[mask])
