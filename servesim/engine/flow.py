"""What moves between events outside the replicas' steps: session turns waiting to be sent (a
binary min-heap on (time, request), `state.turn_dtype` records) and KV transfers from prefill to decode replicas
(``xfers``: the requests whose transfer is in flight), which share the link out of their prefill
replica equally (processor sharing; engine/POOLS.md). A transfer is on the link while its
`xfer_end` is nan; its bytes done, `xfer_end` is set to that time plus the link's latency. Each is a
feature of its own: a run without sessions has no turns, one without prefill/decode pools no
transfers (None, and their code is not compiled: `kernel.simulate_pools`).
"""
from __future__ import annotations

import math

from numba import njit

from .jit import HANDLER
from .state import HEAP_N, INF, N_ACTIVE, XFER_NEXT


# ------------------------------------------------------------------ session turns
@njit(**HANDLER)
def heap_less_nb(turns, a, b):
    ta = turns.t[a]
    tb = turns.t[b]
    return ta < tb or (ta == tb and turns.i[a] < turns.i[b])


@njit(**HANDLER)
def heap_swap_nb(turns, a, b):
    t = turns.t[a]
    turns.t[a] = turns.t[b]
    turns.t[b] = t
    i = turns.i[a]
    turns.i[a] = turns.i[b]
    turns.i[b] = i


@njit(**HANDLER)
def heap_push_nb(turns, ctr, t, i):
    k = ctr[HEAP_N]
    ctr[HEAP_N] += 1
    turns.t[k] = t
    turns.i[k] = i
    while k > 0:
        parent = (k - 1) >> 1
        if not heap_less_nb(turns, k, parent):
            break
        heap_swap_nb(turns, k, parent)
        k = parent


@njit(**HANDLER)
def heap_pop_nb(turns, ctr):
    i = turns.i[0]
    n = ctr[HEAP_N] - 1
    ctr[HEAP_N] = n
    turns.t[0] = turns.t[n]
    turns.i[0] = turns.i[n]
    k = 0
    while True:
        a = 2 * k + 1
        if a >= n:
            break
        b = a + 1
        m = b if b < n and heap_less_nb(turns, b, a) else a
        if not heap_less_nb(turns, m, k):
            break
        heap_swap_nb(turns, k, m)
        k = m
    return i


# ------------------------------------------------------------------ KV transfers
@njit(**HANDLER)
def link_nb(link, rprow, rq, i):
    """(bandwidth, latency) of request i's transfer: from its prefill replica's pool to its decode one's
    (``link``: `KernelPools.link`; ``rprow``: the replicas' records, as every function below takes them)."""
    a = rprow.pool[rq.pf_replica[i]]
    b = rprow.pool[rq.replica[i]]
    return link.bw[a, b], link.alpha[a, b]


@njit(**HANDLER)
def advance_nb(link, rq, rprow, xfers, ctr, src, now):
    """Bring the bytes left of every transfer out of replica src up to now (before its count changes)."""
    n = rprow.n_xfer[src]
    if n == 0:
        return
    for k in range(ctr[N_ACTIVE]):
        i = xfers[k]
        if rq.pf_replica[i] == src and math.isnan(rq.xfer_end[i]):
            bw, alpha = link_nb(link, rprow, rq, i)
            left = rq.xfer_left[i] - (now - rq.xfer_t[i]) * bw / n
            rq.xfer_left[i] = left if left > 0.0 else 0.0
            rq.xfer_t[i] = now


@njit(**HANDLER)
def reprice_nb(link, rq, rprow, xfers, ctr, src, now):
    """The next event of every transfer out of src at its (new) share of the link; then the first of all."""
    n = rprow.n_xfer[src]
    for k in range(ctr[N_ACTIVE]):
        i = xfers[k]
        if rq.pf_replica[i] == src and math.isnan(rq.xfer_end[i]):
            bw, alpha = link_nb(link, rprow, rq, i)
            rq.xfer_ev[i] = now + rq.xfer_left[i] * n / bw
    first_transfer_nb(rq, xfers, ctr)


@njit(**HANDLER)
def first_transfer_nb(rq, xfers, ctr):
    best = -1
    t = INF
    for k in range(ctr[N_ACTIVE]):
        i = xfers[k]
        if rq.xfer_ev[i] < t or (rq.xfer_ev[i] == t and best >= 0 and i < best):
            t = rq.xfer_ev[i]
            best = i
    ctr[XFER_NEXT] = best


@njit(**HANDLER)
def start_transfer_nb(link, rq, rprow, xfers, ctr, i, nbytes, now):
    src = rq.pf_replica[i]
    advance_nb(link, rq, rprow, xfers, ctr, src, now)
    rprow.n_xfer[src] += 1
    xfers[ctr[N_ACTIVE]] = i
    ctr[N_ACTIVE] += 1
    rq.xfer_start[i] = now
    rq.xfer_left[i] = nbytes
    rq.xfer_t[i] = now
    if nbytes <= 0.0:       # nothing to move: only the latency
        leave_link_nb(link, rq, rprow, i, src, now)
    reprice_nb(link, rq, rprow, xfers, ctr, src, now)


@njit(**HANDLER)
def leave_link_nb(link, rq, rprow, i, src, now):
    """Transfer i has no byte left: it leaves src's link and ends after the link's latency."""
    rq.xfer_left[i] = 0.0
    rprow.n_xfer[src] -= 1
    bw, alpha = link_nb(link, rprow, rq, i)
    rq.xfer_ev[i] = now + alpha
    rq.xfer_end[i] = rq.xfer_ev[i]


@njit(**HANDLER)
def bytes_done_nb(link, rq, rprow, xfers, ctr, i, now):
    """Transfer i has moved its last byte: it leaves the link; it ends after the link's latency."""
    src = rq.pf_replica[i]
    advance_nb(link, rq, rprow, xfers, ctr, src, now)
    leave_link_nb(link, rq, rprow, i, src, now)
    reprice_nb(link, rq, rprow, xfers, ctr, src, now)


@njit(**HANDLER)
def drop_transfer_nb(rq, xfers, ctr, i):
    for k in range(ctr[N_ACTIVE]):
        if xfers[k] == i:
            ctr[N_ACTIVE] -= 1
            xfers[k] = xfers[ctr[N_ACTIVE]]
            break
    first_transfer_nb(rq, xfers, ctr)
