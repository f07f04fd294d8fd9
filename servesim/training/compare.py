"""Training cost against serving cost, for one model on one or more hardware profiles.

Training: the fastest layout that fits on ``gpus`` GPUs (``search_layouts``); wall time =
train_tokens / tokens_per_s; GPU-hours = wall time x GPUs; $ = GPU-hours x the profile's
$/GPU-hour. Serving: the cheapest deployment on that hardware that meets the SLO at the given load
(``servesim.planning.plan.run_plan``: TP 1, 2, 4, 8 or the given one, replicas up to ``max_gpus``, checked
on a second seed), $ per million tokens = its $/h / (tokens/s x 3600) x 1e6 (servesim.metrics).
Break-even: the served tokens whose serving spend equals the training spend,
train_usd / usd_per_million x 1e6. A hardware on which nothing meets the SLO has no serving price.
"""
from __future__ import annotations

import dataclasses

import pandas as pd

from .layout import TrainLayout
from .search import search_layouts


def serving_config(best: dict) -> str:
    """The deployment a serving price comes from, e.g. 'TP=4 x 2 replicas (8 GPUs), bf16'."""
    pp = f" PP={best['pp']}" if best.get("pp", 1) > 1 else ""
    reps = f"{best['replicas']} replica" + ("" if best["replicas"] == 1 else "s")
    gpus = f"{best['num_gpus']} GPU" + ("" if best["num_gpus"] == 1 else "s")
    return f"TP={best['tp']}{pp} x {reps} ({gpus}), {best['dtype']}"


def serving_row(best: dict | None, why_not: str | None = None) -> dict:
    """compare's serving columns from a plan's best deployment (None: nothing meets the SLO)."""
    if best is None:
        return {"serve_config": f"none meets the SLO: {why_not}", "serve_tp": None, "serve_replicas": None,
                "serve_gpus": None, "serve_usd_per_hour": None, "serve_usd_per_m_output": None,
                "serve_usd_per_m_total": None, "serve_output_tokens_per_s": None, "serve_meets_slo": False,
                "serve_capacity_headroom": None}
    thr = best["metrics"]["throughput"]
    total = thr["total_tokens_per_s"]
    return {"serve_config": serving_config(best), "serve_tp": best["tp"], "serve_replicas": best["replicas"],
            "serve_gpus": best["num_gpus"], "serve_usd_per_hour": best["usd_per_hour"],
            "serve_usd_per_m_output": best["usd_per_million_output_tokens"],
            "serve_usd_per_m_total": best["usd_per_hour"] / (total * 3600.0) * 1e6 if total else None,
            "serve_output_tokens_per_s": thr["output_tokens_per_s"], "serve_meets_slo": True,
            "serve_capacity_headroom": best.get("capacity_headroom")}


def serving_cost(model: str, hardware: str, tp: int | None, *, dtype: str = "bf16", max_gpus: int = 64,
                 backend=None, **sim) -> dict:
    """The cheapest deployment of `model` on `hardware` meeting `sim['slo']` at `sim['rate']`."""
    from servesim.api import SimConfig
    from servesim.planning.plan import PlanSpec, run_plan
    res = run_plan(PlanSpec(base=SimConfig(model=model, **sim), hardware=(hardware,), dtypes=(dtype,),
                        tps=(tp,) if tp else (1, 2, 4, 8), max_gpus=max_gpus), backend)
    return serving_row(res.best, res.why_not)


def compare_costs(model_name: str, hardware: list[str], gpus: int, train_tokens: float, base: TrainLayout,
                  serve_tp: int | None = None, serving: dict | None = None, **sim) -> pd.DataFrame:
    """One row per hardware. `serving`: {hardware: serving_row(...)} already planned (the report's);
    otherwise each hardware is planned here with `sim` (SimConfig fields, `dtype`, `max_gpus`)."""
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
        serve = serving[name] if serving else serving_cost(model_name, name, serve_tp, **sim)
        per_m = serve["serve_usd_per_m_output"]
        lay = best.layout
        rows.append({
            "hardware": name, "gpus": gpus,
            "train_layout": f"tp{lay.tp} pp{lay.pp} dp{lay.dp} cp{lay.cp} ep{lay.ep} vp{lay.vp} zero{lay.zero} {lay.recompute}",
            "train_mfu": best.mfu, "train_days": hours / 24.0, "train_gpu_hours": gpu_hours, "train_usd": usd,
            "usd_per_gpu_hour": hw.usd_per_hour, **serve,
            "break_even_output_tokens": usd / per_m * 1e6 if per_m else None,
        })
    return pd.DataFrame(rows)
