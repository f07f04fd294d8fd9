"""Framework profiles that carry their frameworks' defaults (issue #24 items 2 and 3): sequence
parallelism with TP, torchtitan's activation checkpointing, FSDP2 resharding, fp8 all-gathers and
fp8 weight copies under FSDP, MaxText remat policies; the command line wins and the summary lists
what came from the profile."""
import dataclasses
import json

import pytest
from click.testing import CliRunner

from servesim.cli import main
from servesim.config import load_hardware, load_model
from servesim.errors import ConfigError, InfeasibleError
from servesim.training import TrainLayout, activation_bytes_per_layer, memory_per_gpu, train_step
from servesim.training.framework import REMAT_POLICIES, list_frameworks, load_framework
from servesim.training.layout import resolve_with_defaults
from servesim.training.memory import GiB, layer_recompute_flags


@pytest.fixture(scope="module")
def h100():
    return load_hardware("h100-sxm")


@pytest.fixture(scope="module")
def l8b():
    return load_model("llama-3.1-8b")


def _train(args):
    r = CliRunner().invoke(main, ["train", *args])
    return r


def test_every_profile_has_defaults():
    for name in list_frameworks():
        fw = load_framework(name)
        assert fw.runtime in ("pytorch", "jax")
        assert fw.recompute in ("none", "selective", "full", "auto")
    assert load_framework("torchtitan").sequence_parallel and load_framework("nemo").sequence_parallel
    assert load_framework("megatron-bridge").sequence_parallel and load_framework("megatron-bridge").tp_comm_overlap
    assert not load_framework("megatron").sequence_parallel
    assert load_framework("maxtext").runtime == "jax" and load_framework("maxtext").remat_policy in REMAT_POLICIES


