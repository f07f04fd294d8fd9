"""The Python API: `servesim.simulate(...) -> Result`, mirroring `servesim simulate`."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace

import numpy as np

from .config import load_hardware, load_model
from .config.engine import load_engine, replica_provenance
from .engine.budget import check_run_memory
from .engine.kernel import prestart_ahead
from .engine.lower import engine_options, lower_deployment, lower_requests, replica_of
from .engine.run import run, threads_of
from .errors import ConfigError
from .long_runs import LONG_ABOVE
from .metrics import requests_columns, summarize
from .options import SimConfig, default_rate, plain
from .options import options as declared
from .slo import Slo
from .workload import build_requests, load_workload, with_shared_prefix
from .workload.spec import with_sessions
from .workload.arrivals import daily_window

__all__ = ["Result", "SimConfig", "replica_of", "resolve", "simulate", "warmup"]


ITERATION_COLUMNS = ("time_s", "replica", "batch_size", "tokens", "kv_blocks", "waiting")


@dataclass
class Result:
    """One simulation: its ``config`` and ``summary`` dicts; ``requests`` (one row per request; None for a
    streamed run) and ``iterations`` (one row per engine step) are pandas DataFrames, built from the
    run's arrays the first time they are read (a run that is only summarised never imports pandas)."""
    config: dict
    summary: dict
    columns: dict | None = field(repr=False)     # metrics.requests_columns (+ the pools' columns)
    log: tuple = field(repr=False)               # the iteration log's arrays, ITERATION_COLUMNS
    gap_hist: np.ndarray = field(repr=False)

    @property
    def requests(self):
        if self.columns is None:
            return None
        if "_requests" not in self.__dict__:
            from .metrics import frame_of
            self.__dict__["_requests"] = frame_of(self.columns)
        return self.__dict__["_requests"]

    @property
    def iterations(self):
        if "_iterations" not in self.__dict__:
            import pandas as pd
            self.__dict__["_iterations"] = pd.DataFrame(dict(zip(ITERATION_COLUMNS, self.log)))
        return self.__dict__["_iterations"]

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
                                  filled.users_per_system_prompt, filled.system_prompt_len, filled.question_per)
    workload = with_sessions(workload, filled.turns_per_session, filled.think_time)
    sp = workload.shared_prefix
    if sp is not None:
        filled = replace(filled, num_system_prompts=sp.num_system_prompts,
                         users_per_system_prompt=sp.users_per_system_prompt, system_prompt_len=sp.system_prompt_len,
                         question_per=sp.question_per)
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


# options of pools, prefix caching and PD: in the config of a single-pool run only when given (so
# single-pool runs keep their JSON)
_POOL_OPTIONS = ("pool", "prefix_caching", "cpu_kv_gib", "kv_link", "layerwise_transfer", "turns_per_session",
                 "think_time")


# expert parallelism, DP attention, speculation: in the config only when not their default
_PARALLEL_OPTIONS = ("ep", "attn_dp", "expert_skew", "speculative")


def _plain_config(cfg: SimConfig, given: SimConfig, pools: bool) -> dict:
    """The config block: every option as resolved (``given``: as the caller gave them)."""
    from .pools import specs_of
    config = plain(cfg)
    for name in _PARALLEL_OPTIONS:
        if getattr(given, name) == getattr(SimConfig(), name):
            del config[name]
    if given.stream is None:                    # automatic and not streamed: the JSON stays as it was
        del config["stream"]
    if config.get("question_per") is None:      # no shared prefix: the JSON of such runs stays as it was
        del config["question_per"]
    if not pools:
        for name in _POOL_OPTIONS:
            if getattr(given, name) in (None, ()):
                del config[name]
    else:   # the single-pool fields describe the deployment: its replicas, hardware, and TP/PP where one
        specs = specs_of(cfg)
        config["pool"] = "+".join(s.text for s in specs)      # the form --grid pool= takes (one cell of a table)
        config["replicas"] = sum(s.replicas for s in specs)
        config["hardware"] = "+".join(dict.fromkeys(s.hardware for s in specs))
        config["tp"] = specs[0].tp if len({s.tp for s in specs}) == 1 else None
        config["pp"] = specs[0].pp if len({s.pp for s in specs}) == 1 else None
    return config


