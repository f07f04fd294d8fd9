"""`servesim sweep` and `servesim plan`: thin click commands over `servesim.workflows`
(capacity: the functions behind `servesim.sweep` and `find_max_rate`; planner: `servesim.plan`)."""
from __future__ import annotations

import click

from ..progress import Bar
from .options import simulate_options as _simulate_options


def _replace_option(f, name: str, option):
    """Swap one option that `_simulate_options` added for a command-specific one."""
    f.__click_params__ = [p for p in f.__click_params__ if p.name != name]
    return option(f)


def _price_option(f):
    return _replace_option(f, "price", click.option(
        "--price", "prices", multiple=True,
        help="$ per GPU-hour: USD for every hardware, or HARDWARE=USD (repeatable / comma list)."))


def _backend_options(f):
    f = click.option("--dask-timeout", default=None, type=float, metavar="SECONDS",
                     help="With --dask-scheduler: give up, keeping the finished points, when the scheduler "
                          "is unreachable or no worker is connected for this long (default 60).")(f)
    f = click.option("--dask-scheduler", default=None, metavar="tcp://HOST:PORT",
                     help="Run points on this Dask cluster instead of the local process pool.")(f)
    f = click.option("--workers", default=None, type=int, help="Local worker processes (default: every core).")(f)
    return f


def _base_config(kw):
    from .options import sim_config
    return sim_config(kw)


SWEEP_COLUMNS = [("rate", "rate", "{:.3g}"), ("status", "status", "{}"), ("ttft_ms_p99", "TTFT p99", "{:.1f}"),
                 ("tpot_ms_p99", "TPOT p99", "{:.1f}"), ("e2e_ms_p99", "E2E p99", "{:.0f}"),
                 ("throughput_output_tokens_per_s", "out tok/s", "{:.0f}"),
                 ("goodput_requests_per_s", "goodput", "{:.2f}"),
                 ("cost_usd_per_million_output_tokens", "$/M out", "{:.3f}"), ("saturated", "sat", "{}"),
                 ("slo_met", "SLO", "{}"), ("knee", "knee", "{}")]
MAXRATE_COLUMNS = [("status", "status", "{}"), ("max_rate", "max rate", "{:.3g}"),
                   ("ttft_ms_p99", "TTFT p99", "{:.1f}"), ("tpot_ms_p99", "TPOT p99", "{:.1f}"),
                   ("cost_usd_per_million_output_tokens", "$/M out", "{:.3f}"),
                   ("cost_usd_per_hour", "$/h", "{:.2f}"), ("limited_by", "limited by", "{}")]


def _text_table(df, lead, columns) -> str:
    cols = [(c, c, "{}") for c in lead] + [c for c in columns if c[0] in df.columns]
    rows = [[label for _, label, _ in cols]]
    for r in df.to_dict("records"):
        cells = []
        for key, _, fmt in cols:
            v = r.get(key)
            if v is None or (isinstance(v, float) and v != v):
                cells.append("-")
            else:
                try:
                    cells.append(fmt.format(v))
                except (ValueError, TypeError):
                    cells.append(str(v))
        rows.append(cells)
    widths = [max(len(row[i]) for row in rows) for i in range(len(cols))]
    return "\n".join("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths)))
                     for row in rows)


@click.command()
@_price_option
@_simulate_options
@click.option("--rates", default=None, help="1,2,4,8 or START:STOP:COUNT (geometric), req/s.")
@click.option("--grid", "grid", multiple=True, metavar="KEY=V1,V2",
              help="Sweep a simulate option too (repeatable), e.g. --grid tp=1,2 --grid hardware=h100-sxm,h200-sxm.")
@click.option("--find-max-rate", is_flag=True, help="Per grid point, bisect for the highest sustainable rate meeting --slo.")
@click.option("--tolerance", default=0.05, show_default=True, type=float, help="Relative bracket width that stops the bisection.")
@click.option("--margin", default=0.0, show_default=True, type=float, help="Required headroom under each SLO target (0.1 = 10%).")
@_backend_options
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option("-o", "--output", "outdir", default=None, type=click.Path(file_okay=False),
              help="Write sweep.csv (+ .parquet) and figures here.")
