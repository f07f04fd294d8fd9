"""Training step-time and memory model: FLOPs, Korthikanti memory, bubble, scaling, errors."""
import dataclasses

import pytest

from servesim.config import load_hardware, load_model
from servesim.errors import ConfigError, InfeasibleError
from servesim.training import (
    TrainLayout,
    activation_bytes_per_layer,
    counted_flops_per_token,
    memory_per_gpu,
    model_flops_per_token,
    train_step,
)
from servesim.training.flops import mfu_params


@pytest.fixture(scope="module")
def h100():
    return load_hardware("h100-sxm")


@pytest.mark.parametrize("name", ["llama-3.1-8b", "llama-3.1-70b", "gpt3-175b", "mixtral-8x7b", "deepseek-v3"])
def test_flops_per_token_is_6n_plus_attention(name):
    """Bottom-up GEMM FLOPs (x3 for fwd+bwd) equal 6N + 12 L s d_attn, up to the non-matmul
    parameters (norms, biases), < 0.1%."""
    m = load_model(name)
    s = 4096
    counted = counted_flops_per_token(m, s)
    assert counted == pytest.approx(model_flops_per_token(m, s), rel=1e-3)


def test_llama_8b_flops_closed_form():
    m = load_model("llama-3.1-8b")
    s = 8192
    n = m.param_count() - m.vocab_size * m.hidden_size  # 8.03B minus the input embedding
    expected = 6 * n + 12 * m.num_layers * m.num_attention_heads * m.head_dim * s
    assert model_flops_per_token(m, s) == pytest.approx(expected, rel=1e-9)
    assert 7.4e9 < mfu_params(m) < 7.6e9


def _korthikanti(s, b, h, a, t, L, mode, sp):
    """Korthikanti et al. 2022 Table 2, whole model (L layers), bytes."""
    if mode == "full":
        per = 2 * s * b * h / (t if sp else 1)
    elif mode == "selective":
        per = s * b * h * (34 / t if sp else 10 + 24 / t)
    else:
        per = s * b * h * ((34 + 5 * a * s / h) / t if sp else 10 + 24 / t + 5 * a * s / (h * t))
    return per * L


@pytest.mark.parametrize("mode", ["none", "selective", "full"])
@pytest.mark.parametrize("sp", [False, True])
@pytest.mark.parametrize("tp", [1, 8])
def test_activation_memory_matches_korthikanti(h100, mode, sp, tp):
    """The per-tensor activation model reproduces Korthikanti et al. 2022 Table 2 exactly for GPT
    blocks (4h GELU MLP, multi-head attention, dropout, unfused attention, 16 bits). GPT-3 175B
    layout of the paper: p = 8 (1F1B: stage 0 holds p micro-batches of L/p layers)."""
    m = load_model("gpt3-175b")
    lay = TrainLayout(tp=tp, pp=8, dp=1, sp=sp, recompute=mode, seq_len=2048, micro_batch=1, global_batch=64, zero=0,
                      attention="unfused", dropout=True)
    want = _korthikanti(2048, 1, 12288, 96, tp, 96, mode, sp and tp > 1)
    assert activation_bytes_per_layer(m, lay) * m.num_layers == pytest.approx(want)
    assert memory_per_gpu(m, h100, lay)["activations"] == pytest.approx(want)


def test_selective_sp_paper_number():
    # Korthikanti et al. 2022 sec. 5: GPT-3 175B with SP + selective needs 34 sbh/t per layer.
    m = load_model("gpt3-175b")
    lay = TrainLayout(tp=8, pp=8, dp=1, sp=True, recompute="selective", seq_len=2048, micro_batch=1, global_batch=8,
                      attention="unfused", dropout=True)
    assert activation_bytes_per_layer(m, lay) == 34 * 2048 * 12288 / 8


