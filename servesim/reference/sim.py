"""The slow, obvious twin of the jitted engine (`servesim.engine.kernel.simulate_nb`).

Written independently in plain Python -- objects, lists and deques -- so that it reads like the
documentation of the engine's semantics. Its methods are the engine's handlers, by the same names
(`complete`, `arrive`, `route`, `schedule`, `static_batch`, `continuous_batch`, `preempt`, `launch`
here; `complete_nb`, ... in `servesim/engine/events.py` and `schedule.py`). The tests demand that both agree exactly, request by
request. Only the iteration cost function is shared: `iteration_components_nb`, called here from
Python with batch aggregates summed in the same order as the engine sums them.

Semantics
---------
Events and their total order. At equal times a micro-batch *completion* comes first (it emits
tokens and frees KV blocks), then an *arrival*, then a *scheduling* decision, so a request arriving
exactly when blocks free up is admitted in that same scheduling step. Among completions the lowest
(replica, pipeline slot) goes first; among replicas ready to schedule, the lowest replica index.
The clock stops when no event is left or the next one lies after `max_time`.

Arrival. The router picks a replica (see `route`); a request whose prompt + output can never fit
in the KV cache (more blocks than capacity minus the watermark) is rejected on the spot, otherwise
it joins the back of that replica's waiting queue. With `concurrency > 0` the run is closed-loop:
the first `concurrency` requests are sent at their given times, and every request that ends (done
or rejected) lets its client send the next request at that instant, which reaches the engine
`frontend` later (arrival times here are the engine's).

Scheduling (one micro-batch per step; a replica with PP stages holds up to PP in flight):
  static    when nothing runs, admit waiting requests FCFS while their whole prompt + output
            reservation fits; the batch then runs (finished members keep padding it as decodes)
            until every member is done.
  vllm,     1) running requests not in flight, in admission order (vllm: decodes and partial
  sarathi,     prefills alike, as vLLM V1; the others: first the decodes, then the partial prefills),
               within `max_num_seqs` sequences and the token budget (sarathi's
  orca,        budget is its chunk size); a prefill longer than the budget is chunked (orca skips
  vllm-v0      it instead). If a request's next KV blocks do not fit, the youngest running request
               that is neither in flight nor already in this batch is preempted (possibly the
               request itself), until they fit -- except that a request never preempts itself
               while a micro-batch of its replica is in flight: it waits for that micro-batch
               (whose requests become preemptable), since giving up its own blocks to requests
               in flight can livelock a pipeline (PP > 1) forever.
            2) unless something was preempted (or had to wait) in this step, admit waiting
               requests FCFS while the blocks they need leave at least `watermark` blocks free;
               vllm/sarathi chunk the head to the remaining budget, orca/vllm-v0 take whole
               prompts only (an empty batch takes a prompt longer than the budget whole).
            vllm-v0 is prefill-prioritised: if the head of the queue can be admitted, the step
            admits only (no running requests); otherwise it is a decode-only step (1 without 2).
Preemption. recompute: the victim drops its KV cache and its computed tokens and goes to the front
of the waiting queue. swap: the victim keeps its computed tokens, its blocks are freed and it goes
to the front of the queue as swapped; swapping out and later in each costs
`swap_alpha + computed * kv_bytes_per_token / swap_bw`, added to that step's duration.

Prefix cache. A request of a shared-prefix group (``group`` >= 0) that is admitted from the
waiting queue with nothing computed starts with ``hit`` tokens computed (its group's prefix in
whole blocks) once some request of its group has computed that many tokens on the same replica;
it still holds blocks for them. A request preempted by recomputation loses its tokens and may hit
again when it is re-admitted.

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
`inflight_time` the time with at least one micro-batch in flight (the engine has work).
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from ..costmodel.iteration import iteration_components_nb
from ..engine import codes as C

INF = math.inf


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
    blocks: int = 0            # KV blocks held
    in_flight: bool = False
    ends: int = 0              # how many times the request ended (must be exactly one)
    group: int = -1            # shared-prefix group (-1: none)
    hit: int = 0               # prompt tokens it can take from its replica's prefix cache

    @property
    def pending(self) -> int:
        """Tokens still to be run through the model before the next token comes out."""
        return self.prompt + self.generated - self.computed

    @property
    def is_decode(self) -> bool:
        return self.generated > 0 and self.pending == 1


class KVBlockPool:
    """Paged KV blocks of one replica; refuses to go negative or above capacity."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.free = capacity

    @property
    def in_use(self) -> int:
        return self.capacity - self.free

    def take(self, n: int) -> None:
        if n < 0 or n > self.free:
            raise KVAccountingError(f"take {n} blocks with {self.free} of {self.capacity} free")
        self.free -= n

    def give_back(self, n: int) -> None:
        if n < 0 or self.free + n > self.capacity:
            raise KVAccountingError(f"give back {n} blocks with {self.free} of {self.capacity} free")
        self.free += n


