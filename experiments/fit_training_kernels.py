"""Training-kernel figures per GPU architecture from measured kernels (servesim/training/data/architectures.toml).

Reads only the AIConfigurator copies under servesim/calibrate/data/aiconfigurator (NVIDIA, Apache-2.0;
kernel latencies measured on real GPUs, CUDA-graph timed):

- Attention (``attn_max``, ``attn_half_seq``): the forward causal prefill attention of the serving
  engines' FlashAttention-class kernels (head dim 128, bf16 queries and KV), achieved fraction of
  the bf16 dense peak fitted as e(s) = attn_max s / (s + attn_half_seq) (soft-L1 least squares on
  log e) over the shapes with s >= 2048 and at least ``MIN_TILES`` (batch x heads x s / 128)
  query tiles, as a training micro-batch has. Hopper: H100 vLLM 0.14 and SGLang 0.5.9
  (FlashAttention-3); Ampere: A100 vLLM 0.14 and SGLang 0.5.9 (FlashAttention-2); Blackwell: B200
  vLLM 0.19 (its Blackwell prefill kernel; no cuDNN table is available). Held out: the fit on one
  engine's table predicts the other's (Hopper and Ampere), and the s >= 8192 rows from the fit on
  s < 8192 (every architecture).
- Blackwell GEMM (``gemm_vs_source``: relative to Hopper, where the B200 profile borrows from): the median, over the GEMM shapes with m, n, k >= 4096 that
  both the B200 (vLLM 0.19) and the H100 (vLLM 0.14) bf16 tables hold, of the B200 fraction of its
  bf16 peak over the H100 fraction of its own; the training model multiplies the Hopper training
  GEMM efficiency (fitted on H100 training runs) by it.
- Blackwell fp8 (``fp8_gemm_ratio``): Hopper's fp8/bf16 ratio (0.749, TensorRT-LLM cuBLASLt) times
  the B200 over H100 ratio of the per-tensor fp8/bf16 fraction ratios in the vLLM tables (the same
  engine on both chips, so its activation-quantisation overhead cancels to first order).
- Blackwell NVLink collectives (``scaleup_bw_vs_source``): NCCL 2.27.3 all-reduce bus bandwidth
  over 8 GPUs at messages >= 64 MB, as a fraction of the per-direction NVLink bandwidth, B200 over
  H100.

    python experiments/fit_training_kernels.py     # prints the figures and the held-out errors

Writes experiments/results/training_kernels.md. The figures are copied into architectures.toml by
hand (with the date); a test checks that the shipped values equal this script's.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from servesim.config import load_hardware  # noqa: E402

AIC = ROOT / "servesim" / "calibrate" / "data" / "aiconfigurator"
MIN_TILES = 512
ATTENTION = {  # architecture -> (hardware profile, [(gpu folder, engine folder)])
    "hopper": ("h100-sxm", [("h100_sxm", "vllm-0.14.0"), ("h100_sxm", "sglang-0.5.9")]),
    "ampere": ("a100-sxm-80gb", [("a100_sxm", "vllm-0.14.0"), ("a100_sxm", "sglang-0.5.9")]),
    "blackwell": ("b200", [("b200_sxm", "vllm-0.19.0")]),
}
HOPPER_FP8_RATIO = 0.749  # architectures.toml [hopper] fp8_gemm_ratio (experiments/validate_training.py --fp8-ratio)


def attention_rows(hw_name: str, gpu: str, engine: str) -> pd.DataFrame:
    peak = load_hardware(hw_name).peak_flops["bf16"]
    d = pd.read_csv(AIC / gpu / engine / "context_attention_perf.csv.gz")
    d = d[d["kv_cache_dtype"] == "bfloat16"]
    d = d.groupby(["batch_size", "isl", "num_heads", "num_key_value_heads"], as_index=False)["latency"].median()
    d = d[(d["isl"] >= 2048) & (d["batch_size"] * d["num_heads"] * d["isl"] / 128 >= MIN_TILES)]
    flops = d["batch_size"] * d["num_heads"] * d["isl"].astype(float) ** 2 * 128 * 4 / 2   # causal QK^T + AV
    return d.assign(eff=flops / (d["latency"] * 1e-3) / peak, engine=engine)


def fit_curve(s: np.ndarray, eff: np.ndarray) -> tuple[float, float]:
    from scipy.optimize import least_squares
    sol = least_squares(lambda p: np.log(p[0] * s / (s + p[1])) - np.log(eff), [0.6, 1000.0],
                        bounds=([0.01, 1.0], [1.0, 1e5]), loss="soft_l1")
    return float(sol.x[0]), float(sol.x[1])


def curve_error(p, s, eff) -> float:
    return float(np.median(np.abs(p[0] * s / (s + p[1]) / eff - 1.0)))


def attention_figures() -> tuple[dict, list[str]]:
    out, lines = {}, []
    for arch, (hw, tables) in ATTENTION.items():
        parts = [attention_rows(hw, g, e) for g, e in tables]
        d = pd.concat(parts, ignore_index=True)
        s, eff = d["isl"].to_numpy(float), d["eff"].to_numpy(float)
        p = fit_curve(s, eff)
        out[arch] = p
        short = d["isl"] < 8192
        p_short = fit_curve(s[short], eff[short])
        lines.append(f"| {arch} | {', '.join(f'{g} {e}' for g, e in tables)} | {len(d)} | {p[0]:.3f} | {p[1]:.0f} | "
                     f"{curve_error(p, s, eff) * 100:.1f}% | {curve_error(p_short, s[~short], eff[~short]) * 100:.1f}% | "
                     + (f"{curve_error(fit_curve(parts[0]['isl'].to_numpy(float), parts[0]['eff'].to_numpy(float)), parts[1]['isl'].to_numpy(float), parts[1]['eff'].to_numpy(float)) * 100:.1f}%"
                        if len(parts) > 1 else "-") + " |")
    return out, lines


def gemm_fraction(gpu: str, engine: str, dtype: str, peak: float) -> pd.Series:
    d = pd.read_csv(AIC / gpu / engine / "gemm_perf.csv.gz")
    q = d[d["gemm_dtype"] == dtype].groupby(["m", "n", "k"])["latency"].median()
    idx = q.index.to_frame()
    return 2.0 * idx["m"] * idx["n"] * idx["k"] / (q * 1e-3) / peak


def blackwell_gemm() -> dict:
    h100, b200 = load_hardware("h100-sxm"), load_hardware("b200")
    hb = gemm_fraction("h100_sxm", "vllm-0.14.0", "bfloat16", h100.peak_flops["bf16"])
    h8 = gemm_fraction("h100_sxm", "vllm-0.14.0", "fp8", h100.peak_flops["fp8"])
    bb = gemm_fraction("b200_sxm", "vllm-0.19.0", "bfloat16", b200.peak_flops["bf16"])
    b8 = gemm_fraction("b200_sxm", "vllm-0.19.0", "fp8", b200.peak_flops["fp8"])
    j = pd.concat({"hb": hb, "h8": h8, "bb": bb, "b8": b8}, axis=1).dropna()
    m, n, k = (j.index.get_level_values(i) for i in range(3))
    big = j[(m >= 4096) & (n >= 4096) & (k >= 4096)]
    ratio = float((big["bb"] / big["hb"]).median())
    fp8_transfer = float((big["b8"] / big["bb"]).median() / (big["h8"] / big["hb"]).median())
    return {"n": int(len(big)), "h100_bf16": float(big["hb"].median()), "b200_bf16": float(big["bb"].median()),
            "gemm_vs_hopper": ratio, "fp8_transfer": fp8_transfer,
            "fp8_gemm_ratio": HOPPER_FP8_RATIO * fp8_transfer}


def nccl_fraction(gpu: str, folder: str, hw_name: str) -> float:
    hw = load_hardware(hw_name)
    d = pd.read_csv(AIC / gpu / folder / "nccl_perf.csv.gz")
    d = d[(d["num_gpus"] == 8) & (d["message_size"] * 2 >= 64e6)]
    n = d["num_gpus"]
    bus = 2 * (n - 1) / n * d["message_size"] * 2 / (d["latency"] * 1e-3)
    return float((bus / (hw.scaleup_bw)).median())


def figures() -> tuple[dict, dict]:
    """({architecture.key: value as architectures.toml holds it}, the details for the report)."""
    att, att_lines = attention_figures()
    g = blackwell_gemm()
    h_nccl = nccl_fraction("h100_sxm", "nccl-2.27.3", "h100-sxm")
    b_nccl = nccl_fraction("b200_sxm", "nccl-2.27.3", "b200")
    out = {f"{a}.attn_max": round(p[0], 3) for a, p in att.items()}
    out.update({f"{a}.attn_half_seq": round(p[1]) for a, p in att.items()})
    out["blackwell.gemm_vs_source"] = round(g["gemm_vs_hopper"], 3)
    out["blackwell.fp8_gemm_ratio"] = round(g["fp8_gemm_ratio"], 3)
    out["blackwell.scaleup_bw_vs_source"] = round(b_nccl / h_nccl, 3)
    return out, {"att": att, "att_lines": att_lines, "gemm": g, "h_nccl": h_nccl, "b_nccl": b_nccl}


def main() -> int:
    values, d = figures()
    att, att_lines, g, h_nccl, b_nccl = d["att"], d["att_lines"], d["gemm"], d["h_nccl"], d["b_nccl"]
    for k, v in values.items():
        print(f"{k} = {v}")
    text = f"""# Training-kernel figures per architecture

