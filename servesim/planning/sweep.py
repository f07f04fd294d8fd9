"""`servesim sweep`: every (grid point x rate) a full simulation; a tidy table, one row per point."""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError
from .backends import Backend
from .evaluate import LEAD, point_row
from .grid import expand
from .maxrate import max_rate_task

KNEE_FACTOR = 2.0


@dataclass(frozen=True)
class SweepResult:
    """What `run_sweep` / `run_max_rate` (and so `servesim.sweep`, `servesim.find_max_rate`) return.

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
        User errors found while running a point: (point index, message), in point order.
    mode : str
        ``"sweep"`` or ``"max-rate"``.
    """
    points: object      # pandas.DataFrame (pandas loads with the first result, not with `import servesim`)
    grid: tuple = ()
    errors: tuple = ()
    mode: str = "sweep"

    @property
    def first_error(self) -> str | None:
        return self.errors[0][1] if self.errors else None

    @property
    def summary(self) -> dict:
        """Counts of points per status, the grid keys and the errors."""
        counts = self.points["status"].value_counts().to_dict() if len(self.points) else {}
        return {"mode": self.mode, "grid": list(self.grid), "num_points": len(self.points),
                "status": {str(k): int(v) for k, v in counts.items()},
                "errors": [{"point": p, "message": m} for p, m in self.errors]}

    def as_dict(self, files=()) -> dict:
        from ..outputs.jsonout import records
        return {"mode": self.mode, "grid": list(self.grid), "points": records(self.points),
                "errors": [{"point": p, "message": m} for p, m in self.errors],
                "files": [str(p) for p in files]}

    def to_json(self, files=()) -> str:
        """The JSON of ``servesim sweep --format json`` (``files``: what ``-o`` wrote)."""
        from ..outputs.jsonout import dumps
        return dumps(self.as_dict(files))


def validate_base(base, grid) -> None:
    """Fail fast, before anything runs: every grid point's options (`checks.check_sim_config`), then
    what needs the model, preset and workload loaded (`api.resolve`), once per distinct point."""
    from dataclasses import replace
    from ..api import resolve
    from ..checks import check_sim_config
    seen = set()
    for point in expand(base, grid, None):
        point = check_sim_config(point)
        key = replace(point, rate=None, seed=0, price=None)
        if key not in seen:
            seen.add(key)
            resolve(point)


def _table(rows: list[dict]):
    import pandas as pd
    df = pd.DataFrame(rows)
    cols = [c for c in LEAD if c in df.columns] + [c for c in df.columns if c not in LEAD]
    return df[cols].sort_values("point", kind="stable").reset_index(drop=True)


def _collect(rows, grid_keys, mode) -> SweepResult:
    df = _table(rows)
    errors = [(int(r.point), r.error) for r in df.itertuples() if r.status == "error"]
    if not errors and len(df) and (df.status == "infeasible").all():
        errors.append((0, "no feasible configuration in the grid: " + df.error.iloc[0]))
    return SweepResult(df, tuple(grid_keys), tuple(errors), mode)


def run_sweep(base, grid, rates, backend: Backend | None = None, progress=None) -> SweepResult:
    """Simulate every point; user errors at a point are recorded (status 'error'), not raised."""
    validate_base(base, grid)
    points = expand(base, grid, rates)
    backend = backend or Backend()
    rows = backend.map(point_row, list(enumerate(points)), progress)
    res = _collect(rows, [k for k, _ in grid], "sweep")
    if rates is not None and len(res.points):
        res.points["knee"] = knee_flags(res.points, list(res.grid))
    return res


def run_max_rate(base, grid, backend: Backend | None = None, tol: float = 0.05, margin: float = 0.0,
                 progress=None) -> SweepResult:
    """Per grid point, the highest sustainable rate meeting the SLOs (`maxrate.search_max_rate`)."""
    if not base.slo:
        raise ConfigError("--find-max-rate needs --slo, e.g. --slo ttft_p99=1s,tpot_p99=60ms")
    if base.offline or base.concurrency is not None:
        raise ConfigError("--find-max-rate searches the open-loop --rate; drop --offline / --concurrency")
    if not 0 < tol < 1:
        raise ConfigError(f"--tolerance must be in (0, 1), got {tol}")
    validate_base(base, grid)
    points = expand(base, grid, None)
    backend = backend or Backend()
    rows = backend.map(max_rate_task, [(i, p, tol, margin) for i, p in enumerate(points)], progress)
    return _collect(rows, [k for k, _ in grid], "max-rate")


def knee_flags(df, grid_keys):
    """Per grid combination, True at the knee: the highest rate whose TTFT p99 is still within
    KNEE_FACTOR x its value at the lowest rate swept and that is not saturated (the end of the flat
    region of the latency-load curve)."""
    import pandas as pd
    flags = pd.Series(False, index=df.index)
    if "ttft_ms_p99" not in df.columns:
        return flags
    ok = df[df.status == "ok"]
    groups = ok.groupby(grid_keys, sort=False, dropna=False) if grid_keys else [((), ok)]
    for _, g in groups:
        g = g.sort_values("rate")
        if g.empty:
            continue
        base = g.ttft_ms_p99.iloc[0]
        flat = g[(g.ttft_ms_p99 <= KNEE_FACTOR * base) & (~g.saturated.astype(bool))]
        if len(flat):
            flags.loc[flat.index[-1]] = True
    return flags


def write_table(df, outdir, stem: str = "sweep") -> list:
    from pathlib import Path
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    paths = [outdir / f"{stem}.csv"]
    df.to_csv(paths[0], index=False)
    try:
        import pyarrow  # noqa: F401
        p = outdir / f"{stem}.parquet"
        df.to_parquet(p, index=False)
        paths.append(p)
    except ImportError:
        pass
    return paths
