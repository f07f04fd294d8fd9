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
``attn_scale`` is the attention efficiency of a framework whose kernel has no measurement
(llm-foundry's Triton flash attention with ALiBi, ``composer``), relative to the measured
FlashAttention-class curve of ``data/architectures.toml``.
Fitted by ``experiments/validate_training.py`` (scipy least_squares with a soft-L1 loss on every
priced row of ``servesim/calibrate/data/training_published_calibration.csv``, ``overlap`` profiled
on a grid; leave-one-framework-out and leave-one-GPU-generation-out refits give the held-out
errors); see ``experiments/results/training_validation.md``.
"""
from __future__ import annotations

from typing import NamedTuple


class TrainingFit(NamedTuple):
    compute_scale: float = 1.0
    overlap: float = 1.0
    # (architecture, compute_scale) pairs that override compute_scale on that architecture
    # (servesim/training/data/architectures.toml); an architecture not listed uses compute_scale.
    arch_scale: tuple = ()
    # (framework, factor) pairs: the attention efficiency of a framework profile whose kernel has no
    # measurement (llm-foundry's Triton flash attention with ALiBi under ``composer``), relative to
    # the measured FlashAttention-class curve; a framework not listed uses 1
    attn_scale: tuple = ()

    def attn_for(self, framework: str) -> float:
        for name, value in self.attn_scale:
            if name == framework:
                return value
        return 1.0

    def scale_for(self, arch: str) -> float:
        for name, value in self.arch_scale:
            if name == arch:
                return value
        return self.compute_scale


# Fitted by `python experiments/validate_training.py` on every priced row of the published set
# (all frameworks; values printed there; update by hand and re-run to regenerate the results file),
# 2026-12-06: overlap 0.8 is the best of the profiled grid 0.5-1.0, whose costs differ by < 12%
# (weakly determined); held-out figures leave one framework or one GPU generation out.
FITTED = TrainingFit(compute_scale=1.0782, overlap=0.8, arch_scale=(("ampere", 1.0782), ("hopper", 0.9081)),
                     attn_scale=(("composer", 0.5399),))
