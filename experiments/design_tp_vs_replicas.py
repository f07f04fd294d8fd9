"""Design study: tensor parallelism vs replicas for llama-3.1-70b on a fixed budget of 8 GPUs.

h100-sxm vs h200-sxm, `chat` workload (Azure conversation trace lengths, Poisson arrivals), vLLM
preset. Layouts: TP=2 x 4 replicas, TP=4 x 2, TP=8 x 1 in bf16, and fp8 TP=1 x 8 / TP=2 x 4 (bf16
TP=1 does not fit on either GPU; bf16 TP=2 leaves no KV cache on the 80 GB H100). For each:

- the maximum sustainable rate under ttft_p99=1s, tpot_p99=60ms (`planning.maxrate.search_max_rate`,
  geometric bisection to 3%; the median over seeds 0, 1, 2, with the lowest and highest);
- $ per million output tokens at that rate (profile $/GPU-hour, all 8 GPUs);
- TTFT and TPOT p50/p99 at one common rate, 0.8 x the lowest bf16 max rate on the h100-sxm.

    python experiments/design_tp_vs_replicas.py [--num-requests 6000]

Writes experiments/results/design_tp_vs_replicas.md, design_tp_vs_replicas.csv and
design_tp_vs_replicas.png. Runtime: about 12 s on 2 cores.
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from servesim.api import SimConfig, simulate  # noqa: E402
from servesim.errors import InfeasibleError  # noqa: E402
from servesim.planning.maxrate import search_max_rate  # noqa: E402

OUT = ROOT / "experiments" / "results"
MODEL, WORKLOAD, GPUS = "llama-3.1-70b", "chat", 8
SLO = "ttft_p99=1s,tpot_p99=60ms"
HARDWARE = ("h100-sxm", "h200-sxm")
SEEDS = (0, 1, 2)
NUM_REQUESTS = 6000
LAYOUTS = (("bf16", 1), ("bf16", 2), ("bf16", 4), ("bf16", 8), ("fp8", 1), ("fp8", 2))


def study(num_requests: int, tol: float = 0.03) -> tuple[pd.DataFrame, float]:
    rows = []
    for hw in HARDWARE:
        for dtype, tp in LAYOUTS:
            base = SimConfig(model=MODEL, hardware=hw, workload=WORKLOAD, dtype=dtype, tp=tp,
                             replicas=GPUS // tp, slo=SLO, num_requests=num_requests)
            row = {"hardware": hw, "dtype": dtype, "tp": tp, "replicas": GPUS // tp}
            runs = [search_max_rate(replace(base, seed=seed), tol=tol) for seed in SEEDS]
            if runs[0]["status"] != "ok" or any(m["max_rate"] is None for m in runs):
                m = runs[0]
                row.update(status=m["status"] if m["status"] != "ok" else "no_rate",
                           note=m["error"] or m["limited_by"])
                rows.append(row)
                continue
            runs.sort(key=lambda m: m["max_rate"])
            m0 = runs[len(runs) // 2]             # the median seed
            row.update(status="ok", note="", max_rate=m0["max_rate"], max_rate_lo=runs[0]["max_rate"],
                       max_rate_hi=runs[-1]["max_rate"], limited_by=m0["limited_by"],
                       kv_tokens_per_replica=m0["kv_capacity_tokens_per_replica"],
                       usd_per_m_output=m0["cost_usd_per_million_output_tokens"],
                       output_tok_s=m0["throughput_output_tokens_per_s"])
            rows.append(row)
    df = pd.DataFrame(rows)
    ok = df[(df.status == "ok") & (df.hardware == "h100-sxm") & (df["dtype"] == "bf16")]
    common = float(f"{0.8 * ok.max_rate.min():.2g}")
    for i, r in df[df.status == "ok"].iterrows():
        s = simulate(SimConfig(model=MODEL, hardware=r.hardware, workload=WORKLOAD, dtype=r["dtype"], tp=int(r.tp),
                               replicas=int(r.replicas), slo=SLO, num_requests=num_requests, rate=common)).summary
        for m in ("ttft", "tpot"):
            for q in ("p50", "p99"):
                df.loc[i, f"{m}_{q}_ms_at_common"] = s[f"{m}_ms"][q]
        df.loc[i, "usd_per_m_output_at_common"] = s["cost"]["usd_per_million_output_tokens"]
    return df, common


def figure(df: pd.DataFrame, common: float, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns
    sns.set_theme(style="whitegrid")
    ok = df[df.status == "ok"].copy()
    ok["layout"] = ok["dtype"] + " TP" + ok.tp.astype(str) + " x" + ok.replicas.astype(str)
    order = [f"{d} TP{t} x{GPUS // t}" for d, t in LAYOUTS if f"{d} TP{t} x{GPUS // t}" in set(ok.layout)]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    sns.barplot(data=ok, x="layout", y="max_rate", hue="hardware", order=order, ax=axes[0])
    axes[0].set(ylabel="max rate meeting the SLO (req/s)", xlabel="", title=f"8 GPUs, {SLO}")
    sns.barplot(data=ok, x="layout", y="usd_per_m_output", hue="hardware", order=order, ax=axes[1], legend=False)
    axes[1].set(ylabel="$ / M output tokens at that rate", xlabel="", title="cost at the max rate")
    sns.barplot(data=ok, x="layout", y="tpot_p99_ms_at_common", hue="hardware", order=order, ax=axes[2],
                legend=False)
    axes[2].axhline(60, color="red", ls="--", lw=1)
    axes[2].set(ylabel="TPOT p99 (ms)", xlabel="", title=f"TPOT p99 at {common:g} req/s")
    for ax in axes:
        ax.tick_params(axis="x", rotation=30, labelsize=8)
    fig.suptitle(f"{MODEL}, {WORKLOAD} workload (source: servesim simulator, experiments/design_tp_vs_replicas.py)",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def findings(df: pd.DataFrame, common: float) -> list[str]:
    """Sentences computed from the table, so they stay true when the numbers change."""
    ok = df[df.status == "ok"]
    bf = ok[ok["dtype"] == "bf16"]
    out = []
    spread = float((ok.max_rate_hi / ok.max_rate_lo - 1).max())
    out.append(f"Sampling noise: over seeds {', '.join(map(str, SEEDS))} a layout's max rate varies by up to "
               f"{100 * spread:.0f}% (lowest to highest); the table shows the median seed, and differences "
               "smaller than that spread are not findings.")
    for hw in HARDWARE:
        g = bf[bf.hardware == hw].sort_values("tp")
        if g.empty:
            continue
        best = g.loc[g.max_rate.idxmax()]
        txt = (f"{hw}, bf16: " + ", ".join(f"TP={r.tp} x {r.replicas}: {r.max_rate:.3g}" for r in g.itertuples())
               + f" req/s; TP={best.tp} x {best.replicas} carries the most load")
        others = g[g.tp != best.tp]
        if len(others) and (best.max_rate / others.max_rate.max() - 1) < spread:
            txt += f", but by less than the seed spread over TP={int(others.loc[others.max_rate.idxmax()].tp)}"
        t8 = g[g.tp == GPUS]
        if len(t8) and best.tp != GPUS:
            r8 = t8.iloc[0]
            d = r8.tpot_p99_ms_at_common / best.tpot_p99_ms_at_common - 1
            word = "about the same" if abs(d) < 0.03 else ("a lower" if d < 0 else "a higher")
            txt += (f". TP={GPUS} x 1 has {word} TPOT p99 at {common:g} req/s ({r8.tpot_p99_ms_at_common:.1f} vs "
                    f"{best.tpot_p99_ms_at_common:.1f} ms) but a {100 * (1 - r8.max_rate / best.max_rate):.0f}% lower "
                    "max rate (its one replica batches all the traffic, and every layer pays two all-reduces across "
                    f"{GPUS} GPUs)")
        t2 = g[g.tp == 2]
        if len(t2) and best.tp != 2:
            r2 = t2.iloc[0]
            txt += (f". TP=2 x 4 has the smallest KV cache per replica ({int(r2.kv_tokens_per_replica):,} tokens) "
                    f"and the slowest decode (TPOT p99 {r2.tpot_p99_ms_at_common:.1f} ms at {common:g} req/s)")
        out.append(txt + ".")
    pair = bf.pivot_table(index="tp", columns="hardware", values="max_rate").dropna()
    cost = bf.pivot_table(index="tp", columns="hardware", values="usd_per_m_output").dropna()
    if len(pair) and set(HARDWARE) <= set(pair.columns):
        r = pair["h200-sxm"] / pair["h100-sxm"]
        c = cost["h200-sxm"] / cost["h100-sxm"]
        txt = ("Same bf16 layout, h200-sxm vs h100-sxm: " + ", ".join(f"TP={tp}: {v:.2f}x" for tp, v in r.items())
               + " the max rate" + (" (within the seed spread)" if (r - 1).abs().max() <= spread else "")
               + " and " + ", ".join(f"{v:.2f}x" for v in c.values) + " the $ per output token")
        kv_more = all(bf[(bf.hardware == "h200-sxm") & (bf.tp == tp)].kv_tokens_per_replica.iloc[0]
                      > bf[(bf.hardware == "h100-sxm") & (bf.tp == tp)].kv_tokens_per_replica.iloc[0] for tp in r.index)
        tpot_ends = all("tpot" in (x.limited_by or "") for x in bf.itertuples())
        if kv_more and tpot_ends:
            txt += (". Under this SLO H200's extra HBM buys a larger KV cache but little rate: TPOT, not KV "
                    "capacity, ends every bf16 search")
        if (c > 1).all():
            txt += ("; at the profiles' $/GPU-hour the h100-sxm serves a given load more cheaply, and H200's "
                    "bf16 advantage is that TP=2 fits at all" if len(bf[(bf.hardware == "h200-sxm") & (bf.tp == 2)])
                    and not len(bf[(bf.hardware == "h100-sxm") & (bf.tp == 2)]) else
                    "; at the profiles' $/GPU-hour the h100-sxm serves a given load more cheaply")
        out.append(txt + ".")
    at = ok.dropna(subset=["usd_per_m_output_at_common"])
    for hw in HARDWARE:
        g = at[at.hardware == hw]
        if len(g) > 1 and g.usd_per_m_output_at_common.max() / g.usd_per_m_output_at_common.min() < 1.03:
            out.append(f"At the common {common:g} req/s every {hw} layout costs the same per token "
                       f"(${g.usd_per_m_output_at_common.mean():.3g}/M: 8 GPUs at one price serving the same "
                       "tokens); the layouts differ in latency there and in how much load they carry within the SLO.")
    tpot_lim = sum("tpot" in (r.limited_by or "") for r in ok.itertuples())
    out.append(f"The first failing rate breaks TPOT p99 in {tpot_lim} of {len(ok)} layouts"
               + ("." if tpot_lim == len(ok) else " (the rest: see `limited_by` in design_tp_vs_replicas.csv)."))
    if len(ok[ok["dtype"] == "fp8"]):
        cheapest = ok.loc[ok.usd_per_m_output.idxmin()]
        fp8 = ok[ok["dtype"] == "fp8"]
        gain = fp8.max_rate.max() / bf.max_rate.max() if len(bf) else float("nan")
        out.append(f"fp8 weights (W8A8 at the fp8 tensor-core peak, half the weight bytes) carry {gain:.1f}x the "
                   f"best bf16 rate; cheapest per output token overall: {cheapest.hardware} {cheapest['dtype']} "
                   f"TP={cheapest.tp} x {cheapest.replicas} (${cheapest.usd_per_m_output:.3g}/M). servesim models "
                   "speed only; fp8's accuracy cost is not in these numbers.")
    return out


def write(df: pd.DataFrame, common: float, num_requests: int, seconds: float) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    df.to_csv(OUT / "design_tp_vs_replicas.csv", index=False)
    figure(df, common, OUT / "design_tp_vs_replicas.png")
    cols = {"hardware": "hardware", "dtype": "dtype", "tp": "TP", "replicas": "replicas",
            "max_rate": "max rate (req/s)", "max_rate_lo": "lowest seed", "max_rate_hi": "highest seed", "usd_per_m_output": "$/M out at max",
            "kv_tokens_per_replica": "KV tokens / replica", "ttft_p50_ms_at_common": "TTFT p50",
            "ttft_p99_ms_at_common": "TTFT p99", "tpot_p50_ms_at_common": "TPOT p50",
            "tpot_p99_ms_at_common": "TPOT p99", "usd_per_m_output_at_common": "$/M out at common"}

    def cell(v, c):
        if isinstance(v, float) and pd.isna(v):
            return "-"
        if c in ("kv_tokens_per_replica",):
            return f"{int(v):,}"
        return f"{v:.3g}" if isinstance(v, float) else str(v)

    lines = [f"# TP vs replicas: {MODEL} on {GPUS} GPUs, h100-sxm vs h200-sxm\n",
             "Generated by `python experiments/design_tp_vs_replicas.py"
             + (f" --num-requests {num_requests}" if num_requests != NUM_REQUESTS else "") + f"` in {seconds:.0f} s; "
             "do not edit by hand.\n",
             f"Workload `{WORKLOAD}`, Poisson arrivals, {num_requests} requests per simulation, vLLM preset, "
             f"SLO `{SLO}`. Max rate: highest rate that meets every target without saturation "
             "(`servesim sweep --find-max-rate`, 3% bisection tolerance); cost at that rate. Latencies "
             f"(ms) at the common rate {common:g} req/s (0.8 x the lowest bf16 max rate on h100-sxm).\n",
             "![design_tp_vs_replicas.png](design_tp_vs_replicas.png)\n",
             "| " + " | ".join(cols.values()) + " |", "|" + "---|" * len(cols)]
    for _, r in df[df.status == "ok"].iterrows():
        lines.append("| " + " | ".join(cell(r[c], c) for c in cols) + " |")
    bad = df[df.status != "ok"]
    if len(bad):
        lines.append("\nLayouts that do not fit:\n")
        for r in bad.itertuples():
            lines.append(f"- {r.hardware} {r.dtype} TP={r.tp} x {r.replicas}: {r.note}")
    lines.append("\n## Findings\n")
    lines += [f"- {f}" for f in findings(df, common)]
    lines.append("\nThe h200-sxm profile borrows its efficiencies from h100-sxm (`efficiency_from`), so its "
                 "numbers are the h100 calibration applied to H200's HBM capacity and bandwidth: an "
                 "extrapolation, not a measurement.\n")
    (OUT / "design_tp_vs_replicas.md").write_text("\n".join(lines))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-requests", type=int, default=NUM_REQUESTS)
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    try:
        df, common = study(a.num_requests)
    except InfeasibleError as e:
        sys.exit(f"design_tp_vs_replicas: {e}")
    write(df, common, a.num_requests, time.perf_counter() - t0)
    print((OUT / "design_tp_vs_replicas.md").read_text())


if __name__ == "__main__":
    main()
