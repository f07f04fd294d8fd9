"""Records -> per-request columns (NumPy) -> latency percentiles with confidence intervals, throughput,
goodput, cost; the request table as a pandas DataFrame only when one is asked for (`requests_frame`)."""
from __future__ import annotations

import math
import re
from typing import NamedTuple

import numpy as np

from . import intervals as CI
from .engine import codes as C
from .engine import kernel as K
from .errors import ConfigError
from .long_runs import LONG_ABOVE
from .order import stable_argsort
from .rows import Rows
from .workload.arrivals import DURATION_UNITS

PCTS = (50, 90, 95, 99)
_UNITS = DURATION_UNITS  # us, ms, s, min (or m), h


def parse_duration(text: str, option: str) -> float:
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(" + "|".join(_UNITS) + r")?\s*", text)
    if not m:
        raise ConfigError(f"{option}: cannot read a duration from {text!r}; write e.g. 500ms, 0.5s, 200us or 10min")
    return float(m.group(1)) * _UNITS[m.group(2) or "s"]


def requests_columns(out: K.EngineOutput, prompt, output, frontend: float = 0.0) -> dict:
    """One array per column, one value per request, in the request table's order (`requests_frame`);
    ``status`` holds the codes (`codes.STATUS_NAMES`). ``arrival_s`` is the client's send time; the
    engine receives the request ``frontend`` seconds later (``engine_arrival_s``). TTFT and E2E run
    from the send, queueing from the engine's receipt."""
    arrival = np.asarray(out.arrival, np.float64)
    first, finish = np.asarray(out.first_token, np.float64), np.asarray(out.finish, np.float64)
    output = np.asarray(output, np.int64)
    cols = {"arrival_s": arrival, "engine_arrival_s": arrival + frontend, "scheduled_s": out.scheduled,
            "first_token_s": first, "finish_s": finish, "prompt_tokens": np.asarray(prompt, np.int64),
            "output_tokens": output, "preemptions": out.preemptions, "replica": out.replica,
            "status": out.status, "max_gap_s": out.max_gap}
    done = out.status == C.DONE
    cols["ttft_s"] = np.where(done, first - arrival, np.nan)
    cols["e2e_s"] = np.where(done, finish - arrival, np.nan)
    cols["queue_s"] = cols["scheduled_s"] - cols["engine_arrival_s"]
    multi = done & (output > 1)
    cols["tpot_s"] = np.where(multi, (finish - first) / np.maximum(output - 1, 1), np.nan)
    return cols


def frame_of(cols: dict):
    """The request table (pandas), one row per request, from `requests_columns` (and any columns added
    to them); ``status`` as a categorical of the status names."""
    import pandas as pd
    codes = cols["status"]
    n_codes = max(6, int(np.max(codes)) + 1 if len(codes) else 6)   # "transfer" only when present (PD)
    df = pd.DataFrame(cols)
    df["status"] = pd.Categorical.from_codes(codes, categories=[C.STATUS_NAMES[i] for i in range(n_codes)])
    df.index.name = "request"
    return df


def requests_frame(out: K.EngineOutput, prompt, output, frontend: float = 0.0):
    """The request table (pandas) of one run's records: `frame_of(requests_columns(...))`."""
    return frame_of(requests_columns(out, prompt, output, frontend))


THREADS_ABOVE = LONG_ABOVE      # more requests: the summary's independent series computed on threads


def each(fn, items, threads: int = 1) -> list:
    """``[fn(x) for x in items]``, on up to ``threads`` threads: for functions of their own inputs only
    (the intervals of one series), so the values are the same whatever the threads."""
    items = list(items)
    if threads <= 1 or len(items) <= 1:
        return [fn(x) for x in items]
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(min(threads, len(items)), thread_name_prefix="servesim-metrics") as ex:
        return list(ex.map(fn, items))


LATENCIES = ("ttft", "tpot", "e2e", "queue")


def run_batch_size(done: Rows, threads: int = 1) -> int:
    """Batch size for one run's intervals: the largest chosen from its TTFT, TPOT, E2E and queueing
    series in arrival order (`intervals.batch_size`). All four are read off the same engine state; the
    slow drift of the decode batch shows clearly in TPOT but hardly in E2E's own autocorrelation."""
    cols = [np.asarray(done[f"{c}_s"], np.float64) for c in LATENCIES]
    return max(each(lambda x: CI.batch_size(x[np.isfinite(x)]), cols, threads))


