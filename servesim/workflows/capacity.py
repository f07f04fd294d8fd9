"""`sweep`, `find_max_rate` and `plan`: the Python API, and the one path `servesim sweep` and
`servesim plan` share with it (`prepare_*` checks every option before any work, `execute_*` runs
on a backend; the CLI adds its progress bar, saved points and output folder around them)."""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..errors import ConfigError, InfeasibleError
from .results import PlanResult, SweepResult


# ---------------------------------------------------------------- shared
def sim_base(config, options: dict, where: str):
    """The simulation options of an API call as a checked SimConfig (`checks.sim_config`): ``config``
    (or the defaults) with ``options`` (SimConfig field names; an unknown one names the closest field)."""
    from ..checks import check_sim_keywords, sim_config
    from ..options import options as declared
    check_sim_keywords(options)
    kinds = declared()   # an int given for a float option is that float, as the CLI reads it (12 -> 12.0)
    options = {k: float(v) if type(v) is int and kinds[k].kind == "float" else v for k, v in options.items()}
    return sim_config(config, where, **options)


def _text(value):
    """An API value as the CLI's text: a number or a sequence becomes a comma list."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return str(value)


def _grid_items(grid) -> tuple:
    """``{"tp": [1, 2]}`` or ``["tp=1,2"]`` -> the CLI's ``--grid`` items."""
    if grid is None:
        return ()
    if isinstance(grid, str):
        return (grid,)
    if isinstance(grid, dict):
        return tuple(f"{k}={_text(list(v) if isinstance(v, (list, tuple, range)) else [v])}"
                     for k, v in grid.items())
    return tuple(grid)


def _price_items(price, base) -> tuple:
    """``price``: USD per GPU-hour for every hardware, ``{"h100-sxm": 2.5}``, or the CLI's text;
    None: the config's price, if any (else each profile's)."""
    if price is None:
        price = base.price
    if price is None:
        return ()
    if isinstance(price, dict):
        return tuple(f"{k}={v}" for k, v in price.items())
    if isinstance(price, (list, tuple)):
        return tuple(str(p) for p in price)
    return (str(price),)


def parse_prices(values) -> tuple[float | None, dict[str, float]]:
    """``--price`` items (``USD`` or ``HARDWARE=USD``, comma lists) -> (default, per hardware)."""
    default, per_hw = None, {}
    for v in values or ():
        for part in str(v).split(","):
            part = part.strip()
            if not part:
                continue
            hw, sep, usd = part.rpartition("=")
            try:
                price = float(usd)
            except ValueError:
                raise ConfigError(f"--price: {part!r} is not USD or HARDWARE=USD; write e.g. --price h100-sxm=2.5") from None
            if not (price >= 0 and price != float("inf")):
                raise ConfigError(f"--price: must be a finite number >= 0 $/GPU-hour, got {part!r}")
            if sep:
                from ..config import list_hardware
                if hw not in list_hardware():
                    raise ConfigError(f"--price: unknown hardware {hw!r}; use one of {', '.join(list_hardware())}")
                per_hw[hw] = price
            else:
                default = price
    return default, per_hw


# ---------------------------------------------------------------- sweep and max rate
@dataclass(frozen=True)
class SweepSpec:
    """A checked sweep: the base config, grid, rates (None for a max-rate search) and prices."""
    base: object
    grid: list
    rates: list | None
    max_rate: bool = False
    tolerance: float = 0.05
    margin: float = 0.0
    default_price: float | None = None
    per_hw: dict = field(default_factory=dict)

    @property
    def num_points(self) -> int:
        n = 1
        for _, v in self.grid:
            n *= len(v)
        return n if self.max_rate else n * len(self.rates)


