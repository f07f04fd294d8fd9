"""Build the report directory: run every section through the library, then write report.md.

Sections and the library function behind each:

- cheapest configurations meeting the SLO: `planning.plan.run_plan` at the target rate, once per
  hardware (each hardware's cheapest deployment, checked on a second seed, with its simulated
  capacity headroom); the cheapest of these is the report's answer;
- latency / throughput vs load: `planning.sweep.run_sweep` on one replica of each hardware's
  cheapest layout meeting the SLO (the same family for every hardware: its own cheapest; the
  smallest TP in 1, 2, 4, 8 whose weights and a KV cache fit where nothing meets the SLO); figures
  from `planning.figures.sweep_figures`;
- bottleneck of a typical iteration: `costmodel.build_replica(...).iteration(Batch(...))` at the
  workload's mean prompt and output lengths, for three batches (a lone prefill, a decode batch and
  the steady-state mix of decodes plus the prefill tokens that keep them in flight, B / osl new
  requests per iteration), with B the mean batch size simulated at the target rate, on the same
  layouts as the sweep;
- training vs serving cost: `training.compare.compare_costs`, serving priced on each hardware's
  cheapest deployment meeting the SLO (the plan above);
- validation status: `report.validation.profile_status` (own fit or `efficiency_from`, quoted errors).

Default sweep rates: 6 geometric rates from 0.15 to 1.2 x the largest per-replica capacity bound
(`planning.plan.layout_bounds`) among the hardware candidates, rounded to 3 significant figures.
"""
from __future__ import annotations

import html
import re
import shlex
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import ConfigError, InfeasibleError
from ..planning.capacity import capacity_sentence

SERVE_TPS = (1, 2, 4, 8)
DEFAULT_SLO = "ttft_p99=1s,tpot_p99=60ms"


@dataclass(frozen=True)
class ReportSpec:
    model: str = "llama-3.1-8b"
    hardware: tuple = ("h100-sxm",)
    workload: str = "chat"
    rates: tuple | None = None        # sweep rates, req/s; None = from the capacity bound
    rate: float | None = None         # target load for plan / breakdown / compare; None = workload default
    slo: object = DEFAULT_SLO         # a servesim.slo.Slo, or its text
    dtype: str = "bf16"
    num_requests: int = 1000
    seed: int = 0
    train_tokens: float = 15e12
    train_gpus: int = 1024
    max_gpus: int = 64


def regenerate_command(spec: ReportSpec, outdir: str) -> str:
    """The `servesim report` command line that rebuilds this report (every option explicit)."""
    parts = ["servesim", "report", "--model", spec.model, "--hardware", ",".join(spec.hardware),
             "--workload", spec.workload]
    if spec.rates is not None:
        parts += ["--rates", ",".join(f"{r:g}" for r in spec.rates)]
    if spec.rate is not None:
        parts += ["--rate", f"{spec.rate:g}"]
    parts += ["--slo", str(spec.slo), "--dtype", spec.dtype, "--num-requests", str(spec.num_requests),
              "--seed", str(spec.seed), "--train-tokens", f"{spec.train_tokens:g}",
              "--train-gpus", str(spec.train_gpus), "--max-gpus", str(spec.max_gpus), "-o", str(outdir)]
    return " ".join(shlex.quote(p) for p in parts)


# ---------------------------------------------------------------- scenario pieces
def _base(spec: ReportSpec):
    from ..api import SimConfig
    return SimConfig(model=spec.model, workload=spec.workload, dtype=spec.dtype, slo=spec.slo,
                     num_requests=spec.num_requests, seed=spec.seed)


def _replica(cfg):
    """(ReplicaCost, resolved SimConfig) for one replica of `cfg`; InfeasibleError if it does not fit."""
    from ..api import replica_of, resolve
    cfg, model, hw, _ = resolve(cfg)
    rc = replica_of(cfg, model, hw)
    return rc, cfg


def serving_tp(base, hardware: str) -> int:
    """Smallest TP whose weights and a KV cache fit (checked by a one-request simulation)."""
    from ..api import simulate
    last = None
    for tp in SERVE_TPS:
        try:
            simulate(replace(base, hardware=hardware, tp=tp, num_requests=1, rate=1.0, slo=None))
            return tp
        except InfeasibleError as e:
            last = e
    raise InfeasibleError(f"--hardware {hardware}: {base.model} {base.dtype} fits at none of TP "
                          f"{', '.join(map(str, SERVE_TPS))} ({last})")


