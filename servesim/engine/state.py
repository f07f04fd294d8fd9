"""The engine's state, declared once: configuration, requests, replicas, the micro-batch being
formed, the run's counters and outputs. Structures of arrays in NamedTuples (immutable bundles of
mutable arrays), built by jitted constructors, passed whole to the event handlers.

Names follow the reference simulator (`servesim.reference.sim`): its `Request` and `Replica`
attributes are the arrays of `Requests` and `Replicas` here, one element per request or replica.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from numba import njit

from .nextevent import new_tree_nb

INF = math.inf


class EngineConfig(NamedTuple):
    policy: int
    router: int
    preemption: int
    replicas: int
    pp: int
    max_num_seqs: int
    max_batched_tokens: int     # token budget per iteration (sarathi: the chunk size)
    block_size: int
    num_blocks: int             # KV blocks per replica
    watermark_blocks: int
    concurrency: int            # > 0: closed loop with this many clients
    max_time: float             # stop the clock here (inf: run until every request ends)
    warmup_time: float          # gaps of requests arriving before this are not histogrammed
    kv_bytes_per_token: float   # per GPU, for swap traffic
    log_size: int               # iteration samples kept (decimated)
    frontend: float             # closed loop: a client's next request reaches the engine this long after it is sent
    prefix_caching: int = 0     # 1: automatic prefix caching over `Chains` (POOLS.md)
    layerwise: int = 0          # 1: KV transfers pipelined layer by layer (only the last layer exposed)


class Pools(NamedTuple):
    """One element per pool (POOLS.md); pool k's replicas are first[k] .. first[k] + count[k] - 1."""
    role: np.ndarray            # codes.MIXED, PREFILL, DECODE
    first: np.ndarray
    count: np.ndarray
    pp: np.ndarray
    num_blocks: np.ndarray      # KV blocks per replica
    watermark_blocks: np.ndarray
    cpu_blocks: np.ndarray      # CPU-tier blocks per replica (0: none)
    kv_bytes_per_token: np.ndarray   # per GPU (swap and CPU-tier traffic)
    kv_bytes_total: np.ndarray  # per token, all GPUs of a replica (KV transfers)
    kv_gpus: np.ndarray         # GPUs a replica's KV cache is spread over
    n_layers: np.ndarray
    weight: np.ndarray          # router weight (capacity per replica)
    link_bw: np.ndarray         # (P, P) achieved B/s between a GPU of pool a and one of pool b
    link_alpha: np.ndarray      # (P, P) s


class Chains(NamedTuple):
    """Prefix-cache block ids per request (equal id: equal content) and session turns (POOLS.md)."""
    start: np.ndarray
    length: np.ndarray
    ids: np.ndarray
    next_turn: np.ndarray       # the session's next request (-1: none)
    think: np.ndarray           # s from the previous turn's end to this request's send


class EngineOutput(NamedTuple):
    arrival: np.ndarray
    scheduled: np.ndarray
    first_token: np.ndarray
    finish: np.ndarray
    preemptions: np.ndarray
    replica: np.ndarray
    status: np.ndarray
    max_gap: np.ndarray
    gap_hist: np.ndarray
    log_time: np.ndarray
    log_replica: np.ndarray
    log_seqs: np.ndarray
    log_tokens: np.ndarray
    log_kv_blocks: np.ndarray
    log_waiting: np.ndarray
    log_count: int
    stats: np.ndarray           # see STAT_* below


# run totals (EngineOutput.stats)
STAT_ITERATIONS = 0
STAT_END_TIME = 1
STAT_BUSY = 2               # sum over replicas of first-stage busy (interval) time
STAT_SEQS_TIME = 3          # sum of batch size x interval
STAT_KV_TIME = 4            # sum of KV blocks in use x interval
STAT_KV_MAX = 5             # max KV blocks in use on any replica
STAT_FLOPS = 6
STAT_BYTES = 7
STAT_PREEMPTIONS = 8
STAT_SWAP_TIME = 9
STAT_GEMM = 10
STAT_ATTN = 11
STAT_ELEM = 12
STAT_COMM = 13
STAT_OVERHEAD = 14
STAT_TOKENS_TIME = 15       # sum of tokens x interval
STAT_INFLIGHT_TIME = 16     # sum over replicas of time with at least one micro-batch in flight
STAT_STAGE_BUSY = 17        # sum over replicas of the busy time of each later pipeline stage
N_STATS = 18

# the run's counters (an int64 array, `new_counters`)
NEXT_ARRIVAL = 0            # the next request to arrive
SENT = 1                    # requests whose send time is known (closed loop: one per client at first)
ROUTED = 2                  # arrivals routed so far (round-robin)
ENDED = 3                   # requests done or rejected
ITERATIONS = 4              # micro-batches launched
LOG_COUNT = 5               # iteration samples in the log
LOG_STRIDE = 6              # one sample kept every LOG_STRIDE iterations
N_COUNTERS = 7


class Requests(NamedTuple):
    """One element per request. Inputs first (read only), then the state the engine keeps."""
    prompt: np.ndarray
    output: np.ndarray
    group: np.ndarray           # shared-prefix group (-1: none)
    hit: np.ndarray             # prompt tokens it can take from its replica's prefix cache
    u1: np.ndarray              # router draws
    u2: np.ndarray
    arrival: np.ndarray         # engine arrival (closed loop: filled in when a client sends)
    scheduled: np.ndarray
    first_token: np.ndarray
    finish: np.ndarray
    last_token: np.ndarray
    max_gap: np.ndarray
    preemptions: np.ndarray
    replica: np.ndarray
    status: np.ndarray          # codes.NOT_ARRIVED ... REJECTED
    computed: np.ndarray        # tokens whose KV is in the cache (prompt and generated)
    generated: np.ndarray       # output tokens emitted so far
    blocks: np.ndarray          # KV blocks held
    in_flight: np.ndarray
    q_next: np.ndarray          # next request in its replica's waiting queue (-1: last)


