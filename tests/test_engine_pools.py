"""The kernel's pools, prefix cache and prefill/decode transfers against values derived by hand
(engine/POOLS.md): one-request TTFT = prefill + transfer, two transfers sharing a link, LRU order,
CPU-tier reload time, the shared-prefix hit rate, a session's hit on its history."""
from __future__ import annotations

import numpy as np
import pytest

from servesim.costmodel.fields import table
from servesim.costmodel.iteration import iteration_components
from servesim.engine import codes as C
from servesim.engine.kernel import simulate_pools
from servesim.engine.lower import EngineOptions, engine_config, no_chains, router_draws
from servesim.engine.state import Chains, Pools

from conftest import shared_prefix_chains

BS = 16
KVB = 131072.0      # KV bytes per token per GPU of llama-3.1-8b in bf16 (32 layers x 8 heads x 128 x 2 x 2)


def ints(*v):
    return np.array(v, np.int64)


def floats(*v):
    return np.array(v, np.float64)


def pools(roles, blocks, cpu=None, bw=50e9, alpha=1e-5, wm=0):
    P = len(roles)
    cpu = [0] * P if cpu is None else cpu
    return Pools(role=ints(*roles), first=ints(*range(P)), count=ints(*([1] * P)), pp=ints(*([1] * P)),
                 num_blocks=ints(*blocks[:P]), watermark_blocks=ints(*([wm] * P)), cpu_blocks=ints(*cpu[:P]),
                 kv_bytes_per_token=floats(*([KVB] * P)), kv_bytes_total=floats(*([KVB] * P)),
                 kv_gpus=ints(*([1] * P)), n_layers=ints(*([32] * P)), weight=floats(*([1.0] * P)),
                 link_bw=np.full((P, P), bw), link_alpha=np.full((P, P), alpha))


@pytest.fixture(scope="module")
def rc(replica_cost):
    return replica_cost()


def config(rc, replicas, **kw):
    cfg = engine_config(EngineOptions(max_num_seqs=16, max_num_batched_tokens=2048, block_size=BS), rc)
    return cfg._replace(replicas=replicas, **kw)


def run(rc, cfg, pl, arrival, prompt, output, chains=None):
    n = len(prompt)
    u1, u2 = router_draws(n, 0)
    chains = no_chains(n) if chains is None else chains
    return simulate_pools(tuple(rc.params for _ in range(len(pl.role))), cfg, pl,
                             np.asarray(arrival, np.float64), ints(*prompt), ints(*output), u1, u2, chains)


def prefill_latency(rc, prompt, done=0):
    """One iteration running the whole (remaining) prompt of one request, sampling its first token."""
    c = prompt - done
    return iteration_components(table(rc.params), float(c), 1.0, 1.0, c * (done + (c + 1) / 2), float(done + c),
                                0.0, 0.0).latency


def test_one_request_ttft_is_prefill_plus_transfer(rc):
    out = run(rc, config(rc, 2), pools([C.PREFILL, C.DECODE], [1000, 1000]), [0.0], [1000], [10])
    t_pf = prefill_latency(rc, 1000)
    assert out.xfer_start[0] == t_pf
    assert out.first_token[0] == t_pf + 1000 * KVB / 50e9 + 1e-5
    assert out.replica[0] == 1 and out.pf_replica[0] == 0 and out.status[0] == C.DONE


def test_two_transfers_share_the_link(rc):
    """Two prompts in one micro-batch finish together: each transfer moves at half the link's rate."""
    out = run(rc, config(rc, 2), pools([C.PREFILL, C.DECODE], [1000, 1000], bw=1e9, alpha=0.0),
              [0.0, 0.0], [500, 500], [5, 5])
    assert out.xfer_start[0] == out.xfer_start[1]
    alone = 500 * KVB / 1e9
    np.testing.assert_allclose(out.xfer_end - out.xfer_start, [2 * alone, 2 * alone], rtol=1e-12)


def test_output_of_one_token_finishes_on_the_prefill_pool(rc):
    out = run(rc, config(rc, 2), pools([C.PREFILL, C.DECODE], [1000, 1000]), [0.0], [300], [1])
    assert out.replica[0] == 0 and np.isnan(out.xfer_start[0]) and out.first_token[0] == prefill_latency(rc, 300)


def test_two_mixed_pools_price_each_replica_with_its_own_params(replica_cost):
    a, b = replica_cost(1, 1), replica_cost(2, 1)
    cfg = config(a, 2, router=C.ROUND_ROBIN)
    pl = pools([C.MIXED, C.MIXED], [1000, 1000])
    n = 2
    u1, u2 = router_draws(n, 0)
    out = simulate_pools((a.params, b.params), cfg, pl, floats(0.0, 0.0), ints(400, 400), ints(1, 1), u1, u2,
                            no_chains(n))
    assert list(out.replica) == [0, 1]
    assert out.first_token[0] == prefill_latency(a, 400)
    assert out.first_token[1] == prefill_latency(b, 400)
    assert out.pool_stats[0, 2] == prefill_latency(a, 400) and out.pool_stats[1, 2] == prefill_latency(b, 400)


