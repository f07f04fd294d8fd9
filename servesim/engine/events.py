"""One jitted handler per event kind, named as the reference simulator's methods
(`servesim.reference.sim.ReferenceSimulator`): `complete` (a micro-batch comes out of the pipeline),
`transfer` (a KV transfer moves its last byte or ends), `arrive` (a request reaches the engine,
`route` picks its replica), `schedule` (a replica forms one micro-batch, `launch` prices it and puts
it in flight), and `end`, `wake` and `to_decode`, which they share. Semantics: engine/POOLS.md.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from ..costmodel import fields as F
from ..costmodel.iteration import IterationCost, decode_cost_nb, iteration_components_nb
from ..costmodel.speculative import draft_time_nb
from . import codes as C
from .flow import bytes_done_nb, drop_transfer_nb, heap_push_nb, start_transfer_nb
from .jit import HANDLER, INLINED
from .nextevent import set_time_nb
from .prefix import blocks_for_nb, lookup_nb, register_nb, release_nb, take_nb
from .span import gap_bin_nb, leave_nb, span_complete_nb, span_joins_nb, span_next_nb, span_quick_nb
from .schedule import (admit_nb, async_cutoff_nb, continuous_batch_nb, drop_running_nb, push_back_nb, push_front_nb,
                       static_batch_nb)
from .state import (
    ENDED, HELD_HEAD, HELD_TAIL, INF, ITERATIONS, LOG_COUNT, LOG_STRIDE, ROUTED, ROUTED_D, SENT, STAT_ATTN,
    STAT_BUSY, STAT_ITERATIONS, STAT_PREEMPTIONS, STAT_BYTES, STAT_COMM, STAT_ELEM, STAT_FLOPS, STAT_GEMM, STAT_INFLIGHT_TIME, STAT_KV_MAX,
    STAT_KV_TIME, STAT_OVERHEAD, STAT_SEQS_TIME, STAT_STAGE_BUSY, STAT_SWAP_TIME, STAT_TOKENS_TIME,
    STAT_DRAFT, STAT_SPEC_STEPS, STAT_SPEC_TOKENS, STAT_VERIFY, PAD_KV, PAD_SEQS,
)


@njit(**HANDLER)
def end_nb(cfg, chains, rq, turns, ctr, i, status, now):
    """Request i ends (done or rejected); in a closed loop its client sends the next request, in a
    session the next turn is sent after its think time."""
    rq.status[i] = status
    rq.finish[i] = now
    ctr[ENDED] += 1
    if cfg.concurrency > 0 and ctr[SENT] < rq.prompt.shape[0]:
        rq.arrival[ctr[SENT]] = now + cfg.frontend
        ctr[SENT] += 1
    if turns is None:        # (no sessions: compiled without them)
        return
    j = chains.next_turn[i]
    if j >= 0:
        rq.arrival[j] = now + chains.think[j] + cfg.frontend
        heap_push_nb(turns, ctr, rq.arrival[j], j)


@njit(**HANDLER)
def wake_nb(prow, rprow, wake_at, wake_tree, r, at):
    """Ask for a scheduling decision on replica r at `at` if a pipeline slot is free (``prow``, ``rprow``:
    the pools' and the replicas' records; ``wake_at``, ``wake_tree``: `Replicas`')."""
    if rprow.n_in_flight[r] < prow.pp[rprow.pool[r]]:
        set_time_nb(wake_at, wake_tree, r, at)


@njit(inline="always", **HANDLER)
def complete_nb(cfg, pools, chains, rq, rp, cache, turns, xfers, ctr, stats, prefix, gap_hist, r, s, now, spec, sp, pad):
    """The micro-batch in slot s of replica r comes out: tokens are emitted, finished requests free
    their blocks; on a prefill replica a finished prompt goes to a decode replica. ``pad``: static
    batching's padding (`state.new_pad`; None: another policy, pruned)."""
    computed, generated, prompt = rq.computed, rq.generated, rq.prompt
    last_token, max_gap, in_flight = rq.last_token, rq.max_gap, rq.in_flight
    slot_req, slot_chunk = rp.slot_req, rp.slot_chunk
    pl = rp.row.pool[r]
    k = r * cfg.pp + s
    set_time_nb(rp.slot_end, rp.slot_tree, k, INF)
    rp.row.n_in_flight[r] -= 1
    if rp.row.n_in_flight[r] == 0:
        stats[r, STAT_INFLIGHT_TIME] += now - rp.row.inflight_since[r]
    prefill_pool = pools.row.role[pl] == C.PREFILL
    freed = False
    cached_gap = -1.0
    cached_bin = 0
    lo = 0
    in_span = spec is None and sp.row.active[r] == 1
    if in_span:                     # an iteration of a decode span (span.py): its members untouched,
        lo = sp.row.n[r]                # but those it ends; then its other members as below
        span_complete_nb(sp.row, sp.epochs, gap_hist, r, now)
        if sp.row.done[r] == sp.row.fin[r]:
            span_finish_nb(cfg, chains, rq, rp.row, rp.running, rp.slot_req, cache, turns, ctr, sp, r, now)
            freed = True
    for j in range(lo, rp.slot.n[k]):
        i = slot_req[k, j]
        in_flight[i] = False
        new = 1                     # tokens emitted
        if spec is not None and generated[i] > 0 and computed[i] + 1 == prompt[i] + generated[i]:
            new = slot_chunk[k, j]  # a verified decode: the accepted drafts and the target's own token
            spec.steps[i] += 1
            generated[i] += new - 1
        computed[i] += slot_chunk[k, j]
        if cache is not None and not rq.reg_done[i]:
            register_nb(cfg, rq, cache, chains, ctr, r, i)
        if computed[i] != prompt[i] + generated[i]:
            continue                # a prefill chunk that does not finish the prompt
        if xfers is not None and prefill_pool and generated[i] == 0 and rq.output[i] > 1:
            drop_running_nb(rp.running, rp.row.n_running, r, i)
            rq.status[i] = C.TRANSFER
            rq.pf_replica[i] = r
            to_decode_nb(cfg, pools, chains, rq, rp, cache, xfers, ctr, prefix, i, now - rp.slot.start[k], now)
            continue
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
                if new > 1:         # the step's other tokens come out with it: gaps of 0
                    gap_hist[0] += new - 1
        last_token[i] = now
        if generated[i] >= rq.output[i]:
            rp.row.load[r] -= 1
            if pad is not None and cfg.policy == C.STATIC:
                pad[r, PAD_SEQS] += 1
                pad[r, PAD_KV] += computed[i]
            release_nb(cfg, rq, rp.row, cache, chains, ctr, r, i, rq.blocks[i])
            rq.blocks[i] = 0
            freed = True
            drop_running_nb(rp.running, rp.row.n_running, r, i)
            end_nb(cfg, chains, rq, turns, ctr, i, C.DONE, now)
    rp.slot.n[k] = 0
    if in_span and sp.row.active[r] == 1 and sp.row.n[r] < rp.row.n_running[r]:    # (else none can join)
        span_joins_nb(cfg, chains, rq, rp.row, rp.running, rp.slot_req, rp.slot_chunk, cache, sp, r, now)
    if pad is not None and rp.row.n_running[r] == 0 and cfg.policy == C.STATIC:
        pad[r, PAD_SEQS] = 0
        pad[r, PAD_KV] = 0
    wake_nb(pools.row, rp.row, rp.wake_at, rp.wake_tree, r, max(rp.row.next_free[r], now))
    if xfers is not None and freed and pools.row.role[pl] == C.DECODE and ctr[HELD_HEAD] >= 0:
        retry_held_nb(cfg, pools, chains, rq, rp, cache, xfers, ctr, prefix, now)


@njit(**HANDLER)
def span_finish_nb(cfg, chains, rq, rprow, running, slot_req, cache, turns, ctr, sp, r, now):
    """The span's completion `sp.row.fin` gives members their last token: in running order, each leaves the
    span (`span.leave_nb`) and ends as in `complete_nb`, and the running list closes up over it (as
    `drop_running_nb` would), the span's positions with it; the span's next ending completion. The
    members' own ending completions (`sp.fin_at`, by running position, not their records) are read in
    one pass per member it ends, which finds the first and the least ending completion of the others
    (vectorised, as are the shifts that close the lists up after it); positions before it stay as they are."""
    c = sp.row.done[r]
    # replica r's rows, as 1-D views: the loops below index them by position alone (and vectorise)
    run, fin_at, epoch, sreq = running[r], sp.fin_at[r], sp.epoch[r], slot_req[r * cfg.pp]
    n = sp.row.n[r]
    nr = rprow.n_running[r]
    big = 1 << 62
    while True:     # (some member ends)
        fin = big       # the least ending completion of the members that stay
        ends = 0        # members it ends
        at = big        # ... the first's position
        for pos in range(n):
            f = fin_at[pos]
            e = f <= c
            ends += e
            at = min(at, pos if e else big)
            fin = min(fin, big if e else f)
        i = run[at]
        leave_nb(cfg, rq, sp, r, i, epoch[at])
        rprow.load[r] -= 1
        release_nb(cfg, rq, rprow, cache, chains, ctr, r, i, rq.blocks[i])
        rq.blocks[i] = 0
        end_nb(cfg, chains, rq, turns, ctr, i, C.DONE, now)
        # the running list and the span's positions close up over it (unsigned positions: numba's
        # wraparound of a negative index, which LLVM cannot rule out for a range from `at`, otherwise
        # keeps these copies from being vectorised, ~4x slower)
        lo, one = np.uint64(at), np.uint64(1)
        for q in range(lo, np.uint64(n - 1)):
            epoch[q] = epoch[q + one]
        for q in range(lo, np.uint64(n - 1)):
            fin_at[q] = fin_at[q + one]
        for q in range(lo, np.uint64(n - 1)):
            sreq[q] = sreq[q + one]
        for q in range(lo, np.uint64(nr - 1)):
            run[q] = run[q + one]
        n -= 1
        nr -= 1
        if ends == 1:
            break
    rprow.n_running[r] = nr
    sp.row.n[r] = n
    sp.row.fin[r] = fin
    if n == 0:
        sp.row.active[r] = 0


@njit(**INLINED)
def pick_nb(cfg, rq, rprow, prow, cache, chains, lst, i, routed, prefix_aware):
    """The router's choice among the replicas `lst` for request i (``prefix_aware``: the most blocks of
    its chain cached, GPU or CPU, capped as a hit is; ties to the least loaded). ``rprow``, ``prow``: the
    replicas' and the pools' records."""
    m = lst.shape[0]
    if m == 1:
        return lst[0]
    if cfg.router == C.ROUND_ROBIN:
        return lst[routed % m]
    if cfg.router == C.RANDOM:
        return lst[min(int(rq.u1[i] * m), m - 1)]
    load, weight, pool = rprow.load, prow.weight, rprow.pool
    if cfg.router == C.POWER_OF_TWO:
        ja = min(int(rq.u1[i] * m), m - 1)
        jb = min(int(rq.u2[i] * (m - 1)), m - 2)
        if jb >= ja:
            jb += 1
        a = lst[ja]
        b = lst[jb]
        lb = load[b] / weight[pool[b]]
        la = load[a] / weight[pool[a]]
        if lb < la or (lb == la and b < a):
            return b
        return a
    free, nblk = rprow.free_blocks, prow.num_blocks
    best = lst[0]
    best_h = -1
    if cache is not None and prefix_aware:
        best_h = lookup_nb(cfg, rq, cache, chains, best, i)[0]
    for jj in range(1, m):
        r = lst[jj]
        lr = load[r] / weight[pool[r]]
        lbest = load[best] / weight[pool[best]]
        if cache is not None and prefix_aware:
            h = lookup_nb(cfg, rq, cache, chains, r, i)[0]
            if h > best_h or (h == best_h and lr < lbest):
                best = r
                best_h = h
        elif cfg.router == C.LEAST_KV:
            fr = free[r] / nblk[pool[r]]
            fb = free[best] / nblk[pool[best]]
            if fr > fb or (fr == fb and lr < lbest):
                best = r
        elif lr < lbest:
            best = r
    return best


@njit(**HANDLER)
def to_decode_nb(cfg, pools, chains, rq, rp, cache, xfers, ctr, prefix, i, t_prefill, now):
    """Request i's prompt is done on its prefill replica: reserve a decode replica and start the
    transfer of its KV cache, or hold it (with its blocks) until a decode replica has room.
    Returns whether the transfer started."""
    need = blocks_for_nb(rq.prompt[i] + 1, cfg.block_size)
    whole = blocks_for_nb(rq.prompt[i] + rq.output[i], cfg.block_size)
    lst = rp.decode
    d = pick_nb(cfg, rq, rp.row, pools.row, cache, chains, lst, i, ctr[ROUTED_D], False)
    m = lst.shape[0]
    at = 0
    for jj in range(m):
        if lst[jj] == d:
            at = jj
    found = -1
    for jj in range(m):     # the first from d on that can take `need` blocks now, and its pool `whole`
        c = lst[(at + jj) % m]
        k = rp.row.pool[c]
        wm = pools.row.watermark_blocks[k]
        if whole <= pools.row.num_blocks[k] - wm and rp.row.free_blocks[c] - need >= wm:
            found = c
            break
    if found < 0:
        if t_prefill >= 0.0:        # first try: join the held FIFO (q_next links it)
            rq.q_next[i] = -1
            if ctr[HELD_TAIL] < 0:
                ctr[HELD_HEAD] = i
            else:
                rq.q_next[ctr[HELD_TAIL]] = i
            ctr[HELD_TAIL] = i
        return False
    ctr[ROUTED_D] += 1
    take_nb(cfg, pools.row, rp.row, cache, ctr, prefix, found, need)
    rp.row.load[found] += 1
    rq.src_blocks[i] = rq.blocks[i]
    rq.blocks[i] = need
    rq.replica[i] = found
    rq.reg_done[i] = True
    P = rp.row.pool[rq.pf_replica[i]]
    D = rp.row.pool[found]
    g = pools.row.kv_gpus[P] if pools.row.kv_gpus[P] < pools.row.kv_gpus[D] else pools.row.kv_gpus[D]
    nbytes = rq.prompt[i] * pools.row.kv_bytes_total[P] / g
    if cfg.layerwise and t_prefill >= 0.0:
        left = nbytes - pools.link.bw[P, D] * t_prefill
        last = nbytes / pools.row.n_layers[P]
        nbytes = left if left > last else last
    start_transfer_nb(pools.link, rq, rp.row, xfers, ctr, i, nbytes, now)
    return True


@njit(**HANDLER)
def retry_held_nb(cfg, pools, chains, rq, rp, cache, xfers, ctr, prefix, now):
    """Decode blocks were freed: start the held transfers from the head while they fit."""
    while ctr[HELD_HEAD] >= 0:
        i = ctr[HELD_HEAD]
        if not to_decode_nb(cfg, pools, chains, rq, rp, cache, xfers, ctr, prefix, i, -1.0, now):
            return
        ctr[HELD_HEAD] = rq.q_next[i]
        rq.q_next[i] = -1
        if ctr[HELD_HEAD] < 0:
            ctr[HELD_TAIL] = -1


@njit(**HANDLER)
def transfer_nb(cfg, pools, chains, rq, rp, cache, xfers, ctr, i, now):
    """Transfer i moves its last byte (it then ends after the link's latency), or ends: the prefill
    replica frees its blocks, the first token comes out, decoding starts on the decode replica."""
    if math.isnan(rq.xfer_end[i]):
        bytes_done_nb(pools.link, rq, rp.row, xfers, ctr, i, now)
        return
    drop_transfer_nb(rq, xfers, ctr, i)
    src = rq.pf_replica[i]
    release_nb(cfg, rq, rp.row, cache, chains, ctr, src, i, rq.src_blocks[i])
    rq.src_blocks[i] = 0
    rp.row.load[src] -= 1
    wake_nb(pools.row, rp.row, rp.wake_at, rp.wake_tree, src, max(rp.row.next_free[src], now))
    d = rq.replica[i]
    rq.generated[i] = 1
    rq.first_token[i] = now
    rq.last_token[i] = now
    if rq.generated[i] >= rq.output[i]:     # (output 1 never transfers)
        return
    if rp.row.n_running[d] < cfg.max_num_seqs:
        rq.status[i] = C.RUNNING
        rp.running[d, rp.row.n_running[d]] = i
        rp.row.n_running[d] += 1
    else:       # at the front: a preempted request must not wait behind the blocks it holds
        rq.status[i] = C.WAITING
        push_front_nb(rq.q_next, rp.row.q_head, rp.row.q_tail, rp.row.n_waiting, d, i)
    wake_nb(pools.row, rp.row, rp.wake_at, rp.wake_tree, d, max(rp.row.next_free[d], now))


@njit(**INLINED)
def rejects_nb(cfg, prow, rprow, rq, r, i):
    """Request i can never fit on entry replica r (or, PD, on any decode replica); ``prow``, ``rprow``:
    the pools' and the replicas' records."""
    k = rprow.pool[r]
    cap = prow.num_blocks[k] - prow.watermark_blocks[k]
    if prow.role[k] != C.PREFILL:
        return blocks_for_nb(rq.prompt[i] + rq.output[i], cfg.block_size) > cap
    if blocks_for_nb(rq.prompt[i], cfg.block_size) > cap:
        return True
    if rq.output[i] <= 1:
        return False
    need = blocks_for_nb(rq.prompt[i] + rq.output[i], cfg.block_size)
    for q in range(prow.role.shape[0]):
        if prow.role[q] == C.DECODE and need <= prow.num_blocks[q] - prow.watermark_blocks[q]:
            return False
    return True


@njit(**INLINED)
def route_nb(cfg, rq, rprow, prow, cache, chains, entry, i, routed):
    """The replica request i arrives at (the reference simulator's `route`), one of ``entry`` (`Replicas`')."""
    return pick_nb(cfg, rq, rprow, prow, cache, chains, entry, i, routed,
                   cfg.router == C.PREFIX_AWARE and cfg.prefix_caching)


@njit(inline="always", **HANDLER)
def arrive_nb(cfg, pools, chains, rq, rp, cache, turns, ctr, i, now):
    """Request i arrives: route it, reject it if it can never fit, else queue it."""
    r = route_nb(cfg, rq, rp.row, pools.row, cache, chains, rp.entry, i, ctr[ROUTED])
    ctr[ROUTED] += 1
    rq.replica[i] = r
    if rejects_nb(cfg, pools.row, rp.row, rq, r, i):
        end_nb(cfg, chains, rq, turns, ctr, i, C.REJECTED, now)
        return
    rq.status[i] = C.WAITING
    push_back_nb(rq.q_next, rp.row.q_head, rp.row.q_tail, rp.row.n_waiting, r, i)
    rp.row.load[r] += 1
    wake_nb(pools.row, rp.row, rp.wake_at, rp.wake_tree, r, max(rp.row.next_free[r], now))


@njit(**HANDLER)    # called, not inlined: 1.5 CPU s less cold compile, same loop speed (README, Speed)
def schedule_nb(ps, fs, cfg, pools, chains, rq, rp, cache, step, ctr, stats, prefix, r, now, spec, dps, sp, pad):
    """A scheduling decision on replica r: form one micro-batch and price it (the next iteration of a
    decode span, span.py, when it can be one); the loop launches it (`launch_nb`). Returns `price_nb`'s
    tuple, its first member 0 when the batch is empty. Static batching only with its padding ``pad``
    (None: another policy, and `static_batch_nb` is not compiled)."""
    set_time_nb(rp.wake_at, rp.wake_tree, r, INF)
    pl = rp.row.pool[r]
    before = stats[r, STAT_PREEMPTIONS]
    kv_span = -1
    if spec is None and cfg.fast_forward and cfg.policy != C.STATIC:
        kv_span = span_quick_nb(sp.row, sp.hits, rp.row, r, cfg.block_size, cfg.policy)
        if kv_span < 0:
            kv_span = span_next_nb(cfg, pools.row, chains, rq, rp.row, rp.running, rp.slot_req, rp.slot_chunk, cache, ctr, prefix, sp, r)
    if kv_span >= 0:
        nb = sp.row.n[r]
        swap_s = 0.0
        if rp.row.n_waiting[r] > 0:     # admissions after the span's members, one token of the budget each
            nb, swap_s = admit_nb(ps, cfg, pools.row, rq, rp.row, rp.running, rp.slot, cache, chains, step, ctr, prefix,
                                  r, now, nb, cfg.max_batched_tokens - nb, swap_s)
    elif pad is not None and cfg.policy == C.STATIC:
        nb, swap_s = static_batch_nb(ps, cfg, pools.row, rq, rp.row, rp.running, cache, chains, step, ctr, prefix, r,
                                     now)
    else:
        nb, swap_s = continuous_batch_nb(ps, cfg, pools, rq, rp, cache, chains, step, ctr, stats, prefix, r, now,
                                         spec)
    if nb == 0:
        if stats[r, STAT_PREEMPTIONS] > before:
            # it preempted and launched nothing: decide again at once (the freed blocks may admit requests)
            wake_nb(pools.row, rp.row, rp.wake_at, rp.wake_tree, r, now)
        return nb, nb, 0.0, IterationCost(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0), 0.0, 0.0, 0.0, 0.0
    dp = ps[pl]         # the drafts' cost table (speculative decoding), else unused
    if spec is not None:
        dp = dps[pl]
    return price_nb(ps[pl], fs, cfg, rq, step, r, nb, swap_s, spec, dp, kv_span, sp.row.n[r], pad)


@njit(inline="always", **HANDLER)
def span_decide_nb(ps, fs, cfg, pools, rq, rp, sp, r):
    """`schedule_nb`'s most common decision, inlined in the loop (a call of `schedule_nb` passes ~300
    words of arguments): replica r's span goes on (`span.span_quick_nb`) and nothing it could admit
    waits (none waits, or with async scheduling the first waiting arrived after the step now ending
    was launched, `schedule.async_cutoff_nb`, where `admit_nb` stops at once), so the batch is the
    span's members alone, priced from their count and KV as `price_nb` prices them, the terms of the
    count kept from the pool's earlier steps (`costmodel.iteration.decode_cost_nb`). Returns
    `price_nb`'s tuple, or its first member -1, with nothing changed, when that is not the case:
    `schedule_nb` decides (and only it begins a span, where spans run: fast-forward on, no
    speculative decoding, not static batching)."""
    kv = -1
    n = sp.row.n[r]
    if rp.row.n_waiting[r] == 0 or rq.arrival[rp.row.q_head[r]] > async_cutoff_nb(ps, cfg, pools.row, rp.row, rp.slot, r, n):
        kv = span_quick_nb(sp.row, sp.hits, rp.row, r, cfg.block_size, cfg.policy)
    pl = rp.row.pool[r]
    if kv < 0:
        return -1, n, 0.0, IterationCost(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0), 0.0, 0.0, 0.0, 0.0
    set_time_nb(rp.wake_at, rp.wake_tree, r, INF)
    cost = decode_cost_nb(ps[pl], fs.moe, fs.ep, fs.mla, fs.wo, sp.memo[pl], n, kv)
    return n, n, 0.0 + float(n), cost, 0.0, 0.0, 0.0, 0.0


@njit(inline="always", **HANDLER)
def price_nb(p, fs, cfg, rq, step, r, nb, swap_s, spec, dp, kv_span, n_span, pad):
    """Price the micro-batch of the step's first ``nb`` members from its aggregates; returns (nb, the
    first member the slot does not hold yet, its tokens, its cost, ``swap_s``, the drafts' seconds,
    the sequence-steps that verify drafts and the tokens they yield), for `launch_nb`. With
    speculative decoding a decode is priced as a verification of k + 1 tokens after its cached ones
    (a short prefill, every position sampled) and the step first drafts for those decodes (``dp``).
    ``kv_span`` >= 0: an iteration of a decode span (span.py): its first ``n_span`` members decode, their
    KV sums to it, and they are already in the slot. Static batching pads the batch with its finished
    members (``pad``). ``fs``: the step cost's shape (costmodel/features.py)."""
    computed, generated, prompt, b_req, b_chunk = rq.computed, rq.generated, rq.prompt, step.req, step.chunk
    tp_tok = 0.0
    n_pf = 0.0
    n_logit = 0.0
    pairs = 0.0
    kv_pf = 0.0
    n_dec = 0.0
    kv_dec = 0.0
    n_spec = 0.0
    kv_spec = 0.0
    spec_tok = 0.0
    lo = 0
    if kv_span >= 0:        # the sums below, of n_span decodes (exact integers in floating point)
        n_dec = float(n_span)
        kv_dec = float(kv_span)
        n_logit = float(n_span)
        lo = n_span
    for j in range(lo, nb):
        i = b_req[j]
        c = b_chunk[j]
        pend = prompt[i] + generated[i] - computed[i]
        if spec is not None and generated[i] > 0 and pend == 1:
            q = spec.k + 1.0
            tp_tok += q
            n_pf += 1.0
            pairs += q * (computed[i] + (q + 1.0) / 2.0)
            kv_pf += computed[i] + q
            n_logit += q
            n_spec += 1.0
            kv_spec += computed[i] + 1.0
            spec_tok += c
            continue
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
    if pad is not None and cfg.policy == C.STATIC and pad[r, PAD_SEQS] > 0:
        n_dec += pad[r, PAD_SEQS]
        kv_dec += pad[r, PAD_KV]
        n_logit += pad[r, PAD_SEQS]
    cost = iteration_components_nb(p, fs.moe, fs.ep, fs.mla, fs.wo, tp_tok, n_pf, n_logit, pairs, kv_pf, n_dec, kv_dec)
    draft = 0.0
    if spec is not None and n_spec > 0.0 and spec.draft > 0:
        draft = draft_time_nb(dp, fs.moe, fs.ep, fs.mla, fs.wo, p[F.attn_dp], n_spec, kv_spec, spec.k, spec.proj)
    return nb, lo, tp_tok + n_dec, cost, swap_s, draft, n_spec, spec_tok


@njit(inline="always", **HANDLER)
def launch_nb(cfg, pools, rq, rp, step, ctr, stats, log, r, priced, spec, now):
    """Put the micro-batch a decision priced (``priced``: `price_nb`'s tuple) in flight on replica r: a
    pipeline slot, its completion and the replica's next decision, its members in the slot (those
    after the span's), the statistics and the log."""
    nb, lo, tokens, cost, swap_s, draft, n_spec, spec_tok = priced
    pl = rp.row.pool[r]
    PP = pools.row.pp[pl]
    latency = cost.latency + swap_s + draft
    interval = cost.interval + swap_s + draft
    # claim a pipeline slot
    base = r * cfg.pp
    k = base
    slot_end = rp.slot_end
    for s in range(PP):
        if slot_end[base + s] == INF:
            k = base + s
            break
    if rp.row.n_in_flight[r] == 0:
        rp.row.inflight_since[r] = now
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
        stats[r, STAT_STAGE_BUSY] += d
    set_time_nb(rp.slot_end, rp.slot_tree, k, t_out)
    rp.slot.start[k] = now
    rp.slot.n[k] = nb
    rp.row.n_in_flight[r] += 1
    rp.row.next_free[r] = now + interval
    wake_nb(pools.row, rp.row, rp.wake_at, rp.wake_tree, r, rp.row.next_free[r])

    kv_in_use = pools.row.num_blocks[pl] - rp.row.free_blocks[r]
    ctr[ITERATIONS] += 1
    stats[r, STAT_ITERATIONS] += 1
    stats[r, STAT_BUSY] += interval
    stats[r, STAT_SEQS_TIME] += nb * interval
    stats[r, STAT_TOKENS_TIME] += tokens * interval
    stats[r, STAT_KV_TIME] += kv_in_use * interval
    if kv_in_use > stats[r, STAT_KV_MAX]:
        stats[r, STAT_KV_MAX] = kv_in_use
    stats[r, STAT_FLOPS] += cost.flops
    stats[r, STAT_BYTES] += cost.nbytes
    stats[r, STAT_SWAP_TIME] += swap_s
    stats[r, STAT_GEMM] += cost.gemm
    stats[r, STAT_ATTN] += cost.attention
    stats[r, STAT_ELEM] += cost.elementwise
    stats[r, STAT_COMM] += cost.communication
    stats[r, STAT_OVERHEAD] += cost.overhead
    if (ctr[ITERATIONS] - 1) & (ctr[LOG_STRIDE] - 1) == 0:     # (a sample: the call, ~18 ns, only then)
        log_iteration_nb(log, ctr, now, r, nb, int(tokens), kv_in_use, rp.row.n_waiting[r])
    if spec is not None and n_spec > 0.0:
        stats[r, STAT_DRAFT] += draft
        stats[r, STAT_VERIFY] += interval - draft
        stats[r, STAT_SPEC_STEPS] += n_spec
        stats[r, STAT_SPEC_TOKENS] += spec_tok
    slot_req, slot_chunk, in_flight, b_req, b_chunk = rp.slot_req, rp.slot_chunk, rq.in_flight, step.req, step.chunk
    for j in range(lo, nb):
        slot_req[k, j] = b_req[j]
        slot_chunk[k, j] = b_chunk[j]
        in_flight[b_req[j]] = True


@njit(**HANDLER)
def log_iteration_nb(log, ctr, now, r, nb, tokens, kv_in_use, waiting):
    """Decimated iteration log: when full, keep every other sample and double the stride. (`launch_nb`
    calls it only at an iteration that is a multiple of the stride.)"""
    it = ctr[ITERATIONS] - 1
    if it & (ctr[LOG_STRIDE] - 1) != 0:     # (it % stride: the stride is a power of two)
        return
    L = log.shape[0]
    if ctr[LOG_COUNT] == L:
        for k in range(L // 2):
            log[k] = log[2 * k]     # (whole records: one site each, cheaper to compile than a field's)
        ctr[LOG_COUNT] = L // 2
        ctr[LOG_STRIDE] *= 2
    if it & (ctr[LOG_STRIDE] - 1) == 0:
        e = log[ctr[LOG_COUNT]]     # (a reference to the record)
        e.time = now
        e.replica = r
        e.seqs = nb
        e.tokens = tokens
        e.kv_blocks = kv_in_use
        e.waiting = waiting
        ctr[LOG_COUNT] += 1
