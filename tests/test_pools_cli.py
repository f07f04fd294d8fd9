"""Issue #18, pools on the command line and in the API: `--pool` specs parsed (one-line errors, exit 2),
the deployment rules, and each pool lowered to the kernel's arrays (KV blocks, CPU tier, links)."""
from __future__ import annotations

import numpy as np
import pytest

import servesim.api as api
from clihelp import one_line_error
from servesim.checks import sim_config
from servesim.engine import codes as C
from servesim.errors import ConfigError, InfeasibleError, ServesimWarning
from servesim.engine.lower import engine_options, lower_pools
from servesim.pools import PoolSpec, check_pool_capacity, parse_pool, specs_of

# llama-3.1-8b: 32 layers, 8 KV heads of dim 128, bf16 KV (its config.json): K and V of one token
# take 2 x 8 x 128 x 2 B = 4096 B per layer, 131072 B over 32 layers, on one GPU.
LLAMA8B_KV_PER_TOKEN = 2 * 8 * 128 * 2 * 32


@pytest.mark.parametrize("text, spec", [
    ("h100-sxm:tp2:x4", PoolSpec("h100-sxm", tp=2, pp=1, replicas=4, role="mixed")),
    ("a100-sxm-80gb:tp4:x2:decode", PoolSpec("a100-sxm-80gb", tp=4, replicas=2, role="decode")),
    ("h100-sxm:tp2:pp2:x1:prefill", PoolSpec("h100-sxm", tp=2, pp=2, replicas=1, role="prefill")),
    ("h100-sxm:tp1:x3:mixed:dtype=fp8:engine=sglang",
     PoolSpec("h100-sxm", tp=1, replicas=3, dtype="fp8", engine="sglang")),
    (" h100-sxm : x2 : tp8 ", PoolSpec("h100-sxm", tp=8, replicas=2)),
])
def test_good_specs_parse(text, spec):
    assert parse_pool(text) == spec
    assert parse_pool(spec.text) == spec          # the canonical text reads back the same


@pytest.mark.parametrize("text, words", [
    ("h100:tp1:x2", ["unknown hardware 'h100'", "h100-sxm", "a100-sxm-80gb"]),
    ("h100-sxm:tp0:x2", ["tp0: must be >= 1"]),
    ("h100-sxm:tp1:x0", ["x0: must be >= 1"]),
    ("h100-sxm:tp1:pp0:x1", ["pp0: must be >= 1"]),
    ("h100-sxm:tp1", ["no xR"]),
    ("h100-sxm:x1", ["no tpN"]),
    ("h100-sxm:tp1:x2:encode", ["cannot read 'encode'", "mixed, prefill, decode"]),
    ("h100-sxm:tp1:tp2:x2", ["tp given twice"]),
    ("h100-sxm:tp1:x2:dtype=fp9", ["dtype 'fp9' unknown"]),
    (":tp1:x2", ["no hardware"]),
])
def test_bad_specs_are_one_line_errors_naming_the_option_the_text_and_the_form(text, words):
    line = one_line_error("simulate", "--pool", text, must_contain=["--pool", repr(text.strip()) if text.strip()
                                                                    != text else repr(text), "HW:tpN"] + words)
    assert "e.g. h100-sxm:tp2:x4" in line
    with pytest.raises(ConfigError, match="--pool"):
        sim_config(None, pool=(text,))


@pytest.mark.parametrize("pools, words", [
    (["h100-sxm:tp1:x2:prefill"], ["prefill pools without a decode pool"]),
    (["h100-sxm:tp1:x2:decode"], ["decode pools without a prefill pool"]),
    (["h100-sxm:tp1:x2:prefill", "h100-sxm:tp1:x2:decode", "h100-sxm:tp1:x1"],
     ["h100-sxm:tp1:x1", "mixed pools together with prefill/decode pools are not modelled"]),
])
def test_deployment_rules(pools, words):
    args = [a for p in pools for a in ("--pool", p)]
    one_line_error("simulate", *args, must_contain=words)


