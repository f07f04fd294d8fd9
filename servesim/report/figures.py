"""Report figures not covered by planning.figures: the iteration breakdown and training vs serving."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..figures import pyplot, save

PARTS = ("gemm", "attention", "elementwise", "communication", "overhead")


def breakdown_figure(df: pd.DataFrame, path) -> Path:
    """Horizontal stacked bars: ms per operator class for each (hardware, batch); share of the time
    inside the bars would hide small parts, so the total is printed at the end of each bar."""
    plt, sns = pyplot()
    labels = (df.hardware + " TP" + df.tp.astype(str) + ": " + df.batch).tolist()
    fig, ax = plt.subplots(figsize=(10, 0.55 * len(df) + 1.6))
    left = pd.Series(0.0, index=df.index)
    colors = sns.color_palette("deep", len(PARTS))
    for part, c in zip(PARTS, colors):
        col = f"{part}_ms"
        vals = df[col] if col in df.columns else pd.Series(0.0, index=df.index)
        ax.barh(labels, vals, left=left, color=c, label=part)
        left = left + vals
    for y, (tot, b) in enumerate(zip(df.time_ms, df.bottleneck)):
        ax.text(tot, y, f" {tot:.2f} ms, {b}", va="center", fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(0, float(left.max()) * 1.45 if len(df) else 1)
    ax.set(xlabel="iteration time (ms), servesim cost model", ylabel="")
    ax.tick_params(axis="y", labelsize=7)
    ax.legend(fontsize=7, ncol=len(PARTS), loc="upper center", bbox_to_anchor=(0.5, -0.14 * 8 / (len(df) + 3)))
    return save(fig, Path(path))


def compare_figure(df: pd.DataFrame, path) -> Path:
    plt, sns = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.4))
    for ax, col, label in zip(axes, ("train_usd", "serve_usd_per_m_output", "break_even_output_tokens"),
                              ("training $", "serving $ / M output tokens", "break-even output tokens")):
        sns.barplot(data=df, x="hardware", y=col, ax=ax, color="C0")
        ax.set(ylabel=label, xlabel="")
        ax.tick_params(axis="x", rotation=20)
    fig.suptitle("training vs serving (servesim training model + serving simulator)", fontsize=9)
    return save(fig, Path(path))
