"""Model-error intervals: how far the simulated means may be from a real deployment's, from the
residuals of predictions the model did not see.

The intervals are built from held-out residuals r = predicted / measured - 1, never from simulation
noise (that is ``ci95``):

- latency (mean E2E, TTFT, ITL): the vLLM suite's held-out rows (every split of
  ``servesim/calibrate/vllm_heldout.py``: leave one deployment, workload kind or model family out,
  stage extrapolation), by class: model family (dense / MoE) x load relative to the simulated
  capacity (rho = offered / maximum sustainable rate: < 0.5, 0.5-0.8, >= 0.8, or unknown);
- throughput and capacity: the published TensorRT-LLM maximum-throughput rows, held out
  (``experiments/validate_serving.py``): the simulated maximum sustainable rate errs as a saturated
  run's throughput does;
- GPUs without kernel tables of their own (``config.engine_fit`` says "no ... fit for"): the
  residuals are combined with the error of carrying a GPU's kernel efficiencies over to another GPU's
  datasheet, measured on the kernel tables of the GPUs that have them (every pair r_total = (1 + r)
  (1 + c) - 1).

The truth lies in [predicted / (1 + q_hi), predicted / (1 + q_lo)] with q_lo, q_hi the 10th and 90th
percentiles of the class's residuals: an 80% interval. ``experiments/model_error.py`` writes the
residuals (``experiments/results/model_error.json``) and measures the coverage of these intervals on
residuals left out.
"""
from __future__ import annotations

import functools
import json

import numpy as np

from .errors import ConfigError

LEVEL = 0.8
FILE = "model_error.json"
# a class is used only with residuals of this many deployments, else the pooled ones, and said so: the
# vLLM suite has 13 (9 dense, 4 MoE), and per-family / per-load intervals built without one deployment
# covered 50-56% of its rows against 76-77% pooled (experiments/results/model_error.md), so they pool
MIN_CLASS = 14
LOAD_EDGES = (0.5, 0.8)


@functools.lru_cache(maxsize=None)
def residuals() -> dict | None:
    """The shipped residuals; None before ``experiments/model_error.py`` has written them (a checkout
    rebuilding them), in which case summaries carry no model_error."""
    from .paths import results_dir
    path = results_dir() / FILE
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: not readable model-error residuals ({exc}); rerun experiments/model_error.py") \
            from None


def load_class(rho: float | None) -> str:
    if rho is None or not np.isfinite(rho):
        return "unknown"
    if rho < LOAD_EDGES[0]:
        return "low"
    return "mid" if rho < LOAD_EDGES[1] else "high"


def quantiles(samples, level: float = LEVEL) -> tuple[float, float]:
    a = np.asarray(samples, dtype=float)
    lo = (1.0 - level) / 2.0
    return float(np.quantile(a, lo)), float(np.quantile(a, 1.0 - lo))


def combine(samples, carry) -> np.ndarray:
    """Residuals of a prediction that also carries kernel efficiencies over to another GPU."""
    a = np.asarray(samples, dtype=float)[:, None]
    c = np.asarray(carry, dtype=float)[None, :]
    return ((1.0 + a) * (1.0 + c) - 1.0).ravel()


def bounds(value, q: tuple[float, float]):
    """[value / (1 + q_hi), value / (1 + q_lo)]: where the measured value lies, given predicted / measured
    - 1 in [q_lo, q_hi]."""
    if value is None or not np.isfinite(value):
        return None
    return [value / (1.0 + q[1]), value / (1.0 + q[0])]


def latency_samples(family: str, load: str) -> tuple[list, dict]:
    """(residual rows, class actually used) of the latency metrics for (family, load): the narrowest of
    (family, load), (family, all), (all, load), (all, all) with residuals of MIN_CLASS deployments."""
    rows = residuals()["latency"]
    for fam, ld in ((family, load), (family, "all"), ("all", load), ("all", "all")):
        pick = [r for r in rows if (fam == "all" or r["family"] == fam) and (ld == "all" or r["load"] == ld)]
        if len({r["experiment"] for r in pick}) >= MIN_CLASS or (fam, ld) == ("all", "all"):
            return pick, {"family": fam, "load": ld}
    raise AssertionError("unreachable")


def family_of(model) -> str:
    """The residual class of a model: "moe" or "dense"."""
    return "moe" if model.moe is not None else "dense"


def class_text(used: dict) -> str:
    """The class of residuals actually used, in words."""
    if used == {"family": "all", "load": "all"}:
        return "every family and load pooled: too few deployments per class"
    return f"{used['family']} models, load {used['load']}"


