"""Memory per GPU of a training layout, per pipeline rank (the fullest one decides).

Model states (Rajbhandari et al. 2020, "ZeRO", sec. 3.1; Megatron-LM docs/source/api-guide/
dist_optimizer.md): 16-bit weights (2 B), gradients (``grad_bytes`` of the framework: 4 for
Megatron's fp32 main-grad buffer, 2 for fp16/bf16 reductions) and 12 B of optimiser state (fp32
master weights, Adam momentum and variance). ZeRO-1 (Megatron's distributed optimizer) shards the
12 B, ZeRO-2 also the gradients, ZeRO-3 / FSDP also the weights, over the data-parallel group
(DP x CP ranks; experts over DP x CP / EP), or over its ``--dp-shard`` innermost ranks with the
rest replicas (hybrid sharding): Megatron bf16 with the distributed optimizer is
6 + 12/d bytes per parameter, as its documentation tabulates. ZeRO-3 also holds the gathered
16-bit parameters of the layers in flight (the current one plus ``fsdp_prefetch`` ahead; the
embedding or LM head when that is larger) and the unsharded gradients of two layers (one being
reduce-scattered while the next is computed); DeepSpeed caps the gathered parameters at
``stage3_max_live_parameters``. fp8 with a weight cache (Transformer Engine under Megatron-Core)
keeps an fp8 copy of every local weight: 1 B per parameter (the transposed copy the backward needs
is not counted; with it the DGX Cloud Llama-3.1-8B fp8 run on 8 GPUs would not fit without
recomputation, which it ran without). Under ZeRO-3 / FSDP only the gathered layers have fp8
copies (a layer's weights are gathered, then cast), and with fp8 all-gathers (torchao's
enable_fsdp_float8_all_gather, Megatron's --fp8-param-gather) the gathered weights are the fp8
ones, 1 B each. FSDP without resharding after the forward (``reshard_after_forward`` never; torchtitan's
default under PP) keeps every local layer gathered from its forward to its backward.

Activations per layer and micro-batch are derived from the tensors the backward pass needs
(``layer_activation_parts``), for T = micro_batch x seq_len / CP tokens on the GPU, TP t, and
sequence parallelism (SP) sharding the tensors outside the TP region by t:

- two norm inputs (2 B x T h each, the residual stream) and the norm outputs, which are the inputs
  of the QKV and fc1 GEMMs;
- Q, K and V (q_dim + 2 kv_dim columns: GQA/MQA keep kv_heads x head_dim; MLA keeps its latents
  and the per-head K and V of the up-projection);
- attention: FlashAttention-style kernels keep only the softmax log-sum-exp (4 B per head and
  token) and the output O; an unfused kernel keeps the s x s softmax output (2 B), and with
  dropout its mask (1 B) and output (2 B) -- Korthikanti et al.'s 5 a s^2 b;
- the output-projection input (O);
- the MLP: fc1 output (2 x ffn for gated SwiGLU/GeGLU, ffn otherwise) and the activation output
  that feeds fc2; MoE layers keep the router logits and probabilities (fp32, T x E), the
  dispatched token rows (T x top-k x capacity factor) entering the experts, the experts' fc1 and
  activation outputs, and the expert outputs for the weighted combine; shared experts as a
  dense MLP of their width;
- dropout masks (1 B x T h, two per layer) when dropout is on.

GEMM inputs that an fp8 GEMM consumes are kept as its fp8 copy (1 B; block and MXFP8 recipes add
one scale per 128 or 32 elements) instead of 16 bits; attention stays in bf16. For GPT blocks
(4h GELU MLP, multi-head attention, dropout, unfused attention, 16 bits) the sum is exactly
Korthikanti et al. 2022 (arXiv:2205.05198, sec. 4 and Table 2): s b h (34 + 5 a s / h) per layer,
(10 + 24/t + 5 a s/(h t)) with TP, (34 + 5 a s / h) / t with TP + SP (tests reproduce it).

Recomputation: ``full`` keeps only the layer input (2 B x T h, / t with SP); ``--recompute-layers
N`` does that for N layers of each model chunk; ``selective`` drops the tensors of the recomputed
modules (``core_attn`` -- Korthikanti's selective recomputation -- ``mlp``, ``moe``, ``moe_act``,
``shared_experts``, ``layernorm``, ``mla_up_proj``, as Megatron-Core's --recompute-modules).
A fully recomputed layer's activations exist again during its backward (one layer's worth).
Offloaded layers (``--offload-activations N``) keep their saved tensors in host memory; one
layer's worth stays on the GPU as the copy buffer.

Pipeline: rank r holds ``pipeline.in_flight_chunks`` chunk-micro-batches of activations (p - r
micro-batches under 1F1B; the interleaved schedule's warm-up under --vp, each forward counted with
its own chunk's activations, ``pipeline.in_flight_per_chunk``), which for rank 0 and even stages is
Korthikanti's L (1 + (p - 1)/(p v)) layers. The last rank also holds one micro-batch's fp32
logits, 4 s b V / t (and a rank with MTP layers their logits too). An MTP layer (DeepSeek-V3 sec.
2.2) keeps a layer of the last layer's kind plus its two normed inputs and their concatenation;
it holds that layer's parameters and the 2h x h projection, and copies of the embedding and LM
head where its stage does not hold them.
"""
from __future__ import annotations

