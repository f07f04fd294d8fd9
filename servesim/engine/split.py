"""Independent replicas simulated at once: a run split into one sub-run per replica, on threads.

A run splits (`whole_reason` says when it may not) when each replica's requests evolve without
the others': the router picks a replica from the request alone (round-robin: request i goes to
entry replica i mod R, as every arrival is routed in index order; random: from its own draw ``u1``),
and nothing else passes between replicas. Request by request the records are then those of the
whole run: a replica's events are ordered among themselves as the whole run orders them, and no
event of another replica changes its state.

What the whole run shares is rebuilt exactly:

* the statistics: the kernel sums them per replica (`state.pool_stats_of` folds them into pools,
  for a whole run too), so each sub-run's row is the whole run's row of that replica;
* the clock at the end: the last event's time is the latest of the sub-runs' (each stops before its
  first event past ``max_time`` as the whole run does), and every sub-run is ended at it
  (`kernel.end_run_nb`: spans closed, the time with work in flight counted up to it);
* the decimated iteration log: a sub-run logs every iteration (``cfg.log_all``), pausing when its log is
  full to have it drained; the sub-runs advance together window by window of simulated time, and a
  window's iterations, merged in the whole run's order (time, then replica: at equal times the loop
  takes the lowest replica's decision first, and a replica's own in order), are decimated by the
  loop's own `events.log_iteration_nb` (`merge_log_nb`);
* the gap histogram, prefix counters and span count are integers (counts), summed.

The split takes the lowered inputs (`lower.KernelInputs`) and gives the whole run's `EngineOutput`;
tests/test_split.py checks the two field for field.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from numba import njit

from . import codes as C
from ..jit import JIT
from .events import log_iteration_nb
from .kernel import RUN_PAUSED, compile_ahead, end_run_nb, kernel_features, cost_inputs, new_run, run_nb, run_totals
from .lower import KernelInputs
from .nextevent import first_nb, new_tree, set_time_nb
from .state import (
    INF, ITERATIONS, LOG_COUNT, LOG_STRIDE, OUTPUT_FIELDS, EngineOutput, Pools, log_dtype, new_counters, new_log, output_columns, output_of,
    pool_stats_of, request_dtype,
)

SUB_LOG = 1 << 17           # a window's log, shared by the sub-runs (a row each; 48 B an iteration)
WINDOW = 1 << 14            # requests arriving per window of the lock-step advance
GATHER = 1 << 16            # a sub-run's records gathered into the run's columns this many at a time
SPLIT_MIN = 2000            # fewer requests run whole: the split's fixed costs would not pay off


def usable_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):      # (not on Linux)
        return os.cpu_count() or 1


SHARING = 1                 # processes of this machine sharing its cores (a sweep's worker pool: `share_cores`)


def share_cores(processes: int) -> None:
    """This process is one of ``processes`` running at once (a sweep's or plan's workers): its default
    threads are its share of the cores, so the workers do not oversubscribe them."""
    global SHARING
    SHARING = max(1, int(processes))


def default_threads(replicas: int | None = None) -> int:
    """``--threads`` when not given: this process's share of the usable cores, at most one per replica
    (``replicas``; None: the summary's series, `metrics.each`)."""
    share = usable_cores() // SHARING
    return max(1, share if replicas is None else min(share, replicas))


def whole_reason(inputs: KernelInputs) -> str:
    """Why the run must be simulated whole ("": it splits into one independent sub-run per replica).
    Each condition below couples replicas or makes a request's replica depend on other replicas."""
    cfg, pools, chains = inputs.cfg, inputs.pools, inputs.chains
    if cfg.replicas < 2:
        return "one replica"
    if np.any(pools.role != C.MIXED):
        return "prefill and decode pools: a request moves between replicas (KV transfers, the held FIFO)"
    if cfg.router not in (C.ROUND_ROBIN, C.RANDOM):
        return "the router reads the replicas' load or cache"
    if cfg.concurrency > 0:
        return "a closed loop: a client sends its next request when its last one ends, on any replica"
    if np.any(chains.next_turn >= 0):
        return "sessions: a turn is sent when the turn before ends, and routed in the order turns arrive"
    if cfg.prefix_caching and chains.ids.shape[0] > 0:
        return "the prefix cache's entries and table are shared by the replicas"
    if inputs.arrival.shape[0] > 1 and np.any(inputs.arrival[1:] < inputs.arrival[:-1]):
        return "arrivals out of time order"
    return ""


def replica_of(inputs: KernelInputs) -> np.ndarray:
    """The replica each request goes to, as `events.pick_nb` picks it for a separable run: round-robin
    i mod R (the i-th arrival; every arrival is routed, rejected or not), random its draw's."""
    cfg, n = inputs.cfg, inputs.prompt.shape[0]
    m = cfg.replicas        # (every replica is an entry replica: mixed pools)
    if cfg.router == C.ROUND_ROBIN:
        return np.arange(n, dtype=np.int64) % m
    return np.minimum((inputs.u1 * m).astype(np.int64), m - 1)


def sub_inputs(inputs: KernelInputs, r: int, idx: np.ndarray) -> KernelInputs:
    """Replica r alone with its requests ``idx``: its pool as the only one, one replica, every
    iteration logged (``cfg.log_all``)."""
    pools = inputs.pools
    k = int(np.searchsorted(pools.first, r, side="right") - 1)
    one = Pools(*(np.ascontiguousarray(getattr(pools, f)[k:k + 1]) for f in Pools._fields[:-2]),
                link_bw=pools.link_bw[k:k + 1, k:k + 1].copy(), link_alpha=pools.link_alpha[k:k + 1, k:k + 1].copy())
    one = one._replace(first=np.zeros(1, np.int64), count=np.ones(1, np.int64))
    cfg = inputs.cfg._replace(replicas=1, log_all=1)
    spec = inputs.spec
    if spec is not None:
        spec = spec._replace(start=spec.start[idx])
    # (no session turns and no chain listing a block: the whole run's chain arrays hold the same value
    # at every request, so every sub-run reads a prefix of them, not a copy)
    m, ch = idx.shape[0], inputs.chains
    chains = ch._replace(start=ch.start[:m], length=ch.length[:m], next_turn=ch.next_turn[:m], think=ch.think[:m])
    return KernelInputs((inputs.ps[k],), cfg, one, inputs.arrival[idx], inputs.prompt[idx], inputs.output[idx],
                        inputs.u1[idx], inputs.u2[idx], chains, spec,
                        None if inputs.dps is None else (inputs.dps[k],))


@njit(nogil=True, **JIT)    # (nogil: it runs beside the sub-runs' next window)
def merge_log_nb(recs, counts, keys, tree, log, ctr):
    """Feed the whole run's log (``log``, its counters ``ctr``) the iterations of one window, in the
    whole run's order: replica r's are ``recs[r, :counts[r]]``, in its order; the earliest head goes
    first, ties to the lowest replica (the tournament tree of nextevent.py, the order the loop takes
    replicas' decisions in), each logged as the loop logs it (`events.log_iteration_nb`). ``keys``,
    ``tree``: a tree of one leaf per replica, every time inf (as it is left)."""
    heads = np.zeros(counts.shape[0], np.int64)
    for r in range(counts.shape[0]):
        if counts[r] > 0:
            set_time_nb(keys, tree, r, recs[r, 0].time)
    while True:
        t, r = first_nb(keys, tree)
        if t == INF:
            break
        e = recs[r, heads[r]]
        ctr[ITERATIONS] += 1
        if (ctr[ITERATIONS] - 1) & (ctr[LOG_STRIDE] - 1) == 0:     # (a sample: as `events.launch_nb` asks)
            log_iteration_nb(log, ctr, t, r, e.seqs, e.tokens, e.kv_blocks, e.waiting)
        heads[r] += 1
        set_time_nb(keys, tree, r, recs[r, heads[r]].time if heads[r] < counts[r] else INF)


class SubRun:
    """One replica's sub-run: its requests (``idx``), its state, its clock."""

    def __init__(self, inputs: KernelInputs, r: int, idx: np.ndarray, fs, row):
        self.r = r
        self.idx = idx
        self.state = new_run(*sub_inputs(inputs, r, idx), fs=fs, log=row)
        self.now = 0.0
        self.done = False

    def advance(self, until: float, row):
        """Run to the first event at or after ``until``, logging its iterations in ``row`` (its row of
        this window's log); returns (the logs it filled and drained before, its count in ``row``)."""
        st = self.state = self.state._replace(log=row)
        st.ctr[LOG_COUNT] = 0
        full = []
        while not self.done:
            self.now, why = run_nb(*st, self.now, until)
            if why != RUN_PAUSED:
                self.done = True
            elif st.ctr[LOG_COUNT] < row.shape[0]:
                break               # paused at `until`, not because its log was full
            else:
                full.append(row.copy())
                st.ctr[LOG_COUNT] = 0
        return full, int(st.ctr[LOG_COUNT])


class Windows:
    """The ends of the lock-step windows: the arrival of every WINDOW-th request; after the last,
    windows as long as the one before, twice as long after one that left most of the log empty, half
    after one that filled a replica's log (the windows change the speed, never the results)."""

    def __init__(self, arrival: np.ndarray, cap: int):
        ends = np.unique(arrival[WINDOW::WINDOW])
        self.ends = [float(t) for t in ends if t > 0]
        self.cap = cap
        self.t = 0.0
        self.dt = 1.0       # s; (adapted)

    def next(self, filled: int, overflowed: bool) -> float:
        if self.ends:
            t = self.ends.pop(0)
            self.dt = max(t - self.t, 1e-9)
        else:
            if overflowed:
                self.dt /= 2
            elif filled < self.cap // 4:
                self.dt *= 2
            t = self.t + self.dt
        self.t = t
        return t


def simulate_split(inputs: KernelInputs, threads: int) -> EngineOutput:
    """The whole run's `EngineOutput` from one sub-run per replica on ``threads`` threads (``inputs``
    must split: `whole_reason`)."""
    cfg = inputs.cfg
    tabs = cost_inputs(inputs.ps, inputs.pools)
    dtabs = None if inputs.spec is None else (cost_inputs(inputs.dps, inputs.pools) if inputs.dps is not None else tabs)
    fs = kernel_features(tabs, dtabs)     # the whole run's step-cost shape for every sub-run
    R = cfg.replicas
    rep = replica_of(inputs)
    # each replica's requests in index order (a radix sort: replica numbers fit 16 bits)
    order = np.argsort(rep.astype(np.int16) if R < 1 << 15 else rep, kind="stable")
    cuts = np.searchsorted(rep[order], np.arange(R + 1))
    del rep
    log, ctr = new_log(cfg.log_size), new_counters(cfg, 0)     # the whole run's log and its counters
    keys, tree = new_tree(R)
    # the windows' logs, a row per replica: two, alternating (one is merged while the next is filled)
    cap = max(SUB_LOG // R, 8)
    logs = [np.zeros((R, cap), log_dtype).view(np.recarray) for _ in range(2)]

    def merge(recs, got):
        counts = np.array([n + sum(f.shape[0] for f in full) for full, n in got], np.int64)
        if any(full for full, _ in got):     # a replica's log filled: its iterations into one row each
            rows = np.zeros((R, counts.max()), log_dtype).view(np.recarray)
            for r, (full, n) in enumerate(got):
                rows[r, :counts[r]] = np.concatenate(full + [recs[r, :n]])
            recs = rows
        merge_log_nb(recs, counts, keys, tree, log, ctr)

    win = Windows(inputs.arrival, cap)
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="servesim-split") as ex:
        subs = list(ex.map(lambda r: SubRun(inputs, r, order[cuts[r]:cuts[r + 1]], fs, logs[0][r]), range(R)))
        with compile_ahead(subs[0].state):
            last, filled, overflowed, w = None, 0, False, 0
            while True:
                until = win.next(filled, overflowed)
                # the sub-runs advance through this window while the last one's iterations are merged
                futures = [ex.submit(s.advance, until, logs[w % 2][s.r]) for s in subs]
                if last is not None:
                    merge(*last)
                last = (logs[w % 2], [f.result() for f in futures])
                w += 1
                if all(s.done for s in subs):
                    break
                filled = max(n + sum(f.shape[0] for f in full) for full, n in last[1])
                overflowed = any(full for full, _ in last[1])
        merge(*last)
        now = max(s.now for s in subs)
        cols = {name: np.empty(inputs.prompt.shape[0], request_dtype[name]) for name in OUTPUT_FIELDS}

        def finish(s: SubRun):
            st = s.state
            end_run_nb(st.cfg, st.rq, st.rp, st.sp, st.stats, now)
            for a in range(0, s.idx.shape[0], GATHER):     # (in slices: no second copy of every column)
                sub = output_columns(st.rq[a:a + GATHER], OUTPUT_FIELDS)
                sub["replica"][sub["replica"] >= 0] = s.r
                for name in OUTPUT_FIELDS:
                    cols[name][s.idx[a:a + GATHER]] = sub[name]

        list(ex.map(finish, subs))
    stats = np.concatenate([s.state.stats for s in subs])
    pool_stats = pool_stats_of(stats, inputs.pools.first, inputs.pools.count)
    gap_hist = np.sum([s.state.gap_hist for s in subs], axis=0)
    prefix = np.zeros(C.N_PREFIX)
    for s in subs:          # (counts: integers, exact in any order)
        prefix += s.state.prefix
    return output_of(cols, log, ctr, gap_hist, run_totals(pool_stats), pool_stats, prefix,
                     int(sum(int(s.state.sp.row.count.sum()) for s in subs)))