def prepare_sweep(base, rates=None, grid=(), *, find_max_rate=False, tolerance=0.05, margin=0.0, prices=(),
                  workers=None) -> SweepSpec:
    """Every option of a sweep checked, and every grid point resolved, before any simulation."""
    from ..checks import check_float, check_int
    from ..planning import grid as G, sweep as S
    default_price, per_hw = parse_prices(prices)
    grid_spec = G.parse_grid(grid)
    check_float(tolerance, "--tolerance", gt=0.0, lt=1.0)
    check_float(margin, "--margin", ge=0.0, lt=1.0)
    check_int(workers, "--workers", none_ok=True)
    if find_max_rate:
        if not base.slo:
            raise ConfigError("--find-max-rate needs --slo, e.g. --slo ttft_p99=1s,tpot_p99=60ms")
        rate_list = None
        if rates:
            base = replace(base, rate=min(G.parse_rates(rates)))
    else:
        if not rates:
            raise ConfigError("--rates is required, e.g. --rates 1,2,4 or --rates 1:64:16 (or use --find-max-rate)")
        rate_list = G.parse_rates(rates)
        if base.offline or base.concurrency is not None:
            raise ConfigError("--rates sweeps open-loop arrivals; drop --offline / --concurrency")
    S.validate_base(base, grid_spec)
    return SweepSpec(base, grid_spec, rate_list, find_max_rate, tolerance, margin, default_price, per_hw)


class _PricedBackend:
    """Prices each point by its hardware before it runs (and before a saved point is looked up)."""

    def __init__(self, inner, spec: SweepSpec):
        self.inner, self.spec = inner, spec

    def map(self, fn, items, progress=None):
        s = self.spec
        items = [(x[0], replace(x[1], price=s.per_hw.get(x[1].hardware, s.default_price)), *x[2:]) for x in items]
        return self.inner.map(fn, items, progress)


def execute_sweep(spec: SweepSpec, backend, progress=None) -> SweepResult:
    """Run a prepared sweep on a backend (`planning.backends`); user errors at a point are recorded."""
    from ..planning import sweep as S
    be = _PricedBackend(backend, spec)
    if spec.max_rate:
        res = S.run_max_rate(spec.base, spec.grid, be, tol=spec.tolerance, margin=spec.margin, progress=progress)
    else:
        res = S.run_sweep(spec.base, spec.grid, spec.rates, be, progress=progress)
    return SweepResult(res.table, tuple(res.grid_keys), tuple(res.errors), res.mode)


def sweep_error(result: SweepResult, where: str = "") -> ConfigError | None:
    """The first point's error as the one line the CLI prints, with the result attached."""
    if not result.errors:
        return None
    point, msg = result.errors[0]
    err = ConfigError(f"point {point}: {msg}{where}")
    err.result = result
    return err


def _run(spec, workers, dask_scheduler, dask_timeout) -> SweepResult:
    from ..planning import backends
    with backends.make_backend(dask_scheduler, workers, dask_timeout) as be:
        res = execute_sweep(spec, be)
    err = sweep_error(res)
    if err is not None:
        raise err
    return res


