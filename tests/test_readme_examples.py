"""The README's `plan`, `compare` and `report` examples run as written (issue #17).

Every `servesim plan|compare|report` line of a ```bash block of README.md is run through the CLI in
a scratch folder, and what the README says it gives is checked.
"""
from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from servesim.cli import main

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_commands(names=("plan", "compare", "report")) -> list[list[str]]:
    cmds = []
    for block in re.findall(r"```bash\n(.*?)```", README.read_text(), re.S):
        for line in block.replace("\\\n", " ").splitlines():
            args = shlex.split(line, comments=True)
            if len(args) > 1 and args[0] == "servesim" and args[1] in names:
                cmds.append(args[1:])
    return cmds


def test_readme_has_the_examples():
    found = {c[0] for c in readme_commands()}
    assert found == {"plan", "compare", "report"}


@pytest.mark.slow
@pytest.mark.parametrize("args", readme_commands(), ids=lambda a: " ".join(a)[:60])
def test_readme_example_runs(args, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    if args[0] == "plan":
        best = json.loads(res.output)["best"]
        assert 0 < best["capacity_headroom"] < 1 and best["max_sustainable_rate"] > best["rate"]
        split = best["cost_split"]
        assert split["used_usd_per_hour"] + split["headroom_usd_per_hour"] == pytest.approx(best["usd_per_hour"])
        out = Path(args[args.index("-o") + 1])
        assert {"plan.json", "candidates.csv"} <= {p.name for p in out.iterdir()}
    elif args[0] == "compare":
        assert res.output.count("the cheapest meeting the SLO") == len(args[args.index("--hardware") + 1].split(","))
    else:
        text = (Path(args[args.index("-o") + 1]) / "report.md").read_text()
        assert "capacity headroom of" in text and "serving deployment" in text
