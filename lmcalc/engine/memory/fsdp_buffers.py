"""Megatron-FSDP's own buffers: ZeRO-2 and ZeRO-3 under a profile with ``buffers.communication_unit_elements`` are
Megatron-Core's Megatron-FSDP (``--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads`` or
``optim_grads_params``), as NVIDIA/Megatron-LM core_v0.16.1 (55ac7082) allocates them in
megatron/core/distributed/fsdp/ (docs/formulas.md §5.11).

Megatron-FSDP keeps the model states as shards of flat buffers over DP·CP, as lmcalc's ZeRO stages do. Two things
are not shards:

* Under ZeRO-3 the units are all-gathered into 16-bit buckets before their forward and again before their backward,
  and freed after each. The units are every TransformerLayer (mcore_fsdp_adapter.py). Gathered at once are the unit
  in use and those the all-gather prefetches: further units, until at least half a communication unit is in flight
  beyond it (param_and_grad_buffer.py, AllGatherPipeline.all_gather_params). The modules outside the units (the
  embedding, the final norm and the output layer) are gathered at their first use and stay gathered for the step.
* Under ZeRO-2 and ZeRO-3 each bucket's gradients are made unsharded, in the gradient buffer's dtype, and
  reduce-scattered into the shard in every backward pass (megatron_fsdp.py, _process_post_backward_gradients). A
  reduced bucket is freed only when a later bucket is reduced and finds more than a communication unit queued
  before it (GradReducePipeline.wait_for_previous_grad_reduce). The queue is emptied at the end of each backward
  pass.

The communication unit, in elements, is max(10⁹, 2·u) under ZeRO-3, where u is a unit's parameters on one GPU. Under
ZeRO-2 it is max(10⁹, the bucket size) (megatron_fsdp.py; the line its comment calls a cap is a floor). ZeRO-2 has
no units. Its buckets cut the parameters, in their order, at Megatron-LM's default bucket size of
max(4·10⁷, 10⁶·DP·CP) elements (megatron/training/training.py).
"""

from __future__ import annotations

import functools
from collections import deque
from typing import NamedTuple

from lmcalc.engine.finetune.method import FULL
from lmcalc.engine.parallel.layout import ModelSplit, StateShards
from lmcalc.engine.parallel.pipeline import StageLayers
from lmcalc.engine.parallel.sharding import frozen_held, trained_held, trained_precision, zero_shards
from lmcalc.engine.workload import Workload
from lmcalc.units import GB

BUCKET_ELEMENTS = 40_000_000
"""Megatron-LM's least gradient bucket, in elements, when ``--ddp-bucket-size`` is not given
(megatron/training/training.py get_model: max(40000000, 1000000 · DP·CP))."""

BUCKET_ELEMENTS_PER_REPLICA = 1_000_000
"""Elements Megatron-LM's default bucket grows by for each data-parallel replica (DP·CP), as above."""


class Gathered(NamedTuple):
    """What Megatron-FSDP's ZeRO-3 holds gathered on one GPU beside the shards, in bytes."""

    units: int  # layers gathered at once: the one in use and those prefetched
    unit_elements: float  # parameters of one such layer on the GPU
    unit_bytes: float  # its 16-bit bytes (frozen weights at their own bytes)
    outside: float  # the embedding, the final norm and the output layer, gathered for the whole step
    prefetch: float  # the all-gather's prefetch, in elements: half the communication unit

    @property
    def total(self) -> float:
        return self.units * self.unit_bytes + self.outside

    @property
    def formula(self) -> str:
        return (
            "(1 + ⌈prefetch / u⌉) layers · a layer's 16-bit bytes + embedding, final norm and output layer; "
            "prefetch = max(10⁹, 2·u) / 2 elements, u = a layer's parameters on the GPU"
        )

    @property
    def numbers(self) -> str:
        return (
            f"(1 + ⌈{self.prefetch:,.0f} / {self.unit_elements:,.0f}⌉ = {self.units} layers) · "
            f"{self.unit_bytes / GB:.4g} GB + {self.outside / GB:.4g} GB"
        )


