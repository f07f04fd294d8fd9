"""numba's first cache load without importing scipy.linalg (~0.2 s of a cached run's start-up).

The first time numba loads or compiles any function, its CPU target imports `numba.np.linalg` and
then `numba.np.arraymath` (numba/core/cpu.py, `load_additional_registries`); arraymath probes once, at
import, whether a BLAS is there: `_HAVE_BLAS = _check_blas()`, which calls linalg's `ensure_blas`:
import `scipy.linalg.cython_blas` and check its integer width (numba 0.58-0.68). The answer only
chooses how `np.correlate` / `np.convolve` are compiled, which no jitted servesim function calls.

`answer_blas_probe()` (run by `import servesim`, before numba is imported) watches for numba importing
`numba.np.linalg`, in numba's own order, and then answers that one probe by finding scipy.linalg
without importing it: the same answer wherever scipy is installed, as it must be for servesim. The
answer puts numba's `ensure_blas` back at once, so every BLAS or LAPACK function numba compiles later
is checked by numba as before. Nothing is changed once numba has loaded `numba.np.arraymath`, or where
numba's layout is not the one described here, or where `SERVESIM_NUMBA_PATCHES=0`.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys

from ._compile_speed import PATCHES_ENV

_LINALG = "numba.np.linalg"


def _answer_once(linalg) -> None:
    """Replace linalg's `ensure_blas` until its first call (arraymath's probe)."""
    probe = getattr(linalg, "ensure_blas", None)
    if probe is None:
        return

    def found_without_import():
        linalg.ensure_blas = probe                  # answered once: numba's own check from here on
        arraymath = sys.modules.get("numba.np.arraymath")
        if arraymath is not None and getattr(arraymath, "ensure_blas", None) is found_without_import:
            arraymath.ensure_blas = probe
        if importlib.util.find_spec("scipy.linalg") is None:
            raise ImportError("scipy 0.16+ is required for linear algebra")    # numba's own message

    linalg.ensure_blas = found_without_import


class _WatchLinalg(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when numba.np.linalg is imported, has the path finder find it and
    answers the probe right after the module has run."""

    def find_spec(self, fullname, path, target=None):
        if fullname != _LINALG:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run = loader.exec_module

        def run_then_answer(module):
            run(module)
            _answer_once(module)
        loader.exec_module = run_then_answer
        return spec


def answer_blas_probe() -> None:
    if "numba.np.arraymath" in sys.modules or os.environ.get(PATCHES_ENV, "").strip() == "0":
        return      # (SERVESIM_NUMBA_PATCHES=0: numba left as it is; _compile_speed checks the value)
    linalg = sys.modules.get(_LINALG)
    if linalg is not None:
        _answer_once(linalg)
    elif not any(isinstance(f, _WatchLinalg) for f in sys.meta_path):
        sys.meta_path.insert(0, _WatchLinalg())
