"""Every simulation option, declared once: the fields of `SimConfig`.

Each field carries its `Option` (made by `opt`): kind, range, choices, help text, the engine-profile
value or constant that fills it when not given, and whether a sweep may grid it. From this one
declaration come the click options of simulate/sweep/plan (`servesim.cli.options`), the keywords of
`servesim.simulate(**kw)`, the checks (`servesim.checks.check_sim_config`), the defaults filled by
`api.resolve`, and the `--grid` keys and value parsing (`servesim.planning.grid`).

A default of None means "not given": `api.resolve` fills it from the engine profile (``preset``), a
constant (``fill``) or the workload, as the help text says. The offered rate has one default, in one
place (`default_rate`): the workload's ``default_rate``, for the whole deployment whatever its
replicas, so simulate, sweep, plan and report describe the same traffic.
"""
from __future__ import annotations

import difflib
import os
from dataclasses import MISSING, dataclass, field, fields

from .engine import codes as C
from .errors import ConfigError

KINDS = ("name", "int", "float", "choice", "bool", "duration", "stages", "slo", "pools", "speculative")   # duration: seconds (text on the CLI)


def _weight_dtypes():
    from .costmodel.dtypes import WEIGHT_DTYPES
    return ("auto",) + tuple(WEIGHT_DTYPES)


def _kv_dtypes():
    from .costmodel.dtypes import KV_DTYPES
    return tuple(KV_DTYPES)


def _allreduce():
    from .costmodel.collectives import ALGORITHMS
    return ("auto",) + tuple(k for k in ALGORITHMS if k != "auto")


def _arrivals():
    from .workload.arrivals import PROCESSES
    return tuple(PROCESSES)


def _trace_modes():
    from .workload.spec import TRACE_MODES
    return tuple(TRACE_MODES)


def _models():
    from .config.model import list_hf_models, list_models
    return tuple(list_models()) + tuple(list_hf_models())


def _hardware():
    from .config.hardware import list_hardware
    return tuple(list_hardware())


def _engines():
    from .config.engine import list_engines
    return tuple(list_engines())


def _workloads():
    from .workload.spec import list_workloads
    return tuple(list_workloads())


@dataclass(frozen=True)
class Option:
    """What one SimConfig field is: the rule it is checked by and how the CLI and sweeps show it."""
    kind: str                      # one of KINDS
    help: str = ""
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    choices: tuple | object = ()   # a tuple, or a function returning one (read when first needed)
    names: object = None           # kind name: a function listing the shipped names (else a file path)
    preset: str = ""               # None is filled from this attribute of the engine profile's [scheduler]
    fill: object = None            # None is filled with this constant
    grid: bool = True              # a `--grid` key of sweep
    hint: str = ""                 # what None means, added to a range error
    echo: bool = True              # shown in a result's config and sweep rows (False: how, not what, is simulated)

    def choice_list(self) -> tuple:
        return self.choices() if callable(self.choices) else tuple(self.choices)

    def help_text(self) -> str:
        if self.preset:
            return f"{self.help} [default: the engine profile's]".strip()
        if self.fill is not None:
            return f"{self.help} [default: {self.fill:g}]" if isinstance(self.fill, float) else \
                f"{self.help} [default: {self.fill}]"
        return self.help


def opt(default, kind: str, **meta):
    """A SimConfig field declared as an option (see `Option` for ``meta``)."""
    assert kind in KINDS, kind
    return field(default=default, metadata={"option": Option(kind, **meta)})


