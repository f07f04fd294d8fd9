"""Speculative decoding in the simulator, the issue's checks against the cost model: TPOT at batch 1,
A -> 0, monotone in A and in load, determinism (kernel = reference: tests/test_reference_agreement.py).
The kernel runs behind the slow marker: speculative decoding compiles its own specialisation."""
from __future__ import annotations

import numpy as np
import pytest

from servesim.costmodel.fields import table
import servesim
from servesim.costmodel import speculative as S

def test_draws_follow_the_acceptance_model():
    spec = S.parse_speculative("eagle:k=3:acceptance=0.6:delta=0.9")
    y, start = S.spec_draws(spec, np.full(2000, 100), seed=3)
    assert y.min() >= 1 and y.max() <= 4 and start[1] == 100
    assert y.mean() == pytest.approx(spec.expected_tokens, rel=0.01)
    p = S.yields_distribution(spec)
    assert p.sum() == pytest.approx(1.0)
    assert p[0] == pytest.approx(1 - 0.6) and p[-1] == pytest.approx(0.6 * 0.54 * 0.486)
    y2, _ = S.spec_draws(spec, np.full(2000, 100), seed=3)
    assert np.array_equal(y, y2)


def _run(**kw):
    base = dict(model="llama-3.1-8b", num_requests=24, isl=1000, osl=1000, concurrency=1, seed=0)
    return servesim.simulate(**{**base, **kw}).summary


def _lone(text="eagle:k=3:acceptance=0.7"):
    """A lone request's run (_run) with ``text``, the lowered replica, and the cost model's speculative
    step at its mean context (1000 -> 2000: 1500)."""
    from servesim.api import replica_of, resolve
    cfg, model, hw, _ = resolve(servesim.SimConfig(model="llama-3.1-8b"))
    rc = replica_of(cfg, model, hw)
    return _run(speculative=text), rc, S.price_step(rc, S.parse_speculative(text), 1, 1500)


@pytest.mark.slow
def test_batch_one_tpot_is_step_time_over_expected_tokens():
    s, _, step = _lone()
    assert s["speculative"]["mean_accepted_per_step"] + 1 == pytest.approx(step["expected_tokens"], rel=0.02)
    # every step of a lone request drafts and verifies; its context runs 1000 -> 2000 (mean 1500)
    assert s["tpot_ms"]["mean"] == pytest.approx(step["step_s"] / step["expected_tokens"] * 1e3, rel=0.01)


@pytest.mark.slow
def test_time_shares_of_a_lone_request():
    # a lone request's busy time is its 1000-token prefill and ~999 / E speculative steps, each the draft
    # (draft_s) then the verification (verify_s): the shares follow from the cost model's step by hand
    from servesim.costmodel.iteration import iteration_components
    from servesim.render import summary_table
    s, rc, step = _lone()
    prefill = iteration_components(table(rc.params), 1000.0, 1.0, 1.0, 1000 * 1001 / 2, 1000.0, 0.0, 0.0).latency
    decode = 999 / step["expected_tokens"] * step["step_s"]
    sp = s["speculative"]
    assert sp["draft_time_share"] / sp["verify_time_share"] == pytest.approx(step["draft_s"] / step["verify_s"], rel=0.02)
    assert sp["draft_time_share"] + sp["verify_time_share"] == pytest.approx(decode / (decode + prefill), abs=0.005)
    assert "drafting" in summary_table(s) and "ngram" not in summary_table(s)
    assert _run(speculative="ngram:k=3:acceptance=0.7")["speculative"]["draft_time_share"] == 0.0


@pytest.mark.slow
def test_no_acceptance_never_beats_plain_decoding():
    plain = _run()["tpot_ms"]["mean"]
    for text in ("eagle:k=3:acceptance=0.000001", "ngram:k=2:acceptance=0.000001"):
        assert _run(speculative=text)["tpot_ms"]["mean"] >= plain * (1 - 1e-9), text


@pytest.mark.slow
def test_higher_acceptance_never_raises_tpot():
    tpot = [_run(speculative=f"eagle:k=3:acceptance={a}")["tpot_ms"]["mean"] for a in (0.2, 0.5, 0.8, 1.0)]
    assert all(b <= a for a, b in zip(tpot, tpot[1:])), tpot


@pytest.mark.slow
def test_speedup_shrinks_under_load():
    base = dict(model="llama-3.1-8b", num_requests=600, workload="chat", seed=1)
    speedups = []
    for rate in (1.0, 8.0, 20.0):
        plain = servesim.simulate(**base, rate=rate).summary["tpot_ms"]["mean"]
        spec = servesim.simulate(**base, rate=rate, speculative="eagle:k=3:acceptance=0.7").summary["tpot_ms"]["mean"]
        speedups.append(plain / spec)
    assert speedups[0] > 1.0
    assert all(b < a for a, b in zip(speedups, speedups[1:])), speedups


@pytest.mark.slow
def test_deterministic_for_a_seed():
    a = servesim.simulate(num_requests=100, rate=4, seed=3, speculative="eagle:k=3:acceptance=0.6")
    b = servesim.simulate(num_requests=100, rate=4, seed=3, speculative="eagle:k=3:acceptance=0.6")
    c = servesim.simulate(num_requests=100, rate=4, seed=4, speculative="eagle:k=3:acceptance=0.6")
    assert a.summary == b.summary
    assert a.requests.equals(b.requests)
    assert not a.requests["finish_s"].equals(c.requests["finish_s"])


def test_static_scheduler_refuses_speculation():
    from clihelp import one_line_error
    one_line_error("simulate", "--scheduler", "static", "--speculative", "mtp:k=1", "--num-requests", "10",
                   must_contain=("--scheduler static",))


@pytest.mark.parametrize("args,phrase", [
    (["--speculative", "eagle:k=0:acceptance=0.5"], "k=0 must be >= 1"),
    (["--speculative", "eagle:k=2:acceptance=0"], "acceptance=0 must be in (0, 1]"),
    (["--speculative", "eagle:k=2:acceptance=1.01"], "acceptance=1.01 must be in (0, 1]"),
    (["--speculative", "mtp:k=2:acceptance_length=1"], "acceptance_length=1 must be in (1, 3]"),
    (["--speculative", "mtp:k=2:acceptance_length=3.2"], "acceptance_length=3.2 must be in (1, 3]"),
    (["--speculative", "draft:k=2:acceptance=0.5:draft=llama-3.1-70b"], "not smaller than the target"),
    (["--model", "deepseek-v3", "--dtype", "fp8", "--hardware", "h200-sxm", "--tp", "8", "--ep", "6"],
     "--ep 6 does not divide the 256 experts"),
])
def test_simulate_bad_input_is_one_line(args, phrase):
    # the bad inputs through `simulate`: one line naming the option, exit 2, no traceback
    from clihelp import one_line_error
    one_line_error("simulate", *args, "--num-requests", "4", must_contain=(phrase,))
