"""The sessions workload kind: multi-turn chat whose turns resend their history."""
from dataclasses import replace

import numpy as np
import pytest

from servesim.errors import ConfigError
from servesim.workload import (
    Sessions,
    build_requests,
    load_workload,
    with_sessions,
    with_shared_prefix,
)


def fixed(tmp_path, prompt=100, output=50, turns=3, think=10.0, extra=""):
    p = tmp_path / "conv.toml"
    p.write_text(f'''name = "conv"
description = "fixed lengths"
source = "test"
default_rate = 2.0
{extra}
[sessions]
turns_per_session = {turns}
think_time_s = {think}

[prompt]
kind = "fixed"
value = {prompt}

[output]
kind = "fixed"
value = {output}
''')
    return load_workload(p)


def test_shipped_sessions_workload():
    spec = load_workload("sessions")
    assert spec.sessions == Sessions(3, 30.0) and spec.shared_prefix is None and spec.source
    r = build_requests(spec, 3000, seed=0)
    assert r.prompt.size == 3000
    # no context limit: 1000 sessions of exactly 3 turns
    assert np.bincount(r.turn).tolist() == [1000, 1000, 1000]
    for a, dt in zip(r, (np.float64, np.int64, np.int64, np.int64, np.int64, np.int64, np.int64, np.int64,
                         np.float64)):
        assert a.dtype == dt and a.shape == (3000,)


def test_turn_prompts_grow_by_output_plus_question(tmp_path):
    # fixed question 100, output 50: prompts 100, 100 + 50 + 100 = 250, 250 + 50 + 100 = 400
    r = build_requests(fixed(tmp_path), 30, seed=0)
    for t, p in enumerate((100, 250, 400)):
        assert np.all(r.prompt[r.turn == t] == p)
    # drawn lengths: the difference is the previous output plus a question of the workload's lengths
    r = build_requests(load_workload("sessions"), 3000, seed=4)
    i = np.flatnonzero(r.next_turn >= 0)
    j = r.next_turn[i]
    question = r.prompt[j] - r.prompt[i] - r.output[i]
    assert question.min() >= 1 and question.max() <= 4096
    # the questions of later turns are drawn like first-turn prompts (lognormal, mean ~94 before clipping)
    assert question.mean() == pytest.approx(r.prompt[r.turn == 0].mean(), rel=0.1)
    assert question.mean() == pytest.approx(57 * np.exp(0.5), rel=0.1)
    # --question-len fixes every question: turn 0's prompt and each growth step
    q = build_requests(load_workload("sessions"), 300, seed=4, question_len=33)
    assert np.all(q.prompt[q.turn == 0] == 33)
    k = np.flatnonzero(q.next_turn >= 0)
    np.testing.assert_array_equal(q.prompt[q.next_turn[k]], q.prompt[k] + q.output[k] + 33)


def test_session_structure_and_order(tmp_path):
    r = build_requests(load_workload("sessions"), 999, seed=2, max_len=2048)
    first = np.flatnonzero(r.turn == 0)
    S = first.size
    # first turns are requests 0..S-1 in arrival order, each its own session's id; follow-ups after
    assert first.tolist() == list(range(S)) and r.session[:S].tolist() == list(range(S))
    assert np.all(np.isfinite(r.arrival[:S])) and np.all(np.diff(r.arrival[:S]) >= 0)
    assert np.all(np.isinf(r.arrival[S:])) and np.all(r.turn[S:] >= 1)
    # follow-ups grouped by session, turns in order
    assert np.all(np.diff(r.session[S:]) >= 0)
    # next_turn links turn t to turn t + 1 of the same session; the last turn has -1
    seen = np.zeros(r.prompt.size, bool)
    for s in range(S):
        i, t = s, 0
        while i >= 0:
            assert r.session[i] == s and r.turn[i] == t and not seen[i]
            seen[i] = True
            i, t = r.next_turn[i], t + 1
    assert seen.all()
    assert np.all(r.think[:S] == 0) and np.all(r.think[S:] > 0)


