"""Loads that real serving benchmarks use: open-loop stages, shared-prefix workloads, whole-trace replay."""
import json
import math
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from servesim.cli import main
from servesim.errors import ConfigError
from servesim.metrics import parse_duration
from servesim.workload import (
    PROCESSES,
    build_requests,
    load_workload,
    parse_stages,
    stage_arrivals,
    with_shared_prefix,
)
from clihelp import one_line_error

TRACES = Path(__file__).resolve().parents[1] / "workloads" / "traces"


def run(*args):
    r = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return r.output


# ----------------------------------------------------------------------------- parsing

def test_parse_stages_units_and_separators():
    assert parse_stages("5x600s,10x600s") == ((5.0, 600.0), (10.0, 600.0))
    assert parse_stages("5.0x600s;10.0x600s") == ((5.0, 600.0), (10.0, 600.0))
    assert parse_stages(" 2.5 x 10min ; 1x1h, 4x500ms,3x20 ") == ((2.5, 600.0), (1.0, 3600.0), (4.0, 0.5), (3.0, 20.0))
    assert parse_stages([(5, 600), [10, 60.0]]) == ((5.0, 600.0), (10.0, 60.0))   # the parsed form
    assert parse_stages(parse_stages("5x1m")) == ((5.0, 60.0),)
    assert parse_stages(None) is None
    assert parse_duration("10min", "--duration") == 600.0 and parse_duration("2h", "--duration") == 7200.0
    assert parse_duration("3m", "--duration") == 180.0 and parse_duration("3ms", "--duration") == 0.003


@pytest.mark.parametrize("text, words", [
    ("5x", ["'5x'", "RATExDURATION"]),
    ("-3x10s", ["'-3x10s'", "rate -3", "> 0"]),
    ("5x0s", ["'5x0s'", "duration 0", "> 0"]),
    ("x10s", ["'x10s'", "RATExDURATION"]),
    ("", ["empty"]),
    ("5x10s,", ["empty stage"]),
    ("5x10q", ["'5x10q'"]),
])
def test_parse_stages_errors(text, words):
    with pytest.raises(ConfigError) as e:
        parse_stages(text)
    msg = str(e.value)
    assert msg.startswith("--stages") and "e.g. --stages" in msg
    for w in words:
        assert w in msg, msg


# ----------------------------------------------------------------------------- stage arrivals

def test_poisson_stage_counts_match_rate_times_duration():
    # a Poisson stage receives Poisson(rate x duration) requests: over S seeds the mean count has
    # standard error sqrt(lambda / S), and the sample variance is close to lambda (index of dispersion 1)
    stages = ((5.0, 20.0), (10.0, 20.0), (2.0, 50.0))
    lam = np.array([r * d for r, d in stages])
    seeds = 300
    counts = np.empty((seeds, len(stages)))
    for s in range(seeds):
        t = stage_arrivals(stages, s)
        counts[s] = np.histogram(t, bins=[0.0, 20.0, 40.0, 90.0])[0]
    se = np.sqrt(lam / seeds)
    assert np.all(np.abs(counts.mean(axis=0) - lam) < 4 * se), (counts.mean(axis=0), lam)
    # Var(sample variance) of a Poisson count ~ (lambda + 2 lambda^2) / (S - 1): relative sd ~ sqrt(2 / S)
    dispersion = counts.var(axis=0, ddof=1) / lam
    assert np.all(np.abs(dispersion - 1) < 4 * math.sqrt(2 / seeds)), dispersion


@pytest.mark.parametrize("process", PROCESSES)
def test_stage_arrivals_inside_windows_and_sorted(process):
    stages = parse_stages("3x40s,12x10s,1x30s")
    t = stage_arrivals(stages, 7, process=process, cv=2.0)
    assert t.dtype == np.float64 and t.size > 0
    assert np.all(np.diff(t) >= 0)
    assert t.min() >= 0.0 and t.max() < 80.0
    # every stage receives arrivals (rates x durations are 120, 120, 30 requests)
    counts = np.histogram(t, bins=[0.0, 40.0, 50.0, 80.0])[0]
    assert np.all(counts > 0), counts


def test_deterministic_stages_exact():
    t = stage_arrivals("4x10s,2x5s", 0, process="deterministic")
    np.testing.assert_allclose(t, np.concatenate((np.arange(40) / 4.0, 10.0 + np.arange(10) / 2.0)))


def test_stage_arrivals_deterministic_per_seed():
    a, b = stage_arrivals("5x30s,9x30s", 3), stage_arrivals("5x30s,9x30s", 3)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, stage_arrivals("5x30s,9x30s", 4))
    # a stage's arrivals depend on its own rate and window only, not on the later stages
    c = stage_arrivals("5x30s,20x30s", 3)
    np.testing.assert_array_equal(a[a < 30.0], c[c < 30.0])


