"""How an MoE layer's tokens reach their experts' GPUs, and how long one dispatch takes (docs/formulas.md §8.8.1).

* ``alltoall``: NCCL's all-to-all of each token's k copies, one per expert it is routed to, wherever those experts
  sit (Megatron-Core's ``MoEAlltoAllTokenDispatcher`` permutes a copy per (token, expert) before the all-to-all;
  torchtitan's standard dispatcher does the same). Two experts of a token on one GPU get two copies.
* ``deepep`` and ``hybridep``: one copy per GPU that holds at least one of the token's experts, and across nodes one
  per node, which NVLink forwards there to its GPUs (DeepEP's normal kernels: ``get_dispatch_layout`` marks each
  token's ranks, ``is_token_in_rank``, and its RDMA ranks, DeepEP tests/legacy/test_internode.py; NVIDIA's
  HybridEP, hierarchical alike: RDMA between nodes, TMA over NVLink within; both behind Megatron-Core's flex
  dispatcher, ``--moe-token-dispatcher-type flex`` with ``--moe-flex-dispatcher-backend``). DeepSeek-V3's node-limited
  routing (§3.2.2) bounds the nodes a token visits.

Under balanced routing each token's k experts are k of the E + Z (zero-computation experts, never sent) drawn
without replacement, so a GPU holding ``g`` of them receives none with probability C(E + Z − g, k) / C(E + Z, k),
and a token goes to N · (1 − that) of N such GPUs (or nodes) on average. Over NVLink a deduplicating dispatch moves
the bytes a GPU receives at the share of the link its kernels reach in their own benchmarks (``NVLINK_EFFICIENCY``);
across nodes the remote copies go over the NICs at the network's bus bandwidth, as NCCL's do (``engine.time.comm``):
DeepEP's and HybridEP's figures over 400 Gb/s RDMA (43 to 58 GB/s) are of that order. How their rates change with the
SMs they are given is not modelled: the constants are taken near Megatron-Core's defaults.
"""

from __future__ import annotations

from typing import NamedTuple

from lmcalc.engine.choices import MoeDispatcher
from lmcalc.engine.time.comm import group_time, intra_link
from lmcalc.specs import Cluster

DEDUPLICATING: tuple[MoeDispatcher, ...] = ("deepep", "hybridep")
"""The dispatchers that send a token once per GPU, and once per node across nodes."""
NVLINK_EFFICIENCY: dict[MoeDispatcher, float] = {"hybridep": 0.538, "deepep": 0.496}
"""The bytes a GPU receives in one dispatch or combine over the seconds it takes, as a share of the NVLink bandwidth
a direction, as the dispatchers' own benchmarks measure it (received bytes over time, through the Torch API). HybridEP:
the median of its 22 BF16 dispatch and combine figures on GB200 (8 to 36 ranks, 16 and 32 SMs) and B200 (8 ranks, 16
SMs) over NVLink 5's 900 GB/s, 0.46 to 0.63 (DeepEP docs/README_Hybrid-EP.md; tests/test_hybrid_ep.py: the
dispatched tokens' bytes over the time). DeepEP: the median of its BF16 figures at 24 SMs on GB200 over 900 GB/s (8,
16 and 24 ranks, in the same README: 0.18 to 0.57) and of DeepEP V1's on H800 over its 200 GB/s (153 and 158 GB/s:
0.77, 0.79; docs/legacy.md), 8 figures. Megatron-Core gives DeepEP 20 SMs by default and HybridEP the flex
dispatcher's 16 (``moe_flex_dispatcher_num_sms``): their kernels, not the links, set these rates, which NCCL's ring
reaches at 0.816 (``comm.NVLINK_RING_EFFICIENCY``)."""


def reached(holders: int, held: float, pool: int, k: float) -> float:
    """Of ``holders`` GPUs (or nodes) that hold ``held`` experts each, how many a token's k experts reach on average:
    ``holders · (1 − C(pool − held, k) / C(pool, k))``, the k drawn without replacement from the ``pool`` of E + Z
    experts, so one of them lands on a given holder with the complement of none of them doing so."""
    if holders <= 1:
        return float(holders)
    none = 1.0
    for i in range(round(k)):
        if pool - held - i <= 0:  # more picks than the experts elsewhere: every holder is reached
            return float(holders)
        none *= (pool - held - i) / (pool - i)
    return holders * (1 - none)


class EpGroup(NamedTuple):
    """The EP group a dispatch runs over: its GPUs (``ep``, ``stride`` ranks apart), the E routed experts spread over
    them, the pool of E + Z a token picks its k from, and the nodes a token may visit (None: any)."""

    ep: int
    stride: int
    experts: int
    pool: int
    k: int
    node_limit: int | None


def dispatch_time(dispatcher: MoeDispatcher, group: EpGroup, token_bytes: float, copies: float, share: float,
                  cluster: Cluster) -> float:  # fmt: skip
    """Seconds of one dispatch (a combine is its mirror) over the EP group. ``token_bytes``: the bytes of this GPU's
    tokens, once each; an all-to-all sends ``copies`` (k·ρ routed rows a token) of them; a deduplicating dispatcher
    sends a token's ``share`` (ρ: a capacity's padding is sent too) to each GPU its experts reach, and across nodes to
    each node, within ``node_limit`` nodes where the router limits them."""
    ep, stride, hardware = group.ep, group.stride, cluster.hardware
    if dispatcher not in DEDUPLICATING:
        return group_time("all-to-all", copies * token_bytes, ep, stride, cluster)
    per_domain = max(1, cluster.scale_up // stride)  # EP ranks one NVLink domain holds
    ranks = reached(ep, group.experts / ep, group.pool, group.k)
    link = intra_link(hardware)  # refused where the preset gives no NVLink bandwidth
    nvlink = NVLINK_EFFICIENCY[dispatcher] * (hardware.intra_node_gbps or 0.0) * 1e9
    received = share * ranks * token_bytes  # a GPU receives a copy of each token that reaches it, its own included
    near = link.latency + received / nvlink
    if ep <= per_domain:  # all over NVLink
        return near
    domains = -(-ep // per_domain)
    held, limit = group.experts / domains, group.node_limit
    if limit and limit < domains:  # the k picked among the experts of the ``limit`` nodes the router chose
        visited = reached(limit, held, round(limit * held), group.k)
    else:
        visited = reached(domains, held, group.pool, group.k)
    remote = group_time("all-to-all", share * visited * token_bytes, ep, stride, cluster)  # the NIC's share: remote
    return max(remote, near)  # RDMA and NVLink run at once (DeepEP's and HybridEP's forwarding)
