"""The figures helper every command shares (headless matplotlib, one seaborn theme, one save), and the
figures of `simulate` and of `train` / `compare`. Sweep and plan figures: planning.figures; the
report's: report.figures; validation parity: calibrate.validate."""
from __future__ import annotations

from pathlib import Path


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display needed) and seaborn with the house theme."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns
    sns.set_theme(style="whitegrid")
    return plt, sns


def save(fig, path: Path, dpi: int = 110) -> Path:
    """Lay out, write and close one figure; returns its path."""
    import matplotlib.pyplot as plt
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return Path(path)


def simulation_figures(res, outdir: Path) -> list[Path]:
    """`servesim simulate -o`: latency CDFs, and batch size and KV blocks in use over time."""
    import numpy as np
    plt, sns = pyplot()
    out = []
    if res.requests is not None:    # (a streamed run keeps no request table: no CDF)
        df = res.requests[res.requests.status == "done"]
        fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
        for ax, col, label in zip(axes, ("ttft_s", "tpot_s", "e2e_s"), ("TTFT", "TPOT", "end-to-end")):
            x = np.sort(df[col].dropna().to_numpy() * 1e3)
            if x.size:
                ax.plot(x, np.arange(1, x.size + 1) / x.size)
            ax.set_xlabel(f"{label} (ms)")
            ax.set_ylabel("CDF")
        out.append(save(fig, outdir / "latency_cdf.png"))
    it = res.iterations
    fig, axes = plt.subplots(2, 1, figsize=(10, 5), sharex=True)
    if len(it):
        sns.lineplot(data=it, x="time_s", y="batch_size", hue="replica", ax=axes[0], palette="tab10", lw=0.8)
        sns.lineplot(data=it, x="time_s", y="kv_blocks", hue="replica", ax=axes[1], palette="tab10", lw=0.8,
                     legend=False)
    axes[0].set_ylabel("batch size (seqs)")
    axes[1].set_ylabel("KV blocks in use")
    axes[1].set_xlabel("simulated time (s)")
    out.append(save(fig, outdir / "batch_kv_timeline.png"))
    return out


def training_scaling_figure(df, path: Path, title: str) -> Path:
    """`servesim train --scaling`: scaling efficiency against GPUs."""
    plt, sns = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    sns.lineplot(data=df, x="gpus", y="scaling_efficiency", marker="o", ax=ax)
    ax.set_xscale("log", base=2)
    ax.set_ylim(0, max(1.05, float(df["scaling_efficiency"].max()) * 1.05))
    ax.set_xlabel("GPUs")
    ax.set_ylabel("scaling efficiency (tokens/s/GPU vs first)")
    ax.set_title(title + "\nsource: servesim training model (servesim.training)", fontsize=9)
    return save(fig, path)


def training_compare_figure(df, path: Path, title: str) -> Path:
    """`servesim compare`: training $, serving $ per M output tokens and the break-even, per hardware."""
    plt, sns = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.5))
    for ax, col, label in zip(axes, ("train_usd", "serve_usd_per_m_output", "break_even_output_tokens"),
                              ("training $", "serving $ / M output tokens", "break-even output tokens")):
        sns.barplot(data=df, x="hardware", y=col, ax=ax)
        ax.set_ylabel(label)
        ax.set_xlabel("")
        ax.tick_params(axis="x", rotation=30)
    fig.suptitle(title + " (source: servesim training model + serving simulator)", fontsize=9)
    return save(fig, path)