def _pool_report(cfg: SimConfig, reqs) -> bool:
    """The summary reports pools (its `pools`, `prefix_cache`, `kv_transfer_ms` blocks, the deployment's
    totals) when pools are given or a feature of theirs is used (a CPU tier, the prefix-aware router,
    sessions, prompts re-sent per user); else it keeps the single-pool form (one replica's GPUs, price and KV blocks)."""
    sessions = getattr(reqs, "next_turn", None)
    users = getattr(reqs, "prefix_user", None)      # prompts re-sent per user: the workload's chains
    return bool(cfg.pool) or cfg.cpu_kv_gib > 0 or cfg.router == "prefix-aware" or \
        (sessions is not None and bool(np.any(np.asarray(sessions) >= 0))) or \
        (users is not None and cfg.prefix_caching is not False and bool(np.any(np.asarray(users) >= 0)))


def _check_capacity(cfg: SimConfig, dep, reqs) -> None:
    """Every pool can hold the requests (`pools.check_pool_capacity`; the single-pool shorthand in
    its own words, `_check_blocks`); sessions are not a closed loop."""
    from .pools import check_pool_capacity
    if getattr(reqs, "next_turn", None) is not None and cfg.concurrency > 0 and np.any(np.asarray(reqs.next_turn) >= 0):
        raise ConfigError(f"--concurrency {cfg.concurrency} and a sessions workload contradict: turns are sent a think "
                          "time after the previous one ends, not by a closed loop; drop --concurrency")
    if not cfg.pool:
        _check_blocks(cfg, dep.cfg, reqs)
        return
    check_pool_capacity(dep.pools, reqs.prompt, reqs.output, cfg.block_size,
                        given_blocks=cfg.num_gpu_blocks is not None)


def _single_summary(cfg: SimConfig, dep, hw):
    """The single-pool form: one replica's GPUs, price and KV blocks."""
    from .costmodel.dtypes import compute_dtype
    rc, ecfg = dep.pools[0].cost, dep.cfg
    price = cfg.price if cfg.price is not None else hw.usd_per_hour
    summary_args = dict(num_gpus_per_replica=rc.num_gpus, replicas=cfg.replicas, usd_per_gpu_hour=price,
                        peak_flops=hw.peak_flops[compute_dtype(cfg.dtype, hw.peak_flops)], hbm_bw=hw.hbm_bw,
                        num_blocks=ecfg.num_blocks)
    config_extra = {"engine_fit": rc.engine.fit_for(rc.hw).note or "given in memory",
                    "fit": replica_provenance(rc),
                    "num_gpus": rc.num_gpus * cfg.replicas, "kv_blocks_per_replica": ecfg.num_blocks,
                    "kv_capacity_tokens_per_replica": ecfg.num_blocks * ecfg.block_size,
                    "weights_gib_per_gpu": rc.memory.weight_bytes / 2**30}
    return summary_args, config_extra


def _pools_summary(cfg: SimConfig, dep, out, df: dict, reqs):
    """The pools form: the deployment's totals, one entry per pool; per request its session and
    turn, prefill replica and KV transfer (added to the request columns ``df``)."""
    lowered, pools, ecfg = dep.pools, dep.table, dep.cfg
    if getattr(reqs, "session", None) is not None and np.any(np.asarray(reqs.session) >= 0):
        df["session"], df["turn"] = np.asarray(reqs.session, np.int64), np.asarray(reqs.turn, np.int64)
    df["pf_replica"] = np.asarray(out.pf_replica, np.int64)
    df["xfer_start_s"] = np.asarray(out.xfer_start, np.float64) - ecfg.frontend   # on the clients' clock
    df["xfer_end_s"] = np.asarray(out.xfer_end, np.float64) - ecfg.frontend
    n_gpus = sum(lp.spec.gpus for lp in lowered)
    usd = sum(lp.spec.gpus * lp.usd_per_gpu_hour for lp in lowered)
    replicas = sum(lp.spec.replicas for lp in lowered)
    summary_args = dict(num_gpus_per_replica=1, replicas=replicas, num_gpus=n_gpus, usd_per_hour=usd,
                        usd_per_gpu_hour=usd / n_gpus,
                        peak_flops=sum(lp.spec.gpus * lp.peak_flops for lp in lowered) / n_gpus,
                        hbm_bw=sum(lp.spec.gpus * lp.cost.hw.hbm_bw for lp in lowered) / n_gpus,
                        num_blocks=sum(lp.spec.replicas * lp.num_blocks for lp in lowered) / replicas)
    meta = [{"name": lp.spec.text, "role": lp.spec.role, "hardware": lp.spec.hardware, "tp": lp.spec.tp,
             "pp": lp.spec.pp, "replicas": lp.spec.replicas, "first": int(pools.first[k]), "num_gpus": lp.spec.gpus,
             "usd_per_hour": lp.spec.gpus * lp.usd_per_gpu_hour, "kv_blocks_per_replica": lp.num_blocks,
             "cpu_blocks_per_replica": lp.cpu_blocks, "engine": lp.cost.engine.name, "dtype": lp.cost.layout.dtype,
             "engine_fit": lp.cost.engine.fit_for(lp.cost.hw).note or "given in memory",
             "fit": replica_provenance(lp.cost),
             "weights_gib_per_gpu": lp.cost.memory.weight_bytes / 2**30}
            for k, lp in enumerate(lowered)]
    config_extra = {"num_gpus": n_gpus, "pools": meta}
    if not cfg.pool:     # the single-pool options in the pools form (sessions, re-sent prompts): their fields too
        config_extra |= {"engine_fit": meta[0]["engine_fit"], "kv_blocks_per_replica": lowered[0].num_blocks}
    return summary_args, config_extra


