"""The engine's state, declared once: configuration, requests, replicas, the micro-batch being
formed, the run's counters and outputs. Requests are a record array (one structured array: a
handler receives it as one argument, not as 28 arrays, which numba would flatten into hundreds of
arguments per call and compile slowly); so are the per-replica, per-span, per-pool, per-step-member
and per-log-sample fields (`replica_dtype` ...; compiling the loop took ~13% less CPU than with
NamedTuples of arrays), the prefix cache's entries and table slots, the pipeline slots, the spans'
epochs, the links between pools and the session turns' heap. The arrays of other shapes are
NamedTuples of arrays (immutable bundles of mutable arrays); so are the rows that loops scan or shift
(a span's members, a slot's), contiguous so that those loops vectorise (`events.span_finish_nb`; a
record field's view has a stride known only at run time). Built in NumPy by the constructors below,
passed to the jitted event loop.

Names follow the reference simulator (`servesim.reference.sim`): its `Request` and `Replica`
attributes are the fields of `request_dtype` and of `replica_dtype` (or the arrays of `Replicas`) here.
"""
from __future__ import annotations

import math
from typing import NamedTuple, get_type_hints

import numpy as np
from numba import njit

from ..jit import JIT
from ..long_runs import LONG_ABOVE
from . import codes as C
from ..workload.chains import Chains  # noqa: F401  (a kernel input: built by the workload's chain builder)
from ..costmodel.iteration import N_COUNT_TERMS
from .nextevent import new_tree

INF = math.inf


class EngineConfig(NamedTuple):
    policy: int
    router: int
    preemption: int
    replicas: int
    pp: int
    max_num_seqs: int
    max_batched_tokens: int     # token budget per iteration (sarathi: the chunk size)
    max_chunk_tokens: int       # one sequence's prefill chunk per iteration (DP attention: a rank's budget)
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
    fast_forward: int = 1       # 1: decode spans without touching their requests (span.py); 0: step by step
    log_all: int = 0            # 1: a sub-run of a split run (split.py): every iteration logged, the loop
                                # pausing when the log is full (it is drained, then resumed)



# The kernel takes the configuration as one NumPy record (`config_record`): numba passes a record by
# reference, one argument to each handler where the NamedTuple's 20 fields were 20 (each flattened at
# every call and unpacked at every entry: ~0.5 CPU s of a cold compile; README, Speed).
config_dtype = np.dtype([(name, np.float64 if t is float else np.int64)
                         for name, t in get_type_hints(EngineConfig).items()])


def config_record(cfg: EngineConfig):
    """``cfg`` as one record of `config_dtype`, as `kernel.run_nb` and `kernel.end_run_nb` take it."""
    for name, t in get_type_hints(EngineConfig).items():
        v = getattr(cfg, name)
        if t is int and int(v) != v:        # (the record's int64 field would truncate it)
            raise ValueError(f"EngineConfig.{name} = {v!r}: an integer is needed")
    return np.array([tuple(cfg)], config_dtype).view(np.recarray)[0]     # (np.record: fields as attributes with the JIT off too)

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


# The pools as the kernel reads them (`kernel_pools`): one record per pool with the fields of `Pools`
# but the (P, P) links, so a handler's call passes one array for them, not twelve; the links one
# record per pair of pools.
pool_dtype = np.dtype([
    ("role", np.int64),
    ("first", np.int64),
    ("count", np.int64),
    ("pp", np.int64),
    ("num_blocks", np.int64),
    ("watermark_blocks", np.int64),
    ("cpu_blocks", np.int64),
    ("kv_bytes_per_token", np.float64),
    ("kv_bytes_total", np.float64),
    ("kv_gpus", np.int64),
    ("n_layers", np.int64),
    ("weight", np.float64),
])


link_dtype = np.dtype([("bw", np.float64), ("alpha", np.float64)])


class KernelPools(NamedTuple):
    row: np.ndarray             # (P) pool_dtype records
    link: np.ndarray            # (P, P) link_dtype records: Pools.link_bw and link_alpha


