"""Progress on long work (issue #25, item 6): plan, plan --disaggregated, sweep and validate draw a
tqdm-style bar on a terminal that moves with every simulation, and nothing on a pipe."""
from __future__ import annotations

import io
import json
import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import pytest

from servesim import progress as P
from servesim.planning.backends import Backend, LocalBackend

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--num-requests", "200", "--isl", "256", "--osl", "64"]


class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_bar_draws_on_a_terminal_only():
    tty, pipe = _Tty(), io.StringIO()
    for stream in (tty, pipe):
        bar = P.Bar("sweep", total=4, unit="points", stream=stream)
        bar.EVERY = 0.0
        with bar:
            for _ in range(4):
                P.tick()           # the listener installed by the bar
                bar.task()
    assert pipe.getvalue() == ""
    frames = tty.getvalue().split("\r")[1:]
    assert len(frames) == 1 + 8 + 1      # first draw, every tick and task, the last
    assert "0/4 points" in frames[0] and "100%|####################| 4/4 points" in frames[-1]
    assert "4 simulations" in frames[-1] and tty.getvalue().endswith("\n")
    counter = P.Bar("plan", stream=_Tty())
    assert counter.line().startswith("plan: 0 simulations [00:00")


@pytest.mark.parametrize("backend", [Backend, lambda: LocalBackend(2)], ids=["serial", "pool"])
def test_every_simulation_reaches_the_listener(backend):
    """Ticks from the calling process and from pool workers (forwarded by the parent) alike."""
    from dataclasses import replace
    from servesim.checks import sim_config
    from servesim.planning.evaluate import point_row
    cfg = sim_config(None, "simulate", num_requests=100, isl=128, osl=16)
    seen = []
    with backend() as be, P.listen(seen.append):
        be.map(point_row, [(i, replace(cfg, rate=r)) for i, r in enumerate((2.0, 4.0, 8.0))])
    assert sum(seen) == 3


def _run(args, tty: bool):
    """servesim ARGS with standard error on a terminal (a pty) or a pipe: (stdout, stderr)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "servesim"] + args
    if not tty:
        p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
        return p.stdout, p.stderr
    master, slave = pty.openpty()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=slave, stdin=subprocess.DEVNULL, cwd=ROOT, env=env)
    os.close(slave)
    err = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:
            break
        if not chunk:
            break
        err += chunk
    out = p.stdout.read().decode()
    p.wait(timeout=600)
    os.close(master)
    return out, err.decode(errors="replace")


def _counts(err: str) -> list[int]:
    return [int(n) for n in re.findall(r"(\d+) simulations", err)]


@pytest.mark.slow   # subprocesses, ~20 s: CI runs it
@pytest.mark.parametrize("args", [
    ["plan", "--hardware", "h100-sxm,a100-sxm-80gb", "--tp", "1,2", "--rate", "4", "--slo", "ttft_p99=1s"],
    ["plan", "--disaggregated", "--hardware", "h100-sxm", "--tp", "1", "--rate", "4", "--slo", "ttft_p99=1s"],
], ids=["plan", "plan-disaggregated"])
def test_plan_bar_counts_every_simulation_on_a_terminal_and_nothing_on_a_pipe(args):
    """Before, plan's bar stayed at 0% (it was never told of any progress)."""
    out, err = _run(args + SMALL + ["--format", "json"], tty=True)
    n = json.loads(out)["simulations"]
    counts = _counts(err)
    assert counts[0] == 0 and counts[-1] == n and len(set(counts)) >= min(n, 4), (n, counts)
    out, err = _run(args + SMALL + ["--format", "json"], tty=False)
    assert "simulations [" not in err and "\r" not in err and json.loads(out)["simulations"] == n


@pytest.mark.slow   # subprocesses, ~10 s: CI runs it
def test_sweep_bar_fills_per_point():
    out, err = _run(["sweep", "--rates", "2,4,8", "--workers", "2"] + SMALL + ["--format", "json"], tty=True)
    assert "3/3 points" in err and _counts(err)[-1] == 3 and "100%|" in err
    _, err = _run(["sweep", "--rates", "2,4,8"] + SMALL, tty=False)
    assert "points [" not in err


@pytest.mark.slow   # the serving suite, ~40 s: CI runs it
def test_validate_bar_moves():
    out, err = _run(["validate", "--suite", "serving", "--quick"], tty=True)
    counts = _counts(err)
    assert counts[-1] > 10 and len(set(counts)) > 5 and "serving:" in out
