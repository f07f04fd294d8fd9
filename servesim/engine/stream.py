"""A run of any length in bounded memory: the kernel over a window of requests, loaded chunk by chunk.

The requests arrive in time order, so the kernel (`kernel.run_nb`) can run over the requests loaded
so far and pause before the first event at or after the next chunk's first arrival: nothing it has
done yet depends on a request it has not seen (at equal times an arrival comes before a scheduling
decision and after completions, and the pause leaves the state untouched, so resuming with the next
chunk appended replays the same order). After each pause the window's leading requests that have
ended (done or rejected) are handed to ``sink`` in arrival order and dropped: every stored request
index (the waiting queues' links, the running sets, the micro-batch slots, the arrival counters)
is shifted down by their number (`_shift`). The records the sink sees, concatenated, are the
records of the same requests run in one piece, field for field (tests/test_stream.py).

Memory is the window (the requests in the system plus one chunk), not the run: a stable run's
window stays near one chunk. A backlog that grows without bound (an overloaded deployment) is
stopped once the window holds ``max_window`` requests (`StreamEnd.backlog`): the run is saturated.

Only the plain feature set streams (no prefix cache, no session turns or KV transfers between
pools, no speculative decoding, an open loop): those keep request indices in further arrays
(chains, the transfer list, the turn heap) that are not shifted here.
"""
from __future__ import annotations

from typing import Callable, Iterator, NamedTuple

import numpy as np

from . import codes as C
from .kernel import RUN_CUT, compile_ahead, cost_inputs, end_run_nb, kernel_features, run_nb, run_totals
from .state import (
    ENDED, INF, LOG_COUNT, N_STATS, NEXT_ARRIVAL, SENT, EngineConfig, Pools, config_record, kernel_pools,
    new_counters, new_log, new_pad, pool_stats_of, new_replicas, new_requests, new_span, new_step, request_dtype,
)

CHUNK = 1 << 18          # requests loaded per chunk (even: see workload/stream.py)
MAX_WINDOW = 1 << 21     # requests in the system at which a run is stopped as saturated (their records,
                         # 203 B each, held twice while the window is rebuilt: ~1 GB)


class StreamEnd(NamedTuple):
    """What the chunked run leaves besides the records it handed out."""
    stats: np.ndarray           # run totals (EngineOutput.stats)
    pool_stats: np.ndarray
    gap_hist: np.ndarray
    log: tuple                  # (time, replica, seqs, tokens, kv_blocks, waiting) of the decimated samples
    loaded: int                 # requests loaded into the kernel (the rest were never sent: cut or stopped)
    chunks: int                 # pauses + 1
    peak_window: int            # most requests held at once
    backlog: bool               # stopped: the window reached max_window
    cut: bool                   # stopped by cfg.max_time (--duration)


def _shift(rq, rp, ctr, m: int) -> None:
    """Drop the window's first m requests (all ended): every stored request index moves down by m."""
    for a in (rq.q_next, rp.row.q_head, rp.row.q_tail):
        a[a >= 0] -= m
    for a in (rp.running, rp.slot_req):     # (entries past n_running / slot.n are stale, never read)
        a[a >= 0] -= m
    for j in (NEXT_ARRIVAL, SENT, ENDED):
        ctr[j] -= m


def ended_prefix(status: np.ndarray) -> int:
    """Length of the leading run of ended (done or rejected) requests."""
    live = (status != C.DONE) & (status != C.REJECTED)
    idx = np.flatnonzero(live)
    return int(idx[0]) if idx.size else int(status.size)


def run_stream(ps: tuple, cfg: EngineConfig, pools: Pools, chunks: Iterator, sink: Callable,
               max_window: int | None = None) -> StreamEnd:
    """Run the kernel over ``chunks`` (an iterator of (arrival, prompt, output, u1, u2) arrays, engine
    arrivals in non-decreasing order across chunks, as `lower.request_arrays` gives them) and hand each
    drained block of request records (a `state.request_dtype` record array, arrival order) to
    ``sink(records, first_index)``; ``max_window``: default MAX_WINDOW."""
    if cfg.concurrency > 0 or np.any(pools.role != C.MIXED):      # (no chains: the prefix cache stays out)
        raise ValueError("run_stream runs the plain feature set (mixed pools, open loop, no chains)")
    max_window = MAX_WINDOW if max_window is None else max_window
    tabs = cost_inputs(ps, pools)
    fs = kernel_features(tabs)
    rp = new_replicas(cfg, pools)
    kp = kernel_pools(pools)
    ctr = new_counters(cfg, 0)
    log = new_log(cfg.log_size)
    step = new_step(cfg.max_num_seqs)
    sp = new_span(cfg, pools.role.shape[0])      # decode fast-forward: aggregates per replica, no request index to shift
    pad = new_pad(cfg)      # static batching's padding: counts per replica, no request index
    cr = config_record(cfg)     # (as the kernel takes it: state.config_dtype)
    rstats = np.zeros((cfg.replicas, N_STATS))     # per replica (`state.pool_stats_of` folds them into pools)
    prefix = np.zeros(C.N_PREFIX)
    gap_hist = np.zeros(C.GAP_BINS, np.int64)
    rq = new_requests(*(np.zeros(0, t) for t in (np.float64, np.int64, np.int64, np.float64, np.float64)),
                      np.zeros(0, np.int64))
    room = np.empty(0, request_dtype)   # the window's records: reused from chunk to chunk, grown as needed
    pending = next(chunks, None)
    now, base, loaded, n_chunks, peak = 0.0, 0, 0, 0, 0
    backlog = cut = False
    while True:
        if pending is not None:         # append the next chunk: sent, to arrive as the clock reaches it
            k, c = rq.shape[0], pending[1].shape[0]
            if room.shape[0] < k + c:
                room = np.empty(k + c, request_dtype)
            if rq.base is not room:     # the requests in flight, from their own copy (or from the old room)
                room[:k] = rq
            new_requests(*pending, np.full(c, -1, np.int64), out=room[k:k + c])
            rq = room[:k + c].view(np.recarray)
            loaded += c
            ctr[SENT] = rq.shape[0]
            pending = next(chunks, None)
        peak = max(peak, rq.shape[0])
        until = float(pending[0][0]) if pending is not None else INF
        args = (tabs, fs, cr, kp, None, rq, rp, None, None, None, step, log, ctr, rstats, prefix,
                gap_hist, None, None, sp, pad)
        with compile_ahead(args):
            now, why = run_nb(*args, now, until)
        n_chunks += 1
        cut = why == RUN_CUT
        more = pending is not None and not cut
        backlog = more and rq.shape[0] >= max_window
        if not more or backlog:     # the end: decode spans brought up to date before the last records go
            end_run_nb(cr, rq, rp, sp, rstats, now)
        m = ended_prefix(rq.status) if more and not backlog else rq.shape[0]
        if m:
            sink(rq[:m], base)
            base += m
            _shift(rq, rp, ctr, m)
            rq = rq[m:].copy().view(np.recarray)
        if not more or backlog:
            break
    pool_stats = pool_stats_of(rstats, pools.first, pools.count)
    stats = run_totals(pool_stats)
    k = int(ctr[LOG_COUNT])
    samples = tuple(np.ascontiguousarray(log[name][:k]) for name in log.dtype.names)
    return StreamEnd(stats, pool_stats, gap_hist, samples, loaded, n_chunks, peak, backlog, cut)
