"""Megatron-Core's fine-grained activation offloading (``--fine-grained-activation-offloading --offload-modules``;
megatron/core/pipeline_parallel/fine_grained_activation_offload.py and transformer/moe/experts.py at d98e8a64): what a
named module keeps for its backward, each tensor of at least ``--min-offloaded-tensor-size`` elements, is copied to
host memory on a side stream during the forward pass and back before the backward needs it. Every layer's group of a
name is offloaded but one: ``post_warmup_callback`` keeps on the GPU the group the backward reaches first (the last
layer's), so that its reload never holds the backward up.

lmcalc models the routed experts' modules: ``expert_fc1``, the first projection's input (the tokens gathered for
their experts); ``fused_group_mlp``, everything the fused grouped MLP keeps (that input and what its projections and
activation keep). The copies are not timed: they run on their own streams beside the computation, and a layer's
routed tensors cross a host link (PCIe 5 at 64 GB/s, NVLink-C2C at 450 GB/s a direction) in less time than the
layer's GEMMs take at the sizes where offloading pays.
"""

from __future__ import annotations

import functools

from lmcalc.engine.memory.activations import layer_kept_tensors
from lmcalc.engine.memory.saved import SavedTensor
from lmcalc.engine.parallel.layout import ActivationLayout
from lmcalc.engine.workload import Workload

FC1_INPUT = "tokens gathered for their experts"
"""The label of the routed experts' first projection's input (``engine.memory.activations``)."""


def offloaded(w: Workload, tensor: SavedTensor, on_gpu: float) -> bool:
    """Whether ``tensor``, of ``on_gpu`` elements on one GPU, is one the named modules send to the host."""
    if not tensor.routed or on_gpu < w.min_offloaded_tensor_size:
        return False
    return "fused_group_mlp" in w.offload_modules or tensor.label.startswith(FC1_INPUT)


@functools.lru_cache(maxsize=1 << 10)
def offloaded_per_layer(w: Workload, layout: ActivationLayout) -> float:
    """Bytes one MoE layer's offloaded tensors take on one GPU (split by TP and CP as the GPU holds them)."""
    total = 0.0
    for tensor in layer_kept_tensors(w, True):
        ways = tensor.ways(layout)
        if offloaded(w, tensor, tensor.elements / ways):
            total += tensor.bytes / ways
    return total


def host_held(w: Workload, layout: ActivationLayout, moe_layers: int) -> float:
    """Bytes a stage of ``moe_layers`` MoE layers keeps in host memory at the end of its forward pass: every layer's
    offloaded tensors but the last layer's."""
    if not w.offload_modules or moe_layers < 2:
        return 0.0
    return (moe_layers - 1) * offloaded_per_layer(w, layout)
