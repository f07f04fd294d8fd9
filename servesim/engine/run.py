"""Python side of the engine: lowered inputs (`lower.KernelInputs`) -> the kernel -> EngineOutput."""
from __future__ import annotations

from .kernel import EngineOutput, simulate_pools
from .lower import KernelInputs


def threads_of(threads: int | None, replicas: int | None = None) -> int:
    """The threads of a run (``--threads``; None: `split.default_threads`, at most ``replicas``)."""
    if threads is None:
        from .split import default_threads
        return default_threads(replicas)
    return int(threads)


def run(inputs: KernelInputs, threads: int = 1) -> EngineOutput:
    """Run the kernel on lowered inputs (`lower.lower_requests`, `lower.one_pool_inputs`); with
    ``threads`` > 1 a run whose replicas are independent is split into one sub-run per replica, run on
    that many threads (`split.py`; the same output, field for field).

    The kernel sees engine arrival times (each request ``cfg.frontend`` after its send: the serving
    frontend's HTTP, tokenisation, the hop to the engine process, and the return of the first
    token); the output's ``arrival`` is the send time again, so TTFT and E2E include the frontend."""
    from .split import SPLIT_MIN, simulate_split, whole_reason
    if threads > 1 and inputs.prompt.shape[0] >= SPLIT_MIN and not whole_reason(inputs):
        out = simulate_split(inputs, threads)
    else:
        out = simulate_pools(*inputs)
    out.arrival[:] -= inputs.cfg.frontend      # (the output's own array: no copy)
    return out
