"""Issue #16, "atomic outputs and interrupts": every output is written to a temporary name beside its
target and renamed; a bad output path is one line (exit 2) in every command; SIGINT / SIGTERM leave
the previous complete output or a folder marked INCOMPLETE, and exit 130 / 143 with one line; a sweep
saves each point as it finishes, a rerun skips the saved ones, and its pool workers die with it."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from servesim.cli import main
from servesim.errors import ConfigError
from servesim.outputs import INCOMPLETE, OutputDir, atomic_file, write_text_atomic
from clihelp import one_line_error

REPO = Path(__file__).resolve().parent.parent
SLO = "ttft_p99=1s,tpot_p99=60ms"


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def leftovers(folder: Path) -> list[str]:
    """Temporary names servesim could leave behind: staging folders, partial files, probes."""
    return [p.name for p in folder.rglob("*") if p.name.startswith(".servesim-") or ".partial" in p.name]


# ---------------------------------------------------------------- the helpers


def test_atomic_file_keeps_the_previous_file_on_error(tmp_path):
    target = tmp_path / "profile.toml"
    target.write_text("old\n")
    with pytest.raises(RuntimeError):
        with atomic_file(target) as tmp:
            tmp.write_text("half of the new")
            raise RuntimeError("stopped while writing")
    assert target.read_text() == "old\n" and leftovers(tmp_path) == []
    write_text_atomic(target, "new\n")
    assert target.read_text() == "new\n" and leftovers(tmp_path) == []


def test_output_dir_all_or_nothing(tmp_path):
    out = tmp_path / "out"
    with OutputDir(out) as d:
        (d.stage / "a.csv").write_text("1\n")
        (d.stage / "b.json").write_text("{}\n")
        assert not (out / "a.csv").exists()          # nothing visible until the command finishes
    assert sorted(p.name for p in out.iterdir()) == ["a.csv", "b.json"]
    for exc in (KeyboardInterrupt, ConfigError):
        with pytest.raises(exc) as e:
            with OutputDir(out) as d:
                (d.stage / "a.csv").write_text("2\n")
                raise exc("stop")
        assert (out / "a.csv").read_text() == "1\n" and leftovers(out) == [] and not (out / INCOMPLETE).exists()
    with pytest.raises(KeyboardInterrupt) as e:
        with OutputDir(tmp_path / "fresh"):
            raise KeyboardInterrupt
    assert not (tmp_path / "fresh").exists() and "nothing written" in e.value.servesim_notes[0]


def test_output_dir_marks_a_failed_commit(tmp_path):
    out = tmp_path / "out"
    (out / "b.csv").mkdir(parents=True)               # a folder where a file must go
    with pytest.raises(ConfigError, match="INCOMPLETE"):
        with OutputDir(out) as d:
            (d.stage / "a.csv").write_text("1\n")
            (d.stage / "b.csv").write_text("2\n")
    text = (out / INCOMPLETE).read_text()
    assert "Written: a.csv" in text and "b.csv" in text and leftovers(out) == []


# ---------------------------------------------------------------- bad output paths, every command


def _commands(tmp: Path, target: str) -> list[list[str]]:
    small = ["--num-requests", "20"]
    return [
        ["simulate", *small, "-o", target],
        ["sweep", "--rates", "1", *small, "--workers", "1", "-o", target],
        ["plan", "--slo", SLO, *small, "--workers", "1", "-o", target],
        ["report", "-o", target],
        ["validate", "--suite", "training", "-o", target],
        ["train", "-o", target],
        ["compare", "-o", target],
        ["calibrate", "--profile", "h100-sxm", "--training", str(tmp / "t.csv"), "-o", target + ".toml"],
        ["calibrate", "--profile", "h100-sxm", "--training", str(tmp / "t.csv"), "-o", str(tmp / "ok.toml"),
         "--report", target],
    ]


@pytest.mark.parametrize("where", ["under-a-file", "dev-full", "proc"])
def test_bad_output_paths_are_one_line_in_every_command(tmp_path, where):
    (tmp_path / "afile").write_text("x")
    (tmp_path / "t.csv").write_text("")
    target = {"under-a-file": str(tmp_path / "afile" / "out"), "dev-full": "/dev/full",
              "proc": "/proc/servesim-no-such-dir/out"}[where]
    for args in _commands(tmp_path, target):
        if where == "dev-full" and args[0] == "calibrate" and "--report" not in args:
            args = args[:-1] + ["/dev/full"]           # the file itself, not a .toml next to it
        one_line_error(*args)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "t.csv"]


def test_empty_output_and_train_output(tmp_path):
    one_line_error("simulate", "--num-requests", "20", "-o", "", must_contain=["-o", "empty path"])
    r = cli("train", "--gpus", "8", "-o", tmp_path / "t")
    assert r.exit_code == 0, r.output
    d = json.loads((tmp_path / "t" / "train.json").read_text())
    assert d["step_time_s"] > 0 and d["gpus"] == 8


def test_calibrate_refuses_to_overwrite_a_report(tmp_path):
    training = REPO / "servesim/calibrate/data/training_published_calibration.csv"
    for rep, extra in ((tmp_path / "mine-fit", []), (tmp_path / "elsewhere", ["--report", tmp_path / "elsewhere"])):
        rep.mkdir()                                    # the default report folder of -o mine.toml is mine-fit/
        (rep / "report.md").write_text("an earlier fit\n")
        one_line_error("calibrate", "--profile", "h100-sxm", "--training", training, "-o", tmp_path / "mine.toml",
                       *extra, must_contain=["--report", "--force"])
        assert (rep / "report.md").read_text() == "an earlier fit\n" and not (tmp_path / "mine.toml").exists()


# ---------------------------------------------------------------- real signals, in a subprocess


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _default_sigint():
    # a test run started in the background of a shell (`pytest &`) ignores SIGINT, and a child inherits
    # that (as a shell's background job should); these children must see it
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _servesim(args, cwd, **kw):
    return subprocess.Popen([sys.executable, "-m", "servesim", *map(str, args)], cwd=cwd, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_default_sigint, **kw)


def _wait_for(predicate, proc, timeout=60.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.02)
    return False


def _consistent_simulate_output(out: Path) -> int:
    """Either marked INCOMPLETE, or a complete set whose table matches its summary: returns the count."""
    assert leftovers(out) == []
    if (out / INCOMPLETE).exists():
        return -1
    summary = json.loads((out / "summary.json").read_text())
    rows = len(pd.read_csv(out / "requests.csv"))
    assert rows == summary["num_requests"], (rows, summary["num_requests"])
    assert (out / "latency_cdf.png").stat().st_size > 0 and (out / "batch_kv_timeline.png").stat().st_size > 0
    return rows


@pytest.mark.parametrize("sig, status", [(signal.SIGTERM, 143),
                                         pytest.param(signal.SIGINT, 130, marks=pytest.mark.slow)])
def test_signal_while_simulate_writes_keeps_the_previous_output(tmp_path, sig, status):
    out = tmp_path / "out"
    r = cli("simulate", "--num-requests", "100", "-o", out)
    assert r.exit_code == 0, r.output
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    for n in (30000, 120000, 480000):
        proc = _servesim(["simulate", "--num-requests", n, "--rate", "30", "-o", out], tmp_path)
        writing = _wait_for(lambda: any(p.name.startswith(".servesim-partial-") for p in out.iterdir()), proc)
        if writing and proc.poll() is None:
            break
        # the run finished its writing before the signal could be sent (a loaded machine): a longer one
        proc.communicate(timeout=120)
        assert proc.returncode == 0 and _consistent_simulate_output(out) == n
        before = {p.name: p.read_bytes() for p in out.iterdir()}
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert writing, "the run ended before it started writing; use more requests"
    assert proc.returncode == status, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"servesim: interrupted by {sig.name}"), err
    rows = _consistent_simulate_output(out)
    if 0 <= rows != n:   # interrupted before the rename: the earlier output, byte for byte
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before and "untouched" in lines[0]


def test_a_signal_held_while_the_folder_is_created_leaves_nothing(tmp_path, monkeypatch):
    """A SIGTERM sent while the output folder is being created is held (signals blocked) and arrives
    as the block ends, before the command's `with` body: the new folder is removed as after it."""
    import contextlib

    from servesim.outputs import atomic

    @contextlib.contextmanager
    def held_signal_arrives_at_the_end():
        yield
        raise atomic.Terminated()

    monkeypatch.setattr(atomic, "_signals_blocked", held_signal_arrives_at_the_end)
    out = tmp_path / "a" / "new"
    with pytest.raises(atomic.Terminated) as e:
        OutputDir(out, "-o", "servesim simulate")
    assert not out.exists() and not (tmp_path / "a").exists()
    assert e.value.servesim_notes == [f"nothing written to {out}"]     # the CLI's message says so