def throughput_samples(data: dict, tables: bool) -> list:
    """Throughput residuals, combined with the carry-over ones for a GPU without kernel tables."""
    tp = data["throughput"]["samples"]
    return tp if tables else combine(tp, data["carry_over"]["samples"])


def model_error(summary: dict, *, family: str, tables: bool, rho: float | None = None,
                engine_bound: bool = True) -> dict:
    """The ``model_error`` block of a simulation summary: 80% intervals of the headline means and, with a
    simulated capacity, of the maximum sustainable rate and capacity headroom, plus ``near_capacity``.
    ``engine_bound``: the throughput is the engine's (offline, closed loop or saturated); a stable open-loop
    run's throughput is the offered load, which the model does not predict, so it gets no interval."""
    data = residuals()
    if data is None:
        return None
    load = load_class(rho)
    rows, used = latency_samples(family, load)
    carry = None if tables else data["carry_over"]["samples"]
    out = {"level": LEVEL, "class": {"family": family, "load": load, "kernel_tables": tables,
                                     "used": used},
           "source": data["source"], "count": len({r["key"] for r in rows})}
    for metric, block in (("e2e_mean", "e2e_ms"), ("ttft_mean", "ttft_ms"), ("itl_mean", "itl_ms")):
        s = [r["rel_error"] for r in rows if r["metric"] == metric]
        if carry is not None:
            s = combine(s, carry)
        q = quantiles(s)
        out[f"{block}_mean"] = bounds((summary.get(block) or {}).get("mean"), q)
    qt = quantiles(throughput_samples(data, tables))
    thr = summary.get("throughput") or {}
    out["output_tokens_per_s"] = bounds(thr.get("output_tokens_per_s"), qt) if engine_bound else None
    out["requests_per_s"] = bounds(thr.get("requests_per_s"), qt) if engine_bound else None
    out["engine_bound"] = engine_bound
    out["throughput_count"] = len(data["throughput"]["samples"])
    out["capacity"] = None
    out["near_capacity"] = None
    return out


def with_capacity(block: dict, summary: dict, capacity: dict) -> dict:
    """``block`` placed in its load class (rho = offered / simulated maximum sustainable rate), with the
    capacity's interval (the throughput residuals) and ``near_capacity``: the offered rate inside the
    interval of the simulated maximum sustainable rate."""
    if block is None or not capacity:
        return block
    top = capacity.get("max_sustainable_rate")
    lam = capacity.get("offered_rate")
    if not top or lam is None:
        return block
    cls = block["class"]
    block = model_error(summary, family=cls["family"], tables=cls["kernel_tables"], rho=lam / top,
                        engine_bound=block.get("engine_bound", True))
    lo, hi = bounds(top, quantiles(throughput_samples(residuals(), cls["kernel_tables"])))
    block["class"]["rho"] = lam / top
    block["capacity"] = {"max_sustainable_rate": [lo, hi],
                         "capacity_headroom": [1.0 - lam / lo, 1.0 - lam / hi]}
    block["near_capacity"] = bool(lo <= lam <= hi)
    return block


def margin_default(family: str = "all") -> float:
    """The latency margin ``plan`` keeps by default: how much the model may under-predict the worst of
    the mean E2E, TTFT and ITL at high load, 1 / (1 + q_lo) - 1 (q_lo the 10th percentile residual)."""
    if residuals() is None:
        return 0.0
    rows, _ = latency_samples(family, "high")
    worst = 0.0
    for metric in ("e2e_mean", "ttft_mean", "itl_mean"):
        q_lo, _ = quantiles([r["rel_error"] for r in rows if r["metric"] == metric])
        worst = max(worst, 1.0 / (1.0 + q_lo) - 1.0)
    return min(worst, 0.9)


def margin_text(family: str) -> str:
    """Where ``margin_default`` comes from, as plan says it."""
    if residuals() is None:
        return "default 0: no model-error residuals shipped (run experiments/model_error.py)"
    _, used = latency_samples(family, "high")
    return (f"default: the worst 10th-percentile under-prediction of mean E2E, TTFT or ITL in the held-out vLLM "
            f"residuals ({class_text(used)}; experiments/results/model_error.md)")


__all__ = ["LEVEL", "bounds", "class_text", "combine", "family_of", "latency_samples", "load_class", "margin_default",
           "margin_text", "model_error", "quantiles", "residuals", "throughput_samples", "with_capacity"]
