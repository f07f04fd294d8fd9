"""The shipped profiles keep reproducing published TensorRT-LLM results (a deterministic sample)."""
import numpy as np
import pytest

from servesim.calibrate.serving import load_published, predict, setup_of
from servesim.errors import ConfigError


@pytest.fixture(scope="module")
def sample():
    df = load_published()
    held = df[df.load_kind != "static_batch"]
    # every 8th held-out row (rows are grouped by setup, so this spans models, GPUs and lengths)
    return predict(held.iloc[::8]), predict(df[df.load_kind == "static_batch"])


def test_held_out_rows_within_tolerance(sample):
    held, _ = sample
    err = held.rel_error.abs().dropna()
    assert len(err) >= 30
    assert np.median(err) < 0.15          # the serving issue's accuracy target
    assert held.predicted.notna().mean() > 0.9


def test_fitted_static_rows_fit(sample):
    _, static = sample
    assert np.median(static.rel_error.abs()) < 0.10


def test_setup_mapping():
    df = load_published()
    row = df[(df.load_kind == "static_batch") & (df.metric == "ttft_ms")].iloc[0]
    opts = setup_of(row)
    assert opts["scheduler"] == "static" and opts["osl"] == 1 and opts["engine"] == "trtllm"
    row = df[df.load_kind == "offline_max_throughput"].iloc[0]
    assert setup_of(row)["offline"] is True


def test_in_process_benchmarks_run_without_the_frontend():
    """A batch-1 static TTFT row (gptSessionBenchmark, no HTTP server) is the profile's TTFT less
    exactly its frontend time; a Triton row (request_rate) keeps it."""
    from servesim.api import SimConfig, simulate
    from servesim.calibrate.serving import harness_fit
    from servesim.config import load_hardware
    from servesim.config.engine import load_engine

    df = load_published()
    row = df[(df.load_kind == "static_batch") & (df.metric == "ttft_ms")].iloc[:1]
    fit = load_engine("trtllm").fit_for(load_hardware(setup_of(row.iloc[0])["hardware"]))
    assert fit.frontend_s > 0
    with_frontend = simulate(SimConfig(**setup_of(row.iloc[0]))).summary["ttft_ms"]["mean"]
    assert predict(row).predicted.iloc[0] == pytest.approx(with_frontend - 1e3 * fit.frontend_s, rel=1e-9)
    assert harness_fit(df[df.load_kind == "request_rate"].iloc[0]) == {}
    assert harness_fit(df[df.load_kind == "offline_max_throughput"].iloc[0]) == {"frontend_s": 0.0}


def test_bad_published_file(tmp_path):
    p = tmp_path / "bad.csv"
    p.write_text("model,hardware\nLlama-2-7B,H100\n")
    with pytest.raises(ConfigError, match="missing columns"):
        load_published(p)
