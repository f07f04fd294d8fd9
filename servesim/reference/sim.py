"""The slow, obvious twin of the jitted engine (`servesim.engine.kernel`).

Written independently in plain Python -- objects, lists, dicts and deques -- so that it reads like
the documentation of the engine's semantics. Its methods are the engine's handlers, by the same
names (`complete`, `arrive`, `route`, `schedule`, `static_batch`, `continuous_batch`, `preempt`,
`launch`, ... here; `complete_nb`, ... in `servesim/engine/events.py` and `schedule.py`). The tests
demand that both agree exactly, request by request. Only the iteration cost function is shared:
`iteration_components_nb`, called here from Python with batch aggregates summed in the same order
as the engine sums them. `reference_simulate_pools` is the twin of `kernel.simulate_pools`;
`reference_run` takes the same lowered inputs as `engine.run.run` (`engine.lower.KernelInputs`).

Semantics
---------
The full statement of pools, prefix caching, sessions and prefill/decode disaggregation is
`servesim/engine/POOLS.md`; what follows summarises it.

Pools. A deployment is P pools of contiguous replicas; pool k has its own cost params `ps[k]`,
pipeline depth, KV blocks, watermark, CPU tier, router weight and role (mixed, prefill, decode).

Events and their total order. At equal times a micro-batch *completion* comes first (it emits
tokens and frees KV blocks), then a *KV transfer* event, then an *arrival*, then a *scheduling*
decision, so a request arriving exactly when blocks free up is admitted in that same scheduling
step. Among completions the lowest (replica, pipeline slot) goes first; among transfer events the
lowest request index; among replicas ready to schedule, the lowest replica index. The clock stops
when no event is left or the next one lies after `max_time`.

Arrival. Requests arrive in index order, except a session's later turns (some request's
`next_turn`): those are sent `think` seconds after the previous turn ends and reach the engine
`frontend` later (a min-heap on (time, index); ties: the in-order one first). The router picks an
*entry* replica (mixed or prefill pools; see `route`: least-requests compares load / weight,
least-kv free blocks as a fraction of the pool's, prefix-aware the longest cached prefix); a
request that can never fit in the KV cache (more blocks than capacity minus the watermark; for a
prefill pool its prompt there, or, when it wants more than one token, prompt + output in every
decode pool) is rejected on the spot,
otherwise it joins the back of that replica's waiting queue. With `concurrency > 0` the run is
closed-loop: the first `concurrency` requests are sent at their given times, and every request
that ends (done or rejected) lets its client send the next request at that instant, which reaches
the engine `frontend` later (arrival times here are the engine's).

Scheduling (one micro-batch per step; a replica with PP stages holds up to PP in flight):
  static    when nothing runs, admit waiting requests FCFS while their whole prompt + output
            reservation fits (a prefill replica: the prompt only; blocks a request already holds
            count towards it); the batch then runs (finished members keep padding it as decodes)
            until every member is done.
  vllm,     1) running requests not in flight, in admission order (vllm: decodes and partial
  sarathi,     prefills alike, as vLLM V1; the others: first the decodes, then the partial prefills),
               within `max_num_seqs` sequences and the token budget (sarathi's
  orca,        budget is its chunk size); a prefill longer than the budget, or than
  vllm-v0      `max_chunk_tokens` (DP attention: one rank's budget), is chunked (orca skips
               it instead). If a request's next KV blocks do not fit, the youngest running request
               that is neither in flight nor already in this batch is preempted (possibly the
               request itself), until they fit -- except that a request never preempts itself
               while a micro-batch of its replica is in flight: it waits for that micro-batch
               (whose requests become preemptable), since giving up its own blocks to requests
               in flight can livelock a pipeline (PP > 1) forever.
            2) unless something was preempted (or had to wait) in this step, admit waiting
               requests FCFS while the blocks they need leave at least `watermark` blocks free
               (an admission needing no new block at all is not held back by the watermark);
               vllm/sarathi chunk the head to the remaining budget (at most `max_chunk_tokens`),
               orca/vllm-v0 take whole prompts only (an empty batch takes a prompt longer than the budget whole).
            vllm-v0 is prefill-prioritised: if the head of the queue can be admitted, the step
            admits only (no running requests); otherwise it is a decode-only step (1 without 2).
Preemption. recompute: the victim drops its KV cache and its computed tokens and goes to the front
of the waiting queue. swap: the victim keeps its computed tokens, its blocks are freed and it goes
to the front of the queue as swapped; swapping out and later in each costs
`swap_alpha + computed * kv_bytes_per_token / swap_bw`, added to that step's duration.

Prefix cache (`cfg.prefix_caching`; `KVCache`). Each request carries a chain of block ids (equal
id: equal content). A replica keeps cached blocks as entries, on the GPU (refcounted; those at 0
are evictable, in an LRU, and count as free) or in its CPU tier. Admitting a request with nothing
computed looks up the longest prefix of its chain cached there (at most (prompt - 1) // bs
blocks), atomically with the admission: its GPU entries are referenced, its CPU entries reloaded
(the step pays swap_alpha + bytes / swap_bw), and it starts with those tokens computed. Taking
blocks evicts LRU entries (to the CPU tier if there is one, dropping the CPU LRU head when full).
A completion registers the request's newly full blocks of its chain (until one is already cached:
`reg_done`); freeing releases private blocks, then the entries from the chain's tail to its head.

Prefill/decode disaggregation. A request whose prompt completes on a prefill replica (and wants
more than one token) leaves the running list with its blocks, reserves blocks_for(prompt + 1)
blocks on a decode replica that fits (its pool holds blocks_for(prompt + output) within capacity
minus the watermark, and the reservation leaves the watermark free now: the router's choice if it
fits, else the next fitting one in decode-list order, wrapping) or waits in the `held` FIFO
(retried from its head when a request finishes on a decode replica), and moves its KV:
prompt * kv_bytes_total / min(kv_gpus) bytes over the prefill replica's egress, shared equally by
its active transfers (layerwise: only what the prefill did not hide), then `link_alpha`. At the
transfer's end the prefill blocks are freed, the first token is emitted and the request runs its
decodes on the decode replica (a decode replica with `max_num_seqs` running queues it at the front
of its waiting queue, with its blocks).

Completion. Each member's chunk becomes computed; a member whose computed tokens reach
prompt + generated emits one token (the first token, or an inter-token gap). A request that has
generated its output tokens is done: it frees its blocks and leaves the running list.

Pricing. A member is a decode when it has generated tokens and exactly one token pending;
otherwise it is a prefill chunk. Aggregates: prefill tokens, prefill chunks, sampling sequences
(chunk == pending), causal attention pairs c * (ctx + (c + 1) / 2), prefill KV reads ctx + c,
decodes and their KV reads ctx + 1. The micro-batch occupies the first pipeline stage for
`interval` (plus the swap time) and takes `latency` (plus the swap time) to come out of an idle
pipeline. With PP > 1 stages the pipeline is first in, first out: each later stage spends
(latency - interval) / (PP - 1) on it, starting when the stage before has passed it on and the
stage has finished the micro-batch before it, so a light micro-batch never overtakes a heavy one.

Busy time. `busy` sums the first stage's intervals, `stage_busy` what each later stage spends,
`inflight_time` the time with at least one micro-batch in flight (the engine has work); each is
summed per replica, and each pool's share (a row of `pool_stats`) adds its replicas' in replica
order (`state.pool_stats_of`, as the kernel does).
"""
from __future__ import annotations