def test_pool_replaces_the_single_pool_options():
    one_line_error("simulate", "--pool", "h100-sxm:tp1:x2", "--tp", "2",
                   must_contain=["--pool and --tp 2 contradict", "drop --tp"])
    one_line_error("simulate", "--pool", "h100-sxm:tp1:x2", "--replicas", "3", must_contain=["--replicas 3"])


def test_cpu_tier_needs_prefix_caching():
    one_line_error("simulate", "--cpu-kv-gib", "4", "--no-prefix-caching",
                   must_contain=["--cpu-kv-gib 4 and --no-prefix-caching contradict"])
    one_line_error("simulate", "--cpu-kv-gib", "-1", must_contain=["--cpu-kv-gib -1"])
    one_line_error("simulate", "--kv-link", "pcie", must_contain=["--kv-link 'pcie' unknown", "nvlink"])


def test_nvlink_forced_where_there_is_none():
    one_line_error("simulate", "--pool", "l4:tp1:x1:prefill", "--pool", "l4:tp1:x1:decode", "--kv-link", "nvlink",
                   "--num-requests", "5", must_contain=["--kv-link nvlink: l4 has no scale-up fabric"])


def test_transfer_options_without_pd_warn():
    with pytest.warns(ServesimWarning, match="--layerwise-transfer does nothing without prefill and decode pools"):
        sim_config(None, layerwise_transfer=True)
    with pytest.warns(ServesimWarning, match="--kv-link nic does nothing"):
        sim_config(None, pool=("h100-sxm:tp1:x2",), kv_link="nic")


def test_block_size_the_engine_does_not_take_with_prefix_caching():
    # vLLM docs: --block-size choices up to 32 on CUDA; 64 is refused with prefix caching on
    one_line_error("simulate", "--block-size", "64", "--num-requests", "10",
                   must_contain=["--block-size 64", "vllm", "8, 16, 32", "--no-prefix-caching"])


def test_block_sizes_accepted():
    from servesim.config.engine import load_engine
    from servesim.pools import check_block_size
    for engine, bs, caching in (("vllm", 8, True), ("vllm", 32, True), ("vllm", 64, False), ("sglang", 1, True),
                                ("sglang", 48, True), ("trtllm", 64, True)):
        cfg, *_ = api.resolve(sim_config(None, engine=engine, block_size=bs, prefix_caching=caching))
        check_block_size(cfg, load_engine(engine))
    for engine, bs in (("vllm", 1), ("vllm", 128), ("trtllm", 32)):
        cfg, *_ = api.resolve(sim_config(None, engine=engine, block_size=bs))
        with pytest.raises(ConfigError, match=f"--block-size {bs} is not supported by {engine}"):
            check_block_size(cfg, load_engine(engine))


def test_api_takes_a_tuple_or_plus_joined_text():
    a = sim_config(None, pool=("h100-sxm:tp1:x2:prefill", "h100-sxm:tp1:x2:decode"))
    b = sim_config(None, pool="h100-sxm:tp1:x2:prefill+h100-sxm:tp1:x2:decode")
    assert a.pool == b.pool == ("h100-sxm:tp1:x2:prefill", "h100-sxm:tp1:x2:decode")
    assert specs_of(sim_config(None, hardware="a100-sxm-80gb", tp=2, replicas=3)) == \
        [PoolSpec("a100-sxm-80gb", tp=2, pp=1, replicas=3, role="mixed")]


def test_grid_takes_pool_specs():
    from servesim.planning.grid import expand, parse_grid
    g = parse_grid(["pool=h100-sxm:tp1:x2:prefill+h100-sxm:tp1:x2:decode,h100-sxm:tp1:x4"])
    assert g == [("pool", [("h100-sxm:tp1:x2:prefill", "h100-sxm:tp1:x2:decode"), ("h100-sxm:tp1:x4",)])]
    assert [p.pool for p in expand(api.SimConfig(), g, None)] == [g[0][1][0], g[0][1][1]]
    with pytest.raises(ConfigError, match="--pool 'h100:tp1:x1'"):
        parse_grid(["pool=h100:tp1:x1"])


