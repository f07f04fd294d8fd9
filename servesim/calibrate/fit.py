"""`servesim calibrate`: fit a hardware profile's efficiencies and an engine profile's kernel and host
keys to a user's measurements, and write new profiles.

Two outputs, each from its own inputs (any mix; at least one input):

- the **hardware profile** (``-o``): ``--operators`` (GEMM, elementwise, copy, collective timings)
  and ``--training``;
- the **engine profile** (``--engine-output``, a copy of ``--engine``): ``--aiconfigurator`` (the
  engine's per-kernel tables, fitted by ``engine_fit``) and ``--serving`` (the engine's host keys).

Hardware inputs:

- **per-operator timings** (``--operators``, files or folders, searched recursively):

  * the Vidur layout: ``mlp.csv`` (``.../<gpu>/<org>/<model>/mlp.csv``, times in ms; read by
    ``operators.read_vidur_mlp``), ``all_reduce.csv`` and ``send_recv.csv`` (``.../<system>/``, read by
    ``operators.read_vidur_network``; only rows inside one node are used);
  * the native format, any other ``*.csv`` with an ``op`` column, one measurement per row (what
    ``experiments/measure/`` writes; empty cells where a column does not apply)::

        op,m,k,n,dtype,bytes,gpus,time_us
        gemm,128,4096,4096,bf16,,,31.2         # C[m,n] = A[m,k] B[k,n]; dtype bf16/fp16 (others skipped)
        allreduce,,,,,16777216,8,95.0          # bytes = message size per GPU; gpus = group size
        sendrecv,,,,,16777216,2,60.0           # point-to-point, bytes sent
        copy,,,,,1073741824,,700.0             # device-to-device copy of `bytes` (HBM traffic 2 x bytes)

    ``time_us`` is the median time of one call in microseconds. Optional columns: ``model`` (the
    group held out in the leave-one-group-out check; default the GEMM's ``k x n``), ``gpu``. Rows with
    any other ``op`` (e.g. attention) are skipped with a warning.
- **training step times** (``--training``): the shipped training CSV layout
  (``servesim/calibrate/data/training_published_calibration.csv``).

Engine inputs:

- **AIConfigurator tables** (``--aiconfigurator``): see ``servesim.calibrate.engine_fit``;
- **end-to-end serving results** (``--serving``): the shipped CSV layout
  (``servesim/calibrate/data/inference_published_calibration.csv``) or the JSON that vLLM's
  ``benchmarks/benchmark_serving.py --save-result`` writes (model / TP / hardware from CLI options);
  rows of another engine than ``--engine`` are skipped.

What is fitted, each with ``scipy.optimize.least_squares`` on log(pred / measured) inside physical
bounds, by the fit functions of ``operators``, ``serving`` and ``training`` (not re-derived here):
GEMM (``gemm_max``, ``gemm_half_tokens``, ``kernel_latency_us``, ``hbm_fraction``), elementwise /
copy (``norm_hbm_fraction``, ``rope_hbm_fraction``, ``activation_hbm_fraction`` for the kernel kinds
present, ``elementwise_latency_us``; copies stream at ``hbm_fraction``, fitted here only without GEMM
rows), scale-up collectives (all-reduce: ``scaleup_bw_fraction``, ``scaleup_latency_us``,
``collective_base_latency_us``; send-recv: ``p2p_bw_fraction``, ``p2p_latency_us``,
``p2p_large_bw_fraction`` where rows lie above ``p2p_large_message_mib``) and training
(``compute_scale``, ``overlap``: not profile keys, reported only) into the hardware profile; the
engine's kernel keys (``engine_fit``) and its end-to-end keys (``serving.FIT_KEYS``: host time per
step and per sequence, graph overlap; every other value held fixed, the kernel keys just fitted
included) into the engine profile's ``[hardware.<gpu>]`` table, ``<gpu>`` being ``-o``'s stem when
a hardware profile is written in the same call, else ``--profile``'s name.
"""
from __future__ import annotations

import json
import math
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from servesim.calibrate import engine_fit as ef
from servesim.calibrate import operators as ops
from servesim.calibrate import serving as srv
from servesim.calibrate.profile_io import EFFICIENCY_FILE_KEYS, derived_profile
from servesim.config.engine import FIT_KEYS as ENGINE_FIT_KEYS
from servesim.config.hardware import source_file
from servesim.paths import hardware_dir
from servesim.errors import ConfigError

PLAUSIBLE_OVER_PEAK = 1.2    # a row faster than 1.2 x the datasheet peak is a measurement error: left out
UNIT_SLIP = math.sqrt(1000.0)  # a file whose median row beats the datasheet limit this far is in other units
IMPLAUSIBLE_LOG_RES = math.log(3.0)  # median |log(pred/meas)| beyond this with a parameter at a bound
UNIDENTIFIED = 0.01          # full-range change of a parameter moves the rms prediction < 1%
NATIVE_OPS = {"gemm": "gemm", "allreduce": "all_reduce", "all_reduce": "all_reduce",
              "sendrecv": "send_recv", "send_recv": "send_recv", "copy": "copy"}
NATIVE_NEED = {"gemm": ("m", "k", "n", "dtype"), "all_reduce": ("bytes", "gpus"), "send_recv": ("bytes",),
               "copy": ("bytes",)}
GEMM_DTYPES = ("bf16", "fp16", "bfloat16", "float16", "half")
TRAINING_COLUMNS = ("framework", "model", "hardware", "num_gpus", "tp", "pp", "dp", "cp", "vp", "zero_or_fsdp",
                    "recompute", "precision", "seq_len", "micro_batch", "global_batch", "metric", "value")
VLLM_METRICS = {"mean_ttft_ms": "ttft_ms_mean", "mean_itl_ms": "itl_ms_mean",
                "request_throughput": "achieved_request_throughput", "output_throughput": "total_output_tokens_per_s"}
HARDWARE_INPUTS = "--operators / --training"
ENGINE_INPUTS = "--aiconfigurator / --serving"


@dataclass
class OperatorData:
    gemm: list = field(default_factory=list)         # frames: op_class gemm_*, m, k, n, time_s, group, source
    elementwise: list = field(default_factory=list)  # Vidur elementwise_frame + group, source
    copy: list = field(default_factory=list)         # nbytes, time_s, group, source
    collectives: list = field(default_factory=list)  # collective, nbytes, num_workers, time_s, group, source
    skipped: list = field(default_factory=list)      # messages
    files: list = field(default_factory=list)


@dataclass
class EngineResult:
    engine: str                  # base engine profile name
    base_path: str               # its file
    table: str                   # the [hardware.<table>] written
    base_note: str               # which of the base's tables the base values come from
    values: dict                 # fitted keys, file units
    base_values: dict            # the base values of every FIT_KEYS key for the GPU, file units
    fitted: list                 # what was fitted, "class (n rows)"
    kept: list                   # what kept the base values, and why
    inputs: list