def test_build_requests_with_stages():
    spec = load_workload("chat")
    a = build_requests(spec, None, 5, stages="4x50s,8x50s")
    b = build_requests(spec, None, 5, stages="4x50s,8x50s")
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    n = a.arrival.size
    assert 0.7 * 600 < n < 1.3 * 600
    assert np.all((a.arrival >= 0) & (a.arrival < 100.0)) and np.all(np.diff(a.arrival) >= 0)
    # lengths come from their own streams: the same n from a constant rate gives the same lengths
    plain = build_requests(spec, n, 5, rate=123.0)
    np.testing.assert_array_equal(a.prompt, plain.prompt)
    np.testing.assert_array_equal(a.output, plain.output)
    assert np.all(a.prefix_group == -1) and np.all(a.prefix_len == 0)
    with pytest.raises(ConfigError, match="--num-requests"):
        build_requests(spec, 100, 5, stages="4x50s")
    with pytest.raises(ConfigError, match="--offline"):
        build_requests(spec, None, 5, stages="4x50s", offline=True)
    with pytest.raises(ConfigError, match="no request arrives"):
        build_requests(spec, None, 5, stages="0.0001x1s")


# ----------------------------------------------------------------------------- shared prefix

def test_shared_prefix_arrays():
    spec = with_shared_prefix(load_workload("chat"), num_system_prompts=9, users_per_system_prompt=5,
                              system_prompt_len=100)
    n = 9000
    r = build_requests(spec, n, 1, question_len=447, osl=248)
    assert np.all(r.prompt == 100 + 447) and np.all(r.output == 248)
    assert np.all(r.prefix_len == 100)
    assert r.prefix_group.dtype == np.int64 and r.prefix_len.dtype == np.int64
    assert set(np.unique(r.prefix_group).tolist()) == set(range(9))
    # users drawn uniformly: each group of 5 users gets a binomial(n, 1/9) share of the requests
    counts = np.bincount(r.prefix_group, minlength=9)
    sd = math.sqrt(n * (1 / 9) * (8 / 9))
    assert np.all(np.abs(counts - n / 9) < 4 * sd), counts
    again = build_requests(spec, n, 1, question_len=447, osl=248)
    for x, y in zip(r, again):
        np.testing.assert_array_equal(x, y)


def test_shared_prefix_questions_from_workload_and_isl():
    chat = load_workload("chat")
    spec = with_shared_prefix(chat, num_system_prompts=3, system_prompt_len=50, question_per="request")
    assert spec.shared_prefix.users_per_system_prompt == 1
    plain = build_requests(chat, 500, 2)
    r = build_requests(spec, 500, 2)
    np.testing.assert_array_equal(r.prompt, 50 + plain.prompt)   # the workload's prompts become questions
    # one question per user (the default): the 3 users' prompts, each 50 + a length of the workload's
    per_user = build_requests(with_shared_prefix(chat, num_system_prompts=3, system_prompt_len=50), 500, 2)
    assert np.unique(per_user.prompt).size <= 3 and np.all(per_user.prompt > 50)
    np.testing.assert_array_equal(per_user.output, plain.output)
    np.testing.assert_array_equal(r.output, plain.output)
    np.testing.assert_array_equal(r.arrival, plain.arrival)
    total = build_requests(spec, 500, 2, isl=80)
    assert np.all(total.prompt == 80) and np.all(total.prefix_len == 50)
    with pytest.raises(ConfigError, match="--isl 40 is not longer"):
        build_requests(spec, 10, 2, isl=40)
    with pytest.raises(ConfigError, match="--isl 80 and --question-len 5 contradict"):
        build_requests(spec, 10, 2, isl=80, question_len=5)
    with pytest.raises(ConfigError, match="--question-len 5 needs a shared prefix"):
        build_requests(chat, 10, 2, question_len=5)


def test_shared_prefix_clipped_to_context_keeps_a_token_to_prefill():
    spec = with_shared_prefix(load_workload("chat"), num_system_prompts=2, system_prompt_len=1000)
    r = build_requests(spec, 50, 0, question_len=100, osl=50, max_len=600)
    assert np.all(r.prompt + r.output <= 600)
    assert np.all(r.prefix_len < r.prompt) and np.all(r.prefix_len == 549)


@pytest.mark.parametrize("kw, words", [
    ({"num_system_prompts": 0, "system_prompt_len": 10}, ["--num-system-prompts 0", ">= 1"]),
    ({"num_system_prompts": 3, "system_prompt_len": -5}, ["--system-prompt-len -5", ">= 1"]),
    ({"num_system_prompts": 3, "system_prompt_len": 5, "users_per_system_prompt": 0}, ["--users-per-system-prompt 0"]),
    ({"num_system_prompts": 3}, ["needs --system-prompt-len"]),
    ({"users_per_system_prompt": 2}, ["needs --num-system-prompts and --system-prompt-len"]),
])
def test_with_shared_prefix_errors(kw, words):
    with pytest.raises(ConfigError) as e:
        with_shared_prefix(load_workload("chat"), **kw)
    for w in words:
        assert w in str(e.value), str(e.value)


