"""Issue #16, "validate once, up front": every bad option of every command, and every bad keyword of
the Python API, is refused before any work with one line naming the option, the bad value and what
would work (exit 2, no traceback); options that do nothing in a combination are a one-line warning."""
from __future__ import annotations

import warnings
from pathlib import Path

import pytest
from click.testing import CliRunner

import servesim
from servesim.cli import main
from servesim.errors import ConfigError, ServesimError, ServesimWarning
from clihelp import one_line_error

REPO = Path(__file__).resolve().parent.parent
SLO = "ttft_p99=1s,tpot_p99=60ms"


SIMULATE = [
    (["--rate", "nan"], ["--rate nan", "finite"]),
    (["--rate", "inf"], ["--rate inf", "finite", "--offline"]),          # what the nan message used to advise
    (["--rate", "-1"], ["--rate -1", "> 0"]),
    (["--rate", "0"], ["--rate 0", "> 0"]),
    (["--price", "nan"], ["--price nan"]),
    (["--price", "inf"], ["--price inf"]),
    (["--price", "-2"], ["--price -2", ">= 0"]),
    (["--num-requests", "99999999999999999999999"], ["--num-requests 99999999999999999999999", "at most"]),
    (["--num-requests", "0"], ["--num-requests 0", ">= 1"]),
    (["--isl", "1000", "--osl", "200000"], ["--isl 1,000", "--osl 200,000", "131,072", "llama-3.1-8b"]),
    (["--isl", "131072", "--osl", "1"], ["--isl 131,072", "131,072"]),
    (["--osl", "131072"], ["--osl 131,072", "1 prompt token"]),
    (["--isl", "131072"], ["--isl 131,072", "1 output token"]),
    (["--num-system-prompts", "2", "--system-prompt-len", "131072"], ["--system-prompt-len 131,072"]),
    (["--offline", "--rate", "5"], ["--offline and --rate 5 contradict"]),
    (["--concurrency", "4", "--offline"], ["--offline and --concurrency 4 contradict"]),
    (["--concurrency", "4", "--arrival", "gamma", "--cv", "3"], ["--concurrency 4 and --arrival gamma contradict"]),
    (["--concurrency", "4", "--rate", "2"], ["--concurrency 4 and --rate 2 contradict"]),
    (["--concurrency", "-3"], ["--concurrency -3", ">= 1", "open loop"]),
    (["--concurrency", "0"], ["--concurrency 0", ">= 1", "open loop"]),
    (["--offline", "--trace-mode", "replay"], ["--offline and --trace-mode replay contradict"]),
    (["--trace-mode", "replay", "--rate", "3"], ["--trace-mode replay and --rate 3", "--trace-mode scale"]),
    (["--trace-mode", "scale", "--arrival", "gamma"], ["--trace-mode scale and --arrival gamma"]),
    (["--gpu-memory-utilization", "0"], ["--gpu-memory-utilization 0", "(0, 1]"]),
    (["--gpu-memory-utilization", "1.5"], ["--gpu-memory-utilization 1.5", "(0, 1]"]),
    (["--gpu-memory-utilization", "nan"], ["--gpu-memory-utilization nan"]),
    (["--max-num-seqs", "0"], ["--max-num-seqs 0"]),
    (["--block-size", "0"], ["--block-size 0"]),
    (["--max-num-batched-tokens", "0"], ["--max-num-batched-tokens 0"]),
    (["--chunk-size", "0"], ["--chunk-size 0"]),
    (["--num-gpu-blocks", "0"], ["--num-gpu-blocks 0"]),
    (["--duration", "0s"], ["--duration 0", "> 0"]),
    (["--duration", ""], ["--duration", "''"]),
    (["--warmup", "10s", "--duration", "5s"], ["--warmup 10s", "--duration 5s"]),
    (["--tp", "0"], ["--tp 0"]),
    (["--tp", "x"], ["--tp", "'x'"]),                                     # click's own parse error, one line
    (["--replicas", "0"], ["--replicas 0"]),
    (["--seed", "-1"], ["--seed -1"]),
    (["--cv", "0"], ["--cv 0"]),
    (["--arrival", "gamma", "--cv", "nan"], ["--cv nan"]),
    (["--iteration-overhead-us", "inf"], ["--iteration-overhead-us inf"]),
    (["--isl", "0"], ["--isl 0"]),
    (["--slo", "ttft_p99=0ms"], ["--slo", "ttft_p99", "> 0"]),
    (["--slo", ""], ["--slo", "empty"]),
    (["--dtype", "fp3"], ["--dtype 'fp3'", "fp8"]),
    (["-o", ""], ["-o", "empty path"]),
]


