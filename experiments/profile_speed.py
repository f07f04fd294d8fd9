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
other jobs. The run is the whole run's loop on one thread (``--threads 1``, the default here). ``--threads N``
with N > 1: simulate's ``--threads``; a run then splits into sub-runs on other threads
(engine/split.py), which this thread's clock and the event loop's timer do not see, so the run also
prints its wall time, the process's CPU time, this thread's and each worker thread's (the sub-runs and
the summary's series, `metrics.each`): were the workers running side by side, the process's CPU would
exceed the wall time.
"""
from __future__ import annotations

import argparse
import threading
import time

import servesim
import servesim.api as api
import servesim.engine.kernel as kernel
import servesim.engine.split as split
import servesim.metrics as metrics
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


def watch_threads(per_thread: dict) -> None:
    """Count the CPU time of every call that a split run or the summary hands to a worker thread into
    ``per_thread`` (thread id -> s)."""
    lock = threading.Lock()

    def on_thread(f):
        def g(*a, **k):
            t0 = time.thread_time()
            out = f(*a, **k)
            with lock:
                key = threading.get_ident()
                per_thread[key] = per_thread.get(key, 0.0) + time.thread_time() - t0
            return out
        return g

    split.SubRun.__init__ = on_thread(split.SubRun.__init__)
    split.SubRun.advance = on_thread(split.SubRun.advance)
    split.end_run_nb = on_thread(split.end_run_nb)
    split.output_columns = on_thread(split.output_columns)
    each = metrics.each
    metrics.each = lambda fn, items, threads=1: each(on_thread(fn), items, threads)


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
    per_thread = {}
    if args.threads > 1:
        watch_threads(per_thread)
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
        per_thread.clear()
        t0, w0, p0, m0 = clock(), time.perf_counter(), time.process_time(), time.thread_time()
        kw = {"threads": args.threads} if "threads" in options() else {}     # (a tree before --threads: one)
        res = servesim.simulate(replicas=4, rate=rate, num_requests=args.requests, seed=0,
                                fast_forward=not args.no_fast_forward, **kw)
        wall = clock() - t0
        if args.threads > 1:
            workers = sorted(v for k, v in per_thread.items() if k != threading.get_ident())
            print(f"threads {args.threads}: {time.perf_counter() - w0:.2f} s wall, {time.process_time() - p0:.2f} "
                  f"CPU s in the process: {time.thread_time() - m0:.2f} on this thread, workers "
                  f"{', '.join(f'{v:.2f}' for v in workers)}")
        if best is None or wall < best[0]:
            best = (wall, dict(phases))
    wall, phases = best
    its = res.summary["iterations"]
    print(f"{args.requests:,} requests, {its:,} iterations ({its / args.requests:.2f} per request), "
          f"fast-forward {'off' if args.no_fast_forward else 'on'}: {seen['spans']:,} iterations in spans "
          f"({seen['spans'] / its:.0%})")
    print(f"whole run {wall:.2f} {'CPU ' if args.cpu else ''}s ({args.requests / wall:,.0f} requests/s), "
          f"best of {args.runs}")
    loop = phases.pop("event loop", None)     # (None: a split run, its loops on the workers)
    for name, s in phases.items():
        print(f"  {name:14s} {s:6.2f} s  {s / wall:4.0%}")
        if name == "kernel" and loop is not None:
            print(f"    {'event loop':12s} {loop:6.2f} s  {loop / wall:4.0%}")
    print(f"  {'other':14s} {wall - sum(phases.values()):6.2f} s")
    ns = cost_call_ns(seen["inputs"].ps[0])
    print(f"kernel per iteration {phases['kernel'] / its * 1e9:,.0f} ns, of which one step cost "
          f"(iteration_components_nb) {ns:,.0f} ns: {ns * its * 1e-9:.2f} s of the kernel")


if __name__ == "__main__":
    main()