def describe(x_s: np.ndarray, batch: int | None = None) -> dict:
    """mean, p50..p99 in ms, with 95% confidence intervals under "ci95" from batches of `batch`
    values (default: chosen from x's own autocorrelation); x in arrival order. A bound is None when
    there are too few values (`intervals.MIN_VALUES`, or a quantile's rank beyond the sample)."""
    x = np.asarray(x_s, dtype=np.float64)
    finite = np.isfinite(x)
    if not finite.all():
        x = x[finite]
    keys = ["mean"] + [f"p{p}" for p in PCTS]
    if x.size == 0:
        return {k: None for k in keys} | {"ci95": {k: [None, None] for k in keys}}
    b = CI.batch_size(x) if batch is None else batch
    n = x.size
    xs = CI.Ranked(x, [r for p in PCTS for r in CI.quantile_ranks(n, p / 100.0)])   # the values a sort would give
    out = {"mean": float(x.mean()) * 1e3}
    ci = {"mean": _ms(CI.mean_ci(x, b))}
    bounds = {}
    for p in PCTS:
        xq = CI.sorted_quantile(xs, p / 100.0)
        out[f"p{p}"] = xq * 1e3
        bounds[p] = CI.quantile_ci_ranks(x, xq, p / 100.0, b) if n >= CI.MIN_VALUES else (-1, n)
    xs.need(r for pair in bounds.values() for r in pair)
    for p, (lo, hi) in bounds.items():     # (as CI.quantile_ci)
        ci[f"p{p}"] = _ms((float(xs[lo]) if lo >= 0 else None, float(xs[hi]) if hi <= n - 1 else None))
    out["ci95"] = ci
    return out


def _ms(bounds) -> list:
    return [None if v is None else v * 1e3 for v in bounds]


def _itl_ci(done: Rows, batch: int) -> dict:
    """ci95 of the ITL block: the mean's (a ratio, sum(finish - first) / sum(out - 1)); none for the
    percentiles, which come from one histogram of all gaps with no order to batch."""
    d = done.where(done["output_tokens"] > 1)
    num = (d["finish_s"] - d["first_token_s"]).astype(np.float64)
    den = (d["output_tokens"] - 1).astype(np.float64)
    return {"mean": _ms(CI.ratio_ci(num, den, batch))} | {f"p{p}": [None, None] for p in PCTS}


def histogram_describe(hist: np.ndarray, mean_s: float) -> dict:
    """Percentiles of the inter-token gap histogram (log-spaced bins, ~0.5% wide), in ms."""
    total = int(hist.sum())
    keys = ["mean"] + [f"p{p}" for p in PCTS]
    if total == 0:
        return {k: None for k in keys}
    edges = np.logspace(C.GAP_LOG10_MIN, C.GAP_LOG10_MAX, C.GAP_BINS + 1)
    cum = np.cumsum(hist)
    out = {"mean": mean_s * 1e3}
    for p in PCTS:
        target = p / 100.0 * total
        b = int(np.searchsorted(cum, target))
        prev = cum[b - 1] if b > 0 else 0
        frac = (target - prev) / max(hist[b], 1)
        lo, hi = edges[b], edges[b + 1]
        out[f"p{p}"] = float(lo * (hi / lo) ** frac) * 1e3
    return out


