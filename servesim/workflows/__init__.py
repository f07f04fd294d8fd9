"""The Python API beyond `simulate`: one function per command, each returning a typed result.

``sweep`` and ``find_max_rate`` (`capacity`), ``plan`` (`planner`), ``cost`` (`cost`), ``train`` and
``compare`` (`training`), ``calibrate`` and ``validate`` (`calibration`); the results are in `results`.
The CLI commands call the same functions, so one set of inputs gives the same numbers either way.
"""
from .calibration import calibrate, validate
from .capacity import find_max_rate, sweep
from .cost import cost
from .planner import plan
from .results import (CalibrateResult, CompareResult, CostResult, PlanResult, SweepResult, TrainingResult,
                      ValidateResult)
from .training import compare, train

__all__ = ["CalibrateResult", "CompareResult", "CostResult", "PlanResult", "SweepResult", "TrainingResult",
           "ValidateResult", "calibrate", "compare", "cost", "find_max_rate", "plan", "sweep", "train", "validate"]
