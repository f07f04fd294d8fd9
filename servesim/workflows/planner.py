"""`plan`: the Python API, and the path `servesim plan` shares with it (`prepare_plan` checks every
option before any work, `execute_plan` runs on a backend)."""
from __future__ import annotations

from dataclasses import replace

from ..errors import ConfigError, InfeasibleError
from .capacity import as_text, parse_prices, price_items, sim_base
from .results import PlanResult

PLACEHOLDERS = dict(tp=1, pp=1, replicas=1, hardware="h100-sxm", dtype="bf16", max_num_seqs=None,
                     max_num_batched_tokens=None, ep=1, attn_dp=1)   # searched by the planner, not taken from the base


def _candidates(key: str, text) -> tuple:
    """A comma list of candidate values of SimConfig field `key`, each checked by its declared rule."""
    from ..options import flag
    from ..planning.grid import parse_values
    return tuple(parse_values(key, text, flag(key)))


def check_no_pool(pool, disaggregated: bool, option: str = "--pool") -> None:
    """plan searches the deployment, so a fixed --pool contradicts it (a one-line error)."""
    if pool:
        text = " ".join(pool) if isinstance(pool, (list, tuple)) else str(pool)
        what = ("--disaggregated searches the prefill and decode pools" if disaggregated
                else "plan searches the deployment")
        raise ConfigError(f"plan: {option} {text} contradicts the search ({what}); drop {option} and give the "
                          "candidates with --hardware, --tp, --pp" + ("" if disaggregated else
                                                                       ", or --disaggregated for prefill/decode pools"))


