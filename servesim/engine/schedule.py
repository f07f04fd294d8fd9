"""Batch formation and preemption on one replica: the policies of a scheduling step.

Each policy fills the step (`state.step_dtype` records) with (request, chunk) members and returns how
many it took and the swap seconds the step pays; the semantics are written out in
`servesim.reference.sim` (methods of the same names: `static_batch`, `continuous_batch`, `preempt`,
`cached`, `blocks_needed`).
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from ..costmodel import fields as F
from . import codes as C
from .jit import HANDLER, INLINED
from .prefix import blocks_for_nb, commit_hit_nb, lookup_nb, release_nb, swap_seconds_nb, take_nb
from .state import STAT_PREEMPTIONS


@njit(**HANDLER)
def drop_running_nb(running, n_running, r, i):
    """Remove request i from replica r's running list, keeping admission order."""
    k = 0
    for j in range(n_running[r]):
        if running[r, j] != i:
            running[r, k] = running[r, j]
            k += 1
    n_running[r] = k


# each replica's waiting queue: a linked list through q_next, from q_head[r] to q_tail[r]
@njit(**HANDLER)
def push_back_nb(q_next, q_head, q_tail, n_waiting, r, i):
    q_next[i] = -1
    if q_tail[r] < 0:
        q_head[r] = i
    else:
        q_next[q_tail[r]] = i
    q_tail[r] = i
    n_waiting[r] += 1


@njit(**HANDLER)
def push_front_nb(q_next, q_head, q_tail, n_waiting, r, i):
    q_next[i] = q_head[r]
    q_head[r] = i
    if q_tail[r] < 0:
        q_tail[r] = i
    n_waiting[r] += 1


@njit(**HANDLER)
def pop_front_nb(q_next, q_head, q_tail, n_waiting, r):
    i = q_head[r]
    q_head[r] = q_next[i]
    if q_head[r] < 0:
        q_tail[r] = -1
    q_next[i] = -1
    n_waiting[r] -= 1
    return i


@njit(**HANDLER)
def cached_nb(cfg, rq, cache, chains, r, i):
    """(h, g0, c) of `prefix.lookup_nb` for a waiting request with nothing computed, else zeros."""
    if cache is not None and rq.computed[i] == 0 and chains.length[i] > 0:
        return lookup_nb(cfg, rq, cache, chains, r, i)
    return 0, 0, 0


@njit(**HANDLER)
def preempt_nb(ps, cfg, prow, rq, rprow, running, cache, chains, ctr, stats, r, v):
    """Free the victim's blocks and put it back at the front of the queue; returns swap seconds."""
    swap_s = 0.0
    release_nb(cfg, rq, rprow, cache, chains, ctr, r, v, rq.blocks[v])
    if cfg.preemption == C.SWAP:
        swap_s = swap_seconds_nb(ps, prow, rprow, r, rq.computed[v])
        rq.status[v] = C.SWAPPED
        rq.reg_done[v] = True
    else:
        rq.computed[v] = 0
        rq.status[v] = C.WAITING
    rq.blocks[v] = 0
    rq.preemptions[v] += 1
    stats[r, STAT_PREEMPTIONS] += 1
    drop_running_nb(running, rprow.n_running, r, v)
    # to the front, but behind transferred requests queued there with their blocks (decode
    # replicas): they need no block, and the victim may need theirs
    a = -1
    j = rprow.q_head[r]
    while j >= 0 and rq.blocks[j] > 0:
        a = j
        j = rq.q_next[j]
    if a < 0:
        push_front_nb(rq.q_next, rprow.q_head, rprow.q_tail, rprow.n_waiting, r, v)
    else:       # after a
        rq.q_next[v] = rq.q_next[a]
        rq.q_next[a] = v
        if rprow.q_tail[r] == a:
            rprow.q_tail[r] = v
        rprow.n_waiting[r] += 1
    return swap_s