@dataclass
class FitResult:
    profile: str                 # base profile name
    base_path: str               # base profile file
    values: dict                 # fitted [efficiency] values, file units
    base_values: dict            # the base profile's values of the same keys
    residuals: pd.DataFrame      # kind, group, label, source, measured, predicted, rel_error
    holdout: pd.DataFrame        # kind, held_out, n, median_rel_err, p90_rel_err
    warnings: list
    notes: list
    inputs: list
    training_fit: dict | None = None
    output: str | None = None            # hardware profile to write (-o)
    engine_output: str | None = None     # engine profile to write (--engine-output)
    engine: EngineResult | None = None


def _show(path) -> str:
    return ops._show(path)


# -- readers --------------------------------------------------------------------------------------

def _csv_files(path: Path) -> list[Path]:
    if path.is_dir():
        return sorted(p for p in path.rglob("*.csv") if p.is_file())
    if not path.is_file():
        raise ConfigError(f"{_show(path)}: no such file or folder")
    return [path]


def read_native(path) -> tuple[dict, list]:
    """A native per-operator CSV (format in the module docstring) -> {kind: frame}, skipped-row messages."""
    path = Path(path)
    try:
        raw = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{_show(path)}: not a readable CSV ({exc})") from None
    missing = [c for c in ("op", "time_us") if c not in raw.columns]
    if missing:
        raise ConfigError(f"{_show(path)}: missing required column(s) {', '.join(missing)}; a native operator "
                          f"CSV has op,m,k,n,dtype,bytes,gpus,time_us (see servesim calibrate --help)")
    kind = raw["op"].astype(str).str.strip().str.lower().map(NATIVE_OPS)
    skipped = []
    unknown = raw.loc[kind.isna(), "op"].astype(str).unique()
    if len(unknown):
        skipped.append(f"{_show(path)}: skipped {int(kind.isna().sum())} row(s) with op {', '.join(unknown)} "
                       f"(not fitted; known: gemm, allreduce, sendrecv, copy)")
    out = {}
    for k in ("gemm", "all_reduce", "send_recv", "copy"):
        sub = raw[kind == k]
        if sub.empty:
            continue
        need = NATIVE_NEED[k] + ("time_us",)
        lacking = [c for c in need if c not in sub.columns or sub[c].isna().any()]
        if lacking:
            raise ConfigError(f"{_show(path)}: op={k} rows need column(s) {', '.join(lacking)} filled")
        num = {}
        for c in need:
            if c == "dtype":
                continue
            v = pd.to_numeric(sub[c], errors="coerce")
            if v.isna().any() or (v <= 0).any():
                bad = sub[c][v.isna() | (v <= 0)].iloc[0]
                raise ConfigError(f"{_show(path)}: column {c} must be a positive number, got {bad!r}")
            num[c] = v.to_numpy(np.float64)
        t = num["time_us"] * 1e-6
        group = sub["model"].astype(str).to_numpy() if "model" in sub.columns else None
        if k == "gemm":
            dtype = sub["dtype"].astype(str).str.strip().str.lower()
            keep = dtype.isin(GEMM_DTYPES).to_numpy()
            if (~keep).any():
                skipped.append(f"{_show(path)}: skipped {int((~keep).sum())} GEMM row(s) with dtype "
                               f"{', '.join(dtype[~keep].unique())} (the profile's GEMM curve is fitted at 16 bits)")
            m, kk, n = num["m"], num["k"], num["n"]
            g = group if group is not None else np.array([f"k{int(a)}xn{int(b)}" for a, b in zip(kk, n)])
            out[k] = pd.DataFrame({"op_class": "gemm_native", "m": m, "k": kk, "n": n, "time_s": t,
                                   "group": g, "source": _show(path)})[keep]
        elif k == "copy":
            out[k] = pd.DataFrame({"nbytes": num["bytes"], "time_s": t, "source": _show(path),
                                   "group": group if group is not None else "copy"})
        else:
            workers = num["gpus"] if k == "all_reduce" else np.full(len(sub), 2.0)
            out[k] = pd.DataFrame({"collective": k, "op_class": k, "nbytes": num["bytes"], "num_workers": workers,
                                   "time_s": t, "source": _show(path),
                                   "group": [f"{int(w)} GPUs" for w in workers]})
    if not out and not skipped:
        raise ConfigError(f"{_show(path)}: no rows")
    return out, skipped


def read_operator_inputs(paths) -> OperatorData:
    """Every Vidur or native per-operator CSV under ``paths`` (files or folders)."""
    data = OperatorData()
    for p in paths:
        for f in _csv_files(Path(p)):
            data.files.append(_show(f))
            if f.name == "mlp.csv":
                mlp = ops.read_vidur_mlp(f)
                gemm = mlp[mlp["op_class"].str.startswith("gemm_")].copy()
                gemm["group"], gemm["source"] = gemm["model"], _show(f)
                data.gemm.append(gemm)
                elem = ops.elementwise_frame(mlp)
                elem["group"], elem["source"] = elem["model"], _show(f)
                data.elementwise.append(elem)
            elif f.name in ("all_reduce.csv", "send_recv.csv"):
                net = ops.read_vidur_network(f)
                net = net[net["intra_node"]].copy()
                net["group"] = [f"{w} GPUs" for w in net["num_workers"]]
                net["source"] = _show(f)
                data.collectives.append(net)
            else:
                frames, skipped = read_native(f)
                data.skipped += skipped
                data.gemm += [frames["gemm"]] if "gemm" in frames else []
                data.copy += [frames["copy"]] if "copy" in frames else []
                data.collectives += [frames[k] for k in ("all_reduce", "send_recv") if k in frames]
    if not data.files:
        raise ConfigError(f"--operators {', '.join(map(str, paths))}: no .csv files found")
    gpus = sorted({g for fr in data.gemm if "gpu" in fr for g in fr["gpu"].unique()})
    if len(gpus) > 1:
        raise ConfigError(f"--operators: timings of several GPUs ({', '.join(gpus)}); pass the files of one GPU")
    return data


