"""Calibration that fits or says why (issue #25, item 5): `--operators` takes the Vidur tables shipped
in the repo (units checked per file, cache-resident rows left out), `--serving` fits what one
benchmark JSON identifies and says which values it held, `--training` writes the key a training CSV
identifies or exits 2 naming why, and the README's calibrate examples run as written."""
from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from clihelp import one_line_error
from servesim.calibrate.fit import UNIT_SLIP, _faster_than
from servesim.calibrate.training import DATA as TRAINING
from servesim.cli import main
from servesim.config import load_hardware
from servesim.config.engine import load_engine
from servesim.errors import ConfigError
from servesim.training.params import FITTED

DATA = Path(__file__).parent / "data" / "calibrate"
PKG = Path(__file__).resolve().parents[1] / "servesim" / "calibrate" / "data"
README = Path(__file__).resolve().parents[1] / "README.md"


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_units_are_checked_per_file_and_cached_rows_left_out():
    frame = pd.DataFrame({"source": ["a.csv"] * 10 + ["b.csv"] * 10})
    achieved = np.r_[np.full(9, 0.8), 1.26, np.full(10, 0.7)]        # one cache-resident row in a.csv
    warn = []
    kept = _faster_than("copy rows", frame, achieved, 1.0, "unit hint", warn, cap=1.0, why="cache")
    assert len(kept) == 19 and len(warn) == 1 and "1 of 20 row(s)" in warn[0] and "1.26x" in warn[0]
    slipped = np.r_[np.full(10, 0.8), np.full(10, 700.0)]              # b.csv written in ms as us
    with pytest.raises(ConfigError, match=r"copy rows of b.csv: the median row runs at 700x.*unit hint"):
        _faster_than("copy rows", frame, slipped, 1.0, "unit hint", [])
    assert 10 < UNIT_SLIP < 100      # between a noisy row and a 1000x slip


@pytest.mark.slow   # ~16 s a GPU: CI runs it
@pytest.mark.parametrize("gpu,net", [("h100", "h100_dgx"), ("a100", "a100_dgx")])
def test_operators_fit_the_shipped_vidur_tables(tmp_path, gpu, net):
    """The README's Vidur example was refused ("bytes look 1000x too large" for rows 1.26x HBM)."""
    base = {"h100": "h100-sxm", "a100": "a100-sxm-80gb"}[gpu]
    out = tmp_path / f"{gpu}-vidur.toml"
    r = run("calibrate", "--profile", base, "--operators", PKG / "vidur/profiling/compute" / gpu,
            "--operators", PKG / "vidur/profiling/network" / net, "-o", out)
    assert r.exit_code == 0, r.output
    assert "left out of the fit" in r.output and "cache" in r.output
    fitted, shipped = load_hardware(str(out)).efficiency, load_hardware(base).efficiency
    # the shipped efficiencies were fitted on the same tables (experiments/fit_costmodel.py): close
    assert fitted.gemm_max == pytest.approx(shipped.gemm_max, rel=0.05)
    assert fitted.hbm_fraction == pytest.approx(shipped.hbm_fraction, rel=0.05)
    assert fitted.scaleup_bw_fraction == pytest.approx(shipped.scaleup_bw_fraction, rel=0.05)


def test_serving_fits_one_benchmark_json_and_says_what_it_held(tmp_path):
    """One run was refused ("4 rows cannot identify 3 parameters"): now it fits what one run identifies."""
    out = tmp_path / "my-vllm-host.toml"
    r = run("calibrate", "--profile", "h100-sxm", "--serving", DATA / "vllm_rate16.json", "--model", "llama-3.1-8b",
            "--tp", "1", "--engine-output", out)
    assert r.exit_code == 0, r.output
    held = re.findall(r"serving: (\w+) held at the base value", r.output)
    assert set(held) == {"host_step_us", "host_per_seq_us"}     # vLLM's async host time hides behind the GPU
    h100 = load_hardware("h100-sxm")
    mine, base = load_engine(str(out)).fit_for(h100), load_engine("vllm").fit_for(h100)
    assert mine.host_step_s == base.host_step_s and mine.host_per_seq_s == base.host_per_seq_s
    assert mine.graph_overlap != base.graph_overlap                          # the key the run identifies
    assert "held at the base values" in mine.fit_source and "fitted graph_overlap" in mine.fit_source