def _pools_part(cfg: SimConfig, out, df, meta: list[dict], summary: dict) -> dict:
    """The summary's `pools`, `prefix_cache` (prefix caching on) and `kv_transfer_ms` (PD) blocks; the
    deployment's kv_cache_max as the fullest pool's."""
    from .metrics import kv_transfer_summary, pools_summary, prefix_cache_summary
    until = summary["drain"]["start_s"] if summary.get("drain") else float("inf")   # the summary's window
    pools = pools_summary(df, out, meta, warmup=cfg.warmup, until=until)
    for item, m in zip(pools, meta):
        item |= {k: m[k] for k in ("engine", "dtype", "cpu_blocks_per_replica", "engine_fit", "fit", "weights_gib_per_gpu")}
    summary["utilization"]["kv_cache_max"] = max(p["kv_max"] for p in pools)
    part = {"pools": pools}
    if cfg.prefix_caching:
        part["prefix_cache"] = prefix_cache_summary(out.prefix)
    if any(m["role"] != "mixed" for m in meta):
        part["kv_transfer_ms"] = kv_transfer_summary(df, warmup=cfg.warmup, until=until)
    return part


def _model_error(cfg, model, hw, rc, engine_profile, summary) -> dict | None:
    """The model-error block (``servesim/model_error.py``): the residual class of this run's model
    family and GPU (with kernel tables of its own or not); its load class is placed when a capacity is
    simulated (``model_error.with_capacity``)."""
    from . import model_error as me
    from .pools import specs_of
    if rc is not None:
        tables = hw.name in rc.engine.fits
    else:
        from .config.engine import load_engine
        tables = all(s.hardware in (engine_profile or load_engine(s.engine or cfg.engine)).fits for s in specs_of(cfg))
    # throughput is the engine's own figure only when the load does not set it (offline, closed loop, saturated)
    engine_bound = bool(cfg.offline or cfg.concurrency > 0 or summary.get("saturation_verdict") == "saturated")
    return me.model_error(summary, family=me.family_of(model), tables=tables, engine_bound=engine_bound)


