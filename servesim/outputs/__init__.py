"""Outputs: files written atomically, the stop on SIGINT / SIGTERM (`atomic`), and a simulation's
result files (`results`)."""
from .atomic import (INCOMPLETE, OutputDir, Terminated, add_note, atomic_file, check_output_dir,
                     check_output_file, exit_status, output_dir, signal_handlers, signal_name,
                     write_text_atomic)

__all__ = ["INCOMPLETE", "OutputDir", "Terminated", "add_note", "atomic_file", "check_output_dir",
           "check_output_file", "exit_status", "output_dir", "signal_handlers", "signal_name",
           "write_text_atomic"]