class GradQueue(NamedTuple):
    """Megatron-FSDP's unsharded gradient buckets alive at each backward phase of one GPU, in bytes: the bucket being
    made and those queued behind the reduce-scatter."""

    head: float = 0.0  # at the final norm's backward: the output layer's and final norm's bucket
    layers: tuple[float, ...] = ()  # at each layer's backward, from the top layer down
    embedding: float = 0.0  # at the embedding's backward
    records: tuple[tuple[int, float], ...] = ()  # (j, alive) where the alive bytes first exceed all above (``peaks``)

    def layer_peak(self, freed_per_layer: float) -> float:
        """The most the buckets add to the layers' backward beyond what the top layer holds, each layer's backward
        having freed ``freed_per_layer`` saved bytes: max over j of (alive at the j-th layer from the top − j·freed),
        which, with nothing freed negative, only a layer that holds more than every layer above it can reach."""
        most = 0.0  # the top layer's record, (0, alive ≥ 0), is always the first where there are any
        for j, alive in self.records:  # a loop, not max over a generator: the planner asks this millions of times
            if alive - j * freed_per_layer > most:
                most = alive - j * freed_per_layer
        return most

    @property
    def first_layer(self) -> float:
        return self.layers[-1] if self.layers else 0.0

    def numbers(self, freed_per_layer: float) -> str:
        """The buckets alive at each phase, in words (none where there is no queue)."""
        if not self.layers:
            return ""
        return (
            f"; Megatron-FSDP's unsharded gradient buckets in flight: {self.head / GB:.3g} GB at the norm's backward, "
            f"{self.layers[0] / GB:.3g} to {max(self.layers) / GB:.3g} GB in the layers' (at most "
            f"{self.layer_peak(freed_per_layer) / GB:.3g} GB beyond what the layers above freed, "
            f"{freed_per_layer / GB:.3g} GB each), {self.first_layer / GB:.3g} GB at the first layer's, "
            f"{self.embedding / GB:.3g} GB at the embedding's"
        )


NO_QUEUE = GradQueue()


class _Parts(NamedTuple):
    """A stage's parameters on one GPU as Megatron-FSDP groups them, in elements (bytes where named)."""

    kinds: tuple[tuple[int, float, float, float], ...]  # per layer kind built: (count, elements, trained, 16-bit bytes)
    head: float  # trained elements of the final norm and the output layer
    embedding: float  # trained elements of the embedding
    outside_bytes: float  # 16-bit bytes of the embedding, final norm and output layer


def megatron_fsdp(w: Workload, shards: StateShards) -> bool:
    """Whether the workload's ZeRO-2 or ZeRO-3 is Megatron-FSDP: the profile names its communication unit, and
    the states are sharded over more than one replica (over one, Megatron-FSDP shards nothing)."""
    return w.framework.buffers.communication_unit_elements > 0 and shards.zero >= 2 and shards.replicas > 1


@functools.lru_cache(maxsize=1 << 12)
def _parts(w: Workload, split: ModelSplit, built: StageLayers) -> _Parts:
    model, method, param_bytes = w.model, w.method, trained_precision(w).param_bytes

    def every(part: StageLayers) -> float:
        return trained_held(model, FULL, split, part).total

    def trained(part: StageLayers) -> float:
        return trained_held(model, method, split, part).total

    def weight_bytes(part: StageLayers) -> float:
        return trained(part) * param_bytes + frozen_held(model, method, w.precision.param_bytes, split, part).total

    kinds = []
    for count, part in (
        (built.dense, StageLayers(built.dense, 0, False, False)),
        (built.moe, StageLayers(0, built.moe, False, False)),
    ):
        if count:
            kinds.append((count, every(part) / count, trained(part) / count, weight_bytes(part) / count))
    embedding = trained(StageLayers(0, 0, True, False)) if built.embedding else 0.0
    # a tied matrix on a stage with both ends is the embedding's: the head's bucket then holds the final norm alone
    head = trained(StageLayers(0, 0, built.embedding, True)) - embedding if built.head else 0.0
    outside = weight_bytes(StageLayers(0, 0, built.embedding, built.head))
    return _Parts(tuple(kinds), head, embedding, outside)


def communication_unit(w: Workload, shards: StateShards, built: StageLayers) -> float:
    """Megatron-FSDP's suggested communication unit, in elements: the reduce-scatter queue's capacity, and twice the
    all-gather's prefetch. ZeRO-3: max(floor, 2 · a unit's mean parameters); ZeRO-2: max(floor, bucket size)."""
    floor = w.framework.buffers.communication_unit_elements
    if zero_shards("params", shards.zero):
        kinds = _parts(w, shards.split, built).kinds
        mean = sum(count * elements for count, elements, _, _ in kinds) / max(1, built.layers)
        return max(floor, 2 * mean)
    return max(floor, bucket_elements(shards.replicas))