@pytest.mark.parametrize("args, words", SIMULATE, ids=[" ".join(a) or "empty" for a, _ in SIMULATE])
def test_simulate_bad_options(args, words):
    small = [] if "--num-requests" in args else ["--num-requests", "20"]   # should a check be missed
    one_line_error("simulate", *small, *args, must_contain=words)


OTHERS = [
    # sweep
    (["sweep", "--rates", "1", "--price", "nan"], ["--price", "finite"]),
    (["sweep", "--rates", "1", "--price", "h100-sxm=inf"], ["--price", "finite"]),
    (["sweep", "--rates", "1", "--margin", "nan"], ["--margin nan"]),
    (["sweep", "--find-max-rate", "--slo", SLO, "--tolerance", "2"], ["--tolerance 2", "(0, 1)"]),
    (["sweep", "--rates", "1", "--workers", "0"], ["--workers 0"]),
    (["sweep", "--rates", "1", "--rate", "inf"], ["--rate inf"]),
    (["sweep", "--rates", "1", "--grid", "max-num-seqs=0,8"], ["max-num-seqs", "0"]),
    (["sweep", "--rates", "1", "--grid", "isl=1000", "--osl", "200000"], ["--osl 200,000", "131,072"]),
    (["sweep", "--rates", "1", "--concurrency", "0"], ["--concurrency 0"]),
    # plan
    (["plan", "--slo", SLO, "--rate", "inf"], ["--rate inf"]),
    (["plan", "--slo", SLO, "--rate", "nan"], ["--rate nan"]),
    (["plan", "--slo", SLO, "--budget", "nan"], ["--budget nan"]),
    (["plan", "--slo", SLO, "--budget", "-5"], ["--budget -5"]),
    (["plan", "--slo", SLO, "--margin", "1"], ["--margin 1", "[0, 1)"]),
    (["plan", "--slo", SLO, "--top", "0"], ["--top 0"]),
    (["plan", "--slo", SLO, "--max-gpus", "0"], ["--max-gpus 0"]),
    (["plan", "--slo", SLO, "--dtype", "fp3"], ["--dtype 'fp3'"]),
    (["plan", "--slo", SLO, "--hardware", ","], ["--hardware", "empty"]),
    (["plan", "--slo", SLO, "--daily-rates", "2,nan"], ["--daily-rates"]),
    (["plan", "--slo", SLO, "--max-num-seqs", "0"], ["--max-num-seqs"]),
    # cost
    (["cost", "--decode-seqs", "100000000000000000000"], ["--decode-seqs", "at most"]),
    (["cost", "--decode-seqs", "1e20"], ["--decode-seqs", "1e20"]),
    (["cost", "--prefill-tokens", "-1"], ["--prefill-tokens -1"]),
    (["cost", "--decode-seqs", "1", "--context", "200000"], ["--context 200,000", "131,072"]),
    (["cost", "--prefill-tokens", "200000"], ["131,072", "--prefill-seqs"]),
    (["cost", "--decode-seqs", "1", "--tp", "0"], ["--tp 0"]),
    (["cost", "--decode-seqs", "1", "--max-num-seqs", "0"], ["--max-num-seqs 0"]),
    # train
    (["train", "--vp", "0"], ["--vp 0"]),
    (["train", "--cp", "0"], ["--cp 0"]),
    (["train", "--search", "--top", "0"], ["--top 0"]),
    (["train", "--tp", "0"], ["--tp 0"]),
    (["train", "--zero", "7"], ["--zero 7"]),
    (["train", "--seq-len", "0"], ["--seq-len 0"]),
    (["train", "--global-batch", "99999999999999999999999"], ["--global-batch", "at most"]),
    (["train", "--gpus", "0"], ["--gpus"]),
    # compare
    (["compare", "--rate", "inf"], ["--rate inf"]),
    (["compare", "--train-tokens", "nan"], ["--train-tokens nan"]),
    (["compare", "--gpus", "0"], ["--gpus 0"]),
    (["compare", "--num-requests", "0"], ["--num-requests 0"]),
    (["compare", "--slo", "fast"], ["--slo"]),
    (["compare", "--hardware", ","], ["--hardware", "empty"]),
    # report
    (["report", "-o", "{tmp}/r", "--rate", "nan"], ["--rate nan"]),
    (["report", "-o", "{tmp}/r", "--num-requests", "0"], ["--num-requests 0"]),
    (["report", "-o", "{tmp}/r", "--train-tokens", "inf"], ["--train-tokens inf"]),
    (["report", "-o", "{tmp}/r", "--seed", "-1"], ["--seed -1"]),
    (["report", "-o", "{tmp}/r", "--max-gpus", "0"], ["--max-gpus 0"]),
    (["report", "-o", "{tmp}/r", "--dtype", "fp3"], ["--dtype 'fp3'"]),
    (["report", "-o", "{tmp}/r", "--slo", "ttft_p99=-1s"], ["--slo"]),
    # calibrate / validate: empty measurement files, bad options
    (["validate", "--csv", "{tmp}/empty.csv"], ["empty.csv", "not a readable CSV"]),
    (["validate", "--csv", "{tmp}/header.csv"], ["header.csv", "no data rows"]),
    (["calibrate", "--profile", "h100-sxm", "--training", "{tmp}/empty.csv", "-o", "{tmp}/x.toml"], ["empty.csv"]),
    (["calibrate", "--profile", "h100-sxm", "--training", "{tmp}/header.csv", "-o", "{tmp}/x.toml"],
     ["header.csv", "no data rows"]),
    (["calibrate", "--profile", "h100-sxm", "--serving", "{tmp}/empty.csv", "--engine-output", "{tmp}/e.toml"],
     ["empty.csv"]),
    (["calibrate", "--profile", "h100-sxm", "--training", "{tmp}/header.csv", "-o", "{tmp}/x.toml", "--tp", "0"],
     ["--tp 0"]),
    # hardware files that cannot be read as TOML, or whose numbers overflow once converted
    (["simulate", "--hardware", "{tmp}/binary.toml"], ["binary.toml", "UTF-8"]),
    (["simulate", "--hardware", "{tmp}/utf16.toml"], ["utf16.toml", "UTF-8"]),
    (["cost", "--decode-seqs", "1", "--hardware", "{tmp}/huge.toml"], ["hbm_capacity_GB", "implausibly large"]),
    (["train", "--hardware", "{tmp}/huge.toml"], ["hbm_capacity_GB"]),
]


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bad")
    (tmp / "empty.csv").write_text("")
    header = (REPO / "servesim/calibrate/data/training_published_calibration.csv").read_text().splitlines()[0]
    (tmp / "header.csv").write_text(header + "\n")
    (tmp / "binary.toml").write_bytes(bytes(range(256)) * 4)
    text = (REPO / "hardware_profiles/h100-sxm.toml").read_text()
    (tmp / "utf16.toml").write_bytes(text.replace('name = "h100-sxm"', 'name = "utf16"').encode("utf-16"))
    lines = [("hbm_capacity_GB = 1e308" if ln.strip().startswith("hbm_capacity_GB") else
              'name = "huge"' if ln.strip().startswith("name =") else ln) for ln in text.splitlines()]
    (tmp / "huge.toml").write_text("\n".join(lines) + "\n")
    return tmp


