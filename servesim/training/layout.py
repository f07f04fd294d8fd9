"""A training layout (parallel degrees, sharding, recomputation, batch, framework) and its
feasibility rules.

Rank order, innermost first: TP, CP, DP (EP is a contiguous sub-group of DP), PP outermost, as in
Megatron-Core's default ``tp-cp-ep-dp-pp`` order. A group's span (the distance between its first
and last rank, times the inner degrees) decides whether it stays inside one scale-up domain.

Fields left at ``None`` take the framework profile's value (``resolve_layout``, which also says
which ones it filled): ``zero`` (``default_zero``), ``dp_overlap`` (``overlap_grad_reduce`` /
``overlap_param_gather``), ``attention`` (``attention.kernel``), ``fp8_recipe`` (per architecture),
``fsdp_prefetch``, ``fsdp_param_bytes``, and the recipe defaults of its ``[defaults]`` table:
``sp`` (sequence parallelism whenever TP > 1), ``tp_overlap`` (with SP), ``recompute`` and what
``selective`` means (Megatron's ``--recompute-modules``, torchtitan's ``selective_ac_option`` --
per-op or every N-th layer -- or a MaxText ``remat_policy``), ``reshard_after_forward`` (ZeRO-3 /
FSDP: always, never, or torchtitan's default: not under PP) and ``fp8_all_gather`` (ZeRO-3 gathers
in fp8). An option given on the command line wins; an option of another framework's vocabulary
(a MaxText remat policy on a PyTorch framework, torchtitan's selective_ac_option on Megatron) is
a one-line error.
"""
from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass

from servesim.errors import ConfigError, InfeasibleError

RECOMPUTE = ("none", "selective", "full", "auto")
# Megatron-Core --recompute-modules (selective recompute), what each recomputes in the backward:
RECOMPUTE_MODULES = ("core_attn", "mlp", "moe", "moe_act", "shared_experts", "layernorm", "mla_up_proj")
# finer modules the MaxText remat policies recompute (framework.REMAT_POLICIES): the attention output
# (context), the MLP's first matmul and activation, its activation only, the QKV / output projections
POLICY_MODULES = ("context", "mlp_fc1", "mlp_act", "qkv_proj", "out_proj")
TRAIN_DTYPES = ("bf16", "fp8")
CP_COMM = ("ring", "a2a", "allgather")


