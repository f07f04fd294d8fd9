"""Cost per engine iteration against the number of replicas (issue #18, step 6).

llama-3.1-8b on h100-sxm, vllm policy, round-robin router, PP = 1, the chat workload's lengths
with Poisson arrivals. Every replica gets the same load (`--load`, default 80% of one replica's simulated capacity,
`--per-replica` requests each, at least `--min-requests` in all), so only the number of replicas
changes. Times the kernel alone (`engine.run.run`: no workload sampling, no pandas) in CPU seconds of
this process (the machine may be shared), best of `--repeats` runs after a compiling warm-up, and
prints microseconds per iteration.

    python experiments/bench_replicas.py [--replicas 1,64,1024] [--per-replica 400] [--repeats 3]
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from servesim.config import load_hardware, load_model
from servesim.costmodel import Layout, build_replica
from servesim.engine.kernel import STAT_END_TIME, STAT_ITERATIONS
from servesim.engine.lower import EngineOptions, engine_config, one_pool_inputs
from servesim.engine.run import run
from servesim.workload import build_requests, load_workload


def lengths(n: int, seed: int):
    reqs = build_requests(load_workload("chat"), n, seed, offline=True)
    return reqs.prompt, reqs.output


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--replicas", default="1,64,1024")
    ap.add_argument("--per-replica", type=int, default=400, help="requests per replica")
    ap.add_argument("--min-requests", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--load", type=float, default=0.8, help="fraction of one replica's capacity, per replica")
    args = ap.parse_args()
    rc = build_replica(load_model("llama-3.1-8b"), load_hardware("h100-sxm"), Layout(1, 1, "bf16"), 0.9,
                       max_tokens=8192, max_seqs=256)
    # one replica's capacity: offline throughput on the same lengths
    prompt, output = lengths(4000, 1)
    cfg = engine_config(EngineOptions(), rc)
    out = run(one_pool_inputs(rc.params, cfg, np.zeros(4000), prompt, output, frontend=True))
    capacity = 4000 / out.stats[STAT_END_TIME]
    print(f"one replica: {capacity:.1f} req/s offline; load {args.load:.0%} of that per replica")
    for r in (int(x) for x in args.replicas.split(",")):
        n = max(r * args.per_replica, args.min_requests)
        prompt, output = lengths(n, 2)
        rng = np.random.default_rng(3)
        arrival = np.cumsum(rng.exponential(1.0 / (args.load * capacity * r), n))
        cfg = engine_config(EngineOptions(replicas=r), rc)
        best = None
        for _ in range(args.repeats):
            t0 = time.process_time()
            out = run(one_pool_inputs(rc.params, cfg, arrival, prompt, output, frontend=True))
            cpu = time.process_time() - t0
            best = cpu if best is None else min(best, cpu)
        iters = int(out.stats[STAT_ITERATIONS])
        print(f"replicas {r:5d}  requests {n:8,d}  iterations {iters:9,d}  best {best:6.2f} s CPU  "
              f"{best / iters * 1e6:5.2f} us/iteration")


if __name__ == "__main__":
    main()
