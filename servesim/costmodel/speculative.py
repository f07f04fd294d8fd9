"""Speculative decoding: what one decode step of a request costs and yields (Leviathan et al. 2023,
"Fast Inference from Transformers via Speculative Decoding", ICML; Chen et al. 2023).

``--speculative METHOD:k=K[:acceptance=A][:delta=D][:acceptance_length=L][:draft=MODEL]``:

- **draft**: the proposer makes K tokens per sequence, one at a time. ``draft``: a smaller model,
  priced on the same hardware and layout as the target (K decode forwards of its own); ``eagle``: one
  decoder layer of the target's width and a 2h -> h projection of [hidden; embedding] ahead of the
  target's LM head, per draft token (Li et al. 2024, "EAGLE", sec. 3: "a single transformer decoder
  layer"); ``mtp``: DeepSeek-V3's multi-token-prediction module, one transformer block of the
  target (MLA and MoE), the 2h -> h projection and the shared head (DeepSeek-V3 report,
  arXiv:2412.19437, sec. 2.2); ``ngram``: prompt lookup on the CPU (vLLM's n-gram proposer), no GPU
  work; its own CPU time is not priced (no published or measured figure), but an engine that turns
  its async scheduling off for the method (vLLM for ``draft`` and ``ngram``) runs its host work
  between the steps (`host_params`).
- **verify**: one forward of the target over K + 1 query tokens per sequence: GEMMs at n (K + 1)
  rows (the weights read once), attention as a short prefill of K + 1 tokens over the cached KV,
  K + 1 sampled rows per sequence.
- **acceptance**: the i-th draft token is accepted with probability a_i = A delta^(i - 1) given the
  ones before it were (delta = 1: a constant rate); the step yields the accepted prefix plus the
  target's own token, 1 + sum_{j<=K} prod_{i<=j} a_i tokens in expectation, (1 - A^(K+1)) / (1 - A)
  for constant A (Leviathan et al., eq. 1). ``acceptance_length=L`` gives that expectation (the
  "acceptance length" published for EAGLE and MTP) and A is solved for it.
- MTP's default acceptance is DeepSeek's own measurement: "the acceptance rate of the second token
  prediction ranges between 85% and 90%" (DeepSeek-V3 report, sec. 5.4.3); the lower end is taken.
  The other methods need ``acceptance=`` or ``acceptance_length=``.

The engine reserves K lookahead KV slots per sequence (vLLM ``num_lookahead_slots``).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
from numba import njit

from ..config.engine import SPECULATIVE_METHODS
from ..errors import ConfigError, InfeasibleError
from . import fields as F
from .features import features
from .fields import table
from .iteration import _gemm_nb, iteration_components, iteration_components_nb
from ..jit import JIT

METHODS = SPECULATIVE_METHODS
MTP_ACCEPTANCE = 0.85        # DeepSeek-V3 report, sec. 5.4.3: 85%-90% for the second token
_KEYS = ("k", "acceptance", "delta", "acceptance_length", "draft")
OPTION = "--speculative"
FORM = "METHOD:k=K[:acceptance=A][:delta=D][:acceptance_length=L][:draft=MODEL]"


@dataclass(frozen=True)
class Speculative:
    """A parsed ``--speculative`` value."""
    method: str
    k: int
    acceptance: float            # A, the first draft token's acceptance probability
    delta: float = 1.0           # a_i = A delta^(i - 1)
    draft: str | None = None     # the draft model (method draft)
    text: str = ""

    def rates(self) -> np.ndarray:
        """a_1 .. a_K."""
        return self.acceptance * self.delta ** np.arange(self.k, dtype=np.float64)

    @property
    def expected_tokens(self) -> float:
        return expected_tokens(self.acceptance, self.delta, self.k)

    def __str__(self) -> str:
        return self.text


def expected_tokens(a: float, delta: float, k: int) -> float:
    """1 + sum_{j=1..K} prod_{i<=j} a_i with a_i = a delta^(i - 1): tokens one verification yields."""
    total, run = 1.0, 1.0
    for i in range(k):
        run *= min(1.0, a * delta ** i)
        total += run
    return total


def acceptance_for_length(length: float, delta: float, k: int) -> float:
    """The A whose expected tokens per step equal ``length`` (bisection; the expectation rises with A)."""
    lo, hi = 0.0, 1.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if expected_tokens(mid, delta, k) < length:
            lo = mid
        else:
            hi = mid
    return hi


def _number(key, value, text, kind=float):
    try:
        x = kind(value)
    except ValueError:
        raise ConfigError(f"{OPTION} {text!r}: {key}={value!r} is not {'an integer' if kind is int else 'a number'}; "
                          f"use {FORM}") from None
    if kind is float and not math.isfinite(x):
        raise ConfigError(f"{OPTION} {text!r}: {key}={value!r} must be finite")
    return x


def parse_speculative(text) -> Speculative | None:
    """``METHOD:k=K[:acceptance=A][:delta=D][:acceptance_length=L][:draft=MODEL]`` -> Speculative (None
    for None); one-line ConfigError naming the part that is wrong."""
    if text is None or isinstance(text, Speculative):
        return text
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(f"{OPTION} {text!r}: use {FORM}, e.g. eagle:k=3:acceptance=0.7 or mtp:k=1")
    parts = text.strip().split(":")
    method = parts[0]
    if method not in METHODS:
        raise ConfigError(f"{OPTION} {text!r}: unknown method {method!r}; use one of {', '.join(METHODS)}")
    kv = {}
    for part in parts[1:]:
        key, eq, value = part.partition("=")
        if not eq or key not in _KEYS:
            raise ConfigError(f"{OPTION} {text!r}: {part!r} is not one of {', '.join(k + '=' for k in _KEYS)}")
        if key in kv:
            raise ConfigError(f"{OPTION} {text!r}: {key}= given twice")
        kv[key] = value
    if "k" not in kv:
        raise ConfigError(f"{OPTION} {text!r}: give the draft length k=K (K >= 1)")
    k = _number("k", kv["k"], text, int)
    if k < 1:
        raise ConfigError(f"{OPTION} {text!r}: k={k} must be >= 1 (draft tokens per step)")
    if k > 16:
        raise ConfigError(f"{OPTION} {text!r}: k={k} is beyond 16 draft tokens; engines run 1-8")
    delta = _number("delta", kv.get("delta", "1"), text)
    if not 0.0 < delta <= 1.0:
        raise ConfigError(f"{OPTION} {text!r}: delta={delta:g} must be in (0, 1] (a_i = A delta^(i-1))")
    if "acceptance" in kv and "acceptance_length" in kv:
        raise ConfigError(f"{OPTION} {text!r}: give acceptance= or acceptance_length=, not both")
    if "acceptance_length" in kv:
        length = _number("acceptance_length", kv["acceptance_length"], text)
        top = expected_tokens(1.0, delta, k)
        if not 1.0 < length <= top + 1e-12:
            raise ConfigError(f"{OPTION} {text!r}: acceptance_length={length:g} must be in (1, {top:g}] for k={k}"
                              + (f", delta={delta:g}" if delta != 1.0 else "") + " (tokens per verification step)")
        a = acceptance_for_length(length, delta, k)
    elif "acceptance" in kv:
        a = _number("acceptance", kv["acceptance"], text)
        if not 0.0 < a <= 1.0:
            raise ConfigError(f"{OPTION} {text!r}: acceptance={a:g} must be in (0, 1]")
    elif method == "mtp":
        a = MTP_ACCEPTANCE
    else:
        raise ConfigError(f"{OPTION} {text!r}: {method} needs acceptance=A (0 < A <= 1) or acceptance_length=L")
    draft = kv.get("draft")
    if method == "draft" and not draft:
        raise ConfigError(f"{OPTION} {text!r}: the draft method needs draft=MODEL (a smaller model of the same "
                          "vocabulary, e.g. llama-3.1-8b for llama-3.1-70b)")
    if method != "draft" and draft:
        raise ConfigError(f"{OPTION} {text!r}: draft=MODEL is for the draft method; {method} drafts with "
                          f"{'no model' if method == 'ngram' else 'a head of the target'}")
    return Speculative(method, k, a, delta, draft, text.strip())


def draft_model(spec: Speculative, target):
    """The model whose forwards draft: the draft model, or the one-layer head of eagle / mtp (None for
    ngram). A draft model larger than the target is an error."""
    from ..config.model import load_model
    if spec.method == "ngram":
        return None
    if spec.method == "draft":
        d = load_model(spec.draft)
        if d.param_count() >= target.param_count():
            raise InfeasibleError(f"{OPTION} {spec.text!r}: draft model {d.name} ({d.param_count() / 1e9:.1f}B "
                                  f"parameters) is not smaller than the target {target.name} "
                                  f"({target.param_count() / 1e9:.1f}B); use a smaller draft model")
        if d.vocab_size != target.vocab_size:
            raise ConfigError(f"{OPTION} {spec.text!r}: draft model {d.name} has a vocabulary of {d.vocab_size:,}, "
                              f"the target {target.name} {target.vocab_size:,}; a draft must share the target's")
        return d
    if spec.method == "mtp":
        if target.moe is not None:
            moe = dataclasses.replace(target.moe, first_moe_layer=0, moe_layer_freq=1, moe_layers=())
            return dataclasses.replace(target, name=f"{target.name}-mtp", num_layers=1, moe=moe)
        return dataclasses.replace(target, name=f"{target.name}-mtp", num_layers=1)
    # eagle: one dense decoder layer of the target's width (its dense FFN width)
    return dataclasses.replace(target, name=f"{target.name}-eagle", num_layers=1, moe=None)


def draft_layout(spec: Speculative, layout):
    """The draft runs on the target's GPUs: the same TP and DP attention, no pipeline; a one-layer head
    keeps the target's EP, a draft model (usually dense) none."""
    ep = layout.ep if spec.method == "mtp" else 1
    return dataclasses.replace(layout, pp=1, ep=ep, attn_dp=layout.attn_dp if ep > 1 else 1)