from servesim.costmodel.memory import GiB

from .pipeline import in_flight_chunks, in_flight_per_chunk, pipeline_chunks

# CUDA context, NCCL buffers and the allocator's fragmentation outside the tensors counted here
# (vLLM and PyTorch report ~0.5-1.5 GiB of such "non-torch memory" on H100; vLLM docs, "Conserving Memory")
RUNTIME_RESERVE_BYTES = 1.0 * GiB
BYTES_16 = 2.0
# MoE capacity factor for the dispatched rows: dropless routing (Megatron-Core's default,
# --moe-expert-capacity-factor unset) sizes them by the routed tokens, i.e. 1.0 when balanced.
CAPACITY_FACTOR = 1.0


def fp8_element_bytes(lay) -> float:
    """Bytes per element of an fp8 copy: 1, plus its scales (block: fp32 per 1x128 tile, DeepSeek-V3
    sec. 3.3.2; MXFP8: one E8M0 byte per 32 elements, OCP MX spec v1.0)."""
    if lay.fp8_recipe == "block":
        return 1.0 + 4.0 / 128.0
    if lay.fp8_recipe == "mxfp8":
        return 1.0 + 1.0 / 32.0
    return 1.0


def _attention_kernel(lay) -> str:
    if lay.attention is not None:
        return lay.attention
    from .framework import load_framework
    return load_framework(lay.framework).attention


def layer_activation_parts(model, lay, moe_layer: bool = False) -> dict[str, float]:
    """Saved bytes of one layer for one micro-batch on one GPU, by tensor group, without recomputation
    (see the module docstring for what each group is)."""
    from .flops import attn_dims
    t = lay.tp
    sp = lay.sp and t > 1
    sh = t if sp else 1
    T = lay.micro_batch * lay.seq_len / lay.cp
    h = model.hidden_size
    a = BYTES_16
    g = fp8_element_bytes(lay) if lay.dtype == "fp8" else a
    heads = model.num_attention_heads
    d_qk, d_v = attn_dims(model)
    flash = _attention_kernel(lay) != "unfused"
    p = {"norm_in": 2.0 * a * T * h / sh, "norm_out": 2.0 * g * T * h / sh}
    if model.mla is not None:
        m = model.mla
        lat = (m.kv_lora_rank + m.qk_rope_head_dim) * a + m.kv_lora_rank * g
        if m.q_lora_rank > 0:
            lat += m.q_lora_rank * (a + g)
        p["mla_latent"] = T * lat / sh
        p["qkv"] = a * T * heads * (2 * d_qk + d_v) / t
    else:
        p["qkv"] = a * T * (model.q_dim + 2 * model.kv_dim) / t
    if flash:
        p["attn_core"] = 4.0 * T * heads / t  # log-sum-exp, fp32
        if lay.dtype == "fp8":
            p["attn_core"] += a * T * heads * d_v / t  # O, kept by the kernel besides the fp8 copy below
    else:
        s_q, s_kv = lay.seq_len / lay.cp, float(lay.seq_len)
        p["attn_core"] = lay.micro_batch * heads / t * s_q * s_kv * (5.0 if lay.dropout else 2.0)
    p["proj_in"] = g * T * heads * d_v / t
    if lay.dropout:
        p["dropout"] = 2.0 * T * h / sh
    up = 2 if model.gated_mlp else 1
    if not moe_layer:
        f = model.ffn_hidden_size
        p["mlp_hidden"] = a * T * up * f / t
        p["mlp_act"] = g * T * f / t
        return p
    moe = model.moe
    rows = T * moe.experts_per_token * CAPACITY_FACTOR
    fe = moe.expert_ffn_hidden_size
    p["moe_router"] = 2.0 * 4.0 * T * moe.num_experts / sh
    p["moe_in"] = g * rows * h
    p["moe_hidden"] = a * rows * up * fe / t
    p["moe_act"] = g * rows * fe / t
    p["moe_out"] = a * rows * h
    if moe.num_shared_experts > 0:
        fs = moe.num_shared_experts * moe.shared_expert_ffn_hidden_size
        p["shared_hidden"] = a * T * up * fs / t
        p["shared_act"] = g * T * fs / t
        if lay.dtype == "fp8":
            p["shared_in"] = g * T * h / sh
    return p


