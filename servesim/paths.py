"""Where the shipped data files live, in a source checkout or an installed wheel."""
from __future__ import annotations

from pathlib import Path

_REPO = Path(__file__).resolve().parent.parent


_INSTALLED = Path(__file__).resolve().parent / "data"


def _data_dir(installed_subdir: str, repo_subdir: str) -> Path:
    # A source checkout (tests, editable installs) reads the top-level folders directly;
    # an installed wheel carries them under servesim/data/ (see pyproject's package-dir).
    local = _REPO / repo_subdir
    if (_REPO / "pyproject.toml").is_file() and local.is_dir():
        return local
    return _INSTALLED / installed_subdir


def hardware_dir() -> Path:
    return _data_dir("hardware_profiles", "hardware_profiles")


def engines_dir() -> Path:
    return _data_dir("engines", "engines")


def workloads_dir() -> Path:
    return _data_dir("workloads", "workloads")


def models_dir() -> Path:
    return workloads_dir() / "models"


def results_dir() -> Path:
    """The calibration reports (experiments/results/*.md), shipped so installed reports can quote them."""
    return _data_dir("results", "experiments/results")


def traces_dir() -> Path:
    return workloads_dir() / "traces"
