"""Python side of the engine: lowered inputs (`lower.KernelInputs`) -> the kernel -> EngineOutput."""
from __future__ import annotations

from .kernel import EngineOutput, simulate_pools
from .lower import KernelInputs


def run(inputs: KernelInputs) -> EngineOutput:
    """Run the kernel on lowered inputs (`lower.lower_requests`, `lower.one_pool_inputs`).

    The kernel sees engine arrival times (each request ``cfg.frontend`` after its send: the serving
    frontend's HTTP, tokenisation, the hop to the engine process, and the return of the first
    token); the output's ``arrival`` is the send time again, so TTFT and E2E include the frontend."""
    out = simulate_pools(*inputs)
    out.arrival[:] -= inputs.cfg.frontend      # (the output's own array: no copy)
    return out