def mean_lengths(base) -> tuple[float, float]:
    from ..config import load_model
    from ..workload import build_requests, load_workload
    reqs = build_requests(load_workload(base.workload), min(base.num_requests, 4000), base.seed, rate=1.0,
                          max_len=load_model(base.model).max_context)
    return float(np.mean(reqs.prompt)), float(np.mean(reqs.output))


def default_rates(base, tps: dict, isl_osl) -> list[float]:
    from ..planning.plan import layout_bounds
    prompt = np.array([isl_osl[0]])
    output = np.array([isl_osl[1]])
    caps = []
    for hw, tp in tps.items():
        b = layout_bounds({"hardware": hw, "tp": tp}, base, prompt, output, base.slo, 0.0)
        if b.get("capacity_rps") and np.isfinite(b["capacity_rps"]):
            caps.append(b["capacity_rps"])
    cap = max(caps) if caps else 1.0
    return [float(f"{r:.3g}") for r in np.geomspace(0.15 * cap, 1.2 * cap, 6)]


# ---------------------------------------------------------------- sections
def sweep_section(base, tps: dict, rates) -> pd.DataFrame:
    from ..planning.sweep import run_sweep
    frames = []
    for hw, tp in tps.items():
        res = run_sweep(replace(base, hardware=hw, tp=tp), [], list(rates))
        if res.first_error:
            raise ConfigError(res.first_error)
        frames.append(res.points)
    df = pd.concat(frames, ignore_index=True)
    df["point"] = range(len(df))
    return df


def breakdown_section(base, tps: dict, rate: float, isl: float, osl: float) -> tuple[pd.DataFrame, dict]:
    from ..api import simulate
    from ..costmodel import Batch
    rows, batch_sizes = [], {}
    for hw, tp in tps.items():
        cfg = replace(base, hardware=hw, tp=tp, rate=rate)
        rc, filled = _replica(cfg)
        s = simulate(cfg).summary
        b = max(1, int(round(s["utilization"]["mean_batch_size"] or 1)))
        batch_sizes[hw] = f"{b}" + (" (saturated: one replica cannot carry this load)" if s["saturated"] else "")
        p_tok, ctx = max(1, int(round(isl))), int(round(isl + osl / 2.0))
        mix_tok = max(1, min(int(round(b * isl / max(osl, 1.0))), filled.max_num_batched_tokens))
        batches = {f"prefill of one {p_tok}-token prompt": Batch(prefill=((p_tok, 0),)),
                   f"decode of {b} sequences at context {ctx}": Batch(decode=(ctx,) * b),
                   f"steady state: {b} decodes + {mix_tok} prefill tokens": Batch(prefill=((mix_tok, 0),),
                                                                                   decode=(ctx,) * b)}
        for label, batch in batches.items():
            br = rc.iteration(batch)
            row = {"hardware": hw, "tp": tp, "batch": label, "time_ms": br.time_s * 1e3}
            row.update({f"{k}_ms": v * 1e3 for k, v in br.parts_s.items()})
            row["gemm_bound"] = br.bound.get("gemm", "")
            row["bottleneck"] = br.bottleneck
            rows.append(row)
    return pd.DataFrame(rows), batch_sizes


def plan_section(base, hardware, rate: float, max_gpus: int, dtype: str) -> dict:
    """{hardware: PlanResult}: each hardware's cheapest deployment meeting the SLO at `rate`."""
    from ..planning.plan import PlanSpec, run_plan
    return {h: run_plan(PlanSpec(base=replace(base, rate=rate), hardware=(h,), dtypes=(dtype,), max_gpus=max_gpus))
            for h in hardware}


def cheapest(plans: dict) -> dict | None:
    """The cheapest of the hardware's best deployments (plan's order: $/h, then fewer GPUs)."""
    bests = [p.best for p in plans.values() if p.best]
    return min(bests, key=lambda b: (b["usd_per_hour"], b["num_gpus"])) if bests else None


