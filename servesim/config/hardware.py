"""Hardware profiles: ``hardware_profiles/<name>.toml`` -> validated, frozen, SI-unit dataclasses.

Units are converted once, here (schema and sources in ``hardware_profiles/README.md``):

- ``peak_*_TFLOPS`` / ``peak_int8_TOPS``  x 1e12 -> FLOP/s (op/s for int8), dense, no sparsity
- ``hbm_capacity_GB``                     x 1e9  -> bytes (decimal GB, as vendors print them)
- ``device_memory_GiB``                   x 2**30 -> bytes (what the runtime reports as total memory)
- ``*_GBps``                              x 1e9  -> bytes/s
- ``scaleup_bandwidth_GBps`` is the vendor's total bidirectional figure per GPU; one direction is
  half of it (NVIDIA H100 datasheet: "NVLink: 900GB/s" = 18 links x 50 GB/s bidirectional).
- ``scaleout_bandwidth_Gbps``             x 1e9 / 8 -> bytes/s per GPU, per direction (NIC line rate)
- ``*_us``                                x 1e-6 -> seconds
- ``*_mib``                               x 2**20 -> bytes
- ``sm_count`` (in ``[compute]``) is unit-free: streaming multiprocessors (NVIDIA), compute units
  (AMD) or MXUs (TPU), the units over which GEMM tiles are spread (wave quantisation)

A profile either carries its own ``[efficiency]`` or names a calibrated profile whose ``[efficiency]``
it borrows (``efficiency_from``); chains are not allowed, so a borrowed block is always a measured
one. ``efficiency_from`` also names where the engine fits come from: an engine profile without a
``[hardware.<this name>]`` table uses the named profile's (`config.engine.EngineProfile.fit_for`, the
output saying so). A profile with its own ``[efficiency]`` may still name one for that alone
(``servesim calibrate`` writes the base profile there); ``""`` names none, and an engine without a
table of its own for the profile is then an error.
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from pathlib import Path

from servesim.config._toml import Table, did_you_mean, read_toml
from servesim.errors import ConfigError
from servesim.paths import hardware_dir

PRECISIONS = ("fp32", "tf32", "bf16", "fp16", "fp8", "int8", "fp4")

_TOP_KEYS = ("name", "description", "vendor", "efficiency_from", "compute", "memory",
             "interconnect", "power", "price")
_COMPUTE_KEYS = {p: (f"peak_{p}_TOPS" if p == "int8" else f"peak_{p}_TFLOPS") for p in PRECISIONS}
_MEMORY_KEYS = ("hbm_capacity_GB", "hbm_bandwidth_GBps", "device_memory_GiB")
_INTERCONNECT_KEYS = ("scaleup_name", "scaleup_bandwidth_GBps", "scaleup_domain_gpus", "gpus_per_node",
                      "pcie_gen", "pcie_lanes", "pcie_bandwidth_GBps", "scaleout_name",
                      "scaleout_bandwidth_Gbps")
_POWER_KEYS = ("tdp_W",)
_ALLTOALL_KEYS = ("bw_fraction", "latency_us", "fit_source")   # optional [alltoall] (experiments/fit_ep.py)
_PRICE_KEYS = ("usd_per_gpu_hour", "source")
# Efficiency keys in file order: (file key, dataclass field, kind). kind "fraction" is (0, 1],
# "positive" is > 0, "nonneg" is >= 0; "_us" keys are converted to seconds.
_EFFICIENCY_KEYS = (
    ("gemm_max", "gemm_max", "fraction"),
    ("gemm_half_tokens", "gemm_half_tokens", "positive"),
    ("kernel_latency_us", "kernel_latency_s", "nonneg"),
    ("hbm_fraction", "hbm_fraction", "fraction"),
    ("attn_prefill_max", "attn_prefill_max", "fraction"),
    ("scaleup_bw_fraction", "scaleup_bw_fraction", "fraction"),
    ("scaleup_latency_us", "scaleup_latency_s", "nonneg"),
    ("scaleout_bw_fraction", "scaleout_bw_fraction", "fraction"),
    ("scaleout_latency_us", "scaleout_latency_s", "nonneg"),
    ("pcie_bw_fraction", "pcie_bw_fraction", "fraction"),
    ("pcie_latency_us", "pcie_latency_s", "nonneg"),
    ("norm_hbm_fraction", "norm_hbm_fraction", "fraction"),
    ("rope_hbm_fraction", "rope_hbm_fraction", "fraction"),
    ("activation_hbm_fraction", "activation_hbm_fraction", "fraction"),
    ("elementwise_latency_us", "elementwise_latency_s", "nonneg"),
    ("collective_base_latency_us", "collective_base_latency_s", "nonneg"),
    ("p2p_bw_fraction", "p2p_bw_fraction", "fraction"),
    ("p2p_latency_us", "p2p_latency_s", "nonneg"),
    ("p2p_large_bw_fraction", "p2p_large_bw_fraction", "fraction"),
    ("p2p_large_message_mib", "p2p_large_message_bytes", "positive"),
)
# Keys of older profiles, with what replaced them (named in the error message).
_RENAMED_EFFICIENCY_KEYS = {
    "elementwise_hbm_fraction": "norm_hbm_fraction, rope_hbm_fraction, activation_hbm_fraction and "
                                "elementwise_latency_us (servesim 0.2: one fraction per kernel kind)",
    "iteration_overhead_us": "host_step_us in the engine profile, engines/<engine>.toml [hardware.<gpu>] (host "
                             "time belongs to the engine; servesim calibrate --serving ... --engine-output fits it)",
    "per_seq_overhead_us": "host_per_seq_us in the engine profile, engines/<engine>.toml [hardware.<gpu>] (host "
                           "time belongs to the engine; servesim calibrate --serving ... --engine-output fits it)",
    "attn_decode_hbm_fraction": "attn_decode_hbm_fraction in the engine profile, engines/<engine>.toml "
                                "[hardware.<gpu>] (attention kernels belong to the engine; servesim calibrate "
                                "--aiconfigurator ... --engine-output fits it)",
}
# File-key unit suffix -> factor to SI (see the module docstring).
_UNIT = {"us": 1e-6, "mib": 2.0 ** 20}
_FRACTION_FIELDS = tuple(f for _, f, kind in _EFFICIENCY_KEYS if kind == "fraction")
_POSITIVE_FIELDS = tuple(f for _, f, kind in _EFFICIENCY_KEYS if kind == "positive")


@dataclass(frozen=True)
class Efficiency:
    """Achieved fractions of peak and fixed overheads, all in SI units (seconds).

    GEMM efficiency is a curve in the token count M, not a constant:
    ``eff(M) = gemm_max * M / (M + gemm_half_tokens)`` (a saturating, Michaelis-Menten-shaped fit,
    as in roofline-with-efficiency models such as Calculon, Isaev et al. SC'23); the cost model
    owns the formula, this class only holds its parameters.
    """

    gemm_max: float
    gemm_half_tokens: float
    kernel_latency_s: float
    hbm_fraction: float
    attn_prefill_max: float           # prefill attention of the training model (servesim/training/step.py)
    scaleup_bw_fraction: float
    scaleup_latency_s: float
    scaleout_bw_fraction: float
    scaleout_latency_s: float
    pcie_bw_fraction: float
    pcie_latency_s: float
    norm_hbm_fraction: float          # RMSNorm / LayerNorm kernels (per-token reductions)
    rope_hbm_fraction: float          # rotary embedding of q and k
    activation_hbm_fraction: float    # SiLU-and-multiply / GELU
    elementwise_latency_s: float      # fixed time per elementwise kernel (residual adds stream at hbm_fraction)
    collective_base_latency_s: float  # once per collective (NCCL tuning model: base + per-hop latency)
    p2p_bw_fraction: float            # point-to-point send/recv over the scale-up link: fraction of its bandwidth
    p2p_latency_s: float              # fixed time of one send/recv over the scale-up link
    p2p_large_bw_fraction: float      # the same, for messages larger than p2p_large_message_bytes
    p2p_large_message_bytes: float    # where send/recv steps to p2p_large_bw_fraction
    fit_source: str


@dataclass(frozen=True)
class HardwareProfile:
    """One accelerator (per GPU / chip) and the node and fabric it sits in, in SI units."""

    name: str
    description: str
    vendor: str
    path: Path
    peak_flops: dict[str, float]  # keys PRECISIONS, FLOP/s (int8: op/s); 0.0 = not supported
    sm_count: int  # units matrix tiles are spread over: SMs (NVIDIA), CUs (AMD), MXUs (TPU)
    hbm_bytes: float
    hbm_bw: float  # bytes/s
    device_bytes: float  # what the runtime reports as total device memory (the capacity engines plan with)
    scaleup_name: str
    scaleup_bw: float  # bytes/s per direction per GPU (= vendor bidirectional total / 2)
    scaleup_domain: int
    gpus_per_node: int
    pcie_gen: int
    pcie_lanes: int
    pcie_bw: float  # bytes/s per direction
    scaleout_name: str
    scaleout_bw: float  # bytes/s per GPU per direction
    tdp_w: float  # 0.0 = not published
    usd_per_hour: float  # per GPU (chip) hour
    price_source: str
    efficiency: Efficiency
    efficiency_from: str  # the profile borrowed from: [efficiency] (unless own_efficiency) and engine fits; "" none
    cuda_capability: str = ""  # NVIDIA compute capability ("9.0"), where engines switch kernels on it
    own_efficiency: bool = True  # the file carries its own [efficiency] (measured), else borrowed
    # [alltoall]: (fraction of the scale-up link, latency s) of an all-to-all inside the scale-up domain,
    # fitted on NCCL alltoall rows (costmodel/ep.py); None: the [efficiency] collective figures
    alltoall: tuple | None = None
    alltoall_source: str = ""


def list_hardware() -> list[str]:
    """Names (file stems) of the shipped hardware profiles, sorted."""
    return sorted(p.stem for p in hardware_dir().glob("*.toml"))


def load_hardware(name_or_path: str) -> HardwareProfile:
    """Load a shipped profile by name (``"h100-sxm"``) or any profile by path to a ``.toml`` file."""
    return _load_file(_resolve(str(name_or_path)))


def with_efficiency(profile: HardwareProfile, **overrides) -> HardwareProfile:
    """A copy of ``profile`` with some ``Efficiency`` fields replaced (SI names, e.g. ``gemm_max``).

    Used by calibration to try candidate efficiencies without writing files; the same bounds
    as for files apply.
    """
    known = {f.name for f in dataclasses.fields(Efficiency)}
    for key in overrides:
        if key not in known:
            raise ConfigError(f"with_efficiency: unknown efficiency field '{key}'; "
                              f"known: {', '.join(sorted(known))}")
    efficiency = dataclasses.replace(profile.efficiency, **overrides)
    _check_efficiency_values(efficiency, f"with_efficiency({profile.name})")
    return dataclasses.replace(profile, efficiency=efficiency)


# -- loading ----------------------------------------------------------------------------------

def _resolve(name_or_path: str) -> Path:
    if name_or_path.endswith(".toml") or "/" in name_or_path or "\\" in name_or_path:
        path = Path(name_or_path)
        if not path.is_file():
            raise ConfigError(f"{name_or_path}: hardware profile file not found")
        return path.resolve()
    path = hardware_dir() / f"{name_or_path}.toml"
    if not path.is_file():
        raise ConfigError(f"unknown hardware '{name_or_path}'; {did_you_mean(name_or_path, list_hardware())}"
                          f"available: {', '.join(list_hardware())}")
    return path.resolve()


@functools.lru_cache(maxsize=None)
def _load_file(path: Path) -> HardwareProfile:
    top = Table(read_toml(path), path)
    has_eff = top.has("efficiency")
    top.expect_keys(_TOP_KEYS, optional=("efficiency", "alltoall"))

    name = top.str("name", nonempty=True)
    if name != path.stem:
        raise top.error("name", f"must equal the file stem '{path.stem}', got {name!r}")
    description = top.str("description", nonempty=True)
    vendor = top.str("vendor", nonempty=True)
    efficiency_from = top.str("efficiency_from")

    compute = top.table("compute")
    compute.expect_keys(list(_COMPUTE_KEYS.values()) + ["sm_count"], ("cuda_capability",))
    sm_count = compute.int("sm_count", ge=1)
    cuda_capability = compute.str("cuda_capability", nonempty=True) if compute.has("cuda_capability") else ""
    peak = {}
    for precision, key in _COMPUTE_KEYS.items():
        # bf16 is the precision every cost model path needs; the others may be 0 = unsupported.
        value = compute.float(key, gt=0.0) if precision == "bf16" else compute.float(key, ge=0.0)
        peak[precision] = value * 1e12

    memory = top.table("memory")
    memory.expect_keys(_MEMORY_KEYS)
    hbm_bytes = memory.float("hbm_capacity_GB", gt=0.0) * 1e9
    hbm_bw = memory.float("hbm_bandwidth_GBps", gt=0.0) * 1e9
    device_bytes = memory.float("device_memory_GiB", gt=0.0) * 2.0 ** 30

    net = top.table("interconnect")
    net.expect_keys(_INTERCONNECT_KEYS)
    scaleup_name = net.str("scaleup_name", nonempty=True)
    scaleup_total = net.float("scaleup_bandwidth_GBps", ge=0.0)
    scaleup_domain = net.int("scaleup_domain_gpus", ge=1)
    if scaleup_total == 0.0 and scaleup_domain != 1:
        raise net.error("scaleup_domain_gpus",
                        f"must be 1 when scaleup_bandwidth_GBps = 0 (no scale-up fabric), got {scaleup_domain}")
    if scaleup_total > 0.0 and scaleup_domain < 2:
        raise net.error("scaleup_domain_gpus",
                        f"must be >= 2 when scaleup_bandwidth_GBps > 0, got {scaleup_domain}")
    gpus_per_node = net.int("gpus_per_node", ge=1)
    pcie_gen = net.int("pcie_gen", ge=1)
    pcie_lanes = net.int("pcie_lanes", ge=1)
    pcie_bw = net.float("pcie_bandwidth_GBps", gt=0.0) * 1e9
    scaleout_name = net.str("scaleout_name", nonempty=True)
    scaleout_bw = net.float("scaleout_bandwidth_Gbps", gt=0.0) * 1e9 / 8.0

    power = top.table("power")
    power.expect_keys(_POWER_KEYS)
    tdp_w = power.float("tdp_W", ge=0.0)

    price = top.table("price")
    price.expect_keys(_PRICE_KEYS)
    usd_per_hour = price.float("usd_per_gpu_hour", ge=0.0)
    price_source = price.str("source", nonempty=True)

    if has_eff:
        efficiency = _read_efficiency(top.table("efficiency"))
        if efficiency_from:     # the engine fits' source alone: a name that resolves
            _source_file(top, path, efficiency_from)
    elif efficiency_from == "":
        raise top.error("efficiency", "is missing; add an [efficiency] table or set efficiency_from "
                                      "to a calibrated profile such as 'h100-sxm'")
    else:
        efficiency = _borrow_efficiency(top, path, efficiency_from)

    alltoall, alltoall_source = None, ""
    if top.has("alltoall"):
        a2a = top.table("alltoall")
        a2a.expect_keys(_ALLTOALL_KEYS)
        alltoall = (a2a.float("bw_fraction", gt=0.0, le=1.0), a2a.float("latency_us", ge=0.0) * 1e-6)
        alltoall_source = a2a.str("fit_source", nonempty=True)

    return HardwareProfile(
        alltoall=alltoall, alltoall_source=alltoall_source,
        name=name, description=description, vendor=vendor, path=path, peak_flops=peak, sm_count=sm_count,
        hbm_bytes=hbm_bytes, hbm_bw=hbm_bw, device_bytes=device_bytes, scaleup_name=scaleup_name,
        scaleup_bw=scaleup_total * 1e9 / 2.0, scaleup_domain=scaleup_domain,
        gpus_per_node=gpus_per_node, pcie_gen=pcie_gen, pcie_lanes=pcie_lanes, pcie_bw=pcie_bw,
        scaleout_name=scaleout_name, scaleout_bw=scaleout_bw, tdp_w=tdp_w,
        usd_per_hour=usd_per_hour, price_source=price_source, efficiency=efficiency, cuda_capability=cuda_capability,
        efficiency_from=efficiency_from, own_efficiency=has_eff,
    )


def _read_efficiency(table: Table) -> Efficiency:
    for old, new in _RENAMED_EFFICIENCY_KEYS.items():
        if table.has(old):
            raise table.error(old, f"is no longer a key; it was replaced by {new}")
    table.expect_keys(["fit_source"] + [key for key, _, _ in _EFFICIENCY_KEYS])
    values: dict[str, object] = {"fit_source": table.str("fit_source", nonempty=True)}
    for key, field, kind in _EFFICIENCY_KEYS:
        if kind == "fraction":
            value = table.fraction(key)
        elif kind == "positive":
            value = table.float(key, gt=0.0)
        else:
            value = table.float(key, ge=0.0)
        values[field] = value * _UNIT.get(key.rsplit("_", 1)[-1], 1.0)
    return Efficiency(**values)


def source_file(name: str, beside: Path | None = None) -> Path | None:
    """The file of profile ``name``: a sibling of ``beside`` first, else the shipped one (None: neither)."""
    candidates = ([Path(beside).parent / f"{name}.toml"] if beside is not None else []) + [hardware_dir() / f"{name}.toml"]
    return next((p for p in candidates if p.is_file()), None)


def borrow_chain(hw: HardwareProfile) -> list[str]:
    """The profiles ``hw`` borrows from, nearest first: its ``efficiency_from``, that profile's, ...
    (each file found as `source_file` finds it; stops at "" or a name already seen)."""
    chain, name, beside = [], hw.efficiency_from, hw.path
    while name and name != hw.name and name not in chain:
        chain.append(name)
        path = source_file(name, beside)
        if path is None:
            break
        name, beside = str(read_toml(path).get("efficiency_from", "")), path
    return chain


def _source_file(top: Table, path: Path, source_name: str) -> Path:
    """The file ``efficiency_from`` names (a sibling first, else the shipped one), checked."""
    if not source_name or any(c in source_name for c in "/\\:") or source_name.startswith("."):
        raise top.error("efficiency_from", f"must name a profile (a file stem such as 'h100-sxm'), not a path; "
                                           f"got {source_name!r}")
    source = source_file(source_name, path)
    if source is None:
        raise top.error("efficiency_from", f"names unknown profile {source_name!r}; "
                                           f"available: {', '.join(list_hardware())}")
    if source.resolve() == path:
        raise top.error("efficiency_from", f"must not name the profile itself ({source_name!r}); use \"\"")
    return source


def _borrow_efficiency(top: Table, path: Path, source_name: str) -> Efficiency:
    """The [efficiency] of profile ``source_name``: a sibling file first, else the shipped one."""
    source = _source_file(top, path, source_name)
    # Peek before loading so that a cycle (a -> b -> a) is reported rather than recursed into.
    data = read_toml(source)
    if "efficiency" not in data:
        onward = data.get("efficiency_from", "")
        raise top.error("efficiency_from", f"names {source_name!r}, which itself borrows from "
                                           f"{onward!r}; point at a profile with its own "
                                           f"[efficiency], e.g. {onward!r}")
    return _load_file(source.resolve()).efficiency


def _check_efficiency_values(eff: Efficiency, where: str) -> None:
    for field in dataclasses.fields(Efficiency):
        value = getattr(eff, field.name)
        if field.name == "fit_source":
            if not isinstance(value, str):
                raise ConfigError(f"{where}: field 'fit_source' must be a string, got {value!r}")
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: field '{field.name}' must be a number, got {value!r}")
        if field.name in _FRACTION_FIELDS and not 0.0 < value <= 1.0:
            raise ConfigError(f"{where}: field '{field.name}' must be in (0, 1], got {value!r}")
        if field.name in _POSITIVE_FIELDS and not value > 0.0:
            raise ConfigError(f"{where}: field '{field.name}' must be > 0, got {value!r}")
        if not value >= 0.0:
            raise ConfigError(f"{where}: field '{field.name}' must be >= 0, got {value!r}")


__all__ = ["Efficiency", "HardwareProfile", "PRECISIONS", "list_hardware", "load_hardware",
           "with_efficiency"]
