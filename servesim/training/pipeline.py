"""Which layers each pipeline rank holds, in which model chunks (virtual stages).

Megatron-Core's split (``get_transformer_layer_offset`` / ``get_num_layers_to_build``,
megatron/core/transformer/transformer_block.py and transformer_layer.py):

- Even split: L layers over p ranks x v chunks, L / (p v) per chunk. With
  ``--account-for-embedding-in-pipeline-split`` / ``--account-for-loss-in-pipeline-split`` the
  embedding and the loss (LM head + cross entropy) count as one layer each: (L + 1 + 1) / (p v) per
  chunk, the first chunk of rank 0 holding the embedding and one layer fewer, the last chunk of the
  last rank the loss and one layer fewer (Llama-3.1-405B's 126 layers on p v = 64 chunks).
- Uneven split: ``--decoder-first-pipeline-num-layers F`` / ``--decoder-last-pipeline-num-layers
  Lst``: rank 0 holds F layers, rank p - 1 Lst, the other ranks share the rest evenly; each rank's
  layers are split evenly over its v chunks. Megatron does not combine this with the account-for
  options.
- Virtual-stage order: chunk c of rank r is virtual stage c p + r; virtual stages hold consecutive
  layers (Narayanan et al. 2021, sec. 2.2, interleaved schedule).
- A pipeline layout (``--pipeline-layout``, Megatron-Core's ``--pipeline-model-parallel-layout``;
  ``pipeline_layout.py``) places every layer, the embedding, the MTP layers and the loss stage by
  stage, in virtual-stage order; ``auto`` is the split of those units over p x v stages that
  minimises the largest stage's forward FLOPs (``unit_flops``).
"""
from __future__ import annotations

from dataclasses import dataclass

from servesim.errors import ConfigError, InfeasibleError

from .pipeline_layout import balanced_layout, check_stages, format_layout, parse_layout


@dataclass(frozen=True)
class Chunk:
    rank: int
    chunk: int
    layers: tuple[int, ...]
    embedding: bool  # holds the input embedding
    loss: bool       # holds the final norm, LM head and loss
    mtp: int = 0     # multi-token-prediction layers (a pipeline layout's m)


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


def _suggest(L: int, p: int, v: int) -> str:
    """What would split L layers over p x v chunks: the account-for options or uneven stages."""
    tips = []
    for extra, opts in ((2, "--account-for-embedding --account-for-loss"), (1, "--account-for-embedding"),
                        (1, "--account-for-loss")):
        if (L + extra) % (p * v) == 0:
            tips.append(opts)
            break
    if p > 1:
        for first in range(v, L, v):
            rest = L - first
            if rest % v == 0 and rest // v >= p - 1 and (rest // v) % (p - 1) == 0:
                tips.append(f"--first-stage-layers {first}")
                break
        for last in range(v, L, v):
            rest = L - last
            if rest % v == 0 and rest // v >= p - 1 and (rest // v) % (p - 1) == 0:
                tips.append(f"--last-stage-layers {last}")
                break
    tips.append(f"a --pp x --vp dividing {L} ({_divisors(L)})")
    tips.append("--pipeline-layout auto (the most balanced uneven split)")
    return "; or ".join(tips)