SHARED = '''name = "sp"
description = "d"
source = "s"
default_rate = 5.0

[shared_prefix]
num_system_prompts = 9
users_per_system_prompt = 5
system_prompt_len = 130

[prompt]
kind = "fixed"
value = 447

[output]
kind = "fixed"
value = 248
'''


def test_shared_prefix_toml(tmp_path):
    p = tmp_path / "sp.toml"
    p.write_text(SHARED)
    spec = load_workload(p)
    assert (spec.shared_prefix.num_system_prompts, spec.shared_prefix.users_per_system_prompt,
            spec.shared_prefix.system_prompt_len) == (9, 5, 130)
    r = build_requests(spec, 200, 0)
    assert np.all(r.prompt == 577) and np.all(r.prefix_len == 130) and r.prefix_group.max() <= 8
    # CLI-style overrides replace single fields
    assert with_shared_prefix(spec, system_prompt_len=10).shared_prefix.num_system_prompts == 9


@pytest.mark.parametrize("old, new, words", [
    ("users_per_system_prompt = 5", "users = 5", ["sp.toml:8", "[shared_prefix] unknown key 'users'"]),
    ("system_prompt_len = 130\n", "", ["sp.toml:6", "missing key 'system_prompt_len'"]),
    ("num_system_prompts = 9", "num_system_prompts = 0", ["sp.toml:7", "num_system_prompts = 0", ">= 1"]),
    ("system_prompt_len = 130", 'system_prompt_len = "long"', ["sp.toml:9", "system_prompt_len"]),
    ("[shared_prefix]\nnum_system_prompts = 9\nusers_per_system_prompt = 5\nsystem_prompt_len = 130\n",
     "", []),  # optional table
])
def test_shared_prefix_toml_errors(tmp_path, old, new, words):
    assert old in SHARED
    p = tmp_path / "sp.toml"
    p.write_text(SHARED.replace(old, new))
    if not words:
        assert load_workload(p).shared_prefix is None
        return
    with pytest.raises(ConfigError) as e:
        load_workload(p)
    for w in words:
        assert w in str(e.value), str(e.value)


# ----------------------------------------------------------------------------- whole-trace replay

def test_replay_uses_every_trace_row_by_default():
    spec = load_workload(TRACES / "splitwise_conv.csv")
    r = build_requests(spec, None, 0, trace_mode="replay")
    assert r.arrival.size == len(spec.trace) > 2000
    np.testing.assert_array_equal(r.arrival, spec.trace.arrival_s)
    s = build_requests(spec, None, 0, trace_mode="scale", rate=10.0)
    assert s.arrival.size == len(spec.trace)
    assert (s.arrival.size - 1) / s.arrival[-1] == pytest.approx(10.0)
    assert build_requests(spec, None, 0).arrival.size == 2000  # synthetic default unchanged


def test_replay_cli_all_rows_and_header():
    trace = str(TRACES / "splitwise_conv.csv")
    n = len(load_workload(trace).trace)
    d = json.loads(run("simulate", "--workload", trace, "--trace-mode", "replay", "--duration", "2s",
                       "--format", "json"))
    c = d["config"]
    assert d["num_requests"] == c["num_requests"] == n
    assert c["arrival"] == "trace" and c["trace"]["file"] == "splitwise_conv.csv"
    assert c["rate"] == pytest.approx(c["trace"]["mean_rate"]) and c["rate"] == pytest.approx(
        (n - 1) / c["trace"]["span_s"])
    out = run("simulate", "--workload", trace, "--trace-mode", "replay", "--duration", "2s")
    assert f"replay of trace splitwise_conv.csv: {n} requests over" in out and "poisson" not in out
    assert f"at the trace's own arrival times, delivered {c['rate']:.3g} req/s" in out
    out = run("simulate", "--workload", trace, "--trace-mode", "scale", "--rate", "50", "--duration", "2s")
    assert "trace splitwise_conv.csv rescaled to 50 req/s" in out
    one_line_error("simulate", "--workload", trace, "--trace-mode", "replay", "--num-requests", str(n + 1),
               must_contain=(f"--num-requests {n + 1}", f"<= {n}"))


# ----------------------------------------------------------------------------- simulate with stages