def test_model_states_bytes_per_param(h100):
    """ZeRO (Rajbhandari et al. 2020): 2 + 2 + 12 = 16 B/param with 16-bit gradients (the deepspeed
    profile); Megatron's fp32 main grads make it 18, and its distributed optimizer 6 + 12/d
    (Megatron-LM docs, dist_optimizer.md)."""
    m = load_model("llama-3.1-8b")
    lay = TrainLayout(tp=1, pp=1, dp=8, zero=0, global_batch=8, seq_len=2048, framework="deepspeed")
    mem = memory_per_gpu(m, h100, lay)
    n = m.param_count()
    assert mem["weights"] + mem["gradients"] + mem["optimizer"] == pytest.approx(16 * n)
    z3 = memory_per_gpu(m, h100, dataclasses.replace(lay, zero=3))
    assert z3["weights"] + z3["gradients"] + z3["optimizer"] == pytest.approx(16 * n / 8)
    z1 = memory_per_gpu(m, h100, dataclasses.replace(lay, zero=1))
    assert z1["optimizer"] == pytest.approx(12 * n / 8)
    meg = memory_per_gpu(m, h100, dataclasses.replace(lay, framework="megatron"))
    assert meg["weights"] + meg["gradients"] + meg["optimizer"] == pytest.approx(18 * n)
    dist = memory_per_gpu(m, h100, dataclasses.replace(lay, framework="megatron", zero=1))
    assert dist["weights"] + dist["gradients"] + dist["optimizer"] == pytest.approx((6 + 12 / 8) * n)


@pytest.mark.parametrize("name,pp,m_", [("llama-3.1-8b", 2, 4), ("llama-3.1-70b", 4, 8), ("llama-3.1-70b", 8, 64),
                                       ("llama-3.1-70b", 4, 1), ("llama-3.1-70b", 16, 3)])
def test_bubble_fraction(h100, name, pp, m_):
    """Narayanan et al. 2021: the slowest stage sets the period, the others fill the ramp:
    m t_max + (sum t_r - t_max); for equal stages (p - 1)/(m + p - 1) of the pipeline time. Here the
    last stage also runs the LM head, so the bubble is a little under that."""
    model = load_model(name)
    lay = TrainLayout(tp=8, pp=pp, dp=1, sp=True, seq_len=4096, micro_batch=1, global_batch=m_)
    r = train_step(model, h100, lay)
    st = r.extra["stage_times_s"]
    assert r.breakdown_s["pp_bubble"] == pytest.approx(sum(st) - max(st))
    assert r.extra["stage_time_s"] == pytest.approx(max(st))
    equal = (pp - 1) / (m_ + pp - 1)
    assert equal * 0.85 < r.bubble_fraction <= equal + 1e-12


def test_interleaved_bubble_divided_by_vp(h100):
    model = load_model("llama-3.1-70b")
    lay = TrainLayout(tp=8, pp=4, dp=1, vp=5, sp=True, seq_len=4096, micro_batch=1, global_batch=8)
    r = train_step(model, h100, lay)
    st = r.extra["stage_times_s"]
    assert r.breakdown_s["pp_bubble"] == pytest.approx((sum(st) - max(st)) / 5)
    plain = train_step(model, h100, dataclasses.replace(lay, vp=1))
    assert r.bubble_fraction < plain.bubble_fraction


@pytest.mark.parametrize("name,tp,pp,zero,cp", [
    ("llama-3.1-8b", 8, 1, 0, 1), ("llama-3.1-8b", 2, 1, 0, 2), ("llama-3.1-70b", 8, 4, 0, 1),
    ("mixtral-8x7b", 8, 4, 0, 1), ("llama-3.1-8b", 1, 1, 1, 1), ("llama-3.1-8b", 2, 1, 3, 2),
    ("llama-3.1-70b", 8, 4, 1, 1), ("mixtral-8x7b", 2, 2, 3, 1)])
