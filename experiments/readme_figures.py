"""The README's figures that a short, deterministic computation gives (issue #17, "README truth").

Each function returns the figures of one README statement, in the README's units (percent as
0-100, req/s, tok/s, GiB, counts); `python experiments/readme_figures.py` prints them all (about
30 s on 2 cores with a warm numba cache, half of it the interval coverage over 240 seeded runs). `tests/test_readme_figures.py` checks the README's numbers against them (the slow tests run
these functions; the fast ones check what the data and the results files under
`experiments/results/` say). Timings (wall seconds) are not here: they depend on the machine and
its load, and `experiments/bench_readme.py` measures them for the README's dated labels.

    python experiments/readme_figures.py [NAME ...]       # NAME: one of FIGURES (default: all)
"""
from __future__ import annotations

import re
import sys
import time

import servesim
from servesim.errors import InfeasibleError


def default_load() -> dict:
    """README "Busy and capacity headroom": the default deployment at its default rate."""
    s = servesim.simulate().summary
    u = s["utilization"]
    return {"rate_req_s": s["config"]["rate"], "num_requests": s["num_requests"],
            "busy_pct": 100 * u["busy_fraction"], "kv_cache_pct": 100 * u["kv_cache_mean"]}


def default_capacity() -> dict:
    """README "Busy and capacity headroom": `simulate --capacity` of the default deployment."""
    from servesim.options import SimConfig
    from servesim.planning.capacity import capacity
    c = capacity(SimConfig(), 5.5)
    return {"max_sustainable_rate_req_s": c["max_sustainable_rate"], "headroom_pct": 100 * c["capacity_headroom"],
            "simulations": c["simulations"]}


def daily_short() -> dict:
    """README simulate options: 300 requests of `--arrival daily --rate 12` from midnight."""
    d = servesim.simulate(arrival="daily", rate=12, num_requests=300).summary["config"]["daily"]
    return {"delivered_rate_req_s": d["delivered_rate"]}


def daily_day() -> dict:
    """README simulate options: `--arrival daily --rate 4 --duration 24h` sends a whole day of chat."""
    from servesim.config import load_model
    from servesim.workload import load_workload
    from servesim.workload.spec import build_requests
    reqs = build_requests(load_workload("chat"), None, 0, rate=4.0, process="daily",
                          max_len=load_model("llama-3.1-8b").max_context, window=86400.0)
    return {"requests": int(reqs.arrival.size)}


def pipeline_fifo() -> dict:
    """README Engine: llama-3.1-70b, chat, 2,000 requests offline on 8 h100-sxm, TP=8 vs TP=4 x PP=2."""
    common = dict(model="llama-3.1-70b", offline=True, num_requests=2000)
    tp8 = servesim.simulate(tp=8, **common).summary
    pp2 = servesim.simulate(tp=4, pp=2, **common).summary
    u = pp2["utilization"]
    return {"tp8_output_tok_s": tp8["throughput"]["output_tokens_per_s"],
            "tp4pp2_output_tok_s": pp2["throughput"]["output_tokens_per_s"],
            "first_stage_busy_pct": 100 * u["first_stage_busy_fraction"],
            "later_stage_busy_pct": 100 * u["later_stage_busy_fraction"]}


def int4_decode_gemms() -> dict:
    """README Cost model, precision: Llama-3.1-8B batch-1 decode GEMMs, int4 over bf16, on h100-sxm."""
    from servesim.config import load_hardware, load_model
    from servesim.config.engine import load_engine
    from servesim.costmodel import Batch, Layout, lower
    from servesim.costmodel.explain import breakdown
    hw, eng, model = load_hardware("h100-sxm"), load_engine("vllm"), load_model("llama-3.1-8b")
    batch = Batch(decode=(1000,))
    t = {d: breakdown(lower(model, hw, Layout(dtype=d), eng), batch).parts_s["gemm"] for d in ("bf16", "int4")}
    head = model.lm_head_params()
    body = model.param_count() - model.embedding_params() - head
    int4_bytes = 0.5 + 2.0 / 128.0
    return {"time_ratio": t["int4"] / t["bf16"],
            "bytes_ratio": (body * int4_bytes + head * 2.0) / ((body + head) * 2.0)}