def test_nine_pools_run_the_kernel_compiled_for_one_each_priced_by_its_own_row(replica_cost):
    """The pools' cost tables are the rows of one array, zero-padded to the longest (a pool whose per-token
    tables stop at 300 tokens prices its 400-token prompt directly): nine pools run the loop compiled
    for one pool (no new signature), each replica priced by its own pool's table."""
    from servesim.engine.kernel import run_nb
    a, b = replica_cost(1, 1), replica_cost(2, 1)
    short = a.params._replace(tab_gemm=a.params.tab_gemm[:300], tab_elem=a.params.tab_elem[:300],
                              tab_comm=a.params.tab_comm[:300])
    ps = (a.params, b.params, short) * 3
    n = len(ps)
    u1, u2 = router_draws(n, 0)
    one = simulate_pools(ps[:1], config(a, 1), pools([C.MIXED], [1000]), floats(0.0), ints(400), ints(1), u1[:1],
                         u2[:1], no_chains(1))
    signatures = lambda: len(getattr(run_nb, "signatures", ()))   # noqa: E731  (none with the JIT off)
    compiled = signatures()
    out = simulate_pools(ps, config(a, n, router=C.ROUND_ROBIN), pools([C.MIXED] * n, [1000] * n),
                         floats(*([0.0] * n)), ints(*([400] * n)), ints(*([1] * n)), u1, u2, no_chains(n))
    assert signatures() == compiled
    assert list(out.replica) == list(range(n))
    assert one.first_token[0] == out.first_token[0]
    for k, p in enumerate(ps):
        want = iteration_components(table(p), 400.0, 1.0, 1.0, 400 * 401 / 2, 400.0, 0.0, 0.0).latency
        assert out.first_token[k] == want, k
    assert out.first_token[2] == out.first_token[0]      # the truncated tables' direct pricing is the same
    assert out.first_token[1] != out.first_token[0]
    with pytest.raises(ValueError, match="8 cost params for 9 pools; give one per pool"):
        simulate_pools(ps[:8], config(a, n), pools([C.MIXED] * n, [1000] * n), floats(*([0.0] * n)),
                       ints(*([400] * n)), ints(*([1] * n)), u1, u2, no_chains(n))


def sequential(n, gap=10.0):
    return [gap * k for k in range(n)]


