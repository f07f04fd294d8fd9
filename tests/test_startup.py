"""Start-up of a run (issue #26): a run that is only summarised never imports pandas, scipy's
subpackages, matplotlib, seaborn or dask; the request and iteration tables are built, with pandas, when
they are read."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

import servesim

# Not loaded by a summarised `simulate` (no --output), table or JSON. Allowed: `scipy` itself (numba
# imports it at its own import to check its version, with scipy.__config__, scipy.version and
# scipy._lib: ~10 ms), numpy, numba, click and what those import.
NOT_LOADED = ("pandas", "matplotlib", "seaborn", "dask", "scipy.linalg", "scipy.special", "scipy.stats",
         "scipy.optimize", "scipy.fft", "scipy.sparse", "scipy.interpolate", "scipy.integrate",
         # servesim's own, for other commands: the planner, training, calibration, reports, figures
         "servesim.workflows", "servesim.planning", "servesim.training", "servesim.calibrate.", "servesim.report",
         "servesim.figures", "servesim.cli.plan", "servesim.cli.train", "servesim.cli.report",
         "servesim.cli.calibrate")

_RUN = ("import json, sys\n"
        "from servesim.cli import main\n"
        "try:\n"
        "    main(sys.argv[1:])\n"
        "except SystemExit as e:\n"
        "    assert not e.code, e.code\n"
        "{after}"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('pandas', 'matplotlib', 'seaborn', 'dask', 'scipy', 'servesim'))), file=sys.stderr)\n")


def _run(args: list[str], after: str = "") -> tuple[str, set[str]]:
    r = subprocess.run([sys.executable, "-c", _RUN.format(after=after)] + args, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout, set(json.loads(r.stderr.strip().splitlines()[-1]))


def _not_needed(loaded: set[str]) -> list[str]:
    return sorted(m for m in loaded if any(m == h or m.startswith(h if h.endswith(".") else h + ".")
                                           for h in NOT_LOADED))


@pytest.mark.parametrize("fmt", ["table", "json"])
def test_a_summarised_run_loads_only_what_it_needs(fmt):
    out, loaded = _run(["simulate", "--num-requests", "200", "--format", fmt])
    assert _not_needed(loaded) == []
    assert ('"saturation_verdict"' in out) if fmt == "json" else ("95% CI" in out and "TTFT" in out)


def test_numba_is_told_of_the_blas_without_scipy_linalg():
    """servesim._numba_start answers numba's one BLAS probe without importing scipy.linalg, gives the answer
    numba's own probe gives here (scipy is installed), and puts numba's check back for what compiles next:
    a function using np.dot then compiles, runs and loads scipy.linalg's BLAS as before."""
    after = ("import numpy as np, numba\n"
             "from numba.np import arraymath, linalg\n"
             "before = 'scipy.linalg' in sys.modules\n"
             "assert arraymath._HAVE_BLAS is True\n"
             "assert linalg.ensure_blas.__module__ == 'numba.np.linalg' and arraymath.ensure_blas is linalg.ensure_blas\n"
             "x = np.arange(3.0)\n"
             "assert numba.njit(lambda a, b: np.dot(a, b))(x, x) == 5.0\n"
             "assert not before and 'scipy.linalg' in sys.modules\n")
    _, loaded = _run(["simulate", "--num-requests", "50"], after)
    assert "scipy.linalg" in loaded


def test_the_tables_are_built_when_read():
    res = servesim.simulate(num_requests=50, rate=2, seed=1)
    df, it = res.requests, res.iterations
    assert res.requests is df and res.iterations is it          # built once
    assert len(df) == 50 and list(df.columns[:3]) == ["arrival_s", "engine_arrival_s", "scheduled_s"]
    assert df.index.name == "request" and str(df.status.dtype) == "category"
    assert int((df.status == "done").sum()) == res.summary["num_completed"]
    assert list(it.columns) == ["time_s", "replica", "batch_size", "tokens", "kv_blocks", "waiting"]
    assert len(it) > 0
