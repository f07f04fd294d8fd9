"""Every CLI command through click's CliRunner, including user errors (one line, exit 2)."""
import json

import pytest
from click.testing import CliRunner

from servesim import __version__
from servesim.cli import main
from clihelp import one_line_error


def run(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_version_and_help():
    assert __version__ in run("--version").output
    out = run("--help").output
    for cmd in ("simulate", "cost", "profiles"):
        assert cmd in out


def test_profiles_list_table_and_json():
    out = run("profiles", "list").output
    assert "h100-sxm" in out and "llama-3.1-405b" in out
    d = json.loads(run("profiles", "list", "--format", "json").output)
    assert {h["name"] for h in d["hardware"]} >= {"a100-sxm-40gb", "b200", "tpu-v5e"}
    assert any(m["name"] == "deepseek-v3" and 660 < m["params_b"] < 680 for m in d["models"])


def test_profiles_show():
    d = json.loads(run("profiles", "show", "h200-sxm", "--format", "json").output)
    assert d["hbm_bw"] == pytest.approx(4.8e12)
    d = json.loads(run("profiles", "show", "llama-3.1-8b", "--format", "json").output)
    assert d["num_layers"] == 32 and abs(d["param_count"] / 8.03e9 - 1) < 0.01
    assert "hbm_bw" in run("profiles", "show", "h100-sxm").output
    one_line_error("profiles", "show", "h900", must_contain=("h900", "h100-sxm"))


def test_cost_json_and_table():
    d = json.loads(run("cost", "--decode-seqs", "32", "--context", "2048", "--format", "json").output)
    assert set(d["parts_ms"]) == {"gemm", "attention", "elementwise", "communication", "overhead"}
    assert d["time_ms"] == pytest.approx(sum(d["parts_ms"].values()))
    assert d["bound"]["gemm"] == "memory"
    d = json.loads(run("cost", "--prefill-tokens", "8192", "--format", "json").output)
    assert d["bound"]["gemm"] == "compute"
    out = run("cost", "--model", "llama-3.1-70b", "--tp", "4", "--prefill-tokens", "4096", "--decode-seqs", "8").output
    assert "bottleneck" in out and "communication" in out


def test_cost_engine_profiles():
    # the same batch under two engines: vLLM replays a CUDA graph (one launch, the engine's fitted host
    # time), TensorRT-LLM enqueues its engine; both name the table they used
    v = json.loads(run("cost", "--decode-seqs", "8", "--format", "json").output)
    t = json.loads(run("cost", "--decode-seqs", "8", "--engine", "trtllm", "--format", "json").output)
    assert v["engine"] == "vllm" and t["engine"] == "trtllm"
    assert v["engine_fit"] == "fitted on h100-sxm" and t["engine_fit"].startswith("fitted on h100-sxm; end-to-end terms")
    h200 = json.loads(run("cost", "--decode-seqs", "8", "--hardware", "h200-sxm", "--format", "json").output)
    assert h200["engine_fit"].startswith("fitted on h200-sxm") and "carried over from h100-sxm" in h200["engine_fit"]
    mi = json.loads(run("cost", "--decode-seqs", "8", "--hardware", "mi300x", "--format", "json").output)
    assert "h100-sxm's fit" in mi["engine_fit"]
    one_line_error("cost", "--decode-seqs", "8", "--engine", "vllx", must_contain=("unknown engine 'vllx'",))


def test_cost_errors():
    one_line_error("cost", "--model", "llama-3.1-70b", "--decode-seqs", "1", must_contain=("needs", "GiB", "--tp 2"))
    one_line_error("cost", "--tp", "3", "--decode-seqs", "1", must_contain=("--tp 3",))
    one_line_error("cost", "--model", "gpt-9", "--decode-seqs", "1", must_contain=("unknown model 'gpt-9'",))
    one_line_error("cost", must_contain=("empty batch",))


def test_simulate_json_has_documented_keys():
    r = run("simulate", "--num-requests", "200", "--format", "json", "--slo", "ttft_p99=2s,tpot_p99=100ms")
    d = json.loads(r.output)
    for k in ("config", "num_requests", "num_completed", "saturated", "duration_s", "ttft_ms", "tpot_ms", "itl_ms",
              "e2e_ms", "queue_ms", "throughput", "cost", "utilization", "preemptions"):
        assert k in d
    for k in ("mean", "p50", "p90", "p95", "p99"):
        assert d["ttft_ms"][k] is not None
    assert set(d["throughput"]) >= {"requests_per_s", "input_tokens_per_s", "output_tokens_per_s",
                                    "output_tokens_per_s_per_gpu"}
    assert set(d["cost"]) >= {"usd_per_hour", "usd_per_million_input_tokens", "usd_per_million_output_tokens"}
    assert set(d["utilization"]) >= {"mean_batch_size", "kv_cache_mean", "kv_cache_max", "mfu", "mbu"}
    assert d["num_requests"] == 200 and d["slo"]["ttft_p99"]["target_ms"] == 2000


def test_simulate_table_and_output_dir(tmp_path):
    out = run("simulate", "--num-requests", "100", "-o", str(tmp_path / "o")).output
    assert "TTFT" in out and "throughput" in out
    for f in ("requests.csv", "summary.json", "latency_cdf.png", "batch_kv_timeline.png"):
        assert (tmp_path / "o" / f).is_file()


def test_simulate_user_errors():
    one_line_error("simulate", "--model", "nope", must_contain=("unknown model 'nope'",))
    one_line_error("simulate", "--hardware", "h900", must_contain=("unknown hardware 'h900'",))
    one_line_error("simulate", "--slo", "ttft=1s", must_contain=("--slo",))
    one_line_error("simulate", "--slo", "ttft_p99=fast", must_contain=("--slo", "fast"))
    one_line_error("simulate", "--rate", "-1", must_contain=("--rate",))
    one_line_error("simulate", "--workload", "nothing", must_contain=("unknown workload",))
    one_line_error("simulate", "--model", "llama-3.1-405b", must_contain=("needs", "GiB"))
    one_line_error("simulate", "--num-requests", "0", must_contain=("--num-requests",))