@dataclass(frozen=True)
class TrainLayout:
    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    ep: int = 1
    vp: int = 1
    sp: bool | None = None                    # None: the framework's (sequence parallelism with TP)
    tp_overlap: bool | None = None
    zero: int | None = 1
    recompute: str | None = None              # None: the framework's
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
    selective_ac: str | None = None            # torchtitan selective_ac_option: "op" or "N" (every N-th layer)
    remat_policy: str | None = None            # MaxText remat policy (framework.REMAT_POLICIES)
    reshard_after_forward: str | None = None   # ZeRO-3 / FSDP: always | never | default (torchtitan's)
    fp8_all_gather: bool | None = None         # ZeRO-3 / FSDP gathers fp8 weights (torchao, --fp8-param-gather)
    ep_overlap: bool = False                   # EP all-to-alls beside another micro-batch's compute (Megatron)
    dp_shard: int | None = None                # data-parallel ranks sharing the model states; None: all (HSDP below)

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    @property
    def num_microbatches(self) -> int:
        """m = global_batch / (micro_batch x dp), micro-batches per DP rank per step."""
        return self.global_batch // (self.micro_batch * self.dp)

    @property
    def modules(self) -> tuple[str, ...]:
        """Selective-recompute modules in effect (empty unless recompute = selective; torchtitan's
        selective modes are ``op_sac`` and ``layer_sac``, not modules)."""
        if self.recompute != "selective" or self.selective_ac is not None:
            return ()
        return self.recompute_modules or ("core_attn",)

    def shard_groups(self) -> tuple[int, int, int, int]:
        """(shard, replicas) of the dense and of the expert data-parallel groups. ZeRO / FSDP shard
        the model states over the ``dp_shard`` innermost data-parallel ranks (DP x CP for dense
        parameters, DP x CP / EP for experts) and replicate them over the rest: hybrid sharding
        (torchtitan's data_parallel_shard / replicate degrees, MaxText's ici_fsdp x dcn_data
        axes, Megatron's --num-distributed-optimizer-instances)."""
        n_dense = self.dp * self.cp
        n_exp = max(1, n_dense // self.ep)
        if self.dp_shard is None or self.dp_shard >= n_dense:
            return n_dense, 1, n_exp, 1
        rep = n_dense // self.dp_shard
        if n_exp % rep == 0:
            return self.dp_shard, rep, n_exp // rep, rep
        return self.dp_shard, rep, n_exp, 1

    @property
    def op_sac(self) -> bool:
        """torchtitan's per-op selective checkpointing (selective_ac_option = "op")."""
        return self.recompute == "selective" and self.selective_ac == "op"

    @property
    def layer_sac(self) -> int:
        """torchtitan's per-layer selective checkpointing: every N-th layer fully recomputed (0: off)."""
        if self.recompute == "selective" and self.selective_ac is not None and str(self.selective_ac).isdigit():
            return int(self.selective_ac)
        return 0

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
    return resolve_with_defaults(lay, hw, fw)[0]


def check_framework_options(lay: TrainLayout, fw) -> None:
    """Options of another framework's vocabulary, or that need another setting, before defaults fill in."""
    from .framework import REMAT_POLICIES, RESHARD, check_selective_ac
    if lay.remat_policy is not None:
        if fw.runtime != "jax" or fw.ac_style != "maxtext":
            raise ConfigError(f"--remat-policy {lay.remat_policy} is a MaxText (JAX) option; the {fw.name} framework "
                              f"profile runs {fw.runtime}: use --recompute none|selective|full|auto, or "
                              f"--framework maxtext")
        if lay.remat_policy not in REMAT_POLICIES:
            raise ConfigError(f"--remat-policy: unknown policy {lay.remat_policy!r}; use one of "
                              f"{', '.join(REMAT_POLICIES)}")
        if lay.recompute is not None:
            raise ConfigError(f"--remat-policy {lay.remat_policy} and --recompute {lay.recompute} both set "
                              f"the recomputation; give one")
    if lay.selective_ac is not None:
        if fw.ac_style != "torchtitan":
            raise ConfigError(f"--selective-ac {lay.selective_ac} is torchtitan's selective_ac_option; the {fw.name} "
                              f"framework profile's selective recomputation is "
                              + ("--remat-policy" if fw.ac_style == "maxtext" else "--recompute-modules")
                              + "; use that, or --framework torchtitan")
        if not check_selective_ac(lay.selective_ac):
            raise ConfigError(f"--selective-ac: expected op or a layer interval >= 1, got {lay.selective_ac!r}")
        if lay.recompute not in (None, "selective"):
            raise ConfigError(f"--selective-ac {lay.selective_ac} needs --recompute selective (got {lay.recompute})")
    if lay.recompute_modules and fw.ac_style != "megatron":
        other = "--selective-ac op|N" if fw.ac_style == "torchtitan" else "--remat-policy"
        raise ConfigError(f"--recompute-modules is Megatron-Core's; the {fw.name} framework profile's selective "
                          f"recomputation is {other}")
    if lay.reshard_after_forward is not None and lay.reshard_after_forward not in RESHARD:
        raise ConfigError(f"--reshard-after-forward: unknown value {lay.reshard_after_forward!r}; use "
                          f"{', '.join(RESHARD)}")


def resolve_with_defaults(lay: TrainLayout, hw, fw=None) -> tuple[TrainLayout, dict]:
    """(the layout with every field left at None filled from the framework profile, {option: value}
    of the values that came from the profile, in option form)."""
    from .framework import REMAT_POLICIES, default_fp8_recipe, load_framework
    fw = fw or load_framework(lay.framework)
    check_framework_options(lay, fw)
    upd, taken = {}, {}

    def fill(field, value, option=None, shown=None):
        if getattr(lay, field) is None:
            upd[field] = value
            taken[option or "--" + field.replace("_", "-")] = value if shown is None else shown

    fill("zero", fw.default_zero)
    fill("attention", fw.attention)
    fill("dp_overlap", fw.overlap_grad_reduce)
    zero = upd.get("zero", lay.zero)
    if zero is not None and zero >= 3:
        fill("fsdp_prefetch", fw.fsdp_prefetch_layers)
        fill("fsdp_param_bytes", fw.fsdp_param_bytes)
        ra = fw.reshard_after_forward
        if ra == "default":   # torchtitan: reshard after forward unless pipeline parallelism is on
            ra_v, shown = ("never" if lay.pp > 1 else "always"), f"default ({'never' if lay.pp > 1 else 'always'})"
        else:
            ra_v, shown = ra, None
        fill("reshard_after_forward", ra_v, shown=shown)
        if lay.dtype == "fp8":
            fill("fp8_all_gather", fw.fp8_all_gather)
    else:
        upd.setdefault("fsdp_prefetch", lay.fsdp_prefetch if lay.fsdp_prefetch is not None else fw.fsdp_prefetch_layers)
        upd.setdefault("fsdp_param_bytes",
                       lay.fsdp_param_bytes if lay.fsdp_param_bytes is not None else fw.fsdp_param_bytes)
    if lay.reshard_after_forward == "default":
        upd["reshard_after_forward"] = "never" if lay.pp > 1 else "always"
    if lay.dtype == "fp8":
        fill("fp8_recipe", default_fp8_recipe(fw, hw))
    if lay.tp > 1:
        fill("sp", fw.sequence_parallel, shown="on" if fw.sequence_parallel else "off")
    else:
        upd.setdefault("sp", bool(lay.sp))
    sp = upd.get("sp", lay.sp)
    if lay.tp > 1 and sp:
        fill("tp_overlap", fw.tp_comm_overlap, shown="on" if fw.tp_comm_overlap else "off")
    else:
        upd.setdefault("tp_overlap", bool(lay.tp_overlap))
    if fw.ac_style == "maxtext" and lay.recompute is None:
        policy = lay.remat_policy or fw.remat_policy
        if lay.remat_policy is None:
            taken["--remat-policy"] = policy
        rc, mods, offload = REMAT_POLICIES[policy]
        upd.update(recompute=rc, recompute_modules=mods, remat_policy=policy)
        if offload:
            upd["offload_layers"] = 1 << 30
    else:
        fill("recompute", fw.recompute)
    rc = upd.get("recompute", lay.recompute)
    if fw.ac_style == "torchtitan" and rc == "selective":
        fill("selective_ac", fw.selective_ac_option, option="--selective-ac")
    if lay.fp8_all_gather is None and "fp8_all_gather" not in upd:
        upd["fp8_all_gather"] = False
    return (dataclasses.replace(lay, **upd) if upd else lay), taken


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
    known = RECOMPUTE_MODULES + (POLICY_MODULES if lay.remat_policy else ())
    bad = [m for m in lay.recompute_modules if m not in known]
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
    if lay.reshard_after_forward is not None and (lay.zero or 0) < 3:
        raise ConfigError(f"--reshard-after-forward {lay.reshard_after_forward} is an FSDP / ZeRO-3 setting; "
                          f"use --zero 3 or drop it (zero={lay.zero})")
    if lay.fp8_all_gather and ((lay.zero or 0) < 3 or lay.dtype != "fp8"):
        raise ConfigError(f"--fp8-all-gather gathers fp8 weights under FSDP / ZeRO-3; it needs --zero 3 and "
                          f"--dtype fp8 (got zero={lay.zero}, dtype={lay.dtype})")
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
    if lay.dp_shard is not None:
        n = lay.dp * lay.cp
        if not isinstance(lay.dp_shard, int) or lay.dp_shard < 1 or n % lay.dp_shard:
            raise InfeasibleError(f"--dp-shard {lay.dp_shard!r} must divide dp*cp = {n} (the shard group is "
                                  f"that many data-parallel ranks, the rest replicas); use one of {_divisors(n)}")
        if (lay.zero or 0) < 1:
            raise ConfigError(f"--dp-shard {lay.dp_shard} shards model states: it needs --zero 1, 2 or 3")
    if lay.ep_overlap and lay.ep == 1:
        raise ConfigError("--ep-overlap overlaps the expert-parallel all-to-alls; it needs --ep > 1")
    if lay.ep > 1 and (lay.dp * lay.cp) % lay.ep:
        raise InfeasibleError(f"--ep {lay.ep} must divide dp*cp = {lay.dp * lay.cp} (experts are "
                              f"sharded inside the data-parallel group); use one of {_divisors(lay.dp * lay.cp)}")
    if lay.cp > 1:
        if lay.attention == "unfused":
            raise InfeasibleError(f"--cp {lay.cp} needs a flash-style attention kernel (ring and all-to-all "
                                  f"context parallelism run blockwise attention); use --attention flash")
        if lay.cp_comm in ("ring", "allgather") and lay.seq_len % (2 * lay.cp):
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