import heapq
import math
from collections import OrderedDict, deque
from dataclasses import dataclass, field

import numpy as np

from ..costmodel.features import features
from ..costmodel.fields import table
from ..costmodel.iteration import iteration_components_nb
from ..costmodel.speculative import draft_time_nb
from ..engine import codes as C
from ..engine import state as S

INF = math.inf
GPU = 0
CPU = 1


class KVAccountingError(AssertionError):
    """The reference found KV blocks going negative, above capacity, or not returning to the pool."""


@dataclass(eq=False)
class Request:
    index: int
    arrival: float
    prompt: int
    output: int
    status: int = C.NOT_ARRIVED
    replica: int = -1
    scheduled: float = math.nan
    first_token: float = math.nan
    finish: float = math.nan
    last_token: float = math.nan
    max_gap: float = 0.0
    preemptions: int = 0
    computed: int = 0          # tokens whose KV is in the cache (prompt and generated)
    generated: int = 0         # output tokens emitted so far
    blocks: int = 0            # KV blocks held (the first n_ref are entries of its chain)
    in_flight: bool = False
    ends: int = 0              # how many times the request ended (must be exactly one)
    chain: tuple = ()          # prefix-cache block ids (POOLS.md)
    n_ref: int = 0             # chain entries it references
    reg_done: bool = False     # stopped registering its blocks
    next_turn: int = -1        # the session's next request
    think: float = 0.0
    is_turn: bool = False      # some request's next_turn: sent when that one ends
    xfer_start: float = math.nan
    xfer_end: float = math.nan
    pf_replica: int = -1       # the prefill replica of a disaggregated request
    dec_replica: int = -1      # its decode replica (from the reservation)
    dec_blocks: int = 0        # blocks reserved there
    t_prefill: float = 0.0     # duration of the micro-batch that finished its prompt
    was_held: bool = False     # waited for a decode replica (layerwise: nothing streamed meanwhile)

    @property
    def pending(self) -> int:
        """Tokens still to be run through the model before the next token comes out."""
        return self.prompt + self.generated - self.computed

    @property
    def is_decode(self) -> bool:
        return self.generated > 0 and self.pending == 1


@dataclass(eq=False)
class Entry:
    tier: int                  # GPU or CPU
    ref: int = 0               # requests referencing it (GPU)


class KVCache:
    """One replica's GPU blocks with vLLM's automatic prefix cache and an optional CPU tier.

    free = never-used blocks (`empty`) + the blocks of `gpu_lru`, vLLM V1's free block queue in the
    order they were freed: evictable GPU entries (refcount 0, key: block id) and runs of freed
    private blocks (key: ("run", k), value: blocks left). Without prefix caching no entry is ever
    made and this is a plain block pool."""

    def __init__(self, capacity: int, cpu_capacity: int = 0):
        self.capacity = capacity
        self.cpu_capacity = cpu_capacity
        self.empty = capacity
        self.entries: dict = {}                 # block id -> Entry
        self.gpu_lru: OrderedDict = OrderedDict()
        self.cpu_lru: OrderedDict = OrderedDict()
        self.run_blocks = 0                     # blocks in the runs of gpu_lru
        self.runs = 0                           # runs made (their keys)
        self.live_runs = 0                      # runs in gpu_lru
        self.gpu_evictions = 0
        self.cpu_evictions = 0

    @property
    def free(self) -> int:
        return self.empty + self.run_blocks + len(self.gpu_lru) - self.live_runs

    @property
    def in_use(self) -> int:
        return self.capacity - self.free

    def take(self, n: int) -> None:
        """n new blocks: never-used ones first, then from the head of gpu_lru: a run's blocks, an
        entry evicted (to the CPU tier if any)."""
        if n < 0 or n > self.free:
            raise KVAccountingError(f"take {n} blocks with {self.free} of {self.capacity} free")
        for _ in range(n):
            if self.empty > 0:
                self.empty -= 1
                continue
            bid = next(iter(self.gpu_lru))
            if is_run(bid):
                self.run_blocks -= 1
                self.gpu_lru[bid] -= 1
                if self.gpu_lru[bid] == 0:
                    del self.gpu_lru[bid]
                    self.live_runs -= 1
                continue
            del self.gpu_lru[bid]
            self.gpu_evictions += 1             # a block leaves GPU memory (moved or dropped)
            if self.cpu_capacity > 0:
                if len(self.cpu_lru) >= self.cpu_capacity:
                    old, _ = self.cpu_lru.popitem(last=False)
                    del self.entries[old]
                    self.cpu_evictions += 1
                self.entries[bid].tier = CPU
                self.cpu_lru[bid] = None
            else:
                del self.entries[bid]

    def give_back(self, n: int) -> None:
        """n private blocks are freed: one run at the tail of gpu_lru."""
        if n < 0 or self.free + n > self.capacity:
            raise KVAccountingError(f"give back {n} blocks with {self.free} of {self.capacity} free")
        if n > 0:
            self.runs += 1
            self.gpu_lru[("run", self.runs)] = n
            self.run_blocks += n
            self.live_runs += 1

    def acquire(self, bid) -> None:
        e = self.entries[bid]
        if e.tier != GPU:
            raise KVAccountingError(f"acquire of block {bid} in the CPU tier")
        if e.ref == 0:
            del self.gpu_lru[bid]
        e.ref += 1

    def release(self, bid) -> None:
        e = self.entries.get(bid)
        if e is None or e.tier != GPU or e.ref <= 0:
            raise KVAccountingError(f"release of block {bid} not referenced on the GPU")
        e.ref -= 1
        if e.ref == 0:
            self.gpu_lru[bid] = None

    def register(self, bid) -> None:
        """A private block of a request becomes the GPU entry `bid`, referenced by it."""
        if bid in self.entries:
            raise KVAccountingError(f"block {bid} registered twice")
        self.entries[bid] = Entry(GPU, 1)

    def referenced(self) -> int:
        return sum(1 for e in self.entries.values() if e.tier == GPU and e.ref > 0)


