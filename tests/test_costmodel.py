"""Cost model: hand-derived counts, roofline limits, monotonicity, collectives, feasibility."""
import dataclasses
import math

import pytest

from servesim.config import list_hardware, list_models, load_hardware, load_model
from servesim.config.engine import load_engine
from servesim.costmodel import Batch, Layout, build_replica, lower
from servesim.costmodel.collectives import ring_allreduce_time_nb, tree_allreduce_time_nb
from servesim.costmodel.memory import kv_bytes_per_token_layer, weight_bytes_per_gpu
from servesim.errors import ConfigError, InfeasibleError

VLLM = load_engine("vllm")

TINY = """
name = "tiny"
source = "hand-written test model"
published_params_b = 0.0
num_layers = 2
hidden_size = 64
num_attention_heads = 4
num_kv_heads = 2
head_dim = 16
ffn_hidden_size = 128
activation = "silu"
gated_mlp = true
vocab_size = 100
tied_embeddings = false
max_context = 4096
rope_theta = 10000.0
position_embedding = "rope"
norm = "rmsnorm"
linear_bias = false
qkv_bias = false
"""


@pytest.fixture
def tiny(tmp_path):
    p = tmp_path / "tiny.toml"
    p.write_text(TINY)
    return load_model(str(p))


def test_tiny_param_count_by_hand(tiny):
    attn = 64 * 64 + 2 * 64 * 32 + 64 * 64          # q, k+v (2 kv heads x 16), o
    mlp = 3 * 64 * 128                               # gate, up, down
    per_layer = attn + mlp + 2 * 64                  # two RMSNorm weights
    total = 2 * per_layer + 64 + 2 * 100 * 64        # final norm, embedding, untied LM head
    assert tiny.param_count() == total


def test_tiny_iteration_flops_and_bytes_by_hand(tiny):
    hw = load_hardware("h100-sxm")
    rc = build_replica(tiny, hw, Layout())
    b = rc.iteration(Batch(decode=(10,)))
    non_embedding = 2 * (12288 + 24576 + 128) + 64 + 6400
    attn_flops = 2 * 10 * 4 * 4 * 16                 # layers x context x (QK^T + PV: 4 FLOPs/MAC pair) x heads x head_dim
    assert b.flops == pytest.approx(2 * non_embedding + attn_flops)
    kv_per_token_layer = 2 * 2 * 16 * 2              # K and V x kv heads x head_dim x bf16
    # bytes the step moves (issue #25): GEMM weights once (the norm gains are not priced) and their 16-bit
    # activations in and out (m (k + n) for m = 1 token), the elementwise kernels (vLLM fuses each residual
    # add into the next norm: 2 x 8 h; rope 4 (heads + kv heads) d; gated activation 6 f), attention's
    # query and output (2 x 2 x heads d) and KV cache, the LM head
    gemm_w = 64 * 128 + 64 * 64 + 64 * 256 + 128 * 64              # qkv, o, gate+up, down
    gemm_act = (64 + 128) + (64 + 64) + (64 + 256) + (128 + 64)
    elementwise = 2 * 8 * 64 + 4 * (4 + 2) * 16 + 6 * 128
    layer = 2 * gemm_w + 2 * gemm_act + elementwise + 4 * 64 + kv_per_token_layer * 10
    assert b.bytes == pytest.approx(2 * layer + 2 * 100 * 64 + 2 * (100 + 64))


def test_kv_bytes_gqa_and_mla():
    m = load_model("llama-3.1-70b")
    assert kv_bytes_per_token_layer(m, 1, "bf16") == 2 * 8 * 128 * 2
    assert kv_bytes_per_token_layer(m, 8, "fp8") == 2 * 1 * 128 * 1
    assert kv_bytes_per_token_layer(m, 16, "bf16") == 2 * 1 * 128 * 2    # replicated past the KV heads
    ds = load_model("deepseek-v3")
    assert kv_bytes_per_token_layer(ds, 8, "bf16") == (512 + 64) * 2


@pytest.mark.parametrize("model,tp", [("llama-3.1-8b", 1), ("llama-3.1-70b", 4), ("qwen2.5-72b", 8)])
def test_decode_never_below_weight_streaming(model, tp):
    # dense models read every weight once per iteration (MoE reads only the experts it routes to)
    m, hw = load_model(model), load_hardware("h100-sxm")
    rc = build_replica(m, hw, Layout(tp=tp))
    w = weight_bytes_per_gpu(m, tp, 1, "bf16")
    for seqs in (1, 8, 64):
        assert rc.iteration(Batch(decode=(1024,) * seqs)).time_s >= w / hw.hbm_bw


@pytest.mark.parametrize("model,tp", [("llama-3.1-8b", 1), ("llama-3.1-70b", 8)])
def test_prefill_never_below_flops_over_peak(model, tp):
    m, hw = load_model(model), load_hardware("h100-sxm")
    rc = build_replica(m, hw, Layout(tp=tp))
    for tokens in (512, 4096, 16384):
        b = rc.iteration(Batch(prefill=((tokens, 0),)))
        assert b.time_s >= b.flops / (tp * hw.peak_flops["bf16"])


