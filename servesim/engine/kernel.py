"""The jitted event loop: picks the next event in one total order and hands it to its handler.

Arrays in, an `EngineOutput` out; no Python objects. Events are ordered by (time, kind, index):
a micro-batch completion (which frees KV blocks and emits tokens) comes before a KV transfer's
event, that before an arrival at the same instant, and an arrival before a scheduling decision, so
a request arriving exactly when blocks free up is admitted in that same scheduling step. Ties among
completions go to the lowest (replica, slot); among transfers to the lowest request; among replicas
ready to schedule, to the lowest replica index. The earliest completion and scheduling decision are
kept in tournament trees (`nextevent.py`), so choosing them does not scan the replicas.

The state is declared in `state.py`, the handlers are in `events.py` (one per event kind), the
batch formation policies in `schedule.py`, the prefix cache in `prefix.py`, session turns and KV
transfers in `flow.py`; the semantics of pools, prefix caching and disaggregation in POOLS.md.
`simulate_pools` allocates the state (in NumPy) and `run_nb` runs the loop over it; the handlers
borrow the arrays (`jit.HANDLER`). Its inputs come from one lowering (`lower.py`).
"""
from __future__ import annotations

import os
from typing import NamedTuple

import numpy as np
from numba import njit

from .._compile_ahead import ahead, by_name, params, prestart
from ..costmodel.features import FULL, features
from ..costmodel.iteration import decode_cost_nb
from ..costmodel.fields import tables
from . import codes as C
from .events import arrive_nb, complete_nb, launch_nb, schedule_nb, span_decide_nb, transfer_nb
from .flow import heap_pop_nb
from .jit import HANDLER
from .nextevent import first_nb
from .span import span_end_nb
from .state import (  # noqa: F401  (EngineConfig, EngineOutput and STAT_* are read from here)
    ENDED, HEAP_N, INF, ITERATIONS, LOG_COUNT, N_STATS, NEXT_ARRIVAL, SENT, STAT_ATTN, STAT_BUSY, STAT_BYTES, STAT_COMM,
    STAT_ELEM, STAT_END_TIME, STAT_FLOPS, STAT_GEMM, STAT_INFLIGHT_TIME, STAT_ITERATIONS, STAT_KV_MAX,
    STAT_KV_TIME, STAT_OVERHEAD, STAT_PREEMPTIONS, STAT_SEQS_TIME, STAT_STAGE_BUSY, STAT_SWAP_TIME,
    STAT_TOKENS_TIME, XFER_NEXT, Chains, EngineConfig, config_record, EngineOutput, Pools, engine_output, kernel_pools,
    new_cache, new_counters, new_log, new_pad, pool_stats_of, new_replicas, new_requests, new_span, new_step, new_turns, new_xfers,
)
from ..jit import JIT


def cost_inputs(ps, pools) -> np.ndarray:
    """The cost tables of the pools' CostParams ``ps``, one per pool of ``pools``, as the rows of one 2-D
    array (`costmodel.fields.tables`; row k is pool k's, so the kernel's signature does not depend on
    the number of pools). The handlers read a pool's PCIe path (`prefix.swap_seconds_nb`) and whether
    its engine schedules asynchronously (`schedule.admit_nb`) from its row."""
    if len(ps) != pools.role.shape[0]:      # the kernel reads row rp.pool[r] unchecked
        raise ValueError(f"{len(ps)} cost params for {pools.role.shape[0]} pools; give one per pool")
    return tables(ps)


def kernel_features(*tabs):
    """The shape of the step cost the kernel is compiled for (costmodel/features.py): the smallest that
    prices every table in ``tabs``; FULL under SERVESIM_KERNEL_UNION=1 (the test suite, so that one
    compiled shape serves every run; a test checks the smaller one gives the same records)."""
    return FULL if os.environ.get("SERVESIM_KERNEL_UNION") == "1" else features(*tabs)


