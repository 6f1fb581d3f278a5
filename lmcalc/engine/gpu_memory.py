"""Memory of one GPU in a training step, for any parallel layout: the one memory engine of lmcalc.

A GPU of pipeline stage i holds its share of the model states (``engine.sharding``: TP splits the
matrices, PP the layers, EP the experts, ZeRO shards the states over the data-parallel replicas), the
activations of the micro-batches its stage holds in flight (``engine.pipeline.held_in_flight``), ZeRO-3's
gathered layers, and what the workload's framework profile adds: its buffers, transient peaks, the caching
allocator's fragmentation and the CUDA context (or, for the idealised profile, a flat allowance). A single GPU
training the whole model is the trivial layout, ``Layout()``.

Activations follow Korthikanti et al. 2022: tensors inside attention and the MLP are split by the
tensor-parallel degree t (eq. 2); the norm inputs, dropout masks and linear inputs are split too only
with sequence parallelism (eq. 4); context parallelism splits the sequence. Under 1F1B the first
pipeline stage holds p micro-batches in flight, each through L/p layers (eq. 5); under the interleaved
schedule every stage's count follows Megatron-LM's schedule chunk by chunk, which on the first stage is
Korthikanti et al.'s 1 + (p − 1)/(p·v) times as much.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Literal

from lmcalc.engine.activations import (
    SavedTensor,
    layer_checkpoint,
    layer_kept_tensors,
    model_saved_tensors,
    norm_keeps,
)
from lmcalc.engine.layout import ActivationLayout, Layout
from lmcalc.engine.pipeline import StageLayers, distinct_stages, held_in_flight, stage_chunk_mixes, stage_layers
from lmcalc.engine.sharding import StageParams, sharded_state_bytes, stage_params, zero_shards
from lmcalc.engine.states import optimizer_bytes_per_param
from lmcalc.engine.workload import Workload

Verdict = Literal["fits", "tight", "does not fit"]


@dataclass(frozen=True)
class GpuMemory:
    """The parts of one GPU's memory during a training step, as the workload's framework profile allocates them.

    The allocated peak is the larger of two moments: during the forward and backward passes (the persistent parts,
    the activations held, and the loss's or a layer's backward transient) and at the end of the step, once the
    activations are freed (the persistent parts and what the step itself makes). The caching allocator reserves
    more than it hands out (``fragmentation``); the CUDA context lies outside its pool; the flat ``overhead``
    allowance is the idealised profile's stand-in for all of these.
    """

    stage: int
    params: float
    grads: float
    master: float
    optimizer: float
    activations: float
    zero3_buffers: float  # ZeRO-3/FSDP: gathered layers, a layer's reduce-scatter, a head kept gathered
    overhead: float  # the flat allowance
    micro_batches_in_flight: float  # at the stage's busiest moment, in passes through all its layers
    activations_outside: float  # of the activations, the bytes outside the layers
    activations_rebuilt: float  # of the activations, the layer full recomputation rebuilds in the backward pass
    grad_buckets: float = 0.0  # DDP's second copy of the gradients
    buffers: float = 0.0  # sequence-parallel and pipeline buffers, the reduce bucket, cuBLAS/NCCL workspaces
    backward_transient: float = 0.0  # the loss's logit-sized tensors or a layer's activation gradients, at most
    step_transient: float = 0.0  # at the end of the step: 16-bit gradients, optimizer temporaries, fp32 copies
    fragmentation: float = 0.0  # reserved beyond allocated
    context: float = 0.0  # the CUDA context, outside PyTorch's pool

    @property
    def states(self) -> float:
        return self.params + self.grads + self.master + self.optimizer

    @property
    def framework_buffers(self) -> float:
        return self.zero3_buffers + self.grad_buckets + self.buffers

    @property
    def transient(self) -> float:
        """What the busier moment adds to the persistent parts beyond the activations held."""
        return max(self.activations + self.backward_transient, self.step_transient) - self.activations

    @property
    def allocated(self) -> float:
        """The most PyTorch's allocator hands out at once: persistent parts plus the busier moment."""
        return self.states + self.framework_buffers + self.activations + self.transient

    @property
    def reserved(self) -> float:
        """What PyTorch's caching allocator holds at the peak (``torch.cuda.max_memory_reserved``)."""
        return self.allocated + self.fragmentation

    @property
    def total(self) -> float:
        """The device memory the step needs: reserved, the CUDA context, and the flat allowance."""
        return self.reserved + self.context + self.overhead

    @property
    def parts(self) -> dict[str, float]:
        return {
            "model states": self.states,
            "activations": self.activations,
            "framework buffers": self.framework_buffers,
            "transient peaks": self.transient,
            "fragmentation and CUDA context": self.fragmentation + self.context,
            "overhead": self.overhead,
        }

    @property
    def binding(self) -> tuple[str, float]:
        """The largest part of the total, and its bytes: what binds when the GPU is full."""
        parts = self.parts
        biggest = max(parts, key=parts.__getitem__)
        return biggest, parts[biggest]

    def verdict(self, capacity: float) -> Verdict:
        """``fits`` when the whole (reserved, context, allowance) is within ``capacity``; ``tight`` when only the
        allocator's fragmentation overflows it, so that how the allocator fragments decides; else ``does not fit``."""
        if self.total <= capacity:
            return "fits"
        return "tight" if self.total - self.fragmentation <= capacity else "does not fit"


