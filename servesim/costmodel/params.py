"""Lowering: (model, hardware, layout, engine profile) -> CostParams, plain floats and float64 arrays.

Done once per configuration; the jitted step-cost function sees only this bundle. Silicon figures
come from the hardware profile (peaks, bandwidths, links, elementwise and NCCL efficiencies); the
engine's kernel efficiencies, its all-reduce, CUDA graphs and host time from the engine profile's
fit for this hardware (``EngineProfile.fit_for``).
"""
from __future__ import annotations

from dataclasses import dataclass
import numpy as np

from ..errors import ConfigError, InfeasibleError
from . import collectives, elementwise
from . import ep as ep_model
from .graphs import GRAPH_FULL, GRAPH_FULL_AND_PIECEWISE, GRAPH_MODES, GRAPH_NONE, GRAPH_PIECEWISE  # noqa: F401
from .dtypes import (BYTES, WEIGHT_ONLY_EXTRA_LATENCY_US, activation_bytes, check_dtype, compute_dtype,
                     kv_dtype_resolved, weight_only)
from .features import features
from .fields import CostParams, table
from .moe_tiles import tile_table
from .memory import GiB, kv_bytes_per_token_layer, kv_heads_per_gpu, weight_bytes_per_gpu, weight_bytes_per_param


@dataclass(frozen=True)
class Layout:
    tp: int = 1
    pp: int = 1
    dtype: str = "bf16"
    kv_dtype: str = "auto"
    allreduce: str = "auto"
    ep: int = 1                  # expert parallelism of the MoE layers (costmodel/ep.py)
    attn_dp: int = 1             # data-parallel attention ranks, each a TP group of tp GPUs
    expert_skew: float | None = None   # routing: 0 balanced, alpha > 0 power law; None: the model's default

    @property
    def gpus(self) -> int:
        """GPUs of one replica: tp x attn_dp per pipeline stage."""
        return self.tp * self.attn_dp * self.pp


def check_layout(model, hw, layout: Layout) -> None:
    tp, pp = layout.tp, layout.pp
    if tp < 1 or pp < 1:
        raise ConfigError(f"--tp/--pp must be >= 1, got tp={tp} pp={pp}")
    if model.num_attention_heads % tp:
        ok = [d for d in range(1, model.num_attention_heads + 1) if model.num_attention_heads % d == 0 and d <= 64]
        raise InfeasibleError(
            f"--tp {tp} does not divide the {model.num_attention_heads} attention heads of {model.name}; "
            f"use one of {', '.join(map(str, ok))}")
    kv = model.num_kv_heads
    if model.mla is None and kv % tp and tp % kv:
        raise InfeasibleError(
            f"--tp {tp} neither divides nor is a multiple of the {kv} KV heads of {model.name}")
    if pp > model.num_layers:
        raise InfeasibleError(f"--pp {pp} exceeds the {model.num_layers} layers of {model.name}")
    check_ep(model, layout)
    if layout.allreduce not in collectives.ALGORITHMS:
        raise ConfigError(f"--allreduce: unknown value {layout.allreduce!r}; use ring, tree or auto")
    check_dtype(layout.dtype, hw.name, hw.peak_flops)


def check_ep(model, layout: Layout) -> None:
    """Expert parallelism and DP attention: a MoE model, EP dividing the experts and the replica's
    tp x attn_dp GPUs (each expert's FFN then split over tp x attn_dp / ep of them)."""
    ep, dp = layout.ep, layout.attn_dp
    if ep < 1 or dp < 1:
        raise ConfigError(f"--ep/--attn-dp must be >= 1, got ep={ep} attn-dp={dp}")
    if ep == 1 and dp == 1:
        return
    if model.moe is None:
        raise InfeasibleError(f"--ep {ep} --attn-dp {dp}: {model.name} has no experts; expert parallelism and "
                              "DP attention are for MoE models (use --replicas for data parallelism)")
    e = model.moe.num_experts
    if e % ep:
        ok = [d for d in range(1, e + 1) if e % d == 0 and d <= 512]
        raise InfeasibleError(f"--ep {ep} does not divide the {e} experts of {model.name}; use one of "
                              f"{', '.join(map(str, ok))}")
    if (layout.tp * dp) % ep:
        raise InfeasibleError(f"--ep {ep} must divide the replica's --tp x --attn-dp = {layout.tp} x {dp} = "
                              f"{layout.tp * dp} GPUs (each expert on tp x attn-dp / ep of them)")