def kernel_pools(pools: Pools) -> KernelPools:
    """``pools`` as the kernel reads them: ``row.num_blocks[k]`` for ``num_blocks[k]``, ``link.bw[a, b]`` for
    ``link_bw[a, b]``."""
    P = pools.role.shape[0]
    row = np.zeros(P, pool_dtype)
    for name in pool_dtype.names:
        v = np.asarray(getattr(pools, name))
        if v.shape != (P,) or np.any(v.astype(pool_dtype[name]) != v):
            raise ValueError(f"Pools.{name} is {v!r}: give one {pool_dtype[name]} per pool ({P})")
        row[name] = v
    link = np.zeros(np.shape(pools.link_bw), link_dtype)
    link["bw"] = pools.link_bw
    link["alpha"] = pools.link_alpha
    return KernelPools(row.view(np.recarray), link.view(np.recarray))


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
    pool_stats: np.ndarray      # (P, N_STATS) each pool's share
    prefix: np.ndarray          # prefix-cache counters (codes.HIT_GPU_TOKENS ...)
    xfer_start: np.ndarray      # KV transfer of each request (nan: none)
    xfer_end: np.ndarray
    pf_replica: np.ndarray      # the prefill replica (-1: none)
    span_iterations: int = 0    # iterations run as decode spans (engine/span.py; diagnostic)


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
STAT_DRAFT = 18             # speculative decoding: draft time of the steps
STAT_VERIFY = 19            # ... the rest of the steps that verified drafts (interval - draft)
STAT_SPEC_STEPS = 20        # ... sequence-steps that verified drafts
STAT_SPEC_TOKENS = 21       # ... the tokens those steps yielded (accepted drafts + the target's own)
N_STATS = 22

def pool_stats_of(replica_stats, first, count) -> np.ndarray:
    """Each pool's share of the statistics (EngineOutput.pool_stats) from the kernel's rows, one per
    replica (``replica_stats`` (R, N_STATS): each replica sums its own iterations in its own order, so
    a run split into one sub-run per replica, `split.py`, sums exactly as the whole run does): pool k
    adds its replicas ``first[k] .. first[k] + count[k] - 1`` one after another, in replica order; its
    largest KV in use and its end time are their largest."""
    out = np.zeros((len(first), N_STATS))
    for k in range(len(first)):
        rows = replica_stats[int(first[k]):int(first[k]) + int(count[k])]
        for row in rows:
            out[k] += row
        for j in (STAT_KV_MAX, STAT_END_TIME):
            out[k, j] = rows[:, j].max() if rows.shape[0] else 0.0
    return out


# the run's counters (an int64 array, `new_counters`)
NEXT_ARRIVAL = 0            # the next request to arrive
SENT = 1                    # requests whose send time is known (closed loop: one per client at first)
ROUTED = 2                  # arrivals routed so far (round-robin)
ENDED = 3                   # requests done or rejected
ITERATIONS = 4              # micro-batches launched
LOG_COUNT = 5               # iteration samples in the log
LOG_STRIDE = 6              # one sample kept every LOG_STRIDE iterations
ROUTED_D = 7                # transfers routed to decode replicas (round-robin)
HEAP_N = 8                  # session turns pending in the arrival heap
HELD_HEAD = 9               # requests waiting for a decode replica: a FIFO through the requests' q_next
HELD_TAIL = 10
N_ACTIVE = 11               # KV transfers in flight (the first N_ACTIVE of xfers, `new_xfers`)
XFER_NEXT = 12              # the transfer that ends first (-1: none)
ENTRIES_FREE = 13           # unused prefix-cache entries on the stack (Cache.free_stack)
N_COUNTERS = 14


# One record per request (a NumPy structured array: the kernel's handlers receive it as one array,
# `rq.prompt[i]` reads a field). Inputs first (read only), then the state the engine keeps; with
# the initial value `new_requests` gives each field.
request_dtype = np.dtype([
    ("prompt", np.int64),
    ("output", np.int64),
    ("u1", np.float64),             # router draws
    ("u2", np.float64),
    ("arrival", np.float64),        # engine arrival (closed loop: filled in when a client sends)
    ("scheduled", np.float64),      # nan
    ("first_token", np.float64),    # nan
    ("finish", np.float64),         # nan
    ("last_token", np.float64),     # nan
    ("max_gap", np.float64),
    ("preemptions", np.int64),
    ("replica", np.int64),          # -1
    ("status", np.int64),           # codes.NOT_ARRIVED ... REJECTED
    ("computed", np.int64),         # tokens whose KV is in the cache (prompt and generated)
    ("generated", np.int64),        # output tokens emitted so far
    ("blocks", np.int64),           # KV blocks held
    ("in_flight", np.bool_),
    ("q_next", np.int64),           # -1; next request in its replica's waiting queue or the held FIFO (-1: last)
    ("followup", np.bool_),         # a session's later turn: sent when the turn before ends
    ("n_ref", np.int64),            # its first n_ref chain blocks are prefix-cache entries it references
    ("reg_done", np.bool_),         # stopped registering blocks in the prefix cache
    ("pf_replica", np.int64),       # -1; the prefill replica (-1: none)
    ("src_blocks", np.int64),       # blocks still held on the prefill replica during the transfer
    ("xfer_start", np.float64),     # nan
    ("xfer_end", np.float64),       # nan; when the transfer ends (estimate while in flight)
    ("xfer_left", np.float64),      # bytes left to move
    ("xfer_ev", np.float64),        # its next event: the bytes done (xfer_left > 0), else the transfer done
    ("xfer_t", np.float64),         # when xfer_left was last brought up to date
])


