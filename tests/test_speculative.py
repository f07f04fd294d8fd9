"""Speculative decoding pricing (servesim/costmodel/speculative.py): the acceptance model against its
closed form, the step's parts by hand, monotonicity, and the one-line errors."""
import numpy as np
import pytest

from servesim.costmodel.fields import table
import servesim
from clihelp import one_line_error
from servesim.config import load_hardware, load_model
from servesim.config.engine import load_engine
from servesim.costmodel import Layout, build_replica
from servesim.costmodel import speculative as S
from servesim.costmodel.iteration import iteration_components
from servesim.errors import ConfigError, InfeasibleError


@pytest.mark.parametrize("a,k", [(0.5, 1), (0.7, 3), (0.9, 5), (0.3, 8)])
def test_expected_tokens_closed_form(a, k):
    assert S.expected_tokens(a, 1.0, k) == pytest.approx((1 - a ** (k + 1)) / (1 - a), rel=1e-12)


def test_expected_tokens_with_decay_by_hand():
    # a_1 = 0.8, a_2 = 0.4: 1 + 0.8 + 0.8 x 0.4
    assert S.expected_tokens(0.8, 0.5, 2) == pytest.approx(1 + 0.8 + 0.32, rel=1e-12)
    assert S.expected_tokens(1.0, 1.0, 4) == 5.0


def test_acceptance_length_inverts():
    spec = S.parse_speculative("mtp:k=2:acceptance_length=2.4")
    assert spec.expected_tokens == pytest.approx(2.4, abs=1e-9)
    a = spec.acceptance
    assert 1 + a + a * a == pytest.approx(2.4, abs=1e-9)


def test_mtp_default_is_deepseeks_measurement():
    assert S.parse_speculative("mtp:k=1").acceptance == 0.85


@pytest.mark.parametrize("text,phrase", [
    ("eagle:k=0:acceptance=0.5", "k=0 must be >= 1"),
    ("eagle:k=2:acceptance=0", "acceptance=0 must be in (0, 1]"),
    ("eagle:k=2:acceptance=1.2", "acceptance=1.2 must be in (0, 1]"),
    ("eagle:k=2", "needs acceptance=A"),
    ("medusa:k=2:acceptance=0.5", "unknown method 'medusa'"),
    ("eagle:acceptance=0.5", "give the draft length k=K"),
    ("eagle:k=2:acceptance=0.5:acceptance_length=2", "not both"),
    ("mtp:k=1:acceptance_length=2.5", "must be in (1, 2]"),
    ("draft:k=2:acceptance=0.5", "needs draft=MODEL"),
    ("eagle:k=2:acceptance=0.5:draft=llama-3.1-8b", "draft=MODEL is for the draft method"),
    ("eagle:k=x:acceptance=0.5", "k='x' is not an integer"),
    ("eagle:k=2:acceptance=0.5:delta=0", "delta=0 must be in (0, 1]"),
    ("eagle:k=2:foo=1", "'foo=1' is not one of"),
])
def test_parse_errors(text, phrase):
    with pytest.raises(ConfigError, match=None) as e:
        S.parse_speculative(text)
    assert phrase in str(e.value) and "--speculative" in str(e.value) and "\n" not in str(e.value)


def test_cli_bad_speculative_is_one_line():
    one_line_error("cost", "--decode-seqs", "1", "--speculative", "eagle:k=0:acceptance=0.5",
                   must_contain=("--speculative", "k=0"))
    one_line_error("cost", "--decode-seqs", "1", "--speculative", "eagle:k=2:acceptance=1.5",
                   must_contain=("acceptance=1.5",))


def test_draft_larger_than_target_is_refused():
    one_line_error("cost", "--model", "llama-3.1-8b", "--decode-seqs", "1", "--speculative",
                   "draft:k=2:acceptance=0.5:draft=llama-3.1-70b", must_contain=("not smaller than the target",))
    with pytest.raises(InfeasibleError):
        S.draft_model(S.parse_speculative("draft:k=2:acceptance=0.5:draft=llama-3.1-8b"), load_model("llama-3.1-8b"))


def _rc(model="llama-3.1-70b", tp=4):
    return build_replica(load_model(model), load_hardware("h100-sxm"), Layout(tp=tp), max_tokens=1024, max_seqs=256,
                         engine=load_engine("vllm"))


def test_step_parts_by_hand():
    rc = _rc()
    spec = S.parse_speculative("draft:k=3:acceptance=0.7:draft=llama-3.1-8b")
    d = S.lower_draft(rc, spec)
    out = S.price_step(rc, spec, 4, 1000, d)
    # verification: 4 chunks of K + 1 = 4 tokens after 1000 cached, all 16 positions sampled; vLLM runs a
    # draft model without async scheduling, so the host work does not overlap the step
    v = iteration_components(table(rc.params._replace(host_overlap=0.0)), 16.0, 4.0, 16.0, 4 * 4 * (1000 + 2.5),
                             4 * 1004.0, 0.0, 0.0).latency
    assert out["verify_s"] == v
    draft = 0.0
    for i in range(3):
        r = iteration_components(table(d.params), 0.0, 0.0, 4.0, 0.0, 0.0, 4.0, 4.0 * (1001 + i))
        draft += r.gemm + r.attention + r.elementwise + r.communication
    assert out["draft_s"] == pytest.approx(draft, rel=1e-12)
    assert out["expected_tokens"] == pytest.approx((1 - 0.7 ** 4) / 0.3)
    assert out["per_token_s"] == pytest.approx((draft + v) / out["expected_tokens"], rel=1e-12)
    plain = iteration_components(table(rc.params), 0.0, 0.0, 4.0, 0.0, 0.0, 4.0, 4000.0).latency
    assert out["plain_step_s"] == plain


