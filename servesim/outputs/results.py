"""A simulation's result files: the per-request table (CSV, and Parquet when pyarrow is there), the
summary JSON and its figures (`servesim.figures`)."""
from __future__ import annotations

from pathlib import Path


class RecordsWriter:
    """A streamed run's per-request records (`engine.stream`), appended to one CSV file chunk by chunk, in
    the columns of `metrics.requests_frame` (None: nothing written). The file is the staging folder's
    (`atomic.OutputDir`): it reaches the output folder only when the command commits."""

    def __init__(self, path, frontend: float):
        self.path, self.frontend, self.f = path, frontend, None

    def __enter__(self):
        if self.path is not None:
            self.f = open(self.path, "w", newline="")
        return self

    def write(self, rec, base: int) -> None:
        if self.f is None:
            return
        import numpy as np
        from types import SimpleNamespace
        from ..metrics import requests_frame
        out = SimpleNamespace(arrival=rec.arrival - self.frontend, scheduled=rec.scheduled,
                              first_token=rec.first_token, finish=rec.finish, preemptions=rec.preemptions,
                              replica=rec.replica, status=rec.status, max_gap=rec.max_gap)
        df = requests_frame(out, rec.prompt, rec.output, self.frontend)
        df.index = np.arange(base, base + len(df))
        df.index.name = "request"
        df.to_csv(self.f, header=base == 0)

    def __exit__(self, *exc):
        if self.f is not None:
            self.f.close()


def write_outputs(res, outdir: Path) -> list[Path]:
    outdir.mkdir(parents=True, exist_ok=True)
    written = []
    p = outdir / "requests.csv"
    if res.requests is None:        # a streamed run: written while it ran (`RecordsWriter`), or not kept
        if p.exists():
            written.append(p)
    else:
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
