"""`servesim calibrate` and `servesim validate` through the CLI (CliRunner), on small fixtures."""
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from servesim.calibrate.fit import read_vllm_json
from servesim.calibrate.profile_io import update_profile
from servesim.cli import main
from servesim.config import load_hardware
from servesim.config.engine import load_engine

DATA = Path(__file__).parent / "data" / "calibrate"
NATIVE = DATA / "native_h100.csv"


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_native_fit_recovers_parameters_and_writes_loadable_profile(tmp_path):
    out = tmp_path / "my-h100.toml"
    r = run("calibrate", "--profile", "h100-sxm", "--operators", NATIVE, "-o", out)
    assert r.exit_code == 0, r.output
    hw = load_hardware(str(out))
    e = hw.efficiency
    # the fixture was generated from the cost model with gemm_max 0.70, hbm 0.90 (GEMMs and copies), elementwise
    # kernel latency 5.2 us, link 0.75 (+3% noise)
    assert e.gemm_max == pytest.approx(0.70, abs=0.03)
    assert e.hbm_fraction == pytest.approx(0.90, abs=0.03)
    assert e.elementwise_latency_s == pytest.approx(5.2e-6, abs=0.5e-6)
    assert e.scaleup_bw_fraction == pytest.approx(0.75, abs=0.05)
    assert hw.name == "my-h100" and hw.own_efficiency and hw.efficiency_from == "h100-sxm"   # engine fits named
    assert "servesim calibrate" in e.fit_source and "native_h100.csv" in e.fit_source
    assert hw.peak_flops == load_hardware("h100-sxm").peak_flops
    rep = tmp_path / "my-h100-fit"
    md = (rep / "report.md").read_text()
    assert "Leave-one-group-out" in md and "k4096xn6144" in md and "attn_prefill" in md  # skipped op warned
    res = pd.read_csv(rep / "residuals.csv")
    assert set(res["kind"]) == {"gemm", "memory", "collective"} and len(res) == 58
    assert set(pd.read_csv(rep / "holdout.csv")["kind"]) == {"gemm", "collective"}


def test_vidur_subset_fit(tmp_path):
    out = tmp_path / "vidur-h100.toml"
    r = run("calibrate", "--profile", "h100-sxm", "--operators", DATA / "vidur", "-o", out,
            "--report", tmp_path / "rep")
    assert r.exit_code == 0, r.output
    e = load_hardware(str(out)).efficiency
    assert 0.6 < e.gemm_max <= 1.0 and 0.05 < e.scaleup_bw_fraction <= 1.0
    hold = pd.read_csv(tmp_path / "rep" / "holdout.csv")
    assert {"meta-llama/Llama-2-7b-hf", "microsoft/phi-2"} <= set(hold["held_out"])  # one model held out at a time
    assert "mlp.csv" in e.fit_source


def test_refuses_to_overwrite_and_shipped_names(tmp_path):
    out = tmp_path / "x.toml"
    out.write_text("keep me")
    r = run("calibrate", "--profile", "h100-sxm", "--operators", NATIVE, "-o", out)
    assert r.exit_code == 2 and "--force" in r.output and out.read_text() == "keep me"
    r = run("calibrate", "--profile", "h100-sxm", "--operators", NATIVE, "-o", tmp_path / "h100-sxm.toml")
    assert r.exit_code == 2 and "shipped profile name" in r.output
    assert not (tmp_path / "h100-sxm.toml").exists()
    r = run("calibrate", "--profile", "h100-sxm", "--operators", NATIVE, "-o", out, "--force", "--no-holdout")
    assert r.exit_code == 0, r.output
    assert load_hardware(str(out)).name == "x"


def _one_line_error(r):
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.startswith("servesim: error")]
    assert len(lines) == 1 and "Traceback" not in r.output
    return lines[0]


@pytest.mark.parametrize("case", ["missing_column", "ms_as_us", "ns_as_us", "too_few", "bad_number"])
def test_bad_operator_csv_writes_nothing(tmp_path, case):
    df = pd.read_csv(NATIVE)
    if case == "missing_column":
        df = df.drop(columns=["time_us"])
    elif case == "ms_as_us":
        df["time_us"] = df["time_us"] / 1000.0
    elif case == "ns_as_us":
        df["time_us"] = df["time_us"] * 1000.0
    elif case == "too_few":
        df = df[df["op"] == "gemm"].head(4)
    else:
        df["m"] = df["m"].astype(object)
        df.loc[0, "m"] = "lots"
    bad = tmp_path / "bad.csv"
    df.to_csv(bad, index=False)
    out = tmp_path / "new.toml"
    msg = _one_line_error(run("calibrate", "--profile", "h100-sxm", "--operators", bad, "-o", out))
    expect = {"missing_column": "time_us", "ms_as_us": "milliseconds", "ns_as_us": "nanoseconds",
              "too_few": "at least", "bad_number": "positive number"}[case]
    assert expect in msg
    assert not out.exists() and not (tmp_path / "new-fit").exists()


