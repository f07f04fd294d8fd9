"""Fit the cost model's GEMM, elementwise and scale-up link efficiencies to Vidur per-operator timings.

    python experiments/fit_costmodel.py                 # fit, validate, write report + profiles
    python experiments/fit_costmodel.py --no-write      # fit and print only
    python experiments/fit_costmodel.py --refresh-data /work/shared/calibration/vidur
                                                        # re-copy (and trim) the shipped data first

Per GPU (a100-sxm-80gb, h100-sxm): GEMM parameters (gemm_max, gemm_half_tokens, kernel_latency_us,
hbm_fraction) and the elementwise ones (norm / rope / activation HBM fractions, elementwise_latency_us)
are fitted on the Llama family (meta-llama/*) and validated on the held-out models; the scale-up link
(all-reduce: scaleup_bw_fraction, scaleup_latency_us, collective_base_latency_us; send-recv:
p2p_bw_fraction, p2p_latency_us, p2p_large_bw_fraction above p2p_large_message_mib) on the intra-node
rows of the *_dgx files, validated on a DGX group size left out of a refit and on the *_pairwise_nvlink
machines (a different topology, nothing fitted there). Writes experiments/results/costmodel_validation.md and the fitted values into the profiles'
[efficiency].
"""
from __future__ import annotations

import argparse
import dataclasses
import shutil
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from servesim.calibrate.operators import (COLLECTIVE_PARAMS, ELEMENTWISE_OPS, ELEMENTWISE_PARAMS,  # noqa: E402
                                          GEMM_OPS, GEMM_PARAMS, OPTIONAL_OPS, P2P_PARAMS, SHAPE_COLUMNS,
                                          VIDUR_NETWORK_BYTES_PER_SIZE, elementwise_frame, error_summary,
                                          fit_collectives, fit_elementwise, fit_gemm, layer_sums,
                                          predict_collectives, predict_elementwise, predict_gemm,
                                          profile_params, read_vidur_mlp, read_vidur_network)
from servesim.calibrate import vidur_dir  # noqa: E402
from servesim.config import load_hardware  # noqa: E402
from servesim.calibrate.profile_io import DECIMALS, update_profile  # noqa: E402

GPUS = {"a100-sxm-80gb": "a100", "h100-sxm": "h100"}
FIT_ORG = "meta-llama"
NOISE_FLOOR_S = 5e-6
FIT_SOURCE = ("experiments/fit_costmodel.py on Vidur per-operator timings (MIT): GEMM and elementwise fit on "
              "Llama family, held out others; links on the DGX node; see experiments/results/costmodel_validation.md")
REPORT = REPO / "experiments" / "results" / "costmodel_validation.md"
# NVLink bridge of the pairwise machines' cards, total bidirectional GB/s: A100 PCIe 80GB "NVLink Bridge
# for 2 GPUs: 600 GB/s" (A100 PCIe product brief PB-10137); H100 NVL "NVLink: 600GB/s" (H100 datasheet).
BRIDGE_GBPS = {"a100": 600.0, "h100": 600.0}


def bridge_bw(gpu: str) -> float:
    """One direction of the pairwise machines' NVLink bridge, bytes/s."""
    return BRIDGE_GBPS[gpu] * 1e9 / 2
CLASS_ORDER = ["gemm_qkv", "gemm_attn_out", "gemm_mlp_up", "gemm_mlp_down", "elementwise", "all_reduce",
               "send_recv"]

# -- data copy ----------------------------------------------------------------------------------

def refresh_data(src: Path) -> None:
    """Copy the a100/h100 Vidur files into the package; mlp.csv keeps only medians + shape columns."""
    dst = vidur_dir()
    keep_ops = list(GEMM_OPS) + list(ELEMENTWISE_OPS) + list(OPTIONAL_OPS)
    for gpu in GPUS.values():
        for f in sorted((src / "profiling" / "compute" / gpu).glob("*/*/mlp.csv")):
            raw = pd.read_csv(f)
            cols = [f"time_stats.{op}.median" for op in keep_ops if f"time_stats.{op}.median" in raw] + \
                list(SHAPE_COLUMNS)
            out = dst / f.relative_to(src)
            out.parent.mkdir(parents=True, exist_ok=True)
            raw[cols].to_csv(out, index=False)  # shortest round-trip repr: values unchanged
        for sysdir in sorted((src / "profiling" / "network").glob(f"{gpu}_*")):
            for f in sorted(sysdir.glob("*.csv")):
                out = dst / f.relative_to(src)
                out.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(f, out)
    shutil.copyfile(src / "LICENSE", dst / "LICENSE")


# -- loading ------------------------------------------------------------------------------------

def load_compute(gpu: str) -> pd.DataFrame:
    files = sorted((vidur_dir() / "profiling" / "compute" / gpu).glob("*/*/mlp.csv"))
    return pd.concat([read_vidur_mlp(f) for f in files], ignore_index=True)


