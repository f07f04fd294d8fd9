"""Pure-Python reference simulator with the kernel's semantics."""
from .sim import KVAccountingError, ReferenceSimulator, reference_run, reference_simulate_pools

__all__ = ["KVAccountingError", "ReferenceSimulator", "reference_run", "reference_simulate_pools"]
