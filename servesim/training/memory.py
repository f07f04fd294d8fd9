"""Memory per GPU of a training layout.

- Model states, mixed-precision Adam: 2 B weights + 2 B gradients (16-bit) + 12 B optimiser
  (fp32 master weights, momentum, variance) = 16 B per parameter (Rajbhandari et al. 2020,
  "ZeRO", sec. 3.1). ZeRO-1 shards the 12 B, ZeRO-2 also the gradients, ZeRO-3 (FSDP FULL_SHARD)
  also the weights, over the data-parallel group (DP x CP ranks; experts over DP x CP / EP).
- Activations per layer and micro-batch (Korthikanti et al. 2022, "Reducing Activation
  Recomputation in Large Transformer Models", arXiv:2205.05198, sec. 4 and Table 2), with s the
  sequence per GPU (s / CP), b the micro-batch, h hidden, a heads, t TP:
      no recompute, TP only:       s b h (10 + 24/t + 5 a s / (h t))
      no recompute, TP + SP:       s b h (34 + 5 a s / h) / t
      selective, TP only:          s b h (10 + 24/t)
      selective, TP + SP:          s b h 34 / t
      full:                        2 s b h   (the layer input; / t with SP)
  The paper derives them for GPT blocks (4h MLP, multi-head attention, 16-bit activations) and
  we use them as written for every architecture.
- Pipeline: under 1F1B the first stage holds p micro-batches of its L/p layers, i.e. L layers'
  worth (Narayanan et al. 2021, sec. 2.2.1); the interleaved schedule multiplies that by
  (1 + (p - 1) / (p v)) (Korthikanti et al. 2022, sec. 4.2.3).
- Logits: with one stage, the fp32 logits of one micro-batch, 4 s b V / t bytes.
"""
from __future__ import annotations

from servesim.costmodel.memory import GiB

# CUDA context, NCCL buffers and the allocator's fragmentation outside the tensors counted here
# (vLLM and PyTorch report ~0.5-1.5 GiB of such "non-torch memory" on H100; vLLM docs, "Conserving Memory")
RUNTIME_RESERVE_BYTES = 1.0 * GiB


def stage_params(model, pp: int, stage: int) -> tuple[float, float]:
    """(dense, expert) parameters held by one pipeline stage before TP/EP sharding."""
    per = model.num_layers // pp
    dense = expert = 0.0
    for i in range(stage * per, (stage + 1) * per):
        dense += model.attn_params_per_layer() + model.norm_params_per_layer()
        if model.is_moe_layer(i):
            expert += model.moe.num_experts * model.expert_params()
            dense += model.shared_expert_params() + model.router_params()
        else:
            dense += model.dense_mlp_params()
    if stage == 0:
        dense += model.embedding_params()
    if stage == pp - 1:
        dense += model.lm_head_params() + model.final_norm_params()
        if pp > 1 and model.tied_embeddings:
            dense += model.vocab_size * model.hidden_size  # a copy of the tied embedding (Megatron)
    return dense, expert


def local_params(model, lay, stage: int) -> tuple[float, float]:
    """(dense, expert) parameters on one GPU of ``stage``: dense / TP, experts / (TP x EP)."""
    dense, expert = stage_params(model, lay.pp, stage)
    return dense / lay.tp, expert / (lay.tp * lay.ep)


def activation_bytes_per_layer(model, lay) -> float:
    """Korthikanti et al. 2022 Table 2, per layer and micro-batch, bytes."""
    s = lay.seq_len / lay.cp
    b, h, a, t = lay.micro_batch, model.hidden_size, model.num_attention_heads, lay.tp
    sbh = s * b * h
    sp = lay.sp and t > 1
    if lay.recompute == "full":
        return 2.0 * sbh / (t if sp else 1)
    if lay.recompute == "selective":
        return sbh * 34.0 / t if sp else sbh * (10.0 + 24.0 / t)
    if sp:
        return sbh * (34.0 + 5.0 * a * s / h) / t
    return sbh * (10.0 + 24.0 / t + 5.0 * a * s / (h * t))


def in_flight_factor(lay) -> float:
    """Layers' worth of activations held by the first stage, as a multiple of L / p."""
    if lay.pp == 1:
        return 1.0
    f = float(lay.pp)
    if lay.vp > 1:
        f *= 1.0 + (lay.pp - 1) / (lay.pp * lay.vp)
    return f


def memory_per_gpu(model, hw, lay) -> dict[str, float]:
    """Bytes per GPU, per part, for the fullest stage (the first under 1F1B)."""
    worst = None
    n_dense = lay.dp * lay.cp
    n_exp = max(1, n_dense // lay.ep)
    for stage in sorted({0, lay.pp - 1}):
        pd_, pe = local_params(model, lay, stage)
        w = 2.0 * (pd_ / (n_dense if lay.zero >= 3 else 1) + pe / (n_exp if lay.zero >= 3 else 1))
        g = 2.0 * (pd_ / (n_dense if lay.zero >= 2 else 1) + pe / (n_exp if lay.zero >= 2 else 1))
        o = 12.0 * (pd_ / (n_dense if lay.zero >= 1 else 1) + pe / (n_exp if lay.zero >= 1 else 1))
        act = 0.0
        if stage == 0:
            act = activation_bytes_per_layer(model, lay) * (model.num_layers / lay.pp) * in_flight_factor(lay)
        logits = 0.0
        if stage == lay.pp - 1:
            logits = 4.0 * (lay.seq_len / lay.cp) * lay.micro_batch * model.vocab_size / lay.tp
        parts = {"weights": w, "gradients": g, "optimizer": o, "activations": act, "logits": logits,
                 "reserve": RUNTIME_RESERVE_BYTES}
        parts["total"] = sum(parts.values())
        if worst is None or parts["total"] > worst["total"]:
            worst = parts
    return worst


def as_gib(parts: dict[str, float]) -> dict[str, float]:
    return {k: v / GiB for k, v in parts.items()}