def test_more_tokens_never_cheaper():
    m, hw = load_model("llama-3.1-8b"), load_hardware("h100-sxm")
    rc = build_replica(m, hw, Layout())
    prev = 0.0
    for seqs in range(1, 300, 7):
        t = rc.iteration(Batch(decode=(2048,) * seqs)).time_s
        assert t >= prev
        prev = t
    prev = 0.0
    for tokens in (1, 16, 100, 512, 2048, 8192):
        t = rc.iteration(Batch(prefill=((tokens, 0),))).time_s
        assert t >= prev
        prev = t


def test_more_bandwidth_never_slower():
    m, hw = load_model("llama-3.1-70b"), load_hardware("h100-sxm")
    faster = dataclasses.replace(hw, hbm_bw=hw.hbm_bw * 1.5, scaleup_bw=hw.scaleup_bw * 2)
    for batch in (Batch(decode=(1024,) * 32), Batch(prefill=((2048, 0),))):
        slow = build_replica(m, hw, Layout(tp=4)).iteration(batch).time_s
        fast = build_replica(m, faster, Layout(tp=4)).iteration(batch).time_s
        assert fast <= slow


def test_ring_allreduce_textbook():
    # Thakur et al. 2005: 2(n-1) alpha + 2 (n-1)/n S / B
    S, n, B, a = 64e6, 8, 200e9, 5e-6
    assert ring_allreduce_time_nb(S, n, B, a) == pytest.approx(2 * 7 * a + 2 * 7 / 8 * S / B)
    assert tree_allreduce_time_nb(S, n, B, a) == pytest.approx(2 * math.log2(8) * a + 2 * S / B)
    assert ring_allreduce_time_nb(S, 1, B, a) == 0.0


def test_tp_adds_communication():
    m, hw = load_model("llama-3.1-70b"), load_hardware("h100-sxm")
    b = build_replica(m, hw, Layout(tp=4)).iteration(Batch(decode=(1024,) * 16))
    assert b.parts_s["communication"] > 0
    b1 = build_replica(load_model("llama-3.1-8b"), hw, Layout(tp=1)).iteration(Batch(decode=(1024,) * 16))
    assert b1.parts_s["communication"] == 0


def test_weights_do_not_fit_message():
    with pytest.raises(InfeasibleError) as e:
        build_replica(load_model("llama-3.1-70b"), load_hardware("h100-sxm"), Layout(tp=1))
    msg = str(e.value)
    assert "llama-3.1-70b bf16 needs 131.5 GiB" in msg or "needs 131." in msg
    assert "h100-sxm holds 79.2 GiB" in msg and "--tp 2" in msg


def test_tp_must_divide_heads():
    with pytest.raises(InfeasibleError, match="--tp 3 does not divide the 32 attention heads"):
        lower(load_model("llama-3.1-8b"), load_hardware("h100-sxm"), Layout(tp=3), VLLM)


def test_unsupported_dtype():
    with pytest.raises(ConfigError, match="a100-sxm-80gb has no fp8"):
        lower(load_model("llama-3.1-8b"), load_hardware("a100-sxm-80gb"), Layout(dtype="fp8"), VLLM)
    with pytest.raises(ConfigError, match="--dtype: unknown value 'fp7'"):
        lower(load_model("llama-3.1-8b"), load_hardware("h100-sxm"), Layout(dtype="fp7"), VLLM)


def test_quantised_weights_are_smaller_and_decode_faster():
    m, hw = load_model("llama-3.1-70b"), load_hardware("h100-sxm")
    assert weight_bytes_per_gpu(m, 4, 1, "fp8") < 0.55 * weight_bytes_per_gpu(m, 4, 1, "bf16")
    assert weight_bytes_per_gpu(m, 4, 1, "int4") < 0.3 * weight_bytes_per_gpu(m, 4, 1, "bf16")
    batch = Batch(decode=(1024,) * 8)
    t16 = build_replica(m, hw, Layout(tp=4)).iteration(batch).time_s
    t8 = build_replica(m, hw, Layout(tp=4, dtype="fp8")).iteration(batch).time_s
    assert t8 < t16


def test_moe_touches_fewer_experts_at_small_batch():
    m, hw = load_model("mixtral-8x7b"), load_hardware("h100-sxm")
    rc = build_replica(m, hw, Layout(tp=2))
    one = rc.iteration(Batch(decode=(128,))).parts_s["gemm"]
    many = rc.iteration(Batch(decode=(128,) * 64)).parts_s["gemm"]
    assert many > 1.8 * one      # 1 token reads 2 of 8 experts, 64 tokens read ~all 8


def _smallest_layout(m, hw):
    for pp in (1, 2, 4, 8):
        for tp in (1, 2, 4, 8):
            if m.num_attention_heads % tp:
                continue
            try:
                return build_replica(m, hw, Layout(tp=tp, pp=pp, dtype="bf16" if hw.peak_flops["bf16"] else "fp16"))
            except InfeasibleError:
                continue
    return None


