"""A training layout (parallel degrees, sharding, recomputation, batch, framework) and its
feasibility rules.

Rank order, innermost first: TP, CP, DP (EP is a contiguous sub-group of DP), PP outermost, as in
Megatron-Core's default ``tp-cp-ep-dp-pp`` order. A group's span (the distance between its first
and last rank, times the inner degrees) decides whether it stays inside one scale-up domain.

Fields left at ``None`` take the framework profile's value (``resolve_layout``): ``zero``
(``default_zero``), ``dp_overlap`` (``overlap_grad_reduce`` / ``overlap_param_gather``),
``attention`` (``attention.kernel``), ``fp8_recipe`` (per architecture), ``fsdp_prefetch``,
``fsdp_param_bytes``.
"""
from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass

from servesim.errors import ConfigError, InfeasibleError

RECOMPUTE = ("none", "selective", "full", "auto")
# Megatron-Core --recompute-modules (selective recompute), what each recomputes in the backward:
RECOMPUTE_MODULES = ("core_attn", "mlp", "moe", "moe_act", "shared_experts", "layernorm", "mla_up_proj")
TRAIN_DTYPES = ("bf16", "fp8")
CP_COMM = ("ring", "a2a")


@dataclass(frozen=True)
class TrainLayout:
    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    ep: int = 1
    vp: int = 1
    sp: bool = False
    tp_overlap: bool = False
    zero: int | None = 1
    recompute: str = "selective"
    dtype: str = "bf16"
    seq_len: int = 4096
    micro_batch: int = 1
    global_batch: int = 256
    # uneven pipelines (servesim/training/pipeline.py)
    first_stage_layers: int | None = None
    last_stage_layers: int | None = None
    account_for_embedding: bool = False
    account_for_loss: bool = False
    pipeline_layout: str | None = None        # Megatron-Core layout string, or "auto" (pipeline_layout.py)
    # recomputation and offloading beyond --recompute
    recompute_layers: int | None = None       # full recompute of N layers per model chunk (recompute = full)
    recompute_modules: tuple[str, ...] = ()   # selective recompute modules (default: core_attn)
    offload_layers: int = 0                   # saved activations of N layers per chunk go to host memory
    cp_comm: str = "ring"
    framework: str = "megatron"
    fp8_recipe: str | None = None
    attention: str | None = None
    dropout: bool = False                      # attention and hidden dropout (GPT-3 / Megatron-LM 2021 recipes)
    dp_overlap: bool | None = None
    fsdp_prefetch: int | None = None
    fsdp_param_bytes: int | None = None

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    @property
    def num_microbatches(self) -> int:
        """m = global_batch / (micro_batch x dp), micro-batches per DP rank per step."""
        return self.global_batch // (self.micro_batch * self.dp)

    @property
    def modules(self) -> tuple[str, ...]:
        """Selective-recompute modules in effect (empty unless recompute = selective)."""
        if self.recompute != "selective":
            return ()
        return self.recompute_modules or ("core_attn",)

    def as_dict(self) -> dict:
        d = asdict(self)
        d["recompute_modules"] = list(self.recompute_modules)
        return d


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


def derive_dp(gpus: int, tp: int, pp: int, cp: int) -> int:
    """DP = GPUs / (TP x PP x CP); an error naming --gpus when it does not divide."""
    denom = tp * pp * cp
    if gpus < 1 or gpus % denom:
        raise InfeasibleError(f"--gpus {gpus} is not a multiple of tp*pp*cp = {denom}; "
                              f"use a multiple of {denom}")
    return gpus // denom


def resolve_layout(lay: TrainLayout, hw, fw=None) -> TrainLayout:
    """Fill the fields left at None from the framework profile (and the architecture)."""
    from .framework import default_fp8_recipe, load_framework
    fw = fw or load_framework(lay.framework)
    upd = {}
    if lay.zero is None:
        upd["zero"] = fw.default_zero
    if lay.attention is None:
        upd["attention"] = fw.attention
    if lay.dp_overlap is None:
        upd["dp_overlap"] = fw.overlap_grad_reduce
    if lay.fsdp_prefetch is None:
        upd["fsdp_prefetch"] = fw.fsdp_prefetch_layers
    if lay.fsdp_param_bytes is None:
        upd["fsdp_param_bytes"] = fw.fsdp_param_bytes
    if lay.fp8_recipe is None and lay.dtype == "fp8":
        upd["fp8_recipe"] = default_fp8_recipe(fw, hw)
    return dataclasses.replace(lay, **upd) if upd else lay


