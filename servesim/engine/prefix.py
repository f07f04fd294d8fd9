"""The paged KV blocks of a replica with automatic prefix caching (engine/POOLS.md, "Prefix cache").

`free_blocks[r]` = `empty[r]` (never used) + the blocks of the replica's LRU list: evictable GPU
entries (refcount 0) and runs of freed private blocks (tier RUN, `block` = blocks left), in the
order they were freed, as vLLM V1's free block queue holds them. Without prefix caching there is no
list and the two counts move together. Entries are found
by (block id, replica) in an open-addressing table with linear probing and backward-shift
deletion (Knuth, TAOCP vol. 3, sec. 6.4, Algorithm R).
"""
from __future__ import annotations

from numba import njit

from ..costmodel import fields as F
from . import codes as C
from .jit import HANDLER
from .state import ENTRIES_FREE

RUN = 3         # Cache.tier of a run of freed private blocks in a GPU LRU list (Cache.block: its size)


@njit(**HANDLER)
def blocks_for_nb(tokens, block_size):
    return (tokens + block_size - 1) // block_size


# ------------------------------------------------------------------ the table
@njit(**HANDLER)
def home_nb(key, H):
    return ((key * 0x9E3779B1) ^ (key >> 16)) & (H - 1)


@njit(**HANDLER)
def find_nb(table, key):
    """The entry of key, -1 if none."""
    H = table.key.shape[0]
    if H < 2:
        return -1
    j = home_nb(key, H)
    while table.key[j] >= 0:
        if table.key[j] == key:
            return table.val[j]
        j = (j + 1) & (H - 1)
    return -1


@njit(**HANDLER)
def insert_nb(table, key, e):
    H = table.key.shape[0]
    j = home_nb(key, H)
    while table.key[j] >= 0:
        j = (j + 1) & (H - 1)
    table.key[j] = key
    table.val[j] = e


@njit(**HANDLER)
def delete_nb(table, key):
    H = table.key.shape[0]
    j = home_nb(key, H)
    while table.key[j] != key:
        j = (j + 1) & (H - 1)
    # backward shift: move later members of the run into the hole when their home allows it
    while True:
        table.key[j] = -1
        k = j
        while True:
            k = (k + 1) & (H - 1)
            if table.key[k] < 0:
                return
            h = home_nb(table.key[k], H)
            # k's entry may fill hole j unless its home lies cyclically in (j, k]
            if (j < k and (h <= j or h > k)) or (j > k and (h <= j and h > k)):
                break
        table.key[j] = table.key[k]
        table.val[j] = table.val[k]
        j = k


# ------------------------------------------------------------------ LRU lists (GPU or CPU tier of a replica)
@njit(**HANDLER)
def lru_append_nb(entry, head, tail, r, e):
    entry.prev[e] = tail[r]
    entry.next[e] = -1
    if tail[r] >= 0:
        entry.next[tail[r]] = e
    else:
        head[r] = e
    tail[r] = e


@njit(**HANDLER)
def lru_remove_nb(entry, head, tail, r, e):
    a = entry.prev[e]
    b = entry.next[e]
    if a >= 0:
        entry.next[a] = b
    else:
        head[r] = b
    if b >= 0:
        entry.prev[b] = a
    else:
        tail[r] = a
    entry.prev[e] = -1
    entry.next[e] = -1


@njit(**HANDLER)
def drop_entry_nb(cfg, cache, ctr, e):
    delete_nb(cache.table, cache.entry.block[e] * cfg.replicas + cache.entry.rep[e])
    cache.free_stack[ctr[ENTRIES_FREE]] = e
    ctr[ENTRIES_FREE] += 1


@njit(**HANDLER)
def new_entry_nb(cfg, cache, ctr, block, r):
    ctr[ENTRIES_FREE] -= 1
    e = cache.free_stack[ctr[ENTRIES_FREE]]
    cache.entry.block[e] = block
    cache.entry.rep[e] = r
    cache.entry.ref[e] = 1
    cache.entry.tier[e] = 0
    cache.entry.prev[e] = -1
    cache.entry.next[e] = -1
    insert_nb(cache.table, block * cfg.replicas + r, e)
    return e


# ------------------------------------------------------------------ blocks
@njit(**HANDLER)
def swap_seconds_nb(ps, prow, rprow, r, tokens):
    """Moving ``tokens`` tokens' KV between GPU and host on replica r: the pool's PCIe path
    (``swap_alpha`` s + bytes / ``swap_bw`` B/s of its cost table ``ps``, `costmodel.fields`).
    ``prow``, ``rprow``: the pools' and the replicas' records (`KernelPools.row`, `Replicas.row`)."""
    k = rprow.pool[r]
    return ps[k, F.swap_alpha] + tokens * prow.kv_bytes_per_token[k] / ps[k, F.swap_bw]


