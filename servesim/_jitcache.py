"""Keep numba's on-disk cache honest.

numba invalidates a cached function only when its own file changes, not when a jitted function it
calls (in another file) does: after editing the cost model, the engine would silently run the old
formulas. On import we hash every servesim source file that defines jitted code; when the hash
differs from the one stored beside the cache, all of servesim's cache files are dropped and
numba recompiles. Caching stays a speed-up, never a correctness requirement.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

_ROOT = Path(__file__).resolve().parent
_STAMP = _ROOT / "__pycache__" / "numba-sources.sha256"


def _sources_digest() -> str:
    h = hashlib.sha256()
    for p in sorted(_ROOT.rglob("*.py")):
        text = p.read_bytes()
        if b"njit" in text:
            h.update(str(p.relative_to(_ROOT)).encode())
            h.update(text)
    return h.hexdigest()


def ensure_fresh() -> None:
    try:
        digest = _sources_digest()
        if _STAMP.is_file() and _STAMP.read_text().strip() == digest:
            return
        for f in _ROOT.rglob("__pycache__/*.nb[ic]"):
            f.unlink(missing_ok=True)
        _STAMP.parent.mkdir(exist_ok=True)
        _STAMP.write_text(digest + "\n")
    except OSError:
        pass   # read-only install: numba cannot cache there either