@dataclass(frozen=True)
class SimConfig:
    """Every knob of one simulation. None means: take it from the engine profile or the workload."""
    model: str = opt("llama-3.1-8b", "name", names=_models, help="Model name, or a .toml / HF config.json path.")
    hardware: str = opt("h100-sxm", "name", names=_hardware,
                        help="Hardware profile (servesim profiles list) or a .toml path.")
    tp: int = opt(1, "int", ge=1, help="Tensor-parallel degree.")
    pp: int = opt(1, "int", ge=1, help="Pipeline-parallel stages.")
    replicas: int = opt(1, "int", ge=1, help="Data-parallel replicas behind the router.")
    ep: int = opt(1, "int", ge=1,
                  help="Expert parallelism of a MoE model's routed experts within a replica (must divide the "
                       "experts and --tp x --attn-dp).")
    attn_dp: int = opt(1, "int", ge=1,
                       help="Data-parallel attention ranks per replica, each a TP group serving its own requests "
                            "(a replica is tp x attn-dp x pp GPUs; MoE models, with --ep).")
    expert_skew: float | None = opt(None, "float", ge=0.0,
                                    help="Expert routing with --ep: 0 balanced, ALPHA > 0 power-law expert loads "
                                         "[default: 1.01 for DeepSeek (MLA) models, 1.2 for others, AIConfigurator's].")
    speculative: object = opt(None, "speculative", grid=False,
                              help="Speculative decoding, METHOD:k=K[:acceptance=A][:delta=D][:acceptance_length=L]"
                                   "[:draft=MODEL], METHOD draft|eagle|mtp|ngram (e.g. eagle:k=3:acceptance=0.7, "
                                   "mtp:k=1:acceptance_length=1.85).")
    pool: tuple = opt((), "pools",
                      help="A pool of replicas, HW:tpN[:ppM]:xR[:mixed|prefill|decode][:dtype=D][:engine=E]; "
                           "repeat for several (e.g. --pool h100-sxm:tp1:x2:prefill --pool h100-sxm:tp1:x2:decode); "
                           "replaces --hardware/--tp/--pp/--replicas (API: a tuple of texts; --grid: pools joined "
                           "by +).")
    router: str = opt("round-robin", "choice", choices=tuple(C.ROUTERS), help="How requests go to replicas.")
    dtype: str = opt("auto", "choice", choices=_weight_dtypes,
                     help="Weights; auto: the checkpoint's (its quantization_config or torch_dtype; bf16 for "
                          "shipped models).")
    kv_dtype: str = opt("auto", "choice", choices=_kv_dtypes,
                        help="KV cache; auto: 16-bit, the model's activation dtype, as vLLM's kv_cache_dtype auto.")
    allreduce: str = opt("auto", "choice", choices=_allreduce,
                         help="TP all-reduce algorithm; auto: the faster of ring and tree per message size.")
    engine: str = opt("vllm", "name", names=_engines,
                      help="Engine profile: vllm, sglang, trtllm (engines/*.toml), or a path to your own .toml.")
    scheduler: str | None = opt(None, "choice", choices=tuple(C.POLICIES), preset="policy", help="Scheduling policy.")
    max_num_seqs: int | None = opt(None, "int", ge=1, preset="max_num_seqs", help="Largest batch, in sequences.")
    max_num_batched_tokens: int | None = opt(None, "int", ge=1, preset="max_num_batched_tokens",
                                             help="Token budget of one iteration.")
    chunk_size: int | None = opt(None, "int", ge=1,
                                 help="sarathi chunk size [default: 512 with sarathi, else --max-num-batched-tokens].")
    block_size: int | None = opt(None, "int", ge=1, preset="block_size", help="KV-cache block, in tokens.")
    gpu_memory_utilization: float | None = opt(None, "float", gt=0.0, le=1.0, preset="gpu_memory_utilization",
                                               help="Fraction of GPU memory the engine may use.")
    preemption: str | None = opt(None, "choice", choices=tuple(C.PREEMPTION), preset="preemption",
                                 help="What happens to a preempted request's KV cache.")
    iteration_overhead_us: float | None = opt(None, "float", ge=0.0,
                                              help="Replace the engine profile's host time per step (us).")
    num_gpu_blocks: int | None = opt(None, "int", ge=1,
                                     help="KV-cache blocks per replica, as the real engine reported them (default: "
                                          "computed from memory the way the engine does).")
    prefix_caching: bool | None = opt(None, "bool", preset="prefix_caching",
                                      help="Automatic prefix caching: full KV blocks of shared prefixes reused "
                                           "(--prefix-caching/--no-prefix-caching).")
    cpu_kv_gib: float | None = opt(None, "float", ge=0.0, fill=0.0,
                            help="Host memory per replica for a CPU tier of the prefix cache, GiB (0: none); "
                                 "evicted blocks move there and are reloaded over PCIe.")
    kv_link: str | None = opt(None, "choice", choices=("auto", "nvlink", "nic"), fill="auto",
                       help="Link of prefill-to-decode KV transfers; auto: NVLink when both pools share hardware "
                            "and fit one scale-up domain, else the NIC.")
    layerwise_transfer: bool | None = opt(None, "bool", fill=False,
                                   help="Pipeline KV transfers layer by layer with the prefill (only the last "
                                        "layer's transfer exposed).")
    workload: str = opt("chat", "name", names=_workloads,
                        help="chat, code, summarization, long-context, or a .toml / trace .csv.")
    isl: int | None = opt(None, "int", ge=1, help="Fixed input length (overrides the workload).")
    osl: int | None = opt(None, "int", ge=1, help="Fixed output length (overrides the workload).")
    num_system_prompts: int | None = opt(None, "int", ge=1,
                                         help="Shared prefix: N system prompts (with --system-prompt-len); each "
                                              "request's user is drawn at random.")
    users_per_system_prompt: int | None = opt(None, "int", ge=1, help="Users sharing each system prompt (default 1).")
    system_prompt_len: int | None = opt(None, "int", ge=1, help="Tokens of each shared system prompt.")
    question_per: str | None = opt(None, "choice", choices=("user", "request"),
                                   help="Shared prefix: one question per user, re-sent every time (its whole "
                                        "prompt a prefix-cache hit after its first request, as in the shipped "
                                        "vLLM benchmark), or a fresh question per request (default: the "
                                        "workload's, else user).")
    question_len: int | None = opt(None, "int", ge=1,
                                   help="Fixed question tokens after the system prompt (default: the workload's "
                                        "prompt lengths).")
    turns_per_session: int | None = opt(None, "int", ge=1,
                                        help="Multi-turn sessions: N turns each, every turn resending the history "
                                             "(default: the workload's [sessions], e.g. --workload sessions).")
    think_time: float | None = opt(None, "duration", ge=0.0,
                                   help="Sessions: mean think time between a turn's end and the next turn (e.g. "
                                        "30s; exponential; default: the workload's).")
    rate: float | None = opt(None, "float", gt=0.0, grid=False, hint="; for every request at t = 0 use --offline",
                             help="Requests/s offered to the whole deployment (default: the workload's "
                                  "default_rate, whatever --replicas).")
    stages: str | tuple | None = opt(None, "stages", grid=False,
                                     help="Open-loop load in stages, RATExDURATION each, e.g. 5x600s,10x600s (sets "
                                          "the rate and the number of requests).")
    arrival: str | None = opt(None, "choice", choices=_arrivals, fill="poisson", help="Open-loop arrival process.")
    cv: float | None = opt(None, "float", gt=0.0, fill=1.0,
                           help="Coefficient of variation of --arrival gamma (1: as Poisson).")
    concurrency: int | None = opt(None, "int", ge=1, hint=" (omit it for an open loop)",
                                  help="Closed loop with N >= 1 clients [default: open loop at --rate].")
    offline: bool = opt(False, "bool", grid=False, help="All requests at time zero.")
    trace_mode: str = opt("lengths", "choice", choices=_trace_modes,
                          help="lengths: sample lengths from the workload; replay: a trace's rows with its arrival "
                               "times; scale: those arrivals rescaled to --rate.")
    num_requests: int | None = opt(None, "int", ge=1,
                                   help="Default 2000; every row with --trace-mode replay/scale; not with --stages.")
    duration: float | None = opt(None, "duration", gt=0.0, hint=" (omit it to run until every request ends)",
                                       help="Stop the clock after this long (e.g. 600s); with --arrival daily and no "
                                            "--num-requests: the window of the day sent (24h: a whole day).")
    warmup: float = opt(0.0, "duration", ge=0.0, help="Exclude requests arriving before this.")
    stream: bool | None = opt(None, "bool", grid=False,
                              help="Run in bounded memory: requests drawn and simulated in chunks, per-request "
                                   "records written as they end (to -o, else dropped), percentiles from "
                                   "log-binned histograms (within 0.5%) [default: automatic, when the run's "
                                   "records would need more than 2 GB or half the available memory] "
                                   "(--stream/--no-stream).")
    slo: object = opt(None, "slo", grid=False, help="Latency targets, e.g. ttft_p99=500ms,tpot_p99=50ms.")
    seed: int = opt(0, "int", ge=0, help="Seed of every random draw.")
    price: float | None = opt(None, "float", ge=0.0, help="Override $ per GPU-hour.")
    fast_forward: bool = opt(True, "bool", grid=False, echo=False,
                             help="Run a replica's decode iterations between batch changes from aggregates "
                                  "(engine/span.py); --no-fast-forward steps request by request, the reference "
                                  "path (identical results, slower).")
    threads: int | None = opt(None, "int", ge=1, grid=False, echo=False,
                              help="Threads simulating independent replicas at once (mixed pools, round-robin or "
                                   "random router, open loop, no prefix cache or sessions; other runs, and runs of "
                                   "under 2,000 requests, use one) and computing the summary's intervals of "
                                   "runs over 65,536 requests; identical results for any N [default: the usable "
                                   "cores (at most --replicas for the replicas); in a sweep's or plan's worker "
                                   "processes, the cores shared among the workers].")


