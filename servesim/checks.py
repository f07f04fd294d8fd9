"""Validating options once, up front, before any work.

One rule per `SimConfig` field, read from its declaration in `servesim.options` (type, range,
finiteness; `None` means "not given": the engine preset, the workload or a documented default fills
it in `api.resolve`), one function for the contradictions
between fields (`check_sim_config`), and one for what needs the model loaded (`check_resolved`:
fixed lengths against the model's context, options the resolved scheduler ignores). Every failure is
a `ConfigError` naming the option, the bad value and what would work; an option that does nothing in
a combination is a `ServesimWarning` (the CLI prints it as one line).

The other commands (cost, train, compare, report, plan, sweep, calibrate) check their own options
with `check_int` / `check_float` / `slo.parse_slo` before they load or run anything.
"""
from __future__ import annotations

import difflib
import math
import os
import warnings
from dataclasses import fields, replace

import numpy as np

from .errors import ConfigError, ServesimWarning
from .options import check_choice, check_known_name, flag  # noqa: F401  (read from here too)

INT64_MAX = 2**63 - 1


def _show(value) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return repr(value) if isinstance(value, str) else str(value)


# ------------------------------------------------------------------------------------------------
# scalar checks, shared by every command


def check_int(value, option: str, *, ge: int | None = 1, le: int = INT64_MAX, none_ok: bool = False,
              hint: str = ""):
    """An integer (not bool, not float) in [ge, le]; numpy integers become int."""
    if value is None and none_ok:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ConfigError(f"{option} {value!r} is not valid: must be an integer, got {type(value).__name__}{hint}")
    value = int(value)
    if ge is not None and value < ge:
        upto = f" and <= {le}" if le < 2**31 else ""
        raise ConfigError(f"{option} {value} is not valid: must be an integer >= {ge}{upto}{hint}")
    if value > le:
        raise ConfigError(f"{option} {value} is too large: use at most {le:,}{hint}")
    return value


def check_float(value, option: str, *, gt: float | None = None, ge: float | None = None,
                le: float | None = None, lt: float | None = None, none_ok: bool = False, hint: str = ""):
    """A finite number (int or float, not bool) within the bounds; numpy scalars become float."""
    if value is None and none_ok:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ConfigError(f"{option} {value!r} is not valid: must be a number, got {type(value).__name__}{hint}")
    try:
        x = float(value)
    except OverflowError:
        x = math.inf
    low = f"({gt:g}" if gt is not None else f"[{ge:g}" if ge is not None else None
    high = f"{le:g}]" if le is not None else f"{lt:g})" if lt is not None else None
    if low and high:
        want = f"in {low}, {high}"
    elif low:
        want = f"{'>' if gt is not None else '>='} {low[1:]}"
    elif high:
        want = f"{'<=' if le is not None else '<'} {high[:-1]}"
    else:
        want = ""
    finite = "a finite number" + (f" {want}" if want and not want.startswith("in") else f", {want}" if want else "")
    if not math.isfinite(x):
        raise ConfigError(f"{option} {_show(x)} is not valid: must be {finite}{hint}")
    if ((gt is not None and not x > gt) or (ge is not None and not x >= ge) or (le is not None and not x <= le)
            or (lt is not None and not x < lt)):
        raise ConfigError(f"{option} {_show(x)} is not valid: must be {want}{hint}")
    return value if isinstance(value, (int, float)) and not isinstance(value, np.generic) else x


def check_name(value, option: str, *, none_ok: bool = False, what: str = "a name or a file path"):
    """A non-empty string (a path object becomes its string)."""
    if value is None and none_ok:
        return None
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str):
        raise ConfigError(f"{option} must be {what}, got {value!r} ({type(value).__name__})")
    if not value.strip():
        raise ConfigError(f"{option} is empty; give {what}")
    return value


# ------------------------------------------------------------------------------------------------
# SimConfig: one rule per field, read from its declaration (`servesim.options`)


