"""Lowering: a resolved run configuration -> what the kernel is given.

`replica_of` prices one replica (its engine profile, layout, memory and cost bundle, from
`costmodel`); `pools.lower_pools` lowers every pool of a deployment with it.
"""
from __future__ import annotations

from ..config.engine import load_engine, with_fit_for
from ..costmodel import Layout, build_replica
from ..errors import ConfigError


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
