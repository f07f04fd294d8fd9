"""fp8 (W8A8) against 16-bit: the cost model's prefill and decode ratios per GPU, and the evidence.

    python experiments/fp8_ratios.py          # ~3 min on 2 cores; writes experiments/results/fp8_ratios.md

Model: ``servesim cost`` (vLLM engine profile) of Llama-3.1-8B at TP 1 and Llama-3.1-70B at TP 4:
a lone prefill of 4,096 / 8,192 tokens and a decode step of 64 sequences at 1,024 tokens of context,
in bf16 and in fp8 (fp8 KV cache off: the KV dtype stays 16-bit), on every GPU whose datasheet has an
fp8 peak. Evidence, each with its source:

- kernel tables (``servesim/calibrate/data/aiconfigurator``): the measured fp8 (per-tensor, activation
  quantised by the op) over bf16 GEMM time of the Llama-3.1 8B and 70B/TP4 linear layers present in
  each engine's table, at m = 8 (decode) and m = 4,096 (prefill);
- published end-to-end results (``servesim/calibrate/data/inference_published_calibration.csv``):
  TensorRT-LLM maximum throughput on H100, FP8 (v0.17) over FP16 (v0.14), for a prefill-heavy
  (2,048 in / 128 out) and a decode-heavy (128 in / 2,048 out) row of Llama-3.1-8B TP1 and 70B TP4.

And what the planner picks on H100 with both dtypes allowed: `servesim plan --model llama-3.1-70b
--hardware h100-sxm --dtype bf16,fp8 --rate 10 --slo ttft_p99=2s,tpot_p99=80ms`, its best plan and the
cheapest plan in bf16.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from servesim.calibrate import engine_kernels as ek  # noqa: E402
from servesim.config import list_hardware, load_hardware  # noqa: E402
from servesim.workflows.cost import cost  # noqa: E402

OUT = ROOT / "experiments" / "results" / "fp8_ratios.md"
CASES = (("llama-3.1-8b", 1, "prefill 4,096", dict(prefill_tokens=4096)),
         ("llama-3.1-70b", 4, "prefill 8,192", dict(prefill_tokens=8192)),
         ("llama-3.1-8b", 1, "decode 64 x 1,024", dict(decode_seqs=64, context=1024)),
         ("llama-3.1-70b", 4, "decode 64 x 1,024", dict(decode_seqs=64, context=1024)))
# (n, k) of the linear layers per GPU: Llama-3.1-8B TP1 and 70B TP4 (QKV, O, gate+up, down)
SHAPES = {"llama-3.1-8b TP1": ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)),
          "llama-3.1-70b TP4": ((2560, 8192), (8192, 2048), (14336, 8192), (8192, 7168))}


def model_rows() -> list:
    rows = []
    for hw in list_hardware():
        h = load_hardware(hw)
        if h.peak_flops.get("fp8", 0.0) <= 0.0:
            continue
        for model, tp, what, kw in CASES:
            t = {}
            for dt in ("bf16", "fp8"):
                try:
                    t[dt] = cost(model, hw, tp=tp, dtype=dt, kv_dtype="bf16", **kw).summary["time_ms"]
                except Exception as exc:     # a layout the chip cannot hold: said in the table
                    t[dt] = None
                    reason = str(exc).split(";")[0]
            rows.append({"hardware": hw, "case": f"{model} TP{tp} {what}", "bf16_ms": t["bf16"], "fp8_ms": t["fp8"],
                         "ratio": t["fp8"] / t["bf16"] if t["bf16"] and t["fp8"] else None,
                         "fit": cost(model, hw, tp=tp, dtype="bf16", **kw).summary.get("engine_fit", "")
                         if t["bf16"] else reason})
    return rows


def table_rows() -> list:
    rows = []
    for gpu, engines in ek.ENGINES.items():
        frame = ek.gemm_frame(gpu, list(engines))
        for engine, part in frame.groupby("engine"):
            for name, shapes in SHAPES.items():
                for m in (8, 4096):
                    sel = part[part["m"] == m]
                    tot = {}
                    for n, k in shapes:
                        s = sel[(sel["n"] == n) & (sel["k"] == k)]
                        if set(s["dtype"]) >= {"bf16", "fp8"}:
                            for dt in ("bf16", "fp8"):
                                tot.setdefault(dt, []).append(float(s[s["dtype"] == dt]["time_s"].iloc[0]))
                    if tot.get("fp8"):
                        rows.append({"gpu": ek.GPUS[gpu], "engine": engine, "layers": name, "m": m,
                                     "shapes": len(tot["fp8"]), "ratio": sum(tot["fp8"]) / sum(tot["bf16"])})
    return rows


def published_rows() -> list:
    d = pd.read_csv(ROOT / "servesim" / "calibrate" / "data" / "inference_published_calibration.csv")
    d = d[d.hardware.str.contains("H100") & (d.load_kind == "offline_max_throughput")]
    d = d.assign(p=d.precision.str[:4].str.strip())
    rows = []
    for model, tp in (("Llama-3.1-8B", 1), ("Llama-3.1-70B", 4)):
        for isl, osl in ((2048, 128), (128, 2048)):
            s = d[(d.model == model) & (d.tp == tp) & (d.isl == isl) & (d.osl == osl)]
            v = s.set_index("p")["value"]
            if {"FP8", "FP16"} <= set(v.index):
                rows.append({"model": model, "tp": tp, "isl/osl": f"{isl}/{osl}", "fp16 tok/s": v["FP16"],
                             "fp8 tok/s": v["FP8"], "time ratio fp8/fp16": v["FP16"] / v["FP8"],
                             "source": s["source"].iloc[0]})
    return rows


PLAN = dict(model="llama-3.1-70b", hardware=("h100-sxm",), dtypes=("bf16", "fp8"), rate=10.0,
            slo="ttft_p99=2s,tpot_p99=80ms")


def plan_rows() -> list:
    """The plan's best candidate and the cheapest one meeting the SLO in each dtype."""
    import servesim
    res = servesim.plan(model=PLAN["model"], hardware=PLAN["hardware"], dtype=PLAN["dtypes"], rate=PLAN["rate"],
                        slo=PLAN["slo"], workers=1)
    c = res.candidates
    ok = c[c["status"] == "meets_slo"].sort_values("usd_per_hour", kind="stable")
    out = []
    for dt in PLAN["dtypes"]:
        part = ok[ok["dtype"] == dt]
        if len(part):
            r = part.iloc[0]
            out.append({"dtype": dt, "tp": int(r["tp"]), "replicas": int(r["replicas"]), "gpus": int(r["num_gpus"]),
                        "usd_per_hour": float(r["usd_per_hour"]),
                        "best": "yes" if (dt, int(r["tp"]), int(r["replicas"])) == (res.best["dtype"], int(res.best["tp"]),
                                                                                   int(res.best["replicas"])) else "no"})
    return out


