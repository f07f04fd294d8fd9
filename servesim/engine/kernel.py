"""The jitted event loop: picks the next event in one total order and hands it to its handler.

Arrays in, an `EngineOutput` out; no Python objects. Events are ordered by (time, kind, index):
a micro-batch completion (which frees KV blocks and emits tokens) comes before an arrival at the
same instant, and an arrival before a scheduling decision, so a request arriving exactly when
blocks free up is admitted in that same scheduling step. Ties among completions go to the lowest
(replica, slot); among replicas ready to schedule, to the lowest replica index. The earliest of
each kind is kept in a tournament tree (`nextevent.py`), so choosing it does not scan the replicas.

The state is declared in `state.py`, the handlers are in `events.py` (one per event kind) and the
batch formation policies in `schedule.py`. `simulate_nb` allocates the state and `run_nb` runs the
loop over it; the handlers are inlined into the loop, which borrows the arrays (`jit.HANDLER`).
"""
from __future__ import annotations

import numpy as np
from numba import njit

from . import codes as C
from .events import arrive_nb, complete_nb, schedule_nb
from .jit import HANDLER
from .nextevent import first_nb
from .state import (  # noqa: F401  (EngineConfig, EngineOutput and STAT_* are read from here)
    ENDED, INF, ITERATIONS, N_STATS, NEXT_ARRIVAL, SENT, STAT_ATTN, STAT_BUSY, STAT_BYTES, STAT_COMM,
    STAT_ELEM, STAT_END_TIME, STAT_FLOPS, STAT_GEMM, STAT_INFLIGHT_TIME, STAT_ITERATIONS, STAT_KV_MAX,
    STAT_KV_TIME, STAT_OVERHEAD, STAT_PREEMPTIONS, STAT_SEQS_TIME, STAT_STAGE_BUSY, STAT_SWAP_TIME,
    STAT_TOKENS_TIME, EngineConfig, EngineOutput, engine_output_nb, n_groups_nb, new_counters, new_log,
    new_replicas, new_requests, new_step,
)


@njit(cache=True)
def simulate_nb(p, cfg, arrival, prompt, output, u1, u2, group, hit):
    """``group``: shared-prefix group of each request (-1: none); ``hit``: prompt tokens a request can
    take from the prefix cache (its group's prefix in whole blocks, below its prompt length)."""
    rq = new_requests(arrival, prompt, output, u1, u2, group, hit)
    rp = new_replicas(cfg, n_groups_nb(group))
    log = new_log(cfg.log_size)
    ctr = new_counters(cfg, prompt.shape[0])
    stats = np.zeros(N_STATS)
    gap_hist = np.zeros(C.GAP_BINS, np.int64)
    run_nb(p, cfg, rq, rp, new_step(cfg.max_num_seqs), log, ctr, stats, gap_hist)
    return engine_output_nb(rq, log, ctr, gap_hist, stats)


@njit(**HANDLER)
def run_nb(p, cfg, rq, rp, step, log, ctr, stats, gap_hist):
    """The event loop over state the caller owns (borrowed: see `jit.py`)."""
    n = rq.prompt.shape[0]
    now = 0.0
    while ctr[ENDED] < n:
        t_comp, k = first_nb(rp.slot_end, rp.slot_tree)
        t_arr = rq.arrival[ctr[NEXT_ARRIVAL]] if ctr[NEXT_ARRIVAL] < ctr[SENT] else INF
        t_sch, r = first_nb(rp.wake_at, rp.wake_tree)
        t = min(t_comp, min(t_arr, t_sch))
        if t == INF or t > cfg.max_time:
            break
        now = t
        if t_comp <= t:
            complete_nb(cfg, rq, rp, ctr, stats, gap_hist, k // cfg.pp, k % cfg.pp, now)
        elif t_arr <= t:
            arrive_nb(cfg, rq, rp, ctr, now)
        else:
            schedule_nb(p, cfg, rq, rp, step, ctr, stats, log, r, now)
    for r in range(cfg.replicas):
        if rp.n_in_flight[r] > 0:
            stats[STAT_INFLIGHT_TIME] += now - rp.inflight_since[r]
    stats[STAT_ITERATIONS] = ctr[ITERATIONS]
    stats[STAT_END_TIME] = now
