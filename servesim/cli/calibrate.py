"""`servesim calibrate` and `servesim validate`: thin click commands over servesim.calibrate.fit / .validate."""
from __future__ import annotations

import shlex
import sys

import click


def _echo_warnings(items) -> None:
    for w in items:
        click.echo(f"servesim: warning: {w}", err=True)


def _heldout_table(h: dict) -> None:
    """Medians of the held-out splits (experiments/fit_vllm_host.py), whole runs and load stages."""
    from ..calibrate.vllm_heldout import pct, spct
    click.echo("  held out (refitted without the rows predicted; experiments/results/vllm_validation.md)"
               + ("  [STALE: produced with other end-to-end values than the shipped profile]" if h["stale"] else ""))
    click.echo(f"  {'split':<10}{'rows':<13}{'n':>4}{'E2E mean':>10}{'TTFT mean':>11}{'ITL mean':>10}{'signed E2E':>12}")
    for split, v in h["splits"].items():
        for label in ("whole", "stages"):
            m = v[label]
            if not m["n"]:
                continue
            click.echo(f"  {split:<10}{'whole runs' if label == 'whole' else 'load stages':<13}{m['n']:>4}"
                       f"{pct(m['e2e_mean']):>10}{pct(m['ttft_mean']):>11}{pct(m['itl_mean']):>10}"
                       f"{spct(m['signed_e2e_mean']):>12}")
    for st, b in h["stage_bias"].items():
        click.echo(f"  signed bias, load stage {st} (LODO): E2E {spct(b['e2e_mean'])}, TTFT {spct(b['ttft_mean'])}, "
                   f"ITL {spct(b['itl_mean'])}")


def _training_heldout_table(h: dict) -> None:
    """Leave one framework / one GPU generation out (servesim.calibrate.training.held_out)."""
    click.echo("  held out (compute scales and attention factors refitted without the rows predicted):")
    click.echo(f"  {'split':<12}{'left out':<14}{'n':>5}{'median':>9}{'p90':>9}{'signed':>9}")
    for split, v in h["splits"].items():
        for fold, m in list(v["folds"].items()) + [("all", v["all"])]:
            click.echo(f"  {split:<12}{fold:<14}{m['n']:>5}{_pct(m['median']):>9}{_pct(m['p90']):>9}"
                       f"{100 * m['signed']:>+8.1f}%")


def _deployment_table(rows) -> None:
    """Per deployment and stage: measured (ms) and predicted / measured - 1 of each metric."""
    metrics = ["e2e_mean", "e2e_p90", "e2e_p99", "ttft_mean", "ttft_p90", "ttft_p99", "itl_mean"]
    click.echo("  measured ms (predicted / measured - 1):")
    click.echo(f"  {'deployment':<58}" + "".join(f"{m:>17}" for m in metrics))
    for label, part in rows.groupby("label", sort=False):
        by = part.set_index("metric")
        cells = []
        for m in metrics:
            if m in by.index and by.at[m, "predicted"] == by.at[m, "predicted"]:
                cells.append(f"{by.at[m, 'measured']:>8.1f} ({100 * by.at[m, 'rel_error']:+4.0f}%)")
            else:
                cells.append(f"{'-':>15}")
        click.echo(f"  {label[:58]:<58}" + "".join(f"{c:>17}" for c in cells))


def _pct(v) -> str:
    return "-" if v != v else f"{100 * v:.1f}%"


@click.command()
@click.option("--profile", required=True,
              help="Base hardware profile (shipped name or .toml path): the GPU the measurements were taken on.")
@click.option("--operators", multiple=True, type=click.Path(exists=True),
              help="Hardware input: per-operator timing CSV or folder (Vidur mlp.csv / all_reduce.csv / "
                   "send_recv.csv, or the native op,m,k,n,dtype,bytes,gpus,time_us format). Repeatable.")
@click.option("--training", type=click.Path(exists=True, dir_okay=False),
              help="Hardware input: training step times in the shipped training CSV layout.")
@click.option("-o", "--output", default=None, type=click.Path(dir_okay=False),
              help="New hardware profile TOML (required with --operators / --training).")
