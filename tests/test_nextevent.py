"""The tournament tree that finds the next event (engine/nextevent.py) and the kernel on many replicas."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from servesim.engine import codes as C
from servesim.engine.nextevent import first_nb, new_tree, set_time_nb
from test_reference_agreement import assert_agree

# pure-Python versions of the jitted functions (they have no Python entry point)
set_time, first = (getattr(f, "py_func", f) for f in (set_time_nb, first_nb))   # (NUMBA_DISABLE_JIT=1: already)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 40), st.lists(st.tuples(st.integers(0, 39), st.sampled_from([0.5, 1.0, 2.0, 3.0, np.inf])),
                                    max_size=60))
def test_tree_gives_the_earliest_lowest_leaf_as_a_scan_does(n, updates):
    keys, tree = new_tree(n)
    assert keys.shape[0] >= n and keys.shape[0] & (keys.shape[0] - 1) == 0
    times = np.full(n, np.inf)
    for j, t in updates:
        j %= n
        set_time(keys, tree, j, t)
        times[j] = t
        t_first, leaf = first(keys, tree)
        assert t_first == times.min()
        if t_first < np.inf:
            assert leaf == int(np.argmin(times))       # the lowest index among equal times


def test_many_replicas_agree_with_the_reference(replica_cost, small_engine, run_both):
    # 37 replicas (not a power of two) x 3 pipeline slots; identical requests arriving in bursts at
    # equal times make completions and scheduling decisions tie across replicas
    rc = replica_cost(1, 3)
    n = 300
    arrival = np.repeat(np.arange(n // 37 + 1) * 0.05, 37)[:n]
    prompt = np.full(n, 64)
    output = np.full(n, 5)
    for router in ("round-robin", "least-requests"):
        cfg = small_engine(rc, num_blocks=64, replicas=37, router=router)
        out, ref = run_both(rc, cfg, arrival, prompt, output)
        assert_agree(out, ref)
        assert (out.status == C.DONE).all()
        assert len(np.unique(out.replica)) == 37
