"""`train` and `compare`: the Python API and the path ``servesim train`` / ``servesim compare`` share."""
from __future__ import annotations

import difflib
from dataclasses import dataclass

from ..errors import ConfigError
from ..training.framework import FP8_RECIPES, REMAT_POLICIES, RESHARD
from ..training.layout import CP_COMM
from .results import CompareResult, TrainingResult

# the layout keywords of `train` and their defaults (those of ``servesim train``; a test keeps them equal)
LAYOUT_DEFAULTS = dict(
    framework="megatron", tp=1, pp=1, dp=None, cp=1, cp_comm="ring", ep=1, vp=1, first_stage_layers=None,
    last_stage_layers=None, account_for_embedding=False, account_for_loss=False, pipeline_layout=None, sp=None,
    tp_overlap=None, zero=None, dp_overlap=None, fsdp_prefetch=None, fsdp_param_bytes=None, recompute=None,
    recompute_layers=None, recompute_modules=None, selective_ac=None, remat_policy=None, reshard_after_forward=None,
    fp8_all_gather=None, ep_overlap=False, dp_shard=None, offload_activations=None, dtype="bf16", fp8_recipe=None, attention=None, dropout=False,
    seq_len=4096, micro_batch=1, global_batch=256)
_CHOICES = {"cp_comm": CP_COMM, "recompute": ("none", "selective", "full", "auto"), "dtype": ("bf16", "fp8"),
            "fp8_recipe": FP8_RECIPES, "attention": ("flash", "fa2", "unfused"), "fsdp_param_bytes": ("2", "4"),
            "remat_policy": tuple(REMAT_POLICIES), "reshard_after_forward": RESHARD}
_OPTIONAL_CHOICES = ("fp8_recipe", "attention", "fsdp_param_bytes", "recompute", "remat_policy", "reshard_after_forward")
_FLAGS = ("account_for_embedding", "account_for_loss", "dropout", "ep_overlap")
_OPTIONAL_FLAGS = ("sp", "tp_overlap", "fp8_all_gather")   # None: the framework profile's


def int_list(value, option: str) -> list[int]:
    """``8``, ``[8, 16]`` or ``"8,16"`` -> [8, 16]."""
    from ..checks import INT64_MAX
    if isinstance(value, (list, tuple)):
        value = ",".join(str(v) for v in value)
    try:
        out = [int(v) for v in str(value).split(",") if v.strip()]
    except ValueError:
        raise ConfigError(f"{option}: expected an integer or a comma-separated list such as 64,128,256, "
                          f"got {value!r}") from None
    if not out or any(v < 1 or v > INT64_MAX for v in out):
        raise ConfigError(f"{option}: expected positive integers (at most {INT64_MAX:,}), got {value!r}")
    return out


def _option(name: str) -> str:
    return "--" + name.replace("_", "-")


def _check_layout_options(kw: dict) -> dict:
    """Every layout keyword known, an integer in range, a choice or a flag, before anything loads."""
    from ..checks import check_choice, check_int
    for key in kw:
        if key not in LAYOUT_DEFAULTS:
            close = difflib.get_close_matches(key, list(LAYOUT_DEFAULTS), n=1)
            raise ConfigError(f"train: unknown option {key!r}; {f'did you mean {close[0]!r}? ' if close else ''}"
                              f"use model, hardware, gpus, search, top, scaling or {', '.join(LAYOUT_DEFAULTS)}")
    kw = LAYOUT_DEFAULTS | kw
    for name in ("tp", "pp", "cp", "ep", "vp", "seq_len", "micro_batch", "global_batch"):
        check_int(kw[name], _option(name))
    check_int(kw["dp"], "--dp", none_ok=True, hint=" (omit it for GPUs / (tp x pp x cp))")
    check_int(kw["dp_shard"], "--dp-shard", none_ok=True, hint=" (omit it to shard over every data-parallel rank)")
    check_int(kw["zero"], "--zero", ge=0, le=3, none_ok=True, hint=" (ZeRO stage 0-3; omit it for the framework's)")
    if kw["fsdp_param_bytes"] is not None:
        kw["fsdp_param_bytes"] = str(kw["fsdp_param_bytes"])
    for name, choices in _CHOICES.items():
        check_choice(kw[name], _option(name), choices, none_ok=name in _OPTIONAL_CHOICES)
    for name in _FLAGS + _OPTIONAL_FLAGS:
        if not isinstance(kw[name], bool) and not (kw[name] is None and name in _OPTIONAL_FLAGS):
            raise ConfigError(f"{_option(name)} {kw[name]!r} is not valid: must be True or False"
                              + (" (or None: the framework's)" if name in _OPTIONAL_FLAGS else ""))
    if kw["selective_ac"] is not None:
        kw["selective_ac"] = str(kw["selective_ac"]).strip()
    return kw


