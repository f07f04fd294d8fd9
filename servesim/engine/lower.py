"""Lowering: a resolved run configuration -> the kernel's inputs. The only place that does it.

A deployment is one or more pools (`--pool`; without it the single-pool options make one mixed
pool), so every run is lowered the same way, in two stages:

* `lower_deployment` prices each pool with its own replica (`replica_of`: the pool's hardware,
  engine, dtype, TP, PP; the deployment's memory utilisation, max_num_seqs, token budget and block
  size) and fills the kernel's per-pool arrays (`state.Pools`, semantics in engine/POOLS.md) and
  its `EngineConfig`;
* `lower_requests` turns the workload's requests into the kernel's request arrays and prefix-cache
  chains (`workload.chains.block_chains`, the one chain builder) and returns `KernelInputs`, which
  the kernel (`run.run`) and the reference simulator (`reference.reference_run`) both consume.

Per pool:

* ``num_blocks``: the KV blocks of one replica (`engine_config`: the KV capacity of its memory plan
  over the block size, or ``--num-gpu-blocks``), ``watermark_blocks`` from the pool's engine profile;
* ``cpu_blocks``: ``floor(--cpu-kv-gib * 2**30 / (block_size * kv_bytes_total))``, the host-memory
  tier of one replica (0 without ``--cpu-kv-gib``);
* ``kv_bytes_per_token``: per GPU (the memory plan's figure, its stage's layers);
  ``kv_bytes_total``: that x TP x PP (every GPU of a replica holds KV: its TP shard of its stage's
  layers; KV heads replicated when TP exceeds them are counted on every GPU, as they are stored;
  with PP not dividing the layers the fullest stage is counted on every stage);
  ``kv_gpus`` = TP x PP;
* ``weight`` (the router's capacity weight per replica): TP x attn-DP x PP x the dense peak FLOP/s of the
  pool's hardware at its GEMM dtype, in PFLOP/s. A peak rather than a lowered iteration: it needs no
  reference batch and ranks pools the way their datasheets do; only ratios between pools matter;
* ``link_bw`` / ``link_alpha`` between two pools: the scale-up fabric (NVLink; the point-to-point
  figures of `costmodel.collectives.p2p_link`, the rate above its size step, KV transfers being tens
  of MiB) when both pools run on the same hardware and all their GPUs fit one scale-up domain
  (``hw.scaleup_domain``), else the NIC (``hw.scaleout_bw x scaleout_bw_fraction``,
  ``scaleout_latency_s``; the slower side's). ``--kv-link nvlink|nic`` forces one.

The prefix cache is compiled in (`kernel.simulate_pools`) only when prefix caching is on and some
request has a chain to share; ``EngineConfig.prefix_caching`` (the lookup counters) follows the
option alone.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, replace
from typing import NamedTuple

import numpy as np

from ..config import load_hardware
from ..config.engine import load_engine, with_fit_for
from ..costmodel import Layout, build_replica
from ..costmodel.dtypes import compute_dtype
from ..costmodel.speculative import host_params, lower_draft, spec_draws
from ..errors import ConfigError, InfeasibleError
from ..workload.chains import block_chains
from . import codes as C
from .state import Chains, EngineConfig, Pools, Spec


@dataclass(frozen=True)
class EngineOptions:
    scheduler: str = "vllm"
    router: str = "round-robin"
    preemption: str = "recompute"
    replicas: int = 1
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    chunk_size: int = 512
    block_size: int = 16
    watermark: float = 0.01
    concurrency: int = 0
    duration: float = math.inf
    warmup_time: float = 0.0
    log_size: int = 20000
    num_gpu_blocks: int | None = None   # KV blocks per replica given by the user (None: from memory)
    frontend: float = 0.0               # s from a client sending a request to the engine receiving it
    max_chunk_tokens: int | None = None  # one sequence's prefill chunk per step (None: the whole budget)


class KernelInputs(NamedTuple):
    """Everything the kernel (`kernel.simulate_pools`) and the reference simulator take."""
    ps: tuple                   # one CostParams per pool
    cfg: EngineConfig
    pools: Pools
    arrival: np.ndarray         # engine arrival times (the send + the frontend)
    prompt: np.ndarray
    output: np.ndarray
    u1: np.ndarray              # router draws
    u2: np.ndarray
    chains: Chains
    spec: object = None         # state.Spec of speculative decoding (None: none, pruned)
    dps: tuple | None = None    # the pools' draft CostParams (None: the pools' own, or no speculation)


@dataclass(frozen=True)
class LoweredPool:
    spec: object                 # pools.PoolSpec
    cost: object                 # ReplicaCost
    num_blocks: int
    watermark_blocks: int
    cpu_blocks: int
    usd_per_gpu_hour: float
    peak_flops: float            # per GPU, at its GEMM dtype


@dataclass(frozen=True)
class Deployment:
    """The lowered pools of a run, their per-pool arrays and the deployment's EngineConfig."""
    pools: list                  # list[LoweredPool]
    table: Pools
    cfg: EngineConfig


