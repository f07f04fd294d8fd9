"""Replica pools: `--pool HW:tpN[:ppM]:xR[:role][:dtype=D][:engine=E]` -> `PoolSpec`, checked; the
semantics of pools are in servesim/engine/POOLS.md.

A deployment is one or more pools, each with its own hardware, engine profile, weight dtype, TP, PP,
replica count and role (mixed: prefill and decode on the same replicas; prefill / decode: the
disaggregated roles, the KV cache moving from a prefill replica to a decode replica). Without
``--pool`` the single-pool options (``--hardware --tp --pp --replicas``) make one mixed pool.

Lowering each pool into the kernel's per-pool arrays is `engine.lower`'s (`lower_deployment`).
"""
from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

import numpy as np

from .engine import codes as C
from .errors import ConfigError

FORM = "HW:tpN[:ppM][:epN][:dpN]:xR[:mixed|prefill|decode][:dtype=D][:engine=E], e.g. h100-sxm:tp2:x4, " \
       "a100-sxm-80gb:tp4:x2:decode or b200:tp1:ep8:dp8:x2:decode"
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
    ep: int = 1                  # expert parallelism of a MoE model (costmodel/ep.py)
    attn_dp: int = 1             # data-parallel attention ranks per replica
    dtype: str | None = None     # None: the deployment's --dtype
    engine: str | None = None    # None: the deployment's --engine

    @property
    def gpus(self) -> int:
        return self.tp * self.attn_dp * self.pp * self.replicas

    @property
    def text(self) -> str:
        """The canonical spec, as `parse_pool` reads it."""
        parts = [self.hardware, f"tp{self.tp}"] + ([f"pp{self.pp}"] if self.pp != 1 else [])
        parts += ([f"ep{self.ep}"] if self.ep != 1 else []) + ([f"dp{self.attn_dp}"] if self.attn_dp != 1 else [])
        parts += [f"x{self.replicas}"]
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
        m = re.fullmatch(r"(tp|pp|ep|dp|x)(-?\d+)", p)
        if m:
            key = {"tp": "tp", "pp": "pp", "ep": "ep", "dp": "attn_dp", "x": "replicas"}[m.group(1)]
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
    disaggregated ones (not modelled). Any number of pools: the kernel takes their cost tables as the rows
    of one array (`engine.kernel.cost_inputs`)."""
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
    return [PoolSpec(cfg.hardware, cfg.tp, cfg.pp, cfg.replicas, ep=cfg.ep, attn_dp=cfg.attn_dp)]


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


def check_pool_capacity(lowered: list, prompt, output, block_size: int,
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
