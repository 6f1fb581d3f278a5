"""HSDP, hybrid sharding (``--hsdp N``): ZeRO shards each state within a group of DP·CP / N replicas, and the N groups
hold copies, all-reducing each GPU's shard of the gradients across them. PyTorch's FSDP2 on a 2-D mesh (torchtitan's
``data_parallel_replicate_degree``) and Megatron-Core's distributed optimizer instances
(``--num-distributed-optimizer-instances``; at d98e8a64 param_and_grad_buffer.py reduce-scatters each bucket within an
instance, then all-reduces the GPU's shard of it across instances) run it so.

The sharding is checked against FSDP2 itself on the CPU (four gloo ranks on a 2 × 2 mesh); the memory and the traffic
by hand from Llama 3.1 8B's count (8,030,261,248 parameters, 32 layers; HF meta-llama/Llama-3.1-8B) on two nodes of
8 H100.
"""

from __future__ import annotations

import math
import socket

import pytest

import lmcalc
from lmcalc.engine.parallel.layout import Layout
from lmcalc.engine.parallel.pipeline import StageLayers
from lmcalc.engine.time.comm import INTER_NODE_LATENCY_S, INTER_NODE_STEP_S, group_time, inter_link
from lmcalc.engine.time.rates import Machine
from lmcalc.engine.time.state_traffic import state_traffic
from lmcalc.engine.workload import Workload
from lmcalc.errors import LmcalcError
from lmcalc.presets import framework_profile, parse_cluster, resolve_model, resolve_optimizer, resolve_precision

N, LAYERS = 8_030_261_248, 32
SETTINGS = {"model": "llama-3.1-8b", "gpus": "16xH100", "seq": 4096, "framework": "torchtitan", "dp": 16}


def _local_shard_numels(rank: int, port: int, out) -> None:  # runs in each of four processes
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=4)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256, bias=False), nn.Linear(256, 64, bias=False))
    fully_shard(model, mesh=mesh)  # a 2-D mesh: replicate over the first dimension, shard over the second
    out.put((rank, sum(p.to_local().numel() for p in model.parameters())))
    dist.destroy_process_group()