# tensor groups each --recompute-modules entry (and each module of a MaxText remat policy) recomputes
# instead of keeping
MODULE_PARTS = {
    "core_attn": ("attn_core",),
    "mlp": ("mlp_hidden", "mlp_act"),
    "moe": ("moe_router", "moe_in", "moe_hidden", "moe_act", "moe_out", "shared_hidden", "shared_act", "shared_in"),
    "moe_act": ("moe_act",),
    "shared_experts": ("shared_hidden", "shared_act", "shared_in"),
    "layernorm": ("norm_out",),
    "mla_up_proj": ("qkv",),
    "context": ("attn_core", "proj_in"),
    "mlp_fc1": ("mlp_hidden", "mlp_act", "moe_hidden", "moe_act", "shared_hidden", "shared_act"),
    "mlp_act": ("mlp_act", "moe_act", "shared_act"),
    "qkv_proj": ("qkv", "mla_latent"),
    "out_proj": (),
}


def op_sac_bytes(model, lay, moe_layer: bool) -> float:
    """Saved bytes of one layer under torchtitan's per-op selective checkpointing: the block input,
    and the outputs of the saved ops -- matmuls except every second one (wq, wv, w1, w2 kept; wk, wo,
    w3 recomputed for a gated MLP; w2 recomputed for a plain one), SDPA (O and its log-sum-exp) and
    the reduce-scatters of the TP plan; norms, rope and activations are recomputed. A matmul output
    under TP is the local one: wq / wv / w1 a column shard of the full sequence, w2 the full-width
    partial sum before its reduce-scatter. MoE layers keep their router and dispatch tensors and half
    of the expert hiddens."""
    parts = layer_activation_parts(model, lay, moe_layer)
    t = lay.tp
    sp = lay.sp and t > 1
    T = lay.micro_batch * lay.seq_len / lay.cp
    h = model.hidden_size
    a = BYTES_16
    kept = parts["norm_in"] / 2.0 + parts["attn_core"] + parts["proj_in"]
    if model.mla is not None:
        kept += parts["qkv"] + parts.get("mla_latent", 0.0)
    else:
        kept += a * T * (model.q_dim + model.kv_dim) / t
    if sp:
        kept += 2.0 * a * T * h / t   # reduce-scatter outputs of wo and w2
    if moe_layer:
        for name in ("moe_router", "moe_in", "moe_out", "shared_in"):
            kept += parts.get(name, 0.0)
        kept += 0.5 * (parts["moe_hidden"] + parts.get("shared_hidden", 0.0))
        return kept
    if model.gated_mlp:
        kept += parts["mlp_hidden"] / 2.0 + a * T * h   # w1 out; w2 out (full width, before any reduce-scatter)
    else:
        kept += parts["mlp_hidden"]                     # w1 out (w2, the second matmul of the MLP, recomputed)
    return kept


def layer_input_bytes(model, lay) -> float:
    """What a fully recomputed layer keeps: its input, 2 B x T h (/ t with SP)."""
    T = lay.micro_batch * lay.seq_len / lay.cp
    sh = lay.tp if (lay.sp and lay.tp > 1) else 1
    return BYTES_16 * T * model.hidden_size / sh


