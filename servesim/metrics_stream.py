"""The summary of a streamed run (`--stream`): running totals and log-binned histograms, no request table.

`StreamStats.add` takes each block of ended requests the chunked kernel hands out (arrival order,
engine/stream.py) and keeps only what the summary needs: per batch of consecutive measured arrivals
(`BATCHES` of them) a histogram (`loghist`) and totals of each latency, the ITL sums and the SLO
counts; per equal bin of the measurement window the completions and tokens (throughput); and the
counts the saturation verdict reads (`metrics.growth_verdict`: the judged window's bounds are known
before the run from the arrival stream, `workload.stream.arrival_marks`). Memory is fixed.

Against the exact summary (`metrics.summarize`) of the same run:

* counts, rates, totals, the saturation evidence and verdict are the same figures (the queueing
  delay's slope is fitted from running sums instead of `np.polyfit`: equal to rounding);
* a latency percentile is within `loghist.REL_ERROR` (0.5%) of the exact one; the ITL block is the
  kernel's gap histogram in both;
* 95% intervals come from `BATCHES` separate batches of consecutive arrivals (batch means, Student-t
  on BATCHES - 1 degrees of freedom) where the exact path chooses its batch size from the series'
  autocorrelation (`intervals.batch_size`), which needs the series: with autocorrelation longer than
  a batch (n / 30 requests) these intervals are too narrow. Throughput intervals use `BATCHES` equal
  bins of the window as batches. Quantile bounds are order statistics of the histogram.
"""
from __future__ import annotations

import math

import numpy as np

from . import intervals as CI
from . import loghist as H
from .engine import codes as C
from .engine import kernel as K
from .engine.state import OUTPUT_FIELDS, output_columns
from .metrics import (PCTS, SATURATED, SLO_COLUMN, cost_block, growth_verdict, histogram_describe, meets_slo,
                      slo_report, time_shares, utilization)

BATCHES = CI.K_MAX           # 30
LATENCIES = ("ttft", "tpot", "e2e", "queue")


def _bincount(b: np.ndarray, w=None) -> np.ndarray:
    return np.bincount(b, weights=w, minlength=BATCHES).astype(np.float64)


class _Slope:
    """Least-squares slope of y on x from merged per-block moments (Chan et al. 1979, pairwise update)."""

    def __init__(self):
        self.n, self.mx, self.my, self.cxx, self.cxy = 0, 0.0, 0.0, 0.0, 0.0

    def add(self, x: np.ndarray, y: np.ndarray) -> None:
        m = x.size
        if m == 0:
            return
        mx, my = float(x.mean()), float(y.mean())
        cxx, cxy = float(((x - mx) ** 2).sum()), float(((x - mx) * (y - my)).sum())
        n = self.n + m
        dx, dy = mx - self.mx, my - self.my
        self.cxx += cxx + dx * dx * self.n * m / n
        self.cxy += cxy + dx * dy * self.n * m / n
        self.mx += dx * m / n
        self.my += dy * m / n
        self.n = n

    def slope(self) -> float:
        return self.cxy / self.cxx if self.cxx > 0 else 0.0


