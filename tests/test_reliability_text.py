"""Paths and text (issue #16): a file named by another file can only be a trace or a profile, error
messages never print the content of a file that is not what it claims to be, and text from user
files or options is escaped in report.md."""
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from servesim.cli import main
from servesim.config import load_hardware
from servesim.errors import ConfigError
from servesim.report.build import md_code, md_table, md_text
from servesim.workload import load_workload
from servesim.workload.traces import read_trace
from clihelp import one_line_error

REPO = Path(__file__).resolve().parents[1]
MARKER = "SECRET-MARKER-7f3a"


@pytest.fixture()
def secret(tmp_path):
    """A file outside the workload's folder whose first line must never be printed."""
    outside = tmp_path / "outside"
    outside.mkdir()
    f = outside / "secret.csv"
    f.write_text(f"root:x:0:0:{MARKER}:/root:/bin/bash\nline two {MARKER}\n")
    (outside / "passwd").write_text(f"root:x:0:0:{MARKER}:/root:/bin/bash\n")
    return f


def _workload_toml(folder: Path, trace: str, description: str = "a test workload") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    p = folder / "mine.toml"
    p.write_text(f'name = "mine"\ndescription = {description!r}\nsource = "tests"\ndefault_rate = 1.0\n'
                 f'[prompt]\nkind = "empirical"\ntrace = {trace!r}\n[output]\nkind = "fixed"\nvalue = 10\n')
    return p


@pytest.mark.parametrize("trace", [
    "../outside/secret.csv",                  # leaves the workload's folder
    "../../../../../../../../etc/passwd",     # the example
    "ABSOLUTE",                               # an absolute path
    "../outside/passwd",                      # not a .csv
    "sub/../../outside/secret.csv",
    "link.csv",                               # a link in the folder leading out of it
])
def test_workload_trace_paths_stay_inside_and_never_echo(tmp_path, secret, trace):
    folder = tmp_path / "wl"
    folder.mkdir()
    (folder / "link.csv").symlink_to(secret)
    trace = str(secret) if trace == "ABSOLUTE" else trace
    p = _workload_toml(folder, trace)
    with pytest.raises(ConfigError) as e:
        load_workload(p)
    assert MARKER not in str(e.value) and "root:x" not in str(e.value)
    msg = one_line_error("simulate", "--workload", str(p), "--num-requests", "10")
    assert MARKER not in msg and "mine.toml:7" in msg


@pytest.mark.parametrize("header, words", [
    (f"root:x:0:0:{MARKER}:/root:/bin/bash", ["1 column(s)", "is this a trace?"]),
    (f"a,b,{MARKER}", ["3 column(s)"]),
    (f"TIMESTAMP,{MARKER},ContextTokens", ["missing column(s) GeneratedTokens", "TIMESTAMP, ContextTokens",
                                           "1 other column(s)"]),
])
def test_trace_errors_never_echo_an_unknown_header(tmp_path, header, words):
    p = tmp_path / "given.csv"
    p.write_text(header + "\n1,2,3\n")
    with pytest.raises(ConfigError) as e:
        read_trace(p)
    msg = str(e.value)
    assert MARKER not in msg
    for w in words:
        assert w in msg, msg
    assert MARKER not in one_line_error("simulate", "--workload", str(p))


def test_bad_cells_of_a_trace_are_quoted_short_and_escaped(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,5,5\n1,\"x" + "y" * 200 + "\x1b[31m\",3\n")
    with pytest.raises(ConfigError) as e:
        read_trace(p)
    msg = str(e.value)
    assert "t.csv:3" in msg and "yyy..." in msg and len(msg) < 300 and "\x1b" not in msg


def test_hardware_efficiency_from_is_a_name_not_a_path(tmp_path, secret):
    text = (REPO / "hardware_profiles" / "h200-sxm.toml").read_text()
    assert 'efficiency_from = "h100-sxm"' in text
    for bad in ("../outside/secret", str(secret.with_suffix(""))):
        p = tmp_path / "hw" / "h200-sxm.toml"
        p.parent.mkdir(exist_ok=True)
        p.write_text(text.replace('efficiency_from = "h100-sxm"', f"efficiency_from = {bad!r}"))
        with pytest.raises(ConfigError, match="must name a profile .*not a path") as e:
            load_hardware(p)
        assert MARKER not in str(e.value)


# ----------------------------------------------------------------------------- report.md

@pytest.mark.parametrize("text, absent, present", [
    ("<img src=x onerror=alert(1)>", ["<img"], ["&lt;img"]),
    ("<script>alert(1)</script>", ["<script>"], ["&lt;script&gt;"]),
    ("[click](http://evil.example)", ["[click]"], [r"\[click\]"]),
    ("![pixel](http://evil.example/p.png)", ["![pixel]"], [r"!\[pixel\]"]),
    ("**bold** _it_ `code` ~~x~~", ["**bold**", "`code`"], [r"\*\*bold\*\*", r"\`code\`"]),
    ("a | b\n# heading\n- item", ["\n", "a | b"], [r"a \| b # heading - item"]),
    ("plain text, (parentheses) and 1.5", [], ["plain text, (parentheses) and 1.5"]),
])
def test_md_text_escapes_markup_and_html(text, absent, present):
    out = md_text(text)
    for a in absent:
        assert a not in out, out
    for p in present:
        assert p in out, out


@pytest.mark.parametrize("text, expected", [("chat", "`chat`"), ("a`b", "`` a`b ``"), ("x\ny", "`x y`")])
def test_md_code_spans_cannot_be_closed_early(text, expected):
    assert md_code(text) == expected


def test_md_table_cells_cannot_break_the_table():
    import pandas as pd
    t = md_table(pd.DataFrame({"reason": ["a | b\nc", "<b>x</b>"], "n": [1, 2.5]}), {"reason": "why", "n": "n"})
    rows = t.splitlines()
    assert len(rows) == 4 and all(len(re.findall(r"(?<!\\)\|", r)) == 3 for r in rows), t
    assert "<b>" not in t


@pytest.mark.slow   # ~2-3 s: kept out of the default run for time (CI runs it)
def test_report_escapes_a_user_workload_description(tmp_path):
    folder = tmp_path / "wl"
    nasty = "<img src=x onerror=alert(1)> [click](http://evil.example) | **loud**"
    wl = _workload_toml(folder, "splitwise_conv.csv", description=nasty)
    wl.write_text(wl.read_text().replace('[prompt]\nkind = "empirical"\ntrace = \'splitwise_conv.csv\'',
                                         '[prompt]\nkind = "fixed"\nvalue = 200'))
    out = tmp_path / "rep"
    r = CliRunner().invoke(main, ["report", "--workload", str(wl), "--rates", "2", "--rate", "2",
                                  "--num-requests", "40", "--train-tokens", "1e9", "--train-gpus", "8",
                                  "--max-gpus", "2", "-o", str(out)])
    assert r.exit_code == 0, r.output
    text = (out / "report.md").read_text()
    assert "<img" not in text and "[click](" not in text and "**loud**" not in text
    assert md_text(nasty) in text