def simulate(config: SimConfig | None = None, *, hardware_profile=None, engine_profile=None, records=None,
             **options) -> Result:
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
        ``slo`` (a string such as ``"ttft_p99=500ms,tpot_p99=50ms"``), ``seed``, ``price``, ``pool``
        (a tuple of pool specs, ``("h100-sxm:tp1:x2:prefill", "h100-sxm:tp1:x2:decode")``),
        ``prefix_caching``, ``cpu_kv_gib``, ``kv_link``, ``layerwise_transfer``, ...
        An unknown keyword is a ConfigError naming the closest field.
    records : path, optional
        A streamed run (``stream``) writes its per-request records to this CSV file as they end;
        without it they are dropped (its ``requests`` is None).

    Returns
    -------
    Result
        ``summary`` (the dict ``servesim simulate --format json`` prints: latency percentiles with
        confidence intervals, throughput, cost, utilisation, the saturation verdict, SLO attainment;
        with pools ``pools``, ``prefix_cache`` and ``kv_transfer_ms``),
        ``requests`` (one row per request), ``iterations`` (one row per engine step).

    Examples
    --------
    >>> import servesim
    >>> res = servesim.simulate(rate=4, num_requests=200, isl=256, osl=32, slo="ttft_p99=1s")
    >>> res.summary["saturation_verdict"], len(res.requests), res.summary["slo_attainment"]
    ('stable', 200, 1.0)
    """
    from ._jitcache import compile_notice
    from .checks import sim_config
    compile_notice()        # a cold numba cache: one line on stderr before compiling
    given = cfg = sim_config(config, "simulate", **options)     # the edge: every option checked, the SLO parsed
    cfg, model, hw, workload = resolve(cfg, hardware_profile)
    from .pools import check_block_size, specs_of
    specs = specs_of(cfg)
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
    prestart_ahead()        # a first cold compile: its second process imports while the run is lowered
    # the one lowering (engine/lower.py): every pool priced, then the requests
    dep = lower_deployment(cfg, model, specs, engine_options(cfg, window), hw=hw, engine_profile=engine_profile)
    for lp in dep.pools:
        check_block_size(cfg, lp.cost.engine)
    if _streams(cfg, workload):     # bounded memory: in chunks, summarised as it runs
        return _simulate_stream(cfg, given, model, hw, workload, dep, rate, engine_profile, records)
    # refuse, before any work, a run the machine cannot hold
    check_run_memory(replace(cfg, replicas=sum(s.replicas for s in specs), pp=max(s.pp for s in specs)), workload)
    reqs = build_requests(workload, cfg.num_requests, cfg.seed, rate=rate, process=cfg.arrival, cv=cfg.cv,
                          offline=cfg.offline or cfg.concurrency > 0, isl=cfg.isl, osl=cfg.osl,
                          trace_mode=cfg.trace_mode, max_len=model.max_context, stages=cfg.stages,
                          question_len=cfg.question_len, window=window)
    trace, arrival = _trace_info(cfg, workload, reqs), cfg.arrival
    if trace is not None and rate is not None:
        arrival = "trace"
        if cfg.trace_mode == "replay":
            rate = trace["mean_rate"]
    _check_capacity(cfg, dep, reqs)
    threads = threads_of(cfg.threads, dep.cfg.replicas)
    out = run(lower_requests(dep, reqs, cfg.seed, cfg.speculative), threads)
    df = requests_columns(out, reqs.prompt, reqs.output, dep.cfg.frontend)
    if _pool_report(cfg, reqs):
        summary_args, config_extra = _pools_summary(cfg, dep, out, df, reqs)
    else:
        summary_args, config_extra = _single_summary(cfg, dep, hw)
    summary = summarize(df, out, warmup=cfg.warmup, slo=cfg.slo or Slo(), offered_rate=rate, stages=cfg.stages,
                        concurrency=cfg.concurrency, threads=threads_of(cfg.threads), **summary_args)
    pools_part = {}
    if "pools" in config_extra:
        pools_part = _pools_part(cfg, out, df, config_extra.pop("pools"), summary)
    config = _plain_config(cfg, given, pools_part != {})
    config.update(config_extra)
    config.update({"rate": rate, "duration": cfg.duration, "num_requests": int(reqs.arrival.size),
                   "arrival": arrival, "trace": trace})
    if daily:   # the window of the day sent and the delivered rate (only for daily runs)
        config["daily"] = daily_window(reqs.arrival, rate, window_s=window)
    rc = None if cfg.pool else dep.pools[0].cost
    summary["model_error"] = _model_error(cfg, model, hw, rc, engine_profile, summary)
    if cfg.speculative is not None:
        summary["speculative"] = speculative_summary(cfg.speculative, out.stats)
    summary = _clean({"config": config, **summary, **pools_part})
    from . import progress
    progress.tick()      # one simulation finished (a progress bar listening, servesim/progress.py)
    log = (out.log_time, out.log_replica, out.log_seqs, out.log_tokens, out.log_kv_blocks, out.log_waiting)
    return Result(config, summary, df, log, out.gap_hist)


def _streams(cfg: SimConfig, workload) -> bool:
    """Whether a run streams: ``--stream`` (refused, one line, for a run that cannot), never with
    ``--no-stream``, else when it can and its records would not fit (`budget.stream_budget`)."""
    from .engine.budget import expected_requests, run_bytes, stream_budget
    from .workload.stream import stream_refusal
    if cfg.stream is False:
        return False
    why = stream_refusal(cfg, workload)
    if cfg.stream:
        if why:
            raise ConfigError(f"--stream: a streamed run is open-loop, synthetic and single-pool; not with {why}; "
                              "drop --stream or those options")
        return True
    need = run_bytes(expected_requests(cfg, workload), cfg.replicas, cfg.max_num_seqs, cfg.pp)
    return why is None and need > stream_budget()


def _simulate_stream(cfg: SimConfig, given: SimConfig, model, hw, workload, dep, rate, engine_profile,
                     records) -> Result:
    """`simulate` in bounded memory: requests drawn chunk by chunk (`workload.stream`, the same as in one
    piece), the kernel run over a window of them (`engine.stream`), each block of ended requests
    summarised (`metrics_stream`) and written to ``records`` (else dropped)."""
    from types import SimpleNamespace

    from .engine.lower import router_chunks
    from .engine.stream import CHUNK, run_stream
    from .metrics_stream import StreamStats
    from .workload.spec import DEFAULT_NUM_REQUESTS
    from .workload.stream import arrival_marks, request_chunks
    n = int(cfg.num_requests) if cfg.num_requests is not None else DEFAULT_NUM_REQUESTS
    i0, t_mid, t1 = arrival_marks(n, cfg.seed, rate=rate, process=cfg.arrival, cv=cfg.cv, warmup=cfg.warmup,
                                  chunk=CHUNK)
    t0 = cfg.warmup if cfg.warmup > 0 else 0.0
    if not t1 > t0 or i0 >= n:
        raise ConfigError(f"--stream: the measured arrivals span no time (last arrival {t1:g} s, --warmup "
                          f"{cfg.warmup:g} s); use more --num-requests or a shorter --warmup")
    ecfg = dep.cfg
    # the replicas' state is not streamed: refuse a deployment the machine cannot hold (a window's requests)
    check_run_memory(replace(cfg, num_requests=min(n, 2 * CHUNK), replicas=ecfg.replicas, pp=ecfg.pp), workload)
    stats = StreamStats(n, i0, t0, t_mid, t1, ecfg.frontend, cfg.slo or Slo())

    def chunks():
        gen = request_chunks(workload, n, cfg.seed, rate=rate, process=cfg.arrival, cv=cfg.cv, isl=cfg.isl,
                             osl=cfg.osl, max_len=model.max_context, chunk=CHUNK)
        for (arrival, prompt, output), (u1, u2) in zip(gen, router_chunks(n, cfg.seed, CHUNK)):
            _check_capacity(cfg, dep, SimpleNamespace(prompt=prompt, output=output))
            yield np.ascontiguousarray(arrival, dtype=np.float64) + ecfg.frontend, prompt, output, u1, u2

    from .outputs.results import RecordsWriter
    with RecordsWriter(records, ecfg.frontend) as writer:
        def sink(rec, base):
            stats.add(rec, base)
            writer.write(rec, base)
        end = run_stream(tuple(lp.cost.params for lp in dep.pools), ecfg, dep.table, chunks(), sink)
    summary_args, config_extra = _single_summary(cfg, dep, hw)
    stopped = (f"the backlog reached {end.peak_window:,} requests in the system (a streamed run stops there); "
               f"{n - end.loaded:,} requests never sent") if end.backlog else None
    summary = stats.summary(end, warmup=cfg.warmup, stopped=stopped, **summary_args)
    summary["stream"]["records"] = None if records is None else str(records)
    config = _plain_config(cfg, given, False)
    config.update(config_extra)
    config.update({"stream": True, "rate": rate, "duration": cfg.duration, "num_requests": n,
                   "arrival": cfg.arrival, "trace": None})
    summary["model_error"] = _model_error(cfg, model, hw, dep.pools[0].cost, engine_profile, summary)
    summary = _clean({"config": config, **summary})
    from . import progress
    progress.tick()
    return Result(config, summary, None, tuple(end.log[:6]), end.gap_hist)


def speculative_summary(spec, stats) -> dict:
    """The run's speculative decoding: its method and draft length, the acceptance model's expected
    tokens per step, the simulated mean accepted drafts per verification step, and the shares of the
    replicas' busy time spent drafting and in the steps that verified (the rest of those steps)."""
    from .engine import state as K
    steps, busy = stats[K.STAT_SPEC_STEPS], stats[K.STAT_BUSY]
    return {"method": spec.method, "k": spec.k, "acceptance": spec.acceptance, "delta": spec.delta,
            "expected_tokens_per_step": spec.expected_tokens,
            "mean_accepted_per_step": stats[K.STAT_SPEC_TOKENS] / steps - 1.0 if steps > 0 else None,
            "verify_steps": int(steps),
            "draft_time_share": stats[K.STAT_DRAFT] / busy if busy > 0 else None,
            "verify_time_share": stats[K.STAT_VERIFY] / busy if busy > 0 else None}


