"""Replica pools: `--pool HW:tpN[:ppM]:xR[:role][:dtype=D][:engine=E]` -> `PoolSpec` -> the kernel's
per-pool arrays (`engine.state.Pools`, semantics in servesim/engine/POOLS.md).

A deployment is one or more pools, each with its own hardware, engine profile, weight dtype, TP, PP,
replica count and role (mixed: prefill and decode on the same replicas; prefill / decode: the
disaggregated roles, the KV cache moving from a prefill replica to a decode replica). Without
``--pool`` the single-pool options (``--hardware --tp --pp --replicas``) make one mixed pool.

Lowering (`lower_pools`) prices each pool with its own replica (`engine.lower.replica_of` on its hardware,
engine, dtype, TP, PP; the deployment's gpu_memory_utilization, max_num_seqs, token budget and block
size) and fills, per pool:

* ``num_blocks``: the KV blocks of one replica as `engine.run.engine_config` computes them (or
  ``--num-gpu-blocks``, for every pool), ``watermark_blocks`` from the pool's engine profile;
* ``cpu_blocks``: ``floor(--cpu-kv-gib * 2**30 / (block_size * kv_bytes_total))``, the host-memory
  tier of one replica (0 without ``--cpu-kv-gib``);
* ``kv_bytes_per_token``: per GPU (the memory plan's figure, its stage's layers);
  ``kv_bytes_total``: that x TP x PP (every GPU of a replica holds KV: its TP shard of its stage's
  layers; KV heads replicated when TP exceeds them are counted on every GPU, as they are stored;
  with PP not dividing the layers the fullest stage is counted on every stage);
  ``kv_gpus`` = TP x PP;
* ``weight`` (the router's capacity weight per replica): TP x PP x the dense peak FLOP/s of the
  pool's hardware at its GEMM dtype, in PFLOP/s. A peak rather than a lowered iteration: it needs no
  reference batch and ranks pools the way their datasheets do; only ratios between pools matter;
* ``link_bw`` / ``link_alpha`` between two pools: the scale-up fabric (NVLink; the point-to-point
  figures of `costmodel.collectives.p2p_link`, the rate above its size step, KV transfers being tens
  of MiB) when both pools run on the same hardware and all their GPUs fit one scale-up domain
  (``hw.scaleup_domain``), else the NIC (``hw.scaleout_bw x scaleout_bw_fraction``,
  ``scaleout_latency_s``; the slower side's). ``--kv-link nvlink|nic`` forces one.
"""
from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass, replace

import numpy as np

from .engine import codes as C
from .errors import ConfigError

FORM = "HW:tpN[:ppM]:xR[:mixed|prefill|decode][:dtype=D][:engine=E], e.g. h100-sxm:tp2:x4 or " \
       "a100-sxm-80gb:tp4:x2:decode"
KV_LINKS = ("auto", "nvlink", "nic")

# Block sizes the engine takes with prefix caching on. vLLM: the docs list `--block-size` choices
# {1, 8, 16, 32, 64, 128} and say "on CUDA devices, only block sizes up to 32 are supported" (vLLM docs,
# "Engine Arguments", --block-size); we accept 8, 16 and 32 (1 is left out, conservatively: no
# validated run of ours uses one-token blocks). SGLang pages any size (`--page-size`, any integer >= 1,
# docs.sglang.ai "Server Arguments"). Other engines (TensorRT-LLM, a user's profile): only the profile's
# own block size, the one it is documented to run with.
PREFIX_BLOCK_SIZES = {"vllm": (8, 16, 32), "sglang": None}


@dataclass(frozen=True)
class PoolSpec:
    hardware: str
    tp: int = 1
    pp: int = 1
    replicas: int = 1
    role: str = "mixed"
    dtype: str | None = None     # None: the deployment's --dtype
    engine: str | None = None    # None: the deployment's --engine

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.replicas

    @property
    def text(self) -> str:
        """The canonical spec, as `parse_pool` reads it."""
        parts = [self.hardware, f"tp{self.tp}"] + ([f"pp{self.pp}"] if self.pp != 1 else []) + [f"x{self.replicas}"]
        parts += [self.role] if self.role != "mixed" else []
        parts += [f"dtype={self.dtype}"] if self.dtype else []
        parts += [f"engine={self.engine}"] if self.engine else []
        return ":".join(parts)


