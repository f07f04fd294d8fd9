"""`calibrate` and `validate`: the Python API over the functions ``servesim calibrate`` and
``servesim validate`` call (`run_calibration`, `validate_result`)."""
from __future__ import annotations

from pathlib import Path

from ..errors import ConfigError
from .results import CalibrateResult, ValidateResult


def _paths(value, option: str) -> tuple[str, ...]:
    """One path or several, each existing (as the CLI's click.Path(exists=True))."""
    if value is None:
        return ()
    items = (value,) if isinstance(value, (str, Path)) else tuple(value)
    for p in items:
        if not isinstance(p, (str, Path)) or not Path(p).exists():
            raise ConfigError(f"{option} {p!r}: no such file or folder")
    return tuple(str(p) for p in items)


def run_calibration(profile, *, operators=(), training=None, output=None, aiconfigurator=None, serving=(),
                    engine=None, engine_output=None, model=None, tp=1, hardware=None, precision="BF16",
                    force=False, report_dir=None, holdout=True, command="servesim calibrate"):
    """Check the outputs, fit, write the profiles and the report -> (`calibrate.fit.FitResult`, report dir)."""
    from ..calibrate.fit import calibrate as fit, default_report_dir, write_outputs
    from ..checks import check_int
    from ..outputs import check_output_dir, check_output_file
    check_int(tp, "--tp")
    for path, option in ((output, "-o"), (engine_output, "--engine-output")):
        if path is not None:
            check_output_file(path, option)
    first = output or engine_output
    if report_dir is not None or first:
        rep = report_dir if report_dir is not None else default_report_dir(first)
        rep_path, _ = check_output_dir(rep, "--report", create=False)
        if rep_path.is_dir() and any(rep_path.iterdir()) and not force:
            raise ConfigError(f"--report {rep}: the folder exists and is not empty (an earlier fit report?); "
                              "pass --force to replace its files, or name another folder")
    result = fit(profile, output, operators=operators, serving=serving, training=training, model=model, tp=tp,
                 hardware=hardware, precision=precision, force=force, holdout=holdout,
                 aiconfigurator=aiconfigurator, engine=engine, engine_output=engine_output)
    return result, write_outputs(result, report_dir=report_dir, command=command)


def calibrate(profile, *, operators=None, training=None, output=None, aiconfigurator=None, serving=None,
              engine=None, engine_output=None, model=None, tp=1, hardware=None, precision="BF16", force=False,
              report_dir=None, holdout=True) -> CalibrateResult:
    """Fit a hardware and/or an engine profile to your measurements and write them, as
    ``servesim calibrate``.

    Parameters
    ----------
    profile : str
        Base hardware profile (name or ``.toml``): the GPU the measurements were taken on.
    operators : path or sequence of paths, optional
        Per-operator timings (Vidur CSVs or the native ``op,m,k,n,dtype,bytes,gpus,time_us``).
    training : path, optional
        Training step times (the shipped training CSV layout).
    output : path
        The hardware profile to write (required with ``operators`` / ``training``).
    aiconfigurator : path, optional
        AIConfigurator per-kernel tables of one GPU (engine input).
    serving : path or sequence of paths, optional
        End-to-end serving results (engine input): shipped CSV layout or vLLM benchmark JSON, with
        ``model``, ``tp``, ``hardware``, ``precision`` describing the JSON runs.
    engine, engine_output : str, path
        Base engine profile (default vllm) and the engine profile to write.
    force : bool
        Overwrite existing files, or use a shipped name.
    report_dir : path, optional
        Fit report folder (default: ``<stem>-fit`` next to the first profile).
    holdout : bool
        Held-out refits (one model / layout / GPU count at a time).

    Returns
    -------
    CalibrateResult
        ``summary`` (fitted values, base values, engine keys, files written, warnings, notes),
        ``residuals`` and ``holdout`` frames.

    Examples
    --------
    Needs your own measurement files, so not run here:

    >>> import servesim
    >>> res = servesim.calibrate("h100-sxm", operators="my_timings.csv",
    ...                          output="my-h100.toml")  # doctest: +SKIP
    >>> res.summary["values"]["gemm_max"], res.summary["report"]  # doctest: +SKIP
    (0.7..., 'my-h100-fit')
    >>> servesim.simulate(hardware="my-h100.toml")  # doctest: +SKIP
    """
    args = dict(operators=_paths(operators, "--operators"), training=(_paths(training, "--training") or (None,))[0],
                output=output, aiconfigurator=aiconfigurator, serving=_paths(serving, "--serving"), engine=engine,
                engine_output=engine_output, model=model, tp=tp, hardware=hardware, precision=precision,
                force=force, report_dir=report_dir, holdout=holdout)
    shown = ", ".join(f"{k}={v!r}" for k, v in args.items() if v not in (None, (), False, 1, "BF16", True))
    result, rep = run_calibration(profile, **args, command=f"servesim.calibrate({profile!r}, {shown})")
    e = result.engine
    engine_summary = None if e is None else {
        "engine": e.engine, "table": e.table, "base": e.base_note, "values": e.values, "base_values": e.base_values,
        "fitted": e.fitted, "kept": e.kept}
    summary = {"profile": result.profile, "values": result.values, "base_values": result.base_values,
               "engine": engine_summary, "training_fit": result.training_fit, "output": result.output,
               "engine_output": result.engine_output, "report": str(rep), "warnings": list(result.warnings),
               "notes": list(result.notes)}
    return CalibrateResult(summary, result.residuals, result.holdout)