def sweep_layouts(base, plans: dict) -> tuple[dict, dict]:
    """({hardware: TP}, {hardware: why}): each hardware's cheapest layout meeting the SLO, else the
    smallest TP that fits."""
    from ..training.compare import serving_config
    tps, why = {}, {}
    for h, p in plans.items():
        if p.best:
            tps[h] = p.best["tp"]
            why[h] = f"the layout of its cheapest deployment meeting the SLO, {serving_config(p.best)}"
        else:
            tps[h] = serving_tp(base, h)
            why[h] = "no deployment meets the SLO, so the smallest TP whose weights and a KV cache fit"
    return tps, why


def compare_section(spec: ReportSpec, plans: dict) -> tuple[pd.DataFrame | None, str]:
    from ..training import TrainLayout
    from ..training.compare import compare_costs, serving_row
    serving = {h: serving_row(p.best, p.why_not) for h, p in plans.items()}
    try:
        df = compare_costs(spec.model, list(spec.hardware), spec.train_gpus, spec.train_tokens,
                           TrainLayout(seq_len=8192, global_batch=1024), serving=serving)
    except InfeasibleError as e:
        return None, str(e)
    return df, ""


# ---------------------------------------------------------------- markdown helpers
_MD_SPECIAL = re.compile(r"([\\`*_\[\]|~])")


def md_text(v) -> str:
    """Text from options or user files (names, descriptions, sources, messages) for report.md: one
    line, HTML escaped (&, <, >) and markdown escaped (emphasis, code, links, table pipes), so it
    reads as the text it is and cannot add markup, links, images or HTML to the report."""
    return _MD_SPECIAL.sub(r"\\\1", html.escape(" ".join(str(v).split()), quote=False))


def md_code(v) -> str:
    """`v` as one inline code span, fenced by more backticks than it contains (CommonMark)."""
    s = " ".join(str(v).split())
    fence = "`" * (max((len(m) for m in re.findall(r"`+", s)), default=0) + 1)
    pad = " " if len(fence) > 1 else ""
    return f"{fence}{pad}{s}{pad}{fence}"


def _fmt(v, spec="{:.3g}"):
    if v is None or (isinstance(v, float) and not np.isfinite(v)):
        return "-"
    if isinstance(v, (bool, np.bool_)):
        return "yes" if v else "no"
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    if isinstance(v, (float, np.floating)):
        return spec.format(float(v))
    return md_text(v)


def md_table(df: pd.DataFrame, columns: dict) -> str:
    """columns: {column: header}; floats to 3 significant figures."""
    cols = [c for c in columns if c in df.columns]
    lines = ["| " + " | ".join(columns[c] for c in cols) + " |", "|" + "---|" * len(cols)]
    for _, r in df.iterrows():
        lines.append("| " + " | ".join(_fmt(r[c]) for c in cols) + " |")
    return "\n".join(lines)


