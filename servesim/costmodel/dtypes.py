"""Precisions: bytes per element and which tensor-core peak a dtype computes at.

`--dtype` names the weight format. W8A8 formats (fp8, int8) compute at their own peak; fp4
(NVFP4/MXFP4) computes at the fp4 peak and only where the chip has fp4 tensor cores (Blackwell);
int4 is weight-only: the GEMMs read 4-bit weights and dequantise them to bf16 in registers, as
vLLM's Marlin/AWQ/GPTQ kernels and TensorRT-LLM's fpA_intB do (Frantar et al., "MARLIN", 2024),
priced by ``kernels.weight_only_gemm_time_nb``.
"""
from __future__ import annotations

from ..errors import ConfigError

WEIGHT_DTYPES = ("bf16", "fp16", "fp8", "int8", "int4", "fp4")
KV_DTYPES = ("auto", "bf16", "fp16", "fp8", "int8")

BYTES = {"fp32": 4.0, "tf32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5, "fp4": 0.5}


# Fixed time a weight-only GEMM adds to the engine's bf16 GEMM (the dequantising kernel's setup:
# scales, the unpacking pipeline), 7.88 us: fitted on AIConfigurator's A100 TensorRT-LLM int4 rows,
# less the TensorRT plugin's timing floor (experiments/fit_weight_only.py,
# experiments/results/weight_only_validation.md).
WEIGHT_ONLY_EXTRA_LATENCY_US = 7.88


def compute_dtype(dtype: str, peak_flops: dict[str, float]) -> str:
    """The dtype whose dense peak prices the GEMMs for weights in `dtype` (check_dtype first)."""
    if dtype in ("bf16", "fp16"):
        return dtype if peak_flops.get(dtype, 0.0) > 0 else "bf16"
    if dtype in ("fp8", "int8", "fp4"):
        return dtype
    return "bf16"  # int4 weight-only: dequantise to bf16


def weight_only(dtype: str) -> bool:
    """Weights quantised, activations in 16 bits: the GEMMs dequantise (int4)."""
    return dtype == "int4"


def activation_bytes(dtype: str) -> float:
    """Bytes per activation element: 1 for W8A8 / fp4 compute, else 2."""
    return 1.0 if dtype in ("fp8", "int8") else 2.0


def kv_dtype_resolved(kv_dtype: str, dtype: str) -> str:
    """``auto``: the model's 16-bit activation dtype, whatever the weights (vLLM's kv_cache_dtype
    "auto"; an fp8 KV cache is a separate choice, --kv-dtype fp8, as in vLLM and TensorRT-LLM)."""
    if kv_dtype not in KV_DTYPES:
        raise ConfigError(f"--kv-dtype: unknown value {kv_dtype!r}; use one of {', '.join(KV_DTYPES)}")
    if kv_dtype != "auto":
        return kv_dtype
    return "fp16" if dtype == "fp16" else "bf16"


def check_dtype(dtype: str, hw_name: str, peak_flops: dict[str, float]) -> None:
    if dtype not in WEIGHT_DTYPES:
        raise ConfigError(f"--dtype: unknown value {dtype!r}; use one of {', '.join(WEIGHT_DTYPES)}")
    cd = compute_dtype(dtype, peak_flops)
    if peak_flops.get(cd, 0.0) <= 0:
        have = supported_dtypes(peak_flops)
        raise ConfigError(f"--dtype {dtype}: {hw_name} has no {cd} tensor cores (its profile's peak is 0); "
                          f"use one of {', '.join(have)}")


def supported_dtypes(peak_flops: dict[str, float]) -> list[str]:
    """The weight dtypes a chip runs: those with a tensor-core peak, and int4 where it has bf16."""
    have = [d for d in ("bf16", "fp16", "fp8", "int8", "fp4") if peak_flops.get(d, 0.0) > 0]
    if "bf16" in have:
        have.insert(have.index("fp4") if "fp4" in have else len(have), "int4")
    return have
