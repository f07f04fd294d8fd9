"""Engine profiles: ``engines/<name>.toml`` -> validated, frozen, SI-unit dataclasses.

A hardware profile describes silicon; an engine profile describes how a serving framework runs on
it: its scheduler defaults, whether it runs decode under CUDA graphs (and which batch sizes it
captures), which kernels it fuses, which all-reduce it uses, and its host-side step model. The
kernel efficiencies and host costs that were fitted for one (engine, hardware) pair live in the
profile's ``[hardware.<profile name>]`` tables, each with its ``fit_source``. Hardware without such a
table borrows the fit of the hardware it takes its silicon efficiencies from (the hardware
profile's ``efficiency_from``), priced with its own datasheet peaks and bandwidths, and the output
says so (``EngineFit.note``).

Units are converted once, here: ``*_us`` -> seconds, ``*_mib`` -> bytes. Schema and sources in
``engines/README.md``.
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from servesim.config._toml import Table, did_you_mean, display_path, read_named
from servesim.errors import ConfigError
from servesim.paths import engines_dir

POLICIES = ("vllm", "vllm-v0", "sarathi", "orca", "static")
PREEMPTION = ("recompute", "swap")
GRAPH_MODES = ("none", "piecewise", "full", "full_and_piecewise")
ALLREDUCE = ("custom", "nccl")
MEMORY_FRACTION_OF = ("total", "free")

_TOP_KEYS = ("name", "description", "version", "source", "scheduler", "cuda_graph", "kernels", "host",
             "hardware")
_SCHEDULER_KEYS = ("policy", "max_num_seqs", "max_num_batched_tokens", "block_size", "gpu_memory_utilization",
                   "memory_fraction_of", "watermark", "preemption", "non_torch_memory_mib")
_GRAPH_KEYS = ("mode", "sizes", "step_small", "step_large", "large_from", "max_size", "max_size_per_seq")
_KERNEL_KEYS = ("fused_add_norm", "allreduce", "custom_allreduce_max_mib")
# fused-MoE tiles: the engine's tuned configs (a CSV beside the profile) and its default tiles
_MOE_TILE_KEYS = ("moe_configs", "moe_default_tile_small", "moe_default_tile")
# the engine's own NVLink all-reduce limit per TP degree, where it differs from custom_allreduce_max_mib
_AR_TP_KEY = "allreduce_max_mib_by_tp"
_HOST_KEYS = ("overlap",)
_HOST_OPTIONAL = ("overlap_speculative",)
# the --speculative methods (costmodel/speculative.METHODS is this tuple)
SPECULATIVE_METHODS = ("draft", "eagle", "mtp", "ngram")
# Fitted per (engine, hardware): (file key, field, kind). kind: "fraction" (0, 1], "nonneg" >= 0.
# Formulas in servesim/costmodel/kernels.py; fits in servesim/calibrate/engine_kernels.py.
FIT_KEYS = (
    ("gemm_max", "gemm_max", "fraction"),                            # of the dense bf16/fp16 peak
    ("gemm_hbm_fraction", "gemm_hbm_fraction", "fraction"),          # weight streaming
    ("gemm_latency_us", "gemm_latency_s", "nonneg"),
    ("gemm_splitk_latency_us", "gemm_splitk_latency_s", "nonneg"),
    ("gemm_tile_overhead_k", "gemm_tile_overhead_k", "nonneg"),      # K elements per tile
    ("gemm_mem_latency_us", "gemm_mem_latency_s", "nonneg"),         # ramp of a bandwidth-bound GEMM
    ("gemm_fp8_max", "gemm_fp8_max", "fraction"),                    # W8A8 GEMMs: of the fp8 peak
    ("gemm_fp8_latency_us", "gemm_fp8_latency_s", "nonneg"),         # incl. quantising the activation
    ("gemm_fp8_quant_bytes", "gemm_fp8_quant_bytes", "nonneg"),      # activation quantisation, per element
    ("attn_prefill_max", "attn_prefill_max", "fraction"),
    ("attn_prefill_hbm_fraction", "attn_prefill_hbm_fraction", "fraction"),
    ("attn_prefill_block_overhead", "attn_prefill_block_overhead", "nonneg"),   # 128-key blocks
    ("attn_prefill_latency_us", "attn_prefill_latency_s", "nonneg"),
    ("attn_decode_hbm_fraction", "attn_decode_hbm_fraction", "fraction"),
    ("attn_decode_block_us", "attn_decode_block_s", "nonneg"),
    ("attn_decode_latency_us", "attn_decode_latency_s", "nonneg"),
    ("attn_decode_split_us", "attn_decode_split_s", "nonneg"),       # split-KV combine kernel, small batches
    ("attn_decode_split_seqs", "attn_decode_split_seqs", "nonneg"),  # split-KV: sequences x splits per KV head
    ("attn_decode_block_GBps", "attn_decode_block_bw", "nonneg"),    # one thread block's KV read rate
    ("mla_decode_max", "mla_decode_max", "fraction"),               # MLA absorbed decode (kernels.mla_decode_time_nb)
    ("mla_decode_hbm_fraction", "mla_decode_hbm_fraction", "fraction"),
    ("mla_decode_block_us", "mla_decode_block_s", "nonneg"),
    ("mla_decode_latency_us", "mla_decode_latency_s", "nonneg"),
    ("mla_decode_fp8_max", "mla_decode_fp8_max", "fraction"),       # ... with an fp8 latent cache
    ("mla_decode_fp8_hbm_fraction", "mla_decode_fp8_hbm_fraction", "fraction"),
    ("mla_prefill_max", "mla_prefill_max", "fraction"),             # MLA prefill (kernels.mla_prefill_time_nb)
    ("mla_prefill_hbm_fraction", "mla_prefill_hbm_fraction", "fraction"),
    ("mla_prefill_block_overhead", "mla_prefill_block_overhead", "nonneg"),
    ("mla_prefill_latency_us", "mla_prefill_latency_s", "nonneg"),
    ("allreduce_latency_us", "allreduce_latency_s", "nonneg"),
    ("allreduce_bw_fraction", "allreduce_bw_fraction", "fraction"),
    ("allreduce_step_latency_us", "allreduce_step_latency_s", "nonneg"),
    ("allreduce_eager_launch_us", "allreduce_eager_launch_s", "nonneg"),
    ("moe_efficiency", "moe_efficiency", "fraction"),
    ("moe_latency_us", "moe_latency_s", "nonneg"),
    ("moe_fp8_efficiency", "moe_fp8_efficiency", "fraction"),
    ("moe_fp8_latency_us", "moe_fp8_latency_s", "nonneg"),
    ("moe_pair_us", "moe_pair_s", "nonneg"),
    ("moe_tile_ridge", "moe_tile_ridge", "nonneg"),                 # MACs per operand element; 0: no tile cap
    ("moe_stream_bytes", "moe_stream_bytes", "nonneg"),             # contiguous weight bytes per K step; 0: no cap
    ("launch_us", "launch_s", "nonneg"),
    ("graph_overlap", "graph_overlap", "unit"),                     # fitted end to end (fit_vllm_host.py)
    ("step_gpu_us", "step_gpu_s", "nonneg"),                       # GPU work per step outside the forward
    ("host_step_us", "host_step_s", "nonneg"),
    ("host_per_seq_us", "host_per_seq_s", "nonneg"),
    ("frontend_us", "frontend_s", "nonneg"),
)
_UNIT = {"us": 1e-6, "mib": 2.0 ** 20, "GBps": 1e9}
# keys a table may leave out (profiles written before they existed), with the value that means "absent"
_OPTIONAL_FIT = {"moe_tile_ridge": 0.0, "moe_stream_bytes": 0.0, "step_gpu_us": 0.0, "gemm_fp8_quant_bytes": 0.0,
                 "attn_decode_split_us": 0.0, "attn_decode_split_seqs": 0.0, "attn_decode_block_GBps": 0.0}
# MLA kernel keys (experiments/fit_mla.py): a table without them prices MLA with its generic attention
# keys (costmodel/params.py, ``attention_kernel_params``), and its provenance says so
MLA_FIT_KEYS = ("mla_decode_max", "mla_decode_hbm_fraction", "mla_decode_block_us", "mla_decode_latency_us",
                "mla_decode_fp8_max", "mla_decode_fp8_hbm_fraction", "mla_prefill_max", "mla_prefill_hbm_fraction",
                "mla_prefill_block_overhead", "mla_prefill_latency_us")
_OPTIONAL_FIT.update({k: 0.0 for k in MLA_FIT_KEYS})


@dataclass(frozen=True)
class SchedulerDefaults:
    """The engine's defaults for the options a user can override on the command line."""
    policy: str
    max_num_seqs: int
    max_num_batched_tokens: int
    block_size: int
    gpu_memory_utilization: float
    memory_fraction_of: str        # "total": of all device memory (vLLM); "free": of what is left (TensorRT-LLM)
    watermark: float               # fraction of KV blocks kept free when admitting
    preemption: str
    non_torch_memory_bytes: float  # CUDA context, NCCL and CUDA-graph buffers outside the allocator
    prefix_caching: bool = True    # automatic prefix caching on by default (optional key; absent: on)


