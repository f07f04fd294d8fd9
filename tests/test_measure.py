"""experiments/measure/measure.py: the CPU tiny mode runs end to end and writes the native calibration CSV."""
from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "experiments" / "measure" / "measure.py"
COLUMNS = ["op", "dtype", "m", "k", "n", "bytes", "gpus", "time_us", "device", "torch_version"]


def _run(args, timeout=120):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _read(path):
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh)
        return reader.fieldnames, list(reader)


def test_cpu_tiny_mode_writes_native_csv(tmp_path):
    out = tmp_path / "ops.csv"
    proc = _run([sys.executable, str(SCRIPT), "--out", str(out), "--device", "cpu"])
    assert "wrote" in proc.stderr  # progress goes to stderr
    columns, rows = _read(out)
    assert columns == COLUMNS
    assert {r["op"] for r in rows} == {"gemm", "attention_prefill", "attention_decode", "copy"}
    for r in rows:
        assert float(r["time_us"]) > 0
        assert r["device"].startswith("cpu") and r["torch_version"] == torch.__version__
        assert r["dtype"] == "bf16"
    gemms = [r for r in rows if r["op"] == "gemm"]
    for r in gemms:
        assert all(int(r[c]) > 0 for c in "mkn") and r["bytes"] == "" and r["gpus"] == ""
    for r in rows:
        if r["op"] == "attention_prefill":
            assert int(r["m"]) > 0 and int(r["k"]) > 0 and int(r["n"]) > 0 and r["bytes"] == ""
        elif r["op"] == "attention_decode":
            assert int(r["m"]) > 0 and int(r["n"]) > 0 and int(r["bytes"]) > 0
        elif r["op"] == "copy":
            assert int(r["bytes"]) > 0 and r["m"] == r["k"] == r["n"] == ""
    # Plausible monotonicity, well clear of timing noise: the biggest GEMM is not faster than the smallest.
    flops = lambda r: int(r["m"]) * int(r["k"]) * int(r["n"])  # noqa: E731
    small, big = min(gemms, key=flops), max(gemms, key=flops)
    assert flops(big) > 100 * flops(small)
    assert float(big["time_us"]) >= float(small["time_us"])


def test_single_process_skips_collectives(tmp_path):
    out = tmp_path / "c.csv"
    proc = _run([sys.executable, str(SCRIPT), "--out", str(out), "--device", "cpu",
                 "--ops", "copy,allreduce,sendrecv"])
    assert "skipping allreduce,sendrecv" in proc.stderr
    columns, rows = _read(out)
    assert columns == COLUMNS and {r["op"] for r in rows} == {"copy"}


def test_bad_dtype_is_refused(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "x.csv"), "--device", "cpu",
                           "--dtypes", "int3"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 2 and "int3" in proc.stderr
    assert not (tmp_path / "x.csv").exists()


def test_collectives_under_torchrun_gloo(tmp_path):
    """The torch.distributed path (NCCL on GPUs) exercised on the CPU with gloo and two processes."""
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo not available")
    out = tmp_path / "nccl.csv"
    _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
          str(SCRIPT), "--collectives", "--device", "cpu", "--out", str(out), "--repeats", "3"])
    columns, rows = _read(out)
    assert columns == COLUMNS
    assert {r["op"] for r in rows} == {"allreduce", "sendrecv"}
    for r in rows:
        assert float(r["time_us"]) > 0 and int(r["bytes"]) > 0 and int(r["gpus"]) == 2
        assert r["m"] == r["k"] == r["n"] == ""
