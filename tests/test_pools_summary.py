"""Issue #18, the summary of a deployment of pools: per-pool utilisation, KV and queueing, the prefix
cache's counters, the KV transfers, and the deployment's GPUs and $/hour summed over the pools. The
records are built by hand (no kernel), so every expected value is worked out here."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

import servesim.api as api
from servesim.engine import codes as C
from servesim.engine import kernel as K
from servesim.metrics import kv_transfer_summary, pools_summary, prefix_cache_summary, requests_frame

LLAMA8B_KV = 2 * 8 * 128 * 2 * 32     # B per token: K and V, 8 KV heads of 128, bf16, 32 layers (config.json)

POOLS = [dict(name="h100-sxm:tp1:x2:prefill", role="prefill", hardware="h100-sxm", tp=1, pp=1, replicas=2, first=0,
              num_gpus=2, usd_per_hour=8.5, kv_blocks_per_replica=100),
         dict(name="h100-sxm:tp1:x1:decode", role="decode", hardware="h100-sxm", tp=1, pp=1, replicas=1, first=2,
              num_gpus=1, usd_per_hour=4.25, kv_blocks_per_replica=200)]


def _hand_run():
    """Four requests on a 2-replica prefill pool and a 1-replica decode pool, over 10 s."""
    stats = np.zeros(K.N_STATS)
    stats[K.STAT_END_TIME] = 10.0
    pool_stats = np.zeros((2, K.N_STATS))
    pool_stats[0, [K.STAT_BUSY, K.STAT_INFLIGHT_TIME, K.STAT_KV_TIME, K.STAT_KV_MAX, K.STAT_SEQS_TIME]] = \
        [12.0, 16.0, 500.0, 80, 24.0]
    pool_stats[1, [K.STAT_BUSY, K.STAT_INFLIGHT_TIME, K.STAT_KV_TIME, K.STAT_KV_MAX, K.STAT_SEQS_TIME]] = \
        [5.0, 9.0, 1000.0, 150, 150.0]
    out = SimpleNamespace(stats=stats, pool_stats=pool_stats)
    # request 3 has a 1-token output: done on its prefill replica, no transfer
    df = pd.DataFrame({"arrival_s": [0.0, 1.0, 2.0, 3.0], "queue_s": [0.1, 0.3, 0.0, 0.5],
                       "replica": [2, 2, 2, 1], "pf_replica": [0, 1, 0, -1],
                       "xfer_start_s": [0.5, 1.6, 2.4, np.nan], "xfer_end_s": [0.52, 1.64, 2.46, np.nan]})
    return out, df


def test_per_pool_utilisation_kv_and_queueing_by_hand():
    out, df = _hand_run()
    pf, dc = pools_summary(df, out, POOLS, warmup=0.0)
    assert pf["utilisation"] == pytest.approx(12.0 / (2 * 10.0))      # busy / (replicas x time)
    assert pf["busy_fraction"] == pytest.approx(16.0 / 20.0)
    assert pf["kv_utilisation"] == pytest.approx(500.0 / (10.0 * 2 * 100))
    assert pf["kv_max"] == pytest.approx(0.8)
    assert dc["utilisation"] == pytest.approx(0.5) and dc["kv_utilisation"] == pytest.approx(0.5)
    assert dc["kv_max"] == pytest.approx(0.75)
    assert pf["mean_batch_size"] == pytest.approx(2.0) and dc["mean_batch_size"] == pytest.approx(30.0)
    # every request entered the prefill pool: queues 100, 300, 0, 500 ms
    assert pf["num_requests"] == 4
    assert pf["queue_ms"]["mean"] == pytest.approx(225.0)
    assert pf["queue_ms"]["p50"] == pytest.approx(200.0)            # halfway between 100 and 300
    assert "queue_ms" not in dc                                      # decode start is not recorded
    # the decode pool decoded requests 0-2, transfers of 20, 40 and 60 ms
    assert dc["num_requests"] == 3
    assert dc["kv_transfer_ms"]["mean"] == pytest.approx(40.0) and dc["kv_transfer_ms"]["p50"] == pytest.approx(40.0)
    assert (pf["name"], pf["usd_per_hour"], dc["num_gpus"]) == ("h100-sxm:tp1:x2:prefill", 8.5, 1)


def test_warmup_leaves_out_the_early_requests():
    out, df = _hand_run()
    pf, dc = pools_summary(df, out, POOLS, warmup=0.5)
    assert pf["num_requests"] == 3 and pf["queue_ms"]["mean"] == pytest.approx(800.0 / 3)
    assert dc["kv_transfer_ms"]["mean"] == pytest.approx(50.0)
    kv = kv_transfer_summary(df, warmup=0.5)
    assert kv["count"] == 2 and kv["p50"] == pytest.approx(50.0) and kv["p90"] == pytest.approx(58.0)


def test_prefix_cache_counters():
    prefix = np.zeros(C.N_PREFIX)
    prefix[[C.HIT_GPU_TOKENS, C.HIT_CPU_TOKENS, C.LOOKUP_TOKENS, C.GPU_EVICTIONS, C.CPU_EVICTIONS]] = \
        [300, 100, 1000, 7, 2]
    s = prefix_cache_summary(prefix)
    assert s["hit_rate"] == pytest.approx(0.4)                        # (300 + 100) / 1000
    assert (s["gpu_hits"], s["cpu_hits"], s["evictions"]) == (300, 100, {"gpu": 7, "cpu": 2})
    assert prefix_cache_summary(np.zeros(C.N_PREFIX))["hit_rate"] is None


def test_a_request_caught_in_transfer_is_counted_unfinished():
    n = 2
    out = SimpleNamespace(arrival=np.zeros(n), scheduled=np.zeros(n), first_token=np.full(n, np.nan),
                          finish=np.full(n, np.nan), preemptions=np.zeros(n, np.int64),
                          replica=np.zeros(n, np.int64), status=np.array([C.TRANSFER, C.WAITING]),
                          max_gap=np.zeros(n))
    df = requests_frame(out, [10, 10], [5, 5])
    assert df.status.tolist() == ["transfer", "waiting"]


# ------------------------------------------------------------------------------------------------
# the API end to end around a stand-in kernel


def _fake_run(seen):
    def run(inputs, threads=1):
        cfg, pools = inputs.cfg, inputs.pools
        seen.update(costs=inputs.ps, cfg=cfg, pools=pools, chains=inputs.chains)
        n = len(inputs.arrival)
        arr = np.asarray(inputs.arrival)
        stats = np.zeros(K.N_STATS)
        stats[K.STAT_END_TIME] = float(arr.max() + 2.0)
        stats[K.STAT_BUSY] = stats[K.STAT_INFLIGHT_TIME] = 1.0
        pool_stats = np.zeros((len(pools.role), K.N_STATS))
        pool_stats[:, K.STAT_KV_MAX] = 1
        prefix = np.zeros(C.N_PREFIX)
        prefix[[C.HIT_GPU_TOKENS, C.LOOKUP_TOKENS]] = [64, 256]
        entry, decode = int(pools.first[0]), int(pools.first[-1])
        return SimpleNamespace(
            arrival=arr - cfg.frontend, scheduled=arr + 0.01, first_token=arr + 0.1, finish=arr + 1.0,
            preemptions=np.zeros(n, np.int64), replica=np.full(n, decode, np.int64),
            status=np.full(n, C.DONE, np.int64), max_gap=np.full(n, 0.05), gap_hist=np.zeros(C.GAP_BINS, np.int64),
            log_time=np.zeros(0), log_replica=np.zeros(0, np.int64), log_seqs=np.zeros(0, np.int64),
            log_tokens=np.zeros(0, np.int64), log_kv_blocks=np.zeros(0, np.int64), log_waiting=np.zeros(0, np.int64),
            log_count=0, stats=stats, pool_stats=pool_stats, prefix=prefix,
            xfer_start=arr + 0.07, xfer_end=arr + 0.1, pf_replica=np.full(n, entry, np.int64))
    return run


def test_api_lowers_every_pool_and_sums_gpus_and_price(monkeypatch):
    seen = {}
    monkeypatch.setattr(api, "run", _fake_run(seen))
    res = api.simulate(pool=("h100-sxm:tp1:x2:prefill", "a100-sxm-80gb:tp2:x1:decode"), num_requests=20, rate=2.0,
                       isl=300, osl=20, num_system_prompts=2, system_prompt_len=64, question_per="request")
    cfg, pools, chains = seen["cfg"], seen["pools"], seen["chains"]
    assert cfg.replicas == 3 and cfg.prefix_caching == 1 and cfg.layerwise == 0
    assert pools.role.tolist() == [C.PREFILL, C.DECODE] and pools.first.tolist() == [0, 2]
    # the shared 64-token system prompt: 4 blocks of 16 in every request's chain
    assert chains.length.tolist() == [4] * 20
    # one question per user (the default): each of the 2 users re-sends its 300-token prompt, whose
    # 300 // 16 = 18 full blocks are in every chain
    api.simulate(pool=("h100-sxm:tp1:x2:prefill", "a100-sxm-80gb:tp2:x1:decode"), num_requests=20, rate=2.0,
                 isl=300, osl=20, num_system_prompts=2, system_prompt_len=64)
    assert seen["chains"].length.tolist() == [18] * 20
    s = res.summary
    # 2 x 1 h100-sxm at $4.25 + 1 x 2 a100-sxm-80gb at $2.21 (hardware_profiles/*.toml)
    assert s["config"]["num_gpus"] == 4
    assert s["cost"]["usd_per_hour"] == pytest.approx(2 * 4.25 + 2 * 2.21)
    assert [p["usd_per_hour"] for p in s["pools"]] == pytest.approx([8.5, 4.42])
    assert [p["role"] for p in s["pools"]] == ["prefill", "decode"]
    assert s["prefix_cache"]["hit_rate"] == pytest.approx(0.25)
    assert s["kv_transfer_ms"]["p50"] == pytest.approx(30.0) and s["kv_transfer_ms"]["count"] == 20
    assert s["pools"][0]["queue_ms"]["mean"] == pytest.approx(10.0)
    assert s["config"]["pool"] == "h100-sxm:tp1:x2:prefill+a100-sxm-80gb:tp2:x1:decode"
    assert (s["config"]["replicas"], s["config"]["hardware"], s["config"]["tp"]) == (3, "h100-sxm+a100-sxm-80gb", None)
    assert s["config"]["prefix_caching"] is True
    assert {"pf_replica", "xfer_start_s", "xfer_end_s"} <= set(res.requests.columns)
    # --price replaces every pool's
    res = api.simulate(pool=("h100-sxm:tp1:x2:prefill", "a100-sxm-80gb:tp2:x1:decode"), num_requests=20, rate=2.0,
                       price=1.0)
    assert res.summary["cost"]["usd_per_hour"] == pytest.approx(4.0)


def test_no_prefix_caching_passes_empty_chains(monkeypatch):
    seen = {}
    monkeypatch.setattr(api, "run", _fake_run(seen))
    res = api.simulate(pool=("h100-sxm:tp1:x2",), num_requests=10, rate=2.0, prefix_caching=False,
                       num_system_prompts=2, system_prompt_len=64)
    ch = seen["chains"]
    assert ch.length.tolist() == [0] * 10 and ch.ids.size == 0 and ch.next_turn.tolist() == [-1] * 10
    assert "prefix_cache" not in res.summary and "kv_transfer_ms" not in res.summary
    assert seen["cfg"].prefix_caching == 0


def test_single_pool_runs_keep_their_config_keys():
    res = api.simulate(num_requests=20, rate=2.0)
    for key in ("pool", "prefix_caching", "cpu_kv_gib", "kv_link", "layerwise_transfer"):
        assert key not in res.summary["config"]
    assert "pools" not in res.summary and "prefix_cache" not in res.summary
    res = api.simulate(num_requests=20, rate=2.0, prefix_caching=False)
    assert res.summary["config"]["prefix_caching"] is False
    # given, they are shown (a sweep's grid columns read them), at their value
    c = api.simulate(num_requests=20, rate=2.0, prefix_caching=True, cpu_kv_gib=0.0, kv_link="auto").summary["config"]
    assert (c["prefix_caching"], c["cpu_kv_gib"], c["kv_link"]) == (True, 0.0, "auto") and "pool" not in c


# ------------------------------------------------------------------------------------------------
# end to end, on the pools kernel


def _cli_json(*args) -> dict:
    import json

    from click.testing import CliRunner

    from servesim.cli import main
    r = CliRunner().invoke(main, ["simulate", *args, "--format", "json"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def test_pd_end_to_end_one_request_transfer_by_hand():
    """One 1000-token prompt from a prefill to a decode replica of h100-sxm (2 GPUs: one NVLink domain):
    llama-3.1-8b's 131072 B of KV per token over NVLink's point-to-point rate above the size step,
    450 GB/s x 0.80, after its 7.64 us latency (hardware_profiles/h100-sxm.toml)."""
    s = _cli_json("--pool", "h100-sxm:tp1:x1:prefill", "--pool", "h100-sxm:tp1:x1:decode", "--model", "llama-3.1-8b",
                  "--isl", "1000", "--osl", "10", "--num-requests", "1", "--offline")
    want_ms = (7.64e-6 + 1000 * LLAMA8B_KV / (450e9 * 0.80)) * 1e3
    assert s["kv_transfer_ms"]["count"] == 1
    assert s["kv_transfer_ms"]["p50"] == pytest.approx(want_ms, rel=1e-9)
    assert [p["num_requests"] for p in s["pools"]] == [1, 1]


def test_pd_end_to_end_two_hundred_requests():
    s = _cli_json("--pool", "h100-sxm:tp1:x2:prefill", "--pool", "h100-sxm:tp1:x2:decode", "--model", "llama-3.1-8b",
                  "--num-requests", "200")
    assert s["num_completed"] == 200 and s["config"]["num_gpus"] == 4
    assert [p["role"] for p in s["pools"]] == ["prefill", "decode"]
    # requests with a 1-token answer finish on their prefill replica, without a transfer
    assert 0 < s["kv_transfer_ms"]["count"] <= 200 and s["kv_transfer_ms"]["p50"] > 0
    assert s["pools"][0]["num_requests"] == 200
    assert s["cost"]["usd_per_hour"] == pytest.approx(4 * 4.25)


def test_heterogeneous_pools_end_to_end():
    s = _cli_json("--pool", "h100-sxm:tp2:x4", "--pool", "a100-sxm-80gb:tp4:x2", "--model", "llama-3.1-8b",
                  "--num-requests", "300", "--router", "least-requests")
    assert s["num_completed"] == 300 and "kv_transfer_ms" not in s
    # 4 x 2 h100-sxm at $4.25 + 2 x 4 a100-sxm-80gb at $2.21 (hardware_profiles/*.toml)
    assert s["config"]["num_gpus"] == 16
    assert s["cost"]["usd_per_hour"] == pytest.approx(8 * 4.25 + 8 * 2.21)
    assert sum(p["num_requests"] for p in s["pools"]) == 300
    assert all(p["num_requests"] > 0 and 0 < p["utilisation"] <= 1 for p in s["pools"])


def test_one_mixed_pool_is_the_single_pool_shorthand():
    """`--pool h100-sxm:tp1:x2` lowers to the same replica, blocks and router as `--replicas 2`: every
    summary figure is the same (with and without shared system prompts)."""
    for kw in ({}, dict(num_system_prompts=4, system_prompt_len=512, users_per_system_prompt=8)):
        a = api.simulate(num_requests=200, seed=1, replicas=2, **kw).summary
        b = api.simulate(num_requests=200, seed=1, pool=("h100-sxm:tp1:x2",), **kw).summary
        assert [k for k in a if k != "config" and a[k] != b[k]] == []
        assert b["pools"][0]["num_requests"] == 200


def test_prefix_hit_rate_on_shared_prompts_by_hand():
    """300 requests of 1024 tokens at 2 req/s on one replica, 4 system prompts of 512 tokens: every
    request but the first of each group hits its 512 tokens (32 full blocks of 16), so the hit rate is
    (300 - 4) x 512 / (300 x 1024)."""
    s = api.simulate(num_requests=300, seed=1, rate=2.0, isl=1024, osl=32, num_system_prompts=4,
                     system_prompt_len=512, users_per_system_prompt=8, pool=("h100-sxm:tp1:x1",),
                     question_per="request").summary
    assert s["prefix_cache"]["lookup_tokens"] == 300 * 1024
    assert s["prefix_cache"]["hit_rate"] == pytest.approx((300 - 4) * 512 / (300 * 1024), abs=0.01)


def test_prefix_hit_rate_on_prompts_resent_per_user_by_hand():
    """As above with one question per user: 32 users (all drawn in 300 requests) each re-send one
    1024-token prompt. A user's later requests hit all of it but the block holding the last token
    (1008 tokens: vLLM recomputes the last prompt token), its first request only the group's 512-token
    system prompt, unless it is the group's first request too (4 of them hit nothing)."""
    s = api.simulate(num_requests=300, seed=1, rate=2.0, isl=1024, osl=32, num_system_prompts=4,
                     system_prompt_len=512, users_per_system_prompt=8, pool=("h100-sxm:tp1:x1",)).summary
    hits = (300 - 32) * 1008 + (32 - 4) * 512
    assert s["prefix_cache"]["gpu_hits"] == hits