@dataclass(frozen=True)
class CudaGraphs:
    """Which batches run as a replayed CUDA graph, and the batch sizes captured.

    Captured sizes: ``sizes``, then every ``step_small`` up to ``large_from`` and every ``step_large``
    from ``large_from``, up to ``min(max_size_per_seq * max_num_seqs, max_size)`` tokens. A batch of
    T tokens at most the largest size is padded to the next captured size; a larger one runs eagerly.
    Modes: none (always eager), piecewise (every kernel but attention in graphs), full (the whole
    forward in one graph), full_and_piecewise (full for decode-only batches, piecewise for mixed)."""
    mode: str
    sizes: tuple[int, ...]
    step_small: int
    step_large: int
    large_from: int
    max_size: int
    max_size_per_seq: int

    def capture_sizes(self, max_num_seqs: int) -> np.ndarray:
        if self.mode == "none":
            return np.zeros(0, dtype=np.float64)
        top = min(self.max_size_per_seq * max_num_seqs, self.max_size)
        out = [s for s in self.sizes if s <= top]
        start = max(out[-1] + 1, self.step_small) if out else self.step_small
        first = -(-start // self.step_small) * self.step_small
        out += list(range(first, min(top + 1, self.large_from), self.step_small))
        if top >= self.large_from:
            out += list(range(self.large_from, top + 1, self.step_large))
        return np.asarray(sorted(set(out)), dtype=np.float64)


@dataclass(frozen=True)
class EngineFit:
    """Kernel efficiencies and host costs of one engine on one GPU, in SI units (FIT_KEYS)."""
    gemm_max: float
    gemm_hbm_fraction: float
    gemm_latency_s: float
    gemm_splitk_latency_s: float
    gemm_tile_overhead_k: float
    gemm_mem_latency_s: float
    gemm_fp8_max: float
    gemm_fp8_latency_s: float
    gemm_fp8_quant_bytes: float      # HBM bytes per activation element its quantisation moves (0: none apart)
    attn_prefill_max: float
    attn_prefill_hbm_fraction: float
    attn_prefill_block_overhead: float
    attn_prefill_latency_s: float
    attn_decode_hbm_fraction: float
    attn_decode_block_s: float
    attn_decode_latency_s: float
    attn_decode_split_s: float       # split-KV decode's combine kernel (few sequences x KV heads)
    attn_decode_split_seqs: float    # split-KV: sequences x splits aimed at per KV head (0: split every chunk)
    attn_decode_block_bw: float      # bytes/s one decode thread block reads (0: no cap)
    mla_decode_max: float            # MLA kernels (0 throughout: not fitted, the generic attention keys price MLA)
    mla_decode_hbm_fraction: float
    mla_decode_block_s: float
    mla_decode_latency_s: float
    mla_decode_fp8_max: float
    mla_decode_fp8_hbm_fraction: float
    mla_prefill_max: float
    mla_prefill_hbm_fraction: float
    mla_prefill_block_overhead: float
    mla_prefill_latency_s: float
    allreduce_latency_s: float
    allreduce_bw_fraction: float
    allreduce_step_latency_s: float
    allreduce_eager_launch_s: float
    moe_efficiency: float
    moe_latency_s: float
    moe_fp8_efficiency: float
    moe_fp8_latency_s: float
    moe_pair_s: float
    moe_tile_ridge: float            # tile intensity at which the L2 feed matches the tensor cores (0: off)
    moe_stream_bytes: float          # weight run per K step at which a fused-MoE tile streams at the GEMM rate (0: off)
    launch_s: float                  # CPU time to launch one kernel outside a CUDA graph
    graph_overlap: float             # fraction of each kernel's fixed time hidden behind its neighbours in a step
    step_gpu_s: float                # GPU time per step outside the forward (sampler, input copies), never overlapped
    host_step_s: float               # host work per engine step (schedule, prepare inputs, sample, update)
    host_per_seq_s: float            # ... per scheduled sequence
    frontend_s: float                # per request: HTTP, tokenisation, IPC to the engine, first token back
    fit_source: str
    fitted_on: str                   # the hardware profile whose table this is
    note: str = ""                   # how it applies to the hardware at hand (fitted / borrowed)
    borrowed_from: str = ""          # the profile whose table a GPU without its own uses ("": its own)
    borrowed_keys: tuple = ()        # keys the table took from another of the profile's tables ...
    keys_from: str = ""              # ... named by its efficiency_from


@dataclass(frozen=True)
class EngineProfile:
    name: str
    description: str
    version: str
    source: str
    path: Path
    scheduler: SchedulerDefaults
    cuda_graph: CudaGraphs
    fused_add_norm: bool             # residual add fused into the following RMSNorm
    allreduce: str                   # "custom": the engine's own inside the scale-up domain; "nccl"
    custom_allreduce_max_bytes: float
    host_overlap: bool               # host work of a step overlaps the GPU work of the previous step
    fits: dict                       # hardware profile name -> EngineFit
    allreduce_max_bytes_by_tp: dict = dataclasses.field(default_factory=dict)   # capability -> {tp: bytes}
    moe_configs: Path | None = None  # tuned fused-MoE tiles (costmodel/moe_tiles.py); None: not known
    moe_default_tile_small: tuple = (0, 0, 0)   # tile (rows, columns, K step) when the batch has at most as many
    moe_default_tile: tuple = (0, 0, 0)         # tokens as local experts; otherwise, without a tuned config
    moe_ep_masked: bool = False      # under EP the fused MoE walks every routed pair, zeroing remote ones (costmodel/ep.py)
    overlap_speculative: tuple | None = None   # speculative methods that keep host_overlap (None: all of them)

    def allreduce_max_bytes(self, tp: int, hw=None) -> float:
        """Largest message the engine's own NVLink all-reduce takes for a TP group of ``tp`` GPUs on ``hw``
        (its compute capability's limits, else ``custom_allreduce_max_mib``)."""
        by_tp = self.allreduce_max_bytes_by_tp.get(getattr(hw, "cuda_capability", ""), {})
        return by_tp.get(int(tp), self.custom_allreduce_max_bytes)

    def fit_for(self, hw) -> EngineFit:
        """This engine's fit for hardware ``hw``: its own table, else that of the profile ``hw`` names
        in ``efficiency_from`` (followed on: b200 -> h100-sxm), marked as borrowed. A profile naming
        none, or none with a table, is a ConfigError naming the keys and the command that fits them:
        another GPU's table is never used unnamed. ``note`` says which terms are fitted on this GPU
        and which are carried over (``_terms``)."""
        fit = self.fits.get(hw.name)
        if fit is not None and fit.fitted_on == hw.name:
            return dataclasses.replace(fit, note=f"fitted on {hw.name}" + _terms(fit))
        base = fit.fitted_on if fit is not None else None     # a borrowed fit with fields replaced
        if base is None:
            from .hardware import borrow_chain
            chain = borrow_chain(hw)
            base = next((name for name in chain if name in self.fits), None)
            if base is None:
                raise ConfigError(_no_fit_message(self, hw, chain))
            fit = self.fits[base]
        return dataclasses.replace(
            fit, borrowed_from=base,
            note=f"no {self.name} fit for {hw.name}: {base}'s fit (borrowed: efficiency_from), priced with "
                 f"{hw.name}'s datasheet peaks and bandwidths (kernel efficiencies carried over as "
                 f"fractions of them)" + _terms(fit))


def _no_fit_message(engine: EngineProfile, hw, chain: list[str]) -> str:
    """One line: which table is missing, the command that fits it, and how to borrow one by name."""
    named = f"names {', '.join(chain)} in efficiency_from, without a table there" if chain else \
        "names no profile to borrow from (efficiency_from = \"\")"
    eng_arg = engine.name if engine.path.parent == engines_dir() else display_path(engine.path)
    return (f"--engine {eng_arg}: no [hardware.{hw.name}] table of fitted keys ({FIT_KEYS[0][0]} ... "
            f"{FIT_KEYS[-1][0]}) and hardware {hw.name} {named}; fit one with `servesim calibrate --profile "
            f"{_hw_arg(hw)} --aiconfigurator DIR --engine {eng_arg} --engine-output FILE.toml` (then --serving "
            f"bench.json for the end-to-end keys), or borrow a GPU's fit by name: efficiency_from = "
            f"\"h100-sxm\" in {display_path(hw.path)} (tables: {', '.join(sorted(engine.fits)) or 'none'})")


def _hw_arg(hw) -> str:
    from servesim.paths import hardware_dir
    return hw.name if Path(hw.path).parent == hardware_dir() else display_path(hw.path)


def _terms(fit: EngineFit) -> str:
    """'' when every term of a table was fitted on its own GPU; else '; ' and which were carried over."""
    carried = carried_terms(fit)
    return "; " + "; ".join(carried) if carried else ""


def carried_terms(fit: EngineFit, moe: bool = True, mla: bool = False) -> list[str]:
    """The terms of a table not fitted on its own GPU, read from its ``borrowed_keys`` and its
    fit_source (the fit scripts write 'h100-sxm's values' / 'carried over' / "vLLM's values" there);
    the fused-MoE ones only when ``moe``, the MLA kernels' only when ``mla``."""
    src = fit.fit_source
    carried = []
    if mla and fit.mla_decode_hbm_fraction == 0.0:
        carried.append("MLA attention priced with the generic attention keys (no mla_* keys in this table)")
    elif mla:
        carried += [part for part in src.split("; ") if part.startswith("mla keys") and "'s" in part]
    if fit.borrowed_keys:
        carried.append(f"{', '.join(fit.borrowed_keys)} from {fit.keys_from}'s table (efficiency_from)")
    if "h100-sxm's end-to-end fit carried over" in src or "h100-sxm's values" in src or "vLLM's" in src:
        scaled = "x its gemm_latency_us" in src
        carried.append("end-to-end terms (graph_overlap, " + ("step GPU time as a ratio of its own GEMM fixed time, "
                                                             if scaled else "step GPU time, ")
                       + "host time, frontend) carried over from "
                       + ("vLLM's h100-sxm fit" if "vLLM's" in src else "h100-sxm"))
    if "moe keys: h100-sxm's" in src and moe:
        carried.append("fused-MoE efficiencies h100-sxm's")
    if "launch_us: h100-sxm's" in src:
        carried.append("launch_us h100-sxm's")
    return carried


def replica_provenance(rc) -> dict:
    """`provenance` of a lowered replica (``costmodel.ReplicaCost``: its engine, hardware and model)."""
    return provenance(rc.engine, rc.hw, moe=getattr(rc.model, "moe", None) is not None,
                      mla=getattr(rc.model, "mla", None) is not None)


def provenance(engine: EngineProfile, hw, moe: bool = True, mla: bool = False) -> dict:
    """Where a run's efficiencies come from, for the summary (``config.fit``) and ``plan``:
    ``hardware``: "measured" (the profile's own [efficiency]) or "borrowed from X (datasheet
    extrapolation)"; ``engine``: "fitted on X" or "borrowed from X (datasheet extrapolation)";
    ``carried``: the terms of the table not fitted on its GPU, "; "-joined ("" none); ``measured``:
    none of it borrowed.
    ``moe``: count the fused-MoE terms (a MoE model); ``mla``: the MLA kernels' (an MLA model)."""
    fit = engine.fit_for(hw)
    extrapolated = f"datasheet extrapolation to {hw.name}"
    hw_src = "measured" if hw.own_efficiency else f"borrowed from {hw.efficiency_from} ({extrapolated})"
    eng = (f"borrowed from {fit.borrowed_from} ({extrapolated})" if fit.borrowed_from
           else f"fitted on {hw.name}")
    carried = carried_terms(fit, moe, mla)
    return {"hardware": hw_src, "engine": eng, "carried": "; ".join(carried),
            "measured": bool(hw.own_efficiency and not fit.borrowed_from and not carried),
            "text": f"{hw.name} efficiencies {hw_src}; {engine.name} kernels {eng}"
                    + "".join(f"; {c}" for c in carried)}


def with_fit_for(engine: EngineProfile, hw, **overrides) -> EngineProfile:
    """A copy of ``engine`` whose fit for ``hw`` has some fields replaced (SI names, e.g.
    ``host_step_s``): used for ``--iteration-overhead-us`` and by the host-model fit."""
    fit = with_fit(engine.fit_for(hw), **overrides)
    return dataclasses.replace(engine, fits={**engine.fits, hw.name: dataclasses.replace(fit, note="")})


def list_engines() -> list[str]:
    return sorted(p.stem for p in engines_dir().glob("*.toml"))


def load_engine(name_or_path: str) -> EngineProfile:
    """A shipped engine by name (``"vllm"``) or a user's profile by path to a ``.toml``."""
    text = str(name_or_path)
    if text.endswith(".toml") or "/" in text or "\\" in text:
        path = Path(text)
        if not path.is_file():
            raise ConfigError(f"--engine {text}: engine profile file not found; pass a shipped engine "
                              f"({', '.join(list_engines())}) or an existing .toml")
        return _load_file(path.resolve())
    path = engines_dir() / f"{text}.toml"
    if not path.is_file():
        raise ConfigError(f"--engine: unknown engine {text!r}; {did_you_mean(text, list_engines())}use one of "
                          f"{', '.join(list_engines())} or a path to an engine profile .toml")
    return _load_file(path.resolve())


@functools.lru_cache(maxsize=None)
def _load_file(path: Path) -> EngineProfile:
    top, name = read_named(path, _TOP_KEYS)
    s = top.table("scheduler")
    s.expect_keys(_SCHEDULER_KEYS, ("prefix_caching",))
    sched = SchedulerDefaults(
        policy=s.str("policy", choices=POLICIES),
        max_num_seqs=s.int("max_num_seqs", ge=1),
        max_num_batched_tokens=s.int("max_num_batched_tokens", ge=1),
        block_size=s.int("block_size", ge=1),
        gpu_memory_utilization=s.fraction("gpu_memory_utilization"),
        memory_fraction_of=s.str("memory_fraction_of", choices=MEMORY_FRACTION_OF),
        watermark=s.float("watermark", ge=0.0, le=0.5),
        preemption=s.str("preemption", choices=PREEMPTION),
        non_torch_memory_bytes=s.float("non_torch_memory_mib", ge=0.0) * _UNIT["mib"],
        prefix_caching=s.bool("prefix_caching") if s.has("prefix_caching") else True,
    )

    g = top.table("cuda_graph")
    g.expect_keys(_GRAPH_KEYS)
    sizes = g.data["sizes"]
    if not isinstance(sizes, list) or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in sizes) \
            or sizes != sorted(set(sizes)):
        raise g.error("sizes", f"must be an increasing list of integers >= 1, got {sizes!r}")
    graphs = CudaGraphs(
        mode=g.str("mode", choices=GRAPH_MODES), sizes=tuple(sizes),
        step_small=g.int("step_small", ge=1), step_large=g.int("step_large", ge=1),
        large_from=g.int("large_from", ge=1), max_size=g.int("max_size", ge=1),
        max_size_per_seq=g.int("max_size_per_seq", ge=1),
    )

    k = top.table("kernels")
    k.expect_keys(_KERNEL_KEYS, _MOE_TILE_KEYS + (_AR_TP_KEY, "moe_ep_masked"))
    ar_by_tp = {}
    if k.has(_AR_TP_KEY):
        by_cap = k.data[_AR_TP_KEY]
        ok = isinstance(by_cap, dict)
        for cap, pairs in (by_cap.items() if ok else ()):
            ok &= isinstance(pairs, list) and all(isinstance(q, list) and len(q) == 2 and isinstance(q[0], int)
                                                  and q[0] >= 2 and isinstance(q[1], (int, float)) and q[1] >= 0
                                                  for q in pairs)
            if ok:
                ar_by_tp[str(cap)] = {int(a): float(b) * _UNIT["mib"] for a, b in pairs}
        if not ok:
            raise k.error(_AR_TP_KEY, "must map a compute capability (\"9.0\") to [tp, MiB] pairs (tp >= 2, "
                                      f"MiB >= 0), got {by_cap!r}")
    moe_tiles = {}
    if k.has("moe_configs"):
        name_ = k.str("moe_configs", nonempty=True)
        cfg = path.parent / name_
        if not cfg.is_file():     # a copy of a shipped profile elsewhere names the shipped data file
            cfg = engines_dir() / name_
        if not cfg.is_file():
            raise k.error("moe_configs", f"names {name_}, which is neither beside {display_path(path)} nor a "
                                         f"shipped engine data file ({', '.join(p.name for p in engines_dir().glob('*.csv'))})")
        moe_tiles["moe_configs"] = cfg
        for key in _MOE_TILE_KEYS[1:]:
            tile = k.data.get(key)
            if not (isinstance(tile, list) and len(tile) == 3 and all(isinstance(v, int) and v >= 1 for v in tile)):
                raise k.error(key, f"must be [rows, columns, K step] of integers >= 1 with moe_configs, got {tile!r}")
            moe_tiles[key] = tuple(tile)
    h = top.table("host")
    h.expect_keys(_HOST_KEYS, _HOST_OPTIONAL)

    hw_table = top.table("hardware")
    tables = {hw_name: hw_table.table(hw_name) for hw_name in hw_table.data}
    fits = {hw_name: _read_fit(t, hw_name, tables, name) for hw_name, t in tables.items()}

    return EngineProfile(
        name=name, description=top.str("description", nonempty=True), version=top.str("version", nonempty=True),
        source=top.str("source", nonempty=True), path=path, scheduler=sched, cuda_graph=graphs,
        fused_add_norm=k.bool("fused_add_norm"), allreduce=k.str("allreduce", choices=ALLREDUCE),
        custom_allreduce_max_bytes=k.float("custom_allreduce_max_mib", ge=0.0) * _UNIT["mib"],
        host_overlap=h.bool("overlap"), overlap_speculative=_overlap_speculative(h), fits=fits, allreduce_max_bytes_by_tp=ar_by_tp, **moe_tiles,
        moe_ep_masked=k.bool("moe_ep_masked") if k.has("moe_ep_masked") else False,
    )


