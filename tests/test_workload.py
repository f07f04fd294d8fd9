"""Workload generation: arrival processes, length distributions, trace readers, named workloads."""
from pathlib import Path

import numpy as np
import pytest

from servesim.errors import ConfigError
from servesim.workload import (
    DIURNAL_CURVE,
    LengthSpec,
    Requests,
    arrival_times,
    build_requests,
    list_workloads,
    load_workload,
    offline_arrivals,
    read_trace,
    sample_lengths,
)

DATA = Path(__file__).parent / "data" / "traces"
N = 20_000


def rng(seed=1):
    return np.random.default_rng(seed)


def gaps(t):
    return np.diff(t)


# ----------------------------------------------------------------------------- arrivals

@pytest.mark.parametrize("process", ["poisson", "gamma", "deterministic", "bursty", "daily"])
def test_arrivals_sorted_float64_start(process):
    t = arrival_times(500, 3.0, rng(), process=process, cv=2.0, start=100.0)
    assert t.dtype == np.float64 and t.shape == (500,)
    assert np.all(np.diff(t) >= 0)
    assert t[0] == 100.0


def test_poisson_mean_and_cv():
    g = gaps(arrival_times(N, 4.0, rng()))
    # exponential gaps: mean 1/rate, CV 1; std error of the mean is 1/(rate*sqrt(N)) ~ 0.7 %
    assert g.mean() == pytest.approx(0.25, rel=0.03)
    assert g.std() / g.mean() == pytest.approx(1.0, rel=0.04)


@pytest.mark.parametrize("cv", [0.5, 1.0, 2.0, 4.0])
def test_gamma_mean_and_cv(cv):
    g = gaps(arrival_times(N, 2.0, rng(7), process="gamma", cv=cv))
    assert g.mean() == pytest.approx(0.5, rel=0.03 * max(cv, 1))
    assert g.std() / g.mean() == pytest.approx(cv, rel=0.06 * max(cv, 1))


def test_deterministic_exact():
    t = arrival_times(1000, 8.0, rng(), process="deterministic", start=2.0)
    np.testing.assert_array_equal(t, 2.0 + np.arange(1000) / 8.0)


def test_bursty_long_run_mean_and_silence():
    on, off = 5.0, 15.0
    t = arrival_times(N, 10.0, rng(3), process="bursty", burst_on_s=on, burst_off_s=off)
    rate = (t.size - 1) / (t[-1] - t[0])
    assert rate == pytest.approx(10.0, rel=0.05)
    phase = np.mod(t, on + off)
    assert np.all(phase <= on + 1e-9)  # nothing in off-windows
    # inside on-windows the rate is rate / duty = 40 req/s
    g = gaps(t)
    inside = g[np.floor(t[1:] / (on + off)) == np.floor(t[:-1] / (on + off))]
    assert inside.mean() == pytest.approx(1 / 40.0, rel=0.05)


def test_daily_counts_follow_curve():
    rate = 2.0
    n = 4 * int(rate * 86400)  # about four days
    t = arrival_times(n, rate, rng(11), process="daily")
    assert np.all(np.diff(t) >= 0)
    hours = (np.floor(t / 3600) % 24).astype(int)
    days = t[-1] / 86400
    counts = np.bincount(hours, minlength=24)
    m = np.asarray(DIURNAL_CURVE) / np.mean(DIURNAL_CURVE)
    expected = rate * 3600 * m * days
    # Poisson counts: within 5 standard deviations plus partial-day edge effects (one day's hour)
    tol = 5 * np.sqrt(expected) + rate * 3600 * m
    assert np.all(np.abs(counts - expected) < tol)
    # and the shape: correlation with the curve is near 1
    assert np.corrcoef(counts, m)[0, 1] > 0.99
    # long-run mean rate
    assert (n - 1) / t[-1] == pytest.approx(rate, rel=0.02)


def test_daily_custom_curve_zero_hours_are_silent():
    curve = [0.0] * 12 + [1.0] * 12  # only afternoons
    t = arrival_times(5000, 1.0, rng(5), process="daily", daily_curve=curve, start=12 * 3600.0)
    hours = np.floor(t / 3600) % 24
    assert np.all(hours >= 12)
    # during active hours the rate is 2 (the curve is mean-normalised to 1 over the day)
    def active(x):  # afternoon seconds elapsed since midnight of day 0
        return np.floor(x / 86400) * 43200 + np.clip(np.mod(x, 86400) - 43200, 0, 43200)
    assert (t.size - 1) / (active(t[-1]) - active(t[0])) == pytest.approx(2.0, rel=0.05)


