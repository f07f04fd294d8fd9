"""The Python API beyond simulate (servesim.sweep, find_max_rate, plan, cost, train, compare,
calibrate, validate): the numbers the CLI prints, typed results, one-line errors, the CLI's defaults,
runnable docstring examples."""
import doctest
import inspect
import io
import json
import subprocess
import sys

import pandas as pd
import pytest
from click.testing import CliRunner

import servesim
from servesim.cli import main
from servesim.errors import ConfigError, InfeasibleError

SMALL = dict(num_requests=200, isl=256, osl=32)
SMALL_CLI = ["--num-requests", "200", "--isl", "256", "--osl", "32"]
SLO = "ttft_p99=1s,tpot_p99=60ms"


def cli(*args) -> str:
    r = CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return r.stdout


def one_line(excinfo, *words):
    msg = str(excinfo.value)
    assert "\n" not in msg
    for w in words:
        assert w in msg, msg


# ---------------------------------------------------------------- the CLI prints the API's result
@pytest.mark.slow   # ~2-3 s: kept out of the default run for time (CI runs it)
def test_sweep_same_as_cli_json_and_csv(tmp_path):
    res = servesim.sweep([2, 8], grid={"tp": [1, 2]}, slo=SLO, price={"h100-sxm": 2.0}, workers=1, **SMALL)
    out = cli("sweep", "--rates", "2,8", "--grid", "tp=1,2", "--slo", SLO, "--price", "h100-sxm=2.0", *SMALL_CLI,
              "--workers", "1", "--format", "json", "-o", tmp_path)
    files = json.loads(out)["files"]
    assert str(tmp_path / "sweep.csv") in files and out == res.to_json(files=files) + "\n"
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "sweep.csv"),
                                  pd.read_csv(io.StringIO(res.points.to_csv(index=False))))
    p = res.points
    assert list(zip(p.tp, p.rate)) == [(1, 2.0), (1, 8.0), (2, 2.0), (2, 8.0)]
    assert (p.status == "ok").all() and (p.cost_usd_per_gpu_hour == 2.0).all()
    # four times the load: more output tokens per second at each TP
    assert (p[p.rate == 8].throughput_output_tokens_per_s.values > 3 * p[p.rate == 2].throughput_output_tokens_per_s.values).all()
    assert res.summary["status"] == {"ok": 4} and res.mode == "sweep" and res.grid == ("tp",)


def test_find_max_rate_same_as_cli():
    res = servesim.find_max_rate(grid={"hardware": ["h100-sxm", "l40s"]}, slo=SLO, workers=1, **SMALL)
    out = cli("sweep", "--find-max-rate", "--grid", "hardware=h100-sxm,l40s", "--slo", SLO, *SMALL_CLI,
              "--workers", "1", "--format", "json")
    assert out == res.to_json() + "\n"
    p = res.points.set_index("hardware")
    assert res.mode == "max-rate" and (p.status == "ok").all()
    assert (p.max_rate < p.first_failing_rate).all()
    assert p.max_rate["h100-sxm"] > p.max_rate["l40s"]      # the faster chip sustains more


def test_plan_same_as_cli_and_cheapest():
    res = servesim.plan(hardware=["h100-sxm", "l40s"], tp=[1, 2], rate=12, slo=SLO, workers=1, **SMALL)
    out = cli("plan", "--hardware", "h100-sxm,l40s", "--tp", "1,2", "--rate", "12", "--slo", SLO, *SMALL_CLI,
              "--workers", "1", "--format", "json")
    assert out == res.to_json() + "\n"
    meets = res.candidates[res.candidates.status == "meets_slo"]
    assert res.best["usd_per_hour"] == meets.usd_per_hour.min()
    assert set(res.candidates.hardware) == {"h100-sxm", "l40s"} and "metrics" not in res.candidates.columns


def test_cost_same_as_cli():
    res = servesim.cost("llama-3.1-70b", tp=4, prefill_tokens=4096, decode_seqs=8)
    assert cli("cost", "--model", "llama-3.1-70b", "--tp", "4", "--prefill-tokens", "4096", "--decode-seqs", "8",
               "--format", "json") == res.to_json() + "\n"
    b = res.breakdown
    assert b.time_ms.sum() == pytest.approx(res.summary["time_ms"], rel=1e-6)
    assert b.share.sum() == pytest.approx(1.0, rel=1e-6) and b.set_index("part").bound["gemm"] == "compute"
    assert res.summary["tp"] == 4 and res.summary["communication" in res.summary["parts_ms"] and "parts_ms"]


