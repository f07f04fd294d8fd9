"""Reproduce published training throughputs with servesim.training, and fit two parameters.

``data/training_published_calibration.csv`` (copied from servesim's calibration set; every value
from a public source named in its ``source`` column): Megatron-LM (Narayanan et al. 2021 Table 1
and the ZeRO-3 comparison; Korthikanti et al. 2022 step times), the Megatron-Core README H100
weak-scaling table, NVIDIA DGX Cloud (NeMo 2.0) Llama 3.1 step times, and MosaicML llm-foundry
(FSDP) throughputs.

Every reproducible run is compared on one quantity, **tokens/s per GPU**:

- ``step_time_s``: global_batch x seq_len / (step x GPUs);
- ``tokens_per_s_per_gpu``: as published;
- ``tflops_per_gpu`` (Megatron-Core README): divided by the FLOPs per token of Megatron-Core's own
  ``num_floating_point_operations`` (training.py), 12 L h^2 (1 + g/a + s/h + (ffn/h) x glu) + 6 h V;
- ``hw_tflops_per_gpu`` (Narayanan et al. 2021 eq. 3, which includes the recompute forward):
  divided by 96 l h^2 (1 + s/(6h) + V/(16 l h)) per token.
MFU rows duplicate these and are not used (sources define MFU differently).

Assumptions where the source is silent (each printed in the report): micro-batch 1; recompute
``selective`` (FlashAttention keeps no s^2 activations, which is what selective drops); virtual
stages 1; ZeRO: distributed optimiser (1) for Megatron-Core/NeMo, 0 for Megatron-LM 2021/2022,
3 for FSDP and DeepSpeed ZeRO-3; sequence parallelism on with TP for Megatron-Core/NeMo and for the
Korthikanti "selective" rows. Runs are priced with ``check_memory=False``: the published runs did fit
and the Korthikanti activation formula ignores FlashAttention for ``recompute = none``.
Rows without a complete layout (TP/PP split not given, GPT-3 177B on a GPU count only) are skipped.
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


def load_cases(path: Path = DATA) -> tuple[list[Case], pd.DataFrame]:
    """(reproducible cases, skipped rows with the reason)."""
    df = pd.read_csv(path)
    cases, skipped = [], []
    for i, r in df.iterrows():
        if r["metric"] not in METRICS:
            continue
        fw = str(r["framework"])
        group = source_group(fw)
        model = _model_for(r)
        hw = HARDWARE.get(str(r["hardware"]))
        gpus = _num(r["num_gpus"])
        tp, pp = _num(r["tp"]), _num(r["pp"])
        zero_txt = str(r["zero_or_fsdp"]).lower()
        zero3 = "zero3" in zero_txt or "fsdp" in zero_txt
        if zero3 and tp is None:
            tp = pp = 1.0
        if model is None or hw is None or gpus is None or tp is None or pp is None or _num(r["global_batch"]) is None:
            skipped.append({"row": i, "model": r["model"], "reason": "layout incomplete (TP/PP or batch not given)"})
            continue
        notes = []
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
            recompute = "selective"
            notes.append("recompute selective assumed")
        if zero3:
            zero = 3
        elif fw.startswith(("Megatron-Core", "NeMo")):
            zero = 1
        else:
            zero = 0
        tp_i = int(tp)
        sp = tp_i > 1 and (fw.startswith(("Megatron-Core", "NeMo")) or
                           (fw.startswith("Megatron-LM (2022)") and recompute == "selective"))
        dtype = "fp8" if "fp8" in str(r["precision"]) else "bf16"
        seq = int(r["seq_len"])
        tp_overlap = sp and fw.startswith("Megatron-Core")  # README: --tp-comm-overlap
        lay = TrainLayout(tp=tp_i, pp=int(pp), dp=int(round(dp)), cp=cp, ep=1, vp=vp, sp=sp,
                          tp_overlap=tp_overlap, zero=zero,
                          recompute=recompute, dtype=dtype, seq_len=seq, micro_batch=int(mb),
                          global_batch=int(r["global_batch"]))
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
        label = f"{r['model']} {int(gpus)}x{hw} tp{lay.tp} pp{lay.pp} dp{lay.dp} cp{cp} vp{vp} {recompute} {dtype} s{seq} mb{lay.micro_batch}"
        cases.append(Case(row=int(i), group=group, label=label, model=model, hardware=hw, layout=lay,
                          metric=metric, value=v, published_tokens_per_s_per_gpu=pub,
                          assumptions="; ".join(notes)))
    return cases, pd.DataFrame(skipped)


def predict(cases: list[Case], fit: TrainingFit = FITTED) -> pd.DataFrame:
    rows = []
    for c in cases:
        try:
            r = train_step(c.model, load_hardware(c.hardware), c.layout, fit=fit, check_memory=False)
            pred = r.tokens_per_s_per_gpu
            mfu = r.mfu
            err = ""
        except ServesimError as e:
            pred, mfu, err = float("nan"), float("nan"), str(e)
        rows.append({"row": c.row, "group": c.group, "case": c.label, "metric": c.metric, "value": c.value,
                     "published_tokens_per_s_per_gpu": c.published_tokens_per_s_per_gpu,
                     "predicted_tokens_per_s_per_gpu": pred,
                     "rel_error": pred / c.published_tokens_per_s_per_gpu - 1.0, "predicted_mfu": mfu,
                     "assumptions": c.assumptions, "error": err})
    return pd.DataFrame(rows)


def fit_parameters(cases: list[Case], groups=("megatron",)) -> TrainingFit:
    """Least-squares fit of (compute_scale, overlap) on log throughput ratios of ``groups``."""
    from scipy.optimize import least_squares
    sub = [c for c in cases if c.group in groups]

    def resid(x):
        f = TrainingFit(compute_scale=float(x[0]), overlap=float(x[1]))
        df = predict(sub, f)
        return np.log(df["predicted_tokens_per_s_per_gpu"].to_numpy() / df["published_tokens_per_s_per_gpu"].to_numpy())

    sol = least_squares(resid, x0=[1.0, 1.0], bounds=([0.3, 0.0], [1.3, 1.0]), diff_step=1e-3)
    return TrainingFit(compute_scale=float(sol.x[0]), overlap=float(sol.x[1]))


def error_summary(df: pd.DataFrame) -> dict:
    e = df["rel_error"].abs().dropna()
    if e.empty:
        return {"n": 0, "median": float("nan"), "p90": float("nan")}
    return {"n": int(e.size), "median": float(e.median()), "p90": float(e.quantile(0.9))}
