"""Typed results of the Python API: small frozen dataclasses, a summary dict and pandas frames.

Each ``to_json()`` is exactly what the matching command prints with ``--format json``. `SweepResult`
and `PlanResult` are defined where they are made (`planning.sweep`, `planning.common`) and read here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:   # pandas loads with the first result, not with `import servesim`
    import pandas as pd


from ..outputs.jsonout import dumps, records  # noqa: E402,F401  (the JSON of every result)
from ..planning.common import PlanResult  # noqa: E402,F401  (defined once, with the plan)
from ..planning.sweep import SweepResult  # noqa: E402,F401  (defined once, with the sweep)


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
