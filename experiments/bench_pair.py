"""One timed simulation for side-by-side speed runs (farm-bench A/B against another checkout).

    python experiments/bench_pair.py [--requests 1000000] [--no-fast-forward]

The standard case of experiments/bench_speed.py (llama-3.1-8b on h100-sxm, 4 replicas, the chat
workload at 80% of the deployment's simulated capacity), run once with a warm numba cache; prints
simulated requests per second of the timed run (sampling + kernel + metrics).
"""
from __future__ import annotations

import argparse
import time

import servesim


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--no-fast-forward", action="store_true", help="the step-by-step loop (engine/span.py)")
    args = ap.parse_args()
    ff = {"fast_forward": False} if args.no_fast_forward else {}
    cap = servesim.simulate(replicas=4, offline=True, num_requests=20000, seed=1).summary
    rate = 0.8 * cap["throughput"]["requests_per_s"]
    t0 = time.perf_counter()
    res = servesim.simulate(replicas=4, rate=rate, num_requests=args.requests, seed=0, **ff)
    wall = time.perf_counter() - t0
    print(f"{args.requests / wall:,.0f} simulated requests/s ({res.summary['iterations']:,} iterations in {wall:.2f} s, "
          f"rate {rate:.1f} req/s)")


if __name__ == "__main__":
    main()
