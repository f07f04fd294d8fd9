"""A training layout (parallel degrees, sharding, recomputation, batch) and its feasibility rules.

Rank order, innermost first: TP, CP, DP (EP is a contiguous sub-group of DP), PP outermost, as in
Megatron-Core's default ``tp-cp-ep-dp-pp`` order. A group's span (the distance between its first
and last rank, times the inner degrees) decides whether it stays inside one scale-up domain.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from servesim.errors import ConfigError, InfeasibleError

RECOMPUTE = ("none", "selective", "full")
TRAIN_DTYPES = ("bf16", "fp8")


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
    zero: int = 1
    recompute: str = "selective"
    dtype: str = "bf16"
    seq_len: int = 4096
    micro_batch: int = 1
    global_batch: int = 256

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    @property
    def num_microbatches(self) -> int:
        """m = global_batch / (micro_batch x dp), micro-batches per DP rank per step."""
        return self.global_batch // (self.micro_batch * self.dp)

    def as_dict(self) -> dict:
        return asdict(self)


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


def derive_dp(gpus: int, tp: int, pp: int, cp: int) -> int:
    """DP = GPUs / (TP x PP x CP); an error naming --gpus when it does not divide."""
    denom = tp * pp * cp
    if gpus < 1 or gpus % denom:
        raise InfeasibleError(f"--gpus {gpus} is not a multiple of tp*pp*cp = {denom}; "
                              f"use a multiple of {denom}")
    return gpus // denom


def check_layout(model, hw, lay: TrainLayout, gpus: int | None = None) -> None:
    """Raise ConfigError / InfeasibleError (one line, naming the option) for a layout that cannot run."""
    for name in ("tp", "pp", "dp", "cp", "ep", "vp", "seq_len", "micro_batch", "global_batch"):
        v = getattr(lay, name)
        if not isinstance(v, int) or v < 1:
            raise ConfigError(f"--{name.replace('_', '-')}: must be an integer >= 1, got {v!r}")
    if lay.zero not in (0, 1, 2, 3):
        raise ConfigError(f"--zero: must be 0, 1, 2 or 3, got {lay.zero!r}")
    if lay.recompute not in RECOMPUTE:
        raise ConfigError(f"--recompute: unknown value {lay.recompute!r}; use one of {', '.join(RECOMPUTE)}")
    if lay.dtype not in TRAIN_DTYPES:
        raise ConfigError(f"--dtype: unknown value {lay.dtype!r} for training; use one of {', '.join(TRAIN_DTYPES)}")
    if lay.dtype == "fp8" and hw.peak_flops.get("fp8", 0.0) <= 0:
        raise InfeasibleError(f"--dtype fp8: {hw.name} has no fp8 tensor cores; use --dtype bf16")
    check_model_split(model, lay)
    if gpus is not None and gpus != lay.gpus:
        raise InfeasibleError(f"--gpus {gpus} != tp*pp*dp*cp = {lay.tp}*{lay.pp}*{lay.dp}*{lay.cp} = "
                              f"{lay.gpus}; use --gpus {lay.gpus} or change the degrees")
    if lay.ep > 1 and (lay.dp * lay.cp) % lay.ep:
        raise InfeasibleError(f"--ep {lay.ep} must divide dp*cp = {lay.dp * lay.cp} (experts are "
                              f"sharded inside the data-parallel group); use one of {_divisors(lay.dp * lay.cp)}")
    if lay.seq_len % (2 * lay.cp) and lay.cp > 1:
        raise InfeasibleError(f"--cp {lay.cp}: seq_len {lay.seq_len} must be divisible by 2*cp = "
                              f"{2 * lay.cp} (load-balanced causal ring attention)")
    if lay.global_batch % (lay.micro_batch * lay.dp):
        raise InfeasibleError(f"--global-batch {lay.global_batch} is not a multiple of micro_batch*dp = "
                              f"{lay.micro_batch}*{lay.dp}; use a multiple of {lay.micro_batch * lay.dp}")
    if lay.vp > 1 and lay.num_microbatches % lay.pp:
        raise InfeasibleError(f"--vp {lay.vp}: the interleaved schedule needs micro-batches per DP rank "
                              f"({lay.num_microbatches}) to be a multiple of --pp {lay.pp}; change "
                              f"--global-batch or use --vp 1")


def check_model_split(model, lay: TrainLayout) -> None:
    """The rules that involve only the model and the TP / PP / VP / EP degrees."""
    heads = model.num_attention_heads
    if heads % lay.tp:
        raise InfeasibleError(f"--tp {lay.tp} does not divide num_attention_heads = {heads} of "
                              f"{model.name}; use one of {_divisors(heads)}")
    if lay.tp_overlap and not lay.sp and lay.tp > 1:
        raise ConfigError("--tp-overlap needs --sp (the overlapped collectives are SP's all-gather and "
                          "reduce-scatter); add --sp")
    if lay.vp > 1 and lay.pp == 1:
        raise ConfigError(f"--vp {lay.vp} needs --pp > 1 (interleaving splits pipeline stages); use --vp 1")
    if model.num_layers % (lay.pp * lay.vp):
        what = f"--pp {lay.pp}" if lay.vp == 1 else f"--pp x --vp = {lay.pp}x{lay.vp}"
        raise InfeasibleError(f"{what} does not divide num_layers = {model.num_layers} "
                              f"of {model.name}; use a divisor of {model.num_layers} ({_divisors(model.num_layers)})")
    if lay.ep > 1:
        if model.moe is None:
            raise InfeasibleError(f"--ep {lay.ep}: {model.name} has no experts; use --ep 1")
        if model.moe.num_experts % lay.ep:
            raise InfeasibleError(f"--ep {lay.ep} does not divide num_experts = {model.moe.num_experts}; "
                                  f"use one of {_divisors(model.moe.num_experts)}")