class Run(NamedTuple):
    """A run's state and inputs, in `run_nb`'s order (``run_nb(*run, now, until)``): allocated by
    `new_run`, owned by the caller."""
    ps: np.ndarray
    fs: object
    cfg: np.record
    pools: object
    chains: object              # Chains; None without the prefix cache and session turns (`new_run`)
    rq: np.ndarray
    rp: object
    cache: object
    turns: object
    xfers: object
    step: np.ndarray
    log: np.ndarray
    ctr: np.ndarray
    stats: np.ndarray
    prefix: np.ndarray
    gap_hist: np.ndarray
    spec: object
    dps: object
    sp: object
    pad: object


def new_run(ps, cfg, pools, arrival, prompt, output, u1, u2, chains, spec=None, dps=None, fs=None, log=None) -> Run:
    """The state of a run, allocated in NumPy: ``ps`` one CostParams per pool; ``pools``, ``chains``: see
    engine/POOLS.md; ``fs``: the step cost's shape (None: `kernel_features` of the tables); ``log``: the
    iteration log's records (None: new ones, `cfg.log_size` of them)."""
    n = prompt.shape[0]
    rq = new_requests(arrival, prompt, output, u1, u2, chains.next_turn)
    ctr = new_counters(cfg, n)
    rp = new_replicas(cfg, pools)
    # features the run does not use are None: numba prunes their branches, and compiles the loop
    # without them (one specialisation per feature set, each cached): the prefix cache (only when some
    # chain lists a block: without one it would stay empty), session turns, KV transfers between
    # prefill and decode pools, static batching's padding, speculative decoding
    use_cache = bool(cfg.prefix_caching) and chains.ids.shape[0] > 0
    pd = bool(np.any(pools.role == C.DECODE))
    use_turns = bool(np.any(chains.next_turn >= 0))
    static = cfg.policy == C.STATIC
    union = (use_cache or use_turns or pd or static) and os.environ.get("SERVESIM_KERNEL_UNION") == "1"
    if union:
        # a run with any of the four gets all four, the unused ones empty (the same records:
        # tests/test_golden.py checks both ways); the test suite sets it, so fifteen specialisations
        # compile as one. A cache is added only where no chain lists a block: one present would
        # register and look up chains that a run with prefix caching off ignores.
        use_turns = True
        use_cache = use_cache or chains.ids.shape[0] == 0
    cache = new_cache(cfg, pools, ctr, room=union) if use_cache else None
    turns = new_turns(n) if use_turns else None
    xfers = new_xfers(n if pd else 1) if pd or union else None
    tabs = cost_inputs(ps, pools)
    # the chains are read by the prefix cache and the session turns alone: None without both (pruned)
    kchains = chains if cache is not None or turns is not None else None
    # speculative decoding (``spec``, a state.Spec; ``dps`` the pools' draft CostParams, or the pools' own
    # where nothing drafts on the GPU): None otherwise, and pruned
    dtabs = None
    if spec is not None:
        spec = spec._replace(steps=np.zeros(n, np.int64))
        dtabs = cost_inputs(dps, pools) if dps is not None else tabs
    return Run(tabs, kernel_features(tabs, dtabs) if fs is None else fs,   # the step cost's shape (costmodel/features.py)
               config_record(cfg), kernel_pools(pools), kchains, rq, rp, cache, turns, xfers,
               new_step(cfg.max_num_seqs), new_log(cfg.log_size) if log is None else log, ctr,
               np.zeros((cfg.replicas, N_STATS)),    # per replica (`state.pool_stats_of` folds them into pools)
               np.zeros(C.N_PREFIX), np.zeros(C.GAP_BINS, np.int64), spec, dtabs,
               new_span(cfg, pools.role.shape[0]),  # decode fast-forward (span.py; cfg.fast_forward 0: never used)
               new_pad(cfg, union))