def read_vllm_json(path, model: str | None, tp: int, hardware: str, precision: str = "BF16") -> pd.DataFrame:
    """One vLLM ``benchmark_serving.py`` result JSON -> rows in the shipped serving CSV layout
    (load_kind ``request_rate``; metrics mean TTFT, mean ITL, request and output throughput).
    ISL / OSL are the mean input / output lengths (the simulator replays fixed lengths)."""
    path = Path(path)
    try:
        d = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{_show(path)}: file not found") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{_show(path)}: not valid JSON ({exc})") from None
    if not isinstance(d, dict):
        raise ConfigError(f"{_show(path)}: expected a JSON object as benchmark_serving.py writes")
    if not model:
        raise ConfigError(f"{_show(path)}: give --model (a servesim model name) for a vLLM benchmark JSON")
    completed = d.get("completed")
    if not isinstance(completed, (int, float)) or completed < 1:
        raise ConfigError(f"{_show(path)}: key 'completed' (number of finished requests) missing or < 1")

    def mean_len(lens_key, total_key):
        if isinstance(d.get(lens_key), list) and d[lens_key]:
            return float(np.mean(d[lens_key]))
        if isinstance(d.get(total_key), (int, float)):
            return float(d[total_key]) / completed
        raise ConfigError(f"{_show(path)}: needs '{lens_key}' or '{total_key}' for the request lengths")

    isl, osl = mean_len("input_lens", "total_input_tokens"), mean_len("output_lens", "total_output_tokens")
    rate = d.get("request_rate", float("inf"))
    try:
        rate = float(rate)
    except (TypeError, ValueError):
        raise ConfigError(f"{_show(path)}: request_rate must be a number or 'inf', got {rate!r}") from None
    metrics = {VLLM_METRICS[k]: float(d[k]) for k in VLLM_METRICS if isinstance(d.get(k), (int, float))}
    if not metrics:
        raise ConfigError(f"{_show(path)}: none of the metric keys {', '.join(VLLM_METRICS)} present")
    rows = [{"source": _show(path), "engine": "vLLM", "engine_version": str(d.get("vllm_version", "")),
             "model": model, "hardware": hardware, "num_gpus": tp, "tp": tp, "pp": 1, "precision": precision,
             "isl": max(1, round(isl)), "osl": max(1, round(osl)), "load_kind": "request_rate", "load_value": rate,
             "metric": m, "value": v, "num_requests": int(completed)} for m, v in metrics.items()]
    return pd.DataFrame(rows)


def read_serving_inputs(paths, model, tp, hardware, precision) -> pd.DataFrame:
    frames = []
    for p in paths:
        p = Path(p)
        if p.suffix.lower() == ".json":
            frames.append(read_vllm_json(p, model, tp, hardware, precision))
        else:
            df = srv.load_published(p)
            df["source"] = _show(p)
            frames.append(df)
    df = pd.concat(frames, ignore_index=True)
    df["row"] = np.arange(len(df))
    return df


def read_training_inputs(path):
    from servesim.calibrate import training as trn
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{_show(path)}: file not found")
    try:
        head = pd.read_csv(path, nrows=1)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{_show(path)}: not a readable CSV ({str(exc).splitlines()[0]}); expected the layout "
                          f"of servesim/calibrate/data/training_published_calibration.csv") from None
    missing = [c for c in TRAINING_COLUMNS if c not in head.columns]
    if missing:
        raise ConfigError(f"{_show(path)}: missing required column(s) {', '.join(missing)}; expected the layout "
                          f"of servesim/calibrate/data/training_published_calibration.csv")
    if head.empty:
        raise ConfigError(f"{_show(path)}: no data rows under the header; add one row per measured training run")
    cases, _ = trn.load_cases(path)
    return cases


# -- checks ---------------------------------------------------------------------------------------

def _at_bound(values: dict, bounds: dict) -> list[str]:
    out = []
    for k, v in values.items():
        lo, hi = bounds[k]
        tol = 1e-3 * (hi - lo)
        if v - lo <= tol or hi - v <= tol:
            out.append(k)
    return out


def _sensitivity(pred_fn, values: dict, bounds: dict) -> dict:
    """rms d log(pred) per full-range change of each parameter (finite difference at the solution)."""
    base = np.log(np.maximum(pred_fn(values), 1e-30))
    out = {}
    for k, v in values.items():
        lo, hi = bounds[k]
        step = 1e-3 * (hi - lo)
        trial = dict(values)
        trial[k] = v + step if v + step <= hi else v - step
        d = (np.log(np.maximum(pred_fn(trial), 1e-30)) - base) / (abs(trial[k] - v) / (hi - lo))
        out[k] = float(np.sqrt(np.nanmean(d ** 2)))
    return out


def _unit_check(what: str, fitted: dict, bounds: dict, pred, meas, hint_slow: str, hint_fast: str) -> None:
    """Parameters at a bound with a huge median miss: the data are in other units than the header says."""
    log_res = np.log(np.asarray(pred) / np.asarray(meas))
    med = float(np.nanmedian(np.abs(log_res)))
    stuck = _at_bound(fitted, bounds)
    if stuck and med > IMPLAUSIBLE_LOG_RES:
        hint = hint_slow if np.nanmedian(log_res) < 0 else hint_fast
        raise ConfigError(f"{what}: fit is implausible ({', '.join(stuck)} at a bound, predictions a median "
                          f"{math.exp(med):.0f}x off the measurements); {hint}; no profile written")


def _faster_than(what: str, frame: pd.DataFrame, achieved, limit: float, unit_hint: str, warn: list,
                 cap: float = PLAUSIBLE_OVER_PEAK, why: str = "a measurement error") -> pd.DataFrame:
    """Units checked file by file against the file's own rows: a unit slip (ms written as us, bytes as
    KB) moves every row of a file 1000x, so a file whose *median* row runs beyond ``UNIT_SLIP`` x the
    datasheet limit is refused with ``unit_hint``. Single rows beyond ``cap`` x the limit (a cache-
    resident copy runs faster than HBM; a noisy GEMM just above the peak) are not units: they are left
    out of the fit, with a warning saying ``why``. Returns the rows kept."""
    ratio = np.asarray(achieved, dtype=np.float64) / limit
    if not len(ratio):
        return frame
    src = frame["source"].astype(str).to_numpy() if "source" in frame else np.full(len(ratio), "")
    for f in dict.fromkeys(src):
        med = float(np.nanmedian(ratio[src == f]))
        if med > UNIT_SLIP:
            where = f" of {f}" if f else ""
            raise ConfigError(f"{what}{where}: the median row runs at {med:.3g}x the datasheet limit; {unit_hint}; "
                              "no profile written")
    over = ratio > cap
    if over.any():
        warn.append(f"{what}: {int(over.sum())} of {len(ratio)} row(s) run faster than {cap:g}x the datasheet "
                    f"limit (up to {float(np.nanmax(ratio)):.3g}x): {why}; left out of the fit")
    return frame[~over].reset_index(drop=True)


# -- fits -----------------------------------------------------------------------------------------

def _quiet(fn, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args)


def _capture(fn, *args):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fn(*args)
    return out, [str(w.message) for w in caught]


def _holdout(kind: str, frame: pd.DataFrame, refit, predict) -> list[dict]:
    groups = list(dict.fromkeys(frame["group"].astype(str)))
    if len(groups) < 2:
        return []
    rows = []
    for g in groups:
        held = frame["group"].astype(str) == g
        try:
            params = _quiet(refit, frame[~held])
        except ConfigError as e:
            rows.append({"kind": kind, "held_out": g, "n": int(held.sum()), "median_rel_err": np.nan,
                         "p90_rel_err": np.nan, "note": str(e)})
            continue
        err = np.abs(predict(frame[held], params) / frame[held]["time_s"].to_numpy() - 1.0)
        rows.append({"kind": kind, "held_out": g, "n": int(held.sum()), "median_rel_err": float(np.median(err)),
                     "p90_rel_err": float(np.quantile(err, 0.9)), "note": ""})
    return rows


