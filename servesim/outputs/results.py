"""A simulation's result files: the per-request table (CSV, and Parquet when pyarrow is there), the
summary JSON and its figures (`servesim.figures`)."""
from __future__ import annotations

from pathlib import Path


def write_outputs(res, outdir: Path) -> list[Path]:
    outdir.mkdir(parents=True, exist_ok=True)
    written = []
    p = outdir / "requests.csv"
    res.requests.to_csv(p)
    written.append(p)
    try:
        import pyarrow  # noqa: F401
        p = outdir / "requests.parquet"
        res.requests.to_parquet(p)
        written.append(p)
    except ImportError:
        pass
    p = outdir / "summary.json"
    p.write_text(res.to_json() + "\n")
    written.append(p)
    from ..figures import simulation_figures
    written += simulation_figures(res, outdir)
    return written