def _code(table: dict, value: str, option: str) -> int:
    if value not in table:
        raise ConfigError(f"{option}: unknown value {value!r}; use one of {', '.join(table)}")
    return table[value]


def engine_config(opts: EngineOptions, replica_cost) -> EngineConfig:
    policy = _code(C.POLICIES, opts.scheduler, "--scheduler")
    for name, v in (("--replicas", opts.replicas), ("--max-num-seqs", opts.max_num_seqs),
                    ("--max-num-batched-tokens", opts.max_num_batched_tokens), ("--block-size", opts.block_size),
                    ("--chunk-size", opts.chunk_size)):
        if v < 1:
            raise ConfigError(f"{name} must be >= 1, got {v}")
    if opts.max_chunk_tokens is not None and opts.max_chunk_tokens < 1:
        raise ConfigError(f"max_chunk_tokens must be >= 1 (or None: the whole budget), got {opts.max_chunk_tokens}")
    if not 0.0 <= opts.watermark < 1.0:
        raise ConfigError(f"watermark must be in [0, 1), got {opts.watermark}")
    mem = replica_cost.memory
    if opts.num_gpu_blocks is not None:
        if isinstance(opts.num_gpu_blocks, bool) or not isinstance(opts.num_gpu_blocks, int) or opts.num_gpu_blocks < 1:
            raise ConfigError(f"--num-gpu-blocks must be an integer >= 1, got {opts.num_gpu_blocks!r}")
        num_blocks = opts.num_gpu_blocks
    else:
        num_blocks = mem.kv_capacity_tokens // opts.block_size
    if num_blocks < 1:
        raise InfeasibleError(
            f"{replica_cost.model.name} on {replica_cost.hw.name} at TP={replica_cost.layout.tp} "
            f"PP={replica_cost.layout.pp}: no memory left for the KV cache "
            f"(weights {mem.weight_bytes / 2**30:.1f} GiB + activations {mem.activation_bytes / 2**30:.1f} GiB "
            f"of {mem.usable_bytes / 2**30:.1f} GiB usable); use a larger --tp/--pp, a smaller --dtype "
            f"or a higher --gpu-memory-utilization")
    budget = opts.chunk_size if policy == C.SARATHI else opts.max_num_batched_tokens
    chunk = budget if opts.max_chunk_tokens is None else min(budget, opts.max_chunk_tokens)
    return EngineConfig(
        policy=policy,
        router=_code(C.ROUTERS, opts.router, "--router"),
        preemption=_code(C.PREEMPTION, opts.preemption, "--preemption"),
        replicas=int(opts.replicas), pp=int(replica_cost.layout.pp),
        max_num_seqs=int(opts.max_num_seqs), max_batched_tokens=int(budget),
        max_chunk_tokens=int(chunk),
        block_size=int(opts.block_size), num_blocks=int(num_blocks),
        watermark_blocks=int(math.floor(opts.watermark * num_blocks)),
        concurrency=int(opts.concurrency),
        max_time=float(opts.duration), warmup_time=float(opts.warmup_time),
        kv_bytes_per_token=float(mem.kv_bytes_per_token), log_size=int(opts.log_size),
        frontend=float(opts.frontend),
    )


