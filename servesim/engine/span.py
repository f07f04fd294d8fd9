"""Decode fast-forward: a replica's iterations between two events that change its batch, run from
aggregates without touching its requests, which are brought up to date once when the span ends.

A span begins at a scheduling decision of a one-stage replica (not static batching, no speculative
decoding) whose waiting queue is empty and whose running requests are all decoding, none in flight,
with one last-token time, each holding the blocks of its next token and no more than a block beyond
(and, with the prefix cache, done registering its chain's blocks), and no more of them than the token budget.
The step-by-step scheduler would then put every running request in the batch, one token each, in
running order; so does each iteration of the span, as long as

- nothing waits (an arrival, a transfer to a decode replica, a preempted request),
- the running list is the span's (a transfer appended none),
- the blocks the members need at this iteration are free (else one would preempt),
- and no member finishes at the completion (that completion is run request by request).

Each iteration is priced from the members' count and their computed tokens' sum, exact integers in
floating point, so its cost, the statistics and the log are those of the step loop, in the same
order (the span's iterations stay events of the one loop, interleaved with the other replicas'). The
members share their gaps: one histogram increment per completion, the span's longest gap and last
token applied to each member at the end (`span_end_nb`), with the tokens and blocks it ran. The
step-by-step loop is the reference (`EngineConfig.fast_forward` 0, `--no-fast-forward`); tests
demand identical records.
"""
from __future__ import annotations

import math

from numba import njit

from . import codes as C
from .jit import HANDLER
from .prefix import take_nb


@njit(**HANDLER)
def gap_bin_nb(gap):
    """The inter-token gap histogram's bin of a gap (log10-spaced, codes.GAP_*)."""
    if gap <= 0.0:
        return 0
    x = (math.log10(gap) - C.GAP_LOG10_MIN) / (C.GAP_LOG10_MAX - C.GAP_LOG10_MIN) * C.GAP_BINS
    if x < 0.0:
        return 0
    if x >= C.GAP_BINS:
        return C.GAP_BINS - 1
    return int(x)


@njit(**HANDLER)
def span_start_nb(cfg, pools, chains, rq, rp, cache, sp, r):
    """Begin a span on replica r if its next decision would batch its whole running list, every member
    decoding one token (the conditions in the module's docstring); returns whether it began."""
    n = rp.n_running[r]
    if n == 0 or rp.n_waiting[r] > 0 or n > cfg.max_batched_tokens or pools.pp[rp.pool[r]] != 1:
        return False
    bs = cfg.block_size
    run = rp.running
    t = rq.last_token[run[r, n - 1]]
    for q in range(bs):
        sp.hits[r, q] = 0
    kv = 0
    fin = rq.output[run[r, n - 1]]
    warm = 0
    for j in range(n - 1, -1, -1):     # the latest admitted first: the likeliest to be prefilling
        i = run[r, j]
        c = rq.computed[i]
        g = rq.generated[i]
        room = rq.blocks[i] * bs - c
        if g == 0 or c + 1 != rq.prompt[i] + g or rq.in_flight[i] or rq.last_token[i] != t or room < 0 or room >= bs:
            return False
        if cache is not None and not rq.reg_done[i] and rq.n_ref[i] < chains.length[i]:
            return False        # it may still register blocks of its chain (prefix.register_nb)
        sp.hits[r, (room + 1) % bs] += 1     # first needs a block at the span's iteration room + 1
        kv += c
        if rq.output[i] - g < fin:
            fin = rq.output[i] - g
        if rq.arrival[i] >= cfg.warmup_time:
            warm += 1
    k = r * cfg.pp
    for j in range(n):      # the batch of every iteration, in running order (its last completion reads it)
        rp.slot_req[k, j] = run[r, j]
        rp.slot_chunk[k, j] = 1
    sp.active[r] = 1
    sp.n[r] = n
    sp.kv0[r] = kv
    sp.fin[r] = fin
    sp.launched[r] = 0
    sp.done[r] = 0
    sp.n_warm[r] = warm
    sp.t_last[r] = t
    sp.gap_max[r] = 0.0
    return True


@njit(**HANDLER)
def span_next_nb(cfg, pools, chains, rq, rp, cache, ctr, prefix, sp, r):
    """A scheduling decision on replica r: launch the next iteration of its span (beginning one if it
    can), taking the blocks its members need; returns the members' computed tokens + 1, summed (the
    batch's KV), or -1: the step-by-step scheduler decides (the span, if any, ended)."""
    if sp.active[r] == 0 and not span_start_nb(cfg, pools, chains, rq, rp, cache, sp, r):
        return -1
    j = sp.launched[r] + 1
    need = sp.hits[r, j % cfg.block_size]
    if rp.n_waiting[r] > 0 or rp.n_running[r] != sp.n[r] or need > rp.free_blocks[r]:
        span_end_nb(cfg, rq, rp, sp, r)
        return -1
    if need > 0:
        take_nb(cfg, pools, rp, cache, ctr, prefix, r, need)
    sp.launched[r] = j
    sp.count[0] += 1
    return sp.kv0[r] + sp.n[r] * j


@njit(**HANDLER)
def span_complete_nb(cfg, rq, rp, sp, gap_hist, r, now):
    """The span's in-flight iteration comes out: True if no member finishes, and then its tokens are
    counted on the span; else the span ends (`span_end_nb`) and False: the caller runs this completion
    request by request."""
    if sp.done[r] + 1 >= sp.fin[r]:
        span_end_nb(cfg, rq, rp, sp, r)
        return False
    gap = now - sp.t_last[r]
    if gap > sp.gap_max[r]:
        sp.gap_max[r] = gap
    if sp.n_warm[r] > 0:
        gap_hist[gap_bin_nb(gap)] += sp.n_warm[r]
    sp.t_last[r] = now
    sp.done[r] += 1
    return True


@njit(**HANDLER)
def span_end_nb(cfg, rq, rp, sp, r):
    """End replica r's span: each member gets the tokens of the span's completed iterations, the
    blocks of its launched ones, its last token and longest gap; a member of a launched iteration
    not yet out is in flight."""
    bs = cfg.block_size
    m = sp.done[r]
    L = sp.launched[r]
    for j in range(sp.n[r]):
        i = rp.running[r, j]
        first = rq.blocks[i] * bs - rq.computed[i] + 1      # the span's first iteration taking a block
        if L >= first:
            rq.blocks[i] += (L - first) // bs + 1
        rq.computed[i] += m
        rq.generated[i] += m
        if m > 0:
            rq.last_token[i] = sp.t_last[r]
            if sp.gap_max[r] > rq.max_gap[i]:
                rq.max_gap[i] = sp.gap_max[r]
        rq.in_flight[i] = L > m
    sp.active[r] = 0

