"""Fitted training parameters (the only ones the training model adds to the hardware profiles).

``compute_scale`` multiplies the profile's achieved GEMM and attention fractions (``gemm_max``,
``attn_prefill_max``, fitted on inference operators) for training kernels, which also run the
backward pass, fused optimiser-side kernels and framework overhead that inference kernels do not.
``overlap`` is the fraction of data-parallel / ZeRO traffic that can hide behind compute when the
overlap rule says it may (NCCL kernels share SMs and HBM with compute, so perfect hiding is rare).
Fitted by ``experiments/validate_training.py`` (scipy least_squares on the Megatron rows of
``servesim/calibrate/data/training_published_calibration.csv``); see
``experiments/results/training_validation.md``.
"""
from __future__ import annotations

from typing import NamedTuple


class TrainingFit(NamedTuple):
    compute_scale: float = 1.0
    overlap: float = 1.0


# Fitted by `python experiments/validate_training.py` (values printed there; update by hand and
# re-run to regenerate the results file). overlap = 0: the fit finds Megatron's measured runs as
# slow as if no DP traffic hid behind compute; see the results file for why this is confounded.
FITTED = TrainingFit(compute_scale=0.9477, overlap=0.0)
