"""Pure-Python reference simulator with the kernel's semantics."""
from .sim import KVAccountingError, ReferenceSimulator, reference_simulate

__all__ = ["KVAccountingError", "ReferenceSimulator", "reference_simulate"]