def gemm_rows(mlp: pd.DataFrame) -> pd.DataFrame:
    g = mlp[mlp["op_class"].str.startswith("gemm_") & (mlp["num_tokens"] >= 1)].copy()
    g["split"] = np.where(g["model"].str.startswith(FIT_ORG + "/"), "fitted", "held-out")
    return g


def load_network_frames(gpu: str, bytes_per_size: float = VIDUR_NETWORK_BYTES_PER_SIZE) -> pd.DataFrame:
    files = sorted((vidur_dir() / "profiling" / "network").glob(f"{gpu}_*/*.csv"))
    return pd.concat([read_vidur_network(f, bytes_per_size=bytes_per_size) for f in files], ignore_index=True)


def large_message_rate(rows: pd.DataFrame) -> float:
    """Bytes/s of the slope of time vs bytes over messages >= 4 MB (a linear fit, as nccl-tests' busbw)."""
    big = rows[rows["nbytes"] >= 4e6]
    return 1.0 / np.polyfit(big["nbytes"], big["time_s"], 1)[0]


def network_split(net: pd.DataFrame, gpu: str) -> pd.Series:
    """Intra-node rows of the DGX (NVSwitch) node are fitted (all-reduce and send-recv, separate
    parameters); the pairwise-NVLink machine is held out whole, except a send-recv file whose
    large-message rate is above one direction of the bridge (not a measurement of that link)."""
    split = np.where(net["system"] == f"{gpu}_dgx", "fitted", "held-out")
    pw = net["system"] == f"{gpu}_pairwise_nvlink"
    ar = net["collective"] == "all_reduce"
    split = np.where(pw & ar & (net["num_workers"] > 2), "held-out: pairwise, 4 GPUs over PCIe", split)
    split = np.where(pw & ar & (net["num_workers"] <= 2), "held-out: pairwise, 2 GPUs over the bridge", split)
    split = np.where(pw & ~ar, "held-out: pairwise send-recv", split)
    pw_sr = pw & ~ar
    if pw_sr.any() and large_message_rate(net[pw_sr]) > bridge_bw(gpu):
        split = np.where(pw_sr, "excluded", split)
    return pd.Series(split, index=net.index)


def size_octave_cv(rows: pd.DataFrame, hw, params: dict) -> pd.DataFrame:
    """Out-of-fold predictions for ``rows`` (one collective): 2 folds by message-size octave (even /
    odd floor(log2 bytes)), each fitted on the other fold's sizes."""
    fold = np.floor(np.log2(rows["nbytes"].to_numpy())).astype(int) % 2
    out = rows.copy()
    out["pred_s"] = np.nan
    for k in (0, 1):
        fitted, _ = _fit_quietly(fit_collectives, rows[fold != k], hw)
        out.loc[fold == k, "pred_s"] = predict_collectives(rows[fold == k], hw, {**params, **_rounded(fitted)})
    return out


def pairwise_variant(hw, gpu: str):
    """The profile as a pairwise-NVLink server (Vidur's *_pairwise_nvlink machines: 2-card NVLink-bridge
    pairs in a 4-GPU node, the PCIe A100 80GB / H100 NVL parts as on Azure NC A100 v4 / NC H100 v5):
    a scale-up domain of 2 at the bridge's rate (``BRIDGE_GBPS``; for A100 the same 300 GB/s per
    direction as SXM, for H100 300 instead of 450), 4 GPUs per node, the chip's PCIe generation. Its
    efficiencies stay the DGX-fitted ones; groups of 4 leave the pair and run at the profile's PCIe
    figures."""
    return dataclasses.replace(hw, name=f"{hw.name} (pairwise-NVLink topology)", scaleup_domain=2,
                               gpus_per_node=4, scaleup_bw=bridge_bw(gpu))


def _fit_quietly(fn, *args):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fn(*args)
    return out, [str(w.message) for w in caught]


def _rounded(values: dict) -> dict:
    return {k: round(v, DECIMALS[k]) for k, v in values.items()}


def fit_collectives_on(gpu: str, hw, bytes_per_size: float):
    net = load_network_frames(gpu, bytes_per_size)
    intra = net[net["intra_node"]].copy()
    intra["split"] = network_split(intra, gpu).to_numpy()
    intra = intra[intra["split"] != "excluded"]
    params, msgs = _fit_quietly(fit_collectives, intra[intra["split"] == "fitted"], hw)
    return net, intra, _rounded(params), msgs


def predict_network(intra: pd.DataFrame, gpu: str, hw, params: dict) -> np.ndarray:
    """Each row on its own machine: the DGX rows on the profile, the pairwise rows on its pairwise variant."""
    pw = (intra["system"] == f"{gpu}_pairwise_nvlink").to_numpy()
    pred = predict_collectives(intra, hw, params)
    if pw.any():
        pred[pw] = predict_collectives(intra[pw], pairwise_variant(hw, gpu), params)
    return pred


