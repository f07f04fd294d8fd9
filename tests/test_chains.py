"""Prefix-cache block chains (servesim.workload.chains.block_chains), derived by hand."""
import numpy as np
import pytest

from servesim.errors import ConfigError
from servesim.workload import Requests, build_requests, load_workload
from servesim.workload.chains import block_chains


def reqs(prompt, output, group=None, plen=None, session=None, turn=None, next_turn=None, think=None, user=None):
    n = len(prompt)

    def arr(x, fill, dt=np.int64):
        return np.asarray(x if x is not None else [fill] * n, dtype=dt)
    return Requests(np.zeros(n), arr(prompt, 0), arr(output, 0), arr(group, -1), arr(plen, 0),
                    arr(session, -1), arr(turn, 0), arr(next_turn, -1), arr(think, 0.0, np.float64),
                    None if user is None else arr(user, -1))


def chains(c):
    """Each request's chain as a list of ids relabelled a, b, c, ... in order of first appearance:
    only equality between ids means anything."""
    names = {}
    out = []
    for s, n in zip(c.start, c.length):
        out.append("".join(names.setdefault(int(x), "abcdefghijklmnopqrstuvwxyz"[len(names)])
                           for x in c.ids[s:s + n]))
    return out


def test_two_groups_shared_prefix():
    # block size 16; group 0's system prompt is 40 tokens (2 full blocks), group 1's 64 (4 blocks);
    # request 5 had its prompt cut to 21 tokens, so only 20 of the prefix stay (1 block);
    # request 6 is alone in group 2: nobody else can hit its blocks, so none are listed
    r = reqs(prompt=[100, 80, 50, 200, 70, 21, 90], output=[10] * 7,
             group=[0, 1, 0, -1, 1, 1, 2], plen=[40, 64, 40, 0, 64, 20, 64])
    c = block_chains(r, 16)
    assert chains(c) == ["ab", "cdef", "ab", "", "cdef", "c", ""]
    assert c.length.tolist() == [2, 4, 2, 0, 4, 1, 0]
    assert c.start.tolist() == [0, 2, 6, 8, 8, 12, 13]
    for a in (c.start, c.length, c.ids, c.next_turn):
        assert a.dtype == np.int64
    assert c.next_turn.tolist() == [-1] * 7 and c.think.tolist() == [0.0] * 7


def test_prefix_groups_with_a_larger_block():
    # block size 32: 40 tokens -> 1 block, 64 -> 2, 20 -> 0
    r = reqs(prompt=[100, 80, 50, 200, 70, 21, 90], output=[10] * 7,
             group=[0, 1, 0, -1, 1, 1, 2], plen=[40, 64, 40, 0, 64, 20, 64])
    assert chains(block_chains(r, 32)) == ["a", "bc", "a", "", "bc", "", ""]


def test_users_resending_their_prompt_share_it_after_the_system_prompt():
    # block size 16, group 0's system prompt 40 tokens (2 full blocks: a, b). Users 0 and 1 are in
    # group 0; user 0 re-sends a 100-token prompt (6 full blocks: a, b + 4 of its own), user 1 a
    # 70-token one (4 blocks) but only once, so only the group's 2 are listed for it. Request 4
    # (user 0, prompt cut to 60 tokens: 3 full blocks) holds a, b and the user's first block.
    # Request 5 (user 2, group 1, system prompt 10 tokens: no full block) re-sends 50 tokens
    # (3 blocks, all its user's own)
    r = reqs(prompt=[100, 70, 100, 50, 60, 50], output=[10] * 6, group=[0, 0, 0, 1, 0, 1],
             plen=[40, 40, 40, 10, 40, 10], user=[0, 1, 0, 2, 0, 2])
    assert chains(block_chains(r, 16)) == ["abcdef", "ab", "abcdef", "ghi", "abc", "ghi"]
    # without users (a fresh question per request) only the system prompts are shared
    r = reqs(prompt=[100, 70, 100, 50, 60, 50], output=[10] * 6, group=[0, 0, 0, 1, 0, 1],
             plen=[40, 40, 40, 10, 40, 10])
    assert chains(block_chains(r, 16)) == ["ab", "ab", "ab", "", "ab", ""]