def split_by_tp(tensor: SavedTensor, layout: Layout | ActivationLayout) -> bool:
    """TP splits attention/MLP internals always, the rest of a layer's tensors only under SP."""
    return tensor.split == "tp" or (tensor.split == "seq" and layout.sequence_parallel)


def bytes_on_gpu(tensor: SavedTensor, layout: Layout | ActivationLayout) -> float:
    """Bytes of ``tensor`` on one GPU: split by TP (``split_by_tp``, over at most the KV heads for K and V:
    ``SavedTensor.tp_ways``) and by CP over the sequence."""
    return tensor.bytes / (layout.cp * (tensor.tp_ways(layout.tp) if split_by_tp(tensor, layout) else 1))


@dataclass(frozen=True)
class StageActivations:
    total: float  # bytes at the stage's busiest moment
    in_flight: float  # micro-batches in flight then, counted in passes through all the stage's layers
    outside: float  # of the total, the bytes outside the layers (embedding side, head side)
    rebuilt: float  # of the total, the one layer full recomputation rebuilds


@functools.lru_cache(maxsize=1 << 14)
def layer_bytes(w: Workload, tp: int, sequence_parallel: bool, cp: int, moe_layer: bool) -> float:
    """Bytes one layer keeps on one GPU whose tensors TP (with or without SP) and CP split."""
    layout = Layout(tp=tp, cp=cp, sequence_parallel=sequence_parallel)
    return sum(bytes_on_gpu(t, layout) for t in layer_kept_tensors(w, moe_layer))


def stage_activations(w: Workload, layout: Layout, stage: int) -> StageActivations:
    """Activation bytes on one GPU of ``stage`` at its busiest, and the micro-batches it holds in flight then."""
    return _stage_activations(w, layout.activation_layout, stage)


@functools.lru_cache(maxsize=1 << 16)  # the planner's layouts share them across DP, EP and ZeRO
def _stage_activations(w: Workload, layout: ActivationLayout, stage: int) -> StageActivations:

    def one_layer(moe_layer: bool) -> float:
        return layer_bytes(w, layout.tp, layout.sequence_parallel, layout.cp, moe_layer)

    chunks = stage_chunk_mixes(w.model, layout)[stage]
    rebuilt = 0.0
    if w.recompute == "full":
        checkpoint = bytes_on_gpu(layer_checkpoint(w), layout)
        layers = [(dense + moe) * checkpoint for dense, moe in chunks]
        built = stage_layers(w.model, layout, stage)
        rebuilt = max(one_layer(False) if built.dense else 0.0, one_layer(True) if built.moe else 0.0)
        if norm_keeps(w) == "input":
            rebuilt -= checkpoint  # the rebuilt layer's first norm keeps the checkpointed input, already counted
    else:
        layers = [dense * one_layer(False) + (moe * one_layer(True) if moe else 0.0) for dense, moe in chunks]
    embedding_side, head_side = stage_outside_bytes(w, layout, stage)
    per_chunk = [*layers]
    per_chunk[0] += embedding_side  # the first chunk of the first stage begins with the embedding
    per_chunk[-1] += head_side  # the last chunk of the last stage ends with the head
    held, counts = held_in_flight(layout, stage, tuple(per_chunk))
    outside = counts[0] * embedding_side + counts[-1] * head_side
    per_micro_batch = sum(layers)
    in_flight = (held - outside) / per_micro_batch if per_micro_batch else float(counts[0])
    return StageActivations(held + rebuilt, in_flight, outside, rebuilt)


def stage_outside_bytes(w: Workload, layout: Layout | ActivationLayout, stage: int) -> tuple[float, float]:
    """Saved bytes outside the layers that one micro-batch leaves on ``stage``: (the embedding side, the head
    side). Token ids and embedding dropout belong to the first stage; the final norm, head input and logits
    to the last; rotary tables, where the framework keeps them, to every stage's first layer."""
    embedding = head = 0.0
    for tensor in model_saved_tensors(w):
        if tensor.block == "tables" or (tensor.block == "embedding" and stage == 0):
            embedding += bytes_on_gpu(tensor, layout)
        elif tensor.block == "head" and stage == layout.pp - 1:
            head += bytes_on_gpu(tensor, layout)
    return embedding, head