def infeasible_70b() -> dict:
    """README Cost model, memory: the error of llama-3.1-70b bf16 at TP=1 on one h100-sxm."""
    try:
        servesim.simulate(model="llama-3.1-70b", num_requests=10)
    except InfeasibleError as e:
        msg = str(e)
    else:
        raise AssertionError("llama-3.1-70b bf16 at TP=1 ran on one h100-sxm")
    gib = [float(x) for x in re.findall(r"([\d.]+) GiB", msg)]
    return {"message": msg, "weights_gib": gib[0], "holds_gib": gib[1],
            "usable_gib": gib[2] if len(gib) > 2 else None}


def overload() -> dict:
    """README Speed: 20,000 requests at 200 req/s against one h100-sxm."""
    s = servesim.simulate(rate=200, num_requests=20000).summary
    return {"verdict": s["saturation_verdict"], "completed": s["num_completed"]}


def plan_space() -> dict:
    """README Capacity planning: the space and simulations of the measured plan (pruned search only;
    the exhaustive one, ~1,200 simulations, is timed by experiments/bench_readme.py)."""
    p = servesim.plan(**PLAN_ARGS)
    return {"search_space": p.summary["search_space"], "simulations": p.summary["simulations"],
            "best": {k: p.best[k] for k in ("hardware", "tp", "replicas")}}


def verdict_short_overload() -> dict:
    """README simulate options: the default deployment at 120% of its capacity, 100 and 3,000 requests."""
    rate = 1.2 * default_capacity()["max_sustainable_rate_req_s"]
    return {n: servesim.simulate(rate=rate, num_requests=n).summary["saturation_verdict"] for n in (100, 3000)}


def interval_coverage(latency_seeds: int = 40, throughput_seeds: int = 120) -> dict:
    """README Confidence intervals: how often the ci95 of the default deployment (2,000 requests) holds
    the across-seed mean, at 30% and 75% of its capacity: mean and p99 TTFT and E2E pooled over
    `latency_seeds` seeds (tests/test_intervals_coverage.py's check), requests/s over
    `throughput_seeds` (about 15 s: 240 runs of 2,000 requests)."""
    import numpy as np
    capacity = 23.2       # tests/test_intervals_coverage.py's CAPACITY
    out = {}
    for load in (0.30, 0.75):
        runs = [servesim.simulate(rate=load * capacity, num_requests=2000, seed=s).summary
                for s in range(max(latency_seeds, throughput_seeds))]
        hits = []
        for metric in ("ttft_ms", "e2e_ms"):
            for stat in ("mean", "p99"):
                target = np.mean([r[metric][stat] for r in runs[:latency_seeds]])
                hits += [(lo is None or lo <= target) and (hi is None or target <= hi)
                         for lo, hi in (r[metric]["ci95"][stat] for r in runs[:latency_seeds])]
        out[f"latency_pct_at_{load:.0%}"] = 100 * float(np.mean(hits))
        thr = [r["throughput"] for r in runs[:throughput_seeds]]
        target = np.mean([t["requests_per_s"] for t in thr])
        out[f"requests_per_s_pct_at_{load:.0%}"] = 100 * float(np.mean(
            [(lo is None or lo <= target) and (hi is None or target <= hi)
             for lo, hi in (t["ci95"]["requests_per_s"] for t in thr)]))
    return out


# the plan of README "Capacity planning": llama-3.1-8b, chat, 500 requests per simulation, 20 req/s
PLAN_ARGS = dict(model="llama-3.1-8b", workload="chat", num_requests=500, rate=20.0, slo="ttft_p99=1s,tpot_p99=60ms",
                 hardware=("h100-sxm", "h200-sxm", "a100-sxm-80gb", "l40s", "l4"), tp=(1, 2, 4, 8), max_replicas=64,
                 max_gpus=512)

FIGURES = {f.__name__: f for f in (default_load, default_capacity, daily_short, daily_day, verdict_short_overload,
                                   pipeline_fifo, int4_decode_gemms, infeasible_70b, overload, plan_space,
                                   interval_coverage)}


def main(names):
    for name in names or FIGURES:
        t0 = time.perf_counter()
        out = FIGURES[name]()
        print(f"{name} ({time.perf_counter() - t0:.1f} s): {out}")


if __name__ == "__main__":
    main(sys.argv[1:])
