"""`servesim plan --disaggregated`: the cheapest prefill/decode (P:D) deployment meeting every SLO.

A P:D deployment is two pools (servesim/engine/POOLS.md): a `prefill` pool computing prompts and a
`decode` pool receiving their KV cache and generating the rest. Each role has its own layout
(hardware x dtype x TP x PP, from the plan's candidate lists) and replica count. The engine limits
(max_num_seqs, token budget) are deployment-wide, as the pools have them.

Search, per role first, then jointly:

1. per-role layouts: the weights must fit (`build_replica`), the KV cache of one replica must hold
   the longest prompt (prefill) or the longest prompt + output (decode), and the no-load latency
   floors must be under the targets (prefill: the q-quantile prompt alone against the TTFT target;
   decode: one batch-1 decode step against the TPOT target), as the co-located plan prunes;
2. a capacity bound per role, from the cost model (`iteration_components`):
   * prefill: one replica sustains ``k * isl / t(k prompts of isl)`` prompt tokens/s, where isl is
     the workload's mean prompt, ``k = max(1, floor(max_num_batched_tokens / isl))`` the prompts a
     full token budget holds, and t the iteration's interval; the role needs
     ``ceil(rate * isl / that)`` replicas;
   * decode: one replica sustains ``B / t(B decodes)`` tokens/s at its largest batch
     ``B = floor(min(max_num_seqs, kv_capacity_tokens / (isl + osl / 2)))`` (KV-bound or
     max_num_seqs-bound, with the mean context of a request half-way through its output), lowered to
     the largest batch whose decode step meets the TPOT target less the margin when a TPOT SLO is
     given (TPOT-bound); the role generates ``osl - 1`` tokens per request (the first comes from the
     prefill), so it needs ``ceil(rate * (osl - 1) / that)`` replicas;
3. candidates: every pair of surviving layouts with each role's count in bound - 1 .. bound + 2
   (`NEIGHBOURHOOD`), within --max-replicas (per role), --max-gpus and --budget (summed), ordered by
   $/hour (summing the pools, each at its hardware's price);
4. simulation in that order, a batch at a time, until one meets the planner's criterion (every SLO
   with the margin, not saturated, nothing rejected): every cheaper candidate has then been simulated
   and missed, so it is the cheapest in the searched space. ``exhaustive`` simulates every candidate.
5. the honesty checks of `plan._check`, per role: one prefill replica fewer and one decode replica
   fewer must each miss the criterion (searched downwards if not); another seed (seed + 1) must meet
   every SLO, replicas being added to the role whose target it misses (TTFT: prefill, TPOT / ITL:
   decode, anything else: both) until it does or the limits stop it; a candidate made dearer goes
   back in cost order.
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from ..costmodel.fields import table
from ..errors import ConfigError, InfeasibleError
from .common import LATENCY_SLACK, _lengths, _metrics, _quantile, _sim, borrowed_row, fit_columns

NEIGHBOURHOOD = (-1, 0, 1, 2)
ROLES = ("prefill", "decode")
MAX_SEED_STEPS = 4


# ---------------------------------------------------------------- per-role bounds
def _replica(layout: dict, base):
    from ..api import replica_of, resolve
    from ..config import load_hardware
    from ..costmodel.dtypes import check_dtype
    if layout.get("dtype", "auto") != "auto":
        hw = load_hardware(layout["hardware"])
        check_dtype(layout["dtype"], hw.name, hw.peak_flops)
    cfg, model, hw, _ = resolve(replace(base, pool=(), replicas=1, **layout))
    return cfg, hw, replica_of(cfg, model, hw)


def _iteration(p, tokens, n_pf, pairs, kv_pf, n_dec, kv_dec):
    """One step on the cost table ``p`` (costmodel/fields.py)."""
    from ..costmodel.iteration import iteration_components
    return iteration_components(p, float(tokens), float(n_pf), float(n_dec + n_pf), float(pairs),
                                float(kv_pf), float(n_dec), float(kv_dec))


def prefill_tokens_per_s(params, isl: float, max_num_batched_tokens: int) -> tuple[float, int]:
    """(prompt tokens/s of one prefill replica, prompts per iteration k): k = max(1, floor(budget /
    isl)) prompts of isl tokens in one iteration, at the iteration's interval."""
    k = max(1, int(max_num_batched_tokens // isl))
    it = _iteration(params, k * isl, k, k * isl * (isl + 1) / 2, k * isl, 0, 0)
    return k * isl / float(it.interval), k


def decode_tokens_per_s(params, batch: int, context: float) -> float:
    """Decode tokens/s of one replica running `batch` decodes of mean context `context`."""
    it = _iteration(params, 0, 0, 0, 0, batch, batch * context)
    return batch / float(it.interval)


def _decode_latency(params, batch: int, context: float) -> float:
    return float(_iteration(params, 0, 0, 0, 0, batch, batch * context).latency)


def role_bounds(layout: dict, role: str, base, prompt, output, rate: float, slo: dict, margin: float) -> dict:
    """{'status': ok|infeasible|pruned, 'reason', 'tokens_per_s' (one replica), 'replicas_bound',
    'gpus_per_replica', 'usd_per_gpu_hour', floors and the batch bound} of one role's layout."""
    try:
        cfg, hw, rc = _replica(layout, base)
    except (InfeasibleError, ConfigError) as e:
        return {"status": "infeasible", "reason": str(e)}
    p = table(rc.params)     # packed once for every step priced below
    isl, osl = float(prompt.mean()), float(max(output.mean(), 1.0))
    kv_cap = float(rc.memory.kv_capacity_tokens)
    out = {"status": "ok", "reason": "", "gpus_per_replica": rc.num_gpus, "usd_per_gpu_hour": hw.usd_per_hour,
           "kv_capacity_tokens": kv_cap, **fit_columns(rc)}
    need = float(np.max(prompt + output)) if role == "decode" else float(np.max(prompt))
    if kv_cap < need:
        what = "the longest prompt + output" if role == "decode" else "the longest prompt"
        return {**out, "status": "infeasible",
                "reason": f"one replica's KV cache holds {kv_cap:.0f} tokens, fewer than {what} ({need:.0f})"}
    if role == "prefill":
        tok_s, k = prefill_tokens_per_s(p, isl, cfg.max_num_batched_tokens)
        demand = rate * isl
        out.update(prompts_per_iteration=k)
        key = next((k for k in slo if k.startswith("ttft")), None)
        if key is not None:
            q = _quantile(prompt, key.split("_")[1])
            floor = float(_iteration(p, q, 1, q * (q + 1) / 2, q, 0, 0).latency)
            out["ttft_floor_ms"] = floor * 1e3
            if floor * LATENCY_SLACK > slo[key] * (1.0 - margin):
                return {**out, "status": "pruned",
                        "reason": f"{key} floor {floor * 1e3:.1f} ms (prompt alone) exceeds the target "
                                  f"{slo[key] * 1e3:.1f} ms" + (f" less the {100 * margin:.0f}% margin" if margin else "")}
    else:
        context = isl + osl / 2.0
        b_kv = kv_cap / context
        batch, limit = (cfg.max_num_seqs, "max_num_seqs") if cfg.max_num_seqs <= b_kv else (b_kv, "kv")
        batch = max(1, int(math.floor(batch)))
        tpot = next((key for key in slo if key.startswith(("tpot", "itl"))), None)
        if tpot is not None:
            q = _quantile(prompt, "p50" if tpot.startswith("itl") else tpot.split("_")[1])
            floor = _decode_latency(p, 1, q)
            out["tpot_floor_ms"] = floor * 1e3
            target = slo[tpot] * (1.0 - margin)
            if floor * LATENCY_SLACK > target:
                return {**out, "status": "pruned",
                        "reason": f"{tpot} floor {floor * 1e3:.1f} ms (one decode) exceeds the target "
                                  f"{slo[tpot] * 1e3:.1f} ms" + (f" less the {100 * margin:.0f}% margin" if margin else "")}
            if _decode_latency(p, batch, context) > target:
                lo, hi = 1, batch            # latency(lo) <= target < latency(hi)
                while hi - lo > 1:
                    mid = (lo + hi) // 2
                    if _decode_latency(p, mid, context) <= target:
                        lo = mid
                    else:
                        hi = mid
                batch, limit = lo, "tpot"
        tok_s = decode_tokens_per_s(p, batch, context)
        demand = rate * max(osl - 1.0, 0.0)
        out.update(batch_bound=batch, batch_limited_by=limit)
    out["tokens_per_s"] = tok_s
    out["replicas_bound"] = max(1, int(math.ceil(demand / tok_s))) if tok_s > 0 else 1
    return out


def capacity_bounds(base, layout_p: dict, layout_d: dict, rate: float | None = None, slo: dict | None = None,
                    margin: float = 0.0) -> dict:
    """The per-role capacity bounds of one P:D layout pair for `base`'s workload and rate (API and
    tests): {'prefill': role_bounds(...), 'decode': role_bounds(...)}."""
    from ..checks import check_sim_config
    base = check_sim_config(base)
    prompt, output = _lengths(base)
    rate = rate if rate is not None else base.rate
    slo = dict(base.slo.items()) if slo is None and base.slo else dict(slo or {})
    return {"prefill": role_bounds(layout_p, "prefill", base, prompt, output, rate, slo, margin),
            "decode": role_bounds(layout_d, "decode", base, prompt, output, rate, slo, margin)}


# ---------------------------------------------------------------- candidates
def _role_layouts(spec):
    for hw in spec.hardware:
        for dtype in spec.dtypes:
            for tp in spec.tps:
                for pp in spec.pps:
                    yield {"hardware": hw, "dtype": dtype, "tp": tp, "pp": pp}


def pool_specs(lp: dict, ld: dict, p: int, d: int, dtypes: tuple) -> tuple[str, str]:
    """The two `--pool` texts of a candidate (dtype named in the spec only when dtypes are searched)."""
    from ..pools import PoolSpec
    multi = len(dtypes) > 1
    sp, sd = (PoolSpec(x["hardware"], tp=x["tp"], pp=x["pp"], replicas=n, role=role, ep=x.get("ep", 1),
                       attn_dp=x.get("attn_dp", 1), dtype=x["dtype"] if multi else None)
              for x, n, role in ((lp, p, "prefill"), (ld, d, "decode")))
    return sp.text, sd.text


class _Cand:
    __slots__ = ("lp", "ld", "bp", "bd", "p", "d", "row", "by", "checked")

    def __init__(self, lp, ld, bp, bd, p, d):
        self.lp, self.ld, self.bp, self.bd, self.p, self.d = lp, ld, bp, bd, p, d
        self.row, self.by, self.checked = None, None, False


def _price(spec, role_bounds_: dict, hardware: str) -> float:
    return spec.prices.get(hardware, spec.default_price if spec.default_price is not None
                           else role_bounds_["usd_per_gpu_hour"])


def pd_task(arg) -> dict:
    """Task: (SimConfig with two pools, margin) -> the planner's verdict and summary."""
    cfg, margin = arg
    return _sim(cfg, margin)


class _Search:
    def __init__(self, spec, base, backend, progress):
        self.spec, self.base, self.backend, self.progress = spec, base, backend, progress
        self.results = {}          # (key, p, d, seed) -> _sim result
        self.sims = 0

    def cfg(self, c, p, d, seed=None):
        pools = pool_specs(c.lp, c.ld, p, d, self.spec.dtypes)
        dtype = c.lp["dtype"] if len(self.spec.dtypes) == 1 else self.base.dtype
        return replace(self.base, pool=pools, dtype=dtype, price=self.spec.default_price,
                       seed=self.base.seed if seed is None else seed)

    def key(self, c, p, d, seed):
        return (tuple(c.lp.values()), tuple(c.ld.values()), p, d, seed)

    def run(self, items):
        """items: [(cand, p, d, seed, margin)] -> results (simulated once each, in parallel)."""
        todo = [(self.key(c, p, d, s), (self.cfg(c, p, d, s), m)) for c, p, d, s, m in items
                if self.key(c, p, d, s) not in self.results]
        seen, uniq = set(), []
        for k, a in todo:
            if k not in seen:
                seen.add(k)
                uniq.append((k, a))
        if uniq:
            res = self.backend.map(pd_task, [a for _, a in uniq], self.progress)
            self.sims += len(uniq)
            for (k, _), r in zip(uniq, res):
                self.results[k] = r
        return [self.results[self.key(c, p, d, s)] for c, p, d, s, _ in items]

    def at(self, c, p, d):
        return self.run([(c, p, d, self.base.seed, self.spec.margin)])[0]

    def usd(self, c, p, d):
        return (p * c.bp["gpus_per_replica"] * c.bp["price"] + d * c.bd["gpus_per_replica"] * c.bd["price"])

    def gpus(self, c, p, d):
        return p * c.bp["gpus_per_replica"] + d * c.bd["gpus_per_replica"]

    def fits(self, c, p, d):
        s = self.spec
        if p > s.max_replicas or d > s.max_replicas or self.gpus(c, p, d) > s.max_gpus:
            return False
        return s.budget_usd_per_hour is None or self.usd(c, p, d) <= s.budget_usd_per_hour + 1e-9


def _grow(reasons) -> tuple[int, int]:
    """Which role to give one more replica, from the reasons a run misses: TTFT -> prefill, TPOT /
    ITL -> decode, anything else (saturation, rejections, E2E) -> both."""
    dp = dd = 0
    for r in reasons:
        if r.startswith("ttft"):
            dp = 1
        elif r.startswith(("tpot", "itl")):
            dd = 1
        else:
            dp = dd = 1
    return (dp, dd) if dp or dd else (1, 1)


def _check(S: _Search, c: _Cand) -> int:
    """plan._check for a P:D candidate: one replica fewer of each role must miss the criterion; the
    other seed must meet every SLO (replicas added to the role it misses). Updates c.p, c.d, c.row;
    returns the replicas added (0 when it fails the other seed)."""
    base = S.base
    p, d = c.p, c.d
    while True:                              # one fewer of either role must fail
        if p > 1 and S.at(c, p - 1, d)["ok"]:
            p -= 1
        elif d > 1 and S.at(c, p, d - 1)["ok"]:
            d -= 1
        else:
            break
    seed = base.seed + 1
    other = S.run([(c, p, d, seed, 0.0)])[0]
    added = 0
    for _ in range(MAX_SEED_STEPS):
        if other["ok"]:
            break
        dp, dd = _grow(other["reasons"])
        if not S.fits(c, p + dp, d + dd):
            break
        p, d = p + dp, d + dd
        added += dp + dd
        if not S.at(c, p, d)["ok"]:
            continue
        other = S.run([(c, p, d, seed, 0.0)])[0]
    c.p, c.d = p, d
    c.checked = True
    checks = {"other_seed": {"seed": seed, "meets_slo": other["ok"], "reasons": other["reasons"]}}
    if added and other["ok"]:
        checks["other_seed"]["replicas_added"] = added
    if p > 1:
        r = S.at(c, p - 1, d)
        checks["one_prefill_replica_fewer"] = {"replicas": [p - 1, d], "meets_slo": r["ok"], "reasons": r["reasons"]}
    if d > 1:
        r = S.at(c, p, d - 1)
        checks["one_decode_replica_fewer"] = {"replicas": [p, d - 1], "meets_slo": r["ok"], "reasons": r["reasons"]}
    c.row = _row(S, c, S.at(c, p, d))
    c.row["checks"] = checks
    if not other["ok"]:
        c.row["status"] = "fails_other_seed"
        c.row["reason"] = f"seed {seed}: " + "; ".join(other["reasons"])
        return 0
    if not S.at(c, p, d)["ok"]:
        c.row["status"] = "misses_slo"
        c.row["reason"] = "; ".join(S.at(c, p, d)["reasons"])
        return 0
    return added


def _row(S: _Search, c: _Cand, sim: dict) -> dict:
    pools = pool_specs(c.lp, c.ld, c.p, c.d, S.spec.dtypes)
    usd = S.usd(c, c.p, c.d)
    row = {"pools": list(pools), "hardware": f"{c.lp['hardware']}+{c.ld['hardware']}",
           "dtype": c.lp["dtype"] if c.lp["dtype"] == c.ld["dtype"] else f"{c.lp['dtype']}+{c.ld['dtype']}",
           "tp": f"{c.lp['tp']}+{c.ld['tp']}", "pp": f"{c.lp['pp']}+{c.ld['pp']}", "replicas": c.p + c.d}
    for role, lay, b, n in (("prefill", c.lp, c.bp, c.p), ("decode", c.ld, c.bd, c.d)):
        row.update({f"{role}_{k}": v for k, v in lay.items()})
        row.update({f"{role}_replicas": n, f"{role}_replicas_bound": b["replicas_bound"],
                    f"{role}_tokens_per_s_bound": b["tokens_per_s"], f"{role}_usd_per_gpu_hour": b["price"]})
    measured = c.bp["fit"] == c.bd["fit"] == "measured"
    notes = dict.fromkeys((c.bp["fit_note"], c.bd["fit_note"]))      # one note when both roles share it
    row.update({"num_gpus": S.gpus(c, c.p, c.d), "usd_per_hour": usd, "fit": "measured" if measured else "borrowed",
                "fit_note": " | ".join(notes)})
    s = sim.get("summary")
    if s:
        out_tok = s["throughput"]["output_tokens_per_s"]
        row.update({"usd_per_million_output_tokens": usd * 1e6 / (3600.0 * out_tok) if out_tok > 0 else None,
                    "headroom": sim["headroom"], "ttft_ms_p50": s["ttft_ms"]["p50"], "ttft_ms_p99": s["ttft_ms"]["p99"],
                    "tpot_ms_p50": s["tpot_ms"]["p50"], "tpot_ms_p99": s["tpot_ms"]["p99"],
                    "e2e_ms_p99": s["e2e_ms"]["p99"], "slo_attainment": s["slo_attainment"],
                    "goodput_requests_per_s": s["goodput_requests_per_s"],
                    "kv_transfer_ms_p50": (s.get("kv_transfer_ms") or {}).get("p50"),
                    "kv_transfer_ms_p99": (s.get("kv_transfer_ms") or {}).get("p99"),
                    "output_tokens_per_s_per_gpu": s["throughput"]["output_tokens_per_s_per_gpu"],
                    "metrics": {**_metrics(s), "kv_transfer_ms": s.get("kv_transfer_ms"), "pools": s.get("pools")}})
    row["status"] = "meets_slo" if sim["ok"] else ("misses_slo" if sim["status"] == "ok" else sim["status"])
    row["reason"] = "" if sim["ok"] else "; ".join(sim["reasons"])
    return row


def _cost_key(S, c):
    return (S.usd(c, c.p, c.d), S.gpus(c, c.p, c.d), c.p + c.d)


def plan_disaggregated(spec, base, rate: float, backend, progress=None):
    """The P:D plan of a checked base at `rate` -> (best, candidates, why_not, simulations, search
    space), made a `common.PlanResult` by `plan.run_plan`."""
    from ..config import list_hardware
    hardware = spec.hardware or tuple(list_hardware())
    spec = replace(spec, hardware=hardware)
    # the engine limits are deployment-wide: one value each (prepare_plan refuses lists)
    base = replace(base, max_num_seqs=spec.max_num_seqs[0], max_num_batched_tokens=spec.max_num_batched_tokens[0])
    slo = dict(base.slo.items())
    prompt, output = _lengths(base)
    layouts = list(_role_layouts(spec))
    per_role = {r: [] for r in ROLES}
    rejected = []
    for role in ROLES:
        for lay in layouts:
            b = role_bounds(lay, role, base, prompt, output, rate, slo, spec.margin)
            if b["status"] != "ok":
                rejected.append({"role": role, **{f"{role}_{k}": v for k, v in lay.items()}, **lay,
                                 "status": b["status"], "reason": f"{role}: {b['reason']}"})
                continue
            if spec.require_measured and b["fit"] != "measured":
                rejected.append({"role": role, **borrowed_row(lay, b, role)})
                continue
            b["price"] = _price(spec, b, lay["hardware"])
            if b["replicas_bound"] - 1 > spec.max_replicas or b["gpus_per_replica"] > spec.max_gpus:
                rejected.append({"role": role, **lay, "status": "pruned",
                                 "reason": f"{role}: needs >= {max(1, b['replicas_bound'] - 1)} replicas of "
                                           f"{b['gpus_per_replica']} GPUs by the capacity bound "
                                           f"({b['tokens_per_s']:.0f} tokens/s each), beyond the limits"})
                continue
            per_role[role].append((lay, b))
    S = _Search(spec, base, backend, progress)
    cands = []
    for lp, bp in per_role["prefill"]:
        for ld, bd in per_role["decode"]:
            for dp in NEIGHBOURHOOD:
                for dd in NEIGHBOURHOOD:
                    p, d = bp["replicas_bound"] + dp, bd["replicas_bound"] + dd
                    if p < 1 or d < 1:
                        continue
                    c = _Cand(lp, ld, bp, bd, p, d)
                    if S.fits(c, p, d):
                        cands.append(c)
    if spec.exhaustive:
        from ..engine.budget import check_points
        check_points(len(cands), "plan --disaggregated --exhaustive", "use fewer --hardware / --tp values or a smaller "
                     "--max-gpus")
    cands.sort(key=lambda c: _cost_key(S, c))
    keys = {S.key(c, c.p, c.d, 0) for c in cands}
    width = max(2, getattr(backend, "workers", 1) or 1)
    best, ready, i = None, [], 0
    while i < len(cands) or ready:
        nxt = _cost_key(S, cands[i]) if i < len(cands) else None
        ready.sort(key=lambda c: (_cost_key(S, c)[:2], -(c.row.get("headroom") or 0.0)))
        # equal $/hour not yet simulated: simulate it first, the tie goes to the larger headroom
        if ready and (nxt is None or _cost_key(S, ready[0])[0] < nxt[0] - 1e-9):
            best = ready.pop(0)
            break
        n = len(cands) - i if spec.exhaustive else width
        batch = cands[i:i + n]
        i += len(batch)
        res = S.run([(c, c.p, c.d, base.seed, spec.margin) for c in batch])
        grown = []
        for c, r in zip(batch, res):
            c.row = _row(S, c, r)
            if r["status"] == "ok" and not r["ok"]:     # beyond the neighbourhood: one more where it misses
                dp, dd = _grow(r["reasons"])
                g = _Cand(c.lp, c.ld, c.bp, c.bd, c.p + dp, c.d + dd)
                k = S.key(g, g.p, g.d, 0)
                if k not in keys and S.fits(g, g.p, g.d):
                    keys.add(k)
                    grown.append(g)
        if grown:
            cands[i:] = sorted(cands[i:] + grown, key=lambda c: _cost_key(S, c))
        for c in sorted((c for c in batch if c.row["status"] == "meets_slo"), key=lambda c: _cost_key(S, c)):
            _check(S, c)
            if c.row["status"] == "meets_slo":
                ready.append(c)
    simulated = [c for c in cands if c.row is not None]
    rows = [c.row for c in simulated]
    order = {"meets_slo": 0, "fails_other_seed": 1, "misses_slo": 2, "pruned": 3, "borrowed_fit": 4, "over_budget": 5,
             "infeasible": 6, "error": 7}
    rows.sort(key=lambda r: (order.get(r["status"], 9), r.get("usd_per_hour") or math.inf))
    if best is not None:
        rows.remove(best.row)
        rows.insert(0, best.row)
    rows += rejected
    out = None
    if best is not None:
        out = _best(S, best, spec, base, rate, per_role, len(cands))
    why = None if best else why_not(rows, rate, per_role)
    return out, rows, why, S.sims + (out or {}).get("capacity_simulations", 0), len(cands)


def _best(S, c, spec, base, rate, per_role, n_cands) -> dict:
    from .capacity import capacity, cost_split
    r = c.row
    b = {"disaggregated": True, "pools": r["pools"], "pool_args": " ".join(f"--pool {t}" for t in r["pools"])}
    for role, lay, bounds, n in (("prefill", c.lp, c.bp, c.p), ("decode", c.ld, c.bd, c.d)):
        g = bounds["gpus_per_replica"]
        b[role] = {**lay, "replicas": n, "num_gpus": n * g, "usd_per_gpu_hour": bounds["price"],
                   "usd_per_hour": n * g * bounds["price"],
                   "capacity_bound": {k: bounds[k] for k in ("tokens_per_s", "replicas_bound", "prompts_per_iteration",
                                                             "batch_bound", "batch_limited_by") if k in bounds}}
    b.update({k: r[k] for k in ("hardware", "dtype", "tp", "pp", "replicas", "num_gpus", "usd_per_hour",
                                "usd_per_million_output_tokens", "headroom", "slo_attainment", "checks", "metrics",
                                "fit", "fit_note")})
    b.update(margin=spec.margin, rate=rate, candidates_in_space=n_cands)
    cap = capacity(S.cfg(c, c.p, c.d), rate)
    b.update({"max_sustainable_rate": cap["max_sustainable_rate"], "capacity_headroom": cap["capacity_headroom"],
              "cost_split": cost_split(b["usd_per_hour"], cap["capacity_headroom"]),
              "capacity_simulations": cap["simulations"]})
    return b


def why_not(rows, rate, per_role) -> str:
    sim = [r for r in rows if r.get("headroom") is not None]
    if sim:
        r = max(sim, key=lambda r: r["headroom"])
        return (f"no configuration meets the SLO at {rate:g} req/s with prefill/decode pools; closest: "
                f"{' + '.join(r['pools'])} ({r['num_gpus']} GPUs) {r['reason']}")
    other = [r for r in rows if r.get("reason")]
    if not other:
        return f"no configuration meets the SLO at {rate:g} req/s with prefill/decode pools (nothing to search)"
    missing = [role for role in ROLES if not per_role[role]]
    first = other[0]
    lead = f"no {' or '.join(missing)} layout survives the bounds" if missing else "nothing was simulated"
    return (f"no configuration meets the SLO at {rate:g} req/s with prefill/decode pools ({lead}); e.g. "
            f"{first.get('hardware')} {first.get('dtype')} TP={first.get('tp')} PP={first.get('pp')}: {first['reason']}")