@pytest.mark.parametrize("args, words", OTHERS, ids=[" ".join(a) for a, _ in OTHERS])
def test_other_commands_bad_options(args, words, bad_files):
    one_line_error(*[a.replace("{tmp}", str(bad_files)) for a in args], must_contain=words)


def test_nothing_written_when_an_option_is_refused(tmp_path):
    one_line_error("simulate", "--rate", "nan", "-o", tmp_path / "new", must_contain=["--rate nan"])
    one_line_error("report", "--rate", "nan", "-o", tmp_path / "rep", must_contain=["--rate nan"])
    one_line_error("sweep", "--rates", "1", "--grid", "tp=0", "-o", tmp_path / "sw", must_contain=["tp"])
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- options that do nothing: one warning line


def test_chunk_size_with_the_vllm_scheduler_warns_once():
    r = CliRunner().invoke(main, ["simulate", "--num-requests", "20", "--chunk-size", "256", "--format", "json"])
    assert r.exit_code == 0, r.output
    warn = [ln for ln in r.stderr.splitlines() if ln.startswith("servesim: warning:")]
    assert len(warn) == 1 and "--chunk-size 256" in warn[0] and "vllm" in warn[0] and "sarathi" in warn[0]
    r = CliRunner().invoke(main, ["simulate", "--num-requests", "20", "--scheduler", "sarathi", "--chunk-size", "256"])
    assert r.exit_code == 0 and "warning" not in r.stderr