def _training_rows(tmp_path, scale: float = 1.0, hardware: str = "H100") -> Path:
    df = pd.read_csv(TRAINING)
    df = df[df.hardware.str.startswith(hardware)].copy()
    slower = df.metric == "step_time_s"
    df.loc[slower, "value"] *= scale
    df.loc[~slower, "value"] /= scale
    path = tmp_path / "my_runs.csv"
    df.to_csv(path, index=False)
    return path


@pytest.mark.slow   # ~20 s: the training fit over the H100 rows; CI runs it
def test_training_writes_the_gemm_max_the_rows_identify(tmp_path):
    """It fitted 0 parameters and wrote a copy of the base profile."""
    out = tmp_path / "mine.toml"
    r = run("calibrate", "--profile", "h100-sxm", "--training", _training_rows(tmp_path), "-o", out)
    assert r.exit_code == 0, r.output
    scale = float(re.search(r"compute_scale = ([\d.]+) on h100-sxm's rows", r.output).group(1))
    base, mine = load_hardware("h100-sxm").efficiency, load_hardware(str(out)).efficiency
    # the training model runs GEMMs at gemm_max x the architecture's scale: the written key gives the fit
    assert mine.gemm_max * FITTED.scale_for("hopper") == pytest.approx(base.gemm_max * scale, rel=1e-3)
    assert mine.gemm_max != base.gemm_max and "fitted 1 parameter(s)" in r.output


def test_training_without_rows_of_the_gpu_exits_2_naming_why(tmp_path):
    rows = _training_rows(tmp_path, hardware="A100")
    line = one_line_error("calibrate", "--profile", "h100-sxm", "--training", rows, "-o", tmp_path / "x.toml",
                          must_contain=("0 usable row(s) on h100-sxm",))
    assert "no profile written" in line and not (tmp_path / "x.toml").exists()


def _readme_calibrate_block() -> list[list[str]]:
    block = next(b for b in re.findall(r"```bash\n(.*?)```", README.read_text(), re.S) if "servesim calibrate" in b)
    return [shlex.split(line, comments=True) for line in block.replace("\\\n", " ").splitlines() if line.strip()]


@pytest.mark.slow   # ~70 s: every fit of the README; CI runs it
def test_readme_calibrate_examples_run_as_written(tmp_path, monkeypatch):
    """Each `servesim calibrate` and `simulate` line of the README's calibration block, in a folder holding
    the inputs it names (the repo's own copies); `validate --check` is tests/test_vllm_suite.py's."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "measure_out").mkdir()
    shutil.copy(DATA / "native_h100.csv", tmp_path / "measure_out")
    shutil.copytree(PKG / "vidur", tmp_path / "vidur")
    (tmp_path / "aiconfigurator").mkdir()
    (tmp_path / "aiconfigurator" / "h100_sxm").symlink_to(PKG / "aiconfigurator" / "h100_sxm")
    _training_rows(tmp_path)
    shutil.copy(DATA / "vllm_rate16.json", tmp_path / "bench.json")
    serving = pd.read_csv(PKG / "inference_published_calibration.csv")
    serving[serving.hardware.str.startswith("H100")].head(12).to_csv(tmp_path / "my_serving.csv", index=False)
    ran = []
    for args in _readme_calibrate_block():
        assert args[0] == "servesim"
        if args[1:3] == ["validate", "--check"]:
            continue
        if args[1] == "simulate":
            args = args + ["--num-requests", "200"]     # the README's run, shorter
        r = run(*args[1:])
        assert r.exit_code == 0, (args, r.output)
        ran.append(args[1])
    assert ran.count("calibrate") == 5 and "simulate" in ran and "validate" in ran
    fits = {p.name for p in tmp_path.glob("*-fit")}
    assert len(fits) == 5                               # distinct outputs, distinct report folders
    sim = run("simulate", "--hardware", "./my-h100.toml", "--engine", "./my-vllm.toml", "--num-requests", "200",
              "--format", "json")
    import json
    fit = json.loads(sim.output)["config"]["fit"]
    assert fit["hardware"] == "measured" and fit["engine"].startswith("borrowed from h100-sxm")
