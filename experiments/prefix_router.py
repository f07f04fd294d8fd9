"""Prefix-cache hit rate of multi-turn sessions by router: round-robin scatters a session's turns
over the replicas, prefix-aware sends each turn to the replica holding its history.

    python experiments/prefix_router.py

llama-3.1-8b on 4 H100 replicas, the `sessions` workload (3 turns, 30 s think time) at its default
rate, 2,000 requests, seed 0; prints one markdown row per router.
"""
from __future__ import annotations

import servesim


def main():
    print("| router | prefix hit rate | TTFT p50 ms | TTFT p99 ms | E2E p50 ms |")
    print("|---|---:|---:|---:|---:|")
    for router in ("round-robin", "least-requests", "prefix-aware"):
        s = servesim.simulate(workload="sessions", replicas=4, router=router, num_requests=2000, seed=0).summary
        print(f"| {router} | {s['prefix_cache']['hit_rate']:.1%} | {s['ttft_ms']['p50']:.1f} | "
              f"{s['ttft_ms']['p99']:.1f} | {s['e2e_ms']['p50']:.0f} |")


if __name__ == "__main__":
    main()