def engine_options(cfg, window=None) -> EngineOptions:
    """The engine options of a resolved SimConfig (watermark and frontend: set per engine profile;
    ``window``: a daily run's window, which sets the requests instead of stopping the clock)."""
    given = {f.name for f in dataclasses.fields(cfg)}
    shared = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(EngineOptions) if f.name in given}
    if cfg.attn_dp > 1:     # every DP attention rank schedules its own batch (costmodel/ep.py)
        # the replica's scheduler holds the ranks' limits together; one sequence sits on one rank,
        # so its prefill chunk is cut to that rank's own budget (SGLang DP attention, vLLM DP ranks)
        shared.update(max_num_seqs=cfg.max_num_seqs * cfg.attn_dp,
                      max_num_batched_tokens=cfg.max_num_batched_tokens * cfg.attn_dp,
                      max_chunk_tokens=cfg.max_num_batched_tokens)
    return EngineOptions(**shared | dict(
        duration=math.inf if cfg.duration is None or window else cfg.duration, warmup_time=cfg.warmup))


def replica_of(cfg, model, hw, engine=None):
    """The lowered replica of a resolved SimConfig: its engine profile (``engine``: an in-memory profile
    replacing ``cfg.engine``; ``iteration_overhead_us`` replaces the engine's host time per step),
    layout, memory and cost bundle."""
    engine = engine if engine is not None else load_engine(cfg.engine)
    if cfg.iteration_overhead_us is not None:
        if not cfg.iteration_overhead_us >= 0:
            raise ConfigError(f"--iteration-overhead-us must be >= 0, got {cfg.iteration_overhead_us}")
        engine = with_fit_for(engine, hw, host_step_s=cfg.iteration_overhead_us * 1e-6)
    layout = Layout(tp=cfg.tp, pp=cfg.pp, dtype=cfg.dtype, kv_dtype=cfg.kv_dtype, allreduce=cfg.allreduce,
                    ep=cfg.ep, attn_dp=cfg.attn_dp, expert_skew=cfg.expert_skew)
    return build_replica(model, hw, layout, cfg.gpu_memory_utilization, max_tokens=cfg.max_num_batched_tokens,
                         max_seqs=cfg.max_num_seqs, engine=engine)


def _link(a: LoweredPool, b: LoweredPool, same: bool, kv_link: str) -> tuple[float, float]:
    """(achieved B/s, alpha s) of a KV transfer from a GPU of pool a to one of pool b."""
    from ..costmodel.collectives import p2p_link
    ha, hb = a.cost.hw, b.cost.hw
    gpus = a.spec.gpus + (0 if same else b.spec.gpus)
    if kv_link == "auto":
        kv_link = "nvlink" if (ha.name == hb.name and ha.scaleup_bw > 0 and gpus <= ha.scaleup_domain) else "nic"
    if kv_link == "nvlink":
        for h in (ha, hb):
            if h.scaleup_bw <= 0:
                raise ConfigError(f"--kv-link nvlink: {h.name} has no scale-up fabric; use --kv-link nic or auto")
        la = p2p_link(ha, min(2, ha.scaleup_domain))
        lb = p2p_link(hb, min(2, hb.scaleup_domain))
        return min(la[3], lb[3]), max(la[2], lb[2])
    bw = min(h.scaleout_bw * h.efficiency.scaleout_bw_fraction for h in (ha, hb))
    return bw, max(ha.efficiency.scaleout_latency_s, hb.efficiency.scaleout_latency_s)


