"""A whole engine step assembled from AIConfigurator's kernel tables vs the cost model's own kernel sum.

For a model, GPU and TP, one step (a decode batch, or one prefill chunk plus decodes) is priced
twice, class by class:

- **table**: every kernel of the step looked up in the measured tables of the engine on that GPU
  (``servesim/calibrate/data/aiconfigurator``: GEMM bf16, fused MoE, prefill and decode attention,
  the engine's all-reduce under a CUDA graph or eager), interpolated linearly between grid points
  (exact for the roofline's linear forms: time ~ a + b n k at small m, ~ m n k at large m) and
  extrapolated linearly beyond the last point on an axis (LM heads wider than the 65,536 columns
  of the GEMM grid);
- **model**: the same kernels from ``servesim.costmodel`` as the simulator prices them, from the
  CostParams lowered for the run, with ``graph_overlap`` set to 0 so that every kernel is priced
  as the tables measure it, alone (the overlap is an end-to-end term; ``overlap_s`` says how much
  it takes off).

Classes: ``gemm`` (the layers' linear layers, shared experts, router and the LM head on the sampled
rows), ``moe`` (the routed experts' fused kernel), ``attention``, ``allreduce``. Elementwise
kernels (norms, rope, activation) have no table and are reported as the model prices them
(``elementwise``), outside the check. The GEMMs and all-reduces run on the CUDA-graph padded
token count, as the engine does, on both sides. The MoE rows of the tables use a balanced router
(every expert receives tokens once T k >= E), so the model is asked at the same routing
(``kernels.balanced_experts_nb``); in a simulation it takes the expected distinct experts of
uniform random routing instead.

A row is ``None`` (not compared) where the table cannot price it: KV heads per GPU beyond the
attention tables' 8, MLA attention (tables not shipped), MoE shapes absent from the table, an
all-reduce above the custom kernel's limit (8 MiB: vLLM 0.15.1 runs its symmetric-memory all-reduce
there, which the tables do not measure), or a GPU without the table. Fused MoE between two of the
table's token counts is compared with the model interpolated between the same two counts (both
sides linear; the kernel's tile steps in between are in neither). ``experiments/step_table.py`` writes the report.
"""
from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np
import pandas as pd

from servesim.calibrate import engine_kernels as ek
from servesim.config import load_hardware, load_model
from servesim.config.engine import load_engine, with_fit
from servesim.costmodel import kernels as kn
from servesim.costmodel.features import features
from servesim.costmodel.fields import table
from servesim.costmodel.iteration import _gemm16_nb, _gemms_nb, allreduce_nb, attention_nb, graph_tokens_nb
from servesim.costmodel.memory import weight_bytes_per_gpu
from servesim.costmodel.moe_tiles import pick_tile_nb
from servesim.costmodel.params import Layout, lower

TARGET = 0.10     # issue #23: every class within 10% of the tables at every batch
CLASSES = ("gemm", "moe", "attention", "allreduce")
# AIConfigurator folder of each servesim hardware profile that has shipped vLLM tables
TABLE_GPUS = {v: k for k, v in ek.GPUS.items()}


def _axis(grid: np.ndarray, x: float) -> tuple[int, float]:
    """Left index and weight of ``x`` on an increasing ``grid``: inside, the bracketing cell; beyond
    either end, the end cell with a weight outside [0, 1] (linear extrapolation)."""
    n = grid.shape[0]
    if n == 1:
        return 0, 0.0
    i = int(np.searchsorted(grid, x, side="right")) - 1
    i = min(max(i, 0), n - 2)
    return i, (x - grid[i]) / (grid[i + 1] - grid[i])


def _interp(grids: tuple, values: np.ndarray, point: tuple) -> float:
    """Multilinear interpolation of ``values`` (one axis per grid) at ``point``; NaN if a corner is
    missing from the table."""
    idx = [_axis(g, x) for g, x in zip(grids, point)]
    total = 0.0
    for corner in range(2 ** len(idx)):
        w = 1.0
        sel = []
        for d, (i, t) in enumerate(idx):
            bit = (corner >> d) & 1
            sel.append(i + bit if grids[d].shape[0] > 1 else i)
            w *= (t if bit else 1.0 - t) if grids[d].shape[0] > 1 else (1.0 if bit == 0 else 0.0)
        if w == 0.0:
            continue
        v = values[tuple(sel)]
        if not np.isfinite(v):
            return math.nan
        total += w * v
    return float(total)