# ---------------------------------------------------------------- the report
def build_report(spec: ReportSpec, outdir, command: str | None = None, progress=None, shown_as=None) -> Path:
    """Run every section and write `outdir`/report.md, its PNGs and CSVs. Returns the report path.
    ``shown_as``: the folder the regenerate command names (when `outdir` is a staging folder)."""
    from ..version import __version__
    from ..config import load_hardware, load_model
    from ..options import default_rate
    from ..planning.figures import pareto_figure, sweep_figures
    from ..slo import parse_slo
    from ..workload import load_workload
    from . import figures
    from .validation import profile_status

    say = progress or (lambda msg: None)
    t0 = time.perf_counter()
    if not spec.hardware:
        raise ConfigError("--hardware: give at least one profile, e.g. --hardware h100-sxm,h200-sxm")
    load_model(spec.model)
    for h in spec.hardware:
        load_hardware(h)
    workload = load_workload(spec.workload)
    slo = parse_slo(spec.slo)       # the edge: a string or an already parsed Slo
    spec = replace(spec, slo=slo)
    if not slo:
        raise ConfigError(f"--slo: the report needs at least one target, e.g. --slo {DEFAULT_SLO}")
    if spec.num_requests < 1:
        raise ConfigError(f"--num-requests must be >= 1, got {spec.num_requests}")
    if spec.rate is not None and spec.rate <= 0:
        raise ConfigError(f"--rate must be > 0 req/s, got {spec.rate:g}")
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    base = _base(spec)
    isl, osl = mean_lengths(base)
    rate = spec.rate if spec.rate is not None else default_rate(workload)
    say("plan")
    plans = plan_section(base, spec.hardware, rate, spec.max_gpus, spec.dtype)
    best = cheapest(plans)
    tps, tp_why = sweep_layouts(base, plans)
    rates = list(spec.rates) if spec.rates else default_rates(base, tps, (isl, osl))
    if command is None:
        command = regenerate_command(replace(spec, rates=tuple(rates), rate=rate), str(shown_as or outdir))

    say("sweep")
    sweep = sweep_section(base, tps, rates)
    sweep.to_csv(out / "sweep.csv", index=False)
    sweep_pngs = [p.name for p in sweep_figures(sweep, ["hardware", "tp"], slo, out)]
    say("breakdown")
    brk, bsizes = breakdown_section(base, tps, rate, isl, osl)
    brk.to_csv(out / "breakdown.csv", index=False)
    brk_png = figures.breakdown_figure(brk, out / "breakdown.png").name
    candidates = sorted((c for p in plans.values() for c in p.summary["candidates"]), key=_candidate_order)
    n_plan_sims = sum(p.simulations for p in plans.values())
    cand = pd.DataFrame([{k: v for k, v in c.items() if k not in ("metrics", "cost_split", "checks")}
                         for c in candidates])
    cand.to_csv(out / "plan_candidates.csv", index=False)
    pareto = [p.name for p in pareto_figure(cand, out)] if "ttft_ms_p99" in cand.columns else []
    say("compare")
    cmp_df, cmp_err = compare_section(spec, plans)
    cmp_png = None
    if cmp_df is not None:
        cmp_df.to_csv(out / "compare.csv", index=False)
        cmp_png = figures.compare_figure(cmp_df, out / "compare.png").name
    say("validation")
    status = [profile_status(h) for h in spec.hardware]
    elapsed = time.perf_counter() - t0

    md = []
    md.append(f"# servesim report: {md_text(spec.model)} on {md_text(', '.join(spec.hardware))}, "
              f"{md_code(spec.workload)} workload\n")
    md.append("Regenerate this report (every number below is produced by this command):\n")
    fence = "`" * max(3, max((len(m) for m in re.findall(r"`+", command)), default=0) + 1)
    md.append(f"{fence}bash\n{command}\n{fence}\n")
    md.append(f"servesim {__version__}; built in {elapsed:.1f} s. Tables behind the figures: `sweep.csv`, "
              "`breakdown.csv`, `plan_candidates.csv`, `compare.csv`.\n")
    md.append("## Scenario\n")
    md.append(f"- model {md_code(spec.model)}, weights {md_text(spec.dtype)}, engine preset `vllm`\n"
              f"- workload {md_code(spec.workload)} ({md_text(workload.description)}); mean prompt {isl:.0f} tokens, "
              f"mean output {osl:.0f} tokens (over {min(spec.num_requests, 4000)} sampled requests, seed {spec.seed})\n"
              f"- SLO {md_code(str(spec.slo))}; target load {rate:g} req/s "
              f"({'--rate' if spec.rate is not None else 'the workload default'})\n"
              f"- serving layout per hardware for the sweep and the iteration breakdown: "
              + "; ".join(f"{md_text(h)} TP={t} ({md_text(tp_why[h])})" for h, t in tps.items()) + "\n"
              f"- {spec.num_requests} Poisson requests per simulation, seed {spec.seed}\n")

    md.append("## Latency and throughput vs load\n")
    md.append("One replica per hardware, each at the TP of its own cheapest deployment meeting the SLO "
              "(" + ", ".join(f"{md_text(h)} TP={t}" for h, t in tps.items()) + "), swept over "
              f"{', '.join(f'{r:g}' for r in rates)} req/s"
              + ("" if spec.rates else " (default: 0.15 to 1.2 x the largest capacity bound of one replica)")
              + ". Red dashed lines: the SLO targets; circled: the knee (the last rate whose TTFT p99 is "
              "within 2x its low-load value, unsaturated).\n")
    for p in sweep_pngs:
        md.append(f"![{p}]({p})\n")
    sw = sweep.copy()
    md.append(md_table(sw, {"hardware": "hardware", "tp": "TP", "rate": "rate (req/s)",
                            "ttft_ms_p50": "TTFT p50 (ms)", "ttft_ms_p99": "TTFT p99 (ms)",
                            "tpot_ms_p50": "TPOT p50 (ms)", "tpot_ms_p99": "TPOT p99 (ms)",
                            "throughput_output_tokens_per_s": "output tok/s",
                            "cost_usd_per_million_output_tokens": "$/M output",
                            "slo_met": "SLO met", "saturated": "saturated"}) + "\n")
    md.append(_sweep_findings(sweep) + "\n")

    md.append("## Where the time goes in one iteration\n")
    md.append(f"Cost model (`servesim cost`), one replica, workload mean lengths; B = the mean batch size "
              f"simulated at {rate:g} req/s (" + ", ".join(f"{md_text(h)}: {b}" for h, b in bsizes.items()) + "). "
              "The steady-state row adds the prefill tokens of the B / osl requests that arrive per "
              "iteration, as one chunk. `bottleneck` = the largest part, with whether it is compute- or "
              "memory-bound.\n")
    md.append(f"![{brk_png}]({brk_png})\n")
    md.append(md_table(brk, {"hardware": "hardware", "tp": "TP", "batch": "batch", "time_ms": "time (ms)",
                             "gemm_ms": "GEMM", "attention_ms": "attention", "elementwise_ms": "elementwise",
                             "communication_ms": "communication", "overhead_ms": "overhead",
                             "gemm_bound": "GEMM bound", "bottleneck": "bottleneck"}) + "\n")

    md.append("## Cheapest configurations meeting the SLO\n")
    md.append(f"`servesim plan` at {rate:g} req/s on each of {md_text(', '.join(spec.hardware))}, {md_text(spec.dtype)}, "
              f"TP 1/2/4/8, up to {spec.max_gpus} GPUs, 10% headroom under each target; {n_plan_sims} simulations.\n")
    for h, p in plans.items():
        md.append(f"- {md_text(h)}: " + (_best_line(p.best) if p.best else f"nothing meets the SLO: {md_text(p.why_not)}"))
    md.append("")
    if best:
        b = best
        md.append(f"**Cheapest:** {md_text(b['hardware'])} TP={b['tp']} x {_n(b['replicas'], 'replica')} ({_n(b['num_gpus'], 'GPU')}), "
                  f"${b['usd_per_hour']:.2f}/h, ${b['usd_per_million_output_tokens']:.3g} per million output "
                  f"tokens, TTFT p99 {b['metrics']['ttft_ms']['p99']:.0f} ms, TPOT p99 "
                  f"{b['metrics']['tpot_ms']['p99']:.1f} ms; it also meets the SLO with seed "
                  f"{b['checks']['other_seed']['seed']}" + (
                      f", and {_n(b['replicas'] - 1, 'replica')} do not" if "one_replica_fewer" in b["checks"] else "")
                  + f". {capacity_sentence(b)}\n")
    else:
        md.append("**No configuration meets the SLO** on any of the hardware (reasons above).\n")
    meets = cand[cand.status == "meets_slo"] if "status" in cand.columns else cand.iloc[:0]
    if len(meets):
        md.append(md_table(meets.head(8), {"hardware": "hardware", "dtype": "dtype", "tp": "TP",
                                           "replicas": "replicas", "num_gpus": "GPUs", "usd_per_hour": "$/h",
                                           "usd_per_million_output_tokens": "$/M output",
                                           "ttft_ms_p99": "TTFT p99 (ms)", "tpot_ms_p99": "TPOT p99 (ms)",
                                           "headroom": "SLO slack"}) + "\n")
    rest = cand[cand.status != "meets_slo"] if "status" in cand.columns else cand.iloc[:0]
    if len(rest):
        md.append("Layouts that did not qualify:\n")
        md.append(md_table(rest, {"hardware": "hardware", "tp": "TP", "status": "status", "reason": "reason"}) + "\n")
    for p in pareto:
        md.append(f"![{p}]({p})\n")

    md.append("## Training vs serving cost\n")
    if cmp_df is None:
        md.append(f"Not computed: {md_text(cmp_err)}\n")
    else:
        md.append(f"Training on {spec.train_tokens:.3g} tokens with {spec.train_gpus} GPUs (fastest layout "
                  f"that fits, bf16, sequence 8192, global batch 1024) against serving at {rate:g} req/s on "
                  "each hardware's cheapest deployment meeting the SLO (the plan above; `servesim compare` "
                  "prices serving the same way), named in the `serving deployment` column. Break-even: the "
                  "served output tokens whose serving spend equals the training spend.\n")
        md.append(f"![{cmp_png}]({cmp_png})\n")
        md.append(md_table(cmp_df, {"hardware": "hardware", "train_layout": "training layout", "train_mfu": "MFU",
                                    "train_days": "days", "train_gpu_hours": "GPU-hours", "train_usd": "training $",
                                    "serve_config": "serving deployment", "serve_usd_per_m_output": "serving $/M output",
                                    "serve_capacity_headroom": "capacity headroom",
                                    "break_even_output_tokens": "break-even output tokens"}) + "\n")

    md += validation_md(status)
    path = out / "report.md"
    path.write_text("\n".join(md))
    return path


