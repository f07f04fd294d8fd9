"""DeepSeek-V3 serving layouts: TP-only vs wide expert parallelism with DP attention, co-located and
prefill/decode, as throughput per GPU against tokens/s per user over a concurrency sweep (the form in
which public serving benchmarks report such deployments), and where a decode step's time goes.

    python experiments/deepseek_ep.py            # writes experiments/results/deepseek_ep.md
    python experiments/deepseek_ep.py --quick    # fewer concurrency points

Each point is `servesim simulate` with a closed loop of C clients (fixed 1,024-token prompts and
outputs), the same as `servesim sweep --grid concurrency=4,16,...`; tokens/s per user = 1000 / mean
TPOT, throughput per GPU = output tokens/s / GPUs. Where the time goes: `servesim cost` at the run's
mean decode batch and mean context (attention, routed experts, dispatch + combine, the rest).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import servesim  # noqa: E402

OUT = REPO / "experiments" / "results" / "deepseek_ep.md"
FIG = OUT.with_suffix(".png")
ISL = OSL = 1024
BASE = dict(model="deepseek-v3", isl=ISL, osl=OSL, seed=0)
LAYOUTS = [
    ("H200 fp8, TP 8", dict(hardware="h200-sxm", dtype="fp8", tp=8)),
    ("H200 fp8, DP attention 8 + EP 8", dict(hardware="h200-sxm", dtype="fp8", tp=1, attn_dp=8, ep=8)),
    ("B200 fp4, TP 8", dict(hardware="b200", dtype="fp4", tp=8)),
    ("B200 fp4, DP attention 8 + EP 8", dict(hardware="b200", dtype="fp4", tp=1, attn_dp=8, ep=8)),
    ("GB200 fp4, DP attention 32 + EP 32", dict(hardware="gb200-nvl72", dtype="fp4", tp=1, attn_dp=32, ep=32)),
    # with pools the batch limits are the deployment's, per replica: 8 DP ranks x 256 for the decode pool
    ("B200 fp4, P:D TP 8 prefill + DP 8/EP 8 decode",
     dict(dtype="fp4", pool=("b200:tp8:x1:prefill", "b200:tp1:ep8:dp8:x1:decode"), max_num_seqs=2048)),
]
CONCURRENCY = (4, 16, 64, 256, 1024, 4096)
QUICK = (16, 256, 2048)


def where(kw: dict, batch: float) -> dict:
    """The cost model's decode step at the run's mean batch and context (a pool layout: its decode pool)."""
    if "pool" in kw:
        hw, tp, ep, dp = "b200", 1, 8, 8
    else:
        hw, tp, ep, dp = kw["hardware"], kw["tp"], kw.get("ep", 1), kw.get("attn_dp", 1)
    s = servesim.cost(model="deepseek-v3", hardware=hw, dtype=kw["dtype"], tp=tp, ep=ep, attn_dp=dp,
                      decode_seqs=max(1, int(round(batch))), context=ISL + OSL // 2, max_num_seqs=256).summary
    parts, moe = s["parts_ms"], s["moe"]
    total = s["time_ms"]
    rest = total - parts["attention"] - moe["experts_ms"] - moe["alltoall_ms"]
    return {"step_ms": total, "attention": parts["attention"] / total, "experts": moe["experts_ms"] / total,
            "alltoall": moe["alltoall_ms"] / total, "rest": rest / total}


def figure(curves: dict) -> None:
    """Output tokens/s per GPU against tokens/s per user, one line per layout (C rising to the left)."""
    from servesim.figures import pyplot, save
    plt, _ = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for name, pts in curves.items():
        x, y = zip(*pts)
        ax.plot(x, y, marker="o", label=name)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("tokens/s per user (1000 / mean TPOT)")
    ax.set_ylabel("output tokens/s per GPU")
    ax.set_title(f"DeepSeek-V3, closed loop, {ISL}-token prompts and outputs (servesim)")
    ax.legend(fontsize=7)
    save(fig, FIG)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args(argv)
    conc = QUICK if a.quick else CONCURRENCY
    t0 = time.time()
    lines = ["# DeepSeek-V3: TP-only vs wide expert parallelism", "",
             f"`python experiments/deepseek_ep.py` ({time.strftime('%Y-%m-%d')}): closed loop of C clients, "
             f"{ISL}-token prompts and outputs, vLLM profile, expert routing AIConfigurator's power law 1.01.", "",
             "| layout | GPUs | C | tok/s/user | output tok/s/GPU | TPOT ms | TTFT p50 ms | mean batch | step ms "
             "| attention | experts | all-to-all | rest |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    curves = {}
    for name, kw in LAYOUTS:
        for c in conc:
            s = servesim.simulate(**BASE, **kw, concurrency=c, num_requests=max(64, 2 * c)).summary
            gpus = s["config"]["num_gpus"]
            tpot = s["tpot_ms"]["mean"]
            batch = s["utilization"]["mean_batch_size"]
            if "pools" in s:
                dec = [p for p in s["pools"] if p["role"] == "decode"][0]
                batch = dec["mean_batch_size"]
            w = where(kw, batch)
            lines.append(f"| {name} | {gpus} | {c} | {1000.0 / tpot:.1f} | "
                         f"{s['throughput']['output_tokens_per_s'] / gpus:.0f} | {tpot:.1f} | "
                         f"{s['ttft_ms']['p50']:.0f} | {batch:.0f} | {w['step_ms']:.1f} | {100 * w['attention']:.0f}% | "
                         f"{100 * w['experts']:.0f}% | {100 * w['alltoall']:.0f}% | {100 * w['rest']:.0f}% |")
            curves.setdefault(name, []).append((1000.0 / tpot, s["throughput"]["output_tokens_per_s"] / gpus))
            print(lines[-1], flush=True)
    figure(curves)
    lines += ["", f"{time.time() - t0:.0f} s on this machine; the curves: `deepseek_ep.png`."]
    text = "\n".join(lines) + "\n"
    OUT.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