def _grid(frame: pd.DataFrame, axes: tuple) -> tuple:
    """(grids, values) of ``frame``'s time_s over the columns ``axes`` (missing cells NaN)."""
    grids = tuple(np.array(sorted(frame[a].unique()), dtype=np.float64) for a in axes)
    values = np.full(tuple(g.shape[0] for g in grids), np.nan)
    pos = [np.searchsorted(g, frame[a].to_numpy(np.float64)) for g, a in zip(grids, axes)]
    values[tuple(pos)] = frame["time_s"].to_numpy(np.float64)
    return grids, values


@dataclasses.dataclass
class Tables:
    """One engine's shipped tables on one GPU, gridded for lookup."""
    gpu: str
    gemm: tuple
    decode: dict        # (heads, kv_heads) -> (grids, values) over (seqs, step)
    prefill: dict       # (heads, kv_heads) -> (grids, values) over (seqs, chunk)
    allreduce: dict     # (n, eager) -> (grids, values) over nbytes
    moe: dict           # (hidden, inter, experts, topk, tp) -> (grids, values) over tokens

    def gemm_time(self, m: float, n: float, k: float) -> float:
        return _interp(self.gemm[0], self.gemm[1], (m, n, k))

    def _heads(self, table: dict, heads: float, kv: float, point: tuple) -> float:
        """Linear in the query heads between the table's head counts for this KV-head count."""
        hs = np.array(sorted(h for h, g in table if g == kv), dtype=np.float64)
        if hs.size == 0:
            return math.nan
        i, t = _axis(hs, heads)
        if hs.size == 1:
            return _interp(*table[(hs[0], kv)], point) if hs[0] == heads else math.nan
        lo = _interp(*table[(hs[i], kv)], point)
        hi = _interp(*table[(hs[i + 1], kv)], point)
        return (1.0 - t) * lo + t * hi

    def decode_time(self, seqs: float, heads: float, kv: float, ctx: float) -> float:
        """One decode attention layer: ``seqs`` sequences, ``ctx`` tokens each (the new one included)."""
        return self._heads(self.decode, heads, kv, (seqs, ctx - 1.0))

    def prefill_time(self, seqs: float, heads: float, kv: float, chunk: float) -> float:
        return self._heads(self.prefill, heads, kv, (seqs, chunk))

    def allreduce_time(self, n: float, nbytes: float, eager: bool) -> float:
        key = (float(n), bool(eager))
        if key not in self.allreduce:
            return math.nan
        return _interp(*self.allreduce[key], (nbytes,))

    def moe_time(self, tokens: float, hidden: float, inter: float, experts: float, topk: float, tp: float) -> float:
        key = (float(hidden), float(inter), float(experts), float(topk), float(tp))
        if key not in self.moe:
            return math.nan
        return _interp(*self.moe[key], (tokens,))

    def moe_tokens(self, hidden: float, inter: float, experts: float, topk: float, tp: float):
        """The token counts the MoE table measured for this shape (None: not in the table)."""
        key = (float(hidden), float(inter), float(experts), float(topk), float(tp))
        return self.moe[key][0][0] if key in self.moe else None


@functools.lru_cache(maxsize=None)
def load_tables(gpu: str, engine: str = "vllm") -> Tables:
    """The shipped ``engine`` tables of AIConfigurator GPU folder ``gpu`` (``h100_sxm``, ``a100_sxm``)."""
    g = ek.gemm_frame(gpu, [engine])
    g = g[g["dtype"] == "bf16"]
    d = ek.decode_frame(gpu, engine)
    d = d[d["kv_dtype"] == "bf16"]
    p = ek.prefill_frame(gpu, engine)
    p = p[p["kv_dtype"] == "bf16"]
    a = ek.allreduce_frame(gpu, engine)
    moe = {}
    mf = ek.moe_frame(gpu, engine)
    if mf is not None:
        mf = mf[(mf["dtype"] == "bf16") & (mf["ep"] == 1.0)]
        for key, part in mf.groupby(["hidden", "inter", "experts", "topk", "tp"]):
            # inter in the frame is per GPU; key the table by the model's full width
            hidden, inter_gpu, experts, topk, tp = key
            moe[(hidden, inter_gpu * tp, experts, topk, tp)] = _grid(part, ("tokens",))
    return Tables(
        gpu=gpu, gemm=_grid(g, ("m", "n", "k")),
        decode={key: _grid(part.assign(step=part["kv_tokens"] / part["seqs"] - 1.0), ("seqs", "step"))
                for key, part in d.groupby(["heads", "kv_heads"])},
        prefill={key: _grid(part, ("seqs", "chunk")) for key, part in p.groupby(["heads", "kv_heads"])},
        allreduce={(float(n), bool(e)): _grid(part, ("nbytes",)) for (n, e), part in a.groupby(["n", "eager"])},
        moe=moe)