@click.option("--aiconfigurator", default=None,
              help="Engine input: AIConfigurator per-kernel tables of one GPU, a <gpu>/ folder holding "
                   "<engine>-<version>/ folders or one such folder (gemm_perf, context_attention_perf, "
                   "generation_attention_perf, custom_allreduce_perf, moe_perf; .csv or .csv.gz).")
@click.option("--serving", multiple=True, type=click.Path(exists=True),
              help="Engine input: end-to-end serving results (the shipped CSV layout or a vLLM "
                   "benchmark_serving.py JSON); fits the engine's end-to-end keys (host time per step and per "
                   "sequence, graph overlap). Repeatable.")
@click.option("--engine", default=None,
              help="Base engine profile (shipped name or .toml path) of the engine inputs [default: vllm].")
@click.option("--engine-output", default=None, type=click.Path(dir_okay=False),
              help="New engine profile TOML (required with --aiconfigurator / --serving).")
@click.option("--model", default=None, help="servesim model of the vLLM JSON runs (e.g. llama-3.1-8b).")
@click.option("--tp", default=1, show_default=True, type=int, help="Tensor parallelism of the vLLM JSON runs.")
@click.option("--hardware", default=None, help="Hardware of the vLLM JSON runs [default: the base profile].")
@click.option("--precision", default="BF16", show_default=True, help="Precision of the vLLM JSON runs (BF16, FP16, FP8).")
@click.option("--force", is_flag=True, help="Overwrite existing files or use a shipped profile or engine name.")
@click.option("--report", "report_dir", default=None, type=click.Path(file_okay=False),
              help="Fit report folder [default: <stem>-fit next to -o, else next to --engine-output].")
@click.option("--holdout/--no-holdout", default=True, show_default=True,
              help="Held-out refits (one model / layout / GPU count at a time; k-fold by shape for kernels).")
