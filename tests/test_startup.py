"""Start-up of a run (issue #26): a run that is only summarised never imports pandas; the request and
iteration tables are built, with pandas, when they are read."""
from __future__ import annotations

import subprocess
import sys

import servesim


def test_a_summarised_run_does_not_import_pandas():
    code = ("import sys\n"
            "from servesim.cli import main\n"
            "try:\n"
            "    main(['simulate', '--num-requests', '200', '--format', 'json'])\n"
            "except SystemExit as e:\n"
            "    assert not e.code, e.code\n"
            "print('pandas' in sys.modules, file=sys.stderr)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stderr.strip().splitlines()[-1] == "False"
    assert '"saturation_verdict"' in r.stdout


def test_the_tables_are_built_when_read():
    res = servesim.simulate(num_requests=50, rate=2, seed=1)
    df, it = res.requests, res.iterations
    assert res.requests is df and res.iterations is it          # built once
    assert len(df) == 50 and list(df.columns[:3]) == ["arrival_s", "engine_arrival_s", "scheduled_s"]
    assert df.index.name == "request" and str(df.status.dtype) == "category"
    assert int((df.status == "done").sum()) == res.summary["num_completed"]
    assert list(it.columns) == ["time_s", "replica", "batch_size", "tokens", "kv_blocks", "waiting"]
    assert len(it) > 0