def test_rate_counts_requests(tmp_path):
    # 3 turns per session, no context limit: sessions start at rate / 3
    r = build_requests(load_workload("sessions"), 30_000, seed=0, rate=6.0)
    S = int((r.turn == 0).sum())
    assert S == 10_000
    assert (S - 1) / r.arrival[S - 1] == pytest.approx(2.0, rel=0.03)
    # the deterministic process spaces sessions exactly 1 / (rate / 3) = 0.5 s apart
    d = build_requests(load_workload("sessions"), 30, seed=0, rate=6.0, process="deterministic")
    np.testing.assert_allclose(d.arrival[:10], 0.5 * np.arange(10))
    # sessions cut by the context: 2 turns each (see test_max_context), so sessions start at rate / 2
    c = build_requests(fixed(tmp_path, turns=5), 20, seed=0, rate=6.0, process="deterministic", max_len=420)
    np.testing.assert_allclose(c.arrival[:10], np.arange(10) / 3.0)
    # offline: every session starts at 0
    o = build_requests(load_workload("sessions"), 30, seed=0, offline=True)
    assert np.all(o.arrival[:10] == 0) and np.all(np.isinf(o.arrival[10:]))


def test_think_times(tmp_path):
    r = build_requests(load_workload("sessions"), 30_000, seed=3)
    assert r.think[r.turn > 0].mean() == pytest.approx(30.0, rel=0.03)
    # the think times have their own stream: a doubled mean doubles each draw and changes nothing else
    a = build_requests(fixed(tmp_path, think=10.0), 300, seed=3, rate=1.0)
    b = build_requests(fixed(tmp_path, think=20.0), 300, seed=3, rate=1.0)
    np.testing.assert_allclose(b.think, 2 * a.think)
    for f in ("arrival", "prompt", "output", "session", "turn", "next_turn"):
        np.testing.assert_array_equal(getattr(a, f), getattr(b, f))
    z = build_requests(fixed(tmp_path, think=0), 30, seed=3)
    assert np.all(z.think == 0)


def test_max_context(tmp_path):
    # question 100, output 50, 5 turns, max_len 420: turn 0 = 100 + 50 = 150, turn 1 = 250 + 50 = 300,
    # turn 2 = 400 + 50 = 450 > 420, so every session ends after 2 turns
    r = build_requests(fixed(tmp_path, turns=5), 10, seed=0, max_len=420)
    assert r.turn.tolist() == [0] * 5 + [1] * 5 and r.prompt.tolist() == [100] * 5 + [250] * 5
    assert np.all(r.prompt + r.output <= 420)
    # max_len 120: turn 0 is fitted as any request (output 50 kept, prompt cut to 70); turn 1 would be
    # 70 + 50 + 100 = 220 tokens of prompt: every session has one turn, all timed
    r = build_requests(fixed(tmp_path, turns=5), 10, seed=0, max_len=120)
    assert r.prompt.tolist() == [70] * 10 and r.output.tolist() == [50] * 10
    assert np.all(r.next_turn == -1) and np.all(np.isfinite(r.arrival))
    # drawn lengths: nothing exceeds the context, and some sessions end early
    d = build_requests(load_workload("sessions"), 3000, seed=0, max_len=1024)
    assert (d.prompt + d.output).max() <= 1024
    assert (d.turn == 0).sum() > 1000


def test_num_requests_cuts_the_last_session(tmp_path):
    # 7 turns of 3-turn sessions: 3 + 3 + 1
    r = build_requests(fixed(tmp_path), 7, seed=0)
    assert r.session.tolist() == [0, 1, 2, 0, 0, 1, 1] and r.turn.tolist() == [0, 0, 0, 1, 2, 1, 2]
    assert r.next_turn.tolist() == [3, 5, -1, 4, -1, 6, -1]


def test_determinism_by_seed():
    spec = load_workload("sessions")
    a = build_requests(spec, 2000, seed=42, rate=3.0, max_len=4096)
    b = build_requests(spec, 2000, seed=42, rate=3.0, max_len=4096)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    c = build_requests(spec, 2000, seed=43, rate=3.0, max_len=4096)
    assert not np.array_equal(a.prompt, c.prompt) and not np.array_equal(a.think, c.think)
    # the arrival process does not change the lengths or think times
    d = build_requests(spec, 2000, seed=42, rate=9.0, process="gamma", cv=2.0, max_len=4096)
    for f in ("prompt", "output", "think", "next_turn"):
        np.testing.assert_array_equal(getattr(a, f), getattr(d, f))
    assert not np.array_equal(a.arrival, d.arrival)


def test_other_workloads_have_no_sessions():
    r = build_requests(load_workload("chat"), 100, seed=0)
    assert np.all(r.session == -1) and np.all(r.turn == 0) and np.all(r.next_turn == -1)
    assert np.all(r.think == 0) and r.think.dtype == np.float64