def _residual_rows(kind, frame, pred, label_cols) -> pd.DataFrame:
    label = frame[label_cols].astype(str).agg(" ".join, axis=1) if label_cols else ""
    return pd.DataFrame({"kind": kind, "group": frame["group"].astype(str).to_numpy(), "label": label,
                         "source": frame["source"].to_numpy(), "measured": frame["time_s"].to_numpy(),
                         "predicted": pred, "rel_error": pred / frame["time_s"].to_numpy() - 1.0})


def _check_fit(kind, fitted, bounds, pred_fn, warn, what_unit_slow, what_unit_fast, pred, meas):
    _unit_check(kind, fitted, bounds, pred, meas, what_unit_slow, what_unit_fast)
    for k, s in _sensitivity(pred_fn, fitted, bounds).items():
        if s < UNIDENTIFIED:
            warn.append(f"{kind}: the data cannot identify {k} (moving it across its whole range changes the "
                        f"predictions by {100 * s:.2g}% rms); it is a guess, not a fit")


def fit_operators(data: OperatorData, hw, holdout: bool = True):
    """Fitted values (file units), residual frame, hold-out rows, warnings."""
    values, res, hold, warn = {}, [], [], list(data.skipped)
    params = ops.profile_params(hw)
    peak = hw.peak_flops["fp16"]
    if data.gemm:
        g = pd.concat(data.gemm, ignore_index=True)
        g = g[np.isfinite(g["time_s"]) & (g["time_s"] > 0) & (g["m"] >= 1)].reset_index(drop=True)
        g = _faster_than("GEMM rows", g, 2.0 * g["m"] * g["k"] * g["n"] / g["time_s"], peak,
                         "a GEMM cannot beat the fp16 peak: the times look 1000x too small (milliseconds written "
                         "as time_us?)", warn)
        fitted, w = _capture(ops.fit_gemm, g, hw)
        warn += w

        def pred_g(p, frame=g):
            return ops.predict_gemm(frame, hw, {**params, **p})

        _check_fit("GEMM", fitted, ops.BOUNDS, pred_g, warn, "the times look 1000x too large (nanoseconds "
                   "written as time_us?)", "the times look 1000x too small (milliseconds written as time_us?)",
                   pred_g(fitted), g["time_s"].to_numpy())
        values.update(fitted)
        res.append(_residual_rows("gemm", g, pred_g(fitted), ["op_class", "m", "k", "n"]))
        if holdout:
            hold += _holdout("gemm", g, lambda f: ops.fit_gemm(f, hw), lambda f, p: pred_g(p, f))
    lat = {**params, **values}
    if data.elementwise or data.copy:
        fitted, w, pred_e = _fit_memory(data, hw, lat, warn, res, hold, holdout)
        values.update(fitted)
    if data.collectives:
        c = pd.concat(data.collectives, ignore_index=True)
        c = c[np.isfinite(c["time_s"]) & (c["time_s"] > 0)].reset_index(drop=True)
        n = c["num_workers"].to_numpy(np.float64)
        busbw = np.where(c["collective"] == "all_reduce", 2.0 * (n - 1) / n, 1.0) * c["nbytes"] / c["time_s"]
        c = _faster_than("collective rows", c, busbw.to_numpy(), hw.scaleup_bw,
                         "no collective beats the scale-up link: bytes look 1000x too large or time_us 1000x too "
                         "small", warn)
        fitted, w = _capture(ops.fit_collectives, c, hw)
        warn += w

        def pred_c(p, frame=c):
            return ops.predict_collectives(frame, hw, {**params, **p})

        _check_fit("collectives", fitted, ops.BOUNDS, pred_c, warn, "the times look 1000x too large "
                   "(nanoseconds?) or bytes 1000x too small (KB?)", "the times look 1000x too small "
                   "(milliseconds?) or bytes 1000x too large", pred_c(fitted), c["time_s"].to_numpy())
        values.update(fitted)
        res.append(_residual_rows("collective", c, pred_c(fitted), ["collective", "num_workers", "nbytes"]))
        if holdout:
            hold += _holdout("collective", c, lambda f: ops.fit_collectives(f, hw), lambda f, p: pred_c(p, f))
    return values, res, hold, warn


def _fit_memory(data: OperatorData, hw, params: dict, warn, res, hold, holdout):
    """Elementwise parameters from Vidur elementwise kernel rows (norms, rope, activation, residual
    adds) and native copy rows (one streaming kernel moving 2 x bytes), jointly: the fraction of each
    kernel kind present plus ``elementwise_latency_us``; ``hbm_fraction`` (the streaming kind's) too
    when no GEMM rows fixed it."""
    parts = []
    if data.elementwise:
        e = pd.concat(data.elementwise, ignore_index=True)
        parts.append(pd.DataFrame({"kind": e["kind"].to_numpy(), "nbytes": e["nbytes"].to_numpy(),
                                   "time_s": e["time_s"].to_numpy(), "group": e["group"].to_numpy(),
                                   "source": e["source"].to_numpy(), "what": e["op"].to_numpy()}))
    if data.copy:
        c = pd.concat(data.copy, ignore_index=True)
        parts.append(pd.DataFrame({"kind": "stream", "nbytes": 2.0 * c["nbytes"].to_numpy(),
                                   "time_s": c["time_s"].to_numpy(), "group": c["group"].to_numpy(),
                                   "source": c["source"].to_numpy(), "what": "copy"}))
    m = pd.concat(parts, ignore_index=True)
    m = m[np.isfinite(m["time_s"]) & (m["time_s"] > 0)].reset_index(drop=True)
    m = _faster_than("copy / elementwise rows", m, (m["nbytes"] / m["time_s"]).to_numpy(), hw.hbm_bw,
                     "nothing streams faster than HBM: bytes look 1000x too large or time_us 1000x too small", warn,
                     cap=1.0, why="their working set stays in the GPU's cache, which the HBM fractions do not "
                                  "describe")
    present = set(m["kind"])
    free = ops.kind_fractions_present(present)
    if "stream" in present and not data.gemm:
        free.append("hbm_fraction")
    free.append("elementwise_latency_us")

    def pred(p, frame=m):
        return ops.predict_elementwise(frame, hw, {**params, **p})

    def fit(frame):
        return ops.fit_elementwise(frame, hw, params, free)

    fitted, w = _capture(fit, m)
    warn += w
    _check_fit("copy / elementwise", fitted, ops.BOUNDS, pred, warn, "the times look 1000x too large "
               "(nanoseconds?)", "the times look 1000x too small (milliseconds?)", pred(fitted), m["time_s"].to_numpy())
    res.append(_residual_rows("memory", m, pred(fitted), ["what", "nbytes"]))
    if holdout:
        hold += _holdout("memory", m, fit, lambda f, p: pred(p, f))
    return fitted, w, pred


