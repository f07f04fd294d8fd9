"""The smaller things a user sees (issue #25, point 7), each as it was reported."""
from __future__ import annotations

import pandas as pd
import pytest
from click.testing import CliRunner

import servesim
from clihelp import one_line_error
from servesim.cli import main
from servesim.config import load_model

SMALL = ["--num-requests", "200", "--isl", "256", "--osl", "64", "--workers", "1"]


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_plan_prints_one_headroom_and_checks_as_findings():
    """'SLO headroom 88%' beside 'a capacity headroom of 91%'; 'checks: ...; 1 replicas meets: False'."""
    r = run("plan", "--hardware", "h100-sxm", "--tp", "1", "--rate", "20", "--slo", "ttft_p99=1s,tpot_p99=12ms",
            *SMALL)
    assert r.exit_code == 0, r.output
    head = r.output.split("searched")[0]
    assert head.count("headroom") == 1 and "capacity headroom of" in head and "SLO slack" in head
    checks = next(ln for ln in head.splitlines() if "checks:" in ln)
    assert "meets: False" not in checks and "replicas meets" not in checks
    assert "seed 1 meets every SLO" in checks


def test_checks_text_names_replicas_in_words():
    from servesim.cli.plan import _checks_text
    text = _checks_text({"other_seed": {"seed": 1, "meets_slo": True, "reasons": []},
                         "one_replica_fewer": {"replicas": 1, "meets_slo": False, "reasons": ["x"]}})
    assert text == "checks: seed 1 meets every SLO; one replica fewer (1 replica) misses it"
    pd_ = _checks_text({"other_seed": {"seed": 1, "meets_slo": False, "reasons": []},
                        "one_decode_replica_fewer": {"replicas": [2, 1], "meets_slo": True, "reasons": []}})
    assert pd_ == "checks: seed 1 MISSES the SLO; one decode replica fewer (2:1 prefill:decode) MEETS it too"


def _candidates() -> pd.DataFrame:
    rows = []
    for hw, dtype, tp, reps, usd, ttft in (("h100-sxm", "bf16", 1, 2, 8.5, 80.0), ("h100-sxm", "fp8", 1, 1, 4.25, 95.0),
                                           ("a100-sxm-80gb", "bf16", 2, 1, 4.4, 120.0)):
        rows.append({"status": "meets_slo", "hardware": hw, "dtype": dtype, "tp": tp, "pp": 1, "replicas": float(reps),
                     "usd_per_hour": usd, "ttft_ms_p99": ttft, "output_tokens_per_s_per_gpu": 1000.0 / usd,
                     "usd_per_million_output_tokens": usd / 3.6})
    rows.append({"status": "pruned", "hardware": "l4", "dtype": "bf16", "tp": 1, "pp": 1, "replicas": None})
    return pd.DataFrame(rows)


def test_pareto_axes_label_units_whole_replicas_dtype_markers_slo_and_choice():
    """'TTFT MS P99', replicas 1.0 / 2.0, fp8 and bf16 alike, no SLO line, the chosen point unmarked."""
    from servesim.planning.figures import pareto_axes
    best = {"hardware": "h100-sxm", "dtype": "fp8", "tp": 1, "replicas": 1, "usd_per_hour": 4.25,
            "metrics": {"ttft_ms": {"p99": 95.0}}}
    fig = pareto_axes(_candidates(), slo={"ttft_p99": 0.2}, best=best)
    ax = fig.axes[0]
    assert ax.get_xlabel() == "TTFT p99 (ms)"
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert {"1", "2"} <= set(labels) and "1.0" not in labels and "2.0" not in labels
    assert {"bf16", "fp8"} <= set(labels)
    assert any("SLO" in t and "200 ms" in t for t in labels) and "chosen" in labels
    assert any(list(line.get_xdata()) == [200.0, 200.0] for line in ax.get_lines())    # the target line
    import matplotlib.pyplot as plt
    plt.close(fig)