@pytest.mark.parametrize("hw_name", list_hardware())
def test_every_profile_prices_every_model(hw_name):
    hw = load_hardware(hw_name)
    priced = 0
    for name in list_models():
        rc = _smallest_layout(load_model(name), hw)
        if rc is None:
            continue
        b = rc.iteration(Batch(prefill=((512, 0),), decode=(1024,) * 8))
        assert b.time_s > 0 and math.isfinite(b.time_s)
        assert rc.memory.kv_capacity_tokens > 0 or rc.memory.weight_bytes > 0.8 * hw.hbm_bytes
        priced += 1
    assert priced >= 2


# -- links and elementwise kernels ------------------------------------------------------------------

def test_tp_group_beyond_bridge_pairs_runs_over_pcie():
    from servesim.costmodel.collectives import link_for_group
    hw = load_hardware("h100-pcie")  # NVLink bridge joins pairs; 8 cards per node on PCIe
    e = hw.efficiency
    assert link_for_group(hw, 2)[0] == "scaleup"
    name, bw, alpha = link_for_group(hw, 4)
    assert name == "pcie" and bw == pytest.approx(hw.pcie_bw * e.pcie_bw_fraction) and alpha == e.pcie_latency_s
    p4 = lower(load_model("llama-3.1-8b"), hw, Layout(tp=4), VLLM)
    assert p4.tp_bw == pytest.approx(hw.pcie_bw * e.pcie_bw_fraction)
    # the same all-reduce over 64 GB/s PCIe costs more than over the 300 GB/s bridge
    p2 = lower(load_model("llama-3.1-8b"), hw, Layout(tp=2), VLLM)
    assert p4.tp_bw < p2.tp_bw


def test_pipeline_sends_use_point_to_point_figures():
    hw = load_hardware("h100-sxm")
    e = hw.efficiency
    p = lower(load_model("llama-3.1-8b"), hw, Layout(tp=2, pp=2), VLLM)
    assert p.pp_bw == pytest.approx(hw.scaleup_bw * e.p2p_bw_fraction) and p.pp_alpha == e.p2p_latency_s
    assert p.pp_bw_large == pytest.approx(hw.scaleup_bw * e.p2p_large_bw_fraction)
    assert p.pp_large_bytes == e.p2p_large_message_bytes
    assert p.tp_bw == pytest.approx(hw.scaleup_bw * e.scaleup_bw_fraction)
    # a PP group that leaves the node sends over the NIC at one rate (no step)
    wide = lower(load_model("llama-3.1-8b"), hw, Layout(tp=8, pp=2), VLLM)
    assert wide.pp_bw == wide.pp_bw_large == pytest.approx(hw.scaleout_bw * e.scaleout_bw_fraction)
    assert wide.pp_large_bytes == float("inf")


def test_elementwise_bytes_hand_derived():
    from servesim.costmodel import elementwise as el
    # Llama-2-7B layer at TP=1: h = 4096, 32 q + 32 kv heads of 128, gated f = 11008, 16-bit values
    k = el.layer_kernels(4096, (32 + 32) * 128, 11008, True)
    assert [kind for kind, _ in k] == ["norm", "norm", "rope", "activation", "stream", "stream"]
    assert [b for _, b in k] == [2 * 4096 * 2, 2 * 4096 * 2,          # norm: read h, write h
                                 2 * 8192 * 2,                        # rope: read + write q and k
                                 (2 * 11008 + 11008) * 2,             # SiLU-and-mul: read 2f, write f
                                 3 * 4096 * 2, 3 * 4096 * 2]          # add: read 2h, write h
    hw = load_hardware("h100-sxm")
    e = hw.efficiency
    want = (2 * 16384 / e.norm_hbm_fraction + 32768 / e.rope_hbm_fraction + 66048 / e.activation_hbm_fraction
            + 2 * 24576 / e.hbm_fraction) / hw.hbm_bw
    import dataclasses
    trt = dataclasses.replace(load_engine("trtllm"), fused_add_norm=False)   # an engine that fuses nothing
    p = lower(load_model("llama-2-7b"), hw, Layout(), trt)
    assert p.elem_s_tok_layer == pytest.approx(want) and p.elem_kernels == 6
    assert p.elem_latency == pytest.approx((1 - trt.fit_for(hw).graph_overlap) * e.elementwise_latency_s)
    # vLLM fuses each residual add into the next RMSNorm: read x and the residual, write both (8 h bytes)
    fused = el.layer_kernels(4096, (32 + 32) * 128, 11008, True, fused_add_norm=True)
    assert fused == [("norm", 4 * 4096 * 2), ("norm", 4 * 4096 * 2), ("rope", 2 * 8192 * 2),
                     ("activation", (2 * 11008 + 11008) * 2)]
    p = lower(load_model("llama-2-7b"), hw, Layout(), VLLM)
    want = (2 * 32768 / e.norm_hbm_fraction + 32768 / e.rope_hbm_fraction + 66048 / e.activation_hbm_fraction) / hw.hbm_bw
    assert p.elem_s_tok_layer == pytest.approx(want) and p.elem_kernels == 4
