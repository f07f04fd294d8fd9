"""Where the shipped data files live, in a source checkout or an installed wheel."""
from __future__ import annotations

from importlib import resources
from pathlib import Path

_REPO = Path(__file__).resolve().parent.parent


def _data_dir(package: str, repo_subdir: str) -> Path:
    # A source checkout (tests, editable installs) reads the top-level folders directly;
    # an installed wheel carries them as servesim.data.* packages.
    local = _REPO / repo_subdir
    if (_REPO / "pyproject.toml").is_file() and local.is_dir():
        return local
    return Path(str(resources.files(package)))


def hardware_dir() -> Path:
    return _data_dir("servesim.data.hardware_profiles", "hardware_profiles")


def workloads_dir() -> Path:
    return _data_dir("servesim.data.workloads", "workloads")


def models_dir() -> Path:
    return workloads_dir() / "models"


def traces_dir() -> Path:
    return workloads_dir() / "traces"