# One record per replica (a record array, like the requests: a handler receives the per-replica
# state as one array, `rp.row.free_blocks[r]` reads a field); with the initial value `new_replicas`
# gives each field.
replica_dtype = np.dtype([
    ("pool", np.int64),
    ("q_head", np.int64),           # -1; waiting queue: a linked list through the requests' q_next
    ("q_tail", np.int64),           # -1
    ("n_waiting", np.int64),
    ("n_running", np.int64),
    ("free_blocks", np.int64),      # the pool's num_blocks
    ("load", np.int64),             # waiting + running, what the routers compare
    ("next_free", np.float64),      # first pipeline stage free at
    ("n_in_flight", np.int64),
    ("inflight_since", np.float64), # start of the current span with work in flight
    ("empty", np.int64),            # the pool's num_blocks; never-used free blocks (free_blocks = empty + the LRU list's blocks)
    ("lru_head", np.int64),         # -1; evictable GPU entries and runs of freed private blocks, least recently freed first
    ("lru_tail", np.int64),         # -1
    ("cpu_head", np.int64),         # -1; CPU-tier entries, least recently stored first
    ("cpu_tail", np.int64),         # -1
    ("cpu_used", np.int64),
    ("n_xfer", np.int64),           # KV transfers leaving the replica (they share its link)
])


# A pipeline slot's micro-batch, one record per slot (`Replicas.slot`; its members are plain 2-D
# arrays, see the module's docstring)
pipe_dtype = np.dtype([
    ("n", np.int64),                # its members
    ("start", np.float64),          # when it was launched
])


class Replicas(NamedTuple):
    """The replicas: ``row`` one record per replica (`replica_dtype`); pipeline slots are flattened to
    index r * cfg.pp + s (cfg.pp: the deepest pool's stages)."""
    row: np.ndarray             # (R) replica_dtype records
    running: np.ndarray         # (R, max_num_seqs) running requests in admission order
    wake_at: np.ndarray         # pending scheduling decision (inf: none); padded, see nextevent.py
    wake_tree: np.ndarray       # the earliest wake_at
    slot_end: np.ndarray        # (R * pp) when the micro-batch in the slot comes out (inf: empty); padded
    slot_tree: np.ndarray       # the earliest slot_end
    slot: np.ndarray            # (R * pp) pipe_dtype records: the slot's micro-batch (its members, launch)
    slot_req: np.ndarray        # (R * pp, max_num_seqs) its members
    slot_chunk: np.ndarray      # (R * pp, max_num_seqs) tokens each member runs
    stage_free: np.ndarray      # (R, pp) later pipeline stages 1..pp-1 free at
    entry: np.ndarray           # the replicas arrivals go to (mixed and prefill pools)
    decode: np.ndarray          # the decode replicas


# Prefix-cache entries, one record per entry (a record array, as the replicas': one argument where
# six arrays were 42 words), and the slots of the open-addressing table that finds them
entry_dtype = np.dtype([
    ("block", np.int64),            # block id
    ("rep", np.int64),              # replica
    ("ref", np.int64),              # requests referencing it (GPU); 0: evictable
    ("tier", np.int64),             # 0 GPU, 1 CPU, 2 being reloaded, 3 a run of freed private blocks (prefix.RUN)
    ("prev", np.int64),             # LRU links (GPU or CPU list of its replica)
    ("next", np.int64),
])
table_dtype = np.dtype([
    ("key", np.int64),              # block id * R + replica (-1: empty slot)
    ("val", np.int64),              # its entry
])