@njit(**HANDLER)
def static_batch_nb(ps, cfg, prow, rq, rprow, running, cache, chains, step, ctr, prefix, r, now):
    """When nothing runs, admit a whole batch reserving every prompt and output block; then run it.
    Returns (members, seconds of CPU-tier reloads)."""
    B = cfg.max_num_seqs
    reload_s = 0.0
    if rprow.n_running[r] == 0:
        while rprow.n_waiting[r] > 0 and rprow.n_running[r] < B:
            i = rprow.q_head[r]
            h, g0, c = cached_nb(cfg, rq, cache, chains, r, i)
            tokens = rq.prompt[i] if prow.role[rprow.pool[r]] == C.PREFILL else rq.prompt[i] + rq.output[i]
            need = blocks_for_nb(tokens, cfg.block_size) - h - rq.blocks[i]
            if need + g0 + c > rprow.free_blocks[r]:
                break
            pop_front_nb(rq.q_next, rprow.q_head, rprow.q_tail, rprow.n_waiting, r)
            if cfg.prefix_caching and rq.computed[i] == 0:
                prefix[C.LOOKUP_TOKENS] += rq.prompt[i]
            if cache is not None and h > 0:
                reload_s += commit_hit_nb(ps, cfg, prow, rq, rprow, cache, chains, ctr, prefix, r, i, h, c)
            take_nb(cfg, prow, rprow, cache, ctr, prefix, r, need)
            rq.blocks[i] += need
            rq.status[i] = C.RUNNING
            if math.isnan(rq.scheduled[i]):
                rq.scheduled[i] = now
            running[r, rprow.n_running[r]] = i
            rprow.n_running[r] += 1
    nb = 0
    in_flight, b_req, b_chunk = rq.in_flight, step.req, step.chunk
    prompt, generated, computed = rq.prompt, rq.generated, rq.computed
    for j in range(rprow.n_running[r]):
        i = running[r, j]
        if not in_flight[i]:
            b_req[nb] = i
            b_chunk[nb] = prompt[i] + generated[i] - computed[i]
            nb += 1
    return nb, reload_s


@njit(inline="always", **HANDLER)
def continuous_batch_nb(ps, cfg, pools, rq, rp, cache, chains, step, ctr, stats, prefix, r, now, spec):
    """vllm, vllm-v0, sarathi, orca: running requests first, then admissions; returns (members, swap s).
    With speculative decoding (``spec``) a decode verifies k + 1 tokens (of the token budget), holds
    blocks for them (k lookahead slots) and advances by the tokens its step yields."""
    B = cfg.max_num_seqs
    wm = pools.row.watermark_blocks[rp.row.pool[r]]
    pol = cfg.policy
    run, n_running, free_blocks = rp.running, rp.row.n_running, rp.row.free_blocks
    b_req, b_chunk, pf_cand = step.req, step.chunk, step.pf_cand
    prompt, generated, computed, blocks = rq.prompt, rq.generated, rq.computed, rq.blocks
    status, in_flight = rq.status, rq.in_flight
    nb = np.int64(0)        # (not the literal 0, which numba would compile admit_nb for as well)
    budget = cfg.max_batched_tokens
    swap_s = 0.0
    preempted_now = False
    decode_only = False
    if pol == C.VLLM_V0:
        # prefill-prioritised: if any waiting request can be admitted, this is a prefill iteration
        decode_only = True
        if rp.row.n_waiting[r] > 0 and rp.row.n_running[r] < B:
            i = rp.row.q_head[r]
            h, g0, c = cached_nb(cfg, rq, cache, chains, r, i)
            done = rq.computed[i] if h == 0 else h * cfg.block_size
            pend = rq.prompt[i] + rq.generated[i] - done
            need = blocks_for_nb(done + pend, cfg.block_size) - (rq.blocks[i] if h == 0 else h) + g0 + c
            if need == 0 or rp.row.free_blocks[r] - need >= wm:
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
                    if j >= n_running[r]:
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
                if in_flight[i]:
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
                tok = pend              # tokens the step computes (of the budget)
                ahead = pend            # tokens whose KV it holds
                if spec is not None and generated[i] > 0 and pend == 1:
                    tok = spec.k + 1
                    if tok > budget:
                        continue        # a verification is not split
                    c = min(spec.yields[spec.start[i] + spec.steps[i]], rq.output[i] - generated[i])
                    ahead = min(tok, rq.output[i] - generated[i])
                elif c > budget and pol == C.ORCA:
                    continue
                elif c > min(budget, cfg.max_chunk_tokens) and pol != C.ORCA:
                    c = min(budget, cfg.max_chunk_tokens)   # (DP attention: a rank's own budget)
                    tok = c
                    ahead = c
                need = blocks_for_nb(computed[i] + ahead, cfg.block_size) - blocks[i]
                victim_self = False
                while need > free_blocks[r]:
                    # preempt the youngest running request that is not in flight
                    v = -1
                    for j2 in range(n_running[r] - 1, -1, -1):
                        cand = run[r, j2]
                        if not in_flight[cand]:
                            already = False
                            for j3 in range(nb):
                                if b_req[j3] == cand:
                                    already = True
                            if not already:
                                v = cand
                                break
                    if v < 0:
                        break
                    if v == i and rp.row.n_in_flight[r] > 0:
                        # only the requester is left while a micro-batch is in flight: wait for it
                        # rather than preempt itself (that livelocks with PP > 1), admit nothing now
                        preempted_now = True
                        break
                    swap_s += preempt_nb(ps, cfg, pools.row, rq, rp.row, rp.running, cache, chains, ctr, stats, r, v)
                    preempted_now = True
                    if v == i:
                        victim_self = True
                        break
                    if phase == 0:
                        # the list shifted left past v's slot; re-find our position
                        for j2 in range(n_running[r]):
                            if run[r, j2] == i:
                                j = j2 + 1
                if victim_self or need > free_blocks[r]:
                    continue
                take_nb(cfg, pools.row, rp.row, cache, ctr, prefix, r, need)
                blocks[i] += need
                b_req[nb] = i
                b_chunk[nb] = c
                nb += 1
                budget -= tok
    # 2) admit waiting requests in FCFS order (none after a preemption in this step)
    if not decode_only and not preempted_now:
        nb, swap_s = admit_nb(ps, cfg, pools.row, rq, rp.row, rp.running, rp.slot, cache, chains, step, ctr, prefix, r, now,
                              nb, budget, swap_s)
    return nb, swap_s