def simulate_pools(ps, cfg, pools, arrival, prompt, output, u1, u2, chains, spec=None, dps=None):
    """Run the kernel: ``ps`` one CostParams per pool; ``pools``, ``chains``: see engine/POOLS.md.
    The state is allocated here, in NumPy (`new_run`), and `run_nb` runs the loop over it."""
    run = new_run(ps, cfg, pools, arrival, prompt, output, u1, u2, chains, spec, dps)
    with compile_ahead(run):
        now, _ = run_nb(*run, 0.0, INF)
    end_run_nb(run.cfg, run.rq, run.rp, run.sp, run.stats, now)
    pool_stats = pool_stats_of(run.stats, pools.first, pools.count)
    transfers = bool(np.any(pools.role != C.MIXED))     # (a prefill or decode pool: KV transfers)
    return engine_output(run.rq, run.log, run.ctr, run.gap_hist, run_totals(pool_stats), pool_stats, run.prefix,
                         transfers)._replace(span_iterations=int(run.sp.row.count.sum()))


def compile_ahead(args):
    """Around the call of `run_nb` with ``args`` (its arguments but ``now`` and ``until``): on a cold
    compile, part of it in a second process (`servesim._compile_ahead`, `ahead_plan`)."""
    return ahead(run_nb, tuple(args), ahead_plan)


def prestart_ahead() -> None:
    """Before a run is lowered: on a first cold compile, the second process started now, to import while
    this one lowers (`servesim._compile_ahead.prestart`)."""
    prestart(run_nb)


def ahead_plan(args) -> tuple:
    """What a second process compiles of `run_nb` for its arguments ``args``, and what this one compiles
    first meanwhile, as (dispatcher, example arguments): there `schedule_nb` (~3 of `run_nb`'s ~10 CPU
    s) and `end_run_nb`, which take the loop's arguments under the same names and its ``r`` (int64) and
    ``now`` (float64); here a decode span's step cost as `events.span_decide_nb` calls it, most of it
    the cost model's code that `schedule_nb` calls too, so the child finds it in the cache
    (tests/test_ahead.py checks that these are the types runs compile)."""
    ex = dict(zip(params(run_nb), args), r=0, now=0.0)
    child = [(schedule_nb, by_name(schedule_nb, ex)), (end_run_nb, by_name(end_run_nb, ex))]
    return child, [(decode_cost_nb, (ex["ps"][0], *ex["fs"], ex["sp"].memo[0], 0, 0))]


def run_totals(pool_stats: np.ndarray) -> np.ndarray:
    """The run's totals (EngineOutput.stats): the pools summed in order; the largest KV in use, the end time."""
    stats = pool_stats.sum(axis=0)
    for j in (STAT_KV_MAX, STAT_END_TIME):
        stats[j] = max(0.0, pool_stats[:, j].max())
    return stats


@njit(**HANDLER)
def skip_followups_nb(rq, ctr):
    while ctr[NEXT_ARRIVAL] < ctr[SENT] and rq.followup[ctr[NEXT_ARRIVAL]]:
        ctr[NEXT_ARRIVAL] += 1


# why `run_nb` returned: every request ended or no event is left; the clock passed cfg.max_time; paused
# at ``until`` (a chunked run, engine/stream.py: the next requests are loaded, then it resumes; a split
# run's window, split.py) or, with cfg.log_all, with its log full (split.py drains it, then it resumes)
RUN_ENDED, RUN_CUT, RUN_PAUSED = 0, 1, 2


