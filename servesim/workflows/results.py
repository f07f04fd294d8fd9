"""Typed results of the Python API: small frozen dataclasses, a summary dict and pandas frames.

Each ``to_json()`` is exactly what the matching command prints with ``--format json``.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:   # pandas loads with the first result, not with `import servesim`
    import pandas as pd


def records(df: pd.DataFrame) -> list[dict]:
    """A frame as JSON-ready records (NaN -> None, numpy scalars -> Python), as the CLI prints them."""
    return json.loads(df.to_json(orient="records"))


def _plain(x):
    import numpy as np
    if isinstance(x, (np.floating, np.integer, np.bool_)):
        return x.item()
    raise TypeError(f"not JSON serializable: {type(x).__name__}")


def dumps(obj) -> str:
    return json.dumps(obj, indent=2, default=_plain)


@dataclass(frozen=True)
class SweepResult:
    """What `servesim.sweep` and `servesim.find_max_rate` return.

    Attributes
    ----------
    points : pandas.DataFrame
        One row per point (grid point x rate for a sweep; grid point for a max-rate search):
        ``point``, ``status`` (ok, error, infeasible, no_rate), ``error``, the point's options, then
        every summary metric flattened (``ttft_ms_p99``, ``goodput_requests_per_s``, ...); a sweep adds
        ``knee``, a max-rate search ``max_rate``, ``first_failing_rate``, ``limited_by``, ``simulations``.
    grid : tuple of str
        The grid keys, in the order given.
    errors : tuple of (int, str)
        User errors found while running a point: (point index, message).
    mode : str
        ``"sweep"`` or ``"max-rate"``.
    """
    points: pd.DataFrame
    grid: tuple = ()
    errors: tuple = ()
    mode: str = "sweep"

    @property
    def summary(self) -> dict:
        """Counts of points per status, the grid keys and the errors."""
        counts = self.points["status"].value_counts().to_dict() if len(self.points) else {}
        return {"mode": self.mode, "grid": list(self.grid), "num_points": len(self.points),
                "status": {str(k): int(v) for k, v in counts.items()},
                "errors": [{"point": p, "message": m} for p, m in self.errors]}

    def as_dict(self, files=()) -> dict:
        return {"mode": self.mode, "grid": list(self.grid), "points": records(self.points),
                "errors": [{"point": p, "message": m} for p, m in self.errors],
                "files": [str(p) for p in files]}

    def to_json(self, files=()) -> str:
        """The JSON of ``servesim sweep --format json`` (``files``: what ``-o`` wrote)."""
        return dumps(self.as_dict(files))


@dataclass(frozen=True)
class PlanResult:
    """What `servesim.plan` returns.

    Attributes
    ----------
    best : dict or None
        The cheapest deployment meeting every SLO, checked on another seed and with one replica
        fewer: hardware, dtype, tp, pp, replicas, num_gpus, usd_per_hour,
        usd_per_million_output_tokens, headroom, cost_split, checks, metrics (and daily with
        ``daily_rates``). None when nothing meets (`plan` then raises InfeasibleError).
    candidates : pandas.DataFrame
        Every layout searched, best first, one flat row each (``candidates.csv``).
    summary : dict
        The whole plan as ``servesim plan --format json`` prints it (``plan.json``).
    """
    best: dict | None
    candidates: pd.DataFrame
    summary: dict = field(repr=False)

    @property
    def why_not(self) -> str | None:
        return self.summary.get("why_not")

    def to_json(self) -> str:
        return dumps(self.summary)


@dataclass(frozen=True)
class CostResult:
    """What `servesim.cost` returns.

    Attributes
    ----------
    summary : dict
        As ``servesim cost --format json``: model, hardware, layout, batch, ``time_ms``,
        ``interval_ms``, ``parts_ms``, ``bound``, ``bottleneck``, ``flops``, ``bytes``, ``memory``,
        ``tokens_per_s``.
    breakdown : pandas.DataFrame
        One row per operator class: ``part``, ``time_ms``, ``share`` (of the iteration), ``bound``.
    """
    summary: dict
    breakdown: pd.DataFrame

    def to_json(self) -> str:
        return dumps(self.summary)


@dataclass(frozen=True)
class TrainingResult:
    """What `servesim.train` returns.

    Attributes
    ----------
    mode : str
        ``"layout"`` (one layout), ``"search"`` (the fastest layouts that fit) or ``"scaling"``
        (a list of GPU counts).
    summary : dict
        The layout's (or the best layout's) step time, tokens/s, MFU, HFU, breakdown and memory;
        for scaling, ``{"scaling": "weak" | "strong"}``.
    table : pandas.DataFrame or None
        The alternatives (search) or one row per GPU count (scaling); None for one layout.
    """
    mode: str
    summary: dict
    table: pd.DataFrame | None = None

    def as_dict(self) -> dict:
        if self.mode == "scaling":
            return {"scaling": self.summary["scaling"], "rows": self.table.to_dict(orient="records")}
        if self.mode == "search":
            return {"best": self.summary, "alternatives": self.table.to_dict(orient="records")}
        return self.summary

    def to_json(self) -> str:
        return dumps(self.as_dict())


@dataclass(frozen=True)
class CompareResult:
    """What `servesim.compare` returns.

    Attributes
    ----------
    rows : pandas.DataFrame
        One row per hardware: training layout, MFU, days, GPU-hours and $; the cheapest serving
        deployment meeting the SLO (``serve_config``), its $ per million output tokens and capacity
        headroom; the break-even in served output tokens.
    summary : dict
        ``model`` and ``train_tokens``.
    """
    rows: pd.DataFrame
    summary: dict

    def to_json(self) -> str:
        rows = [{k: (None if isinstance(v, float) and v != v else v) for k, v in r.items()}   # NaN -> null
                for r in self.rows.to_dict(orient="records")]
        return dumps({**self.summary, "rows": rows})


@dataclass(frozen=True)
class CalibrateResult:
    """What `servesim.calibrate` returns (the profiles and the report are written).

    Attributes
    ----------
    summary : dict
        ``profile``; ``values`` and ``base_values`` (the fitted hardware keys, file units);
        ``engine`` (the fitted engine keys, or None); ``output``, ``engine_output``, ``report``
        (the files written); ``warnings`` and ``notes``.
    residuals : pandas.DataFrame
        Per measured row: profile, kind, group, label, source, measured, predicted, rel_error.
    holdout : pandas.DataFrame
        Held-out refits: profile, kind, held_out, n, median_rel_err, p90_rel_err, note.
    """
    summary: dict
    residuals: pd.DataFrame
    holdout: pd.DataFrame

    def to_json(self) -> str:
        return dumps(self.summary)


@dataclass(frozen=True)
class ValidateResult:
    """What `servesim.validate` returns.

    Attributes
    ----------
    suites : list of dict
        One per suite, as ``servesim validate --format json``: suite, tolerance, pass, n,
        median_rel_err, p90_rel_err, checked, groups.
    rows : pandas.DataFrame
        Every row of every suite: suite, gpu, metric, label, measured, predicted, rel_error.
    failed : tuple of str
        What exceeded its tolerance (``servesim validate --check`` exits 2 when not empty).
    """
    suites: list
    rows: pd.DataFrame
    failed: tuple = ()

    @property
    def passed(self) -> bool:
        return not self.failed

    def to_json(self) -> str:
        return dumps(self.suites)