def _bad(text: str, why: str, option: str) -> ConfigError:
    return ConfigError(f"{option} {text!r}: {why}; write {FORM}")


def parse_pool(text, option: str = "--pool") -> PoolSpec:
    """'h100-sxm:tp2:x4' -> PoolSpec; anything else is a one-line ConfigError naming ``option``, the
    text and the expected form."""
    from .options import check_choice, check_known_name, options
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(f"{option} {text!r}: not a pool spec; write {FORM}")
    parts = [p.strip() for p in text.strip().split(":")]
    hw, rest = parts[0], parts[1:]
    if not hw:
        raise _bad(text, "no hardware before the first ':'", option)
    try:
        check_known_name("hardware", hw, option)
    except ConfigError:
        known = options()["hardware"].names()
        close = difflib.get_close_matches(hw, known, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise _bad(text, f"unknown hardware {hw!r}; {hint}use one of {', '.join(known)} or a .toml path",
                   option) from None
    got: dict[str, object] = {}
    for p in rest:
        m = re.fullmatch(r"(tp|pp|x)(-?\d+)", p)
        if m:
            key = {"tp": "tp", "pp": "pp", "x": "replicas"}[m.group(1)]
            value = int(m.group(2))
            if value < 1:
                raise _bad(text, f"{m.group(1)}{value}: must be >= 1", option)
        elif p in C.ROLES:
            key, value = "role", p
        elif p.startswith(("dtype=", "engine=")):
            key, _, value = p.partition("=")
            try:
                if key == "dtype":
                    check_choice(value, "dtype", options()["dtype"].choice_list())
                else:
                    check_known_name("engine", value, "engine")
            except ConfigError as e:
                raise _bad(text, str(e), option) from None
        else:
            raise _bad(text, f"cannot read {p!r} (roles: {', '.join(C.ROLES)})", option)
        if key in got:
            raise _bad(text, f"{key} given twice", option)
        got[key] = value
    for need, show in (("tp", "tpN"), ("replicas", "xR")):
        if need not in got:
            raise _bad(text, f"no {show}", option)
    return PoolSpec(hardware=hw, **got)


def pool_texts(value, option: str = "--pool") -> tuple[str, ...]:
    """The ``pool`` option normalised: a tuple of checked spec texts. Takes one text (several pools
    joined by '+', as in `--grid pool=a+b,c`) or a sequence of texts."""
    if value is None:
        return ()
    if isinstance(value, str):
        value = [v for v in value.split("+")]
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f"{option} must be pool specs ({FORM}), got {value!r}")
    out = []
    for v in value:
        if isinstance(v, PoolSpec):
            v = v.text
        parse_pool(v, option)
        out.append(v.strip())
    return tuple(out)


def check_deployment(specs: list[PoolSpec], option: str = "--pool") -> None:
    """The roles must make a deployment: prefill needs decode and back; mixed pools do not combine with
    disaggregated ones (not modelled); at most `engine.kernel.MAX_POOLS` pools."""
    from .engine.kernel import MAX_POOLS
    if len(specs) > MAX_POOLS:
        raise ConfigError(f"{option}: {len(specs)} pools given; the engine takes at most {MAX_POOLS}: merge pools of "
                          "the same hardware, TP, PP and role into one with more replicas")
    roles = {s.role for s in specs}
    pd = roles & {"prefill", "decode"}
    if pd and "mixed" in roles:
        mixed = next(s for s in specs if s.role == "mixed")
        raise ConfigError(f"{option} {mixed.text}: mixed pools together with prefill/decode pools are not modelled; "
                          "give either mixed pools only, or prefill and decode pools")
    if pd == {"prefill"}:
        raise ConfigError(f"{option}: prefill pools without a decode pool; add one, e.g. --pool "
                          f"{specs[0].hardware}:tp{specs[0].tp}:x1:decode")
    if pd == {"decode"}:
        raise ConfigError(f"{option}: decode pools without a prefill pool: nothing would take the arrivals; add one, "
                          f"e.g. --pool {specs[0].hardware}:tp{specs[0].tp}:x1:prefill")