def test_signal_before_any_output_leaves_nothing(tmp_path):
    out = tmp_path / "new"
    proc = _servesim(["simulate", "--num-requests", "30000", "--rate", "30", "-o", out], tmp_path)
    assert _wait_for(out.exists, proc)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    assert not out.exists() or _consistent_simulate_output(out) == 30000
    if not out.exists():
        assert "nothing written" in err


def _children(pid: int) -> list[int]:
    kids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                kids.append(int(d.name))
    return kids


def _gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


SWEEP = ["sweep", "--rates", "2,3,4,5,6,7,8,9", "--num-requests", "1500", "--seed", "3"]


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc to find the pool workers")
def test_sigterm_to_a_sweep_kills_its_workers_marks_the_folder_and_resumes(tmp_path):
    out = tmp_path / "out"
    proc = _servesim([*SWEEP, "--workers", "2", "-o", out], tmp_path)
    points = out / "points"
    assert _wait_for(lambda: points.is_dir() and any(points.glob("*.json")), proc), proc.communicate()
    workers = _children(proc.pid)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)       # returns only once nothing holds the pipes: no orphans
    assert proc.returncode == 143, err
    assert err.strip().splitlines() == [f"servesim: interrupted by SIGTERM; {out / INCOMPLETE} lists what was "
                                        "saved and what is missing"]
    time.sleep(0.5)
    assert workers and all(_gone(w) for w in workers), workers
    saved = sorted(points.glob("*.json"))
    assert 1 <= len(saved) < 8 and (out / INCOMPLETE).exists() and not (out / "sweep.csv").exists()
    assert "Rerun the same command" in (out / INCOMPLETE).read_text() and leftovers(out) == []
    # the rerun computes only the missing points and writes what an uninterrupted sweep writes
    r = cli(*SWEEP, "--workers", "1", "-o", out)
    assert r.exit_code == 0, r.output
    assert f"reused {len(saved)} of 8 points" in r.stderr and not (out / INCOMPLETE).exists()
    fresh = cli(*SWEEP, "--workers", "1", "-o", tmp_path / "fresh")
    assert fresh.exit_code == 0
    pd.testing.assert_frame_equal(pd.read_csv(out / "sweep.csv"), pd.read_csv(tmp_path / "fresh" / "sweep.csv"))