def verify_aggregates(n: float, ctx: float, k: int):
    """Batch aggregates (iteration_components_nb's order) of verifying ``n`` sequences at context
    ``ctx``: a chunk of K + 1 tokens each after ctx cached tokens, every position sampled."""
    q = k + 1.0
    return n * q, n, n * q, n * q * (ctx + (q + 1.0) / 2.0), n * (ctx + q), 0.0, 0.0


@njit(**JIT)
def draft_time_nb(dp, moe, ep, mla, wo, target_dp, n, kv, k, proj):
    """Drafting ``k`` tokens for ``n`` sequences whose contexts sum to ``kv``: k forwards of the draft
    ``dp`` one after the other (each sequence's context one longer each time), priced as GPU work inside
    the target's step (GEMMs, attention, elementwise, communication; its host time is the step's);
    ``proj`` adds EAGLE's / MTP's 2h -> h projection per forward. A draft without DP attention on a
    target with ``target_dp`` ranks runs on each rank over its share, ceil(n / ranks). ``moe, ep, mla,
    wo``: the markers the step cost is compiled for (`features.py`; they must cover ``dp``)."""
    if n <= 0.0 or k <= 0:
        return 0.0
    m = n
    kvm = kv
    if dp[F.attn_dp] <= 1.0 and target_dp > 1.0:
        m = float(math.ceil(n / target_dp))
        kvm = kv * m / n
    t = 0.0
    for i in range(k):
        r = iteration_components_nb(dp, moe, ep, mla, wo, 0.0, 0.0, m, 0.0, 0.0, m, kvm + m * i)
        t += r.gemm + r.attention + r.elementwise + r.communication
        if proj > 0:
            t += _gemm_nb(dp, wo, float(math.ceil(m / dp[F.attn_dp])) if dp[F.attn_dp] > 1.0 else m, 2.0 * dp[F.hidden],
                          dp[F.hidden])   # on the busiest rank's sequences
    return t


