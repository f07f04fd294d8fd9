"""One timed simulation for side-by-side speed runs: whole processes timed alternately against
another checkout (e.g. with /usr/bin/time -v).

    python experiments/bench_pair.py [--requests 1000000] [--no-fast-forward] [--prefix] [--stream]

The standard case of experiments/bench_speed.py (llama-3.1-8b on h100-sxm, 4 replicas, the chat
workload at 80% of the deployment's simulated capacity), run once with a warm numba cache; prints
simulated requests per second of the timed run (sampling + kernel + metrics). ``--prefix``: the
prefix-cache path instead (the golden `prefix` scenario's shape: 4 system prompts of 512 tokens x 10
users, 2 replicas of 600 KV blocks, a 2 GiB CPU tier, prefix-aware routing, 9 req/s: evictions on
every replica). ``--stream``: the standard case streamed (`--stream`: in chunks, in bounded memory).
"""
from __future__ import annotations

import argparse
import time

import servesim


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--no-fast-forward", action="store_true", help="the step-by-step loop (engine/span.py)")
    ap.add_argument("--prefix", action="store_true", help="the prefix-cache path under KV pressure")
    ap.add_argument("--stream", action="store_true", help="the standard case streamed (bounded memory)")
    args = ap.parse_args()
    ff = {"fast_forward": False} if args.no_fast_forward else {}
    if args.stream:
        ff["stream"] = True
    if args.prefix:
        kw = dict(num_system_prompts=4, users_per_system_prompt=10, system_prompt_len=512, cpu_kv_gib=2.0,
                  router="prefix-aware", replicas=2, num_gpu_blocks=600, rate=9.0, num_requests=args.requests, seed=0)
        t0 = time.perf_counter()
        res = servesim.simulate(**kw, **ff)
        wall = time.perf_counter() - t0
        pc = res.summary["prefix_cache"]
        print(f"{args.requests / wall:,.0f} simulated requests/s ({wall:.2f} s; hit rate {pc['hit_rate']:.3f}, "
              f"evictions {pc['evictions']})")
        return
    cap = servesim.simulate(replicas=4, offline=True, num_requests=20000, seed=1).summary
    rate = 0.8 * cap["throughput"]["requests_per_s"]
    t0 = time.perf_counter()
    res = servesim.simulate(replicas=4, rate=rate, num_requests=args.requests, seed=0, **ff)
    wall = time.perf_counter() - t0
    print(f"{args.requests / wall:,.0f} simulated requests/s ({res.summary['iterations']:,} iterations in {wall:.2f} s, "
          f"rate {rate:.1f} req/s)")


if __name__ == "__main__":
    main()