def summarize(cols: dict, out: K.EngineOutput, *, warmup: float, slo: dict, num_gpus_per_replica: int,
              replicas: int, usd_per_gpu_hour: float, peak_flops: float, hbm_bw: float, num_blocks: int,
              offered_rate: float | None, stages=None, concurrency: int = 0, num_gpus: int | None = None,
              usd_per_hour: float | None = None, threads: int = 1) -> dict:
    """The summary of one run from its request columns (`requests_columns`). `busy_fraction`: share of time a replica had a micro-batch in flight
    (any work; near 1 whenever requests overlap, whatever the load); `first_stage_busy_fraction` /
    `later_stage_busy_fraction`: share of time the first / each later pipeline stage computed (the
    first includes host time; None without PP). `stages`: ((rate, duration_s), ...) of a load in
    stages, or None; with it the summary has a `stages` list (requests binned by arrival time) and
    saturation is judged per stage (see `_queue_growth`). `concurrency`: the clients of a closed
    loop (0: open loop/offline). ``num_gpus`` / ``usd_per_hour``: the deployment's totals when its pools
    differ (default: ``num_gpus_per_replica x replicas`` GPUs at ``usd_per_gpu_hour``); ``peak_flops``,
    ``hbm_bw`` are then per-GPU means and ``num_blocks`` the mean per replica. ``threads``: the
    independent series' intervals computed on up to that many threads (above THREADS_ABOVE requests;
    the same values)."""
    end = float(out.stats[K.STAT_END_TIME])
    threads = threads if len(cols["arrival_s"]) > THREADS_ABOVE else 1
    n_gpus = num_gpus_per_replica * replicas if num_gpus is None else num_gpus
    df = Rows(cols)
    t0, t1, open_loop = measurement_window(df, warmup, offered_rate is not None)
    arrival, status = df["arrival_s"], df["status"]
    in_window = (arrival >= warmup) & (arrival <= t1) if open_loop else arrival >= warmup
    measured = df.where(in_window)
    done = measured.where(measured["status"] == C.DONE)
    if not open_loop:    # offline / closed loop: no offered load; to the last completion of a measured request
        t1 = float(done["finish_s"].max()) if len(done) else end
    window = max(t1 - t0, 1e-12)
    fin = status == C.DONE
    delivered = done
    if open_loop:     # the requests completing in the window (the rates and goodput read them)
        f = df["finish_s"]
        delivered = df.where(fin & (f >= t0) & (f <= t1))
    thr = _throughput(delivered, t0, window, n_gpus, threads)
    if open_loop:
        thr["offered_requests_per_s"] = len(measured) / window
    thr |= {"window_s": [t0, t1], "whole_run": _whole_run(df, fin)}
    drain = _drain(df, fin, t1) if open_loop else None
    usd_h = usd_per_gpu_hour * n_gpus if usd_per_hour is None else usd_per_hour
    cost = cost_block(thr, usd_h, usd_per_gpu_hour)
    itl_mean = _itl_mean(done)
    s = out.stats
    util = utilization(s, replicas=replicas, num_blocks=num_blocks, n_gpus=n_gpus, peak_flops=peak_flops,
                       hbm_bw=hbm_bw)
    time_share = time_shares(s)
    arrivals_in = ascending(measured["arrival_s"])
    timeline = _timeline(df, done)
    unfinished = int(np.isin(status, (C.WAITING, C.RUNNING, C.SWAPPED, C.NOT_ARRIVED, C.TRANSFER)).sum())
    if stages is None:
        growth, verdict, reason = _queue_growth(timeline, arrivals_in, offered_rate is not None)
        if offered_rate is None:
            verdict, reason = _closed_or_offline(concurrency, len(df))
        stage_list = None
    else:
        stage_list = _stages(stages, df, measured, done, timeline, slo, warmup, n_gpus)
        decisive = next((st for st in stage_list if st["saturated"]), None) or next(
            (st for st in stage_list if st["saturation_verdict"] == UNDETERMINED), stage_list[-1])
        growth = {"stage": decisive["stage"], **decisive["queue_growth"]}
        verdict = decisive["saturation_verdict"]
        reason = f"stage {decisive['stage']}: {decisive['saturation_reason']}"
    if unfinished:
        verdict, reason = SATURATED, f"stopped by --duration with {unfinished} requests unfinished"
    saturated = verdict == SATURATED
    b = run_batch_size(done, threads)
    lat = dict(zip(LATENCIES, each(lambda c: describe(done[f"{c}_s"], b), LATENCIES, threads)))
    metrics = {
        "ttft_ms": lat["ttft"],
        "tpot_ms": lat["tpot"],
        "itl_ms": histogram_describe(out.gap_hist, itl_mean) | {"ci95": _itl_ci(done, b)},
        "e2e_ms": lat["e2e"],
        "queue_ms": lat["queue"],
    }
    slo_report, attainment, _ = evaluate_slo(slo, metrics, done, window)
    goodput = None
    if slo:     # requests meeting every target, of those completing in the window
        goodput = float(meets_slo(slo, delivered).sum() / window)
    sessions = _sessions(df, measured, delivered, window) if "turn" in df else None
    return {
        "num_requests": int(len(df)),
        "num_measured": int(arrivals_in.size),
        "num_completed": int(fin.sum()),
        "num_rejected": int((status == C.REJECTED).sum()),
        "saturated": bool(saturated),
        "saturation_verdict": verdict,
        "saturation_reason": reason,
        "queue_growth": growth,
        "duration_s": end,
        **metrics,
        "throughput": thr,
        "cost": cost,
        "utilization": util,
        "time_share": time_share,
        "iterations": int(s[K.STAT_ITERATIONS]),
        "preemptions": int(s[K.STAT_PREEMPTIONS]),
        "slo": slo_report,
        "slo_attainment": attainment,
        "goodput_requests_per_s": goodput,
    } | ({} if stage_list is None else {"stages": stage_list}) | ({} if drain is None else {"drain": drain}) \
        | ({} if sessions is None else {"sessions": sessions})


def cost_block(thr: dict, usd_h: float, usd_per_gpu_hour: float) -> dict:
    """The summary's `cost`: $/h and $ per million tokens at the window's rates."""
    def per_million(tok_s):
        return usd_h / (tok_s * 3600.0) * 1e6 if tok_s > 0 else None
    return {"usd_per_hour": usd_h, "usd_per_gpu_hour": usd_per_gpu_hour,
            "usd_per_million_input_tokens": per_million(thr["input_tokens_per_s"]),
            "usd_per_million_output_tokens": per_million(thr["output_tokens_per_s"]),
            "usd_per_million_total_tokens": per_million(thr["total_tokens_per_s"])}


