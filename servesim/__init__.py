"""servesim: request-level LLM serving simulator, cost model and capacity planner.

The Python API: `simulate` (servesim.api) and `sweep`, `find_max_rate`, `plan`, `cost`, `train`,
`compare`, `calibrate`, `validate` (servesim.workflows), one per command of the CLI.
"""

from .version import __version__  # noqa: F401

from ._jitcache import ensure_fresh as _ensure_fresh

_ensure_fresh()

# the subpackage servesim.calibrate is loaded first, so that importing it later cannot rebind the
# name `calibrate` from the function to the package
from . import calibrate as _calibrate_package  # noqa: E402,F401
from .workflows import (CalibrateResult, CompareResult, CostResult, PlanResult, SweepResult,  # noqa: E402
                        TrainingResult, ValidateResult, calibrate, compare, cost, find_max_rate, plan, sweep,
                        train, validate)

_LAZY = {"simulate", "SimConfig", "Result"}   # servesim.api loads numba: only when first used

__all__ = ["CalibrateResult", "CompareResult", "CostResult", "PlanResult", "Result", "SimConfig", "SweepResult",
           "TrainingResult", "ValidateResult", "calibrate", "compare", "cost", "find_max_rate", "plan", "simulate",
           "sweep", "train", "validate"]


def __getattr__(name):
    if name in _LAZY:
        from . import api
        value = getattr(api, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'servesim' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | _LAZY)
