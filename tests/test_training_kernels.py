"""Measured training-kernel figures per architecture, long context, Blackwell, and the held-out
validation splits (issue #24 items 4-6)."""
import importlib.util
from pathlib import Path

import pytest

from servesim.config import load_hardware, load_model
from servesim.training import TrainLayout, train_step
from servesim.training.framework import _architectures, architecture_of, training_hardware
from servesim.training.params import FITTED

ROOT = Path(__file__).resolve().parent.parent


def _script(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "experiments" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_shipped_kernel_figures_are_the_scripts():
    """architectures.toml holds exactly what experiments/fit_training_kernels.py computes from the
    shipped AIConfigurator tables (a changed table or formula shows up here)."""
    values, _ = _script("fit_training_kernels").figures()
    archs = {a.name: a for a in _architectures().values()}
    for key, want in values.items():
        arch, field = key.split(".")
        assert getattr(archs[arch], field) == pytest.approx(want, abs=1e-9), key


def test_attention_follows_the_measured_curve_and_ring_cp_sees_s_over_cp():
    """Attention time of one layer, by hand: causal forward FLOPs at e(s) = attn_max s / (s + half)
    of the bf16 peak; with ring CP each rank runs kernels over s / CP keys."""
    h100 = load_hardware("h100-sxm")
    arch = architecture_of(h100)
    m = load_model("llama-3.1-8b")
    for cp, seq in ((1, 8192), (8, 131072)):
        lay = TrainLayout(cp=cp, dp=1, seq_len=seq, global_batch=1, recompute="none")
        r = train_step(m, h100, lay, check_memory=False)
        e = arch.attn_max * (seq / cp) / (seq / cp + arch.attn_half_seq)
        tokens = seq / cp
        flops = tokens * 2 * seq * (128 + 128) * 32 / 2          # causal QK^T + AV, 32 heads of 128
        # the attention core of 32 layers, forward + 2.5x backward, inside the compute
        attn = 32 * 3.5 * (flops / (h100.peak_flops["bf16"] * e) + h100.efficiency.kernel_latency_s)
        assert attn < r.breakdown_s["compute"]
        if seq > 100_000:
            assert r.breakdown_s["compute"] < 1.5 * attn   # attention dominates at these lengths
        assert e == pytest.approx(arch.attention("flash", seq / cp, 0.6))
    # the curve saturates: 128K and 256K differ by little, 2K and 8K by much
    assert arch.attention("flash", 262144, 0) / arch.attention("flash", 131072, 0) < 1.01
    assert arch.attention("flash", 8192, 0) / arch.attention("flash", 2048, 0) > 1.2


def test_long_context_cp_ring_overlap():
    """Ring CP at 128K and 256K: the KV blocks hide behind the block attention inside NVLink; across
    nodes (TP 8 x CP 16) the sends cost more but at these lengths still hide; all-to-all is exposed."""
    h100 = load_hardware("h100-sxm")
    m = load_model("llama-3.1-8b")
    for seq, cp in ((131072, 8), (262144, 16)):
        ring = train_step(m, h100, TrainLayout(tp=1, cp=cp, dp=1, seq_len=seq, global_batch=1, recompute="full"),
                          check_memory=False)
        assert ring.breakdown_s["cp_comm"] == 0.0
        a2a = train_step(m, h100, TrainLayout(tp=1, cp=cp, dp=1, seq_len=seq, global_batch=1, recompute="full",
                                              cp_comm="a2a"), check_memory=False)
        assert a2a.breakdown_s["cp_comm"] > 0.0
        # the Llama 3 report's all-gather CP: the whole sequence's K, V gathered, on the critical path
        ag = train_step(m, h100, TrainLayout(tp=1, cp=cp, dp=1, seq_len=seq, global_batch=1, recompute="full",
                                             cp_comm="allgather"), check_memory=False)
        from servesim.training import comm
        kv = seq * 2 * m.kv_dim * 2   # K and V of every token, 16-bit
        per_layer = 2 * comm.reduce_scatter(h100, kv, cp)   # forward gather + backward reduce-scatter
        # full recomputation repeats the forward gather
        assert ag.breakdown_s["cp_comm"] + ag.breakdown_s["tp_comm"] == pytest.approx(32 * 1.5 * per_layer, rel=1e-6)
        # attention dominates at these lengths: the step grows faster than the sequence
        assert ring.mfu > 0.3


def test_blackwell_kernels_are_measured_ratios():
    """B200's training GEMM efficiency is Hopper's fitted one times the measured B200/H100 ratio, its
    NVLink collectives Hopper's fraction times the measured NCCL ratio, its attention the B200 curve."""
    from servesim.training.step import _Kern
    from servesim.training.framework import load_framework
    b200, h100 = load_hardware("b200"), load_hardware("h100-sxm")
    arch = architecture_of(b200)
    assert arch.name == "blackwell" and not arch.calibrated
    lay = TrainLayout(dp=8, framework="megatron", attention="flash", sp=False, recompute="none", zero=1)
    kb = _Kern(b200, lay, FITTED, load_framework("megatron"))
    kh = _Kern(h100, lay, FITTED, load_framework("megatron"))
    assert kb.gemm_max == pytest.approx(kh.gemm_max * arch.gemm_vs_source)
    assert kb.gemm8_max == pytest.approx(kb.gemm_max * arch.fp8_gemm_ratio)
    tb = training_hardware(b200)
    assert tb.efficiency.scaleup_bw_fraction == pytest.approx(
        h100.efficiency.scaleup_bw_fraction * arch.scaleup_bw_vs_source)
    assert training_hardware(h100) is h100
    r = train_step(load_model("llama-3.1-70b"), b200, TrainLayout(tp=4, pp=4, dp=4, seq_len=8192, global_batch=128,
                                                                   framework="nemo", recompute="auto"))
    assert "measured on B200 kernels" in r.extra["extrapolation"]
    # GB200 is the same architecture: the same kernel figures
    assert architecture_of(load_hardware("gb200-nvl72")) is arch


def test_held_out_folds_refit_without_the_rows_they_predict():
    """The leave-one-out machinery on a small subset: every row predicted once per split, each fold
    fitted on the others (a generation left out takes the remaining generation's scale)."""
    from servesim.calibrate import training as trn
    cases, _ = trn.load_cases()
    sub = [c for c in cases if c.group in ("deepspeed", "nemo")][:12] + \
        [c for c in cases if c.group == "megatron" and c.hardware == "a100-sxm-80gb"][:6]
    h = trn.held_out(sub)
    assert set(h["split"]) == {"framework", "generation"}
    for split, part in h.groupby("split"):
        assert sorted(part["row"]) == sorted(c.row for c in sub)
    hopper = h[(h["split"] == "generation") & (h["fold"] == "hopper")]
    assert hopper["fold_fit"].str.startswith("compute scale all").all()


@pytest.mark.slow   # ~20 s: the whole suite with its held-out refits (CI runs it)
def test_validate_training_check_passes_and_prints_held_out():
    from click.testing import CliRunner
    from servesim.cli import main
    r = CliRunner().invoke(main, ["validate", "--suite", "training", "--check"])
    assert r.exit_code == 0, r.output
    assert "framework   llm-foundry" in r.output and "generation  hopper" in r.output