@njit(**HANDLER)
def take_nb(cfg, prow, rprow, cache, ctr, prefix, r, n):
    """Take n free blocks: never-used ones first, then from the LRU head (least recently freed):
    a run of freed private blocks gives its blocks, an entry is evicted (to the CPU tier when the
    pool has one)."""
    rprow.free_blocks[r] -= n
    k = n if rprow.empty[r] >= n else rprow.empty[r]
    rprow.empty[r] -= k
    if cache is None:       # no prefix cache: every free block is empty (k == n)
        return
    cpu = prow.cpu_blocks[rprow.pool[r]]
    m = n - k
    while m > 0:
        e = rprow.lru_head[r]
        if cache.entry.tier[e] == RUN:
            t = m if cache.entry.block[e] > m else cache.entry.block[e]
            cache.entry.block[e] -= t
            m -= t
            if cache.entry.block[e] == 0:
                lru_remove_nb(cache.entry, rprow.lru_head, rprow.lru_tail, r, e)
                cache.free_stack[ctr[ENTRIES_FREE]] = e
                ctr[ENTRIES_FREE] += 1
            continue
        m -= 1
        lru_remove_nb(cache.entry, rprow.lru_head, rprow.lru_tail, r, e)
        prefix[C.GPU_EVICTIONS] += 1.0
        if cpu > 0:
            if rprow.cpu_used[r] == cpu:
                d = rprow.cpu_head[r]
                lru_remove_nb(cache.entry, rprow.cpu_head, rprow.cpu_tail, r, d)
                drop_entry_nb(cfg, cache, ctr, d)
                rprow.cpu_used[r] -= 1
                prefix[C.CPU_EVICTIONS] += 1.0
            cache.entry.tier[e] = 1
            lru_append_nb(cache.entry, rprow.cpu_head, rprow.cpu_tail, r, e)
            rprow.cpu_used[r] += 1
        else:
            drop_entry_nb(cfg, cache, ctr, e)


@njit(**HANDLER)
def release_nb(cfg, rq, rprow, cache, chains, ctr, r, i, held):
    """Request i gives back the `held` blocks it has on replica r, last to first, to the LRU tail:
    first its private blocks (one run), then its referenced entries (those reaching refcount 0)."""
    n = held - rq.n_ref[i]
    rprow.free_blocks[r] += n
    if cache is None:       # no prefix cache: no entries (n_ref == 0), no list
        rprow.empty[r] += n
        return
    if n > 0:               # one run, not in the table
        ctr[ENTRIES_FREE] -= 1
        e = cache.free_stack[ctr[ENTRIES_FREE]]
        cache.entry.block[e] = n
        cache.entry.rep[e] = r
        cache.entry.ref[e] = 0
        cache.entry.tier[e] = RUN
        lru_append_nb(cache.entry, rprow.lru_head, rprow.lru_tail, r, e)
    base = chains.start[i]
    for j in range(rq.n_ref[i] - 1, -1, -1):
        e = find_nb(cache.table, chains.ids[base + j] * cfg.replicas + r)
        cache.entry.ref[e] -= 1
        if cache.entry.ref[e] == 0:
            lru_append_nb(cache.entry, rprow.lru_head, rprow.lru_tail, r, e)
            rprow.free_blocks[r] += 1
    rq.n_ref[i] = 0


@njit(**HANDLER)
def lookup_nb(cfg, rq, cache, chains, r, i):
    """(h, g0, c): the cached prefix of request i's chain on replica r, in blocks (at most
    (prompt - 1) // block_size), its evictable GPU entries and its CPU-tier entries."""
    cap = (rq.prompt[i] - 1) // cfg.block_size
    L = chains.length[i]
    if L < cap:
        cap = L
    base = chains.start[i]
    h = 0
    g0 = 0
    c = 0
    while h < cap:
        e = find_nb(cache.table, chains.ids[base + h] * cfg.replicas + r)
        if e < 0:
            break
        if cache.entry.tier[e] == 1:
            c += 1
        elif cache.entry.ref[e] == 0:
            g0 += 1
        h += 1
    return h, g0, c


@njit(**HANDLER)
def commit_hit_nb(ps, cfg, prow, rq, rprow, cache, chains, ctr, prefix, r, i, h, c):
    """Request i takes the h cached blocks of its chain on replica r; returns the seconds its CPU
    tier hits take to reload over PCIe."""
    base = chains.start[i]
    for j in range(h):      # GPU entries first, so that reloading cannot evict them
        e = find_nb(cache.table, chains.ids[base + j] * cfg.replicas + r)
        if cache.entry.tier[e] == 0:
            if cache.entry.ref[e] == 0:
                lru_remove_nb(cache.entry, rprow.lru_head, rprow.lru_tail, r, e)
                rprow.free_blocks[r] -= 1
            cache.entry.ref[e] += 1
        else:
            lru_remove_nb(cache.entry, rprow.cpu_head, rprow.cpu_tail, r, e)
            rprow.cpu_used[r] -= 1
            cache.entry.tier[e] = 2       # being reloaded
    if c > 0:
        for j in range(h):
            e = find_nb(cache.table, chains.ids[base + j] * cfg.replicas + r)
            if cache.entry.tier[e] == 2:
                take_nb(cfg, prow, rprow, cache, ctr, prefix, r, 1)
                cache.entry.tier[e] = 0
                cache.entry.ref[e] = 1
    rq.computed[i] = h * cfg.block_size
    rq.blocks[i] = h
    rq.n_ref[i] = h
    prefix[C.HIT_GPU_TOKENS] += (h - c) * cfg.block_size
    prefix[C.HIT_CPU_TOKENS] += c * cfg.block_size
    if c == 0:
        return 0.0
    s = swap_seconds_nb(ps, prow, rprow, r, c * cfg.block_size)
    prefix[C.CPU_RELOAD_TIME] += s
    return s


@njit(**HANDLER)
def register_nb(cfg, rq, cache, chains, ctr, r, i):
    """Request i's newly full blocks of its chain become entries, until one already exists here."""
    L = chains.length[i]
    base = chains.start[i]
    while rq.n_ref[i] < L and (rq.n_ref[i] + 1) * cfg.block_size <= rq.computed[i]:
        b = chains.ids[base + rq.n_ref[i]]
        if find_nb(cache.table, b * cfg.replicas + r) >= 0:
            rq.reg_done[i] = True
            return
        new_entry_nb(cfg, cache, ctr, b, r)
        rq.n_ref[i] += 1
