"""Engine presets: documented defaults for the scheduler knobs of real serving engines.

Every option given explicitly overrides the preset. Per-iteration CPU overhead is not set here:
it comes from the hardware profile's fitted `iteration_overhead_us` (calibrated on TensorRT-LLM
results, the only end-to-end measurements shipped) unless `--iteration-overhead-us` is given.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError


@dataclass(frozen=True)
class EnginePreset:
    name: str
    scheduler: str
    max_num_seqs: int
    max_num_batched_tokens: int
    chunk_size: int
    block_size: int
    gpu_memory_utilization: float
    watermark: float          # fraction of KV blocks kept free when admitting
    preemption: str
    source: str
    memory_fraction_of_free: bool = False   # TensorRT-LLM semantics of the memory fraction


PRESETS = {
    # vLLM V1: chunked prefill on, max_num_seqs 256, max_num_batched_tokens 8192 for the OpenAI
    # server on large GPUs, block size 16, gpu_memory_utilization 0.9, recompute preemption.
    # docs.vllm.ai "Engine Arguments" and "Optimization and Tuning" (v0.8-0.10).
    "vllm": EnginePreset("vllm", "vllm", 256, 8192, 8192, 16, 0.90, 0.01, "recompute",
                         "vLLM engine arguments (docs.vllm.ai), V1 defaults"),
    # TensorRT-LLM: in-flight batching, max_batch_size 2048 and max_num_tokens 8192 (trtllm-build /
    # trtllm-bench defaults since 0.11), tokens_per_block 64, kv_cache_free_gpu_mem_fraction 0.90
    # (0.95 in the published throughput tables). nvidia.github.io/TensorRT-LLM "Best practices".
    "trtllm": EnginePreset("trtllm", "vllm", 2048, 8192, 8192, 64, 0.90, 0.0, "recompute",
                           "TensorRT-LLM build/bench defaults (nvidia.github.io/TensorRT-LLM)", True),
    # SGLang: chunked_prefill_size 8192, page_size 1, mem_fraction_static ~0.88 on 80 GB GPUs,
    # max_running_requests derived from memory (we cap at 1024). docs.sglang.ai "Server Arguments".
    "sglang": EnginePreset("sglang", "vllm", 1024, 8192, 8192, 1, 0.88, 0.0, "recompute",
                           "SGLang server arguments (docs.sglang.ai)"),
}


def get_preset(name: str) -> EnginePreset:
    try:
        return PRESETS[name]
    except KeyError:
        raise ConfigError(f"--engine: unknown engine {name!r}; use one of {', '.join(PRESETS)}") from None