def sweep(rates, grid, find_max_rate, tolerance, margin, dask_scheduler, dask_timeout, workers, fmt, outdir, prices,
          **kw):
    """Sweep arrival rate and any grid of options; one full simulation per point.

    \b
    Examples:
      servesim sweep --rates 1:32:6 --slo ttft_p99=1s,tpot_p99=60ms -o out/
      servesim sweep --rates 2,4,8 --grid tp=1,2 --grid hardware=h100-sxm,h200-sxm --format json
      servesim sweep --find-max-rate --slo ttft_p99=1s,tpot_p99=60ms --grid hardware=h100-sxm,l40s
    """
    from ..outputs import output_dir
    from ..planning import backends, figures, sweep as S
    from ..planning.checkpoint import Checkpointed, PointStore, POINTS
    from ..workflows.capacity import execute_sweep, prepare_sweep, sweep_error
    spec = prepare_sweep(_base_config(kw), rates, grid, find_max_rate=find_max_rate, tolerance=tolerance,
                         margin=margin, prices=prices, workers=workers)
    stem = "max_rate" if find_max_rate else "sweep"
    with output_dir(outdir, "-o", "servesim sweep") as out:
        bar = Bar("max-rate search" if find_max_rate else "sweep", spec.num_points, "points")
        with backends.make_backend(dask_scheduler, workers, dask_timeout) as be:
            runner = be
            if out is not None:   # save each point as it finishes; a rerun skips the saved ones
                runner = Checkpointed(be, PointStore(out.path / POINTS))
                out.begin_progress(lambda: (runner.describe()[0], [
                    f"{stem}.csv / {stem}.parquet and the figures (any present are from an earlier run)"]),
                    hint="Rerun the same command to resume: the saved points are not computed again.")
            with bar:
                res = execute_sweep(spec, runner, progress=bar.task)
        df, keys = res.points, list(res.grid)
        written = []
        if out is not None:
            out.write(lambda d: written.extend(S.write_table(df, d, stem)))
            try:
                out.write(lambda d: written.extend(
                    figures.max_rate_figure(df, keys, d) if find_max_rate
                    else figures.sweep_figures(df, keys, spec.base.slo, d)))
            except Exception as e:  # a figure must never lose the table
                click.echo(f"servesim: warning: figures skipped ({e})", err=True)
            out.commit()
            written = [out.final(p) for p in written]
            if runner.reused:
                click.echo(f"servesim: reused {runner.reused} of {runner.total} points saved in "
                           f"{out.path / POINTS} (identical inputs)", err=True)
    if (df.status != "error").any() or not res.errors:
        if fmt == "json":
            click.echo(res.to_json(files=written))
        else:
            click.echo(_text_table(df, keys, MAXRATE_COLUMNS if find_max_rate else SWEEP_COLUMNS))
            if written:
                click.echo(f"wrote {', '.join(str(p) for p in written)}")
    if res.errors:
        done = int((df.status == "ok").sum())
        raise sweep_error(res, f" ({done} completed points written to {outdir})" if outdir else "")


def _plan_options(f):
    f = _simulate_options(f)
    f = _price_option(f)
    f = _replace_option(f, "hardware", click.option(
        "--hardware", default=None, help="Candidate hardware, comma list (default: every profile that can hold the model)."))
    f = _replace_option(f, "dtype", click.option("--dtype", default="bf16", show_default=True,
                                                 help="Candidate weight dtypes, comma list, e.g. bf16,fp8."))
    f = _replace_option(f, "tp", click.option("--tp", default="1,2,4,8", show_default=True, help="Candidate TP degrees."))
    f = _replace_option(f, "pp", click.option("--pp", default="1", show_default=True, help="Candidate PP degrees."))
    f = _replace_option(f, "ep", click.option(
        "--ep", default="auto", show_default=True,
        help="Candidate expert-parallel degrees of a MoE model, comma list; auto: none and over the whole replica."))
    f = _replace_option(f, "attn_dp", click.option(
        "--attn-dp", default="1", show_default=True, help="Candidate data-parallel attention ranks (MoE models)."))
    f = _replace_option(f, "replicas", click.option("--max-replicas", default=64, show_default=True, type=int))
    f = _replace_option(f, "max_num_seqs", click.option(
        "--max-num-seqs", default=None, help="Candidate max batch sizes, comma list (default: the preset's)."))
    f = _replace_option(f, "max_num_batched_tokens", click.option(
        "--max-num-batched-tokens", default=None, help="Candidate token budgets, comma list (default: the preset's)."))
    return f


