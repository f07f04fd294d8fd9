"""Memory accounting per GPU for one serving replica: weights, KV cache, activations.

Weights: every transformer-layer matrix is sharded over TP ranks (Megatron-style column/row
splits, Shoeybi et al. 2019); layers are split over PP stages (the fullest stage counts);
embedding and LM head are vocab-sharded over TP and live on the first / last stage.
Embedding and LM head stay in 16-bit when the body is quantised, as in vLLM and TensorRT-LLM.
int4 / fp4 weights carry one 16-bit scale per group of 128 (AWQ, Lin et al. 2024; GPTQ).
KV cache per token: 2 (K and V) x KV heads x head dim x bytes per layer (Pope et al. 2022,
"Efficiently Scaling Transformer Inference", sec. 2); KV heads are split over TP and replicated
when TP exceeds them (vLLM). MLA caches the compressed latent plus the rope key,
(kv_lora_rank + qk_rope_head_dim) per layer, replicated on every TP rank (DeepSeek-V2 paper, sec. 2.1.2).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .dtypes import BYTES, activation_bytes

GiB = float(1 << 30)


def weight_bytes_per_param(dtype: str) -> float:
    b = BYTES[dtype]
    if dtype in ("int4", "fp4"):
        b += 2.0 / 128.0
    return b


def kv_heads_per_gpu(model, tp: int) -> float:
    return max(1.0, model.num_kv_heads / tp)


def kv_bytes_per_token_layer(model, tp: int, kv_dtype: str) -> float:
    """KV-cache bytes one token occupies in one layer on one GPU."""
    kvb = BYTES[kv_dtype]
    if model.mla is not None:
        return (model.mla.kv_lora_rank + model.mla.qk_rope_head_dim) * kvb
    return 2.0 * kv_heads_per_gpu(model, tp) * model.head_dim * kvb


def layers_per_stage(model, pp: int) -> int:
    return math.ceil(model.num_layers / pp)


@dataclass(frozen=True)
class MemoryPlan:
    weight_bytes: float          # fullest stage, per GPU
    kv_bytes_per_token: float    # per GPU (its stage's layers)
    activation_bytes: float      # peak workspace for one iteration
    reserve_bytes: float
    hbm_bytes: float
    usable_bytes: float          # hbm * gpu_memory_utilization
    kv_capacity_tokens: int

    def as_dict(self) -> dict:
        return {
            "weights_gib": self.weight_bytes / GiB,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "activations_gib": self.activation_bytes / GiB,
            "reserve_gib": self.reserve_bytes / GiB,
            "hbm_gib": self.hbm_bytes / GiB,
            "usable_gib": self.usable_bytes / GiB,
            "kv_capacity_tokens": self.kv_capacity_tokens,
        }


def weight_bytes_per_gpu(model, tp: int, pp: int, dtype: str, ep: int = 1, attn_dp: int = 1) -> float:
    """Weights on the fullest GPU. With expert parallelism the routed experts are spread over the
    replica's tp x attn_dp GPUs of a stage (E / ep experts each, split over tp x attn_dp / ep), while
    attention, dense MLPs, shared experts and the router are TP-sharded and replicated on every DP
    attention rank (SGLang DP attention, vLLM DP + EP)."""
    wb = weight_bytes_per_param(dtype)
    layer_params = [0.0] * model.num_layers
    layer_experts = [0.0] * model.num_layers
    for i in range(model.num_layers):
        p = model.attn_params_per_layer() + model.norm_params_per_layer()
        if model.is_moe_layer(i):
            moe = model.moe
            p += model.shared_expert_params() + model.router_params()
            layer_experts[i] = moe.num_experts * model.expert_params()
        else:
            p += model.dense_mlp_params()
        layer_params[i] = p
    per = layers_per_stage(model, pp)
    expert_gpus = tp * attn_dp if ep > 1 else tp
    stage_bytes = [(sum(layer_params[s * per:(s + 1) * per]) / tp
                    + sum(layer_experts[s * per:(s + 1) * per]) / expert_gpus) * wb for s in range(pp)]
    emb = model.embedding_params() * 2.0 / tp
    head = model.lm_head_params() * 2.0 / tp
    if pp == 1:
        return stage_bytes[0] + emb + head
    stage_bytes[0] += emb
    stage_bytes[-1] += head if model.lm_head_params() else emb  # tied: last stage keeps a copy
    return max(stage_bytes)


def activation_bytes_per_gpu(model, tp: int, dtype: str, max_tokens: int, max_seqs: int) -> float:
    """Peak transient memory of one forward pass over `max_tokens` tokens (vLLM's profile run).

    The widest live tensors: the fused MLP up/gate output (2 * ffn / TP per token) or the QKV
    output, plus the hidden state and residual, plus fp32 logits for the sampled sequences.
    """
    ab = activation_bytes(dtype) if dtype in ("fp8", "int8") else 2.0
    f = model.ffn_hidden_size
    if model.moe is not None:
        f = max(f, model.moe.expert_ffn_hidden_size * model.moe.experts_per_token)
    widest = max(2.0 * f / tp, (model.q_dim + 2 * model.num_kv_heads * model.head_dim) / tp)
    per_token = (widest + 4.0 * model.hidden_size) * ab
    logits = max_seqs * model.vocab_size / tp * 4.0
    return max_tokens * per_token + logits


def plan_memory(model, hw, tp: int, pp: int, dtype: str, kv_dtype: str, gpu_memory_utilization: float,
                max_tokens: int, max_seqs: int, fraction_of_free: bool = False,
                non_torch_bytes: float = GiB, ep: int = 1, attn_dp: int = 1) -> MemoryPlan:
    """KV capacity from the memory the device reports (``hw.device_bytes``).

    vLLM: ``gpu_memory_utilization`` x total memory - weights - the activation peak of a profile
    run - non-torch memory (CUDA context, NCCL, CUDA graphs) (vllm/v1/worker/gpu_worker.py,
    determine_available_memory). TensorRT-LLM (``fraction_of_free``): the fraction is of the memory
    left after weights, activations and runtime buffers (``kv_cache_free_gpu_mem_fraction``,
    TensorRT-LLM docs, "KV cache"). With ``attn_dp`` DP attention ranks each rank caches its own
    requests, so the replica holds attn_dp times one rank's tokens."""
    w = weight_bytes_per_gpu(model, tp, pp, dtype, ep, attn_dp)
    kv = kv_bytes_per_token_layer(model, tp, kv_dtype) * layers_per_stage(model, pp)
    act = activation_bytes_per_gpu(model, tp, dtype, max_tokens, max_seqs)
    total = hw.device_bytes
    if fraction_of_free:
        usable = w + act + non_torch_bytes + gpu_memory_utilization * max(total - w - act - non_torch_bytes, 0.0)
    else:
        usable = total * gpu_memory_utilization
    free = usable - w - act - non_torch_bytes
    cap = int(free // kv) * attn_dp if free > 0 else 0
    return MemoryPlan(w, kv, act, non_torch_bytes, total, usable, cap)
