"""Megatron-Core's pipeline layout strings (``--pipeline-layout``): parse, check, balance, print.

Syntax (Megatron-Core ``PipelineParallelLayerLayout``, megatron/core/transformer/
pipeline_parallel_layer_layout.py; the ``--pipeline-model-parallel-layout`` argument): one symbol
per layer -- ``E`` the input embedding, ``t`` a transformer (decoder) layer, ``m`` a multi-token-
prediction (MTP) layer, ``L`` the loss (final norm, LM head, cross entropy) -- ``|`` between
stages, ``X*N`` repeats a symbol, ``(...)*N`` a group, commas and spaces are cosmetic. Stages are
listed in virtual-stage order: stage i runs on pipeline rank i mod PP as its model chunk i div PP,
so a layout has PP x VP stages. Megatron's own example, DeepSeek-V3's 61 layers on 32 stages:
``Ettt|(tt|)*29,m|L``. A stage may be empty; ``E`` belongs to the first stage and ``L`` to the
last; MTP layers follow the last transformer layer.

``balanced_layout`` finds the layout ``--pipeline-layout auto`` uses: the contiguous split of
E, the layers, the MTP layers and L over PP x VP stages that minimises the largest stage's time
(binary search over the contiguous sums with a greedy check; the classic linear-partition problem),
each stage non-empty where there are enough units.
"""
from __future__ import annotations

import bisect

from servesim.errors import ConfigError

SYMBOLS = {"E": "embedding", "t": "transformer layer", "m": "MTP layer", "L": "loss"}
_HELP = "use E (embedding), t (transformer layer), m (MTP layer), L (loss), | between stages, X*N or (...)*N to repeat"


def _err(text: str, what: str) -> ConfigError:
    return ConfigError(f"--pipeline-layout {text!r}: {what}")


def _parse_seq(s: str, i: int, text: str, depth: int, opened: int = -1) -> tuple[str, int]:
    """Expand from position i to the matching ')' of the '(' at ``opened`` (depth > 0) or the end:
    (expanded, next i). Positions are 1-based in messages, counted after removing commas and spaces."""
    out = []
    while i < len(s):
        c = s[i]
        if c == ")":
            if depth == 0:
                raise _err(text, f"unbalanced parentheses: ')' at position {i + 1} has no matching '('")
            return "".join(out), i + 1
        if c == "(":
            atom, i = _parse_seq(s, i + 1, text, depth + 1, i)
            if not atom:
                raise _err(text, f"empty group '()' before position {i}")
        elif c in SYMBOLS or c == "|":
            atom, i = c, i + 1
        elif c == "*":
            raise _err(text, f"'*' at position {i + 1} follows nothing to repeat; {_HELP}")
        elif c.isdigit():
            raise _err(text, f"number at position {i + 1} without '*' before it; {_HELP}")
        else:
            raise _err(text, f"unknown symbol {c!r} at position {i + 1}; {_HELP}")
        if i < len(s) and s[i] == "*":
            j = i + 1
            while j < len(s) and s[j].isdigit():
                j += 1
            if j == i + 1:
                raise _err(text, f"'*' at position {i + 1} needs a repeat count (as in t*4 or (tt|)*29)")
            n = int(s[i + 1:j])
            if n > 100_000:
                raise _err(text, f"repeat count {n} at position {i + 2} is too large")
            atom, i = atom * n, j
        out.append(atom)
    if depth > 0:
        raise _err(text, f"unbalanced parentheses: the '(' at position {opened + 1} is never closed")
    return "".join(out), i


def parse_layout(text: str) -> list[str]:
    """The stages of a layout string, each a string of E/t/m/L (possibly empty), in virtual-stage order."""
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(f"--pipeline-layout: expected a layout such as 'Et|(tt|)*30mL' or auto, got {text!r}")
    s = "".join(ch for ch in text if ch not in ", \t")
    flat, _ = _parse_seq(s, 0, text, 0)
    return flat.split("|")