def is_run(key) -> bool:
    """A key of KVCache.gpu_lru naming a run of freed private blocks, not an entry."""
    return isinstance(key, tuple)


@dataclass(eq=False)
class MicroBatch:
    members: list          # [(Request, chunk tokens)] in batch order
    end: float             # when its tokens come out of the last pipeline stage
    start: float = 0.0     # when it was launched


@dataclass(eq=False)
class Transfer:
    req: Request
    src: "Replica"         # the prefill replica (its egress is shared)
    dst: "Replica"
    remaining: float       # bytes still to move
    last: float = 0.0      # when `remaining` was last brought up to date
    bytes_end: float = INF  # projected end of the bytes at the current share of the link
    done_at: float = INF   # bytes done: the transfer completes alpha later

    @property
    def time(self) -> float:
        return self.done_at if self.done_at < INF else self.bytes_end


@dataclass(eq=False)
class Replica:
    index: int
    kv: KVCache
    stages: int
    pool: int = 0
    role: int = C.MIXED
    waiting: deque = field(default_factory=deque)
    running: list = field(default_factory=list)      # admission order, oldest first
    parked: list = field(default_factory=list)       # prefill done here: held or transferring out
    incoming: list = field(default_factory=list)     # transferring in (blocks reserved here)
    egress: list = field(default_factory=list)       # transfers out moving bytes (processor sharing)
    slots: list = field(default_factory=list)        # one per pipeline stage: MicroBatch or None
    next_free: float = 0.0                           # first stage free to take a micro-batch
    stage_free: list = field(default_factory=list)   # later stages 1..PP-1 free at (index 0 unused)
    inflight_since: float = 0.0                      # start of the current span with work in flight
    last_start: float = 0.0                          # when its latest micro-batch was launched
    wake_at: float = INF                             # pending scheduling decision
    pad_seqs: int = 0                                # static: finished members still padding
    pad_kv: int = 0

    def __post_init__(self):
        self.slots = [None] * self.stages
        self.stage_free = [0.0] * self.stages

    @property
    def in_flight(self) -> int:
        return sum(mb is not None for mb in self.slots)

    @property
    def load(self) -> int:
        """Requests queued, running, parked or incoming here (what the load routers compare)."""
        return len(self.waiting) + len(self.running) + len(self.parked) + len(self.incoming)


