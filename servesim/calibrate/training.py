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


OVERLAP_GRID = tuple(i / 10 for i in range(5, 11))
GROUPS = ("megatron", "nemo", "llm-foundry", "deepspeed")
# frameworks whose attention kernel has no measurement and gets a fitted factor (params.TrainingFit.attn_scale)
ATTN_FITTED = ("composer",)


def prepare(cases: list[Case]) -> list[tuple[Case, TrainLayout]]:
    """The cases that price, each with the layout ``--recompute auto`` resolved to (memory does not
    depend on the fitted parameters, so fits reprice only the step)."""
    out = []
    for c in cases:
        try:
            r = train_step(c.model, load_hardware(c.hardware), c.layout, fit=FITTED)
        except ServesimError:
            continue
        out.append((c, r.layout))
    return out


def throughputs(prepared, fit: TrainingFit) -> np.ndarray:
    """Predicted tokens/s per GPU of prepared cases under ``fit``."""
    return np.array([train_step(c.model, load_hardware(c.hardware), lay, fit=fit, check_memory=False)
                     .tokens_per_s_per_gpu for c, lay in prepared])


def _architectures(prepared) -> list[str]:
    from servesim.training.framework import architecture_of
    counts: dict[str, int] = {}
    for c, _ in prepared:
        a = architecture_of(load_hardware(c.hardware)).name
        counts[a] = counts.get(a, 0) + 1
    return sorted(counts, key=lambda a: (-counts[a], a))


def fit_parameters(cases: list[Case], groups=GROUPS, overlap: float | None = None,
                   overlap_grid=OVERLAP_GRID, prepared=None) -> tuple[TrainingFit, list]:
    """Fit on the rows of ``groups``: one ``compute_scale`` per GPU architecture among them (the
    most frequent is ``compute_scale`` itself, which an architecture without rows takes) and an
    attention factor for each ``ATTN_FITTED`` framework among them, by least squares on
    log(predicted / published) with a soft-L1 loss (10% scale) so that a few far rows do not set the
    figures. ``overlap`` fixed, or profiled over ``overlap_grid`` (the step is piecewise in it).
    Returns (best fit, [(overlap, fit, cost, median |error|)])."""
    from scipy.optimize import least_squares
    if prepared is None:
        prepared = prepare([c for c in cases if c.group in groups])
    archs = _architectures(prepared)
    fws = [f for f in ATTN_FITTED if any(lay.framework == f for _, lay in prepared)]
    published = np.array([c.published_tokens_per_s_per_gpu for c, _ in prepared])

    def make(x, ov):
        scales = tuple((a, float(x[i])) for i, a in enumerate(archs))
        attn = tuple((f, float(x[len(archs) + i])) for i, f in enumerate(fws))
        return TrainingFit(compute_scale=float(x[0]), overlap=float(ov),
                           arch_scale=scales if len(archs) > 1 else (), attn_scale=attn)

    x0 = [FITTED.scale_for(a) for a in archs] + [FITTED.attn_for(f) for f in fws]
    lo = [0.3] * len(archs) + [0.2] * len(fws)
    hi = [1.3] * len(archs) + [1.5] * len(fws)
    x0 = [min(max(v, a + 1e-3), b - 1e-3) for v, a, b in zip(x0, lo, hi)]
    table = []
    for ov in ((overlap,) if overlap is not None else overlap_grid):
        def resid(x):
            return np.log(throughputs(prepared, make(x, ov)) / published)
        sol = least_squares(resid, x0=x0, bounds=(lo, hi), diff_step=1e-3, loss="soft_l1", f_scale=0.1)
        table.append((ov, make(sol.x, ov), float(sol.cost), float(np.median(np.abs(np.expm1(sol.fun))))))
    best = min(table, key=lambda r: r[2])
    return best[1], table


def fit_profile(cases: list[Case], groups=GROUPS, overlap_grid=OVERLAP_GRID):
    """(best fit, the overlap profile) -- ``fit_parameters`` over the grid."""
    return fit_parameters(cases, groups, overlap_grid=overlap_grid)


def describe_fit(f: TrainingFit) -> str:
    scales = ", ".join(f"{a} {v:.3f}" for a, v in f.arch_scale) or f"all {f.compute_scale:.3f}"
    attn = ", ".join(f"{n} attention x{v:.3f}" for n, v in f.attn_scale)
    return f"compute scale {scales}; overlap {f.overlap:.1f}" + (f"; {attn}" if attn else "")


def generation_of(case: Case) -> str:
    from servesim.training.framework import architecture_of
    return architecture_of(load_hardware(case.hardware)).name


def held_out(cases: list[Case], fit: TrainingFit = FITTED) -> pd.DataFrame:
    """Leave one framework out and leave one GPU generation out: each fold refits the compute
    scales and the attention factors (``overlap`` stays ``fit``'s) on the other rows and predicts
    the rows left out; a generation left out takes the compute scale of the rows that remain, as an
    architecture without training rows does (Blackwell), and a framework left out its kernel's
    measured curve without a factor. Columns: split, fold, row, group, hardware, rel_error, fold_fit."""
    prepared = prepare(cases)
    rows = []
    folds = [("framework", g, lambda c, g=g: c.group == g) for g in GROUPS]
    gens = sorted({generation_of(c) for c, _ in prepared})
    folds += [("generation", a, lambda c, a=a: generation_of(c) == a) for a in gens]
    for split, name, out in folds:
        train = [(c, lay) for c, lay in prepared if not out(c)]
        test = [(c, lay) for c, lay in prepared if out(c)]
        if not test or not train:
            continue
        f, _ = fit_parameters(cases, overlap=fit.overlap, prepared=train)
        pred = throughputs(test, f)
        for (c, _), y in zip(test, pred):
            rows.append({"split": split, "fold": name, "row": c.row, "group": c.group, "hardware": c.hardware,
                         "rel_error": y / c.published_tokens_per_s_per_gpu - 1.0,
                         "fold_fit": describe_fit(f)})
    return pd.DataFrame(rows)


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