def options() -> dict[str, Option]:
    """Every option, in declaration order: name -> Option."""
    return {f.name: f.metadata["option"] for f in fields(SimConfig)}


def defaults() -> dict[str, object]:
    return {f.name: f.default for f in fields(SimConfig) if f.default is not MISSING}


def flag(name: str) -> str:
    """SimConfig field -> CLI option: max_num_seqs -> --max-num-seqs."""
    return "--" + name.replace("_", "-")


def grid_keys() -> list[str]:
    return [name for name, o in options().items() if o.grid]


def default_rate(workload) -> float:
    """The offered rate when none is given: the workload's ``default_rate`` (req/s), for the whole
    deployment, whatever its replicas (workloads/README.md)."""
    return float(workload.default_rate)


def plain(cfg) -> dict:
    """Every field of a SimConfig as a plain value (the SLO as its text), for JSON and tables; not the
    fields that change how, not what, is simulated (``echo`` False)."""
    out = {}
    for f in fields(cfg):
        if not f.metadata["option"].echo:
            continue
        v = getattr(cfg, f.name)
        out[f.name] = str(v) if f.metadata["option"].kind in ("slo", "speculative") and v is not None else v
    return out


# checks of an option's value against its declaration (also `servesim.checks`)
def check_choice(value, option: str, choices, *, none_ok: bool = False):
    if value is None and none_ok:
        return None
    if not isinstance(value, str) or value not in choices:
        close = difflib.get_close_matches(str(value), list(choices), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ConfigError(f"{option} {value!r} unknown; {hint}use one of {', '.join(choices)}")
    return value


def check_known_name(name: str, value: str, option: str | None = None) -> str:
    """A shipped name of SimConfig field `name` (hardware, engine, model, workload), or a file path."""
    known = options()[name].names()
    path = "/" in value or "\\" in value or os.path.splitext(value)[1] in (".toml", ".json", ".csv")
    if value not in known and not path:
        close = difflib.get_close_matches(value, known, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ConfigError(f"{option or flag(name)}: unknown {name} {value!r}; {hint}use one of {', '.join(known)} "
                          "or a file path")
    return value