def activation_bytes_per_layer(model, lay, moe_layer: bool = False, full: bool | None = None) -> float:
    """Saved bytes of one layer and micro-batch under the layout's recomputation (``full`` forces
    full recomputation on or off for this layer)."""
    if full is None:
        full = lay.recompute == "full" and lay.recompute_layers is None
    if full:
        return layer_input_bytes(model, lay)
    if lay.op_sac:
        return op_sac_bytes(model, lay, moe_layer)
    parts = layer_activation_parts(model, lay, moe_layer)
    dropped = {name for mod in lay.modules for name in MODULE_PARTS[mod]}
    return sum(v for k, v in parts.items() if k not in dropped)


def layer_recompute_flags(lay, chunk_layers: int) -> list[bool]:
    """Which layers of a chunk are fully recomputed (Megatron's block method: the first N;
    torchtitan's per-layer selective checkpointing: every N-th, counted from 1)."""
    if lay.layer_sac:
        return [(i + 1) % lay.layer_sac == 0 for i in range(chunk_layers)]
    if lay.recompute != "full":
        return [False] * chunk_layers
    n = chunk_layers if lay.recompute_layers is None else min(lay.recompute_layers, chunk_layers)
    return [i < n for i in range(chunk_layers)]


def chunk_activation_bytes(model, lay, chunk) -> tuple[float, float, float]:
    """(bytes kept on the GPU, bytes offloaded to the host, largest single layer without
    recomputation) of one chunk for one micro-batch."""
    flags = layer_recompute_flags(lay, len(chunk.layers))
    gpu = host = 0.0
    largest = 0.0
    cache = {}
    for j, i in enumerate(chunk.layers):
        kind = model.is_moe_layer(i)
        key = (kind, flags[j])
        if key not in cache:
            cache[key] = activation_bytes_per_layer(model, lay, kind, full=flags[j])
        b = cache[key]
        if j < lay.offload_layers:
            host += b
        else:
            gpu += b
        if ("raw", kind) not in cache:
            cache[("raw", kind)] = sum(layer_activation_parts(model, lay, kind).values())
        largest = max(largest, cache[("raw", kind)])
    if chunk.mtp:
        kind = model.is_moe_layer(model.num_layers - 1)
        gpu += chunk.mtp * (activation_bytes_per_layer(model, lay, kind) + 2.0 * layer_input_bytes(model, lay))
    return gpu, host, largest


def stage_params(model, lay, chunks) -> tuple[float, float, float, float]:
    """(dense, expert, largest layer's dense, largest layer's expert) parameters of one rank's
    chunks before TP/EP sharding; the embedding / LM head count as layers for the largest."""
    dense = expert = 0.0
    big_d = big_e = 0.0
    for ch in chunks:
        for i in ch.layers:
            d, e = _layer_params(model, i)
            dense += d
            expert += e
            if d + e > big_d + big_e:
                big_d, big_e = d, e
        if ch.embedding:
            emb = model.embedding_params()
            dense += emb
            big_d, big_e = (emb, 0.0) if emb > big_d + big_e else (big_d, big_e)
        if ch.loss:
            head = model.lm_head_params() + model.final_norm_params()
            if lay.pp > 1 and model.tied_embeddings:
                head += model.vocab_size * model.hidden_size  # a copy of the tied embedding (Megatron)
            dense += head
            big_d, big_e = (head, 0.0) if head > big_d + big_e else (big_d, big_e)
        if ch.mtp:
            d, e = _layer_params(model, model.num_layers - 1)
            d += 2 * model.hidden_size * model.hidden_size + 2 * model.hidden_size  # projection, two norms
            copies = (0 if ch.embedding else model.embedding_params()) + (
                0 if ch.loss else model.vocab_size * model.hidden_size)
            dense += ch.mtp * d + copies
            expert += ch.mtp * e
    return dense, expert, big_d, big_e


def _layer_params(model, i: int) -> tuple[float, float]:
    """(dense, expert) parameters of layer i."""
    d = model.attn_params_per_layer() + model.norm_params_per_layer()
    if model.is_moe_layer(i):
        return d + model.shared_expert_params() + model.router_params(), model.moe.num_experts * model.expert_params()
    return d + model.dense_mlp_params(), 0.0


def local_params(model, lay, rank: int = 0) -> tuple[float, float]:
    """(dense, expert) parameters on one GPU of pipeline rank ``rank``: dense / TP, experts / (TP x EP)."""
    chunks = pipeline_chunks(model, lay)[rank]
    dense, expert, _, _ = stage_params(model, lay, chunks)
    return dense / lay.tp, expert / (lay.tp * lay.ep)


