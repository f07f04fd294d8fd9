"""`servesim sweep` and `servesim plan` through click's CliRunner, including user errors."""
import json

import pandas as pd
import pytest
from click.testing import CliRunner

from servesim.cli import main
from clihelp import stderr_error

SMALL = ["--num-requests", "200", "--workers", "1"]
SLO = "ttft_p99=1s,tpot_p99=60ms"


def run(*args):
    r = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return r


def test_help_lists_commands_with_examples():
    out = run("--help").output
    assert "sweep" in out and "plan" in out
    for cmd in ("sweep", "plan"):
        h = run(cmd, "--help").output
        assert "Examples:" in h and "--model" in h and "--workload" in h and "--isl" in h
        assert "--dask-scheduler" in h and "--price" in h


def test_sweep_writes_tidy_table_and_figures(tmp_path):
    r = run("sweep", "--rates", "2,8", "--grid", "tp=1,2", "--slo", SLO, *SMALL, "-o", str(tmp_path))
    assert "TTFT p99" in r.output and "knee" in r.output
    df = pd.read_csv(tmp_path / "sweep.csv")
    assert len(df) == 4 and {"tp", "rate", "ttft_ms_p99", "goodput_requests_per_s"} <= set(df.columns)
    try:
        import pyarrow  # noqa: F401
        has_parquet = True
    except ImportError:
        has_parquet = False
    assert (tmp_path / "sweep.parquet").exists() == has_parquet   # Parquet only when pyarrow is installed
    for fig in ("latency_vs_rate.png", "throughput_vs_rate.png", "cost_vs_rate.png"):
        assert (tmp_path / fig).stat().st_size > 0


def test_sweep_json_and_isl_osl():
    r = run("sweep", "--rates", "1:4:2", "--isl", "256", "--osl", "32", "--format", "json", *SMALL)
    d = json.loads(r.stdout)
    assert d["mode"] == "sweep" and [p["rate"] for p in d["points"]] == [1.0, 4.0]
    assert all(p["isl"] == 256 for p in d["points"]) and d["errors"] == []


def test_sweep_find_max_rate_with_price(tmp_path):
    r = run("sweep", "--find-max-rate", "--slo", SLO, "--price", "h100-sxm=2.0", "--format", "json", *SMALL,
            "-o", str(tmp_path))
    p = json.loads(r.stdout)["points"][0]
    assert p["max_rate"] > 0 and p["cost_usd_per_gpu_hour"] == 2.0 and p["cost_usd_per_million_output_tokens"] > 0
    assert (tmp_path / "max_rate.csv").exists() and (tmp_path / "max_rate.png").exists()


@pytest.mark.parametrize("args,words", [
    (["--rates", "8:2:3"], ["--rates", "empty"]),
    (["--rates", "-1,2"], ["--rates", "> 0"]),
    (["--rates", ""], ["--rates"]),
    (["--rates", "1", "--grid", "hardware=h100-sxm,tpu-v9"], ["tpu-v9", "h100-sxm"]),
    (["--rates", "1", "--slo", "ttft=1s"], ["--slo"]),
    (["--find-max-rate"], ["--slo"]),
    (["--rates", "1", "--price", "nope=1"], ["--price"]),
    (["--rates", "1", "--model", "llama-3.1-70b"], ["no feasible configuration"]),
])
def test_sweep_user_errors(args, words):
    stderr_error("sweep", *SMALL, *args, must_contain=words)


def test_sweep_partial_results_written_on_later_error(tmp_path):
    # a value every point could reject is refused before anything runs; one found only by running
    # the point (too few KV blocks for its longest request) is recorded, and the others are written
    stderr_error("sweep", "--rates", "2", "--grid", "gpu-memory-utilization=0.9,1.5", *SMALL, "-o", str(tmp_path),
               must_contain=["--gpu-memory-utilization", "(0, 1]"])
    assert not (tmp_path / "sweep.csv").exists()
    r = stderr_error("sweep", "--rates", "2", "--grid", "num-gpu-blocks=4000,2", *SMALL, "-o", str(tmp_path),
                   must_contain=["point 1", "--num-gpu-blocks 2", "1 completed points written"])
    df = pd.read_csv(tmp_path / "sweep.csv")
    assert list(df.status) == ["ok", "error"] and df.ttft_ms_p99.notna().iloc[0]
    assert "TTFT p99" in r.stdout


def test_plan_json_schema_and_outputs(tmp_path):
    r = run("plan", "--hardware", "h100-sxm,l40s", "--tp", "1,2", "--rate", "12", "--slo", SLO,
            "--num-requests", "300", "--workers", "1", "--format", "json", "-o", str(tmp_path))
    d = json.loads(r.stdout)
    b = d["best"]
    assert set(("hardware", "dtype", "tp", "pp", "replicas", "num_gpus", "usd_per_hour",
                "usd_per_million_output_tokens", "metrics")) <= set(b)
    assert b["checks"]["other_seed"]["meets_slo"]
    assert d["candidates"][0]["status"] == "meets_slo"
    assert (tmp_path / "pareto.png").exists() and (tmp_path / "candidates.csv").exists()
    t = run("plan", "--hardware", "h100-sxm", "--tp", "1", "--rate", "12", "--slo", SLO,
            "--num-requests", "300", "--workers", "1").output
    assert t.startswith("best:") and "h100-sxm" in t


def test_plan_nothing_meets_is_nonzero_with_reason():
    r = stderr_error("plan", "--hardware", "h100-sxm", "--tp", "1", "--rate", "12", "--slo", "tpot_p99=2ms",
                   "--num-requests", "200", "--workers", "1", must_contain=["no configuration meets", "tpot_p99"])
    assert "no plan" in r.stdout


@pytest.mark.parametrize("args,words", [
    (["--hardware", "nope", "--slo", SLO], ["--hardware", "nope"]),
    (["--slo", "ttft_p99=fast"], ["--slo"]),
    (["--tp", "1,x", "--slo", SLO], ["--tp"]),
    ([], ["--slo"]),
])
def test_plan_user_errors(args, words):
    stderr_error("plan", "--num-requests", "200", "--workers", "1", *args, must_contain=words)