def _offload(value) -> int:
    if value is None:
        return 0
    text = str(value).strip().lower()
    if text == "all":
        return 1 << 30  # every layer of every chunk
    try:
        n = int(text)
    except ValueError:
        raise ConfigError(f"--offload-activations: expected a layer count per model chunk or 'all', got {value!r}") from None
    if n < 0:
        raise ConfigError(f"--offload-activations: expected a layer count >= 0 or 'all', got {value!r}")
    return n


def _modules(value) -> tuple[str, ...]:
    if not value:
        return ()
    if isinstance(value, (list, tuple)):
        value = ",".join(value)
    return tuple(v.strip() for v in str(value).split(",") if v.strip())


def base_layout(kw: dict, dp: int = 1):
    from ..training import TrainLayout
    return TrainLayout(tp=kw["tp"], pp=kw["pp"], dp=dp, cp=kw["cp"], ep=kw["ep"], vp=kw["vp"], sp=kw["sp"],
                       tp_overlap=kw["tp_overlap"], zero=kw["zero"], recompute=kw["recompute"],
                       dtype=kw["dtype"], seq_len=kw["seq_len"], micro_batch=kw["micro_batch"],
                       global_batch=kw["global_batch"], first_stage_layers=kw["first_stage_layers"],
                       last_stage_layers=kw["last_stage_layers"], account_for_embedding=kw["account_for_embedding"],
                       account_for_loss=kw["account_for_loss"], pipeline_layout=kw["pipeline_layout"],
                       recompute_layers=kw["recompute_layers"],
                       recompute_modules=_modules(kw["recompute_modules"]),
                       offload_layers=_offload(kw["offload_activations"]), cp_comm=kw["cp_comm"],
                       framework=kw["framework"], fp8_recipe=kw["fp8_recipe"], attention=kw["attention"],
                       dropout=kw["dropout"], dp_overlap=kw["dp_overlap"], fsdp_prefetch=kw["fsdp_prefetch"],
                       fsdp_param_bytes=int(kw["fsdp_param_bytes"]) if kw["fsdp_param_bytes"] else None,
                       selective_ac=kw["selective_ac"], remat_policy=kw["remat_policy"],
                       reshard_after_forward=kw["reshard_after_forward"], fp8_all_gather=kw["fp8_all_gather"],
                       ep_overlap=kw["ep_overlap"], dp_shard=kw["dp_shard"])


@dataclass(frozen=True)
class TrainSpec:
    """A checked `train` call: the loaded model and hardware, the GPU counts and the layout keywords."""
    model: object
    hardware: object
    gpus: list
    layout: dict
    search: bool = False
    top: int = 10
    scaling: str = "weak"


def prepare_train(model="llama-3.1-8b", hardware="h100-sxm", gpus=8, *, search=False, top=10, scaling="weak",
                  **layout) -> TrainSpec:
    from ..checks import check_choice, check_int
    from ..config import load_hardware, load_model
    kw = _check_layout_options(layout)
    check_int(top, "--top", hint=" (alternatives shown by --search)")
    check_choice(scaling, "--scaling", ("weak", "strong"))
    gpu_list = int_list(gpus, "--gpus")
    return TrainSpec(load_model(model), load_hardware(hardware), gpu_list, kw, bool(search), top, scaling)


def result_dict(res) -> dict:
    d = res.as_dict()
    d["global_batch_microbatches"] = res.extra["num_microbatches"]
    d["recompute_asked"] = res.extra.get("recompute_asked")
    d["layers_per_rank"] = res.extra.get("layers_per_rank", [])
    d["pipeline_layout"] = res.extra.get("pipeline_layout", "")
    return d


def execute_train(spec: TrainSpec) -> TrainingResult:
    from ..training import derive_dp, train_step
    from ..training.layout import check_model_split
    from ..training.search import results_frame, scaling_table, search_layouts
    model, hw, kw = spec.model, spec.hardware, spec.layout
    if len(spec.gpus) > 1:
        df = scaling_table(model, hw, spec.gpus, base_layout(kw), mode=spec.scaling, search=spec.search)
        return TrainingResult("scaling", {"scaling": spec.scaling}, df)
    g = spec.gpus[0]
    if spec.search:
        results = search_layouts(model, hw, g, base_layout(kw), top=spec.top)
        return TrainingResult("search", result_dict(results[0]), results_frame(results))
    check_model_split(model, base_layout(kw))
    dp = kw["dp"] if kw["dp"] is not None else derive_dp(g, kw["tp"], kw["pp"], kw["cp"])
    return TrainingResult("layout", result_dict(train_step(model, hw, base_layout(kw, dp=dp), gpus=g)))