class Cache(NamedTuple):
    """Prefix-cache entries (replica, block id) and the open-addressing table that finds them."""
    entry: np.ndarray           # (E) entry_dtype records
    free_stack: np.ndarray      # unused entries
    table: np.ndarray           # (H) table_dtype records


# Session turns waiting to be sent: a binary min-heap on (time, request), one record per heap node
turn_dtype = np.dtype([("t", np.float64), ("i", np.int64)])


class Spec(NamedTuple):
    """Speculative decoding (costmodel/speculative.py; None when a run does not use it): every decode
    step of request i verifies ``k`` draft tokens and yields ``yields[start[i] + steps[i]]`` tokens
    (1 .. k + 1, drawn before the run, `spec_draws`); ``draft`` 1: the pools' draft params price the
    drafting, ``proj`` 1: plus the 2h -> h projection of EAGLE / MTP."""
    k: int
    draft: int
    proj: int
    yields: np.ndarray          # int64, per request from start[i]
    start: np.ndarray           # int64
    steps: np.ndarray           # int64, decode steps taken (state)


# Decode fast-forward (`span.py`), one record per replica: a span of iterations whose batch starts
# with the whole running list, every member decoding, run from these aggregates (admissions after
# them run request by request, and join the span once decoding); the members' records are brought
# up to date once, when the span ends.
span_dtype = np.dtype([
    ("active", np.int64),           # 1 while replica r runs a span
    ("n", np.int64),                # members: the first n of its running list
    ("kv0", np.int64),              # their computed tokens when they joined less the span's completions then, summed
    ("fin", np.int64),              # the span's completion that ends a member (counted from 1)
    ("launched", np.int64),         # iterations of the span launched
    ("done", np.int64),             # ... and completed
    ("n_warm", np.int64),           # members whose gaps go to the histogram (arrived after the warm-up)
    ("t_last", np.float64),         # the members' last token (the span's last completion)
    ("n_epochs", np.int64),
    ("gap_bin", np.int64),          # the histogram bin of its latest gap (span.gap_bin_near_nb's guess)
    ("count", np.int64),            # iterations the replica ran as spans (diagnostic)
])
epoch_dtype = np.dtype([
    ("start", np.int64),            # the span's completions when the epoch began (members joined)
    ("longest", np.float64),        # the longest gap of the epoch's completions
])


class Span(NamedTuple):
    """Decode fast-forward: ``row`` one `span_dtype` record per replica, and the per-member arrays."""
    row: np.ndarray             # (R) span_dtype records
    hits: np.ndarray            # (R, block_size): members taking a block at the span's iterations j = q (mod block_size)
    epoch: np.ndarray           # (R, max_num_seqs) the epoch a member (by running position) joined in
    fin_at: np.ndarray          # (R, max_num_seqs) the span's completion that ends the member (its last token)
    epochs: np.ndarray          # (R, SPAN_EPOCHS) epoch_dtype records
    memo: np.ndarray            # (P, max_num_seqs + 1, ...) each pool's step cost terms by decode count
                                # (costmodel.iteration.decode_cost_nb; zeros: not yet computed)


SPAN_EPOCHS = 32                # joins per span (then joiners wait for the next span)


# The micro-batch being formed in one scheduling step (reused from step to step), one record per member
step_dtype = np.dtype([
    ("req", np.int64),
    ("chunk", np.int64),
    ("pf_cand", np.int64),          # running partial prefills set aside until the decodes are in
])

# Decimated iteration samples, one record per sample
log_dtype = np.dtype([
    ("time", np.float64),
    ("replica", np.int64),
    ("seqs", np.int64),
    ("tokens", np.int64),
    ("kv_blocks", np.int64),
    ("waiting", np.int64),
])


# new_requests and engine_output go through the records in blocks of this many (~0.8 MB, cache-sized):
# each field of a block is read or written in cache and the records pass through memory once, where
# field by field over the whole array each field's pass would stream them through memory again
BLOCK = 4096


def request_template() -> np.ndarray:
    """One record with each field's initial value (`request_dtype`'s comments)."""
    t = np.zeros(1, request_dtype)
    for name in ("scheduled", "first_token", "finish", "last_token", "xfer_start", "xfer_end"):
        t[name] = np.nan
    for name in ("replica", "q_next", "pf_replica"):
        t[name] = -1
    return t