@njit(_nrt=False, nogil=True, **JIT)    # (nogil: split runs run sub-runs on threads, split.py)
def run_nb(ps, fs, cfg, pools, chains, rq, rp, cache, turns, xfers, step, log, ctr, stats, prefix, gap_hist, spec, dps, sp,
           pad, now, until):
    """The event loop over state the caller owns (borrowed: see `jit.py`), from ``now``; ``cfg``: the
    EngineConfig as one record (`state.config_record`); returns (the last
    event's time, RUN_*). It pauses before the first event at or after ``until`` (inf: never), leaving
    the state as it was, so that a later call with the same state continues exactly; `end_run_nb` ends it.
    ``ps``, ``dps``: the pools' cost tables and their drafts' (`cost_inputs`; row k pool k's); ``fs``: the
    step cost's shape, covering both (`kernel_features`); ``stats``: one row per replica (N_STATS each),
    each summing its own replica's iterations (`state.pool_stats_of` folds them into the pools')."""
    n = rq.prompt.shape[0]
    skip_followups_nb(rq, ctr)
    while ctr[ENDED] < n:
        if cfg.log_all and ctr[LOG_COUNT] == log.shape[0]:
            return now, RUN_PAUSED      # a split run's sub-run logs every iteration: its full log is drained
        t_comp, k = first_nb(rp.slot_end, rp.slot_tree)
        x = ctr[XFER_NEXT]
        t_x = rq.xfer_ev[x] if x >= 0 else INF
        # the next arrival: the in-order one or the first pending session turn, the in-order one first
        # at equal times
        t_arr = INF
        i = -1
        from_heap = False
        if ctr[NEXT_ARRIVAL] < ctr[SENT]:
            i = ctr[NEXT_ARRIVAL]
            t_arr = rq.arrival[i]
        if turns is not None and ctr[HEAP_N] > 0 and turns.t[0] < t_arr:
            t_arr, i, from_heap = turns.t[0], turns.i[0], True
        t_sch, r = first_nb(rp.wake_at, rp.wake_tree)
        t = min(min(t_comp, t_x), min(t_arr, t_sch))
        if t >= until and t != INF:
            return now, RUN_PAUSED
        if t == INF:
            break
        if t > cfg.max_time:
            return now, RUN_CUT
        now = t
        if t_comp <= t:
            kr, ks = k, 0           # slot k's replica and stage (no integer division at PP 1)
            if cfg.pp > 1:
                kr, ks = k // cfg.pp, k % cfg.pp
            complete_nb(cfg, pools, chains, rq, rp, cache, turns, xfers, ctr, stats, prefix, gap_hist, kr, ks, now,
                        spec, sp, pad)
        elif xfers is not None and t_x <= t:
            transfer_nb(cfg, pools, chains, rq, rp, cache, xfers, ctr, x, now)
        elif t_arr <= t:
            if turns is not None and from_heap:
                heap_pop_nb(turns, ctr)
            else:
                ctr[NEXT_ARRIVAL] += 1
                skip_followups_nb(rq, ctr)
            arrive_nb(cfg, pools, chains, rq, rp, cache, turns, ctr, i, now)
        else:
            # a scheduling decision prices a micro-batch (a decode span's iteration alone in the loop,
            # else `schedule_nb`), and the loop launches it
            priced = span_decide_nb(ps, fs, cfg, pools, rq, rp, sp, r)
            if priced[0] < 0:
                priced = schedule_nb(ps, fs, cfg, pools, chains, rq, rp, cache, step, ctr, stats, prefix, r, now, spec,
                                     dps, sp, pad)
            if priced[0] > 0:
                launch_nb(cfg, pools, rq, rp, step, ctr, stats, log, r, priced, spec, now)
    return now, RUN_ENDED


@njit(_nrt=False, **JIT)
def end_run_nb(cfg, rq, rp, sp, stats, now):
    """End the run at ``now`` (the last event's time): a decode span's requests brought up to date, each
    replica's span with work in flight closed, every pool's end time set."""
    for r in range(cfg.replicas):
        if sp.row.active[r]:    # the clock stopped in a decode span: its requests brought up to date
            span_end_nb(cfg, rq, rp.running, sp, r)
        if rp.row.n_in_flight[r] > 0:
            stats[r, STAT_INFLIGHT_TIME] += now - rp.row.inflight_since[r]
    for k in range(stats.shape[0]):
        stats[k, STAT_END_TIME] = now