def check_stages(stages: list[str], text: str, model, pp: int, vp: int) -> None:
    """The layout fits the model (its layer count) and PP x VP (its stage count); one-line errors."""
    n = len(stages)
    if n != pp * vp:
        if n % pp == 0:
            raise _err(text, f"{n} stages are {pp} pipeline ranks x {n // pp} virtual stages, but --vp is {vp}; "
                             f"use --vp {n // pp} or a layout of {pp * vp} stages")
        raise _err(text, f"{n} stages, but --pp x --vp = {pp} x {vp} = {pp * vp}; write {pp * vp} stages "
                         f"separated by |")
    flat = "".join(stages)
    t = flat.count("t")
    if t != model.num_layers:
        raise _err(text, f"places {t} transformer layers (t) but {model.name} has {model.num_layers}; "
                         f"write {model.num_layers} t in all")
    for sym, where, idx in (("E", "first", 0), ("L", "last", n - 1)):
        c = flat.count(sym)
        if c != 1:
            raise _err(text, f"needs exactly one {sym} ({SYMBOLS[sym]}), found {c}")
        if sym not in stages[idx]:
            raise _err(text, f"{sym} ({SYMBOLS[sym]}) must be in the {where} stage")
    if not stages[0].startswith("E"):
        raise _err(text, "E (embedding) must come first in the first stage")
    if not stages[-1].endswith("L"):
        raise _err(text, "L (loss) must come last in the last stage")
    if "m" in flat and flat.index("m") < flat.rindex("t"):
        raise _err(text, "MTP layers (m) must follow the last transformer layer (t)")


def _compress_stage(stage: str) -> str:
    out, i = [], 0
    while i < len(stage):
        j = i
        while j < len(stage) and stage[j] == stage[i]:
            j += 1
        n = j - i
        out.append(stage[i] * n if n <= 2 else f"{stage[i]}*{n}")
        i = j
    return "".join(out)


def format_layout(stages: list[str]) -> str:
    """Stages back to a compact layout string: runs of a symbol as X*N, repeated stages as (...|)*N."""
    parts = [_compress_stage(s) for s in stages]
    out, i = [], 0
    while i < len(parts):
        j = i
        while j + 1 < len(parts) and parts[j + 1] == parts[i]:
            j += 1
        n = j - i + 1
        last = j == len(parts) - 1
        if n >= 3 and not last:
            out.append(f"({parts[i]}|)*{n}")
        else:
            out.append("|".join(parts[i:j + 1]) + ("" if last else "|"))
        i = j + 1
    return "".join(out)


def _greedy(costs: list[float], cap: float) -> int:
    """Stages a greedy left-to-right packing under ``cap`` needs."""
    k, cur = 1, 0.0
    for c in costs:
        if cur + c > cap and cur > 0:
            k += 1
            cur = c
        else:
            cur += c
    return k


def balanced_layout(units: list[str], costs: list[float], stages: int) -> list[str]:
    """Split ``units`` (E, t..., m..., L in order) into ``stages`` contiguous stages minimising the
    largest stage cost; every stage non-empty when there are at least as many units as stages."""
    n = len(units)
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    sums = sorted({prefix[j] - prefix[i] for i in range(n) for j in range(i + 1, n + 1)})
    lo = bisect.bisect_left(sums, max(costs))
    hi = len(sums) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if _greedy(costs, sums[mid]) <= stages:
            hi = mid
        else:
            lo = mid + 1
    cap = sums[lo] * (1 + 1e-12)
    groups: list[list[int]] = [[]]
    cur = 0.0
    for i, c in enumerate(costs):
        if groups[-1] and cur + c > cap:
            groups.append([])
            cur = 0.0
        groups[-1].append(i)
        cur += c
    # more stages than the greedy packing used: split the costliest splittable stage (never raises the max)
    while len(groups) < stages:
        splittable = [g for g in range(len(groups)) if len(groups[g]) > 1]
        if not splittable:
            groups.append([])
            continue
        g = max(splittable, key=lambda k: sum(costs[i] for i in groups[k]))
        members = groups[g]
        total = sum(costs[i] for i in members)
        acc, cut = 0.0, 1
        for idx, i in enumerate(members[:-1]):
            acc += costs[i]
            if acc >= total / 2:
                cut = idx + 1
                break
            cut = idx + 1
        groups[g:g + 1] = [members[:cut], members[cut:]]
    return ["".join(units[i] for i in g) for g in groups]


__all__ = ["SYMBOLS", "balanced_layout", "check_stages", "format_layout", "parse_layout"]
