"""Analytical cost model: rooflines, attention, MoE, collectives and memory for one replica."""
from __future__ import annotations

from dataclasses import dataclass

from .dtypes import kv_dtype_resolved
from .explain import Batch, Breakdown, breakdown
from .memory import MemoryPlan, plan_memory
from .params import CostParams, Layout, check_layout, check_weights_fit, lower


@dataclass(frozen=True)
class ReplicaCost:
    """Everything the engine needs about one replica, lowered once."""
    model: object
    hw: object
    layout: Layout
    params: CostParams
    memory: MemoryPlan
    engine: object

    @property
    def num_gpus(self) -> int:
        return self.layout.gpus

    def iteration(self, batch: Batch) -> Breakdown:
        return breakdown(self.params, batch)


def build_replica(model, hw, layout: Layout, gpu_memory_utilization: float = 0.9,
                  max_tokens: int = 8192, max_seqs: int = 256, engine=None) -> ReplicaCost:
    """Lower one replica: ``engine`` is an engine profile (default: the shipped ``vllm``)."""
    if engine is None:
        from ..config.engine import load_engine
        engine = load_engine("vllm")
    params = lower(model, hw, layout, engine, max_num_seqs=max_seqs, max_tokens=max_tokens)
    check_weights_fit(model, hw, layout, gpu_memory_utilization)
    mem = plan_memory(model, hw, layout.tp, layout.pp, layout.dtype, kv_dtype_resolved(layout.kv_dtype, layout.dtype),
                      gpu_memory_utilization, max_tokens, max_seqs, engine.scheduler.memory_fraction_of == "free",
                      engine.scheduler.non_torch_memory_bytes, layout.ep, layout.attn_dp)
    return ReplicaCost(model, hw, layout, params, mem, engine)


__all__ = ["Batch", "Breakdown", "CostParams", "Layout", "MemoryPlan", "ReplicaCost", "build_replica",
           "breakdown", "check_layout", "check_weights_fit", "lower", "plan_memory"]