def test_question_per_user_workload():
    wl = load_workload("chat")
    from servesim.workload.spec import with_shared_prefix
    per_user = with_shared_prefix(wl, 3, 4, 100)
    r = build_requests(per_user, 400, seed=2)
    assert r.prefix_user is not None and set(np.unique(r.prefix_user)) <= set(range(12))
    np.testing.assert_array_equal(r.prefix_group, r.prefix_user // 4)
    for u in np.unique(r.prefix_user):       # one prompt per user
        assert np.unique(r.prompt[r.prefix_user == u]).size == 1
    assert np.unique(r.prompt).size > 1      # drawn from the workload's lengths, per user
    per_request = build_requests(with_shared_prefix(wl, 3, 4, 100, question_per="request"), 400, seed=2)
    assert per_request.prefix_user is None
    np.testing.assert_array_equal(per_request.prefix_group, r.prefix_group)   # the same users
    np.testing.assert_array_equal(per_request.output, r.output)              # and outputs
    with pytest.raises(ConfigError, match="--question-per 'each'"):
        with_shared_prefix(wl, 3, 4, 100, question_per="each")
    with pytest.raises(ConfigError, match="--question-per request: needs a shared prefix"):
        with_shared_prefix(wl, question_per="request")


def session3():
    # one 3-turn session (requests 0, 2, 3) and a 1-turn session (request 1), block size 16:
    #   turn 0: prompt 20, output 30 -> 50 tokens, 3 full blocks
    #   turn 1: prompt 20 + 30 + question 10 = 60, output 25 -> 85 tokens, 5 full blocks; its first
    #           3 blocks lie inside its 50-token history: turn 0's blocks
    #   turn 2: prompt 85 + question 7 = 92, output 40 -> 132 tokens, 8 full blocks; the first 5 lie
    #           inside its 85-token history (turn 1's); blocks 5..7 are its own: cut
    return reqs(prompt=[20, 300, 60, 92], output=[30, 200, 25, 40], session=[0, 1, 0, 0],
                turn=[0, 0, 1, 2], next_turn=[2, -1, 3, -1], think=[0.0, 0.0, 12.5, 3.0])


def test_three_turn_session():
    c = block_chains(session3(), 16)
    assert chains(c) == ["abc", "", "abcde", "abcde"]
    assert c.next_turn.tolist() == [2, -1, 3, -1]
    assert c.think.tolist() == [0.0, 0.0, 12.5, 3.0]


def test_session_block_size_change():
    # 32: 50 -> 1 block, 85 -> 2, 132 -> 4 (its blocks 2, 3 are its own)
    assert chains(block_chains(session3(), 32)) == ["a", "", "ab", "ab"]
    # 64: 50 -> 0 blocks, 85 -> 1, 132 -> 2 (its block 1 is its own)
    assert chains(block_chains(session3(), 64)) == ["", "", "a", "a"]


def test_cut_at_the_last_shared_block():
    # two sessions, block size 16. Session 0: the history before turn 1 is 5 + 10 = 15 tokens, less
    # than a block, so turn 1's 3 full blocks (21 + 30 = 51 tokens) are its own: both chains empty.
    # Session 1: turn 0 holds 66 + 4 = 70 tokens = 4 full blocks; turn 1 (prompt 70 + 1, output 60:
    # 131 tokens, 8 full blocks) shares those 4 and is cut after them
    r = reqs(prompt=[5, 66, 21, 71], output=[10, 4, 30, 60], session=[0, 1, 0, 1], turn=[0, 0, 1, 1],
             next_turn=[2, 3, -1, -1])
    assert chains(block_chains(r, 16)) == ["", "abcd", "", "abcd"]


def test_sessions_and_shared_prefix_refused_and_bad_block_size():
    r = reqs(prompt=[50, 60], output=[5, 5], group=[0, -1], plen=[20, 0], session=[-1, 1])
    with pytest.raises(ConfigError, match="sessions with a shared prefix"):
        block_chains(r, 16)
    for bad in (0, -16, 1.5, True):
        with pytest.raises(ConfigError, match=r"--block-size .* use an integer >= 1"):
            block_chains(session3(), bad)


def test_no_prefix_no_sessions_lists_nothing():
    c = block_chains(build_requests(load_workload("long-context"), 50, seed=0), 16)
    assert c.ids.size == 0 and np.all(c.length == 0) and np.all(c.next_turn == -1)


def test_sessions_workload_chains_are_prefixes_of_the_next_turn():
    r = build_requests(load_workload("sessions"), 3000, seed=1, max_len=8192)
    bs = 16
    c = block_chains(r, bs)
    ids = [c.ids[s:s + n] for s, n in zip(c.start, c.length)]
    for i in range(r.prompt.size):
        assert c.length[i] <= (r.prompt[i] + r.output[i]) // bs
        j = r.next_turn[i]
        if j >= 0:
            # the next turn starts with this turn's whole content (its history), so this turn's
            # full blocks are all shared with it
            assert c.length[i] == (r.prompt[i] + r.output[i]) // bs
            np.testing.assert_array_equal(ids[j][:c.length[i]], ids[i])
    # every listed id is listed by at least two requests; sessions never share ids
    _, count = np.unique(c.ids, return_counts=True)
    assert count.min() >= 2
    owner_session = np.repeat(r.session, c.length)
    by_id = {}
    for x, s in zip(c.ids.tolist(), owner_session.tolist()):
        assert by_id.setdefault(x, s) == s