def test_daily_curve_validation():
    with pytest.raises(ConfigError, match="24"):
        arrival_times(10, 1.0, rng(), process="daily", daily_curve=[1.0] * 23)
    with pytest.raises(ConfigError, match=">= 0"):
        arrival_times(10, 1.0, rng(), process="daily", daily_curve=[-1.0] + [1.0] * 23)


@pytest.mark.parametrize("rate", [0, -1.0, float("nan")])
def test_bad_rate_names_flag(rate):
    with pytest.raises(ConfigError, match="--rate"):
        arrival_times(10, rate, rng())


def test_unknown_process_and_bad_cv():
    with pytest.raises(ConfigError, match="poisson"):
        arrival_times(10, 1.0, rng(), process="weibull")
    with pytest.raises(ConfigError, match="cv"):
        arrival_times(10, 1.0, rng(), process="gamma", cv=0.0)


def test_infinite_rate_and_offline():
    np.testing.assert_array_equal(arrival_times(5, float("inf"), rng()), np.zeros(5))
    z = offline_arrivals(7)
    assert z.dtype == np.float64 and np.all(z == 0) and z.size == 7


# ----------------------------------------------------------------------------- lengths

@pytest.mark.parametrize("spec", [
    LengthSpec("fixed", value=128),
    LengthSpec("uniform", low=10, high=20),
    LengthSpec("normal", mean=100.0, std=80.0, min_len=50, max_len=150),
    LengthSpec("lognormal", median=1000.0, sigma=2.0, min_len=16, max_len=4096),
    LengthSpec("empirical", samples=(1, 5, 9000), max_len=8000),
])
def test_lengths_within_bounds(spec):
    x = sample_lengths(spec, 5000, rng())
    assert x.dtype == np.int64 and x.shape == (5000,)
    assert x.min() >= max(1, spec.min_len) and x.max() <= spec.max_len


def test_length_distributions():
    assert np.all(sample_lengths(LengthSpec("fixed", value=77), 10, rng()) == 77)
    u = sample_lengths(LengthSpec("uniform", low=10, high=20), N, rng())
    assert set(np.unique(u)) == set(range(10, 21))  # both ends inclusive
    ln = sample_lengths(LengthSpec("lognormal", median=500.0, sigma=0.5), N, rng())
    assert np.median(ln) == pytest.approx(500, rel=0.03)
    assert np.log(ln).std() == pytest.approx(0.5, rel=0.05)
    no = sample_lengths(LengthSpec("normal", mean=300.0, std=30.0), N, rng())
    assert no.mean() == pytest.approx(300, rel=0.01)
    e = sample_lengths(LengthSpec("empirical", samples=(3, 7)), N, rng())
    assert set(np.unique(e)) == {3, 7} and (e == 3).mean() == pytest.approx(0.5, abs=0.02)


def test_normal_clipped_never_below_one():
    x = sample_lengths(LengthSpec("normal", mean=2.0, std=50.0), N, rng())
    assert x.min() == 1 and (x == 1).mean() > 0.3


@pytest.mark.parametrize("kwargs", [
    dict(kind="fixed", value=0),
    dict(kind="uniform", low=5, high=4),
    dict(kind="normal", mean=-1.0, std=1.0),
    dict(kind="lognormal", median=100.0, sigma=-0.1),
    dict(kind="empirical", samples=()),
    dict(kind="empirical", samples=(3, 0)),
    dict(kind="fixed", value=5, min_len=0),
    dict(kind="fixed", value=5, min_len=10, max_len=9),
    dict(kind="fixed", value="many"),
    dict(kind="zipf"),
])
def test_length_spec_validation(kwargs):
    with pytest.raises(ConfigError):
        LengthSpec(**kwargs)


# ----------------------------------------------------------------------------- traces

