"""Decode fast-forward: a replica's iterations between two events that change its batch, run from
aggregates without touching its requests, which are brought up to date once when the span ends.

A span begins at a scheduling decision of a one-stage replica (not static batching, no speculative
decoding) whose running requests are all decoding, none in flight, with one last-token time, each
holding the blocks of its next token and no more than a block beyond (and, with the prefix cache,
done registering its chain's blocks), and no more of them than the token budget. The step-by-step
scheduler would then put every running request in the batch first, one token each, in running order,
and admit waiting requests after them; so does each iteration of the span (the admissions by the
same code, `schedule.admit_nb`, and run request by request: they are the batch's other members), as
long as

- the running list is the span's (a transfer to a decode replica appended none),
- the blocks the members need at this iteration are free (else one would preempt),
- and nothing waits under vllm-v0 (its prefill steps hold no decodes).

A member leaves the span at the completion of its last token (`events.span_finish_nb`: it ends as
it would step by step, in running order, before the batch's other members). At a completion, the
other members whose prompt is done join the span (in running order, while
each meets the conditions above): a member's tokens count from the span's completions at its join,
and its longest gap from the epoch it joined in (the span's gaps are kept per epoch).

Each iteration is priced from the members' count and their computed tokens' sum, exact integers in
floating point, so its cost, the statistics and the log are those of the step loop, in the same
order (the span's iterations stay events of the one loop, interleaved with the other replicas'). The
members share their gaps: one histogram increment per completion, the longest gap since its join
and the last token applied to each member at the end (`span_end_nb`), with the tokens and blocks it ran. The
step-by-step loop is the reference (`EngineConfig.fast_forward` 0, `--no-fast-forward`); tests
demand identical records.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from . import codes as C
from .jit import HANDLER, INLINED
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


# the bins' edges, 10 ** (GAP_LOG10_MIN + b (GAP_LOG10_MAX - GAP_LOG10_MIN) / GAP_BINS) for b = 0 ..
# GAP_BINS (NumPy's power: within an ulp or two of the exact edges), and how far inside a bin's edges,
# relative to the gap, `gap_bin_near_nb` takes a gap to be in it
GAP_EDGES = 10.0 ** (C.GAP_LOG10_MIN
                     + np.arange(C.GAP_BINS + 1) * ((C.GAP_LOG10_MAX - C.GAP_LOG10_MIN) / C.GAP_BINS))
GAP_SLACK = 1e-9


@njit(**HANDLER)
def gap_bin_near_nb(gap, b):
    """`gap_bin_nb` of ``gap``, without its log10 when the gap lies inside bin ``b`` (a guess: the bin of
    the span's gap before) by more than GAP_SLACK of itself from both edges. There log10(gap) is over
    4e-10 inside the bin in log space, x in `gap_bin_nb` over 2e-7 inside (b, b + 1), and the rounding
    of log10, of the edges and of the bin's arithmetic (~1e-12 in x) cannot take it out: the same bin."""
    if gap > GAP_EDGES[b] * (1.0 + GAP_SLACK) and gap < GAP_EDGES[b + 1] * (1.0 - GAP_SLACK):
        return b
    return gap_bin_nb(gap)


@njit(**HANDLER)
def joins_nb(cfg, chains, rq, cache, i, t):
    """Request i (running, not in flight) can be a member of a span whose last token was at t:
    decoding, its last token at t, holding its next token's blocks and less than a block more, done
    registering prefix-cache blocks."""
    c = rq.computed[i]
    g = rq.generated[i]
    room = rq.blocks[i] * cfg.block_size - c
    if g == 0 or c + 1 != rq.prompt[i] + g or rq.in_flight[i] or rq.last_token[i] != t:
        return False
    if room < 0 or room >= cfg.block_size:
        return False
    if cache is None:
        return True
    # (with the prefix cache: it may still register blocks of its chain, prefix.register_nb)
    return rq.reg_done[i] or rq.n_ref[i] >= chains.length[i]


@njit(**HANDLER)
def join_nb(cfg, rq, slot_req, slot_chunk, sp, r, i, pos):
    """Request i, at running position pos, joins replica r's span (in its latest epoch)."""
    m = sp.row.done[r]
    c = rq.computed[i]
    room = rq.blocks[i] * cfg.block_size - c
    sp.epoch[r, pos] = sp.row.n_epochs[r] - 1
    sp.hits[r, (m + room + 1) % cfg.block_size] += 1     # first takes a block at the span's iteration m + room + 1
    sp.row.kv0[r] += c - m
    f = m + rq.output[i] - rq.generated[i]
    sp.fin_at[r, pos] = f
    if f < sp.row.fin[r]:
        sp.row.fin[r] = f
    if rq.arrival[i] >= cfg.warmup_time:
        sp.row.n_warm[r] += 1
    k = r * cfg.pp
    slot_req[k, pos] = i        # the span's batch, in running order (a completion run request by request reads it)
    slot_chunk[k, pos] = 1
    sp.row.n[r] = pos + 1


@njit(**HANDLER)
def new_epoch_nb(row, epoch, r):
    """Replica r's span (``row``: the spans' records; ``epoch``: their epochs') begins an epoch."""
    e = row.n_epochs[r]
    epoch.start[r, e] = row.done[r]
    epoch.longest[r, e] = 0.0
    row.n_epochs[r] = e + 1


@njit(**INLINED)
def span_start_nb(cfg, prow, chains, rq, rprow, running, slot_req, slot_chunk, cache, sp, r):
    """Begin a span on replica r if its next decision would batch its whole running list first, every
    member decoding one token (the conditions in the module's docstring); returns whether it began.
    ``prow``, ``rprow``: the pools' and the replicas' records; ``running``, ``slot_req``, ``slot_chunk``: `Replicas`'."""
    n = rprow.n_running[r]
    if n == 0 or n > cfg.max_batched_tokens or prow.pp[rprow.pool[r]] != 1:
        return False
    if cfg.policy == C.VLLM_V0 and rprow.n_waiting[r] > 0:
        return False
    run = running
    t = rq.last_token[run[r, n - 1]]
    for j in range(n - 1, -1, -1):     # the latest admitted first: the likeliest to be prefilling
        if not joins_nb(cfg, chains, rq, cache, run[r, j], t):
            return False
    for q in range(cfg.block_size):
        sp.hits[r, q] = 0
    sp.row.n[r] = 0
    sp.row.kv0[r] = 0
    sp.row.fin[r] = 1 << 62
    sp.row.launched[r] = 0
    sp.row.done[r] = 0
    sp.row.n_warm[r] = 0
    sp.row.t_last[r] = t
    sp.row.n_epochs[r] = 0
    new_epoch_nb(sp.row, sp.epochs, r)
    for j in range(n):
        join_nb(cfg, rq, slot_req, slot_chunk, sp, r, run[r, j], j)
    sp.row.active[r] = 1
    return True


@njit(**HANDLER)
def span_quick_nb(row, hits, rprow, r, block_size, policy):
    """`span_next_nb`'s common case, from the arrays it reads (``row``, ``hits``: the span's;
    ``rprow``: the replicas' records), so that a call costs few arguments: replica r's span goes on and
    the blocks its members take at this iteration are never-used ones (`prefix.take_nb` takes those
    first, and without touching the prefix cache's lists). Returns what `span_next_nb` would, or -1
    with nothing changed: `span_next_nb` decides."""
    if row.active[r] == 0:
        return -1
    j = row.launched[r] + 1
    need = hits[r, j % block_size]
    if need > rprow.empty[r] or rprow.n_running[r] != row.n[r] or (policy == C.VLLM_V0 and rprow.n_waiting[r] > 0):
        return -1
    rprow.free_blocks[r] -= need      # (take_nb of never-used blocks)
    rprow.empty[r] -= need
    return span_launch_nb(row, r, j)


@njit(**HANDLER)
def span_launch_nb(row, r, j):
    """Iteration j of replica r's span is launched; returns its members' KV (`span_next_nb`)."""
    row.launched[r] = j
    row.count[r] += 1
    return row.kv0[r] + row.n[r] * j


@njit(**HANDLER)
def span_next_nb(cfg, prow, chains, rq, rprow, running, slot_req, slot_chunk, cache, ctr, prefix, sp, r):
    """A scheduling decision on replica r: launch the next iteration of its span (beginning one if it
    can), taking the blocks its members need; returns the members' computed tokens + 1, summed (their
    KV in the batch), or -1: the step-by-step scheduler decides (the span, if any, ended). Waiting
    requests are then admitted after the members (`schedule.admit_nb`, by the caller)."""
    if sp.row.active[r] == 0 and not span_start_nb(cfg, prow, chains, rq, rprow, running, slot_req, slot_chunk, cache, sp, r):
        return -1
    j = sp.row.launched[r] + 1
    need = sp.hits[r, j % cfg.block_size]
    if rprow.n_running[r] != sp.row.n[r] or need > rprow.free_blocks[r] or (cfg.policy == C.VLLM_V0 and rprow.n_waiting[r] > 0):
        span_end_nb(cfg, rq, running, sp, r)
        return -1
    if need > 0:
        take_nb(cfg, prow, rprow, cache, ctr, prefix, r, need)
    return span_launch_nb(sp.row, r, j)


@njit(**HANDLER)
def span_complete_nb(row, epoch, gap_hist, r, now):
    """The span's in-flight iteration comes out: its members' tokens are counted on the span (one gap,
    shared; ``row``, ``epoch``: the spans' records and their epochs'). Members it ends (the span's
    completion ``fin``) leave it by `events.span_finish_nb`; the batch's other members are run request
    by request, then `span_joins_nb`."""
    gap = now - row.t_last[r]
    e = row.n_epochs[r] - 1
    if gap > epoch.longest[r, e]:
        epoch.longest[r, e] = gap
    if row.n_warm[r] > 0:    # (the gaps of a span change little: most fall in the bin before)
        b = gap_bin_near_nb(gap, row.gap_bin[r])
        row.gap_bin[r] = b
        gap_hist[b] += row.n_warm[r]
    row.t_last[r] = now
    row.done[r] += 1


@njit(inline="always", **HANDLER)     # (one caller, `events.span_finish_nb`)
def leave_nb(cfg, rq, sp, r, i, e):
    """Member i (of epoch e) leaves replica r's span: its share of the aggregates taken out, its record
    brought up to date (`member_end_nb`)."""
    m0 = sp.epochs.start[r, e]
    room = rq.blocks[i] * cfg.block_size - rq.computed[i]
    sp.hits[r, (m0 + room + 1) % cfg.block_size] -= 1
    sp.row.kv0[r] -= rq.computed[i] - m0
    if rq.arrival[i] >= cfg.warmup_time:
        sp.row.n_warm[r] -= 1
    g = 0.0
    for e2 in range(e, sp.row.n_epochs[r]):
        if sp.epochs.longest[r, e2] > g:
            g = sp.epochs.longest[r, e2]
    member_end_nb(cfg, rq, sp.row, r, i, m0, g)


@njit(**HANDLER)
def member_end_nb(cfg, rq, row, r, i, m0, gap_max):
    """Member i, joined at the span's completion m0, gets the tokens of the iterations completed since,
    the blocks of those launched, the last token and ``gap_max``, its longest gap since (``row``: the
    spans' records)."""
    bs = cfg.block_size
    m = row.done[r]
    L = row.launched[r]
    first = rq.blocks[i] * bs - rq.computed[i] + 1      # its first iteration taking a block, from its join
    if L - m0 >= first:
        rq.blocks[i] += (L - m0 - first) // bs + 1
    d = m - m0
    rq.computed[i] += d
    rq.generated[i] += d
    if d > 0:
        rq.last_token[i] = row.t_last[r]
        if gap_max > rq.max_gap[i]:
            rq.max_gap[i] = gap_max
    rq.in_flight[i] = L > m


@njit(**INLINED)
def span_joins_nb(cfg, chains, rq, rprow, running, slot_req, slot_chunk, cache, sp, r, now):
    """After a span's completion: the running requests after its members join it, in running order,
    while each can (one new epoch for them)."""
    pos = sp.row.n[r]
    if pos >= rprow.n_running[r] or pos >= cfg.max_batched_tokens or sp.row.n_epochs[r] == sp.epochs.shape[1]:
        return
    if not joins_nb(cfg, chains, rq, cache, running[r, pos], now):
        return
    new_epoch_nb(sp.row, sp.epochs, r)
    while pos < rprow.n_running[r] and pos < cfg.max_batched_tokens:
        i = running[r, pos]
        if not joins_nb(cfg, chains, rq, cache, i, now):
            return
        join_nb(cfg, rq, slot_req, slot_chunk, sp, r, i, pos)
        pos += 1


@njit(**INLINED)
def span_end_nb(cfg, rq, running, sp, r):
    """End replica r's span: each member brought up to date (`member_end_nb`); a member of a launched
    iteration not yet out is in flight."""
    for e in range(sp.row.n_epochs[r] - 2, -1, -1):     # the longest gap from each epoch on
        if sp.epochs.longest[r, e + 1] > sp.epochs.longest[r, e]:
            sp.epochs.longest[r, e] = sp.epochs.longest[r, e + 1]
    for j in range(sp.row.n[r]):
        e = sp.epoch[r, j]
        member_end_nb(cfg, rq, sp.row, r, running[r, j], sp.epochs.start[r, e], sp.epochs.longest[r, e])
    sp.row.active[r] = 0