def test_torchtitan_tp2_runs_sequence_parallel_unless_no_sp():
    base = ["--model", "llama-3.1-8b", "--framework", "torchtitan", "--tp", "2", "--gpus", "8", "--global-batch", "32"]
    r = _train(base + ["--format", "json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["layout"]["sp"] is True and d["from_profile"]["--sp"] == "on"
    off = json.loads(_train(base + ["--no-sp", "--format", "json"]).output)
    assert off["layout"]["sp"] is False and "--sp" not in off["from_profile"]
    # SP shards the norms and the residual stream: less activation memory without recomputation
    sp_none = json.loads(_train(base + ["--recompute", "none", "--format", "json"]).output)
    off_none = json.loads(_train(base + ["--recompute", "none", "--no-sp", "--format", "json"]).output)
    assert sp_none["memory_gib_per_gpu"]["parts"]["activations"] < off_none["memory_gib_per_gpu"]["parts"]["activations"]
    table = _train(base).output
    assert "from the profile" in table and "--sp on" in table and "--selective-ac op" in table


def test_command_line_wins_and_is_not_listed(h100, l8b):
    lay = TrainLayout(tp=2, dp=4, global_batch=32, framework="torchtitan", zero=1, recompute="full")
    res, taken = resolve_with_defaults(lay, h100)
    assert res.zero == 1 and res.recompute == "full" and res.selective_ac is None
    assert "--zero" not in taken and "--recompute" not in taken and taken["--sp"] == "on"
    nemo, taken = resolve_with_defaults(TrainLayout(tp=4, dp=2, framework="nemo"), h100)
    assert nemo.sp and nemo.tp_overlap and taken["--tp-overlap"] == "on"
    # without SP the TP overlap default stays off (it needs SP)
    nemo_nosp, taken = resolve_with_defaults(TrainLayout(tp=4, dp=2, sp=False, framework="nemo"), h100)
    assert not nemo_nosp.tp_overlap and "--tp-overlap" not in taken
    # TP 1: sequence parallelism has nothing to shard and is not reported
    one, taken = resolve_with_defaults(TrainLayout(tp=1, dp=8, framework="torchtitan"), h100)
    assert one.sp is False and "--sp" not in taken


def test_op_sac_keeps_the_saved_ops(h100, l8b):
    """torchtitan per-op SAC, Llama-3.1-8B, TP 1, 4096 tokens: kept = block input + wq and wv outputs
    + SDPA output and log-sum-exp + w1 output + w2 output, by hand."""
    lay = resolve_with_defaults(TrainLayout(dp=8, seq_len=4096, framework="torchtitan"), h100)[0]
    assert lay.op_sac
    T, h, q, kv, f, heads = 4096, 4096, 4096, 1024, 14336, 32
    expect = 2 * T * h + 2 * T * (q + kv) + 4 * T * heads + 2 * T * q + 2 * T * f + 2 * T * h
    assert activation_bytes_per_layer(l8b, lay) == pytest.approx(expect)
    none = dataclasses.replace(lay, recompute="none", selective_ac=None)
    assert activation_bytes_per_layer(l8b, none) > 1.5 * expect
    # the time it adds: elementwise kernels and every second matmul (wk, wo, w3), less than full recompute
    r_op = train_step(l8b, h100, lay)
    r_full = train_step(l8b, h100, dataclasses.replace(lay, recompute="full", selective_ac=None))
    r_none = train_step(l8b, h100, none)
    assert 0 < r_op.breakdown_s["recompute"] < 0.6 * r_full.breakdown_s["recompute"]
    # HFU counts causal attention as executed (issue #25): no recompute, it is below MFU; per-op SAC adds to it
    assert r_none.hfu < r_none.mfu and r_op.hfu / r_op.mfu > r_none.hfu / r_none.mfu


def test_layer_sac_every_nth_layer(h100, l8b):
    lay = resolve_with_defaults(TrainLayout(dp=8, framework="torchtitan", selective_ac="2"), h100)[0]
    assert lay.layer_sac == 2
    assert layer_recompute_flags(lay, 6) == [False, True, False, True, False, True]
    full = train_step(l8b, h100, dataclasses.replace(lay, recompute="full", selective_ac=None))
    half = train_step(l8b, h100, lay)
    assert half.breakdown_s["recompute"] == pytest.approx(full.breakdown_s["recompute"] / 2, rel=1e-6)


def test_recompute_auto_in_the_frameworks_vocabulary(h100):
    m = load_model("llama-3.1-70b")
    lay = TrainLayout(dp=64, zero=3, seq_len=8192, micro_batch=1, global_batch=128, recompute="auto",
                      framework="torchtitan")
    r = train_step(m, h100, lay)
    assert r.layout.recompute in ("none", "selective", "full")
    assert r.layout.recompute_modules == () and r.layout.recompute_layers is None
    mt = train_step(m, h100, dataclasses.replace(lay, framework="maxtext"))
    assert mt.layout.remat_policy in REMAT_POLICIES


def test_reshard_after_forward(h100):
    """Kept gathered after the forward: no backward all-gather (less DP traffic), every local layer's
    parameters in memory; torchtitan's default keeps them under PP."""
    m = load_model("llama-3.1-8b")
    lay = TrainLayout(dp=8, zero=3, seq_len=4096, global_batch=8, framework="torchtitan", recompute="full",
                      dp_overlap=False)
    always = train_step(m, h100, dataclasses.replace(lay, reshard_after_forward="always"))
    never = train_step(m, h100, dataclasses.replace(lay, reshard_after_forward="never"))
    assert never.breakdown_s["dp_comm"] < always.breakdown_s["dp_comm"]
    local = m.param_count() * 2 / GiB
    assert never.memory_bytes["gathered_params"] / GiB > 0.95 * local
    # the largest unit (the embedding) and one prefetched, and two layers' unsharded gradients
    assert always.memory_bytes["gathered_params"] / GiB < 0.45 * local
    pp = resolve_with_defaults(dataclasses.replace(lay, pp=2, dp=4), h100)[0]
    assert pp.reshard_after_forward == "never"
    assert resolve_with_defaults(lay, h100)[0].reshard_after_forward == "always"


def test_fsdp_fp8_copies_only_of_gathered_layers():
    """Llama-3.1-70B, FSDP over 64 GPUs, fp8, 8K sequence, micro-batch 1 (the layout of the published
    70B FSDP fp8 runs): the fp8 weight copies are those of the gathered layers, not 70B x 1 B on every
    GPU; it fits on B200 and GB200 with the recomputation --recompute auto chooses, and on H100 with
    full recomputation. With micro-batch 4 and no recomputation it needs over 2x the memory and is
    refused with the numbers."""
    m = load_model("llama-3.1-70b")
    lay = TrainLayout(tp=1, pp=1, dp=64, zero=3, seq_len=8192, micro_batch=1, global_batch=128, dtype="fp8",
                      recompute="auto", framework="megatron-bridge")
    for name in ("b200", "gb200-nvl72", "h100-sxm"):
        hw = load_hardware(name)
        r = train_step(m, hw, lay, gpus=64)
        assert r.memory_bytes["total"] <= hw.device_bytes
        # two gathered layers (the current one and one prefetched; the embedding is the largest unit)
        assert r.memory_bytes["fp8_weight_cache"] / GiB < 3.0
        assert r.memory_bytes["fp8_weight_cache"] < r.memory_bytes["gathered_params"]
    gb = load_hardware("gb200-nvl72")
    ag = train_step(m, gb, dataclasses.replace(lay, fp8_all_gather=True), gpus=64)
    assert ag.memory_bytes["fp8_weight_cache"] == 0.0
    plain = train_step(m, gb, lay, gpus=64)
    assert ag.memory_bytes["gathered_params"] < plain.memory_bytes["gathered_params"]
    over = dataclasses.replace(lay, micro_batch=4, global_batch=256, recompute="none")
    need = memory_per_gpu(m, gb, over)["total"]
    assert need > 2.0 * gb.device_bytes
    with pytest.raises(InfeasibleError) as e:
        train_step(m, gb, over, gpus=64)
    msg = str(e.value)
    assert "\n" not in msg and f"{need / GiB:.1f} GiB per GPU" in msg and "184.0 GiB" in msg


def test_fp8_all_gather_halves_the_gathers(h100):
    m = load_model("llama-3.1-70b")
    lay = TrainLayout(dp=64, zero=3, seq_len=4096, global_batch=64, dtype="fp8", framework="torchtitan",
                      recompute="full", dp_overlap=False)
    bf = train_step(m, h100, lay)
    f8 = train_step(m, h100, dataclasses.replace(lay, fp8_all_gather=True))
    assert f8.breakdown_s["dp_comm"] < bf.breakdown_s["dp_comm"]
    assert bf.layout.fp8_recipe == "tensorwise"


def test_maxtext_remat_policies(h100, l8b):
    lay = TrainLayout(tp=1, dp=8, seq_len=8192, global_batch=16, framework="maxtext")
    res, taken = resolve_with_defaults(lay, h100)
    assert taken["--remat-policy"] == "full" and res.recompute == "full"
    times, mems = {}, {}
    for policy in ("minimal", "save_dot_except_mlp", "save_qkv_proj", "full"):
        r = train_step(l8b, h100, dataclasses.replace(lay, remat_policy=policy), check_memory=False)
        times[policy] = r.breakdown_s["recompute"]
        mems[policy] = r.memory_bytes["activations"]
    # saving less costs more recomputation
    assert times["minimal"] < times["save_dot_except_mlp"] < times["save_qkv_proj"] < times["full"]
    assert mems["minimal"] > mems["save_dot_except_mlp"] >= mems["save_qkv_proj"] > mems["full"]
    off = train_step(l8b, h100, dataclasses.replace(lay, remat_policy="minimal_offloaded"), check_memory=False)
    assert off.memory_bytes["activations"] == 0 and off.memory_bytes["activations_offloaded_host"] > 0


@pytest.mark.parametrize("args,needle", [
    (["--framework", "torchtitan", "--remat-policy", "minimal"], "--remat-policy minimal is a MaxText (JAX) option"),
    (["--framework", "megatron", "--remat-policy", "full"], "MaxText (JAX) option"),
    (["--framework", "megatron", "--selective-ac", "op"], "torchtitan's selective_ac_option"),
    (["--framework", "torchtitan", "--selective-ac", "x"], "--selective-ac: expected op or a layer interval"),
    (["--framework", "torchtitan", "--recompute-modules", "mlp"], "--recompute-modules is Megatron-Core's"),
    (["--framework", "maxtext", "--remat-policy", "full", "--recompute", "none"], "give one"),
    (["--zero", "1", "--reshard-after-forward", "never"], "--reshard-after-forward never is an FSDP"),
    (["--zero", "3", "--fp8-all-gather"], "--fp8-all-gather gathers fp8 weights"),
    (["--cp", "2", "--seq-len", "4098"], "--cp 2 does not divide the sequence"),
])
def test_framework_option_errors_are_one_line_exit_2(args, needle):
    r = _train(["--model", "llama-3.1-8b", "--gpus", "8", "--global-batch", "16", *args])
    assert r.exit_code == 2, r.output
    line = r.output.strip()
    assert "\n" not in line and "Traceback" not in line and needle in line, line


def test_unknown_remat_policy_is_a_usage_error():
    r = _train(["--framework", "maxtext", "--remat-policy", "everything"])
    assert r.exit_code == 2 and "Traceback" not in r.output


def test_api_keywords_take_profile_defaults():
    import servesim
    res = servesim.train(model="llama-3.1-8b", gpus=8, tp=2, global_batch=16, framework="torchtitan")
    assert res.summary["layout"]["sp"] is True
    with pytest.raises(ConfigError):
        servesim.train(model="llama-3.1-8b", gpus=8, global_batch=16, framework="torchtitan", remat_policy="full")


def test_ep_overlap_hides_the_all_to_alls_behind_compute(h100):
    """--ep-overlap: each MoE layer's dispatch / combine beside another micro-batch's compute: exposed
    only what the layer's compute cannot cover (plus the SMs the collective takes)."""
    m = load_model("mixtral-8x7b")
    lay = TrainLayout(tp=1, dp=8, ep=8, zero=1, seq_len=4096, global_batch=64, recompute="full")
    plain = train_step(m, h100, lay, check_memory=False)
    over = train_step(m, h100, dataclasses.replace(lay, ep_overlap=True), check_memory=False)
    assert plain.breakdown_s["ep_comm"] > 0
    assert over.breakdown_s["ep_comm"] < 0.3 * plain.breakdown_s["ep_comm"]
    assert over.step_time_s < plain.step_time_s
    with pytest.raises(ConfigError):
        train_step(load_model("llama-3.1-8b"), h100, TrainLayout(dp=8, ep_overlap=True))


def test_hybrid_sharding_dp_shard(h100):
    """--dp-shard N: model states sharded over N data-parallel ranks, replicated over the rest;
    by hand for ZeRO-3 (2 + 4 + 12 B per parameter / N), and the replicas' all-reduce costs time."""
    m = load_model("llama-3.1-8b")
    lay = TrainLayout(dp=64, zero=3, seq_len=8192, global_batch=128, framework="torchtitan", recompute="full",
                      dp_shard=8)
    assert lay.shard_groups() == (8, 8, 8, 8)
    mem = memory_per_gpu(m, h100, lay)
    n = m.param_count()
    assert mem["weights"] + mem["gradients"] + mem["optimizer"] == pytest.approx(18.0 * n / 8, rel=1e-9)
    full = memory_per_gpu(m, h100, dataclasses.replace(lay, dp_shard=None))
    assert full["optimizer"] == pytest.approx(mem["optimizer"] / 8)
    # gathers stay inside a node, the replicas reduce once per step: less DP time than sharding over 64
    hs = train_step(m, h100, dataclasses.replace(lay, dp_overlap=False))
    fs = train_step(m, h100, dataclasses.replace(lay, dp_shard=None, dp_overlap=False))
    assert hs.breakdown_s["dp_comm"] < fs.breakdown_s["dp_comm"]
    with pytest.raises(InfeasibleError) as e:
        train_step(m, h100, dataclasses.replace(lay, dp_shard=7))
    assert "--dp-shard 7 must divide dp*cp = 64" in str(e.value)
    with pytest.raises(ConfigError):
        train_step(m, h100, dataclasses.replace(lay, zero=0))


def test_torchao_tensorwise_is_dynamic_per_tensor_scaling(h100, l8b):
    """torchao's tensorwise recipe is per-tensor dynamic scaling: priced as Transformer Engine's
    current scaling (an amax read per cast), dearer than delayed scaling's history."""
    lay = TrainLayout(dp=8, seq_len=4096, global_batch=16, dtype="fp8", framework="torchtitan", recompute="none")
    tw = train_step(l8b, h100, dataclasses.replace(lay, fp8_recipe="tensorwise"))
    cur = train_step(l8b, h100, dataclasses.replace(lay, fp8_recipe="current"))
    dl = train_step(l8b, h100, dataclasses.replace(lay, fp8_recipe="delayed"))
    assert tw.step_time_s == pytest.approx(cur.step_time_s)
    assert tw.step_time_s > dl.step_time_s
