"""`servesim report`: a thin click command over servesim.report.build_report."""
from __future__ import annotations

import click

from .options import SLO


@click.command()
@click.option("--model", default="llama-3.1-8b", show_default=True, help="Model name or path.")
@click.option("--hardware", default="h100-sxm", show_default=True,
              help="Hardware candidates, comma-separated (e.g. h100-sxm,h200-sxm).")
@click.option("--workload", default="chat", show_default=True, help="Workload name or file.")
@click.option("--rates", default=None,
              help="Sweep rates, 1,2,4 or START:STOP:COUNT (req/s) [default: 6 rates from 0.15 to 1.2 x "
                   "the largest one-replica capacity bound].")
@click.option("--rate", default=None, type=float,
              help="Target load for the plan, the iteration breakdown and the cost comparison "
                   "[default: the workload's default rate].")
@click.option("--slo", default="ttft_p99=1s,tpot_p99=60ms", show_default=True, type=SLO, help="Latency targets.")
@click.option("--dtype", default="bf16", show_default=True, help="Serving weight dtype.")
@click.option("--num-requests", default=1000, show_default=True, type=int, help="Requests per simulation.")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--train-tokens", default=15e12, show_default=True, type=float, help="Training tokens.")
@click.option("--train-gpus", default=1024, show_default=True, type=int, help="GPUs for training.")
@click.option("--max-gpus", default=64, show_default=True, type=int, help="GPU budget of the plan.")
@click.option("-o", "--output", "outdir", required=True, type=click.Path(file_okay=False),
              help="Directory for report.md, its figures and CSV tables.")
def report(model, hardware, workload, rates, rate, slo, dtype, num_requests, seed, train_tokens, train_gpus,
           max_gpus, outdir):
    """Write a technical report for one scenario: latency/throughput vs load with the SLO, the
    bottleneck of a typical iteration, the cheapest configurations meeting the SLO, training vs
    serving cost and the validation status of each hardware profile.

    \b
    Examples:
      servesim report -o report/
      servesim report --model llama-3.1-70b --hardware h100-sxm,h200-sxm --rate 8 -o r70b/
    """
    from ..checks import check_choice, check_float, check_int
    from ..costmodel.dtypes import WEIGHT_DTYPES
    from ..outputs import OutputDir
    from ..planning import parse_rates
    from ..report import ReportSpec, build_report
    check_float(rate, "--rate", gt=0.0, none_ok=True, hint=" req/s (omit it for the workload's rate)")
    check_choice(dtype, "--dtype", WEIGHT_DTYPES)
    check_int(num_requests, "--num-requests")
    check_int(seed, "--seed", ge=0)
    check_float(train_tokens, "--train-tokens", gt=0.0)
    check_int(train_gpus, "--train-gpus")
    check_int(max_gpus, "--max-gpus")
    hws = tuple(h.strip() for h in hardware.split(",") if h.strip())
    spec = ReportSpec(model=model, hardware=hws, workload=workload,
                      rates=tuple(parse_rates(rates)) if rates is not None else None, rate=rate, slo=slo,
                      dtype=dtype, num_requests=num_requests, seed=seed, train_tokens=train_tokens,
                      train_gpus=train_gpus, max_gpus=max_gpus)
    with OutputDir(outdir, "-o", "servesim report") as out:
        path = out.write(lambda d: build_report(spec, d, progress=lambda msg: click.echo(f"  {msg} ...", err=True),
                                                shown_as=outdir))
    click.echo(str(out.final(path)))