def suite_dict(res, s: dict) -> dict:
    """One suite as ``servesim validate --format json`` prints it."""
    return {"suite": res.name, "tolerance": res.metric_tolerance or res.tolerance, "pass": not s["failed"],
            "n": s["n"], "median_rel_err": s["median"], "p90_rel_err": s["p90"], "checked": s.get("checked"),
            "groups": s["table"].to_dict(orient="records"),
            **({"heldout": {k: v for k, v in s["heldout"].items() if k != "failed"}} if "heldout" in s else {})}


def validate_result(results) -> ValidateResult:
    """`calibrate.validate.SuiteResult`s -> ValidateResult (summaries, every row, what failed)."""
    import pandas as pd
    from ..calibrate.validate import COLUMNS, summarize
    suites, failed = [], []
    for res in results:
        s = summarize(res)
        failed += [f"{res.name} {f}" for f in s["failed"]]
        suites.append(suite_dict(res, s))
    rows = pd.concat([r.rows for r in results], ignore_index=True) if results else pd.DataFrame(columns=COLUMNS)
    return ValidateResult(suites, rows, tuple(failed))


def validate(suite="all", *, csv=None, quick=False, output=None) -> ValidateResult:
    """Compare the simulator with published (or your) measurements, as ``servesim validate``.

    Parameters
    ----------
    suite : {"all", "serving", "vllm", "training"}
        serving: published TensorRT-LLM results; vllm: real vLLM 0.15.1 deployments; training:
        published training step times.
    csv : path or sequence of paths, optional
        Your own measurements (serving or training CSV layout), one more suite each.
    quick : bool
        Every 8th serving row (a deterministic sample).
    output : path, optional
        Write per-row CSVs, summary.csv and parity.png here (as ``-o``).

    Returns
    -------
    ValidateResult
        ``suites`` (one summary each), ``rows`` (predicted vs measured), ``failed``, ``passed``.

    Examples
    --------
    >>> import servesim
    >>> res = servesim.validate("training")
    >>> res.suites[0]["suite"], res.passed
    ('training', True)
    """
    from ..calibrate.validate import run_suites, write_outputs
    from ..checks import check_choice
    from ..outputs import output_dir
    check_choice(suite, "--suite", ("serving", "vllm", "training", "all"))
    with output_dir(output, "-o", "servesim.validate") as od:
        results = run_suites(suite, _paths(csv, "--csv"), quick=quick)
        if od is not None:
            od.write(lambda d: write_outputs(results, d))
    return validate_result(results)