def utilization(s: np.ndarray, *, replicas: int, num_blocks: float, n_gpus: int, peak_flops: float,
                hbm_bw: float) -> dict:
    """The summary's `utilization`, from the run's totals (EngineOutput.stats)."""
    span = max(float(s[K.STAT_END_TIME]), 1e-12)
    return {
        "mean_batch_size": s[K.STAT_SEQS_TIME] / s[K.STAT_BUSY] if s[K.STAT_BUSY] > 0 else 0.0,
        "mean_tokens_per_iteration": s[K.STAT_TOKENS_TIME] / s[K.STAT_BUSY] if s[K.STAT_BUSY] > 0 else 0.0,
        "busy_fraction": s[K.STAT_INFLIGHT_TIME] / (span * replicas),
        "first_stage_busy_fraction": s[K.STAT_BUSY] / (span * replicas),
        "later_stage_busy_fraction": s[K.STAT_STAGE_BUSY] / (span * replicas) if s[K.STAT_STAGE_BUSY] > 0 else None,
        "kv_cache_mean": s[K.STAT_KV_TIME] / (span * replicas * num_blocks),
        "kv_cache_max": s[K.STAT_KV_MAX] / num_blocks,
        "mfu": s[K.STAT_FLOPS] / (span * n_gpus * peak_flops),
        "mbu": s[K.STAT_BYTES] / (span * n_gpus * hbm_bw),
    }


def time_shares(s: np.ndarray) -> dict:
    """The summary's `time_share`: each component's share of the busy time."""
    busy_total = s[K.STAT_GEMM] + s[K.STAT_ATTN] + s[K.STAT_ELEM] + s[K.STAT_COMM] + s[K.STAT_OVERHEAD]
    return {k: (s[i] / busy_total if busy_total > 0 else 0.0) for k, i in
            (("gemm", K.STAT_GEMM), ("attention", K.STAT_ATTN), ("elementwise", K.STAT_ELEM),
             ("communication", K.STAT_COMM), ("overhead", K.STAT_OVERHEAD))}


def _ms_stats(x_s) -> dict:
    """{p50, p90, p99, mean} in ms of the finite values (None when there are none)."""
    x = np.asarray(x_s, dtype=np.float64)
    x = np.sort(x[np.isfinite(x)])
    if x.size == 0:
        return {"p50": None, "p90": None, "p99": None, "mean": None}
    return {f"p{p}": CI.sorted_quantile(x, p / 100.0) * 1e3 for p in (50, 90, 99)} | {"mean": float(x.mean()) * 1e3}


def pools_summary(df, out, pools: list[dict], *, warmup: float, until: float = math.inf) -> list[dict]:
    """One entry per pool. ``pools``: dicts with name, role, hardware, tp, pp, replicas, first (its first
    replica index), num_gpus, usd_per_hour, kv_blocks_per_replica; ``out.pool_stats`` (P x N_STATS)
    holds each pool's share of the run's totals. ``utilisation``: first-stage busy time / (replicas x
    run time), ``busy_fraction``: time with a micro-batch in flight / (replicas x run time) (as the
    deployment's `utilization` block); ``kv_utilisation``: mean KV blocks in use / the pool's blocks,
    ``kv_max`` the most on one replica; ``mean_batch_size``: sequences x time / busy time. ``queue_ms`` (mixed and prefill pools): engine arrival to first
    admission of the measured requests that entered the pool (the prefill replica, else the replica
    that served them); not for decode pools (the kernel records no decode start; their requests'
    wait is in ``kv_transfer_ms``: transfer start to end, of the requests the pool decoded). ``df``: the
    request columns (`requests_columns` and the pools' columns), or their table."""
    end = max(float(out.stats[K.STAT_END_TIME]), 1e-12)
    arrival = np.asarray(df["arrival_s"])
    measured = (arrival >= warmup) & (arrival <= until)    # the summary's window
    replica = np.asarray(df["replica"])
    pf = np.asarray(df["pf_replica"]) if "pf_replica" in df else np.full(len(arrival), -1)
    entry = np.where(pf >= 0, pf, replica)
    res = []
    for k, p in enumerate(pools):
        st = out.pool_stats[k]
        r, blocks = p["replicas"], p["kv_blocks_per_replica"]
        lo, hi = p["first"], p["first"] + r
        item = {key: p[key] for key in ("name", "role", "hardware", "tp", "pp", "replicas", "num_gpus",
                                        "usd_per_hour", "kv_blocks_per_replica")}
        item |= {"utilisation": st[K.STAT_BUSY] / (end * r), "busy_fraction": st[K.STAT_INFLIGHT_TIME] / (end * r),
                 "kv_utilisation": st[K.STAT_KV_TIME] / (end * r * blocks), "kv_max": st[K.STAT_KV_MAX] / blocks,
                 "mean_batch_size": st[K.STAT_SEQS_TIME] / st[K.STAT_BUSY] if st[K.STAT_BUSY] > 0 else 0.0,
                 "preemptions": int(st[K.STAT_PREEMPTIONS])}
        if p["role"] == "decode":
            mine = measured & (replica >= lo) & (replica < hi)
            item["kv_transfer_ms"] = _ms_stats((np.asarray(df["xfer_end_s"]) - np.asarray(df["xfer_start_s"]))[mine])
        else:
            mine = measured & (entry >= lo) & (entry < hi)
            item["queue_ms"] = _ms_stats(np.asarray(df["queue_s"])[mine])
        item["num_requests"] = int(mine.sum())
        res.append(item)
    return res


