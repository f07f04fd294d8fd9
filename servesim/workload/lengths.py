"""Request length distributions (prompt or output tokens) -> int64 arrays.

A `LengthSpec` names one distribution and its parameters; `sample_lengths` draws from it with a
caller-supplied `numpy.random.Generator`. Every draw is rounded to an integer and clipped to
`[min_len, max_len]`, and `min_len >= 1`, so no request ever has zero tokens.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from servesim.errors import ConfigError

KINDS = ("fixed", "uniform", "normal", "lognormal", "empirical")


@dataclass(frozen=True)
class LengthSpec:
    """One length distribution, in tokens.

    kinds and the fields they use:
      fixed      value
      uniform    low..high, both inclusive
      normal     mean, std (clipped to [min_len, max_len])
      lognormal  median, sigma: exp(N(ln median, sigma^2)) (clipped)
      empirical  samples, resampled with replacement (clipped)
    """

    kind: str
    value: int = 0
    low: int = 0
    high: int = 0
    mean: float = 0.0
    std: float = 0.0
    sigma: float = 0.0
    median: float = 0.0
    samples: tuple | None = None
    min_len: int = 1
    max_len: int = 1_000_000

    def __post_init__(self) -> None:
        _validate(self)


def _number(spec: LengthSpec, field: str, *, integer: bool) -> float:
    v = getattr(spec, field)
    ok = isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)
    if not ok or not math.isfinite(float(v)) or (integer and float(v) != int(v)):
        want = "an integer" if integer else "a finite number"
        raise ConfigError(f"{spec.kind} length: {field} = {v!r} is not valid; use {want}")
    return float(v)


def _validate(spec: LengthSpec) -> None:
    if spec.kind not in KINDS:
        raise ConfigError(f"length kind {spec.kind!r} unknown; use one of {', '.join(KINDS)}")
    lo = _number(spec, "min_len", integer=True)
    hi = _number(spec, "max_len", integer=True)
    if lo < 1 or hi < lo:
        raise ConfigError(f"{spec.kind} length: min_len = {spec.min_len}, max_len = {spec.max_len}; "
                          "need 1 <= min_len <= max_len")
    k = spec.kind
    if k == "fixed":
        if _number(spec, "value", integer=True) < 1:
            raise ConfigError(f"fixed length: value = {spec.value}; use a value >= 1 token")
    elif k == "uniform":
        a = _number(spec, "low", integer=True)
        b = _number(spec, "high", integer=True)
        if a < 1 or b < a:
            raise ConfigError(f"uniform length: low = {spec.low}, high = {spec.high}; need 1 <= low <= high")
    elif k == "normal":
        if _number(spec, "mean", integer=False) <= 0:
            raise ConfigError(f"normal length: mean = {spec.mean}; use a mean > 0 tokens")
        if _number(spec, "std", integer=False) < 0:
            raise ConfigError(f"normal length: std = {spec.std}; use std >= 0")
    elif k == "lognormal":
        if _number(spec, "median", integer=False) <= 0:
            raise ConfigError(f"lognormal length: median = {spec.median}; use a median > 0 tokens")
        if _number(spec, "sigma", integer=False) < 0:
            raise ConfigError(f"lognormal length: sigma = {spec.sigma}; use sigma >= 0")
    else:  # empirical
        if spec.samples is None or len(spec.samples) == 0:
            raise ConfigError("empirical length: no samples; give a trace or a non-empty list of lengths")
        arr = np.asarray(spec.samples)
        if arr.ndim != 1 or not (np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)):
            raise ConfigError("empirical length: samples must be a flat list of token counts")
        bad = np.flatnonzero(~np.isfinite(arr.astype(np.float64)) | (arr < 1) | (arr != np.round(arr)))
        if bad.size:
            i = int(bad[0])
            raise ConfigError(f"empirical length: sample {i} = {spec.samples[i]!r}; "
                              "samples must be integers >= 1")


def sample_lengths(spec: LengthSpec, n: int, rng: np.random.Generator) -> np.ndarray:
    """Draw `n` lengths from `spec` -> int64 array, every value in [min_len, max_len] (and >= 1)."""
    n = _count(n)
    k = spec.kind
    if k == "fixed":
        x = np.full(n, float(spec.value))
    elif k == "uniform":
        x = rng.integers(int(spec.low), int(spec.high) + 1, size=n).astype(np.float64)
    elif k == "normal":
        x = rng.normal(float(spec.mean), float(spec.std), size=n)
    elif k == "lognormal":
        # median m and shape sigma: X = m * exp(sigma * Z), Z ~ N(0, 1); mean is m * exp(sigma^2 / 2).
        x = float(spec.median) * np.exp(float(spec.sigma) * rng.standard_normal(n))
    else:
        pool = np.asarray(spec.samples, dtype=np.float64)
        x = pool[rng.integers(0, pool.size, size=n)]
    return clip_lengths(x, spec)


def clip_lengths(x: np.ndarray, spec: LengthSpec) -> np.ndarray:
    """Round to the nearest integer and clip to [min_len, max_len] -> int64 (clip before the cast, so
    a huge lognormal draw cannot overflow)."""
    x = np.clip(np.rint(np.asarray(x, dtype=np.float64)), float(spec.min_len), float(spec.max_len))
    return x.astype(np.int64)


def _count(n) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise ConfigError(f"number of requests {n!r} is not valid; use an integer >= 0")
    return int(n)