def gpu_memory(w: Workload, layout: Layout, stage: int) -> GpuMemory:
    """Every part of one GPU's memory on pipeline stage ``stage``, as the workload's framework allocates it."""
    held = stage_params(w, layout, stage)
    precision, rules = w.precision, w.framework
    activations = stage_activations(w, layout, stage)
    built = stage_layers(w.model, layout, stage)
    replicated = layout.data_replicas > 1
    grad_bytes = rules.states.grad_bytes or precision.grad_bytes
    zero3 = 0.0
    if zero_shards("params", layout.zero) and replicated:
        per_layer = held.total / max(1, built.layers)
        zero3 = per_layer * (rules.buffers.gathered_layers * precision.param_bytes + rules.buffers.reduce_scatter_bytes)
        if rules.buffers.head_gathered and built.head:
            zero3 += w.model.vocab_size * w.model.hidden_size / layout.tp * precision.param_bytes
    optimizer = sharded_state_bytes(
        optimizer_bytes_per_param(w.model, precision, w.optimizer), "optimizer", held, layout
    )
    params = sharded_state_bytes(precision.param_bytes, "params", held, layout)
    if rules.states.weights == "master_only":
        params = 0.0  # only the master copy persists; the 16-bit weights are gathered a layer at a time
    grads = sharded_state_bytes(grad_bytes, "grads", held, layout)
    master = sharded_state_bytes(precision.master_bytes, "master", held, layout)
    buckets = 0.0
    if rules.states.ddp_bucket_copy and layout.zero == 0 and replicated:
        buckets = held.total * precision.grad_bytes
    buffers = _buffers(w, layout, replicated)
    backward = _backward_transient(w, layout, built) if rules.transients else 0.0
    step = _step_transient(w, layout, held, optimizer)
    busiest = max(activations.total + backward, step)  # the activations' moment, or the end of the step
    allocated = params + grads + master + optimizer + zero3 + buckets + buffers + busiest
    return GpuMemory(
        stage=stage,
        params=params,
        grads=grads,
        master=master,
        optimizer=optimizer,
        activations=activations.total,
        zero3_buffers=zero3,
        overhead=w.allowance,
        micro_batches_in_flight=activations.in_flight,
        activations_outside=activations.outside,
        activations_rebuilt=activations.rebuilt,
        grad_buckets=buckets,
        buffers=buffers,
        backward_transient=backward,
        step_transient=step,
        fragmentation=rules.allocator.fragmentation * allocated,
        context=rules.allocator.context_bytes,
    )


def _buffers(w: Workload, layout: Layout, replicated: bool) -> float:
    """The framework's buffers: sequence-parallel all-gather buffers of a full-sequence layer input, pipeline
    send/receive tensors of a layer boundary, the data-parallel reduce bucket, cuBLAS and NCCL workspaces."""
    rules, act = w.framework.buffers, w.precision.activation_bytes
    layer_input = w.tokens * w.model.hidden_size * act / layout.cp
    total = rules.workspace_bytes
    if layout.sequence_parallel and layout.tp > 1:
        total += rules.sequence_parallel_gather * layer_input
    if layout.pp > 1:
        total += rules.pipeline_tensors * layer_input / (layout.tp if layout.sequence_parallel else 1)
    if replicated:
        total += rules.reduce_bucket_elements * w.precision.grad_bytes
    return total


def _backward_transient(w: Workload, layout: Layout, built: StageLayers) -> float:
    """The most the busiest moment holds beyond the saved tensors: on the last stage, the loss's logit-sized
    tensors (the head's output, upcast copies, the logits' gradients); on every stage, one layer's MLP activation
    gradients during its backward (a gated MLP's two, a GELU MLP's one; a routed layer's for one expert)."""
    spec, act, sb = w.model, w.precision.activation_bytes, w.tokens
    split = layout.tp * layout.cp
    loss = w.framework.loss.transient_bytes * sb * spec.vocab_size / split if built.head else 0.0
    gradients = 1 if spec.ffn_kind == "gelu_mlp" else 2
    layer = gradients * sb * spec.ffn_size * act / split if built.dense else 0.0
    if built.moe and spec.moe:
        moe = spec.moe
        routed = moe.experts_per_token * sb / moe.num_experts * moe.expert_ffn_size
        layer = max(layer, gradients * routed * act / split)
    return max(loss, layer)


def _step_transient(w: Workload, layout: Layout, held: StageParams, optimizer: float) -> float:
    """What the end of the step adds to the persistent parts once the activations are freed: the 16-bit
    gradients a backward makes before they are added into an fp32 buffer, a foreach optimizer's state-sized
    temporary, an fp32 copy of this GPU's share of the gradients."""
    rules, precision = w.framework, w.precision
    total = 0.0
    if rules.states.compute_grads_transient:
        total += held.total * precision.grad_bytes
    if rules.optimizer_step.temporaries == "foreach" and w.optimizer.states:
        total += optimizer / len(w.optimizer.states)
    if rules.optimizer_step.fp32_grad_copy:
        total += sharded_state_bytes(4, "optimizer", held, layout)
    return total


def most_loaded_gpu(w: Workload, layout: Layout) -> GpuMemory:
    """The pipeline stage whose GPUs need the most memory: usually the first, which holds the most
    micro-batches in flight, or the last, which holds the head and the logits; but a lighter first stage
    (uneven stages, or DeepSeek-V3's dense layers) can leave the peak to the next (``distinct_stages``)."""
    return max((gpu_memory(w, layout, s) for s in distinct_stages(w.model, layout)), key=lambda m: m.total)
