"""Layout search (fastest layout that fits) and scaling tables over GPU counts.

The search enumerates TP over divisors of the head count up to the scale-up domain, PP over
divisors of the layer count, CP in {1, 2, 4, 8} (for sequences of 8K or more), EP over divisors of
the expert count inside DP x CP, virtual stages {1, 2, 4}, ZeRO {1, 3} and micro-batches
{1, 2, 4, 8}, each with ``--recompute auto`` (the least recomputation that fits, the fastest of the
recompute choices for that layout); SP is on whenever TP > 1. Layouts that do not divide or do not
fit are skipped. Deterministic: ties break on the enumeration order.
"""
from __future__ import annotations

import dataclasses

import pandas as pd

from servesim.errors import InfeasibleError, ServesimError

from .layout import TrainLayout
from .step import TrainResult, train_step


def _divisors(n: int, cap: int) -> list[int]:
    return [d for d in range(1, min(n, cap) + 1) if n % d == 0]


def candidate_layouts(model, hw, gpus: int, base: TrainLayout):
    tps = [t for t in _divisors(model.num_attention_heads, max(1, hw.scaleup_domain)) if gpus % t == 0]
    pps = _divisors(model.num_layers, gpus)
    cps = [c for c in (1, 2, 4, 8) if c == 1 or base.seq_len >= 8192]
    for tp in tps:
        for pp in pps:
            for cp in cps:
                if gpus % (tp * pp * cp):
                    continue
                dp = gpus // (tp * pp * cp)
                eps = [1] if model.moe is None else [e for e in _divisors(model.moe.num_experts, dp * cp)
                                                      if (dp * cp) % e == 0]
                for ep in eps:
                    for vp in ((1, 2, 4) if pp > 1 else (1,)):
                        for mb in (1, 2, 4, 8):
                            for zero in (1, 3):
                                yield dataclasses.replace(base, tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, vp=vp,
                                                          sp=tp > 1, tp_overlap=base.tp_overlap and tp > 1,
                                                          micro_batch=mb, zero=zero, recompute="auto",
                                                          recompute_layers=None, recompute_modules=(),
                                                          first_stage_layers=None, last_stage_layers=None,
                                                          account_for_embedding=False, account_for_loss=False)


# A searched layout must fit in this fraction of device memory. A choice, not a measurement: the
# memory model counts the tensors and a runtime reserve (memory.RUNTIME_RESERVE_BYTES) but not the
# allocator's peaks between them, and a layout at 99% of memory is one allocation away from running
# out; a layout given by hand is checked against the whole device.
SEARCH_MEMORY_FRACTION = 0.90


def search_layouts(model, hw, gpus: int, base: TrainLayout, top: int = 10,
                   memory_fraction: float = SEARCH_MEMORY_FRACTION) -> list[TrainResult]:
    """Feasible layouts for ``gpus`` GPUs, fastest first (at most ``top``), each within
    ``memory_fraction`` of the device's memory (``--recompute auto`` recomputing more to get there)."""
    from .framework import training_hardware
    results = []
    limit = memory_fraction * training_hardware(hw).device_bytes
    for lay in candidate_layouts(model, hw, gpus, base):
        try:
            results.append(train_step(model, hw, lay, memory_limit=limit))
        except ServesimError:
            continue
    if not results:
        raise InfeasibleError(f"--search: no layout of {model.name} fits in {100 * memory_fraction:.0f}% of the "
                              f"memory of {gpus} x {hw.name} with --global-batch {base.global_batch} --seq-len "
                              f"{base.seq_len}; use more --gpus or a global batch divisible by more DP degrees")
    results.sort(key=lambda r: r.step_time_s)
    return results[:top]


def results_frame(results: list[TrainResult]) -> pd.DataFrame:
    rows = []
    for r in results:
        lay = r.layout
        rows.append({"gpus": r.gpus, "tp": lay.tp, "pp": lay.pp, "dp": lay.dp, "cp": lay.cp, "ep": lay.ep,
                     "vp": lay.vp, "sp": lay.sp, "zero": lay.zero,
                     "recompute": lay.recompute + (f" {lay.recompute_layers}/chunk" if lay.recompute_layers else "")
                     + (f" ({','.join(lay.modules)})" if lay.modules else ""),
                     "micro_batch": lay.micro_batch, "global_batch": lay.global_batch,
                     "step_time_s": r.step_time_s, "tokens_per_s": r.tokens_per_s,
                     "tokens_per_s_per_gpu": r.tokens_per_s_per_gpu, "mfu": r.mfu,
                     "memory_gib": r.memory_bytes["total"] / 2**30, "bottleneck": r.bottleneck})
    return pd.DataFrame(rows)


def scaling_table(model, hw, gpu_counts: list[int], base: TrainLayout, mode: str = "weak",
                  search: bool = False) -> pd.DataFrame:
    """Tokens/s per GPU and scaling efficiency over GPU counts.

    weak: the global batch grows with the GPU count (base.global_batch at the first count);
    strong: the global batch stays fixed. Efficiency = tokens/s/GPU relative to the first count.
    Without ``search`` TP, PP, CP and EP stay as given and DP = GPUs / (TP x PP x CP).
    """
    if mode not in ("weak", "strong"):
        raise ServesimError(f"--scaling: unknown value {mode!r}; use weak or strong")
    results = []
    g0 = gpu_counts[0]
    for g in gpu_counts:
        gb = base.global_batch * g // g0 if mode == "weak" else base.global_batch
        if mode == "weak" and (base.global_batch * g) % g0:
            raise InfeasibleError(f"--gpus {g}: weak scaling needs GPU counts that are multiples of "
                                  f"the first ({g0})")
        b = dataclasses.replace(base, global_batch=gb)
        if search:
            results.append(search_layouts(model, hw, g, b, top=1)[0])
        else:
            denom = b.tp * b.pp * b.cp
            if g % denom:
                raise InfeasibleError(f"--gpus {g} is not a multiple of tp*pp*cp = {denom}; use a multiple of {denom}")
            results.append(train_step(model, hw, dataclasses.replace(b, dp=g // denom)))
    df = results_frame(results)
    df["scaling_efficiency"] = df["tokens_per_s_per_gpu"] / df["tokens_per_s_per_gpu"].iloc[0]
    return df