@njit(inline="always", **HANDLER)
def async_cutoff_nb(ps, cfg, prow, rprow, slot, r, nb):
    """The latest arrival a step of replica r with ``nb`` members before its admissions may admit: with
    async scheduling (vLLM V1, host work overlapping the GPU, one stage) and members, the launch of
    the step now ending (it was planned then: POOLS.md); else inf."""
    pl = rprow.pool[r]
    if cfg.policy == C.VLLM and ps[pl, F.host_overlap] > 0.0 and prow.pp[pl] == 1 and nb > 0:
        return slot.start[r * cfg.pp]
    return math.inf


@njit(**INLINED)
def admit_nb(ps, cfg, prow, rq, rprow, running, slot, cache, chains, step, ctr, prefix, r, now, nb, budget, swap_s):
    """Admit waiting requests in FCFS order into the step's members after its first ``nb`` (``budget``
    tokens left); returns (members, swap s). Async scheduling (vLLM V1, host work overlapping the
    GPU, one stage): this step was planned when the step now ending was launched, so while it has
    running members a request that arrived after that launch waits for the next one (POOLS.md)."""
    B = cfg.max_num_seqs
    wm = prow.watermark_blocks[rprow.pool[r]]
    pol = cfg.policy
    n_running, free_blocks = rprow.n_running, rprow.free_blocks
    b_req, b_chunk = step.req, step.chunk
    prompt, generated, computed, blocks = rq.prompt, rq.generated, rq.computed, rq.blocks
    status, n_waiting, q_head = rq.status, rprow.n_waiting, rprow.q_head
    cutoff = async_cutoff_nb(ps, cfg, prow, rprow, slot, r, nb)
    while n_waiting[r] > 0 and n_running[r] < B and nb < B and budget > 0:
        i = q_head[r]
        if rq.arrival[i] > cutoff:
            break
        h, g0, hc = cached_nb(cfg, rq, cache, chains, r, i)
        done = computed[i] if h == 0 else h * cfg.block_size
        held = blocks[i] if h == 0 else h
        c = prompt[i] + generated[i] - done
        if pol == C.ORCA or pol == C.VLLM_V0:
            if c > budget and nb > 0:
                break       # whole prompts only; an empty batch takes it anyway
        elif c > min(budget, cfg.max_chunk_tokens):
            c = min(budget, cfg.max_chunk_tokens)
        need = blocks_for_nb(done + c, cfg.block_size) - held
        if need + g0 + hc > 0 and free_blocks[r] - (need + g0 + hc) < wm:
            break
        pop_front_nb(rq.q_next, rprow.q_head, rprow.q_tail, rprow.n_waiting, r)
        if cfg.prefix_caching and computed[i] == 0:
            prefix[C.LOOKUP_TOKENS] += prompt[i]
        if cache is not None and h > 0:
            swap_s += commit_hit_nb(ps, cfg, prow, rq, rprow, cache, chains, ctr, prefix, r, i, h, hc)
        if status[i] == C.SWAPPED:
            swap_s += swap_seconds_nb(ps, prow, rprow, r, computed[i])
        status[i] = C.RUNNING
        if math.isnan(rq.scheduled[i]):
            rq.scheduled[i] = now
        take_nb(cfg, prow, rprow, cache, ctr, prefix, r, need)
        blocks[i] += need
        running[r, n_running[r]] = i
        n_running[r] += 1
        b_req[nb] = i
        b_chunk[nb] = c
        nb += 1
        budget -= c
    return nb, swap_s
