"""Prefix-cache block-id chains of a workload's requests (engine/POOLS.md, `Chains`).

Equal id = equal content (the hash chain of vLLM's automatic prefix caching). Every request that can
share KV blocks with others reads one *stream* of tokens from its start:

* shared prefix: group g's system prompt; request i holds its first `prefix_len[i] // bs` blocks;
  a request that re-sends its user's one prompt (`prefix_user` >= 0) also holds the blocks after
  the system prompt's full blocks, up to `prompt[i] // bs`, from its user's stream (the block that
  straddles the system prompt's end already holds the user's question);
* sessions: the session's conversation. Turn n's prompt is turn n-1's prompt + output (its history)
  + a new question, so turn n's tokens start with all of turn n-1's; turn n holds the first
  `(prompt[i] + output[i]) // bs` full blocks of the conversation, and its blocks inside its history
  are turn n-1's blocks.

Block k of stream j has one id. A request lists only blocks that some other request also lists: in
a stream the holders of block k are the requests holding more than k blocks, so block k is shared
iff the second-largest holding of the stream exceeds k, and request i's chain is its first
min(holding_i, second-largest holding of its stream) blocks (cut at its last shared block).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from servesim.errors import ConfigError


class Chains(NamedTuple):
    """Prefix-cache block ids per request (equal id: equal content) and session turns (POOLS.md)."""
    start: np.ndarray
    length: np.ndarray
    ids: np.ndarray
    next_turn: np.ndarray       # the session's next request (-1: none)
    think: np.ndarray           # s from the previous turn's end to this request's send


def block_chains(requests, block_size) -> Chains:
    """`Chains` (start, length, ids, next_turn, think; int64 except think float64) for `requests`
    (a workload `Requests`: prompt, output, prefix_group, prefix_len, and for sessions session,
    next_turn, think) with KV blocks of `block_size` tokens."""
    if isinstance(block_size, bool) or not isinstance(block_size, (int, np.integer)) or block_size < 1:
        raise ConfigError(f"--block-size {block_size!r} is not valid; use an integer >= 1 tokens")
    bs = int(block_size)
    prompt = np.asarray(requests.prompt, dtype=np.int64)
    output = np.asarray(requests.output, dtype=np.int64)
    n = prompt.size
    group = np.asarray(requests.prefix_group, dtype=np.int64)
    plen = np.asarray(requests.prefix_len, dtype=np.int64)
    session = np.asarray(getattr(requests, "session", np.full(n, -1)), dtype=np.int64)
    next_turn = np.asarray(getattr(requests, "next_turn", np.full(n, -1)), dtype=np.int64)
    think = np.asarray(getattr(requests, "think", np.zeros(n)), dtype=np.float64)
    in_group, in_session = group >= 0, session >= 0
    if in_group.any() and in_session.any():
        raise ConfigError("block chains: sessions with a shared prefix (prefix_group >= 0) are not supported; "
                          "use a sessions workload without a shared prefix, or a shared prefix without sessions")

    if not (in_group.any() or in_session.any()):     # nothing shared: no request lists a block (as below)
        z = np.zeros(n, dtype=np.int64)
        return Chains(z, z.copy(), np.zeros(0, dtype=np.int64), np.ascontiguousarray(next_turn, dtype=np.int64),
                      np.ascontiguousarray(think, dtype=np.float64))
    # stream of each request (-1: none) and the blocks of it the request holds
    stream = np.where(in_session, session, group)
    held = np.where(in_session, (prompt + output) // bs, np.where(in_group, plen // bs, 0))
    length, base, used = _shared_part(stream, held, 0)
    user = getattr(requests, "prefix_user", None)
    if user is not None:
        # the user's stream continues after the system prompt's full blocks (held only with them all)
        user = np.where(in_group, np.asarray(user, dtype=np.int64), -1)
        sys_blocks = np.where(in_group, plen // bs, 0)
        own = np.where((user >= 0) & (length == sys_blocks), np.maximum(prompt // bs - sys_blocks, 0), 0)
        u_len, u_base, _ = _shared_part(user, own, used)
    else:
        u_len, u_base = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
    total_len = length + u_len
    start = np.cumsum(total_len) - total_len
    total = int(total_len.sum())
    # ids[start[i] + k] = base[i] + k for k < length[i], then u_base[i] + (k - length[i])
    owner = np.repeat(np.arange(n), total_len)
    k = np.arange(total, dtype=np.int64) - start[owner]
    ids = np.where(k < length[owner], base[owner] + k, u_base[owner] + k - length[owner])
    return Chains(np.ascontiguousarray(start, dtype=np.int64), np.ascontiguousarray(total_len, dtype=np.int64),
                  np.ascontiguousarray(ids, dtype=np.int64), np.ascontiguousarray(next_turn, dtype=np.int64),
                  np.ascontiguousarray(think, dtype=np.float64))


def _shared_part(stream, held, first_id):
    """(length, base, next id) of each request's part of one kind of stream: request i holds
    `held[i]` blocks of stream `stream[i]` (-1: none) and lists the first min(held[i], the second-
    largest holding of its stream) of them, ids base[i] + k; the streams' ids start at `first_id`."""
    n = stream.shape[0]
    held = np.where(stream >= 0, held, 0)
    length = np.zeros(n, dtype=np.int64)
    base = np.zeros(n, dtype=np.int64)
    member = np.flatnonzero(stream >= 0)
    if not member.size:
        return length, base, first_id
    order = member[np.lexsort((-held[member], stream[member]))]   # by stream, most blocks first
    streams, first, count = np.unique(stream[order], return_index=True, return_counts=True)
    second = np.where(count >= 2, held[order[np.minimum(first + 1, order.size - 1)]], 0)
    offset = first_id + np.cumsum(second) - second                 # ids of stream j: offset[j] + k
    pos = np.searchsorted(streams, stream[member])
    length[member] = np.minimum(held[member], second[pos])
    base[member] = offset[pos]
    return length, base, first_id + int(second.sum())
