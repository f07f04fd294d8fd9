"""Which tile a fused-MoE kernel runs for a batch: the engine's tuned configs, else its default.

vLLM's Triton ``fused_moe`` looks up a JSON config for (local experts E, expert width per GPU N,
device, dtype) and takes the entry whose batch size M is nearest the batch's token count
(``try_get_optimal_moe_config``: ``min(configs, key=lambda x: abs(x - M))``); without a file it uses
``get_default_config``: BLOCK_SIZE 16 x 32 (K step 64) when M <= E, else 64 x 64 (K step 32) (vllm 0.15.1
``vllm/model_executor/layers/fused_moe/fused_moe.py``). The tuned tiles are copied, per shipped
hardware profile, into the engine's configs CSV (``engines/vllm_moe_configs.csv``, with its source
line); the default tiles are engine-profile keys (``moe_default_tile_small``, ``moe_default_tile``).

A lookup returns plain arrays (keys, tile rows, tile columns, K step) that the jitted step cost searches
(``pick_tile_nb``); an engine without tile data gets empty arrays and the kernel formula's own
tile choice (``kernels.moe_experts_time_nb`` with tile_m = 0).
"""
from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
from numba import njit

from ..errors import ConfigError
from ..jit import JIT


@functools.lru_cache(maxsize=None)
def read_configs(path: Path) -> dict:
    """{(hardware, dtype, experts, n): (m keys, block_m, block_n, block_k)} from an engine's configs CSV."""
    import csv
    out: dict = {}
    try:
        lines = [ln for ln in Path(path).read_text().splitlines() if ln and not ln.startswith("#")]
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the fused-MoE configs ({exc})") from None
    rows = list(csv.DictReader(lines))
    need = {"hardware", "dtype", "experts", "n", "m", "block_m", "block_n", "block_k"}
    if not rows or not need <= set(rows[0]):
        raise ConfigError(f"{path}: a fused-MoE configs CSV needs the columns {', '.join(sorted(need))}")
    groups: dict = {}
    for r in rows:
        try:
            key = (r["hardware"], r["dtype"], int(r["experts"]), int(r["n"]))
            groups.setdefault(key, []).append((int(r["m"]), float(r["block_m"]), float(r["block_n"]),
                                               float(r["block_k"])))
        except ValueError:
            raise ConfigError(f"{path}: non-integer value in row {r}") from None
    for key, entries in groups.items():
        entries.sort()
        a = np.asarray(entries, dtype=np.float64)
        out[key] = tuple(np.ascontiguousarray(a[:, i]) for i in range(4))
    return out


def tile_table(engine, hw_name: str, dtype: str, experts: int, n: int) -> tuple:
    """(m keys, block_m, block_n, block_k, tuned) of the fused-MoE kernel for E local experts of width n
    per GPU. ``dtype``: "16bit" (the shipped tiles). Engines without tile data: four empty arrays and
    False."""
    empty = np.zeros(0)
    if engine.moe_configs is None:
        return empty, empty, empty, empty, False
    table = read_configs(engine.moe_configs).get((hw_name, dtype, int(experts), int(n)))
    if table is not None:
        return table[0], table[1], table[2], table[3], True
    # the default config as a two-key table: M <= E takes the small tile, M >= E + 1 the large one
    small, large = engine.moe_default_tile_small, engine.moe_default_tile
    return (np.array([float(experts), float(experts) + 1.0]), np.array([float(small[0]), float(large[0])]),
            np.array([float(small[1]), float(large[1])]), np.array([float(small[2]), float(large[2])]), False)


@njit(**JIT)
def pick_tile_nb(keys, block_m, block_n, block_k, tokens):
    """(rows, columns, K step) of the entry whose key is nearest ``tokens`` (the first of two equally
    near), as vLLM picks it; zeros without entries."""
    n = keys.shape[0]
    if n == 0:
        return 0.0, 0.0, 0.0
    best = 0
    for i in range(1, n):
        if abs(keys[i] - tokens) < abs(keys[best] - tokens):
            best = i
    return block_m[best], block_n[best], block_k[best]


__all__ = ["pick_tile_nb", "read_configs", "tile_table"]
