"""One point: SimConfig -> simulate -> flat row; and the SLO verdict shared by max-rate and the planner.

These functions run inside worker processes / Dask tasks: they take and return plain picklable
values and turn user errors into error records instead of raising.
"""
from __future__ import annotations

from ..errors import ConfigError, InfeasibleError

# columns that lead every row, in this order
LEAD = ("point", "status", "error")


def flatten(d: dict, prefix: str = "") -> dict:
    """Nested summary -> one level: {'ttft_ms': {'p99': x}} -> {'ttft_ms_p99': x}; [lo, hi] -> _lo/_hi."""
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "_"))
        elif isinstance(v, (list, tuple)) and len(v) == 2:
            out[key + "_lo"], out[key + "_hi"] = v
        else:
            out[key] = v
    return out


def summary_row(summary: dict) -> dict:
    """Config keys unprefixed, then every metric flattened."""
    row = dict(summary["config"])
    rest = {k: v for k, v in summary.items() if k != "config"}
    row.update(flatten(rest))
    slo = summary.get("slo") or {}
    row["slo_met"] = all(v["met"] for v in slo.values()) if slo else None
    return row


def verdict(summary: dict, margin: float = 0.0) -> tuple[bool, list[str], float | None]:
    """(meets every SLO with `margin` headroom and is sustainable, reasons it does not, min headroom).

    headroom of one target = 1 - value / target; the point passes when every headroom >= margin,
    the run is not saturated and no request was rejected."""
    reasons = []
    if summary.get("saturated"):
        reasons.append("saturated (queue grows without bound)")
    if summary.get("num_rejected"):
        reasons.append(f"{summary['num_rejected']} requests rejected (prompt + output exceed the KV cache)")
    head = None
    for key, v in (summary.get("slo") or {}).items():
        value, target = v["value_ms"], v["target_ms"]
        if value is None:
            reasons.append(f"{key}: no completed requests")
            h = -1.0
        else:
            h = 1.0 - value / target
            if h < margin:
                over = value / target - 1.0
                reasons.append(f"{key} {value:.1f} ms vs target {target:.1f} ms "
                               + (f"({100 * over:+.0f}%)" if over > 0 else f"(headroom {100 * h:.0f}% < margin {100 * margin:.0f}%)"))
        head = h if head is None else min(head, h)
    return (not reasons), reasons, head


def simulate_summary(cfg) -> tuple[str, object]:
    """('ok', summary) | ('infeasible', message) | ('error', message)."""
    from ..api import simulate
    try:
        return "ok", simulate(cfg).summary
    except InfeasibleError as e:
        return "infeasible", str(e)
    except ConfigError as e:
        return "error", str(e)


def point_row(arg) -> dict:
    """Task: (index, SimConfig) -> one flat row."""
    index, cfg = arg
    status, out = simulate_summary(cfg)
    if status == "ok":
        return {"point": index, "status": "ok", "error": "", **summary_row(out)}
    from ..options import plain
    return {"point": index, "status": status, "error": out, **plain(cfg)}
