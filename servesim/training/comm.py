"""Collectives of a training layout on the hardware topology, reusing servesim.costmodel.collectives.

Hierarchical all-reduce / reduce-scatter for a group whose ranks are ``stride`` apart (stride = the
product of the inner degrees): the n_in members that share a scale-up domain reduce-scatter over
NVLink, the n_out = n / n_in domains then reduce across the NIC on 1/n_in of the buffer, and the
result is all-gathered back inside the domain (NCCL's tree/ring hierarchy; the 2D scheme of
Jia et al. 2018, "Highly Scalable Deep Learning Training System with Mixed-Precision").
"""
from __future__ import annotations

import math

from servesim.costmodel.collectives import (
    RING,
    all_to_all_time_nb,
    allreduce_time_nb,
    link_for_group,
    p2p_link,
    p2p_time_nb,
    reduce_scatter_time_nb,
)


def split_group(hw, n: int, stride: int) -> tuple[int, int]:
    """(members per scale-up domain, number of domains) of a group of n ranks, stride apart."""
    if n <= 1:
        return 1, 1
    if hw.scaleup_bw > 0 and n * max(1, stride) <= hw.scaleup_domain:
        return n, 1  # the whole group inside one scale-up domain (e.g. 64 GPUs of a GB200 NVL72 rack)
    per_domain = max(1, hw.scaleup_domain // max(1, stride)) if hw.scaleup_bw > 0 else 1
    n_in = math.gcd(n, per_domain)
    return n_in, n // n_in


def _inner(hw, n_in, stride):
    return link_for_group(hw, n_in, span_in_domain=n_in * stride)


def _outer(hw, n_out):
    # across scale-up domains: PCIe while the domains share a node (NVLink-bridge pairs), else the NIC
    return link_for_group(hw, n_out, span_in_domain=max(hw.scaleup_domain + 1, n_out * hw.scaleup_domain))


def allreduce(hw, nbytes: float, n: int, stride: int = 1) -> float:
    """Hierarchical ring all-reduce of nbytes over n ranks (RS inside, AR across, AG inside)."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    n_in, n_out = split_group(hw, n, stride)
    if n_out == 1:
        _, bw, a = _inner(hw, n_in, stride)
        return allreduce_time_nb(nbytes, n_in, bw, a, RING)
    _, bw_o, a_o = _outer(hw, n_out)
    t = allreduce_time_nb(nbytes / n_in, n_out, bw_o, a_o, RING)
    if n_in > 1:
        _, bw, a = _inner(hw, n_in, stride)
        t += 2.0 * reduce_scatter_time_nb(nbytes, n_in, bw, a)
    return t


def reduce_scatter(hw, nbytes: float, n: int, stride: int = 1, hierarchical: bool = True) -> float:
    """Hierarchical reduce-scatter (equally, all-gather) of an nbytes buffer over n ranks.

    ``hierarchical=False``: one flat ring over all n ranks whose every step runs at the slowest
    link of the group -- each rank's NIC once the group leaves the scale-up domain -- with no
    intra-node stage sharing the node's NICs (DeepSpeed ZeRO-3 before ZeRO++'s hierarchical
    partitioning; Wang et al. 2023, arXiv:2306.10209, sec. 3)."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    if not hierarchical:
        _, bw, a = link_for_group(hw, n, span_in_domain=n * stride)
        return reduce_scatter_time_nb(nbytes, n, bw, a)
    n_in, n_out = split_group(hw, n, stride)
    t = 0.0
    if n_in > 1:
        _, bw, a = _inner(hw, n_in, stride)
        t += reduce_scatter_time_nb(nbytes, n_in, bw, a)
    if n_out > 1:
        _, bw_o, a_o = _outer(hw, n_out)
        t += reduce_scatter_time_nb(nbytes / n_in, n_out, bw_o, a_o)
    return t


def all_to_all(hw, nbytes: float, n: int, stride: int = 1) -> float:
    """All-to-all where each rank sends nbytes in total; the group's span decides the link."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    _, bw, a = link_for_group(hw, n, span_in_domain=n * stride)
    return all_to_all_time_nb(nbytes, n, bw, a)


def p2p(hw, nbytes: float, stride: int) -> float:
    """One send between neighbours ``stride`` ranks apart (PP stages, CP ring steps)."""
    if nbytes <= 0:
        return 0.0
    _, bw, a, bw_large, large_bytes = p2p_link(hw, 2 * stride if stride > 1 else 2)
    return p2p_time_nb(nbytes, bw, a, bw_large, large_bytes)
