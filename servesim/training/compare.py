"""Training cost against serving cost, for one model on one or more hardware profiles.

Training: the fastest layout that fits on ``gpus`` GPUs (``search_layouts``); wall time =
train_tokens / tokens_per_s; GPU-hours = wall time x GPUs; $ = GPU-hours x the profile's
$/GPU-hour. Serving: ``servesim.simulate`` at the given load and SLO on the smallest TP in
1, 2, 4, 8 whose weights fit (or the given one), $ per million tokens = deployment $/h /
(tokens/s x 3600) x 1e6 (servesim.metrics). Break-even: the served tokens whose serving spend
equals the training spend, train_usd / usd_per_million x 1e6.
"""
from __future__ import annotations

import dataclasses

import pandas as pd

from servesim.errors import InfeasibleError

from .layout import TrainLayout
from .search import search_layouts


def serving_cost(model: str, hardware: str, tp: int | None, **sim) -> dict:
    from servesim.api import simulate
    tps = [tp] if tp else [1, 2, 4, 8]
    last = None
    for t in tps:
        try:
            res = simulate(model=model, hardware=hardware, tp=t, **sim)
        except InfeasibleError as e:
            last = e
            continue
        s = res.summary
        return {"serve_tp": t, "serve_usd_per_m_output": s["cost"]["usd_per_million_output_tokens"],
                "serve_usd_per_m_total": s["cost"]["usd_per_million_total_tokens"],
                "serve_output_tokens_per_s": s["throughput"]["output_tokens_per_s"],
                "slo_attainment": s.get("slo_attainment"), "saturated": s["saturated"]}
    raise InfeasibleError(f"--hardware {hardware}: {model} does not fit for serving at TP "
                          f"{', '.join(map(str, tps))} ({last})")


def compare_costs(model_name: str, hardware: list[str], gpus: int, train_tokens: float, base: TrainLayout,
                  serve_tp: int | None = None, **sim) -> pd.DataFrame:
    from servesim.config import load_hardware, load_model
    model = load_model(model_name)
    rows = []
    for name in hardware:
        hw = load_hardware(name)
        best = search_layouts(model, hw, gpus, dataclasses.replace(base, dtype="bf16" if base.dtype == "fp8" and
                                                                   hw.peak_flops.get("fp8", 0) <= 0 else base.dtype),
                              top=1)[0]
        hours = train_tokens / best.tokens_per_s / 3600.0
        gpu_hours = hours * gpus
        usd = gpu_hours * hw.usd_per_hour
        serve = serving_cost(model_name, name, serve_tp, **sim)
        per_m = serve["serve_usd_per_m_output"]
        lay = best.layout
        rows.append({
            "hardware": name, "gpus": gpus,
            "train_layout": f"tp{lay.tp} pp{lay.pp} dp{lay.dp} cp{lay.cp} ep{lay.ep} vp{lay.vp} zero{lay.zero} {lay.recompute}",
            "train_mfu": best.mfu, "train_days": hours / 24.0, "train_gpu_hours": gpu_hours, "train_usd": usd,
            "usd_per_gpu_hour": hw.usd_per_hour, **serve,
            "break_even_output_tokens": usd / per_m * 1e6 if per_m else float("inf"),
        })
    return pd.DataFrame(rows)