def _overlap_speculative(h: Table) -> tuple | None:
    """``[host] overlap_speculative``: the speculative methods under which the engine keeps its host
    overlap (the others run the host work between steps); absent: every method keeps it."""
    if not h.has("overlap_speculative"):
        return None
    value = h.data["overlap_speculative"]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise h.error("overlap_speculative", f"must be a list of method names, got {value!r}")
    bad = [v for v in value if v not in SPECULATIVE_METHODS]
    if bad:
        raise h.error("overlap_speculative", f"unknown method {bad[0]!r}; use {', '.join(SPECULATIVE_METHODS)}")
    return tuple(value)


def _read_fit(t: Table, hw_name: str, tables: dict, engine: str) -> EngineFit:
    """One ``[hardware.<gpu>]`` table. A fitted key it lacks is an error naming the key and the
    ``servesim calibrate`` input that fits it, unless the table names another of the profile's tables
    to take it from (``efficiency_from = "h100-sxm"``; that table must be complete), which the fit's
    note then lists."""
    keys = [key for key, _, _ in FIT_KEYS if key not in _OPTIONAL_FIT]
    t.expect_keys([], ["fit_source", "efficiency_from"] + keys + list(_OPTIONAL_FIT))
    src_name = t.str("efficiency_from", nonempty=True) if t.has("efficiency_from") else ""
    src = None
    if src_name:
        if src_name == hw_name or src_name not in tables or tables[src_name].has("efficiency_from"):
            why = "itself" if src_name == hw_name else "a table that borrows too" if src_name in tables else \
                "no table of this profile"
            raise t.error("efficiency_from", f"names {src_name!r}, {why}; name one of the profile's complete "
                                             f"tables: {', '.join(n for n in tables if not tables[n].has('efficiency_from'))}")
        src = tables[src_name]
    if not t.has("fit_source") and src is None:
        raise t.error("fit_source", "is missing; say where the fitted values come from")
    values: dict[str, object] = {"fit_source": t.str("fit_source", nonempty=True) if t.has("fit_source") else
                                 f"{src_name}'s table (efficiency_from)", "fitted_on": hw_name}
    taken = []
    for key, field, kind in FIT_KEYS:
        table = t
        if not t.has(key):
            if key in _OPTIONAL_FIT and (src is None or not src.has(key)):
                values[field] = _OPTIONAL_FIT[key] * _UNIT.get(key.rsplit("_", 1)[-1], 1.0)
                continue
            if src is None:
                raise t.error(key, f"is missing; {_fills(key, hw_name, engine)}, or take it from another GPU's "
                                   f"table by name: efficiency_from = \"h100-sxm\" in this table")
            table = src
            taken.append(key)
        if kind == "fraction":
            value = table.fraction(key)
        elif kind == "unit":
            value = table.float(key, ge=0.0, le=1.0)
        else:
            value = table.float(key, ge=0.0)
        values[field] = value * _UNIT.get(key.rsplit("_", 1)[-1], 1.0)
    given = [k for k in MLA_FIT_KEYS if t.has(k) or (src is not None and src.has(k))]
    if 0 < len(given) < len(MLA_FIT_KEYS):
        missing = [k for k in MLA_FIT_KEYS if k not in given]
        raise t.error(missing[0], f"is missing; the MLA kernel keys come together ({', '.join(MLA_FIT_KEYS)}; "
                                  "experiments/fit_mla.py fits them), or leave all of them out")
    if taken:
        values["borrowed_keys"] = tuple(taken)
        values["keys_from"] = src_name
    return EngineFit(**values)


