"""Reproduce published TensorRT-LLM serving results with the simulator, and fit engine parameters.

The shipped file `data/inference_published_calibration.csv` (copied from servesim's calibration
set; every value from a public TensorRT-LLM performance page, source in its `source` column) has
three kinds of rows, each reproduced with the `trtllm` preset:

- `static_batch` (v0.9): a fixed batch of `load_value` requests, no in-flight batching ->
  scheduler `static`, offline, max_num_seqs = batch; metric output tok/s per GPU, or batch-1 TTFT.
- `offline_max_throughput` (v0.14, v0.17): every request queued at t = 0 (trtllm-bench) ->
  `--offline`, KV memory fraction 0.95; metric output tok/s of the whole TP group.
- `request_rate` (v0.14): Poisson arrivals at `load_value` req/s (`inf`: all at once), 500 requests;
  metrics mean TTFT, mean inter-token latency, achieved request rate, output tokens/s.

The fit (`fit_engine`) moves only the parameters these end-to-end rows identify and the per-kernel
timings do not: the engine's host time per step and per sequence (``host_step_us``,
``host_per_seq_us`` of the engine profile's ``[hardware.<gpu>]`` table) and ``graph_overlap`` (the
fraction of each kernel's fixed time, measured alone, hidden behind its neighbours in a step),
with bounds that keep them physical. Kernel efficiencies come from the engine's per-kernel fit (experiments/fit_engine_kernels.py)
and are left alone.
"""
from __future__ import annotations

import math
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import ConfigError

DATA = Path(__file__).resolve().parent / "data" / "inference_published_calibration.csv"

MODELS = {"Llama-3.1-8B": "llama-3.1-8b", "Llama-3.1-70B": "llama-3.1-70b", "Llama-3.1-405B": "llama-3.1-405b",
          "Mixtral-8x7B": "mixtral-8x7b", "Mixtral-8x22B": "mixtral-8x22b", "Llama-2-7B": "llama-2-7b",
          "Llama-2-70B": "llama-2-70b"}
REQUIRED = ("engine", "engine_version", "model", "hardware", "tp", "pp", "precision", "isl", "osl",
            "load_kind", "load_value", "metric", "value")
FIT_KEYS = ("host_step_s", "host_per_seq_s", "graph_overlap")   # EngineFit fields
_BOUNDS = {"host_step_s": (1e-5, 0.02), "host_per_seq_s": (0.0, 2e-4), "graph_overlap": (0.0, 0.95),
           "attn_decode_hbm_fraction": (0.05, 1.0)}


def hardware_name(text: str) -> str:
    t = text.upper()
    if t.startswith("H100"):
        return "h100-sxm"
    if t.startswith("A100"):
        return "a100-sxm-80gb"
    if t.startswith("H200"):
        return "h200-sxm"
    raise ConfigError(f"published row: unknown hardware {text!r}; known: H100-SXM-80GB, A100-SXM4-80GB, H200")


def precision(text: str) -> tuple[str, str]:
    """(weight dtype, kv dtype) for the CSV's precision labels."""
    t = text.upper()
    if t.startswith("FP8"):
        return "fp8", "fp8"
    if t.startswith("BF16"):
        return "bf16", "bf16"
    if t.startswith("FP16"):
        return "fp16", "fp16"
    raise ConfigError(f"published row: unknown precision {text!r}; known: FP8..., BF16, FP16")


def read_measurements(path, required) -> pd.DataFrame:
    """A measurement CSV with at least the ``required`` columns; a missing file or column is a ConfigError."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{p}: no such file")
    try:
        df = pd.read_csv(p)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{p}: not a readable CSV ({str(exc).splitlines()[0]}); expected columns "
                          f"{', '.join(required)}") from None
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise ConfigError(f"{p}: missing columns {', '.join(missing)}; expected {', '.join(required)}")
    if df.empty:
        raise ConfigError(f"{p}: no data rows under the header; add one row per measurement")
    return df


def load_published(path: str | Path | None = None) -> pd.DataFrame:
    df = read_measurements(path or DATA, REQUIRED)
    df = df[df.model.isin(MODELS)].copy()
    df["row"] = df.index
    return df.reset_index(drop=True)


def setup_of(row) -> dict:
    """SimConfig options that reproduce one published row."""
    dtype, kv = precision(row.precision)
    isl, osl = int(row.isl), int(row.osl)
    # Rows may name a servesim model directly (vLLM benchmark JSON read by servesim calibrate) and a vLLM engine.
    engine = "vllm" if str(getattr(row, "engine", "")).lower().startswith("vllm") else "trtllm"
    opts = dict(model=MODELS.get(row.model, row.model), hardware=hardware_name(row.hardware), tp=int(row.tp),
                pp=int(row.pp), dtype=dtype, kv_dtype=kv, engine=engine, isl=isl, osl=osl, seed=0)
    kind = row.load_kind
    if kind == "static_batch":
        batch = int(row.load_value)
        opts.update(scheduler="static", offline=True, max_num_seqs=batch, num_requests=batch,
                    gpu_memory_utilization=0.95,
                    max_num_batched_tokens=max(8192, batch * isl))
    elif kind == "offline_max_throughput":
        opts.update(offline=True, gpu_memory_utilization=0.95, num_requests=3000 if osl <= 256 else 1500)
    elif kind == "request_rate":
        rate = float(row.load_value)
        n = float(getattr(row, "num_requests", float("nan")))
        opts.update(num_requests=int(n) if n >= 1 else 500)
        if math.isinf(rate):
            opts.update(offline=True)
        else:
            opts.update(rate=rate)
    else:
        raise ConfigError(f"published row {row.row}: unknown load_kind {kind!r}")
    return opts


# Benchmarks that drive the engine in process on token ids, with no HTTP server: gptSessionBenchmark
# (the v0.9 static rows; TensorRT-LLM v0.9 benchmarks/cpp: the C++ GptSession fed synthetic token
# ids) and trtllm-bench (the offline rows: the executor in process on a pre-tokenised dataset). The
# engine's frontend time (HTTP, tokenisation, IPC) is not in what they time; the Triton rows
# (request_rate) keep it.
IN_PROCESS = ("static_batch", "offline_max_throughput")


def harness_fit(row) -> dict:
    """EngineFit fields the row's benchmark harness sets: no frontend for the in-process benchmarks."""
    return {"frontend_s": 0.0} if row.load_kind in IN_PROCESS else {}


