"""Simulation speed: the standard case of the serving issue.

llama-3.1-8b on h100-sxm, 4 replicas, vllm policy, chat workload at ~80% of capacity,
1,000,000 requests. Prints simulated requests per wall-clock second, iterations per second,
the first-call (compiling) time and a cached start of `servesim simulate` with 10,000 requests.

    python experiments/bench_speed.py [--requests 1000000] [--threads N]

``--threads``: simulate's ``--threads`` for the timed runs (default: servesim's, the usable cores at most
the 4 replicas; engine/split.py).
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def cold_compile_seconds() -> float:
    """A fresh interpreter with an empty numba cache: import + compile + a 100-request run.

    The cache is a new, empty NUMBA_CACHE_DIR (a temporary folder), so nothing cached anywhere else
    (the package's __pycache__, another NUMBA_CACHE_DIR) is used or deleted."""
    code = "import servesim; servesim.simulate(num_requests=100)"
    with tempfile.TemporaryDirectory(prefix="servesim-cold-") as cache:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache)
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, env=env)
        return time.perf_counter() - t0


def cached_cli_seconds(n: int) -> float:
    exe = shutil.which("servesim")
    cmd = [exe] if exe else [sys.executable, "-m", "servesim.cli"]
    t0 = time.perf_counter()
    subprocess.run(cmd + ["simulate", "--num-requests", str(n)], check=True, cwd=ROOT,
                   stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--load", type=float, default=0.8, help="fraction of capacity")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs; the best is reported")
    ap.add_argument("--threads", type=int, default=None, help="simulate's --threads (default: servesim's)")
    args = ap.parse_args()
    cold = cold_compile_seconds()
    import servesim
    from servesim.workload import load_workload
    # capacity: offline throughput of the 4-replica deployment on the same workload
    cap = servesim.simulate(replicas=4, offline=True, num_requests=20000, seed=1).summary
    capacity = cap["throughput"]["requests_per_s"]
    rate = args.load * capacity
    walls = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        res = servesim.simulate(replicas=4, rate=rate, num_requests=args.requests, seed=0,
                                **({} if args.threads is None else {"threads": args.threads}))
        walls.append(time.perf_counter() - t0)
    s = res.summary
    t_kernel = min(walls)
    cli = cached_cli_seconds(10_000)
    print(f"workload chat ({load_workload('chat').description[:40]}...), capacity {capacity:.1f} req/s, "
          f"rate {rate:.1f} req/s ({args.load:.0%})")
    print(f"requests                 {args.requests:,}")
    print(f"iterations               {s['iterations']:,}")
    print(f"wall time per run        best {t_kernel:.2f} s, all: {', '.join(f'{w:.2f}' for w in walls)} s "
          f"(workload sampling + kernel + metrics; threads {args.threads or 'default'})")
    print(f"simulated requests/s     {args.requests / t_kernel:,.0f}")
    print(f"iterations/s             {s['iterations'] / t_kernel:,.0f}")
    print(f"first call, cold cache   {cold:.2f} s (fresh interpreter, compile + 100 requests)")
    print(f"cached CLI, 10k requests {cli:.2f} s (wall, including interpreter start)")
    print(f"saturated                {s['saturated']}, p99 TTFT {s['ttft_ms']['p99']:.1f} ms")


if __name__ == "__main__":
    main()