def rank_layer_counts(model, lay) -> list[int]:
    """Transformer layers per pipeline rank (before interleaving), checking the split."""
    L, p, v = model.num_layers, lay.pp, lay.vp
    F, Lst = lay.first_stage_layers, lay.last_stage_layers
    for opt, val in (("--first-stage-layers", F), ("--last-stage-layers", Lst)):
        if val is None:
            continue
        if not isinstance(val, int) or val < 1:
            raise ConfigError(f"{opt}: must be an integer >= 1, got {val!r}")
        if p == 1:
            raise ConfigError(f"{opt} {val} needs --pp > 1 (it sizes the first/last pipeline stage); drop it")
        if val > L:
            raise InfeasibleError(f"{opt} {val} is larger than the model: {model.name} has {L} layers; "
                                  f"use at most {L - (p - 1)}")
        if val % v:
            raise InfeasibleError(f"{opt} {val} is not a multiple of --vp {v} (each stage's layers are split "
                                  f"evenly over its virtual chunks); use a multiple of {v}")
    if (F is not None or Lst is not None) and (lay.account_for_embedding or lay.account_for_loss):
        raise ConfigError("--first-stage-layers / --last-stage-layers cannot be combined with "
                          "--account-for-embedding / --account-for-loss (Megatron allows one or the other)")
    if F is None and Lst is None:
        units = L + int(lay.account_for_embedding) + int(lay.account_for_loss)
        if units % (p * v):
            what = f"--pp {p}" if v == 1 else f"--pp x --vp = {p}x{v}"
            counted = "" if units == L else f" (+ embedding/loss = {units})"
            raise InfeasibleError(f"{what} does not divide num_layers = {L}{counted} of {model.name}; "
                                  f"use {_suggest(L, p, v)}")
        per = units // p
        counts = [per] * p
        if lay.account_for_embedding:
            counts[0] -= 1
        if lay.account_for_loss:
            counts[-1] -= 1
        return counts
    fixed = (F or 0) + (Lst or 0)
    middle = p - (F is not None) - (Lst is not None)
    rest = L - fixed
    if rest < middle or (middle == 0 and rest != 0) or (middle > 0 and rest % middle):
        shown = " + ".join(f"{o} {x}" for o, x in (("--first-stage-layers", F), ("--last-stage-layers", Lst))
                           if x is not None)
        raise InfeasibleError(f"{shown}: the other {middle} stage(s) must share the remaining {rest} of "
                              f"{L} layers evenly (at least one each); {_suggest(L, p, v)}")
    each = rest // middle if middle else 0
    if each % v:
        raise InfeasibleError(f"--vp {v}: the middle stages hold {each} layers each, not a multiple of --vp; "
                              f"change --first-stage-layers / --last-stage-layers or --vp")
    counts = [each] * p
    if F is not None:
        counts[0] = F
    if Lst is not None:
        counts[-1] = Lst
    return counts


def unit_flops(model, unit: str, layer: int, seq_len: int) -> float:
    """Forward FLOPs per token of one layout unit: a layer (its GEMMs and causal attention), the
    loss (LM head), an MTP layer (DeepSeek-V3 sec. 2.2: a projection of 2h -> h, a layer of the last
    layer's kind, the shared LM head), the embedding (a lookup: none)."""
    from .flops import attention_core_flops, gemm_flops, layer_gemms
    h, V = model.hidden_size, model.vocab_size
    head = 2.0 * h * V
    if unit == "E":
        return 0.0
    if unit == "L":
        return head
    kind = model.is_moe_layer(layer if unit == "t" else model.num_layers - 1)
    f = gemm_flops(layer_gemms(model, kind, 1.0)) + attention_core_flops(model, seq_len, causal=True)
    if unit == "m":
        f += 2.0 * 2 * h * h + head
    return f


def layout_stages(model, lay) -> list[str] | None:
    """The layout's stages (checked; ``auto`` balanced), or None without --pipeline-layout."""
    text = lay.pipeline_layout
    if text is None:
        return None
    if lay.first_stage_layers is not None or lay.last_stage_layers is not None or lay.account_for_embedding \
            or lay.account_for_loss:
        raise ConfigError("--pipeline-layout places every layer itself; drop --first-stage-layers / "
                          "--last-stage-layers / --account-for-embedding / --account-for-loss")
    if str(text).strip().lower() == "auto":
        units = ["E"] + ["t"] * model.num_layers + ["L"]
        costs = [unit_flops(model, u, i - 1, lay.seq_len) for i, u in enumerate(units)]
        stages = balanced_layout(units, costs, lay.pp * lay.vp)
        check_stages(stages, format_layout(stages), model, lay.pp, lay.vp)
        return stages
    stages = parse_layout(text)
    check_stages(stages, text, model, lay.pp, lay.vp)
    return stages


