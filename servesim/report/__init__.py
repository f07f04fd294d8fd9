"""`servesim report`: a self-contained technical report (report.md + PNG figures + CSV tables) for one
scenario, built from the library: rate sweeps (planning), the cost model's iteration breakdown, the
SLO planner, training vs serving cost, and the calibration status of each hardware profile used."""
from .build import ReportSpec, build_report, regenerate_command

__all__ = ["ReportSpec", "build_report", "regenerate_command"]