def test_no_input_is_an_error(tmp_path):
    _one_line_error(run("calibrate", "--profile", "h100-sxm", "-o", tmp_path / "n.toml"))


def test_vllm_json_parsed():
    df = read_vllm_json(DATA / "vllm_rate4.json", "llama-3.1-8b", 1, "h100-sxm")
    assert set(df["metric"]) == {"ttft_ms_mean", "itl_ms_mean", "achieved_request_throughput",
                                 "total_output_tokens_per_s"}
    assert (df["isl"] == 512).all() and (df["osl"] == 128).all() and (df["load_value"] == 4.0).all()
    assert (df["engine"] == "vLLM").all() and (df["num_requests"] == 200).all()


@pytest.mark.slow   # ~6-9 s: kept out of the default run for time (CI runs it)
def test_vllm_json_fit_writes_the_engine_host_keys(tmp_path):
    # serving rows fit the engine's host keys into the engine profile, not the hardware profile
    out = tmp_path / "served.toml"
    r = run("calibrate", "--profile", "h100-sxm", "--serving", DATA / "vllm_rate4.json",
            "--serving", DATA / "vllm_rate16.json", "--model", "llama-3.1-8b", "--tp", "1", "--engine-output", out)
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["served-fit", "served.toml"]   # no hardware profile
    h100 = load_hardware("h100-sxm")
    fit, base = load_engine(str(out)).fit_for(h100), load_engine("vllm").fit_for(h100)
    assert load_engine(str(out)).name == "served" and fit.fitted_on == "h100-sxm"
    assert 1e-5 <= fit.host_step_s <= 0.02 and 0.0 <= fit.host_per_seq_s <= 2e-4
    assert fit.gemm_max == base.gemm_max and fit.attn_decode_hbm_fraction == base.attn_decode_hbm_fraction
    assert "servesim calibrate" in fit.fit_source and "serving rows" in fit.fit_source
    res = pd.read_csv(tmp_path / "served-fit" / "residuals.csv")
    assert len(res) == 8 and set(res["profile"]) == {"engine"} and res["rel_error"].abs().median() < 0.15


def test_serving_rows_of_another_engine_are_one_line(tmp_path):
    from servesim.calibrate.serving import DATA as SERVING
    df = pd.read_csv(SERVING)
    rows = tmp_path / "trt.csv"
    df[df.hardware.str.startswith("H100")].head(8).to_csv(rows, index=False)
    msg = _one_line_error(run("calibrate", "--profile", "h100-sxm", "--serving", rows, "--engine", "vllm",
                              "--engine-output", tmp_path / "e.toml"))
    assert "--engine trtllm" in msg and not (tmp_path / "e.toml").exists()


def test_vllm_json_without_model_is_one_line(tmp_path):
    msg = _one_line_error(run("calibrate", "--profile", "h100-sxm", "--serving", DATA / "vllm_rate4.json",
                              "--engine-output", tmp_path / "s.toml"))
    assert "--model" in msg


def test_update_profile_keeps_layout():
    hw = load_hardware("h100-sxm")
    path = Path(hw.path)  # rewriting the current value with the current source changes nothing
    assert update_profile(path, {"gemm_max": hw.efficiency.gemm_max}, "experiments/fit_costmodel.py") == path.read_text()


@pytest.mark.slow   # ~6-9 s: kept out of the default run for time (CI runs it)
def test_validate_quick_table_and_check(tmp_path):
    r = run("validate", "--quick", "-o", tmp_path / "v")
    assert r.exit_code == 0, r.output
    assert "serving:" in r.output and "training:" in r.output and "PASS" in r.output
    # --check passes on every suite (the vllm suite's splits are checked in tests/test_vllm_suite.py)
    for suite in ("serving", "training", "vllm"):
        c = run("validate", "--suite", suite, "--quick", "--check")
        assert c.exit_code == 0, c.output
    assert (tmp_path / "v" / "parity.png").stat().st_size > 1000
    rows = pd.read_csv(tmp_path / "v" / "serving_rows.csv")
    assert {"gpu", "metric", "measured", "predicted", "rel_error"} <= set(rows.columns) and len(rows) >= 50
    summary = pd.read_csv(tmp_path / "v" / "summary.csv")
    assert set(summary["suite"]) == {"serving", "vllm", "training"}


@pytest.mark.slow     # the training suite around the user's rows, ~8 CPU s
def test_validate_user_csv_check_fails(tmp_path):
    from servesim.calibrate.serving import DATA as SERVING
    df = pd.read_csv(SERVING)
    df = df[df.load_kind == "static_batch"].head(6)
    df["value"] = df["value"] * 3.0            # far from anything the simulator predicts
    user = tmp_path / "mine.csv"
    df.to_csv(user, index=False)
    r = run("validate", "--suite", "training", "--csv", user, "--check", "--format", "json")
    assert r.exit_code == 2
    assert "user:mine.csv median" in r.output


def test_validate_bad_user_csv(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    _one_line_error(run("validate", "--suite", "training", "--csv", bad))
