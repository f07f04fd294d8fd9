"""Expert-parallel MoE serving with data-parallel attention (wide EP), per replica.

A replica of ``tp x attn_dp`` GPUs (per pipeline stage) runs attention on ``attn_dp`` data-parallel
ranks, each a TP group of ``tp`` GPUs serving its own requests (SGLang ``--enable-dp-attention``,
vLLM ``--data-parallel-size`` with ``--enable-expert-parallel``), and spreads the routed experts of
every MoE layer over ``ep`` GPUs (E / ep local experts each), every expert's FFN split over the
``moe_tp = tp x attn_dp / ep`` GPUs that hold it (AIConfigurator's moe_tp_size x moe_ep_size).
The DeepSeek-V3 deployment (DeepSeek-AI 2024, arXiv:2412.19437, sec. 3.4): attention TP 4 with DP 8
and EP 32 for prefill; EP 320 for decode.

Per MoE layer (one engine step, ``tokens`` = the tokens of all DP ranks together):

- **the slowest rank's grouped GEMM**: the token-expert pairs routed to the EP rank with the most,
  under a routing model (`rank_load_nb`): ``balanced`` (``expert_skew = 0``: T k / ep pairs each,
  the AIConfigurator ``balanced`` rows) or power-law expert loads (``expert_skew = alpha > 0``: the
  generator of AIConfigurator's ``power_law_<alpha>`` rows, `power_law_counts_nb`: every expert's
  weight drawn from a bounded power law p(x) ~ x^-alpha, scaled to T k pairs and rounded to whole
  pairs, the pairs the rounding leaves over dealt out one each, each expert capped at T pairs (a token
  picks an expert once); the slowest of the ep ranks taken, its pairs and the experts holding at least
  one; the expectation over `DRAWS` seeded draws, tabulated once per replica). The kernel time is
  the engine's fused-MoE formula (``kernels.moe_experts_time_nb``) at that rank's pairs and touched
  experts.
- **dispatch and combine** (only with ``attn_dp > 1``: each DP rank's tokens go to the ranks of
  their experts and back; DeepEP in SGLang, vLLM's all2all backends): two all-to-alls, each rank
  sending ``tokens x top_k x (1 - 1/ep) x hidden x bytes`` (the slowest rank's receive when it is
  larger), fp8 for the dispatch of a W8A8 / fp4 model and 16 bits for the combine (DeepSeek-V3
  report, sec. 3.3.2: dispatch activations quantised to FP8, combine in BF16). Inside the scale-up
  domain over NVLink, across domains the bytes to other domains over the NIC, the two in parallel
  (`dispatch_combine_nb`); alpha + (n - 1)/n S / B fitted on AIConfigurator's NCCL ``alltoall``
  rows (hardware profile ``[alltoall]``; there are no DeepEP tables in the AIConfigurator data).
- with ``attn_dp = 1`` (TP attention + EP experts, vLLM ``--enable-expert-parallel`` at DP 1) every
  GPU holds every token and no all-to-all runs: the experts' partial outputs join in the TP
  all-reduce, and the Triton fused MoE of vLLM/SGLang walks every routed pair, writing zeros for
  the remote experts' blocks (vLLM ``fused_moe.py``, ``write_zeros_to_output`` when
  ``expert_ids == -1``; engine profile ``moe_ep_masked``): the remote pairs' intermediate traffic
  (w1 output and the activation's read and write, w2 output, the sum's read) is priced at the
  engine's GEMM bandwidth.

The iteration ends with the slowest rank: attention on the busiest DP rank, the experts on the
busiest EP rank. The cost model sees one replica's batch; each request runs on one DP rank, whole:
SGLang's DP attention gives each DP worker its own requests and batches (LMSYS blog "SGLang v0.4",
2024-12-04, "Data Parallelism Attention"; SGLang server argument ``--enable-dp-attention``), vLLM's
data-parallel deployment load-balances requests over DP ranks, each its own engine core and
scheduler, and the MoE layers of all ranks step together (vLLM docs, "Data Parallel Deployment").
The assumption: the requests of a step are spread as evenly as whole requests go, so the busiest
rank holds ceil(n_pf / D) of the prefill chunks (of the step's mean chunk) and ceil(n_dec / D) of
the decodes (`busiest_share_nb`), and the MoE layers route the step's real tokens (every rank's
together, ``tp_tok + n_dec``; not the busiest rank's times D, which would invent work for a step
with fewer sequences than ranks); graph-padding rows are not routed (assumed).
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from . import fields as F
from .collectives import all_to_all_time_nb
from .fields import array_nb
from ..jit import JIT

# AIConfigurator's default power-law exponents for MoE routing (aiconfigurator-core 0.12.0,
# sdk/models/deepseek.py and the DeepSeek-derived models: ``_power_law_alpha = 1.01``; the generic
# sdk/models/moe.py: 1.2; sdk/config.py ``workload_distribution = "power_law"``).
SKEW_DEEPSEEK = 1.01
SKEW_OTHER = 1.2
DRAWS = 64                # draws of the power-law loads per tabulated token count
SKEW_SEED = 0x45505f       # fixed: the table is a deterministic function of its inputs
GRID_POINTS = 96          # token counts tabulated (geometric, 1 .. max), linear in between
# Where the generator deals the pairs its rounding leaves over (T k minus the rounded loads; at T k <= E
# nearly every load rounds to 0, so at 1-2 tokens these are all of the pairs). Read off the tables
# (experiments/results/ep_validation.md): in the B200 vLLM 0.19 tables a 1-2 token power-law row costs
# what the balanced row costs (the pairs spread over the ranks: DEFICIT_SPREAD, the current collector
# and the serving default); in the H100/H200/A100 tables of vLLM 0.14, SGLang 0.5.9 and TensorRT-LLM
# 1.x the hottest rank holds all T k pairs at 1-2 tokens (time = T k experts' weights at every EP
# degree whose ranks hold >= T k experts), then the leftover plus its share of the rounded loads:
# the leftover goes to experts 0, 1, 2, ... in turn, all on one rank (DEFICIT_FIRST).
DEFICIT_SPREAD = 0
DEFICIT_FIRST = 1
DEFICITS = {"spread": DEFICIT_SPREAD, "first": DEFICIT_FIRST}


def default_skew(model) -> float:
    """The routing exponent when none is given: AIConfigurator's for the model's family."""
    return SKEW_DEEPSEEK if model.mla is not None else SKEW_OTHER


@njit(**JIT)
def _power_law_draws_nb(u, lo, hi, alpha):
    """Inverse-CDF draws of p(x) ~ x^-alpha on [lo, hi] from the uniforms ``u`` (one per expert)."""
    n = u.shape[0]
    x = np.empty(n)
    if abs(alpha - 1.0) < 1e-9:
        for j in range(n):
            x[j] = lo * (hi / lo) ** u[j]
    else:
        a = lo ** (1.0 - alpha)
        b = hi ** (1.0 - alpha)
        for j in range(n):
            x[j] = ((b - a) * u[j] + a) ** (1.0 / (1.0 - alpha))
    return x


@njit(**JIT)
def power_law_counts_nb(u, tokens, top_k, lo, hi, alpha, ep, deficit):
    """Whole pairs per expert as AIConfigurator's power-law generator gives them: the draws of
    `_power_law_draws_nb` scaled to T k = ``tokens x top_k`` pairs and rounded; the pairs left over
    (T k minus the rounded sum) one each to experts in turn, ``deficit`` DEFICIT_FIRST: experts 0, 1,
    2, ... (consecutive: one rank's block first), DEFICIT_SPREAD: one per EP rank in turn (rank r's
    experts r E/ep, r E/ep + 1, ...); an excess taken one at a time from the largest load; each load
    then capped at ``tokens``. ``tokens`` a whole number."""
    n = u.shape[0]
    x = _power_law_draws_nb(u, lo, hi, alpha)
    s = x.sum()
    target = int(round(tokens * top_k))
    c = np.empty(n, dtype=np.int64)
    total = 0
    for j in range(n):
        c[j] = int(np.floor(x[j] / s * target + 0.5))
        total += c[j]
    per = n // int(ep)
    for i in range(target - total):
        if deficit == DEFICIT_FIRST:
            j = i % n
        else:
            j = (i % int(ep)) * per + (i // int(ep)) % per
        c[j] += 1
    for i in range(total - target):
        c[np.argmax(c)] -= 1
    out = np.empty(n)
    for j in range(n):
        out[j] = min(float(c[j]), tokens)
    return out


@njit(**JIT)
def slowest_rank_nb(loads, ep):
    """(pairs, touched experts) of the EP rank with the most pairs; experts in ep consecutive blocks.
    A touched expert holds at least half a pair (whole pairs from `power_law_counts_nb`: at least one)."""
    per = loads.shape[0] // ep
    best = -1.0
    touched = 0.0
    for r in range(ep):
        s = 0.0
        t = 0.0
        for j in range(r * per, (r + 1) * per):
            s += loads[j]
            if loads[j] >= 0.5:
                t += 1.0
        if s > best:
            best = s
            touched = t
    return best, touched


@njit(**JIT)
def skew_table_nb(grid, experts, top_k, ep, alpha, u, deficit):
    """Mean (pairs, touched) of the slowest rank at each token count of ``grid`` (whole numbers) over
    the draws ``u`` (draws x experts uniforms), loads from `power_law_counts_nb`: weights on [1, 0.8 T]
    when T k exceeds the experts, else on [0.01, 2] (few pairs: most experts get none)."""
    n = grid.shape[0]
    pairs = np.zeros(n)
    touched = np.zeros(n)
    for i in range(n):
        t = grid[i]
        if t * top_k > experts:
            lo, hi = 1.0, max(0.8 * t, 1.000001)
        else:
            lo, hi = 0.01, 2.0
        for d in range(u.shape[0]):
            a, b = slowest_rank_nb(power_law_counts_nb(u[d], t, top_k, lo, hi, alpha, ep, deficit), int(ep))
            pairs[i] += a
            touched[i] += max(b, 1.0)
        pairs[i] /= u.shape[0]
        touched[i] /= u.shape[0]
    return pairs, touched


def skew_table(experts: int, top_k: int, ep: int, alpha: float, max_tokens: float, deficit: str = "spread"):
    """(grid, pairs, touched) of the slowest rank under power-law loads, for `rank_load_nb`; empty
    arrays for a balanced router (alpha 0) or ep = 1. ``deficit``: "spread" (the generator of the
    newest tables, B200 vLLM 0.19: the serving default) or "first" (that of the vLLM 0.14, SGLang
    0.5.9 and TensorRT-LLM 1.x tables; see DEFICIT_FIRST)."""
    if alpha <= 0.0 or ep <= 1:
        return np.zeros(0), np.zeros(0), np.zeros(0)
    grid = np.unique(np.round(np.geomspace(1.0, max(float(max_tokens), 2.0), GRID_POINTS)))
    u = np.random.default_rng(SKEW_SEED).random((DRAWS, int(experts)))
    pairs, touched = skew_table_nb(grid, float(experts), float(top_k), float(ep), float(alpha), u,
                                   DEFICITS[deficit])
    return grid, pairs, touched


@njit(**JIT)
def _interp_nb(grid, ys, x):
    n = grid.shape[0]
    if x <= grid[0]:
        return ys[0] * x / grid[0]
    if x >= grid[n - 1]:
        return ys[n - 1] * x / grid[n - 1]
    lo = 0
    hi = n - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if grid[mid] <= x:
            lo = mid
        else:
            hi = mid
    w = (x - grid[lo]) / (grid[hi] - grid[lo])
    return ys[lo] + w * (ys[hi] - ys[lo])


@njit(**JIT)
def rank_load_nb(tokens, experts, top_k, ep, grid, pairs, touched):
    """(pairs, touched local experts) of the slowest EP rank for ``tokens`` tokens: balanced
    (``grid`` empty) T k / ep pairs over min(E / ep, T k / ep) experts, else the power-law table."""
    local = experts / ep
    if tokens <= 0.0:
        return 0.0, 0.0
    if grid.shape[0] == 0:
        a = tokens * top_k / ep
        return a, min(local, a)
    a = min(_interp_nb(grid, pairs, tokens), tokens * local)
    t = min(max(_interp_nb(grid, touched, tokens) if tokens <= grid[grid.shape[0] - 1]
                else touched[touched.shape[0] - 1], 1.0), local, a)
    return a, t


@njit(**JIT)
def rank_load_of_nb(p, tokens):
    """`rank_load_nb` of the cost table ``p`` (costmodel/fields.py): its experts, top-k, EP and skew table."""
    return rank_load_nb(tokens, p[F.experts], p[F.top_k], p[F.ep], array_nb(p, F.skew_grid),
                        array_nb(p, F.skew_pairs), array_nb(p, F.skew_touched))


@njit(**JIT)
def alltoall_nb(nbytes, n, domain, bw_in, alpha_in, bw_out, alpha_out):
    """All-to-all of ``nbytes`` per rank (its whole send buffer) over ``n`` ranks of which ``domain``
    share a scale-up domain: the (domain - 1)/n share over NVLink and the (n - domain)/n share over
    the NIC, in parallel (the slower bounds); inside one domain alpha + (n - 1)/n S / B
    (``collectives.all_to_all_time_nb`` with one latency per call, as NCCL's alltoall rows show)."""
    if n <= 1.0 or nbytes <= 0.0:
        return 0.0
    if n <= domain:
        return alpha_in + all_to_all_time_nb(nbytes, n, bw_in, 0.0)
    t_in = (domain - 1.0) / n * nbytes / bw_in
    t_out = (n - domain) / n * nbytes / bw_out
    return max(alpha_in, alpha_out) + max(t_in, t_out)


def alltoall_link(hw, ep: int):
    """(bw inside the scale-up domain, its latency, NIC bw, its latency, ranks per domain) for an
    all-to-all over ``ep`` GPUs: the profile's fitted ``[alltoall]`` figures on the scale-up link
    (else its collective figures), the NIC at ``scaleout_bw_fraction``."""
    eff = hw.efficiency
    frac, lat = hw.alltoall if hw.alltoall is not None else (eff.scaleup_bw_fraction,
                                                             eff.collective_base_latency_s)
    domain = hw.scaleup_domain if hw.scaleup_bw > 0 else 1
    if hw.scaleup_bw > 0:
        bw_in, a_in = hw.scaleup_bw * frac, lat
    else:
        bw_in, a_in = hw.pcie_bw * eff.pcie_bw_fraction, eff.pcie_latency_s
        domain = max(1, min(ep, hw.gpus_per_node))
    return bw_in, a_in, hw.scaleout_bw * eff.scaleout_bw_fraction, eff.scaleout_latency_s, float(domain)


@njit(**JIT)
def dispatch_combine_nb(p, m, rank_pairs):
    """Dispatch + combine of one MoE layer on a DP rank with ``m`` tokens, the slowest EP rank
    receiving ``rank_pairs`` token rows: each all-to-all moves max(m k, rank pairs) rows of the
    hidden state, (1 - 1/ep) of them to other ranks (`alltoall_nb` counts the share)."""
    if p[F.attn_dp] <= 1.0 or p[F.ep] <= 1.0:
        return 0.0
    rows = max(m * p[F.top_k], rank_pairs)
    t = alltoall_nb(rows * p[F.hidden] * p[F.a2a_dispatch_bytes], p[F.ep], p[F.a2a_domain], p[F.a2a_bw],
                    p[F.a2a_alpha], p[F.a2a_bw_out], p[F.a2a_alpha_out])
    return t + alltoall_nb(rows * p[F.hidden] * 2.0, p[F.ep], p[F.a2a_domain], p[F.a2a_bw], p[F.a2a_alpha],
                           p[F.a2a_bw_out], p[F.a2a_alpha_out])


@njit(**JIT)
def masked_pairs_time_nb(p, pairs):
    """The remote pairs an expert-map fused MoE walks anyway (``moe_ep_masked``): per pair, zeros
    written for the w1 output (2 x inter when gated) and the w2 output (hidden), the activation's read
    of the w1 output and write of its inter-wide result, the final sum's read of the w2 output."""
    if p[F.ep_masked] <= 0.0 or pairs <= 0.0:
        return 0.0
    up_n = 2.0 * p[F.exp_inter] if p[F.gated] > 0.0 else p[F.exp_inter]
    nbytes = pairs * p[F.a_bytes] * (2.0 * up_n + p[F.exp_inter] + 2.0 * p[F.hidden])
    return nbytes / (p[F.hbm_bw] * p[F.g_hbm])


@njit(**JIT)
def wide_ep_nb(p):
    """Expert parallelism with DP attention: the MoE layers route every DP rank's tokens together."""
    return p[F.ep] > 1.0 and p[F.attn_dp] > 1.0


@njit(**JIT)
def busiest_share_nb(n, d):
    """Sequences on the busiest of ``d`` DP attention ranks when a step holds ``n``: ceil(n / d), whole
    sequences (a request runs on the one rank it was sent to). A fractional n (a mean over steps, as
    the planner's steady state) interpolates linearly between the integer counts either side."""
    k = math.floor(n)
    w = n - k
    lo = math.ceil(k / d)
    if w <= 0.0:
        return float(lo)
    return (1.0 - w) * lo + w * math.ceil((k + 1.0) / d)


def moe_parallel(model, tp: int, attn_dp: int, ep: int) -> int:
    """moe_tp: the GPUs each expert's FFN is split over (tp x attn_dp / ep)."""
    return (tp * attn_dp) // ep


__all__ = ["DEFICITS", "DEFICIT_FIRST", "DEFICIT_SPREAD", "DRAWS", "SKEW_DEEPSEEK", "SKEW_OTHER", "alltoall_link",
           "alltoall_nb", "busiest_share_nb", "default_skew", "dispatch_combine_nb", "masked_pairs_time_nb",
           "moe_parallel", "power_law_counts_nb", "rank_load_nb", "rank_load_of_nb", "skew_table", "skew_table_nb",
           "slowest_rank_nb", "wide_ep_nb"]
