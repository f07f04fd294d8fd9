"""Co-located vs prefill/decode disaggregated serving at equal GPU count (issue #18, step 5).

llama-3.1-70b on h100-sxm, the `chat` workload at 20 req/s, SLO ttft_p99=1s,tpot_p99=60ms:

1. the co-located plan: `servesim.plan(hardware="h100-sxm")`, the cheapest mixed deployment meeting
   the SLO (G GPUs);
2. the P:D plan: `servesim.plan(disaggregated=True, hardware="h100-sxm")`, the cheapest prefill +
   decode pools meeting it (any GPU count);
3. P:D at the co-located plan's G GPUs: every split of G GPUs into prefill and decode pools (TP 2, 4,
   8 per role, any replica counts using exactly G GPUs) simulated, the best kept (highest SLO
   attainment, then goodput).

Each row is then simulated once more with the same seed and the default 2,000 requests, and the
table shows GPUs, $/h, TTFT and TPOT p50/p99, SLO attainment, goodput and the KV transfer p50.

    python experiments/pd_compare.py [--rate 20] [--workers 2]

Writes experiments/results/pd_compare.md and prints it. ~2 min on the 2-core development machine.
"""
from __future__ import annotations

import argparse
import datetime
import time
from pathlib import Path

import servesim

MODEL, HW, WORKLOAD = "llama-3.1-70b", "h100-sxm", "chat"
SLO = "ttft_p99=1s,tpot_p99=60ms"
TPS = (2, 4, 8)
OUT = Path(__file__).resolve().parent / "results" / "pd_compare.md"


def splits(gpus: int):
    """(prefill tp, replicas, decode tp, replicas) using exactly `gpus` GPUs."""
    for tp_p in TPS:
        for tp_d in TPS:
            for p in range(1, gpus // tp_p + 1):
                rest = gpus - p * tp_p
                if rest >= tp_d and rest % tp_d == 0:
                    yield tp_p, p, tp_d, rest // tp_d


def run(rate, **deployment):
    return servesim.simulate(model=MODEL, workload=WORKLOAD, rate=rate, slo=SLO, **deployment).summary


def row(name, s):
    x = s.get("kv_transfer_ms") or {}
    return {"deployment": name, "GPUs": s["config"]["num_gpus"], "$/h": s["cost"]["usd_per_hour"],
            "TTFT p50 ms": s["ttft_ms"]["p50"], "TTFT p99 ms": s["ttft_ms"]["p99"],
            "TPOT p50 ms": s["tpot_ms"]["p50"], "TPOT p99 ms": s["tpot_ms"]["p99"],
            "SLO attainment %": 100.0 * s["slo_attainment"], "goodput req/s": s["goodput_requests_per_s"],
            "KV transfer p50 ms": x.get("p50")}


def fmt(v, key):
    if v is None:
        return "-"
    if isinstance(v, str):
        return v
    if key in ("GPUs",):
        return str(int(v))
    if key == "$/h":
        return f"{v:.2f}"
    if key == "KV transfer p50 ms":
        return f"{v:.2f}"
    return f"{v:.1f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=20.0)
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args()
    t0 = time.time()
    co = servesim.plan(model=MODEL, workload=WORKLOAD, rate=a.rate, slo=SLO, hardware=HW, workers=a.workers).best
    pd = servesim.plan(model=MODEL, workload=WORKLOAD, rate=a.rate, slo=SLO, hardware=HW, disaggregated=True,
                       workers=a.workers).best
    g = co["num_gpus"]
    best_eq, key_eq = None, None
    for tp_p, p, tp_d, d in splits(g):
        pools = (f"{HW}:tp{tp_p}:x{p}:prefill", f"{HW}:tp{tp_d}:x{d}:decode")
        try:
            s = run(a.rate, pool=pools)
        except servesim.ServesimError:
            continue          # a layout that cannot hold the model or a request
        k = (s["slo_attainment"], s["goodput_requests_per_s"])
        if key_eq is None or k > key_eq:
            best_eq, key_eq = pools, k
    co_name = f"co-located: {HW}:tp{co['tp']}:x{co['replicas']} (cheapest meeting the SLO)"
    rows = [row(co_name, run(a.rate, hardware=HW, tp=co["tp"], pp=co["pp"], replicas=co["replicas"]))]
    if best_eq is not None:
        rows.append(row(f"P:D at {g} GPUs: {' + '.join(best_eq)} (best split)", run(a.rate, pool=best_eq)))
    rows.append(row(f"P:D: {' + '.join(pd['pools'])} (cheapest meeting the SLO)", run(a.rate, pool=tuple(pd["pools"]))))
    keys = list(rows[0])
    lines = [f"Co-located vs prefill/decode disaggregated: {MODEL} on {HW}, `{WORKLOAD}` at {a.rate:g} req/s, "
             f"SLO `{SLO}`; 2,000 requests, seed 0 (experiments/pd_compare.py, "
             f"measured {datetime.date.today().isoformat()}, {time.time() - t0:.0f} s).", "",
             "| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(fmt(r[k], k) for k in keys) + " |" for r in rows]
    c, e = rows[0], rows[1] if best_eq is not None else None
    lines.append("")
    if e is not None:
        won = (e["SLO attainment %"], e["goodput req/s"]) > (c["SLO attainment %"], c["goodput req/s"])
        lines.append(f"At {g} GPUs the best P:D split {'beats' if won else 'does not beat'} co-located serving on SLO "
                     f"attainment ({e['SLO attainment %']:.1f}% vs {c['SLO attainment %']:.1f}%): it trades TTFT p99 "
                     f"({e['TTFT p99 ms']:.0f} vs {c['TTFT p99 ms']:.0f} ms) for TPOT p99 ({e['TPOT p99 ms']:.1f} vs "
                     f"{c['TPOT p99 ms']:.1f} ms). The cheapest P:D plan meeting the SLO (re-checked on seed 1) costs "
                     f"${rows[-1]['$/h']:.2f}/h on {rows[-1]['GPUs']} GPUs against ${c['$/h']:.2f}/h on {c['GPUs']} "
                     f"GPUs for the cheapest co-located plan.")
    text = "\n".join(lines) + "\n"
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