@pytest.mark.parametrize("api,args", [
    (dict(gpus=8, global_batch=64), ["--gpus", "8", "--global-batch", "64"]),
    (dict(gpus=16, search=True, top=3, global_batch=64), ["--gpus", "16", "--search", "--top", "3", "--global-batch", "64"]),
    (dict(gpus=[8, 16], global_batch=32, tp=2, sp=True), ["--gpus", "8,16", "--global-batch", "32", "--tp", "2", "--sp"]),
])
def test_train_same_as_cli(api, args):
    res = servesim.train(**api)
    assert cli("train", *args, "--format", "json") == res.to_json() + "\n"
    if res.mode == "layout":
        assert res.table is None and 0 < res.summary["mfu"] < 1
    elif res.mode == "search":
        times = res.table.step_time_s.tolist()
        assert times == sorted(times) and res.summary["step_time_s"] == pytest.approx(times[0])
    else:
        assert res.table.gpus.tolist() == [8, 16]


@pytest.mark.slow   # ~2-3 s: kept out of the default run for time (CI runs it)
def test_compare_same_as_cli():
    res = servesim.compare(gpus=64, global_batch=128, train_tokens=1e12, rate=2, num_requests=100)
    assert cli("compare", "--gpus", "64", "--global-batch", "128", "--train-tokens", "1e12", "--rate", "2",
               "--num-requests", "100", "--format", "json") == res.to_json() + "\n"
    r = res.rows.iloc[0]
    assert r.break_even_output_tokens == pytest.approx(r.train_usd / r.serve_usd_per_m_output * 1e6)


@pytest.mark.slow     # the training suite twice, ~12 CPU s
def test_validate_same_as_cli(tmp_path):
    res = servesim.validate("training", output=tmp_path / "v")
    assert cli("validate", "--suite", "training", "--format", "json") == res.to_json() + "\n"
    assert res.passed and res.suites[0]["suite"] == "training" and len(res.rows) == res.suites[0]["n"]
    summary = pd.read_csv(tmp_path / "v" / "summary.csv")
    whole = summary[(summary.suite == "training") & (summary.gpu == "all")].iloc[0]
    assert whole.n == res.suites[0]["n"] and whole.median_rel_err == pytest.approx(res.suites[0]["median_rel_err"])


def test_calibrate_fits_and_writes(tmp_path):
    from servesim.config import load_hardware
    out = tmp_path / "my-h100.toml"
    res = servesim.calibrate("h100-sxm", operators="tests/data/calibrate/native_h100.csv", output=out,
                             holdout=False)
    # the fixture was generated from the cost model with gemm_max 0.70 and hbm 0.90 (+3% noise)
    assert res.summary["values"]["gemm_max"] == pytest.approx(0.70, abs=0.03)
    assert load_hardware(str(out)).efficiency.gemm_max == pytest.approx(res.summary["values"]["gemm_max"], abs=1e-3)
    assert (tmp_path / "my-h100-fit" / "report.md").is_file() and res.summary["report"] == str(tmp_path / "my-h100-fit")
    assert set(res.residuals.kind) == {"gemm", "memory", "collective"}
    with pytest.raises(ConfigError) as e:      # the profile exists now
        servesim.calibrate("h100-sxm", operators="tests/data/calibrate/native_h100.csv", output=out)
    one_line(e, "--force")


# ---------------------------------------------------------------- errors
@pytest.mark.parametrize("call,words", [
    (lambda: servesim.sweep([2], num_request=200), ["num_request", "did you mean 'num_requests'"]),
    (lambda: servesim.sweep([-1], **SMALL), ["--rates", "> 0"]),
    (lambda: servesim.sweep([2], grid={"tpp": [1]}, **SMALL), ["--grid", "tpp"]),
    (lambda: servesim.sweep([2], price="nope=1", **SMALL), ["--price", "nope"]),
    (lambda: servesim.sweep([2], config="llama", **SMALL), ["config", "SimConfig"]),
    (lambda: servesim.find_max_rate(**SMALL), ["--slo"]),
    (lambda: servesim.plan(slo=SLO, replicas=2), ["replicas", "max_replicas"]),
    (lambda: servesim.plan(slo=SLO, hardware="tpu-v9"), ["--hardware", "tpu-v9"]),
    (lambda: servesim.plan(slo="ttft=1s"), ["--slo"]),
    (lambda: servesim.cost(decode_seqs=1, allreduce="rng"), ["--allreduce", "did you mean 'ring'"]),
    (lambda: servesim.cost(), ["empty batch"]),
    (lambda: servesim.train(tpp=2), ["tpp", "did you mean 'tp'"]),
    (lambda: servesim.train(gpus=[8, "x"]), ["--gpus"]),
    (lambda: servesim.train(recompute="some"), ["--recompute", "some"]),
    (lambda: servesim.train(sp="yes"), ["--sp"]),
    (lambda: servesim.compare(dtype="fp4"), ["--dtype", "fp4"]),
    (lambda: servesim.compare(hardware=[]), ["--hardware"]),
    (lambda: servesim.validate("nope"), ["--suite", "nope"]),
    (lambda: servesim.calibrate("h100-sxm", operators="no/such.csv", output="x.toml"), ["--operators", "no/such.csv"]),
])
def test_bad_input_is_one_line_config_error(call, words):
    with pytest.raises(ConfigError) as e:
        call()
    one_line(e, *words)


