"""Capacity headroom: how far the offered load is below the most the deployment sustains.

The maximum sustainable rate is simulated, not bounded: the highest arrival rate whose run is not
saturated (the waiting queue does not grow, `metrics` saturation verdict) and rejects nothing,
found by `maxrate.search_max_rate` with no SLO (bracketing from the offered rate, then bisection to
within `tol`). capacity_headroom = 1 - offered / max sustainable rate, i.e. 1 - rho with rho the
utilisation lambda / mu of a single-server queue (Kleinrock 1975, vol. 1, sec. 2.1); it is the
share of the deployment's throughput capacity the load leaves unused. `busy_fraction` cannot say
this: under continuous batching some request is almost always in flight, whatever the load.

It costs about 5-8 simulations, so `simulate` computes it only when asked (`--capacity`); `plan`
computes it for the deployment it picks, and `report` shows it there.
"""
from __future__ import annotations

from dataclasses import replace

from .maxrate import search_max_rate

TOL = 0.05
REQUESTS_PER_SLOT = 2     # the search's runs hold at least this many requests per batch slot


def long_enough(cfg):
    """``cfg`` with at least REQUESTS_PER_SLOT x the deployment's batch slots (replicas x DP attention
    ranks x --max-num-seqs) requests: a run whose requests all fit in the running batches never
    queues, so an overload would never look saturated (a wide-EP replica has 8 x 256 slots, more than
    the default 2,000 requests). Unchanged where a duration or a trace fixes the count."""
    from ..api import resolve
    from ..pools import specs_of
    from ..workload.spec import DEFAULT_NUM_REQUESTS
    if cfg.duration is not None or cfg.trace_mode != "lengths" or (cfg.num_requests is None and cfg.arrival == "daily"):
        return cfg
    filled = resolve(cfg)[0]
    slots = sum(s.replicas * s.attn_dp for s in specs_of(filled)) * filled.max_num_seqs
    n = filled.num_requests if filled.num_requests is not None else DEFAULT_NUM_REQUESTS
    return cfg if n >= REQUESTS_PER_SLOT * slots else replace(cfg, num_requests=REQUESTS_PER_SLOT * slots)


def capacity(cfg, offered_rate: float, tol: float = TOL) -> dict:
    """{'offered_rate', 'max_sustainable_rate', 'first_saturated_rate', 'capacity_headroom',
    'simulations', 'limited_by'} of the deployment `cfg` (a SimConfig) at `offered_rate` req/s
    (runs of at least `long_enough` requests). `max_sustainable_rate` is None (and the headroom too)
    when no rate is sustainable."""
    row = search_max_rate(replace(long_enough(cfg), slo=None), tol=tol, start=offered_rate)
    top = row["max_rate"]
    return {"offered_rate": offered_rate, "max_sustainable_rate": top,
            "first_saturated_rate": row["first_failing_rate"],
            "capacity_headroom": capacity_headroom(offered_rate, top),
            "simulations": row["simulations"], "limited_by": row["limited_by"] or row.get("error") or ""}


def capacity_headroom(offered_rate: float, max_rate: float | None) -> float | None:
    """1 - offered / max sustainable rate; None when the maximum is unknown."""
    if not max_rate:
        return None
    return 1.0 - offered_rate / max_rate


def cost_split(usd_per_hour: float, headroom: float | None) -> dict | None:
    """$/hour of the capacity the load uses and of the capacity held unused (the headroom)."""
    if headroom is None:
        return None
    used = min(max(1.0 - headroom, 0.0), 1.0)
    return {"used_usd_per_hour": usd_per_hour * used, "headroom_usd_per_hour": usd_per_hour * (1.0 - used)}


def check_open_loop(cfg) -> None:
    """The search varies the arrival rate, so it needs an open-loop load at one rate."""
    from ..errors import ConfigError
    for bad, what in ((cfg.offline, "--offline"), (cfg.concurrency, f"--concurrency {cfg.concurrency}"),
                      (cfg.stages, "--stages"), (cfg.trace_mode == "replay", "--trace-mode replay")):
        if bad:
            raise ConfigError(f"--capacity varies the arrival rate, so it does not work with {what}; "
                              "give an open-loop --rate (or none, for the workload's rate)")


def capacity_sentence(b: dict) -> str:
    """The chosen deployment's simulated capacity and the $/hour the load uses vs leaves unused
    (plan's text and the report share it)."""
    if b.get("capacity_headroom") is None:
        return "No sustainable rate was found for its capacity."
    cs = b["cost_split"]
    return (f"It sustains up to {b['max_sustainable_rate']:.3g} req/s (simulated), a capacity headroom of "
            f"{100 * b['capacity_headroom']:.0f}%: ${cs['used_usd_per_hour']:.2f}/h of capacity carries the load, "
            f"${cs['headroom_usd_per_hour']:.2f}/h is unused (for the SLO, and replicas come whole).")