def calibrate(profile, operators, training, output, aiconfigurator, serving, engine, engine_output, model, tp,
              hardware, precision, force, report_dir, holdout):
    """Fit a hardware profile and/or an engine profile to your measurements and write new ones.

    \b
    Hardware inputs (--operators, --training) write the hardware profile -o; engine inputs
    (--aiconfigurator, --serving) write the engine profile --engine-output, a copy of --engine
    whose [hardware.<gpu>] table holds the fit (<gpu>: -o's stem when both are written, else
    --profile's name). Both may be given in one call.
    Examples:
      servesim calibrate --profile h100-sxm --operators measure_out/ -o my-h100.toml
      servesim calibrate --profile h100-sxm --operators vidur/profiling/compute/h100 \\
          --operators vidur/profiling/network/h100_dgx -o h100-vidur.toml
      servesim calibrate --profile h100-sxm --aiconfigurator aiconfigurator/h100_sxm \\
          --engine vllm --engine-output my-vllm.toml
      servesim calibrate --profile h100-sxm --serving bench.json --model llama-3.1-8b --tp 1 \\
          --engine-output my-vllm.toml
      servesim simulate --hardware h100-sxm --engine my-vllm.toml
    """
    from ..calibrate.fit import summary
    from ..workflows.calibration import run_calibration
    command = "servesim " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv[1:] else "servesim calibrate"
    result, rep = run_calibration(profile, operators=operators, training=training, output=output,
                                  aiconfigurator=aiconfigurator, serving=serving, engine=engine,
                                  engine_output=engine_output, model=model, tp=tp, hardware=hardware,
                                  precision=precision, force=force, report_dir=report_dir, holdout=holdout,
                                  command=command)
    _echo_warnings(result.warnings)
    if output:
        click.echo(f"fitted {len(result.values)} parameter(s) of {result.profile}:")
        for k, v in result.values.items():
            click.echo(f"  {k:<28}{result.base_values[k]:>12.4g} -> {v:.4g}")
    e = result.engine
    if e is not None:
        click.echo(f"fitted {len(e.values)} key(s) of engine {e.engine} [hardware.{e.table}] (base: {e.base_note}):")
        for k, v in e.values.items():
            click.echo(f"  {k:<28}{e.base_values[k]:>12.4g} -> {v:.4g}")
        for why in e.kept:
            click.echo(f"  kept: {why}")
    for note in result.notes:
        click.echo(f"  {note}")
    held = {}
    for r in result.holdout.itertuples():
        held.setdefault(r.kind, []).append(r.median_rel_err)
    click.echo(f"  {'rows':<20}{'n':>7}{'median':>9}{'p90':>9}{'held-out':>10}")
    for r in summary(result.residuals).itertuples():
        h = sorted(v for v in held.get(r.kind, []) if v == v)      # one per held-out group or k-fold run
        ho = _pct(0.5 * (h[(len(h) - 1) // 2] + h[len(h) // 2])) if h else "-"
        click.echo(f"  {r.kind:<20}{r.n:>7}{_pct(r.median_rel_err):>9}{_pct(r.p90_rel_err):>9}{ho:>10}")
    wrote = " and ".join(p for p in (result.output, result.engine_output) if p)
    click.echo(f"wrote {wrote} and {rep}/report.md")


@click.command()
@click.option("--suite", type=click.Choice(["serving", "vllm", "training", "all"]), default="all", show_default=True,
              help="serving: published TensorRT-LLM results; vllm: real vLLM 0.15.1 deployments; training.")
@click.option("--csv", "user_csv", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="Your own measurements (serving or training CSV layout) as an extra suite. Repeatable.")
@click.option("--quick", is_flag=True, help="Every 8th serving row (a deterministic sample; the vllm and training "
                                           "suites are fast and always run whole).")
@click.option("--check", is_flag=True, help="Exit 2 when a suite's median error exceeds its tolerance.")
@click.option("-o", "--output", "outdir", default=None, type=click.Path(file_okay=False),
              help="Write per-row predicted-vs-measured CSVs, summary.csv and parity.png here.")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
def validate(suite, user_csv, quick, check, outdir, fmt):
    """Compare the simulator with published (or your) serving and training measurements.

    \b
    Tolerances (median |predicted / measured - 1|): serving 15%, training 8% (and p90 20%, each
    framework x GPU group 15%); vllm, on the whole runs: E2E mean 10%, TTFT mean 15%, ITL mean 10%.
    Examples:
      servesim validate
      servesim validate --suite vllm --check
      servesim validate --suite serving --quick --check
      servesim validate --csv my_runs.csv -o validation/
    """
    from ..calibrate.validate import run_suites, summarize, write_outputs
    from ..outputs import output_dir
    from ..workflows.calibration import validate_result
    from ..progress import Bar
    with output_dir(outdir, "-o", "servesim validate") as od:
        with Bar("validate"):
            results = run_suites(suite, user_csv, quick=quick)
        if od is not None:
            od.write(lambda d: write_outputs(results, d))
    checked = validate_result(results)
    failed = list(checked.failed)
    out = [(res, s, not s["failed"]) for res, s in ((res, summarize(res)) for res in results)]
    if fmt == "json":
        click.echo(checked.to_json())
    else:
        for res, s, ok in out:
            if s.get("checked"):
                tol = ", ".join(f"{m} {_pct(v['median'])} (tolerance {_pct(v['tolerance'])})"
                                for m, v in s["checked"].items())
                click.echo(f"{res.name}: {s['n']} rows; whole-run medians: {tol} {'PASS' if ok else 'FAIL'}")
            else:
                click.echo(f"{res.name}: {s['n']} rows, median {_pct(s['median'])}, p90 {_pct(s['p90'])} "
                           f"(tolerance {_pct(res.tolerance)}) {'PASS' if ok else 'FAIL'}")
            click.echo(f"  {'gpu':<16}{'metric':<30}{'n':>5}{'median':>9}{'p90':>9}")
            for r in s["table"].itertuples():
                click.echo(f"  {r.gpu:<16}{r.metric:<30}{r.n:>5}{_pct(r.median_rel_err):>9}{_pct(r.p90_rel_err):>9}")
            if res.kind == "vllm":
                if s.get("heldout"):
                    _heldout_table(s["heldout"])
                _deployment_table(res.rows)
            if res.kind == "training" and s.get("heldout"):
                _training_heldout_table(s["heldout"])
        if outdir:
            click.echo(f"wrote per-row tables, summary.csv and parity.png to {outdir}")
    if check and failed:
        click.echo("servesim: error: validation failed: " + "; ".join(failed), err=True)
        sys.exit(2)