def prepare_plan(base, *, hardware=None, dtype="bf16", tp="1,2,4,8", pp="1", max_replicas=64, max_num_seqs=None,
                 max_num_batched_tokens=None, max_gpus=64, budget=None, margin=0.1, daily_rates=None,
                 exhaustive=False, prices=(), workers=None, disaggregated=False, model_margin=None,
                 require_measured=False, ep="auto", attn_dp="1", speculative_grid=None):
    """Every option of a plan checked (text as the CLI takes it) -> a `planning.plan.PlanSpec`."""
    from ..checks import check_choice, check_float, check_int, check_known_name, check_sim_config
    from ..costmodel.dtypes import WEIGHT_DTYPES
    from ..planning.grid import parse_rates
    from ..planning.plan import PlanSpec
    base = check_sim_config(replace(base, **PLACEHOLDERS))
    default_price, per_hw = parse_prices(prices)
    check_int(max_gpus, "--max-gpus")
    check_int(max_replicas, "--max-replicas")
    check_float(budget, "--budget", gt=0.0, none_ok=True, hint=" $/hour (omit it for no budget)")
    check_float(margin, "--margin", ge=0.0, lt=1.0)
    check_float(model_margin, "--model-margin", ge=0.0, lt=1.0, none_ok=True,
                hint=" (omit it for the default from the held-out residuals)")
    check_int(workers, "--workers", none_ok=True)
    from ..config import load_model
    from ..model_error import family_of, margin_default, margin_text
    family = family_of(load_model(base.model))
    if model_margin is None:
        model_margin, margin_source = margin_default(family), margin_text(family)
    else:
        margin_source = "given (--model-margin)"
    hw = tuple(h.strip() for h in hardware.split(",") if h.strip()) if hardware is not None else ()
    if hardware is not None and not hw:
        raise ConfigError("--hardware is empty; give a comma list such as h100-sxm,a100-sxm-80gb, or omit it")
    for h in hw:
        check_known_name("hardware", h, "--hardware")
    dtypes = tuple(check_choice(d.strip(), "--dtype", WEIGHT_DTYPES) for d in str(dtype).split(",") if d.strip())
    if not dtypes:
        raise ConfigError("--dtype is empty; give a comma list such as bf16,fp8")
    seqs, tokens = max_num_seqs, max_num_batched_tokens
    if disaggregated:
        check_no_pool(base.pool, True)
        if daily_rates is not None:
            raise ConfigError(f"--daily-rates {daily_rates} does not work with --disaggregated yet; plan the peak rate "
                              "with --rate, or drop --disaggregated")
        for name, text in (("--max-num-seqs", seqs), ("--max-num-batched-tokens", tokens)):
            if text is not None and len(_candidates(name[2:].replace("-", "_"), text)) > 1:
                raise ConfigError(f"{name} {text}: --disaggregated takes one value (the engine limits are shared by "
                                  f"both pools); give one, e.g. {name} {str(text).split(',')[0]}")
    else:
        check_no_pool(base.pool, False)
    eps = (0,) if str(ep).strip() == "auto" else _candidates("ep", ep)
    dps = _candidates("attn_dp", attn_dp)
    specs = (None,)
    if speculative_grid is not None:
        from ..costmodel.speculative import parse_speculative
        texts = [t.strip() for t in str(speculative_grid).split(",") if t.strip()]
        if not texts:
            raise ConfigError("--speculative-grid is empty; give settings such as none,mtp:k=1,eagle:k=3:acceptance=0.7")
        specs = tuple(None if t == "none" else parse_speculative(t).text for t in texts)
        if base.speculative is not None:
            raise ConfigError(f"--speculative {base.speculative} and --speculative-grid contradict: the grid gives "
                              "the settings to search; drop one of them")
    elif base.speculative is not None:
        specs = (str(base.speculative),)
    if disaggregated and (speculative_grid is not None or eps != (0,) or dps != (1,)):
        raise ConfigError("--ep, --attn-dp and --speculative-grid do not work with --disaggregated yet; plan "
                          "co-located replicas, or give per-pool specs to simulate (--pool b200:tp1:ep8:dp8:x2:decode)")
    return PlanSpec(base=base, hardware=hw, dtypes=dtypes, tps=_candidates("tp", tp), pps=_candidates("pp", pp),
                    eps=eps, attn_dps=dps, speculatives=specs,
                    max_num_seqs=_candidates("max_num_seqs", seqs) if seqs is not None else (None,),
                    max_num_batched_tokens=(_candidates("max_num_batched_tokens", tokens) if tokens is not None
                                            else (None,)),
                    max_gpus=max_gpus, max_replicas=max_replicas, budget_usd_per_hour=budget, margin=margin,
                    model_margin=float(model_margin), model_margin_source=margin_source, prices=per_hw,
                    default_price=default_price, exhaustive=exhaustive,
                    daily_rates=tuple(parse_rates(daily_rates, "--daily-rates")) if daily_rates is not None else (),
                    disaggregated=bool(disaggregated), require_measured=bool(require_measured))


def execute_plan(spec, backend, progress=None) -> PlanResult:
    """Run a prepared plan (`planning.plan.run_plan`)."""
    from ..planning.plan import run_plan
    return run_plan(spec, backend, progress=progress)


def plan_error(result: PlanResult) -> InfeasibleError | None:
    if result.best is not None:
        return None
    err = InfeasibleError(result.why_not)
    err.result = result
    return err