def test_parity_panels_never_mix_units():
    """parity.png put ms, tok/s and req/s on one axis."""
    from servesim.calibrate.validate import SuiteResult, parity_panels, unit_of
    assert [unit_of(m) for m in ("ttft_ms_mean", "itl_ms_mean", "e2e_p99", "achieved_request_throughput",
                                 "total_output_tokens_per_s", "tokens_per_s_per_gpu (nemo)")] == \
        ["ms", "ms", "ms", "req/s", "tok/s", "tok/s"]
    rows = pd.DataFrame({"suite": "serving", "gpu": "h100-sxm", "label": "",
                         "metric": ["ttft_ms_mean", "achieved_request_throughput", "total_output_tokens_per_s"] * 2,
                         "measured": [50.0, 4.0, 900.0] * 2, "predicted": [55.0, 4.1, 950.0] * 2, "rel_error": 0.05})
    res = SuiteResult(name="serving", kind="serving", rows=rows, tolerance=0.15)
    panels = parity_panels([res])
    assert [u for _, u, _ in panels] == ["ms", "req/s", "tok/s"]
    assert all(p["metric"].map(unit_of).nunique() == 1 for _, _, p in panels)


def test_offload_all_is_named_all():
    """`--offload-activations all` printed 'offload=1000000 layers/chunk'."""
    r = run("train", "--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--gpus", "8", "--offload-activations", "all")
    assert r.exit_code == 0, r.output
    first = r.output.splitlines()[0]
    assert "offload=all layers" in first and "1000000" not in first and str(1 << 30) not in first


def test_slo_without_a_unit_is_refused():
    """`--slo ttft_p99=1` silently meant 1 s."""
    one_line_error("simulate", "--slo", "ttft_p99=1", must_contain=("ttft_p99=1", "no unit", "1ms", "1s"))
    with pytest.raises(servesim.errors.ConfigError, match="no unit"):
        servesim.simulate(slo="ttft_p99=500", num_requests=10)


@pytest.mark.parametrize("option,value,close", [("--hardware", "h100", "'h100-sxm'"), ("--model", "llama-3-8b",
                                                "'llama-3.1-8b'"), ("--engine", "vlm", "'vllm'")])
def test_unknown_names_get_a_did_you_mean(option, value, close):
    line = one_line_error("simulate", option, value, must_contain=("did you mean", close))
    if option == "--hardware":
        assert line.index("'h100-sxm'") < line.index("'h100-pcie'")     # the closest first


def test_hfu_counts_causal_attention_as_computed():
    """HFU counted causal attention as non-causal (91% at 256K)."""
    m = load_model("llama-3.1-8b")
    s = 8192
    r = servesim.train("llama-3.1-8b", "h100-sxm", gpus=8, tp=2, seq_len=s, recompute="none", global_batch=64).summary
    n = m.num_layers * (m.attn_params_per_layer() + m.dense_mlp_params()) + m.vocab_size * m.hidden_size
    lsd = m.num_layers * s * m.num_attention_heads * m.head_dim
    # MFU: 6N + 12 L s d (non-causal convention); HFU without recompute: 6N + 6 L s d (the half computed)
    assert r["hfu"] / r["mfu"] == pytest.approx((6 * n + 6 * lsd) / (6 * n + 12 * lsd), rel=1e-3)
    long = servesim.train("llama-3.1-8b", "h100-sxm", gpus=16, cp=16, seq_len=262144, global_batch=16,
                          recompute="full").summary
    assert long["hfu"] < long["mfu"] < 1.0 and long["hfu"] < 0.8


def test_search_leaves_memory_headroom():
    """`train --search` picked layouts at 99% of memory."""
    from servesim.training.search import SEARCH_MEMORY_FRACTION
    r = servesim.train("llama-3.1-70b", "h100-sxm", gpus=64, search=True, global_batch=512, top=5)
    device = load_device_gib("h100-sxm")
    assert (r.table["memory_gib"] <= SEARCH_MEMORY_FRACTION * device + 1e-9).all()
    assert SEARCH_MEMORY_FRACTION <= 0.95


def load_device_gib(name: str) -> float:
    from servesim.config import load_hardware
    return load_hardware(name).device_bytes / 2**30


def test_report_quotes_each_calibrated_table_once():
    """The report printed the H100 error table again under H200."""
    from servesim.report.build import validation_md
    from servesim.report.validation import profile_status
    md = "\n".join(validation_md([profile_status(h) for h in ("h200-sxm", "h100-sxm")]))
    assert md.count("Errors of `h100-sxm`") == 1
    assert md.index("### h100-sxm") < md.index("### h200-sxm")
    h200 = md[md.index("### h200-sxm"):]
    assert "those of `h100-sxm`, above" in h200 and "| check" not in h200