def test_cv_without_gamma_warns_in_the_api():
    with pytest.warns(ServesimWarning, match="--cv 2 does nothing with --arrival poisson"):
        servesim.simulate(num_requests=20, cv=2.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ServesimWarning)
        servesim.simulate(num_requests=20, arrival="gamma", cv=2.0)


# ---------------------------------------------------------------- the Python API


API = [
    (dict(tpp=2), "unknown option 'tpp'; did you mean 'tp'?"),
    (dict(num_request=10), "did you mean 'num_requests'?"),
    (dict(tp="2"), "--tp '2' is not valid: must be an integer"),
    (dict(tp=2.0), "must be an integer"),
    (dict(tp=True), "must be an integer"),
    (dict(tp=0), "--tp 0"),
    (dict(rate="5"), "--rate '5' is not valid: must be a number"),
    (dict(rate=float("nan")), "--rate nan"),
    (dict(rate=float("inf")), "--rate inf"),
    (dict(model=None), "--model must be a name or a file path"),
    (dict(model=3), "--model must be a name or a file path"),
    (dict(hardware="h900"), "h900"),
    (dict(router="rr"), "--router 'rr' unknown"),
    (dict(scheduler="VLLM"), "--scheduler 'VLLM' unknown"),
    (dict(arrival="gama"), "did you mean 'gamma'?"),
    (dict(num_requests=10**30), "--num-requests 1000000000000000000000000000000 is too large"),
    (dict(num_requests=0), "--num-requests 0"),
    (dict(seed=-1), "--seed -1"),
    (dict(seed=1.5), "--seed 1.5"),
    (dict(slo="ttft=1"), "--slo"),
    (dict(slo=5), "--slo must be a string"),
    (dict(stages=[(1,)]), "--stages"),
    (dict(offline="yes"), "--offline must be True or False"),
    (dict(duration="10s"), "--duration '10s' is not valid: must be a number"),
    (dict(duration=0), "--duration 0"),
    (dict(warmup=-1), "--warmup -1"),
    (dict(price=float("inf")), "--price inf"),
    (dict(concurrency=0), "--concurrency 0"),
    (dict(concurrency=4, offline=True), "contradict"),
    (dict(gpu_memory_utilization=2), "(0, 1]"),
    (dict(block_size=3.5), "--block-size 3.5"),
    (dict(kv_dtype="fp4"), "--kv-dtype 'fp4' unknown"),
    (dict(engine=""), "--engine is empty"),
    (dict(isl=1000, osl=200000), "131,072"),
    (dict(max_num_batched_tokens=10**19), "too large"),
]


@pytest.mark.parametrize("kw, words", API, ids=[str(k) for k, _ in API])
def test_api_keywords_raise_servesim_errors(kw, words):
    with pytest.raises(ServesimError) as e:
        servesim.simulate(**({"num_requests": 20} | kw))
    assert isinstance(e.value, ConfigError) and words in str(e.value), str(e.value)
    assert "\n" not in str(e.value)


def test_api_config_object_and_paths():
    with pytest.raises(ConfigError, match="expected a servesim.SimConfig"):
        servesim.simulate({"tp": 1})
    # a path object is a file path like its string; numpy integers are integers
    import numpy as np
    res = servesim.simulate(workload=REPO / "workloads" / "chat.toml", num_requests=np.int64(20), tp=np.int32(1))
    assert res.summary["config"]["workload"].endswith("chat.toml") and res.summary["num_requests"] == 20