def plan(*, hardware=None, dtype="bf16", tp=(1, 2, 4, 8), pp=(1,), max_replicas=64, max_num_seqs=None,
         max_num_batched_tokens=None, max_gpus=64, budget=None, margin=0.1, model_margin=None, daily_rates=None,
         exhaustive=False, disaggregated=False, require_measured=False, price=None, workers=None, dask_scheduler=None,
         dask_timeout=None, config=None, ep="auto", attn_dp=(1,), speculative_grid=None, **options) -> PlanResult:
    """The cheapest deployment meeting every SLO at the target load, as ``servesim plan``.

    Searches hardware x dtype x TP x PP x replicas (x max batch size, token budget), prunes with
    memory, latency-floor and capacity bounds, verifies every answer by simulation, and checks the
    winner on another seed and with one replica fewer.

    Parameters
    ----------
    hardware : sequence of str or str, optional
        Candidate hardware (default: every profile that can hold the model).
    dtype, tp, pp : sequence or str
        Candidate weight dtypes, TP and PP degrees.
    max_replicas, max_gpus : int
        Search limits.
    max_num_seqs, max_num_batched_tokens : sequence of int, optional
        Candidate engine limits (default: the engine profile's).
    budget : float, optional
        USD per hour.
    margin : float
        Required headroom under every SLO target (0.1: within 90% of it).
    model_margin : float, optional
        The model's error band kept besides ``margin``: a simulated value counts as (1 + model_margin)
        times itself; default from the held-out residuals (``servesim.model_error.margin_default``).
    daily_rates : sequence of float, optional
        A daily load curve (req/s per equal slot): plan for its peak and report GPU-hours per day.
    exhaustive : bool
        Simulate every (layout, replicas) point instead of pruning.
    disaggregated : bool
        Search prefill/decode pools instead (``planning/disagg.py``): per-role hardware, dtype, TP and
        PP from the candidate lists, replica counts from a capacity bound per role; ``best["pools"]``
        is the two ``--pool`` specs, ``max_replicas`` applies per role and ``max_gpus`` / ``budget``
        to the sum.
    require_measured : bool
        Leave out layouts resting on borrowed fits (every candidate's ``fit`` is "measured" or
        "borrowed", ``fit_note`` says which terms; `servesim.config.engine.provenance`).
    ep, attn_dp : sequence or str
        A MoE model's candidate expert-parallel degrees ("auto": none and over the whole replica) and
        data-parallel attention ranks (``servesim/costmodel/ep.py``).
    speculative_grid : sequence of str or str, optional
        Speculative decoding settings to search ("none": without); ``best["speculation"]`` says whether
        it paid at this load.
    price, workers, dask_scheduler, dask_timeout, config
        As in `sweep`.
    **options
        Simulation options, the fields of `SimConfig` but the searched ones (``hardware``, ``dtype``,
        ``tp``, ``pp``, ``replicas``, ``max_num_seqs``, ``max_num_batched_tokens``); ``slo`` is
        required and ``rate`` is the target load.

    Returns
    -------
    PlanResult
        ``best`` (dict), ``candidates`` (DataFrame, best first), ``summary`` (the whole plan).

    Raises
    ------
    InfeasibleError
        Nothing meets the SLO within the limits; the message names the closest candidate and the
        result is ``error.result``.

    Examples
    --------
    >>> import servesim
    >>> res = servesim.plan(hardware="h100-sxm", tp=[1], rate=4, slo="ttft_p99=1s,tpot_p99=60ms",
    ...                     num_requests=200, isl=256, osl=32, workers=1)
    >>> res.best["hardware"], res.best["replicas"] >= 1
    ('h100-sxm', True)
    """
    check_no_pool(options.get("pool"), disaggregated, "pool=")
    searched = sorted(set(options) & set(PLACEHOLDERS))
    if searched:
        raise ConfigError(f"plan: {searched[0]}={options[searched[0]]!r} is searched by the planner; give the "
                          "candidates as plan(hardware=..., dtype=..., tp=..., pp=..., max_replicas=...)")
    from ..planning import backends
    base = sim_base(config, options, "plan")
    spec = prepare_plan(replace(base, price=None), hardware=as_text(hardware), dtype=as_text(dtype), tp=as_text(tp),
                        pp=as_text(pp), max_replicas=max_replicas, max_num_seqs=as_text(max_num_seqs),
                        max_num_batched_tokens=as_text(max_num_batched_tokens), max_gpus=max_gpus, budget=budget,
                        margin=margin, daily_rates=as_text(daily_rates), exhaustive=exhaustive,
                        prices=price_items(price, base), workers=workers, disaggregated=disaggregated,
                        model_margin=model_margin, require_measured=require_measured, ep=as_text(ep),
                        attn_dp=as_text(attn_dp), speculative_grid=as_text(speculative_grid))
    with backends.make_backend(dask_scheduler, workers, dask_timeout) as be:
        res = execute_plan(spec, be)
    err = plan_error(res)
    if err is not None:
        raise err
    return res