@pytest.mark.torch
def test_fsdp2_on_a_two_by_two_mesh_shards_each_weight_over_two_gpus_not_four():
    pytest.importorskip("torch")
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_local_shard_numels, args=(rank, port, out)) for rank in range(4)]
    for p in procs:
        p.start()
    held = dict(out.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    params = 2 * 64 * 256
    assert held == {rank: params // 2 for rank in range(4)}  # what lmcalc holds: the states / (DP·CP / groups)
    sharded = lmcalc.memory(zero=3, hsdp=2, model="llama-3.1-8b", gpus="4xH100", seq=1024, framework="torchtitan")
    assert sharded.gpu.master == 4 * N / 2


def test_each_state_is_sharded_over_one_group_of_replicas():
    flat, hybrid = lmcalc.memory(zero=3, **SETTINGS).gpu, lmcalc.memory(zero=3, hsdp=2, **SETTINGS).gpu
    assert (flat.grads, flat.master, flat.optimizer) == (4 * N / 16, 4 * N / 16, 8 * N / 16)  # fp32, over 16 GPUs
    assert (hybrid.grads, hybrid.master, hybrid.optimizer) == (4 * N / 8, 4 * N / 8, 8 * N / 8)  # over a node's 8
    assert hybrid.params == flat.params == 0  # ZeRO-3: only the master shard persists
    more = (4 + 4 + 8) * N * (1 / 8 - 1 / 16)  # the fp32 gradients, master and moments: twice the share
    assert hybrid.total - flat.total == pytest.approx(more * (1 + flat.allocator.fragmentation))


def _workload(framework: str) -> Workload:
    model = resolve_model("llama-3.1-8b").spec
    return Workload(model, resolve_precision("bf16-mixed").spec, resolve_optimizer("adamw").spec, 4096, 1, "flash",
                    "full", framework=framework_profile(framework))  # fmt: skip


def test_the_groups_all_reduce_their_shard_of_the_gradients_across_the_nodes():
    cluster, built = parse_cluster("16xH100"), StageLayers(LAYERS, 0, True, True)
    traffic = state_traffic(_workload("torchtitan"), Layout(dp=16, zero=3, hsdp=2).state_shards, 1, built,
                            Machine(cluster))  # fmt: skip
    # within a node: each layer's bf16 weights gathered for forward and again for backward, the fp32 gradients
    # reduce-scattered; then one member of each of the two nodes all-reduces its eighth of the gradients, 4·N/8
    # bytes, over the network: a tree of ⌈log₂ 2⌉ = 1 level (2 steps), 2·(2 − 1)/2 = 1 of the bytes each way
    gather = group_time("all-gather", N * 2, 8, 1, cluster)
    scatter = group_time("reduce-scatter", N * 4, 8, 1, cluster)
    across = INTER_NODE_LATENCY_S + 2 * INTER_NODE_STEP_S + 1 * (4 * N / 8) / inter_link(cluster.hardware).bandwidth
    assert traffic.zero3 == pytest.approx(2 * gather + scatter + across, rel=1e-12)
    # against flat ZeRO-3 over 16 GPUs on two nodes, hierarchical: the network carries 1/8 of each collective
    flat = state_traffic(_workload("torchtitan"), Layout(dp=16, zero=3).state_shards, 1, built, Machine(cluster))
    assert flat.zero3 > traffic.zero3


def test_megatron_instances_reduce_within_and_all_reduce_their_shard_across():
    # ZeRO-1 reduces as lmcalc's ZeRO 0-2 rule has it (docs/formulas.md §8: an all-reduce within the group), then
    # each GPU all-reduces the eighth of the gradients its optimizer updates with its peer in the other node
    cluster, built = parse_cluster("16xH100"), StageLayers(LAYERS, 0, True, True)
    w = _workload("megatron")
    traffic = state_traffic(w, Layout(dp=16, zero=1, hsdp=2).state_shards, 1, built, Machine(cluster))
    grads = w.grad_bytes * N
    across = INTER_NODE_LATENCY_S + 2 * math.ceil(math.log2(2)) * INTER_NODE_STEP_S + grads / 8 / inter_link(
        cluster.hardware).bandwidth  # fmt: skip
    assert traffic.reduce == pytest.approx(group_time("all-reduce", grads, 8, 1, cluster) + across, rel=1e-12)
    assert traffic.gather == pytest.approx(group_time("all-gather", 2 * N, 8, 1, cluster), rel=1e-12)
    assert traffic.zero3 == 0.0


def test_megatron_fsdp_reduces_across_the_groups_once_a_step():
    # megatron_fsdp.py (d98e8a64) reduce-scatters within the group in every backward and passes
    # outer_fsdp_group_grad_reduce only when is_last_microbatch: the groups' all-reduce is a step's, not a micro-batch's
    cluster, built = parse_cluster("16xH100"), StageLayers(LAYERS, 0, True, True)
    w = _workload("megatron")
    traffic = state_traffic(w, Layout(dp=16, zero=3, hsdp=2).state_shards, 1, built, Machine(cluster))
    grads = w.grad_bytes * N
    across = INTER_NODE_LATENCY_S + 2 * INTER_NODE_STEP_S + grads / 8 / inter_link(cluster.hardware).bandwidth
    assert traffic.reduce == pytest.approx(across, rel=1e-12)
    gather, scatter = group_time("all-gather", N * 2, 8, 1, cluster), group_time("reduce-scatter", grads, 8, 1, cluster)
    assert traffic.zero3 == pytest.approx(2 * gather + scatter, rel=1e-12)
    # torchtitan's FSDP2 all-reduces in every backward: the same bytes, charged each of the step's micro-batches
    fsdp2 = state_traffic(_workload("torchtitan"), Layout(dp=16, zero=3, hsdp=2).state_shards, 1, built,
                          Machine(cluster))  # fmt: skip
    assert fsdp2.reduce == 0.0 and fsdp2.zero3 > traffic.zero3


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"zero": 0, "hsdp": 2}, r"hsdp 2 needs a ZeRO stage"),
        ({"zero": 3, "hsdp": 16}, r"hsdp 16 must split DP·CP = 16 into groups of two or more GPUs"),
        ({"zero": 3, "hsdp": 3}, r"hsdp 3 must split DP·CP = 16"),
        ({"zero": 3, "hsdp": 0}, r"hsdp must be a positive integer, got 0"),
    ],
)
def test_groups_that_cannot_shard_are_refused(settings, message):
    with pytest.raises(LmcalcError, match=message):
        lmcalc.memory(**SETTINGS, **settings)