class StreamStats:
    """Running totals of a streamed open-loop run of ``n`` requests: measured from index ``i0`` (the
    first arrival at or after the warm-up, ``t0`` the window's start), the judged window's middle
    and last arrival ``t_mid``, ``t1``; ``frontend`` s between a send and the engine; ``slo`` a parsed Slo."""

    def __init__(self, n: int, i0: int, t0: float, t_mid: float, t1: float, frontend: float, slo):
        self.n, self.i0, self.t0, self.t_mid, self.t1 = n, i0, t0, t_mid, t1
        self.frontend, self.slo = frontend, slo or {}
        self.blen = max(1, -(-(n - i0) // BATCHES))
        z = lambda: np.zeros(BATCHES)  # noqa: E731
        self.hist = {m: np.zeros((BATCHES, H.NBINS), np.int64) for m in LATENCIES}
        self.sum = {m: z() for m in LATENCIES}
        self.count = {m: z() for m in LATENCIES}
        self.itl_num, self.itl_den, self.slo_ok, self.done_measured = z(), z(), z(), z()
        self.bins = {k: z() for k in ("requests", "input", "output", "ok")}      # completions per window bin
        self.c = dict.fromkeys(("seen", "done", "rejected", "unfinished", "done_in", "done_out", "after",
                                "after_out", "arrivals_after", "queued_w", "adm_w", "dep_w", "arrived",
                                "fin_le", "queued_le", "adm_le", "late"), 0)
        self.max_finish, self.min_arrival = -math.inf, math.inf
        self.slope = _Slope()

    def add(self, rec, base: int) -> None:
        """Take ended (or, at the end, every remaining) requests ``rec`` (`state.request_dtype` records)
        of indices base, base + 1, ..."""
        m = rec.shape[0]
        idx = base + np.arange(m)
        f = output_columns(rec, OUTPUT_FIELDS)     # contiguous copies: read many times below
        st, eng, sched, first, fin = f["status"], f["arrival"], f["scheduled"], f["first_token"], f["finish"]
        arr = eng - self.frontend
        prompt, out = np.ascontiguousarray(rec.prompt), np.ascontiguousarray(rec.output)
        done, rej = st == C.DONE, st == C.REJECTED
        c = self.c
        c["seen"] += m
        c["done"] += int(done.sum())
        c["rejected"] += int(rej.sum())
        c["unfinished"] += int((~done & ~rej).sum())
        dm = done & (idx >= self.i0)
        b = np.clip((idx - self.i0) // self.blen, 0, BATCHES - 1)
        with np.errstate(invalid="ignore"):
            cols = {"ttft_s": np.where(done, first - arr, np.nan), "e2e_s": np.where(done, fin - arr, np.nan),
                    "queue_s": sched - eng, "max_gap_s": f["max_gap"],
                    "tpot_s": np.where(done & (out > 1), (fin - first) / np.maximum(out - 1, 1), np.nan)}
        for name in LATENCIES:
            x = cols[SLO_COLUMN[name]]
            sel = dm & np.isfinite(x)
            bs, xs = b[sel], x[sel]
            self.hist[name] += np.bincount(bs * H.NBINS + H.bin_of(xs), minlength=BATCHES * H.NBINS
                                           ).reshape(BATCHES, H.NBINS)
            self.sum[name] += _bincount(bs, xs)
            self.count[name] += _bincount(bs)
        multi = dm & (out > 1)
        self.itl_num += _bincount(b[multi], (fin - first)[multi])
        self.itl_den += _bincount(b[multi], (out - 1)[multi].astype(np.float64))
        ok = meets_slo(self.slo, cols) if self.slo else np.ones(m, bool)
        self.done_measured += _bincount(b[dm])
        self.slo_ok += _bincount(b[dm & ok])
        # completions in the window [t0, t1], binned by finish time (throughput and goodput)
        win = max(self.t1 - self.t0, 1e-12)
        dl = done & (fin >= self.t0) & (fin <= self.t1)
        tb = np.clip(((fin[dl] - self.t0) / win * BATCHES).astype(np.int64), 0, BATCHES - 1)
        for key, w in (("requests", None), ("input", prompt[dl].astype(np.float64)),
                       ("output", out[dl].astype(np.float64)), ("ok", ok[dl].astype(np.float64))):
            self.bins[key] += _bincount(tb, w)
        # the whole run, the drain after the last arrival
        c["done_in"] += int(prompt[done].sum())
        c["done_out"] += int(out[done].sum())
        if done.any():
            self.max_finish = max(self.max_finish, float(fin[done].max()))
        sent = arr[np.isfinite(arr)]
        if sent.size:
            self.min_arrival = min(self.min_arrival, float(sent.min()))
        after = done & (fin > self.t1)
        c["after"] += int(after.sum())
        c["after_out"] += int(out[after].sum())
        c["arrivals_after"] += int((arr > self.t1).sum())
        # the saturation evidence over the judged window (t_mid, t1] (metrics._queue_growth)
        lo, hi = self.t_mid, self.t1
        queued = ~rej
        adm = sched - self.frontend
        admitted = queued & np.isfinite(adm)
        in_w = (arr > lo) & (arr <= hi)
        c["queued_w"] += int((queued & in_w).sum())
        c["adm_w"] += int((admitted & (adm > lo) & (adm <= hi)).sum())
        c["dep_w"] += int((dm & (fin > lo) & (fin <= hi)).sum())
        c["arrived"] += int((arr <= hi).sum())
        c["fin_le"] += int((dm & (fin <= hi)).sum())
        c["queued_le"] += int((queued & (arr <= hi)).sum())
        c["adm_le"] += int((admitted & (adm <= hi)).sum())
        late = admitted & in_w
        c["late"] += int(late.sum())
        self.slope.add(arr[late] - lo, cols["queue_s"][late])

    # ------------------------------------------------------------------ the summary
    def _describe(self, name: str) -> dict:
        """`metrics.describe` from the batches' histograms and totals (ms)."""
        hb = self.hist[name]
        counts = hb.sum(axis=0)
        n = int(counts.sum())
        keys = ["mean"] + [f"p{p}" for p in PCTS]
        if n == 0:
            return {k: None for k in keys} | {"ci95": {k: [None, None] for k in keys}}
        out = {"mean": float(self.sum[name].sum() / n) * 1e3}
        ci = {"mean": _ms(CI.totals_ratio_ci(self.sum[name], self.count[name]))}
        cum, mid = np.cumsum(counts), H.middles()
        for p in PCTS:
            q = p / 100.0
            xq = H.quantile(counts, q)
            out[f"p{p}"] = xq * 1e3
            ci[f"p{p}"] = _ms(_quantile_ci(hb, cum, mid, n, q, xq))
        out["ci95"] = ci
        return out

    def summary(self, end, *, warmup: float, replicas: int, num_gpus_per_replica: int, usd_per_gpu_hour: float,
                peak_flops: float, hbm_bw: float, num_blocks: int, stopped: str | None = None) -> dict:
        """The summary dict of `metrics.summarize` (its keys, in its order) plus ``stream``; ``end`` the
        chunked run's `engine.stream.StreamEnd`; ``stopped``: why the run was stopped early (saturated)."""
        c, s = self.c, end.stats
        unsent = self.n - c["seen"]            # never sent: the run was stopped first
        n_gpus = num_gpus_per_replica * replicas
        t0, t1 = self.t0, self.t1
        window = max(t1 - t0, 1e-12)
        thr = self._throughput(window, n_gpus)
        thr["offered_requests_per_s"] = (self.n - self.i0) / window
        span = max(self.max_finish - self.min_arrival if c["done"] else 0.0, 1e-12)
        thr |= {"window_s": [t0, t1], "whole_run": {
            "requests_per_s": c["done"] / span, "input_tokens_per_s": c["done_in"] / span,
            "output_tokens_per_s": c["done_out"] / span, "total_tokens_per_s": (c["done_in"] + c["done_out"]) / span,
            "duration_s": span}}
        last = self.max_finish if c["done"] else t1
        drain = {"start_s": t1, "duration_s": max(last - t1, 0.0), "requests": c["after"],
                 "output_tokens": c["after_out"], "arrivals": c["arrivals_after"]}
        metrics = {name + "_ms": self._describe(name) for name in ("ttft", "tpot")}
        itl_mean = float(self.itl_num.sum() / self.itl_den.sum()) if self.itl_den.sum() else float("nan")
        metrics["itl_ms"] = histogram_describe(end.gap_hist, itl_mean) | {"ci95": {
            "mean": _ms(CI.totals_ratio_ci(self.itl_num, self.itl_den))} | {f"p{p}": [None, None] for p in PCTS}}
        metrics |= {name + "_ms": self._describe(name) for name in ("e2e", "queue")}
        late = c["late"] >= 50 and self.slope.cxx > 0
        growth, verdict, reason = growth_verdict(
            self.n - self.i0 - (self.n - self.i0) // 2, c["queued_w"] + unsent, c["adm_w"], c["dep_w"],
            c["arrived"] + unsent - c["fin_le"], c["queued_le"] + unsent - c["adm_le"], c["arrived"] + unsent,
            self.slope.slope() if late else 0.0, t1 > self.t_mid)
        unfinished = c["unfinished"] + unsent
        if unfinished:
            verdict, reason = SATURATED, stopped or f"stopped by --duration with {unfinished} requests unfinished"
        slo = self.slo
        report = slo_report(slo, metrics)
        done_m = float(self.done_measured.sum())
        return {
            "num_requests": int(self.n), "num_measured": int(self.n - self.i0), "num_completed": int(c["done"]),
            "num_rejected": int(c["rejected"]), "saturated": verdict == SATURATED, "saturation_verdict": verdict,
            "saturation_reason": reason, "queue_growth": growth, "duration_s": float(s[K.STAT_END_TIME]),
            **metrics,
            "throughput": thr,
            "cost": cost_block(thr, usd_per_gpu_hour * n_gpus, usd_per_gpu_hour),
            "utilization": utilization(s, replicas=replicas, num_blocks=num_blocks, n_gpus=n_gpus,
                                       peak_flops=peak_flops, hbm_bw=hbm_bw),
            "time_share": time_shares(s),
            "iterations": int(s[K.STAT_ITERATIONS]), "preemptions": int(s[K.STAT_PREEMPTIONS]),
            "slo": report,
            "slo_attainment": float(self.slo_ok.sum() / done_m) if done_m and slo else None,
            "goodput_requests_per_s": float(self.bins["ok"].sum() / window) if slo else None,
            "drain": drain,
            "stream": {"chunks": int(end.chunks), "peak_requests_held": int(end.peak_window),
                       "histogram_relative_bin_width": H.REL_WIDTH, "quantile_relative_error": H.REL_ERROR,
                       "ci": f"batch means over {BATCHES} batches of consecutive measured arrivals "
                             f"({self.blen} requests each); throughput over {BATCHES} equal bins of the window",
                       "records": None},
        }

    def _throughput(self, window: float, n_gpus: int) -> dict:
        """`metrics._throughput` of the completions in the window, intervals over its bins."""
        b = self.bins
        width = np.full(BATCHES, window / BATCHES)
        rates = {"requests_per_s": b["requests"], "input_tokens_per_s": b["input"],
                 "output_tokens_per_s": b["output"], "total_tokens_per_s": b["input"] + b["output"]}
        ci = {}
        for k, v in rates.items():
            lo, hi = CI.totals_ratio_ci(v, width) if b["requests"].sum() else (None, None)
            ci[k] = [None if lo is None else max(lo, 0.0), hi]
        ci["output_tokens_per_s_per_gpu"] = [None if v is None else v / n_gpus for v in ci["output_tokens_per_s"]]
        out = {k: float(v.sum()) / window for k, v in rates.items()}
        return {"requests_per_s": out["requests_per_s"], "input_tokens_per_s": out["input_tokens_per_s"],
                "output_tokens_per_s": out["output_tokens_per_s"],
                "output_tokens_per_s_per_gpu": out["output_tokens_per_s"] / n_gpus,
                "total_tokens_per_s": out["total_tokens_per_s"],
                "ci95": {k: ci[k] for k in ("requests_per_s", "input_tokens_per_s", "output_tokens_per_s",
                                            "output_tokens_per_s_per_gpu", "total_tokens_per_s")}}


def _quantile_ci(hb: np.ndarray, cum: np.ndarray, mid: np.ndarray, n: int, q: float, xq: float):
    """`intervals.quantile_ci` from the batches' histograms: order statistics at ranks n q -/+ t n se,
    se that of the share of values <= x_q over the batches (never below the independent one)."""
    if n < CI.MIN_VALUES:
        return None, None
    below = hb[:, mid <= xq].sum(axis=1).astype(np.float64)
    p, se, k = CI.totals_ratio_se(below, hb.sum(axis=1).astype(np.float64))
    if p is None:
        return None, None
    half = CI._t(k - 1) * n * max(se, math.sqrt(q * (1 - q) / n))
    lo, hi = math.floor(n * q - half), math.ceil(n * q + half)
    return (H.order_stat(cum, mid, lo) if lo >= 0 else None), (H.order_stat(cum, mid, hi) if hi <= n - 1 else None)


def _ms(bounds) -> list:
    return [None if v is None else v * 1e3 for v in bounds]