@pytest.mark.slow   # ~6-9 s: kept out of the default run for time (CI runs it)
def test_sweep_saves_points_and_a_rerun_skips_identical_ones(tmp_path, monkeypatch):
    from servesim.planning import evaluate
    calls = []
    real = evaluate.simulate_summary
    monkeypatch.setattr(evaluate, "simulate_summary", lambda cfg: calls.append(cfg.rate) or real(cfg))
    args = ["sweep", "--rates", "2,4", "--num-requests", "100", "--workers", "1", "-o", tmp_path]
    first = cli(*args)
    assert first.exit_code == 0 and sorted(calls) == [2, 4]
    assert len(list((tmp_path / "points").glob("*.json"))) == 2 and not (tmp_path / INCOMPLETE).exists()
    table = (tmp_path / "sweep.csv").read_bytes()
    calls.clear()
    again = cli(*args)
    assert again.exit_code == 0 and calls == [] and "reused 2 of 2 points" in again.stderr
    assert (tmp_path / "sweep.csv").read_bytes() == table
    calls.clear()
    assert cli(*args[:2], "2,4,8", *args[3:]).exit_code == 0 and calls == [8]          # only the new rate
    calls.clear()
    assert cli(*args, "--seed", "1").exit_code == 0 and sorted(calls) == [2, 4]       # other inputs: rerun
    calls.clear()
    for p in (tmp_path / "points").glob("*.json"):
        p.write_text("{not json")                     # unreadable points are computed again
    assert cli(*args).exit_code == 0 and sorted(calls) == [2, 4]


def test_signal_as_the_staging_folder_is_made_leaves_none(tmp_path, monkeypatch):
    """A SIGTERM delivered the moment the staging folder exists (before servesim holds its name) is
    held until it does, so the interrupt removes it."""
    import tempfile

    from servesim.outputs import Terminated, signal_handlers
    real = tempfile.mkdtemp

    def mkdtemp_then_signal(*a, **kw):
        d = real(*a, **kw)
        os.kill(os.getpid(), signal.SIGTERM)
        return d

    out = tmp_path / "out"
    with signal_handlers(), pytest.raises(Terminated):
        with OutputDir(out, "-o", "servesim simulate") as o:
            monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp_then_signal)
            (o.stage / "x.txt").write_text("x")
    assert leftovers(out) == []