def bucket_elements(replicas: int) -> float:
    """Megatron-LM's default gradient bucket, in elements, for ``replicas`` data-parallel copies (DP·CP)."""
    return max(BUCKET_ELEMENTS, BUCKET_ELEMENTS_PER_REPLICA * replicas)


@functools.lru_cache(maxsize=1 << 12)
def gathered(w: Workload, shards: StateShards, built: StageLayers) -> Gathered:
    """ZeRO-3's gathered weights: the unit in use and ⌈prefetch / u⌉ more (no more than the stage's other layers), in
    the layer kind whose window is largest, and the modules outside the units."""
    parts = _parts(w, shards.split, built)
    prefetch = communication_unit(w, shards, built) // 2
    windows = [
        (1 + min(-(-prefetch // elements), built.layers - 1), elements, weight)
        for _, elements, _, weight in parts.kinds
        if elements
    ]
    units, elements, weight = max(windows, key=lambda window: window[0] * window[2], default=(0, 0.0, 0.0))
    return Gathered(int(units), elements, weight, parts.outside_bytes, prefetch)


@functools.lru_cache(maxsize=1 << 12)
def gradient_queue(w: Workload, shards: StateShards, built: StageLayers, grad_bytes: float) -> GradQueue:
    """The unsharded gradient buckets alive at each backward phase, as the reduce-scatter queue keeps them. The
    buckets come in backward order: the output layer's (with the final norm), the layers' from the top (a stage's MoE
    layers above its dense ones, as DeepSeek-V3's come), the embedding's. Under ZeRO-3 a layer is one bucket; under
    ZeRO-2 its parameters are cut into ⌈u / bucket⌉ equal buckets, where Megatron cuts after the parameter that
    reaches the bucket size (each layer's bucket then differs by less than its largest weight)."""
    parts = _parts(w, shards.split, built)
    capacity = communication_unit(w, shards, built)
    zero3 = zero_shards("params", shards.zero)
    bucket = bucket_elements(shards.replicas)
    queue: deque[float] = deque()
    queued = 0.0

    def reduce(size: float) -> float:
        """A bucket made and reduced: what is alive while it is made; then the queue frees the oldest buckets while
        it holds more than the capacity, and keeps this one."""
        nonlocal queued
        alive = queued + size
        while queued > capacity:
            queued -= queue.popleft()
        queue.append(size)
        queued += size
        return alive

    def reduce_layer(size: float, pieces: int) -> float:
        """A layer's ``pieces`` equal buckets made and reduced: the most alive while any is made. Once the queue
        holds only buckets of this size and one more bucket leaves it as long as before, every further bucket
        repeats that one, and is not simulated: a layer of 10²⁰ parameters is not cut into 10¹² buckets."""
        most = 0.0
        for _ in range(pieces):
            before = (len(queue), all(queued_size == size for queued_size in queue))
            most = max(most, reduce(size))
            if before == (len(queue), True):  # the queue the same before and after: a fixed point
                break
        return most

    head = reduce(parts.head) if parts.head else 0.0
    layers: list[float] = []
    for count, _, trained, _ in reversed(parts.kinds):
        pieces = 1 if zero3 else max(1, -(-int(trained) // int(bucket)))
        for made in range(1, count + 1):
            before = (tuple(queue), queued)
            layers.append(reduce_layer(trained / pieces, pieces) if trained else queued)
            if (tuple(queue), queued) == before:  # the queue as it was, to the bit: every further layer of this
                layers += [layers[-1]] * (count - made)  # kind repeats this one, and is not simulated
                break
    embedding = reduce(parts.embedding) if parts.embedding else 0.0
    alive = tuple(alive * grad_bytes for alive in layers)
    return GradQueue(head * grad_bytes, alive, embedding * grad_bytes, records(alive))


def records(alive: tuple[float, ...]) -> tuple[tuple[int, float], ...]:
    """The (j, alive[j]) where alive[j] is more than every earlier one: the only layers that can hold the most
    beyond what the layers above them freed."""
    out: list[tuple[int, float]] = []
    for j, value in enumerate(alive):
        if not out or value > out[-1][1]:
            out.append((j, value))
    return tuple(out)