class Replicas(NamedTuple):
    """One element (row) per replica; pipeline slots are flattened to index r * pp + s."""
    q_head: np.ndarray          # waiting queue: a linked list through Requests.q_next
    q_tail: np.ndarray
    n_waiting: np.ndarray
    running: np.ndarray         # (R, max_num_seqs) running requests in admission order
    n_running: np.ndarray
    free_blocks: np.ndarray
    load: np.ndarray            # waiting + running, what the routers compare
    next_free: np.ndarray       # first pipeline stage free at
    wake_at: np.ndarray         # pending scheduling decision (inf: none); padded, see nextevent.py
    wake_tree: np.ndarray       # the earliest wake_at
    slot_end: np.ndarray        # (R * pp) when the micro-batch in the slot comes out (inf: empty); padded
    slot_tree: np.ndarray       # the earliest slot_end
    slot_n: np.ndarray          # (R * pp) its members
    slot_req: np.ndarray        # (R * pp, max_num_seqs)
    slot_chunk: np.ndarray      # (R * pp, max_num_seqs) tokens each member runs
    n_in_flight: np.ndarray
    inflight_since: np.ndarray  # start of the current span with work in flight
    stage_free: np.ndarray      # (R, pp) later pipeline stages 1..pp-1 free at
    pad_seqs: np.ndarray        # static: finished members still padding the batch
    pad_kv: np.ndarray
    prefix_seen: np.ndarray     # (R, groups) the group's prefix is in the replica's cache


class Step(NamedTuple):
    """The micro-batch being formed in one scheduling step (reused from step to step)."""
    req: np.ndarray
    chunk: np.ndarray
    pf_cand: np.ndarray         # running partial prefills set aside until the decodes are in


class Log(NamedTuple):
    """Decimated iteration samples."""
    time: np.ndarray
    replica: np.ndarray
    seqs: np.ndarray
    tokens: np.ndarray
    kv_blocks: np.ndarray
    waiting: np.ndarray


@njit(cache=True, no_cpython_wrapper=True)
def new_requests(arrival, prompt, output, u1, u2, group, hit):
    n = prompt.shape[0]
    return Requests(prompt, output, group, hit, u1, u2, arrival.copy(), np.full(n, np.nan), np.full(n, np.nan),
                    np.full(n, np.nan), np.full(n, np.nan), np.zeros(n), np.zeros(n, np.int64),
                    np.full(n, -1, np.int64), np.zeros(n, np.int64), np.zeros(n, np.int64), np.zeros(n, np.int64),
                    np.zeros(n, np.int64), np.zeros(n, np.bool_), np.full(n, -1, np.int64))


@njit(cache=True, no_cpython_wrapper=True)
def new_replicas(cfg, n_groups):
    R = cfg.replicas
    B = cfg.max_num_seqs
    S = R * cfg.pp
    wake_at, wake_tree = new_tree_nb(R)
    slot_end, slot_tree = new_tree_nb(S)
    return Replicas(np.full(R, -1, np.int64), np.full(R, -1, np.int64), np.zeros(R, np.int64),
                    np.full((R, B), -1, np.int64), np.zeros(R, np.int64), np.full(R, cfg.num_blocks, np.int64),
                    np.zeros(R, np.int64), np.zeros(R), wake_at, wake_tree, slot_end, slot_tree, np.zeros(S, np.int64),
                    np.full((S, B), -1, np.int64), np.zeros((S, B), np.int64), np.zeros(R, np.int64), np.zeros(R),
                    np.zeros((R, cfg.pp)), np.zeros(R, np.int64), np.zeros(R, np.int64),
                    np.zeros((R, n_groups), np.bool_))


@njit(cache=True, no_cpython_wrapper=True)
def new_step(B):
    return Step(np.zeros(B, np.int64), np.zeros(B, np.int64), np.zeros(B, np.int64))


@njit(cache=True, no_cpython_wrapper=True)
def new_log(size):
    L = max(size, 2)
    return Log(np.zeros(L), np.zeros(L, np.int64), np.zeros(L, np.int64), np.zeros(L, np.int64),
               np.zeros(L, np.int64), np.zeros(L, np.int64))


@njit(cache=True, no_cpython_wrapper=True)
def new_counters(cfg, n):
    ctr = np.zeros(N_COUNTERS, np.int64)
    ctr[SENT] = min(cfg.concurrency, n) if cfg.concurrency > 0 else n
    ctr[LOG_STRIDE] = 1
    return ctr


@njit(cache=True, no_cpython_wrapper=True)
def n_groups_nb(group):
    g = 1
    for i in range(group.shape[0]):
        if group[i] + 1 > g:
            g = group[i] + 1
    return g


@njit(cache=True, no_cpython_wrapper=True)
def engine_output_nb(rq, log, ctr, gap_hist, stats):
    k = ctr[LOG_COUNT]
    return EngineOutput(rq.arrival, rq.scheduled, rq.first_token, rq.finish, rq.preemptions, rq.replica,
                        rq.status, rq.max_gap, gap_hist, log.time[:k].copy(), log.replica[:k].copy(),
                        log.seqs[:k].copy(), log.tokens[:k].copy(), log.kv_blocks[:k].copy(),
                        log.waiting[:k].copy(), k, stats)