def specs_of(cfg) -> list[PoolSpec]:
    """The pools of a (checked) SimConfig: its --pool specs, or the single-pool shorthand."""
    if cfg.pool:
        return [parse_pool(t) for t in cfg.pool]
    return [PoolSpec(cfg.hardware, cfg.tp, cfg.pp, cfg.replicas)]


def check_block_size(cfg, engine) -> None:
    """With prefix caching on, a block size the engine does not take is an error (`PREFIX_BLOCK_SIZES`)."""
    if not cfg.prefix_caching:
        return
    allowed = PREFIX_BLOCK_SIZES.get(engine.name, (engine.scheduler.block_size,))
    if allowed is None or cfg.block_size in allowed or cfg.block_size == engine.scheduler.block_size:
        return
    why = "the vLLM docs allow at most 32 on CUDA" if engine.name == "vllm" else \
        "the profile's own block size is the one it is documented with"
    raise ConfigError(f"--block-size {cfg.block_size} is not supported by {engine.name} with prefix caching "
                      f"({why}); use one of {', '.join(map(str, allowed))} or --no-prefix-caching")


@dataclass(frozen=True)
class LoweredPool:
    spec: PoolSpec
    cost: object                 # ReplicaCost
    num_blocks: int
    watermark_blocks: int
    cpu_blocks: int
    usd_per_gpu_hour: float
    peak_flops: float            # per GPU, at its GEMM dtype


def _link(a: LoweredPool, b: LoweredPool, same: bool, kv_link: str) -> tuple[float, float]:
    """(achieved B/s, alpha s) of a KV transfer from a GPU of pool a to one of pool b."""
    from .costmodel.collectives import p2p_link
    ha, hb = a.cost.hw, b.cost.hw
    gpus = a.spec.gpus + (0 if same else b.spec.gpus)
    if kv_link == "auto":
        kv_link = "nvlink" if (ha.name == hb.name and ha.scaleup_bw > 0 and gpus <= ha.scaleup_domain) else "nic"
    if kv_link == "nvlink":
        for h in (ha, hb):
            if h.scaleup_bw <= 0:
                raise ConfigError(f"--kv-link nvlink: {h.name} has no scale-up fabric; use --kv-link nic or auto")
        la = p2p_link(ha, min(2, ha.scaleup_domain))
        lb = p2p_link(hb, min(2, hb.scaleup_domain))
        return min(la[3], lb[3]), max(la[2], lb[2])
    bw = min(h.scaleout_bw * h.efficiency.scaleout_bw_fraction for h in (ha, hb))
    return bw, max(ha.efficiency.scaleout_latency_s, hb.efficiency.scaleout_latency_s)