@dataclasses.dataclass(frozen=True)
class Step:
    """One engine step: ``decodes`` sequences of ``context`` tokens, plus ``chunk`` prefill tokens of
    one new sequence (0: a decode-only step)."""
    decodes: int
    context: int
    chunk: int = 0

    budget: bool = False      # the chunk fills a token budget with the decodes (chunk + decodes = budget)

    @property
    def kind(self) -> str:
        return ("budget" if self.budget else "mixed") if self.chunk else "decode"


def _lowered(model, hw, tp: int, engine):
    eng = dataclasses.replace(engine, fits={hw.name: with_fit(engine.fit_for(hw), graph_overlap=0.0)})
    return lower(model, hw, Layout(tp=tp), eng, max_num_seqs=engine.scheduler.max_num_seqs,
                 max_tokens=engine.scheduler.max_num_batched_tokens)


def _gemm_shapes(p) -> list:
    """(k, n, count per step) of every dense GEMM of one forward, per GPU."""
    shapes = []
    layers = p.n_dense_layers + p.n_moe_layers
    for k, n in zip(p.attn_k, p.attn_n):
        shapes.append((k, n, layers))
    for k, n in zip(p.mlp_k, p.mlp_n):
        shapes.append((k, n, p.n_dense_layers))
    for k, n in zip(p.sh_k, p.sh_n):
        shapes.append((k, n, p.n_moe_layers))
    if p.n_moe_layers > 0.0:
        shapes.append((p.hidden, p.router_n, p.n_moe_layers))
    return shapes


def _moe_model(p, m: float) -> float:
    """One layer's routed experts over m tokens at balanced routing, as the cost model prices them."""
    pairs = m * p.top_k
    touched = kn.balanced_experts_nb(pairs, p.experts)
    tile_m, tile_n, tile_k = pick_tile_nb(p.moe_tile_keys, p.moe_tile_m, p.moe_tile_n, p.moe_tile_k, m)
    return kn.moe_experts_time_nb(pairs, touched, pairs, p.hidden, p.exp_inter, p.gated > 0.0, p.w_bytes, p.a_bytes,
                                  p.peak, p.hbm_bw, p.sms, p.g16_max, p.g_hbm, p.g_tile_k, p.moe_eff, p.moe_latency,
                                  p.moe_pair, tile_m, tile_n, p.moe_ridge, tile_k, p.moe_stream)


def step_classes(model, hw, tp: int, step: Step, engine, tables: Tables | None) -> dict:
    """{class: (table_s, model_s)} for one step (table_s NaN where the table cannot price it), plus
    ``elementwise`` (model only) and ``overlap_s`` (what the fitted graph_overlap takes off)."""
    p = _lowered(model, hw, tp, engine)
    pt = table(p)       # the jitted cost functions take the packed table (costmodel/fields.py)
    fs = features(pt)   # ... and the markers of its optional parts (costmodel/features.py)
    tokens = step.decodes + step.chunk
    n_pf = 1.0 if step.chunk else 0.0
    n_logit = step.decodes + n_pf
    padded = graph_tokens_nb(p.graph_sizes, float(tokens)) if p.graph_mode > 0.0 else -1.0
    graphed = padded > 0.0
    m = padded if graphed else float(tokens)
    layers = p.n_dense_layers + p.n_moe_layers
    out = {}
    nan = math.nan
    t = tables

    # GEMMs: linear layers at the padded m, LM head on the sampled rows
    g_model = (layers * _gemms_nb(pt, fs.wo, m, p.attn_k, p.attn_n)
               + p.n_dense_layers * _gemms_nb(pt, fs.wo, m, p.mlp_k, p.mlp_n))
    if p.n_moe_layers > 0.0:
        g_model += p.n_moe_layers * (_gemms_nb(pt, fs.wo, m, p.sh_k, p.sh_n) + _gemm16_nb(pt, m, p.hidden, p.router_n))
    g_model += _gemm16_nb(pt, n_logit, p.hidden, p.vocab_gpu)
    if t is not None:
        g_table = sum(c * t.gemm_time(m, n, k) for k, n, c in _gemm_shapes(p))
        g_table += t.gemm_time(n_logit, p.vocab_gpu, p.hidden)
    else:
        g_table = nan
    out["gemm"] = (g_table, g_model)

    # routed experts (balanced routing, as the tables); between two token counts of the table both sides
    # are interpolated the same way (the table's points bracket m; the kernel's tile steps in between
    # are in neither), so the class compares the model with the measurements where they exist
    if p.n_moe_layers > 0.0:
        key = (p.hidden, p.exp_inter * p.tp, p.experts, p.top_k, p.tp)
        grid = t.moe_tokens(*key) if t is not None else None
        if grid is not None and grid.shape[0] > 1 and m not in grid:
            i, w = _axis(grid, m)
            moe_model = (1.0 - w) * _moe_model(p, grid[i]) + w * _moe_model(p, grid[i + 1])
        else:
            moe_model = _moe_model(p, m)
        moe_table = nan if t is None else p.n_moe_layers * t.moe_time(m, *key)
        out["moe"] = (moe_table, p.n_moe_layers * moe_model)

    # attention on the real sequences
    kv_dec = float(step.decodes * step.context)
    pairs_pf = step.chunk * (step.chunk + 1) / 2.0
    a_model = layers * attention_nb(pt, fs.mla, float(step.chunk), n_pf, pairs_pf, float(step.chunk),
                                    float(step.decodes), kv_dec)
    if t is None or p.mla > 0.0:
        a_table = nan
    else:
        a_table = 0.0
        if step.decodes:
            a_table += t.decode_time(step.decodes, p.heads, p.kv_heads, step.context)
        if step.chunk:
            a_table += t.prefill_time(1.0, p.heads, p.kv_heads, step.chunk)
        a_table *= layers
    out["attention"] = (a_table, a_model)

    # the TP all-reduces (two per layer) on the padded tokens
    if p.tp > 1.0:
        ar_model = 2.0 * layers * allreduce_nb(pt, m, graphed)
        msg = m * p.hidden * 2.0
        # the tables measure vLLM's custom all-reduce kernel; above its own limit vLLM 0.15.1 runs the
        # symmetric-memory all-reduce (engines/vllm.toml [SYM]), which they do not measure
        custom = p.ar_custom > 0.0 and msg <= min(p.ar_max_bytes, engine.custom_allreduce_max_bytes)
        ar_table = nan if (t is None or not custom) else 2.0 * layers * t.allreduce_time(p.tp, msg, not graphed)
        out["allreduce"] = (ar_table, ar_model)

    out["elementwise"] = (nan, layers * (m * p.elem_s_tok_layer + p.elem_kernels * p.elem_latency))
    return out