def train(model="llama-3.1-8b", hardware="h100-sxm", gpus=8, *, search=False, top=10, scaling="weak",
          **layout) -> TrainingResult:
    """Step time, throughput, MFU and memory of a training layout, as ``servesim train``.

    Parameters
    ----------
    model, hardware : str
        A model name or path; a hardware profile.
    gpus : int, sequence of int or str
        Total GPUs; a list (``[8, 16, 32]``) gives a scaling table.
    search : bool
        Find the fastest layouts that fit (the layout keywords then only set the batch, sequence
        and precision); ``top`` of them.
    scaling : {"weak", "strong"}
        With a list of GPU counts: the batch grows with the GPUs (weak) or stays fixed (strong).
    **layout
        The layout, as ``servesim train``'s options: ``framework`` (megatron), ``tp``, ``pp``, ``dp``
        (default GPUs / (tp pp cp)), ``cp``, ``ep``, ``vp``, ``sp``, ``zero``, ``recompute``
        (selective; none, full, auto), ``dtype`` (bf16, fp8), ``seq_len`` (4096), ``micro_batch``
        (1), ``global_batch`` (256), and the others of ``servesim train --help``
        (``servesim.workflows.training.LAYOUT_DEFAULTS`` lists them with their defaults).

    Returns
    -------
    TrainingResult
        ``mode`` "layout", "search" or "scaling"; ``summary`` (step_time_s, tokens_per_s, mfu, hfu,
        breakdown_s, memory_gib_per_gpu, ...); ``table`` (alternatives or the scaling rows).

    Examples
    --------
    >>> import servesim
    >>> res = servesim.train(model="llama-3.1-8b", gpus=8, global_batch=64)
    >>> res.mode, 0 < res.summary["mfu"] < 1
    ('layout', True)
    >>> servesim.train(gpus=[8, 16], global_batch=32).table["gpus"].tolist()
    [8, 16]
    """
    return execute_train(prepare_train(model, hardware, gpus, search=search, top=top, scaling=scaling, **layout))


def check_compare(model, hardware, train_tokens, gpus, seq_len, global_batch, dtype, serve_tp, workload, rate, slo,
                  num_requests) -> tuple[list[str], object]:
    """Every option of `compare` checked -> (the hardware as a list, the parsed SLO)."""
    from ..checks import check_choice, check_float, check_int, check_name
    from ..slo import parse_slo
    check_name(model, "--model")
    check_float(train_tokens, "--train-tokens", gt=0.0)
    check_int(gpus, "--gpus")
    check_int(seq_len, "--seq-len")
    check_int(global_batch, "--global-batch")
    check_choice(dtype, "--dtype", ("bf16", "fp8"))
    check_int(serve_tp, "--serve-tp", none_ok=True, hint=" (omit it to search TP 1, 2, 4, 8)")
    check_name(workload, "--workload")
    check_float(rate, "--rate", gt=0.0, none_ok=True, hint=" req/s (omit it for the workload's rate)")
    check_int(num_requests, "--num-requests")
    slo = parse_slo(slo)
    if isinstance(hardware, (list, tuple)):
        hardware = ",".join(str(h) for h in hardware)
    hws = [h.strip() for h in str(hardware).split(",") if h.strip()]
    if not hws:
        raise ConfigError("--hardware is empty; give a profile or a comma list such as h100-sxm,h200-sxm")
    return hws, slo


def compare(model="llama-3.1-8b", hardware="h100-sxm", *, train_tokens=15e12, gpus=1024, seq_len=8192,
            global_batch=1024, dtype="bf16", serve_tp=None, workload="chat", rate=None,
            slo="ttft_p99=1s,tpot_p99=60ms", num_requests=500) -> CompareResult:
    """Training GPU-hours and $ against serving $ per million tokens, and the break-even, as
    ``servesim compare``.

    Parameters
    ----------
    model : str
        A model name or path.
    hardware : str or sequence of str
        One hardware profile, or several compared side by side.
    train_tokens : float
        Training tokens.
    gpus, seq_len, global_batch : int
        Training GPUs, sequence length and sequences per step (the fastest layout that fits is
        searched).
    dtype : {"bf16", "fp8"}
        Training precision (bf16 where the chip has no fp8).
    serve_tp : int, optional
        Serving TP (default: TP 1, 2, 4, 8 searched).
    workload, rate, slo, num_requests
        The serving load: workload, req/s (default: the workload's), SLO, requests per simulation;
        serving is priced on each hardware's cheapest deployment meeting the SLO (`servesim.plan`).

    Returns
    -------
    CompareResult
        ``rows``: one per hardware; ``summary``: model and training tokens.

    Examples
    --------
    >>> import servesim
    >>> res = servesim.compare(gpus=64, global_batch=128, train_tokens=1e12, rate=2, num_requests=100)
    >>> res.rows["hardware"].tolist(), bool(res.rows.loc[0, "break_even_output_tokens"] > 0)
    (['h100-sxm'], True)
    """
    from ..training import TrainLayout
    from ..training.compare import compare_costs
    hws, slo = check_compare(model, hardware, train_tokens, gpus, seq_len, global_batch, dtype, serve_tp, workload, rate,
                        slo, num_requests)
    base = TrainLayout(seq_len=seq_len, global_batch=global_batch, dtype=dtype)
    df = compare_costs(model, hws, gpus, train_tokens, base, serve_tp=serve_tp, workload=workload, rate=rate,
                       slo=slo, num_requests=num_requests)
    return CompareResult(df, {"model": model, "train_tokens": train_tokens})