def lower_pools(cfg, model, specs: list[PoolSpec], opts, *, hw_profile=None, engine_profile=None):
    """Resolved SimConfig + pool specs + the deployment's EngineOptions -> (list[LoweredPool],
    state.Pools). ``hw_profile`` / ``engine_profile``: in-memory profiles for pools on ``cfg.hardware``
    / ``cfg.engine`` (calibration)."""
    from .engine.lower import replica_of
    from .config import load_hardware
    from .config.engine import load_engine
    from .costmodel.dtypes import compute_dtype
    from .engine.run import engine_config
    from .engine.state import Pools
    lowered = []
    for s in specs:
        hw = hw_profile if hw_profile is not None and s.hardware == cfg.hardware else load_hardware(s.hardware)
        eng_name = s.engine or cfg.engine
        engine = engine_profile if engine_profile is not None and eng_name == cfg.engine else load_engine(eng_name)
        dtype = s.dtype if s.dtype not in (None, "auto") else (cfg.dtype if s.dtype is None else model.checkpoint_dtype)
        pcfg = replace(cfg, hardware=s.hardware, tp=s.tp, pp=s.pp, replicas=s.replicas, dtype=dtype, engine=eng_name)
        rc = replica_of(pcfg, model, hw, engine)
        try:
            ecfg = engine_config(replace(opts, replicas=s.replicas, watermark=rc.engine.scheduler.watermark), rc)
        except ConfigError as e:
            raise ConfigError(f"--pool {s.text}: {e}") from None
        total = float(rc.memory.kv_bytes_per_token) * s.tp * s.pp
        cpu_gib = getattr(cfg, "cpu_kv_gib", None) or 0.0
        cpu = int(math.floor(cpu_gib * 2**30 / (ecfg.block_size * total))) if cpu_gib > 0 else 0
        price = cfg.price if cfg.price is not None else hw.usd_per_hour
        lowered.append(LoweredPool(s, rc, ecfg.num_blocks, ecfg.watermark_blocks, cpu, price,
                                   float(hw.peak_flops[compute_dtype(dtype, hw.peak_flops)])))
    P = len(lowered)
    kv_link = getattr(cfg, "kv_link", None) or "auto"
    bw, alpha = np.zeros((P, P)), np.zeros((P, P))
    for i, a in enumerate(lowered):
        for j, b in enumerate(lowered):
            bw[i, j], alpha[i, j] = _link(a, b, i == j, kv_link)
    count = np.array([lp.spec.replicas for lp in lowered], np.int64)
    pools = Pools(
        role=np.array([C.ROLES[lp.spec.role] for lp in lowered], np.int64),
        first=np.concatenate(([0], np.cumsum(count)[:-1])).astype(np.int64),
        count=count,
        pp=np.array([lp.spec.pp for lp in lowered], np.int64),
        num_blocks=np.array([lp.num_blocks for lp in lowered], np.int64),
        watermark_blocks=np.array([lp.watermark_blocks for lp in lowered], np.int64),
        cpu_blocks=np.array([lp.cpu_blocks for lp in lowered], np.int64),
        kv_bytes_per_token=np.array([lp.cost.memory.kv_bytes_per_token for lp in lowered], np.float64),
        kv_bytes_total=np.array([lp.cost.memory.kv_bytes_per_token * lp.spec.tp * lp.spec.pp for lp in lowered],
                                np.float64),
        kv_gpus=np.array([lp.spec.tp * lp.spec.pp for lp in lowered], np.int64),
        n_layers=np.array([model.num_layers for _ in lowered], np.int64),
        weight=np.array([lp.spec.tp * lp.spec.pp * lp.peak_flops / 1e15 for lp in lowered], np.float64),
        link_bw=bw, link_alpha=alpha,
    )
    return lowered, pools


def check_pool_capacity(lowered: list[LoweredPool], prompt, output, block_size: int,
                        given_blocks: bool = False) -> None:
    """A disaggregated pool whose KV per replica cannot hold one request is an error naming it: a decode
    pool the longest prompt + output, a prefill pool the longest prompt. A mixed pool that cannot hold
    even the shortest request would reject everything sent to it: an error too; with
    ``--num-gpu-blocks`` (``given_blocks``) a mixed pool must hold the longest, as a single pool must.
    InfeasibleError for blocks computed from memory (a sweep marks the point infeasible), ConfigError
    for blocks the user gave."""
    from .errors import InfeasibleError
    prompt = np.asarray(prompt, np.int64)
    output = np.asarray(output, np.int64)
    if prompt.size == 0:
        return
    for lp in lowered:
        s = lp.spec
        holds = lp.num_blocks - lp.watermark_blocks
        if s.role == "decode":
            need, what = int(np.max(prompt + output)), "the longest request (prompt + output)"
        elif s.role == "prefill":
            need, what = int(np.max(prompt)), "the longest prompt"
        elif given_blocks:
            need, what = int(np.max(prompt + output)), "the longest request (prompt + output)"
        else:
            need, what = int(np.min(prompt + output)), "even the shortest request (prompt + output)"
        blocks = -(-need // block_size)
        if blocks > holds:
            raise (ConfigError if given_blocks else InfeasibleError)(
                f"--pool {s.text}: one replica holds {holds} KV blocks of {block_size} ({holds * block_size} tokens), "
                f"fewer than {what}, {need} tokens = {blocks} blocks; use a larger tp, more memory per GPU or "
                "shorter requests" + ("" if not given_blocks else f" (--num-gpu-blocks {lp.num_blocks})"))
