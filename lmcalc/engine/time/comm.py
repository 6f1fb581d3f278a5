"""Collective communication as NCCL runs it: latency plus bytes over the achievable bus bandwidth.

For a group of n GPUs, each holding (or receiving) ``size`` bytes, the time of a ring collective is

    t = α + steps · α_step + factor · size / B_bus

* factor is nccl-tests' bus-bandwidth factor (its PERFORMANCE.md): 2·(n−1)/n for an all-reduce (a
  reduce-scatter, then an all-gather), (n−1)/n for all-gather, reduce-scatter and all-to-all, 1 point to point;
* B_bus is the bus bandwidth the link reaches at large messages: the hardware preset's measured figure
  (``intra_node_busbw_gbps``, ``inter_node_busbw_gbps``: nccl-tests), else the link's spec bandwidth times
  the efficiency measured on a comparable link (``NVLINK_RING_EFFICIENCY``, ``NETWORK_RING_EFFICIENCY``);
* α and α_step are latencies: a fixed cost per collective and one per step (n − 1 steps of a ring; across nodes
  NCCL runs all-reduces as trees, whose depth grows as log₂ n). Small messages are latency-bound, so the
  achieved bandwidth grows with the message size and reaches B_bus only for large ones, as nccl-tests' curves
  do.

A group whose members share a node talks over the scale-up links (NVLink, xGMI, ICI); one with a single member
per node is limited by each GPU's network interface; one with several members on each of several nodes is
hierarchical: a reduce-scatter within the node, the collective across nodes on 1/g of the data (each GPU drives
its own NIC), an all-gather within the node. Ranks are laid out TP innermost, then CP, EP within DP, DP, and PP
outermost (Megatron-LM's default order): a group's members sit ``stride`` ranks apart, the product of the
degrees inside it.

A figure the preset does not have is never guessed: a group that needs a link the preset gives no bandwidth for
is refused.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Literal

from lmcalc.errors import LmcalcError
from lmcalc.specs import Cluster, HardwareSpec

Collective = Literal["all-reduce", "all-gather", "reduce-scatter", "all-to-all", "p2p"]

NVLINK_RING_EFFICIENCY = 367.2 / 450
"""Where a chip has no measured bus bandwidth within a node: 8×H200 all-reduce with NCCL_ALGO=Ring measured
367.2 GB/s bus bandwidth against NVLink4's 450 GB/s per direction (stas00, ml-engineering network benchmarks,
16 GiB payload)."""
NETWORK_RING_EFFICIENCY = 47 / 50
"""Where a chip has no measured bus bandwidth across nodes: NVIDIA maintainers expect 46-48 GB/s per 400 Gb/s
(50 GB/s) NDR NIC for ring collectives on a good fabric (NVIDIA/nccl-tests issue #290)."""
INTRA_NODE_LATENCY_S = 10e-6
INTRA_NODE_STEP_S = 0.5e-6
INTER_NODE_LATENCY_S = 20e-6
INTER_NODE_STEP_S = 5e-6
"""Latencies, an assumption of the order nccl-tests shows for small messages: about 10-20 µs for an all-reduce
of a few KB within an NVLink node, tens of µs across InfiniBand nodes."""


@dataclass(frozen=True)
class Link:
    bandwidth: float  # achievable bus bandwidth per GPU, bytes/s, at large messages
    latency: float  # seconds per collective
    step_latency: float  # seconds per ring (or tree) step
    name: str
    source: str


def intra_link(hardware: HardwareSpec) -> Link:
    """The scale-up link within a node (NVLink, xGMI, ICI), refused where the preset gives no bandwidth for it."""
    if not hardware.intra_node_gbps:
        raise LmcalcError(
            f"{hardware.name} has no scale-up (within-node) bandwidth in its preset, and this layout needs GPUs of "
            "one node to talk; add intra_node_gbps to a copy of the preset ('lmcalc presets show "
            f"{hardware.name}') or use one GPU per node"
        )
    derived = f"{hardware.intra_node_gbps:g} GB/s spec × {NVLINK_RING_EFFICIENCY:.3f} (8×H200 ring, stas00)"
    spec = hardware.intra_node_gbps * NVLINK_RING_EFFICIENCY
    bandwidth, source = _bus_bandwidth(hardware, hardware.intra_node_busbw_gbps, spec, derived)
    return Link(bandwidth, INTRA_NODE_LATENCY_S, INTRA_NODE_STEP_S, "intra-node", source)


def inter_link(hardware: HardwareSpec) -> Link:
    """The network between nodes (each GPU's NIC), refused where the preset gives no bandwidth for it."""
    if not hardware.inter_node_gbps:
        raise LmcalcError(
            f"{hardware.name} has no inter-node (network) bandwidth in its preset, and this layout needs GPUs on "
            "different nodes to talk; add inter_node_gbps (the NIC's Gb/s / 8 per GPU) to a copy of the preset "
            f"('lmcalc presets show {hardware.name}') or keep the run within one node"
        )
    derived = f"{hardware.inter_node_gbps:g} GB/s NIC × {NETWORK_RING_EFFICIENCY:.2f} (nccl-tests #290)"
    spec = hardware.inter_node_gbps * NETWORK_RING_EFFICIENCY
    bandwidth, source = _bus_bandwidth(hardware, hardware.inter_node_busbw_gbps, spec, derived)
    return Link(bandwidth, INTER_NODE_LATENCY_S, INTER_NODE_STEP_S, "inter-node", source)


def _bus_bandwidth(
    hardware: HardwareSpec, measured_gbps: float | None, derived_gbps: float, derived: str
) -> tuple[float, str]:
    """Bytes/s a link's ring collectives reach, and its source: the preset's measured bus bandwidth, else the spec
    figure times a measured efficiency."""
    if measured_gbps:
        return measured_gbps * 1e9, hardware.sources.get("collectives", "measured")
    return derived_gbps * 1e9, derived


def link_for(hardware: HardwareSpec, span: int, gpus_per_node: int) -> Link:
    """The link a group spanning ``span`` consecutive ranks uses: scale-up within a node (or a larger scale-up
    domain, ``scale_up_gpus``), the network beyond it."""
    if span <= hardware.scale_up_domain(gpus_per_node):
        return intra_link(hardware)
    return inter_link(hardware)


def ring_factor(op: Collective, n: int) -> float:
    """Bytes each GPU puts on its link per byte of ``size`` (nccl-tests' bus-bandwidth factor): 2·(n−1)/n for
    an all-reduce, (n−1)/n for the other collectives, 1 point to point."""
    if op == "p2p":
        return 1.0
    return (2 if op == "all-reduce" else 1) * (n - 1) / n


def steps(op: Collective, n: int, link: Link) -> float:
    """Latency-bound steps: n − 1 per ring pass (two passes for an all-reduce); across nodes NCCL runs an
    all-reduce as trees, 2·⌈log₂ n⌉ steps, but has only rings for all-gather and reduce-scatter; an all-to-all
    posts its sends at once (one step); one step point to point."""
    if op in ("p2p", "all-to-all"):
        return 1
    if op == "all-reduce":
        return 2 * (n - 1 if link.name == "intra-node" else math.ceil(math.log2(n)))
    return n - 1


def collective_time(op: Collective, size: float, n: int, link: Link) -> float:
    """Seconds for one collective of ``size`` bytes over ``n`` GPUs on one kind of ``link`` (0 for a group of
    one)."""
    if n <= 1 or size <= 0:
        return 0.0
    return link.latency + steps(op, n, link) * link.step_latency + ring_factor(op, n) * size / link.bandwidth


@functools.lru_cache(maxsize=1 << 16)  # the planner's layouts ask for the same few collectives many times
def group_time(op: Collective, size: float, n: int, stride: int, cluster: Cluster, one_nic: bool = False) -> float:
    """Seconds for one collective over a group of ``n`` GPUs whose members sit ``stride`` ranks apart, on the
    links their placement gives them (flat within a node, flat over the NICs with one member per node,
    hierarchical otherwise; ``one_nic``: flat over the NICs whatever the placement, each GPU's whole share
    through its own NIC)."""
    if n <= 1 or size <= 0:
        return 0.0
    hardware, domain = cluster.hardware, cluster.scale_up
    if n * stride <= domain:
        return collective_time(op, size, n, intra_link(hardware))
    local = max(1, min(n, domain // stride))  # members per node (or scale-up domain)
    if local == 1 or one_nic:
        return collective_time(op, size, n, inter_link(hardware))
    nodes = math.ceil(n / local)
    intra, inter = intra_link(hardware), inter_link(hardware)
    if op == "all-to-all":  # (n − local)/n of each GPU's bytes leave the node; both links run at once
        remote = (n - local) / n * size / inter.bandwidth + inter.latency
        near = (local - 1) / n * size / intra.bandwidth + intra.latency
        return max(remote, near)
    if op == "p2p":
        return collective_time(op, size, 2, inter)
    if op == "all-reduce":
        return (
            collective_time("reduce-scatter", size, local, intra)
            + collective_time("all-reduce", size / local, nodes, inter)
            + collective_time("all-gather", size, local, intra)
        )
    return collective_time(op, size, local, intra) + collective_time(op, size / local, nodes, inter)
