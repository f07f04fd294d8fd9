"""Workloads: arrival processes, length distributions and trace readers, lowered to NumPy arrays."""
from servesim.workload.arrivals import (
    DIURNAL_CURVE,
    PROCESSES,
    arrival_times,
    offline_arrivals,
    parse_stages,
    stage_arrivals,
    stage_bounds,
)
from servesim.workload.lengths import KINDS, LengthSpec, sample_lengths
from servesim.workload.spec import (
    DEFAULT_NUM_REQUESTS,
    TRACE_MODES,
    Requests,
    Sessions,
    SharedPrefix,
    WorkloadSpec,
    build_requests,
    clip_to_context,
    list_workloads,
    load_workload,
    with_sessions,
    with_shared_prefix,
)
from servesim.workload.traces import Trace, read_trace

__all__ = [
    "DIURNAL_CURVE", "PROCESSES", "arrival_times", "offline_arrivals", "parse_stages", "stage_arrivals",
    "stage_bounds",
    "KINDS", "LengthSpec", "sample_lengths",
    "DEFAULT_NUM_REQUESTS", "TRACE_MODES", "Requests", "Sessions", "SharedPrefix", "WorkloadSpec", "build_requests",
    "clip_to_context", "list_workloads", "load_workload", "with_sessions", "with_shared_prefix",
    "Trace", "read_trace",
]