def host_params(rc, spec):
    """The target's CostParams under ``spec`` (None: as lowered): an engine that turns its async
    scheduling off for this method (not in ``engine.overlap_speculative``: vLLM 0.15.1 keeps it only
    for EAGLE and MTP) runs its host work between the steps, host_overlap 0."""
    eng = rc.engine
    if spec is None or not eng.host_overlap or eng.overlap_speculative is None or spec.method in eng.overlap_speculative:
        return rc.params
    return rc.params._replace(host_overlap=0.0)


def price_step(rc, spec: Speculative, n: int, ctx: int, draft_rc=None) -> dict:
    """One speculative decode step of ``n`` sequences at context ``ctx`` on the lowered target replica
    ``rc``: draft and verification time (s), the expected tokens per sequence, the time per token and
    the plain decode step it replaces. ``draft_rc``: the lowered draft (`lower_draft`)."""
    if draft_rc is None:
        draft_rc = lower_draft(rc, spec)
    p = table(rc.params)
    plain = iteration_components(p, 0.0, 0.0, float(n), 0.0, 0.0, float(n), float(n * ctx)).latency
    verify = iteration_components(table(host_params(rc, spec)),
                                  *verify_aggregates(float(n), float(ctx), spec.k)).latency
    draft = 0.0
    if draft_rc is not None:
        dt = table(draft_rc.params)
        draft = draft_time_nb(dt, *features(dt), rc.params.attn_dp, float(n), float(n * (ctx + 1)), spec.k,
                              int(spec.method in ("eagle", "mtp")))
    e = spec.expected_tokens
    return {"method": spec.method, "k": spec.k, "acceptance": spec.acceptance, "delta": spec.delta,
            "expected_tokens": e, "draft_s": draft, "verify_s": verify, "step_s": draft + verify,
            "per_token_s": (draft + verify) / e, "plain_step_s": plain,
            "speedup": plain / ((draft + verify) / e) if draft + verify > 0 else 0.0}


