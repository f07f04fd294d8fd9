"""One jitted handler per event kind, named as the reference simulator's methods
(`servesim.reference.sim.ReferenceSimulator`): `complete` (a micro-batch comes out of the pipeline),
`arrive` (a request reaches the engine, `route` picks its replica), `schedule` (a replica forms one
micro-batch, `launch` prices it and puts it in flight), and `end` and `wake`, which they share.
"""
from __future__ import annotations

import math

from numba import njit

from ..costmodel.iteration import iteration_components_nb
from . import codes as C
from .jit import HANDLER
from .nextevent import set_time_nb
from .schedule import blocks_for_nb, continuous_batch_nb, drop_running_nb, push_back_nb, static_batch_nb
from .state import (
    ENDED, INF, ITERATIONS, LOG_COUNT, LOG_STRIDE, NEXT_ARRIVAL, ROUTED, SENT, STAT_ATTN, STAT_BUSY,
    STAT_BYTES, STAT_COMM, STAT_ELEM, STAT_FLOPS, STAT_GEMM, STAT_INFLIGHT_TIME, STAT_KV_MAX, STAT_KV_TIME,
    STAT_OVERHEAD, STAT_SEQS_TIME, STAT_STAGE_BUSY, STAT_SWAP_TIME, STAT_TOKENS_TIME,
)


@njit(**HANDLER)
def gap_bin_nb(gap):
    if gap <= 0.0:
        return 0
    x = (math.log10(gap) - C.GAP_LOG10_MIN) / (C.GAP_LOG10_MAX - C.GAP_LOG10_MIN) * C.GAP_BINS
    if x < 0.0:
        return 0
    if x >= C.GAP_BINS:
        return C.GAP_BINS - 1
    return int(x)


@njit(**HANDLER)
def end_nb(cfg, rq, ctr, i, status, now):
    """Request i ends (done or rejected); in a closed loop its client sends the next request."""
    rq.status[i] = status
    rq.finish[i] = now
    ctr[ENDED] += 1
    if cfg.concurrency > 0 and ctr[SENT] < rq.prompt.shape[0]:
        rq.arrival[ctr[SENT]] = now + cfg.frontend
        ctr[SENT] += 1


@njit(**HANDLER)
def wake_nb(cfg, rp, r, at):
    """Ask for a scheduling decision on replica r at `at` if a pipeline slot is free."""
    if rp.n_in_flight[r] < cfg.pp:
        set_time_nb(rp.wake_at, rp.wake_tree, r, at)


@njit(inline="always", **HANDLER)
def complete_nb(cfg, rq, rp, ctr, stats, gap_hist, r, s, now):
    """The micro-batch in slot s of replica r comes out: tokens are emitted, finished requests free
    their blocks."""
    computed, generated, prompt, group, hit = rq.computed, rq.generated, rq.prompt, rq.group, rq.hit
    last_token, max_gap, in_flight = rq.last_token, rq.max_gap, rq.in_flight
    slot_req, slot_chunk = rp.slot_req, rp.slot_chunk
    k = r * cfg.pp + s
    set_time_nb(rp.slot_end, rp.slot_tree, k, INF)
    rp.n_in_flight[r] -= 1
    if rp.n_in_flight[r] == 0:
        stats[STAT_INFLIGHT_TIME] += now - rp.inflight_since[r]
    cached_gap = -1.0
    cached_bin = 0
    for j in range(rp.slot_n[k]):
        i = slot_req[k, j]
        in_flight[i] = False
        computed[i] += slot_chunk[k, j]
        if group[i] >= 0 and hit[i] > 0 and computed[i] >= hit[i]:
            rp.prefix_seen[r, group[i]] = True
        if computed[i] != prompt[i] + generated[i]:
            continue                # a prefill chunk that does not finish the prompt
        generated[i] += 1
        if generated[i] == 1:
            rq.first_token[i] = now
        else:
            gap = now - last_token[i]
            if gap > max_gap[i]:
                max_gap[i] = gap
            if rq.arrival[i] >= cfg.warmup_time:
                # most decodes of a micro-batch share one gap: bin it once
                if gap != cached_gap:
                    cached_gap = gap
                    cached_bin = gap_bin_nb(gap)
                gap_hist[cached_bin] += 1
        last_token[i] = now
        if generated[i] >= rq.output[i]:
            rp.load[r] -= 1
            if cfg.policy == C.STATIC:
                rp.pad_seqs[r] += 1
                rp.pad_kv[r] += computed[i]
            rp.free_blocks[r] += rq.blocks[i]
            rq.blocks[i] = 0
            drop_running_nb(rp.running, rp.n_running, r, i)
            end_nb(cfg, rq, ctr, i, C.DONE, now)
    rp.slot_n[k] = 0
    if rp.n_running[r] == 0 and cfg.policy == C.STATIC:
        rp.pad_seqs[r] = 0
        rp.pad_kv[r] = 0
    wake_nb(cfg, rp, r, max(rp.next_free[r], now))