def test_with_sessions_overrides():
    s = with_sessions(load_workload("chat"), turns_per_session=4)
    assert s.sessions == Sessions(4, 0.0)
    assert with_sessions(load_workload("sessions"), think_time_s=5).sessions == Sessions(3, 5.0)
    assert with_sessions(load_workload("sessions")) == load_workload("sessions")
    r = build_requests(s, 40, seed=0)
    assert np.bincount(r.turn).tolist() == [10] * 4 and np.all(r.think == 0)


@pytest.mark.parametrize("kwargs, phrase", [
    (dict(stages="2x100s"), "--stages does not apply to the sessions workload 'sessions'"),
    (dict(window=100.0), "--duration (an arrival window) does not apply"),
    (dict(isl=500), "--isl 500 does not apply to the sessions workload 'sessions' (3 turns per session); "
                    "fix each turn's new question with --question-len Q"),
    (dict(trace_mode="replay"), "--trace-mode replay does not apply"),
    (dict(rate=-1.0), "--rate -1.0 is not valid"),
    (dict(max_len=1), "--max-len 1 is not valid"),
    (dict(question_len=0), "--question-len 0 is not valid"),
])
def test_refused_options(kwargs, phrase):
    n = None if "stages" in kwargs or "window" in kwargs else 30
    with pytest.raises(ConfigError) as e:
        build_requests(load_workload("sessions"), n, seed=0, **kwargs)
    assert phrase in str(e.value) and "\n" not in str(e.value)


def test_bad_files_and_overrides(tmp_path):
    with pytest.raises(ConfigError, match=r"conv.toml:7: \[sessions\] turns_per_session = 0; use an integer >= 1"):
        fixed(tmp_path, turns=0)
    with pytest.raises(ConfigError, match=r"conv.toml:8: \[sessions\] think_time_s = -1.0; use a finite number"):
        fixed(tmp_path, think=-1.0)
    p = tmp_path / "conv.toml"
    with pytest.raises(ConfigError, match=r"\[sessions\] and \[shared_prefix\] together are not supported"):
        fixed(tmp_path, extra="[shared_prefix]\nnum_system_prompts = 2\nsystem_prompt_len = 10\n")
    fixed(tmp_path)   # rewrites the file without [shared_prefix]
    p.write_text(p.read_text().replace("think_time_s = 10.0\n", "think_time_s = 10.0\nturns = 4\n"))
    with pytest.raises(ConfigError, match=r"conv.toml:9: \[sessions\] unknown key 'turns'; allowed: "
                                          "turns_per_session, think_time_s"):
        load_workload(p)
    with pytest.raises(ConfigError, match=r"--turns-per-session 0 is not valid; use an integer >= 1"):
        with_sessions(load_workload("chat"), turns_per_session=0)
    with pytest.raises(ConfigError, match=r"--think-time -2 is not valid"):
        with_sessions(load_workload("sessions"), think_time_s=-2)
    with pytest.raises(ConfigError, match=r"sessions also need --turns-per-session"):
        with_sessions(load_workload("chat"), think_time_s=3)
    with pytest.raises(ConfigError, match=r"has \[sessions\], and sessions with a shared prefix are not supported"):
        with_shared_prefix(load_workload("sessions"), 2, 1, 10)
    shared = with_shared_prefix(load_workload("chat"), 2, 1, 10)
    with pytest.raises(ConfigError, match="sessions with a shared prefix are not supported"):
        with_sessions(shared, turns_per_session=2)
    with pytest.raises(ConfigError, match="sessions with a shared prefix are not supported"):
        build_requests(replace(shared, sessions=Sessions(2, 1.0)), 10, seed=0)


def test_session_options_turn_any_workload_into_sessions_that_hit_their_history():
    import servesim
    from servesim.errors import ConfigError
    s = servesim.simulate(turns_per_session=3, think_time=5.0, num_requests=60, isl=None, seed=0).summary
    assert s["config"]["turns_per_session"] == 3 and s["config"]["think_time"] == 5.0
    # one replica: every later turn finds its history (full blocks of the previous prompt + answer)
    assert s["prefix_cache"]["hit_rate"] > 0.3 and s["num_completed"] == 60
    with pytest.raises(ConfigError, match="--turns-per-session"):
        servesim.simulate(think_time=5.0, num_requests=10)