def yields_distribution(spec: Speculative) -> np.ndarray:
    """P(a step yields j + 1 tokens), j = 0 .. K accepted: prod_{i<=j} a_i (1 - a_{j+1}), the last
    prod_{i<=K} a_i."""
    a = np.minimum(spec.rates(), 1.0)
    run = np.concatenate([[1.0], np.cumprod(a)])
    p = run[:-1] * (1.0 - a)
    return np.concatenate([p, run[-1:]])


def spec_draws(spec: Speculative, output, seed: int):
    """(yields, start): the tokens each decode step of each request yields, drawn before the run from
    their own stream (seed, "SPEC"): request i's draws are yields[start[i]:start[i] + output[i]]
    (a request takes at most output - 1 decode steps), int64 in 1 .. K + 1."""
    output = np.asarray(output, dtype=np.int64)
    n_steps = np.maximum(output, 1)
    start = np.zeros(output.shape[0], np.int64)
    if output.shape[0]:
        start[1:] = np.cumsum(n_steps)[:-1]
    total = int(n_steps.sum())
    cdf = np.cumsum(yields_distribution(spec))
    cdf[-1] = 1.0
    u = np.random.default_rng([int(seed), 0x53504543]).random(total)
    yields = (np.searchsorted(cdf, u, side="right") + 1).astype(np.int64)
    return np.minimum(yields, spec.k + 1), start


def lower_draft(rc, spec: Speculative):
    """The draft's lowered replica on the target's hardware, engine and layout (None for ngram)."""
    from . import build_replica
    d = draft_model(spec, rc.model)
    if d is None:
        return None
    lay = draft_layout(spec, rc.layout)
    return build_replica(d, rc.hw, lay, 1.0, max_tokens=256, max_seqs=256, engine=rc.engine)


__all__ = ["draft_time_nb", "host_params", "lower_draft", "price_step", "spec_draws", "verify_aggregates", "yields_distribution", "FORM", "METHODS", "MTP_ACCEPTANCE", "Speculative", "acceptance_for_length", "draft_layout",
           "draft_model", "expected_tokens", "parse_speculative"]
