"""`sweep` and `find_max_rate`: the Python API, and the one path `servesim sweep` shares with it
(`prepare_sweep` checks every option before any work, `execute_sweep` runs on a backend; the CLI adds
its progress bar, saved points and output folder around them). `sim_base` and the price and list
helpers serve `plan` (`planner`) too."""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..errors import ConfigError
from .results import SweepResult


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


def as_text(value):
    """An API value as the CLI's text: a number or a sequence becomes a comma list."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return str(value)


def grid_items(grid) -> tuple:
    """``{"tp": [1, 2]}`` or ``["tp=1,2"]`` -> the CLI's ``--grid`` items."""
    if grid is None:
        return ()
    if isinstance(grid, str):
        return (grid,)
    if isinstance(grid, dict):
        return tuple(f"{k}={as_text(list(v) if isinstance(v, (list, tuple, range)) else [v])}"
                     for k, v in grid.items())
    return tuple(grid)


def price_items(price, base) -> tuple:
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
        return n if self.max_rate or self.rates is None else n * len(self.rates)


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
        # a closed-loop sweep: the grid sets the clients (--grid concurrency=4,8,...), no rates
        closed = any(key == "concurrency" for key, _ in grid_spec)
        if closed and rates:
            raise ConfigError(f"--rates {rates} and --grid concurrency=... contradict: a closed loop sends a request "
                              "whenever a client's previous one ends; drop --rates")
        if not rates and not closed:
            raise ConfigError("--rates is required, e.g. --rates 1,2,4 or --rates 1:64:16 (or use --find-max-rate, or "
                              "--grid concurrency=4,16,64 for a closed loop)")
        rate_list = G.parse_rates(rates) if rates else None
        if rates and (base.offline or base.concurrency is not None):
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
    return res


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
    prices = price_items(price, base)
    spec = prepare_sweep(replace(base, price=None), as_text(rates), grid_items(grid), prices=prices,
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
    prices = price_items(price, base)
    spec = prepare_sweep(replace(base, price=None), None, grid_items(grid), find_max_rate=True,
                         tolerance=tolerance, margin=margin, prices=prices, workers=workers)
    return _run(spec, workers, dask_scheduler, dask_timeout)
