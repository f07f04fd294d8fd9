"""Which optional parts of the step cost a run compiles: MoE layers, expert parallelism (EP or DP
attention, with its all-to-all), MLA attention, weight-only GEMMs.

numba compiles a jitted function once per type of its arguments, and before typing it removes a
branch ``if x is None`` / ``if x is not None`` on an argument ``x`` typed None (numba's dead-branch
pruning, ``numba.core.analysis.dead_branch_prune``); code reachable only through a removed branch is
never compiled. So each optional part is a marker argument of the jitted functions that branch on it
(``iteration.py``: ``moe``, ``ep``, ``mla``, ``wo``): None leaves its code out, True keeps it, and then
each table still chooses by its own fields (``p[F.n_moe_layers] > 0``, ...) as before. The formulas
are written once; only what is compiled changes, never a result.

A run compiles one of two shapes (`SHAPES`), the smallest that covers every cost table it prices
(`features`): `PLAIN` for a dense model with neither MLA, EP nor weight-only GEMMs, `FULL` otherwise.
Two, not one per combination: each shape is a separate compilation of the event loop that calls the
step cost, and `servesim warmup` compiles every one of them for every feature set of the engine.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from . import fields as F


class Features(NamedTuple):
    """The markers, in the order the jitted functions take them: None (left out) or True (compiled)."""
    moe: object     # MoE layers: routed experts, shared experts, router
    ep: object      # expert parallelism or DP attention (EP > 1 or attn_dp > 1): rank loads, all-to-all
    mla: object     # multi-head latent attention
    wo: object      # weight-only (int4) GEMMs


PLAIN = Features(None, None, None, None)
FULL = Features(True, True, True, True)
SHAPES = {"plain": PLAIN, "full": FULL}


def _optional(row) -> bool:
    """Whether the cost table ``row`` uses any optional part."""
    return (row[F.n_moe_layers] > 0.0 or row[F.ep] > 1.0 or row[F.attn_dp] > 1.0 or row[F.mla] > 0.0
            or row[F.g_wo] > 0.0)


def features(*tabs) -> Features:
    """The shape of `SHAPES` that prices every cost table in ``tabs`` (`fields.table` rows: 1-D, or
    2-D with one row per pool; None entries are skipped)."""
    for t in tabs:
        if t is not None and any(_optional(row) for row in np.atleast_2d(t)):
            return FULL
    return PLAIN


__all__ = ["FULL", "Features", "PLAIN", "SHAPES", "features"]