# One small run of each set of features the kernel is compiled for (`servesim warmup`). A feature a
# run does not use is absent from its compiled loop (engine/kernel.py): the prefix cache, session
# turns, the KV transfers of prefill/decode pools, static batching's padding, speculative decoding (not
# with static batching: refused). The number of pools is not: their cost tables are the
# rows of one array (engine/kernel.py `cost_inputs`).
_KV_FEATURES = {
    "": dict(),
    "prefix cache": dict(num_system_prompts=2, users_per_system_prompt=5, system_prompt_len=100),
    "sessions": dict(workload="sessions", prefix_caching=False),
    "prefix cache and sessions": dict(workload="sessions", cpu_kv_gib=1.0, router="prefix-aware"),
}
_BATCHING = {"": dict(), "static batching": dict(scheduler="static"),
             "speculative decoding": dict(speculative="eagle:k=2:acceptance=0.7")}
_POOLS = {"": dict(), "prefill/decode pools": dict(pool=("h100-sxm:tp1:x1:prefill", "h100-sxm:tp1:x1:decode"),
                                                  layerwise_transfer=True)}
_ENGINE_FEATURES = {(", ".join(n for n in (a, c, b) if n) or "one pool"): kv | pools | batching
                    for b, batching in _BATCHING.items() for c, pools in _POOLS.items()
                    for a, kv in _KV_FEATURES.items()}