def test_read_azure():
    tr = read_trace(DATA / "azure_small.csv")
    assert tr.format == "azure"
    np.testing.assert_array_equal(tr.prompt, [374, 396, 879, 91, 1200])
    np.testing.assert_array_equal(tr.output, [44, 109, 17, 256, 7])
    assert tr.prompt.dtype == np.int64 and tr.arrival_s.dtype == np.float64
    np.testing.assert_allclose(tr.arrival_s, [0.0, 4.314579, 4.31941, 15.8194101, 120.0], atol=1e-7)


def test_read_splitwise_with_and_without_times():
    tr = read_trace(DATA / "splitwise_small.csv")
    assert tr.format == "splitwise" and len(tr) == 6
    np.testing.assert_allclose(tr.arrival_s, [0.0, 0.052, 0.5, 0.5, 1.25, 2.0])
    np.testing.assert_array_equal(tr.output, [10, 8, 27, 12, 300, 1])
    lo = read_trace(DATA / "splitwise_lengths_only.csv")
    assert lo.format == "splitwise" and lo.arrival_s is None
    np.testing.assert_array_equal(lo.prompt, [3772, 2015, 100])
    np.testing.assert_array_equal(lo.output, [54, 156, 900])


def test_read_burstgpt_drops_failures():
    tr = read_trace(DATA / "burstgpt_small.csv")
    assert tr.format == "burstgpt" and tr.dropped == 2
    np.testing.assert_array_equal(tr.prompt, [472, 417, 1360, 200])
    np.testing.assert_array_equal(tr.output, [18, 217, 302, 45])
    np.testing.assert_allclose(tr.arrival_s, [0.0, 113.0, 138.0, 185.0])


@pytest.mark.parametrize("name, line, words", [
    ("bad_missing_column.csv", 1, ["num_decode_tokens", "found: arrived_at, num_prefill_tokens"]),
    ("bad_negative_length.csv", 4, ["num_decode_tokens", "negative", "-7"]),
    ("bad_unsorted.csv", 6, ["arrived_at", "line 5", "sort"]),
    ("bad_non_numeric.csv", 3, ["ContextTokens", "'abc'"]),
    ("bad_zero_prompt.csv", 3, ["Request tokens", "zero"]),
    ("bad_timestamp.csv", 4, ["TIMESTAMP", "'yesterday'"]),
    ("header_only.csv", 1, ["no data rows"]),
    ("empty.csv", 1, ["empty trace"]),
    ("unknown_header.csv", 1, ["unrecognised", "3 column(s)", "TIMESTAMP"]),   # its header is not echoed
])
def test_trace_errors_name_file_and_line(name, line, words):
    with pytest.raises(ConfigError) as e:
        read_trace(DATA / name)
    msg = str(e.value)
    assert f"{name}:{line}:" in msg
    assert "\n" not in msg
    for w in words:
        assert w in msg


def test_trace_zero_output_is_error_outside_burstgpt(tmp_path):
    p = tmp_path / "zero_out.csv"
    p.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,5,5\n1,5,0\n")
    with pytest.raises(ConfigError, match=r"zero_out\.csv:3: .*num_decode_tokens.*zero"):
        read_trace(p)


def test_trace_non_integer_and_missing_value(tmp_path):
    p = tmp_path / "frac.csv"
    p.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,5,5\n1,5.5,3\n")
    with pytest.raises(ConfigError, match=r"frac\.csv:3: .*non-integer"):
        read_trace(p)
    q = tmp_path / "hole.csv"
    q.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,5,5\n1,5,3\n2,,3\n")
    with pytest.raises(ConfigError, match=r"hole\.csv:4: .*empty value"):
        read_trace(q)


def test_trace_blank_lines_keep_line_numbers(tmp_path):
    p = tmp_path / "blank.csv"
    p.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,5,5\n\n1,5,3\n2,-1,3\n\n")
    with pytest.raises(ConfigError, match=r"blank\.csv:5: "):
        read_trace(p)
    p.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,5,5\n\n1,5,3\n")
    assert len(read_trace(p)) == 2


SHIPPED_TRACES = sorted((Path(__file__).parent.parent / "workloads" / "traces").glob("*.csv"))


