"""Codes of an engine's CUDA-graph mode (`CostParams.graph_mode`), read by the jitted step cost
(costmodel/iteration.py) and set by the lowering (costmodel/params.py)."""

GRAPH_NONE = 0
GRAPH_PIECEWISE = 1
GRAPH_FULL = 2
GRAPH_FULL_AND_PIECEWISE = 3
GRAPH_MODES = {"none": GRAPH_NONE, "piecewise": GRAPH_PIECEWISE, "full": GRAPH_FULL,
               "full_and_piecewise": GRAPH_FULL_AND_PIECEWISE}