def test_the_layout_says_hsdp_and_the_terms_say_within_each_group():
    estimate = lmcalc.memory(zero=3, hsdp=2, **SETTINGS)
    assert "HSDP=2" in estimate.layout.label
    assert "within each of HSDP's 2 groups" in estimate.report.term("state.master").formula


def test_hfsdp_shards_the_optimizer_over_every_group_and_the_rest_within_one():
    # Megatron-FSDP's outer_dp_sharding_strategy optim (param_and_grad_buffer.py at d98e8a64, the HFSDP helper
    # buffers): the weights and gradients sharded within a group of 8, the fp32 master copy and the moments over all 16
    megatron = {**SETTINGS, "framework": "megatron"}
    hsdp = lmcalc.memory(zero=3, hsdp=2, **megatron)
    hfsdp = lmcalc.memory(zero=3, hsdp=2, hsdp_shard_optimizer=True, **megatron)
    assert (hfsdp.gpu.master, hfsdp.gpu.optimizer) == (4 * N / 16, 8 * N / 16)
    assert (hsdp.gpu.master, hsdp.gpu.optimizer) == (4 * N / 8, 8 * N / 8)
    assert (hfsdp.gpu.params, hfsdp.gpu.grads) == (hsdp.gpu.params, hsdp.gpu.grads)
    assert "HSDP=2 (optimizer over all)" in hfsdp.layout.label
    assert "across HSDP's 2 groups" in hfsdp.report.term("state.optimizer").formula
    assert "within each of HSDP's 2 groups" in hfsdp.report.term("state.grads").formula


def test_hfsdp_reduce_scatters_across_the_groups_and_gathers_the_weights_back():
    # each GPU's eighth of the gradients reduce-scattered with its peer in the other node (one ring step: half of the
    # bytes each way), and after the step the peer's half of the updated bf16 weights gathered back
    cluster, built = parse_cluster("16xH100"), StageLayers(LAYERS, 0, True, True)
    w = _workload("megatron")
    shards = Layout(dp=16, zero=3, hsdp=2, hsdp_shard_optimizer=True).state_shards
    traffic = state_traffic(w, shards, 1, built, Machine(cluster))
    bandwidth = inter_link(cluster.hardware).bandwidth
    one_step = INTER_NODE_LATENCY_S + 1 * INTER_NODE_STEP_S  # a ring of two: one step
    assert traffic.reduce == pytest.approx(one_step + (1 / 2) * (w.grad_bytes * N / 8) / bandwidth, rel=1e-12)
    assert traffic.gather == pytest.approx(one_step + (1 / 2) * (2 * N / 8) / bandwidth, rel=1e-12)
    # the optimizer's step runs over a sixteenth of the states, where HSDP's runs over an eighth
    plain = state_traffic(w, Layout(dp=16, zero=3, hsdp=2).state_shards, 1, built, Machine(cluster))
    assert traffic.optimizer < plain.optimizer


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"zero": 3, "framework": "megatron"}, r"hsdp.shard.optimizer shards the optimizer across HSDP's groups"),
        ({"zero": 1, "hsdp": 2, "framework": "megatron"}, r"needs (--)?zero 3 within each group"),
        ({"zero": 3, "hsdp": 2}, r"torchtitan.* replicates every state across HSDP's groups"),
    ],
)
def test_hfsdp_needs_groups_zero3_and_a_framework_that_has_it(settings, message):
    with pytest.raises(LmcalcError, match=message):
        lmcalc.memory(**{**SETTINGS, **settings, "hsdp_shard_optimizer": True})