@njit(**HANDLER)
def route_nb(cfg, rq, rp, i, routed):
    R = cfg.replicas
    if R == 1:
        return 0
    if cfg.router == C.ROUND_ROBIN:
        return routed % R
    if cfg.router == C.RANDOM:
        return min(int(rq.u1[i] * R), R - 1)
    load = rp.load
    if cfg.router == C.POWER_OF_TWO:
        a = min(int(rq.u1[i] * R), R - 1)
        b = min(int(rq.u2[i] * (R - 1)), R - 2)
        if b >= a:
            b += 1
        if load[b] < load[a] or (load[b] == load[a] and b < a):
            return b
        return a
    free = rp.free_blocks
    best = 0
    for r in range(1, R):
        if cfg.router == C.LEAST_KV:
            if free[r] > free[best] or (free[r] == free[best] and load[r] < load[best]):
                best = r
        else:
            if load[r] < load[best]:
                best = r
    return best


@njit(inline="always", **HANDLER)
def arrive_nb(cfg, rq, rp, ctr, now):
    """The next request arrives: route it, reject it if it can never fit, else queue it."""
    i = ctr[NEXT_ARRIVAL]
    ctr[NEXT_ARRIVAL] += 1
    r = route_nb(cfg, rq, rp, i, ctr[ROUTED])
    ctr[ROUTED] += 1
    rq.replica[i] = r
    if blocks_for_nb(rq.prompt[i] + rq.output[i], cfg.block_size) > cfg.num_blocks - cfg.watermark_blocks:
        end_nb(cfg, rq, ctr, i, C.REJECTED, now)
        return
    rq.status[i] = C.WAITING
    push_back_nb(rq.q_next, rp.q_head, rp.q_tail, rp.n_waiting, r, i)
    rp.load[r] += 1
    wake_nb(cfg, rp, r, max(rp.next_free[r], now))


@njit(inline="always", **HANDLER)
def schedule_nb(p, cfg, rq, rp, step, ctr, stats, log, r, now):
    """A scheduling decision on replica r: form one micro-batch and launch it."""
    set_time_nb(rp.wake_at, rp.wake_tree, r, INF)
    swap_s = 0.0
    if cfg.policy == C.STATIC:
        nb = static_batch_nb(cfg, rq, rp, step, r, now)
    else:
        nb, swap_s = continuous_batch_nb(p, cfg, rq, rp, step, stats, r, now)
    if nb > 0:
        launch_nb(p, cfg, rq, rp, step, ctr, stats, log, r, nb, swap_s, now)