def run_gpu(profile_name: str, gpu: str) -> dict:
    hw = load_hardware(profile_name)
    before = profile_params(hw)
    mlp = load_compute(gpu)
    gemm = gemm_rows(mlp)
    gemm_params, msgs = _fit_quietly(fit_gemm, gemm[gemm["split"] == "fitted"], hw)
    gemm_params = _rounded(gemm_params)
    net, intra, coll_params, cmsgs = fit_collectives_on(gpu, hw, VIDUR_NETWORK_BYTES_PER_SIZE)
    kernels = elementwise_frame(mlp)
    kernels["split"] = np.where(kernels["model"].str.startswith(FIT_ORG + "/"), "fitted", "held-out")
    elem_params, emsgs = _fit_quietly(fit_elementwise, kernels[kernels["split"] == "fitted"], hw, gemm_params)
    msgs += emsgs
    params = {**gemm_params, **coll_params, **_rounded(elem_params)}

    gemm["pred_s"] = predict_gemm(gemm, hw, params)
    kernels["pred_s"] = predict_elementwise(kernels, hw, params)
    elem = layer_sums(kernels)  # one row per layer: the class the cost model prices
    elem["split"] = np.where(elem["model"].str.startswith(FIT_ORG + "/"), "fitted", "held-out")
    intra["pred_s"] = predict_network(intra, gpu, hw, params)

    # Sensitivity: the README's reading of `size` (fp16 elements, 2 bytes each).
    _, intra2, coll2, cmsgs2 = fit_collectives_on(gpu, hw, 2.0)
    intra2["pred_s"] = predict_network(intra2, gpu, hw, {**params, **coll2})

    # Same node, unseen group size: refit on the 2- and 8-GPU DGX all-reduces, predict the 4-GPU ones.
    dgx = intra[(intra["system"] == f"{gpu}_dgx") & (intra["collective"] == "all_reduce")]
    p4, _ = _fit_quietly(fit_collectives, dgx[dgx["num_workers"] != 4], hw)
    held4 = dgx[dgx["num_workers"] == 4].copy()
    held4["pred_s"] = predict_collectives(held4, hw, {**params, **_rounded(p4)})
    held4["split"] = "held-out: DGX, 4 GPUs (refit on 2, 8)"

    # send-recv at message sizes not fitted: 2-fold CV by size octave on the DGX rows.
    sr = intra[(intra["system"] == f"{gpu}_dgx") & (intra["collective"] == "send_recv")]
    sr_cv = size_octave_cv(sr, hw, params)
    sr_cv["split"] = "held-out: DGX, 2-fold by size octave"
    # The same without the size step (one send rate), for the report.
    one_rate = dataclasses.replace(hw, efficiency=dataclasses.replace(hw.efficiency, p2p_large_message_bytes=np.inf))
    sr_one = size_octave_cv(sr, one_rate, params)

    cols = ["op_class", "split", "time_s", "pred_s"]
    parts = [gemm[cols], elem[cols], intra[cols], held4[cols], sr_cv[cols]]
    held_net = pd.concat([intra[intra["split"] != "fitted"], held4, sr_cv], ignore_index=True)[cols]
    parts.append(held_net.assign(split="held-out"))  # pooled per class: the figure the target applies to
    allrows = pd.concat(parts, ignore_index=True)
    allrows.insert(0, "gpu", profile_name)
    summary = error_summary(allrows, ["gpu", "op_class", "split"])
    summary["order"] = (summary["op_class"].map(CLASS_ORDER.index) * 10
                        + summary["split"].map(lambda v: 0 if v == "fitted" else 1 if v == "held-out" else 2))
    summary = summary.sort_values(["order", "split"]).drop(columns="order")

    gemm["m_bin"] = pd.cut(gemm["m"], [0, 8, 32, 128, 512, 2048, np.inf],
                           labels=["1-8", "9-32", "33-128", "129-512", "513-2048", ">2048"])
    return {
        "profile": profile_name, "gpu": gpu, "hw": hw, "before": before, "params": params,
        "warnings": msgs + cmsgs, "summary": summary, "gemm": gemm, "elem": elem, "kernels": kernels,
        "intra": intra, "net_all": net, "intra_elements": intra2, "coll_elements": coll2,
        "warnings_elements": cmsgs2, "mlp": mlp,
        "send_recv_one_rate_err": float(np.median(np.abs(sr_one["pred_s"] / sr_one["time_s"] - 1.0))),
        "send_recv_err": float(np.median(np.abs(sr_cv["pred_s"] / sr_cv["time_s"] - 1.0))),
    }


# -- shape checks -------------------------------------------------------------------------------

def tp_scaling(mlp: pd.DataFrame) -> pd.DataFrame:
    """Median over (model, num_tokens >= 1024) of time(TP=1) / time(TP=t), per op."""
    big = mlp[mlp["num_tokens"] >= 1024]
    piv = big.pivot_table(index=["model", "op", "num_tokens"], columns="tp", values="time_s", aggfunc="median")
    out = {}
    for tp in (2, 4, 8):
        if tp in piv.columns and 1 in piv.columns:
            out[f"TP1/TP{tp}"] = (piv[1] / piv[tp]).groupby(level="op").median()
    return pd.DataFrame(out)