def check_weights_fit(model, hw, layout: Layout, gpu_memory_utilization: float = 1.0) -> None:
    w = weight_bytes_per_gpu(model, layout.tp, layout.pp, layout.dtype, layout.ep, layout.attn_dp)
    cap = hw.device_bytes * gpu_memory_utilization
    if w < cap:
        return
    hint = ""
    for tp in (2, 4, 8, 16, 32, 64):
        if tp > layout.tp and model.num_attention_heads % tp == 0 and \
                weight_bytes_per_gpu(model, tp, layout.pp, layout.dtype) < cap:
            hint = f"; use --tp {tp} or more" + (" (or a larger --pp / smaller --dtype)")
            break
    else:
        hint = "; use more pipeline stages (--pp) or a smaller --dtype"
    if layout.ep > 1 or layout.attn_dp > 1:
        hint = "; use a larger --ep (experts over more GPUs), --pp or a smaller --dtype"
    raise InfeasibleError(
        f"{model.name} {layout.dtype} needs {w / GiB:.1f} GiB of weights per GPU at TP={layout.tp} PP={layout.pp}"
        + (f" EP={layout.ep} attn-DP={layout.attn_dp}" if layout.ep > 1 or layout.attn_dp > 1 else "") + "; "
        f"{hw.name} holds {hw.device_bytes / GiB:.1f} GiB" +
        (f" ({cap / GiB:.1f} GiB at --gpu-memory-utilization {gpu_memory_utilization:g})"
         if gpu_memory_utilization < 1.0 else "") + hint)


def attention_kernel_params(fit, kv_dtype: str, mla: bool) -> dict:
    """The attention keys a model's kernels run with (fractions, block overhead, seconds): the engine's
    generic attention fit, or for an MLA model its MLA fit (``mla_*``; the fp8-cache decode fractions
    for an fp8 KV cache). A table without MLA keys prices MLA with the generic ones (decode compute at
    the prefill fraction), which ``engine.carried_terms`` then reports."""
    if mla and fit.mla_decode_hbm_fraction > 0.0:
        fp8 = kv_dtype == "fp8"
        return {"dec_max": fit.mla_decode_fp8_max if fp8 else fit.mla_decode_max,
                "dec_hbm": fit.mla_decode_fp8_hbm_fraction if fp8 else fit.mla_decode_hbm_fraction,
                "dec_block": fit.mla_decode_block_s, "dec_latency": fit.mla_decode_latency_s,
                "pf_max": fit.mla_prefill_max, "pf_hbm": fit.mla_prefill_hbm_fraction,
                "pf_block": fit.mla_prefill_block_overhead, "pf_latency": fit.mla_prefill_latency_s}
    return {"dec_max": fit.attn_prefill_max, "dec_hbm": fit.attn_decode_hbm_fraction,
            "dec_block": fit.attn_decode_block_s, "dec_latency": fit.attn_decode_latency_s,
            "pf_max": fit.attn_prefill_max, "pf_hbm": fit.attn_prefill_hbm_fraction,
            "pf_block": fit.attn_prefill_block_overhead, "pf_latency": fit.attn_prefill_latency_s}


def _arr(xs):
    return np.asarray(xs, dtype=np.float64).reshape(-1)


# The per-layer cost tables cover forwards of up to this many tokens; larger ones are computed directly.
TABLE_MAX_TOKENS = 16384


