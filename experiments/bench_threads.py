"""The standard case (experiments/bench_speed.py's run) once per call, for whole-process A/B timing of
`--threads` (engine/split.py): llama-3.1-8b on h100-sxm, 4 replicas (round-robin), chat at ``--rate``
req/s (default: 80% of the simulated offline capacity, found as bench_speed.py finds it), 1,000,000
requests.

    python experiments/bench_threads.py [--requests 1000000] [--rate R] [--threads N] [--runs 1]

Prints each run's wall and CPU seconds (this process's, all threads) of `servesim.simulate` and a hash of
its summary, so runs with different threads (or trees) can be checked to give the same results. Run it
from another tree with ``PYTHONPATH=/that/tree`` (a tree without ``--threads`` runs its one thread).
"""
from __future__ import annotations

import argparse
import hashlib
import time

import servesim
from servesim.options import options


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--rate", type=float, default=None, help="req/s (default: 80%% of the offline capacity)")
    ap.add_argument("--threads", type=int, default=None, help="default: servesim's")
    ap.add_argument("--runs", type=int, default=1)
    args = ap.parse_args()
    rate = args.rate
    if rate is None:
        cap = servesim.simulate(replicas=4, offline=True, num_requests=20000, seed=1).summary
        rate = 0.8 * cap["throughput"]["requests_per_s"]
    kw = dict(replicas=4, rate=rate, num_requests=args.requests, seed=0)
    if args.threads is not None and "threads" in options():
        kw["threads"] = args.threads
    for _ in range(args.runs):
        w0, c0 = time.perf_counter(), time.process_time()
        res = servesim.simulate(**kw)
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        digest = hashlib.sha256(res.to_json().encode()).hexdigest()[:16]
        print(f"rate {rate:.3f} req/s, threads {kw.get('threads', 'default')}: simulate {wall:.3f} s wall, "
              f"{cpu:.3f} s CPU, {args.requests / wall:,.0f} requests/s; summary sha256 {digest}")


if __name__ == "__main__":
    main()