def test_doubling_dp_never_raises_tokens_per_gpu(h100, name, tp, pp, zero, cp):
    """At fixed micro-batch and per-DP batch, more DP only adds gradient traffic. Exception, by
    design: ZeRO >= 1 shards the optimizer step over DP, so the per-GPU optimizer time falls; for
    those the step time without the optimizer never falls and any gain is at most the optimizer
    time saved."""
    model = load_model(name)
    prev = None
    for dp in (8, 16, 32, 64, 128):
        lay = TrainLayout(tp=tp, pp=pp, dp=dp, cp=cp, sp=tp > 1, zero=zero, seq_len=4096, micro_batch=1,
                          global_batch=16 * dp)  # fixed micro-batch and per-DP batch
        r = train_step(model, h100, lay, check_memory=False)
        if prev is not None:
            if zero == 0:
                assert r.tokens_per_s_per_gpu <= prev.tokens_per_s_per_gpu * (1 + 1e-12)
            else:
                opt, prev_opt = r.breakdown_s["optimizer"], prev.breakdown_s["optimizer"]
                assert r.step_time_s - opt >= prev.step_time_s - prev_opt - 1e-12
                assert r.step_time_s >= prev.step_time_s - (prev_opt - opt) - 1e-12
        prev = r


def test_mfu_and_breakdown_consistent(h100):
    model = load_model("llama-3.1-8b")
    lay = TrainLayout(tp=1, pp=1, dp=8, zero=1, seq_len=8192, global_batch=128, recompute="none")
    r = train_step(model, h100, lay, check_memory=False)
    parts = sum(v for k, v in r.breakdown_s.items() if k != "recompute")
    assert parts == pytest.approx(r.step_time_s)
    flops = model_flops_per_token(model, 8192) * 128 * 8192
    assert r.mfu == pytest.approx(flops / r.step_time_s / (8 * 989e12))
    # no recompute: HFU counts the causal attention executed, half of MFU's non-causal convention (issue #25)
    from servesim.training.flops import hardware_flops_per_token
    assert r.hfu == pytest.approx(r.mfu * hardware_flops_per_token(model, 8192) / model_flops_per_token(model, 8192))
    assert r.hfu < r.mfu and 0.3 < r.mfu < 0.75
    full = train_step(model, h100, dataclasses.replace(lay, recompute="full"), check_memory=False)
    assert full.step_time_s > r.step_time_s and full.hfu / full.mfu > r.hfu / r.mfu


def test_moe_mla_and_fp8_run(h100):
    ds = load_model("deepseek-v3")
    r = train_step(ds, h100, TrainLayout(tp=1, pp=61, dp=32, ep=32, zero=1, recompute="full", seq_len=4096,
                                         global_batch=256), check_memory=False)
    assert r.breakdown_s["ep_comm"] > 0 and r.step_time_s > 0
    m = load_model("llama-3.1-8b")
    lay = TrainLayout(tp=1, dp=8, zero=3, seq_len=4096, global_batch=64)
    assert train_step(m, h100, dataclasses.replace(lay, dtype="fp8")).step_time_s < train_step(m, h100, lay).step_time_s


def test_cp_and_hierarchical_dp_cost_more_across_nodes(h100):
    m = load_model("llama-3.1-8b")
    one_node = train_step(m, h100, TrainLayout(tp=1, dp=8, zero=3, seq_len=4096, global_batch=8))
    many = train_step(m, h100, TrainLayout(tp=1, dp=64, zero=3, seq_len=4096, global_batch=64))
    assert many.breakdown_s["dp_comm"] > one_node.breakdown_s["dp_comm"]
    ring = train_step(m, h100, TrainLayout(tp=1, dp=4, cp=2, zero=3, seq_len=8192, global_batch=4))
    assert ring.breakdown_s["cp_comm"] >= 0.0
    assert many.breakdown_s["dp_comm"] >= one_node.breakdown_s["dp_comm"]


@pytest.mark.parametrize("kw,gpus,option", [
    (dict(tp=3), 3, "--tp 3"),
    (dict(pp=5), 5, "--pp 5"),
    (dict(dp=4), 8, "--gpus 8"),
    (dict(dp=3, global_batch=8), 3, "--global-batch 8"),
    (dict(ep=2), 1, "--ep 2"),
    (dict(pp=2, vp=3), 2, "--pp x --vp"),
])
def test_infeasible_layouts_name_the_option(h100, kw, gpus, option):
    m = load_model("llama-3.1-8b")
    with pytest.raises((InfeasibleError, ConfigError)) as e:
        train_step(m, h100, TrainLayout(seq_len=2048, global_batch=kw.pop("global_batch", 48), **kw), gpus=gpus)
    msg = str(e.value)
    assert option in msg and "\n" not in msg


