"""Memory of one GPU in a training step, for any parallel layout: the one memory engine of lmcalc.

A GPU of pipeline stage i holds its share of the model states (``engine.parallel.sharding``: TP splits the
matrices, PP the layers, EP the experts, ZeRO shards the states over the data-parallel replicas), the
activations of the micro-batches its stage holds in flight (``engine.parallel.pipeline.held_in_flight``), ZeRO-3's
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
from dataclasses import dataclass, replace
from typing import Literal

from lmcalc.engine.finetune.method import weight_trained
from lmcalc.engine.memory.activations import (
    SavedTensor,
    layer_kept_tensors,
    layer_saved_tensors,
    lowest_layer_unkept,
)
from lmcalc.engine.memory.byte_latent import rebuilt_stack_layers
from lmcalc.engine.memory.cca import checkpoint_kept_again
from lmcalc.engine.memory.fsdp_buffers import NO_QUEUE
from lmcalc.engine.memory.full_recompute import mixer_kinds, recomputed_chunks, trained_chunks, window_kinds
from lmcalc.engine.memory.inkling2 import inkling2
from lmcalc.engine.memory.masks import kinds_differ
from lmcalc.engine.memory.module_offload import host_held
from lmcalc.engine.memory.module_recompute import module_rebuilt
from lmcalc.engine.memory.op_checkpoint import op_checkpoint_kept
from lmcalc.engine.memory.outside_layers import layer_checkpoint, model_saved_tensors, mtp_saved_tensors
from lmcalc.engine.memory.outside_pool import outside_pool
from lmcalc.engine.memory.phases import (
    NONE_UNMADE,
    StageActivations,
    StepPhases,
    Transients,
    UnmadeGrads,
    backward_transients,
    step_phases,
)
from lmcalc.engine.memory.ssm import MixerKind
from lmcalc.engine.memory.stage_states import StageStates, layout_buffers, layout_states, stage_states
from lmcalc.engine.model_code import norm_keeps
from lmcalc.engine.parallel.layout import ActivationLayout, Layout, ModelSplit
from lmcalc.engine.parallel.pipeline import (
    StageLayers,
    distinct_stage_layers,
    held_in_flight,
    stage_chunk_flags,
    stage_chunk_mixes,
    stage_layers,
)
from lmcalc.engine.parallel.sharding import states_workload, trained_held
from lmcalc.engine.workload import Workload
from lmcalc.framework_specs import AllocatorRule

Verdict = Literal["fits", "tight", "does not fit"]


@dataclass(frozen=True, slots=True)  # slots: the planner makes one per layout it tries
class GpuMemory:
    """The parts of one GPU's memory during a training step, as the workload's framework profile allocates them.

    The allocated peak is the largest of the step's phases (``StepPhases``), each on top of the persistent parts:
    the loss's backward (every saved activation and the logits' gradients), a layer's backward (the saved activations
    less the head side the loss has freed, the layer rebuilt under full recomputation, its activation gradients) and
    the optimizer step (the activations freed, what the step itself makes). The caching allocator reserves more than
    it hands out (``fragmentation``); the CUDA context lies outside its pool; the flat ``overhead`` allowance is the
    idealised profile's stand-in for all of these.
    """

    stage: int
    kept: StageStates  # the model states and what ZeRO-3, DDP and the optimizer step add around them
    held: StageActivations  # the activations the forward passes leave saved, at the stage's busiest moment
    transients: Transients  # the loss's logit-sized gradients, a layer's activation gradients
    buffers: float  # sequence-parallel and pipeline buffers, the reduce bucket, cuBLAS/NCCL workspaces
    overhead: float  # the flat allowance
    allocator: AllocatorRule  # its fragmentation and the CUDA context
    context: float  # outside PyTorch's pool: the CUDA context, cuBLAS's kernels, NCCL's where the run has peers
    total: float  # the device memory the step needs: reserved, the CUDA context, the allowance (``_stage_total``)

    @property
    def params(self) -> float:
        return self.kept.params

    @property
    def grads(self) -> float:
        return self.kept.grads

    @property
    def master(self) -> float:
        return self.kept.master

    @property
    def optimizer(self) -> float:
        return self.kept.optimizer

    @property
    def zero3_buffers(self) -> float:
        """ZeRO-3/FSDP: gathered layers, a layer's reduce-scatter, a head kept gathered."""
        return self.kept.zero3

    @property
    def grad_buckets(self) -> float:
        """DDP's second copy of the gradients."""
        return self.kept.buckets

    @property
    def step_transient(self) -> float:
        """At the end of the step: 16-bit gradients, optimizer temporaries, fp32 copies."""
        return self.kept.step_transient

    @property
    def offloaded(self) -> float:
        """This GPU's model states in host memory or on NVMe (``engine.finetune.offload``)."""
        return self.kept.offloaded

    @property
    def activations(self) -> float:
        """Saved by the forward passes in flight (under full recomputation: each layer's input)."""
        return self.held.total

    @property
    def backward_transient(self) -> float:
        """The larger of the loss's and a layer's backward temporaries."""
        t = self.transients
        return max(t.loss, t.layer, t.norm, t.embedding)

    @property
    def phases(self) -> StepPhases:
        """The bytes each phase of the step holds beyond the persistent parts."""
        return step_phases(self.held, self.transients, self.kept.step_transient, self.kept.grads, self.kept.queue)

    @property
    def micro_batches_in_flight(self) -> float:
        """At the stage's busiest moment, in passes through all its layers."""
        return self.held.in_flight

    @property
    def activations_outside(self) -> float:
        """Of the activations, the bytes outside the layers."""
        return self.held.outside

    @property
    def activations_rebuilt(self) -> float:
        """The layer full recomputation rebuilds in the backward pass (in the layer backward's phase)."""
        return self.held.rebuilt

    @property
    def fragmentation(self) -> float:
        """Reserved beyond allocated: the allocator's share of what it hands out at the busier moment."""
        kept = self.kept
        busiest = self.phases.busiest
        allocated = (
            kept.params + kept.grads + kept.master + kept.optimizer + kept.zero3 + kept.buckets + kept.fp8_weights
        ) + (self.buffers + busiest)
        return self.allocator.fragmentation * allocated

    @property
    def states(self) -> float:
        return self.params + self.grads + self.master + self.optimizer

    @property
    def fp8_weights(self) -> float:
        """An fp8 recipe's quantised copies of the layers' weights, kept for the run (Transformer Engine)."""
        return self.kept.fp8_weights

    @property
    def framework_buffers(self) -> float:
        return self.zero3_buffers + self.grad_buckets + self.fp8_weights + self.buffers

    @property
    def grads_unmade(self) -> float:
        """Of the gradients, the bytes autograd has not made yet at the busiest phase (``UnmadeGrads``): where the
        framework frees them after each step and the step is one micro-batch, all of them at the loss's backward."""
        phases, unmade = self.phases, self.held.unmade
        index = phases.index(phases.busiest)
        if index == len(phases) - 1:  # a layer's forward: before any gradient, or the top layer's rebuild
            return (unmade.layer if self.held.rebuilt else unmade.loss) * self.kept.grads
        return (unmade[index] if index < len(unmade) else 0.0) * self.kept.grads

    @property
    def transient(self) -> float:
        """What the busiest phase adds to the persistent parts beyond the saved activations, the gradients it does
        not hold yet aside: negative where that phase comes once most activations are freed (a tied embedding's
        backward, or the optimizer step) and holds less than they did."""
        return self.phases.busiest - self.activations + self.grads_unmade

    @property
    def states_at_peak(self) -> float:
        """The model states the busiest phase holds: all of them but the gradients not made yet."""
        return self.states - self.grads_unmade

    @property
    def allocated(self) -> float:
        """The most PyTorch's allocator hands out at once: persistent parts plus the busier moment."""
        return self.states_at_peak + self.framework_buffers + self.activations + self.transient

    @property
    def reserved(self) -> float:
        """What PyTorch's caching allocator holds at the peak (``torch.cuda.max_memory_reserved``)."""
        return self.allocated + self.fragmentation

    @property
    def parts(self) -> dict[str, float]:
        return {
            "model states": self.states_at_peak,
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
    ``SavedTensor.tp_ways``) and by CP over the sequence (a weight's copy by neither: ``SavedTensor.cp_ways``)."""
    return tensor.bytes / tensor.ways(layout)


@functools.lru_cache(maxsize=1 << 14)
def layer_bytes(
    w: Workload, tp: int, sequence_parallel: bool, cp: int, moe_layer: bool, mixer: MixerKind = "average"
) -> float:
    """Bytes one layer keeps on one GPU whose tensors TP (with or without SP) and CP split (a hybrid's: the average
    layer, or one of ``mixer``'s)."""
    layout = Layout(tp=tp, cp=cp, sequence_parallel=sequence_parallel)
    return sum(bytes_on_gpu(t, layout) for t in layer_kept_tensors(w, moe_layer, mixer))


def largest_layer_bytes(w: Workload, layout: ActivationLayout, moe_layer: bool) -> float:
    """One layer as the backward rebuilds it: a hybrid's larger of the kinds its layers of this MoE-ness have (one
    that attends, one of its other mixer: an average layer is never the one rebuilt), any other model's layer."""
    one = functools.partial(layer_bytes, w, layout.tp, layout.sequence_parallel, layout.cp, moe_layer)
    kinds = mixer_kinds(w.model, moe_layer) or (window_kinds(w.model, moe_layer) if kinds_differ(w) else frozenset())
    largest = max((one(kind) for kind in kinds), default=one())
    if w.model.byte_latent:  # BLT's encoder's and global transformer's layers, rebuilt one at a time too
        on_gpu = functools.partial(bytes_on_gpu, layout=layout)
        largest = max(largest, *rebuilt_stack_layers(w, on_gpu, _rebuilt_keeps_input(w)))
    return largest


def _fp32_copy(w: Workload) -> bool:
    """Whether a norm's fp32 copy of its input is that input (``x.float()`` of fp32 activations is ``x``)."""
    return norm_keeps(w) in ("fp32_input", "fp32_normalised") and w.precision.activation_bytes == 4


def _rebuilt_keeps_input(w: Workload) -> bool:
    """Whether the rebuilt unit keeps the checkpointed input, already counted: its first norm keeps it as its input,
    or as its fp32 copy where the activations are fp32 already, or its residual scale's product (Doge's), or its
    product with 1/rms (CPM-Ant's); the hyper-connections keep their streams too. Not Inkling 2's: its rebuilt layer
    stacks its input into a new fp32 block-residual stack first (``engine.memory.inkling2``)."""
    if inkling2(w):
        return False
    scaled = w.model.residual_scales and weight_trained(w.model, w.method, "residual_scale")  # a frozen one: none
    scaled = scaled and not w.model.ngpt_scales  # nGPT's interpolation keeps y − h, not the input (memory.ngpt)
    return bool(norm_keeps(w) == "input" or _fp32_copy(w) or w.model.hyper_connections or scaled or w.model.prompt)


def stage_activations(w: Workload, layout: Layout, stage: int) -> StageActivations:
    """Activation bytes on one GPU of ``stage`` at its busiest, and the micro-batches it holds in flight then."""
    return _stage_activations(w, layout.activation_layout, stage)


@functools.lru_cache(maxsize=1 << 16)  # the planner's layouts share them across DP, EP and ZeRO
def _stage_activations(w: Workload, layout: ActivationLayout, stage: int) -> StageActivations:

    def one_layer(moe_layer: bool) -> float:
        return layer_bytes(w, layout.tp, layout.sequence_parallel, layout.cp, moe_layer)

    chunks = trained_chunks(w, stage_chunk_mixes(w.model, layout)[stage])
    if w.offloaded_layers:  # one stage (check_layout): the first N layers' activations wait in host memory
        chunks = tuple(_on_gpu(w, *chunk) for chunk in chunks)
    rebuilt = 0.0
    if w.recompute == "full":
        checkpoint = bytes_on_gpu(layer_checkpoint(w), layout)
        largest = functools.partial(largest_layer_bytes, w, layout)
        layers, rebuilt = recomputed_chunks(
            w, stage_chunk_flags(w.model, layout)[stage], checkpoint, one_layer, largest
        )
        # the rebuilt unit's first norm keeps the checkpointed input, already counted (_rebuilt_keeps_input)
        if w.model.cca:  # ZAYA's fp32 stream (its norm's copy in fp32) and router state (a trained scale keeps it)
            rebuilt -= checkpoint_kept_again(w, _fp32_copy(w), weight_trained(w.model, w.method, "router_state_scale"))
        elif _rebuilt_keeps_input(w):
            rebuilt -= checkpoint
    else:
        layers = [dense * one_layer(False) + (moe * one_layer(True) if moe else 0.0) for dense, moe in chunks]
        layers[0] -= host_held(w, layout, chunks[0][1])  # fine-grained offloading: one stage, one chunk (check_layout)
        if w.recompute == "selective":  # what the selective modules or operators dropped comes back in a backward
            built_kinds = stage_layers(w.model, layout, stage)
            kinds = [kind for kind, count in ((False, built_kinds.dense), (True, built_kinds.moe)) if count]
            rebuilt = max((selective_rebuilt(w, layout, kind) for kind in kinds), default=0.0)
    embedding_side, head_side = stage_outside_bytes(w, layout, stage)
    per_chunk = [*layers]
    per_chunk[0] += embedding_side  # the first chunk of the first stage begins with the embedding
    per_chunk[-1] += head_side  # the last chunk of the last stage ends with the head
    held, counts = held_in_flight(layout, stage, tuple(per_chunk))
    outside = counts[0] * embedding_side + counts[-1] * head_side
    per_micro_batch = sum(layers)
    in_flight = (held - outside) / per_micro_batch if per_micro_batch else float(counts[0])
    freed = head_side if w.framework.transients and counts[-1] else 0.0  # a profile with a timeline frees it
    built = stage_layers(w.model, layout, stage)
    if w.recompute == "full":
        first = bytes_on_gpu(layer_checkpoint(w), layout)
    else:  # the stage's first layer: dense unless the stage builds MoE layers alone
        first = one_layer(not built.dense) if built.layers else 0.0
    return StageActivations(held, in_flight, outside, rebuilt, freed, first, _unmade_grads(w, layout, built))


def _on_gpu(w: Workload, dense: int, moe: int) -> tuple[int, int]:
    """Of a stage's (dense, MoE) layers, those whose activations stay on the GPU under CPU offloading: Transformer
    Engine's offload context keeps (L − N)·T of activation memory for N offloaded layers of T each
    (transformer_engine/pytorch/cpu_offload.py get_cpu_offload_context, TransformerEngine d0067d0d)."""
    offloaded_moe = w.model.moe_layers_in(0, w.offloaded_layers)
    return max(0, dense - (w.offloaded_layers - offloaded_moe)), max(0, moe - offloaded_moe)


def selective_rebuilt(w: Workload, layout: ActivationLayout, moe_layer: bool) -> float:
    """Under selective recomputation, what the layer being differentiated holds beyond what it kept. Per operator:
    the tensors autograd saves when the block runs again, less the kept ones that are the same storages; by
    Megatron-Core's modules: what the larger half's modules dropped (``module_rebuilt``)."""
    return _selective_rebuilt(w, layout.tp, layout.sequence_parallel, layout.cp, moe_layer)


@functools.lru_cache(maxsize=1 << 12)  # keyed by what it reads of a layout: the planner's share it across PP and DP
def _selective_rebuilt(w: Workload, tp: int, sequence_parallel: bool, cp: int, moe_layer: bool) -> float:
    layout = Layout(tp=tp, cp=cp, sequence_parallel=sequence_parallel)
    if w.framework.recompute.selective == "attention_core":
        return sum(bytes_on_gpu(t, layout) for t in module_rebuilt(w, layer_saved_tensors(w, moe_layer), moe_layer))
    saved = layer_saved_tensors(replace(w, recompute="none"), moe_layer)
    reused = (kept.tensor for kept in op_checkpoint_kept(w, moe_layer) if kept.reused)
    return sum(bytes_on_gpu(t, layout) for t in saved) - sum(bytes_on_gpu(t, layout) for t in reused)


def _unmade_grads(w: Workload, layout: ActivationLayout, built: StageLayers) -> UnmadeGrads:
    """The shares of the stage's gradients that autograd has not made at each backward phase, where the framework
    makes them in the backward and frees them after the step (``grads_lifetime: step``) and the step is one
    micro-batch; else none (a gradient buffer, or gradients accumulated over micro-batches, is there throughout).
    The head's are made before the final norm's backward, the top layer's (MoE where the stage builds any) by its
    own (a looped model's: every held layer's, taken as made by the top run's backward, which a held layer's later
    runs follow), the embedding's last; a tied embedding's shared matrix gets its gradient in the embedding's
    backward."""
    if w.framework.states.grads_lifetime != "step" or layout.grad_accum > 1:
        return NONE_UNMADE

    def trained(dense: int, moe: int, embedding: bool, head: bool, *mtp: int) -> float:
        split = ModelSplit(layout.tp, 1, layout.tp)  # shares: the frameworks that free gradients run no EP or ETP
        return trained_held(w.model, w.method, split, StageLayers(dense, moe, embedding, head, *mtp)).total

    total = trained(*built)
    if not total:
        return NONE_UNMADE
    head, embedding = trained(0, 0, False, built.head), trained(0, 0, built.embedding, False)
    if built.head and built.embedding and w.model.tied_embeddings:
        head -= head + embedding - trained(0, 0, True, True)  # the shared matrix: counted with the embedding's
    top = trained(int(not built.moe), int(built.moe), False, False)
    if w.model.layer_reuse:  # the top run's backward is not the last to reach its weights: all taken as made by then
        top = total - head - embedding
    return UnmadeGrads(1.0, 1.0 - head / total, max(0.0, 1.0 - (head + top) / total), embedding / total)


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
    if stage == 0:  # the lowest layer keeps less where its input needs no gradient (LoRA, QLoRA)
        embedding -= sum(bytes_on_gpu(t, layout) for t in lowest_layer_unkept(w))
    built = stage_layers(w.model, layout, stage) if layout.split.mtp_layers else None
    if built and (built.mtp or built.mtp_heads):  # the MTP modules', beyond their layers (counted with the stage's)
        module, module_head = mtp_saved_tensors(w)
        head += built.mtp * sum(bytes_on_gpu(t, layout) for t in module)
        head += built.mtp_heads * sum(bytes_on_gpu(t, layout) for t in module_head)
    return embedding, head


def gpu_memory(w: Workload, layout: Layout, stage: int) -> GpuMemory:
    """Every part of one GPU's memory on pipeline stage ``stage``, as the workload's framework allocates it."""
    built = stage_layers(w.model, layout, stage)
    states = stage_states(states_workload(w), layout.state_shards, built)
    activations = stage_activations(w, layout, stage)
    transients = backward_transients(w, layout.tp, layout.cp, built)
    buffers, allocator, allowance = layout_buffers(w, layout), w.framework.allocator, w.allowance
    busiest = step_phases(activations, transients, states.step_transient, states.grads, states.queue).busiest
    context = outside_pool(w, layout)
    total = _stage_total(states, busiest, buffers, allocator.fragmentation, context + allowance)
    return GpuMemory(stage, states, activations, transients, buffers, allowance, allocator, context, total)


def most_loaded_gpu(w: Workload, layout: Layout) -> GpuMemory:
    """The pipeline stage whose GPUs need the most memory: usually the first, which holds the most
    micro-batches in flight, or the last, which holds the head and the logits; but a lighter first stage
    (uneven stages, or DeepSeek-V3's dense layers) can leave the peak to the next (``distinct_stages``)."""
    total, (stage, states, held, transients), buffers, context = _most_loaded(w, layout)
    return GpuMemory(stage, states, held, transients, buffers, w.allowance, w.framework.allocator, context, total)


def most_loaded_total(w: Workload, layout: Layout) -> float:
    """``most_loaded_gpu(w, layout).total`` without its parts: all the planner asks of each layout it tries."""
    return _most_loaded(w, layout)[0]


def _most_loaded(
    w: Workload, layout: Layout
) -> tuple[float, tuple[int, StageStates, StageActivations, Transients], float, float]:
    """The most loaded stage's total, the stage and its parts, the buffers and what lies outside the pool."""
    peaks = _activation_peaks(w, layout.activation_layout)
    states_by_stage = layout_states(states_workload(w), layout.state_shards, layout.stages)
    buffers, allocator = layout_buffers(w, layout), w.framework.allocator
    context = outside_pool(w, layout)
    fragmentation, outside = allocator.fragmentation, context + w.allowance
    most: tuple[int, StageStates, StageActivations, Transients] | None = None
    most_total = 0.0
    for (stage, held, transients, phases, backward), states in zip(peaks, states_by_stage, strict=True):
        queue = states.queue
        if held.unmade is not NONE_UNMADE:  # the backward's phases hold only the gradients made by then
            busiest = step_phases(held, transients, states.step_transient, states.grads, queue).busiest
        elif queue is NO_QUEUE:
            busiest = backward if backward > states.step_transient else states.step_transient  # max, without a call
        else:  # Megatron-FSDP's gradient buckets add to the phases after the loss's (``step_phases``)
            busiest = max(
                backward,
                phases.norm_backward + queue.head,
                phases.layer_backward + queue.layer_peak(held.first_layer),
                phases.first_layer_backward + queue.first_layer,
                phases.embedding_backward + queue.embedding,
                states.step_transient,
            )
        total = _stage_total(states, busiest, buffers, fragmentation, outside)
        if most is None or total > most_total:  # the first of equally loaded stages
            most, most_total = (stage, states, held, transients), total
    assert most is not None  # every layout has a first stage
    return most_total, most, buffers, context


@functools.lru_cache(maxsize=1 << 16)  # the planner's layouts share them across DP, EP and ZeRO
def _activation_peaks(
    w: Workload, layout: ActivationLayout
) -> tuple[tuple[int, StageActivations, Transients, StepPhases, float], ...]:
    """For each of the layout's ``distinct_stages``: the stage, its activations at their busiest, its backward
    transients, the backward's phases and the busiest of them (``step_phases`` without the optimizer step, which the
    model states decide); what the stages' memory depends on besides the model states, looked up once for all of a
    layout's stages."""
    peaks = []
    for stage, built in distinct_stage_layers(w.model, layout):
        held = _stage_activations(w, layout, stage)
        transients = backward_transients(w, layout.tp, layout.cp, built)
        phases = step_phases(held, transients, 0.0)
        peaks.append((stage, held, transients, phases, phases.busiest))
    return tuple(peaks)


def _stage_total(states: StageStates, busiest: float, buffers: float, fragmentation: float, outside: float) -> float:
    """``GpuMemory.total`` of a stage: reserved (allocated, then the allocator's ``fragmentation`` fraction of it), and
    ``outside`` the pool (the CUDA context, NCCL's, the flat allowance), added as the ``GpuMemory`` properties add
    them. The planner compares every distinct stage of every layout it tries by it before it builds the ``GpuMemory``
    of one. ``busiest``: what the step's busiest phase adds to the persistent parts (``StepPhases.busiest``)."""
    persistent = states.params + states.grads + states.master + states.optimizer
    allocated = persistent + (states.zero3 + states.buckets + states.fp8_weights + buffers) + busiest
    return allocated * (1 + fragmentation) + outside