def prefix_cache_summary(prefix) -> dict:
    """The prefix cache's counters (codes.N_PREFIX): hit_rate = hit tokens / prompt tokens looked up."""
    hits_gpu, hits_cpu, lookup = (float(prefix[i]) for i in (C.HIT_GPU_TOKENS, C.HIT_CPU_TOKENS, C.LOOKUP_TOKENS))
    return {"hit_rate": (hits_gpu + hits_cpu) / lookup if lookup > 0 else None,
            "lookup_tokens": int(lookup), "gpu_hits": int(hits_gpu), "cpu_hits": int(hits_cpu),
            "evictions": {"gpu": int(prefix[C.GPU_EVICTIONS]), "cpu": int(prefix[C.CPU_EVICTIONS])},
            "cpu_reload_s": float(prefix[C.CPU_RELOAD_TIME])}


def kv_transfer_summary(df, *, warmup: float, until: float = math.inf) -> dict:
    """{p50, p90, p99, mean} ms of the KV transfers (end - start) of the measured requests (arriving in
    [warmup, until]); ``df`` as `pools_summary`'s."""
    arrival = np.asarray(df["arrival_s"])
    m = (arrival >= warmup) & (arrival <= until)
    start, end = np.asarray(df["xfer_start_s"])[m], np.asarray(df["xfer_end_s"])[m]
    return _ms_stats(end - start) | {"count": int(np.isfinite(end).sum())}


def measurement_window(df: Rows, warmup: float, open_loop: bool) -> tuple[float, float, bool]:
    """(t0, t1, open_loop): the window of the offered load, which the latency statistics, throughput
    and goodput share. It starts at the end of the warm-up (else the first arrival) and, for an
    open-loop load, ends at its last arrival: with sessions, the last session's first turn (the turns
    after it are the started sessions winding down, no load is offered any more). t1 is returned as
    inf without an open-loop load (the caller ends it at the last completion). A window of one instant
    (one arrival) is no window: the run is then judged as without an offered load."""
    arrival = df["arrival_s"]
    sent = arrival[np.isfinite(arrival)]
    t0 = warmup if warmup > 0 else float(sent.min()) if len(sent) else 0.0
    if not open_loop or not len(sent):
        return t0, math.inf, False
    starts = sent[df["turn"][np.isfinite(arrival)] == 0] if "turn" in df else sent
    t1 = float(starts.max()) if len(starts) else float(sent.max())
    if not t1 > t0:
        return t0, math.inf, False
    return t0, t1, True


def _throughput(done: Rows, t0: float, window: float, n_gpus: int, threads: int = 1) -> dict:
    """Rates of the requests in ``done`` (those completing in the window [t0, t0 + window]) per second
    of the window, with 95% intervals."""
    in_tok = float(done["prompt_tokens"].sum())
    out_tok = float(done["output_tokens"].sum())
    return {
        "requests_per_s": len(done) / window,
        "input_tokens_per_s": in_tok / window,
        "output_tokens_per_s": out_tok / window,
        "output_tokens_per_s_per_gpu": out_tok / window / n_gpus,
        "total_tokens_per_s": (in_tok + out_tok) / window,
        "ci95": _throughput_ci(done, t0, window, n_gpus, threads),
    }


def _throughput_ci(done: Rows, t0: float, window: float, n_gpus: int, threads: int = 1) -> dict:
    """95% intervals of the throughput figures: each is a ratio sum(reward) / sum(time) over the
    completions in finish order, time being the gap since the previous completion (the first from the
    window's start) and a last interval of no completion from the last one to the window's end, so
    sum(time) = window (`intervals.ratio_ci`, batches sized from the autocorrelation of the gaps and
    of the tokens). A rate is never negative: lower bounds are clipped at 0."""
    order = stable_argsort(done["finish_s"])     # (np.argsort(kind="stable"), in linear time)
    f = np.asarray(done["finish_s"][order], np.float64)
    m = f.size
    if m == 0:
        return {k: [None, None] for k in ("requests_per_s", "input_tokens_per_s", "output_tokens_per_s",
                                          "output_tokens_per_s_per_gpu", "total_tokens_per_s")}
    gaps = np.empty(m + 1)      # each completion's gap since the one before (the first: since t0), then the rest
    gaps[0] = f[0] - t0
    np.subtract(f[1:], f[:-1], out=gaps[1:m])
    gaps[m] = max(t0 + window - f[-1], 0.0)
    inp, outp, ones = np.empty(m + 1), np.empty(m + 1), np.ones(m + 1)     # rewards, a last 0 with the rest
    inp[:m] = done["prompt_tokens"][order]
    outp[:m] = done["output_tokens"][order]
    inp[m] = outp[m] = ones[m] = 0.0
    tot = inp + outp
    b = max(each(CI.batch_size, (gaps, tot, outp), threads))
    rewards = (("requests_per_s", ones), ("input_tokens_per_s", inp), ("output_tokens_per_s", outp),
               ("total_tokens_per_s", tot))
    out = dict(zip((k for k, _ in rewards), each(lambda v: CI.ratio_ci(v, gaps, b), (v for _, v in rewards), threads)))
    out["output_tokens_per_s_per_gpu"] = [None if v is None else v / n_gpus for v in out["output_tokens_per_s"]]
    return {k: [None if v[0] is None else max(v[0], 0.0), v[1]] for k, v in out.items()}