def lower_pools(cfg, model, specs, opts: EngineOptions, *, hw=None, hw_profile=None, engine_profile=None,
                named: bool = True):
    """Resolved SimConfig + pool specs + the deployment's EngineOptions -> (list[LoweredPool], Pools).
    ``hw``: the loaded profile of ``cfg.hardware`` (else loaded here); ``hw_profile`` /
    ``engine_profile``: in-memory profiles for pools on ``cfg.hardware`` / ``cfg.engine``
    (calibration). ``named``: an error names the pool (``--pool ...: ``)."""
    hw_profile = hw_profile if hw_profile is not None else hw
    lowered = []
    for s in specs:
        hw_s = hw_profile if hw_profile is not None and s.hardware == cfg.hardware else load_hardware(s.hardware)
        eng_name = s.engine or cfg.engine
        engine = engine_profile if engine_profile is not None and eng_name == cfg.engine else load_engine(eng_name)
        dtype = s.dtype if s.dtype not in (None, "auto") else (cfg.dtype if s.dtype is None else model.checkpoint_dtype)
        pcfg = replace(cfg, hardware=s.hardware, tp=s.tp, pp=s.pp, replicas=s.replicas, dtype=dtype, engine=eng_name,
                       ep=s.ep, attn_dp=s.attn_dp)
        try:
            rc = replica_of(pcfg, model, hw_s, engine)
        except (ConfigError, InfeasibleError) as e:
            if not named:
                raise
            raise type(e)(f"--pool {s.text}: {e}") from None
        # (the batch limits are the deployment's, one per replica: a pool's DP ranks share them)
        try:
            ecfg = engine_config(replace(opts, replicas=s.replicas, watermark=rc.engine.scheduler.watermark), rc)
        except ConfigError as e:
            if not named:
                raise
            raise ConfigError(f"--pool {s.text}: {e}") from None
        total = float(rc.memory.kv_bytes_per_token) * s.tp * s.pp
        cpu_gib = getattr(cfg, "cpu_kv_gib", None) or 0.0
        cpu = int(math.floor(cpu_gib * 2**30 / (ecfg.block_size * total))) if cpu_gib > 0 else 0
        price = cfg.price if cfg.price is not None else hw_s.usd_per_hour
        lowered.append(LoweredPool(s, rc, ecfg.num_blocks, ecfg.watermark_blocks, cpu, price,
                                   float(hw_s.peak_flops[compute_dtype(dtype, hw_s.peak_flops)])))
    P = len(lowered)
    kv_link = getattr(cfg, "kv_link", None) or "auto"
    bw, alpha = np.zeros((P, P)), np.zeros((P, P))
    for i, a in enumerate(lowered):
        for j, b in enumerate(lowered):
            bw[i, j], alpha[i, j] = _link(a, b, i == j, kv_link)
    count = np.array([lp.spec.replicas for lp in lowered], np.int64)
    pools = Pools(
        role=np.array([C.ROLES[lp.spec.role] for lp in lowered], np.int64),
        first=np.concatenate(([0], np.cumsum(count)[:-1])).astype(np.int64),
        count=count,
        pp=np.array([lp.spec.pp for lp in lowered], np.int64),
        num_blocks=np.array([lp.num_blocks for lp in lowered], np.int64),
        watermark_blocks=np.array([lp.watermark_blocks for lp in lowered], np.int64),
        cpu_blocks=np.array([lp.cpu_blocks for lp in lowered], np.int64),
        kv_bytes_per_token=np.array([lp.cost.memory.kv_bytes_per_token for lp in lowered], np.float64),
        kv_bytes_total=np.array([lp.cost.memory.kv_bytes_per_token * lp.spec.tp * lp.spec.pp for lp in lowered],
                                np.float64),
        kv_gpus=np.array([lp.spec.tp * lp.spec.pp for lp in lowered], np.int64),
        n_layers=np.array([model.num_layers for _ in lowered], np.int64),
        weight=np.array([lp.spec.tp * lp.spec.attn_dp * lp.spec.pp * lp.peak_flops / 1e15 for lp in lowered],
                        np.float64),
        link_bw=bw, link_alpha=alpha,
    )
    return lowered, pools