@dataclass(eq=False)
class MicroBatch:
    members: list          # [(Request, chunk tokens)] in batch order
    end: float             # when its tokens come out of the last pipeline stage


@dataclass(eq=False)
class Replica:
    index: int
    kv: KVBlockPool
    stages: int
    waiting: deque = field(default_factory=deque)
    running: list = field(default_factory=list)      # admission order, oldest first
    slots: list = field(default_factory=list)        # one per pipeline stage: MicroBatch or None
    next_free: float = 0.0                           # first stage free to take a micro-batch
    stage_free: list = field(default_factory=list)   # later stages 1..PP-1 free at (index 0 unused)
    inflight_since: float = 0.0                      # start of the current span with work in flight
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
        """Requests queued or running here (what least-requests and power-of-two compare)."""
        return len(self.waiting) + len(self.running)


def blocks_for(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


def gap_bin(gap: float) -> int:
    """Bin of the log10-spaced inter-token gap histogram (see engine.codes)."""
    if gap <= 0.0:
        return 0
    x = (math.log10(gap) - C.GAP_LOG10_MIN) / (C.GAP_LOG10_MAX - C.GAP_LOG10_MIN) * C.GAP_BINS
    return min(max(int(math.floor(x)), 0), C.GAP_BINS - 1)


class ReferenceSimulator:
    def __init__(self, params, cfg, arrival, prompt, output, u1, u2, group=None, hit=None, check=True):
        self.p = params
        self.cfg = cfg
        self.u1 = np.asarray(u1, dtype=np.float64)
        self.u2 = np.asarray(u2, dtype=np.float64)
        self.check = check
        n = len(prompt)
        group = np.full(n, -1) if group is None else group
        hit = np.zeros(n) if hit is None else hit
        self.requests = [Request(i, float(a), int(pr), int(o), group=int(g), hit=int(h))
                         for i, (a, pr, o, g, h) in enumerate(zip(arrival, prompt, output, group, hit))]
        self.prefix_seen = set()    # (replica, group) whose prefix is in that replica's cache
        self.replicas = [Replica(r, KVBlockPool(cfg.num_blocks), cfg.pp) for r in range(cfg.replicas)]
        n = len(self.requests)
        # requests whose send time is known; closed loop: one per client to begin with
        self.sent = min(cfg.concurrency, n) if cfg.concurrency > 0 else n
        self.next_arrival = 0
        self.routed = 0
        self.ended = 0
        self.now = 0.0
        self.iterations = 0
        self.busy = 0.0
        self.stage_busy = 0.0
        self.inflight_time = 0.0
        self.kv_max = 0
        self.swap_time = 0.0
        self.total_preemptions = 0
        self.gap_hist = np.zeros(C.GAP_BINS, np.int64)

    # ------------------------------------------------------------------ the event loop
    def run(self) -> dict:
        n = len(self.requests)
        while self.ended < n:
            t_done, r_done, s_done = min(
                ((mb.end, rep.index, s) for rep in self.replicas for s, mb in enumerate(rep.slots)
                 if mb is not None), default=(INF, -1, -1))
            t_arr = self.requests[self.next_arrival].arrival if self.next_arrival < self.sent else INF
            t_sch, r_sch = min(((rep.wake_at, rep.index) for rep in self.replicas), default=(INF, -1))
            t = min(t_done, t_arr, t_sch)
            if t == INF or t > self.cfg.max_time:
                break
            self.now = t
            if t_done == t:
                self.complete(self.replicas[r_done], s_done)
            elif t_arr == t:
                self.arrive(self.requests[self.next_arrival])
            else:
                self.schedule(self.replicas[r_sch])
            if self.check:
                self.check_blocks()
        for rep in self.replicas:
            if rep.in_flight > 0:
                self.inflight_time += self.now - rep.inflight_since
        if self.check and self.ended == n:
            for rep in self.replicas:
                if rep.kv.free != rep.kv.capacity:
                    raise KVAccountingError(f"replica {rep.index} ends with {rep.kv.free} of "
                                            f"{rep.kv.capacity} blocks free")
        return self.records()

    def check_blocks(self):
        for rep in self.replicas:
            held = sum(q.blocks for q in rep.running)
            if held != rep.kv.in_use:
                raise KVAccountingError(f"replica {rep.index}: running requests hold {held} blocks, "
                                        f"pool says {rep.kv.in_use} in use")
            if any(q.blocks for q in rep.waiting):
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

    def wake(self, rep: Replica, at: float):
        if rep.in_flight < self.cfg.pp:
            rep.wake_at = at

    # ------------------------------------------------------------------ completion
    def complete(self, rep: Replica, slot: int):
        mb = rep.slots[slot]
        rep.slots[slot] = None
        if rep.in_flight == 0:
            self.inflight_time += self.now - rep.inflight_since
        for req, chunk in mb.members:
            req.in_flight = False
            req.computed += chunk
            if req.group >= 0 and req.hit > 0 and req.computed >= req.hit:
                self.prefix_seen.add((rep.index, req.group))
            if req.computed != req.prompt + req.generated:
                continue                    # a prefill chunk that does not finish the prompt
            req.generated += 1
            if req.generated == 1:
                req.first_token = self.now
            else:
                gap = self.now - req.last_token
                req.max_gap = max(req.max_gap, gap)
                if req.arrival >= self.cfg.warmup_time:
                    self.gap_hist[gap_bin(gap)] += 1
            req.last_token = self.now
            if req.generated >= req.output:
                if self.cfg.policy == C.STATIC:
                    rep.pad_seqs += 1
                    rep.pad_kv += req.computed
                rep.kv.give_back(req.blocks)
                req.blocks = 0
                rep.running.remove(req)
                self.end(req, C.DONE)
        if self.cfg.policy == C.STATIC and not rep.running:
            rep.pad_seqs = 0
            rep.pad_kv = 0
        self.wake(rep, max(rep.next_free, self.now))

    # ------------------------------------------------------------------ arrival
    def arrive(self, req: Request):
        self.next_arrival += 1
        rep = self.replicas[self.route(req)]
        self.routed += 1
        req.replica = rep.index
        if blocks_for(req.prompt + req.output, self.cfg.block_size) > self.cfg.num_blocks - self.cfg.watermark_blocks:
            self.end(req, C.REJECTED)
            return
        req.status = C.WAITING
        rep.waiting.append(req)
        self.wake(rep, max(rep.next_free, self.now))

    def route(self, req: Request) -> int:
        reps = self.replicas
        R = len(reps)
        if R == 1:
            return 0
        router = self.cfg.router
        if router == C.ROUND_ROBIN:
            return self.routed % R
        if router == C.RANDOM:
            return min(int(self.u1[req.index] * R), R - 1)
        if router == C.POWER_OF_TWO:
            # two distinct replicas from the pre-drawn uniforms; the less loaded wins, ties to the lower index
            a = min(int(self.u1[req.index] * R), R - 1)
            b = min(int(self.u2[req.index] * (R - 1)), R - 2)
            if b >= a:
                b += 1
            return min((reps[a].load, a), (reps[b].load, b))[1]
        if router == C.LEAST_REQUESTS:
            return min(reps, key=lambda x: (x.load, x.index)).index
        if router == C.LEAST_KV:
            return min(reps, key=lambda x: (-x.kv.free, x.load, x.index)).index
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

    def static_batch(self, rep: Replica, step: "Step"):
        cfg = self.cfg
        if not rep.running:
            while rep.waiting and len(rep.running) < cfg.max_num_seqs:
                head = rep.waiting[0]
                need = blocks_for(head.prompt + head.output, cfg.block_size)
                if need > rep.kv.free:
                    break
                rep.waiting.popleft()
                rep.kv.take(need)
                head.blocks = need
                head.status = C.RUNNING
                head.scheduled = self.now
                rep.running.append(head)
        for req in rep.running:
            if not req.in_flight:
                step.add(req, req.pending)

    def continuous_batch(self, rep: Replica, step: "Step"):
        cfg = self.cfg
        pol = cfg.policy
        B = cfg.max_num_seqs
        decode_only = False
        if pol == C.VLLM_V0:
            head = rep.waiting[0] if rep.waiting else None
            if head is not None:
                self.prefix_hit(rep, head)
            can_admit = (head is not None and len(rep.running) < B and
                         rep.kv.free - self.blocks_needed(head, head.pending) >= cfg.watermark_blocks)
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
                if chunk > step.budget:
                    if pol == C.ORCA:
                        continue
                    chunk = step.budget
                need = self.blocks_needed(req, chunk)
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
                step.add(req, chunk)
        if decode_only or step.preempted or step.stalled:
            return
        while rep.waiting and len(rep.running) < B and len(step.members) < B and step.budget > 0:
            head = rep.waiting[0]
            self.prefix_hit(rep, head)
            chunk = head.pending
            if chunk > step.budget:
                if pol in (C.ORCA, C.VLLM_V0):
                    if step.members:
                        break               # whole prompts only; an empty batch takes it anyway
                else:
                    chunk = step.budget
            need = self.blocks_needed(head, chunk)
            if rep.kv.free - need < cfg.watermark_blocks:
                break
            rep.waiting.popleft()
            if head.status == C.SWAPPED:
                step.swap_s += self.swap_seconds(head)
            head.status = C.RUNNING
            if math.isnan(head.scheduled):
                head.scheduled = self.now
            rep.kv.take(need)
            head.blocks += need
            rep.running.append(head)
            step.add(head, chunk)

    def prefix_hit(self, rep: Replica, req: Request):
        if req.group >= 0 and req.computed == 0 and req.status == C.WAITING and \
                (rep.index, req.group) in self.prefix_seen:
            req.computed = req.hit

    def blocks_needed(self, req: Request, chunk: int) -> int:
        return blocks_for(req.computed + chunk, self.cfg.block_size) - req.blocks

    def swap_seconds(self, req: Request) -> float:
        return self.p.swap_alpha + req.computed * self.cfg.kv_bytes_per_token / self.p.swap_bw

    def preempt(self, rep: Replica, victim: Request, step: "Step"):
        rep.kv.give_back(victim.blocks)
        if self.cfg.preemption == C.SWAP:
            step.swap_s += self.swap_seconds(victim)
            victim.status = C.SWAPPED
        else:
            victim.computed = 0
            victim.status = C.WAITING
        victim.blocks = 0
        victim.preemptions += 1
        self.total_preemptions += 1
        step.preempted = True
        rep.running.remove(victim)
        rep.waiting.appendleft(victim)

    # ------------------------------------------------------------------ pricing and launch
    def launch(self, rep: Replica, step: "Step"):
        tp_tok = n_pf = n_logit = pairs = kv_pf = n_dec = kv_dec = 0.0
        for req, c in step.members:
            pend = req.pending
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
        cost = iteration_components_nb(self.p, tp_tok, n_pf, n_logit, pairs, kv_pf, n_dec, kv_dec)
        latency = cost.latency + step.swap_s
        interval = cost.interval + step.swap_s
        slot = rep.slots.index(None)
        if rep.in_flight == 0:
            rep.inflight_since = self.now
        end = self.now + latency
        if self.cfg.pp > 1:                 # first in, first out through the later stages
            d = (latency - interval) / (self.cfg.pp - 1)
            end = self.now + interval
            for k in range(1, self.cfg.pp):
                end = max(end, rep.stage_free[k]) + d
                rep.stage_free[k] = end
            self.stage_busy += d
        rep.slots[slot] = MicroBatch(list(step.members), end)
        for req, _ in step.members:
            req.in_flight = True
        rep.next_free = self.now + interval
        self.wake(rep, rep.next_free)
        self.iterations += 1
        self.busy += interval
        self.swap_time += step.swap_s
        self.kv_max = max(self.kv_max, rep.kv.in_use)

    # ------------------------------------------------------------------ output
    def records(self) -> dict:
        reqs = self.requests

        def col(name, dtype):
            return np.array([getattr(q, name) for q in reqs], dtype=dtype)

        return {
            "arrival": col("arrival", np.float64), "scheduled": col("scheduled", np.float64),
            "first_token": col("first_token", np.float64), "finish": col("finish", np.float64),
            "preemptions": col("preemptions", np.int64), "replica": col("replica", np.int64),
            "status": col("status", np.int64), "max_gap": col("max_gap", np.float64),
            "generated": col("generated", np.int64), "gap_hist": self.gap_hist,
            "iterations": self.iterations, "end_time": self.now, "busy": self.busy,
            "stage_busy": self.stage_busy, "inflight_time": self.inflight_time,
            "kv_max": self.kv_max, "swap_time": self.swap_time, "total_preemptions": self.total_preemptions,
            "free_blocks": np.array([rep.kv.free for rep in self.replicas], np.int64),
        }


@dataclass(eq=False)
class Step:
    """The micro-batch being formed in one scheduling step."""
    budget: int
    members: list = field(default_factory=list)
    swap_s: float = 0.0
    preempted: bool = False
    stalled: bool = False      # a running request waits for blocks held by a micro-batch in flight

    def add(self, req: Request, chunk: int):
        self.members.append((req, chunk))
        self.budget -= chunk

    def contains(self, req: Request) -> bool:
        return any(q is req for q, _ in self.members)


def reference_simulate(params, cfg, arrival, prompt, output, u1, u2, group=None, hit=None, check=True) -> dict:
    """Run the reference simulator; same inputs as `simulate_nb`, a dict of NumPy arrays out.

    Keys: arrival (send times; closed loop fills them in), scheduled, first_token, finish,
    preemptions, replica, status (engine.codes), max_gap, generated, gap_hist, free_blocks per
    replica at the end, and scalars iterations, end_time, busy, stage_busy, inflight_time, kv_max, swap_time,
    total_preemptions. With `check`, KV accounting is verified after every event and raises
    `KVAccountingError` on any inconsistency.
    """
    return ReferenceSimulator(params, cfg, arrival, prompt, output, u1, u2, group, hit, check=check).run()
