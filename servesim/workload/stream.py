"""Requests drawn chunk by chunk, the same requests `spec.build_requests` draws in one piece.

Each quantity has its own random stream (`build_requests` spawns them from the seed), and NumPy's
generators fill an array element after element, so drawing the next chunk from the same streams
continues the same sequence: concatenated, the chunks equal the one-piece draw (arrivals are summed
from the previous chunk's last one, in the same order). Chunks hold an even number of requests:
bounded integers below 2**32 are drawn two per 64-bit word, and an odd chunk would drop a half.
The router's two draws per request (`engine.lower.router_draws`: all first draws, then all second
ones, from one stream) are reached by advancing the stream (PCG64 spends one 64-bit word per double).

What streams: the open-loop synthetic form (`stream_refusal` says what else does not and why).
"""
from __future__ import annotations

import math
from typing import Iterator

import numpy as np

from .spec import WorkloadSpec, _sample_pair, clip_to_context

STREAM_PROCESSES = ("poisson", "gamma", "deterministic")


def stream_refusal(cfg, workload: WorkloadSpec) -> str | None:
    """Why a resolved SimConfig cannot run streamed (`--stream`), or None when it can."""
    why = [(cfg.pool, "--pool (the per-pool summary reads every request)"),
           (cfg.offline or cfg.concurrency > 0, "--offline or --concurrency (every request queued at once, "
                                                 "or sent as clients free: not an arrival stream)"),
           (cfg.stages is not None, "--stages"),
           (cfg.arrival not in STREAM_PROCESSES, f"--arrival {cfg.arrival} (poisson, gamma, deterministic stream)"),
           (cfg.trace_mode != "lengths", f"--trace-mode {cfg.trace_mode}"),
           (workload.shared_prefix is not None or workload.sessions is not None,
            "shared system prompts or sessions (their prefix-cache chains link requests)"),
           (cfg.router == "prefix-aware" or cfg.cpu_kv_gib > 0, "the prefix cache's --router prefix-aware / --cpu-kv-gib"),
           (cfg.speculative is not None, "--speculative"),
           (cfg.rate is not None and math.isinf(cfg.rate), "--rate inf (every request at t = 0)")]
    given = [w for bad, w in why if bad]
    return "; ".join(given) if given else None


def _arrival_chunks(n: int, rate: float, process: str, cv: float, rng, chunk: int) -> Iterator[np.ndarray]:
    """`arrivals.arrival_times(n, rate, rng, process, cv)` in chunks (start 0)."""
    shape = 1.0 / (cv * cv) if process == "gamma" else 1.0
    last = 0.0
    for a in range(0, n, chunk):
        b = min(a + chunk, n)
        if process == "deterministic":
            yield np.arange(a, b, dtype=np.float64) / rate
            continue
        k = b - a - (1 if a == 0 else 0)
        gaps = rng.exponential(1.0 / rate, size=k) if process == "poisson" else \
            rng.gamma(shape, 1.0 / (rate * shape), size=k)
        t = np.empty(k + 1)
        t[0] = last
        np.cumsum(np.concatenate(([last], gaps)), out=t)
        out = t if a == 0 else t[1:]
        last = float(out[-1]) if out.size else last
        yield out


def request_chunks(spec: WorkloadSpec, n: int, seed: int, *, rate: float, process: str = "poisson",
                   cv: float = 1.0, isl=None, osl=None, max_len=None, chunk: int) -> Iterator[tuple]:
    """(arrival, prompt, output) of requests [a, a + chunk) for a = 0, chunk, ...: `build_requests`
    of the same arguments, cut in chunks (``chunk`` even)."""
    if chunk % 2:
        raise ValueError("chunk must be even")
    arr_ss, prompt_ss, output_ss, joint_ss, *_ = np.random.SeedSequence(int(seed)).spawn(7)
    arr_rng, prompt_rng, output_rng, joint_rng = (np.random.default_rng(s)
                                                  for s in (arr_ss, prompt_ss, output_ss, joint_ss))
    for a, arrival in zip(range(0, n, chunk), _arrival_chunks(n, rate, process, cv, arr_rng, chunk)):
        m = arrival.size
        prompt, output = _sample_pair(spec, m, prompt_rng, output_rng, joint_rng)
        if isl is not None:
            prompt = np.full(m, int(isl), dtype=np.int64)
        if osl is not None:
            output = np.full(m, int(osl), dtype=np.int64)
        if max_len is not None:
            prompt, output = clip_to_context(prompt, output, max_len)
        yield arrival, np.ascontiguousarray(prompt, np.int64), np.ascontiguousarray(output, np.int64)


def arrival_marks(n: int, seed: int, *, rate: float, process: str, cv: float, warmup: float,
                  chunk: int) -> tuple[int, float, float]:
    """(index of the first arrival at or after ``warmup``, the middle one of the arrivals from there
    on, the last arrival) of `request_chunks`' arrivals, from their stream alone: the summary's judged
    window (`metrics._queue_growth`) needs them before the run. Two passes over the arrival stream
    when ``warmup`` > 0 (the middle one's index depends on the first)."""
    def arrivals():
        rng = np.random.default_rng(np.random.SeedSequence(int(seed)).spawn(7)[0])
        return _arrival_chunks(n, rate, process, cv, rng, chunk)

    i0, seen, last = (0 if warmup <= 0 else None), 0, 0.0
    mid = n // 2 if i0 == 0 else None
    t_mid = None
    for t in arrivals():
        if i0 is None and t[-1] >= warmup:
            i0 = seen + int(np.searchsorted(t, warmup, side="left"))
        if mid is not None and t_mid is None and mid < seen + t.size:
            t_mid = float(t[mid - seen])
        seen += t.size
        last = float(t[-1])
    if i0 is None:
        return n, last, last
    if t_mid is None:
        mid, seen = i0 + (n - i0) // 2, 0
        for t in arrivals():
            if mid < seen + t.size:
                t_mid = float(t[mid - seen])
                break
            seen += t.size
    return i0, t_mid, last
