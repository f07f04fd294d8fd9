"""Fitting cost-model efficiencies to measurements, and the measurements shipped for it.

``operators`` reads Vidur per-operator timings (``data/vidur/``, MIT, Agrawal et al. MLSys 2024),
predicts them with the cost model's own formulas and fits the GEMM and collective efficiencies;
``experiments/fit_costmodel.py`` runs the fit and writes the report and the profile values.
"""
from __future__ import annotations

from pathlib import Path


def data_dir() -> Path:
    """Measurement files shipped with the package (``servesim/calibrate/data``)."""
    return Path(__file__).resolve().parent / "data"


def vidur_dir() -> Path:
    """The copied Vidur profiling tree: ``profiling/compute/<gpu>/...`` and ``profiling/network/...``."""
    return data_dir() / "vidur"


__all__ = ["data_dir", "vidur_dir"]
