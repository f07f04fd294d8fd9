"""Seaborn figures for sweeps (latency/throughput/cost vs rate, with SLO lines and the knee) and the
planner (Pareto fronts). Each function takes a tidy DataFrame and returns the paths it wrote."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..figures import pyplot, save


def _label(df: pd.DataFrame, keys) -> pd.Series:
    if not keys:
        return pd.Series("all", index=df.index)
    return df[list(keys)].astype(str).apply(lambda r: ", ".join(f"{k}={v}" for k, v in zip(keys, r)), axis=1)


def _plain_log_x(ax, rates) -> None:
    """Log-scaled rate axis with a tick at each swept rate, labelled with plain numbers."""
    from matplotlib.ticker import NullFormatter
    ticks = sorted(set(float(r) for r in rates))
    ax.set_xticks(ticks)
    ax.set_xticklabels([f"{t:.3g}" for t in ticks], fontsize=8)
    ax.xaxis.set_minor_formatter(NullFormatter())


def sweep_figures(df: pd.DataFrame, grid_keys, slo, outdir) -> list[Path]:
    """slo: a `servesim.slo.Slo` (targets in seconds) drawn as lines, or None."""
    outdir = Path(outdir)
    ok = df[df.status == "ok"].copy()
    if ok.empty or "ttft_ms_p99" not in ok.columns:
        return []
    plt, sns = pyplot()
    ok["config"] = _label(ok, grid_keys)
    paths = []
    metrics = [("ttft", "TTFT"), ("tpot", "TPOT"), ("e2e", "end-to-end")]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for ax, (m, title) in zip(axes, metrics):
        long = ok.melt(id_vars=["config", "rate"], value_vars=[f"{m}_ms_p50", f"{m}_ms_p99"],
                       var_name="percentile", value_name="ms")
        long["percentile"] = long.percentile.str.rsplit("_", n=1).str[-1]
        sns.lineplot(data=long, x="rate", y="ms", hue="config", style="percentile", marker="o", ax=ax)
        for key, target in (slo.items() if slo else ()):
            if key.startswith(m + "_"):
                ax.axhline(target * 1e3, color="red", ls="--", lw=1, label=f"SLO {key}")
        if "knee" in ok.columns:
            k = ok[ok.knee.astype(bool)]
            ax.scatter(k.rate, k[f"{m}_ms_p99"], s=90, facecolors="none", edgecolors="black", zorder=5,
                       label="knee")
        ax.set(xscale="log", yscale="log", xlabel="arrival rate (req/s)", ylabel=f"{title} (ms)", title=title)
        _plain_log_x(ax, ok.rate)
        ax.legend(fontsize=7)
    paths.append(save(fig, outdir / "latency_vs_rate.png"))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    sns.lineplot(data=ok, x="rate", y="throughput_output_tokens_per_s", hue="config", marker="o", ax=axes[0])
    axes[0].set(xlabel="arrival rate (req/s)", ylabel="output tokens/s", title="throughput")
    ycol = "goodput_requests_per_s" if ok.get("goodput_requests_per_s") is not None and \
        ok.goodput_requests_per_s.notna().any() else "throughput_requests_per_s"
    sns.lineplot(data=ok, x="rate", y="throughput_requests_per_s", hue="config", marker="o", ax=axes[1])
    if ycol == "goodput_requests_per_s":
        sns.lineplot(data=ok, x="rate", y=ycol, hue="config", marker="x", ls="--", ax=axes[1], legend=False)
    axes[1].plot(ok.rate.sort_values(), ok.rate.sort_values(), color="grey", lw=0.8, label="offered")
    axes[1].set(xlabel="arrival rate (req/s)", ylabel="req/s",
                title="throughput (solid) and goodput (dashed)" if ycol != "throughput_requests_per_s" else "throughput")
    paths.append(save(fig, outdir / "throughput_vs_rate.png"))
    fig, ax = plt.subplots(figsize=(6, 4))
    sns.lineplot(data=ok, x="rate", y="cost_usd_per_million_output_tokens", hue="config", marker="o", ax=ax)
    ax.set(xscale="log", yscale="log", xlabel="arrival rate (req/s)", ylabel="$ per million output tokens",
           title="cost per token")
    _plain_log_x(ax, ok.rate)
    paths.append(save(fig, outdir / "cost_vs_rate.png"))
    return paths


def max_rate_figure(df: pd.DataFrame, grid_keys, outdir) -> list[Path]:
    ok = df[df.max_rate.notna()].copy() if "max_rate" in df.columns else df.iloc[:0]
    if ok.empty:
        return []
    plt, sns = pyplot()
    ok["config"] = _label(ok, grid_keys)
    fig, axes = plt.subplots(1, 2, figsize=(11, max(3, 0.35 * len(ok) + 1.5)))
    sns.barplot(data=ok, y="config", x="max_rate", ax=axes[0], color="C0")
    axes[0].set(xlabel="max sustainable rate meeting the SLO (req/s)", ylabel="")
    sns.barplot(data=ok, y="config", x="cost_usd_per_million_output_tokens", ax=axes[1], color="C1")
    axes[1].set(xlabel="$ per million output tokens at that rate", ylabel="")
    return [save(fig, Path(outdir) / "max_rate.png")]


def pareto_figure(df: pd.DataFrame, outdir, latency: str = "ttft_ms_p99") -> list[Path]:
    """Left: $/hour vs p99 latency; right: $/M output tokens vs output tokens/s per GPU; the Pareto
    front (no other candidate is both cheaper and better) drawn as a line."""
    ok = df[df.status == "meets_slo"].copy() if "status" in df.columns else df.copy()
    ok = ok[ok[latency].notna()] if latency in ok.columns else ok.iloc[:0]
    if ok.empty:
        return []
    plt, sns = pyplot()
    ok["layout"] = ok.hardware + " " + ok.dtype + " TP" + ok.tp.astype(str) + " PP" + ok.pp.astype(str)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    sns.scatterplot(data=ok, x=latency, y="usd_per_hour", hue="hardware", size="replicas", ax=axes[0])
    front = pareto_front(ok, "usd_per_hour", latency)
    axes[0].plot(front[latency], front.usd_per_hour, color="black", lw=1, label="Pareto front")
    axes[0].set(xlabel=latency.replace("_ms_", " ms ").upper(), ylabel="$ / hour")
    sns.scatterplot(data=ok, x="output_tokens_per_s_per_gpu", y="usd_per_million_output_tokens", hue="hardware",
                    ax=axes[1], legend=False)
    ok["_neg"] = -ok.output_tokens_per_s_per_gpu
    front = pareto_front(ok, "usd_per_million_output_tokens", "_neg")
    axes[1].plot(front.output_tokens_per_s_per_gpu, front.usd_per_million_output_tokens, color="black", lw=1)
    axes[1].set(xlabel="output tokens/s per GPU", ylabel="$ per million output tokens")
    return [save(fig, Path(outdir) / "pareto.png")]


def pareto_front(df: pd.DataFrame, a: str, b: str) -> pd.DataFrame:
    """Rows not dominated in (a, b), both minimised, sorted by b."""
    d = df.sort_values([b, a])
    keep, best = [], float("inf")
    for i, v in zip(d.index, d[a]):
        if v < best:
            keep.append(i)
            best = v
    return d.loc[keep]