@click.command()
@_plan_options
@click.option("--max-gpus", default=64, show_default=True, type=int, help="GPU budget.")
@click.option("--budget", "budget", default=None, type=float, help="$ per hour budget.")
@click.option("--margin", default=0.1, show_default=True, type=float,
              help="Required headroom under every SLO target (0.1 = within 90% of it).")
@click.option("--model-margin", default=None, type=float,
              help="The model's own error band kept besides --margin: a value counts as (1 + this) x the simulated "
                   "one [0, 1); default: from the held-out residuals (servesim/model_error.py).")
@click.option("--daily-rates", default=None, help="Daily load curve: req/s per equal slot of the day, comma list; "
              "plans for the peak and reports GPU-hours per day.")
@click.option("--exhaustive", is_flag=True, help="Simulate every (layout, replicas) point, no pruning.")
@click.option("--disaggregated", is_flag=True,
              help="Search prefill/decode pools: per-role hardware (--hardware), TP (--tp) and replica counts from "
                   "a capacity bound per role; the answer is two --pool specs.")
@click.option("--require-measured", is_flag=True,
              help="Leave out layouts resting on borrowed fits: hardware efficiencies or an engine table taken "
                   "from another GPU, or terms of it carried over (the fit column says which).")
@click.option("--speculative-grid", default=None,
              help="Speculative decoding settings to search, comma list (none: without), e.g. "
                   "none,mtp:k=1,mtp:k=2:acceptance_length=2.4.")
@click.option("--top", default=15, show_default=True, type=int, help="Rows of the ranked table.")
@_backend_options
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option("-o", "--output", "outdir", default=None, type=click.Path(file_okay=False),
              help="Write plan.json, candidates.csv and pareto.png here.")
def plan(hardware, dtype, tp, pp, ep, attn_dp, max_replicas, max_num_seqs, max_num_batched_tokens, max_gpus, budget,
         margin, model_margin, daily_rates, exhaustive, disaggregated, require_measured, speculative_grid, top,
         dask_scheduler, dask_timeout, workers, fmt, outdir, prices, **kw):
    """Find the cheapest deployment that meets every SLO at the target load.

    Searches hardware x dtype x TP x PP x replicas (x max batch size / token budget), prunes with
    memory, latency-floor and capacity bounds, and verifies every answer by simulation.

    \b
    Examples:
      servesim plan --model llama-3.1-8b --rate 20 --slo ttft_p99=1s,tpot_p99=60ms
      servesim plan --model llama-3.1-70b --hardware h100-sxm,a100-sxm-80gb --dtype bf16,fp8 \\
          --rate 10 --slo ttft_p99=2s,tpot_p99=80ms --format json -o plan/
      servesim plan --daily-rates 2,2,4,8,12,8 --slo ttft_p99=1s --price h100-sxm=2.5
      servesim plan --disaggregated --model llama-3.1-70b --workload chat --rate 20 \\
          --slo ttft_p99=1s,tpot_p99=60ms --hardware h100-sxm
    """
    from ..checks import check_int
    from ..outputs import output_dir
    from ..planning import backends, figures
    from ..planning.sweep import write_table
    from ..workflows.planner import PLACEHOLDERS, execute_plan, plan_error, prepare_plan
    from ..workflows.planner import check_no_pool
    check_no_pool(kw.get("pool"), disaggregated)
    base = _base_config(kw | PLACEHOLDERS)
    check_int(top, "--top", hint=" (rows of the ranked table)")
    spec = prepare_plan(base, hardware=hardware, dtype=dtype, tp=tp, pp=pp, max_replicas=max_replicas,
                        max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens, max_gpus=max_gpus,
                        budget=budget, margin=margin, daily_rates=daily_rates, exhaustive=exhaustive, prices=prices,
                        workers=workers, disaggregated=disaggregated, model_margin=model_margin,
                        require_measured=require_measured, ep=ep, attn_dp=attn_dp, speculative_grid=speculative_grid)
    with output_dir(outdir, "-o", "servesim plan") as od:
        with backends.make_backend(dask_scheduler, workers, dask_timeout) as be:
            with Bar("plan --disaggregated" if disaggregated else "plan"):
                res = execute_plan(spec, be)
        if od is not None:
            od.write(lambda d: (d / "plan.json").write_text(res.to_json() + "\n"))
            od.write(lambda d: write_table(res.candidates, d, "candidates"))
            try:
                od.write(lambda d: figures.pareto_figure(res.candidates, d, slo=spec.base.slo, best=res.best))
            except Exception as e:  # a figure must never lose the plan
                click.echo(f"servesim: warning: figure skipped ({e})", err=True)
    if fmt == "json":
        click.echo(res.to_json())
    else:
        click.echo(_pd_text(res.summary, top) if disaggregated else _plan_text(res.summary, top))
    err = plan_error(res)
    if err is not None:
        raise err


