"""servesim: request-level LLM serving simulator, cost model and capacity planner.

The Python API: `simulate` (servesim.api) and `sweep`, `find_max_rate`, `plan`, `cost`, `train`,
`compare`, `calibrate`, `validate` (servesim.workflows), one per command of the CLI.
"""

from .version import __version__  # noqa: F401

from ._jitcache import ensure_fresh as _ensure_fresh
from ._numba_start import answer_blas_probe as _answer_blas_probe

_ensure_fresh()
_answer_blas_probe()    # numba's first load then does not import scipy.linalg (servesim._numba_start)

# The API is loaded on first use (PEP 562), so that `python -m servesim simulate` loads the simulator
# and not the planner, the training model or the calibration (~0.4 s of a cached run's start-up).
# The subpackage servesim.calibrate (no imports of its own) is loaded first and its name dropped, so
# that `servesim.calibrate` is always the function, whichever of its modules are imported later.
from . import calibrate as _calibrate_package  # noqa: E402,F401

del calibrate  # noqa: F821 (bound by the import system as the subpackage was loaded)

_API = {"simulate", "SimConfig", "Result"}      # servesim.api (loads numba)
_WORKFLOWS = {"CalibrateResult", "CompareResult", "CostResult", "PlanResult", "SweepResult", "TrainingResult",
              "ValidateResult", "calibrate", "compare", "cost", "find_max_rate", "plan", "sweep", "train",
              "validate"}

__all__ = sorted(_API | _WORKFLOWS)


def __getattr__(name):
    if name in _API:
        from . import api as module
    elif name in _WORKFLOWS:
        from . import workflows as module
    else:
        raise AttributeError(f"module 'servesim' has no attribute {name!r}")
    value = getattr(module, name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | _API | _WORKFLOWS)
