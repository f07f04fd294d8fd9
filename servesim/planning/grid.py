"""Parsing `--rates 1,2,4` / `--rates 1:64:16` and `--grid key=v1,v2`, and expanding them into points."""
from __future__ import annotations

import itertools
import math
from dataclasses import fields, replace

from ..engine.budget import MAX_SWEEP_POINTS, check_points
from ..errors import ConfigError

# grid keys that name a list of choices, checked before anything runs
_CHOICES = {
    "router": ("round-robin", "random", "least-requests", "least-kv", "power-of-two"),
    "engine": ("vllm", "trtllm", "sglang"),
    "scheduler": ("vllm", "vllm-v0", "sarathi", "orca", "static"),
    "preemption": ("recompute", "swap"),
    "arrival": ("poisson", "gamma", "deterministic", "bursty", "daily"),
    "dtype": ("bf16", "fp16", "fp8", "int8", "int4", "fp4"),
    "kv_dtype": ("auto", "bf16", "fp16", "fp8", "int8"),
}
_NOT_GRIDDABLE = {"rate", "slo", "offline"}


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


def _field_types() -> dict[str, str]:
    from ..api import SimConfig
    return {f.name: str(f.type) for f in fields(SimConfig)}


def _coerce(key: str, text: str, ftype: str):
    if "int" in ftype and "float" not in ftype:
        try:
            return int(text)
        except ValueError:
            raise ConfigError(f"--grid {key}: {text!r} is not an integer") from None
    if "float" in ftype:
        try:
            return float(text)
        except ValueError:
            raise ConfigError(f"--grid {key}: {text!r} is not a number") from None
    if "bool" in ftype:
        if text.lower() in ("1", "true", "yes"):
            return True
        if text.lower() in ("0", "false", "no"):
            return False
        raise ConfigError(f"--grid {key}: {text!r} is not true/false")
    return text


def parse_grid(items) -> list[tuple[str, list]]:
    """('tp=1,2', 'hardware=h100-sxm,h200-sxm') -> [('tp', [1, 2]), ('hardware', [...])], validated."""
    from ..config import list_hardware
    types = _field_types()
    out: list[tuple[str, list]] = []
    seen = set()
    for item in items or ():
        if "=" not in item:
            raise ConfigError(f"--grid: {item!r} is not KEY=V1,V2; write e.g. --grid tp=1,2,4")
        key, _, vals = item.partition("=")
        key = key.strip().lstrip("-").replace("-", "_")
        if key not in types or key in _NOT_GRIDDABLE:
            hint = " (use --rates for the rate)" if key == "rate" else ""
            ok = ", ".join(k for k in types if k not in _NOT_GRIDDABLE)
            raise ConfigError(f"--grid: unknown key {key!r}{hint}; use one of {ok}")
        if key in seen:
            raise ConfigError(f"--grid: key {key!r} given twice; list all its values once, e.g. {key}=a,b")
        seen.add(key)
        values = [_coerce(key, v.strip(), types[key]) for v in vals.split(",") if v.strip()]
        if not values:
            raise ConfigError(f"--grid {key}: no values; write e.g. --grid {key}=a,b")
        if key == "hardware":
            known = list_hardware()
            for v in values:
                if v not in known and not v.endswith(".toml"):
                    raise ConfigError(f"--grid hardware: unknown hardware {v!r}; use one of {', '.join(known)}")
        if key in _CHOICES:
            for v in values:
                if v not in _CHOICES[key]:
                    raise ConfigError(f"--grid {key}: unknown value {v!r}; use one of {', '.join(_CHOICES[key])}")
        if key in ("tp", "pp", "replicas", "num_requests") and any(v < 1 for v in values):
            raise ConfigError(f"--grid {key}: values must be >= 1, got {min(values)}")
        out.append((key, values))
    return out


def expand(base, grid: list[tuple[str, list]], rates: list[float] | None) -> list:
    """Cartesian product, grid keys in the order given, rate innermost -> list of SimConfig."""
    keys = [k for k, _ in grid]
    n = math.prod(len(v) for _, v in grid) * (1 if rates is None else len(rates))
    check_points(n, "the grid" + ("" if rates is None else " x --rates"), "use fewer grid values or rates")
    points = []
    for combo in itertools.product(*(v for _, v in grid)):
        cfg = replace(base, **dict(zip(keys, combo)))
        if rates is None:
            points.append(cfg)
        else:
            points.extend(replace(cfg, rate=r) for r in rates)
    return points