def md_table(rows: list, cols: list, fmt: dict) -> list:
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        out.append("| " + " | ".join("-" if r[c] is None else fmt.get(c, "{}").format(r[c]) for c in cols) + " |")
    return out


def main():
    t0 = time.time()
    m, t, p = model_rows(), table_rows(), published_rows()
    md = ["# fp8 (W8A8) against 16-bit: model ratios per GPU and their evidence", "",
          f"Generated by `python experiments/fp8_ratios.py` ({time.time() - t0:.0f} s). Time ratio fp8 / bf16 "
          "(below 1: fp8 faster); KV cache 16-bit in both.", "",
          "How fp8 is priced (`servesim/costmodel/kernels.py`, `iteration._gemm_nb`): each W8A8 GEMM is the "
          "activation quantisation (`gemm_fp8_quant_bytes` per element of X[m, k] at the weight-streaming rate) "
          "plus the fp8 GEMM at `gemm_fp8_max` of the fp8 peak with 1-byte operands, `gemm_fp8_latency_us` its fixed "
          "time; both fitted per engine and GPU on AIConfigurator's fp8 rows "
          "(`experiments/fit_engine_kernels.py`, `experiments/results/engine_kernels_validation.md`). vLLM's "
          "tables quantise per tensor, dynamically (a global max, then the quantise kernel: 32-34 bytes per "
          "element fitted on H100/H200); its serving checkpoints quantise per token or with a static scale, "
          "in one pass (3 bytes: 2 read, 1 written), which the engine profile uses.", "",
          "## The model (vLLM engine profile)", ""]
    md += md_table(m, ["hardware", "case", "bf16_ms", "fp8_ms", "ratio", "fit"],
                   {"bf16_ms": "{:.2f}", "fp8_ms": "{:.2f}", "ratio": "{:.2f}"})
    md += ["", "## Evidence: kernel tables (fp8 / bf16 GEMM time of the layers' linear layers)", "",
           "Source: NVIDIA AIConfigurator per-kernel tables (`servesim/calibrate/data/aiconfigurator`, "
           "Apache-2.0); fp8 rows are per-tensor scaled with the activation quantised inside the call.", ""]
    md += md_table(t, ["gpu", "engine", "layers", "m", "shapes", "ratio"], {"ratio": "{:.2f}"})
    md += ["", "## Evidence: published end-to-end results (TensorRT-LLM, H100, maximum throughput)", "",
           "Output-token throughput, FP8 (v0.17: FP8 weights, activations and KV cache) against FP16 (v0.14); "
           "different releases, so an upper bound on what the dtype alone gives.", ""]
    md += md_table(p, ["model", "tp", "isl/osl", "fp16 tok/s", "fp8 tok/s", "time ratio fp8/fp16", "source"],
                   {"fp16 tok/s": "{:.0f}", "fp8 tok/s": "{:.0f}", "time ratio fp8/fp16": "{:.2f}"})
    md += ["", "## What the planner picks on H100 (bf16 and fp8 allowed)", "",
           f"`servesim plan --model {PLAN['model']} --hardware h100-sxm --dtype bf16,fp8 --rate {PLAN['rate']:g} "
           f"--slo {PLAN['slo']}`: the cheapest deployment meeting the SLO in each dtype, and the plan's choice.", ""]
    md += md_table(plan_rows(), ["dtype", "tp", "replicas", "gpus", "usd_per_hour", "best"], {"usd_per_hour": "{:.2f}"})
    OUT.write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
