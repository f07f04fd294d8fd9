"""Request arrival processes -> sorted float64 arrays of arrival times in seconds.

Conventions shared by every process:
- the first request arrives at `start` (like a benchmark client, which sends its first request at
  once), and the returned times include the `start` offset;
- `rate` is the long-run mean rate in requests per second; `rate = inf` sends every request at
  `start` (the "all at once" load of trtllm-bench and vLLM's benchmark with `--request-rate inf`);
- all randomness comes from the `numpy.random.Generator` passed in.

`stage_arrivals` builds an open-loop load in stages (rate x duration each, as benchmark clients run
it) from the same processes; `parse_stages` reads the `--stages 5x600s,10x600s` text.
"""
from __future__ import annotations

import math
import re

import numpy as np

from servesim.errors import ConfigError

PROCESSES = ("poisson", "gamma", "deterministic", "bursty", "daily")
DURATION_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0, "m": 60.0, "h": 3600.0}

HOUR_S = 3600.0
DAY_S = 24 * HOUR_S

# Illustrative diurnal load shape, one multiplier per hour of the day (00:00-01:00 first), mean 1.
# Only the qualitative shape is taken from a source: production LLM inference load on Azure is low at
# night and high during working hours (the week-long Azure LLM inference trace 2024, characterised in
# Stojkovic et al., "DynamoLLM", HPCA 2025). The values themselves are hand-chosen and NOT fitted to
# that trace (peak/trough about 5). Pass your own 24 values as `daily_curve` to model a real service.
_RAW_DIURNAL = (
    0.45, 0.38, 0.34, 0.32, 0.33, 0.38,   # 00-06
    0.52, 0.75, 1.05, 1.35, 1.55, 1.62,   # 06-12
    1.55, 1.60, 1.65, 1.60, 1.50, 1.35,   # 12-18
    1.18, 1.02, 0.90, 0.78, 0.65, 0.54,   # 18-24
)
DIURNAL_CURVE = tuple(round(v * 24 / sum(_RAW_DIURNAL), 4) for v in _RAW_DIURNAL)


def offline_arrivals(n: int) -> np.ndarray:
    """Offline (batch) load: every request is queued at time 0."""
    return np.zeros(_count(n), dtype=np.float64)


def arrival_times(
    n: int,
    rate: float,
    rng: np.random.Generator,
    process: str = "poisson",
    cv: float = 1.0,
    burst_on_s: float = 10.0,
    burst_off_s: float = 10.0,
    daily_curve=None,
    start: float = 0.0,
) -> np.ndarray:
    """`n` arrival times (seconds, non-decreasing) with long-run mean rate `rate` requests/s.

    processes:
      poisson        exponential gaps, mean 1/rate
      gamma          gamma gaps, mean 1/rate, coefficient of variation `cv` (shape 1/cv^2;
                     cv = 1 is Poisson, cv < 1 smoother, cv > 1 burstier)
      deterministic  constant gap 1/rate, exactly start + i/rate
      bursty         on/off: Poisson at rate/duty during `burst_on_s`-second on-windows, nothing in
                     the `burst_off_s`-second off-windows (duty = on/(on+off)), so the long-run mean
                     is `rate`; starts at the beginning of an on-window
      daily          non-homogeneous Poisson with intensity rate * m[h], h the hour of day of the
                     absolute time t (t = 0 is midnight, so `start = 9 * 3600` begins at 09:00) and
                     m = daily_curve / mean(daily_curve) (default `DIURNAL_CURVE`), piecewise
                     constant per hour; sampled exactly by time rescaling: unit-rate Poisson points
                     are mapped through the inverse of the cumulative intensity (Cinlar 1975;
                     Lewis & Shedler 1979)
    """
    n = _count(n)
    rate = _rate(rate)
    start = float(start)
    if not math.isfinite(start):
        raise ConfigError(f"arrival start time {start!r} is not valid; use a finite number of seconds")
    if process not in PROCESSES:
        raise ConfigError(f"arrival process {process!r} unknown; use one of {', '.join(PROCESSES)}")
    if n == 0:
        return np.zeros(0, dtype=np.float64)
    if math.isinf(rate):
        return np.full(n, start, dtype=np.float64)

    if process == "deterministic":
        return start + np.arange(n, dtype=np.float64) / rate
    if process == "poisson":
        return start + _from_gaps(rng.exponential(1.0 / rate, size=n - 1))
    if process == "gamma":
        cv = _positive("--cv (gamma coefficient of variation)", cv)
        shape = 1.0 / (cv * cv)
        return start + _from_gaps(rng.gamma(shape, 1.0 / (rate * shape), size=n - 1))
    if process == "bursty":
        return start + _bursty(n, rate, rng, burst_on_s, burst_off_s)
    return _daily(n, rate, rng, daily_curve, start)