# ... each with both shapes of the step cost (costmodel/features.py): the default dense model compiles
# the plain one; the full one, which any MoE, MLA, EP or weight-only run compiles, by the same model in int4
WARMUP_RUNS = {name + suffix: opts | shape for name, opts in _ENGINE_FEATURES.items()
               for suffix, shape in (("", {}), (", MoE/MLA/EP/int4", {"dtype": "int4"}))}


LONG_RUNS = f"long runs (over {LONG_ABOVE:,} requests)"


def warmup(runs=None, each=None) -> dict:
    """Compile (or load from numba's cache) every feature set of the kernel ahead of time, by one
    20-request simulation of each (`WARMUP_RUNS`), then the jitted helpers only long runs call
    (`LONG_RUNS`, `warm_long_runs`); returns {name: wall seconds}. ``each(name, s)`` is called after each."""
    import time
    out = {}
    steps = [(name, lambda opts=opts: simulate(num_requests=20, seed=0, **opts))
             for name, opts in (runs or WARMUP_RUNS).items()] + [(LONG_RUNS, warm_long_runs)]
    for name, step in steps:
        t0 = time.perf_counter()
        step()
        out[name] = time.perf_counter() - t0
        if each is not None:
            each(name, out[name])
    return out


def warm_long_runs() -> None:
    """Compile the jitted helpers that only runs over LONG_ABOVE requests call, on tiny inputs of the same
    types: the batch means of the intervals (`batchmeans`), the gather of the output columns
    (`engine.state.gather_nb`), the order of the completions by finish time (`order`)."""
    from .batchmeans import batch_squares_nb
    from .engine.state import OUTPUT_FIELDS, gather_nb, new_requests
    from .order import bucket_argsort_nb
    x = np.arange(4.0)
    batch_squares_nb(x, 0.0, 0.0, False, 1, np.empty(4))
    ones = np.ones(4, np.int64)
    rq = new_requests(x, ones, ones, x, x, np.full(4, -1, np.int64))
    gather_nb(rq, *(np.empty(4, rq.dtype[k]) for k in OUTPUT_FIELDS), np.empty(0), np.empty(0), np.empty(0, np.int64))
    bucket_argsort_nb(x, 0.0, 1.0, 4, np.empty(4, np.int64))
