"""The inter-token gap histogram's bin found without log10 when a guess is right (span.gap_bin_near_nb):
always the bin `gap_bin_nb` computes, wherever the gap lies, edges and their neighbourhood included."""
from __future__ import annotations

import numpy as np
from numba import njit

from servesim.engine import codes as C
from servesim.engine.span import GAP_EDGES, GAP_SLACK, gap_bin_near_nb, gap_bin_nb


@njit(cache=False)
def _bins_nb(gaps, guesses):
    exact = np.empty(gaps.shape[0], np.int64)
    near = np.empty(gaps.shape[0], np.int64)
    for j in range(gaps.shape[0]):
        exact[j] = gap_bin_nb(gaps[j])
        near[j] = gap_bin_near_nb(gaps[j], guesses[j])
    return exact, near


def _check(gaps, guess_of):
    gaps = np.asarray(gaps, np.float64)
    exact, _ = _bins_nb(gaps, np.zeros(gaps.shape[0], np.int64))
    guesses = np.clip(guess_of(exact), 0, C.GAP_BINS - 1).astype(np.int64)
    exact, near = _bins_nb(gaps, guesses)
    bad = np.flatnonzero(exact != near)
    assert bad.size == 0, (gaps[bad[:5]], exact[bad[:5]], near[bad[:5]], guesses[bad[:5]])
    return exact, guesses


def test_a_right_guess_gives_the_bin_without_log10_and_a_wrong_one_the_bin_all_the_same():
    rng = np.random.default_rng(11)
    gaps = 10.0 ** rng.uniform(C.GAP_LOG10_MIN - 1, C.GAP_LOG10_MAX + 1, 200_000)
    for shift in (-1, 1, 7, 0):
        exact, guesses = _check(gaps, lambda b: b + shift)
    # the guess right, a gap of the histogram's range is inside its bin by more than the slack: kept (no log10)
    inside = (gaps > GAP_EDGES[guesses] * (1 + GAP_SLACK)) & (gaps < GAP_EDGES[guesses + 1] * (1 - GAP_SLACK))
    assert inside[(gaps > GAP_EDGES[0]) & (gaps < GAP_EDGES[-1])].mean() > 0.999


def test_gaps_at_and_beside_every_edge_and_the_slack_get_their_exact_bin():
    edges = GAP_EDGES
    near = [edges, edges * (1 + GAP_SLACK), edges * (1 - GAP_SLACK)]
    gaps = np.concatenate([g for e in near for g in (e, np.nextafter(e, 0), np.nextafter(e, np.inf),
                                                         np.nextafter(np.nextafter(e, 0), 0),
                                                         np.nextafter(np.nextafter(e, np.inf), np.inf))])
    for shift in (0, -1, 1):
        _check(gaps, lambda b: b + shift)
    # and the edges are the bins' own: just above GAP_EDGES[b] the bin is b, just below it b - 1
    above, _ = _check(edges[1:-1] * (1 + 1e-12), lambda b: b)
    below, _ = _check(edges[1:-1] * (1 - 1e-12), lambda b: b)
    assert np.array_equal(above, np.arange(1, C.GAP_BINS)) and np.array_equal(below, np.arange(0, C.GAP_BINS - 1))