def check_field(name: str, value, option: str | None = None):
    """One SimConfig field by its declared rule (None passes where the default is None: not given).
    Returns the value normalised: numpy scalars and paths to plain values, the SLO and the stages
    parsed (`slo.parse_slo`, `workload.parse_stages`)."""
    from .options import defaults, options
    rule = options()[name]
    option = option or flag(name)
    if value is None and defaults()[name] is None:
        return None
    if rule.kind == "int":
        return check_int(value, option, ge=rule.ge, hint=rule.hint)
    if rule.kind in ("float", "duration"):
        return check_float(value, option, gt=rule.gt, ge=rule.ge, le=rule.le, hint=rule.hint)
    if rule.kind == "choice":
        return check_choice(value, option, rule.choice_list())
    if rule.kind == "name":
        return check_name(value, option)
    if rule.kind == "bool":
        if not isinstance(value, (bool, np.bool_)):
            raise ConfigError(f"{option} must be True or False, got {value!r}")
        return bool(value)
    if rule.kind == "slo":
        from .slo import parse_slo
        return parse_slo(value, option)
    if rule.kind == "stages":
        from .workload import parse_stages
        return parse_stages(value, option)
    if rule.kind == "pools":
        from .pools import pool_texts
        return pool_texts(value, option)
    if rule.kind == "speculative":
        from .costmodel.speculative import parse_speculative
        return parse_speculative(value)
    raise AssertionError(rule.kind)


def check_sim_keywords(options: dict) -> None:
    """Unknown keyword arguments of `servesim.simulate(**kw)`, with the closest field name."""
    from .options import SimConfig
    known = [f.name for f in fields(SimConfig)]
    for key in options:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ConfigError(f"unknown option {key!r}; {hint}options are the fields of servesim.SimConfig: "
                              + ", ".join(known))


def sim_config(config=None, where: str = "simulate", **options):
    """The API edge: a SimConfig (or None: the defaults) with keyword options replacing its fields,
    every keyword a known field, every field checked (`check_sim_config`)."""
    from .options import SimConfig
    check_sim_keywords(options)
    if config is not None and not isinstance(config, SimConfig):
        raise ConfigError(f"{where}(config): expected a servesim.SimConfig, got {type(config).__name__}; "
                          f"or pass the options as keywords, {where}(model=..., rate=...)")
    return check_sim_config(replace(config if config is not None else SimConfig(), **options))


def check_sim_config(cfg):
    """Every field's type and range, then the contradictions between fields. Returns the config with
    values normalised (`check_field`); checking a checked config again returns it unchanged."""
    from .options import SimConfig
    if not isinstance(cfg, SimConfig):
        raise ConfigError(f"config must be a servesim.SimConfig, got {type(cfg).__name__}")
    changes = {}
    for f in fields(cfg):
        value = getattr(cfg, f.name)
        checked = check_field(f.name, value)
        if checked is not value:
            changes[f.name] = checked
    cfg = replace(cfg, **changes) if changes else cfg
    _contradictions(cfg)
    return cfg


def _contradictions(cfg) -> None:
    """Options that cannot hold together: each pair named, with the reason and the way out."""
    def given(name):
        v = getattr(cfg, name)
        return v is not None and v is not False and not (name == "trace_mode" and v == "lengths")

    def show(name):
        v = getattr(cfg, name)
        if v is True or name == "stages":
            return flag(name)
        return f"{flag(name)} {v:g}" if isinstance(v, float) else f"{flag(name)} {v}"

    rules = [
        ("stages", ("rate", "offline", "concurrency", "num_requests", "trace_mode"),
         "the stages set the rate, the arrivals and the number of requests"),
        ("offline", ("rate", "concurrency", "arrival", "cv", "trace_mode"),
         "--offline sends every request at t = 0"),
        ("concurrency", ("rate", "arrival", "cv", "trace_mode"),
         "a closed loop sends a request whenever a client's previous one ends, not on an arrival process"),
    ]
    for lead, others, reason in rules:
        if not given(lead):
            continue
        for other in others:
            if given(other):
                raise ConfigError(f"{show(lead)} and {show(other)} contradict: {reason}; drop one of them")
    if cfg.trace_mode == "replay" and cfg.rate is not None:
        raise ConfigError(f"--trace-mode replay and --rate {_show(cfg.rate)} contradict: replay keeps the trace's "
                          "own arrival times; use --trace-mode scale to rescale them to --rate")
    if cfg.trace_mode != "lengths":
        for other in ("arrival", "cv"):
            if given(other):
                raise ConfigError(f"--trace-mode {cfg.trace_mode} and {show(other)} contradict: the arrivals are "
                                  "the trace's own times; use --trace-mode lengths for an arrival process")
    if cfg.duration is not None and cfg.warmup >= cfg.duration:
        raise ConfigError(f"--warmup {cfg.warmup:g}s is not shorter than --duration {cfg.duration:g}s: no request "
                          "would be measured; use a shorter --warmup or a longer --duration")
    _pool_contradictions(cfg)
    if cfg.cv is not None and (cfg.arrival or "poisson") != "gamma":
        warnings.warn(f"--cv {cfg.cv:g} does nothing with --arrival {cfg.arrival or 'poisson'}: it sets the "
                      "spread of --arrival gamma only", ServesimWarning, stacklevel=3)


