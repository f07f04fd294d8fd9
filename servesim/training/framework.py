"""Training framework profiles (``data/frameworks/<name>.toml``) and architecture figures
(``data/architectures.toml``) -> validated, frozen dataclasses.

A hardware profile describes silicon; a framework profile describes how a training framework runs
a model on it: which attention kernel, which gradient precision, whether data-parallel traffic
overlaps compute, how ZeRO-3 / FSDP gathers parameters, how fp8 is applied. Schema and the meaning
of every key: ``data/README.md``; every value's source is in its file.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from servesim.config._toml import Table, display_path, read_named, read_toml
from servesim.errors import ConfigError

DATA_DIR = Path(__file__).resolve().parent / "data"
FRAMEWORKS_DIR = DATA_DIR / "frameworks"
ATTENTION_KERNELS = ("flash", "fa2", "unfused")
# Transformer Engine's recipes (delayed, current, block, mxfp8) and torchao.float8's (tensorwise: dynamic
# per-tensor scales, as current; rowwise: one scale per row of each operand)
FP8_RECIPES = ("delayed", "current", "block", "mxfp8", "tensorwise", "rowwise")
RUNTIMES = ("pytorch", "jax")
AC_STYLES = ("megatron", "torchtitan", "maxtext")
RESHARD = ("always", "never", "default")
# MaxText remat policies (MaxText/layers/decoders.py get_remat_policy; --remat-policy): what each
# recomputes, as (recompute, the modules recomputed, saved tensors offloaded to the host)
REMAT_POLICIES = {
    "full": ("full", (), False),                                                     # nothing_saveable
    "minimal": ("selective", ("layernorm", "context", "mlp_act"), False),             # dots without batch dims saved
    "minimal_offloaded": ("selective", ("layernorm", "context", "mlp_act"), True),
    "save_dot_with_context_except_mlp": ("selective", ("layernorm", "mlp_fc1"), False),
    "save_dot_except_mlpwi": ("selective", ("layernorm", "context", "mlp_fc1"), False),
    "save_dot_except_mlp": ("selective", ("layernorm", "context", "mlp_fc1"), False),
    "save_qkv_proj": ("selective", ("layernorm", "context", "out_proj", "mlp_fc1"), False),
    "qkv_proj_offloaded": ("selective", ("layernorm", "context", "out_proj", "mlp_fc1"), True),
    "save_out_proj": ("selective", ("layernorm", "qkv_proj", "context", "mlp_fc1"), False),
}

_TOP_KEYS = ("name", "description", "source", "runtime", "attention", "precision", "data_parallel", "defaults")
_DEFAULT_KEYS = ("sequence_parallel", "tp_comm_overlap", "recompute", "ac_style", "selective_ac_option",
                 "remat_policy", "reshard_after_forward", "fp8_all_gather")
_ATTN_KEYS = ("kernel",)
_PREC_KEYS = ("grad_bytes", "fp8", "fp8_recipe_hopper", "fp8_recipe_blackwell", "fp8_norm_cast_fused",
              "fp8_weight_cache", "fp8_lm_head")
_DP_KEYS = ("default_zero", "overlap_grad_reduce", "overlap_param_gather", "hierarchical",
            "fsdp_prefetch_layers", "zero3_live_params_m", "fsdp_param_bytes")
_ARCH_KEYS = ("profiles", "calibrated", "fp8_gemm_ratio", "mxfp8", "note")
_ARCH_OPTIONAL = ("fa2_attention_max", "attn_max", "attn_half_seq", "gemm_vs_source", "scaleup_bw_vs_source")


@dataclass(frozen=True)
class Framework:
    """How one training framework runs a model (see data/README.md for each field)."""

    name: str
    description: str
    source: str
    path: Path
    attention: str
    grad_bytes: int
    fp8: bool
    fp8_recipe_hopper: str
    fp8_recipe_blackwell: str
    fp8_norm_cast_fused: bool
    fp8_weight_cache: bool
    fp8_lm_head: bool
    default_zero: int
    overlap_grad_reduce: bool
    overlap_param_gather: bool
    hierarchical: bool
    fsdp_prefetch_layers: int
    zero3_live_params: float  # 0: whole layers are gathered; else at most this many parameters at once
    fsdp_param_bytes: int
    # how the framework runs and what its recipes set when the command line does not ([defaults])
    runtime: str = "pytorch"
    sequence_parallel: bool = False
    tp_comm_overlap: bool = False
    recompute: str = "selective"
    ac_style: str = "megatron"
    selective_ac_option: str = ""
    remat_policy: str = ""
    reshard_after_forward: str = "always"
    fp8_all_gather: bool = False


@dataclass(frozen=True)
class Architecture:
    """Training-kernel figures of one GPU architecture (data/architectures.toml)."""

    name: str
    calibrated: bool
    fa2_attention_max: float | None  # None: the hardware profile's attn_prefill_max
    fp8_gemm_ratio: float            # fp8 GEMM fraction of the fp8 peak / bf16 fraction of the bf16 peak
    mxfp8: bool                      # hardware block scaling (Blackwell)
    note: str
    attn_max: float | None = None          # measured fused-attention curve: attn_max s / (s + attn_half_seq)
    attn_half_seq: float | None = None
    gemm_vs_source: float = 1.0            # GEMM fraction relative to the architecture the profile borrows from
    scaleup_bw_vs_source: float = 1.0      # NVLink collective fraction relative to the same

    def attention(self, kernel: str, seq: float, profile_max: float) -> float | None:
        """Achieved fraction of the bf16 peak of a ``kernel`` ("flash" or "fa2") attention call over
        ``seq`` keys; None where the architecture has no measured curve."""
        if self.attn_max is None or self.attn_half_seq is None:
            return None
        shape = seq / (seq + self.attn_half_seq)
        if kernel == "fa2" and self.fa2_attention_max is not None:
            return self.fa2_attention_max * shape
        return self.attn_max * shape


def list_frameworks() -> list[str]:
    return sorted(p.stem for p in FRAMEWORKS_DIR.glob("*.toml"))


def load_framework(name_or_path: str) -> Framework:
    """A shipped name (``megatron``) or a path to a framework TOML."""
    text = str(name_or_path)
    if text.endswith(".toml") or "/" in text:
        path = Path(text)
        if not path.is_file():
            raise ConfigError(f"--framework {text}: file not found; use one of {', '.join(list_frameworks())} "
                              f"or a path to a framework .toml")
        return _load(path.resolve())
    path = FRAMEWORKS_DIR / f"{text}.toml"
    if not path.is_file():
        raise ConfigError(f"--framework {text}: unknown framework; use one of {', '.join(list_frameworks())} "
                          f"or a path to a framework .toml")
    return _load(path)


@functools.lru_cache(maxsize=None)
def _load(path: Path) -> Framework:
    top, name = read_named(path, _TOP_KEYS)
    att = top.table("attention")
    att.expect_keys(_ATTN_KEYS)
    prec = top.table("precision")
    prec.expect_keys(_PREC_KEYS)
    dp = top.table("data_parallel")
    dp.expect_keys(_DP_KEYS)
    grad_bytes = prec.int("grad_bytes", ge=2, le=4)
    if grad_bytes == 3:
        raise prec.error("grad_bytes", "must be 2 (bf16/fp16) or 4 (fp32), got 3")
    param_bytes = dp.int("fsdp_param_bytes", ge=2, le=4)
    if param_bytes == 3:
        raise dp.error("fsdp_param_bytes", "must be 2 (bf16/fp16) or 4 (fp32), got 3")
    zero = dp.int("default_zero", ge=0, le=3)
    d = top.table("defaults")
    d.expect_keys(_DEFAULT_KEYS)
    style = d.str("ac_style", choices=AC_STYLES)
    option = d.str("selective_ac_option")
    if style == "torchtitan" and not check_selective_ac(option):
        raise d.error("selective_ac_option", f"must be 'op' or a layer interval >= 1, got {option!r}")
    if style != "torchtitan" and option:
        raise d.error("selective_ac_option", f"is a torchtitan setting (ac_style = 'torchtitan'); use \"\" for "
                                             f"ac_style = {style!r}")
    policy = d.str("remat_policy")
    if style == "maxtext" and policy not in REMAT_POLICIES:
        raise d.error("remat_policy", f"unknown policy {policy!r}; use one of {', '.join(REMAT_POLICIES)}")
    if style != "maxtext" and policy:
        raise d.error("remat_policy", f"is a MaxText setting (ac_style = 'maxtext'); use \"\" for ac_style = {style!r}")
    return Framework(
        name=name, description=top.str("description", nonempty=True), source=top.str("source", nonempty=True),
        path=path, attention=att.str("kernel", choices=ATTENTION_KERNELS), grad_bytes=grad_bytes,
        fp8=prec.bool("fp8"), fp8_recipe_hopper=prec.str("fp8_recipe_hopper", choices=FP8_RECIPES),
        fp8_recipe_blackwell=prec.str("fp8_recipe_blackwell", choices=FP8_RECIPES),
        fp8_norm_cast_fused=prec.bool("fp8_norm_cast_fused"), fp8_weight_cache=prec.bool("fp8_weight_cache"),
        fp8_lm_head=prec.bool("fp8_lm_head"),
        default_zero=zero, overlap_grad_reduce=dp.bool("overlap_grad_reduce"),
        overlap_param_gather=dp.bool("overlap_param_gather"), hierarchical=dp.bool("hierarchical"),
        fsdp_prefetch_layers=dp.int("fsdp_prefetch_layers", ge=0, le=8),
        zero3_live_params=dp.float("zero3_live_params_m", ge=0.0) * 1e6, fsdp_param_bytes=param_bytes,
        runtime=top.str("runtime", choices=RUNTIMES), sequence_parallel=d.bool("sequence_parallel"),
        tp_comm_overlap=d.bool("tp_comm_overlap"),
        recompute=d.str("recompute", choices=("none", "selective", "full", "auto")), ac_style=style,
        selective_ac_option=option, remat_policy=policy,
        reshard_after_forward=d.str("reshard_after_forward", choices=RESHARD), fp8_all_gather=d.bool("fp8_all_gather"))


def check_selective_ac(option) -> bool:
    """torchtitan's selective_ac_option: 'op' (per-op) or a layer interval N >= 1 (every N-th layer)."""
    text = str(option).strip()
    return text == "op" or (text.isdigit() and int(text) >= 1)