def validation_md(status: list[dict]) -> list[str]:
    """The report's validation section: one part per profile (`validation.profile_status`), each
    calibrated profile's error table once, a borrowing profile pointing to it."""
    md = []
    md.append("## Validation status of the profiles used\n")
    md.append("How far to trust the numbers above. A profile either carries its own fitted efficiencies "
              "or borrows them (`efficiency_from`) from the closest calibrated architecture, in which case "
              "its predictions are extrapolations (its own peaks, bandwidths and links, another chip's "
              "efficiencies). Errors are |predicted / measured - 1|, quoted from the calibration reports "
              "(regenerate them with the scripts in `experiments/`, see `experiments/README.md`).\n")
    shown = set()     # each calibrated profile's error table once: a borrowing profile points to it
    for s in sorted(status, key=lambda s: not s["own_fit"]):     # measured profiles first, then borrowers
        kind = "own fit" if s["own_fit"] else f"borrowed from {md_code(s['calibrated_on'])} (no measurements of " \
                                              f"{md_text(s['hardware'])} itself)"
        md.append(f"### {md_text(s['hardware'])}: {kind}\n")
        md.append(f"Fit source: {md_text(s['fit_source'])}\n")
        md.append(f"Engine {md_code(s['engine'])} on it: {md_text(s['engine_fit'])}. Its table's source: "
                  f"{md_text(s['engine_fit_source'])}\n")
        if s["errors"] and s["calibrated_on"] in shown and not s["own_fit"]:
            md.append(f"Its errors are those of {md_code(s['calibrated_on'])}, above: {md_text(s['hardware'])} "
                      "has no measurements of its own, and how far the borrowed efficiencies carry to it is "
                      "not measured.\n")
        elif s["errors"]:
            shown.add(s["calibrated_on"])
            df = pd.DataFrame(s["errors"])
            md.append(f"Errors of {md_code(s['calibrated_on'])} (training rows are for all GPUs together):\n")
            md.append(md_table(df, {"report": "check", "what": "rows", "n": "n", "median": "median error",
                                    "p90": "p90 error", "file": "source"}) + "\n")
        else:
            md.append(f"No measurements of {md_code(s['calibrated_on'])} in the calibration reports.\n")
    return md


