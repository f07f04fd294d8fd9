"""Python side of the engine: options -> plain arrays and an EngineConfig -> kernel -> EngineOutput."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError, InfeasibleError
from . import codes as C
from .kernel import EngineConfig, EngineOutput, simulate_nb, simulate_pools
from .state import Chains, Pools


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
    return EngineConfig(
        policy=policy,
        router=_code(C.ROUTERS, opts.router, "--router"),
        preemption=_code(C.PREEMPTION, opts.preemption, "--preemption"),
        replicas=int(opts.replicas), pp=int(replica_cost.layout.pp),
        max_num_seqs=int(opts.max_num_seqs), max_batched_tokens=int(budget),
        block_size=int(opts.block_size), num_blocks=int(num_blocks),
        watermark_blocks=int(math.floor(opts.watermark * num_blocks)),
        concurrency=int(opts.concurrency),
        max_time=float(opts.duration), warmup_time=float(opts.warmup_time),
        kv_bytes_per_token=float(mem.kv_bytes_per_token), log_size=int(opts.log_size),
        frontend=float(opts.frontend),
    )


def router_draws(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Uniform draws for the random and power-of-two routers, from their own stream."""
    rng = np.random.default_rng([seed, 0x726F75])
    return rng.random(n), rng.random(n)


def prefix_arrays(n: int, block_size: int, prompt, prefix_group=None, prefix_len=None):
    """(group, hit) int64 arrays for the kernel: a request's shared-prefix group (-1: none) and the
    prompt tokens it can take from the prefix cache: its prefix in whole blocks, below its prompt
    length (vLLM hits full blocks only and always recomputes the last prompt token)."""
    if prefix_group is None or prefix_len is None:
        return np.full(n, -1, np.int64), np.zeros(n, np.int64)
    group = np.ascontiguousarray(prefix_group, dtype=np.int64)
    plen = np.minimum(np.asarray(prefix_len, dtype=np.int64), np.asarray(prompt, dtype=np.int64) - 1)
    hit = np.where(group >= 0, (np.maximum(plen, 0) // block_size) * block_size, 0).astype(np.int64)
    return group, np.ascontiguousarray(hit)


def kernel_inputs(cfg: EngineConfig, arrival, prompt, output, seed: int):
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
    from ..costmodel.speculative import lower_draft, spec_draws
    from .state import Spec
    yields, start = spec_draws(speculative, output, seed)
    drafts = [lower_draft(rc, speculative) for rc in pool_costs]
    has = all(d is not None for d in drafts)
    spec = Spec(int(speculative.k), int(has), int(speculative.method in ("eagle", "mtp")), yields, start,
                np.zeros(len(start), np.int64))
    return spec, (tuple(d.params for d in drafts) if has else None)


def run_engine(replica_cost, cfg: EngineConfig, arrival, prompt, output, seed: int,
               prefix_group=None, prefix_len=None, speculative=None) -> EngineOutput:
    """Run the kernel; ``prefix_group`` / ``prefix_len`` (from the workload) drive its prefix cache.

    ``arrival`` are the clients' send times; the engine receives each request ``cfg.frontend`` later
    (the serving frontend: HTTP, tokenisation, the hop to the engine process, and the return of the
    first token), so the records' arrival is the send time and TTFT and E2E include it."""
    arrival, prompt, output, u1, u2 = kernel_inputs(cfg, arrival, prompt, output, seed)
    group, hit = prefix_arrays(prompt.shape[0], cfg.block_size, prompt, prefix_group, prefix_len)
    spec, dps = spec_inputs(speculative, [replica_cost], output, seed)
    out = simulate_nb(replica_cost.params, cfg, arrival, prompt, output, u1, u2, group, hit, spec,
                      None if dps is None else dps[0])
    return out._replace(arrival=out.arrival - cfg.frontend)


def run_pools(pool_costs: list, cfg: EngineConfig, pools: Pools, arrival, prompt, output, seed: int,
              chains: Chains, speculative=None) -> EngineOutput:
    """Run the kernel over several pools (engine/POOLS.md): ``pool_costs[k]`` is pool k's lowered
    replica; ``cfg`` the deployment's EngineConfig (``replicas``: all pools', ``pp``: the deepest);
    the frontend offset and router draws as `run_engine`. Session turns (``chains.next_turn``) are
    sent when their previous turn ends; their ``arrival`` is ignored."""
    arrival, prompt, output, u1, u2 = kernel_inputs(cfg, arrival, prompt, output, seed)
    ps = tuple(rc.params for rc in pool_costs)
    spec, dps = spec_inputs(speculative, pool_costs, output, seed)
    out = simulate_pools(ps, cfg, pools, arrival, prompt, output, u1, u2, chains, spec, dps)
    return out._replace(arrival=out.arrival - cfg.frontend)