def _row_family(text: str) -> str:
    t = str(text).lower()
    return "vllm" if t.startswith("vllm") else "sglang" if t.startswith("sglang") else "trtllm"


def fit_serving_rows(df: pd.DataFrame, hw, engine, hw_values: dict, kernel_values: dict, holdout: bool = True):
    """The engine's end-to-end keys (``serving.FIT_KEYS``) on the serving rows measured on ``hw``
    with ``engine``'s family, each row simulated with the base engine profile ``engine`` (the kernel
    keys ``kernel_values`` applied, file units) on ``hw`` (the operator-fitted ``hw_values`` applied).
    Returns fitted values (file units), residual frame, hold-out rows, warnings, rows simulated."""
    from servesim.config.hardware import with_efficiency
    warn = []
    try:
        names = df["hardware"].map(srv.hardware_name)
    except ConfigError as e:
        raise ConfigError(f"--serving: {e}") from None
    if hw.name not in ("h100-sxm", "a100-sxm-80gb", "h200-sxm"):
        raise ConfigError(f"--serving: end-to-end rows are simulated on the shipped h100-sxm, a100-sxm-80gb or "
                          f"h200-sxm profile; {hw.name!r} is none of them")
    other = names != hw.name
    if other.any():
        warn.append(f"serving: skipped {int(other.sum())} row(s) measured on {', '.join(sorted(set(names[other])))} "
                    f"(base profile is {hw.name})")
    fam = ef.family(engine.name)
    row_fam = df["engine"].map(_row_family)
    foreign = (row_fam != fam) & ~other if fam else pd.Series(False, index=df.index)
    if foreign.any():
        if (~other & ~foreign).sum() == 0:
            found = ", ".join(sorted(set(row_fam[foreign])))
            raise ConfigError(f"--serving: no row measured with {fam} (the rows are {found}); pass --engine "
                              f"{found.split(', ')[0]} to fit that engine")
        warn.append(f"serving: skipped {int(foreign.sum())} row(s) measured with another engine than {fam} "
                    f"({', '.join(sorted(set(row_fam[foreign])))})")
    rows = df[~other & ~foreign].reset_index(drop=True)
    hw_fit = with_efficiency(hw, **{EFFICIENCY_FILE_KEYS[k][0]: v / EFFICIENCY_FILE_KEYS[k][1]
                                    for k, v in hw_values.items()})
    profiles = {"hardware_profiles": {hw.name: hw_fit}, "engine_profiles": {"vllm": engine, "trtllm": engine}}
    base = ef.si_values(kernel_values)
    current = engine.fit_for(hw)
    start = {k: max(getattr(current, k), 1e-4) if k != "graph_overlap" else getattr(current, k) for k in srv.FIT_KEYS}
    bounds = {k: srv._BOUNDS[k] for k in srv.FIT_KEYS}
    true = {k: getattr(current, k) for k in srv.FIT_KEYS}      # the base values (start is kept off zero)
    keys, fixed = srv.identifiable(rows, hw.name, true, base, **profiles)
    if not keys:
        raise ConfigError(f"--serving: these {len(rows)} row(s) identify none of host_step_us, graph_overlap, "
                          f"host_per_seq_us ({'; '.join(f'{k}: {v}' for k, v in fixed.items())}); no profile written")
    start_all = dict(start)
    start = {k: start_all[k] for k in keys}
    base = {**base, **{k: true[k] for k in fixed}}   # held at the base engine's values
    bounds = {k: bounds[k] for k in keys}
    key_of = {fld: key for key, fld, _ in ENGINE_FIT_KEYS}
    for k, why in fixed.items():
        v = true[k] * (1e6 if key_of[k].endswith("_us") else 1.0)
        warn.append(f"serving: {key_of[k]} held at the base value {v:.4g} ({why})")
    (fitted, pred), w = _capture(lambda *a: srv.fit_engine(*a, keys=keys, **profiles), rows, hw.name, start, base)
    warn += w
    ok = pred.dropna(subset=["predicted"])
    if ok.empty:
        raise ConfigError("serving: no row could be simulated (every setup infeasible); no profile written")

    def pred_fn(p):
        return srv.predict(ok, {hw.name: {**base, **p}}, **profiles).predicted.to_numpy()

    _check_fit("serving", fitted, bounds, pred_fn, warn, "the measurements look 1000x too large "
               "(TTFT/ITL in microseconds, or throughput per ms?)", "the measurements look 1000x too small "
               "(TTFT/ITL in seconds rather than ms?)", ok.predicted.to_numpy(), ok.value.to_numpy())
    group_col = "model" if rows["model"].nunique() > 1 else "tp"
    r = pd.DataFrame({"kind": "serving", "group": ok[group_col].astype(str), "label": ok["metric"] + " " +
                      ok["model"].astype(str) + " tp" + ok["tp"].astype(str) + " isl" + ok["isl"].astype(str) +
                      " osl" + ok["osl"].astype(str) + " " + ok["load_kind"] + "=" + ok["load_value"].astype(str),
                      "source": ok["source"], "measured": ok["value"], "predicted": ok["predicted"],
                      "rel_error": ok["rel_error"]})
    hold = []
    groups = list(dict.fromkeys(rows[group_col].astype(str)))
    if holdout and len(groups) > 1:
        for g in groups:
            held = rows[group_col].astype(str) == g
            try:
                f, _ = _quiet(lambda *a: srv.fit_engine(*a, keys=keys, **profiles), rows[~held], hw.name, start, base)
            except ConfigError as e:
                hold.append({"kind": "serving", "held_out": f"{group_col} {g}", "n": int(held.sum()),
                             "median_rel_err": np.nan, "p90_rel_err": np.nan, "note": str(e)})
                continue
            err = srv.predict(rows[held], {hw.name: {**base, **f}}, **profiles).rel_error.abs().dropna()
            hold.append({"kind": "serving", "held_out": f"{group_col} {g}", "n": int(err.size),
                         "median_rel_err": float(err.median()), "p90_rel_err": float(err.quantile(0.9)), "note": ""})
    file_values = {key_of[k]: v * (1e6 if key_of[k].endswith("_us") else 1.0) for k, v in fitted.items()}
    return file_values, r, hold, warn, len(ok)


