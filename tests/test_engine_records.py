"""The engine's request records -> the output's columns (`engine/state.py`)."""
from __future__ import annotations

import numpy as np

from servesim.engine import state as S


def test_output_columns_jitted_pass_gives_the_block_copies(monkeypatch):
    """state.output_columns over GATHER_JIT_ABOVE records (one jitted pass, `gather_nb`) gives the same
    arrays as the block-by-block NumPy copies, with and without the transfer fields."""
    rng = np.random.default_rng(2)
    n = S.GATHER_JIT_ABOVE + 999
    rq = np.zeros(n, S.request_dtype)
    raw = rq.view(np.uint8).reshape(n, S.request_dtype.itemsize)
    raw[:] = rng.integers(0, 256, raw.shape, dtype=np.uint8)     # every byte of every field random
    rq = rq.view(np.recarray)
    for names in (S.OUTPUT_FIELDS, S.OUTPUT_FIELDS + S.TRANSFER_FIELDS):
        jitted = S.output_columns(rq, names)
        monkeypatch.setattr(S, "GATHER_JIT_ABOVE", n)
        blocks = S.output_columns(rq, names)
        monkeypatch.undo()
        assert list(jitted) == list(blocks) == list(names)
        for k in names:
            assert jitted[k].dtype == blocks[k].dtype and jitted[k].tobytes() == blocks[k].tobytes(), k
            assert jitted[k].tobytes() == np.ascontiguousarray(rq[k]).tobytes(), k
