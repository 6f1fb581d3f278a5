"""Collective communication on a ring: the standard costs, and which link a group runs over.

For a group of n GPUs, each holding (or receiving) ``size`` bytes, with link bandwidth B per GPU in one
direction and per-step latency α (Thakur et al. 2005; NCCL's ring algorithms; nccl-tests PERFORMANCE.md):

    all-reduce       2·(n−1)/n · size / B + 2·(n−1)·α
    all-gather       (n−1)/n · size / B + (n−1)·α      (size = the gathered whole)
    reduce-scatter   (n−1)/n · size / B + (n−1)·α      (size = the whole before scattering)
    all-to-all       (n−1)/n · size / B + (n−1)·α
    point-to-point   size / B + α

A group whose members sit on one node talks over the scale-up links (NVLink, xGMI, ICI); one that
spans nodes is limited by each GPU's network interface. Ranks are laid out TP innermost, then CP, EP
within DP, DP, and PP outermost (Megatron-LM's default order), so a group's span is its size times the
product of the degrees inside it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from lmcalc.specs import HardwareSpec

Collective = Literal["all-reduce", "all-gather", "reduce-scatter", "all-to-all", "p2p"]

# Fraction of the link's spec bandwidth that NCCL's ring collectives reach at large messages.
NVLINK_RING_EFFICIENCY = 367.2 / 450
"""8×H200 all-reduce with NCCL_ALGO=Ring measured 367.2 GB/s bus bandwidth against NVLink4's 450 GB/s
per direction (stas00, ml-engineering network benchmarks, 16 GiB payload)."""
NETWORK_RING_EFFICIENCY = 47 / 50
"""NVIDIA maintainers expect 46–48 GB/s per 400 Gb/s (50 GB/s) NDR NIC for ring collectives on a good
fabric (NVIDIA/nccl-tests issue #290)."""
INTRA_NODE_LATENCY_S = 5e-6
INTER_NODE_LATENCY_S = 20e-6
"""Per-step latencies: an assumption of the order NCCL shows on NVLink (a few µs) and InfiniBand (tens
of µs) for small messages; they matter only for small groups of small messages."""
FALLBACK_INTER_NODE_GBPS = 25.0
"""A GPU whose preset gives no network figure is assumed to have a 200 Gb/s NIC (25 GB/s)."""


@dataclass(frozen=True)
class Link:
    bandwidth: float  # bytes/s per GPU, one direction, achievable
    latency: float  # seconds per ring step
    name: str


def link_for(hardware: HardwareSpec, span: int, gpus_per_node: int) -> Link:
    """The link a group spanning ``span`` consecutive ranks uses."""
    if span <= gpus_per_node and hardware.intra_node_gbps:
        return Link(hardware.intra_node_gbps * 1e9 * NVLINK_RING_EFFICIENCY, INTRA_NODE_LATENCY_S, "intra-node")
    gbps = hardware.inter_node_gbps or FALLBACK_INTER_NODE_GBPS
    return Link(gbps * 1e9 * NETWORK_RING_EFFICIENCY, INTER_NODE_LATENCY_S, "inter-node")


def ring_factor(op: Collective, n: int) -> float:
    """Bytes each GPU puts on its link per byte of ``size`` (nccl-tests' bus-bandwidth factor): 2·(n−1)/n for
    an all-reduce (a reduce-scatter, then an all-gather), (n−1)/n for the other collectives, 1 point to point."""
    if op == "p2p":
        return 1.0
    return (2 if op == "all-reduce" else 1) * (n - 1) / n


def ring_steps(op: Collective, n: int) -> int:
    """Latency-bound steps of the ring: 2·(n−1) for an all-reduce, n−1 for the other collectives, 1 point to
    point."""
    if op == "p2p":
        return 1
    return (2 if op == "all-reduce" else 1) * (n - 1)


def collective_time(op: Collective, size: float, n: int, link: Link) -> float:
    """Seconds for one collective of ``size`` bytes over ``n`` GPUs on ``link`` (0 for a group of one)."""
    if n <= 1 or size <= 0:
        return 0.0
    return ring_factor(op, n) * size / link.bandwidth + ring_steps(op, n) * link.latency