def check_layout(model, hw, lay: TrainLayout, gpus: int | None = None) -> None:
    """Raise ConfigError / InfeasibleError (one line, naming the option) for a layout that cannot run."""
    from .framework import FP8_RECIPES, architecture_of, load_framework
    for name in ("tp", "pp", "dp", "cp", "ep", "vp", "seq_len", "micro_batch", "global_batch"):
        v = getattr(lay, name)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ConfigError(f"--{name.replace('_', '-')}: must be an integer >= 1, got {v!r}")
    if lay.zero not in (0, 1, 2, 3):
        raise ConfigError(f"--zero: must be 0, 1, 2 or 3, got {lay.zero!r}")
    if lay.recompute not in RECOMPUTE:
        raise ConfigError(f"--recompute: unknown value {lay.recompute!r}; use one of {', '.join(RECOMPUTE)}")
    bad = [m for m in lay.recompute_modules if m not in RECOMPUTE_MODULES]
    if bad:
        raise ConfigError(f"--recompute-modules: unknown module {bad[0]!r}; use any of {', '.join(RECOMPUTE_MODULES)}")
    if lay.recompute_modules and lay.recompute != "selective":
        raise ConfigError(f"--recompute-modules needs --recompute selective (got {lay.recompute})")
    if lay.recompute_layers is not None:
        if not isinstance(lay.recompute_layers, int) or lay.recompute_layers < 1:
            raise ConfigError(f"--recompute-layers: must be an integer >= 1, got {lay.recompute_layers!r}")
        if lay.recompute != "full":
            raise ConfigError(f"--recompute-layers {lay.recompute_layers} needs --recompute full (Megatron's "
                              f"--recompute-granularity full --recompute-method block); got --recompute {lay.recompute}")
    if not isinstance(lay.offload_layers, int) or lay.offload_layers < 0:
        raise ConfigError(f"--offload-activations: must be an integer >= 0 or 'all', got {lay.offload_layers!r}")
    if lay.cp_comm not in CP_COMM:
        raise ConfigError(f"--cp-comm: unknown value {lay.cp_comm!r}; use one of {', '.join(CP_COMM)}")
    if lay.dtype not in TRAIN_DTYPES:
        raise ConfigError(f"--dtype: unknown value {lay.dtype!r} for training; use one of {', '.join(TRAIN_DTYPES)}")
    fw = load_framework(lay.framework)
    if lay.dtype == "fp8":
        if hw.peak_flops.get("fp8", 0.0) <= 0:
            raise InfeasibleError(f"--dtype fp8: {hw.name} has no fp8 tensor cores; use --dtype bf16")
        if not fw.fp8:
            raise InfeasibleError(f"--dtype fp8: the {fw.name} framework profile has no fp8 training path; use "
                                  f"--dtype bf16 or --framework megatron")
        if lay.fp8_recipe is not None and lay.fp8_recipe not in FP8_RECIPES:
            raise ConfigError(f"--fp8-recipe: unknown value {lay.fp8_recipe!r}; use one of {', '.join(FP8_RECIPES)}")
        if lay.fp8_recipe == "mxfp8" and not architecture_of(hw).mxfp8:
            raise InfeasibleError(f"--fp8-recipe mxfp8: {hw.name} has no hardware block scaling (MXFP8 is a "
                                  f"Blackwell feature); use delayed, current or block")
    elif lay.fp8_recipe is not None:
        raise ConfigError(f"--fp8-recipe {lay.fp8_recipe} needs --dtype fp8")
    if lay.attention is not None and lay.attention not in ("flash", "fa2", "unfused"):
        raise ConfigError(f"--attention: unknown value {lay.attention!r}; use flash, fa2 or unfused")
    if lay.fsdp_prefetch is not None and (not isinstance(lay.fsdp_prefetch, int) or lay.fsdp_prefetch < 0):
        raise ConfigError(f"--fsdp-prefetch: must be an integer >= 0, got {lay.fsdp_prefetch!r}")
    if lay.fsdp_param_bytes is not None and lay.fsdp_param_bytes not in (2, 4):
        raise ConfigError(f"--fsdp-param-bytes: must be 2 (bf16) or 4 (fp32), got {lay.fsdp_param_bytes!r}")
    check_model_split(model, lay)
    if gpus is not None and gpus != lay.gpus:
        raise InfeasibleError(f"--gpus {gpus} != tp*pp*dp*cp = {lay.tp}*{lay.pp}*{lay.dp}*{lay.cp} = "
                              f"{lay.gpus}; use --gpus {lay.gpus} or change the degrees")
    if lay.ep > 1 and (lay.dp * lay.cp) % lay.ep:
        raise InfeasibleError(f"--ep {lay.ep} must divide dp*cp = {lay.dp * lay.cp} (experts are "
                              f"sharded inside the data-parallel group); use one of {_divisors(lay.dp * lay.cp)}")
    if lay.cp > 1:
        if lay.attention == "unfused":
            raise InfeasibleError(f"--cp {lay.cp} needs a flash-style attention kernel (ring and all-to-all "
                                  f"context parallelism run blockwise attention); use --attention flash")
        if lay.cp_comm == "ring" and lay.seq_len % (2 * lay.cp):
            raise InfeasibleError(f"--cp {lay.cp} does not divide the sequence: seq_len {lay.seq_len} must be "
                                  f"divisible by 2*cp = {2 * lay.cp} (load-balanced causal ring attention: two "
                                  f"chunks per rank); use a --seq-len that is a multiple of {2 * lay.cp}")
        if lay.cp_comm == "a2a":
            if lay.seq_len % lay.cp:
                raise InfeasibleError(f"--cp {lay.cp} does not divide the sequence: seq_len {lay.seq_len} "
                                      f"is not a multiple of {lay.cp}")
            heads = model.num_attention_heads // lay.tp
            if heads % lay.cp:
                raise InfeasibleError(f"--cp-comm a2a: the {heads} attention heads per TP rank must divide over "
                                      f"--cp {lay.cp} (all-to-all context parallelism splits heads); use --cp-comm "
                                      f"ring or a --cp dividing {heads}")
    if lay.global_batch % (lay.micro_batch * lay.dp):
        raise InfeasibleError(f"--global-batch {lay.global_batch} is not a multiple of micro_batch*dp = "
                              f"{lay.micro_batch}*{lay.dp}; use a multiple of {lay.micro_batch * lay.dp}")
    if lay.vp > 1 and lay.num_microbatches % lay.pp:
        raise InfeasibleError(f"--vp {lay.vp}: the interleaved schedule needs micro-batches per DP rank "
                              f"({lay.num_microbatches}) to be a multiple of --pp {lay.pp}; change "
                              f"--global-batch or use --vp 1")


