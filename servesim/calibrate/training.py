"""Reproduce published training throughputs with servesim.training, and fit two parameters.

``data/training_published_calibration.csv`` (a copy of the shared calibration set; every value
from a public source named in its ``source`` column): Megatron-LM (Narayanan et al. 2021 Table 1
and the ZeRO-3 comparison of sec. 5.2 / Table 2; Korthikanti et al. 2022 step times), the
Megatron-Core README H100 weak-scaling table, NVIDIA DGX Cloud (NeMo 2.0) Llama 3.1 step times,
and MosaicML llm-foundry (Composer, FSDP) throughputs.

Every run is compared on one quantity, **tokens/s per GPU**:

- ``step_time_s``: global_batch x seq_len / (step x GPUs);
- ``tokens_per_s_per_gpu``: as published;
- ``tflops_per_gpu`` (Megatron-Core README): divided by the FLOPs per token of Megatron-Core's own
  ``num_floating_point_operations`` (training.py), 12 L h^2 (1 + g/a + s/h + (ffn/h) x glu) + 6 h V;
- ``hw_tflops_per_gpu`` (Narayanan et al. 2021 eq. 3, which includes the recompute forward):
  divided by 96 l h^2 (1 + s/(6h) + V/(16 l h)) per token.
MFU / HFU rows restate a throughput row of the same run with the source's own FLOP formula and are
not compared again; the four MFU rows without such a twin (rows 18, 19: layout per point not given;
68, 69: batch not given) cannot be priced.

Each source runs under its framework profile (``servesim/training/data/frameworks``): Megatron-LM
and Megatron-Core rows ``megatron``, DGX Cloud ``nemo``, llm-foundry ``composer``, the ZeRO-3 rows
``deepspeed``. What the sources say about the run is applied (recompute, micro-batch, interleaving,
mixed-precision mode); where a source is silent the assumption is printed per row:

- micro-batch 1; virtual stages 1;
- recompute ``auto`` (the least recomputation that fits, as a tuned recipe would choose) where the
  source does not state it (Megatron-Core README, DGX Cloud);
- Megatron-LM 2021/2022 (before FlashAttention and before --overlap-grad-reduce): unfused attention,
  dropout 0.1 (GPT-3 recipe), no DP overlap, no distributed optimizer (ZeRO 0); sequence
  parallelism with the Korthikanti "selective" rows (the paper's "present work");
- Megatron-Core / NeMo: distributed optimizer, SP with TP, --tp-comm-overlap with TP (the README's
  and the NeMo performance recipes' setting);
- Llama-3.1-405B (126 layers on pp x vp = 64 chunks): the embedding and the loss counted as
  pipeline layers (NeMo's llama31_405b recipe), 2 layers per chunk;
- Narayanan et al. Table 2 rows give only the model-parallel size TP x PP: TP 8 (a node, as every
  Table 1 run of that size), PP = MP / 8;
- llm-foundry: fp32 parameter gathers under Composer's mixed_precision DEFAULT, bf16 under PURE
  (the table's "MP mode").

Runs are priced with the memory check on: a published run the memory model refuses is reported as
refused, with the message.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from servesim.config import load_hardware, load_model
from servesim.config.model import ModelConfig
from servesim.errors import ServesimError
from servesim.training import TrainLayout, train_step
from servesim.training.params import FITTED, TrainingFit

DATA = Path(__file__).resolve().parent / "data" / "training_published_calibration.csv"
METRICS = ("step_time_s", "tokens_per_s_per_gpu", "tflops_per_gpu", "hw_tflops_per_gpu")
HARDWARE = {"H100 80GB SXM (DGX)": "h100-sxm", "H100 80GB SXM (DGX Cloud reference)": "h100-sxm",
            "H100 80GB": "h100-sxm", "A100 80GB SXM (DGX A100, Selene)": "a100-sxm-80gb",
            "A100 80GB (1600 Gbps RoCE node-node)": "a100-sxm-80gb",
            "A100 40GB (1600 Gbps RoCE node-node)": "a100-sxm-40gb"}
# llm-foundry scripts/train/yamls/pretrain/mpt-*.yaml: (d_model, n_layers, n_heads); vocab 50368,
# no biases, ALiBi (no position parameters), tied embeddings, expansion ratio 4.
MPT = {"MPT-1B": (2048, 24, 16), "MPT-3B": (2560, 32, 20), "MPT-7B": (4096, 32, 32),
       "MPT-13B": (5120, 40, 40), "MPT-30B": (7168, 48, 64), "MPT-70B": (8192, 80, 64)}
# Narayanan et al. 2021 Table 2 models named by size only (Table 1 shapes).
GPT_BY_SIZE = {"GPT 174.6B": (12288, 96, 96), "GPT 529.6B": (20480, 105, 128)}
LLAMA = {"Llama 3.1 8B": "llama-3.1-8b", "Llama 3.1 70B": "llama-3.1-70b", "Llama 3.1 405B": "llama-3.1-405b"}


def source_group(framework: str) -> str:
    if framework.startswith("DeepSpeed"):
        return "deepspeed"
    if framework.startswith("Megatron"):
        return "megatron"
    if framework.startswith("NeMo"):
        return "nemo"
    return "llm-foundry"


def gpt_model(name: str, h: int, layers: int, heads: int, vocab: int, seq: int, mpt: bool = False) -> ModelConfig:
    """A GPT block model (4h GELU MLP, multi-head attention, LayerNorm) built in code."""
    return ModelConfig(
        name=name, source="servesim.calibrate.training", published_params=0.0, num_layers=layers,
        hidden_size=h, num_attention_heads=heads, num_kv_heads=heads, head_dim=h // heads,
        ffn_hidden_size=4 * h, activation="gelu", gated_mlp=False, vocab_size=vocab,
        tied_embeddings=True, max_context=seq, rope_theta=10000.0 if mpt else 0.0,
        position_embedding="rope" if mpt else "learned", norm="layernorm", linear_bias=not mpt,
        qkv_bias=False, moe=None, mla=None, path=Path(name))


@dataclass(frozen=True)
class Case:
    row: int
    group: str
    label: str
    model: ModelConfig
    hardware: str
    layout: TrainLayout
    metric: str
    value: float
    published_tokens_per_s_per_gpu: float
    assumptions: str


def _num(x, default=None):
    try:
        v = float(x)
    except (TypeError, ValueError):
        return default
    return default if math.isnan(v) else v


def _model_for(r) -> ModelConfig | None:
    name = str(r["model"])
    seq = int(r["seq_len"])
    if name in LLAMA:
        return load_model(LLAMA[name])
    if name in MPT:
        h, layers, heads = MPT[name]
        return gpt_model(name, h, layers, heads, 50368, seq, mpt=True)
    if name in GPT_BY_SIZE:
        h, layers, heads = GPT_BY_SIZE[name]
        return gpt_model(name, h, layers, heads, 51200, seq)
    m = re.search(r"h=(\d+), L=(\d+), heads=(\d+)", name)
    if not m:
        return None
    vocab = 131072 if str(r["framework"]).startswith("Megatron-Core") else 51200
    return gpt_model(name, int(m[1]), int(m[2]), int(m[3]), vocab, seq)


def megatron_core_flops_per_token(model, s: int) -> float:
    """Megatron-Core ``num_floating_point_operations`` per token (no MoE): 12 L h^2
    ((1 + g/a + s/h) q/h + (ffn/h) glu) + 6 h V, q/h = heads x head_dim / h."""
    h = model.hidden_size
    glu = 1.5 if model.gated_mlp else 1.0
    q_ratio = model.num_attention_heads * model.head_dim / h
    g_a = model.num_kv_heads / model.num_attention_heads
    return (12.0 * model.num_layers * h * h * ((1 + g_a + s / h) * q_ratio + model.ffn_hidden_size / h * glu)
            + 6.0 * h * model.vocab_size)


def narayanan_flops_per_token(model, s: int) -> float:
    """Narayanan et al. 2021 eq. 3 per token: 96 l h^2 (1 + s/(6h) + V/(16 l h)) (with recompute)."""
    h, layers = model.hidden_size, model.num_layers
    return 96.0 * layers * h * h * (1 + s / (6.0 * h) + model.vocab_size / (16.0 * layers * h))


def _fsdp_param_bytes(notes: str) -> int | None:
    m = re.search(r"MP mode (\w+)", notes)
    if not m:
        return None
    return 2 if m[1].upper() == "PURE" else 4


def load_cases(path: Path = DATA) -> tuple[list[Case], pd.DataFrame]:
    """(reproducible cases, rows not compared with the reason)."""
    df = pd.read_csv(path)
    cases, skipped = [], []
    throughput_runs = set()
    for i, r in df.iterrows():
        if r["metric"] in METRICS:
            throughput_runs.add(_run_key(r))
    for i, r in df.iterrows():
        if r["metric"] not in METRICS:
            if _run_key(r) not in throughput_runs:
                skipped.append({"row": i, "model": r["model"],
                                "reason": f"{r['metric']} only, and the source gives no "
                                          f"{'layout' if pd.isna(r['tp']) else 'global batch'} for this run"})
            continue
        fw = str(r["framework"])
        group = source_group(fw)
        model = _model_for(r)
        hw = HARDWARE.get(str(r["hardware"]))
        gpus = _num(r["num_gpus"])
        tp, pp = _num(r["tp"]), _num(r["pp"])
        notes = []
        zero_txt = str(r["zero_or_fsdp"]).lower()
        zero3 = "zero3" in zero_txt or "fsdp" in zero_txt
        if zero3 and tp is None:
            tp = pp = 1.0
        mp = re.search(r"model-parallel size \(TP\*PP\) = (\d+)", str(r["notes"]))
        if tp is None and mp:
            tp, pp = 8.0, int(mp[1]) / 8.0
            notes.append(f"TP 8, PP {int(pp)} assumed (MP {mp[1]})")
        if model is None or hw is None or gpus is None or tp is None or pp is None or _num(r["global_batch"]) is None:
            skipped.append({"row": i, "model": r["model"], "reason": "layout incomplete (TP/PP or batch not given)"})
            continue
        cp = int(_num(r["cp"], 1))
        dp = _num(r["dp"])
        if dp is None:
            dp = gpus / (tp * pp * cp)
            notes.append("dp derived")
        mb = _num(r["micro_batch"])
        if mb is None:
            mb = 1
            notes.append("micro-batch 1 assumed")
        vp = int(_num(r["vp"], 1))
        rc = str(r["recompute"])
        if rc.startswith("full"):
            recompute = "full"
        elif rc in ("selective", "none"):
            recompute = rc
        else:
            recompute = "auto"
            notes.append("recompute auto (not stated)")
        old = fw.startswith(("Megatron-LM", "DeepSpeed"))
        if group == "deepspeed":
            framework, zero = "deepspeed", 3
        elif group == "llm-foundry":
            framework, zero = "composer", 3
        elif group == "nemo":
            framework, zero = "nemo", 1
        elif fw.startswith("Megatron-Core"):
            framework, zero = "megatron", 1
        else:
            framework, zero = "megatron", 0
        tp_i = int(tp)
        sp = tp_i > 1 and (fw.startswith(("Megatron-Core", "NeMo")) or
                           (fw.startswith("Megatron-LM (2022)") and recompute == "selective"))
        dtype = "fp8" if "fp8" in str(r["precision"]) else "bf16"
        seq = int(r["seq_len"])
        tp_overlap = sp and fw.startswith(("Megatron-Core", "NeMo"))
        acc = model.num_layers % (int(pp) * vp) != 0 and (model.num_layers + 2) % (int(pp) * vp) == 0
        if acc:
            notes.append("embedding and loss counted as pipeline layers")
        lay = TrainLayout(tp=tp_i, pp=int(pp), dp=int(round(dp)), cp=cp, ep=1, vp=vp, sp=sp,
                          tp_overlap=tp_overlap, zero=zero, recompute=recompute, dtype=dtype, seq_len=seq,
                          micro_batch=int(mb), global_batch=int(r["global_batch"]),
                          account_for_embedding=acc, account_for_loss=acc, framework=framework,
                          attention="unfused" if old else None, dropout=old,
                          dp_overlap=False if fw.startswith("Megatron-LM") else None,
                          fsdp_param_bytes=_fsdp_param_bytes(str(r["notes"])) if group == "llm-foundry" else None)
        v = float(r["value"])
        metric = r["metric"]
        if metric == "step_time_s":
            pub = lay.global_batch * seq / (v * gpus)
        elif metric == "tokens_per_s_per_gpu":
            pub = v
        elif metric == "tflops_per_gpu":
            pub = v * 1e12 / megatron_core_flops_per_token(model, seq)
        else:
            pub = v * 1e12 / narayanan_flops_per_token(model, seq)
        label = (f"{r['model']} {int(gpus)}x{hw} tp{lay.tp} pp{lay.pp} dp{lay.dp} cp{cp} vp{vp} {recompute} "
                 f"{dtype} s{seq} mb{lay.micro_batch}")
        cases.append(Case(row=int(i), group=group, label=label, model=model, hardware=hw, layout=lay,
                          metric=metric, value=v, published_tokens_per_s_per_gpu=pub,
                          assumptions="; ".join(notes)))
    return cases, pd.DataFrame(skipped, columns=["row", "model", "reason"])


def _run_key(r) -> tuple:
    cols = ("source", "model", "hardware", "num_gpus", "tp", "pp", "cp", "precision", "recompute", "seq_len",
            "micro_batch", "global_batch")
    return tuple(None if pd.isna(r[c]) else r[c] for c in cols)


def predict(cases: list[Case], fit: TrainingFit = FITTED, check_memory: bool = True) -> pd.DataFrame:
    rows = []
    for c in cases:
        try:
            r = train_step(c.model, load_hardware(c.hardware), c.layout, fit=fit, check_memory=check_memory)
            pred, mfu, err = r.tokens_per_s_per_gpu, r.mfu, ""
            lay = r.layout
            rc = lay.recompute + (f" {lay.recompute_layers}/chunk" if lay.recompute_layers else "") + (
                f" ({','.join(lay.modules)})" if lay.modules else "")
            mem = r.memory_bytes["total"] / 2**30
        except ServesimError as e:
            pred, mfu, err, rc, mem = float("nan"), float("nan"), str(e), "", float("nan")
        rows.append({"row": c.row, "group": c.group, "hardware": c.hardware, "case": c.label, "metric": c.metric,
                     "value": c.value, "published_tokens_per_s_per_gpu": c.published_tokens_per_s_per_gpu,
                     "predicted_tokens_per_s_per_gpu": pred,
                     "rel_error": pred / c.published_tokens_per_s_per_gpu - 1.0, "predicted_mfu": mfu,
                     "recompute": rc, "memory_gib": mem, "framework": c.layout.framework,
                     "assumptions": c.assumptions, "error": err})
    return pd.DataFrame(rows)


OVERLAP_GRID = tuple(i / 10 for i in range(11))


def fit_parameters(cases: list[Case], groups=("megatron",), overlap_grid=OVERLAP_GRID) -> TrainingFit:
    """Least-squares fit on log throughput ratios of ``groups``: one ``compute_scale`` per GPU
    architecture among those rows (the one with the most rows is ``compute_scale`` itself) and
    ``overlap``. The step time is piecewise in ``overlap`` (max(0, comm - overlap x compute)), so it
    is profiled on a grid (the scales fitted by least squares at each value, the lowest cost kept)
    rather than followed by gradients, which stop at a kink."""
    return fit_profile(cases, groups, overlap_grid)[0]


def fit_profile(cases: list[Case], groups=("megatron",), overlap_grid=OVERLAP_GRID):
    """(best fit, [(overlap, fit, cost, median |error| of the fitted rows)] over the grid)."""
    from scipy.optimize import least_squares

    from servesim.training.framework import architecture_of
    sub = [c for c in cases if c.group in groups]
    priced = predict(sub)["predicted_tokens_per_s_per_gpu"].notna().to_numpy()
    sub = [c for c, ok in zip(sub, priced) if ok]  # refused rows (memory) do not depend on the fit
    arch_of = {c.hardware: architecture_of(load_hardware(c.hardware)).name for c in sub}
    counts = {}
    for c in sub:
        counts[arch_of[c.hardware]] = counts.get(arch_of[c.hardware], 0) + 1
    archs = sorted(counts, key=lambda a: (-counts[a], a))

    def make(x, ov):
        scales = tuple((a, float(x[i])) for i, a in enumerate(archs))
        return TrainingFit(compute_scale=float(x[0]), overlap=float(ov), arch_scale=scales if len(archs) > 1 else ())

    table = []
    for ov in overlap_grid:
        def resid(x):
            df = predict(sub, make(x, ov))
            return np.log(df["predicted_tokens_per_s_per_gpu"].to_numpy()
                          / df["published_tokens_per_s_per_gpu"].to_numpy())
        sol = least_squares(resid, x0=[1.0] * len(archs), bounds=([0.3] * len(archs), [1.3] * len(archs)),
                            diff_step=1e-3)
        table.append((ov, make(sol.x, ov), float(sol.cost), float(np.median(np.abs(np.expm1(sol.fun))))))
    best = min(table, key=lambda r: r[2])
    return best[1], table


def error_summary(df: pd.DataFrame) -> dict:
    e = df["rel_error"].abs().dropna()
    if e.empty:
        return {"n": 0, "median": float("nan"), "p90": float("nan")}
    return {"n": int(e.size), "median": float(e.median()), "p90": float(e.quantile(0.9))}


def fp8_gemm_ratio(path: Path | None = None, floor: int = 4096) -> dict:
    """The fp8 GEMM's fraction of the fp8 peak over the bf16 GEMM's fraction of the bf16 peak,
    median over the AIConfigurator H100 TensorRT-LLM GEMM shapes with m, n, k >= ``floor``
    (servesim/training/data/architectures.toml, hopper.fp8_gemm_ratio)."""
    path = path or (Path(__file__).resolve().parent / "data" / "aiconfigurator" / "h100_sxm" / "trtllm-1.2.0rc5"
                    / "gemm_perf.csv.gz")
    hw = load_hardware("h100-sxm")
    d = pd.read_csv(path)
    p = d.pivot_table(index=["m", "n", "k"], columns="gemm_dtype", values="latency").dropna().reset_index()
    p = p[(p["m"] >= floor) & (p["n"] >= floor) & (p["k"] >= floor)]
    flops = 2.0 * p["m"] * p["n"] * p["k"]
    bf = flops / (p["bfloat16"] * 1e-3) / hw.peak_flops["bf16"]
    f8 = flops / (p["fp8"] * 1e-3) / hw.peak_flops["fp8"]
    return {"n": int(len(p)), "bf16": float(bf.median()), "fp8": float(f8.median()),
            "ratio": float((f8 / bf).median())}
