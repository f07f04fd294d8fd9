"""The next event of a kind without scanning every replica: a tournament tree over event times.

`keys` holds one time per leaf (a pipeline slot's completion, a replica's scheduling decision),
padded with inf to a power of two `M`; `tree[M + j] = j`, and each inner node `tree[n]` holds the
leaf that wins its two children: the earlier time, ties to the lower leaf (the left child, whose
leaves all have lower indices). So `tree[1]` is the earliest leaf, lowest index first -- the order a
scan with a strict `<` gives -- and changing one time costs at most log2(M) steps (Knuth, TAOCP
vol. 3, sec. 5.4.1, "tree of winners").
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from .jit import HANDLER


def new_tree(n):
    """(keys, tree) for n leaves, every time inf."""
    m = 1
    while m < n:
        m *= 2
    tree = np.zeros(2 * m, np.int64)
    tree[m:] = np.arange(m)
    lo = m
    while lo > 1:           # each inner node: its left child's winner (every time is inf)
        hi, lo = lo, lo // 2
        tree[lo:hi] = tree[2 * lo:2 * hi:2]
    return np.full(m, math.inf), tree


@njit(**HANDLER)
def set_time_nb(keys, tree, j, t):
    """Leaf j's time becomes t; replay its matches towards the root. A match whose winner stays the
    same leaf, other than j, leaves every match above it as it was: stop there."""
    if keys[j] == t:
        return
    keys[j] = t
    m = keys.shape[0]
    node = (m + j) >> 1
    while node >= 1:
        a = tree[2 * node]
        b = tree[2 * node + 1]
        w = a if keys[a] <= keys[b] else b
        if w == tree[node] and w != j:
            return
        tree[node] = w
        node >>= 1


@njit(**HANDLER)
def first_nb(keys, tree):
    """(time, leaf) of the earliest leaf, the lowest of equal ones."""
    j = tree[1]
    return keys[j], j
