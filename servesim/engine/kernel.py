"""The jitted event loop: arrivals, routing, scheduling, paged KV blocks, pipeline micro-batches.

Arrays in, arrays out; no Python objects. Events are ordered by (time, kind, index):
a micro-batch completion (which frees KV blocks and emits tokens) comes before an arrival at the
same instant, and an arrival before a scheduling decision, so a request arriving exactly when
blocks free up is admitted in that same scheduling step. Ties among completions go to the lowest
(replica, slot); among replicas ready to schedule, to the lowest replica index.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from numba import njit

from ..costmodel.iteration import iteration_components_nb
from . import codes as C

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


@njit(cache=True)
def _blocks_for(tokens, block_size):
    return (tokens + block_size - 1) // block_size


@njit(cache=True)
def _gap_bin(gap):
    if gap <= 0.0:
        return 0
    x = (math.log10(gap) - C.GAP_LOG10_MIN) / (C.GAP_LOG10_MAX - C.GAP_LOG10_MIN) * C.GAP_BINS
    if x < 0.0:
        return 0
    if x >= C.GAP_BINS:
        return C.GAP_BINS - 1
    return int(x)


@njit(cache=True)
def _route(cfg, i, rr_counter, u1, u2, n_req, free_blocks):
    R = cfg.replicas
    if R == 1:
        return 0
    if cfg.router == C.ROUND_ROBIN:
        return rr_counter % R
    if cfg.router == C.RANDOM:
        return min(int(u1[i] * R), R - 1)
    if cfg.router == C.POWER_OF_TWO:
        a = min(int(u1[i] * R), R - 1)
        b = min(int(u2[i] * (R - 1)), R - 2)
        if b >= a:
            b += 1
        if n_req[b] < n_req[a] or (n_req[b] == n_req[a] and b < a):
            return b
        return a
    best = 0
    for r in range(1, R):
        if cfg.router == C.LEAST_KV:
            if free_blocks[r] > free_blocks[best] or (free_blocks[r] == free_blocks[best] and n_req[r] < n_req[best]):
                best = r
        else:
            if n_req[r] < n_req[best]:
                best = r
    return best


@njit(cache=True)
def _drop_running(run, n_run, r, i):
    """Remove request i from replica r's running list, keeping admission order."""
    k = 0
    for j in range(n_run[r]):
        if run[r, j] != i:
            run[r, k] = run[r, j]
            k += 1
    n_run[r] = k


@njit(cache=True)
def _push_back(q_next, q_head, q_tail, r, i):
    q_next[i] = -1
    if q_tail[r] < 0:
        q_head[r] = i
    else:
        q_next[q_tail[r]] = i
    q_tail[r] = i


@njit(cache=True)
def _push_front(q_next, q_head, q_tail, r, i):
    q_next[i] = q_head[r]
    q_head[r] = i
    if q_tail[r] < 0:
        q_tail[r] = i


@njit(cache=True)
def _pop_front(q_next, q_head, q_tail, r):
    i = q_head[r]
    q_head[r] = q_next[i]
    if q_head[r] < 0:
        q_tail[r] = -1
    q_next[i] = -1
    return i


@njit(cache=True)
def _prefix_hit_nb(i, r, status, computed, group, hit, seen):
    """A waiting request with nothing computed takes its shared prefix from the replica's prefix
    cache once a request of its group has computed it there (whole blocks only)."""
    g = group[i]
    if g >= 0 and computed[i] == 0 and status[i] == C.WAITING and seen[r, g]:
        computed[i] = hit[i]