def metric_of(summary: dict, row) -> float:
    """The simulated figure of a published row. Throughputs as the benchmarks measure them: completions
    over the whole run, first send to last completion, the drain included (``throughput.whole_run``;
    an offline run's own throughput is the same)."""
    m = row.metric
    bench = summary["throughput"].get("whole_run", summary["throughput"])
    if m == "output_tokens_per_s_per_gpu":
        return summary["throughput"]["output_tokens_per_s_per_gpu"]
    if m == "total_output_tokens_per_s":
        return bench["output_tokens_per_s"]
    if m == "total_tokens_per_s":
        return bench["total_tokens_per_s"]
    if m == "achieved_request_throughput":
        return bench["requests_per_s"]
    if m in ("ttft_ms", "ttft_ms_mean"):
        return summary["ttft_ms"]["mean"]
    if m == "itl_ms_mean":
        return summary["itl_ms"]["mean"]
    raise ConfigError(f"published row {row.row}: unknown metric {m!r}")


def predict(df: pd.DataFrame, engine_overrides: dict | None = None, hardware_profiles: dict | None = None,
            engine_profiles: dict | None = None) -> pd.DataFrame:
    """Simulate every row (rows sharing a setup share one run). Adds `predicted` and `rel_error`.

    ``engine_overrides``: {hardware name: {EngineFit field: value}} replacing the fit of the row's
    engine on that hardware (used by ``fit_engine``), then what the row's harness sets (``harness_fit``); ``hardware_profiles`` / ``engine_profiles``:
    in-memory profiles by name, replacing the shipped ones."""
    from ..api import SimConfig
    from ..config import load_hardware
    from ..config.engine import load_engine, with_fit_for
    from ..errors import ServesimError

    cache: dict = {}
    preds = []
    for row in df.itertuples():
        opts = setup_of(row)
        fit = {**(engine_overrides or {}).get(opts["hardware"], {}), **harness_fit(row)}
        key = tuple(sorted(opts.items())) + tuple(sorted(fit.items()))
        if key not in cache:
            try:
                hw = (hardware_profiles or {}).get(opts["hardware"]) or load_hardware(opts["hardware"])
                eng = (engine_profiles or {}).get(opts["engine"]) or load_engine(opts["engine"])
                if fit:
                    eng = with_fit_for(eng, hw, **fit)
                cache[key] = _simulate_with(hw, eng, SimConfig(**opts))
            except ServesimError as e:
                cache[key] = e
        res = cache[key]
        preds.append(float("nan") if isinstance(res, Exception) else metric_of(res, row))
    out = df.copy()
    out["predicted"] = preds
    out["rel_error"] = out.predicted / out.value - 1.0
    return out


def _simulate_with(hw, engine, cfg) -> dict:
    from ..api import simulate
    return simulate(cfg, hardware_profile=hw, engine_profile=engine).summary


def error_table(pred: pd.DataFrame, by=("split", "hardware", "metric")) -> pd.DataFrame:
    p = pred.dropna(subset=["predicted"]).copy()
    p["abs_err"] = p.rel_error.abs()
    g = p.groupby(list(by)).abs_err
    return pd.DataFrame({"n": g.size(), "median_rel_error": g.median(),
                         "p90_rel_error": g.quantile(0.9)}).reset_index()


# the order keys are taken in when the rows cannot identify all of them: host time per step moves
# every step; graph_overlap the share of the kernels' fixed time; host_per_seq only with the batch size
PRIORITY = ("host_step_s", "graph_overlap", "host_per_seq_s")
MIN_SENSITIVITY = 0.01    # a row moving < 1% when a key crosses a tenth of its range says nothing of it
MIN_CONDITION = 0.05      # smallest / largest singular value of the kept keys' sensitivities