def fit_training_rows(cases, hw, holdout: bool = True):
    from servesim.calibrate import training as trn
    warn = []
    mine = [c for c in cases if c.hardware == hw.name]
    if not mine:
        found = ", ".join(sorted({c.hardware for c in cases}))
        raise ConfigError(f"training: 0 usable row(s) on {hw.name} (the rows are on {found}); the fit needs rows of "
                          f"the --profile's GPU, e.g. --profile {found.split(', ')[0]}; no profile written")
    if len(mine) < len(cases):
        warn.append(f"training: skipped {len(cases) - len(mine)} row(s) on other hardware than {hw.name}")
    first = trn.predict(mine)
    priced = set(first.loc[np.isfinite(first["predicted_tokens_per_s_per_gpu"]), "row"])
    if len(priced) < len(mine):
        warn.append(f"training: skipped {len(mine) - len(priced)} row(s) the model cannot price "
                    f"({first.loc[~first['row'].isin(priced), 'error'].iloc[0]})")
        mine = [c for c in mine if c.row in priced]
    if len(mine) < 4:
        raise ConfigError(f"training: {len(mine)} usable row(s) on {hw.name}; fitting compute_scale and overlap "
                          f"needs at least 4; no profile written")
    groups = tuple(sorted({c.group for c in mine}))
    fit, _ = trn.fit_parameters(mine, groups)
    df = trn.predict(mine, fit)
    ok = df.dropna(subset=["predicted_tokens_per_s_per_gpu"])
    bounds = {"compute_scale": (0.3, 1.3), "overlap": (0.0, 1.0)}
    fitted = {"compute_scale": fit.compute_scale, "overlap": fit.overlap}
    for k in _at_bound(fitted, bounds):
        warn.append(f"training: {k} = {fitted[k]:.4g} sits at its bound; the data do not pin it down")
    med = float(np.median(np.abs(np.log(ok.predicted_tokens_per_s_per_gpu / ok.published_tokens_per_s_per_gpu))))
    if med > IMPLAUSIBLE_LOG_RES:
        raise ConfigError(f"training: predictions a median {math.exp(med):.0f}x off the measurements; check the "
                          f"units of value (step_time_s in seconds, tokens/s per GPU); no profile written")
    model_of = {c.row: c.model.name for c in mine}
    r = pd.DataFrame({"kind": "training", "group": ok["row"].map(model_of).astype(str), "label": ok["case"],
                      "source": "training", "measured": ok["published_tokens_per_s_per_gpu"],
                      "predicted": ok["predicted_tokens_per_s_per_gpu"], "rel_error": ok["rel_error"]})
    hold = []
    key = (lambda c: c.group) if len(groups) > 1 else (lambda c: c.model.name)
    names = list(dict.fromkeys(key(c) for c in mine))
    if holdout and len(names) > 1:
        for g in names:
            rest = [c for c in mine if key(c) != g]
            held = [c for c in mine if key(c) == g]
            if len(rest) < 4:
                continue
            f, _ = trn.fit_parameters(rest, tuple(sorted({c.group for c in rest})))
            err = trn.predict(held, f).rel_error.abs().dropna()
            hold.append({"kind": "training", "held_out": g, "n": int(err.size), "median_rel_err": float(err.median()),
                         "p90_rel_err": float(err.quantile(0.9)), "note": ""})
    return fitted, r, hold, warn


def training_gemm_max(tfit: dict, hw, values: dict, warn: list) -> str:
    """The profile key training rows identify: the training model runs GEMMs at ``gemm_max`` x the
    architecture's ``compute_scale`` (servesim.training.params), so a ``compute_scale`` fitted on the
    rows of ``hw`` is written as gemm_max x fitted / shipped scale, which gives those GEMMs on a profile
    of this architecture. ``overlap`` is no profile key (reported). Sets ``values["gemm_max"]`` unless
    operator GEMM rows fitted it; a scale at its bound identifies nothing: a ConfigError. Returns the
    note for the report."""
    from servesim.training.framework import efficiency_architecture
    from servesim.training.params import FITTED
    arch = efficiency_architecture(hw)
    shipped = FITTED.scale_for(arch)
    scale, overlap = tfit["compute_scale"], tfit["overlap"]
    head = (f"training: compute_scale = {scale:.4f} on {hw.name}'s rows (shipped {arch}: {shipped:.4f}), overlap = "
            f"{overlap:.4f} (servesim.training.params.TrainingFit, reported: not a profile key)")
    if "gemm_max" in values:
        return head + "; gemm_max taken from the operator GEMM rows, the training scale only reported"
    if any("compute_scale" in line and "bound" in line for line in warn):
        raise ConfigError(f"training: the rows cannot identify gemm_max: compute_scale = {scale:.4g} sits at its "
                          f"bound (the rows' step times barely depend on the GEMMs, or they are off by a factor); "
                          f"no profile written")
    g = hw.efficiency.gemm_max * scale / shipped
    if g > 1.0:
        warn.append(f"training: gemm_max {g:.4g} (from compute_scale {scale:.4g}) clipped to 1")
    values["gemm_max"] = min(g, 1.0)
    return head + (f"; written as gemm_max = {hw.efficiency.gemm_max:.4g} x {scale:.4f} / {shipped:.4f} = "
                   f"{values['gemm_max']:.4g}, which the training model scales back by {arch}'s {shipped:.4f}")


# -- orchestration --------------------------------------------------------------------------------

def check_output(output, force: bool) -> Path:
    from servesim.config import list_hardware
    out = Path(output)
    if out.suffix != ".toml":
        raise ConfigError(f"--output {output}: a hardware profile must end in .toml")
    if out.exists() and not force:
        raise ConfigError(f"--output {output}: file exists; pass --force to overwrite it")
    if out.stem in list_hardware() and not force:
        raise ConfigError(f"--output {output}: {out.stem!r} is a shipped profile name; choose another name "
                          f"or pass --force")
    return out


def check_options(output, engine_output, engine, operators, serving, training, aiconfigurator, force: bool) -> None:
    """Which inputs go with which output; every bad combination is one ConfigError naming the option."""
    hw_in = bool(operators or training)
    eng_in = bool(serving or aiconfigurator)
    if not hw_in and not eng_in:
        raise ConfigError(f"give at least one input: {HARDWARE_INPUTS} (a hardware profile, -o) or "
                          f"{ENGINE_INPUTS} (an engine profile, --engine-output)")
    if hw_in and not output:
        raise ConfigError(f"-o/--output is required with {HARDWARE_INPUTS}: the hardware profile to write, "
                          f"e.g. -o my-h100.toml")
    if eng_in and not engine_output:
        raise ConfigError(f"--engine-output is required with {ENGINE_INPUTS}: the engine profile to write, "
                          f"e.g. --engine-output my-vllm.toml")
    if output and not hw_in:
        raise ConfigError(f"-o/--output {output}: writes a hardware profile fitted from {HARDWARE_INPUTS}, and "
                          f"none is given; {ENGINE_INPUTS} write --engine-output")
    if engine_output and not eng_in:
        raise ConfigError(f"--engine-output {engine_output}: writes an engine profile fitted from {ENGINE_INPUTS}, "
                          f"and none is given; {HARDWARE_INPUTS} write -o")
    if engine is not None and not eng_in:
        raise ConfigError(f"--engine {engine}: names the base engine profile of {ENGINE_INPUTS}; give one of them "
                          f"or drop --engine")
    if output and engine_output and Path(output).resolve() == Path(engine_output).resolve():
        raise ConfigError(f"-o and --engine-output both name {output}; write the two profiles to two files")
    if output:
        check_output(output, force)
    if engine_output:
        ef.check_engine_output(engine_output, force)


