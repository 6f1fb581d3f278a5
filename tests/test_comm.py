"""Collectives as NCCL runs them (engine.time.comm): hand derivations of the latency-bandwidth model, the placement of
a group on the links, and the refusal of figures a preset does not have."""

from __future__ import annotations

import math

import pytest

from lmcalc.engine.time import comm
from lmcalc.errors import LmcalcError
from lmcalc.presets import resolve_hardware
from lmcalc.specs import Cluster

H100 = resolve_hardware("h100-sxm").spec
GB = 1e9


def on(hardware, count: int, per_node: int = 8) -> Cluster:
    return Cluster(hardware=hardware, count=count, gpus_per_node=per_node)


def test_an_all_reduce_within_a_node_by_hand():
    """1 GB over 8 H100 in a node: α + 2·7 ring steps + 2·7/8 · 1 GB over the measured 367.2 GB/s ring bus
    bandwidth (stas00, 8×H200 NCCL ring: the preset's intra_node_busbw_gbps)."""
    assert H100.intra_node_busbw_gbps == 367.2
    t = comm.group_time("all-reduce", 1 * GB, 8, 1, on(H100, 8))
    expected = comm.INTRA_NODE_LATENCY_S + 14 * comm.INTRA_NODE_STEP_S + 2 * 7 / 8 * GB / (367.2 * GB)
    assert t == pytest.approx(expected)


def test_bus_bandwidth_grows_with_the_message_as_nccl_tests_show():
    """busbw = factor · size / t: latency-bound at a few KB, near the link's at a GB (nccl-tests' curve shape)."""
    link = comm.intra_link(H100)

    def busbw(size: float) -> float:
        return comm.ring_factor("all-reduce", 8) * size / comm.collective_time("all-reduce", size, 8, link)

    small, medium, large = busbw(16e3), busbw(16e6), busbw(4e9)
    assert small < 0.01 * link.bandwidth < medium < large < link.bandwidth
    assert large > 0.99 * link.bandwidth


def test_one_member_per_node_runs_over_the_nics():
    """A DP group of 4 with TP 8 inside: one GPU per node, a flat ring over each GPU's NIC (46-48 GB/s per
    400 Gb/s NDR NIC, NVIDIA's expectation in nccl-tests #290: the preset's inter_node_busbw_gbps), tree latency
    across nodes for an all-reduce (log₂ 4 = 2 steps a pass), ring latency for an all-gather (3 steps)."""
    t = comm.group_time("all-reduce", 1 * GB, 4, 8, on(H100, 32))
    busbw = comm.inter_link(H100).bandwidth
    assert 46 * GB <= busbw <= 48 * GB
    expected = comm.INTER_NODE_LATENCY_S + 2 * 2 * comm.INTER_NODE_STEP_S + 2 * 3 / 4 * GB / busbw
    assert t == pytest.approx(expected)
    gather = comm.group_time("all-gather", 1 * GB, 4, 8, on(H100, 32))
    assert gather == pytest.approx(comm.INTER_NODE_LATENCY_S + 3 * comm.INTER_NODE_STEP_S + 3 / 4 * GB / busbw)


def test_a_group_across_nodes_with_several_members_each_is_hierarchical():
    """16 GPUs, 8 on each of 2 nodes: reduce-scatter in the node, all-reduce of 1/8 across the 2 nodes (each GPU
    on its own NIC), all-gather in the node."""
    cluster = on(H100, 16)
    size = 2 * GB
    intra, inter = comm.intra_link(H100), comm.inter_link(H100)
    expected = (
        comm.collective_time("reduce-scatter", size, 8, intra)
        + comm.collective_time("all-reduce", size / 8, 2, inter)
        + comm.collective_time("all-gather", size, 8, intra)
    )
    assert comm.group_time("all-reduce", size, 16, 1, cluster) == pytest.approx(expected)
    flat = comm.collective_time("all-reduce", size, 16, inter)
    assert expected < flat  # the reason NCCL does it


def test_all_to_all_across_nodes_sends_the_remote_share_over_the_network():
    """EP 16 over 2 nodes of 8: 8 of 16 destinations are remote; both links run at once."""
    size = 1 * GB
    t = comm.group_time("all-to-all", size, 16, 1, on(H100, 16))
    remote = 8 / 16 * size / comm.inter_link(H100).bandwidth + comm.INTER_NODE_LATENCY_S
    near = 7 / 16 * size / comm.intra_link(H100).bandwidth + comm.INTRA_NODE_LATENCY_S
    assert t == pytest.approx(max(remote, near))


def test_one_nic_sends_a_gpus_whole_share_over_its_own_nic():
    """ZeRO-3 as DeepSpeed ran it (SpeedRule.zero3_network one_nic): 16 GPUs on 2 nodes, a flat ring over the
    NICs instead of the hierarchical reduce-scatter, all-gather and cross-node all-reduce of 1/8."""
    cluster = on(H100, 16)
    flat = comm.group_time("all-gather", GB, 16, 1, cluster, one_nic=True)
    assert flat == pytest.approx(comm.collective_time("all-gather", GB, 16, comm.inter_link(H100)))
    assert flat > comm.group_time("all-gather", GB, 16, 1, cluster)


def test_a_missing_network_figure_is_refused_not_guessed():
    """An RTX 4090 preset gives no network bandwidth: two of them on two hosts cannot be timed."""
    card = resolve_hardware("rtx-4090").spec
    assert card.inter_node_gbps is None
    with pytest.raises(LmcalcError, match="no inter-node"):
        comm.group_time("all-reduce", GB, 2, 1, on(card, 2, per_node=1))


def test_the_h800_network_is_eight_400g_nics_per_node():
    """DeepSeek-V3 §3.1: H800 nodes with 8 × 400 Gb/s InfiniBand; the preset says 50 GB/s per GPU."""
    h800 = resolve_hardware("h800").spec
    assert h800.inter_node_gbps == 50
    assert comm.inter_link(h800).bandwidth == pytest.approx(
        (h800.inter_node_busbw_gbps or 50 * comm.NETWORK_RING_EFFICIENCY) * GB
    )


def test_a_scale_up_domain_larger_than_a_node_stays_on_nvlink():
    """GB200 NVL72: 4 GPUs to a tray, 72 on one NVLink domain; a group of 64 is intra-domain."""
    gb200 = resolve_hardware("gb200").spec
    assert gb200.scale_up_gpus == 72
    t = comm.group_time("all-reduce", GB, 64, 1, on(gb200, 64, per_node=4))
    assert t == pytest.approx(comm.collective_time("all-reduce", GB, 64, comm.intra_link(gb200)))


def test_ring_factors_are_nccl_tests_bus_bandwidth_factors():
    """nccl-tests PERFORMANCE.md: all-reduce 2(n−1)/n, the others (n−1)/n, point to point 1."""
    assert comm.ring_factor("all-reduce", 8) == pytest.approx(2 * 7 / 8)
    for op in ("all-gather", "reduce-scatter", "all-to-all"):
        assert comm.ring_factor(op, 8) == pytest.approx(7 / 8)
    assert comm.ring_factor("p2p", 2) == 1
    assert math.isclose(comm.collective_time("all-reduce", GB, 1, comm.intra_link(H100)), 0.0)
