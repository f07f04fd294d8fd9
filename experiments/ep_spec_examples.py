"""The README's expert-parallel and speculative-decoding cost examples (servesim cost), as a table.

    python experiments/ep_spec_examples.py      # prints and writes experiments/results/ep_spec_examples.md
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import servesim  # noqa: E402

OUT = REPO / "experiments" / "results" / "ep_spec_examples.md"
DSV3 = dict(model="deepseek-v3", hardware="h200-sxm", dtype="fp8")
LAYOUTS = [("TP 8", dict(tp=8)), ("TP 8, EP 8", dict(tp=8, ep=8)), ("DP attention 8, EP 8", dict(tp=1, attn_dp=8, ep=8)),
           ("DP attention 8, EP 8, balanced", dict(tp=1, attn_dp=8, ep=8, expert_skew=0.0))]
SPEC = [("llama-3.1-70b TP 4, h100-sxm", dict(model="llama-3.1-70b", tp=4),
         "draft:k=4:acceptance=0.8:draft=llama-3.1-8b"),
        ("deepseek-v3 fp8 TP 8, h200-sxm", dict(DSV3, tp=8), "mtp:k=1"),
        ("deepseek-v3 fp8 TP 8, h200-sxm", dict(DSV3, tp=8), "mtp:k=3:acceptance_length=2.4")]


# the README's DeepSeek plans (servesim plan --model deepseek-v3 ...)
PLANS = [("H200 fp8, chat at 4 req/s, TTFT p99 2 s, TPOT p99 60 ms",
          dict(model="deepseek-v3", hardware=("h200-sxm",), dtype="fp8", tp=(1, 8), attn_dp=(1, 8), rate=4,
               slo="ttft_p99=2s,tpot_p99=60ms")),
         ("B200 fp4, 1,024 in / 1,024 out at 8 req/s, TTFT p99 3 s, TPOT p99 50 ms",
          dict(model="deepseek-v3", hardware=("b200",), dtype="fp4", tp=(1, 8), attn_dp=(1, 8), isl=1024, osl=1024,
               rate=8, slo="ttft_p99=3s,tpot_p99=50ms"))]


def main() -> int:
    lines = ["# Expert parallelism and speculative decoding: servesim cost examples", "",
             f"`python experiments/ep_spec_examples.py`, {time.strftime('%Y-%m-%d')}.", "",
             "DeepSeek-V3 fp8 on 8 H200, one decode step of 512 sequences at context 2,048:", "",
             "| layout | step ms | attention ms | routed experts ms | dispatch + combine ms | communication ms |",
             "|---|---:|---:|---:|---:|---:|"]
    for name, kw in LAYOUTS:
        s = servesim.cost(**{**DSV3, **kw}, decode_seqs=512, context=2048).summary
        lines.append(f"| {name} | {s['time_ms']:.1f} | {s['parts_ms']['attention']:.1f} | {s['moe']['experts_ms']:.1f} | "
                     f"{s['moe']['alltoall_ms']:.1f} | {s['parts_ms']['communication']:.1f} |")
    lines += ["", "Speculative decoding at batch 1, context 1,024:", "",
              "| deployment | method | draft ms | verify ms | tokens per step | ms per token | plain ms | speedup |",
              "|---|---|---:|---:|---:|---:|---:|---:|"]
    for name, kw, spec in SPEC:
        sp = servesim.cost(**kw, decode_seqs=1, context=1024, speculative=spec).summary["speculative"]
        lines.append(f"| {name} | `{spec}` | {sp['draft_ms']:.1f} | {sp['verify_ms']:.1f} | {sp['expected_tokens']:.2f} | "
                     f"{sp['per_token_ms']:.1f} | {sp['plain_step_ms']:.1f} | {sp['speedup']:.2f}x |")
    lines += ["", "`servesim plan` for DeepSeek-V3, searching TP 1/8 and DP attention 1/8 (EP over the whole replica "
              "or none); every candidate meeting the SLO, the chosen one first:", "",
              "| plan | layout | replicas | GPUs | $/h | TTFT p99 ms | TPOT p99 ms | max sustainable req/s |",
              "|---|---|---:|---:|---:|---:|---:|---:|"]
    for name, kw in PLANS:
        res = servesim.plan(**kw)
        best = res.best
        c = res.candidates
        for i, r in c[c["status"] == "meets_slo"].iterrows():
            lay = f"TP {int(r['tp'])}" + (f", EP {int(r['ep'])}" if r["ep"] != 1 else "") + \
                (f", DP attention {int(r['attn_dp'])}" if r["attn_dp"] != 1 else "")
            chosen = all(r[k] == best[k] for k in ("tp", "ep", "attn_dp", "replicas"))
            cap = f"{best['max_sustainable_rate']:.1f}" if chosen and best.get("max_sustainable_rate") else "-"
            lines.append(f"| {name} | {lay}{' (chosen)' if chosen else ''} | {int(r['replicas'])} | {int(r['num_gpus'])} | "
                         f"{r['usd_per_hour']:.2f} | {r['ttft_ms_p99']:.1f} | {r['tpot_ms_p99']:.1f} | {cap} |")
    text = "\n".join(lines) + "\n"
    print(text)
    OUT.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