def calibrate(profile: str, output=None, operators=(), serving=(), training=None, model=None, tp: int = 1,
              hardware=None, precision: str = "BF16", force: bool = False, holdout: bool = True,
              aiconfigurator=None, engine=None, engine_output=None) -> FitResult:
    """Fit, check and return the result; ``write_outputs`` writes the profiles and the report.

    ``output``: the hardware profile to write (from ``operators`` / ``training``); ``engine_output``:
    the engine profile to write (from ``aiconfigurator`` / ``serving``, on top of ``engine``, default
    ``vllm``)."""
    from servesim.config import load_hardware
    from servesim.config.engine import load_engine
    check_options(output, engine_output, engine, operators, serving, training, aiconfigurator, force)
    hw = load_hardware(profile)
    eng = load_engine(engine or "vllm") if engine_output else None
    folder = ef.resolve_folder(aiconfigurator, eng.name) if aiconfigurator else None
    values, res, hold, warn, notes, inputs = {}, [], [], [], [], []
    tfit = None
    if operators:
        data = read_operator_inputs(operators)
        inputs += data.files
        v, r, h, w = fit_operators(data, hw, holdout)
        values.update(v)
        res += [f.assign(profile="hardware") for f in r]
        hold += [{**x, "profile": "hardware"} for x in h]
        warn += w
    if training:
        cases = read_training_inputs(training)
        inputs.append(_show(training))
        tfit, r, h, w = fit_training_rows(cases, hw, holdout)
        res.append(r.assign(profile="hardware"))
        hold += [{**x, "profile": "hardware"} for x in h]
        warn += w
        notes.append(training_gemm_max(tfit, hw, values, warn))
    eng_result = None
    if eng is not None:
        base_fit = eng.fit_for(hw)
        base_values = ef.file_values(base_fit)
        eng_values, fitted, kept, eng_inputs = {}, [], [], []
        if folder is not None:
            kf = ef.fit_kernels(folder, hw, base_values, ef.family(eng.name) or eng.name, holdout)
            eng_values.update(kf.values)
            fitted += kf.fitted
            kept += kf.kept
            eng_inputs.append(kf.folder)
            res.append(kf.residuals.assign(profile="engine"))
            hold += [{**x, "profile": "engine"} for x in kf.holdout]
            warn += kf.warnings
        else:
            kept.append("kernel keys: no --aiconfigurator tables")
        if serving:
            df = read_serving_inputs(serving, model, tp, hardware or hw.name, precision)
            eng_inputs += sorted(set(df["source"]))
            v, r, h, w, n = fit_serving_rows(df, hw, eng, values, eng_values, holdout)
            eng_values.update(v)
            fitted.append(f"{', '.join(v)} ({n} serving rows)")
            held = [k for k, f, _ in ENGINE_FIT_KEYS if f in srv.FIT_KEYS and k not in v]
            if held:
                kept.append(f"{', '.join(held)}: held at the base values (the serving rows cannot identify them)")
            res.append(r.assign(profile="engine"))
            hold += [{**x, "profile": "engine"} for x in h]
            warn += w
        from servesim.config.engine import FIT_KEYS
        rest = [k for k, _, _ in FIT_KEYS if k not in eng_values and not k.startswith(
            ("gemm_", "attn_", "allreduce_", "moe_")) and not any(k in line and "held at" in line for line in kept)]
        if rest:
            kept.append(f"{', '.join(rest)}: not given by these inputs")
        table = Path(output).stem if output else hw.name
        eng_result = EngineResult(engine=eng.name, base_path=str(eng.path), table=table,
                                  base_note=f"{eng.name}'s {base_fit.fitted_on} table", values=eng_values,
                                  base_values=base_values, fitted=fitted, kept=kept, inputs=eng_inputs)
        inputs += eng_inputs
    pp = ops.profile_params(hw)
    base_values = {k: (pp[k] if k in pp else getattr(hw.efficiency, EFFICIENCY_FILE_KEYS[k][0])
                       * EFFICIENCY_FILE_KEYS[k][1]) for k in values}
    cols = ["profile", "kind", "group", "label", "source", "measured", "predicted", "rel_error"]
    residuals = pd.concat(res, ignore_index=True)[cols] if res else pd.DataFrame(columns=cols)
    holdout_df = pd.DataFrame(hold, columns=["profile", "kind", "held_out", "n", "median_rel_err", "p90_rel_err",
                                             "note"])
    return FitResult(profile=hw.name, base_path=str(hw.path), values=values, base_values=base_values,
                     residuals=residuals, holdout=holdout_df, warnings=warn, notes=notes, inputs=inputs,
                     training_fit=tfit, output=str(output) if output else None,
                     engine_output=str(engine_output) if engine_output else None, engine=eng_result)


def _files(paths) -> str:
    return ", ".join(Path(p).name for p in paths[:6]) + (" ..." if len(paths) > 6 else "")


def _clean_source(text: str) -> str:
    return text.replace('"', "'").replace("\\", "/").replace("\n", " ")


def fit_source(result: FitResult, report_dir: Path) -> str:
    """The hardware profile's fit_source: its inputs and kinds of rows."""
    own = result.residuals[result.residuals["profile"] == "hardware"]
    eng_inputs = set(result.engine.inputs) if result.engine else set()
    files = _files([p for p in result.inputs if p not in eng_inputs])
    kinds = ", ".join(f"{k} ({n} rows)" for k, n in own["kind"].value_counts(sort=False).items())
    return _clean_source(f"servesim calibrate from {result.profile} on {files}: {kinds}; "
                         f"report {Path(report_dir).name}/report.md")


def engine_fit_source(result: FitResult, report_dir: Path) -> str:
    """The engine table's fit_source: what was fitted on which inputs, and what kept the base values."""
    e = result.engine
    text = (f"servesim calibrate from {e.base_note} on {result.profile} with {_files(e.inputs)}: fitted "
            f"{', '.join(e.fitted)}; kept from {e.base_note}: {'; '.join(e.kept) or 'nothing'}; "
            f"report {Path(report_dir).name}/report.md")
    return _clean_source(text)


def profile_text(result: FitResult, output, report_dir=None) -> str:
    """The new profile's text, checked by loading it (under its own stem) before anything is written."""
    from servesim.config import load_hardware
    output = Path(output)
    hw = load_hardware(result.base_path)
    rep = Path(report_dir) if report_dir else default_report_dir(output)
    source = engine_fit_source_of(hw, output)
    text = derived_profile(hw, output.stem, result.values, fit_source(result, rep), source)
    with tempfile.TemporaryDirectory() as tmp:
        trial = Path(tmp) / f"{output.stem}.toml"
        trial.write_text(text)
        found = source_file(source, output) if source else None
        if found is not None and found.parent != hardware_dir():    # a sibling of the output: beside the trial too
            (Path(tmp) / found.name).write_text(found.read_text())
        load_hardware(str(trial))
    return text