def sweep(rates, *, grid=None, price=None, workers=None, dask_scheduler=None, dask_timeout=None, config=None,
          **options) -> SweepResult:
    """Simulate every rate at every grid point, as ``servesim sweep``.

    Parameters
    ----------
    rates : sequence of float or str
        Arrival rates in req/s: ``[1, 2, 4]``, ``"1,2,4"`` or ``"1:64:16"`` (16 geometric steps).
    grid : dict or sequence of str, optional
        Other options to sweep, ``{"tp": [1, 2], "hardware": ["h100-sxm", "h200-sxm"]}`` or
        ``["tp=1,2"]``; the rate is innermost.
    price : float, dict or str, optional
        USD per GPU-hour for every hardware, or per hardware ``{"h100-sxm": 2.5}``; default: the
        profiles' prices.
    workers : int, optional
        Local worker processes (default: every core); results do not depend on it.
    dask_scheduler, dask_timeout : str, float, optional
        Run the points on a Dask cluster instead (``tcp://HOST:PORT``), as ``--dask-scheduler``.
    config : SimConfig, optional
        Base options; ``**options`` replace its fields.
    **options
        Simulation options, the fields of `SimConfig` (``model``, ``slo``, ``num_requests``, ...).

    Returns
    -------
    SweepResult
        ``points``: one row per (grid point, rate), with ``knee`` marking the end of the flat part of
        each latency-load curve.

    Raises
    ------
    ConfigError
        A bad option, before any simulation; or a point that failed while running (the first one,
        with the partial result as ``error.result``).

    Examples
    --------
    >>> import servesim
    >>> res = servesim.sweep([2, 8], grid={"tp": [1, 2]}, slo="ttft_p99=1s", num_requests=200,
    ...                      isl=256, osl=32, workers=1)
    >>> res.points[["tp", "rate", "status"]].values.tolist()
    [[1, 2.0, 'ok'], [1, 8.0, 'ok'], [2, 2.0, 'ok'], [2, 8.0, 'ok']]
    """
    base = sim_base(config, options, "sweep")
    prices = _price_items(price, base)
    spec = prepare_sweep(replace(base, price=None), _text(rates), _grid_items(grid), prices=prices,
                         workers=workers)
    return _run(spec, workers, dask_scheduler, dask_timeout)


def find_max_rate(*, grid=None, tolerance=0.05, margin=0.0, price=None, workers=None, dask_scheduler=None,
                  dask_timeout=None, config=None, **options) -> SweepResult:
    """The highest sustainable rate meeting the SLO at each grid point, as ``servesim sweep
    --find-max-rate``: bracketing from ``rate`` (default: the workload's), then geometric bisection.

    Parameters
    ----------
    grid : dict or sequence of str, optional
        Options to search over, as in `sweep`.
    tolerance : float
        Relative bracket width that stops the bisection (0.05: within 5%).
    margin : float
        Required headroom under each SLO target (0.1: within 90% of it).
    price, workers, dask_scheduler, dask_timeout, config
        As in `sweep`.
    **options
        Simulation options, the fields of `SimConfig`; ``slo`` is required (``"ttft_p99=1s"``).

    Returns
    -------
    SweepResult
        ``mode`` ``"max-rate"``; ``points``: one row per grid point with ``max_rate`` (req/s),
        ``first_failing_rate``, ``limited_by`` (the targets missed just above it), the metrics at
        ``max_rate`` and ``simulations``.

    Examples
    --------
    >>> import servesim
    >>> res = servesim.find_max_rate(slo="ttft_p99=1s,tpot_p99=60ms", num_requests=200, isl=256, osl=32,
    ...                              workers=1)
    >>> p = res.points.iloc[0]
    >>> p["status"], bool(p["max_rate"] > 1), bool(p["first_failing_rate"] > p["max_rate"])
    ('ok', True, True)
    """
    base = sim_base(config, options, "find_max_rate")
    prices = _price_items(price, base)
    spec = prepare_sweep(replace(base, price=None), None, _grid_items(grid), find_max_rate=True,
                         tolerance=tolerance, margin=margin, prices=prices, workers=workers)
    return _run(spec, workers, dask_scheduler, dask_timeout)


# ---------------------------------------------------------------- plan
PLACEHOLDERS = dict(tp=1, pp=1, replicas=1, hardware="h100-sxm", dtype="bf16", max_num_seqs=None,
                     max_num_batched_tokens=None)   # searched by the planner, not taken from the base


def _candidates(key: str, text) -> tuple:
    """A comma list of candidate values of SimConfig field `key`, each checked by its declared rule."""
    from ..options import flag
    from ..planning.grid import parse_values
    return tuple(parse_values(key, text, flag(key)))


