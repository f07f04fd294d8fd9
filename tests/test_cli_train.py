"""CliRunner tests for `servesim train` and `servesim compare`."""
import json

import pytest
from click.testing import CliRunner

from servesim.cli import main


def run(*args):
    return CliRunner().invoke(main, list(args))


def test_train_table():
    r = run("train", "--model", "llama-3.1-70b", "--gpus", "64", "--tp", "4", "--pp", "4", "--cp", "2",
            "--vp", "5", "--sp", "--seq-len", "8192", "--global-batch", "128")
    assert r.exit_code == 0, r.output
    for word in ("step time", "tokens/s/GPU", "MFU", "HFU", "bottleneck", "pp_bubble", "memory per GPU"):
        assert word in r.output


def test_train_json_keys():
    r = run("train", "--gpus", "8", "--global-batch", "64", "--format", "json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    for key in ("step_time_s", "tokens_per_s", "tokens_per_s_per_gpu", "mfu", "hfu", "memory_gib_per_gpu",
                "breakdown_s"):
        assert key in d
    assert set(d["memory_gib_per_gpu"]) >= {"parts", "total"}
    assert d["tokens_per_s"] == pytest.approx(d["tokens_per_s_per_gpu"] * 8)


@pytest.mark.parametrize("args,option", [
    (["--tp", "3"], "--tp 3"),
    (["--pp", "5", "--gpus", "5"], "--pp 5"),
    (["--gpus", "8", "--dp", "4"], "--gpus 8"),
    (["--gpus", "12", "--tp", "8"], "--gpus 12"),
    (["--model", "llama-3.1-70b", "--gpus", "8"], "GiB per GPU"),
    (["--zero", "4"], "--zero"),
    (["--gpus", "8,x"], "--gpus"),
])
def test_train_errors_are_one_line(args, option):
    r = run("train", *args)
    assert r.exit_code == 2
    assert "Traceback" not in r.output
    assert option in r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("servesim: error: ")


def test_train_bad_choice_is_a_usage_error():
    r = run("train", "--recompute", "some")
    assert r.exit_code == 2 and "Traceback" not in r.output and "--recompute" in r.output


def test_train_search_json():
    r = run("train", "--model", "llama-3.1-8b", "--gpus", "16", "--search", "--top", "3", "--global-batch", "64",
            "--format", "json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    times = [a["step_time_s"] for a in d["alternatives"]]
    assert times == sorted(times) and len(times) <= 3
    assert d["best"]["step_time_s"] == pytest.approx(times[0])


def test_train_scaling_writes_figure(tmp_path):
    r = run("train", "--gpus", "8,16,32", "--global-batch", "32", "--tp", "2", "--sp", "-o", str(tmp_path))
    assert r.exit_code == 0, r.output
    assert "scaling_efficiency" in r.output
    assert (tmp_path / "scaling.png").stat().st_size > 0
    assert (tmp_path / "scaling.csv").is_file()


@pytest.mark.slow   # ~2-3 s: kept out of the default run for time (CI runs it)
def test_compare_json(tmp_path):
    r = run("compare", "--model", "llama-3.1-8b", "--hardware", "h100-sxm,a100-sxm-80gb", "--gpus", "64",
            "--global-batch", "128", "--train-tokens", "1e12", "--rate", "2", "--num-requests", "100",
            "--format", "json", "-o", str(tmp_path))
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert [row["hardware"] for row in d["rows"]] == ["h100-sxm", "a100-sxm-80gb"]
    for row in d["rows"]:
        assert row["train_usd"] > 0 and row["serve_usd_per_m_output"] > 0
        assert row["break_even_output_tokens"] == pytest.approx(row["train_usd"] / row["serve_usd_per_m_output"] * 1e6)
    assert (tmp_path / "compare.png").stat().st_size > 0


def test_help_has_examples():
    for cmd in ("train", "compare"):
        r = run(cmd, "--help")
        assert r.exit_code == 0 and "Examples" in r.output


def test_train_uneven_stages_and_framework():
    r = run("train", "--model", "llama-3.1-405b", "--gpus", "512", "--tp", "8", "--pp", "8", "--vp", "8", "--cp", "2",
            "--sp", "--tp-overlap", "--account-for-embedding", "--account-for-loss", "--seq-len", "8192",
            "--global-batch", "256", "--recompute", "auto", "--framework", "nemo", "--format", "json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["framework"] == "nemo" and d["layout"]["account_for_embedding"]
    assert d["layers_per_rank"][0] == 15 and sum(d["layers_per_rank"]) == 126
    assert d["mfu_peak"] == "bf16" and d["mfu_fp8_peak"] is None
    assert d["memory_gib_per_gpu"]["total"] <= d["memory_gib_per_gpu"]["device"]


def test_train_fp8_blackwell_table_says_extrapolation():
    r = run("train", "--model", "llama-3.1-70b", "--hardware", "gb200-nvl72", "--gpus", "64", "--zero", "3",
            "--micro-batch", "2", "--seq-len", "8192", "--global-batch", "128", "--recompute", "auto",
            "--dtype", "fp8", "--offload-activations", "2")
    assert r.exit_code == 0, r.output
    for word in ("MFU (bf16 peak)", "MFU (fp8 peak)", "extrapolation", "mxfp8", "[auto]", "activations (host)"):
        assert word in r.output, word


@pytest.mark.parametrize("args,needle", [
    (["--model", "llama-3.1-70b", "--gpus", "32", "--tp", "8", "--pp", "4", "--first-stage-layers", "100"],
     "larger than the model"),
    (["--gpus", "8", "--cp", "8", "--seq-len", "8196"], "does not divide the sequence"),
    (["--gpus", "8", "--cp", "8", "--cp-comm", "a2a", "--seq-len", "65536", "--zero", "3", "--global-batch", "8"],
     None),
    (["--gpus", "3", "--cp", "3", "--cp-comm", "a2a", "--seq-len", "6144", "--global-batch", "3"], "--cp-comm a2a"),
    (["--recompute-layers", "2"], "--recompute-layers"),
    (["--recompute", "selective", "--recompute-modules", "attn"], "--recompute-modules"),
    (["--framework", "jax"], "--framework jax"),
    (["--offload-activations", "some"], "--offload-activations"),
])
def test_train_new_option_errors_are_one_line(args, needle):
    """Bad values of the new options: one line naming the option, exit 2 (a good a2a layout runs)."""
    r = run("train", *args)
    if needle is None:
        assert r.exit_code == 0, r.output
        return
    assert r.exit_code == 2, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("servesim: error: ") and needle in lines[0]
