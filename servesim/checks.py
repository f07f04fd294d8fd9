"""Validating options once, up front, before any work.

One rule per `SimConfig` field (type, range, finiteness; `None` means "not given": the engine preset,
the workload or a documented default fills it in `api.resolve`), one function for the contradictions
between fields (`check_sim_config`), and one for what needs the model loaded (`check_resolved`:
fixed lengths against the model's context, options the resolved scheduler ignores). Every failure is
a `ConfigError` naming the option, the bad value and what would work; an option that does nothing in
a combination is a `ServesimWarning` (the CLI prints it as one line).

The other commands (cost, train, compare, report, plan, sweep, calibrate) check their own options
with `check_int` / `check_float` / `check_slo` before they load or run anything.
"""
from __future__ import annotations

import difflib
import math
import os
import warnings
from dataclasses import dataclass, fields, replace

import numpy as np

from .errors import ConfigError, ServesimWarning

INT64_MAX = 2**63 - 1


def flag(name: str) -> str:
    """SimConfig field -> CLI option: max_num_seqs -> --max-num-seqs."""
    return "--" + name.replace("_", "-")


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


def check_choice(value, option: str, choices, *, none_ok: bool = False):
    if value is None and none_ok:
        return None
    if not isinstance(value, str) or value not in choices:
        close = difflib.get_close_matches(str(value), list(choices), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ConfigError(f"{option} {value!r} unknown; {hint}use one of {', '.join(choices)}")
    return value


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


def check_slo(text, option: str = "--slo") -> dict[str, float]:
    """Parse an SLO string at the edge: every target a known metric with a duration > 0."""
    from .metrics import parse_slo
    if text is None:
        return {}
    if not isinstance(text, str):
        raise ConfigError(f"{option} must be a string such as 'ttft_p99=500ms,tpot_p99=50ms', got {text!r}")
    if not text.strip():
        raise ConfigError(f"{option} is empty; write e.g. {option} ttft_p99=500ms,tpot_p99=50ms, or omit it")
    slo = parse_slo(text)
    for key, seconds in slo.items():
        if not (math.isfinite(seconds) and seconds > 0):
            raise ConfigError(f"{option}: target {key} must be a duration > 0, got {seconds:g} s; "
                              "write e.g. ttft_p99=500ms")
    return slo


# ------------------------------------------------------------------------------------------------
# SimConfig: one rule per field


@dataclass(frozen=True)
class Rule:
    kind: str                      # int | float | choice | name | bool | slo | stages
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    choices: tuple = ()
    none_ok: bool = False          # None = not given: filled from the preset / workload / default


_POLICIES = ("vllm", "vllm-v0", "sarathi", "orca", "static")
_ROUTERS = ("round-robin", "random", "least-requests", "least-kv", "power-of-two")
_DTYPES = ("auto", "bf16", "fp16", "fp8", "int8", "int4", "fp4")
_KV_DTYPES = ("auto", "bf16", "fp16", "fp8", "int8")
_ARRIVALS = ("poisson", "gamma", "deterministic", "bursty", "daily")
_TRACE_MODES = ("lengths", "replay", "scale")

SIM_RULES: dict[str, Rule] = {
    "model": Rule("name"), "hardware": Rule("name"),
    "tp": Rule("int", ge=1), "pp": Rule("int", ge=1), "replicas": Rule("int", ge=1),
    "router": Rule("choice", choices=_ROUTERS),
    "dtype": Rule("choice", choices=_DTYPES), "kv_dtype": Rule("choice", choices=_KV_DTYPES),
    "allreduce": Rule("choice", choices=("auto", "ring", "tree")),
    "engine": Rule("name"),
    "scheduler": Rule("choice", choices=_POLICIES, none_ok=True),
    "max_num_seqs": Rule("int", ge=1, none_ok=True),
    "max_num_batched_tokens": Rule("int", ge=1, none_ok=True),
    "chunk_size": Rule("int", ge=1, none_ok=True),
    "block_size": Rule("int", ge=1, none_ok=True),
    "gpu_memory_utilization": Rule("float", gt=0.0, le=1.0, none_ok=True),
    "preemption": Rule("choice", choices=("recompute", "swap"), none_ok=True),
    "iteration_overhead_us": Rule("float", ge=0.0, none_ok=True),
    "num_gpu_blocks": Rule("int", ge=1, none_ok=True),
    "workload": Rule("name"),
    "isl": Rule("int", ge=1, none_ok=True), "osl": Rule("int", ge=1, none_ok=True),
    "num_system_prompts": Rule("int", ge=1, none_ok=True),
    "users_per_system_prompt": Rule("int", ge=1, none_ok=True),
    "system_prompt_len": Rule("int", ge=1, none_ok=True),
    "question_len": Rule("int", ge=1, none_ok=True),
    "rate": Rule("float", gt=0.0, none_ok=True),
    "stages": Rule("stages", none_ok=True),
    "arrival": Rule("choice", choices=_ARRIVALS, none_ok=True),
    "cv": Rule("float", gt=0.0, none_ok=True),
    "concurrency": Rule("int", ge=1, none_ok=True),
    "offline": Rule("bool"),
    "trace_mode": Rule("choice", choices=_TRACE_MODES),
    "num_requests": Rule("int", ge=1, none_ok=True),
    "duration": Rule("float", gt=0.0, none_ok=True),
    "warmup": Rule("float", ge=0.0),
    "slo": Rule("slo", none_ok=True),
    "seed": Rule("int", ge=0),
    "price": Rule("float", ge=0.0, none_ok=True),
}

# what None means, for the messages of options that accept "not given"
_HINTS = {
    "rate": "; for every request at t = 0 use --offline",
    "concurrency": " (omit it for an open loop)",
    "duration": " (omit it to run until every request ends)",
}


def _check_field(name: str, value, rule: Rule):
    option = flag(name)
    hint = _HINTS.get(name, "")
    if rule.kind == "int":
        return check_int(value, option, ge=rule.ge, none_ok=rule.none_ok, hint=hint)
    if rule.kind == "float":
        return check_float(value, option, gt=rule.gt, ge=rule.ge, le=rule.le, none_ok=rule.none_ok, hint=hint)
    if rule.kind == "choice":
        return check_choice(value, option, rule.choices, none_ok=rule.none_ok)
    if rule.kind == "name":
        return check_name(value, option)
    if rule.kind == "bool":
        if not isinstance(value, (bool, np.bool_)):
            raise ConfigError(f"{option} must be True or False, got {value!r}")
        return bool(value)
    if rule.kind == "slo":
        check_slo(value, option)
        return value
    if rule.kind == "stages":
        from .workload import parse_stages
        parse_stages(value)
        return value
    raise AssertionError(rule.kind)


def check_sim_keywords(options: dict) -> None:
    """Unknown keyword arguments of `servesim.simulate(**kw)`, with the closest field name."""
    from .api import SimConfig
    known = [f.name for f in fields(SimConfig)]
    for key in options:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ConfigError(f"unknown option {key!r}; {hint}options are the fields of servesim.SimConfig: "
                              + ", ".join(known))


def check_sim_config(cfg):
    """Every field's type and range, then the contradictions between fields. Returns the config with
    numpy scalars and paths normalised to plain values."""
    from .api import SimConfig
    if not isinstance(cfg, SimConfig):
        raise ConfigError(f"config must be a servesim.SimConfig, got {type(cfg).__name__}")
    changes = {}
    for f in fields(cfg):
        value = getattr(cfg, f.name)
        checked = _check_field(f.name, value, SIM_RULES[f.name])
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
    if cfg.cv is not None and (cfg.arrival or "poisson") != "gamma":
        warnings.warn(f"--cv {cfg.cv:g} does nothing with --arrival {cfg.arrival or 'poisson'}: it sets the "
                      "spread of --arrival gamma only", ServesimWarning, stacklevel=3)


def check_resolved(given, filled, model) -> None:
    """What needs the preset and the model: fixed lengths within the model's context (they are never
    cut silently; sampled lengths are, see `workload.clip_to_context`), options the resolved
    scheduler ignores."""
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
