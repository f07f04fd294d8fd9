"""Fitted training parameters (the only ones the training model adds to the hardware profiles).

``compute_scale`` multiplies the profile's achieved GEMM fraction (``gemm_max``, fitted on
inference-sized eager operators, which run in bursts) for training GEMMs, which run for minutes at
the clocks the power cap allows and on training shapes; one value per GPU architecture
(``arch_scale``), since the sustained clock under the power cap is the architecture's. A profile
that borrows its efficiencies (``efficiency_from``) uses the scale of the architecture it borrows
from. Attention kernels are not scaled: their efficiencies are literature values for training
kernels (FlashAttention-2/3 papers). ``overlap`` is the fraction of the compute behind which
data-parallel / ZeRO traffic can hide when the overlap rule says it may; the collective's SMs slow
the compute it hides behind (servesim/training/step.py, ``COMM_SMS``).
Fitted by ``experiments/validate_training.py`` (scipy least_squares on the Megatron-LM /
Megatron-Core rows of ``servesim/calibrate/data/training_published_calibration.csv``, ``overlap``
profiled on a grid); see ``experiments/results/training_validation.md``.
"""
from __future__ import annotations

from typing import NamedTuple


class TrainingFit(NamedTuple):
    compute_scale: float = 1.0
    overlap: float = 1.0
    # (architecture, compute_scale) pairs that override compute_scale on that architecture
    # (servesim/training/data/architectures.toml); an architecture not listed uses compute_scale.
    arch_scale: tuple = ()

    def scale_for(self, arch: str) -> float:
        for name, value in self.arch_scale:
            if name == arch:
                return value
        return self.compute_scale


# Fitted by `python experiments/validate_training.py` (values printed there; update by hand and
# re-run to regenerate the results file). overlap = 1.0 sits at its bound: the Megatron rows are
# best matched when DP traffic hides behind all of the compute (less the SMs it occupies); the
# profile over overlap is shallow (see the results file), so it is weakly determined.
FITTED = TrainingFit(compute_scale=1.1027, overlap=1.0, arch_scale=(("ampere", 1.1027), ("hopper", 0.8581)))
