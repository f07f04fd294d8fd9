"""Alpha-beta cost of collectives (Hockney 1994; Thakur, Rabenseifner & Gropp, IJHPCA 2005).

A message of S bytes over a link with latency alpha and bandwidth B costs alpha + S/B.
Ring all-reduce over n ranks: 2(n-1) steps of S/n bytes -> 2(n-1)*alpha + 2(n-1)/n * S/B
(Thakur et al. 2005, eq. for ring reduce-scatter + all-gather; Patarasuk & Yuan 2009).
Tree (double binary tree, as NCCL >= 2.4): 2*log2(n)*alpha + 2*S/B (pipelined; Sanders et al. 2009).
Reduce-scatter and all-gather are each half of a ring all-reduce.
B is the per-direction link bandwidth times an achieved fraction.
Point-to-point sends over the scale-up link have a second rate for messages above a size threshold:
the Vidur A100 DGX send/recv timings step from ~260 to ~224 GB/s between 31.9 and 32.1 MiB and stay
there (experiments/results/costmodel_validation.md); below and above the step each is alpha + S/B.
"""
from __future__ import annotations

import math

from numba import njit
from ..jit import JIT

RING = 0
TREE = 1
AUTO = 2
ALGORITHMS = {"ring": RING, "tree": TREE, "auto": AUTO}


@njit(inline="always", **JIT)
def p2p_time_nb(nbytes, bw, alpha, bw_large, large_bytes):
    """One send of nbytes: alpha + S/bw, or alpha + S/bw_large for S > large_bytes."""
    if nbytes <= 0.0:
        return 0.0
    if nbytes > large_bytes:
        return alpha + nbytes / bw_large
    return alpha + nbytes / bw


@njit(inline="always", **JIT)
def ring_allreduce_time_nb(nbytes, n, bw, alpha):
    if n <= 1 or nbytes <= 0.0:
        return 0.0
    return 2.0 * (n - 1) * alpha + 2.0 * (n - 1) / n * nbytes / bw


@njit(inline="always", **JIT)
def tree_allreduce_time_nb(nbytes, n, bw, alpha):
    if n <= 1 or nbytes <= 0.0:
        return 0.0
    return 2.0 * math.log2(n) * alpha + 2.0 * nbytes / bw


@njit(inline="always", **JIT)
def allreduce_time_nb(nbytes, n, bw, alpha, algorithm):
    ring = ring_allreduce_time_nb(nbytes, n, bw, alpha)
    if algorithm == RING:
        return ring
    tree = tree_allreduce_time_nb(nbytes, n, bw, alpha)
    if algorithm == TREE:
        return tree
    return min(ring, tree)


@njit(inline="always", **JIT)
def reduce_scatter_time_nb(nbytes, n, bw, alpha):
    """Ring reduce-scatter (or all-gather) of a buffer of nbytes total: (n-1)*alpha + (n-1)/n * S/B."""
    if n <= 1 or nbytes <= 0.0:
        return 0.0
    return (n - 1) * alpha + (n - 1) / n * nbytes / bw


@njit(**JIT)
def all_to_all_time_nb(nbytes, n, bw, alpha):
    """Pairwise all-to-all, each rank sending nbytes in total: (n-1)*alpha + (n-1)/n * S/B."""
    return reduce_scatter_time_nb(nbytes, n, bw, alpha)


def link_for_group(hw, group_size: int, span_in_domain: int | None = None) -> tuple[str, float, float]:
    """(link name, achieved per-direction bandwidth in B/s, latency in s) for a group of GPUs.

    ``span_in_domain`` is how many consecutive GPUs the group spans (default: its size). A group
    inside one scale-up domain uses NVLink/NVSwitch/Infinity Fabric/ICI; a group that stays in one
    node but leaves the scale-up domain (no fabric, or NVLink-bridge pairs as on PCIe cards) is
    bound by PCIe, the slowest hop of its ring; a group larger than a node is bound by the NIC.
    """
    eff = hw.efficiency
    span = group_size if span_in_domain is None else span_in_domain
    if span <= hw.scaleup_domain and hw.scaleup_bw > 0:
        return "scaleup", hw.scaleup_bw * eff.scaleup_bw_fraction, eff.scaleup_latency_s
    if span <= hw.gpus_per_node:
        return "pcie", hw.pcie_bw * eff.pcie_bw_fraction, eff.pcie_latency_s
    return "scaleout", hw.scaleout_bw * eff.scaleout_bw_fraction, eff.scaleout_latency_s


def p2p_link(hw, span: int) -> tuple[str, float, float, float, float]:
    """(link name, bw, alpha, bw above the size step, step in bytes) of a send between two GPUs
    ``span`` consecutive GPUs apart (2 = neighbours). Over the scale-up link these are the
    point-to-point figures (NCCL runs p2p and collectives through different protocols); PCIe and
    the NIC have one rate (no step)."""
    name, bw, alpha = link_for_group(hw, 2, span_in_domain=span)
    if name != "scaleup":
        return name, bw, alpha, bw, math.inf
    eff = hw.efficiency
    return (name, hw.scaleup_bw * eff.p2p_bw_fraction, eff.p2p_latency_s,
            hw.scaleup_bw * eff.p2p_large_bw_fraction, eff.p2p_large_message_bytes)