def prepare_plan(base, *, hardware=None, dtype="bf16", tp="1,2,4,8", pp="1", max_replicas=64, max_num_seqs=None,
                 max_num_batched_tokens=None, max_gpus=64, budget=None, margin=0.1, daily_rates=None,
                 exhaustive=False, prices=(), workers=None):
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
    check_int(workers, "--workers", none_ok=True)
    hw = tuple(h.strip() for h in hardware.split(",") if h.strip()) if hardware is not None else ()
    if hardware is not None and not hw:
        raise ConfigError("--hardware is empty; give a comma list such as h100-sxm,a100-sxm-80gb, or omit it")
    for h in hw:
        check_known_name("hardware", h, "--hardware")
    dtypes = tuple(check_choice(d.strip(), "--dtype", WEIGHT_DTYPES) for d in str(dtype).split(",") if d.strip())
    if not dtypes:
        raise ConfigError("--dtype is empty; give a comma list such as bf16,fp8")
    seqs, tokens = max_num_seqs, max_num_batched_tokens
    return PlanSpec(base=base, hardware=hw, dtypes=dtypes, tps=_candidates("tp", tp), pps=_candidates("pp", pp),
                    max_num_seqs=_candidates("max_num_seqs", seqs) if seqs is not None else (None,),
                    max_num_batched_tokens=(_candidates("max_num_batched_tokens", tokens) if tokens is not None
                                            else (None,)),
                    max_gpus=max_gpus, max_replicas=max_replicas, budget_usd_per_hour=budget, margin=margin,
                    prices=per_hw, default_price=default_price, exhaustive=exhaustive,
                    daily_rates=tuple(parse_rates(daily_rates, "--daily-rates")) if daily_rates is not None else ())


def execute_plan(spec, backend, progress=None) -> PlanResult:
    """Run a prepared plan; with no hardware given, only the profiles that can hold the model are listed."""
    import pandas as pd
    from ..planning.plan import plan as run_plan
    res = run_plan(spec, backend, progress=progress)
    cands = res.candidates
    if not spec.hardware:
        fits = {c["hardware"] for c in cands if c["status"] != "infeasible"}
        cands = [c for c in cands if c["hardware"] in fits]
    flat = pd.DataFrame([{k: v for k, v in c.items() if not isinstance(v, dict)} for c in cands])
    return PlanResult(res.best, flat, res.as_dict() | {"candidates": cands})


def plan_error(result: PlanResult) -> InfeasibleError | None:
    if result.best is not None:
        return None
    err = InfeasibleError(result.why_not)
    err.result = result
    return err


def plan(*, hardware=None, dtype="bf16", tp=(1, 2, 4, 8), pp=(1,), max_replicas=64, max_num_seqs=None,
         max_num_batched_tokens=None, max_gpus=64, budget=None, margin=0.1, daily_rates=None, exhaustive=False,
         price=None, workers=None, dask_scheduler=None, dask_timeout=None, config=None, **options) -> PlanResult:
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
    daily_rates : sequence of float, optional
        A daily load curve (req/s per equal slot): plan for its peak and report GPU-hours per day.
    exhaustive : bool
        Simulate every (layout, replicas) point instead of pruning.
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
    searched = sorted(set(options) & set(PLACEHOLDERS))
    if searched:
        raise ConfigError(f"plan: {searched[0]}={options[searched[0]]!r} is searched by the planner; give the "
                          "candidates as plan(hardware=..., dtype=..., tp=..., pp=..., max_replicas=...)")
    from ..planning import backends
    base = sim_base(config, options, "plan")
    spec = prepare_plan(replace(base, price=None), hardware=_text(hardware), dtype=_text(dtype), tp=_text(tp),
                        pp=_text(pp), max_replicas=max_replicas, max_num_seqs=_text(max_num_seqs),
                        max_num_batched_tokens=_text(max_num_batched_tokens), max_gpus=max_gpus, budget=budget,
                        margin=margin, daily_rates=_text(daily_rates), exhaustive=exhaustive,
                        prices=_price_items(price, base), workers=workers)
    with backends.make_backend(dask_scheduler, workers, dask_timeout) as be:
        res = execute_plan(spec, be)
    err = plan_error(res)
    if err is not None:
        raise err
    return res