def engine_fit_source_of(base, output: Path) -> str:
    """The profile a calibrated copy of ``base`` written to ``output`` borrows its engine fits from: the
    base itself, else the profile the base borrows from, the first whose file is found from the
    output's folder ("" when none is)."""
    from servesim.config.hardware import borrow_chain
    for name in [base.name] + borrow_chain(base):
        if name != Path(output).stem and source_file(name, output) is not None:
            return name
    return ""


def engine_text(result: FitResult, report_dir) -> str:
    """The new engine profile's text (a copy of the base engine profile named by ``--engine-output``'s
    stem, its ``[hardware.<table>]`` holding the fitted values over the base ones), checked by loading."""
    e = result.engine
    values = {**e.base_values, **e.values}
    return ef.engine_profile_text(e.base_path, Path(result.engine_output).stem, e.table, values,
                                  engine_fit_source(result, Path(report_dir)))


def default_report_dir(output) -> Path:
    return Path(output).with_name(f"{Path(output).stem}-fit")


def summary(residuals: pd.DataFrame) -> pd.DataFrame:
    """n, median and p90 |relative error| per profile and kind of row."""
    e = residuals.assign(abs_err=residuals["rel_error"].abs().astype(float))
    g = e.groupby(["profile", "kind"], sort=False)["abs_err"]
    return pd.DataFrame({"n": g.size(), "median_rel_err": g.median(), "p90_rel_err": g.quantile(0.9)}).reset_index()


def _pct(v) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{100 * v:.1f}%"


def report_markdown(result: FitResult, command: str) -> str:
    """The fit report: fitted values of each profile, in-sample and held-out errors, warnings."""
    from servesim.config.engine import FIT_KEYS
    key_of = {fld: key for key, fld, _ in FIT_KEYS}
    host = {key_of[k]: (lo * 1e6, hi * 1e6) if key_of[k].endswith("_us") else (lo, hi)
            for k, (lo, hi) in srv._BOUNDS.items()}

    def bound(key, table):
        lo, hi = table.get(key, (math.nan, math.nan))
        return "-" if lo != lo else f"[{lo:g}, {hi:g}]"
    names = [Path(p).stem for p in (result.output, result.engine_output) if p]
    lines = [f"# Calibration of {' and '.join(f'`{n}`' for n in names)} (from `{result.profile}`"
             + (f", engine `{result.engine.engine}`)" if result.engine else ")"), "",
             f"Regenerate: `{command}`", "", "Inputs: " + ", ".join(f"`{p}`" for p in result.inputs), ""]
    if result.output:
        lines += [f"## Fitted parameters: hardware profile `{Path(result.output).name}`", "",
                  "| key | base | fitted | bounds |", "|---|---:|---:|---|"]
        for k, v in result.values.items():
            lines.append(f"| {k} | {result.base_values[k]:.4g} | {v:.4g} | {bound(k, ops.BOUNDS)} |")
        lines.append("")
    if result.engine:
        e = result.engine
        lines += [f"## Fitted parameters: engine profile `{Path(result.engine_output).name}` "
                  f"`[hardware.{e.table}]`", "", f"Base values: {e.base_note} (`{e.engine}` on {result.profile}).", "",
                  "| key | base | fitted | bounds |", "|---|---:|---:|---|"]
        for k, v in e.values.items():
            lines.append(f"| {k} | {e.base_values[k]:.4g} | {v:.4g} | {bound(k, {**ef.ek.BOUNDS, **host})} |")
        lines += ["", "Fitted: " + "; ".join(e.fitted) + ".", "",
                  "Kept from the base: " + ("; ".join(e.kept) or "nothing") + ".", ""]
    lines += ["## Error |predicted / measured - 1| (fitted rows)", "", "| profile | rows | n | median | p90 |",
              "|---|---|---:|---:|---:|"]
    for r in summary(result.residuals).itertuples():
        lines.append(f"| {r.profile} | {r.kind} | {r.n} | {_pct(r.median_rel_err)} | {_pct(r.p90_rel_err)} |")
    lines += ["", "## Leave-one-group-out and k-fold by group (refit without the group, predict it)", ""]
    if result.holdout.empty:
        lines.append("Not available: each kind of input has a single group (one model / layout).")
    else:
        lines += ["| profile | rows | held out | n | median | p90 | note |", "|---|---|---|---:|---:|---:|---|"]
        for r in result.holdout.itertuples():
            lines.append(f"| {r.profile} | {r.kind} | {r.held_out} | {r.n} | {_pct(r.median_rel_err)} | "
                         f"{_pct(r.p90_rel_err)} | {r.note} |")
    lines += ["", "## Warnings", ""] + ([f"- {w}" for w in result.warnings] or ["None."])
    if result.notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in result.notes]
    lines += ["", "Per-row residuals: `residuals.csv`; hold-out table: `holdout.csv`.", ""]
    return "\n".join(lines)


def write_outputs(result: FitResult, output=None, report_dir=None, command: str = "servesim calibrate") -> Path:
    """Write the report (report.md, residuals.csv, holdout.csv) and then the profiles (``result.output``,
    ``result.engine_output``; ``output`` overrides the first). Both texts are built and loaded before
    anything is written. Returns the report dir (default ``<stem>-fit`` of -o, else of --engine-output)."""
    if output is not None:
        result.output = str(output)
    first = result.output or result.engine_output
    rep = Path(report_dir) if report_dir else default_report_dir(first)
    import contextlib
    from servesim.outputs import OutputDir, atomic_file
    hw_text = profile_text(result, result.output, rep) if result.output else None
    eng_text = engine_text(result, rep) if result.engine else None
    # every file to a temporary name beside its target first, then all renamed (report, then profiles)
    with contextlib.ExitStack() as stack:
        for path, text, option in ((result.output, hw_text, "-o"), (result.engine_output, eng_text, "--engine-output")):
            if path and text is not None:
                stack.enter_context(atomic_file(path, option)).write_text(text)
        out = stack.enter_context(OutputDir(rep, "--report", "servesim calibrate"))
        out.write(lambda d: (result.residuals.to_csv(d / "residuals.csv", index=False),
                             result.holdout.to_csv(d / "holdout.csv", index=False),
                             (d / "report.md").write_text(report_markdown(result, command))))
    return rep


__all__ = ["EngineResult", "FitResult", "OperatorData", "calibrate", "check_options", "check_output",
           "engine_fit_source", "engine_text", "fit_operators", "fit_serving_rows", "fit_training_rows",
           "profile_text", "read_native", "read_operator_inputs", "read_serving_inputs", "read_training_inputs",
           "read_vllm_json", "report_markdown", "summary", "write_outputs"]