def layout_text(model, lay) -> str:
    """The layout string in effect (``auto`` resolved), or "" without --pipeline-layout."""
    stages = layout_stages(model, lay)
    return format_layout(stages) if stages is not None else ""


def _chunks_from_layout(stages: list[str], p: int, v: int) -> list[list[Chunk]]:
    chunks = [[None] * v for _ in range(p)]
    nxt = 0
    for i, st in enumerate(stages):
        r, c = i % p, i // p
        n = st.count("t")
        chunks[r][c] = Chunk(rank=r, chunk=c, layers=tuple(range(nxt, nxt + n)), embedding="E" in st,
                             loss="L" in st, mtp=st.count("m"))
        nxt += n
    return chunks


def pipeline_chunks(model, lay) -> list[list[Chunk]]:
    """For each pipeline rank, its model chunks in order (see the module docstring)."""
    p, v = lay.pp, lay.vp
    stages = layout_stages(model, lay)
    if stages is not None:
        return _chunks_from_layout(stages, p, v)
    counts = rank_layer_counts(model, lay)
    uneven = lay.first_stage_layers is not None or lay.last_stage_layers is not None
    # units per (rank, chunk); the embedding and the loss occupy one unit where accounted for
    per_chunk = [[0] * v for _ in range(p)]
    for r in range(p):
        if uneven:
            for c in range(v):
                per_chunk[r][c] = counts[r] // v
        else:
            units = (model.num_layers + int(lay.account_for_embedding) + int(lay.account_for_loss)) // (p * v)
            for c in range(v):
                per_chunk[r][c] = units
    chunks = [[None] * v for _ in range(p)]
    nxt = 0
    for c in range(v):
        for r in range(p):
            n = per_chunk[r][c]
            emb = (r == 0 and c == 0)
            loss = (r == p - 1 and c == v - 1)
            if not uneven:
                if emb and lay.account_for_embedding:
                    n -= 1
                if loss and lay.account_for_loss:
                    n -= 1
            layers = tuple(range(nxt, nxt + n))
            nxt += n
            chunks[r][c] = Chunk(rank=r, chunk=c, layers=layers, embedding=emb, loss=loss)
    if nxt != model.num_layers:  # pragma: no cover - guarded by rank_layer_counts
        raise InfeasibleError(f"pipeline split assigns {nxt} of {model.num_layers} layers")
    return chunks


def in_flight_per_chunk(lay, rank: int, m: int) -> list[int]:
    """Micro-batches of each of rank ``rank``'s chunks in flight at its peak: the warm-up forwards
    (``in_flight_chunks``) in Megatron-Core's interleaved order, forward k running chunk
    (k mod p v) div p (``get_model_chunk_id``); 1F1B: all on the one chunk."""
    p, v = lay.pp, lay.vp
    w = in_flight_chunks(lay, rank, m)
    if v == 1:
        return [w]
    out = [0] * v
    for k in range(w):
        out[(k % (p * v)) // p] += 1
    return out


def in_flight_chunks(lay, rank: int, m: int) -> int:
    """Chunk-micro-batches whose activations rank ``rank`` holds at its peak.

    1F1B (Narayanan et al. 2021, sec. 2.2.1): rank r runs p - r forwards before its first backward,
    so it holds min(m, p - r) micro-batches of its (single) chunk. Interleaved (Megatron-Core
    ``forward_backward_pipelining_with_interleaving``): (p - r - 1) 2 + (v - 1) p warm-up forwards
    plus one in the steady state, at most m v.
    """
    p, v = lay.pp, lay.vp
    if p == 1:
        return 1
    if v == 1:
        return min(m, p - rank)
    return min(m * v, (p - rank - 1) * 2 + (v - 1) * p + 1)