def test_shared_prefix_hit_rate_is_the_analytical_value(rc):
    """Requests far apart (each done before the next arrives): every request after its group's
    first takes the group's prefix in whole blocks, capped below its prompt."""
    rng = np.random.default_rng(1)
    n = 40
    group = rng.integers(0, 4, n)
    prompt = rng.integers(200, 900, n)
    plen = 160 + 37 * group                 # each group's system prompt
    hit = (np.minimum(plen, prompt - 1) // BS) * BS
    chains = shared_prefix_chains(prompt, np.full(n, 4), group, hit, BS)
    cfg = config(rc, 1, prefix_caching=1)
    out = run(rc, cfg, pools([C.MIXED], [4000]), sequential(n), list(prompt), [4] * n, chains)
    # a request's chain is its prefix blocks up to the group's second-longest (the blocks another
    # request shares); the group's cached blocks are the longest chain so far: a later request
    # takes what its chain has in common with that
    held = hit // BS
    second = {g: sorted(held[group == g])[-2] if (group == g).sum() > 1 else 0 for g in set(group)}
    first = {}
    expect = 0
    for g, h in zip(group, held):
        chain = min(h, second[g])
        if g in first:
            expect += min(chain, first[g]) * BS
            first[g] = max(first[g], chain)
        else:
            first[g] = chain
    assert out.prefix[C.HIT_GPU_TOKENS] == expect
    assert out.prefix[C.LOOKUP_TOKENS] == prompt.sum()
    assert abs(out.prefix[C.HIT_GPU_TOKENS] / out.prefix[C.LOOKUP_TOKENS] - expect / prompt.sum()) < 0.01


def test_lru_evicts_a_request_tail_first(rc):
    """A (4 shared blocks) ends; B, a stranger, needs all empty blocks and one more: one of A's
    cached blocks is evicted -- its last -- so C of A's group still hits the first three."""
    cap = 20
    a_prompt = 4 * BS + 1           # 5 blocks: 4 full (cached when A ends) + 1 private (empty)
    b_prompt = (cap - 4) * BS + 1   # 17 blocks: the 16 empty ones and one cached
    chains = shared_prefix_chains([a_prompt, b_prompt, a_prompt], [1, 1, 1], ints(0, -1, 0), ints(4 * BS, 0, 4 * BS), BS)
    cfg = config(rc, 1, prefix_caching=1)
    out = run(rc, cfg, pools([C.MIXED], [cap]), sequential(3), [a_prompt, b_prompt, a_prompt], [1, 1, 1], chains)
    assert out.prefix[C.GPU_EVICTIONS] == 1
    assert out.prefix[C.HIT_GPU_TOKENS] == 3 * BS


def test_freed_blocks_are_taken_in_the_order_they_were_freed(rc):
    """vLLM V1's free block queue: never-used blocks first, then freed blocks oldest first, cached or
    not. A (4 shared blocks + 1 private) ends: 15 never used, then [A's private, a4, a3, a2, a1].
    B (10 blocks) takes 10 never-used ones and ends: [.., B's 10]. D (7 blocks) takes the 5 never
    used, A's private block and evicts a4 -- though B's 10 freed blocks hold nothing shared -- so C
    of A's group hits a1-a3 only."""
    cap = 20
    a, b, d = 4 * BS + 1, 9 * BS + 1, 6 * BS + 1     # 5, 10 and 7 blocks
    prompt = [a, b, d, a]
    chains = shared_prefix_chains(prompt, [1] * 4, ints(0, -1, -1, 0), ints(4 * BS, 0, 0, 4 * BS), BS)
    cfg = config(rc, 1, prefix_caching=1)
    out = run(rc, cfg, pools([C.MIXED], [cap]), sequential(4), prompt, [1] * 4, chains)
    assert out.prefix[C.GPU_EVICTIONS] == 1
    assert out.prefix[C.HIT_GPU_TOKENS] == 3 * BS


def test_cpu_tier_keeps_evicted_blocks_and_reloads_them_over_pcie(rc):
    cap = 20
    a_prompt = 4 * BS + 1
    b_prompt = cap * BS - 1         # needs every block: evicts all four of A's to the CPU tier
    chains = shared_prefix_chains([a_prompt, b_prompt, a_prompt], [1, 1, 1], ints(0, -1, 0), ints(4 * BS, 0, 4 * BS), BS)
    cfg = config(rc, 1, prefix_caching=1)
    out = run(rc, cfg, pools([C.MIXED], [cap], cpu=(8,)), sequential(3), [a_prompt, b_prompt, a_prompt], [1, 1, 1],
              chains)
    p = rc.params
    assert out.prefix[C.GPU_EVICTIONS] == 4 and out.prefix[C.CPU_EVICTIONS] == 0
    assert out.prefix[C.HIT_CPU_TOKENS] == 4 * BS and out.prefix[C.HIT_GPU_TOKENS] == 0
    reload = p.swap_alpha + 4 * BS * KVB / p.swap_bw
    assert out.prefix[C.CPU_RELOAD_TIME] == reload
    # C's step: its last prompt token computed after the 4 reloaded blocks, plus the reload
    np.testing.assert_allclose(out.first_token[2] - 20.0, prefill_latency(rc, a_prompt, 4 * BS) + reload, rtol=1e-12)


def test_a_session_turn_hits_its_history(rc):
    """Turn 2's prompt = turn 1's prompt + answer + question: it takes the history's full blocks."""
    p1, o1, q = 300, 50, 40
    p2 = p1 + o1 + q
    shared = (p1 + o1) // BS
    ids = np.concatenate([np.arange(shared), np.arange(shared)]).astype(np.int64)
    chains = Chains(ints(0, shared), ints(shared, shared), ids, ints(1, -1), floats(0.0, 2.0))
    cfg = config(rc, 1, prefix_caching=1)
    out = run(rc, cfg, pools([C.MIXED], [4000]), [0.0, np.inf], [p1, p2], [o1, 10], chains)
    assert out.prefix[C.HIT_GPU_TOKENS] == shared * BS
    assert out.arrival[1] == out.finish[0] + 2.0        # sent its think time after turn 1 ended
    assert out.status[1] == C.DONE


def test_pools_with_a_field_of_the_wrong_length_are_refused_naming_it(replica_cost):
    """The kernel reads the pools as one record per pool (`state.kernel_pools`): a field with fewer
    entries than pools is an error naming it, not a pool read past its end."""
    a = replica_cost(1, 1)
    bad = pools([C.MIXED] * 3, [1000] * 3)._replace(cpu_blocks=ints(0, 0))
    with pytest.raises(ValueError, match=r"Pools.cpu_blocks is .*: give one int64 per pool \(3\)"):
        simulate_pools((a.params,) * 3, config(a, 3), bad, floats(0.0), ints(400), ints(1), *router_draws(1, 0),
                       no_chains(1))