def _whole_run(df: Rows, fin: np.ndarray) -> dict:
    """The rates as serving benchmarks report them (vLLM's benchmark_serving.py, trtllm-bench): every
    completion (``fin``: the done requests) over the whole run, first send to last completion, the
    drain included."""
    arrival = df["arrival_s"]
    sent = arrival[np.isfinite(arrival)]
    f = df["finish_s"][fin]
    span = max(float(f.max() - sent.min()) if f.size and sent.size else 0.0, 1e-12)
    in_tok = float(df["prompt_tokens"][fin].sum())
    out_tok = float(df["output_tokens"][fin].sum())
    return {"requests_per_s": f.size / span, "input_tokens_per_s": in_tok / span,
            "output_tokens_per_s": out_tok / span, "total_tokens_per_s": (in_tok + out_tok) / span,
            "duration_s": span}


def _drain(df: Rows, fin: np.ndarray, t1: float) -> dict:
    """After the offered load ends (t1): how long the run took to finish and what it finished then."""
    f = df["finish_s"]
    after = fin & (f > t1)
    last = float(f[fin].max()) if fin.any() else t1
    return {"start_s": t1, "duration_s": max(last - t1, 0.0), "requests": int(after.sum()),
            "output_tokens": int(df["output_tokens"][after].sum()),
            "arrivals": int((df["arrival_s"] > t1).sum())}


def _sessions(df: Rows, measured: Rows, delivered: Rows, window: float) -> dict | None:
    """A sessions run: sessions started, turns offered and completed per second of the window."""
    if not (df["turn"] >= 0).any() or not (df["session"] >= 0).any():
        return None
    first = int((measured["turn"] == 0).sum())
    return {"sessions_started": first, "sessions_per_s": first / window,
            "offered_turns_per_s": len(measured) / window, "completed_turns_per_s": len(delivered) / window,
            "turns_per_session": float(np.unique(df["session"], return_counts=True)[1].mean())}


def _itl_mean(done: Rows) -> float:
    """Mean inter-token gap over every gap of the completed requests, sum(finish - first) / sum(out - 1)."""
    d = done.where(done["output_tokens"] > 1)
    n_gaps = float((d["output_tokens"] - 1).sum())
    return float(np.nansum(d["finish_s"] - d["first_token_s"]) / n_gaps) if n_gaps else float("nan")


STABLE, SATURATED, UNDETERMINED = "stable", "saturated", "undetermined"
MIN_WINDOW_ARRIVALS = 50     # arrivals in the judged window below which no verdict is given
MAX_ADMISSION_LAG = 0.10     # admissions more than 10% behind arrivals: the waiting queue grows
MAX_QUEUE_SLOPE = 0.05       # s of queueing delay per s of arrival time (lambda > 1.05 mu)


class _Timeline(NamedTuple):
    """Event times of one run, on the clients' clock, in request order: `_queue_growth` only counts
    them in intervals, which needs no sort."""
    arrivals: np.ndarray      # every request's arrival
    finishes: np.ndarray      # completions
    queued: np.ndarray        # arrivals of the requests that queued (all but the rejected ones)
    admitted: np.ndarray      # first admissions to a batch of those (never admitted: nan)
    late_arrival: np.ndarray  # arrivals of the admitted requests, in request order
    late_queue: np.ndarray    # and their queueing delays


def _timeline(df: Rows, done: Rows) -> _Timeline:
    frontend = df["engine_arrival_s"] - df["arrival_s"]
    kept = df["status"] != C.REJECTED
    queued = df.where(kept)
    sched = queued["scheduled_s"] - frontend[kept]
    adm = queued.where(np.isfinite(sched))
    return _Timeline(df["arrival_s"], done["finish_s"], queued["arrival_s"], sched, adm["arrival_s"], adm["queue_s"])


def ascending(x: np.ndarray) -> np.ndarray:
    """np.sort(x); x itself when it is in order already (the arrivals of an open-loop run)."""
    return x if x.size < 2 or bool(np.all(x[1:] >= x[:-1])) else np.sort(x)


def _count(x: np.ndarray, lo: float, hi: float) -> int:
    """Number of x in (lo, hi] (nan: none)."""
    return int(np.count_nonzero((x > lo) & (x <= hi)))