def check_model_split(model, lay: TrainLayout) -> None:
    """The rules that involve only the model and the TP / PP / VP / EP degrees."""
    from .pipeline import pipeline_chunks
    heads = model.num_attention_heads
    if heads % lay.tp:
        raise InfeasibleError(f"--tp {lay.tp} does not divide num_attention_heads = {heads} of "
                              f"{model.name}; use one of {_divisors(heads)}")
    if lay.tp_overlap and not lay.sp and lay.tp > 1:
        raise ConfigError("--tp-overlap needs --sp (the overlapped collectives are SP's all-gather and "
                          "reduce-scatter); add --sp")
    if lay.vp > 1 and lay.pp == 1:
        raise ConfigError(f"--vp {lay.vp} needs --pp > 1 (interleaving splits pipeline stages); use --vp 1")
    if lay.pipeline_layout is not None and lay.pp == 1:
        raise ConfigError(f"--pipeline-layout {lay.pipeline_layout} needs --pp > 1 (it places layers on pipeline "
                          f"stages); drop it")
    if (lay.account_for_embedding or lay.account_for_loss) and lay.pp == 1:
        raise ConfigError("--account-for-embedding / --account-for-loss need --pp > 1 (they balance pipeline "
                          "stages); drop them")
    chunks = pipeline_chunks(model, lay)
    if lay.pipeline_layout is None and any(not c.layers and not (c.embedding or c.loss) for rank in chunks
                                           for c in rank):
        raise InfeasibleError("a pipeline chunk holds no layer; use fewer --pp x --vp")
    if lay.recompute_layers is not None:
        biggest = max(len(c.layers) for rank in chunks for c in rank)
        if lay.recompute_layers > biggest:
            raise InfeasibleError(f"--recompute-layers {lay.recompute_layers} exceeds the {biggest} layers of the "
                                  f"largest model chunk; use at most {biggest}")
    if lay.ep > 1:
        if model.moe is None:
            raise InfeasibleError(f"--ep {lay.ep}: {model.name} has no experts; use --ep 1")
        if model.moe.num_experts % lay.ep:
            raise InfeasibleError(f"--ep {lay.ep} does not divide num_experts = {model.moe.num_experts}; "
                                  f"use one of {_divisors(model.moe.num_experts)}")
