"""The terms of what a framework allocates beside the model states and the activations, as ``engine.memory.terms``
writes them: ZeRO-3's gathered parameters (Megatron-FSDP's window), DDP's gradient buckets, an fp8 recipe's weight
copies, and the workspaces and communication buffers."""

from __future__ import annotations

from lmcalc.engine.memory.fp8_storage import te_fp8, weight_copy_bytes
from lmcalc.engine.memory.fsdp_buffers import gathered, megatron_fsdp
from lmcalc.engine.memory.gpu_memory import GpuMemory
from lmcalc.engine.parallel.layout import Layout
from lmcalc.engine.parallel.pipeline import stage_layers
from lmcalc.engine.parallel.sharding import gathered_to_backward, zero_shards
from lmcalc.engine.workload import Workload
from lmcalc.result import Term


def buffer_terms(w: Workload, layout: Layout, gpu: GpuMemory) -> tuple[Term, ...]:
    """What the framework allocates beside the states and activations: ZeRO-3's gathered parameters, DDP's
    gradient buckets, and its workspaces and communication buffers."""
    rules = w.framework
    buffers = rules.buffers
    return (
        _gathered_term(w, layout, gpu),
        *((_fp8_term(w, gpu),) if te_fp8(w) else ()),
        Term(
            "grad_buckets",
            "DDP gradient buckets",
            gpu.grad_buckets,
            "bytes",
            "N_gpu · 16-bit gradient bytes, without ZeRO and with DP > 1"
            if rules.states.ddp_bucket_copy
            else f"none: {rules.name} keeps no second copy of the gradients",
            source=rules.states.source,
        ),
        Term(
            "buffers",
            "Framework buffers",
            gpu.buffers,
            "bytes",
            "workspaces + SP all-gather (s·b·h each) + pipeline send/receive (s·b·h each) + DP reduce bucket"
            + (" + the largest 4-bit weight dequantised (QLoRA)" if w.method.kind == "qlora" else ""),
            f"{buffers.workspace_bytes / 2**20:g} MiB workspaces; {buffers.sequence_parallel_gather} SP buffers; "
            f"{buffers.pipeline_tensors} pipeline tensors; {buffers.reduce_bucket_elements:g} bucket elements",
            source=buffers.source,
        ),
    )


def _gathered_term(w: Workload, layout: Layout, gpu: GpuMemory) -> Term:
    """ZeRO-3's gathered weights: Megatron-FSDP's window of layers and the modules outside them, or the profile's
    count of gathered layers."""
    buffers = w.framework.buffers
    formula = "(gathered layers · 16-bit bytes + reduce-scatter bytes) per parameter of a layer (+ a gathered head)"
    numbers = f"{buffers.gathered_layers} layers gathered, {buffers.reduce_scatter_bytes:g} B per parameter of a " + (
        "layer being reduce-scattered" + (", the head kept gathered" if buffers.head_gathered else "")
    )
    if gathered_to_backward(w, layout.zero):
        formula = "reduce-scatter bytes per parameter of a layer (FSDP's ZeRO-2: the weights stay gathered, above)"
        numbers = f"{buffers.reduce_scatter_bytes:g} B per parameter of a layer being reduce-scattered"
    elif not zero_shards("params", layout.zero):
        formula, numbers = "none (ZeRO-3 only)", ""
    elif megatron_fsdp(w, layout.state_shards):
        window = gathered(w, layout.state_shards, stage_layers(w.model, layout, gpu.stage))
        formula, numbers = window.formula, window.numbers
    return Term(
        "zero3_buffers", "ZeRO-3 gathered parameters", gpu.zero3_buffers, "bytes", formula, numbers,
        source=buffers.source,
    )  # fmt: skip


def _fp8_term(w: Workload, gpu: GpuMemory) -> Term:
    """An fp8 recipe's quantised weights under a profile that follows Transformer Engine: a copy beside each layer
    weight, or with fp8 primary weights the weights themselves."""
    fp8 = te_fp8(w)
    assert fp8 is not None  # asked only under an fp8 recipe that the profile keeps as Transformer Engine does
    what = "the layers' weights, kept in fp8" if w.framework.fp8.primary_weights else "a copy of each layer weight"
    numbers = (
        f"{fp8.weight_copy_bytes:g} B + {fp8.transposed_bytes:g} B of transpose ({fp8.scaling} scaling)"
        if fp8.transposed_bytes
        else f"{fp8.weight_copy_bytes:g} B ({fp8.scaling} scaling)"
    )
    return Term(
        "fp8_weights", "FP8 weights", gpu.fp8_weights, "bytes",
        f"N_layers · {weight_copy_bytes(fp8):g} B: {what}, both uses (sharded as the weights)", numbers,
        source=fp8.source,
    )  # fmt: skip
