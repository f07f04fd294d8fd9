"""`servesim plan`: the cheapest deployment meeting every SLO at the target load.

Search space: hardware x dtype x TP x PP x engine knobs (max_num_seqs, max_num_batched_tokens) -- a
*layout* -- times the replica count. Cheap analytical bounds prune first, simulation decides:

1. memory: the weights must fit (`build_replica` raises InfeasibleError otherwise);
2. latency floors, independent of load: the q-quantile TTFT can be no lower than the prefill of the
   q-quantile prompt running alone, and TPOT no lower than one batch-1 decode iteration;
3. capacity: a replica serves at most mu = (B / osl) / t_iter requests/s, where t_iter prices one
   steady-state iteration of B decodes plus the prefill tokens that keep B in flight (B / osl new
   requests per iteration) at the largest batch the engine and KV cache allow; stability (utilisation
   rho = lambda / (r mu) < 1, Kleinrock 1975, vol. 1 sec. 2.1) then needs r > lambda / mu, so the
   search starts at r_min = floor(lambda / (SLACK mu)) + 1 replicas.

Every answer is verified by simulation; the bounds only decide where to start and what to skip.
`exhaustive=True` simulates every (layout, replicas) point instead (used to test the pruning and to
time large plans). The winner is re-simulated with another seed (it must meet every SLO) and with one
replica fewer (it must not meet the planner's criterion).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace

import numpy as np

from ..errors import ConfigError, InfeasibleError
from ..engine.budget import check_points
from .backends import Backend
from .common import (LATENCY_SLACK, PlanResult, _lengths, plan_result, _metrics, _quantile, _sim,  # noqa: F401 (also read from here)
                     borrowed_row, fit_columns)

SLACK = 1.25            # the capacity bound is optimistic by design; this keeps it a bound


@dataclass(frozen=True)
class PlanSpec:
    base: object                              # SimConfig: model, workload, load, slo, seed, engine
    hardware: tuple = ()
    dtypes: tuple = ("bf16",)
    tps: tuple = (1, 2, 4, 8)
    pps: tuple = (1,)
    max_num_seqs: tuple = (None,)
    max_num_batched_tokens: tuple = (None,)
    max_gpus: int = 64
    max_replicas: int = 64
    budget_usd_per_hour: float | None = None
    margin: float = 0.1
    model_margin: float = 0.0                  # the model's own error band (servesim/model_error.py)
    model_margin_source: str = ""
    prices: dict = field(default_factory=dict)   # hardware -> $/GPU-hour overrides
    default_price: float | None = None
    exhaustive: bool = False
    daily_rates: tuple = ()
    disaggregated: bool = False                # search prefill/decode pools (planning/disagg.py)
    require_measured: bool = False             # leave out layouts resting on borrowed fits (fit_columns)
    eps: tuple = (1,)                          # expert parallelism; 0: none and over the whole replica (MoE)
    attn_dps: tuple = (1,)                     # data-parallel attention ranks
    speculatives: tuple = (None,)              # speculative decoding settings (None: without)


# the keys of a layout (one candidate deployment but its replica count)
LAYOUT_KEYS = ("hardware", "dtype", "tp", "pp", "ep", "attn_dp", "speculative", "max_num_seqs",
               "max_num_batched_tokens")


# ---------------------------------------------------------------- bounds
def layout_bounds(layout: dict, base, prompt, output, slo: dict, margin: float) -> dict:
    """{'status': 'ok'|'infeasible'|'pruned', 'reason', 'capacity_rps', 'ttft_floor_ms', 'tpot_floor_ms'}."""
    from ..api import replica_of, resolve
    from ..config import load_hardware
    from ..costmodel.dtypes import check_dtype
    from ..costmodel.fields import table
    from ..costmodel.iteration import iteration_components
    if layout.get("dtype", "auto") != "auto":   # a dtype the chip cannot run is a layout to skip, not an error
        try:
            hw = load_hardware(layout["hardware"])
            check_dtype(layout["dtype"], hw.name, hw.peak_flops)
        except ConfigError as e:
            return {"status": "infeasible", "reason": str(e)}
    try:
        cfg, model, hw, _ = resolve(replace(base, **{k: v for k, v in layout.items()}))
        rc = replica_of(cfg, model, hw)
    except InfeasibleError as e:
        return {"status": "infeasible", "reason": str(e)}
    p = table(rc.params)     # packed once for every step priced below

    def t(tp_tok, n_pf, pairs, kv_pf, n_dec, kv_dec, interval=True):
        r = iteration_components(p, float(tp_tok), float(n_pf), float(n_dec + n_pf), float(pairs), float(kv_pf),
                                 float(n_dec), float(kv_dec))
        return float(r.interval if interval else r.latency)

    isl, osl = float(prompt.mean()), float(max(output.mean(), 1.0))
    kv_cap = rc.memory.kv_capacity_tokens
    b = min(cfg.max_num_seqs, kv_cap / (isl + osl / 2.0))
    b = max(1.0, min(b, cfg.max_num_batched_tokens / (1.0 + isl / osl)))
    n_pf = b / osl
    it = t(n_pf * isl, n_pf, n_pf * isl * (isl + 1) / 2, n_pf * isl, b, b * (isl + osl / 2))
    capacity = n_pf / it if it > 0 else math.inf
    out = {"status": "ok", "reason": "", "capacity_rps": capacity, "gpus_per_replica": rc.num_gpus,
           "kv_capacity_tokens": kv_cap, "usd_per_gpu_hour": hw.usd_per_hour, **fit_columns(rc)}
    for key, target in slo.items():
        metric, stat = key.split("_")
        if metric == "ttft":
            q = _quantile(prompt, stat)
            floor = t(q, 1, q * (q + 1) / 2, q, 0, 0, interval=False)
        elif metric in ("tpot", "itl"):
            q = _quantile(prompt, stat if metric == "tpot" else "p50")
            floor = t(0, 0, 0, 0, 1, q, interval=False) if metric == "tpot" else 0.0
            if metric == "tpot" and cfg.speculative is not None:    # a lone request's time per token
                from ..costmodel.speculative import price_step
                floor = price_step(rc, cfg.speculative, 1, int(q))["per_token_s"]
        else:
            continue
        out[f"{metric}_floor_ms"] = floor * 1e3
        if floor * LATENCY_SLACK > target * (1.0 - margin):
            out["status"] = "pruned"
            out["reason"] = (f"{key} floor {floor * 1e3:.1f} ms (no load) exceeds the target {target * 1e3:.1f} ms"
                             + (f" less the {100 * margin:.0f}% margin" if margin else ""))
            break
    return out


def replicas_lower_bound(rate: float, capacity_rps: float) -> int:
    return max(1, int(math.floor(rate / (SLACK * capacity_rps))) + 1) if capacity_rps > 0 else 1


# ---------------------------------------------------------------- tasks
def search_task(arg) -> dict:
    """Task: (cfg with layout, r_min, r_max, margin) -> the fewest replicas meeting the SLO (galloping
    from r_min, then bisection), and every simulation made."""
    cfg, r_min, r_max, margin = arg
    tried = {}

    def run(r):
        if r not in tried:
            tried[r] = _sim(replace(cfg, replicas=r), margin)
        return tried[r]

    r, lo = r_min, r_min - 1
    hi = None
    while True:
        res = run(r)
        if res["status"] != "ok":
            break
        if res["ok"]:
            hi = r
            break
        lo = r
        if r >= r_max:
            break
        r = min(2 * r, r_max)
    if hi is not None:
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if run(mid)["ok"]:
                hi = mid
            else:
                lo = mid
    return {"best": hi, "tried": [tried[k] for k in sorted(tried)]}


def point_task(arg) -> dict:
    cfg, margin = arg
    return _sim(cfg, margin)


# ---------------------------------------------------------------- the planner
def _parallel(spec: PlanSpec, tp: int, moe: bool):
    """(ep, attn_dp) pairs for TP ``tp``: DP attention and EP only for a MoE model; ep 0 in ``spec.eps``
    means both no EP and EP over the whole replica (tp x attn_dp)."""
    out = []
    for dp in (spec.attn_dps if moe else (1,)):
        for ep in (spec.eps if moe else (1,)):
            for e in ((1, tp * dp) if ep == 0 else (ep,)):
                if dp > 1 and e == 1:
                    continue              # DP attention without EP is data parallelism: more replicas
                if (e, dp) not in out:
                    out.append((e, dp))
    return out


def _layouts(spec: PlanSpec, moe: bool = False):
    for hw in spec.hardware:
        for dtype in spec.dtypes:
            for tp in spec.tps:
                for ep, dp in _parallel(spec, tp, moe):
                    for sp in spec.speculatives:
                        for pp in spec.pps:
                            for mns in spec.max_num_seqs:
                                for mnbt in spec.max_num_batched_tokens:
                                    yield {"hardware": hw, "dtype": dtype, "tp": tp, "pp": pp, "ep": ep,
                                           "attn_dp": dp, "speculative": sp, "max_num_seqs": mns,
                                           "max_num_batched_tokens": mnbt}


def _candidate(layout, price, gpr, sim, bounds, n_sims) -> dict:
    s = sim["summary"] if sim else None
    r = sim["replicas"] if sim else None
    c = {**layout, "replicas": r, "num_gpus": gpr * r if r else None, "usd_per_gpu_hour": price,
         "usd_per_hour": price * gpr * r if r else None, "simulations": n_sims,
         "capacity_bound_rps_per_replica": bounds.get("capacity_rps"),
         "replicas_lower_bound": bounds.get("r_min"), "fit": bounds.get("fit"), "fit_note": bounds.get("fit_note")}
    if s:
        cost = s["cost"]
        busy = s["utilization"]["busy_fraction"]
        c.update({"usd_per_million_output_tokens": cost["usd_per_million_output_tokens"],
                  "usd_per_million_input_tokens": cost["usd_per_million_input_tokens"],
                  "headroom": sim["headroom"], "ttft_ms_p99": s["ttft_ms"]["p99"], "tpot_ms_p99": s["tpot_ms"]["p99"],
                  "e2e_ms_p99": s["e2e_ms"]["p99"],
                  "output_tokens_per_s_per_gpu": s["throughput"]["output_tokens_per_s_per_gpu"],
                  "busy_fraction": busy, "mean_batch_size": s["utilization"]["mean_batch_size"],
                  "metrics": _metrics(s)})
    return c


def effective_margin(margin: float, model_margin: float) -> float:
    """The headroom under a target that keeps ``margin`` after the value grows by ``model_margin``."""
    return 1.0 - (1.0 - margin) / (1.0 + model_margin)


def run_plan(spec: PlanSpec, backend: Backend | None = None, progress=None) -> PlanResult:
    """The cheapest deployment of ``spec`` meeting its SLOs, and every candidate searched."""
    from ..checks import check_sim_config
    from ..config import list_hardware
    from ..options import default_rate
    from ..workload import load_workload
    backend = backend or Backend()
    base = check_sim_config(spec.base)     # the edge: the SLO parsed once, every option checked
    shown = dict(hardware_given=bool(spec.hardware), disaggregated=bool(spec.disaggregated))
    slo = base.slo
    if not slo:
        raise ConfigError("plan needs --slo, e.g. --slo ttft_p99=1s,tpot_p99=60ms")
    if base.offline or base.concurrency is not None:
        raise ConfigError("plan sizes for an open-loop --rate; drop --offline / --concurrency")
    if not 0 <= spec.margin < 1:
        raise ConfigError(f"--margin must be in [0, 1), got {spec.margin}")
    if not 0 <= spec.model_margin < 1:
        raise ConfigError(f"--model-margin must be in [0, 1), got {spec.model_margin}")
    # a target is met when the value, raised by the model margin, keeps the SLO margin:
    # value (1 + model_margin) <= target (1 - margin), i.e. one effective margin on the value
    slo_margin = spec.margin
    spec = replace(spec, margin=effective_margin(spec.margin, spec.model_margin))
    rate = base.rate
    if spec.daily_rates:
        rate = max(rate if rate is not None else 0.0, max(spec.daily_rates))
    if rate is None:
        rate = default_rate(load_workload(base.workload))
    if rate <= 0:
        raise ConfigError(f"--rate must be > 0, got {rate}")
    base = replace(base, rate=rate)
    if spec.disaggregated:
        from .disagg import plan_disaggregated
        best, rows, why, sims, space = plan_disaggregated(spec, base, rate, backend, progress)
        _margins(best, slo_margin, spec)
        return plan_result(best, rows, why, sims, space, **shown)
    hardware = spec.hardware or tuple(list_hardware())
    spec = replace(spec, hardware=hardware)
    prompt, output = _lengths(base)
    from ..config import load_model
    layouts = list(_layouts(spec, load_model(base.model).moe is not None))
    candidates, tasks, meta = [], [], []
    space = 0
    for lay in layouts:
        price = spec.prices.get(lay["hardware"], spec.default_price)
        b = layout_bounds(lay, base, prompt, output, slo, spec.margin)
        if b["status"] == "infeasible":
            candidates.append({**lay, "status": "infeasible", "reason": b["reason"]})
            continue
        if spec.require_measured and b["fit"] != "measured":
            candidates.append(borrowed_row(lay, b))
            continue
        gpr = b["gpus_per_replica"]
        price = b["usd_per_gpu_hour"] if price is None else price
        r_max = min(spec.max_replicas, spec.max_gpus // gpr)
        if spec.budget_usd_per_hour is not None and price * gpr > 0:
            r_max = min(r_max, int(spec.budget_usd_per_hour // (price * gpr)))
        space += max(r_max, 0)
        if r_max < 1:
            candidates.append({**lay, "status": "over_budget", "reason": f"one replica needs {gpr} GPUs "
                               f"(${price * gpr:.2f}/h), beyond the GPU or $ budget"})
            continue
        b["r_min"] = replicas_lower_bound(rate, b["capacity_rps"])
        if b["status"] == "pruned" and not spec.exhaustive:
            candidates.append({**lay, "status": "pruned", "reason": b["reason"], **_floors(b)})
            continue
        if b["r_min"] > r_max and not spec.exhaustive:
            candidates.append({**lay, "status": "pruned", "capacity_bound_rps_per_replica": b["capacity_rps"],
                               "reason": f"needs >= {b['r_min']} replicas by the capacity bound "
                                         f"({b['capacity_rps']:.2f} req/s each), budget allows {r_max}"})
            continue
        cfg = replace(base, price=price, replicas=1, **lay)
        meta.append((lay, price, gpr, b, r_max))
        tasks.append((cfg, 1 if spec.exhaustive else b["r_min"], r_max, spec.margin))
    if spec.exhaustive:
        check_points(sum(t[2] for t in tasks), "plan --exhaustive", "use a smaller --max-gpus or --max-replicas")
        flat = [(replace(c, replicas=r), m) for c, _, r_max, m in tasks for r in range(1, r_max + 1)]
        sims = backend.map(point_task, flat, progress)
        results, k = [], 0
        for c, _, r_max, _ in tasks:
            tried = sims[k:k + r_max]
            k += r_max
            ok = [t["replicas"] for t in tried if t["ok"]]
            results.append({"best": min(ok) if ok else None, "tried": tried})
    else:
        results = backend.map(search_task, tasks, progress)
    n_sims = sum(len(r["tried"]) for r in results)
    meeting = []
    for (lay, price, gpr, b, r_max), res in zip(meta, results):
        by_r = {t["replicas"]: t for t in res["tried"]}
        if res["best"] is not None:
            c = _candidate(lay, price, gpr, by_r[res["best"]], b, len(res["tried"]))
            c.update(status="meets_slo", reason="")
            meeting.append((c, by_r))
        else:
            last = res["tried"][-1]
            c = _candidate(lay, price, gpr, last if last["summary"] else None, b, len(res["tried"]))
            c.update(status="misses_slo" if last["status"] == "ok" else last["status"],
                     reason=f"at {last['replicas']} replicas: " + "; ".join(last["reasons"]),
                     replicas=last["replicas"])
        candidates.append(c)
    order = {"meets_slo": 0, "misses_slo": 1, "pruned": 2, "borrowed_fit": 3, "over_budget": 4, "infeasible": 5,
             "error": 6}
    candidates.sort(key=lambda c: (order.get(c["status"], 9),) + _cost_order(c))
    best, n_extra = _choose(candidates, meeting, base, spec, backend)
    if best:
        n_extra += _capacity(best, base)
    why = None if best else why_not(candidates, rate)
    if best and spec.daily_rates:
        best["daily"], extra = daily_cost(best, base, spec, backend)
        n_extra += extra
    _margins(best, slo_margin, spec)
    if best is not None and len(spec.speculatives) > 1:
        gain = functools.partial(speculation_gain, base=base, prompt=prompt, output=output)
        best["speculation"] = speculation_note(best, candidates, rate, gain)
    return plan_result(best, candidates, why, n_sims + n_extra, space, **shown)


def speculation_gain(c: dict, base, prompt, output) -> tuple[float, float]:
    """The cost model's speed-up per token of candidate ``c``'s speculative setting over plain decoding
    on its layout: (at batch 1, at the candidate's simulated mean batch per replica), each a decode step
    at the workload's mean context (mean prompt + half the mean output)."""
    from ..api import replica_of, resolve
    from ..costmodel.speculative import price_step
    cfg, model, hw, _ = resolve(replace(base, **{k: c[k] for k in LAYOUT_KEYS}))
    rc = replica_of(cfg, model, hw)
    ctx = int(round(float(np.mean(prompt)) + float(np.mean(output)) / 2.0))
    n = max(1, int(round(c.get("mean_batch_size") or 1.0)))
    return price_step(rc, cfg.speculative, 1, ctx)["speedup"], price_step(rc, cfg.speculative, n, ctx)["speedup"]


def speculation_note(best: dict, candidates: list, rate: float, gain=None) -> str:
    """Why the plan took speculative decoding or not: the cheapest candidate meeting the SLO with and
    without it, and the TPOT each reached; with ``gain`` (`speculation_gain`), the cost model's speed-up
    per token of that speculative setting at batch 1 and at its simulated mean batch. Speculation pays
    while the GPU has idle capacity per step (a small batch is bound by reading the weights, so
    verifying k + 1 tokens costs little more than one); under load the batch fills the step, the
    verification's k + 1 tokens per sequence compete with batching, and the drafts rejected are work
    the plain engine never does."""
    def cheapest(with_spec, statuses=("meets_slo",)):
        ok = [c for c in candidates if c["status"] in statuses and (c.get("speculative") is not None) == with_spec
              and c.get("usd_per_hour") is not None]
        return min(ok, key=lambda c: (c["usd_per_hour"], c["num_gpus"])) if ok else None
    on, off = cheapest(True), cheapest(False)
    if on is None and off is None:
        return ""
    why = ""
    shown = on or cheapest(True, ("misses_slo",))
    if gain is not None and shown is not None and shown.get("mean_batch_size"):
        one, at = gain(shown)
        why = (f"; cost model, {shown['speculative']} per token against plain decoding: {one:.2f}x at batch 1, "
               f"{at:.2f}x at this load's mean batch of {shown['mean_batch_size']:.0f} sequences per replica")
    if on is None:
        return (f"speculation does not pay at {rate:g} req/s: no speculative setting met the SLO; verifying "
                f"k + 1 tokens per sequence competes with batching at this load{why}")
    if off is None:
        return f"speculation pays at {rate:g} req/s: only speculative decoding ({on['speculative']}) met the SLO{why}"
    d = (f"{on['speculative']}: ${on['usd_per_hour']:.2f}/h, TPOT p99 {on['tpot_ms_p99']:.1f} ms; without: "
         f"${off['usd_per_hour']:.2f}/h, TPOT p99 {off['tpot_ms_p99']:.1f} ms")
    if on["usd_per_hour"] < off["usd_per_hour"]:
        return f"speculation pays at {rate:g} req/s ({d}): it turns idle step capacity into tokens{why}"
    if on["usd_per_hour"] == off["usd_per_hour"] and on["tpot_ms_p99"] < off["tpot_ms_p99"]:
        return (f"speculation pays in latency at {rate:g} req/s, at the same cost ({d}): the steps have idle "
                f"capacity to verify drafts in{why}")
    return (f"speculation does not pay at {rate:g} req/s ({d}): the batches are full enough that verifying k + 1 "
            f"tokens per sequence competes with batching{why}")


def _margins(best: dict | None, slo_margin: float, spec) -> None:
    """The chosen deployment says which margins it was chosen with."""
    if best is None:
        return
    best.update(margin=spec.margin, slo_margin=slo_margin, model_margin=spec.model_margin,
                model_margin_source=spec.model_margin_source)


def _capacity(best, base) -> int:
    """Add the simulated maximum sustainable rate of the chosen deployment, its capacity_headroom and
    the $/hour split into capacity the load uses and headroom held for the SLO (`capacity`)."""
    from .capacity import capacity, cost_split
    lay = {k: best[k] for k in LAYOUT_KEYS}
    cap = capacity(replace(base, price=best["usd_per_gpu_hour"], replicas=best["replicas"], **lay), base.rate)
    best.update({"max_sustainable_rate": cap["max_sustainable_rate"], "capacity_headroom": cap["capacity_headroom"],
                 "cost_split": cost_split(best["usd_per_hour"], cap["capacity_headroom"])})
    return cap["simulations"]


def _cost_order(c):
    return (c.get("usd_per_hour") or math.inf, c.get("num_gpus") or 0, -(c.get("headroom") or 0.0))


def _floors(b):
    return {k: v for k, v in b.items() if k.endswith("_floor_ms")}


def _choose(candidates, meeting, base, spec, backend):
    """The cheapest candidate that survives the honesty checks (``_check``), in cost order; one that
    needed replicas added for the other seed goes back in cost order among the remaining ones."""
    by_key = {id(c): by_r for c, by_r in meeting}
    extra = 0
    queue = [c for c in candidates if c["status"] == "meets_slo"]
    while queue:
        c = queue.pop(0)
        if c.get("checks") is None:
            added, n_sims = _check(c, by_key[id(c)], base, spec)
            extra += n_sims
            if c["status"] != "meets_slo":
                continue
            if added:                      # dearer now: back in cost order among the rest
                queue.append(c)
                queue.sort(key=_cost_order)
                continue
        best = {k: c[k] for k in ("hardware", "dtype", "tp", "pp", "ep", "attn_dp", "speculative", "replicas",
                                  "num_gpus", "usd_per_hour", "usd_per_million_output_tokens")}
        best.update({k: c[k] for k in ("max_num_seqs", "max_num_batched_tokens", "usd_per_gpu_hour",
                                       "usd_per_million_input_tokens", "headroom", "checks", "fit", "fit_note")})
        best["margin"] = spec.margin
        best["rate"] = base.rate
        best["metrics"] = c["metrics"]
        return best, extra
    return None, extra


def _check(c, by_r, base, spec):
    """Honesty checks of a candidate meeting the SLO, recorded in ``c["checks"]``: one replica fewer
    must miss the planner's criterion (searched downwards if it does not); another seed must meet
    every SLO (replicas added, up to ``max_replicas`` / ``max_gpus``, while it does not). Updates
    ``c`` to the replica count found; marks it ``fails_other_seed`` when none works. Returns
    (replicas added, simulations run)."""
    lay = {k: c[k] for k in LAYOUT_KEYS}
    cfg = replace(base, price=c["usd_per_gpu_hour"], **lay)
    gpr = c["num_gpus"] // c["replicas"]
    sims = 0

    def at(r):                             # planner's criterion at r replicas, simulated once
        nonlocal sims
        if r not in by_r:
            by_r[r] = _sim(replace(cfg, replicas=r), spec.margin)
            sims += 1
        return by_r[r]

    r = c["replicas"]
    while r > 1 and at(r - 1)["ok"]:       # one fewer must fail; if it passes, the bound started too high
        r -= 1
    other = _sim(replace(cfg, replicas=r, seed=base.seed + 1), 0.0)
    sims += 1
    added = 0
    while not other["ok"] and r < spec.max_replicas and (r + 1) * gpr <= spec.max_gpus:
        r += 1                             # meets on one seed only: one more replica, both seeds again
        if not at(r)["ok"]:
            break
        other = _sim(replace(cfg, replicas=r, seed=base.seed + 1), 0.0)
        sims += 1
        added += 1
    if r != c["replicas"]:
        c.update(_candidate(lay, c["usd_per_gpu_hour"], gpr, by_r[r],
                            {"capacity_rps": c["capacity_bound_rps_per_replica"],
                             "r_min": c["replicas_lower_bound"], "fit": c["fit"], "fit_note": c["fit_note"]},
                            c["simulations"]))
    checks = {"other_seed": {"seed": base.seed + 1, "meets_slo": other["ok"], "reasons": other["reasons"]}}
    if added and other["ok"]:
        checks["other_seed"]["replicas_added"] = added
    if r > 1 and (r - 1) in by_r:
        checks["one_replica_fewer"] = {"replicas": r - 1, "meets_slo": by_r[r - 1]["ok"],
                                       "reasons": by_r[r - 1]["reasons"]}
    c["checks"] = checks
    if not other["ok"]:
        c["status"] = "fails_other_seed"
        c["reason"] = f"seed {base.seed + 1}: " + "; ".join(other["reasons"])
    return (added if other["ok"] else 0), sims


def why_not(candidates, rate) -> str:
    sim = [c for c in candidates if c.get("headroom") is not None]
    if sim:
        c = max(sim, key=lambda c: c["headroom"])
        return (f"no configuration meets the SLO at {rate:g} req/s; closest: {c['hardware']} {c['dtype']} "
                f"TP={c['tp']} PP={c['pp']} x {c['replicas']} replicas ({c['num_gpus']} GPUs) {c['reason']}")
    other = [c for c in candidates if c.get("reason")]
    if not other:
        return f"no configuration meets the SLO at {rate:g} req/s (nothing to search)"
    counts = {}
    for c in other:
        counts[c["status"]] = counts.get(c["status"], 0) + 1
    first = min(other, key=lambda c: {"pruned": 0, "misses_slo": 1, "over_budget": 2}.get(c["status"], 3))
    summary = ", ".join(f"{n} {s}" for s, n in counts.items())
    return (f"no configuration meets the SLO at {rate:g} req/s ({summary}); e.g. {first['hardware']} "
            f"{first['dtype']} TP={first['tp']} PP={first['pp']}: {first['reason']}")


def daily_cost(best, base, spec, backend):
    """GPU-hours per day when the replica count follows the daily curve (equal slots over 24 h),
    against holding the peak deployment all day."""
    lay = {k: best[k] for k in LAYOUT_KEYS}
    gpr = best["num_gpus"] // best["replicas"]
    cfg = replace(base, price=best["usd_per_gpu_hour"], **lay)
    tasks = [(replace(cfg, rate=r), 1, best["replicas"], spec.margin) for r in spec.daily_rates]
    res = backend.map(search_task, tasks)
    hours = 24.0 / len(spec.daily_rates)
    # a slot at the planned rate or above holds the checked peak deployment (both seeds meet there)
    reps = [best["replicas"] if r["best"] is None or rate >= base.rate else r["best"]
            for rate, r in zip(spec.daily_rates, res)]
    gpu_h = sum(n * gpr * hours for n in reps)
    peak_h = best["replicas"] * gpr * 24.0
    price = best["usd_per_gpu_hour"]
    return ({"slot_hours": hours, "rates": list(spec.daily_rates), "replicas": reps, "gpu_hours_per_day": gpu_h,
             "usd_per_day": gpu_h * price, "peak_gpu_hours_per_day": peak_h, "peak_usd_per_day": peak_h * price},
            sum(len(r["tried"]) for r in res))