Generated by `python experiments/fit_training_kernels.py` from the AIConfigurator kernel tables
shipped in `servesim/calibrate/data/aiconfigurator` (NVIDIA, Apache-2.0; measured on real GPUs).
The values are those of `servesim/training/data/architectures.toml`.

## Attention: e(s) = attn_max s / (s + attn_half_seq), forward, causal, bf16, head dim 128

Shapes with s >= 2048 and at least {MIN_TILES} query tiles. Errors are the median absolute relative
error of the curve: on the rows it was fitted on; on the s >= 8192 rows from a fit on s < 8192
(extrapolation in length); on the second engine's table from a fit on the first (another
implementation of the same kernel family).

| architecture | tables | rows | attn_max | attn_half_seq | fit error | s >= 8192 from s < 8192 | other engine |
|---|---|---:|---:|---:|---:|---:|---:|
{chr(10).join(att_lines)}

At 131072 tokens the curves give {', '.join(f'{a} {p[0] * 131072 / (131072 + p[1]):.3f}' for a, p in att.items())} of the bf16 peak (forward).
No backward-pass attention table exists here: the backward runs at the forward's efficiency on its
2.5x FLOPs (FlashAttention-2's 5 matmuls to 2), an assumption.

## Blackwell GEMMs and collectives (relative to Hopper)

- bf16 GEMM, {g['n']} shapes with m, n, k >= 4096 in both tables: H100 {g['h100_bf16']:.3f} of its
  peak, B200 {g['b200_bf16']:.3f} of its own; median ratio **{g['gemm_vs_hopper']:.3f}** (gemm_vs_source).
- fp8 per-tensor over bf16, B200 relative to H100 in the same engine: {g['fp8_transfer']:.3f}; times
  Hopper's {HOPPER_FP8_RATIO} = **{g['fp8_gemm_ratio']:.3f}** (fp8_gemm_ratio).
- NCCL all-reduce over 8 GPUs, messages >= 64 MB: bus bandwidth / per-direction NVLink bandwidth
  H100 {h_nccl:.3f}, B200 {b_nccl:.3f}; ratio **{b_nccl / h_nccl:.3f}** (scaleup_bw_vs_source).
"""
    out = ROOT / "experiments" / "results" / "training_kernels.md"
    out.write_text(text)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
