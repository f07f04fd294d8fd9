"""The Python API: `servesim.simulate(...) -> Result`, mirroring `servesim simulate`."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields, replace

import numpy as np
import pandas as pd

from .config import load_hardware, load_model
from .costmodel import Layout, build_replica
from .config.engine import load_engine, with_fit_for
from .engine.budget import check_run_memory
from .engine.run import EngineOptions, engine_config, run_engine
from .errors import ConfigError
from .metrics import requests_frame, summarize
from .options import SimConfig, default_rate, plain
from .options import options as declared
from .slo import Slo
from .workload import build_requests, load_workload, with_shared_prefix
from .workload.arrivals import daily_window

__all__ = ["Result", "SimConfig", "replica_of", "resolve", "simulate"]


@dataclass
class Result:
    config: dict
    summary: dict
    requests: pd.DataFrame
    iterations: pd.DataFrame = field(repr=False)
    gap_hist: np.ndarray = field(repr=False)

    def to_json(self) -> str:
        return json.dumps(self.summary, indent=2, sort_keys=False, default=_json_default)


def _json_default(x):
    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    raise TypeError(type(x))


def _clean(obj):
    """NaN/inf -> None so the JSON is valid and stable."""
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def resolve(cfg: SimConfig, hw=None) -> tuple[SimConfig, object, object, object]:
    """Check every option (`checks.check_sim_config`), fill preset defaults; load model, hardware (unless
    a profile object is given) and workload; check what needs them (`checks.check_resolved`)."""
    from .checks import check_resolved, check_sim_config
    cfg = check_sim_config(cfg)
    d = load_engine(cfg.engine).scheduler
    fills = {}
    for name, o in declared().items():   # None: the engine profile's value, or a declared constant
        if getattr(cfg, name) is None and (o.preset or o.fill is not None):
            fills[name] = getattr(d, o.preset) if o.preset else o.fill
    filled = replace(cfg, **fills)
    filled = replace(
        filled,
        chunk_size=cfg.chunk_size if cfg.chunk_size is not None else
        512 if filled.scheduler == "sarathi" else filled.max_num_batched_tokens,
        concurrency=cfg.concurrency if cfg.concurrency is not None else 0,   # 0 = open loop, as the engine reads it
    )
    if not 0.0 < filled.gpu_memory_utilization <= 1.0:
        raise ConfigError(f"--gpu-memory-utilization must be in (0, 1], got {filled.gpu_memory_utilization} "
                          f"(from engine {cfg.engine})")
    model = load_model(filled.model)
    if filled.dtype == "auto":
        filled = replace(filled, dtype=model.checkpoint_dtype)
    hw = hw if hw is not None else load_hardware(filled.hardware)
    workload = with_shared_prefix(load_workload(filled.workload), filled.num_system_prompts,
                                  filled.users_per_system_prompt, filled.system_prompt_len)
    sp = workload.shared_prefix
    if sp is not None:
        filled = replace(filled, num_system_prompts=sp.num_system_prompts,
                         users_per_system_prompt=sp.users_per_system_prompt, system_prompt_len=sp.system_prompt_len)
    check_resolved(cfg, filled, model)
    return filled, model, hw, workload


def _trace_info(cfg: SimConfig, workload, reqs) -> dict | None:
    """What a replayed or rescaled trace brings: file, requests, span and mean rate of the arrivals used."""
    if cfg.trace_mode == "lengths" or workload.trace is None:
        return None
    from pathlib import Path
    n = int(reqs.arrival.size)
    span = float(reqs.arrival[-1] - reqs.arrival[0]) if n else 0.0
    return {"file": Path(workload.trace.path).name, "mode": cfg.trace_mode, "num_requests": n,
            "trace_rows": len(workload.trace), "span_s": span,
            "mean_rate": (n - 1) / span if span > 0 else None}


def _check_blocks(cfg: SimConfig, ecfg, reqs) -> None:
    """A --num-gpu-blocks too small for the longest request is a user error, not a run of rejections;
    a replica too small for even the shortest request (every request rejected) is infeasible."""
    if len(reqs.prompt) == 0:
        return
    shortest = int(np.min(reqs.prompt + reqs.output))
    holds = ecfg.num_blocks - ecfg.watermark_blocks
    if -(-shortest // ecfg.block_size) > holds and cfg.num_gpu_blocks is None:
        from .errors import InfeasibleError
        raise InfeasibleError(
            f"every request would be rejected: the shortest needs {shortest} tokens = "
            f"{-(-shortest // ecfg.block_size)} KV blocks of {ecfg.block_size}, more than the {holds} blocks "
            f"({holds * ecfg.block_size} tokens) one replica of {cfg.model} at TP={cfg.tp} PP={cfg.pp} on "
            f"{cfg.hardware} holds; use shorter --isl/--osl, a larger --tp, a smaller --kv-dtype or a higher "
            "--gpu-memory-utilization")
    if cfg.num_gpu_blocks is None:
        return
    longest = int(np.max(reqs.prompt + reqs.output))
    need = -(-longest // ecfg.block_size)
    if ecfg.num_blocks - ecfg.watermark_blocks < need:
        raise ConfigError(
            f"--num-gpu-blocks {cfg.num_gpu_blocks} holds {cfg.num_gpu_blocks * ecfg.block_size} tokens, fewer than "
            f"the longest request ({longest} tokens = {need} blocks of {ecfg.block_size}); use --num-gpu-blocks "
            f"{need + ecfg.watermark_blocks} or more")


def replica_of(cfg: SimConfig, model, hw, engine=None):
    """The lowered replica of a resolved config: its engine profile (``engine``: an in-memory profile
    replacing ``cfg.engine``; ``iteration_overhead_us`` replaces the engine's host time per step),
    layout, memory and cost bundle."""
    engine = engine if engine is not None else load_engine(cfg.engine)
    if cfg.iteration_overhead_us is not None:
        if not cfg.iteration_overhead_us >= 0:
            raise ConfigError(f"--iteration-overhead-us must be >= 0, got {cfg.iteration_overhead_us}")
        engine = with_fit_for(engine, hw, host_step_s=cfg.iteration_overhead_us * 1e-6)
    layout = Layout(tp=cfg.tp, pp=cfg.pp, dtype=cfg.dtype, kv_dtype=cfg.kv_dtype, allreduce=cfg.allreduce)
    return build_replica(model, hw, layout, cfg.gpu_memory_utilization, max_tokens=cfg.max_num_batched_tokens,
                         max_seqs=cfg.max_num_seqs, engine=engine)


def simulate(config: SimConfig | None = None, *, hardware_profile=None, engine_profile=None, **options) -> Result:
    """Run one serving simulation, request by request, as ``servesim simulate``.

    Parameters
    ----------
    config : SimConfig, optional
        Every option of the run (default: ``SimConfig()``); ``**options`` replace its fields.
    hardware_profile, engine_profile : optional
        In-memory profiles replacing the named ones (used by calibration).
    **options
        The fields of `SimConfig`, as the CLI's options: ``model``, ``hardware``, ``tp``, ``pp``,
        ``replicas``, ``engine``, ``workload``, ``isl``, ``osl``, ``rate``, ``num_requests``,
        ``slo`` (a string such as ``"ttft_p99=500ms,tpot_p99=50ms"``), ``seed``, ``price``, ...
        An unknown keyword is a ConfigError naming the closest field.

    Returns
    -------
    Result
        ``summary`` (the dict ``servesim simulate --format json`` prints: latency percentiles with
        confidence intervals, throughput, cost, utilisation, the saturation verdict, SLO attainment),
        ``requests`` (one row per request), ``iterations`` (one row per engine step).

    Examples
    --------
    >>> import servesim
    >>> res = servesim.simulate(rate=4, num_requests=200, isl=256, osl=32, slo="ttft_p99=1s")
    >>> res.summary["saturation_verdict"], len(res.requests), res.summary["slo_attainment"]
    ('stable', 200, 1.0)
    """
    from .checks import sim_config
    cfg = sim_config(config, "simulate", **options)     # the edge: every option checked, the SLO parsed
    cfg, model, hw, workload = resolve(cfg, hardware_profile)
    rc = replica_of(cfg, model, hw, engine_profile)
    check_run_memory(cfg, workload)     # refuse, before any work, a run the machine cannot hold
    rate = None
    if cfg.stages is not None:  # time-averaged offered rate
        rate = sum(r * d for r, d in cfg.stages) / sum(d for _, d in cfg.stages)
    elif not cfg.offline and cfg.concurrency <= 0:
        rate = cfg.rate if cfg.rate is not None else default_rate(workload)
        if rate <= 0:
            raise ConfigError(f"--rate must be > 0, got {rate}")
    # daily arrivals with --duration and no --num-requests: the requests of that window of the day
    daily = cfg.arrival == "daily" and rate is not None and cfg.stages is None and cfg.trace_mode == "lengths"
    window = cfg.duration if daily and cfg.num_requests is None and math.isfinite(rate) else None
    reqs = build_requests(workload, cfg.num_requests, cfg.seed, rate=rate, process=cfg.arrival, cv=cfg.cv,
                          offline=cfg.offline or cfg.concurrency > 0, isl=cfg.isl, osl=cfg.osl,
                          trace_mode=cfg.trace_mode, max_len=model.max_context, stages=cfg.stages,
                          question_len=cfg.question_len, window=window)
    trace, arrival = _trace_info(cfg, workload, reqs), cfg.arrival
    if trace is not None and rate is not None:
        arrival = "trace"
        if cfg.trace_mode == "replay":
            rate = trace["mean_rate"]
    shared = {f.name: getattr(cfg, f.name) for f in fields(EngineOptions) if f.name in declared()}
    opts = EngineOptions(**shared | dict(
        watermark=rc.engine.scheduler.watermark, duration=math.inf if cfg.duration is None or window else cfg.duration,
        warmup_time=cfg.warmup, frontend=rc.engine.fit_for(rc.hw).frontend_s))
    ecfg = engine_config(opts, rc)
    _check_blocks(cfg, ecfg, reqs)
    out = run_engine(rc, ecfg, reqs.arrival, reqs.prompt, reqs.output, cfg.seed,
                     prefix_group=reqs.prefix_group, prefix_len=reqs.prefix_len)
    df = requests_frame(out, reqs.prompt, reqs.output, ecfg.frontend)
    price = cfg.price if cfg.price is not None else hw.usd_per_hour
    from .costmodel.dtypes import compute_dtype
    summary = summarize(df, out, warmup=cfg.warmup, slo=cfg.slo or Slo(), num_gpus_per_replica=rc.num_gpus,
                        replicas=cfg.replicas, usd_per_gpu_hour=price,
                        peak_flops=hw.peak_flops[compute_dtype(cfg.dtype, hw.peak_flops)], hbm_bw=hw.hbm_bw,
                        num_blocks=ecfg.num_blocks, offered_rate=rate, stages=cfg.stages,
                        concurrency=cfg.concurrency)
    config = plain(cfg)
    config.update({"engine_fit": rc.engine.fit_for(rc.hw).note or "given in memory",
                   "num_gpus": rc.num_gpus * cfg.replicas, "kv_blocks_per_replica": ecfg.num_blocks,
                   "kv_capacity_tokens_per_replica": ecfg.num_blocks * ecfg.block_size,
                   "weights_gib_per_gpu": rc.memory.weight_bytes / 2**30, "rate": rate,
                   "duration": cfg.duration, "num_requests": int(reqs.arrival.size), "arrival": arrival,
                   "trace": trace})
    if daily:   # the window of the day sent and the delivered rate (only for daily runs)
        config["daily"] = daily_window(reqs.arrival, rate, window_s=window)
    summary = _clean({"config": config, **summary})
    iters = pd.DataFrame({"time_s": out.log_time, "replica": out.log_replica, "batch_size": out.log_seqs,
                          "tokens": out.log_tokens, "kv_blocks": out.log_kv_blocks, "waiting": out.log_waiting})
    return Result(config, summary, df, iters, out.gap_hist)