@pytest.mark.parametrize("path", SHIPPED_TRACES, ids=lambda p: p.name)
def test_shipped_traces_read_without_pandas_as_with_it(path, monkeypatch):
    """A trace of plain numbers is read with the csv module (no pandas at start-up); every shipped
    trace gives the same arrays as pandas' reader."""
    import servesim.workload.traces as T
    assert T._plain_numbers(path, [c for c in ("arrived_at", "num_prefill_tokens", "num_decode_tokens")
                                   if c in T._header(path)]) is not None
    fast = read_trace(path)
    monkeypatch.setattr(T, "_plain_numbers", lambda *a: None)
    slow = read_trace(path)
    for key in ("arrival_s", "prompt", "output"):
        a, b = getattr(fast, key), getattr(slow, key)
        assert (a is None and b is None) or (a.dtype == b.dtype and np.array_equal(a, b)), key
    assert (fast.format, fast.dropped, len(fast)) == (slow.format, slow.dropped, len(slow))


@pytest.mark.parametrize("cell", ["", " 5", "1_000", "nan", "inf", "0x10", "5 ", "'5'", "1e"])
def test_trace_cells_that_are_not_plain_numbers_go_to_pandas(cell, tmp_path):
    import servesim.workload.traces as T
    p = tmp_path / "t.csv"
    p.write_text(f"arrived_at,num_prefill_tokens,num_decode_tokens\n0,5,5\n1,{cell},3\n")
    assert T._plain_numbers(p, ["arrived_at", "num_prefill_tokens", "num_decode_tokens"]) is None


def test_trace_missing_file():
    with pytest.raises(ConfigError, match="nope.csv"):
        read_trace(DATA / "nope.csv")


def test_large_trace_reads_quickly(tmp_path):
    import time
    n = 300_000
    r = rng()
    p = tmp_path / "big.csv"
    t = np.cumsum(r.exponential(0.1, n))
    with open(p, "w") as f:
        f.write("arrived_at,num_prefill_tokens,num_decode_tokens\n")
        np.savetxt(f, np.column_stack([t, r.integers(1, 4000, n), r.integers(1, 500, n)]),
                   fmt=["%.6f", "%d", "%d"], delimiter=",")
    t0 = time.perf_counter()
    tr = read_trace(p)
    assert len(tr) == n
    assert time.perf_counter() - t0 < 5.0


# ----------------------------------------------------------------------------- workloads

def test_shipped_workloads_listed():
    assert list_workloads() == ["chat", "code", "long-context", "sessions", "summarization"]


@pytest.mark.parametrize("name", ["chat", "code", "long-context", "sessions", "summarization"])
def test_every_shipped_workload_builds(name):
    spec = load_workload(name)
    assert spec.name == name and spec.default_rate > 0 and spec.source
    req = build_requests(spec, 1000, seed=0)
    assert isinstance(req, Requests)
    for a, dt in zip(req, (np.float64, np.int64, np.int64)):
        assert a.shape == (1000,) and a.dtype == dt
    assert req.prompt.min() >= 1 and req.output.min() >= 1
    first = np.isfinite(req.arrival)        # a session's later turns are sent when the turn before ends
    assert first.sum() > 0 and np.all(np.diff(req.arrival[first]) >= 0)
    # no shared prefix: every request carries group -1 and a shared length of 0
    assert req.prefix_group.dtype == np.int64 and np.all(req.prefix_group == -1)
    assert req.prefix_len.dtype == np.int64 and np.all(req.prefix_len == 0)


def test_chat_matches_its_trace():
    spec = load_workload("chat")
    assert spec.trace is not None and spec.trace.arrival_s is not None
    req = build_requests(spec, 20_000, seed=3)
    assert req.prompt.mean() == pytest.approx(spec.trace.prompt.mean(), rel=0.05)
    assert req.output.mean() == pytest.approx(spec.trace.output.mean(), rel=0.05)


def test_joint_sampling_keeps_rows():
    spec = load_workload(DATA / "splitwise_lengths_only.csv")
    req = build_requests(spec, 500, seed=1)
    pairs = set(zip(spec.trace.prompt.tolist(), spec.trace.output.tolist()))
    assert set(zip(req.prompt.tolist(), req.output.tolist())) <= pairs


def test_summarization_keeps_negative_correlation():
    # in the arXiv file long inputs come with short summaries (total <= 4096): joint rows keep that
    spec = load_workload("summarization")
    req = build_requests(spec, 20_000, seed=2)
    assert (req.prompt + req.output).max() <= 4096
    assert np.corrcoef(np.log(req.prompt), np.log(req.output))[0, 1] < -0.3