def rank_memory(model, hw, lay, fw, rank: int, chunks) -> dict[str, float]:
    """Bytes per GPU of pipeline rank ``rank``, per part (``lay`` resolved)."""
    dense, expert, big_d, big_e = stage_params(model, lay, chunks)
    pd_, pe = dense / lay.tp, expert / (lay.tp * lay.ep)
    n_dense, _, n_exp, _ = lay.shard_groups()

    def shard(x_d, x_e, on):
        return x_d / (n_dense if on else 1) + x_e / (n_exp if on else 1)

    z = lay.zero
    parts = {
        "weights": BYTES_16 * shard(pd_, pe, z >= 3),
        "gradients": fw.grad_bytes * shard(pd_, pe, z >= 2),
        "optimizer": 12.0 * shard(pd_, pe, z >= 1),
    }
    gathered = 0.0
    fp8 = lay.dtype == "fp8"
    fp8_copies = (pd_ + pe) if (fp8 and fw.fp8_weight_cache) else 0.0
    if z >= 3:
        layer_local = big_d / lay.tp + big_e / (lay.tp * lay.ep)
        if lay.reshard_after_forward == "never":
            live = pd_ + pe   # every local layer stays gathered from its forward to its backward
        else:
            live = (1 + lay.fsdp_prefetch) * layer_local
        if fw.zero3_live_params > 0:
            live = min(live, fw.zero3_live_params)
        gather_bytes = 1.0 if lay.fp8_all_gather else lay.fsdp_param_bytes
        gathered = live * gather_bytes + 2.0 * min(layer_local, live) * fw.grad_bytes
        # fp8 copies exist only of the gathered layers (the weights are gathered, then cast, per layer);
        # gathered in fp8 they are the gathered tensors themselves
        fp8_copies = live if (fp8 and not lay.fp8_all_gather) else 0.0
    parts["gathered_params"] = gathered
    parts["fp8_weight_cache"] = fp8_copies
    m = lay.num_microbatches
    flights = in_flight_per_chunk(lay, rank, m)
    per_chunk = [chunk_activation_bytes(model, lay, c) for c in chunks]
    largest = max(x[2] for x in per_chunk)
    parts["activations"] = sum(f * x[0] for f, x in zip(flights, per_chunk))
    # the layer being recomputed in its backward, or the offload copy buffer
    parts["recompute_buffer"] = largest if (lay.recompute == "full" or lay.offload_layers > 0 or lay.op_sac
                                            or lay.layer_sac) else 0.0
    parts["activations_offloaded_host"] = sum(f * x[1] for f, x in zip(flights, per_chunk))
    heads = sum(int(c.loss) + c.mtp for c in chunks)
    parts["logits"] = heads * 4.0 * (lay.seq_len / lay.cp) * lay.micro_batch * model.vocab_size / lay.tp
    parts["reserve"] = RUNTIME_RESERVE_BYTES
    parts["total"] = sum(v for k, v in parts.items() if k != "activations_offloaded_host")
    return parts


def memory_by_rank(model, hw, lay, fw=None) -> list[dict[str, float]]:
    """``rank_memory`` of every pipeline rank (``lay`` resolved)."""
    from .framework import load_framework
    fw = fw or load_framework(lay.framework)
    chunks = pipeline_chunks(model, lay)
    out = []
    cache = {}
    for r, ch in enumerate(chunks):
        key = (tuple((c.layers[0] if (c.layers and model.moe is not None) else -1, len(c.layers), c.embedding,
                      c.loss, c.mtp) for c in ch), in_flight_chunks(lay, r, lay.num_microbatches))
        if key not in cache:
            cache[key] = rank_memory(model, hw, lay, fw, r, ch)
        out.append(cache[key])
    return out


def memory_per_gpu(model, hw, lay, fw=None) -> dict[str, float]:
    """Bytes per GPU, per part, of the fullest pipeline rank (``stage`` = its index)."""
    from .layout import resolve_layout
    lay = resolve_layout(lay, hw, fw)
    ranks = memory_by_rank(model, hw, lay, fw)
    r = max(range(len(ranks)), key=lambda i: ranks[i]["total"])
    out = dict(ranks[r])
    out["stage"] = float(r)
    return out


def as_gib(parts: dict[str, float]) -> dict[str, float]:
    return {k: v / GiB for k, v in parts.items() if k != "stage"}
