"""Capacity planning: rate sweeps, max-rate search, the SLO planner and their execution backends.

Data flows one way: grid/rates -> SimConfig points -> a backend runs `servesim.api.simulate` per point
(one process or Dask task each) -> flat rows -> pandas tables -> figures and CLI output.
"""
from .grid import expand, parse_grid, parse_rates
from .sweep import SweepResult, run_sweep

__all__ = ["SweepResult", "expand", "parse_grid", "parse_rates", "run_sweep"]