def test_point_error_and_no_plan_carry_the_result():
    with pytest.raises(ConfigError) as e:
        servesim.sweep([2], grid={"num_gpu_blocks": [4000, 2]}, workers=1, **SMALL)
    one_line(e, "point 1", "--num-gpu-blocks 2")
    assert e.value.result.points.status.tolist() == ["ok", "error"]
    with pytest.raises(InfeasibleError) as e:
        servesim.plan(hardware="h100-sxm", tp=[1], rate=12, slo="tpot_p99=2ms", workers=1, **SMALL)
    one_line(e, "no configuration meets", "tpot_p99")
    assert e.value.result.best is None and len(e.value.result.candidates) == 1


# ---------------------------------------------------------------- exports, defaults, docstrings
def test_exports_and_calibrate_name_survives_the_subpackage():
    names = {"simulate", "sweep", "find_max_rate", "plan", "cost", "train", "compare", "calibrate", "validate"}
    assert names <= set(servesim.__all__) and names <= set(dir(servesim))
    from servesim import api
    assert servesim.simulate is api.simulate and servesim.SimConfig is api.SimConfig
    code = ("import servesim, servesim.calibrate.fit, servesim.calibrate.validate; "
            "assert servesim.calibrate.__module__ == 'servesim.workflows.calibration', servesim.calibrate")
    subprocess.run([sys.executable, "-c", code], check=True)


def _click_defaults(command) -> dict:
    import click
    cmd = main.commands[command]
    ctx = click.Context(cmd)
    return {p.name: p.get_default(ctx) for p in cmd.params}


@pytest.mark.parametrize("command,fn,skip", [
    ("cost", servesim.cost, set()),
    ("compare", servesim.compare, set()),
    ("plan", servesim.plan, {"price"}),
    ("sweep", servesim.find_max_rate, {"price", "rates", "grid"}),
])
def test_api_defaults_are_the_cli_defaults(command, fn, skip):
    from servesim.workflows.capacity import as_text
    click = _click_defaults(command)
    sig = {k: p.default for k, p in inspect.signature(fn).parameters.items() if p.default is not inspect.Parameter.empty}
    shared = (set(sig) & set(click)) - skip
    assert len(shared) >= 3
    for k in shared:
        assert as_text(sig[k]) == as_text(click[k]), k


def test_train_layout_defaults_are_the_cli_defaults():
    from servesim.workflows.training import LAYOUT_DEFAULTS
    click = _click_defaults("train")
    assert {k: click[k] for k in LAYOUT_DEFAULTS} == LAYOUT_DEFAULTS
    assert set(click) - set(LAYOUT_DEFAULTS) == {"model", "hardware", "gpus", "search", "top", "scaling", "fmt",
                                                  "outdir"}
    sig = inspect.signature(servesim.train).parameters
    assert [sig[k].default for k in ("model", "hardware", "top", "scaling")] == \
        [click["model"], click["hardware"], click["top"], click["scaling"]] and str(sig["gpus"].default) == click["gpus"]


@pytest.mark.parametrize("fn", [servesim.simulate, servesim.cost, servesim.train, servesim.sweep, servesim.find_max_rate,
                                servesim.plan,
                                pytest.param(servesim.validate, marks=pytest.mark.slow)])   # ~5 CPU s
def test_docstring_examples_run(fn):
    finder, runner = doctest.DocTestFinder(), doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    for t in finder.find(fn, fn.__name__, globs={}):
        runner.run(t)
    r = runner.summarize(verbose=False)
    assert r.attempted >= 2 and r.failed == 0