def _pool_contradictions(cfg) -> None:
    """--pool replaces the single-pool options; the pools' roles must make a deployment; options of
    features that are off."""
    from .options import SimConfig
    from .pools import check_deployment, parse_pool
    if cfg.pool:
        base = SimConfig()
        for name in ("hardware", "tp", "pp", "replicas", "ep", "attn_dp"):
            if getattr(cfg, name) != getattr(base, name):
                raise ConfigError(f"--pool and {flag(name)} {getattr(cfg, name)} contradict: each pool gives its own "
                                  "hardware, tp, pp and replicas; drop " + flag(name))
        specs = [parse_pool(t) for t in cfg.pool]
        check_deployment(specs)
        disaggregated = any(s.role != "mixed" for s in specs)
    else:
        disaggregated = False
    if cfg.expert_skew is not None and cfg.ep == 1:
        warnings.warn(f"--expert-skew {cfg.expert_skew:g} does nothing without --ep > 1: it sets how the routed "
                      "pairs spread over the EP ranks", ServesimWarning, stacklevel=4)
    if cfg.cpu_kv_gib and cfg.prefix_caching is False:
        raise ConfigError(f"--cpu-kv-gib {cfg.cpu_kv_gib:g} and --no-prefix-caching contradict: the CPU tier holds "
                          "evicted prefix-cache blocks; drop one of them")
    if not disaggregated:
        if cfg.layerwise_transfer:
            warnings.warn("--layerwise-transfer does nothing without prefill and decode pools (--pool ...:prefill "
                          "--pool ...:decode)", ServesimWarning, stacklevel=4)
        if cfg.kv_link not in (None, "auto"):
            warnings.warn(f"--kv-link {cfg.kv_link} does nothing without prefill and decode pools (--pool ...:prefill "
                          "--pool ...:decode)", ServesimWarning, stacklevel=4)


def check_resolved(given, filled, model) -> None:
    """What needs the preset and the model: fixed lengths within the model's context (they are never
    cut silently; sampled lengths are, see `workload.clip_to_context`), options the resolved
    scheduler ignores."""
    if filled.speculative is not None and filled.scheduler == "static":
        raise ConfigError(f"--speculative {filled.speculative} and --scheduler static contradict: static batching "
                          "runs one token per step for the whole batch; use a continuous-batching scheduler")
    ctx = int(model.max_context)
    prompt, prompt_fixed = [], False
    if given.isl is not None:
        prompt, prompt_fixed = [("--isl", given.isl)], True
    elif filled.system_prompt_len:
        prompt = [("--system-prompt-len", filled.system_prompt_len)]
        if given.question_len is not None:
            prompt, prompt_fixed = prompt + [("--question-len", given.question_len)], True
    output = [("--osl", given.osl)] if given.osl is not None else []
    if prompt or output:
        need = sum(v for _, v in prompt + output) + (0 if prompt_fixed else 1) + (0 if output else 1)
        if need > ctx:
            named = " + ".join(f"{k} {v:,}" for k, v in prompt + output)
            if not prompt_fixed:
                named += " + a 1-token question" if prompt else " + 1 prompt token"
            if not output:
                named += " + 1 output token"
            longest = max(prompt + output, key=lambda kv: kv[1])[0]
            raise ConfigError(f"{named} = {need:,} tokens exceed {model.name}'s context of {ctx:,} tokens "
                              f"(max_context); shorten {longest} by {need - ctx:,} or use a model with a longer "
                              "context (fixed lengths are never cut to fit)")
    if given.chunk_size is not None and filled.scheduler != "sarathi":
        warnings.warn(f"--chunk-size {given.chunk_size} does nothing with the {filled.scheduler} scheduler "
                      "(it is the sarathi token budget; the others split prefills by --max-num-batched-tokens)",
                      ServesimWarning, stacklevel=3)
