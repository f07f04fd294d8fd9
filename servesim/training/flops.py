"""GEMM shapes and FLOPs of one transformer layer, and the model-FLOPs formula used for MFU.

Shapes follow the Megatron-LM tensor-parallel split (Shoeybi et al. 2019, sec. 3): QKV and MLP-up
are column-parallel (output width / TP), attention-out and MLP-down row-parallel (input width / TP).
MoE experts (Lepikhin et al. 2020; Mixtral) run the routed tokens: with EP ranks each GPU holds
E/EP experts and receives, for balanced routing, T x top_k token-rows in total.
MLA (DeepSeek-V2, sec. 2.1) projections are listed in their training (non-absorbed) form.
"""
from __future__ import annotations


def attn_dims(model) -> tuple[int, int]:
    """(d_qk, d_v) per head."""
    if model.mla is not None:
        return model.mla.qk_nope_head_dim + model.mla.qk_rope_head_dim, model.mla.v_head_dim
    return model.head_dim, model.head_dim


def attention_gemms(model, tokens: float, tp: int) -> list[tuple[float, float, float, float]]:
    """Forward GEMMs of the attention block on one GPU: (count, m, k, n)."""
    h, heads = model.hidden_size, model.num_attention_heads
    if model.mla is not None:
        m = model.mla
        d_qk, d_v = attn_dims(model)
        out = []
        if m.q_lora_rank > 0:
            out += [(1, tokens, h, m.q_lora_rank), (1, tokens, m.q_lora_rank, heads * d_qk / tp)]
        else:
            out += [(1, tokens, h, heads * d_qk / tp)]
        out += [(1, tokens, h, m.kv_lora_rank + m.qk_rope_head_dim),
                (1, tokens, m.kv_lora_rank, heads * (m.qk_nope_head_dim + d_v) / tp),
                (1, tokens, heads * d_v / tp, h)]
        return out
    return [(1, tokens, h, (model.q_dim + 2 * model.kv_dim) / tp), (1, tokens, model.q_dim / tp, h)]


def _mlp(model, tokens: float, ffn: float, tp: int, count: float = 1) -> list:
    h = model.hidden_size
    up = (2 if model.gated_mlp else 1) * ffn / tp
    return [(count, tokens, h, up), (count, tokens, ffn / tp, h)]


def ffn_gemms(model, moe_layer: bool, tokens: float, tp: int, ep: int) -> list:
    """Forward GEMMs of the FFN block on one GPU: (count, m, k, n)."""
    if not moe_layer:
        return _mlp(model, tokens, model.ffn_hidden_size, tp)
    moe = model.moe
    local = moe.num_experts / ep
    m_e = tokens * moe.experts_per_token / local  # rows per local expert (balanced routing)
    out = [(1, tokens, model.hidden_size, moe.num_experts)]  # router, replicated
    out += _mlp(model, m_e, moe.expert_ffn_hidden_size, tp, count=local)
    if moe.num_shared_experts > 0:
        out += _mlp(model, tokens, moe.num_shared_experts * moe.shared_expert_ffn_hidden_size, tp)
    return out


def layer_gemms(model, moe_layer: bool, tokens: float, tp: int = 1, ep: int = 1) -> list:
    return attention_gemms(model, tokens, tp) + ffn_gemms(model, moe_layer, tokens, tp, ep)


def gemm_flops(gemms) -> float:
    return sum(2.0 * c * m * k * n for c, m, k, n in gemms)


def attention_core_flops(model, seq_len: int, causal: bool) -> float:
    """Forward QK^T and AV FLOPs per token per layer, all heads: 2 s (d_qk + d_v) x heads
    (non-causal); causal masking skips half the pairs (FlashAttention, Dao 2022)."""
    d_qk, d_v = attn_dims(model)
    f = 2.0 * seq_len * (d_qk + d_v) * model.num_attention_heads
    return f / 2.0 if causal else f


def mfu_params(model) -> float:
    """N in 6N: active parameters that enter a matmul: everything but the input embedding
    lookup (and learned positions), plus the LM head even when tied to the embedding."""
    n = model.active_param_count() - model.embedding_params()
    if model.tied_embeddings:
        n += model.vocab_size * model.hidden_size
    return float(n)


def mtp_params(model) -> float:
    """Matmul parameters of one multi-token-prediction layer (DeepSeek-V3 sec. 2.2), active per
    token: a layer of the last layer's kind, the 2h x h projection and the shared LM head."""
    h = model.hidden_size
    last = model.num_layers - 1
    n = model.attn_params_per_layer() + 2 * h * h + model.vocab_size * h
    if model.is_moe_layer(last):
        m = model.moe
        n += m.experts_per_token * model.expert_params() + model.shared_expert_params() + model.router_params()
    else:
        n += model.dense_mlp_params()
    return float(n)


def model_flops_per_token(model, seq_len: int, mtp_layers: int = 0) -> float:
    """MFU FLOPs per token: 6N + 3 x (non-causal attention) = 6N + 12 L s d_attn for d_qk = d_v
    (Kaplan et al. 2020 sec. 2.1; PaLM, Chowdhery et al. 2022, appendix B: 6N + 12LHQT).
    Non-causal, as PaLM and Megatron-LM count it; no recomputation. MTP layers trained beside the
    model (a pipeline layout's m) count as layers (``mtp_params``), as Megatron-Core counts them."""
    layers = model.num_layers + mtp_layers
    return (6.0 * (mfu_params(model) + mtp_layers * mtp_params(model))
            + 3.0 * layers * attention_core_flops(model, seq_len, causal=False))


def hardware_flops_per_token(model, seq_len: int, mtp_layers: int = 0) -> float:
    """The FLOPs the GPUs execute per token without recomputation, for HFU: as ``model_flops_per_token``
    but causal attention counted as computed, half the pairs (FlashAttention skips the masked blocks,
    Dao 2022), so 6N + 6 L s d_attn."""
    layers = model.num_layers + mtp_layers
    return (6.0 * (mfu_params(model) + mtp_layers * mtp_params(model))
            + 3.0 * layers * attention_core_flops(model, seq_len, causal=True))


def counted_flops_per_token(model, seq_len: int) -> float:
    """The same quantity built bottom-up from the GEMM shapes the step model prices (TP = 1):
    3 x forward (backward = 2 x forward; Kaplan et al. 2020) over layers + LM head + attention."""
    per = 0.0
    for i in range(model.num_layers):
        per += gemm_flops(layer_gemms(model, model.is_moe_layer(i), 1.0))
    per += 2.0 * model.hidden_size * model.vocab_size
    return 3.0 * per + 3.0 * model.num_layers * attention_core_flops(model, seq_len, causal=False)
