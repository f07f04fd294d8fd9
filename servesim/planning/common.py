"""What the co-located planner (`plan.py`) and the disaggregated one (`disagg.py`) share: the result
type, the workload's lengths, a simulated candidate and its metrics, fit provenance columns."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .evaluate import simulate_summary, verdict

LATENCY_SLACK = 0.95    # latency floors are compared after this factor


@dataclass(frozen=True)
class PlanResult:
    """What `plan.run_plan` (and so `servesim.plan`, `servesim plan`) returns.

    Attributes
    ----------
    best : dict or None
        The cheapest deployment meeting every SLO, checked on another seed and with one replica
        fewer: hardware, dtype, tp, pp, replicas, num_gpus, usd_per_hour,
        usd_per_million_output_tokens, headroom, cost_split, checks, metrics (and daily with
        ``daily_rates``). None when nothing meets (`servesim.plan` then raises InfeasibleError).
    candidates : pandas.DataFrame
        Every layout searched, best first, one flat row each (``candidates.csv``).
    summary : dict
        The whole plan as ``servesim plan --format json`` prints it (``plan.json``): ``best``,
        ``candidates`` (the rows with their nested blocks), ``why_not``, ``simulations``, ``search_space``.
    """
    best: dict | None
    candidates: object      # pandas.DataFrame
    summary: dict = field(repr=False)

    @property
    def why_not(self) -> str | None:
        return self.summary.get("why_not")

    @property
    def simulations(self) -> int:
        return self.summary["simulations"]

    def to_json(self) -> str:
        from ..outputs.jsonout import dumps
        return dumps(self.summary)


def plan_result(best, rows: list, why: str | None, simulations: int, space: int, *, hardware_given: bool,
                disaggregated: bool) -> PlanResult:
    """A search's result as a `PlanResult`; with no hardware given, only the profiles that can hold the
    model are listed."""
    import pandas as pd
    cands = rows
    if not hardware_given:   # a P:D row names both roles' hardware, joined by +
        fits = {h for c in cands if c["status"] != "infeasible" for h in str(c["hardware"]).split("+")}
        cands = [c for c in cands if all(h in fits for h in str(c["hardware"]).split("+"))]
    flat = [{k: v for k, v in c.items() if not isinstance(v, dict)} for c in cands]
    if disaggregated:  # one type per column: pools as text, TP/PP as "prefill+decode" text
        flat = [{k: (" ".join(v) if isinstance(v, list) else str(v) if k in ("tp", "pp") else v)
                 for k, v in r.items()} for r in flat]
    summary = {"best": best, "candidates": cands, "why_not": why, "simulations": simulations,
               "search_space": space}
    return PlanResult(best, pd.DataFrame(flat), summary)


def _lengths(base):
    """(prompt tokens to prefill, output tokens) of a sample of the workload's requests, for the bounds:
    a shared prefix's blocks (the system prompt; a user's whole re-sent prompt) counted as cached, as
    a warm prefix cache serves them (the simulation decides the actual hits)."""
    from ..config import load_model
    from ..config.engine import load_engine
    from ..workload import DEFAULT_NUM_REQUESTS, build_requests, load_workload, with_shared_prefix
    from ..workload.chains import block_chains
    model = load_model(base.model)
    workload = with_shared_prefix(load_workload(base.workload), base.num_system_prompts,
                                  base.users_per_system_prompt, base.system_prompt_len, base.question_per)
    reqs = build_requests(workload, min(base.num_requests or DEFAULT_NUM_REQUESTS, 4000), base.seed, rate=1.0,
                          isl=base.isl, osl=base.osl, max_len=model.max_context, question_len=base.question_len)
    prompt = np.asarray(reqs.prompt, float)
    if workload.shared_prefix is not None and base.prefix_caching is not False:
        bs = base.block_size if base.block_size is not None else load_engine(base.engine).scheduler.block_size
        hit = np.minimum(block_chains(reqs, bs).length * bs, (reqs.prompt - 1) // bs * bs)
        prompt = prompt - hit
    return prompt, np.asarray(reqs.output, float)


def _quantile(x, stat):
    return float(x.mean()) if stat == "mean" else float(np.quantile(x, int(stat[1:]) / 100.0))


def fit_columns(rc) -> dict:
    """A layout's ``fit``: "measured" when its hardware efficiencies and engine table were fitted on
    its own GPU, else "borrowed" (``fit_note`` says which terms: `config.engine.provenance`)."""
    from ..config.engine import replica_provenance
    p = replica_provenance(rc)
    return {"fit": "measured" if p["measured"] else "borrowed", "fit_note": p["text"]}


def borrowed_row(layout: dict, bounds: dict, role: str = "") -> dict:
    """The candidate row of a layout that ``--require-measured`` leaves out."""
    return {**layout, "status": "borrowed_fit", "fit": bounds["fit"], "fit_note": bounds["fit_note"],
            "reason": f"{role + ': ' if role else ''}rests on borrowed fits ({bounds['fit_note']}); "
                      "--require-measured leaves it out"}


def _sim(cfg, margin):
    status, out = simulate_summary(cfg)
    if status != "ok":
        return {"replicas": cfg.replicas, "status": status, "ok": False, "reasons": [out], "headroom": None,
                "summary": None}
    ok, reasons, head = verdict(out, margin)
    return {"replicas": cfg.replicas, "status": "ok", "ok": ok, "reasons": reasons, "headroom": head, "summary": out}


def _metrics(s: dict) -> dict:
    keep = ("ttft_ms", "tpot_ms", "e2e_ms", "queue_ms")
    m = {k: {kk: vv for kk, vv in s[k].items() if kk != "ci95"} for k in keep}
    m.update({"itl_ms": s["itl_ms"], "throughput": s["throughput"], "utilization": s["utilization"],
              "saturated": s["saturated"], "slo": s["slo"], "slo_attainment": s["slo_attainment"],
              "goodput_requests_per_s": s["goodput_requests_per_s"], "num_completed": s["num_completed"]})
    return m