def _margin_text(b: dict) -> str:
    if "model_margin" not in b:
        return f"margin {100 * b['margin']:.0f}%"
    return (f"margin {100 * b['margin']:.1f}%: SLO margin {100 * b['slo_margin']:.0f}% with the simulated values "
            f"raised {100 * b['model_margin']:.1f}% for model error, {b['model_margin_source']}")


def _replicas(n: int) -> str:
    return f"{n} replica" + ("" if n == 1 else "s")


def _checks_text(ch: dict) -> str:
    """The honesty checks of the answer, as findings: another seed meets every SLO; one replica fewer
    (of each role) misses the planner's criterion."""
    other = ch["other_seed"]
    parts = [f"seed {other['seed']} " + ("meets every SLO" if other["meets_slo"] else "MISSES the SLO")
             + (f" ({_replicas(other['replicas_added'])} added for it)" if other.get("replicas_added") else "")]
    for key, what in (("one_replica_fewer", ""), ("one_prefill_replica_fewer", " prefill"),
                      ("one_decode_replica_fewer", " decode")):
        if key in ch:
            fewer = ch[key]
            r = fewer.get("replicas")
            n = f" ({r[0]}:{r[1]} prefill:decode)" if isinstance(r, list) else f" ({_replicas(r)})" if r else ""
            parts.append(f"one{what} replica fewer{n} " + ("MEETS it too" if fewer["meets_slo"] else "misses it"))
    return "checks: " + "; ".join(parts)


def _fit_text(b: dict) -> str:
    """Whether the chosen deployment rests on measured or borrowed fits, and which."""
    if b.get("fit") == "measured":
        return f"fit: measured ({b['fit_note']})"
    return (f"fit: BORROWED ({b.get('fit_note')}); --require-measured leaves such layouts out")


def _plan_text(out, top) -> str:
    from ..planning.capacity import capacity_sentence
    lines = []
    b = out["best"]
    if b:
        m = b["metrics"]
        par = (f" EP={b['ep']} attn-DP={b['attn_dp']}" if b.get("ep", 1) > 1 or b.get("attn_dp", 1) > 1 else "") + \
            (f" speculative {b['speculative']}" if b.get("speculative") else "")
        lines.append(f"best: {b['replicas']} x {b['hardware']} {b['dtype']} TP={b['tp']} PP={b['pp']}{par} "
                     f"({b['num_gpus']} GPUs), ${b['usd_per_hour']:.2f}/h, "
                     f"${b['usd_per_million_output_tokens']:.3f} per M output tokens at {b['rate']:g} req/s")
        lines.append(f"      TTFT p99 {m['ttft_ms']['p99']:.1f} ms, TPOT p99 {m['tpot_ms']['p99']:.1f} ms, "
                     f"SLO slack {100 * b['headroom']:.0f}% ({_margin_text(b)})")
        lines.append("      " + capacity_sentence(b))
        lines.append("      " + _fit_text(b))
        lines.append("      " + _checks_text(b["checks"]))
        if b.get("speculation"):
            lines.append("      " + b["speculation"])
        if "daily" in b:
            d = b["daily"]
            lines.append(f"      daily: {d['gpu_hours_per_day']:.0f} GPU-h/day (${d['usd_per_day']:.0f}) following the curve "
                         f"vs {d['peak_gpu_hours_per_day']:.0f} GPU-h/day (${d['peak_usd_per_day']:.0f}) at peak")
    else:
        lines.append(f"no plan: {out['why_not']}")
    lines.append(f"searched {out['search_space']} (layout x replicas) points with {out['simulations']} simulations")
    lines.append("")
    rows = [["hardware", "dtype", "TP", "PP", "EP", "DP", "spec", "repl", "GPUs", "$/h", "$/M out", "TTFT p99",
             "TPOT p99", "fit", "status"]]

    def f(v, fmt):
        return "-" if v is None else fmt.format(v)
    for c in out["candidates"][:top]:
        rows.append([c["hardware"], c["dtype"], str(c["tp"]), str(c["pp"]), str(c.get("ep", 1)),
                     str(c.get("attn_dp", 1)), c.get("speculative") or "-", f(c.get("replicas"), "{}"),
                     f(c.get("num_gpus"), "{}"), f(c.get("usd_per_hour"), "{:.2f}"),
                     f(c.get("usd_per_million_output_tokens"), "{:.3f}"), f(c.get("ttft_ms_p99"), "{:.1f}"),
                     f(c.get("tpot_ms_p99"), "{:.1f}"), c.get("fit") or "-", c["status"]])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines += ["  ".join(x.ljust(w) for x, w in zip(r, widths)) for r in rows]
    return "\n".join(lines)