def new_requests(arrival, prompt, output, u1, u2, next_turn, out=None):
    """The requests' records (``out``: into these, a contiguous `request_dtype` array of the same length)."""
    n = prompt.shape[0]
    rq = np.empty(n, request_dtype) if out is None else out
    raw = rq.view(np.uint8).reshape(n, request_dtype.itemsize)
    template = request_template().view(np.uint8)
    inputs = (("prompt", prompt), ("output", output), ("u1", u1), ("u2", u2), ("arrival", arrival))
    for a in range(0, n, BLOCK):
        b = min(a + BLOCK, n)
        raw[a:b] = template
        block = rq[a:b]
        for name, v in inputs:
            block[name] = v[a:b]
    later = next_turn[next_turn >= 0]
    rq["followup"][later] = True
    rq["arrival"][later] = np.inf   # a session's later turn is sent when the turn before ends
    return rq.view(np.recarray)     # (rq.prompt also without numba: NUMBA_DISABLE_JIT=1)


def new_replicas(cfg, pools):
    R = cfg.replicas
    B = cfg.max_num_seqs
    S = R * cfg.pp
    wake_at, wake_tree = new_tree(R)
    slot_end, slot_tree = new_tree(S)
    pool = np.repeat(np.arange(pools.role.shape[0], dtype=np.int64), pools.count).astype(np.int64)
    row = np.zeros(R, replica_dtype)
    row["pool"] = pool
    row["free_blocks"] = row["empty"] = pools.num_blocks[pool]
    for name in ("q_head", "q_tail", "lru_head", "lru_tail", "cpu_head", "cpu_tail"):
        row[name] = -1
    is_decode = pools.role[pool] == C.DECODE
    entry = np.flatnonzero(~is_decode).astype(np.int64)
    decode = np.flatnonzero(is_decode).astype(np.int64)
    return Replicas(row.view(np.recarray), np.full((R, B), -1, np.int64), wake_at, wake_tree, slot_end, slot_tree,
                    np.zeros(S, pipe_dtype).view(np.recarray), np.full((S, B), -1, np.int64), np.zeros((S, B), np.int64),
                    np.zeros((R, cfg.pp)), entry, decode)


def new_cache(cfg, pools, ctr, room: bool = False):
    """Room for every block a replica can hold on its GPU and CPU tier (none without prefix caching,
    unless ``room``)."""
    E = int(np.sum(pools.count * (pools.num_blocks + pools.cpu_blocks))) if cfg.prefix_caching or room else 0
    H = 1
    while H < 2 * E:
        H *= 2
    ctr[ENTRIES_FREE] = E
    entry = np.zeros(E, entry_dtype)
    entry["prev"] = entry["next"] = -1
    table = np.zeros(H, table_dtype)
    table["key"] = -1
    return Cache(entry.view(np.recarray), np.arange(E - 1, -1, -1, dtype=np.int64), table.view(np.recarray))


def new_turns(n):
    return np.zeros(n, turn_dtype).view(np.recarray)


def new_xfers(n):
    """The requests whose KV transfer is in flight (room for ``n``)."""
    return np.zeros(n, np.int64)


def new_span(cfg, n_pools):
    R = cfg.replicas
    return Span(np.zeros(R, span_dtype).view(np.recarray), np.zeros((R, cfg.block_size), np.int64),
                np.zeros((R, cfg.max_num_seqs), np.int64), np.zeros((R, cfg.max_num_seqs), np.int64),
                np.zeros((R, SPAN_EPOCHS), epoch_dtype).view(np.recarray),
                np.zeros((n_pools, cfg.max_num_seqs + 1, 1 + N_COUNT_TERMS)))


# static batching's padding (`new_pad`, per replica): its finished members still padding the batch and
# their KV tokens
PAD_SEQS, PAD_KV = 0, 1


def new_pad(cfg, union: bool = False):
    """The padding of static batching, zeros, or None for the other policies (pruned, as an unused
    feature is: `kernel.simulate_pools`); ``union``: given to every policy (the kernel then checks the
    policy)."""
    if cfg.policy != C.STATIC and not union:
        return None
    return np.zeros((cfg.replicas, 2), np.int64)


def new_step(B):
    return np.zeros(B, step_dtype).view(np.recarray)


def new_log(size):
    return np.zeros(max(size, 2), log_dtype).view(np.recarray)


def new_counters(cfg, n):
    ctr = np.zeros(N_COUNTERS, np.int64)
    ctr[SENT] = min(cfg.concurrency, n) if cfg.concurrency > 0 else n
    ctr[LOG_STRIDE] = 1
    ctr[HELD_HEAD] = -1
    ctr[HELD_TAIL] = -1
    ctr[XFER_NEXT] = -1
    return ctr