def test_prefix_caching_flag_and_engine_default():
    from click.testing import CliRunner
    from servesim.cli import main
    params = {p.name: p for p in main.commands["simulate"].params}
    assert params["prefix_caching"].opts == ["--prefix-caching"]
    assert params["prefix_caching"].secondary_opts == ["--no-prefix-caching"]
    assert "--no-prefix-caching" in CliRunner().invoke(main, ["simulate", "--help"], terminal_width=300).output
    for engine in ("vllm", "sglang", "trtllm"):   # all three turn it on by default (engines/*.toml cite it)
        cfg, *_ = api.resolve(sim_config(None, engine=engine))
        assert cfg.prefix_caching is True
    cfg, *_ = api.resolve(sim_config(None, prefix_caching=False))
    assert cfg.prefix_caching is False


# ------------------------------------------------------------------------------------------------
# lowering


def _lower(*pools, **kw):
    cfg, model, _, _ = api.resolve(sim_config(None, pool=pools, **kw))
    return lower_pools(cfg, model, specs_of(cfg), engine_options(cfg))


def test_lowering_blocks_kv_bytes_and_cpu_tier_by_hand():
    lowered, pools = _lower("h100-sxm:tp1:x2:prefill", "h100-sxm:tp2:x3:decode", num_gpu_blocks=1000, cpu_kv_gib=1.0)
    assert pools.role.tolist() == [C.PREFILL, C.DECODE]
    assert pools.first.tolist() == [0, 2] and pools.count.tolist() == [2, 3]
    assert pools.num_blocks.tolist() == [1000, 1000]               # --num-gpu-blocks: every pool
    assert pools.watermark_blocks.tolist() == [0, 0]               # vLLM V1: no watermark (engines/vllm.toml)
    # per GPU: TP=2 halves the 8 KV heads; the replica's total is the same 128 KiB per token
    assert pools.kv_bytes_per_token.tolist() == [LLAMA8B_KV_PER_TOKEN, LLAMA8B_KV_PER_TOKEN / 2]
    assert pools.kv_bytes_total.tolist() == [LLAMA8B_KV_PER_TOKEN] * 2
    assert pools.kv_gpus.tolist() == [1, 2] and pools.n_layers.tolist() == [32, 32]
    # 1 GiB of host memory per replica / (16 tokens x 128 KiB) = 2**30 / 2**21 = 512 blocks
    assert pools.cpu_blocks.tolist() == [512, 512]
    # router weight: TP x PP x the bf16 dense peak (989 TFLOP/s, hardware_profiles/h100-sxm.toml), PFLOP/s
    assert pools.weight == pytest.approx([0.989, 2 * 0.989])
    assert [lp.spec.gpus for lp in lowered] == [2, 6]


def test_lowering_blocks_from_memory_match_the_single_pool_run():
    """Without --num-gpu-blocks a pool's blocks are what engine_config gives its replica (the single-pool
    figure reported in the config), each pool on its own hardware."""
    _, pools = _lower("h100-sxm:tp1:x1", "a100-sxm-80gb:tp2:x1")
    for k, (hw, tp) in enumerate((("h100-sxm", 1), ("a100-sxm-80gb", 2))):
        cfg, model, hwp, _ = api.resolve(sim_config(None, hardware=hw, tp=tp))
        rc = api.replica_of(cfg, model, hwp)
        assert pools.num_blocks[k] == rc.memory.kv_capacity_tokens // 16
    assert pools.cpu_blocks.tolist() == [0, 0]


