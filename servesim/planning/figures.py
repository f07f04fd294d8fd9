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


def metric_label(column: str) -> str:
    """'ttft_ms_p99' -> 'TTFT p99 (ms)'; other columns as they are."""
    parts = column.split("_")
    if len(parts) == 3 and parts[1] == "ms":
        return f"{parts[0].upper()} {parts[2]} (ms)"
    return column


def pareto_figure(df: pd.DataFrame, outdir, latency: str = "ttft_ms_p99", slo=None, best: dict | None = None
                  ) -> list[Path]:
    """`pareto_axes` written to ``outdir/pareto.png``; [] when no candidate met the SLO."""
    fig = pareto_axes(df, latency, slo, best)
    return [] if fig is None else [save(fig, Path(outdir) / "pareto.png")]


def pareto_axes(df: pd.DataFrame, latency: str = "ttft_ms_p99", slo=None, best: dict | None = None):
    """Left: $/hour vs p99 latency; right: $/M output tokens vs output tokens/s per GPU; the Pareto
    front (no other candidate is both cheaper and better) drawn as a line. Colour: hardware; marker:
    weight dtype; size: replicas (whole numbers). ``slo`` ({target: seconds} or a `servesim.slo.Slo`)
    draws the target of the latency plotted; ``best`` (the plan's answer) is marked with a star.
    Returns the figure (None when no candidate met the SLO)."""
    ok = df[df.status == "meets_slo"].copy() if "status" in df.columns else df.copy()
    ok = ok[ok[latency].notna()] if latency in ok.columns else ok.iloc[:0]
    if ok.empty:
        return None
    plt, sns = pyplot()
    ok["replicas"] = ok.replicas.astype(int)
    ok["dtype"] = ok.dtype.astype(str)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    sns.scatterplot(data=ok, x=latency, y="usd_per_hour", hue="hardware", style="dtype", size="replicas",
                    legend="full", ax=axes[0])
    front = pareto_front(ok, "usd_per_hour", latency)
    axes[0].plot(front[latency], front.usd_per_hour, color="black", lw=1, label="Pareto front")
    target = dict(slo.items() if hasattr(slo, "items") else ()).get(latency.replace("_ms_", "_"))
    if target is not None:
        axes[0].axvline(target * 1e3, color="red", ls="--", lw=1, label=f"SLO: {metric_label(latency).replace(' (ms)', '')} <= {target * 1e3:g} ms")
    axes[0].set(xlabel=metric_label(latency), ylabel="$ / hour")
    sns.scatterplot(data=ok, x="output_tokens_per_s_per_gpu", y="usd_per_million_output_tokens", hue="hardware",
                    style="dtype", ax=axes[1], legend=False)
    ok["_neg"] = -ok.output_tokens_per_s_per_gpu
    front = pareto_front(ok, "usd_per_million_output_tokens", "_neg")
    axes[1].plot(front.output_tokens_per_s_per_gpu, front.usd_per_million_output_tokens, color="black", lw=1)
    axes[1].set(xlabel="output tokens/s per GPU", ylabel="$ per million output tokens")
    if best:
        lat = (best.get("metrics") or {}).get(latency.split("_ms_")[0] + "_ms", {}).get(latency.split("_ms_")[-1])
        if lat is not None:
            axes[0].scatter([lat], [best["usd_per_hour"]], marker="*", s=320, facecolor="none", edgecolor="black",
                            lw=1.5, zorder=5, label="chosen")
        row = ok[(ok.hardware == best.get("hardware")) & (ok.dtype == str(best.get("dtype")))
                 & (ok.tp.astype(str) == str(best.get("tp"))) & (ok.replicas == best.get("replicas"))]
        if len(row):
            axes[1].scatter(row.output_tokens_per_s_per_gpu.iloc[:1], row.usd_per_million_output_tokens.iloc[:1],
                            marker="*", s=320, facecolor="none", edgecolor="black", lw=1.5, zorder=5, label="chosen")
            axes[1].legend(loc="best", fontsize=8)
    axes[0].legend(loc="upper right", fontsize=7, framealpha=0.9)
    return fig


def pareto_front(df: pd.DataFrame, a: str, b: str) -> pd.DataFrame:
    """Rows not dominated in (a, b), both minimised, sorted by b."""
    d = df.sort_values([b, a])
    keep, best = [], float("inf")
    for i, v in zip(d.index, d[a]):
        if v < best:
            keep.append(i)
            best = v
    return d.loc[keep]
