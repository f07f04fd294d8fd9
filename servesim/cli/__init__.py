"""The `servesim` command line: one module per command group (main: simulate, profiles, cost)."""
from .main import main

__all__ = ["main"]
