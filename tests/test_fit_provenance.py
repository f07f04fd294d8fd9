"""Profiles are used as given (issue #25, item 1): a user's hardware or engine profile is never
replaced by another GPU's fitted table; a missing table or key is one line naming it and the
`servesim calibrate` command that fits it, or is borrowed from a source the user's file names; every
borrowed term is listed in the text summary; `plan` marks borrowed candidates and
`--require-measured` leaves them out."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from clihelp import one_line_error
from servesim.cli import main
from servesim.config import load_hardware
from servesim.config.engine import load_engine, provenance
from servesim.paths import engines_dir, hardware_dir

NATIVE = Path(__file__).parent / "data" / "calibrate" / "native_h100.csv"
RUN = ("--num-requests", "300", "--isl", "512", "--osl", "128", "--rate", "4")


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def tpot(*args) -> tuple[float, dict]:
    r = run("simulate", *RUN, "--format", "json", *args)
    assert r.exit_code == 0, r.output
    s = json.loads(r.output)
    return s["tpot_ms"]["mean"], s["config"]


def own_profile(tmp_path, name="my-gpu", efficiency_from='""') -> Path:
    """A copy of h100-sxm named `name` with its own [efficiency] and the given efficiency_from."""
    text = (hardware_dir() / "h100-sxm.toml").read_text().replace('name = "h100-sxm"', f'name = "{name}"')
    text = re.sub(r'^efficiency_from\s*=.*$', f"efficiency_from = {efficiency_from}", text, count=1, flags=re.M)
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    return path


def test_calibrated_profile_runs_on_its_base_fit_not_another_gpus(tmp_path, monkeypatch):
    """The README's steps: `calibrate --operators -o my-h100.toml`, then simulate with it, alone and with a
    copy of the engine profile. Before, both ran on the A100 table (TPOT ~10.3 ms vs ~8.6 ms on h100-sxm)."""
    monkeypatch.chdir(tmp_path)
    r = run("calibrate", "--profile", "h100-sxm", "--operators", NATIVE, "-o", "my-h100.toml")
    assert r.exit_code == 0, r.output
    shutil.copy(engines_dir() / "vllm.toml", tmp_path / "my-vllm.toml")
    text = (tmp_path / "my-vllm.toml").read_text().replace('name = "vllm"', 'name = "my-vllm"')
    (tmp_path / "my-vllm.toml").write_text(text)
    shipped, _ = tpot("--hardware", "h100-sxm")
    a100_fit, _ = tpot("--hardware", own_profile(tmp_path, "on-a100-fit", '"a100-sxm-80gb"'))   # what main did
    for extra in ((), ("--engine", "./my-vllm.toml")):
        mine, cfg = tpot("--hardware", "./my-h100.toml", *extra)
        assert cfg["fit"]["engine"].startswith("borrowed from h100-sxm"), cfg["fit"]
        assert "a100" not in cfg["engine_fit"]
        # the silicon efficiencies are the user's (fitted), the engine's kernels h100-sxm's: within 6% (the
        # user's elementwise fractions and latency differ from the shipped ones, and a CUDA graph hides only
        # graph_overlap = 0.3 of each kernel's fixed time); the A100 table is > 10% away
        assert mine == pytest.approx(shipped, rel=0.06), (mine, shipped)
    assert a100_fit > 1.1 * shipped     # the comparison can fail: the A100 table is >10% slower here


def test_profile_naming_no_source_is_one_line_with_the_command(tmp_path):
    path = own_profile(tmp_path)
    line = one_line_error("simulate", *RUN, "--hardware", path,
                          must_contain=("[hardware.my-gpu]", "servesim calibrate --profile", "--aiconfigurator",
                                        'efficiency_from = "h100-sxm"'))
    assert "a100" not in line.split("(tables:")[0]


def test_efficiency_from_in_the_hardware_profile_names_the_engine_fit(tmp_path):
    path = own_profile(tmp_path, "my-a100ish", '"a100-sxm-80gb"')
    hw = load_hardware(str(path))
    p = provenance(load_engine("vllm"), hw)
    assert p["hardware"] == "measured" and p["engine"].startswith("borrowed from a100-sxm-80gb")
    assert not p["measured"]
    r = run("simulate", *RUN, "--hardware", path)
    assert r.exit_code == 0, r.output
    fit = next(ln for ln in r.output.splitlines() if ln.startswith("fit"))
    assert "vllm kernels borrowed from a100-sxm-80gb" in fit and "[BORROWED]" in fit


def _engine_copy(tmp_path, table_text: str) -> Path:
    """A copy of the vllm profile named my-eng with one more [hardware.my-gpu] table."""
    text = (engines_dir() / "vllm.toml").read_text().replace('name = "vllm"', 'name = "my-eng"')
    path = tmp_path / "my-eng.toml"
    path.write_text(text + "\n" + table_text)
    return path


def _h100_table(drop=()) -> str:
    lines = []
    import tomllib
    t = tomllib.loads((engines_dir() / "vllm.toml").read_text())["hardware"]["h100-sxm"]
    for k, v in t.items():
        if k not in drop:
            lines.append(f"{k} = {json.dumps(v)}")
    return "[hardware.my-gpu]\n" + "\n".join(lines) + "\n"


def test_engine_table_missing_a_key_names_it_and_the_command(tmp_path):
    eng = _engine_copy(tmp_path, _h100_table(drop=("gemm_fp8_max",)))
    one_line_error("simulate", *RUN, "--hardware", own_profile(tmp_path), "--engine", eng,
                   must_contain=("gemm_fp8_max", "is missing", "servesim calibrate", "--aiconfigurator"))
    eng = _engine_copy(tmp_path, _h100_table(drop=("host_step_us",)))
    one_line_error("simulate", *RUN, "--hardware", own_profile(tmp_path), "--engine", eng,
                   must_contain=("host_step_us", "--serving bench.json"))


def test_engine_table_borrowing_keys_by_name_lists_them(tmp_path):
    table = _h100_table(drop=("host_step_us", "frontend_us", "fit_source")) + 'efficiency_from = "h100-sxm"\n'
    eng = _engine_copy(tmp_path, table)
    r = run("simulate", *RUN, "--hardware", own_profile(tmp_path), "--engine", eng)
    assert r.exit_code == 0, r.output
    fit = next(ln for ln in r.output.splitlines() if ln.startswith("fit"))
    assert "host_step_us, frontend_us from h100-sxm's table" in fit and "[BORROWED]" in fit
    mine, _ = tpot("--hardware", own_profile(tmp_path), "--engine", eng)
    theirs, _ = tpot("--hardware", "h100-sxm")
    assert mine == pytest.approx(theirs, rel=1e-9)     # the same numbers, the h100-sxm table's


@pytest.mark.parametrize("hw,measured", [("h100-sxm", True), ("mi300x", False), ("h200-sxm", False)])
def test_text_summary_lists_the_fit(hw, measured):
    r = run("simulate", *RUN, "--hardware", hw)
    assert r.exit_code == 0, r.output
    fit = next(ln for ln in r.output.splitlines() if ln.startswith("fit"))
    assert ("[BORROWED]" in fit) != measured
    if hw == "mi300x":
        assert "borrowed from h100-sxm (datasheet extrapolation to mi300x)" in fit
    if hw == "h200-sxm":     # own kernel tables, end-to-end terms carried over
        assert "kernels fitted on h200-sxm" in fit and "carried over from h100-sxm" in fit


def test_plan_marks_borrowed_candidates_and_require_measured_leaves_them_out():
    args = ("plan", "--hardware", "h100-sxm,mi300x", "--tp", "1", "--rate", "2", "--slo", "ttft_p99=2s",
            "--num-requests", "200", "--isl", "256", "--osl", "64", "--workers", "1", "--format", "json")
    r = run(*args)
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    fits = {c["hardware"]: c["fit"] for c in out["candidates"]}
    assert fits == {"h100-sxm": "measured", "mi300x": "borrowed"}
    assert out["best"]["hardware"] == "mi300x" and out["best"]["fit"] == "borrowed"   # cheaper, but borrowed
    r = run(*args, "--require-measured")
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["best"]["hardware"] == "h100-sxm" and out["best"]["fit"] == "measured"
    status = {c["hardware"]: c["status"] for c in out["candidates"]}
    assert status["mi300x"] == "borrowed_fit"
