"""`servesim report`: a tiny report end to end through the CLI, and its user errors."""
import re

import pandas as pd
import pytest
from click.testing import CliRunner

from servesim.cli import main
from servesim.report import ReportSpec, regenerate_command
from servesim.report.validation import markdown_tables, profile_status

SECTIONS = ("## Scenario", "## Latency and throughput vs load", "## Where the time goes in one iteration",
            "## Cheapest configurations meeting the SLO", "## Training vs serving cost",
            "## Validation status of the profiles used")


def test_tiny_report(tmp_path):
    out = tmp_path / "rep"
    args = ["report", "--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--rates", "2,8", "--rate", "4",
            "--num-requests", "80", "--train-tokens", "1e9", "--train-gpus", "8", "--max-gpus", "4", "-o", str(out)]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    text = (out / "report.md").read_text()
    for s in SECTIONS:
        assert s in text, s
    pngs = re.findall(r"!\[[^\]]*\]\(([^)]+\.png)\)", text)
    assert {"latency_vs_rate.png", "breakdown.png", "compare.png"} <= set(pngs)
    for p in pngs:
        assert (out / p).is_file() and (out / p).stat().st_size > 1000, p
    # the regenerate command is stated and names every option that was given
    cmd = re.search(r"```bash\n(servesim report .*)\n```", text).group(1)
    for piece in ("--hardware h100-sxm", "--rates 2,8", "--rate 4", "--num-requests 80", "--train-tokens 1e+09",
                  "--train-gpus 8", "--max-gpus 4"):
        assert piece in cmd, piece
    assert "### h100-sxm: own fit" in text
    for csv in ("sweep.csv", "breakdown.csv", "plan_candidates.csv", "compare.csv"):
        assert (out / csv).is_file()
    # serving is priced on the cheapest planned deployment that meets the SLO, and says which one;
    # the sweep runs that deployment's TP
    cand = pd.read_csv(out / "plan_candidates.csv")
    meets = cand[cand.status == "meets_slo"].sort_values(["usd_per_hour", "num_gpus"]).iloc[0]
    row = pd.read_csv(out / "compare.csv").iloc[0]
    assert row.serve_meets_slo and row.serve_tp == meets.tp and row.serve_replicas == meets.replicas
    assert row.serve_usd_per_m_output == pytest.approx(meets.usd_per_million_output_tokens)
    assert f"TP={meets.tp} x" in row.serve_config
    assert set(pd.read_csv(out / "sweep.csv").tp) == {meets.tp}
    assert "capacity headroom of" in text and "sustains up to" in text


def test_bad_hardware_is_one_line_exit_2(tmp_path):
    res = CliRunner().invoke(main, ["report", "--hardware", "h100-sxm,nope-gpu", "-o", str(tmp_path / "r")])
    assert res.exit_code == 2
    lines = [ln for ln in res.output.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "nope-gpu" in lines[0]
    assert not (tmp_path / "r" / "report.md").exists()


def test_regenerate_command_round_trips_options():
    spec = ReportSpec(model="llama-3.1-70b", hardware=("h100-sxm", "h200-sxm"), rates=(1.5, 3.0), rate=2.0)
    cmd = regenerate_command(spec, "out dir")
    assert cmd.startswith("servesim report --model llama-3.1-70b --hardware h100-sxm,h200-sxm")
    assert "--rates 1.5,3 --rate 2" in cmd and cmd.endswith("-o 'out dir'")


def test_borrowed_profile_status_names_its_source():
    s = profile_status("h200-sxm")
    assert not s["own_fit"] and s["calibrated_on"] == "h100-sxm"
    assert s["fit_source"]


def test_markdown_tables_reads_pipe_tables():
    text = "# A\n\n| gpu | median rel. error |\n|---|---:|\n| h100-sxm | 5.0% |\n\ntext\n"
    [(heading, header, body)] = markdown_tables(text)
    assert heading == "A" and header == ["gpu", "median rel. error"] and body == [["h100-sxm", "5.0%"]]