def step_table(models, hardware, tps=(1, 2, 4, 8), batches=(1, 8, 32, 64, 128, 256),
               contexts=(512, 1024, 2048, 4096), chunk: int = 2048, engine: str = "vllm",
               gpu_memory_utilization: float = 0.9) -> pd.DataFrame:
    """One row per (hardware, model, tp, step, class): table_s, model_s, error = model / table - 1.
    Decode steps at every batch x context, mixed steps (one ``chunk``-token prefill plus each batch
    of decodes at the middle context) and budget steps (a prefill chunk that fills a ``chunk``-token
    budget with the decodes, as vLLM's scheduler fills ``max_num_batched_tokens``). Layouts whose weights do not fit, or whose TP does not divide
    the heads, are skipped."""
    eng = load_engine(engine)
    rows = []
    for hw_name in hardware:
        hw = load_hardware(hw_name)
        gpu = TABLE_GPUS.get(hw.name)
        tables = load_tables(gpu, engine) if gpu else None
        for name in models:
            model = load_model(name)
            for tp in tps:
                if model.num_attention_heads % tp or (model.mla is None and model.num_kv_heads % tp
                                                      and tp % model.num_kv_heads):
                    continue
                if weight_bytes_per_gpu(model, tp, 1, "bf16") > gpu_memory_utilization * hw.device_bytes:
                    continue
                steps = [Step(b, c) for b in batches for c in contexts]
                mid = sorted(contexts)[len(contexts) // 2]
                steps += [Step(b, mid, chunk) for b in (0,) + tuple(batches)]
                steps += [Step(b, mid, chunk - b, budget=True) for b in batches if b < chunk]
                for s in steps:
                    for cls, (tab, mod) in step_classes(model, hw, tp, s, eng, tables).items():
                        rows.append({"hardware": hw.name, "model": model.name, "tp": tp, "kind": s.kind,
                                     "batch": s.decodes, "context": s.context, "chunk": s.chunk, "class": cls,
                                     "table_s": tab, "model_s": mod,
                                     "error": mod / tab - 1.0 if tab and np.isfinite(tab) and tab > 0 else math.nan})
    return pd.DataFrame(rows)


def worst_by_class(frame: pd.DataFrame) -> pd.DataFrame:
    """Per (hardware, class, kind, batch): rows compared, median and largest |error|, signed median."""
    f = frame[np.isfinite(frame["error"])]
    g = f.assign(abs_err=f["error"].abs()).groupby(["hardware", "class", "kind", "batch"])
    return pd.DataFrame({"n": g.size(), "median": g["abs_err"].median(), "max": g["abs_err"].max(),
                         "signed": g["error"].median()}).reset_index()


__all__ = ["CLASSES", "Step", "Tables", "load_tables", "step_classes", "step_table", "worst_by_class"]
