"""Memory of one GPU in a training step, for any parallel layout: the one memory engine of lmcalc.

A GPU of pipeline stage i holds its share of the model states (``engine.sharding``: TP splits the
matrices, PP the layers, EP the experts, ZeRO shards the states over the data-parallel replicas), the
activations of the micro-batches its stage holds in flight (``engine.pipeline.held_in_flight``), ZeRO-3's
gathered layers, and an overhead allowance. A single GPU training the whole model is the trivial layout,
``Layout()``.

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

from lmcalc.engine.activations import (
    SavedTensor,
    layer_checkpoint,
    layer_kept_tensors,
    model_saved_tensors,
)
from lmcalc.engine.layout import ActivationLayout, Layout
from lmcalc.engine.pipeline import distinct_stages, held_in_flight, stage_chunk_mixes, stage_layers
from lmcalc.engine.sharding import sharded_state_bytes, stage_params, zero_shards
from lmcalc.engine.states import optimizer_bytes_per_param
from lmcalc.engine.workload import Workload

GATHERED_LAYERS = 2
"""ZeRO-3 gathers a layer's full parameters before using it and prefetches the next one (FSDP's
forward prefetch, DeepSpeed's prefetch bucket): two layers' parameters at once."""


@dataclass(frozen=True)
class GpuMemory:
    """The parts of one GPU's memory during a training step."""

    stage: int
    params: float
    grads: float
    master: float
    optimizer: float
    activations: float
    zero3_buffers: float
    overhead: float
    micro_batches_in_flight: float  # at the stage's busiest moment, in passes through all its layers
    activations_outside: float  # of the activations, the bytes outside the layers
    activations_rebuilt: float  # of the activations, the layer full recomputation rebuilds in the backward pass

    @property
    def states(self) -> float:
        return self.params + self.grads + self.master + self.optimizer

    @property
    def total(self) -> float:
        return self.states + self.activations + self.zero3_buffers + self.overhead

    @property
    def binding(self) -> tuple[str, float]:
        """The largest part of the total, and its bytes: what binds when the GPU is full."""
        parts = {
            "model states": self.states,
            "activations": self.activations,
            "ZeRO-3 buffers": self.zero3_buffers,
            "overhead": self.overhead,
        }
        biggest = max(parts, key=parts.__getitem__)
        return biggest, parts[biggest]


def split_by_tp(tensor: SavedTensor, layout: Layout | ActivationLayout) -> bool:
    """TP splits attention/MLP internals always, the rest of a layer's tensors only under SP."""
    return tensor.split == "tp" or (tensor.split == "seq" and layout.sequence_parallel)


def bytes_on_gpu(tensor: SavedTensor, layout: Layout | ActivationLayout) -> float:
    """Bytes of ``tensor`` on one GPU: split by TP (``split_by_tp``) and by CP over the sequence."""
    return tensor.bytes / (layout.cp * (layout.tp if split_by_tp(tensor, layout) else 1))


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
    to the last."""
    embedding = head = 0.0
    for tensor in model_saved_tensors(w):
        if tensor.block == "embedding":
            embedding += bytes_on_gpu(tensor, layout) if stage == 0 else 0.0
        elif stage == layout.pp - 1:
            head += bytes_on_gpu(tensor, layout)
    return embedding, head


def gpu_memory(w: Workload, layout: Layout, stage: int) -> GpuMemory:
    """Every part of one GPU's memory on pipeline stage ``stage``."""
    held = stage_params(w, layout, stage)
    precision = w.precision
    activations = stage_activations(w, layout, stage)
    zero3 = 0.0
    if zero_shards("params", layout.zero) and layout.data_replicas > 1:
        per_layer = held.total / max(1, stage_layers(w.model, layout, stage).layers)
        zero3 = GATHERED_LAYERS * per_layer * precision.param_bytes
    return GpuMemory(
        stage=stage,
        params=sharded_state_bytes(precision.param_bytes, "params", held, layout),
        grads=sharded_state_bytes(precision.grad_bytes, "grads", held, layout),
        master=sharded_state_bytes(precision.master_bytes, "master", held, layout),
        optimizer=sharded_state_bytes(
            optimizer_bytes_per_param(w.model, precision, w.optimizer), "optimizer", held, layout
        ),
        activations=activations.total,
        zero3_buffers=zero3,
        overhead=w.overhead_bytes,
        micro_batches_in_flight=activations.in_flight,
        activations_outside=activations.outside,
        activations_rebuilt=activations.rebuilt,
    )


def most_loaded_gpu(w: Workload, layout: Layout) -> GpuMemory:
    """The pipeline stage whose GPUs need the most memory: usually the first, which holds the most
    micro-batches in flight, or the last, which holds the head and the logits; but a lighter first stage
    (uneven stages, or DeepSeek-V3's dense layers) can leave the peak to the next (``distinct_stages``)."""
    return max((gpu_memory(w, layout, s) for s in distinct_stages(w.model, layout)), key=lambda m: m.total)