@njit(inline="always", **HANDLER)
def launch_nb(p, cfg, rq, rp, step, ctr, stats, log, r, nb, swap_s, now):
    """Price the micro-batch from its aggregates, put it in a pipeline slot, account and log it."""
    PP = cfg.pp
    computed, generated, prompt, b_req, b_chunk = rq.computed, rq.generated, rq.prompt, step.req, step.chunk
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
    if cfg.policy == C.STATIC and rp.pad_seqs[r] > 0:
        n_dec += rp.pad_seqs[r]
        kv_dec += rp.pad_kv[r]
        n_logit += rp.pad_seqs[r]
    cost = iteration_components_nb(p, tp_tok, n_pf, n_logit, pairs, kv_pf, n_dec, kv_dec)
    latency = cost.latency + swap_s
    interval = cost.interval + swap_s
    # claim a pipeline slot
    k = r * PP
    slot_end = rp.slot_end
    for s in range(PP):
        if slot_end[r * PP + s] == INF:
            k = r * PP + s
            break
    if rp.n_in_flight[r] == 0:
        rp.inflight_since[r] = now
    if PP == 1:
        t_out = now + latency
    else:
        # a pipeline is first in, first out: each later stage takes the micro-batch when the
        # previous stage has passed it on and the stage has finished the one before it
        d = (latency - interval) / (PP - 1)
        t_out = now + interval
        stage_free = rp.stage_free
        for st in range(1, PP):
            if stage_free[r, st] > t_out:
                t_out = stage_free[r, st]
            t_out += d
            stage_free[r, st] = t_out
        stats[STAT_STAGE_BUSY] += d
    set_time_nb(rp.slot_end, rp.slot_tree, k, t_out)
    rp.slot_n[k] = nb
    slot_req, slot_chunk, in_flight = rp.slot_req, rp.slot_chunk, rq.in_flight
    for j in range(nb):
        slot_req[k, j] = b_req[j]
        slot_chunk[k, j] = b_chunk[j]
        in_flight[b_req[j]] = True
    rp.n_in_flight[r] += 1
    rp.next_free[r] = now + interval
    wake_nb(cfg, rp, r, rp.next_free[r])

    kv_in_use = cfg.num_blocks - rp.free_blocks[r]
    ctr[ITERATIONS] += 1
    stats[STAT_BUSY] += interval
    stats[STAT_SEQS_TIME] += nb * interval
    stats[STAT_TOKENS_TIME] += (tp_tok + n_dec) * interval
    stats[STAT_KV_TIME] += kv_in_use * interval
    if kv_in_use > stats[STAT_KV_MAX]:
        stats[STAT_KV_MAX] = kv_in_use
    stats[STAT_FLOPS] += cost.flops
    stats[STAT_BYTES] += cost.nbytes
    stats[STAT_SWAP_TIME] += swap_s
    stats[STAT_GEMM] += cost.gemm
    stats[STAT_ATTN] += cost.attention
    stats[STAT_ELEM] += cost.elementwise
    stats[STAT_COMM] += cost.communication
    stats[STAT_OVERHEAD] += cost.overhead
    log_iteration_nb(log, ctr, now, r, nb, int(tp_tok + n_dec), kv_in_use, rp.n_waiting[r])


@njit(**HANDLER)
def log_iteration_nb(log, ctr, now, r, nb, tokens, kv_in_use, waiting):
    """Decimated iteration log: when full, keep every other sample and double the stride."""
    it = ctr[ITERATIONS] - 1
    if it % ctr[LOG_STRIDE] != 0:
        return
    L = log.time.shape[0]
    if ctr[LOG_COUNT] == L:
        for k in range(L // 2):
            log.time[k] = log.time[2 * k]
            log.replica[k] = log.replica[2 * k]
            log.seqs[k] = log.seqs[2 * k]
            log.tokens[k] = log.tokens[2 * k]
            log.kv_blocks[k] = log.kv_blocks[2 * k]
            log.waiting[k] = log.waiting[2 * k]
        ctr[LOG_COUNT] = L // 2
        ctr[LOG_STRIDE] *= 2
    if it % ctr[LOG_STRIDE] == 0:
        n = ctr[LOG_COUNT]
        log.time[n] = now
        log.replica[n] = r
        log.seqs[n] = nb
        log.tokens[n] = tokens
        log.kv_blocks[n] = kv_in_use
        log.waiting[n] = waiting
        ctr[LOG_COUNT] += 1
