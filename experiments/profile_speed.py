"""Where the time of the standard case goes (experiments/bench_speed.py's run), phase by phase.

    python experiments/profile_speed.py [--requests 1000000] [--no-fast-forward] [--cpu] [--runs 2] [--threads 1]

Times each stage of one `servesim.simulate` of the standard case (llama-3.1-8b on h100-sxm, 4 replicas,
chat at 80% of the simulated capacity) with a warm numba cache, best of two runs: workload sampling,
the lowering of the requests, the kernel, the request columns and the summary's metrics (NumPy); counts the
iterations run as decode spans (engine/span.py); and times one call of the step cost
(`iteration_components_nb`) at a typical decode batch, in a jitted loop, to say how much of the
kernel is the cost model. The kernel's time includes the allocation of its state and the gathering of
its records; the event loop's own (`kernel.run_nb`) is given under it. ``--cpu``: each phase's CPU
time (this thread's, `time.thread_time`) instead of wall time, steadier on a machine shared with
other jobs. The run is the whole run's loop on one thread (``--threads 1``, the default here); with
more a run splits into sub-runs on other threads (engine/split.py), which this thread's clock and the
event loop's timer do not see (experiments/bench_threads.py times those runs).
"""
from __future__ import annotations

import argparse
import time

import servesim
import servesim.api as api
import servesim.engine.kernel as kernel
from servesim.options import options


def cost_call_ns(params, calls: int = 1_000_000) -> float:
    from numba import njit

    from servesim.costmodel.features import features
    from servesim.costmodel.fields import table
    from servesim.costmodel.iteration import iteration_components_nb
    p = table(params)
    fs = features(p)

    @njit
    def loop(p, fs, n):
        s = 0.0
        for k in range(n):       # 80 decodes of ~600 tokens of context, the context growing
            c = iteration_components_nb(p, fs.moe, fs.ep, fs.mla, fs.wo, 0.0, 0.0, 80.0, 0.0, 0.0, 80.0,
                                        48_000.0 + 80.0 * (k % 500))
            s += c.latency + c.flops + c.nbytes
        return s

    loop(p, fs, 10)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        loop(p, fs, calls)
        best = min(best, (time.perf_counter() - t0) / calls * 1e9)
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--no-fast-forward", action="store_true")
    ap.add_argument("--cpu", action="store_true", help="CPU time of this thread instead of wall time")
    ap.add_argument("--runs", type=int, default=2, help="timed runs; the quickest is reported")
    ap.add_argument("--threads", type=int, default=1,
                    help="the run's threads (default 1: the whole run's loop, timed here; more split it, "
                         "engine/split.py, and the phases then time this thread alone)")
    args = ap.parse_args()
    clock = time.thread_time if args.cpu else time.perf_counter
    cap = servesim.simulate(replicas=4, offline=True, num_requests=20000, seed=1).summary
    rate = 0.8 * cap["throughput"]["requests_per_s"]
    phases = {}
    seen = {}

    def timed(name, f):
        def g(*a, **k):
            t0 = clock()
            out = f(*a, **k)
            phases[name] = phases.get(name, 0.0) + clock() - t0
            if name == "kernel":
                seen["spans"] = out.span_iterations
                seen["inputs"] = a[0]
            return out
        return g

    for name, attr in (("sampling", "build_requests"), ("lowering", "lower_requests"), ("kernel", "run"),
                       ("request columns", "requests_columns"), ("metrics", "summarize")):
        setattr(api, attr, timed(name, getattr(api, attr)))
    kernel.run_nb = timed("event loop", kernel.run_nb)
    best = None
    for _ in range(args.runs):
        phases.clear()
        t0 = clock()
        kw = {"threads": args.threads} if "threads" in options() else {}     # (a tree before --threads: one)
        res = servesim.simulate(replicas=4, rate=rate, num_requests=args.requests, seed=0,
                                fast_forward=not args.no_fast_forward, **kw)
        wall = clock() - t0
        if best is None or wall < best[0]:
            best = (wall, dict(phases))
    wall, phases = best
    its = res.summary["iterations"]
    print(f"{args.requests:,} requests, {its:,} iterations ({its / args.requests:.2f} per request), "
          f"fast-forward {'off' if args.no_fast_forward else 'on'}: {seen['spans']:,} iterations in spans "
          f"({seen['spans'] / its:.0%})")
    print(f"whole run {wall:.2f} {'CPU ' if args.cpu else ''}s ({args.requests / wall:,.0f} requests/s), "
          f"best of {args.runs}")
    loop = phases.pop("event loop")
    for name, s in phases.items():
        print(f"  {name:14s} {s:6.2f} s  {s / wall:4.0%}")
        if name == "kernel":
            print(f"    {'event loop':12s} {loop:6.2f} s  {loop / wall:4.0%}")
    print(f"  {'other':14s} {wall - sum(phases.values()):6.2f} s")
    ns = cost_call_ns(seen["inputs"].ps[0])
    print(f"kernel per iteration {phases['kernel'] / its * 1e9:,.0f} ns, of which one step cost "
          f"(iteration_components_nb) {ns:,.0f} ns: {ns * its * 1e-9:.2f} s of the kernel")


if __name__ == "__main__":
    main()