@njit(cache=True)
def simulate_nb(p, cfg, arrival_in, prompt, output, u1, u2, group, hit):
    """``group``: shared-prefix group of each request (-1: none); ``hit``: prompt tokens a request can
    take from the prefix cache (its group's prefix in whole blocks, below its prompt length)."""
    n = prompt.shape[0]
    R = cfg.replicas
    PP = cfg.pp
    B = cfg.max_num_seqs
    bs = cfg.block_size

    # request schema (structure of arrays)
    arrival = arrival_in.copy()
    scheduled = np.full(n, np.nan)
    first_token = np.full(n, np.nan)
    finish = np.full(n, np.nan)
    last_token = np.full(n, np.nan)
    max_gap = np.zeros(n)
    preempt = np.zeros(n, np.int64)
    replica_of = np.full(n, -1, np.int64)
    status = np.zeros(n, np.int64)
    computed = np.zeros(n, np.int64)
    generated = np.zeros(n, np.int64)
    blocks = np.zeros(n, np.int64)
    inflight = np.zeros(n, np.bool_)
    q_next = np.full(n, -1, np.int64)

    # replica schema
    q_head = np.full(R, -1, np.int64)
    q_tail = np.full(R, -1, np.int64)
    n_waiting = np.zeros(R, np.int64)
    run = np.full((R, B), -1, np.int64)     # running requests in admission order
    n_run = np.zeros(R, np.int64)
    free_blocks = np.full(R, cfg.num_blocks, np.int64)
    n_req = np.zeros(R, np.int64)           # waiting + running, for routers
    next_free = np.zeros(R)                 # first pipeline stage free at
    sched_time = np.full(R, INF)
    mb_end = np.full((R, PP), INF)
    mb_n = np.zeros((R, PP), np.int64)
    mb_req = np.full((R, PP, B), -1, np.int64)
    mb_chunk = np.zeros((R, PP, B), np.int64)
    n_inflight = np.zeros(R, np.int64)
    inflight_since = np.zeros(R)            # start of the current span with work in flight
    stage_free = np.zeros((R, PP))          # later pipeline stages (1..PP-1) free at
    static_pad_n = np.zeros(R, np.int64)    # finished members still padding a static batch
    static_pad_kv = np.zeros(R, np.int64)
    n_groups = 1
    for i in range(n):
        if group[i] + 1 > n_groups:
            n_groups = group[i] + 1
    seen = np.zeros((R, n_groups), np.bool_)   # prefix of the group computed on the replica

    # outputs
    gap_hist = np.zeros(C.GAP_BINS, np.int64)
    L = max(cfg.log_size, 2)
    log_time = np.zeros(L)
    log_replica = np.zeros(L, np.int64)
    log_seqs = np.zeros(L, np.int64)
    log_tokens = np.zeros(L, np.int64)
    log_kv = np.zeros(L, np.int64)
    log_wait = np.zeros(L, np.int64)
    log_count = 0
    log_stride = 1
    stats = np.zeros(N_STATS)

    # local batch buffers
    b_req = np.zeros(B, np.int64)
    b_chunk = np.zeros(B, np.int64)
    pf_cand = np.zeros(B, np.int64)

    cached_gap = -1.0
    cached_bin = 0
    closed = cfg.concurrency > 0
    if closed:
        known = min(cfg.concurrency, n)     # requests whose send time is known
    else:
        known = n
    next_arr = 0
    rr_counter = 0
    n_ended = 0
    now = 0.0
    iters = 0

    while n_ended < n:
        # next event of each kind
        t_comp = INF
        c_r = -1
        c_s = -1
        for r in range(R):
            if n_inflight[r] > 0:
                for s in range(PP):
                    if mb_end[r, s] < t_comp:
                        t_comp = mb_end[r, s]
                        c_r = r
                        c_s = s
        t_arr = arrival[next_arr] if next_arr < known else INF
        t_sch = INF
        s_r = -1
        for r in range(R):
            if sched_time[r] < t_sch:
                t_sch = sched_time[r]
                s_r = r
        t = min(t_comp, min(t_arr, t_sch))
        if t == INF or t > cfg.max_time:
            break
        now = t

        if t_comp <= t:
            # ---- micro-batch completion: tokens come out, finished requests free their blocks
            r = c_r
            s = c_s
            mb_end[r, s] = INF
            n_inflight[r] -= 1
            if n_inflight[r] == 0:
                stats[STAT_INFLIGHT_TIME] += now - inflight_since[r]
            for j in range(mb_n[r, s]):
                i = mb_req[r, s, j]
                c = mb_chunk[r, s, j]
                inflight[i] = False
                computed[i] += c
                if group[i] >= 0 and hit[i] > 0 and computed[i] >= hit[i]:
                    seen[r, group[i]] = True
                if computed[i] == prompt[i] + generated[i]:
                    generated[i] += 1
                    if generated[i] == 1:
                        first_token[i] = now
                    else:
                        gap = now - last_token[i]
                        if gap > max_gap[i]:
                            max_gap[i] = gap
                        if arrival[i] >= cfg.warmup_time:
                            # most decodes of a micro-batch share one gap: bin it once
                            if gap != cached_gap:
                                cached_gap = gap
                                cached_bin = _gap_bin(gap)
                            gap_hist[cached_bin] += 1
                    last_token[i] = now
                    if generated[i] >= output[i]:
                        status[i] = C.DONE
                        finish[i] = now
                        n_ended += 1
                        n_req[r] -= 1
                        if cfg.policy == C.STATIC:
                            static_pad_n[r] += 1
                            static_pad_kv[r] += computed[i]
                        free_blocks[r] += blocks[i]
                        blocks[i] = 0
                        _drop_running(run, n_run, r, i)
                        if closed and known < n:
                            arrival[known] = now + cfg.frontend
                            known += 1
            mb_n[r, s] = 0
            if n_run[r] == 0 and cfg.policy == C.STATIC:
                static_pad_n[r] = 0
                static_pad_kv[r] = 0
            if n_inflight[r] < PP:
                sched_time[r] = max(next_free[r], now)
            continue

        if t_arr <= t:
            # ---- arrival: route, reject what can never fit, enqueue
            i = next_arr
            next_arr += 1
            r = _route(cfg, i, rr_counter, u1, u2, n_req, free_blocks)
            rr_counter += 1
            replica_of[i] = r
            if _blocks_for(prompt[i] + output[i], bs) > cfg.num_blocks - cfg.watermark_blocks:
                status[i] = C.REJECTED
                finish[i] = now
                n_ended += 1
                if closed and known < n:
                    arrival[known] = now + cfg.frontend
                    known += 1
                continue
            status[i] = C.WAITING
            _push_back(q_next, q_head, q_tail, r, i)
            n_waiting[r] += 1
            n_req[r] += 1
            if n_inflight[r] < PP:
                sched_time[r] = max(next_free[r], now)
            continue

        # ---- scheduling step on replica r: form one micro-batch
        r = s_r
        sched_time[r] = INF
        nb = 0
        budget = cfg.max_batched_tokens
        swap_s = 0.0
        pol = cfg.policy
        preempted_now = False

        if pol == C.STATIC:
            if n_run[r] == 0:
                # admit a whole batch, reserving blocks for every prompt and output token
                while n_waiting[r] > 0 and n_run[r] < B:
                    i = q_head[r]
                    need = _blocks_for(prompt[i] + output[i], bs)
                    if need > free_blocks[r]:
                        break
                    _pop_front(q_next, q_head, q_tail, r)
                    n_waiting[r] -= 1
                    free_blocks[r] -= need
                    blocks[i] = need
                    status[i] = C.RUNNING
                    scheduled[i] = now
                    run[r, n_run[r]] = i
                    n_run[r] += 1
            for j in range(n_run[r]):
                i = run[r, j]
                if not inflight[i]:
                    b_req[nb] = i
                    b_chunk[nb] = prompt[i] + generated[i] - computed[i]
                    nb += 1
        else:
            decode_only = False
            if pol == C.VLLM_V0:
                # prefill-prioritised: if any waiting request can be admitted, this is a prefill iteration
                decode_only = True
                if n_waiting[r] > 0 and n_run[r] < B:
                    i = q_head[r]
                    _prefix_hit_nb(i, r, status, computed, group, hit, seen)
                    pend = prompt[i] + generated[i] - computed[i]
                    need = _blocks_for(computed[i] + pend, bs) - blocks[i]
                    if free_blocks[r] - need >= cfg.watermark_blocks:
                        decode_only = False
            # 1) running requests (not for a V0 prefill step): vllm walks them in admission order,
            #    decodes and partial prefills alike (V1); the others take decodes first
            if pol != C.VLLM_V0 or decode_only:
                n_pfc = 0
                for phase in range(2):
                    j = 0
                    while True:
                        # phase 0 walks the running list (decodes; prefills are set aside),
                        # phase 1 the set-aside partial prefills, in the same order
                        if phase == 0:
                            if j >= n_run[r]:
                                break
                            i = run[r, j]
                        else:
                            if j >= n_pfc:
                                break
                            i = pf_cand[j]
                            if status[i] != C.RUNNING:
                                j += 1
                                continue      # preempted during phase 0
                        j += 1
                        if inflight[i]:
                            continue
                        pend = prompt[i] + generated[i] - computed[i]
                        if phase == 0 and pol != C.VLLM and not (generated[i] > 0 and pend == 1):
                            pf_cand[n_pfc] = i
                            n_pfc += 1
                            continue
                        if nb >= B or budget <= 0:
                            if phase == 0:
                                continue
                            break
                        c = pend
                        if c > budget:
                            if pol == C.ORCA:
                                continue
                            c = budget
                        need = _blocks_for(computed[i] + c, bs) - blocks[i]
                        victim_self = False
                        while need > free_blocks[r]:
                            # preempt the youngest running request that is not in flight
                            v = -1
                            for j2 in range(n_run[r] - 1, -1, -1):
                                cand = run[r, j2]
                                if not inflight[cand]:
                                    already = False
                                    for j3 in range(nb):
                                        if b_req[j3] == cand:
                                            already = True
                                    if not already:
                                        v = cand
                                        break
                            if v < 0:
                                break
                            if v == i and n_inflight[r] > 0:
                                # only the requester is left while a micro-batch is in flight:
                                # wait for it rather than preempt itself (that livelocks with
                                # PP > 1), and admit nothing in this step
                                preempted_now = True
                                break
                            free_blocks[r] += blocks[v]
                            if cfg.preemption == C.SWAP:
                                swap_s += p.swap_alpha + computed[v] * cfg.kv_bytes_per_token / p.swap_bw
                                status[v] = C.SWAPPED
                            else:
                                computed[v] = 0
                                status[v] = C.WAITING
                            blocks[v] = 0
                            preempt[v] += 1
                            stats[STAT_PREEMPTIONS] += 1
                            preempted_now = True
                            _drop_running(run, n_run, r, v)
                            _push_front(q_next, q_head, q_tail, r, v)
                            n_waiting[r] += 1
                            if v == i:
                                victim_self = True
                                break
                            if v != i and phase == 0:
                                # the list shifted left past v's slot; re-find our position
                                for j2 in range(n_run[r]):
                                    if run[r, j2] == i:
                                        j = j2 + 1
                        if victim_self or need > free_blocks[r]:
                            continue
                        free_blocks[r] -= need
                        blocks[i] += need
                        b_req[nb] = i
                        b_chunk[nb] = c
                        nb += 1
                        budget -= c
            # 2) admit waiting requests in FCFS order (none after a preemption in this step)
            if not decode_only and not preempted_now:
                while n_waiting[r] > 0 and n_run[r] < B and nb < B and budget > 0:
                    i = q_head[r]
                    _prefix_hit_nb(i, r, status, computed, group, hit, seen)
                    pend = prompt[i] + generated[i] - computed[i]
                    c = pend
                    if c > budget:
                        if pol == C.ORCA or pol == C.VLLM_V0:
                            if nb > 0:
                                break
                        else:
                            c = budget
                    need = _blocks_for(computed[i] + c, bs) - blocks[i]
                    if free_blocks[r] - need < cfg.watermark_blocks:
                        break
                    _pop_front(q_next, q_head, q_tail, r)
                    n_waiting[r] -= 1
                    if status[i] == C.SWAPPED:
                        swap_s += p.swap_alpha + computed[i] * cfg.kv_bytes_per_token / p.swap_bw
                    status[i] = C.RUNNING
                    if math.isnan(scheduled[i]):
                        scheduled[i] = now
                    free_blocks[r] -= need
                    blocks[i] += need
                    run[r, n_run[r]] = i
                    n_run[r] += 1
                    b_req[nb] = i
                    b_chunk[nb] = c
                    nb += 1
                    budget -= c

        if nb == 0:
            continue

        # ---- price the micro-batch from its aggregates
        tp_tok = 0.0
        n_pf = 0.0
        n_logit = 0.0
        pairs = 0.0
        kv_pf = 0.0
        n_dec = 0.0
        kv_dec = 0.0
        for j in range(nb):
            i = b_req[j]
            c = b_chunk[j]
            pend = prompt[i] + generated[i] - computed[i]
            if generated[i] > 0 and pend == 1:
                n_dec += 1.0
                kv_dec += computed[i] + 1.0
            else:
                tp_tok += c
                n_pf += 1.0
                pairs += c * (computed[i] + (c + 1.0) / 2.0)
                kv_pf += computed[i] + c
            if c == pend:
                n_logit += 1.0
        if pol == C.STATIC and static_pad_n[r] > 0:
            n_dec += static_pad_n[r]
            kv_dec += static_pad_kv[r]
            n_logit += static_pad_n[r]
        comp = iteration_components_nb(p, tp_tok, n_pf, n_logit, pairs, kv_pf, n_dec, kv_dec)
        latency = comp[5] + swap_s
        interval = comp[6] + swap_s
        # claim a pipeline slot
        slot = 0
        for s in range(PP):
            if mb_end[r, s] == INF:
                slot = s
                break
        if n_inflight[r] == 0:
            inflight_since[r] = now
        if PP == 1:
            mb_end[r, slot] = now + latency
        else:
            # a pipeline is first in, first out: each later stage takes the micro-batch when the
            # previous stage has passed it on and the stage has finished the one before it
            d = (latency - interval) / (PP - 1)
            t_out = now + interval
            for k in range(1, PP):
                if stage_free[r, k] > t_out:
                    t_out = stage_free[r, k]
                t_out += d
                stage_free[r, k] = t_out
            mb_end[r, slot] = t_out
            stats[STAT_STAGE_BUSY] += d
        mb_n[r, slot] = nb
        for j in range(nb):
            mb_req[r, slot, j] = b_req[j]
            mb_chunk[r, slot, j] = b_chunk[j]
            inflight[b_req[j]] = True
        n_inflight[r] += 1
        next_free[r] = now + interval
        if n_inflight[r] < PP:
            sched_time[r] = next_free[r]

        kv_in_use = cfg.num_blocks - free_blocks[r]
        iters += 1
        stats[STAT_BUSY] += interval
        stats[STAT_SEQS_TIME] += nb * interval
        stats[STAT_TOKENS_TIME] += (tp_tok + n_dec) * interval
        stats[STAT_KV_TIME] += kv_in_use * interval
        if kv_in_use > stats[STAT_KV_MAX]:
            stats[STAT_KV_MAX] = kv_in_use
        stats[STAT_FLOPS] += comp[7]
        stats[STAT_BYTES] += comp[8]
        stats[STAT_SWAP_TIME] += swap_s
        stats[STAT_GEMM] += comp[0]
        stats[STAT_ATTN] += comp[1]
        stats[STAT_ELEM] += comp[2]
        stats[STAT_COMM] += comp[3]
        stats[STAT_OVERHEAD] += comp[4]
        # decimated iteration log: when full, keep every other sample and double the stride
        if (iters - 1) % log_stride == 0:
            if log_count == L:
                for k in range(L // 2):
                    log_time[k] = log_time[2 * k]
                    log_replica[k] = log_replica[2 * k]
                    log_seqs[k] = log_seqs[2 * k]
                    log_tokens[k] = log_tokens[2 * k]
                    log_kv[k] = log_kv[2 * k]
                    log_wait[k] = log_wait[2 * k]
                log_count = L // 2
                log_stride *= 2
            if (iters - 1) % log_stride == 0:
                log_time[log_count] = now
                log_replica[log_count] = r
                log_seqs[log_count] = nb
                log_tokens[log_count] = int(tp_tok + n_dec)
                log_kv[log_count] = kv_in_use
                log_wait[log_count] = n_waiting[r]
                log_count += 1

    for r in range(R):
        if n_inflight[r] > 0:
            stats[STAT_INFLIGHT_TIME] += now - inflight_since[r]
    stats[STAT_ITERATIONS] = iters
    stats[STAT_END_TIME] = now
    return (arrival, scheduled, first_token, finish, preempt, replica_of, status, max_gap, gap_hist,
            log_time[:log_count].copy(), log_replica[:log_count].copy(), log_seqs[:log_count].copy(),
            log_tokens[:log_count].copy(), log_kv[:log_count].copy(), log_wait[:log_count].copy(),
            log_count, stats)