def _from_gaps(gaps: np.ndarray) -> np.ndarray:
    t = np.empty(gaps.size + 1, dtype=np.float64)
    t[0] = 0.0
    np.cumsum(gaps, out=t[1:])
    return t


def _bursty(n, rate, rng, on_s, off_s) -> np.ndarray:
    on = _positive("burst on-window (s)", on_s)
    off = float(off_s)
    if not math.isfinite(off) or off < 0:
        raise ConfigError(f"burst off-window {off_s!r} s is not valid; use a number >= 0 seconds")
    duty = on / (on + off)
    # Poisson in "on-time" tau at rate/duty, then tau -> wall time by inserting an off-window after
    # each completed on-window.
    tau = _from_gaps(rng.exponential(duty / rate, size=n - 1))
    window = np.floor(tau / on)
    return window * (on + off) + (tau - window * on)


def _daily(n, rate, rng, curve, start) -> np.ndarray:
    m = daily_multipliers(DIURNAL_CURVE if curve is None else curve)
    per_hour = rate * HOUR_S * m                       # expected arrivals in each hour of the day
    edges = np.concatenate(([0.0], np.cumsum(per_hour)))  # cumulative intensity at each hour edge
    per_day = edges[-1]

    def cumulative(t):  # Lambda(t) since midnight of day 0
        day, s = np.divmod(t, DAY_S)
        h = np.minimum((s // HOUR_S).astype(np.int64), 23)
        return day * per_day + edges[h] + rate * m[h] * (s - h * HOUR_S)

    # Unit-rate Poisson points in Lambda-space, the first at Lambda(start) (first request at `start`).
    y = cumulative(np.array([start]))[0] + _from_gaps(rng.exponential(1.0, size=n - 1))
    day, r = np.divmod(y, per_day)
    # side="right" lands on the last edge <= r, which skips hours whose multiplier is zero.
    h = np.minimum(np.searchsorted(edges, r, side="right") - 1, 23)
    slope = rate * m[h]
    frac = np.divide(r - edges[h], slope, out=np.zeros_like(r), where=slope > 0)
    t = day * DAY_S + h * HOUR_S + np.minimum(frac, HOUR_S)
    t[0] = start
    return np.maximum.accumulate(t)  # guards against rounding at hour edges


def daily_intensity_integral(t0: float, t1: float, rate: float, curve=None) -> float:
    """Expected arrivals of the daily process in [t0, t1] (seconds since midnight of day 0): the
    integral of rate * m[hour of day] over the window, m piecewise constant per hour."""
    m = daily_multipliers(DIURNAL_CURVE if curve is None else curve)
    per_day = rate * HOUR_S * float(m.sum())

    def cumulative(t):
        day, s = divmod(float(t), DAY_S)
        h = min(int(s // HOUR_S), 23)
        return day * per_day + rate * HOUR_S * float(m[:h].sum()) + rate * m[h] * (s - h * HOUR_S)

    return cumulative(t1) - cumulative(t0)


def clock_of_day(t: float, end: bool = False) -> str:
    """Seconds since midnight of day 0 -> 'HH:MM:SS', with '+Nd' from the next day on; the `end` of
    a window at midnight is '24:00:00' of the day before."""
    day, s = divmod(int(round(t)), int(DAY_S))
    if end and s == 0 and day > 0:
        day, s = day - 1, int(DAY_S)
    text = f"{s // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}"
    return text + (f"+{day}d" if day else "")


def daily_window(arrival: np.ndarray, rate: float, curve=None, window_s: float | None = None) -> dict:
    """What a daily run sent: the window of the day (from the first arrival to the last, or
    ``window_s`` seconds from midnight when the arrivals fill a window), the delivered mean rate
    (requests / window length; (n - 1) / span for a fixed number of requests) and the curve's mean
    rate over that window (its expectation), against ``rate``, the curve's mean over a whole day."""
    n = int(arrival.size)
    start = 0.0 if window_s is not None else float(arrival[0]) if n else 0.0
    end = float(window_s) if window_s is not None else float(arrival[-1]) if n else 0.0
    span = end - start
    if window_s is not None:
        delivered = n / span
    else:
        delivered = (n - 1) / span if span > 0 else None
    return {"day_mean_rate": float(rate), "delivered_rate": delivered,
            "window_rate": float(daily_intensity_integral(start, end, rate, curve) / span) if span > 0 else None,
            "start_s": start, "end_s": end, "window": f"{clock_of_day(start)}-{clock_of_day(end, end=True)}",
            "full_window": window_s is not None}


def daily_multipliers(curve) -> np.ndarray:
    """24 hourly values -> float64 multipliers with mean 1. Errors name what would work."""
    try:
        m = np.asarray(curve, dtype=np.float64)
    except (TypeError, ValueError):
        raise ConfigError(f"daily curve {curve!r} is not valid; give 24 hourly numbers >= 0") from None
    if m.shape != (24,):
        raise ConfigError(f"daily curve has {m.size} values; give exactly 24, one per hour of the day")
    if not np.all(np.isfinite(m)) or np.any(m < 0) or m.sum() <= 0:
        raise ConfigError("daily curve values must be finite and >= 0 with at least one > 0")
    return m / m.mean()


# --------------------------------------------------------------------------- load in stages

_NUMBER = r"[-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?"
_STAGE_RE = re.compile(rf"^({_NUMBER})\s*[xX]\s*({_NUMBER})\s*({'|'.join(DURATION_UNITS)})?$")
_STAGE_EXAMPLE = "e.g. --stages 5x600s,10x10min"
_STAGE_HINT = f"write RATExDURATION per stage (req/s x s, ms, min or h), {_STAGE_EXAMPLE}"


def parse_stages(stages, option: str = "--stages") -> tuple[tuple[float, float], ...] | None:
    """'5x600s,10x600s' (or ';' between stages) -> ((5.0, 600.0), (10.0, 600.0)): (req/s, seconds).

    Also takes a sequence of (rate, duration_s) pairs (the parsed form, so parsing twice is harmless);
    None stays None. Every rate and duration must be finite and > 0."""
    if stages is None:
        return None
    if isinstance(stages, str):
        text = stages.strip()
        if not text:
            raise ConfigError(f"{option}: empty stage list; {_STAGE_HINT}")
        pairs = []
        for part in re.split(r"[,;]", text):
            part = part.strip()
            m = _STAGE_RE.match(part)
            if not m:
                what = "an empty stage" if not part else f"stage {part!r} is not RATExDURATION"
                raise ConfigError(f"{option} {stages!r}: {what}; {_STAGE_HINT}")
            pairs.append((float(m.group(1)), float(m.group(2)) * DURATION_UNITS[m.group(3) or "s"]))
    else:
        try:
            pairs = [(float(r), float(d)) for r, d in stages]
        except (TypeError, ValueError):
            raise ConfigError(f"{option} {stages!r}: not a list of (rate, duration_s) pairs; {_STAGE_HINT}") from None
        if not pairs:
            raise ConfigError(f"{option}: empty stage list; {_STAGE_HINT}")
    for i, (r, d) in enumerate(pairs):
        if not (math.isfinite(r) and r > 0):
            raise ConfigError(f"{option} {stages!r}: stage {i} rate {r:g} req/s is not valid; "
                              f"use a finite rate > 0 req/s, {_STAGE_EXAMPLE}")
        if not (math.isfinite(d) and d > 0):
            raise ConfigError(f"{option} {stages!r}: stage {i} duration {d:g} s is not valid; "
                              f"use a finite duration > 0, {_STAGE_EXAMPLE}")
    return tuple(pairs)


def stage_bounds(stages) -> np.ndarray:
    """Start times of the stages and the end of the last: [T_0 = 0, T_1, ..., T_k] seconds."""
    return np.concatenate(([0.0], np.cumsum([d for _, d in stages], dtype=np.float64)))


def stage_arrivals(stages, seed, process: str = "poisson", cv: float = 1.0, daily_curve=None) -> np.ndarray:
    """Arrival times (seconds, non-decreasing) of an open-loop load in stages.

    Stage k sends at `rate_k` during [T_k, T_k + duration_k), T_k the sum of the earlier durations;
    the process restarts at each stage start and only arrivals inside the window are kept, so the
    number of requests is what the windows receive (Poisson: Poisson(rate_k x duration_k) per stage).
    The first arrival of a stage is one gap after its start (so a Poisson stage is exactly a Poisson
    process on its window), except `deterministic`: T_k + i / rate_k, i = 0, 1, ... (ceil(rate x
    duration) arrivals). `daily` uses the absolute time of day (t = 0 is midnight).

    `seed` is a `numpy.random.SeedSequence` (or an int); stage k draws from its k-th child, so a stage's
    arrivals depend only on the seed, its index and its own rate and window."""
    stages = parse_stages(stages)
    if process not in PROCESSES:
        raise ConfigError(f"arrival process {process!r} unknown; use one of {', '.join(PROCESSES)}")
    seq = seed if isinstance(seed, np.random.SeedSequence) else np.random.SeedSequence(int(seed))
    bounds = stage_bounds(stages)
    peak = 1.0
    if process == "daily":
        peak = float(daily_multipliers(DIURNAL_CURVE if daily_curve is None else daily_curve).max())
    out = []
    for k, ((rate, dur), start) in enumerate(zip(stages, bounds[:-1])):
        child = np.random.SeedSequence(seq.entropy, spawn_key=tuple(seq.spawn_key) + (k,))  # seq.spawn, unmutated
        end = start + dur
        if process == "deterministic":
            n = max(int(math.ceil(rate * dur - 1e-9)), 1)
            t = start + np.arange(n, dtype=np.float64) / rate
            out.append(t[t < end])
            continue
        expected = rate * dur * peak
        n = int(expected + 10.0 * math.sqrt(expected) + 16)
        while True:  # draw until the stream passes the window's end; same seed -> same draws
            t = arrival_times(n + 1, rate, np.random.default_rng(child), process=process, cv=cv,
                              daily_curve=daily_curve, start=start)[1:]
            if t[-1] >= end:
                break
            n *= 2
        out.append(t[t < end])
    return np.ascontiguousarray(np.concatenate(out), dtype=np.float64)


def _rate(rate) -> float:
    try:
        r = float(rate)
    except (TypeError, ValueError):
        r = float("nan")
    if isinstance(rate, bool) or not (r > 0):
        raise ConfigError(f"--rate {rate!r} is not valid; use a rate > 0 requests/s (or inf for all at once)")
    return r


def _positive(name: str, v) -> float:
    try:
        x = float(v)
    except (TypeError, ValueError):
        x = float("nan")
    if not (math.isfinite(x) and x > 0):
        raise ConfigError(f"{name} {v!r} is not valid; use a finite number > 0")
    return x


def _count(n) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise ConfigError(f"number of requests {n!r} is not valid; use an integer >= 0")
    return int(n)
