"""Roofline primitives with size-dependent efficiency (the eager-PyTorch GEMM curve of the hardware
profiles, used by the training model and the per-operator calibration; serving engines price GEMMs
with servesim/costmodel/kernels.py). Plain scalar functions, jitted.

Roofline model: Williams, Waterman & Patterson, "Roofline", CACM 2009: a kernel takes
max(FLOPs / achieved FLOP/s, bytes / achieved bandwidth). Achieved FLOP/s for a GEMM grows
with its M dimension (tokens) because small M cannot fill the SMs (tile quantisation, see
NVIDIA "Matrix Multiplication Background User's Guide"); we model it as a saturating curve
eff(M) = gemm_max * M / (M + gemm_half_tokens), plus a fixed per-kernel latency.
"""
from __future__ import annotations

from numba import njit
from ..jit import JIT


@njit(**JIT)
def gemm_efficiency_nb(m, gemm_max, half_tokens):
    return gemm_max * m / (m + half_tokens)


@njit(**JIT)
def gemm_time_nb(m, k, n, w_bytes, a_bytes, peak, hbm_bw, gemm_max, half_tokens, hbm_fraction, latency):
    """One (m x k) @ (k x n) GEMM: 2mkn FLOPs; weights k*n*w_bytes + activations (m*k + m*n)*a_bytes."""
    if m <= 0.0:
        return 0.0
    flops = 2.0 * m * k * n
    nbytes = k * n * w_bytes + (m * k + m * n) * a_bytes
    t_c = flops / (peak * gemm_efficiency_nb(m, gemm_max, half_tokens))
    t_m = nbytes / (hbm_bw * hbm_fraction)
    return max(t_c, t_m) + latency


@njit(**JIT)
def roofline_time_nb(flops, nbytes, peak, compute_fraction, hbm_bw, hbm_fraction, latency):
    """A kernel with given FLOPs and bytes at fixed achieved fractions of peak and bandwidth."""
    if flops <= 0.0 and nbytes <= 0.0:
        return 0.0
    return max(flops / (peak * compute_fraction), nbytes / (hbm_bw * hbm_fraction)) + latency