def _pd_text(out, top) -> str:
    """The text of `plan --disaggregated`: the chosen pools as --pool specs, then the candidates."""
    from ..planning.capacity import capacity_sentence
    lines = []
    b = out["best"]
    if b:
        m = b["metrics"]
        xfer = m.get("kv_transfer_ms") or {}
        lines.append(f"best: {b['pool_args']} ({b['num_gpus']} GPUs: {b['prefill']['num_gpus']} prefill + "
                     f"{b['decode']['num_gpus']} decode), ${b['usd_per_hour']:.2f}/h, "
                     f"${b['usd_per_million_output_tokens']:.3f} per M output tokens at {b['rate']:g} req/s")
        lines.append(f"      TTFT p99 {m['ttft_ms']['p99']:.1f} ms, TPOT p99 {m['tpot_ms']['p99']:.1f} ms, "
                     f"KV transfer p50 {xfer.get('p50', float('nan')):.2f} ms, SLO attainment "
                     f"{100 * b['slo_attainment']:.1f}%, SLO slack {100 * b['headroom']:.0f}% "
                     f"({_margin_text(b)})")
        cp, cd = b["prefill"]["capacity_bound"], b["decode"]["capacity_bound"]
        lines.append(f"      capacity bounds: prefill {cp['tokens_per_s']:.0f} prompt tokens/s per replica -> >= "
                     f"{cp['replicas_bound']}; decode {cd['tokens_per_s']:.0f} tokens/s per replica at batch "
                     f"{cd['batch_bound']} ({cd['batch_limited_by']}-bound) -> >= {cd['replicas_bound']}")
        lines.append("      " + capacity_sentence(b))
        lines.append("      " + _fit_text(b))
        lines.append("      " + _checks_text(b["checks"]))
    else:
        lines.append(f"no plan: {out['why_not']}")
    lines.append(f"searched {out['search_space']} P:D candidates with {out['simulations']} simulations")
    lines.append("")
    rows = [["prefill", "decode", "GPUs", "$/h", "$/M out", "TTFT p99", "TPOT p99", "SLO att", "xfer p50", "fit",
             "status"]]

    def f(v, fmt):
        return "-" if v is None else fmt.format(v)
    for c in out["candidates"][:top]:
        if "pools" in c:
            pf, dc = c["pools"]
        else:
            pf = dc = "-"
            lay = f"{c['hardware']}:tp{c['tp']}" + (f":pp{c['pp']}" if c["pp"] != 1 else "")
            if c.get("role") == "prefill":
                pf = lay
            else:
                dc = lay
        rows.append([pf, dc, f(c.get("num_gpus"), "{}"), f(c.get("usd_per_hour"), "{:.2f}"),
                     f(c.get("usd_per_million_output_tokens"), "{:.3f}"), f(c.get("ttft_ms_p99"), "{:.1f}"),
                     f(c.get("tpot_ms_p99"), "{:.1f}"),
                     f(None if c.get("slo_attainment") is None else 100 * c["slo_attainment"], "{:.1f}%"),
                     f(c.get("kv_transfer_ms_p50"), "{:.2f}"), c.get("fit") or "-", c["status"]])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines += ["  ".join(x.ljust(w) for x, w in zip(r, widths)) for r in rows]
    return "\n".join(lines)
