"""Highest sustainable arrival rate meeting the SLOs, by bracketing and bisection on the rate.

A rate passes when the run is not saturated, nothing is rejected and every SLO target is met
(`evaluate.verdict`). Latency grows with load, so pass/fail is monotone in the rate up to sampling
noise; with a fixed seed the search is deterministic. Bisection is geometric (on log rate) and stops
when hi / lo < 1 + tol.
"""
from __future__ import annotations

import math
from dataclasses import replace

from .evaluate import simulate_summary, summary_row, verdict

MAX_STEPS = 12


def max_rate_task(arg) -> dict:
    """Task: (index, SimConfig with .slo, tol, margin) -> one flat row for that grid point."""
    index, cfg, tol, margin = arg
    return search_max_rate(cfg, tol=tol, margin=margin) | {"point": index}


def search_max_rate(cfg, tol: float = 0.05, margin: float = 0.0, start: float | None = None) -> dict:
    """The highest rate of one configuration ``cfg`` meeting its SLOs (`servesim.find_max_rate` runs it
    per grid point): one flat row, ``max_rate``, ``first_failing_rate``, ``limited_by``, ``simulations``."""
    from ..options import default_rate
    from ..workload import load_workload
    sims = 0
    cache: dict[float, tuple] = {}

    def run(rate):
        nonlocal sims
        if rate not in cache:
            sims += 1
            status, out = simulate_summary(replace(cfg, rate=rate))
            if status != "ok":
                cache[rate] = (status, out, False, [out])
            else:
                ok, reasons, _ = verdict(out, margin)
                cache[rate] = (status, out, ok, reasons)
        return cache[rate]

    if start is None:
        start = cfg.rate if cfg.rate is not None else default_rate(load_workload(cfg.workload))
    status, out, ok, reasons = run(start)
    if status != "ok":
        return _row(cfg, status, out, None, None, None, sims, reasons)
    lo = hi = None
    if ok:
        lo = start
        r = start
        for _ in range(MAX_STEPS):
            r *= 2.0
            if not run(r)[2]:
                hi = r
                break
            lo = r
        if hi is None:   # never failed: report the largest tried
            return _row(cfg, "ok", run(lo)[1], lo, None, "no limit found up to this rate", sims, [])
    else:
        hi = start
        r = start
        for _ in range(MAX_STEPS):
            r /= 2.0
            if run(r)[2]:
                lo = r
                break
            hi = r
        if lo is None:
            st, out, _, reasons = run(hi)
            return _row(cfg, "no_rate", out if st == "ok" else None, None, hi, "; ".join(reasons), sims, reasons)
    while hi / lo > 1.0 + tol:
        mid = float(f"{math.sqrt(lo * hi):.6g}")
        if mid in (lo, hi):
            break
        if run(mid)[2]:
            lo = mid
        else:
            hi = mid
    limit = "; ".join(run(hi)[3])
    return _row(cfg, "ok", run(lo)[1], lo, hi, limit, sims, [])


def _row(cfg, status, summary, max_rate, fail_rate, limit, sims, reasons) -> dict:
    from ..options import plain
    if isinstance(summary, dict):
        base = summary_row(summary)
    else:
        base = plain(cfg)
    row = {"point": None, "status": status if max_rate is not None or status != "ok" else "no_rate",
           "error": summary if isinstance(summary, str) else "", **base}
    row.update({"max_rate": max_rate, "first_failing_rate": fail_rate, "limited_by": limit or "",
                "simulations": sims})
    if status in ("infeasible", "error"):
        row["error"] = reasons[0] if reasons else ""
    return row
