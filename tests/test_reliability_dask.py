"""Dask faults (issue #16): all workers lost or the scheduler lost end a sweep with one clean line after
--dask-timeout (never a hang, never a CommClosedError traceback), the points finished before are kept;
losing one of two workers changes nothing."""
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

distributed = pytest.importorskip("dask.distributed")

from servesim.api import SimConfig  # noqa: E402
from servesim.cli import main  # noqa: E402
from servesim.errors import ConfigError, ServesimError  # noqa: E402
from servesim.planning import backends  # noqa: E402
from servesim.planning import grid as G  # noqa: E402
from servesim.planning import sweep as S  # noqa: E402
from servesim.planning.backends import ClusterError, DaskBackend  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
BASE = SimConfig(num_requests=200, slo="ttft_p99=1s,tpot_p99=60ms")


@pytest.fixture()
def threads_cluster():
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                  dashboard_address=None) as cluster:
        yield cluster


@pytest.fixture()
def scheduler_process(tmp_path):
    """A scheduler and one worker in their own processes (as on a real cluster): (address, scheduler)."""
    sf = tmp_path / "scheduler.json"
    quiet = dict(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO)
    sched = subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler", "--scheduler-file", str(sf),
                              "--port", "0", "--no-dashboard"], **quiet)
    procs = [sched]
    try:
        t0 = time.monotonic()
        while not sf.exists():
            assert time.monotonic() - t0 < 30 and sched.poll() is None, "scheduler did not start"
            time.sleep(0.05)
        addr = json.loads(sf.read_text())["address"]
        procs.append(subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_worker", addr, "--nworkers", "1",
                                       "--nthreads", "1", "--no-nanny", "--no-dashboard"], **quiet))
        yield addr, sched
    finally:
        for p in procs:
            p.kill()
            p.wait()


def _wait_for_workers(be: DaskBackend, n: int = 1):
    t0 = time.monotonic()
    while len(be.client.nthreads()) < n:
        assert time.monotonic() - t0 < 30, "no worker came up"
        time.sleep(0.05)


def _one_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("servesim: error:"), text
    assert "Traceback" not in text and "CommClosedError" not in text
    return lines[0]


def test_all_workers_lost_ends_after_the_timeout_keeping_finished_points(threads_cluster):
    got = {}

    def on_result(i, r):
        got[i] = r
        if len(got) == 3:
            threads_cluster.scale(0)          # every worker leaves mid-sweep

    with DaskBackend(threads_cluster.scheduler_address, timeout=1.5) as be:
        t0 = time.monotonic()
        with pytest.raises(ClusterError) as e:
            be.map(time.sleep, [0.1] * 30, on_result=on_result)
        waited = time.monotonic() - t0
    msg = str(e.value)
    assert "\n" not in msg and "no worker is connected for 1.5 s (--dask-timeout)" in msg
    assert f"{len(got)} of 30 points were completed" in msg and len(got) >= 3
    assert waited < 15
    assert isinstance(e.value, ServesimError)


def test_one_of_two_workers_lost_gives_identical_output(threads_cluster):
    g = G.parse_grid(["tp=1,2"])
    serial = S.run_sweep(BASE, g, [2.0, 6.0, 10.0]).points
    seen = []

    def progress(n):
        seen.append(n)
        if len(seen) == 1:
            threads_cluster.scale(1)          # one worker leaves; the scheduler reruns its tasks

    with backends.make_backend(threads_cluster.scheduler_address, dask_timeout=10) as be:
        remote = S.run_sweep(BASE, g, [2.0, 6.0, 10.0], be, progress=progress).points
    pd.testing.assert_frame_equal(serial, remote)


def test_scheduler_lost_is_one_clean_error(scheduler_process):
    addr, sched = scheduler_process
    got = {}

    def on_result(i, r):
        got[i] = r
        if len(got) == 2:
            os.kill(sched.pid, signal.SIGKILL)   # the scheduler dies mid-sweep

    with DaskBackend(addr, timeout=3) as be:
        _wait_for_workers(be)
        t0 = time.monotonic()
        with pytest.raises(ClusterError) as e:
            be.map(time.sleep, [0.2] * 20, on_result=on_result)
        assert time.monotonic() - t0 < 15
    msg = str(e.value)
    assert "\n" not in msg and addr in msg and ("scheduler" in msg) and len(got) >= 2
    assert f"{len(got)} of 20 points were completed" in msg


def test_cli_sweep_without_workers_fails_after_the_timeout():
    with distributed.LocalCluster(n_workers=0, processes=False, dashboard_address=None) as cluster:
        t0 = time.monotonic()
        r = CliRunner().invoke(main, ["sweep", "--rates", "2,4", "--num-requests", "50", "--dask-scheduler",
                                      cluster.scheduler_address, "--dask-timeout", "1"])
        assert time.monotonic() - t0 < 15
    assert r.exit_code == 2, r.output
    line = _one_line(r.output)
    assert "no worker is connected for 1 s (--dask-timeout)" in line and "0 of 2 points" in line


@pytest.mark.parametrize("value, words", [
    ("0", ["--dask-timeout must be a finite number of seconds > 0"]),
    ("-5", ["--dask-timeout must be"]),
    ("nan", ["--dask-timeout must be"]),
    ("inf", ["--dask-timeout must be"]),
])
def test_bad_dask_timeout_is_one_line(value, words):
    for cmd in (["sweep", "--rates", "2"], ["plan", "--rate", "2", "--slo", "ttft_p99=1s"]):
        r = CliRunner().invoke(main, cmd + ["--dask-scheduler", "tcp://127.0.0.1:1", "--dask-timeout", value])
        assert r.exit_code == 2, r.output
        line = _one_line(r.output)
        for w in words:
            assert w in line, line


def test_dask_timeout_without_a_scheduler_is_an_error():
    with pytest.raises(ConfigError, match="--dask-timeout 5 does nothing without --dask-scheduler"):
        backends.make_backend(None, 2, 5.0)


@pytest.mark.slow
def test_cli_sweep_scheduler_killed_keeps_points_and_resumes(tmp_path, scheduler_process):
    """The CLI in its own process, `sweep -o` on a one-worker cluster whose scheduler is killed once a
    few points are saved: one line, exit 2, the saved points kept and reused by a rerun."""
    addr, sched = scheduler_process
    out = tmp_path / "out"
    args = ["sweep", "--rates", "1:16:24", "--num-requests", "300", "-o", str(out)]
    points = out / "points"

    def killer():
        t0 = time.monotonic()
        while time.monotonic() - t0 < 120:
            if points.is_dir() and len(list(points.glob("*.json"))) >= 2:
                os.kill(sched.pid, signal.SIGKILL)
                return
            time.sleep(0.05)

    threading.Thread(target=killer, daemon=True).start()
    r = subprocess.run([sys.executable, "-m", "servesim"] + args + ["--dask-scheduler", addr, "--dask-timeout", "5"],
                       capture_output=True, text=True, timeout=300, cwd=REPO)
    assert r.returncode == 2, r.stderr
    line = _one_line(r.stderr)
    assert addr in line and "points were completed (kept)" in line
    saved = len(list(points.glob("*.json")))
    assert saved >= 2
    again = subprocess.run([sys.executable, "-m", "servesim"] + args + ["--workers", "1", "--format", "json"],
                           capture_output=True, text=True, timeout=300, cwd=REPO)
    assert again.returncode == 0, again.stderr
    assert f"reused {saved} of 24 points" in again.stderr
    assert len(json.loads(again.stdout)["points"]) == 24