def test_stages_summary_adds_up_and_is_stable():
    # far below capacity (~60 req/s for 512/64 tokens): the rise from 2.5 to 6 req/s is not saturation
    d = json.loads(run("simulate", "--isl", "512", "--osl", "64", "--stages", "2.5x60s,6x60s", "--format", "json",
                       "--slo", "ttft_p99=1s"))
    st = d["stages"]
    assert [s["stage"] for s in st] == [0, 1]
    assert [(s["rate"], s["start_s"], s["duration_s"]) for s in st] == [(2.5, 0.0, 60.0), (6.0, 60.0, 60.0)]
    assert sum(s["num_requests"] for s in st) == d["num_requests"] == d["config"]["num_requests"]
    assert sum(s["num_completed"] for s in st) == d["num_completed"]
    assert d["config"]["stages"] == [[2.5, 60.0], [6.0, 60.0]]
    assert d["config"]["rate"] == pytest.approx((2.5 * 60 + 6 * 60) / 120)
    for s in st:
        for k in ("ttft_ms", "tpot_ms", "e2e_ms", "queue_ms"):
            assert s[k]["mean"] is not None and s[k]["p99"] is not None
        assert s["itl_ms"]["mean"] > 0 and s["throughput"]["requests_per_s"] > 0
        assert not s["saturated"] and s["slo"]["ttft_p99"]["met"]
    assert not d["saturated"]
    # per-stage throughput follows the offered rate
    assert st[0]["throughput"]["requests_per_s"] < st[1]["throughput"]["requests_per_s"]


def test_overloaded_stage_is_saturated():
    d = json.loads(run("simulate", "--isl", "512", "--osl", "64", "--stages", "3x30s,150x10s", "--format", "json"))
    assert d["saturated"]
    assert [s["saturated"] for s in d["stages"]] == [False, True]
    assert d["queue_growth"]["stage"] == 1


def test_stages_table_has_a_line_per_stage():
    out = run("simulate", "--isl", "256", "--osl", "32", "--stages", "2x20s;4x20s;3x10s")
    lines = out.splitlines()
    assert any("arrivals in 3 stage(s): 2 req/s x 20 s, 4 req/s x 20 s, 3 req/s x 10 s" in ln for ln in lines)
    head = next(i for i, ln in enumerate(lines) if ln.startswith("stage "))
    assert "E2E mean/p90/p99" in lines[head] and "TTFT mean/p90/p99" in lines[head]
    assert [ln.split()[0] for ln in lines[head + 1: head + 4]] == ["0", "1", "2"]


def test_shared_prefix_cli():
    d = json.loads(run("simulate", "--num-system-prompts", "9", "--users-per-system-prompt", "5",
                       "--system-prompt-len", "130", "--question-len", "447", "--osl", "32",
                       "--num-requests", "100", "--format", "json"))
    c = d["config"]
    assert (c["num_system_prompts"], c["users_per_system_prompt"], c["system_prompt_len"], c["question_len"]) == \
        (9, 5, 130, 447)
    assert d["num_completed"] == 100


@pytest.mark.parametrize("args, words", [
    (["--stages", "5x"], ["--stages '5x'"]),
    (["--stages", "-3x10s"], ["--stages '-3x10s'", "rate -3"]),
    (["--stages", "5x0s"], ["--stages '5x0s'", "duration 0"]),
    (["--stages", "x10s"], ["--stages 'x10s'"]),
    (["--stages", ""], ["--stages", "empty"]),
    (["--stages", "5x10s", "--rate", "3"], ["--stages and --rate 3 contradict"]),
    (["--stages", "5x10s", "--offline"], ["--stages and --offline contradict"]),
    (["--stages", "5x10s", "--concurrency", "4"], ["--stages and --concurrency 4 contradict"]),
    (["--stages", "5x10s", "--num-requests", "10"], ["--stages and --num-requests 10 contradict"]),
    (["--stages", "5x10s", "--trace-mode", "replay"], ["--stages and --trace-mode replay contradict"]),
    (["--num-system-prompts", "0", "--system-prompt-len", "10"], ["--num-system-prompts 0"]),
    (["--num-system-prompts", "-2", "--system-prompt-len", "10"], ["--num-system-prompts -2"]),
    (["--num-system-prompts", "3", "--system-prompt-len", "0"], ["--system-prompt-len 0"]),
    (["--num-system-prompts", "3", "--system-prompt-len", "10", "--users-per-system-prompt", "0"],
     ["--users-per-system-prompt 0"]),
    (["--num-system-prompts", "3", "--system-prompt-len", "10", "--question-len", "-1"], ["--question-len -1"]),
    (["--num-system-prompts", "3"], ["--system-prompt-len"]),
    (["--question-len", "10"], ["--question-len 10", "shared prefix"]),
    (["--num-system-prompts", "3", "--system-prompt-len", "100", "--isl", "80"],
     ["--isl 80", "--system-prompt-len 100", "--isl >= 101"]),
])
def test_bad_load_inputs_exit_2_with_one_line(args, words):
    one_line_error("simulate", *args, must_contain=words)