def gqa_check(mlp: pd.DataFrame) -> pd.DataFrame:
    """Measured time(QKV)/time(attn-out) and time(MLP-up)/time(MLP-down) at TP=1, M >= 2048, vs the
    FLOP ratios implied by the shape interpretation ((heads + 2 kv_heads)/heads, gated ? 2 : 1)."""
    big = mlp[(mlp["num_tokens"] >= 2048) & (mlp["tp"] == 1)]
    piv = big.pivot_table(index=["model", "num_tokens"], columns="op", values="time_s", aggfunc="median")
    shape = big.drop_duplicates("model").set_index("model")
    rows = []
    for model, grp in piv.groupby(level="model"):
        s = shape.loc[model]
        rows.append({
            "model": model, "heads/kv": f"{s.n_head}/{s.n_kv_head}",
            "qkv/out expected": (s.n_head + 2 * s.n_kv_head) / s.n_head,
            "qkv/out measured": float((grp["attn_pre_proj"] / grp["attn_post_proj"]).median()),
            "gated": bool(s.use_gated_mlp),
            "up/down expected": 2.0 if s.use_gated_mlp else 1.0,
            "up/down measured": float((grp["mlp_up_proj"] / grp["mlp_down_proj"]).median()),
        })
    return pd.DataFrame(rows)


def elementwise_bandwidth(mlp: pd.DataFrame, hw) -> pd.DataFrame:
    """Achieved fraction of HBM bandwidth per elementwise op at num_tokens >= 2048, from the bytes a
    fused kernel must move (norm: read+write h; add: 2 reads + 1 write of h; act: gated 2f/TP in,
    f/TP out; rope: q and k of the local heads, read+write)."""
    big = mlp[mlp["num_tokens"] >= 2048]
    h, f, tp, t = big["n_embd"], big["n_expanded_embd"], big["tp"], big["num_tokens"]
    hd = h / big["n_head"]
    elems = {
        "input_layernorm": 2 * h, "post_attention_layernorm": 2 * h, "add": 3 * h,
        "mlp_act": np.where(big["use_gated_mlp"], 3.0, 2.0) * f / tp,
        "attn_rope": 2 * (big["n_head"] + big["n_kv_head"]) * hd / tp,
    }
    rows = []
    for op, e in elems.items():
        sel = big["op"] == op
        if sel.any():
            frac = (2.0 * e[sel] * t[sel] / big["time_s"][sel]) / hw.hbm_bw
            rows.append({"op": op, "n": int(sel.sum()), "achieved HBM fraction (median)": float(frac.median())})
    return pd.DataFrame(rows)


# -- report -------------------------------------------------------------------------------------

