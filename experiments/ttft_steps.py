"""TTFT in engine steps on the 13 real vLLM deployments (issue #23, the TTFT stage bias), the L40S
codegen roofline and the A100's carried end-to-end terms (issue #23, unseen GPUs).

    python experiments/ttft_steps.py      # ~20 s; writes experiments/results/ttft_steps.md

1. Measured TTFT against measured ITL per generated token (`servesim/calibrate/vllm_serving.py`),
   whole runs: a line TTFT = a + b ITL fitted on the deployments of the three short-output
   workloads (general-lite, codegen, roleplay) and the reasoning deployments' distance from it; and
   (TTFT - frontend_us) / ITL, the steps between a request's arrival and its first token, measured
   and simulated (the shipped profile, `experiments/results/vllm_validation_rows.csv`, split fitted).
2. The codegen shape on an L40S in bf16 (Qwen3-14B TP1): the largest batch its KV cache holds and
   the output rate of a decode step at that batch if every byte moved at the datasheet bandwidth
   (hardware_profiles/l40s.toml), against the rate 10 req/s asks for.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))   # run from a checkout without installing

from servesim.calibrate import vllm_serving as vs  # noqa: E402

RESULTS = ROOT / "experiments" / "results"


def steps_table() -> tuple[list[str], dict]:
    import tomllib
    frontend_ms = tomllib.loads((ROOT / "engines" / "vllm.toml").read_text())["hardware"]["h100-sxm"][
        "frontend_us"] / 1000
    df = vs.load()
    whole = df[df.stage == -1].assign(itl=vs.itl_per_generated_token(df[df.stage == -1]))
    rows = pd.read_csv(RESULTS / "vllm_validation_rows.csv")
    fit = rows[(rows.split == "fitted") & (rows.stage == -1)].pivot_table(
        index="experiment", columns="metric", values="predicted")
    short = ~whole.experiment.str.contains("reasoning")
    b, a = np.polyfit(whole.itl[short], whole.measured_ttft_mean_ms[short], 1)
    out = ["| deployment | ITL ms | TTFT ms | TTFT / (a + b ITL) - 1 | steps measured | steps simulated |",
           "|---|---:|---:|---:|---:|---:|"]
    resid = {}
    for r in whole.itertuples():
        line = a + b * r.itl
        resid[r.experiment] = r.measured_ttft_mean_ms / line - 1
        sim = (fit.loc[r.experiment, "ttft_mean"] - frontend_ms) / fit.loc[r.experiment, "itl_mean"]
        out.append(f"| {r.experiment} | {r.itl:.2f} | {r.measured_ttft_mean_ms:.1f} | {100 * resid[r.experiment]:+.1f}% "
                   f"| {(r.measured_ttft_mean_ms - frontend_ms) / r.itl:.2f} | {sim:.2f} |")
    short_res = [v for k, v in resid.items() if "reasoning" not in k]
    return out, dict(n_short=int(short.sum()), a=a, b=b, frontend_ms=frontend_ms, short_min=min(short_res), short_max=max(short_res),
                     reasoning={k: v for k, v in resid.items() if "reasoning" in k})


def l40s_roofline() -> dict:
    import tomllib
    hw = tomllib.loads((ROOT / "hardware_profiles" / "l40s.toml").read_text())
    cfg = json.loads((ROOT / "workloads" / "models" / "hf" / "qwen3-14b.json").read_text())
    L, kvh, d = cfg["num_hidden_layers"], cfg["num_key_value_heads"], cfg["head_dim"]
    h, inter, vocab = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    heads = cfg["num_attention_heads"]
    # weights read by one decode step (bf16): attention q/k/v/o, the gated MLP, the LM head (untied)
    per_layer = h * (heads * d) + 2 * h * (kvh * d) + (heads * d) * h + 3 * h * inter
    weight_bytes = 2 * (L * per_layer + h * vocab)
    kv_per_token = 2 * L * kvh * d * 2
    prompt = 100 + 466 + vs.TEMPLATE_TOKENS
    out_len = 247
    ctx = prompt + (out_len - 1) / 2             # the mean context of a decode over the request's life
    bw = hw["memory"]["hbm_bandwidth_GBps"] * 1e9
    mem = hw["memory"]["device_memory_GiB"] * 2**30
    kv_tokens = 0.90 * mem - weight_bytes        # vLLM's default gpu_memory_utilization, no activations
    batch = min(128, kv_tokens / kv_per_token / ctx)
    step = (weight_bytes + batch * ctx * kv_per_token) / bw
    # the simulator's own figures: KV capacity (non-torch memory and the activation peak taken out)
    # and the modelled decode step at the batch that capacity holds
    from servesim.workflows import cost
    model = str(ROOT / "workloads" / "models" / "hf" / "qwen3-14b.json")
    cap = cost(model, "l40s", decode_seqs=1, context=int(ctx), max_num_seqs=128).summary["memory"]["kv_capacity_tokens"]
    sim_batch = int(min(128, cap / ctx))
    sim = cost(model, "l40s", decode_seqs=sim_batch, context=int(ctx), max_num_seqs=128).summary
    return dict(cap=cap, sim_batch=sim_batch, sim_step_ms=sim["time_ms"], sim_tok_s=sim_batch / sim["time_ms"] * 1e3,
                sim_roof_tok_s=sim_batch / ((weight_bytes + sim_batch * ctx * kv_per_token) / bw),
                weight_gb=weight_bytes / 1e9, kv_kib=kv_per_token / 1024, ctx=ctx, kv_tokens=kv_tokens / kv_per_token,
                batch=batch, step_ms=1e3 * step, mem_gib=mem / 2**30, tok_s=batch / step, need=10 * out_len, bw=bw / 1e9)


def a100_terms() -> list[str]:
    """A100 decode steps of dense 8B / 14B / 34B models: the kernels (its own vLLM tables), the GPU
    time per step outside the forward (H100's step_gpu_us scaled by A100's own GEMM fixed time) and
    the engine core's host time (H100's, CPU) that async scheduling hides behind the GPU step."""
    from servesim.config import load_hardware
    from servesim.config.engine import load_engine
    from servesim.workflows import cost
    fit = load_engine("vllm").fit_for(load_hardware("a100-sxm-80gb"))
    hf = ROOT / "workloads" / "models" / "hf"
    out = ["| model | TP | batch | step ms | kernels ms | step_gpu ms | host ms (hidden when < step) |",
           "|---|---:|---:|---:|---:|---:|---:|"]
    for name, model, tp in (("llama-3.1-8b", "llama-3.1-8b", 1), ("qwen3-14b", str(hf / "qwen3-14b.json"), 1),
                            ("codellama-34b", str(hf / "codellama-34b-hf.json"), 2)):
        for batch in (8, 64, 256):
            r = cost(model, "a100-sxm-80gb", tp=tp, decode_seqs=batch, context=720, max_num_seqs=256)
            parts = dict(zip(r.breakdown.part, r.breakdown.time_ms))
            host = 1e3 * (fit.host_step_s + batch * fit.host_per_seq_s)
            out.append(f"| {name} | {tp} | {batch} | {r.summary['time_ms']:.2f} | "
                       f"{r.summary['time_ms'] - parts['overhead']:.2f} | {parts['overhead']:.3f} | {host:.2f} |")
    return ["", "## A100: the end-to-end terms carried from H100", "",
            f"`config.engine_fit`: {fit.note}.", "",
            "Decode steps at context 720 (`servesim cost`): the kernels from A100's own vLLM tables; "
            f"step_gpu_us {1e6 * fit.step_gpu_s:.0f} (H100's, scaled by A100's GEMM fixed time); the engine core's "
            f"host time {1e6 * fit.host_step_s:.0f} us + {1e6 * fit.host_per_seq_s:.0f} us per sequence (H100's; CPU) runs "
            "while the GPU executes the step before (async scheduling) and only shows where it is longer.", ""] + out


def main():
    table, s = steps_table()
    r = l40s_roofline()
    md = ["# TTFT in engine steps; the L40S codegen roofline", "",
          "Generated by `python experiments/ttft_steps.py` (data: `servesim/calibrate/data/vllm_serving`, "
          "whole runs; simulated: `experiments/results/vllm_validation_rows.csv`, split fitted).", "",
          f"On the {s['n_short']} deployments of the short-output workloads, measured TTFT = {s['a']:.2f} ms + {s['b']:.3f} x ITL "
          f"(per generated token), each within {100 * s['short_min']:+.1f}..{100 * s['short_max']:+.1f}% of the line. "
          "The reasoning deployments sit above it: " +
          ", ".join(f"{k} {100 * v:+.1f}%" for k, v in s["reasoning"].items()) + ". "
          f"Steps = (TTFT - frontend_us) / ITL with the shipped frontend_us ({s['frontend_ms']:.2f} ms):", ""]
    md += table
    md += ["", "## L40S, Qwen3-14B TP1 bf16, codegen at 10 req/s", "",
           f"Weights read per decode step {r['weight_gb']:.1f} GB; KV {r['kv_kib']:.0f} KiB per token; mean context "
           f"{r['ctx']:.0f} tokens; KV cache in 90% of the card's {r['mem_gib']:.1f} GiB less the weights: "
           f"{r['kv_tokens']:,.0f} tokens, "
           f"so at most {r['batch']:.0f} such sequences. A step at that batch moving every byte at the datasheet "
           f"bandwidth ({r['bw']:.0f} GB/s) takes {r['step_ms']:.1f} ms: {r['tok_s']:,.0f} output tokens/s at most, against "
           f"{r['need']:,.0f} that 10 req/s x 247 tokens ask for. With the simulator's KV capacity ({r['cap']:,} "
           f"tokens: vLLM's non-torch memory and activation peak taken out) the batch is {r['sim_batch']}: "
           f"{r['sim_roof_tok_s']:,.0f} tokens/s at the datasheet bandwidth, {r['sim_tok_s']:,.0f} with the "
           f"model's step ({r['sim_step_ms']:.1f} ms, A100's kernel efficiencies as fractions of the L40S peaks).", ""]
    md += a100_terms() + [""]
    (RESULTS / "ttft_steps.md").write_text("\n".join(md))
    print("\n".join(md))


if __name__ == "__main__":
    main()
