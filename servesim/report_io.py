"""Write a simulation's outputs: per-request table, summary JSON and figures."""
from __future__ import annotations

from pathlib import Path


def write_outputs(res, outdir: Path) -> list[Path]:
    outdir.mkdir(parents=True, exist_ok=True)
    written = []
    p = outdir / "requests.csv"
    res.requests.to_csv(p)
    written.append(p)
    try:
        import pyarrow  # noqa: F401
        p = outdir / "requests.parquet"
        res.requests.to_parquet(p)
        written.append(p)
    except ImportError:
        pass
    p = outdir / "summary.json"
    p.write_text(res.to_json() + "\n")
    written.append(p)
    written += _figures(res, outdir)
    return written


def _figures(res, outdir: Path) -> list[Path]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    import seaborn as sns

    sns.set_theme(style="whitegrid")
    out = []
    df = res.requests[res.requests.status == "done"]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for ax, col, label in zip(axes, ("ttft_s", "tpot_s", "e2e_s"), ("TTFT", "TPOT", "end-to-end")):
        x = np.sort(df[col].dropna().to_numpy() * 1e3)
        if x.size:
            ax.plot(x, np.arange(1, x.size + 1) / x.size)
        ax.set_xlabel(f"{label} (ms)")
        ax.set_ylabel("CDF")
    fig.tight_layout()
    p = outdir / "latency_cdf.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    out.append(p)
    it = res.iterations
    fig, axes = plt.subplots(2, 1, figsize=(10, 5), sharex=True)
    if len(it):
        sns.lineplot(data=it, x="time_s", y="batch_size", hue="replica", ax=axes[0], palette="tab10", lw=0.8)
        sns.lineplot(data=it, x="time_s", y="kv_blocks", hue="replica", ax=axes[1], palette="tab10", lw=0.8,
                     legend=False)
    axes[0].set_ylabel("batch size (seqs)")
    axes[1].set_ylabel("KV blocks in use")
    axes[1].set_xlabel("simulated time (s)")
    fig.tight_layout()
    p = outdir / "batch_kv_timeline.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    out.append(p)
    return out