def test_no_acceptance_never_beats_plain_decoding():
    rc = _rc()
    for spec in ("eagle:k=4:acceptance=0.000001", "draft:k=2:acceptance=0.000001:draft=llama-3.1-8b",
                 "ngram:k=3:acceptance=0.000001"):
        out = S.price_step(rc, S.parse_speculative(spec), 1, 2048)
        assert out["per_token_s"] >= out["plain_step_s"] * (1 - 1e-9), spec
        assert out["speedup"] <= 1.0 + 1e-9


def test_higher_acceptance_never_raises_time_per_token():
    rc = _rc()
    per = [S.price_step(rc, S.parse_speculative(f"eagle:k=4:acceptance={a}"), 8, 2048)["per_token_s"]
           for a in np.linspace(0.05, 1.0, 12)]
    assert all(b <= a for a, b in zip(per, per[1:]))


def test_speedup_shrinks_with_batch():
    rc = _rc(model="llama-3.1-8b", tp=1)
    spec = S.parse_speculative("eagle:k=3:acceptance=0.7")
    speedups = [S.price_step(rc, spec, n, 1024)["speedup"] for n in (1, 16, 64, 256)]
    assert speedups[0] > 1.0
    assert all(b < a for a, b in zip(speedups, speedups[1:]))


def test_mtp_drafts_with_one_moe_layer():
    m = load_model("deepseek-v3")
    d = S.draft_model(S.parse_speculative("mtp:k=1"), m)
    assert d.num_layers == 1 and d.num_moe_layers == 1 and d.mla is not None
    e = S.draft_model(S.parse_speculative("eagle:k=1:acceptance=0.5"), m)
    assert e.num_layers == 1 and e.moe is None


def test_cost_shows_the_speculative_step():
    r = servesim.cost(model="deepseek-v3", hardware="h200-sxm", dtype="fp8", tp=8, decode_seqs=4,
                      speculative="mtp:k=1:acceptance_length=1.8")
    sp = r.summary["speculative"]
    assert sp["expected_tokens"] == pytest.approx(1.8)
    assert sp["draft_ms"] > 0 and sp["verify_ms"] > sp["draft_ms"]
    assert sp["per_token_ms"] == pytest.approx((sp["draft_ms"] + sp["verify_ms"]) / 1.8)


def test_vllm_runs_the_host_between_steps_with_ngram_and_draft():
    # vLLM 0.15.1 keeps async scheduling only for EAGLE / MTP: with ngram (and a draft model) the host's step
    # work adds to the GPU's. Same verification aggregates, so the difference is the host time itself
    rc = _rc()
    fit = rc.engine.fit_for(rc.hw)
    assert rc.params.host_overlap == 1.0 and rc.engine.overlap_speculative == ("eagle", "mtp")
    eagle, ngram = S.parse_speculative("eagle:k=3:acceptance=0.5"), S.parse_speculative("ngram:k=3:acceptance=0.5")
    assert S.host_params(rc, eagle) is rc.params and S.host_params(rc, None) is rc.params
    assert S.host_params(rc, ngram).host_overlap == 0.0
    assert S.host_params(rc, S.parse_speculative("draft:k=2:acceptance=0.5:draft=llama-3.1-8b")).host_overlap == 0.0
    n = 8
    v_e = S.price_step(rc, eagle, n, 1024)["verify_s"]
    v_n = S.price_step(rc, ngram, n, 1024)["verify_s"]
    host = fit.host_step_s + fit.host_per_seq_s * n
    busy = iteration_components(table(rc.params), *S.verify_aggregates(float(n), 1024.0, 3))
    assert busy.latency - busy.overhead > host          # the GPU step hides the host work when overlapped
    assert v_n - v_e == pytest.approx(host, rel=1e-9)


def test_engines_without_the_list_keep_their_overlap(tmp_path):
    from pathlib import Path
    sg = build_replica(load_model("llama-3.1-8b"), load_hardware("h100-sxm"), Layout(tp=1), max_tokens=1024,
                       max_seqs=256, engine=load_engine("sglang"))
    assert sg.engine.overlap_speculative is None
    assert S.host_params(sg, S.parse_speculative("ngram:k=3:acceptance=0.5")) is sg.params
    src = (Path(__file__).resolve().parents[1] / "engines" / "vllm.toml").read_text()
    bad = tmp_path / "vllm.toml"
    bad.write_text(src.replace('overlap_speculative = ["eagle", "mtp"]', 'overlap_speculative = ["eagle", "medusa"]'))
    with pytest.raises(ConfigError, match="overlap_speculative.*medusa"):
        load_engine(str(bad))