def identifiable(df: pd.DataFrame, hardware: str, start: dict, base: dict | None = None,
                 hardware_profiles: dict | None = None, engine_profiles: dict | None = None,
                 keys=FIT_KEYS) -> tuple[tuple, dict]:
    """Which of ``keys`` the rows can fit: (keys to fit, {key held: why}). The sensitivity of each
    row's log prediction to each key (a tenth of its range, from ``start``) is taken by simulation;
    a row is informative when some key moves it by ``MIN_SENSITIVITY``; keys are taken in
    ``PRIORITY`` order while they are no more than the informative rows and their sensitivities stay
    separable (condition ratio above ``MIN_CONDITION``). One benchmark run (TTFT and ITL at one load;
    its throughput is the offered rate) identifies one key: with vLLM's asynchronous scheduling the host
    time hides behind the GPU, so that key is graph_overlap."""
    rows = df[df.hardware.map(hardware_name) == hardware]
    x0 = {k: start[k] for k in keys}
    over = {hardware: {**(base or {}), **x0}}
    p0 = np.log(np.maximum(predict(rows, over, hardware_profiles, engine_profiles).predicted.to_numpy(), 1e-12))
    cols = {}
    for k in keys:
        lo, hi = _BOUNDS[k]
        step = 0.1 * (hi - lo)
        x = dict(x0, **{k: x0[k] + step if x0[k] + step <= hi else x0[k] - step})
        pk = predict(rows, {hardware: {**(base or {}), **x}}, hardware_profiles, engine_profiles).predicted.to_numpy()
        cols[k] = np.nan_to_num((np.log(np.maximum(pk, 1e-12)) - p0) / 0.1)
    informative = int(np.sum(np.max(np.abs(np.column_stack(list(cols.values()))), axis=1) > MIN_SENSITIVITY * 10))
    chosen, held = [], {}
    for k in [k for k in PRIORITY if k in keys] + [k for k in keys if k not in PRIORITY]:
        if np.max(np.abs(cols[k])) <= MIN_SENSITIVITY * 10:
            held[k] = "no row depends on it"
            continue
        if len(chosen) + 1 > informative:
            held[k] = (f"{informative} informative row(s) fit at most {informative} key(s) (the throughput of a "
                       "stable run is its offered rate; runs at other loads or lengths add rows)")
            continue
        sv = np.linalg.svd(np.column_stack([cols[c] for c in chosen + [k]]), compute_uv=False)
        if sv[-1] < MIN_CONDITION * sv[0]:
            held[k] = f"its effect on these rows cannot be told apart from {', '.join(chosen)}'s"
            continue
        chosen.append(k)
    return tuple(chosen), held


def fit_engine(df: pd.DataFrame, hardware: str, start: dict, base: dict | None = None,
               hardware_profiles: dict | None = None, engine_profiles: dict | None = None,
               keys=FIT_KEYS) -> tuple[dict, pd.DataFrame]:
    """Least-squares fit of ``keys`` (EngineFit fields) on log(pred/measured) for one hardware
    profile's rows, each row simulated with its own engine's profile.

    ``base``: other EngineFit fields (SI) held fixed during the fit; ``hardware_profiles`` /
    ``engine_profiles``: in-memory profiles by name, as for ``predict``; ``keys``: the FIT_KEYS to fit
    (default all)."""
    from scipy.optimize import least_squares

    rows = df[df.hardware.map(hardware_name) == hardware]
    if len(rows) < len(keys) + 2:
        raise ConfigError(f"fit for {hardware}: {len(rows)} rows cannot identify {len(keys)} parameters; "
                          f"need at least {len(keys) + 2}")
    # work in scaled units so the optimiser sees O(1) steps
    scale = np.array([{"host_step_s": 1e-3, "host_per_seq_s": 1e-5}.get(k, 1.0) for k in keys])
    lo = np.array([_BOUNDS[k][0] for k in keys]) / scale
    hi = np.array([_BOUNDS[k][1] for k in keys]) / scale
    x0 = np.clip(np.array([start[k] for k in keys]) / scale, lo + 1e-9, hi - 1e-9)

    def residuals(x):
        over = {hardware: {**(base or {}), **dict(zip(keys, (x * scale).tolist()))}}
        pr = predict(rows, over, hardware_profiles, engine_profiles)
        r = np.log(np.maximum(pr.predicted.to_numpy(), 1e-12) / pr.value.to_numpy())
        return np.nan_to_num(r, nan=5.0)

    sol = least_squares(residuals, x0, bounds=(lo, hi), diff_step=0.05, max_nfev=60, x_scale="jac")
    fitted = dict(zip(keys, (sol.x * scale).tolist()))
    for k, v, a, b in zip(keys, sol.x, lo, hi):
        if v <= a * (1 + 1e-3) or v >= b * (1 - 1e-3):
            warnings.warn(f"fit for {hardware}: {k} sits at its bound ({v * scale[list(keys).index(k)]:.4g}); "
                          f"the data do not pin it down")
    return fitted, predict(rows, {hardware: {**(base or {}), **fitted}}, hardware_profiles, engine_profiles)