def test_memory_not_fitting_is_infeasible(h100):
    m = load_model("llama-3.1-70b")
    with pytest.raises(InfeasibleError, match="GiB per GPU"):
        train_step(m, h100, TrainLayout(tp=1, dp=8, zero=0, seq_len=4096, global_batch=8))


def test_validation_sample_within_tolerance():
    """Shipped model vs published runs (experiments/results/training_validation.md): on a fixed
    sample of Megatron (fitted) and NeMo (held-out) rows, median |error| < 10%, each < 20%."""
    from servesim.calibrate.training import load_cases, predict
    cases, _ = load_cases()
    wanted = ("GPT 39.1B", "GPT 145.6B", "GPT 310.1B", "GPT 175B (GPT-3)", "GPT-style 70B", "GPT-style 314B",
              "Llama 3.1 8B 8x", "Llama 3.1 70B 64x")
    sample = [c for c in cases if c.label.startswith(wanted) and c.layout.dtype == "bf16"]
    assert len(sample) >= 8
    df = predict(sample)
    err = df["rel_error"].abs()
    assert err.median() < 0.10
    assert err.max() < 0.20, df[["case", "rel_error"]].to_string()


def test_hierarchical_allreduce_uses_nvlink_inside_and_nic_across(h100):
    from servesim.costmodel.collectives import RING, allreduce_time_nb, link_for_group
    from servesim.training import comm
    nbytes = 1e9
    _, bw, a = link_for_group(h100, 8)
    assert comm.allreduce(h100, nbytes, 8, stride=1) == pytest.approx(allreduce_time_nb(nbytes, 8, bw, a, RING))
    # stride 8 (TP = 8): every DP peer is in another node -> a flat ring over the NICs
    _, bw_o, a_o = link_for_group(h100, 16, span_in_domain=h100.scaleup_domain + 1)
    assert comm.allreduce(h100, nbytes, 16, stride=8) == pytest.approx(allreduce_time_nb(nbytes, 16, bw_o, a_o, RING))
    # stride 1 over 64 ranks: 8 per node share the inter-node traffic, faster than a flat NIC ring
    flat = allreduce_time_nb(nbytes, 64, bw_o, a_o, RING)
    assert comm.allreduce(h100, nbytes, 64, stride=1) < flat
    assert comm.split_group(h100, 64, 2) == (4, 16)


def test_tp_overlap_hides_tp_comm(h100):
    m = load_model("llama-3.1-70b")
    lay = TrainLayout(tp=8, pp=4, dp=1, sp=True, seq_len=4096, global_batch=16)
    plain = train_step(m, h100, lay)
    over = train_step(m, h100, dataclasses.replace(lay, tp_overlap=True))
    assert over.breakdown_s["tp_comm"] < plain.breakdown_s["tp_comm"]
    assert over.breakdown_s["compute"] == pytest.approx(plain.breakdown_s["compute"])
    with pytest.raises(ConfigError, match="--tp-overlap"):
        train_step(m, h100, dataclasses.replace(lay, sp=False, tp_overlap=True))


def test_search_and_strong_scaling(h100):
    from servesim.training.search import scaling_table, search_layouts
    m = load_model("llama-3.1-8b")
    res = search_layouts(m, h100, 16, TrainLayout(seq_len=4096, global_batch=64), top=5)
    assert [r.step_time_s for r in res] == sorted(r.step_time_s for r in res)
    assert all(r.memory_bytes["total"] <= h100.device_bytes for r in res)
    df = scaling_table(m, h100, [8, 16, 32], TrainLayout(tp=2, sp=True, zero=1, seq_len=4096, global_batch=64),
                       mode="strong")
    assert list(df["global_batch"]) == [64, 64, 64]
    assert df["scaling_efficiency"].iloc[0] == 1.0