def lower_deployment(cfg, model, specs, opts: EngineOptions, *, hw=None, hw_profile=None,
                     engine_profile=None) -> Deployment:
    """Stage one: every pool lowered (`lower_pools`) and the deployment's EngineConfig: pool 0's
    engine sets the frontend and the deployment-wide settings; ``replicas`` counts all pools',
    ``pp`` is the deepest pool's."""
    lowered, table = lower_pools(cfg, model, specs, opts, hw=hw, hw_profile=hw_profile,
                                 engine_profile=engine_profile, named=bool(cfg.pool))
    first = lowered[0].cost
    ecfg = engine_config(replace(opts, replicas=lowered[0].spec.replicas, watermark=first.engine.scheduler.watermark,
                                 frontend=first.engine.fit_for(first.hw).frontend_s), first)
    ecfg = ecfg._replace(replicas=int(sum(lp.spec.replicas for lp in lowered)),
                         pp=int(max(lp.spec.pp for lp in lowered)),
                         prefix_caching=int(bool(getattr(cfg, "prefix_caching", False))),
                         layerwise=int(bool(getattr(cfg, "layerwise_transfer", False))),
                         fast_forward=int(bool(getattr(cfg, "fast_forward", True))))
    return Deployment(lowered, table, ecfg)


def router_draws(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Uniform draws for the random and power-of-two routers, from their own stream."""
    rng = np.random.default_rng([seed, 0x726F75])
    return rng.random(n), rng.random(n)


def router_chunks(n: int, seed: int, chunk: int):
    """`router_draws(n, seed)` in chunks of ``chunk`` requests: (u1, u2) of requests [a, a + chunk), the
    second draws reached by advancing the stream past the first n (PCG64: one 64-bit word per double)."""
    first = np.random.default_rng([seed, 0x726F75])
    second = np.random.default_rng([seed, 0x726F75])
    second.bit_generator.advance(n)
    for a in range(0, n, chunk):
        m = min(chunk, n - a)
        yield first.random(m), second.random(m)


def no_chains(n: int, next_turn=None, think=None) -> Chains:
    """Chains listing no block: no prefix cache (sessions' turns and think times kept)."""
    z = np.zeros(n, np.int64)
    next_turn = np.full(n, -1, np.int64) if next_turn is None else np.ascontiguousarray(next_turn, dtype=np.int64)
    think = np.zeros(n) if think is None else np.ascontiguousarray(think, dtype=np.float64)
    return Chains(z, z.copy(), np.zeros(0, np.int64), next_turn, think)


def chains_of(requests, block_size: int, prefix_caching: bool) -> Chains:
    """The kernel's `Chains` of workload requests: their block chains (`block_chains`) with prefix
    caching on; without it chains listing no block, keeping the sessions' turns and think times."""
    if prefix_caching:
        return block_chains(requests, block_size)
    return no_chains(int(np.asarray(requests.prompt).size), getattr(requests, "next_turn", None),
                     getattr(requests, "think", None))


def request_arrays(cfg: EngineConfig, arrival, prompt, output, seed: int):
    """The kernel's request arrays: arrivals at the engine (``cfg.frontend`` after the send; a closed
    loop's first requests at once), lengths as int64, and the router draws."""
    arrival = np.ascontiguousarray(arrival, dtype=np.float64) + cfg.frontend
    prompt = np.ascontiguousarray(prompt, dtype=np.int64)
    output = np.ascontiguousarray(output, dtype=np.int64)
    if cfg.concurrency > 0:
        arrival = np.full_like(arrival, cfg.frontend)
    u1, u2 = router_draws(prompt.shape[0], seed)
    return arrival, prompt, output, u1, u2


def spec_inputs(speculative, pool_costs: list, output, seed: int):
    """(state.Spec, the pools' draft CostParams or None) of a run with ``speculative`` (a parsed
    costmodel.speculative.Speculative; (None, None) without): the draws of every decode step (their own
    stream of ``seed``) and each pool's draft lowered on its own replica (nothing for ngram)."""
    if speculative is None:
        return None, None
    yields, start = spec_draws(speculative, output, seed)
    drafts = [lower_draft(rc, speculative) for rc in pool_costs]
    has = all(d is not None for d in drafts)
    spec = Spec(int(speculative.k), int(has), int(speculative.method in ("eagle", "mtp")), yields, start,
                np.zeros(len(start), np.int64))
    return spec, (tuple(d.params for d in drafts) if has else None)


def lower_requests(dep: Deployment, requests, seed: int, speculative=None) -> KernelInputs:
    """Stage two: the workload's requests (a `workload.Requests`) -> `KernelInputs`. Session turns
    (``requests.next_turn``) are sent when their previous turn ends; their ``arrival`` is ignored.
    ``speculative``: a parsed `costmodel.speculative.Speculative` (None: no speculative decoding)."""
    cfg = dep.cfg
    chains = chains_of(requests, cfg.block_size, bool(cfg.prefix_caching))
    arrival, prompt, output, u1, u2 = request_arrays(cfg, requests.arrival, requests.prompt, requests.output, seed)
    spec, dps = spec_inputs(speculative, [lp.cost for lp in dep.pools], output, seed)
    return KernelInputs(tuple(host_params(lp.cost, speculative) for lp in dep.pools), cfg, dep.table, arrival, prompt,
                        output, u1, u2, chains, spec, dps)


def one_pool(cfg: EngineConfig) -> Pools:
    """The one mixed pool that a single-pool EngineConfig describes (its pp, KV blocks, watermark,
    KV bytes), for kernels run without a deployment (tests, benchmarks)."""
    one = lambda v, t=np.int64: np.array([v], t)  # noqa: E731
    return Pools(role=one(C.MIXED), first=one(0), count=one(cfg.replicas), pp=one(cfg.pp),
                 num_blocks=one(cfg.num_blocks), watermark_blocks=one(cfg.watermark_blocks), cpu_blocks=one(0),
                 kv_bytes_per_token=one(cfg.kv_bytes_per_token, np.float64), kv_bytes_total=one(0.0, np.float64),
                 kv_gpus=one(1), n_layers=one(1), weight=one(1.0, np.float64),
                 link_bw=np.ones((1, 1)), link_alpha=np.zeros((1, 1)))


def one_pool_inputs(params, cfg: EngineConfig, arrival, prompt, output, seed: int = 0, chains=None,
                    frontend: bool = False, spec=None, dp=None) -> KernelInputs:
    """`KernelInputs` of one mixed pool priced by ``params``, for kernels run without a deployment
    (tests, benchmarks): ``arrival`` taken as engine arrivals (``frontend``: as sends, offset by
    ``cfg.frontend`` as `request_arrays` does), ``chains`` (default: none; prefix caching switched
    on when they list a block); ``spec``, ``dp``: speculative decoding (`spec_inputs`)."""
    n = len(prompt)
    chains = no_chains(n) if chains is None else chains
    if chains.ids.size:
        cfg = cfg._replace(prefix_caching=1)
    if frontend:
        arrival, prompt, output, u1, u2 = request_arrays(cfg, arrival, prompt, output, seed)
    else:
        arrival = np.ascontiguousarray(arrival, dtype=np.float64)
        if cfg.concurrency > 0:
            arrival = np.zeros_like(arrival)
        prompt = np.ascontiguousarray(prompt, dtype=np.int64)
        output = np.ascontiguousarray(output, dtype=np.int64)
        u1, u2 = router_draws(n, seed)
    return KernelInputs((params,), cfg, one_pool(cfg), arrival, prompt, output, u1, u2, chains, spec,
                        None if dp is None else (dp,))
