"""Pure-Python reference simulator with the kernel's semantics."""
