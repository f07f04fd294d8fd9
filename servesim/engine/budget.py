"""The memory a run will need, estimated before it starts, and the refusal of runs the machine cannot hold.

A run holds a fixed amount per request (the request arrays, the kernel's per-request state and
records, the per-request DataFrame and the copies the metrics make of it) and per replica (its
running set and micro-batch slots, `max_num_seqs` wide, and its prefix-cache flags, one per shared
system prompt). Both were measured as the growth of the peak resident set (`ru_maxrss`) over a
warm process:

- per request: 450 B, plus ~45 MB once (the workload's trace, the libraries the metrics load): 180
  MB of growth at 3e5 requests (llama-3.1-8b, chat workload, 16 replicas; measured 2026-12-06 by
  tests/test_reliability_memory.py, with the ~45 MB of a line through 1e5, 3e5 and 1e6 requests
  measured 2026-12-03, which then gave 290 B per request: the summary's metrics have grown since;
  the engine's record arrays and feature-shaped state changed it by under 10 B per request, measured
  against the engine before them); `BYTES_PER_REQUEST` and `RUN_BASE_BYTES` round them up;
- per replica: 6.25 KB at `max_num_seqs` 256, PP = 1 (2e4 and 1e5 replicas, 1000 requests), which
  is 8 B x `max_num_seqs` x (1 + 2 PP) (running set, micro-batch requests and chunks) + ~110 B of
  scalars per replica, as the kernel allocates them.

The check compares the estimate with the memory the machine has available (`MemAvailable` in
/proc/meminfo, Linux) and raises a `ConfigError` naming the figure and the way out; where that
figure cannot be read (other systems) only the hard caps apply.
"""
from __future__ import annotations

from ..errors import ConfigError

BYTES_PER_REQUEST = 480
RUN_BASE_BYTES = 64 * 2**20
BYTES_PER_REPLICA_SCALARS = 128
MAX_SWEEP_POINTS = 100_000       # simulations in one sweep or plan; each is a full simulation
MEMINFO = "/proc/meminfo"


STREAM_ABOVE_BYTES = 2 * 10**9   # a run estimated above this (or half the available memory) streams


def stream_budget(available: int | None = None) -> int:
    """The estimate above which a run that can stream does (`--stream` unset): 2 GB, or half the
    memory available when that is less."""
    have = available_bytes() if available is None else available
    return STREAM_ABOVE_BYTES if have is None else min(STREAM_ABOVE_BYTES, have // 2)


def available_bytes(meminfo: str = MEMINFO) -> int | None:
    """MemAvailable in bytes (Linux), or None where it cannot be read."""
    try:
        with open(meminfo) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    parts = line.split()
                    return int(parts[1]) * (1024 if parts[2].lower() == "kb" else 1)
    except (OSError, ValueError, IndexError):
        return None
    return None


def replica_bytes(max_num_seqs: int, pp: int = 1, prefix_groups: int = 0) -> int:
    """Kernel state of one replica: running set and micro-batch slots, prefix-cache flags."""
    return 8 * int(max_num_seqs) * (1 + 2 * int(pp)) + 24 * int(pp) + int(prefix_groups) + BYTES_PER_REPLICA_SCALARS


def run_bytes(num_requests: int, replicas: int, max_num_seqs: int, pp: int = 1, prefix_groups: int = 0) -> int:
    """Estimated peak memory of one run above the interpreter's own, in bytes."""
    return (RUN_BASE_BYTES + int(num_requests) * BYTES_PER_REQUEST
            + int(replicas) * replica_bytes(max_num_seqs, pp, prefix_groups))


def _gb(b: float) -> str:
    return f"{b / 1e9:.3g} GB" if b >= 1e8 else f"{b / 1e6:.3g} MB"


def expected_requests(cfg, workload) -> int:
    """The number of requests a resolved SimConfig will draw, before drawing them."""
    from ..workload.spec import DEFAULT_NUM_REQUESTS
    if cfg.num_requests is not None:
        return int(cfg.num_requests)
    if cfg.stages:
        return int(sum(r * d for r, d in cfg.stages))       # a Poisson stage's mean count
    if cfg.trace_mode != "lengths" and workload.trace is not None:
        return len(workload.trace)
    return DEFAULT_NUM_REQUESTS


def check_run_memory(cfg, workload, available: int | None = None) -> int:
    """Refuse a run whose estimated memory exceeds what the machine has available; returns the estimate.

    `cfg` is a resolved SimConfig (presets filled in), `workload` its WorkloadSpec. `available`
    overrides the machine's figure (tests)."""
    n = expected_requests(cfg, workload)
    groups = int(cfg.num_system_prompts or 0)
    need = run_bytes(n, cfg.replicas, cfg.max_num_seqs, cfg.pp, groups)
    have = available_bytes() if available is None else available
    if have is None or need <= have:
        return need
    per_replica = replica_bytes(cfg.max_num_seqs, cfg.pp, groups)
    req_part, rep_part = n * BYTES_PER_REQUEST, cfg.replicas * per_replica
    room = have - RUN_BASE_BYTES
    ways = []
    if rep_part < room:
        ways.append(f"--num-requests {(room - rep_part) // BYTES_PER_REQUEST:,} or fewer")
    if req_part < room:
        ways.append(f"--replicas {(room - req_part) // per_replica:,} or fewer")
    if not ways:
        ways.append(f"--num-requests {max(room, 0) // 2 // BYTES_PER_REQUEST:,} or fewer and --replicas "
                    f"{max(room, 0) // 2 // per_replica:,} or fewer")
    raise ConfigError(
        f"this run needs about {_gb(need)} of memory ({n:,} requests x {BYTES_PER_REQUEST} B + "
        f"{cfg.replicas:,} replicas x {per_replica:,} B + {RUN_BASE_BYTES >> 20} MB), more than the "
        f"{_gb(have)} available "
        f"(MemAvailable); use {' or '.join(ways)}")


def check_points(n_points: int, what: str, way_out: str) -> None:
    """Refuse a sweep or plan of more than MAX_SWEEP_POINTS simulations before building them."""
    if n_points > MAX_SWEEP_POINTS:
        raise ConfigError(f"{what} makes {n_points:,} points, more than the {MAX_SWEEP_POINTS:,} one run may "
                          f"simulate; {way_out}")
