"""Parsing `--rates 1,2,4` / `--rates 1:64:16` and `--grid key=v1,v2`, and expanding them into points."""
from __future__ import annotations

import itertools
import math
from dataclasses import replace

from ..engine.budget import MAX_SWEEP_POINTS, check_points
from ..errors import ConfigError

def _float(text: str, option: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise ConfigError(f"{option}: {text!r} is not a number; write e.g. 1,2,4 or 1:64:16") from None
    if not math.isfinite(v):
        raise ConfigError(f"{option}: {text!r} is not a finite number")
    return v


def parse_rates(text: str, option: str = "--rates") -> list[float]:
    """'1,2,4' -> [1, 2, 4]; 'START:STOP:COUNT' -> COUNT geometrically spaced rates from START to STOP."""
    text = (text or "").strip()
    if not text:
        raise ConfigError(f"{option}: empty rate list; write e.g. 1,2,4 or 1:64:16 (start:stop:count, geometric)")
    if ":" in text:
        parts = text.split(":")
        if len(parts) != 3:
            raise ConfigError(f"{option}: {text!r} is not START:STOP:COUNT; write e.g. 1:64:16")
        start, stop = _float(parts[0], option), _float(parts[1], option)
        try:
            count = int(parts[2])
        except ValueError:
            raise ConfigError(f"{option}: count {parts[2]!r} in {text!r} is not an integer; write e.g. 1:64:16") from None
        if start <= 0 or stop <= 0:
            raise ConfigError(f"{option}: rates must be > 0 req/s, got {text!r}; write e.g. 1:64:16")
        if stop < start:
            raise ConfigError(f"{option}: empty range {text!r} (stop < start); write e.g. {parts[1]}:{parts[0]}:{count}")
        if count < 1:
            raise ConfigError(f"{option}: count must be >= 1 in {text!r}; write e.g. {parts[0]}:{parts[1]}:8")
        check_points(count, f"{option} {text}", f"use a count of at most {MAX_SWEEP_POINTS:,}, e.g. "
                                                f"{parts[0]}:{parts[1]}:16")
        if count == 1:
            return [start]
        ratio = (stop / start) ** (1.0 / (count - 1))
        rates = [start * ratio ** i for i in range(count)]
        rates[-1] = stop
        return [float(f"{r:.6g}") for r in rates]
    rates = [_float(p.strip(), option) for p in text.split(",") if p.strip()]
    if not rates:
        raise ConfigError(f"{option}: empty rate list {text!r}; write e.g. 1,2,4")
    bad = [r for r in rates if r <= 0]
    if bad:
        raise ConfigError(f"{option}: rates must be > 0 req/s, got {bad[0]:g}; write e.g. 1,2,4 or 1:64:16")
    return rates


def _coerce(key: str, text: str, option: str):
    """Text -> the field's type (int, float, bool, a duration in seconds); other kinds stay text for
    `checks.check_field`."""
    from ..options import options
    kind = options()[key].kind
    if kind == "duration":
        from ..metrics import parse_duration
        return parse_duration(text, option)
    try:
        if kind == "int":
            return int(text)
        if kind == "float":
            return float(text)
    except ValueError:
        raise ConfigError(f"{option}: {text!r} is not {'an integer' if kind == 'int' else 'a number'}") from None
    if kind == "bool":
        if text.lower() in ("1", "true", "yes"):
            return True
        if text.lower() in ("0", "false", "no"):
            return False
        raise ConfigError(f"{option}: {text!r} is not true/false")
    return text


def parse_values(key: str, text: str, option: str) -> list:
    """'1,2,4' -> [1, 2, 4] for SimConfig field `key`: each value coerced and checked by the field's
    declared rule (`checks.check_field`), errors naming `option`."""
    from ..checks import check_field
    values = [check_field(key, _coerce(key, v.strip(), option), option) for v in str(text).split(",") if v.strip()]
    if not values:
        raise ConfigError(f"{option}: no values; write e.g. {option} a,b")
    return values


def parse_grid(items) -> list[tuple[str, list]]:
    """('tp=1,2', 'hardware=h100-sxm,h200-sxm') -> [('tp', [1, 2]), ('hardware', [...])], validated.
    The keys are the SimConfig fields declared ``grid=True`` (`servesim.options`)."""
    from ..checks import check_known_name
    from ..options import flag, grid_keys, options
    keys = grid_keys()
    out: list[tuple[str, list]] = []
    seen = set()
    for item in items or ():
        if "=" not in item:
            raise ConfigError(f"--grid: {item!r} is not KEY=V1,V2; write e.g. --grid tp=1,2,4")
        key, _, vals = item.partition("=")
        key = key.strip().lstrip("-").replace("-", "_")
        if key not in keys:
            hint = " (use --rates for the rate)" if key == "rate" else ""
            raise ConfigError(f"--grid: unknown key {key!r}{hint}; use one of {', '.join(keys)}")
        if key in seen:
            raise ConfigError(f"--grid: key {key!r} given twice; list all its values once, e.g. {key}=a,b")
        seen.add(key)
        values = parse_values(key, vals, flag(key))
        if options()[key].names is not None:
            values = [check_known_name(key, v, f"--grid {key}") for v in values]
        out.append((key, values))
    return out


def closed_loop_requests(cfg):
    """A closed loop of C clients with no --num-requests (or --duration) runs max(DEFAULT_NUM_REQUESTS,
    2 C) requests: with fewer requests than clients every request is sent at once and the point is a
    burst, not the loop's steady state (a concurrency sweep runs C up to 4,096)."""
    from ..workload.spec import DEFAULT_NUM_REQUESTS
    c = cfg.concurrency
    if c is None or cfg.num_requests is not None or cfg.duration is not None or cfg.stages \
            or cfg.trace_mode != "lengths" or 2 * c <= DEFAULT_NUM_REQUESTS:
        return cfg
    return replace(cfg, num_requests=2 * int(c))


def expand(base, grid: list[tuple[str, list]], rates: list[float] | None) -> list:
    """Cartesian product, grid keys in the order given, rate innermost -> list of SimConfig."""
    keys = [k for k, _ in grid]
    n = math.prod(len(v) for _, v in grid) * (1 if rates is None else len(rates))
    check_points(n, "the grid" + ("" if rates is None else " x --rates"), "use fewer grid values or rates")
    points = []
    for combo in itertools.product(*(v for _, v in grid)):
        cfg = closed_loop_requests(replace(base, **dict(zip(keys, combo))))
        if rates is None:
            points.append(cfg)
        else:
            points.extend(replace(cfg, rate=r) for r in rates)
    return points
