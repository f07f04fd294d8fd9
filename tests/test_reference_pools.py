"""The reference simulator's pools, prefix cache, sessions and prefill/decode disaggregation
(engine/POOLS.md), checked against values derived by hand from the cost model's iteration prices."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from servesim.costmodel.fields import table
import servesim.api as api
from servesim.checks import sim_config
from servesim.costmodel.iteration import iteration_components
from servesim.engine import codes as C
from servesim.engine import state as S
from servesim.engine.lower import EngineOptions, engine_config, engine_options, one_pool_inputs
from servesim.errors import ConfigError
from servesim.reference.sim import KVCache, reference_run, reference_simulate_pools

from conftest import shared_prefix_chains

BS = 16
KVB = 131072.0          # llama-3.1-8b bf16: 2 x 8 KV heads x 128 x 32 layers x 2 B per token


def some(values, default):
    """Every value of a grid; those outside `default` run under the slow marker (CI runs them too),
    so the default test run keeps a representative corner of each grid."""
    return [v if v in default else pytest.param(v, marks=pytest.mark.slow) for v in values]


DEFAULT_POLICIES = {"vllm", "static"}
DEFAULT_ROUTERS = {"round-robin", "least-requests", "prefix-aware"}



def pools_of(specs, link_bw=1e9, link_alpha=0.0):
    """Pools from a list of per-pool dicts (role, count, num_blocks; the rest defaulted)."""
    first, arrays = 0, {k: [] for k in S.Pools._fields if k not in ("link_bw", "link_alpha")}
    for sp in specs:
        sp = dict(dict(role=C.MIXED, count=1, pp=1, num_blocks=1000, watermark_blocks=0, cpu_blocks=0,
                       kv_bytes_per_token=KVB, kv_bytes_total=KVB, kv_gpus=1, n_layers=32, weight=1.0), **sp)
        sp["first"] = first
        first += sp["count"]
        for k in arrays:
            arrays[k].append(sp[k])
    P = len(specs)
    ints = {"role", "first", "count", "pp", "num_blocks", "watermark_blocks", "cpu_blocks", "kv_gpus", "n_layers"}
    out = {k: np.array(v, np.int64 if k in ints else np.float64) for k, v in arrays.items()}
    return S.Pools(link_bw=np.full((P, P), float(link_bw)), link_alpha=np.full((P, P), float(link_alpha)), **out)


def chains_of(lists, next_turn=None, think=None):
    n = len(lists)
    start = np.cumsum([0] + [len(x) for x in lists[:-1]]).astype(np.int64)
    ids = np.array([b for x in lists for b in x], np.int64)
    return S.Chains(start=start, length=np.array([len(x) for x in lists], np.int64), ids=ids,
                    next_turn=np.full(n, -1, np.int64) if next_turn is None else np.array(next_turn, np.int64),
                    think=np.zeros(n) if think is None else np.array(think, np.float64))


def config(rc, pools, **opts):
    caching = opts.pop("prefix_caching", 0)
    layerwise = opts.pop("layerwise", 0)
    base = dict(max_num_seqs=16, max_num_batched_tokens=512, block_size=BS)
    cfg = engine_config(EngineOptions(**(base | opts)), rc)
    return cfg._replace(replicas=int(pools.count.sum()), pp=int(pools.pp.max()), prefix_caching=caching,
                        layerwise=layerwise)


def run(rc, cfg, pools, arrival, prompt, output, chains=None, ps=None):
    n = len(prompt)
    ps = tuple(rc.params for _ in pools.role) if ps is None else ps
    chains = chains_of([[] for _ in range(n)]) if chains is None else chains
    u = np.linspace(0.1, 0.9, n)
    return reference_simulate_pools(ps, cfg, pools, np.asarray(arrival, np.float64), np.asarray(prompt, np.int64),
                                    np.asarray(output, np.int64), u, u[::-1].copy(), chains)


def prefill_cost(p, c, ctx=0):
    """One micro-batch of one prompt chunk of c tokens over ctx cached ones that finishes the prompt."""
    return iteration_components(table(p), float(c), 1.0, 1.0, c * (ctx + (c + 1.0) / 2.0), float(ctx + c), 0.0, 0.0)


def decode_cost(p, ctx):
    """One micro-batch of one decode whose KV holds ctx tokens."""
    return iteration_components(table(p), 0.0, 0.0, 1.0, 0.0, 0.0, 1.0, ctx + 1.0)


PD = [dict(role=C.PREFILL), dict(role=C.DECODE)]


# ---------------------------------------------------------------- prefill/decode disaggregation
def test_one_request_ttft_is_prefill_plus_transfer(replica_cost):
    rc = replica_cost()
    p = rc.params
    bw, alpha = 50e9, 20e-6
    pools = pools_of([dict(role=C.PREFILL, kv_bytes_total=2 * KVB, kv_gpus=2),
                      dict(role=C.DECODE, kv_bytes_total=4 * KVB, kv_gpus=4)], bw, alpha)
    ref = run(rc, config(rc, pools), pools, [0.0], [300], [3])
    t_pf = prefill_cost(p, 300).latency
    nbytes = 300 * 2 * KVB / 2          # per GPU pair: the prefill's KV over min(2, 4) GPUs
    t_x = t_pf + nbytes / bw + alpha
    assert ref["xfer_start"][0] == t_pf
    assert ref["xfer_end"][0] == pytest.approx(t_x, rel=1e-12)
    assert ref["first_token"][0] == ref["xfer_end"][0]
    # two decodes on the decode replica (KV of 300 then 301 tokens, one token each)
    t_end = ref["first_token"][0] + decode_cost(p, 300).latency + decode_cost(p, 301).latency
    assert ref["finish"][0] == pytest.approx(t_end, rel=1e-12)
    assert ref["pf_replica"][0] == 0 and ref["replica"][0] == 1 and ref["status"][0] == C.DONE
    assert ref["scheduled"][0] == 0.0
    ps = ref["pool_stats"]
    assert ps[0, S.STAT_ITERATIONS] == 1 and ps[1, S.STAT_ITERATIONS] == 2
    assert ps[0, S.STAT_BUSY] == prefill_cost(p, 300).interval
    np.testing.assert_array_equal(ref["free_blocks"], pools.num_blocks)


def test_one_token_requests_stay_on_the_prefill_replica(replica_cost):
    rc = replica_cost()
    pools = pools_of(PD)
    ref = run(rc, config(rc, pools), pools, [0.0], [100], [1])
    assert ref["finish"][0] == ref["first_token"][0] == prefill_cost(rc.params, 100).latency
    assert np.isnan(ref["xfer_start"][0]) and ref["pf_replica"][0] == -1 and ref["replica"][0] == 0


def test_two_transfers_share_the_prefill_egress(replica_cost):
    """Two prompts finish in one micro-batch: both move at bw / 2 until the smaller one is done,
    then the other at bw: B1 ends after 2 B1 / bw, B2 after (B1 + B2) / bw."""
    rc = replica_cost()
    bw = 10e9
    pools = pools_of(PD, bw)
    prompt = [100, 300]
    ref = run(rc, config(rc, pools), pools, [0.0, 0.0], prompt, [2, 2])
    b1, b2 = prompt[0] * KVB, prompt[1] * KVB
    t0 = ref["xfer_start"]
    assert t0[0] == t0[1]
    dur = ref["xfer_end"] - t0
    assert dur[0] == pytest.approx(2 * b1 / bw, rel=1e-12)
    assert dur[1] == pytest.approx((b1 + b2) / bw, rel=1e-12)
    # alone, the same transfer takes half as long
    alone = run(rc, config(rc, pools), pools, [0.0], prompt[:1], [2])
    assert alone["xfer_end"][0] - alone["xfer_start"][0] == pytest.approx(b1 / bw, rel=1e-12)


def test_two_equal_transfers_each_take_twice_as_long(replica_cost):
    rc = replica_cost()
    bw = 10e9
    pools = pools_of(PD, bw)
    ref = run(rc, config(rc, pools), pools, [0.0, 0.0], [200, 200], [2, 2])
    np.testing.assert_allclose(ref["xfer_end"] - ref["xfer_start"], 2 * 200 * KVB / bw, rtol=1e-12)


def test_held_until_the_decode_replica_frees_blocks(replica_cost):
    """The decode replica holds one reservation (7 of 8 blocks): the second request waits in the
    held FIFO with its prefill blocks until the first is done there, then its transfer starts."""
    rc = replica_cost()
    bw = 20e9
    pools = pools_of([dict(role=C.PREFILL), dict(role=C.DECODE, num_blocks=8)], bw)
    ref = run(rc, config(rc, pools), pools, [0.0, 0.0], [100, 100], [2, 2])
    assert ref["xfer_start"][1] == ref["finish"][0]
    assert ref["first_token"][1] == pytest.approx(ref["finish"][0] + 100 * KVB / bw, rel=1e-12)
    assert ref["xfer_start"][0] < ref["xfer_start"][1]
    np.testing.assert_array_equal(ref["status"], [C.DONE, C.DONE])


def test_layerwise_exposes_only_what_the_prefill_did_not_hide(replica_cost):
    rc = replica_cost()
    p = rc.params
    t_pf = prefill_cost(p, 400).latency
    nbytes = 400 * KVB
    for bw in (0.5 * nbytes / t_pf, 100.0 * nbytes / t_pf):     # mostly hidden; all but the last layer
        pools = pools_of(PD, bw)
        ref = run(rc, config(rc, pools, layerwise=1), pools, [0.0], [400], [2])
        left = max(nbytes / 32, nbytes - bw * t_pf)
        assert ref["xfer_end"][0] - ref["xfer_start"][0] == pytest.approx(left / bw, rel=1e-12)


def test_prefill_pool_rejects_what_no_decode_pool_can_hold(replica_cost):
    rc = replica_cost()
    pools = pools_of([dict(role=C.PREFILL, num_blocks=100), dict(role=C.DECODE, num_blocks=20)])
    # 300 + 10 tokens need 20 blocks: fits the decode pool; 330 + 10 need 22: no decode pool holds it;
    # 1700 tokens of prompt need 107 blocks: more than the prefill pool
    ref = run(rc, config(rc, pools), pools, [0.0, 1.0, 2.0], [300, 330, 1700], [10, 10, 2])
    np.testing.assert_array_equal(ref["status"], [C.DONE, C.REJECTED, C.REJECTED])


# ---------------------------------------------------------------- pools and routing
def test_least_requests_weighs_load_by_pool_capacity(replica_cost):
    """load / weight with weights 1 and 3: 0 vs 0 -> replica 0; 1 vs 0; 1 vs 1/3; 1 vs 2/3 -> replica 1;
    1 vs 1 -> replica 0 (ties to the lower index)."""
    rc = replica_cost()
    pools = pools_of([dict(weight=1.0), dict(weight=3.0, pp=2, num_blocks=500)])
    cfg = config(rc, pools, router="least-requests")
    ps = (rc.params, replica_cost(1, 2).params)
    ref = run(rc, cfg, pools, np.arange(5) * 1e-7, [50] * 5, [20] * 5, ps=ps)
    np.testing.assert_array_equal(ref["replica"], [0, 1, 1, 1, 0])
    assert ref["pool_stats"][1, S.STAT_STAGE_BUSY] > 0.0 == ref["pool_stats"][0, S.STAT_STAGE_BUSY]
    assert ref["stats"][S.STAT_ITERATIONS] == ref["pool_stats"][:, S.STAT_ITERATIONS].sum() == ref["iterations"]


def test_prefix_aware_routes_to_the_cached_prefix(replica_cost):
    """Request 2 shares request 0's two blocks, cached on replica 0, which is busier than replica 1:
    prefix-aware sends it there (and it hits 32 tokens); least-requests would not."""
    rc = replica_cost()
    pools = pools_of([dict(count=2)])
    chains = chains_of([[7, 8], [], [7, 8]])
    arrival, prompt, output = [0.0, 0.5, 0.6], [40, 40, 40], [1, 200, 1]
    ref = run(rc, config(rc, pools, router="prefix-aware", prefix_caching=1), pools, arrival, prompt, output, chains)
    np.testing.assert_array_equal(ref["replica"], [0, 0, 0])
    assert ref["prefix"][C.HIT_GPU_TOKENS] == 32
    lr = run(rc, config(rc, pools, router="least-requests", prefix_caching=1), pools, arrival, prompt, output, chains)
    np.testing.assert_array_equal(lr["replica"], [0, 0, 1])
    assert lr["prefix"][C.HIT_GPU_TOKENS] == 0


# ---------------------------------------------------------------- prefix cache
def _lru_workload(cpu_blocks):
    """8 GPU blocks. A (49 tokens: 3 chain blocks + 1 private) is done and releases a2, a1, a0 in
    that order; B (96 tokens, 6 blocks) takes the 5 empty ones and evicts the LRU head: a2, A's tail.
    C (A's chain again) then finds a0, a1 on the GPU (and a2 in the CPU tier if there is one)."""
    pools = pools_of([dict(num_blocks=8, cpu_blocks=cpu_blocks)])
    chains = chains_of([[10, 11, 12], [], [10, 11, 12]])
    return pools, chains, [0.0, 1.0, 2.0], [49, 96, 49], [1, 1, 1]


def test_lru_evicts_a_requests_tail_block_first(replica_cost):
    rc = replica_cost()
    pools, chains, arrival, prompt, output = _lru_workload(0)
    ref = run(rc, config(rc, pools, prefix_caching=1), pools, arrival, prompt, output, chains)
    pf = ref["prefix"]
    assert pf[C.HIT_GPU_TOKENS] == 32 and pf[C.HIT_CPU_TOKENS] == 0
    assert pf[C.GPU_EVICTIONS] == 1 and pf[C.CPU_EVICTIONS] == 0
    assert pf[C.LOOKUP_TOKENS] == 49 + 96 + 49
    # C prefills its last 17 tokens over the 32 it hit
    assert ref["first_token"][2] - 2.0 == pytest.approx(prefill_cost(rc.params, 17, 32).latency, rel=1e-12)
    np.testing.assert_array_equal(ref["free_blocks"], [8])


def test_cpu_tier_hit_pays_the_reload(replica_cost):
    rc = replica_cost()
    p = rc.params
    pools, chains, arrival, prompt, output = _lru_workload(4)
    ref = run(rc, config(rc, pools, prefix_caching=1), pools, arrival, prompt, output, chains)
    pf = ref["prefix"]
    reload = p.swap_alpha + 1 * BS * KVB / p.swap_bw
    assert pf[C.HIT_GPU_TOKENS] == 32 and pf[C.HIT_CPU_TOKENS] == 16
    assert pf[C.GPU_EVICTIONS] == 1 and pf[C.CPU_EVICTIONS] == 0     # a2 left the GPU for the CPU tier
    assert pf[C.CPU_RELOAD_TIME] == reload
    # C computes its last prompt token over 48 cached ones, and its step pays the reload
    assert ref["first_token"][2] - 2.0 == pytest.approx(prefill_cost(p, 1, 48).latency + reload, rel=1e-12)
    assert ref["swap_time"] == reload


def test_cpu_tier_full_drops_its_lru_head(replica_cost):
    """A CPU tier of one block: B's two evictions (a2, then a1) move both there, a2 is dropped."""
    rc = replica_cost()
    pools = pools_of([dict(num_blocks=8, cpu_blocks=1)])
    chains = chains_of([[10, 11, 12], [], [10, 11, 12]])
    ref = run(rc, config(rc, pools, prefix_caching=1), pools, [0.0, 1.0, 2.0], [49, 112, 49], [1, 1, 1], chains)
    pf = ref["prefix"]
    assert pf[C.GPU_EVICTIONS] == 2 and pf[C.CPU_EVICTIONS] == 1
    assert pf[C.HIT_GPU_TOKENS] == 16 and pf[C.HIT_CPU_TOKENS] == 16     # a0 on the GPU, a1 in the CPU tier


def test_freed_blocks_are_taken_in_the_order_they_were_freed(replica_cost):
    """vLLM V1's free block queue (engine/POOLS.md): A (3 shared blocks + 1 private) ends, then B
    (4 blocks, taken never-used) ends; D (6 blocks) takes the 4 never-used, A's private block and
    evicts a12, not B's freed blocks; C of A's group hits a10 and a11 (32 tokens)."""
    rc = replica_cost()
    pools = pools_of([dict(num_blocks=12)])
    chains = chains_of([[10, 11, 12], [], [], [10, 11, 12]])
    ref = run(rc, config(rc, pools, prefix_caching=1), pools, [0.0, 1.0, 2.0, 3.0], [49, 64, 96, 49], [1] * 4,
              chains)
    pf = ref["prefix"]
    assert pf[C.GPU_EVICTIONS] == 1 and pf[C.HIT_GPU_TOKENS] == 32


def test_kv_cache_runs_of_private_blocks_keep_their_place():
    kv = KVCache(6, cpu_capacity=0)
    kv.take(4)
    kv.register(1)
    kv.give_back(3)             # a run of 3 private blocks, then entry 1
    kv.release(1)
    assert kv.free == 6 and kv.empty == 2 and list(kv.gpu_lru) == [("run", 1), 1]
    kv.take(4)                  # 2 never used, 2 of the run
    assert kv.gpu_lru[("run", 1)] == 1 and kv.gpu_evictions == 0
    kv.take(2)                  # the run's last block, then entry 1 evicted
    assert list(kv.gpu_lru) == [] and kv.gpu_evictions == 1 and kv.free == 0


def test_shared_prefix_hit_rate_is_analytical(replica_cost, small_engine):
    """Three groups with a 100-token prefix (6 whole blocks), four requests each; every group's first
    request is done before the others arrive, so each later one hits exactly 96 tokens: the hit rate
    is 9 x 96 / (12 x 160), the shared blocks over the prompt blocks of all requests."""
    rc = replica_cost()
    cfg = small_engine(rc, num_blocks=400)
    n, g = 12, 3
    group = np.arange(n) % g
    arrival = np.where(np.arange(n) < g, 1.0 * np.arange(n), 5.0 + 0.2 * np.arange(n))
    prompt = np.full(n, 160)
    output = np.full(n, 4)
    chains = shared_prefix_chains(prompt, output, group, np.full(n, 96), cfg.block_size)
    ref = reference_run(one_pool_inputs(rc.params, cfg, arrival, prompt, output, chains=chains))
    pf = ref["prefix"]
    assert pf[C.HIT_GPU_TOKENS] / pf[C.LOOKUP_TOKENS] == pytest.approx(9 * 6 / (12 * 10), abs=1e-15)
    ttft = ref["first_token"] - ref["arrival"]
    np.testing.assert_allclose(ttft[g:], prefill_cost(rc.params, 64, 96).latency, rtol=1e-12)
    np.testing.assert_allclose(ttft[:g], prefill_cost(rc.params, 160).latency, rtol=1e-12)


def test_kv_cache_take_and_release_order():
    kv = KVCache(4, cpu_capacity=0)
    kv.take(3)
    for b in (1, 2, 3):
        kv.register(b)          # three private blocks become entries
    kv.give_back(0)
    for b in (3, 2, 1):         # released tail first
        kv.release(b)
    assert kv.free == 4 and list(kv.gpu_lru) == [3, 2, 1]
    kv.take(2)                  # one empty, then the LRU head
    assert list(kv.gpu_lru) == [2, 1] and kv.gpu_evictions == 1 and 3 not in kv.entries


# ---------------------------------------------------------------- sessions
def test_session_turn_arrives_after_think_and_hits_its_history(replica_cost):
    """Turn 0 (40 + 10 tokens) caches its 3 full blocks (the third once its decodes reach 48 tokens);
    turn 1 is sent `think` after turn 0 ends, reaches the engine `frontend` later, and hits all 3.
    Request 2, in order, is not held up by turn 1."""
    rc = replica_cost()
    pools = pools_of([{}])
    chains = chains_of([[1, 2, 3], [1, 2, 3], []], next_turn=[1, -1, -1], think=[0.0, 0.5, 0.0])
    cfg = config(rc, pools, prefix_caching=1)._replace(frontend=0.01)
    ref = run(rc, cfg, pools, [0.0, 0.0, 0.05], [40, 80, 30], [10, 5, 3], chains)
    assert ref["arrival"][1] == ref["finish"][0] + 0.5 + 0.01
    assert ref["arrival"][2] == 0.05
    assert ref["prefix"][C.HIT_GPU_TOKENS] == 48
    assert ref["first_token"][1] - ref["arrival"][1] == pytest.approx(prefill_cost(rc.params, 32, 48).latency, rel=1e-12)


def test_decode_fallback_goes_on_in_index_order(replica_cost):
    """Decode pools D0 (10 blocks, weight 10), D1 and D2 (200 blocks, weights 1 and 2), replicas 1..3.
    a -> D0 (0/10, 0, 0: ties to the lower index), b -> D1 (0.1, 0, 0), c -> D2 (0.1, 1, 0). For d the
    keys are 0.1, 1, 0.5: D0 is the router's choice but has 3 blocks left, not the 7 d needs; the
    fallback is the next fitting one after it in the decode list (index order), D1 -- not D2, the
    next in the router's order of preference (0.5 < 1)."""
    rc = replica_cost()
    pools = pools_of([dict(role=C.PREFILL), dict(role=C.DECODE, num_blocks=10, weight=10.0),
                      dict(role=C.DECODE, num_blocks=200, weight=1.0), dict(role=C.DECODE, num_blocks=200, weight=2.0)])
    cfg = config(rc, pools, router="least-requests")
    ref = run(rc, cfg, pools, [0.0, 0.05, 0.1, 0.15], [100] * 4, [60] * 4)
    np.testing.assert_array_equal(ref["replica"], [1, 2, 3, 2])
    assert (ref["xfer_start"][:3] < 0.15).all() and (ref["finish"][:3] > 0.2).all()   # a, b, c still decode


# ---------------------------------------------------------------- the kernel agrees, request by request
PER_REQUEST = ("arrival", "scheduled", "first_token", "finish", "preemptions", "replica", "status", "max_gap",
               "gap_hist", "xfer_start", "xfer_end", "pf_replica")


def both(ps, cfg, pools, arrival, prompt, output, chains, seed=0):
    from servesim.engine import kernel
    simulate = kernel.simulate_pools
    n = len(prompt)
    rng = np.random.default_rng(seed)
    u1, u2 = rng.random(n), rng.random(n)
    args = (tuple(ps), cfg, pools, np.ascontiguousarray(arrival, np.float64), np.ascontiguousarray(prompt, np.int64),
            np.ascontiguousarray(output, np.int64), u1, u2, chains)
    return simulate(*args), reference_simulate_pools(*args)


def assert_agree(out, ref, prefix_counters=range(C.N_PREFIX)):
    for name in PER_REQUEST:
        np.testing.assert_array_equal(getattr(out, name), ref[name], err_msg=name)
    np.testing.assert_allclose(out.stats, ref["stats"], rtol=1e-12, err_msg="stats")
    np.testing.assert_allclose(out.pool_stats, ref["pool_stats"], rtol=1e-12, err_msg="pool_stats")
    k = list(prefix_counters)
    np.testing.assert_allclose(out.prefix[k], ref["prefix"][k], rtol=1e-12, err_msg="prefix")


def workload(n, seed, rate, max_prompt, max_output, min_output=1):
    rng = np.random.default_rng(seed)
    arrival = np.concatenate(([0.0], np.cumsum(rng.exponential(1.0 / rate, n - 1))))
    return arrival, rng.integers(1, max_prompt + 1, n), rng.integers(min_output, max_output + 1, n)


def group_lists(prompt, output, seed, groups=4, blocks=8):
    """Chains of shared prefixes: a random group per request (or none), up to `blocks` blocks of it."""
    rng = np.random.default_rng(seed)
    g = rng.integers(-1, groups, len(prompt))
    return [[] if g[i] < 0 else [int(g[i]) * 100 + k for k in range(min(blocks, (prompt[i] + output[i]) // BS))]
            for i in range(len(prompt))]


def session_chains(n_sessions, turns, seed):
    """Multi-turn sessions: turn k's prompt is turn k-1's prompt + answer + a new question; each turn's
    chain is the full blocks of the history it shares with the next turn (the last: with the one before)."""
    rng = np.random.default_rng(seed)
    arrival, prompt, output, nxt, think, lists = [], [], [], [], [], []
    for s in range(n_sessions):
        hist = 0
        for k in range(turns):
            p, o = hist + int(rng.integers(20, 150)), int(rng.integers(2, 40))
            arrival.append(s * 0.02 if k == 0 else 0.0)
            prompt.append(p)
            output.append(o)
            nxt.append(len(prompt) if k + 1 < turns else -1)
            think.append(float(rng.exponential(0.3)) if k else 0.0)
            shared = p + o if k + 1 < turns else hist
            lists.append([s * 1000 + b for b in range(shared // BS)])
            hist = p + o
    return np.array(arrival), np.array(prompt), np.array(output), chains_of(lists, nxt, think)


@pytest.mark.parametrize("router", some(list(C.ROUTERS), DEFAULT_ROUTERS))
@pytest.mark.parametrize("policy", some(list(C.POLICIES), DEFAULT_POLICIES))
def test_kernel_agrees_two_pools(policy, router, replica_cost):
    """Two mixed pools: different pp (1, 2), KV blocks, watermarks and router weights; small KV caches
    so that requests are preempted."""
    rc1, rc2 = replica_cost(), replica_cost(1, 2)
    pools = pools_of([dict(count=2, num_blocks=60, watermark_blocks=1, weight=1.0),
                      dict(count=1, pp=2, num_blocks=90, watermark_blocks=2, weight=2.0)])
    arrival, prompt, output = workload(120, 1, 80.0, 500, 60)
    out, ref = both((rc1.params, rc2.params), config(rc1, pools, scheduler=policy, router=router), pools,
                    arrival, prompt, output, chains_of([[] for _ in prompt]))
    assert_agree(out, ref)
    assert len(np.unique(ref["replica"])) == 3
    if policy != "static":
        assert ref["total_preemptions"] > 0


@pytest.mark.parametrize("cpu_blocks", [0, 6])
@pytest.mark.parametrize("preemption", list(C.PREEMPTION))
@pytest.mark.parametrize("policy", some(list(C.POLICIES), DEFAULT_POLICIES))
def test_kernel_agrees_prefix_cache(policy, preemption, cpu_blocks, replica_cost):
    """Shared prefixes on two replicas with 50 blocks each: hits, evictions, CPU-tier reloads and
    CPU evictions, preemptions of requests holding shared blocks."""
    rc = replica_cost()
    pools = pools_of([dict(count=2, num_blocks=50, watermark_blocks=1, cpu_blocks=cpu_blocks)])
    arrival, prompt, output = workload(150, 3, 60.0, 400, 40)
    prompt = prompt + 60
    chains = chains_of(group_lists(prompt, output, 5))
    cfg = config(rc, pools, scheduler=policy, router="least-requests", preemption=preemption, prefix_caching=1)
    out, ref = both((rc.params,), cfg, pools, arrival, prompt, output, chains)
    assert_agree(out, ref)
    pf = ref["prefix"]
    assert pf[C.HIT_GPU_TOKENS] > 0 and pf[C.GPU_EVICTIONS] > 0 and (pf[C.CPU_EVICTIONS] > 0) == (cpu_blocks > 0)
    if cpu_blocks:
        assert pf[C.HIT_CPU_TOKENS] > 0 and pf[C.CPU_RELOAD_TIME] > 0.0
    if policy != "static":
        assert ref["total_preemptions"] > 0


@pytest.mark.parametrize("cpu_blocks", [0, 8])
@pytest.mark.parametrize("router", ["least-requests", "prefix-aware", "round-robin"])
@pytest.mark.parametrize("policy", ["vllm", "vllm-v0", "static"])
def test_kernel_agrees_sessions(policy, router, cpu_blocks, replica_cost):
    rc = replica_cost()
    pools = pools_of([dict(count=3, num_blocks=60, watermark_blocks=1, cpu_blocks=cpu_blocks)])
    arrival, prompt, output, chains = session_chains(8, 3, 11)
    cfg = config(rc, pools, scheduler=policy, router=router, prefix_caching=1)._replace(frontend=0.002)
    out, ref = both((rc.params,), cfg, pools, arrival, prompt, output, chains)
    assert_agree(out, ref)
    assert (ref["status"] == C.DONE).all() and ref["prefix"][C.HIT_GPU_TOKENS] > 0


@pytest.mark.parametrize("layerwise", [0, 1])
@pytest.mark.parametrize("router", some(list(C.ROUTERS), DEFAULT_ROUTERS))
@pytest.mark.parametrize("policy", some(list(C.POLICIES), DEFAULT_POLICIES))
def test_kernel_agrees_pd_link_contention(policy, router, layerwise, replica_cost):
    """Two prefill replicas, four decode replicas (TP 2: KV over two GPUs), a slow link: transfers
    overlap and share their prefill replica's egress. Decode KV is ample (no held FIFO)."""
    rc1, rc2 = replica_cost(), replica_cost(2, 1)
    pools = pools_of([dict(role=C.PREFILL, count=2, num_blocks=80, watermark_blocks=1),
                      dict(role=C.DECODE, count=4, num_blocks=400, watermark_blocks=1, kv_gpus=2, weight=2.0)],
                     link_bw=3e9, link_alpha=5e-5)
    arrival, prompt, output = workload(100, 4, 90.0, 500, 50, min_output=2)
    cfg = config(rc1, pools, scheduler=policy, router=router, layerwise=layerwise,
                 prefix_caching=int(router == "prefix-aware"))
    out, ref = both((rc1.params, rc2.params), cfg, pools, arrival, prompt, output, chains_of([[] for _ in prompt]),
                    seed=2)
    assert_agree(out, ref)
    assert np.isfinite(ref["xfer_start"]).all() and (ref["pf_replica"] < 2).all() and (ref["replica"] >= 2).all()
    assert np.any(ref["xfer_end"][:-1] > ref["xfer_start"][1:])     # transfers overlap


@pytest.mark.parametrize("layerwise", [0, 1])
@pytest.mark.parametrize("router", some(list(C.ROUTERS), DEFAULT_ROUTERS))
def test_kernel_agrees_pd_held_fifo(router, layerwise, replica_cost):
    """Static batching (no preemption) on two small decode replicas: transfers wait in the held FIFO."""
    rc1, rc2 = replica_cost(), replica_cost(2, 1)
    pools = pools_of([dict(role=C.PREFILL, count=2, num_blocks=80, watermark_blocks=1),
                      dict(role=C.DECODE, count=2, num_blocks=45, watermark_blocks=1, kv_gpus=2, weight=2.0)],
                     link_bw=3e9, link_alpha=5e-5)
    arrival, prompt, output = workload(100, 4, 90.0, 500, 50, min_output=2)
    cfg = config(rc1, pools, scheduler="static", router=router, layerwise=layerwise,
                 prefix_caching=int(router == "prefix-aware"))
    out, ref = both((rc1.params, rc2.params), cfg, pools, arrival, prompt, output, chains_of([[] for _ in prompt]),
                    seed=2)
    assert_agree(out, ref)
    # held transfers start when a request finishes on a decode replica and frees its blocks
    assert np.isin(ref["xfer_start"], ref["finish"][ref["replica"] >= 2]).sum() >= 5


@pytest.mark.parametrize("cpu_blocks", [0, 8])
@pytest.mark.parametrize("policy", some(list(C.POLICIES), DEFAULT_POLICIES))
def test_kernel_agrees_pd_with_prefix_cache(policy, cpu_blocks, replica_cost):
    """Prefill replicas (PP 2) cache shared prefixes and release them when the KV has moved."""
    rc12, rc2 = replica_cost(1, 2), replica_cost(2, 1)
    pools = pools_of([dict(role=C.PREFILL, count=2, pp=2, num_blocks=60, watermark_blocks=1, cpu_blocks=cpu_blocks),
                      dict(role=C.DECODE, count=2, num_blocks=300, watermark_blocks=1, kv_gpus=2)], 5e9, 1e-5)
    arrival, prompt, output = workload(120, 7, 100.0, 400, 30, min_output=2)
    prompt = prompt + 60
    chains = chains_of(group_lists(prompt, output, 9))
    cfg = config(rc12, pools, scheduler=policy, router="prefix-aware", prefix_caching=1)
    out, ref = both((rc12.params, rc2.params), cfg, pools, arrival, prompt, output, chains)
    assert_agree(out, ref)
    assert ref["prefix"][C.HIT_GPU_TOKENS] > 0 and np.isfinite(ref["xfer_end"]).all()


@pytest.mark.parametrize("policy", ["vllm", "static"])
def test_kernel_agrees_pd_sessions(policy, replica_cost):
    rc = replica_cost()
    pools = pools_of([dict(role=C.PREFILL, count=2, num_blocks=80, watermark_blocks=1),
                      dict(role=C.DECODE, count=2, num_blocks=300, watermark_blocks=1)], 5e9, 1e-5)
    arrival, prompt, output, chains = session_chains(10, 3, 3)
    cfg = config(rc, pools, scheduler=policy, router="prefix-aware", prefix_caching=1)._replace(frontend=0.001)
    out, ref = both((rc.params,) * 2, cfg, pools, arrival, prompt, np.maximum(output, 2), chains)
    assert_agree(out, ref)


@pytest.mark.parametrize("policy", some(list(C.POLICIES), DEFAULT_POLICIES))
def test_kernel_agrees_closed_loop_two_pools(policy, replica_cost):
    rc1, rc12 = replica_cost(), replica_cost(1, 2)
    pools = pools_of([dict(count=2, num_blocks=60, watermark_blocks=1), dict(pp=2, num_blocks=90, weight=2.0)])
    _, prompt, output = workload(60, 4, 50.0, 400, 40)
    cfg = config(rc1, pools, scheduler=policy, router="least-kv", concurrency=5)._replace(frontend=0.003)
    out, ref = both((rc1.params, rc12.params), cfg, pools, np.zeros(60), prompt, output, chains_of([[]] * 60))
    assert_agree(out, ref)


@pytest.mark.parametrize("max_time", [0.05, 0.2, 0.37])
def test_kernel_agrees_pd_cut_off_mid_transfer(max_time, replica_cost):
    """The clock stops with transfers on the link, past their bytes, and held."""
    rc = replica_cost()
    pools = pools_of([dict(role=C.PREFILL, num_blocks=80, watermark_blocks=1),
                      dict(role=C.DECODE, count=2, num_blocks=45, watermark_blocks=1)], 1e9, 2e-3)
    arrival, prompt, output = workload(60, 5, 150.0, 400, 30, min_output=2)
    cfg = config(rc, pools, scheduler="static")._replace(max_time=max_time)
    out, ref = both((rc.params,) * 2, cfg, pools, arrival, prompt, output, chains_of([[]] * 60))
    assert_agree(out, ref)
    assert (ref["status"] == C.TRANSFER).any()


# ---------------------------------------------------------------- POOLS.md as amended (formerly kernel departures)
def test_one_token_request_exempt_from_the_decode_fit(replica_cost):
    """A prefill pool rejects a request no decode pool can hold only when it wants more than one
    token: with output 1 it is done on the prefill replica."""
    rc = replica_cost()
    pools = pools_of([dict(role=C.PREFILL, num_blocks=100), dict(role=C.DECODE, num_blocks=20)])
    out, ref = both((rc.params,) * 2, config(rc, pools), pools, [0.0, 0.1], [330, 330], [1, 2], chains_of([[]] * 2))
    np.testing.assert_array_equal(ref["status"], [C.DONE, C.REJECTED])
    assert ref["replica"][0] == 0 and ref["pf_replica"][0] == -1
    assert_agree(out, ref)


def test_kernel_decode_fallback_order(replica_cost):
    """The kernel follows the fallback in index order (test_decode_fallback_goes_on_in_index_order)."""
    rc = replica_cost()
    pools = pools_of([dict(role=C.PREFILL), dict(role=C.DECODE, num_blocks=10, weight=10.0),
                      dict(role=C.DECODE, num_blocks=200, weight=1.0), dict(role=C.DECODE, num_blocks=200, weight=2.0)])
    out, ref = both((rc.params,) * 4, config(rc, pools, router="least-requests"), pools, [0.0, 0.05, 0.1, 0.15],
                    [100] * 4, [60] * 4, chains_of([[]] * 4))
    np.testing.assert_array_equal(ref["replica"], [1, 2, 3, 2])
    assert_agree(out, ref)


@pytest.mark.parametrize("policy", ["vllm", "sarathi"])
def test_kernel_retries_held_only_when_a_decode_request_finishes(policy, replica_cost):
    """Decode replicas preempt, but the held FIFO is retried only when a request finishes on a
    decode replica (at that completion): every held transfer starts at such a finish time."""
    rc1, rc2 = replica_cost(), replica_cost(2, 1)
    pools = pools_of([dict(role=C.PREFILL, count=2, num_blocks=80, watermark_blocks=1),
                      dict(role=C.DECODE, count=2, num_blocks=45, watermark_blocks=1, kv_gpus=2, weight=2.0)],
                     link_bw=3e9, link_alpha=5e-5)
    arrival, prompt, output = workload(100, 4, 90.0, 500, 50)
    output = np.maximum(output, 2)
    out, ref = both((rc1.params, rc2.params), config(rc1, pools, scheduler=policy, router="round-robin"), pools,
                    arrival, prompt, output, chains_of([[] for _ in prompt]), seed=2)
    assert ref["pool_stats"][1, S.STAT_PREEMPTIONS] > 0
    assert_agree(out, ref)
    # held transfers started when a request finished on a decode replica
    assert np.isin(ref["xfer_start"], ref["finish"][ref["replica"] >= 2]).sum() >= 5


def test_kernel_pool_stats_iterations_and_end_time(replica_cost):
    """Each pool's row holds its own iterations and the run's end time."""
    rc = replica_cost()
    pools = pools_of(PD)
    out, ref = both((rc.params,) * 2, config(rc, pools), pools, [0.0], [300], [3], chains_of([[]]))
    np.testing.assert_array_equal(ref["pool_stats"][:, S.STAT_ITERATIONS], [1, 2])
    np.testing.assert_array_equal(ref["pool_stats"][:, S.STAT_END_TIME], ref["end_time"])
    np.testing.assert_array_equal(out.pool_stats[:, [S.STAT_ITERATIONS, S.STAT_END_TIME]],
                                  ref["pool_stats"][:, [S.STAT_ITERATIONS, S.STAT_END_TIME]])
    assert_agree(out, ref)


def test_kernel_keeps_first_scheduled_time_static_pd(replica_cost):
    """`scheduled` is the first admission (the prefill replica's). Decode replicas full (max_num_seqs
    2) queue transferred requests; static batching admits them later and keeps `scheduled`."""
    rc = replica_cost()
    pools = pools_of([dict(role=C.PREFILL, num_blocks=200, watermark_blocks=1),
                      dict(role=C.DECODE, count=2, num_blocks=400, watermark_blocks=1)], 30e9, 5e-5)
    arrival, prompt, output = workload(8, 3, 200.0, 300, 40, min_output=2)
    cfg = config(rc, pools, scheduler="static", router="least-kv", max_num_seqs=2)
    out, ref = both((rc.params,) * 2, cfg, pools, arrival, prompt, output, chains_of([[]] * 8))
    assert (ref["scheduled"] < ref["xfer_start"]).all()      # scheduled on the prefill replica
    assert_agree(out, ref)


def test_kernel_session_turn_never_sent_has_no_arrival(replica_cost):
    """A later turn's `arrival` input is ignored (inf) until the turn before ends; cut off before
    that, it stays inf."""
    rc = replica_cost()
    pools = pools_of([{}])
    chains = chains_of([[], []], next_turn=[1, -1], think=[0.0, 0.1])
    cfg = config(rc, pools)._replace(max_time=0.001)
    out, ref = both((rc.params,), cfg, pools, [0.0, 0.0], [300, 400], [50, 5], chains)
    assert ref["arrival"][1] == np.inf and ref["status"][1] == C.NOT_ARRIVED
    assert_agree(out, ref)


@pytest.mark.parametrize("policy", ["vllm-v0", "vllm", "sarathi", "orca"])
def test_transferred_request_needing_no_block_skips_the_watermark(policy, replica_cost):
    """Decode replica: 22 blocks, watermark 6, max_num_seqs 2. R0 (160 + 90: 11 blocks reserved) and
    R1 (8 + 40: 1 block) run; R2 (48 + 2) reserves 4 (22 - 12 - 4 = 6 >= 6) and, the replica being
    full, waits at the front of its queue with them. R0 and R1 grow to 13 and 3 blocks; when R1 is
    done 5 blocks are free, below the watermark, but R2 needs no new block: it is admitted at once
    and finishes long before R0."""
    rc = replica_cost()
    pools = pools_of([dict(role=C.PREFILL), dict(role=C.DECODE, num_blocks=22, watermark_blocks=6)], 1e10, 0.0)
    cfg = config(rc, pools, scheduler=policy, max_num_seqs=2)._replace(max_time=1e4)
    out, ref = both((rc.params,) * 2, cfg, pools, [0.0, 0.001, 0.002], [160, 8, 48], [90, 40, 2],
                    chains_of([[]] * 3))
    np.testing.assert_array_equal(ref["status"], [C.DONE] * 3)
    assert ref["finish"][1] < ref["finish"][2] < ref["finish"][1] + 0.05 < ref["finish"][0]
    assert ref["total_preemptions"] == 0
    assert_agree(out, ref)


# ---------------------------------------------------------------- former POOLS.md deadlocks: every request ends
def _ends(rc, pools, arrival, prompt, output, **opts):
    out, ref = both((rc.params,) * len(pools.role), config(rc, pools, **opts)._replace(max_time=1e4), pools,
                    arrival, prompt, output, chains_of([[]] * len(prompt)))
    assert_agree(out, ref)
    assert np.isin(ref["status"], [C.DONE, C.REJECTED]).all(), f"not ended: {ref['status']}"
    return ref


def test_decode_replica_too_small_for_the_whole_request(replica_cost):
    """Decode pool 1: 15 blocks, watermark 2; pool 2: 100 blocks. 200 + 43 tokens need 16 blocks:
    the request is accepted (pool 2 holds it); round-robin picks replica 1, whose pool cannot hold
    it (16 > 13), so it goes to replica 2 and finishes there."""
    rc = replica_cost()
    pools = pools_of([dict(role=C.PREFILL), dict(role=C.DECODE, num_blocks=15, watermark_blocks=2),
                      dict(role=C.DECODE, num_blocks=100)])
    ref = _ends(rc, pools, [0.0], [200], [43], router="round-robin", scheduler="orca")
    assert ref["status"][0] == C.DONE and ref["replica"][0] == 2


def test_queued_transfer_blocks_a_preempted_head(replica_cost):
    """max_num_seqs 1, 16 decode blocks. R1 (150 tokens) reserves 10 and decodes; R2 (90 tokens)
    reserves the other 6 and queues with them at the front. R1 needs an 11th block at 160 tokens,
    preempts itself (recompute) and goes to the front but behind R2 (POOLS.md): R2 needs no block and
    runs; when it ends, R1 gets the blocks it needs. (Ahead of R2 it would wait forever.)"""
    rc = replica_cost()
    pools = pools_of([dict(role=C.PREFILL), dict(role=C.DECODE, num_blocks=16)])
    ref = _ends(rc, pools, [0.0, 0.01], [150, 90], [40, 10], max_num_seqs=1)
    np.testing.assert_array_equal(ref["status"], [C.DONE, C.DONE])


def test_static_prefill_reserves_the_prompt_only(replica_cost):
    """Prefill pool of 20 blocks: a 300-token prompt (19 blocks) passes the arrival check, and static
    admission on the prefill replica reserves blocks_for(300) = 19 (not blocks_for(300 + 30) = 21)."""
    rc = replica_cost()
    pools = pools_of([dict(role=C.PREFILL, num_blocks=20), dict(role=C.DECODE)])
    ref = _ends(rc, pools, [0.0], [300], [30], scheduler="static")
    assert ref["status"][0] == C.DONE


# ---------------------------------------------------------------- DP attention: a rank's own chunk
def test_dp_attention_lowering_caps_a_sequences_chunk_at_one_ranks_budget():
    """--attn-dp 8 with 512 tokens per rank: one scheduler of 8 x 512 tokens and 8 x 16 sequences,
    whose chunk of any one sequence is 512 (the sequence sits on one rank); without DP attention
    the cap is the whole budget."""
    kw = dict(model="deepseek-v3", hardware="h200-sxm", dtype="fp8", max_num_batched_tokens=512, max_num_seqs=16)
    cfg, *_ = api.resolve(sim_config(None, tp=1, ep=8, attn_dp=8, **kw))
    opts = engine_options(cfg)
    assert (opts.max_num_batched_tokens, opts.max_num_seqs, opts.max_chunk_tokens) == (4096, 128, 512)
    cfg1, *_ = api.resolve(sim_config(None, tp=8, **kw))
    assert engine_options(cfg1).max_chunk_tokens is None


def dp_cfg(rc, scheduler="vllm", **opts):
    """The lowered limits of DP attention over 8 ranks of 512 tokens and 16 sequences each."""
    base = dict(max_num_seqs=128, max_num_batched_tokens=4096, max_chunk_tokens=512, block_size=BS,
                scheduler=scheduler)
    return engine_config(EngineOptions(**(base | opts)), rc)._replace(max_time=1e4)


def one_pool(rc, cfg, prompt, output):
    n = len(prompt)
    pools = pools_of([dict(num_blocks=4000)])
    out, ref = both((rc.params,), cfg, pools, np.zeros(n), prompt, output, chains_of([[] for _ in range(n)]))
    assert_agree(out, ref)
    return out, ref


@pytest.mark.parametrize("scheduler", ["vllm", "sarathi"])
def test_dp_rank_prefills_a_2000_token_prompt_in_4_chunks(scheduler, replica_cost):
    """DP 8, 512 tokens per rank: one 2,000-token prompt takes ceil(2000 / 512) = 4 prefill steps
    (512, 512, 512, 464), exactly as one rank of budget 512 alone runs it; two such prompts run
    side by side on two ranks in the same 4 steps; uncapped, the 4,096-token budget takes each whole."""
    rc = replica_cost()
    extra = dict(chunk_size=4096) if scheduler == "sarathi" else {}
    cfg = dp_cfg(rc, scheduler, **extra)
    assert (cfg.max_batched_tokens, cfg.max_chunk_tokens) == (4096, 512)
    one, _ = one_pool(rc, cfg, np.array([2000]), np.array([1]))
    assert one.stats[S.STAT_ITERATIONS] == 4
    rank = engine_config(EngineOptions(max_num_seqs=16, max_num_batched_tokens=512, chunk_size=512, block_size=BS,
                                       scheduler=scheduler), rc)._replace(max_time=1e4)
    assert rank.max_chunk_tokens == 512
    alone, _ = one_pool(rc, rank, np.array([2000]), np.array([1]))
    assert alone.stats[S.STAT_ITERATIONS] == 4
    assert one.first_token[0] == alone.first_token[0]
    two, _ = one_pool(rc, cfg, np.array([2000, 2000]), np.array([1, 1]))
    assert two.stats[S.STAT_ITERATIONS] == 4
    whole, _ = one_pool(rc, dp_cfg(rc, scheduler, max_chunk_tokens=None, **extra), np.array([2000, 2000]),
                        np.array([1, 1]))
    assert whole.stats[S.STAT_ITERATIONS] == 1
    assert whole.first_token[0] < two.first_token[0]


@pytest.mark.parametrize("scheduler", ["orca", "vllm-v0"])
def test_dp_cap_leaves_whole_prompt_policies_whole(scheduler, replica_cost):
    """orca and vllm-v0 never cut a prompt: the cap does not either (one 2,000-token step)."""
    rc = replica_cost()
    out, _ = one_pool(rc, dp_cfg(rc, scheduler), np.array([2000]), np.array([1]))
    assert out.stats[S.STAT_ITERATIONS] == 1


@pytest.mark.parametrize("policy", some(list(C.POLICIES), DEFAULT_POLICIES))
def test_kernel_agrees_under_a_chunk_cap(policy, replica_cost):
    """A cap below the budget (a DP rank's share) on a loaded pool with preemptions: kernel and
    reference agree on every record."""
    rc = replica_cost()
    pools = pools_of([dict(count=2, num_blocks=60, watermark_blocks=1)])
    arrival, prompt, output = workload(120, 3, 80.0, 500, 60)
    cfg = config(rc, pools, scheduler=policy, max_num_batched_tokens=600, chunk_size=300, max_chunk_tokens=72)
    assert cfg.max_chunk_tokens == 72
    out, ref = both((rc.params,), cfg, pools, arrival, prompt, output, chains_of([[] for _ in prompt]))
    assert_agree(out, ref)
    if policy in ("vllm", "sarathi"):     # the cap cut chunks the budget alone would not have
        _, whole = both((rc.params,), cfg._replace(max_chunk_tokens=cfg.max_batched_tokens), pools, arrival, prompt,
                        output, chains_of([[] for _ in prompt]))
        assert not np.array_equal(whole["first_token"], ref["first_token"])


def test_bad_chunk_cap_is_refused(replica_cost):
    with pytest.raises(ConfigError, match="max_chunk_tokens must be >= 1"):
        engine_config(EngineOptions(max_chunk_tokens=0), replica_cost())


# ---------------------------------------------------------------- random deployments of mixed pools
@st.composite
def mixed_deployments(draw):
    bs = draw(st.sampled_from([1, 4, 16]))
    pools = [dict(count=draw(st.integers(1, 2)), pp=draw(st.sampled_from([1, 2])),
                  num_blocks=draw(st.integers(6, 60)) * 16 // bs, watermark_blocks=draw(st.integers(0, 2)),
                  cpu_blocks=draw(st.sampled_from([0, 0, 4, 20])) * 16 // bs, weight=draw(st.sampled_from([1.0, 2.0, 3.0])))
             for _ in range(draw(st.integers(1, 2)))]
    opts = dict(scheduler=draw(st.sampled_from(list(C.POLICIES))), router=draw(st.sampled_from(list(C.ROUTERS))),
                preemption=draw(st.sampled_from(list(C.PREEMPTION))), max_num_seqs=draw(st.integers(1, 12)),
                max_num_batched_tokens=draw(st.integers(8, 600)), chunk_size=draw(st.integers(8, 300)), block_size=bs,
                prefix_caching=draw(st.sampled_from([0, 1, 1])), max_chunk_tokens=draw(st.sampled_from([None, None, 8, 100])))
    wl = dict(sessions=draw(st.booleans()), n=draw(st.integers(1, 60)), seed=draw(st.integers(0, 2**16)),
              rate=draw(st.floats(5.0, 300.0)), max_prompt=draw(st.integers(2, 700)),
              max_output=draw(st.integers(1, 60)), groups=draw(st.integers(1, 4)), blocks=draw(st.integers(1, 10)))
    return pools, opts, wl


@pytest.mark.slow   # a property test over many random deployments (~3-6 s)
@settings(max_examples=150, deadline=None)
@given(mixed_deployments())
def test_kernel_agrees_random_mixed_deployments(replica_cost, deployment):
    """One or two mixed pools of any policy, router, pp, KV size and CPU tier, with shared prefixes or
    multi-turn sessions: the kernel and the reference agree on every record, and the reference's
    KV accounting holds after every event (it checks itself)."""
    specs, opts, wl = deployment
    pools = pools_of(specs)
    ps = tuple(replica_cost(1, sp["pp"]).params for sp in specs)
    if wl["sessions"]:
        arrival, prompt, output, chains = session_chains(max(1, wl["n"] // 3), 3, wl["seed"])
    else:
        arrival, prompt, output = workload(wl["n"], wl["seed"], wl["rate"], wl["max_prompt"], wl["max_output"])
        chains = chains_of(group_lists(prompt, output, wl["seed"], wl["groups"], wl["blocks"]))
    cfg = config(replica_cost(), pools, **opts)._replace(max_time=1e4)
    out, ref = both(ps, cfg, pools, arrival, prompt, output, chains, seed=wl["seed"])
    assert_agree(out, ref)
    assert np.isin(ref["status"], [C.DONE, C.REJECTED]).all()
    event(f"prefix hits: {ref['prefix'][C.HIT_GPU_TOKENS] + ref['prefix'][C.HIT_CPU_TOKENS] > 0}")
    event(f"preempted: {ref['total_preemptions'] > 0}")


@st.composite
def pd_deployments(draw):
    bs = draw(st.sampled_from([4, 16]))
    specs = [dict(role=C.PREFILL, count=draw(st.integers(1, 2)), pp=draw(st.sampled_from([1, 2])),
                  num_blocks=draw(st.integers(20, 80)) * 16 // bs, watermark_blocks=draw(st.integers(0, 2)),
                  cpu_blocks=draw(st.sampled_from([0, 8])) * 16 // bs)]
    specs += [dict(role=C.DECODE, count=draw(st.integers(1, 3)), num_blocks=draw(st.integers(10, 60)) * 16 // bs,
                   watermark_blocks=draw(st.integers(0, 5)), weight=draw(st.sampled_from([1.0, 2.0])))
              for _ in range(draw(st.integers(1, 2)))]
    opts = dict(scheduler=draw(st.sampled_from(list(C.POLICIES))),
                router=draw(st.sampled_from(list(C.ROUTERS))), preemption=draw(st.sampled_from(list(C.PREEMPTION))),
                max_num_seqs=draw(st.integers(1, 8)), max_num_batched_tokens=draw(st.integers(16, 600)),
                chunk_size=draw(st.integers(16, 300)), block_size=bs, prefix_caching=draw(st.sampled_from([0, 1])),
                layerwise=draw(st.sampled_from([0, 1])), max_chunk_tokens=draw(st.sampled_from([None, None, 16, 100])))
    wl = dict(n=draw(st.integers(1, 40)), seed=draw(st.integers(0, 2**16)), rate=draw(st.floats(5.0, 300.0)),
              link_bw=draw(st.sampled_from([1e9, 1e10])))
    return specs, opts, wl


@pytest.mark.slow   # a property test over many random deployments (~3-6 s)
@settings(max_examples=60, deadline=None)
@given(pd_deployments())
def test_kernel_agrees_random_pd_deployments(replica_cost, deployment):
    """Prefill/decode deployments (one or two decode pools of any size and watermark, any policy,
    router, preemption, PP, CPU tier, layerwise): kernel and reference agree on every record.
    Not every request need end: a request preempted on a decode replica can still sit at the head of
    its queue ahead of transferred requests holding the blocks it needs (both stop there alike)."""
    specs, opts, wl = deployment
    pools = pools_of(specs, link_bw=wl["link_bw"], link_alpha=1e-5)
    ps = tuple(replica_cost(1, sp.get("pp", 1)).params for sp in specs)
    arrival, prompt, output = workload(wl["n"], wl["seed"], wl["rate"], 500, 60)
    chains = chains_of(group_lists(prompt, output, wl["seed"]))
    cfg = config(replica_cost(), pools, **opts)._replace(max_time=1e4)
    out, ref = both(ps, cfg, pools, arrival, prompt, output, chains, seed=wl["seed"])
    assert_agree(out, ref)
    event(f"every request ended: {np.isin(ref['status'], [C.DONE, C.REJECTED]).all()}")
    on_decode = (ref["replica"] >= specs[0]["count"]) & (ref["status"] == C.DONE)
    event(f"a transfer started when a decode request finished: {np.isin(ref['xfer_start'], ref['finish'][on_decode]).any()}")