def test_determinism_and_independent_streams():
    spec = load_workload("chat")
    a = build_requests(spec, 2000, seed=42, rate=2.0)
    b = build_requests(spec, 2000, seed=42, rate=2.0)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    c = build_requests(spec, 2000, seed=42, rate=9.0, process="gamma", cv=3.0)
    np.testing.assert_array_equal(a.prompt, c.prompt)
    np.testing.assert_array_equal(a.output, c.output)
    assert not np.array_equal(a.arrival, c.arrival)
    d = build_requests(spec, 2000, seed=43, rate=2.0)
    assert not np.array_equal(a.prompt, d.prompt)
    lc = load_workload("long-context")
    e = build_requests(lc, 500, seed=5, isl=100)
    f = build_requests(lc, 500, seed=5)
    np.testing.assert_array_equal(e.output, f.output)  # overriding the prompt keeps the outputs
    assert np.all(e.prompt == 100)


def test_rate_offline_and_overrides():
    spec = load_workload("long-context")
    req = build_requests(spec, 5000, seed=0, rate=10.0)
    assert (req.arrival.size - 1) / req.arrival[-1] == pytest.approx(10.0, rel=0.05)
    off = build_requests(spec, 100, seed=0, offline=True, isl=256, osl=64)
    assert np.all(off.arrival == 0) and np.all(off.prompt == 256) and np.all(off.output == 64)
    with pytest.raises(ConfigError, match="--isl"):
        build_requests(spec, 10, seed=0, isl=0)
    with pytest.raises(ConfigError, match="--rate"):
        build_requests(spec, 10, seed=0, rate=-2.0)
    with pytest.raises(ConfigError, match="--num-requests"):
        build_requests(spec, 0, seed=0)


def test_max_len_truncates_prompt_first():
    spec = load_workload("long-context")
    req = build_requests(spec, 2000, seed=0, max_len=8192)
    assert np.all(req.prompt + req.output <= 8192)
    assert req.prompt.min() >= 1 and req.output.min() >= 1
    free = build_requests(spec, 2000, seed=0)
    np.testing.assert_array_equal(req.output, np.minimum(free.output, 8191))  # output kept
    tiny = build_requests(spec, 50, seed=0, isl=10, osl=50, max_len=20)
    assert np.all(tiny.prompt == 1) and np.all(tiny.output == 19)


def test_replay_uses_trace_times():
    spec = load_workload("code")
    req = build_requests(spec, 300, seed=0, trace_mode="replay", rate=123.0)
    np.testing.assert_array_equal(req.arrival, spec.trace.arrival_s[:300])
    np.testing.assert_array_equal(req.prompt, spec.trace.prompt[:300])
    np.testing.assert_array_equal(req.output, spec.trace.output[:300])


def test_scale_hits_target_rate():
    spec = load_workload(DATA / "azure_small.csv")
    req = build_requests(spec, 5, seed=0, trace_mode="scale", rate=2.0)
    assert (req.arrival.size - 1) / (req.arrival[-1] - req.arrival[0]) == pytest.approx(2.0)
    ratio = req.arrival[1:] / spec.trace.arrival_s[1:]
    np.testing.assert_allclose(ratio, ratio[0])  # shape of the gaps preserved
    big = build_requests(load_workload("chat"), 5000, seed=0, trace_mode="scale", rate=20.0)
    assert 4999 / big.arrival[-1] == pytest.approx(20.0)


def test_replay_errors():
    with pytest.raises(ConfigError, match="--num-requests <= 6"):
        build_requests(load_workload(DATA / "splitwise_small.csv"), 7, seed=0, trace_mode="replay")
    with pytest.raises(ConfigError, match="no arrival times"):
        build_requests(load_workload("summarization"), 10, seed=0, trace_mode="replay")
    with pytest.raises(ConfigError, match="has no trace"):
        build_requests(load_workload("long-context"), 10, seed=0, trace_mode="scale")
    with pytest.raises(ConfigError, match="--trace-mode"):
        build_requests(load_workload("chat"), 10, seed=0, trace_mode="shuffle")