def blocks_for(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


def gap_bin(gap: float) -> int:
    """Bin of the log10-spaced inter-token gap histogram (see engine.codes)."""
    if gap <= 0.0:
        return 0
    x = (math.log10(gap) - C.GAP_LOG10_MIN) / (C.GAP_LOG10_MAX - C.GAP_LOG10_MIN) * C.GAP_BINS
    return min(max(int(math.floor(x)), 0), C.GAP_BINS - 1)


class ReferenceSimulator:
    def __init__(self, ps, cfg, pools, arrival, prompt, output, u1, u2, chains, check=True, spec=None, dps=None):
        self.ps = tuple(ps)
        # speculative decoding (state.Spec, the pools' draft CostParams): request i's j-th decode step
        # verifies spec.k drafts and yields spec.yields[spec.start[i] + j] tokens
        self.spec = spec
        self.dps = tuple(dps) if dps is not None else self.ps
        # the cost tables the jitted step cost takes (costmodel/fields.py), packed once per pool
        self.tabs = [table(p) for p in self.ps]
        self.dtabs = [table(p) for p in self.dps]
        self.fs = features(*self.tabs, *self.dtabs)     # the step cost's shape (costmodel/features.py)
        self.cfg = cfg
        self.pools = pools
        self.u1 = np.asarray(u1, dtype=np.float64)
        self.u2 = np.asarray(u2, dtype=np.float64)
        self.check = check
        n = len(prompt)
        P = len(pools.role)
        if len(self.ps) != P:
            raise ValueError(f"{len(self.ps)} cost params for {P} pools")
        self.requests = [Request(i, float(a), int(pr), int(o))
                         for i, (a, pr, o) in enumerate(zip(arrival, prompt, output))]
        self.spec_steps = [0] * n
        start, length, ids = np.asarray(chains.start), np.asarray(chains.length), np.asarray(chains.ids)
        for q in self.requests:
            s, ln = int(start[q.index]), int(length[q.index])
            q.chain = tuple(int(x) for x in ids[s:s + ln])
            q.next_turn = int(chains.next_turn[q.index])
            q.think = float(chains.think[q.index])
        for q in self.requests:
            if q.next_turn >= 0:
                t = self.requests[q.next_turn]
                t.is_turn = True
                t.arrival = INF
        self.replicas = []
        for k in range(P):
            if int(pools.first[k]) != len(self.replicas):
                raise ValueError(f"pool {k} starts at replica {pools.first[k]}, not {len(self.replicas)}")
            for _ in range(int(pools.count[k])):
                self.replicas.append(Replica(len(self.replicas),
                                             KVCache(int(pools.num_blocks[k]), int(pools.cpu_blocks[k])),
                                             int(pools.pp[k]), pool=k, role=int(pools.role[k])))
        if len(self.replicas) != cfg.replicas:
            raise ValueError(f"pools hold {len(self.replicas)} replicas, cfg says {cfg.replicas}")
        self.entry = [rep for rep in self.replicas if rep.role != C.DECODE]
        self.decode = [rep for rep in self.replicas if rep.role == C.DECODE]
        self.decode_pools = [k for k in range(P) if int(pools.role[k]) == C.DECODE]
        # requests whose send time is known; closed loop: one per client to begin with
        self.sent = min(cfg.concurrency, n) if cfg.concurrency > 0 else n
        self.next_arrival = 0
        self.skip_turns()
        self.turns = []             # heap of (arrival, index): session turns sent, not yet arrived
        self.held = deque()         # prefill done, no decode replica fits yet (FIFO)
        self.transfers = {}         # request index -> Transfer
        self.routed = 0
        self.routed_decode = 0
        self.ended = 0
        self.now = 0.0
        self.replica_stats = np.zeros((len(self.replicas), S.N_STATS))     # (folded into pools at the end)
        self.prefix = np.zeros(C.N_PREFIX)
        self.gap_hist = np.zeros(C.GAP_BINS, np.int64)

    # ------------------------------------------------------------------ small helpers
    def add_stat(self, rep: Replica, k: int, x: float):
        self.replica_stats[rep.index, k] += x

    def weight(self, rep: Replica) -> float:
        return self.pools.weight[rep.pool]

    def watermark(self, rep: Replica) -> int:
        return int(self.pools.watermark_blocks[rep.pool])

    def skip_turns(self):
        while self.next_arrival < len(self.requests) and self.requests[self.next_arrival].is_turn:
            self.next_arrival += 1

    def next_arrival_event(self):
        """(time, request) of the next arrival: the in-order one or the earliest session turn."""
        t_in = self.requests[self.next_arrival].arrival if self.next_arrival < self.sent else INF
        if self.turns and self.turns[0][0] < t_in:
            return self.turns[0][0], self.requests[self.turns[0][1]]
        if t_in < INF:
            return t_in, self.requests[self.next_arrival]
        return INF, None

    # ------------------------------------------------------------------ the event loop
    def run(self) -> dict:
        n = len(self.requests)
        while self.ended < n:
            t_done, r_done, s_done = min(
                ((mb.end, rep.index, s) for rep in self.replicas for s, mb in enumerate(rep.slots)
                 if mb is not None), default=(INF, -1, -1))
            t_xfer, i_xfer = min(((x.time, i) for i, x in self.transfers.items()), default=(INF, -1))
            t_arr, req_arr = self.next_arrival_event()
            t_sch, r_sch = min(((rep.wake_at, rep.index) for rep in self.replicas), default=(INF, -1))
            t = min(t_done, t_xfer, t_arr, t_sch)
            if t == INF or t > self.cfg.max_time:
                break
            self.now = t
            if t_done == t:
                self.complete(self.replicas[r_done], s_done)
            elif t_xfer == t:
                self.transfer(self.transfers[i_xfer])
            elif t_arr == t:
                self.arrive(req_arr)
            else:
                self.schedule(self.replicas[r_sch])
            if self.check:
                self.check_blocks()
        for rep in self.replicas:
            if rep.in_flight > 0:
                self.add_stat(rep, S.STAT_INFLIGHT_TIME, self.now - rep.inflight_since)
        if self.check and self.ended == n:
            for rep in self.replicas:
                if rep.kv.free != rep.kv.capacity:
                    raise KVAccountingError(f"replica {rep.index} ends with {rep.kv.free} of "
                                            f"{rep.kv.capacity} blocks free")
        return self.records()

    def check_blocks(self):
        for rep in self.replicas:
            kv = rep.kv
            holders = rep.running + rep.parked
            private = sum(q.blocks - q.n_ref for q in holders)
            private += sum(q.blocks for q in rep.waiting)     # decode side: transferred, queued
            private += sum(q.dec_blocks for q in rep.incoming)
            refs = {}
            for q in holders:
                for bid in q.chain[:q.n_ref]:
                    refs[bid] = refs.get(bid, 0) + 1
            cached = {bid: e.ref for bid, e in kv.entries.items() if e.tier == GPU and e.ref > 0}
            if refs != cached:
                raise KVAccountingError(f"replica {rep.index}: requests reference {refs}, entries say {cached}")
            if private + len(cached) != kv.in_use:
                raise KVAccountingError(f"replica {rep.index}: requests hold {private} private blocks and "
                                        f"{len(cached)} entries, the cache says {kv.in_use} in use")
            if not 0 <= kv.empty <= kv.capacity or len(kv.cpu_lru) > kv.cpu_capacity:
                raise KVAccountingError(f"replica {rep.index}: {kv.empty} empty blocks, "
                                        f"{len(kv.cpu_lru)} of {kv.cpu_capacity} in the CPU tier")
            if any(kv.entries[b].tier != GPU or kv.entries[b].ref != 0 for b in kv.gpu_lru if not is_run(b)) or \
                    any(kv.entries[b].tier != CPU for b in kv.cpu_lru):
                raise KVAccountingError(f"replica {rep.index}: an LRU list holds a wrong entry")
            if any(q.n_ref for q in rep.waiting) or any(q.blocks for q in rep.waiting if q.generated == 0):
                raise KVAccountingError(f"replica {rep.index}: a waiting request holds blocks")

    def end(self, req: Request, status: int):
        req.ends += 1
        if req.ends != 1:
            raise AssertionError(f"request {req.index} ended twice")
        req.status = status
        req.finish = self.now
        self.ended += 1
        if self.cfg.concurrency > 0 and self.sent < len(self.requests):
            # the client of the request that ended sends the next one now
            self.requests[self.sent].arrival = self.now + self.cfg.frontend
            self.sent += 1
        if req.next_turn >= 0:
            # the session's next turn is sent `think` later and reaches the engine `frontend` after that
            nxt = self.requests[req.next_turn]
            nxt.arrival = self.now + nxt.think + self.cfg.frontend
            heapq.heappush(self.turns, (nxt.arrival, nxt.index))

    def wake(self, rep: Replica, at: float):
        if rep.in_flight < rep.stages:
            rep.wake_at = at

    # ------------------------------------------------------------------ prefix cache
    def cached_prefix(self, rep: Replica, req: Request) -> int:
        """Blocks of the request's chain cached on the replica (either tier), capped as a hit is."""
        cap = min(len(req.chain), (req.prompt - 1) // self.cfg.block_size)
        h = 0
        while h < cap and req.chain[h] in rep.kv.entries:
            h += 1
        return h

    def cached(self, rep: Replica, req: Request):
        """(h, g0, c): the prefix a waiting request with nothing computed would hit on admission,
        its GPU entries nobody references, its CPU-tier entries. Changes nothing."""
        if not self.cfg.prefix_caching or req.computed != 0:
            return 0, 0, 0
        h = self.cached_prefix(rep, req)
        g0 = c = 0
        for bid in req.chain[:h]:
            e = rep.kv.entries[bid]
            if e.tier == CPU:
                c += 1
            elif e.ref == 0:
                g0 += 1
        return h, g0, c

    def prefix_hit(self, rep: Replica, req: Request, hit, step: "Step"):
        """Apply a lookup on admission: reference its GPU entries, reload its CPU ones (paid by the
        step), start with h blocks computed."""
        h, g0, c = hit
        if not self.cfg.prefix_caching or req.computed != 0:
            return
        kv = rep.kv
        bs = self.cfg.block_size
        for bid in req.chain[:h]:
            if kv.entries[bid].tier == GPU:
                kv.acquire(bid)
        reload = [bid for bid in req.chain[:h] if kv.entries[bid].tier == CPU]
        for bid in reload:
            del kv.cpu_lru[bid]
        for bid in reload:
            kv.take(1)
            kv.entries[bid].tier = GPU
            kv.entries[bid].ref = 1
        req.computed = h * bs
        req.blocks = h
        req.n_ref = h
        self.prefix[C.HIT_GPU_TOKENS] += (h - c) * bs
        self.prefix[C.HIT_CPU_TOKENS] += c * bs
        self.prefix[C.LOOKUP_TOKENS] += req.prompt
        if c > 0:
            p = self.ps[rep.pool]
            t = p.swap_alpha + c * bs * self.pools.kv_bytes_per_token[rep.pool] / p.swap_bw
            step.swap_s += t
            self.prefix[C.CPU_RELOAD_TIME] += t

    def register(self, rep: Replica, req: Request):
        """After a completion: the request's newly full chain blocks become cached entries."""
        if not self.cfg.prefix_caching or req.reg_done or rep.role == C.DECODE:
            return
        bs = self.cfg.block_size
        while req.n_ref < len(req.chain) and (req.n_ref + 1) * bs <= req.computed:
            bid = req.chain[req.n_ref]
            if bid in rep.kv.entries:
                req.reg_done = True
                return
            rep.kv.register(bid)
            req.n_ref += 1

    def free(self, rep: Replica, req: Request):
        """Private blocks are freed (one run), then the chain entries are released from tail to head."""
        rep.kv.give_back(req.blocks - req.n_ref)
        for k in range(req.n_ref - 1, -1, -1):
            rep.kv.release(req.chain[k])
        req.n_ref = 0
        req.blocks = 0

    # ------------------------------------------------------------------ completion
    def complete(self, rep: Replica, slot: int):
        mb = rep.slots[slot]
        rep.slots[slot] = None
        if rep.in_flight == 0:
            self.add_stat(rep, S.STAT_INFLIGHT_TIME, self.now - rep.inflight_since)
        freed = False
        for req, chunk in mb.members:
            req.in_flight = False
            new = 1                         # tokens emitted
            if self.spec is not None and req.is_decode:
                new = chunk                 # the accepted drafts and the target's own token
                self.spec_steps[req.index] += 1
                req.generated += new - 1
            req.computed += chunk
            self.register(rep, req)
            if req.computed != req.prompt + req.generated:
                continue                    # a prefill chunk that does not finish the prompt
            if rep.role == C.PREFILL and req.output > 1:
                # the prompt is done: its KV moves to a decode replica, which emits the first token
                rep.running.remove(req)
                rep.parked.append(req)
                req.status = C.TRANSFER
                req.pf_replica = rep.index
                req.t_prefill = mb.end - mb.start
                self.to_decode(req)
                continue
            req.generated += 1
            if req.generated == 1:
                req.first_token = self.now
            else:
                gap = self.now - req.last_token
                req.max_gap = max(req.max_gap, gap)
                if req.arrival >= self.cfg.warmup_time:
                    self.gap_hist[gap_bin(gap)] += 1
                    self.gap_hist[0] += new - 1     # the step's other tokens: gaps of 0
            req.last_token = self.now
            if req.generated >= req.output:
                if self.cfg.policy == C.STATIC:
                    rep.pad_seqs += 1
                    rep.pad_kv += req.computed
                self.free(rep, req)
                freed = True
                rep.running.remove(req)
                self.end(req, C.DONE)
        if self.cfg.policy == C.STATIC and not rep.running:
            rep.pad_seqs = 0
            rep.pad_kv = 0
        self.wake(rep, max(rep.next_free, self.now))
        if freed and rep.role == C.DECODE:
            self.retry_held()

    # ------------------------------------------------------------------ KV transfers
    def to_decode(self, req: Request):
        dst = self.route_decode(req)
        if dst is None:
            req.was_held = True
            self.held.append(req)
        else:
            self.start_transfer(req, dst)

    def retry_held(self):
        """A request finished on a decode replica: start the held transfers that now fit, from the
        head of the FIFO, stopping at the first that does not."""
        while self.held:
            req = self.held[0]
            dst = self.route_decode(req)
            if dst is None:
                return
            self.held.popleft()
            self.start_transfer(req, dst)

    def route_decode(self, req: Request):
        """The decode replica for a request whose prompt is done: the router's choice if it fits,
        else the next one that fits after it in the decode list (index order), wrapping -- for
        every router; None if none fits."""
        bs = self.cfg.block_size
        need = blocks_for(req.prompt + 1, bs)
        whole = blocks_for(req.prompt + req.output, bs)
        choice = self.pick(self.decode, req, self.routed_decode, decode=True)
        at = self.decode.index(choice)
        R = len(self.decode)
        for k in range(R):
            rep = self.decode[(at + k) % R]
            if self.fits(rep, need, whole):
                self.routed_decode += 1
                return rep
        return None

    def fits(self, rep: Replica, need: int, whole: int) -> bool:
        """Its pool can hold the whole request, and the reservation leaves the watermark free now."""
        wm = self.watermark(rep)
        return whole <= self.pools.num_blocks[rep.pool] - wm and rep.kv.free - need >= wm

    def start_transfer(self, req: Request, dst: Replica):
        src = self.replicas[req.pf_replica]
        need = blocks_for(req.prompt + 1, self.cfg.block_size)
        dst.kv.take(need)
        dst.incoming.append(req)
        req.dec_replica = dst.index
        req.dec_blocks = need
        req.replica = dst.index             # the replica that will finish it
        req.reg_done = True                 # decode replicas do not register blocks
        req.xfer_start = self.now
        pl = self.pools
        P, D = src.pool, dst.pool
        nbytes = req.prompt * pl.kv_bytes_total[P] / min(pl.kv_gpus[P], pl.kv_gpus[D])
        if self.cfg.layerwise and not req.was_held:
            # pipelined layer by layer during the prefill: only what it could not hide is left
            nbytes = max(nbytes / pl.n_layers[P], nbytes - pl.link_bw[P, D] * req.t_prefill)
        x = Transfer(req, src, dst, float(nbytes), last=self.now)
        self.transfers[req.index] = x
        if nbytes <= 0.0:                   # nothing to move: only the link's latency
            self.bytes_done(x)
            return
        self.progress(src)
        src.egress.append(x)
        self.share(src)

    def link(self, x: Transfer):
        return self.pools.link_bw[x.src.pool, x.dst.pool], self.pools.link_alpha[x.src.pool, x.dst.pool]

    def progress(self, src: Replica):
        """Bring the bytes left of the replica's active transfers up to now (each moved at
        bw / n since the last change, n the transfers sharing the link)."""
        n = len(src.egress)
        for x in src.egress:
            left = x.remaining - (self.now - x.last) * self.link(x)[0] / n
            x.remaining = max(left, 0.0)
            x.last = self.now

    def share(self, src: Replica):
        """Processor sharing of the prefill replica's egress: when each would finish at bw / n."""
        n = len(src.egress)
        for x in src.egress:
            x.bytes_end = self.now + x.remaining * n / self.link(x)[0]

    def bytes_done(self, x: Transfer):
        x.remaining = 0.0
        x.done_at = self.now + self.link(x)[1]
        x.req.xfer_end = x.done_at

    def transfer(self, x: Transfer):
        if x.done_at == INF:
            # its bytes are done: the others speed up; it completes alpha later
            src = x.src
            self.progress(src)
            src.egress.remove(x)
            self.bytes_done(x)
            self.share(src)
        else:
            self.transfer_done(x)

    def transfer_done(self, x: Transfer):
        req, src, dst = x.req, x.src, x.dst
        del self.transfers[req.index]
        self.free(src, req)
        src.parked.remove(req)
        self.wake(src, max(src.next_free, self.now))
        req.generated = 1
        req.first_token = self.now
        req.last_token = self.now
        req.blocks = req.dec_blocks
        req.dec_blocks = 0
        req.n_ref = 0
        dst.incoming.remove(req)
        if len(dst.running) < self.cfg.max_num_seqs:
            req.status = C.RUNNING
            dst.running.append(req)
        else:
            # at the front: a preempted request must not wait there for the blocks this one holds
            req.status = C.WAITING
            dst.waiting.appendleft(req)
        self.wake(dst, max(dst.next_free, self.now))

    # ------------------------------------------------------------------ arrival
    def arrive(self, req: Request):
        if req.is_turn:
            heapq.heappop(self.turns)
        else:
            self.next_arrival += 1
            self.skip_turns()
        rep = self.route(req)
        self.routed += 1
        req.replica = rep.index
        if self.rejects(rep, req):
            self.end(req, C.REJECTED)
            return
        req.status = C.WAITING
        rep.waiting.append(req)
        self.wake(rep, max(rep.next_free, self.now))

    def rejects(self, rep: Replica, req: Request) -> bool:
        pl, bs = self.pools, self.cfg.block_size
        k = rep.pool
        if rep.role == C.PREFILL:
            whole = blocks_for(req.prompt + req.output, bs)
            return (blocks_for(req.prompt, bs) > pl.num_blocks[k] - pl.watermark_blocks[k] or
                    req.output > 1 and       # one token: done on the prefill replica
                    all(whole > pl.num_blocks[d] - pl.watermark_blocks[d] for d in self.decode_pools))
        return blocks_for(req.prompt + req.output, bs) > pl.num_blocks[k] - pl.watermark_blocks[k]

    def route(self, req: Request) -> Replica:
        """The entry replica (mixed or prefill pools) an arrival goes to."""
        return self.pick(self.entry, req, self.routed)

    def pick(self, reps: list, req: Request, routed: int, decode: bool = False) -> Replica:
        """The router's choice among `reps` (decode: prefix-aware routes as least-requests)."""
        R = len(reps)
        router = self.cfg.router
        if R == 1:
            return reps[0]
        if router == C.ROUND_ROBIN:
            return reps[routed % R]
        if router == C.RANDOM:
            return reps[min(int(self.u1[req.index] * R), R - 1)]
        if router == C.POWER_OF_TWO:
            # two distinct replicas from the pre-drawn uniforms; the less loaded wins, ties to the lower index
            a = min(int(self.u1[req.index] * R), R - 1)
            b = min(int(self.u2[req.index] * (R - 1)), R - 2)
            if b >= a:
                b += 1
            return min((reps[a], reps[b]), key=lambda x: (x.load / self.weight(x), x.index))
        if router == C.LEAST_REQUESTS or (router == C.PREFIX_AWARE and decode):
            return min(reps, key=lambda x: (x.load / self.weight(x), x.index))
        if router == C.LEAST_KV:
            return min(reps, key=lambda x: (-(x.kv.free / self.pools.num_blocks[x.pool]),
                                            x.load / self.weight(x), x.index))
        if router == C.PREFIX_AWARE:
            return min(reps, key=lambda x: (-self.cached_prefix(x, req), x.load / self.weight(x), x.index))
        raise ValueError(f"unknown router code {router}")

    # ------------------------------------------------------------------ scheduling
    def schedule(self, rep: Replica):
        rep.wake_at = INF
        step = Step(self.cfg.max_batched_tokens)
        if self.cfg.policy == C.STATIC:
            self.static_batch(rep, step)
        else:
            self.continuous_batch(rep, step)
        if step.members:
            self.launch(rep, step)
        elif step.preempted:
            # a step that preempted and launched nothing decides again at once (POOLS.md): the
            # requests it freed blocks for may be admitted now
            self.wake(rep, self.now)

    def async_cutoff(self, rep: Replica, step: "Step") -> float:
        """Async scheduling (POOLS.md): while the step has running members, a request that arrived after
        the launch of the step now ending waits for the next one; the latest arrival it may admit."""
        if (self.cfg.policy == C.VLLM and self.ps[rep.pool].host_overlap > 0.0 and rep.stages == 1
                and step.members):
            return rep.last_start
        return INF

    def admit(self, rep: Replica, head: Request, hit, step: "Step", private: int):
        """Move the head of the waiting queue to the running list with its prefix hit and `private`
        new blocks."""
        rep.waiting.popleft()
        if head.status == C.SWAPPED:
            step.swap_s += self.swap_seconds(rep, head)
        self.prefix_hit(rep, head, hit, step)
        head.status = C.RUNNING
        if math.isnan(head.scheduled):
            head.scheduled = self.now
        rep.kv.take(private)
        head.blocks += private
        rep.running.append(head)

    def static_batch(self, rep: Replica, step: "Step"):
        cfg = self.cfg
        if not rep.running:
            while rep.waiting and len(rep.running) < cfg.max_num_seqs:
                head = rep.waiting[0]
                hit = self.cached(rep, head)
                h, g0, c = hit
                # the whole reservation (a prefill replica: the prompt only; the output is decoded
                # elsewhere), less the prefix hit and the blocks it holds (a transferred request)
                tokens = head.prompt if rep.role == C.PREFILL else head.prompt + head.output
                private = blocks_for(tokens, cfg.block_size) - h - head.blocks
                if g0 + c + private > rep.kv.free:
                    break
                self.admit(rep, head, hit, step, private)
        for req in rep.running:
            if not req.in_flight:
                step.add(req, req.pending)

    def continuous_batch(self, rep: Replica, step: "Step"):
        cfg = self.cfg
        pol = cfg.policy
        B = cfg.max_num_seqs
        bs = cfg.block_size
        wm = self.watermark(rep)
        decode_only = False
        if pol == C.VLLM_V0:
            head = rep.waiting[0] if rep.waiting else None
            can_admit = False
            if head is not None and len(rep.running) < B:
                h, g0, c = self.cached(rep, head)
                base = head.computed + h * bs
                need = g0 + c + blocks_for(base + head.pending - h * bs, bs) - head.blocks - h
                can_admit = need == 0 or rep.kv.free - need >= wm
            decode_only = not can_admit
        if pol != C.VLLM_V0 or decode_only:
            ready = [q for q in rep.running if not q.in_flight]
            if pol != C.VLLM:
                ready = [q for q in ready if q.is_decode] + [q for q in ready if not q.is_decode]
            for req in ready:
                if req.status != C.RUNNING:
                    continue                # preempted earlier in this step
                if len(step.members) >= B or step.budget <= 0:
                    continue
                chunk = req.pending
                tokens = ahead = chunk
                if self.spec is not None and req.is_decode:
                    # verify k drafts: k + 1 tokens of the budget, their KV held (lookahead slots)
                    tokens = self.spec.k + 1
                    if tokens > step.budget:
                        continue
                    left = req.output - req.generated
                    chunk = min(int(self.spec.yields[self.spec.start[req.index] + self.spec_steps[req.index]]), left)
                    ahead = min(tokens, left)
                elif chunk > step.budget and pol == C.ORCA:
                    continue
                elif chunk > min(step.budget, cfg.max_chunk_tokens) and pol != C.ORCA:
                    chunk = tokens = ahead = min(step.budget, cfg.max_chunk_tokens)
                need = self.blocks_needed(req, ahead)
                while need > rep.kv.free:
                    victim = next((q for q in reversed(rep.running)
                                   if not q.in_flight and not step.contains(q)), None)
                    if victim is None:
                        break
                    if victim is req and rep.in_flight > 0:
                        step.stalled = True     # wait for the micro-batch in flight instead
                        break
                    self.preempt(rep, victim, step)
                    if victim is req:
                        break
                if req.status != C.RUNNING or need > rep.kv.free:
                    continue
                rep.kv.take(need)
                req.blocks += need
                step.add(req, chunk, tokens)
        if decode_only or step.preempted or step.stalled:
            return
        cutoff = self.async_cutoff(rep, step)
        while rep.waiting and len(rep.running) < B and len(step.members) < B and step.budget > 0:
            head = rep.waiting[0]
            if head.arrival > cutoff:
                break
            hit = self.cached(rep, head)
            h, g0, c = hit
            chunk = head.pending - h * bs
            if pol in (C.ORCA, C.VLLM_V0):
                if chunk > step.budget and step.members:
                    break                   # whole prompts only; an empty batch takes it anyway
            elif chunk > min(step.budget, cfg.max_chunk_tokens):
                chunk = min(step.budget, cfg.max_chunk_tokens)
            private = blocks_for(head.computed + h * bs + chunk, bs) - head.blocks - h
            needed = g0 + c + private
            if needed > 0 and rep.kv.free - needed < wm:
                break               # (an admission needing no new block is not held back)
            self.admit(rep, head, hit, step, private)
            step.add(head, chunk)

    def blocks_needed(self, req: Request, chunk: int) -> int:
        return blocks_for(req.computed + chunk, self.cfg.block_size) - req.blocks

    def swap_seconds(self, rep: Replica, req: Request) -> float:
        p = self.ps[rep.pool]
        return p.swap_alpha + req.computed * self.pools.kv_bytes_per_token[rep.pool] / p.swap_bw

    def preempt(self, rep: Replica, victim: Request, step: "Step"):
        self.free(rep, victim)
        if self.cfg.preemption == C.SWAP:
            step.swap_s += self.swap_seconds(rep, victim)
            victim.status = C.SWAPPED
            victim.reg_done = True          # it never registers again
        else:
            victim.computed = 0
            victim.status = C.WAITING       # it may hit its shared prefix again
        victim.preemptions += 1
        self.add_stat(rep, S.STAT_PREEMPTIONS, 1)
        step.preempted = True
        rep.running.remove(victim)
        # to the front, behind transferred requests queued there with their blocks (POOLS.md)
        k = 0
        while k < len(rep.waiting) and rep.waiting[k].blocks > 0:
            k += 1
        rep.waiting.insert(k, victim)

    # ------------------------------------------------------------------ pricing and launch
    def launch(self, rep: Replica, step: "Step"):
        tp_tok = n_pf = n_logit = pairs = kv_pf = n_dec = kv_dec = 0.0
        n_spec = kv_spec = spec_tok = 0.0
        for req, c in step.members:
            pend = req.pending
            if self.spec is not None and req.is_decode:
                q = self.spec.k + 1.0       # a verification: a short prefill of k + 1 tokens, all sampled
                tp_tok += q
                n_pf += 1.0
                pairs += q * (req.computed + (q + 1.0) / 2.0)
                kv_pf += req.computed + q
                n_logit += q
                n_spec += 1.0
                kv_spec += req.computed + 1.0
                spec_tok += c
                continue
            if req.generated > 0 and pend == 1:
                n_dec += 1.0
                kv_dec += req.computed + 1.0
            else:
                tp_tok += c
                n_pf += 1.0
                pairs += c * (req.computed + (c + 1.0) / 2.0)
                kv_pf += req.computed + c
            if c == pend:
                n_logit += 1.0
        if self.cfg.policy == C.STATIC and rep.pad_seqs > 0:
            n_dec += rep.pad_seqs
            kv_dec += rep.pad_kv
            n_logit += rep.pad_seqs
        cost = iteration_components_nb(self.tabs[rep.pool], *self.fs, tp_tok, n_pf, n_logit, pairs, kv_pf, n_dec,
                                       kv_dec)
        draft = 0.0
        if self.spec is not None and n_spec > 0 and self.spec.draft:
            draft = draft_time_nb(self.dtabs[rep.pool], *self.fs, self.ps[rep.pool].attn_dp, n_spec, kv_spec,
                                  self.spec.k, self.spec.proj)
        latency = cost.latency + step.swap_s + draft
        interval = cost.interval + step.swap_s + draft
        if self.spec is not None and n_spec > 0:
            self.add_stat(rep, S.STAT_DRAFT, draft)
            self.add_stat(rep, S.STAT_VERIFY, interval - draft)
            self.add_stat(rep, S.STAT_SPEC_STEPS, n_spec)
            self.add_stat(rep, S.STAT_SPEC_TOKENS, spec_tok)
        slot = rep.slots.index(None)
        if rep.in_flight == 0:
            rep.inflight_since = self.now
        end = self.now + latency
        if rep.stages > 1:                  # first in, first out through the later stages
            d = (latency - interval) / (rep.stages - 1)
            end = self.now + interval
            for k in range(1, rep.stages):
                end = max(end, rep.stage_free[k]) + d
                rep.stage_free[k] = end
            self.add_stat(rep, S.STAT_STAGE_BUSY, d)
        rep.slots[slot] = MicroBatch(list(step.members), end, self.now)
        rep.last_start = self.now
        for req, _ in step.members:
            req.in_flight = True
        rep.next_free = self.now + interval
        self.wake(rep, rep.next_free)
        nb = len(step.members)
        kv_in_use = rep.kv.in_use
        self.add_stat(rep, S.STAT_ITERATIONS, 1)
        self.add_stat(rep, S.STAT_BUSY, interval)
        self.add_stat(rep, S.STAT_SEQS_TIME, nb * interval)
        self.add_stat(rep, S.STAT_TOKENS_TIME, (tp_tok + n_dec) * interval)
        self.add_stat(rep, S.STAT_KV_TIME, kv_in_use * interval)
        self.replica_stats[rep.index, S.STAT_KV_MAX] = max(self.replica_stats[rep.index, S.STAT_KV_MAX], kv_in_use)
        self.add_stat(rep, S.STAT_FLOPS, cost.flops)
        self.add_stat(rep, S.STAT_BYTES, cost.nbytes)
        self.add_stat(rep, S.STAT_SWAP_TIME, step.swap_s)
        self.add_stat(rep, S.STAT_GEMM, cost.gemm)
        self.add_stat(rep, S.STAT_ATTN, cost.attention)
        self.add_stat(rep, S.STAT_ELEM, cost.elementwise)
        self.add_stat(rep, S.STAT_COMM, cost.communication)
        self.add_stat(rep, S.STAT_OVERHEAD, cost.overhead)

    # ------------------------------------------------------------------ output
    def records(self) -> dict:
        reqs = self.requests

        def col(name, dtype):
            return np.array([getattr(q, name) for q in reqs], dtype=dtype)

        rows = self.replica_stats.copy()
        rows[:, S.STAT_END_TIME] = self.now
        pool_stats = S.pool_stats_of(rows, self.pools.first, self.pools.count)
        stats = np.zeros(S.N_STATS)         # the deployment: the pools' shares summed in pool order
        for row in pool_stats:
            stats += row
        stats[S.STAT_KV_MAX] = pool_stats[:, S.STAT_KV_MAX].max()
        stats[S.STAT_END_TIME] = self.now
        prefix = self.prefix.copy()
        prefix[C.GPU_EVICTIONS] = sum(rep.kv.gpu_evictions for rep in self.replicas)
        prefix[C.CPU_EVICTIONS] = sum(rep.kv.cpu_evictions for rep in self.replicas)
        return {
            "arrival": col("arrival", np.float64), "scheduled": col("scheduled", np.float64),
            "first_token": col("first_token", np.float64), "finish": col("finish", np.float64),
            "preemptions": col("preemptions", np.int64), "replica": col("replica", np.int64),
            "status": col("status", np.int64), "max_gap": col("max_gap", np.float64),
            "generated": col("generated", np.int64), "gap_hist": self.gap_hist,
            "xfer_start": col("xfer_start", np.float64), "xfer_end": col("xfer_end", np.float64),
            "pf_replica": col("pf_replica", np.int64),
            "iterations": int(stats[S.STAT_ITERATIONS]), "end_time": self.now, "busy": stats[S.STAT_BUSY],
            "stage_busy": stats[S.STAT_STAGE_BUSY], "inflight_time": stats[S.STAT_INFLIGHT_TIME],
            "kv_max": int(stats[S.STAT_KV_MAX]), "swap_time": stats[S.STAT_SWAP_TIME],
            "total_preemptions": int(stats[S.STAT_PREEMPTIONS]),
            "free_blocks": np.array([rep.kv.free for rep in self.replicas], np.int64),
            "stats": stats, "pool_stats": pool_stats, "prefix": prefix,
        }


@dataclass(eq=False)
class Step:
    """The micro-batch being formed in one scheduling step."""
    budget: int
    members: list = field(default_factory=list)
    swap_s: float = 0.0
    preempted: bool = False
    stalled: bool = False      # a running request waits for blocks held by a micro-batch in flight

    def add(self, req: Request, chunk: int, tokens: int | None = None):
        """``chunk``: the tokens the member advances by; ``tokens``: of the budget (a verification: k + 1)."""
        self.members.append((req, chunk))
        self.budget -= chunk if tokens is None else tokens

    def contains(self, req: Request) -> bool:
        return any(q is req for q, _ in self.members)


def reference_simulate_pools(ps, cfg, pools, arrival, prompt, output, u1, u2, chains, spec=None, dps=None,
                             check=True) -> dict:
    """Run the reference simulator; same inputs as `kernel.simulate_pools`, a dict of NumPy arrays out.

    Keys: arrival (engine arrival times; closed loop and session turns fill them in), scheduled,
    first_token, finish, preemptions, replica (the replica that finished the request), status
    (engine.codes), max_gap, generated, gap_hist, xfer_start, xfer_end (nan: no KV transfer),
    pf_replica (-1: none), free_blocks per replica at the end, stats (N_STATS, deployment),
    pool_stats (P x N_STATS, each pool's share), prefix (the N_PREFIX counters of engine.codes),
    and scalars iterations, end_time, busy, stage_busy, inflight_time, kv_max, swap_time,
    total_preemptions. With `check`, KV accounting is verified after every event and raises
    `KVAccountingError` on any inconsistency.
    """
    return ReferenceSimulator(ps, cfg, pools, arrival, prompt, output, u1, u2, chains, check=check, spec=spec,
                              dps=dps).run()


def reference_run(inputs, check: bool = True) -> dict:
    """`reference_simulate_pools` on the lowered inputs the kernel takes (`engine.lower.KernelInputs`)."""
    return reference_simulate_pools(*inputs, check=check)