OUTPUT_FIELDS = ("arrival", "scheduled", "first_token", "finish", "preemptions", "replica", "status", "max_gap")
TRANSFER_FIELDS = ("xfer_start", "xfer_end", "pf_replica")     # only KV transfers (a decode pool) set these


GATHER_JIT_ABOVE = LONG_ABOVE     # more requests: the output fields gathered in one jitted pass (`gather_nb`)


def output_columns(rq, names=OUTPUT_FIELDS + TRANSFER_FIELDS) -> dict:
    """The records' fields ``names``, each as its own contiguous array: gathered block by block, or for
    more than GATHER_JIT_ABOVE requests (and the engine's fields) in one jitted pass over the records,
    which reads each record once where NumPy copies a field at a time (~13 ms against ~33 ms for a
    million requests here; tests/test_engine_layout.py checks both give the same arrays)."""
    n = rq.shape[0]
    cols = {name: np.empty(n, request_dtype[name]) for name in names}
    if n > GATHER_JIT_ABOVE and names in (OUTPUT_FIELDS, OUTPUT_FIELDS + TRANSFER_FIELDS):
        none_f, none_i = np.empty(0), np.empty(0, np.int64)     # (no transfer fields asked: not written)
        gather_nb(rq, *(cols[k] for k in OUTPUT_FIELDS), cols.get("xfer_start", none_f),
                  cols.get("xfer_end", none_f), cols.get("pf_replica", none_i))
        return cols
    for a in range(0, n, BLOCK):
        block = rq[a:a + BLOCK]
        for name, col in cols.items():
            col[a:a + BLOCK] = block[name]
    return cols


@njit(nogil=True, **JIT)    # (nogil: a split run's sub-runs gather theirs on threads, split.py)
def gather_nb(rq, arrival, scheduled, first_token, finish, preemptions, replica, status, max_gap, xfer_start,
              xfer_end, pf_replica):
    """`output_columns`' jitted pass: each record's OUTPUT_FIELDS (and TRANSFER_FIELDS, when their
    arrays are not empty) into the arrays of those names."""
    transfers = xfer_start.shape[0] > 0
    for i in range(rq.shape[0]):
        arrival[i] = rq[i].arrival
        scheduled[i] = rq[i].scheduled
        first_token[i] = rq[i].first_token
        finish[i] = rq[i].finish
        preemptions[i] = rq[i].preemptions
        replica[i] = rq[i].replica
        status[i] = rq[i].status
        max_gap[i] = rq[i].max_gap
        if transfers:
            xfer_start[i] = rq[i].xfer_start
            xfer_end[i] = rq[i].xfer_end
            pf_replica[i] = rq[i].pf_replica


def engine_output(rq, log, ctr, gap_hist, stats, pool_stats, prefix, transfers: bool = True):
    """The run's EngineOutput. Without KV transfers (``transfers`` False: no decode pool) the transfer
    fields are not gathered (`output_of`): a million requests' peak memory is then 24 MB lower."""
    f = output_columns(rq, OUTPUT_FIELDS + (TRANSFER_FIELDS if transfers else ()))
    return output_of(f, log, ctr, gap_hist, stats, pool_stats, prefix)


def output_of(f: dict, log, ctr, gap_hist, stats, pool_stats, prefix, span_iterations: int = 0) -> EngineOutput:
    """The EngineOutput of a run's gathered columns ``f`` (OUTPUT_FIELDS, and TRANSFER_FIELDS where the
    run has KV transfers: a transfer field not in ``f`` holds its initial value everywhere, given as a
    read-only view of that one value) and its log (``log``, counters ``ctr``)."""
    k = int(ctr[LOG_COUNT])
    start = request_template()[0]
    f = {**{name: np.broadcast_to(start[name], f["arrival"].shape) for name in TRANSFER_FIELDS if name not in f}, **f}
    return EngineOutput(f["arrival"], f["scheduled"], f["first_token"], f["finish"], f["preemptions"], f["replica"],
                        f["status"], f["max_gap"], gap_hist, log.time[:k].copy(), log.replica[:k].copy(),
                        log.seqs[:k].copy(), log.tokens[:k].copy(), log.kv_blocks[:k].copy(),
                        log.waiting[:k].copy(), k, stats, pool_stats, prefix, f["xfer_start"], f["xfer_end"],
                        f["pf_replica"], span_iterations)