def _count_to(x: np.ndarray, hi: float) -> int:
    """Number of x at or before hi (nan: none)."""
    return int(np.count_nonzero(x <= hi))


def _queue_growth(tl: _Timeline, arrivals_in: np.ndarray, open_loop: bool) -> tuple[dict, str, str]:
    """(evidence, verdict, reason) over the second half of `arrivals_in` (sorted arrival times: the
    whole run, or one stage): the judged window runs from its middle arrival to its last one.

    Saturated: the waiting queue grows. In a stable system the requests admitted to a batch in the
    window match the arrivals in it (up to the change in the waiting queue, small against the
    window); above capacity admissions stay at the service rate. And the queueing delay of the
    window's arrivals grows with their arrival time: above capacity at lambda/mu - 1 seconds per
    second; a slope over 0.05 means lambda > 1.05 mu. Requests in flight (admitted, not finished) are
    not growth: an LLM server holds a whole batch of them, so completions always trail arrivals by
    about lambda x the response time.

    Undetermined ("too few requests"): fewer than 50 arrivals in the window, or fewer completions in
    it than requests still in flight at its end -- a run short against a response time, in which a
    growing backlog may still be hiding in a filling batch. Otherwise stable."""
    n_arr = arrivals_in.size
    last_arr = float(arrivals_in[-1]) if n_arr else 0.0
    t_mid = float(arrivals_in[n_arr // 2]) if n_arr else 0.0
    arr_w = int(n_arr - n_arr // 2)
    queued_w = _count(tl.queued, t_mid, last_arr) if n_arr else 0
    adm_w = _count(tl.admitted, t_mid, last_arr) if n_arr else 0
    dep_w = _count(tl.finishes, t_mid, last_arr) if n_arr else 0
    arrived = _count_to(tl.arrivals, last_arr) if n_arr else 0
    in_system_end = arrived - _count_to(tl.finishes, last_arr) if n_arr else 0
    waiting_end = _count_to(tl.queued, last_arr) - _count_to(tl.admitted, last_arr) if n_arr else 0
    open_loop = open_loop and last_arr > t_mid
    late = (tl.late_arrival > t_mid) & (tl.late_arrival <= last_arr)
    late_arrival, late_queue = tl.late_arrival[late], tl.late_queue[late]
    slope = 0.0
    if open_loop and late_arrival.size >= MIN_WINDOW_ARRIVALS and np.ptp(late_arrival) > 0:
        slope = float(np.polyfit(late_arrival, late_queue, 1)[0])
    return growth_verdict(arr_w, queued_w, adm_w, dep_w, in_system_end, waiting_end, arrived, slope, open_loop)


def growth_verdict(arr_w: int, queued_w: int, adm_w: int, dep_w: int, in_system_end: int, waiting_end: int,
                   arrived: int, slope: float, open_loop: bool) -> tuple[dict, str, str]:
    """(evidence, verdict, reason) from the judged window's counts (`_queue_growth`; a streamed run's
    from its running counts, `metrics_stream`): arrivals, of them queued (not rejected), admissions and
    completions in the window; in the system and waiting at its last arrival, arrivals up to then; the
    queueing delay's slope against arrival time (0 when not fitted)."""
    evidence = {"window_arrivals": arr_w, "window_admissions": adm_w, "window_completions": dep_w,
                "in_system_at_last_arrival": int(in_system_end), "waiting_at_last_arrival": int(waiting_end),
                "fraction_of_arrivals": in_system_end / arrived if arrived else 0.0,
                "late_window_admissions_per_arrival": adm_w / queued_w if queued_w else None,
                "late_window_departures_per_arrival": dep_w / arr_w if arr_w else None,
                "queue_delay_slope": slope}
    if not open_loop or arr_w < MIN_WINDOW_ARRIVALS:
        return evidence, UNDETERMINED, (f"too few requests: {arr_w} arrivals in the judged window (the second "
                                        f"half of the arrivals), {MIN_WINDOW_ARRIVALS} needed; use more requests")
    if adm_w < (1.0 - MAX_ADMISSION_LAG) * queued_w:
        return evidence, SATURATED, (f"the waiting queue grows: {adm_w} of {queued_w} arrivals in the judged "
                                     f"window admitted ({waiting_end} waiting at the last arrival)")
    if slope > MAX_QUEUE_SLOPE:
        return evidence, SATURATED, (f"queueing delay grows {slope:.3f} s per s of arrival time "
                                     f"(> {MAX_QUEUE_SLOPE})")
    if dep_w < in_system_end:
        return evidence, UNDETERMINED, (f"too few requests: the judged window holds {dep_w} completions but "
                                        f"{in_system_end} requests are still in flight at its end (the run is "
                                        "short against a response time); use more requests")
    return evidence, STABLE, (f"the waiting queue does not grow: {adm_w} of {queued_w} arrivals in the judged "
                              f"window admitted, queueing-delay slope {slope:.3f} s/s")


def _closed_or_offline(concurrency: int, n: int) -> tuple[str, str]:
    """Verdict of a run without an arrival rate."""
    if concurrency > 0 and concurrency < n:
        return STABLE, f"closed loop: at most {concurrency} requests outstanding, the queue cannot grow"
    if concurrency > 0:
        return UNDETERMINED, (f"closed loop with {concurrency} clients for {n} requests: every request is sent "
                              "at t = 0, in effect an offline run; use --concurrency below --num-requests")
    return UNDETERMINED, "offline: every request arrives at t = 0, there is no arrival rate to keep up with"


def _stages(stages, df, measured, done, timeline, slo, warmup, n_gpus) -> list[dict]:
    """One entry per stage, over the requests arriving in it (stage k: [T_k, T_k + duration_k))."""
    durations = np.array([d for _, d in stages], dtype=np.float64)
    starts = np.concatenate(([0.0], np.cumsum(durations)[:-1]))

    def stage_of(frame):
        k = np.searchsorted(starts, frame["arrival_s"], side="right") - 1
        return np.clip(k, 0, len(stages) - 1)

    k_all, k_meas, k_done = stage_of(df), stage_of(measured), stage_of(done)
    finished = df.where(df["status"] == C.DONE)
    out = []
    for k, (rate, dur) in enumerate(stages):
        start = float(starts[k])
        d = done.where(k_done == k)
        arr_k = ascending(measured["arrival_s"][k_meas == k])
        growth, verdict, reason = _queue_growth(timeline, arr_k, True)
        t0, t1 = max(start, warmup), start + float(dur)     # the stage's offered load
        window = max(t1 - t0, 1e-12)
        delivered = finished.where((finished["finish_s"] >= t0) & (finished["finish_s"] <= t1))
        b = run_batch_size(d)
        itl = {"mean": _itl_mean(d) * 1e3} | {f"p{p}": None for p in PCTS} | {"ci95": _itl_ci(d, b)}
        lat = {"ttft_ms": describe(d["ttft_s"], b), "tpot_ms": describe(d["tpot_s"], b),
               "itl_ms": itl, "e2e_ms": describe(d["e2e_s"], b), "queue_ms": describe(d["queue_s"], b)}
        slo_report, attainment, _ = evaluate_slo(slo, lat, d, window)
        goodput = float(meets_slo(slo, delivered).sum() / window) if slo else None
        for v in slo_report.values():  # ITL percentiles are whole-run only (one gap histogram)
            if v["value_ms"] is None:
                v["met"] = None
        out.append({"stage": k, "rate": float(rate), "start_s": start, "duration_s": float(dur),
                    "num_requests": int((k_all == k).sum()), "num_measured": int(arr_k.size),
                    "num_completed": len(d), "saturated": verdict == SATURATED,
                    "saturation_verdict": verdict, "saturation_reason": reason, "queue_growth": growth, **lat,
                    "throughput": _throughput(delivered, t0, window, n_gpus)
                    | {"offered_requests_per_s": len(arr_k) / window}, "slo": slo_report,
                    "slo_attainment": attainment, "goodput_requests_per_s": goodput})
    return out


SLO_COLUMN = {"ttft": "ttft_s", "tpot": "tpot_s", "e2e": "e2e_s", "queue": "queue_s", "itl": "max_gap_s"}


def meets_slo(slo, done) -> np.ndarray:
    """Per request: each of its own latencies meets every target (a NaN, e.g. the TPOT of a 1-token
    reply, fails none). ``done``: a frame, or a dict of column arrays."""
    ok = np.ones(len(done[SLO_COLUMN["ttft"]]) if isinstance(done, dict) else len(done), dtype=bool)
    for key, target in slo.items():
        col = SLO_COLUMN[key.split("_")[0]]
        ok &= ~(np.asarray(done[col]) > target)
    return ok


def evaluate_slo(slo, metrics: dict, done: Rows, window: float):
    """Aggregate targets (e.g. ttft_p99 <= 500 ms) and per-request attainment / goodput:
    a request counts toward goodput when each of its own latencies meets every target
    (DistServe, Zhong et al. OSDI 2024, sec. 2)."""
    report = slo_report(slo, metrics)
    ok = meets_slo(slo, done)
    attainment = float(ok.mean()) if len(done) and slo else None
    goodput = float(ok.sum() / window) if slo else None
    return report, attainment, goodput


def slo_report(slo, metrics: dict) -> dict:
    """Each aggregate target (e.g. ttft_p99 <= 500 ms): its value in the summary's metrics and whether met."""
    report = {}
    for key, target in slo.items():
        metric, stat = key.split("_")
        value = metrics[f"{metric}_ms"].get(stat)
        report[key] = {"target_ms": target * 1e3, "value_ms": value,
                       "met": value is not None and value <= target * 1e3}
    return report