_END_TO_END_KEYS = ("graph_overlap", "step_gpu_us", "host_step_us", "host_per_seq_us", "frontend_us", "launch_us")


def _fills(key: str, hw_name: str, engine: str) -> str:
    """The ``servesim calibrate`` command that fits ``key`` (file key) for ``hw_name``."""
    if key in _END_TO_END_KEYS:
        return (f"fit it with `servesim calibrate --profile {hw_name} --serving bench.json --model M --tp N "
                f"--engine {engine} --engine-output FILE.toml` (end-to-end keys)")
    return (f"fit it with `servesim calibrate --profile {hw_name} --aiconfigurator DIR --engine {engine} "
            f"--engine-output FILE.toml` (kernel keys)")


def with_fit(fit: EngineFit, **overrides) -> EngineFit:
    """A copy of ``fit`` with some fields replaced (SI names); used by the host-model fit."""
    known = {f.name for f in dataclasses.fields(EngineFit)}
    for key, value in overrides.items():
        if key not in known:
            raise ConfigError(f"with_fit: unknown field '{key}'; known: {', '.join(sorted(known))}")
        if isinstance(value, float) and not value >= 0.0:
            raise ConfigError(f"with_fit: field '{key}' must be >= 0, got {value!r}")
    return dataclasses.replace(fit, **overrides)


__all__ = ["CudaGraphs", "EngineFit", "EngineProfile", "FIT_KEYS", "MLA_FIT_KEYS", "SchedulerDefaults", "carried_terms",
           "list_engines", "load_engine", "provenance", "replica_provenance", "with_fit", "with_fit_for"]