def test_trace_csv_workload():
    spec = load_workload(DATA / "burstgpt_small.csv")
    assert spec.name == "burstgpt_small" and spec.trace.format == "burstgpt"
    assert spec.default_rate == pytest.approx(3 / 185.0)
    req = build_requests(spec, 4, seed=0, trace_mode="replay")
    np.testing.assert_array_equal(req.arrival, [0.0, 113.0, 138.0, 185.0])


def test_unknown_workload_message():
    with pytest.raises(ConfigError) as e:
        load_workload("x")
    assert str(e.value) == ("unknown workload 'x'; available: chat, code, long-context, sessions, summarization; "
                            "or pass a .toml or trace .csv path")


def _write(tmp_path, name, text):
    p = tmp_path / f"{name}.toml"
    p.write_text(text)
    return p


GOOD = '''name = "mine"
description = "d"
source = "s"
default_rate = 2.0
[prompt]
kind = "uniform"
low = 10
high = 20
[output]
kind = "empirical"
samples = [5, 6, 7]
'''


def test_custom_toml(tmp_path):
    spec = load_workload(_write(tmp_path, "mine", GOOD))
    assert spec.trace is None and spec.default_rate == 2.0
    req = build_requests(spec, 100, seed=0)
    assert req.prompt.min() >= 10 and req.prompt.max() <= 20
    assert set(req.output.tolist()) <= {5, 6, 7}


def test_custom_toml_with_local_trace(tmp_path):
    (tmp_path / "t.csv").write_text((DATA / "splitwise_small.csv").read_text())
    text = GOOD.replace('kind = "uniform"\nlow = 10\nhigh = 20', 'kind = "empirical"\ntrace = "t.csv"') \
               .replace('samples = [5, 6, 7]', 'trace = "t.csv"')
    spec = load_workload(_write(tmp_path, "mine", text))
    assert spec.trace is not None and len(spec.trace) == 6
    req = build_requests(spec, 6, seed=0, trace_mode="replay")
    np.testing.assert_allclose(req.arrival, [0.0, 0.052, 0.5, 0.5, 1.25, 2.0])


@pytest.mark.parametrize("old, new, words", [
    ('low = 10', 'lo = 10', ["mine.toml", "[prompt]", "'lo'"]),                 # unknown key
    ('high = 20\n', '', ["mine.toml:5", "missing key 'high'"]),                 # missing kind key
    ('default_rate = 2.0\n', '', ["mine.toml", "missing key 'default_rate'"]),  # missing top key
    ('source = "s"', 'source = "s"\ncolour = "red"', ["mine.toml:4", "'colour'"]),
    ('kind = "uniform"', 'kind = "pareto"', ["mine.toml:6", "'pareto'", "lognormal"]),
    ('name = "mine"', 'name = "theirs"', ["mine.toml:1", "name = 'mine'"]),
    ('default_rate = 2.0', 'default_rate = 0', ["mine.toml:4", "default_rate"]),
    ('high = 20', 'high = 5', ["mine.toml:5", "low <= high"]),
    ('samples = [5, 6, 7]', 'trace = "none.csv"', ["mine.toml:11", "'none.csv' not found"]),
    ('low = 10', 'low = = 10', ["mine.toml", "invalid TOML"]),
])
def test_toml_errors(tmp_path, old, new, words):
    assert old in GOOD
    with pytest.raises(ConfigError) as e:
        load_workload(_write(tmp_path, "mine", GOOD.replace(old, new)))
    msg = str(e.value)
    for w in words:
        assert w in msg, msg


def test_missing_toml_path():
    with pytest.raises(ConfigError, match="not found"):
        load_workload("/no/such/workload.toml")


def test_a_trace_rewritten_between_reads_is_read_again_and_reads_do_not_share_arrays(tmp_path):
    # the plain-number reader remembers a file per version: a changed file must not give the old rows,
    # and one caller's edits must not reach the next read
    p = tmp_path / "t.csv"
    p.write_text("num_prefill_tokens,num_decode_tokens\n10,5\n20,6\n")
    a = read_trace(p)
    a.prompt[0] = 999
    assert read_trace(p).prompt.tolist() == [10, 20]
    p.write_text("num_prefill_tokens,num_decode_tokens\n30,7\n40,8\n50,9\n")
    b = read_trace(p)
    assert b.prompt.tolist() == [30, 40, 50] and b.output.tolist() == [7, 8, 9]
