"""A step's data-parallel traffic and its optimizer step, for one GPU of a pipeline stage (docs/formulas.md §8.11,
§8.12): the gradients' reduction and ZeRO's gathers over the replicas (within HSDP's groups, then across them), the
optimizer's pass over its share of the states, and what the framework hides of them behind the passes.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

from lmcalc.engine.choices import ZeroStage
from lmcalc.engine.finetune.offload import fetch_seconds, offload_time
from lmcalc.engine.parallel.layout import StateShards
from lmcalc.engine.parallel.pipeline import StageLayers, Stages, split_stage_layers
from lmcalc.engine.parallel.sharding import (
    StageParams,
    frozen_held,
    gathered_to_backward,
    trained_held,
    updated_held,
    zero_shards,
)
from lmcalc.engine.parallel.states import optimizer_bytes_per_param
from lmcalc.engine.time import rates
from lmcalc.engine.time.comm import group_time
from lmcalc.engine.time.microbatch import MicroBatchTime
from lmcalc.engine.time.newton_schulz import orthogonalisation_seconds
from lmcalc.engine.workload import Workload
from lmcalc.framework_specs import SpeedRule
from lmcalc.specs import Cluster

FOREACH_PASSES = 3
"""A multi-tensor (foreach) AdamW step runs its update as separate element-wise kernels over the state lists
(lerp, multiply, add-multiply, square root, divide, add: torch/optim/adamw.py ``_multi_tensor_adamw``), about
three reads and writes of the states where a fused kernel makes one; an estimate, not a measurement."""


class StateTraffic(NamedTuple):
    """Per step, for one GPU of a stage: the data-parallel collectives of its share of the parameters and
    gradients, and its optimizer step. They depend on the stage's parameters and the layout's DP, ZeRO and EP, not
    on the micro-batch."""

    zero3: float  # ZeRO-3, per micro-batch: two all-gathers of the parameters (forward, backward) and a
    # reduce-scatter of the gradients; FSDP's ZeRO-2 (``gathered_to_backward``): one all-gather and the reduce-scatter
    reduce: float  # ZeRO-0/1/2, per step: the gradients' all-reduce (reduce-scatter from ZeRO-2)
    gather: float  # ZeRO-1/2, per step: the all-gather of the updated parameters
    optimizer: float  # the step on the GPU, or offloaded: the gradients down, the weights up, the CPU's step
    fetch: float = 0.0  # parameter offload, per micro-batch: this GPU's weights from the host, forward and backward


@functools.lru_cache(maxsize=1 << 16)
def stage_state_traffic(
    w: Workload, shards: StateShards, cp: int, stages: Stages, machine: rates.Machine
) -> tuple[StateTraffic, ...]:
    """``state_traffic`` of each of the distinct stages of the pipeline (``split_stage_layers``), in their order."""
    return tuple(state_traffic(w, shards, cp, built, machine) for _, built in split_stage_layers(w.model, stages))


@functools.lru_cache(maxsize=1 << 16)
def state_traffic(
    w: Workload, shards: StateShards, cp: int, built: StageLayers, machine: rates.Machine
) -> StateTraffic:
    """The data-parallel traffic and the optimizer step of one GPU of a stage that builds ``built``, its states
    spread as ``shards`` says; its replicas lie TP · CP GPUs apart. Neither the micro-batch nor recomputation
    changes them: the step time asks with ``states_workload``."""
    precision, speed, grad_bytes, cluster = w.precision, w.framework.speed, w.grad_bytes, machine.cluster
    zero = shards.zero
    held = trained_held(w.model, w.method, shards.split, built)  # what has gradients and optimizer states
    frozen = frozen_held(w.model, w.method, precision.param_bytes, shards.split, built)
    params = held.total
    weights = params * precision.param_bytes + frozen.total  # every weight of the stage on this GPU, in bytes
    zero3 = reduce = gather = 0.0
    # the dense states' replicas lie TP·CP GPUs apart, the experts' (EDP) ETP·EP apart: two groups, two collectives.
    # Under HSDP each shards within a group of ``copies`` of them, and ``groups`` such groups, ``copies`` replicas
    # apart, all-reduce their shards of the gradients (PyTorch's HSDP, Megatron's distributed optimizer instances)
    groups = shards.groups
    for trained, frozen_bytes, copies, stride in (
        (held.dense, frozen.dense, shards.shard, shards.tp * cp),
        (held.experts, frozen.experts, shards.expert_shard, shards.etp * shards.ep),
    ):
        if copies * groups == 1 or not trained + frozen_bytes:
            continue
        across, after = (
            _across_groups(
                trained * grad_bytes / copies,
                trained * precision.param_bytes / copies,
                groups,
                stride * copies,
                shards.outer,
                cluster,
            )
            if trained
            else (0.0, 0.0)
        )
        gather += after  # HFSDP's weights, gathered back across the groups after the step
        if zero_shards("params", zero) or gathered_to_backward(w, zero):  # FSDP's ZeRO-2: gathered once, in forward
            flat = speed.zero3_network == "one_nic"
            gathered = group_time("all-gather", trained * precision.param_bytes + frozen_bytes, copies, stride,
                                  cluster, flat)  # fmt: skip
            gathers = 1 if gathered_to_backward(w, zero) else 2
            zero3 += gathers * gathered + group_time("reduce-scatter", trained * grad_bytes, copies, stride, cluster,
                                                     flat)  # fmt: skip
            if speed.hsdp_reduce == "last_micro_batch":  # Megatron-FSDP: once a step, as a bucketed reduction
                reduce += across
            else:
                zero3 += across
        elif trained:
            op = "reduce-scatter" if zero_shards("grads", zero) else "all-reduce"
            reduce += group_time(op, trained * grad_bytes, copies, stride, cluster) + across
            if zero_shards("optimizer", zero):
                gather += group_time("all-gather", trained * precision.param_bytes, copies, stride, cluster)
    fetch = 0.0
    if w.offload.optimizer:
        sharded = zero_shards("optimizer", zero)
        dense_shard, expert_shard = shards.shards_of("optimizer")
        local = held.dense / dense_shard + held.experts / expert_shard if sharded else params
        shard = weights / shards.shard if zero_shards("params", zero) else weights
        gpus_per_host = min(cluster.count, cluster.gpus_per_node)
        optimizer = offload_time(w.offload, local, grad_bytes, precision.param_bytes, gpus_per_host).total
        fetch = fetch_seconds(w.offload, shard)
    else:
        optimizer = _optimizer_seconds(w, shards, updated_held(w, shards.split, built), machine)
    return StateTraffic(zero3, reduce, gather, optimizer, fetch)


def _across_groups(
    grads: float, weights: float, groups: int, stride: int, outer: bool, cluster: Cluster
) -> tuple[float, float]:
    """HSDP's traffic across its ``groups`` (none for one), as (the reduction, the gather after the step): each GPU's
    shard of the gradients (``grads`` bytes) all-reduced with its peers a group apart; under HFSDP, whose optimizer
    updates 1/groups of that shard, reduce-scattered, and the updated weights (``weights`` bytes of the shard)
    all-gathered back after the step (Megatron-FSDP's HFSDP helper buffers, param_and_grad_buffer.py)."""
    if groups == 1:
        return 0.0, 0.0
    if not outer:
        return group_time("all-reduce", grads, groups, stride, cluster), 0.0
    return group_time("reduce-scatter", grads, groups, stride, cluster), group_time(
        "all-gather", weights, groups, stride, cluster)  # fmt: skip


def exposed_traffic(
    traffic: StateTraffic, mb: MicroBatchTime, grad_accum: int, zero: ZeroStage, replicas: int, speed: SpeedRule
) -> tuple[float, float]:
    """The data-parallel and ZeRO communication a stage's step leaves exposed: (DP, ZeRO) seconds. What hides
    depends on the framework: a bucketed reduction behind the last backward pass, a prefetched gather behind the
    next forward pass, ZeRO-3's traffic behind each micro-batch's compute."""
    if replicas == 1:
        return 0.0, 0.0
    hidden = speed.dp_overlap == "always" or speed.dp_overlap == "without_zero" and zero == 0
    dp_time = max(0.0, traffic.reduce - mb.kernels.backward) if hidden else traffic.reduce
    gather = traffic.gather  # once a step: ZeRO-1/2's, or HFSDP's across its groups
    zero_time = max(0.0, gather - mb.kernels.forward) if speed.param_gather_overlap else gather
    if zero_shards("params", zero) or traffic.zero3 > 0:  # ZeRO-3, or FSDP's ZeRO-2: traffic each micro-batch
        comm = traffic.zero3  # (and HSDP's reduction across the groups once a step, where the profile waits for it)
        zero_time += grad_accum * (max(0.0, comm - mb.compute) if speed.param_gather_overlap else comm)
    return dp_time, zero_time


def _optimizer_seconds(w: Workload, shards: StateShards, held: StageParams, machine: rates.Machine) -> float:
    """The optimizer step and gradient clipping over this GPU's share of the states (``held``, sharded as
    ``shards`` says), as memory traffic, and Muon's orthogonalisation of that share's matrices (``newton_schulz``)."""
    precision = w.precision
    sharded = zero_shards("optimizer", shards.zero)
    dense_shard, expert_shard = shards.shards_of("optimizer")
    dense, experts = (held.dense / dense_shard, held.experts / expert_shard) if sharded else (held.dense, held.experts)
    states = optimizer_bytes_per_param(w.model, precision, w.optimizer, w.method)
    per_param = 2 * w.grad_bytes + 2 * (precision.master_bytes + states) + precision.param_bytes
    passes = FOREACH_PASSES if w.framework.optimizer_step.temporaries == "foreach" else 1
    traffic = rates.memory_seconds(machine.hardware, (dense + experts) * per_param * passes, 4 * passes,
                                   machine.calibration)  # fmt: skip
    steps = w.optimizer.newton_schulz_steps
    return traffic + orthogonalisation_seconds(w.model, w.method, steps, machine, dense, experts)
