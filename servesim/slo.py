"""The latency SLO: one type, parsed once at the edge (a CLI option, an API keyword) and passed down.

`parse_slo("ttft_p99=500ms,tpot_p99=50ms")` -> `Slo((("ttft_p99", 0.5), ("tpot_p99", 0.05)))`:
each target is <metric>_<stat> = a duration > 0 (seconds inside). Everything after the edge takes a
`Slo` (or None: no targets); `metrics.evaluate_slo` judges a run against it.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from .errors import ConfigError

METRICS = ("ttft", "tpot", "itl", "e2e", "queue")
STATS = ("mean", "p50", "p90", "p95", "p99")
EXAMPLE = "ttft_p99=500ms,tpot_p99=50ms"


@dataclass(frozen=True)
class Slo:
    """Latency targets in seconds, in the order written; ``text`` is the string they came from."""
    targets: tuple[tuple[str, float], ...] = ()
    text: str = field(default="", compare=False)

    def items(self) -> tuple[tuple[str, float], ...]:
        return self.targets

    def __bool__(self) -> bool:
        return bool(self.targets)

    def __str__(self) -> str:
        return self.text or ",".join(f"{k}={v:g}s" for k, v in self.targets)


def parse_slo(value, option: str = "--slo") -> Slo | None:
    """None -> None; a `Slo` as it is; a string -> `Slo`, or a one-line `ConfigError` naming `option`."""
    if value is None or isinstance(value, Slo):
        return value
    if not isinstance(value, str):
        raise ConfigError(f"{option} must be a string such as {EXAMPLE!r}, got {value!r}")
    text = value.strip()
    if not text:
        raise ConfigError(f"{option} is empty; write e.g. {option} {EXAMPLE}, or omit it")
    from .metrics import parse_duration
    targets = {}
    for part in text.split(","):
        key, eq, dur = (s.strip() for s in part.partition("="))
        if not eq:
            raise ConfigError(f"{option}: {part.strip()!r} is not KEY=DURATION; write e.g. {EXAMPLE}")
        metric, _, stat = key.partition("_")
        if metric not in METRICS or stat not in STATS:
            raise ConfigError(f"{option}: unknown target {key!r}; use <metric>_<stat> with metric in "
                              f"{', '.join(METRICS)} and stat in {', '.join(STATS)}")
        if key in targets:
            raise ConfigError(f"{option}: target {key} given twice in {text!r}; give each target once")
        seconds = parse_duration(dur, option)
        if re.fullmatch(r"\s*[0-9.eE+-]+\s*", dur):      # a bare number: ms or s? never guessed
            raise ConfigError(f"{option}: target {key}={dur} has no unit; write {key}={dur}ms or {key}={dur}s "
                              f"(us, ms, s, min, h), e.g. {EXAMPLE}")
        if not (math.isfinite(seconds) and seconds > 0):
            raise ConfigError(f"{option}: target {key} must be a duration > 0, got {seconds:g} s; "
                              "write e.g. ttft_p99=500ms")
        targets[key] = seconds
    return Slo(tuple(targets.items()), text)
