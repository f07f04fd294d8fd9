"""The cold-compile notice (`servesim._jitcache.compile_notice`) and `servesim warmup`."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from numba import njit

from servesim import _jitcache
from servesim.cli import main



def _probe(module: str):
    def probe(x):
        return x + 1
    probe.__module__ = module
    return njit(probe)


def test_the_first_compile_of_servesim_code_prints_one_line_once(capsys, monkeypatch):
    monkeypatch.setitem(_jitcache._notice, "said", False)
    _jitcache.compile_notice()
    _jitcache.compile_notice()                      # idempotent: one listener
    _probe("not_servesim.probe")(1)                 # another package's compile: nothing
    _probe(None)(1)                                 # (a function made by exec has no module)
    assert capsys.readouterr().err == ""
    first = _probe("servesim.probe_a")
    first(1)
    first(2)                                        # compiled already: no event
    _probe("servesim.probe_b")(1)                   # a later compile in the same process: nothing more
    err = capsys.readouterr().err
    assert err == _jitcache.NOTICE.format(s=_jitcache.COLD_COMPILE_S) + "\n"
    assert err.startswith("compiling the simulator (first run only, about ")


def _warmup_lines():
    res = CliRunner().invoke(main, ["warmup"])
    assert res.exit_code == 0, res.output
    return res.stdout.splitlines()


def test_warmup_runs_each_feature_set_and_reports_its_time(monkeypatch):
    import servesim.api
    runs = dict(list(servesim.api.WARMUP_RUNS.items())[:1])     # (compiled already; all of them: the slow test)
    monkeypatch.setattr(servesim.api, "WARMUP_RUNS", runs)
    lines = _warmup_lines()
    assert [ln.split(":")[0] for ln in lines] == list(runs) + [servesim.api.LONG_RUNS.split(":")[0]]
    assert all(ln.endswith(" s") and float(ln.split(": ")[1][:-2]) >= 0 for ln in lines)


@pytest.mark.slow
def test_warmup_covers_every_feature_set():
    from servesim.api import LONG_RUNS, WARMUP_RUNS
    assert [ln.split(":")[0] for ln in _warmup_lines()] == list(WARMUP_RUNS) + [LONG_RUNS]


@pytest.mark.slow
def test_a_cold_cache_prints_the_notice_and_a_warm_one_does_not(tmp_path):
    import servesim
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"),
               PYTHONPATH=str(Path(servesim.__file__).resolve().parent.parent))   # the package under test
    cmd = [sys.executable, "-m", "servesim", "simulate", "--num-requests", "20", "--format", "json"]
    cold = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, check=True)
    assert cold.stderr.splitlines() == [_jitcache.NOTICE.format(s=_jitcache.COLD_COMPILE_S)]
    warm = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, check=True)
    assert warm.stderr == ""
    assert warm.stdout == cold.stdout


def test_warm_long_runs_compiles_what_a_long_run_calls():
    """`servesim warmup`'s last step compiles the helpers only long runs call with the types a long run
    (exact and streamed) calls them with: the run adds no signature, so it compiles nothing."""
    import servesim
    from servesim.api import warm_long_runs
    from servesim.batchmeans import batch_squares_nb
    from servesim.engine.state import gather_nb
    from servesim.order import bucket_argsort_nb
    helpers = (batch_squares_nb, gather_nb, bucket_argsort_nb)
    if not all(hasattr(f, "signatures") for f in helpers):
        pytest.skip("numba's JIT is off")
    warm_long_runs()
    before = [set(f.signatures) for f in helpers]
    assert all(before)
    n = 70_000      # over the 65,536 requests that take these paths
    servesim.simulate(replicas=4, rate=40.0, num_requests=n, seed=0)
    servesim.simulate(replicas=4, rate=40.0, num_requests=n, seed=0, stream=True)
    assert [set(f.signatures) for f in helpers] == before
