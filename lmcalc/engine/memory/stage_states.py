"""The model states one GPU of a pipeline stage keeps, and the framework's buffers beside them (``gpu_memory`` adds
the activations and the step's phases to these).

The states follow ``engine.parallel.sharding``: TP splits the matrices, PP the layers, EP the experts, ZeRO shards
the states over the data-parallel replicas (DP · CP); the framework profile decides the gradients' bytes, whether
only the master copy persists (FSDP2), DDP's second copy of the gradients, ZeRO-3's gathered layers, Megatron-FSDP's
gradient buckets in flight (``fsdp_buffers``), what the optimizer step makes at the end of the step, and its buffers
(sequence-parallel and pipeline tensors, the reduce bucket, cuBLAS's workspaces). Neither the micro-batch nor
recomputation changes any of them.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

from lmcalc.engine.finetune.method import FULL, dora_temporaries, largest_quantised
from lmcalc.engine.finetune.offload import FP32_GRAD_COPY
from lmcalc.engine.memory.fp8_storage import te_fp8, weight_copy_bytes
from lmcalc.engine.memory.fsdp_buffers import NO_QUEUE, GradQueue, gathered, gradient_queue, megatron_fsdp
from lmcalc.engine.parallel.layout import Layout, StateShards
from lmcalc.engine.parallel.pipeline import StageLayers, Stages, split_stage_layers
from lmcalc.engine.parallel.sharding import (
    StageParams,
    frozen_held,
    gathered_to_backward,
    sharded_state_bytes,
    trained_held,
    trained_precision,
    updated_held,
    zero_shards,
)
from lmcalc.engine.parallel.states import optimizer_bytes_per_param
from lmcalc.engine.workload import Workload


class StageStates(NamedTuple):
    """What one GPU of a stage keeps of the model states, and what ZeRO-3, DDP and the optimizer step add around
    them: bytes that depend on the model, the precision, the optimizer, the framework and how TP, EP and ZeRO share
    the stage's parameters, not on the micro-batch or the pipeline's schedule."""

    params: float
    grads: float
    master: float
    optimizer: float
    zero3: float  # ZeRO-3/FSDP: gathered layers, a layer's reduce-scatter, a head kept gathered
    buckets: float  # DDP's second copy of the gradients
    step_transient: float  # at the end of the step
    offloaded: float = 0.0  # kept off the GPU: in host memory or on NVMe (``engine.finetune.offload``)
    queue: GradQueue = NO_QUEUE  # Megatron-FSDP's unsharded gradient buckets in the backward (``fsdp_buffers``)
    fp8_weights: float = 0.0  # an fp8 recipe's quantised copies of the layers' weights (``fp8_storage``)


@functools.lru_cache(maxsize=1 << 16)
def layout_states(w: Workload, shards: StateShards, stages: Stages) -> tuple[StageStates, ...]:
    """``stage_states`` of each of the distinct stages of the pipeline (``split_stage_layers``), in their order."""
    return tuple(stage_states(w, shards, built) for _, built in split_stage_layers(w.model, stages))


@functools.lru_cache(maxsize=1 << 16)
def stage_states(w: Workload, shards: StateShards, built: StageLayers) -> StageStates:
    """The model states of one GPU of a stage that builds ``built``, with TP and EP splitting its weights and ZeRO
    sharding them over the data-parallel replicas (DP · CP): ``shards``. Neither the micro-batch nor
    recomputation changes them: the planner asks with ``states_workload``, which every micro-batch and mode
    share."""
    model, optimizer, rules, method = w.model, w.optimizer, w.framework, w.method
    precision = trained_precision(w)  # the trained weights' (PEFT's fp32 adapters over a 16-bit model)
    tp, zero, replicas, split = shards.tp, shards.zero, shards.replicas, shards.split
    held = trained_held(model, method, split, built)  # every parameter, unless the method freezes some
    frozen = frozen_held(model, method, w.precision.param_bytes, split, built)  # bytes of the frozen ones
    updated = updated_held(w, split, built)  # the trained ones a step gives gradients to, and the optimizer states
    replicated = replicas > 1
    grad_bytes = rules.states.grad_bytes or precision.grad_bytes
    zero3, fsdp = 0.0, megatron_fsdp(w, shards)
    if zero_shards("params", zero) and fsdp:
        zero3 = gathered(w, shards, built).total
    elif zero_shards("params", zero) and (replicated or w.offload.params):  # offloaded weights are gathered too
        per_layer = (held.total * precision.param_bytes + frozen.total) / max(1, built.layers)
        zero3 = per_layer * rules.buffers.gathered_layers + held.total / max(1, built.layers) * (
            rules.buffers.reduce_scatter_bytes
        )
        if rules.buffers.head_gathered and built.head:
            zero3 += model.vocab_size * model.hidden_size / tp * w.precision.param_bytes
    per_param = optimizer_bytes_per_param(model, precision, optimizer, method)
    optimizer_states = sharded_state_bytes(per_param, "optimizer", updated, shards)
    params = sharded_state_bytes(precision.param_bytes, "params", held, shards)
    params += sharded_state_bytes(1.0, "params", frozen, shards)
    if gathered_to_backward(w, zero):  # the 16-bit weights whole at the backward's start; a layer reduce-scattered
        zero3 = held.total / max(1, built.layers) * rules.buffers.reduce_scatter_bytes if replicated else 0.0
    elif rules.states.weights == "master_only":
        params = 0.0  # only the master copy persists; the 16-bit weights are gathered a layer at a time
    grads = sharded_state_bytes(grad_bytes, "grads", updated, shards)
    master = sharded_state_bytes(precision.master_bytes, "master", held, shards)
    buckets = 0.0
    if rules.states.ddp_bucket_copy and zero == 0 and replicated:
        buckets = held.total * precision.grad_bytes
    step = _step_transient(w, updated, optimizer_states, shards)
    offloaded = 0.0
    if w.offload.optimizer:  # the optimizer step runs on the CPU, over an fp32 copy of the gradients
        fp32_grads = sharded_state_bytes(FP32_GRAD_COPY, "optimizer", updated, shards)
        offloaded = master + optimizer_states + fp32_grads
        master = optimizer_states = step = 0.0
    if w.offload.params:
        offloaded += params + grads
        params = grads = 0.0
    queue = gradient_queue(w, shards, built, grad_bytes) if fsdp else NO_QUEUE
    fp8 = te_fp8(w)
    copies = 0.0
    if fp8 is not None:  # the layers' weights on the GPU, as TP and EP split them (ZeRO-3's gathered ones aside)
        layers = trained_held(model, FULL, split, StageLayers(built.dense, built.moe, False, False))
        if rules.fp8.primary_weights:  # the quantised weight is the weight, sharded as the weights are
            params -= sharded_state_bytes(w.precision.param_bytes, "params", layers, shards)
            copies = sharded_state_bytes(weight_copy_bytes(fp8), "params", layers, shards)
        else:  # a copy of each weight, quantised whole from the bf16 one
            copies = layers.total * weight_copy_bytes(fp8)
    return StageStates(params, grads, master, optimizer_states, zero3, buckets, step, offloaded, queue, copies)


def layout_buffers(w: Workload, layout: Layout) -> float:
    return _buffers(w, layout.tp, layout.sequence_parallel, layout.cp, layout.pp, layout.data_replicas > 1)


@functools.lru_cache(maxsize=1 << 12)
def _buffers(w: Workload, tp: int, sequence_parallel: bool, cp: int, pp: int, replicated: bool) -> float:
    """The framework's buffers: sequence-parallel all-gather buffers of a full-sequence layer input, pipeline
    send/receive tensors of a layer boundary, the data-parallel reduce bucket, cuBLAS and NCCL workspaces; under
    QLoRA the largest 4-bit weight dequantised into the compute dtype (bitsandbytes' MatMul4Bit backward); under
    DoRA the weight-sized temporaries of one module's norm."""
    rules, act = w.framework.buffers, w.precision.activation_bytes
    layer_input = w.tokens * w.model.hidden_size * act / cp
    total = rules.workspace_bytes
    if sequence_parallel and tp > 1:
        total += rules.sequence_parallel_gather * layer_input
    if pp > 1:
        total += rules.pipeline_tensors * layer_input / (tp if sequence_parallel else 1)
    if replicated:
        total += rules.reduce_bucket_elements * w.precision.grad_bytes
    if w.method.kind == "qlora":  # one 4-bit weight dequantised at a time into the compute dtype, for its backward
        total += largest_quantised(w.model) / tp * w.precision.activation_bytes
    if (
        w.method.dora
    ):  # one adapted module's weight norm at a time: the identity, B·A and W + s·B·A (engine.finetune.method)
        total += dora_temporaries(w.model, w.method) * w.precision.activation_bytes
    return total


def _step_transient(w: Workload, held: StageParams, optimizer_bytes: float, shards: StateShards) -> float:
    """What the end of the step adds to the persistent parts once the activations are freed: the 16-bit
    gradients a backward makes before they are added into an fp32 buffer, a foreach optimizer's state-sized
    temporary, an fp32 copy of this GPU's share of the gradients."""
    rules, precision, optimizer = w.framework, trained_precision(w), w.optimizer
    total = 0.0
    if rules.states.compute_grads_transient:
        total += held.total * precision.grad_bytes
    if rules.optimizer_step.temporaries == "foreach" and optimizer.states:
        total += optimizer_bytes / len(optimizer.states)
    if rules.optimizer_step.fp32_grad_copy:
        total += sharded_state_bytes(4, "optimizer", held, shards)
    return total