def _candidate_order(c):
    """Plan's order of candidates: status, then $/h, GPUs and SLO headroom."""
    from ..planning.plan import _cost_order
    order = {"meets_slo": 0, "misses_slo": 1, "pruned": 2, "over_budget": 3, "infeasible": 4, "error": 5}
    return (order.get(c["status"], 9),) + _cost_order(c)


def _best_line(b: dict) -> str:
    from ..training.compare import serving_config
    return (f"{md_text(serving_config(b))}, ${b['usd_per_hour']:.2f}/h, ${b['usd_per_million_output_tokens']:.3g} "
            f"per million output tokens. {capacity_sentence(b)}")


def _n(k: int, word: str) -> str:
    return f"{k} {word}" + ("" if k == 1 else "s")


def _sweep_findings(df: pd.DataFrame) -> str:
    """One sentence per hardware: the highest swept rate that meets the SLO unsaturated."""
    lines = []
    for (hw, tp), g in df[df.status == "ok"].groupby(["hardware", "tp"], sort=False):
        ok = g[(g.slo_met.astype(bool)) & (~g.saturated.astype(bool))]
        if len(ok):
            r = ok.sort_values("rate").iloc[-1]
            lines.append(f"- {md_text(hw)} TP={tp}: highest swept rate meeting the SLO {r.rate:g} req/s "
                         f"({r.throughput_output_tokens_per_s:.0f} output tok/s, "
                         f"${r.cost_usd_per_million_output_tokens:.3g}/M output tokens).")
        else:
            lines.append(f"- {md_text(hw)} TP={tp}: no swept rate meets the SLO on one replica.")
    return "\n".join(lines)
