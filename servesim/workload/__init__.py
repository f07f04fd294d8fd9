"""Workloads: arrival processes, length distributions and trace readers, lowered to NumPy arrays."""
from servesim.workload.arrivals import DIURNAL_CURVE, PROCESSES, arrival_times, offline_arrivals
from servesim.workload.lengths import KINDS, LengthSpec, sample_lengths
from servesim.workload.spec import (
    TRACE_MODES,
    Requests,
    WorkloadSpec,
    build_requests,
    clip_to_context,
    list_workloads,
    load_workload,
)
from servesim.workload.traces import Trace, read_trace

__all__ = [
    "DIURNAL_CURVE", "PROCESSES", "arrival_times", "offline_arrivals",
    "KINDS", "LengthSpec", "sample_lengths",
    "TRACE_MODES", "Requests", "WorkloadSpec", "build_requests", "clip_to_context",
    "list_workloads", "load_workload",
    "Trace", "read_trace",
]