def test_link_nvlink_within_a_domain_else_the_nic():
    # 2 + 2 GPUs of h100-sxm fit its 8-GPU NVLink domain: the point-to-point rate above the size step,
    # 900 GB/s bidirectional / 2 x 0.80 (hardware_profiles/h100-sxm.toml)
    _, pools = _lower("h100-sxm:tp1:x2:prefill", "h100-sxm:tp1:x2:decode")
    assert pools.link_bw[0, 1] == pytest.approx(450e9 * 0.80)
    assert pools.link_alpha[0, 1] == pytest.approx(7.64e-6)
    # 8 + 8 GPUs do not: the NIC, 400 Gb/s x 0.80 = 40 GB/s, 15 us
    _, pools = _lower("h100-sxm:tp4:x2:prefill", "h100-sxm:tp4:x2:decode")
    assert pools.link_bw[0, 1] == pytest.approx(400e9 / 8 * 0.80)
    assert pools.link_alpha[0, 1] == pytest.approx(15e-6)
    # different hardware: the NIC, the slower side's (a100-sxm-80gb: 200 Gb/s x 0.80)
    _, pools = _lower("h100-sxm:tp1:x1:prefill", "a100-sxm-80gb:tp1:x1:decode")
    assert pools.link_bw[0, 1] == pytest.approx(200e9 / 8 * 0.80)
    # forced
    _, pools = _lower("h100-sxm:tp1:x2:prefill", "h100-sxm:tp1:x2:decode", kv_link="nic")
    assert pools.link_bw[0, 1] == pytest.approx(40e9)
    _, pools = _lower("h100-sxm:tp4:x2:prefill", "h100-sxm:tp4:x2:decode", kv_link="nvlink")
    assert pools.link_bw[0, 1] == pytest.approx(360e9)


def test_a_pool_too_small_for_one_request_is_named():
    lowered, _ = _lower("h100-sxm:tp1:x1:prefill", "h100-sxm:tp1:x1:decode", num_gpu_blocks=10)
    output = np.array([20, 20])
    check_pool_capacity(lowered, np.array([100, 140]), output, 16, given_blocks=True)   # 160 tokens = 10 blocks
    # 150 + 20 = 170 tokens need 11 blocks: the decode pool (10 blocks) cannot hold it; the prefill pool
    # needs only the prompt, 150 tokens = 10 blocks
    with pytest.raises(ConfigError, match=r"--pool h100-sxm:tp1:x1:decode: .*10 KV blocks .*170 tokens = 11 blocks"):
        check_pool_capacity(lowered, np.array([100, 150]), output, 16, given_blocks=True)
    # a 161-token prompt (11 blocks) does not fit the prefill pool: it is named first
    with pytest.raises(ConfigError, match=r"--pool h100-sxm:tp1:x1:prefill: .*the longest prompt, 161 tokens"):
        check_pool_capacity(lowered, np.array([161]), np.array([1]), 16, given_blocks=True)
    # blocks from memory: infeasible (a sweep marks the point so); a mixed pool with --num-gpu-blocks must
    # hold the longest request, without it the shortest
    with pytest.raises(InfeasibleError, match="--pool h100-sxm:tp1:x1:decode"):
        check_pool_capacity(lowered, np.array([100, 150]), output, 16)
    mixed, _ = _lower("h100-sxm:tp1:x2", num_gpu_blocks=10)
    check_pool_capacity(mixed, np.array([100, 150]), output, 16)
    with pytest.raises(ConfigError, match=r"the longest request \(prompt \+ output\), 170 tokens"):
        check_pool_capacity(mixed, np.array([100, 150]), output, 16, given_blocks=True)
    with pytest.raises(InfeasibleError, match=r"even the shortest request \(prompt \+ output\), 170 tokens"):
        check_pool_capacity(mixed, np.array([150]), np.array([20]), 16)
    one_line_error("simulate", "--pool", "h100-sxm:tp1:x1:prefill", "--pool", "h100-sxm:tp1:x1:decode",
                   "--num-gpu-blocks", "10", "--isl", "150", "--osl", "20", "--num-requests", "5",
                   must_contain=["--pool h100-sxm:tp1:x1:decode", "170 tokens = 11 blocks"])
