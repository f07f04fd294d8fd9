"""MLA attention (DeepSeek-V3) against AIConfigurator's MLA tables: before/after errors and the fit.

    python experiments/fit_mla.py                  # fit + held-out errors, write experiments/results/mla_validation.md
    python experiments/fit_mla.py --no-write       # print only
    python experiments/fit_mla.py --profiles       # also write the mla_* keys into engines/*.toml
    python experiments/fit_mla.py --refresh-data /work/shared/calibration/aiconfigurator   # re-cut the shipped rows first

"Before" is the cost model's previous MLA pricing: a roofline over the latent (decode: absorbed FLOPs
over the latent, latent bytes, at the engine's generic prefill compute fraction and decode bandwidth
fraction; prefill: FLOPs over the pairs and latent bytes at the generic prefill fractions). "After" is
kernels.mla_decode_time_nb / mla_prefill_time_nb with the MLA keys fitted per GPU and engine; held
out by head count (each in turn) and from short to long contexts. Method: servesim/calibrate/mla_fit.py.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from servesim.calibrate import engine_kernels as ek  # noqa: E402
from servesim.calibrate import mla_fit  # noqa: E402
from servesim.config import load_hardware  # noqa: E402
from servesim.config.engine import MLA_FIT_KEYS, load_engine  # noqa: E402
from servesim.costmodel.roofline import roofline_time_nb  # noqa: E402

REPORT = REPO / "experiments" / "results" / "mla_validation.md"
BATCH_BANDS = [0, 4, 32, 256, 1024]
CTX_BANDS = [0, 256, 2048, 16384, 131072]
# tables without MLA rows take another table's MLA keys (fractions of their own datasheet figures)
CARRY = {("vllm", "b200"): ("h200-sxm", "no vLLM MLA kernel tables on B200 (AIConfigurator's B200 MLA rows time "
                                        "whole MLA modules, GEMMs included)"),
         ("sglang", "a100-sxm-80gb"): ("h100-sxm", "no SGLang MLA attention tables on A100")}


def med(e) -> str:
    e = np.asarray(e, float)
    e = e[np.isfinite(e)]
    return f"{np.median(np.abs(e)) * 100:.1f}%" if e.size else "-"


def bias(e) -> str:
    e = np.asarray(e, float)
    e = e[np.isfinite(e)]
    return f"{np.median(e) * 100:+.1f}%" if e.size else "-"


def p90(e) -> str:
    e = np.asarray(e, float)
    e = e[np.isfinite(e)]
    return f"{np.percentile(np.abs(e), 90) * 100:.1f}%" if e.size else "-"


def before(frame: pd.DataFrame, hw, fit, kind: str) -> np.ndarray:
    """The previous MLA pricing (costmodel/iteration.py before the MLA fit), row by row."""
    g = mla_fit.geometry()
    out = np.empty(len(frame))
    for i, r in enumerate(frame.itertuples()):
        q_bytes = 4.0 * r.heads * g["qk"]
        lat_b = (g["latent"] + g["rope"]) * r.kv_bytes
        if kind == "decode":
            out[i] = roofline_time_nb(r.kv_tokens * 2.0 * r.heads * (2 * g["latent"] + g["rope"]),
                                      r.kv_tokens * lat_b + r.seqs * q_bytes, hw.peak_flops["bf16"],
                                      fit.attn_prefill_max, hw.hbm_bw, fit.attn_decode_hbm_fraction,
                                      fit.attn_decode_latency_s)
        else:
            tok = r.seqs * r.ctx
            pairs = r.seqs * r.ctx * (r.ctx + 1.0) / 2.0
            out[i] = roofline_time_nb(pairs * 2.0 * r.heads * (g["qk"] + g["v"]), tok * lat_b + tok * q_bytes,
                                      hw.peak_flops["bf16"], fit.attn_prefill_max, hw.hbm_bw,
                                      fit.attn_prefill_hbm_fraction, fit.attn_prefill_latency_s)
    return out


def run() -> tuple[pd.DataFrame, dict, pd.DataFrame]:
    fits: dict = {}
    frames, ctx_rows = [], []
    order = sorted(((g, e) for g, es in mla_fit.MLA_SOURCES.items() for e in es), key=lambda x: x[1] in mla_fit.EAGER)
    for gpu, engine in order:
        hw = load_hardware(ek.GPUS[gpu])
        generic = load_engine(engine).fit_for(hw)
        eager = engine in mla_fit.EAGER
        params = {}
        for kind in ("decode", "prefill"):
            f = (mla_fit.decode_frame if kind == "decode" else mla_fit.prefill_frame)(gpu, engine)
            p = mla_fit.fit_kind(f, hw, kind, eager)
            params.update(p)
            f["kind"] = kind
            f["before_s"] = before(f, hw, generic, kind)
            f["floor_s"] = 0.0
            if eager:   # the same eager floor under the previous formula: kernel against kernel
                fp8 = (f["kv_dtype"] == "fp8").to_numpy()
                floor = np.where(fp8, p.get(mla_fit.FLOOR + "_fp8", p[mla_fit.FLOOR]), p[mla_fit.FLOOR]) * 1e-6
                f["before_s"] = np.maximum(f["before_s"], floor)
                f["floor_s"] = floor
            f["pred_s"] = mla_fit.predict_rows(f, hw, p, kind)
            f["heads_out_s"] = mla_fit.heads_holdout(f, hw, kind, eager)
            c = mla_fit.context_holdout(f, hw, kind, eager)
            c["kind"] = kind
            frames.append(f)
            ctx_rows.append(c)
        fits[(gpu, engine)] = params
    f = pd.concat(frames, ignore_index=True)
    for col in ("before", "pred", "heads_out"):
        f[f"err_{col}"] = f[f"{col}_s"] / f["time_s"] - 1.0
    c = pd.concat(ctx_rows, ignore_index=True)
    c["err"] = c["pred_s"] / c["time_s"] - 1.0
    return f, fits, c


def report(f: pd.DataFrame, fits: dict, c: pd.DataFrame) -> str:
    lines = ["# MLA attention against AIConfigurator's MLA tables", "",
             f"Written by `python experiments/fit_mla.py` ({time.strftime('%Y-%m-%d')}); method in "
             "`servesim/calibrate/mla_fit.py`, formulas `servesim/costmodel/kernels.py` (`mla_decode_time_nb`, "
             "`mla_prefill_time_nb`). Error = predicted / measured - 1 per row; median and p90 of |error|, bias = "
             "median signed error. Before: the previous roofline over the latent with the engine's generic attention "
             "keys (vLLM's eager rows: on the same fitted floor). After: the MLA formulas with the fitted keys; held out: each head count predicted by the fit on "
             "the others, and contexts >= 8,192 by the fit on contexts <= 2,048. The fp8-cache prefill rows are "
             "predicted with the 16-bit keys (they are never fitted).", "",
             "| kernel | GPU | engine | KV cache | rows | before: median | bias | after, in sample: median | p90 "
             "| heads held out: median | bias | p90 | long from short contexts: median | bias |",
             "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for (kind, gpu, engine, kv), g in f.groupby(["kind", "gpu", "engine", "kv_dtype"]):
        cc = c[(c["kind"] == kind) & (c["gpu"] == gpu) & (c["engine"] == engine) & (c["kv_dtype"] == kv)]
        lines.append(f"| {kind} | {ek.GPUS[gpu]} | {engine} | {kv} | {len(g)} | {med(g['err_before'])} | "
                     f"{bias(g['err_before'])} | {med(g['err_pred'])} | {p90(g['err_pred'])} | {med(g['err_heads_out'])} | "
                     f"{bias(g['err_heads_out'])} | {p90(g['err_heads_out'])} | {med(cc['err'])} | {bias(cc['err'])} |")
    lines += ["", "vLLM's rows whose measured time is at least twice the table's fitted eager floor (the kernel, not the "
              "host, sets them):", "", "| kernel | GPU | KV cache | rows | before: median | bias | heads held out: median | "
              "bias | p90 |", "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for (kind, gpu, kv), g in f[f["floor_s"] > 0].groupby(["kind", "gpu", "kv_dtype"]):
        g = g[g["time_s"] >= 2.0 * g["floor_s"]]
        lines.append(f"| {kind} | {ek.GPUS[gpu]} | {kv} | {len(g)} | {med(g['err_before'])} | {bias(g['err_before'])} | "
                     f"{med(g['err_heads_out'])} | {bias(g['err_heads_out'])} | {p90(g['err_heads_out'])} |")
    hop = f[f["gpu"] != "a100_sxm"]
    lines += ["", f"Hopper (H100, H200), all engines, 16-bit cache: decode {med(hop[(hop.kind == 'decode') & (hop.kv_dtype == 'bf16')]['err_before'])} "
              f"before, {med(hop[(hop.kind == 'decode') & (hop.kv_dtype == 'bf16')]['err_heads_out'])} held out; prefill "
              f"{med(hop[(hop.kind == 'prefill') & (hop.kv_dtype == 'bf16')]['err_before'])} before, "
              f"{med(hop[(hop.kind == 'prefill') & (hop.kv_dtype == 'bf16')]['err_heads_out'])} held out.", "",
              "## Held-out error (heads) by batch and context (16-bit cache)", ""]
    b = f[f["kv_dtype"] == "bf16"].copy()
    b["batch"] = pd.cut(b["seqs"], BATCH_BANDS).astype(str)
    b["context"] = pd.cut(b["ctx"], CTX_BANDS).astype(str)
    for kind in ("decode", "prefill"):
        k = b[b["kind"] == kind]
        lines += [f"{kind}: median |error| (bias), Hopper engines pooled", "",
                  "| batch \\ context | " + " | ".join(str(x) for x in sorted(k["context"].unique(), key=lambda s: float(s[1:].split(',')[0]))) + " |",
                  "|---|" + "---:|" * k["context"].nunique()]
        kh = k[k["gpu"] != "a100_sxm"]
        ctxs = sorted(k["context"].unique(), key=lambda s: float(s[1:].split(',')[0]))
        for band in sorted(k["batch"].unique(), key=lambda s: float(s[1:].split(',')[0])):
            cells = []
            for cx in ctxs:
                g = kh[(kh["batch"] == band) & (kh["context"] == cx)]
                cells.append(f"{med(g['err_heads_out'])} ({bias(g['err_heads_out'])})" if len(g) else "-")
            lines.append(f"| {band} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["## Fitted keys (written into engines/*.toml with `--profiles`)", "",
              "| GPU | engine | " + " | ".join(MLA_FIT_KEYS) + " | eager table only: floor us, decode / prefill latency us |",
              "|---|---|" + "---:|" * (len(MLA_FIT_KEYS) + 1)]
    for (gpu, engine), t in sorted(fits.items()):
        p = mla_fit.serving_keys(fits, gpu, engine)
        eager = "-"
        if mla_fit.FLOOR in t:
            eager = (f"{t[mla_fit.FLOOR]:.0f}" + (f" (fp8 {t[mla_fit.FLOOR + '_fp8']:.0f})" if mla_fit.FLOOR + "_fp8" in t
                                                 else "")
                     + f"; {t['mla_decode_latency_us']:.1f} / {t['mla_prefill_latency_us']:.1f}")
        lines.append(f"| {ek.GPUS[gpu]} | {engine} | " + " | ".join(f"{p.get(k, float('nan')):.4g}" for k in MLA_FIT_KEYS)
                     + f" | {eager} |")
    lines += ["", "vLLM's rows (eager calls: a 100-200 us floor under every row) are priced max(floor, latency + kernel), "
              "the latency there standing for the host's work before the kernel; the engine profile takes their "
              "fractions and block overhead, and the decode block and latency and the prefill latency of the "
              "graph-replayed table of the same GPU (A100: TensorRT-LLM's) or of SGLang on H100 (H100, H200).", ""]
    return "\n".join(lines) + "\n"


def write_profiles(fits: dict) -> None:
    """Write the mla_* keys into engines/<engine>.toml [hardware.<gpu>], with an 'mla keys' note in its
    fit_source (kept by the other fit scripts); tables without MLA rows take CARRY's."""
    import tomllib
    from servesim.calibrate.profile_io import update_engine_profile
    by_hw = {(engine, ek.GPUS[gpu]): mla_fit.serving_keys(fits, gpu, engine) for (gpu, engine) in fits}
    for engine in ("vllm", "sglang", "trtllm"):
        path = REPO / "engines" / f"{engine}.toml"
        tables = tomllib.loads(path.read_text()).get("hardware", {})
        for hw_name, current in tables.items():
            if "efficiency_from" in current:
                continue
            if (engine, hw_name) in by_hw:
                p, note = by_hw[(engine, hw_name)], (f"mla keys: experiments/fit_mla.py on the AIConfigurator {engine} "
                                                     "MLA tables (experiments/results/mla_validation.md)")
                if engine in mla_fit.EAGER:
                    src_gpu, src_engine = mla_fit.FIXED_FROM[{v: k for k, v in ek.GPUS.items()}[hw_name]]
                    note += (f", block and latency {src_engine} {ek.GPUS[src_gpu]}'s (the {engine} tables are eager "
                             "calls whose host floor hides them)")
            elif (engine, hw_name) in CARRY:
                src, why = CARRY[(engine, hw_name)]
                p = by_hw[(engine, src)]
                note = f"mla keys: {src}'s ({why})"
            else:
                continue
            if "mla_decode_fp8_max" not in p:
                p = {**p, "mla_decode_fp8_max": p["mla_decode_max"],
                     "mla_decode_fp8_hbm_fraction": p["mla_decode_hbm_fraction"]}
                note += "; mla fp8 keys: the 16-bit ones (no fp8-cache rows)"
            vals = {k: round(p[k], 4) for k in MLA_FIT_KEYS}
            kept = [part for part in current.get("fit_source", "").split("; ") if not part.startswith("mla ")]
            path.write_text(update_engine_profile(path, hw_name, vals, "; ".join(kept + [note])))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--profiles", action="store_true")
    ap.add_argument("--refresh-data", type=Path, default=None)
    a = ap.parse_args(argv)
    t0 = time.time()
    if a.refresh_data is not None:
        for w in mla_fit.refresh_mla_data(a.refresh_data):
            print("wrote", *w)
    f, fits, c = run()
    text = report(f, fits, c)
    print(text)
    print(f"{len(f)} rows, {time.time() - t0:.0f} s")
    if not a.no_write:
        REPORT.write_text(text)
    if a.profiles:
        write_profiles(fits)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