@functools.lru_cache(maxsize=None)
def _architectures() -> dict[str, Architecture]:
    path = DATA_DIR / "architectures.toml"
    top = Table(read_toml(path), path)
    by_profile: dict[str, Architecture] = {}
    for name in top.data:
        t = top.table(name)
        t.expect_keys(_ARCH_KEYS, optional=_ARCH_OPTIONAL)
        ratio = t.float("fp8_gemm_ratio", ge=0.0, le=1.0)
        opt = {k: (t.fraction(k) if t.has(k) else None) for k in ("fa2_attention_max", "attn_max")}
        arch = Architecture(name=name, calibrated=t.bool("calibrated"),
                            fa2_attention_max=opt["fa2_attention_max"], fp8_gemm_ratio=ratio, mxfp8=t.bool("mxfp8"),
                            note=t.str("note"), attn_max=opt["attn_max"],
                            attn_half_seq=t.float("attn_half_seq", gt=0.0) if t.has("attn_half_seq") else None,
                            gemm_vs_source=t.float("gemm_vs_source", gt=0.0, le=2.0) if t.has("gemm_vs_source") else 1.0,
                            scaleup_bw_vs_source=(t.float("scaleup_bw_vs_source", gt=0.0, le=2.0)
                                                  if t.has("scaleup_bw_vs_source") else 1.0))
        if (arch.attn_max is None) != (arch.attn_half_seq is None):
            raise t.error("attn_max", "and attn_half_seq go together: give both or neither")
        profiles = t.data["profiles"]
        if not isinstance(profiles, list) or not all(isinstance(p, str) for p in profiles):
            raise t.error("profiles", f"must be a list of hardware profile names, got {profiles!r}")
        for p in profiles:
            if p in by_profile:
                raise t.error("profiles", f"lists {p!r}, already in [{by_profile[p].name}]")
            by_profile[p] = arch
    return by_profile