def md_table(df: pd.DataFrame, floatfmt: dict | None = None) -> str:
    floatfmt = floatfmt or {}
    cols = list(df.columns)
    lines = ["| " + " | ".join(str(c) for c in cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for _, row in df.iterrows():
        cells = []
        for c in cols:
            v = row[c]
            if isinstance(v, (float, np.floating)):
                cells.append(format(v, floatfmt.get(c, ".3f")))
            else:
                cells.append(str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def pct_table(summary: pd.DataFrame) -> pd.DataFrame:
    out = summary.copy()
    for c in ("median_rel_err", "p90_rel_err", "median_signed_err"):
        out[c] = out[c].map(lambda v: f"{100 * v:+.1f}%" if c == "median_signed_err" else f"{100 * v:.1f}%")
    return out.rename(columns={"op_class": "operator class", "median_rel_err": "median rel. error",
                               "p90_rel_err": "p90 rel. error", "median_signed_err": "median signed"})


def build_report(results: list[dict]) -> str:
    out = ["# Cost-model validation against Vidur per-operator timings", "",
           "Generated by `experiments/fit_costmodel.py`; do not edit by hand. Data: per-operator GPU timings "
           "measured by the Vidur project (Agrawal et al., MLSys 2024, MIT licence), shipped in "
           "`servesim/calibrate/data/vidur/`. Error = |predicted / measured - 1| per row, measured = the median "
           "of Vidur's repeats; 'median signed' > 0 means the model is slower than the measurement.", "",
           "## Method", "",
           "- GEMM: `gemm_time_nb` (fp16, peak = `peak_fp16_TFLOPS`, datasheet HBM bandwidth). Fitted on the "
           "Llama family (`meta-llama/*`), held out: Qwen-72B, CodeLlama-34b, internlm-20b, phi-2 (H100 has no "
           "Llama-3 files). Least squares on log(pred/meas), bounds: fractions in [0.05, 1], half_tokens in "
           "[1, 4096], latency in [0, 50] us.",
           "- GEMM loss: soft-L1 with f_scale 0.1 in log time (`GEMM_LOSS`), so the saw-tooth tails of wave "
           "quantisation do not pull the smooth curve off the bulk of the rows.",
           "- Elementwise (per layer: 2 RMSNorms + rope + activation + 2 residual adds; Vidur's `input_layernorm` "
           "and `post_attention_layernorm` columns are the two norms, phi-2 has one and counts it twice): each "
           "kernel costs `elementwise_latency + bytes / (hbm_bw * fraction of its kind)` with the bytes of "
           "`servesim.costmodel.elementwise` (norm 4 h, add 6 h, rope 4 (q + kv heads) d / TP, activation "
           "2 (g + 1) f / TP per token); `norm_hbm_fraction`, `rope_hbm_fraction`, `activation_hbm_fraction` and "
           "`elementwise_latency_us` fitted per kernel on the Llama family (adds at the GEMM `hbm_fraction`), "
           "errors reported on the per-layer sum, other models held out.",
           "- all-reduce: `allreduce_time_nb(algorithm = auto)` over `scaleup_bw * scaleup_bw_fraction`, "
           "alpha = `scaleup_latency` per step, plus `collective_base_latency` once per call (NCCL's tuning "
           "model: a base latency per algorithm plus a per-hop latency, nccl src/graph/tuning.cc); fitted on the "
           "intra-node rows of `<gpu>_dgx/all_reduce.csv`. Held out: (a) the same node at a group size not "
           "fitted (refit on 2 and 8 GPUs, predict 4), (b) `<gpu>_pairwise_nvlink/all_reduce.csv`, a different "
           "topology (NVLink-bridge pairs, 4 GPUs per node: `pairwise_variant`), nothing fitted there: 2-GPU "
           "groups over the bridge at the DGX-fitted link figures, 4-GPU groups over PCIe at the profile's "
           "`pcie_bw_fraction` / `pcie_latency_us`, as `link_for_group` routes them in the cost model.",
           "- send-recv: `p2p_latency + bytes / (scaleup_bw * p2p_bw_fraction)`, and at `p2p_large_bw_fraction` "
           "for messages above `p2p_large_message_mib` (a measured step, see Notes; not fitted), fitted on the "
           "DGX intra-node rows. Held out: 2-fold cross-validation by message-size octave on those rows. The "
           "pairwise machines' send-recv file runs faster than their bridge allows and is not used (see Notes).",
           "- 'held-out' pools all held-out rows of a class; the rows below it break that down.", ""]
    filt = ["## Filters", ""]
    for r in results:
        g = r["gemm"]
        small = g[g["time_s"] < NOISE_FLOOR_S]
        inter = r["net_all"][~r["net_all"]["intra_node"]]
        line = (f"- {r['profile']}: {len(g)} GEMM rows, all with num_tokens >= 1; {len(small)} below 5 us")
        if len(small):
            err = np.abs(small["pred_s"] / small["time_s"] - 1)
            desc = ", ".join(sorted({f"{m} {o} TP{t}" for m, o, t in zip(small["model"], small["op"], small["tp"])}))
            line += (f" ({desc}, M <= {int(small['m'].max())}; kept: they repeat at 4-5 us across neighbouring "
                     f"token counts, so they are not noise; median error there {100 * np.median(err):.0f}%)")
        line += (f". Network: {len(inter)} inter-node rows (num_workers > devices_per_node, i.e. over the "
                 f"NIC, not NVLink) excluded; {len(r['intra'])} intra-node rows used.")
        filt.append(line)
    out += filt + [""]

    out += ["## Errors", ""]
    table = pd.concat([r["summary"] for r in results], ignore_index=True)
    out.append(md_table(pct_table(table)))
    out.append("")
    out += ["## Fitted parameters", "",
            "Written into `hardware_profiles/<gpu>.toml` `[efficiency]` (rounded as shown; the errors above use "
            "the rounded values).", ""]
    prow = []
    for r in results:
        for k in GEMM_PARAMS + ELEMENTWISE_PARAMS + COLLECTIVE_PARAMS + P2P_PARAMS:
            prow.append({"gpu": r["profile"], "parameter": k, "profile before this run": r["before"][k],
                         "fitted": r["params"][k]})
    out.append(md_table(pd.DataFrame(prow), {"profile before this run": ".4g", "fitted": ".4g"}))
    warn = [w for r in results for w in r["warnings"]]
    out += ["", "Bound warnings: " + ("; ".join(warn) if warn else "none (no parameter at a bound)."), ""]

    out += ["## Where the error is", "", "GEMM median |error| by token count M (all models):", ""]
    for r in results:
        s = error_summary(r["gemm"], ["op_class", "m_bin"])
        piv = s.pivot(index="op_class", columns="m_bin", values="median_rel_err").reindex(CLASS_ORDER[:4])
        piv = piv.map(lambda v: f"{100 * v:.1f}%").reset_index()
        out += [f"{r['profile']}:", "", md_table(piv), ""]
    out += ["Collectives by system and group size (intra-node rows):", ""]
    for r in results:
        s = error_summary(r["intra"], ["system", "collective", "num_workers"])
        out += [f"{r['profile']}:", "", md_table(pct_table(s)), ""]
    out += ["Elementwise ops: achieved fraction of datasheet HBM bandwidth at num_tokens >= 2048 (bytes a fused "
            "kernel must move), vs the GEMM `hbm_fraction` (the fitted `elementwise_hbm_fraction` is in the "
            "parameter table):", ""]
    for r in results:
        bw = elementwise_bandwidth(r["mlp"], r["hw"])
        out += [f"{r['profile']} (hbm_fraction = {r['params']['hbm_fraction']:.3f}):", "", md_table(bw), ""]

    slopes = pd.concat([bus_bandwidths(r["net_all"][r["net_all"]["intra_node"]], r["hw"], r["gpu"])
                        for r in results], ignore_index=True)
    out += ["## Network `size` units", "",
            "The shared README describes `size` as fp16 elements (bytes = 2 x size). Read that way, "
            f"{_over(slopes, 'bus GB/s if bytes = 2 x size')} of the {len(slopes)} (system, collective, workers) "
            "groups below move data faster than one direction of NVLink allows, and the fit of "
            "`scaleup_bw_fraction` hits its upper bound 1.0 on both GPUs. Read as bytes, "
            f"{_over(slopes, 'bus GB/s if bytes = size')} group(s) exceed it "
            f"({_over_names(slopes, 'bus GB/s if bytes = size')}){_pairwise_only(slopes)}. The shipped reader "
            "therefore uses bytes "
            "(`VIDUR_NETWORK_BYTES_PER_SIZE = 1`); the README's reading, refitted, gives:", ""]
    sens = []
    for r in results:
        s = error_summary(r["intra_elements"], ["collective", "split"])
        for _, row in s.iterrows():
            sens.append({"gpu": r["profile"], "collective": row["collective"], "split": row["split"],
                         "n": row["n"], "median rel. error (bytes = 2 x size)": f"{100 * row['median_rel_err']:.1f}%",
                         "median rel. error (bytes = size)": f"{100 * _median_err(r['intra'], row):.1f}%"})
        sens.append({"gpu": r["profile"], "collective": "fitted params (2 x size)",
                     "split": ", ".join(f"{k} = {v:g}" for k, v in r["coll_elements"].items()), "n": "",
                     "median rel. error (bytes = 2 x size)": "", "median rel. error (bytes = size)": ""})
    out += [md_table(pd.DataFrame(sens)), ""]
    out += ["Large-message bus bandwidth (linear fit of time vs size for messages >= 4 MB; all-reduce scaled "
            "by 2(n-1)/n as nccl-tests does):", "",
            md_table(slopes, {"bus GB/s if bytes = size": ".0f", "bus GB/s if bytes = 2 x size": ".0f",
                                            "NVLink GB/s per direction": ".0f"}), ""]

    out += ["## Shape interpretation checks", "",
            "Time ratio TP=1 / TP=t at num_tokens >= 1024, median over models: ~t for the TP-sharded ops "
            "(GEMMs, rope, activation), ~1 for the replicated ones (norms, add, embedding).", ""]
    for r in results:
        out += [f"{r['profile']}:", "", md_table(tp_scaling(r["mlp"]).reset_index(), {}), ""]
    out += ["QKV / attention-out and MLP-up / MLP-down time ratios at TP=1, num_tokens >= 2048 (compute-bound), vs "
            "the FLOP ratios the shape interpretation implies:", ""]
    for r in results:
        out += [f"{r['profile']}:", "", md_table(gqa_check(r["mlp"])), ""]
    out += ["## Notes", ""] + notes(results) + [""]
    return "\n".join(out)


def _pairwise_only(slopes: pd.DataFrame) -> str:
    sel = slopes[slopes["bus GB/s if bytes = size"] > slopes["NVLink GB/s per direction"]]
    if len(sel) and (sel["system"].str.endswith("_pairwise_nvlink") & (sel["collective"] == "send_recv")).all():
        return ": the pairwise send-recv file, not used (see Notes)"
    return ""


def _over(slopes: pd.DataFrame, col: str) -> int:
    return int((slopes[col] > slopes["NVLink GB/s per direction"]).sum())


def _over_names(slopes: pd.DataFrame, col: str) -> str:
    sel = slopes[slopes[col] > slopes["NVLink GB/s per direction"]]
    return ", ".join(f"{a} {b} n={c}" for a, b, c in zip(sel["system"], sel["collective"], sel["workers"])) or "none"


def _median_err(frame: pd.DataFrame, row) -> float:
    sel = frame[(frame["collective"] == row["collective"]) & (frame["split"] == row["split"])]
    return float(np.median(np.abs(sel["pred_s"] / sel["time_s"] - 1)))


def _signed(frame: pd.DataFrame, mask) -> float:
    sel = frame[mask]
    return float(np.median(sel["pred_s"] / sel["time_s"] - 1))


def bus_bandwidths(intra: pd.DataFrame, hw, gpu: str) -> pd.DataFrame:
    """Large-message bus bandwidth per (system, collective, workers) from a linear fit of time vs size,
    beside one direction of the NVLink the group runs on (NVSwitch on the DGX, the bridge on pairs)."""
    rows = []
    for (system, coll, n), grp in intra.groupby(["system", "collective", "num_workers"]):
        rate = large_message_rate(grp.assign(nbytes=grp["size"]))
        bus = (2.0 * (n - 1) / n) if coll == "all_reduce" else 1.0
        link = hw.scaleup_bw if system.endswith("_dgx") else bridge_bw(gpu)
        rows.append({"system": system, "collective": coll, "workers": n,
                     "bus GB/s if bytes = size": bus * rate / 1e9, "bus GB/s if bytes = 2 x size": 2 * bus * rate / 1e9,
                     "NVLink GB/s per direction": link / 1e9})
    return pd.DataFrame(rows)


def notes(results: list[dict]) -> list[str]:
    lines = []
    for r in results:
        s = r["summary"].set_index(["op_class", "split"])
        bad = [f"{c} ({100 * s.loc[(c, sp), 'median_rel_err']:.1f}%)"
               for c, sp in s.index if s.loc[(c, sp), "median_rel_err"] >= 0.10 and sp == "held-out"]
        lines.append(f"- {r['profile']}: held-out classes at or above the 10% median target: "
                     + (", ".join(bad) if bad else "none") + ".")
    # GEMM
    ramp = []
    for r in results:
        g = r["gemm"]
        d = g[g["m"] <= 4]
        wbytes = d["k"] * d["n"] * 2.0
        big = d[wbytes >= 300e6]
        frac = float(np.median(wbytes[wbytes >= 300e6] / big["time_s"] / r["hw"].hbm_bw))
        small = d[wbytes < 20e6]
        frac_s = float(np.median(wbytes[wbytes < 20e6] / small["time_s"] / r["hw"].hbm_bw))
        ramp.append(f"{r['profile']} {frac:.2f} for >= 300 MB of weights, {frac_s:.2f} below 20 MB")
    lines.append(
        "- GEMM: the residual is mostly tile/wave quantisation in 128 < M <= 2048 (saw-tooth efficiency that a "
        "smooth M/(M+half) curve cannot follow; see the M table). `hbm_fraction` and `kernel_latency_us` "
        "trade off: decode GEMMs (M <= 4) reach, as raw bytes/time/datasheet bandwidth, " + "; ".join(ramp) +
        ". The fit explains that ramp with a fixed latency, so `hbm_fraction` is an asymptote for very large "
        "weight reads (H100's is close to 1) rather than a stream-benchmark figure.")
    # Elementwise
    parts = []
    for r in results:
        e = r["elem"]
        parts.append(f"{r['profile']} {100 * _signed(e, e['num_tokens'] >= 2048):+.0f}% at >= 2048 tokens, "
                     f"{100 * _signed(e, e['num_tokens'] <= 64):+.0f}% at <= 64 tokens")
    lines.append(
        "- Elementwise: Vidur measures norms, rope and activation as separate, unfused kernels that run well "
        "below the bandwidth the GEMMs stream at (only the residual add reaches it; table above), hence one "
        "fraction per kernel kind. Per layer the formula is off by (median signed) " + "; ".join(parts) +
        "; the p90 tail is at small token counts, where launch latency dominates and varies by kernel.")
    # all-reduce
    lat = []
    topo = []
    bridge = []
    for r in results:
        intra = r["intra"]
        dgx = intra[(intra["system"] == f"{r['gpu']}_dgx") & (intra["collective"] == "all_reduce")]
        med = dgx[dgx["size"] <= 256e3].groupby("num_workers")["time_s"].median() * 1e6
        lat.append(f"{r['profile']} " + ", ".join(f"n={n}: {v:.0f} us" for n, v in med.items()))
        pw = intra[(intra["system"] == f"{r['gpu']}_pairwise_nvlink") & (intra["collective"] == "all_reduce")
                   & (intra["num_workers"] == 4)]
        if len(pw):
            topo.append(f"{r['profile']} {float(np.median(pw['time_s'] / pw['pred_s'])):.1f}x")
        pair = intra[(intra["system"] == f"{r['gpu']}_pairwise_nvlink") & (intra["collective"] == "all_reduce")
                     & (intra["num_workers"] == 2)]
        if len(pair):
            bridge.append(f"{r['profile']} {float(np.median(pair['time_s'] / pair['pred_s'])):.2f}x")
    lines.append(
        "- all-reduce: the alpha-beta model charges latency per step (2 log2(n) alpha for the tree), but the "
        "measured small-message (<= 256 KB) medians do not grow with n (" + "; ".join(lat) + "), and on H100 "
        "the large-message bus bandwidth grows with n (table above), consistent with NCCL's NVLink-SHARP "
        "in-switch reduction rather than the ring's 2(n-1)/n. On the pairwise-NVLink machines (NVLink between "
        "pairs, 4-GPU groups cross PCIe/host) the 4-worker all-reduce, routed over PCIe, takes "
        + ", ".join(topo) + " the predicted time (median). Their 2-worker all-reduce over the bridge, at the "
        "bridge's rate with the NVSwitch-fitted efficiencies (nothing fitted there), takes " + ", ".join(bridge) +
        " the predicted time (median): a bridge pair is not the switched fabric those efficiencies were "
        "fitted on, and A100's pair runs faster through it.")
    lines.append(
        "- send-recv: `a100_pairwise_nvlink/send_recv.csv` and `h100_pairwise_nvlink/send_recv.csv` are "
        "byte-identical files in the Vidur data, and their large-message rate (" + pairwise_sr_rates(results) +
        ") is above one direction of either card's NVLink bridge (600 GB/s bidirectional: A100 PCIe product "
        "brief, H100 NVL datasheet), so they are not a measurement of that link and are not used (the H100 "
        "DGX fit, on the NVSwitch node's 450 GB/s, predicts them within " + pairwise_sr_dgx_err(results) +
        "). Measured rate (bytes / median time) just below and just above "
        "`p2p_large_message_mib`: " + "; ".join(p2p_step(r) for r in results) + ". The A100 step is abrupt "
        "(between 31.9 and 32.1 MiB) and the rate stays flat beyond it, so the cost model has a second send "
        "rate, `p2p_large_bw_fraction`, above that size. Held-out (size-octave) median error with the step "
        "vs one rate for all sizes: " + "; ".join(f"{r['profile']} {100 * r['send_recv_err']:.1f}% vs "
                                                 f"{100 * r['send_recv_one_rate_err']:.1f}%" for r in results) +
        " (one rate averages the two regimes). Fitted fractions below / above the step: " +
        "; ".join(f"{r['profile']} {r['params']['p2p_bw_fraction']:.3f} / {r['params']['p2p_large_bw_fraction']:.3f}"
                  for r in results) + " (H100 shows no step). Below the step A100's fit sits at the full per-direction NVLink "
        "rate (`p2p_bw_fraction` = 1, the bound), i.e. the measured sends there are as fast as the link allows "
        "once the fixed latency is paid.")
    return lines


def _pairwise_sr(r: dict) -> pd.DataFrame:
    net = r["net_all"]
    return net[(net["system"] == f"{r['gpu']}_pairwise_nvlink") & (net["collective"] == "send_recv")
               & net["intra_node"]]


def pairwise_sr_rates(results: list[dict]) -> str:
    return ", ".join(f"{r['gpu']}_pairwise_nvlink {large_message_rate(_pairwise_sr(r)) / 1e9:.0f} GB/s"
                     for r in results)


def pairwise_sr_dgx_err(results: list[dict]) -> str:
    out = []
    for r in results:
        if r["gpu"] != "h100":
            continue
        sr = _pairwise_sr(r)
        err = np.abs(predict_collectives(sr, r["hw"], r["params"]) / sr["time_s"].to_numpy() - 1.0)
        out.append(f"{100 * float(np.median(err)):.1f}% median")
    return ", ".join(out)


def p2p_step(r: dict) -> str:
    """Median measured send-recv rate (GB/s) in (step/2, step] and (step, 2 step] per file of a result."""
    step = r["hw"].efficiency.p2p_large_message_bytes
    sr = r["intra"][r["intra"]["collective"] == "send_recv"]
    out = []
    for system, g in sr.groupby("system"):
        rate = g["nbytes"] / g["time_s"] / 1e9
        lo = rate[(g["nbytes"] > step / 2) & (g["nbytes"] <= step)].median()
        hi = rate[(g["nbytes"] > step) & (g["nbytes"] <= 2 * step)].median()
        out.append(f"{system} {lo:.0f} -> {hi:.0f} GB/s")
    return ", ".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--no-write", action="store_true", help="print only; leave report and profiles alone")
    ap.add_argument("--refresh-data", type=Path, metavar="VIDUR_DIR",
                    help="re-copy the a100/h100 files from a Vidur data folder (with LICENSE and profiling/)")
    args = ap.parse_args(argv)
    if args.refresh_data:
        refresh_data(args.refresh_data)
    results = [run_gpu(profile, gpu) for profile, gpu in GPUS.items()]
    table = pd.concat([r["summary"] for r in results], ignore_index=True)
    print(pct_table(table).to_string(index=False))
    for r in results:
        print(f"{r['profile']}: " + ", ".join(f"{k} = {v:g}" for k, v in r["params"].items()))
        for w in r["warnings"]:
            print(f"  warning: {w}")
    if args.no_write:
        return 0
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    REPORT.write_text(build_report(results))
    print(f"wrote {REPORT.relative_to(REPO)}")
    for r in results:
        path = r["hw"].path
        path.write_text(update_profile(path, r["params"], FIT_SOURCE))
        print(f"updated {path.relative_to(REPO)} [efficiency]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