def lower(model, hw, layout: Layout, engine, max_num_seqs: int = 256, max_tokens: int = 8192) -> CostParams:
    """Lower (model, hardware, layout, engine profile) to the plain bundle the jitted cost sees.
    ``max_num_seqs`` sets the engine's largest captured CUDA-graph batch; ``max_tokens`` (the token
    budget per step) the length of the per-layer cost tables."""
    check_layout(model, hw, layout)
    fit = engine.fit_for(hw)
    tp, pp = layout.tp, layout.pp
    eff = hw.efficiency
    kv_dtype = kv_dtype_resolved(layout.kv_dtype, layout.dtype)
    cd = compute_dtype(layout.dtype, hw.peak_flops)
    h = float(model.hidden_size)
    heads = model.num_attention_heads / tp
    gated = 2.0 if model.gated_mlp else 1.0
    if model.mla is not None:
        m = model.mla
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        q_in = m.q_lora_rank if m.q_lora_rank > 0 else h
        attn_k = [h, q_in, m.kv_lora_rank, heads * m.v_head_dim]
        attn_n = [m.q_lora_rank + m.kv_lora_rank + m.qk_rope_head_dim, heads * qk,
                  heads * (m.qk_nope_head_dim + m.v_head_dim), h]
        q_width = heads * qk
        rope_width = (heads + 1) * m.qk_rope_head_dim   # per-head rope part of q + the shared rope key
        latent_norms = ([m.q_lora_rank] if m.q_lora_rank > 0 else []) + [m.kv_lora_rank]
        flops_pair = 2.0 * heads * (qk + m.v_head_dim)
        # absorbed decode: scores over the latent + rope key, values over the latent (DeepSeek-V2 app. C)
        flops_kv_decode = 2.0 * heads * (2 * m.kv_lora_rank + m.qk_rope_head_dim)
    else:
        hd = model.head_dim
        kvh = kv_heads_per_gpu(model, tp)
        attn_k = [h, heads * hd]
        attn_n = [(heads + 2 * kvh) * hd, h]
        q_width = heads * hd
        rope_width = (heads + kvh) * hd
        latent_norms = []
        flops_pair = 4.0 * heads * hd       # QK^T and PV, 2 FLOPs per MAC
        flops_kv_decode = 4.0 * heads * hd
    f = model.ffn_hidden_size
    mlp_k, mlp_n = [h, f / tp], [gated * f / tp, h]
    sh_k, sh_n = [], []
    experts = top_k = router_n = exp_inter = 0.0
    tiles = (np.zeros(0), np.zeros(0), np.zeros(0), np.zeros(0), False)
    f_act = f
    skew = (np.zeros(0), np.zeros(0), np.zeros(0))
    ep, dp = layout.ep, layout.attn_dp
    if model.moe is not None:
        moe = model.moe
        fe = moe.expert_ffn_hidden_size
        exp_inter = fe / (tp * dp // ep if ep > 1 else tp)    # each expert over moe_tp = tp x attn_dp / ep GPUs
        if ep > 1:
            alpha = ep_model.default_skew(model) if layout.expert_skew is None else layout.expert_skew
            skew = ep_model.skew_table(moe.num_experts, moe.experts_per_token, ep, alpha,
                                       max(max_tokens, max_num_seqs, 1) * dp)
        # all shared experts as one MLP of n_shared x their width (HF DeepseekV3MoE, Llama4TextMoe)
        fs = moe.num_shared_experts * (moe.shared_expert_ffn_hidden_size or fe)
        if fs > 0:
            sh_k, sh_n = [h, fs / tp], [gated * fs / tp, h]
        experts, top_k, router_n = float(moe.num_experts), float(moe.experts_per_token), float(moe.num_experts)
        f_act = fe * moe.experts_per_token + fs
        # the tuned Triton tiles serve 16-bit experts; vLLM 0.15.1 runs W8A8 fp8 MoE with per-channel
        # weights through its CUTLASS grouped GEMM on Hopper (fused_moe/oracle/fp8.py), tiles not known
        if layout.dtype in ("bf16", "fp16"):
            tiles = tile_table(engine, hw.name, "16bit", moe.num_experts // ep, int(round(exp_inter)))
    qk_norms = (q_width, kv_heads_per_gpu(model, tp) * model.head_dim) if model.qk_norm else ()  # Qwen3, Llama-4
    elem = elementwise.layer_kernels(h, rope_width, f_act / tp, model.gated_mlp, latent_norms, qk_norms,
                                     fused_add_norm=engine.fused_add_norm)
    tp_link = collectives.link_for_group(hw, tp)
    pp_link = collectives.p2p_link(hw, tp * pp)
    n_moe = float(model.num_moe_layers) if model.moe is not None else 0.0
    active = model.active_param_count() - model.embedding_params()
    # the engine's own all-reduce runs inside the scale-up domain (vLLM's custom all-reduce needs
    # fully NVLink-connected GPUs); elsewhere, and above its size limit, NCCL over the group's link
    custom = engine.allreduce == "custom" and tp > 1 and tp_link[0] == "scaleup"
    graph_sizes = engine.cuda_graph.capture_sizes(max_num_seqs)
    gemms_layer = len(attn_k) + len(mlp_k) + (2 + len(sh_k) + 1 if model.moe is not None else 0)
    kernels_layer = gemms_layer + len(elem) + 1 + (2 if tp > 1 else 0)
    # W8A8 GEMMs (fp8, int8) run the engine's fp8 kernels (an activation quantisation each); others at 16 bits
    w8a8 = layout.dtype in ("fp8", "int8")
    moe_fp8 = w8a8 and cd in ("fp8", "int8")
    # the fixed time of each kernel, measured alone, is partly hidden behind its neighbours when a
    # step's kernels run back to back (launch and ramp overlap the previous kernel's tail)
    keep = 1.0 - fit.graph_overlap
    a2a = ep_model.alltoall_link(hw, ep)
    attn = attention_kernel_params(fit, kv_dtype, model.mla is not None)
    p = CostParams(
        tp=float(tp), pp=float(pp),
        peak=hw.peak_flops[cd], attn_peak=hw.peak_flops["bf16"], hbm_bw=hw.hbm_bw, sms=float(hw.sm_count),
        g_max=fit.gemm_fp8_max if w8a8 else fit.gemm_max,
        g_latency=keep * (fit.gemm_fp8_latency_s if w8a8 else fit.gemm_latency_s
                          + (WEIGHT_ONLY_EXTRA_LATENCY_US * 1e-6 if weight_only(layout.dtype) else 0.0)),
        g_wo=float(weight_only(layout.dtype)),
        # the activation quantisation of a W8A8 GEMM: its bytes per element at the weight-streaming rate
        g_quant=fit.gemm_fp8_quant_bytes / (hw.hbm_bw * fit.gemm_hbm_fraction) if w8a8 else 0.0,
        g16_max=fit.gemm_max, g16_latency=keep * fit.gemm_latency_s, g_hbm=fit.gemm_hbm_fraction,
        g_splitk=keep * fit.gemm_splitk_latency_s, g_tile_k=fit.gemm_tile_overhead_k,
        g_mem_latency=keep * fit.gemm_mem_latency_s,
        w_bytes=weight_bytes_per_param(layout.dtype), a_bytes=activation_bytes(layout.dtype), hidden=h,
        n_dense_layers=float(model.num_layers) - n_moe, n_moe_layers=n_moe,
        heads=heads, kv_heads=float(kv_heads_per_gpu(model, tp)), head_dim=float(model.head_dim),
        kv_elem_bytes=BYTES[kv_dtype], mla=float(model.mla is not None),
        kv_bytes_tok_layer=kv_bytes_per_token_layer(model, tp, kv_dtype),
        q_bytes_tok_layer=2.0 * 2.0 * q_width,
        attn_flops_pair=flops_pair, attn_flops_kv_decode=flops_kv_decode,
        attn_dec_split_seqs=fit.attn_decode_split_seqs, attn_dec_block_bw=fit.attn_decode_block_bw,
        attn_pf_max=attn["pf_max"], attn_pf_hbm=attn["pf_hbm"],
        attn_pf_block=attn["pf_block"], attn_pf_latency=keep * attn["pf_latency"],
        attn_dec_hbm=attn["dec_hbm"], attn_dec_block=attn["dec_block"],
        attn_dec_latency=keep * attn["dec_latency"], attn_dec_split=keep * fit.attn_decode_split_s,
        attn_dec_max=attn["dec_max"],
        mla_latent=float(model.mla.kv_lora_rank) if model.mla is not None else 0.0,
        mla_rope=float(model.mla.qk_rope_head_dim) if model.mla is not None else 0.0,
        mla_v=float(model.mla.v_head_dim) if model.mla is not None else 0.0,
        elem_s_tok_layer=elementwise.seconds_per_token(elem, hw.hbm_bw, elementwise.kind_fractions(eff)),
        elem_bytes_tok_layer=float(sum(b for _, b in elem)),
        elem_kernels=float(len(elem)), elem_latency=keep * eff.elementwise_latency_s,
        coll_base=eff.collective_base_latency_s,
        experts=experts, top_k=top_k, router_n=router_n,
        moe_eff=fit.moe_fp8_efficiency if moe_fp8 else fit.moe_efficiency,
        moe_latency=keep * (fit.moe_fp8_latency_s if moe_fp8 else fit.moe_latency_s), moe_pair=fit.moe_pair_s,
        moe_ridge=fit.moe_tile_ridge, moe_stream=fit.moe_stream_bytes,
        exp_inter=exp_inter, gated=float(model.gated_mlp),
        vocab_gpu=model.vocab_size / tp,
        tp_bw=tp_link[1], tp_alpha=tp_link[2], tp_algorithm=float(collectives.ALGORITHMS[layout.allreduce]),
        ar_custom=float(custom), ar_link_bw=hw.scaleup_bw, ar_frac=fit.allreduce_bw_fraction,
        ar_latency=keep * fit.allreduce_latency_s, ar_step=fit.allreduce_step_latency_s,
        ar_eager=fit.allreduce_eager_launch_s,
        ar_max_bytes=engine.allreduce_max_bytes(tp, hw),
        pp_bw=pp_link[1], pp_alpha=pp_link[2], pp_bw_large=pp_link[3], pp_large_bytes=pp_link[4],
        swap_bw=hw.pcie_bw * eff.pcie_bw_fraction, swap_alpha=eff.pcie_latency_s,
        step_gpu=fit.step_gpu_s, overhead=fit.host_step_s, overhead_seq=fit.host_per_seq_s, host_overlap=float(engine.host_overlap),
        graph_mode=float(GRAPH_MODES[engine.cuda_graph.mode]),
        graph_max=float(graph_sizes[-1]) if graph_sizes.size else 0.0,
        launch=fit.launch_s, kernels_layer=float(kernels_layer),
        active_params_gpu=active / (tp * pp) * 1.0,
        ep=float(ep), attn_dp=float(dp), ep_masked=float(engine.moe_ep_masked and dp == 1 and ep > 1),
        a2a_bw=a2a[0], a2a_alpha=a2a[1], a2a_bw_out=a2a[2], a2a_alpha_out=a2a[3], a2a_domain=a2a[4],
        a2a_dispatch_bytes=1.0 if layout.dtype in ("fp8", "int8", "fp4") else 2.0,
        attn_k=_arr(attn_k), attn_n=_arr(attn_n), mlp_k=_arr(mlp_k), mlp_n=_arr(mlp_n),
        sh_k=_arr(sh_k), sh_n=_arr(sh_n),
        moe_tile_keys=_arr(tiles[0]), moe_tile_m=_arr(tiles[1]), moe_tile_n=_arr(tiles[2]), moe_tile_k=_arr(tiles[3]),
        graph_sizes=np.ascontiguousarray(graph_sizes, dtype=np.float64),
        skew_grid=skew[0], skew_pairs=skew[1], skew_touched=skew[2],
        tab_gemm=np.zeros(0), tab_elem=np.zeros(0), tab_comm=np.zeros(0), tab_lm=np.zeros(0),
        tab_lm_bytes=np.zeros(0),
    )
    from .iteration import layer_tables_nb
    n_tab = min(max(int(max_tokens), int(max_num_seqs), 1), TABLE_MAX_TOKENS) + 1
    t = table(p)
    fs = features(t)
    tg, te, tc, tl, tlb = layer_tables_nb(t, fs.moe, fs.ep, fs.wo, n_tab)
    return p._replace(tab_gemm=tg, tab_elem=te, tab_comm=tc, tab_lm=tl, tab_lm_bytes=tlb)