UNKNOWN_ARCHITECTURE = Architecture(name="unknown", calibrated=False, fa2_attention_max=None, fp8_gemm_ratio=0.749,
                                    mxfp8=False, note="a hardware profile outside architectures.toml: efficiencies "
                                                      "as its profile gives them, fp8/bf16 GEMM ratio Hopper's")


def architecture_of(hw) -> Architecture:
    """The architecture of a hardware profile (by name; a profile file of another name: the
    architecture of the profile it borrows its efficiencies from, else unknown)."""
    archs = _architectures()
    if hw.name in archs:
        return archs[hw.name]
    if getattr(hw, "efficiency_from", "") in archs:
        return archs[hw.efficiency_from]
    return UNKNOWN_ARCHITECTURE


def borrows_efficiency(hw) -> bool:
    """The profile takes its [efficiency] from another (``efficiency_from``, not its own)."""
    return bool(getattr(hw, "efficiency_from", "")) and not getattr(hw, "own_efficiency", False)


def efficiency_architecture(hw) -> str:
    """The architecture whose measurements a profile's efficiencies come from: its own when it
    carries them, else that of the profile it borrows them from (b200 -> h100-sxm -> hopper)."""
    src = getattr(hw, "efficiency_from", "")
    archs = _architectures()
    if borrows_efficiency(hw) and src in archs:
        return archs[src].name
    return architecture_of(hw).name


def training_hardware(hw):
    """The profile as the training model sees it: its NVLink collective fraction times the
    architecture's measured ``scaleup_bw_vs_source`` where it borrows its efficiencies."""
    import dataclasses
    arch = architecture_of(hw)
    if arch.scaleup_bw_vs_source == 1.0 or not borrows_efficiency(hw):
        return hw
    e = hw.efficiency
    return dataclasses.replace(hw, efficiency=dataclasses.replace(
        e, scaleup_bw_fraction=min(1.0, e.scaleup_bw_fraction * arch.scaleup_bw_vs_source)))


def extrapolation_note(hw) -> str:
    """Why a prediction on ``hw`` is an extrapolation ("" when the architecture has training data
    and the profile carries its own measured efficiencies)."""
    arch = architecture_of(hw)
    parts = []
    if not arch.calibrated:
        parts.append(arch.note or f"no training measurements on {arch.name}")
    if borrows_efficiency(hw):
        if arch.attn_max is not None and arch.gemm_vs_source != 1.0:
            parts.append(f"{hw.name}'s other efficiencies (elementwise, kernel latency, send/recv, NIC) are "
                         f"{hw.efficiency_from}'s")
        else:
            parts.append(f"{hw.name} borrows its measured efficiencies from {hw.efficiency_from}")
    return "; ".join(parts)


def default_fp8_recipe(fw: Framework, hw) -> str:
    return fw.fp8_recipe_blackwell if architecture_of(hw).mxfp8 else fw.fp8_recipe_hopper


def describe(fw: Framework) -> str:
    return f"{fw.name} ({display_path(fw.path)})"
