"""Memory per GPU of a training step for any parallel layout: the most loaded GPU, every pipeline stage, or a
sweep of one setting (serving's memory is ``estimates.serving``)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Unpack

from lmcalc.engine.memory.fp8_storage import te_fp8
from lmcalc.engine.memory.gpu_memory import GpuMemory, gpu_memory, most_loaded_gpu
from lmcalc.engine.memory.terms import Capacity, memory_sections
from lmcalc.engine.parallel.layout import Layout
from lmcalc.engine.parallel.layout_checks import check_layout
from lmcalc.engine.workload import Workload
from lmcalc.errors import LmcalcError, flag, setting
from lmcalc.estimates import levers
from lmcalc.estimates.inputs import (
    ClusterLike,
    ModelLike,
    accept,
    checked,
    context_note,
    how_counted,
    method_inputs,
    model_input,
    model_notes,
    optimizer_text,
    qlora_experts_note,
    stored_text,
    whole_count,
)
from lmcalc.estimates.settings import MemorySettings
from lmcalc.estimates.shown import Estimate
from lmcalc.estimates.training import (
    TrainingSetup,
    build_layout,
    layout_origin,
    layout_settings,
    recompute_input,
    training_settings,
    training_setup,
)
from lmcalc.result import Input, Result, Section
from lmcalc.specs import Cluster
from lmcalc.units import GB


@dataclass(frozen=True)
class MemoryEstimate(Estimate):
    """One training step's memory: ``gpu``, the most loaded GPU of ``layout`` running ``workload``; with
    ``stages``, one GPU of every pipeline stage."""

    workload: Workload
    layout: Layout
    cluster: Cluster
    gpu: GpuMemory
    stages: tuple[GpuMemory, ...] = ()

    @property
    def total(self) -> float:
        """Bytes the most loaded GPU needs."""
        return self.gpu.total

    @property
    def capacity(self) -> float:
        return self.cluster.hardware.capacity_bytes

    @property
    def fits(self) -> bool:
        return self.gpu.total <= self.capacity


def memory(
    *, model: ModelLike, gpus: ClusterLike = "1xH100", stages: bool = False, **settings: Unpack[MemorySettings]
) -> MemoryEstimate:
    """Memory of the most loaded GPU in one training step, for any DP/ZeRO/TP/SP/PP/CP/EP layout; with ``stages``,
    of one GPU of every pipeline stage. ``settings`` are the workload's (``TrainingSettings``: ``seq``,
    ``micro_batch``, ``precision``, ``optimizer``, ``attention``, ``recompute``, ``framework``, ``overhead``, and
    the method's: ``method``, the LoRA settings, ``offload``, …) and the layout's (``LayoutSettings``: ``tp=8,
    pp=4, zero=1, …``)."""
    accept(settings, MemorySettings, "memory")
    given_layout = layout_settings(settings)
    setup = training_setup(model, gpus, training_settings(settings), given_layout)
    layout = build_layout(setup.cluster, given_layout)
    return memory_estimate(setup, layout, stages)


STAGE_PARTS = (
    "total.states",
    "total.activations",
    "total.framework_buffers",
    "total.transient",
    "total.fragmentation",
    "total.context",
    "total.overhead",
)
"""What a stage's or a sweep's row stacks: the model states summed, so that the row stays narrow (a stage's row
adds its layers and micro-batches in flight)."""
MEMORY_STACK = ("state.params", "state.grads", "state.master", "state.optimizer", *STAGE_PARTS[1:])
"""What one GPU's bar stacks: the model states part by part, then the rest as a stage's row has it."""
_AT_PEAK_STACK = tuple("state.grads_at_peak" if k == "state.grads" else k for k in MEMORY_STACK)
"""The same, where the busiest phase holds only some of the gradients (``GpuMemory.grads_unmade``)."""
SWEEPABLE = {
    "seq": "sequence length",
    "micro-batch": "micro-batch",
    "zero": "ZeRO stage",
    "tp": "tensor-parallel degree",
    "pp": "pipeline stages",
    "cp": "context-parallel degree",
    "ep": "expert-parallel degree",
}
SWEEP_EXAMPLES = "seq=1k,4k,16k, micro-batch=1,2,4, zero=0,1,2,3, tp=1,2,4,8, pp=…, cp=… or ep=…"


FP8_UNEXPRESSED = (
    "fp8: the matmuls run at the fp8 peak, but what an fp8 recipe keeps under this profile is not modelled: "
    "Transformer Engine keeps the linear layers' inputs in fp8 (1 byte where this counts the activation dtype's 2) "
    "and fp8 copies of the weights (--framework megatron counts them); the figures here are bf16's"
)
FP8_TE = (
    "fp8 as Transformer Engine keeps it: the linear layers' inputs saved quantised, a quantised copy of each layer "
    "weight (or, with --fp8-param-gather, the weights themselves), and each output gradient quantised in its "
    "layer's backward; not modelled: delayed scaling's amax histories, the norms' bf16 output before it is "
    "quantised, and fp8 under Megatron-FSDP"
)

FP8_HIGH_PRECISION = (
    "fp8 as torchao's float8 keeps it: the linear layers save their bf16 input and weight and cast them to fp8 for "
    "each GEMM, so the stored figures are bf16's; not modelled: the FSDP2 all-gather in float8"
)


TEXT_STEP = (
    "a step of text alone: MllamaTextModel skips the cross-attention layers without image states, so they keep no "
    "activations and get no gradients; a step on images (the vision encoder, its projector and the cross-attention "
    "over the image's tiles) is not modelled (docs/formulas.md §2.21)"
)


def unexpressed_notes(w: Workload) -> tuple[str, ...]:
    """What the workload asks for that the accounting does not express yet, said in the answer."""
    text = (TEXT_STEP,) if w.model.cross_attention is not None else ()
    if w.precision.compute_dtype not in ("fp8", "fp4"):
        return text
    if w.framework.fp8.saved == "high_precision":
        return (*text, FP8_HIGH_PRECISION)
    return (*text, FP8_TE if te_fp8(w) else FP8_UNEXPRESSED)


def memory_estimate(setup: TrainingSetup, layout: Layout, stages: bool = False) -> MemoryEstimate:
    """Memory of the most loaded GPU of one training step, for any parallel layout; with ``stages``, of one GPU
    of every pipeline stage (``memory_stages``)."""
    w, cluster, model, note = setup.workload, setup.cluster, setup.model, setup.resolved.note
    check_layout(w, layout, cluster)
    gpu = most_loaded_gpu(w, layout)
    capacity = setup.capacity
    inputs = (
        model_input(model, note),
        Input("cluster", "GPUs", cluster.label, origin=f"{cluster.count} × {cluster.hardware.label}"),
        Input("layout", "Layout", layout.label, origin=layout_origin(layout)),
        Input("precision", "Precision recipe", w.precision.name, origin=stored_text(w)),
        Input("optimizer", "Optimizer", w.optimizer.name, origin=optimizer_text(w.optimizer)),
        Input("seq_len", "Sequence length", w.seq_len, "tokens", setup.seq.origin),
        Input("micro_batch", "Micro-batch", w.micro_batch, "sequences", flag("micro_batch")),
        Input("grad_accum", "Micro-batches per step", layout.grad_accum, "micro-batches", flag("grad_accum")),
        Input("attention", "Attention kernel", w.attention, origin=flag("attention")),
        recompute_input(w),
        setup.framework_input,
        *method_inputs(w),
    )
    verdict_text = verdict_note(w, layout, gpu, capacity.bytes, setup.framework_named)
    notes = [*model_notes(model, note), *context_note(model, w.seq_len), *unexpressed_notes(w), *qlora_experts_note(w),
             verdict_text]  # fmt: skip
    single = checked(
        Result(
            "memory",
            f"Training memory per GPU: {model.label}",
            inputs,
            memory_sections(w, layout, gpu, capacity, cluster.gpus_per_node),
            tuple(notes),
            stack=MEMORY_STACK if not gpu.grads_unmade else _AT_PEAK_STACK,
            capacity="total.capacity",
            headline=(
                f"{model.label}, {layout.code} on {cluster.label}: {verdict(gpu, capacity.bytes)}",
                *setup.assumed_line,
            ),
        )
    )
    estimate = MemoryEstimate(single, w, layout, cluster, gpu)
    return memory_stages(estimate) if stages else estimate


def _memory_row(key: str, title: str, result: Result, parts: tuple[str, ...] = MEMORY_STACK) -> Section:
    """One row of a memory grid: the ``parts`` (what the bars stack), the total against the capacity."""
    terms = [replace(result.term(k), key=k.rpartition(".")[2]) for k in parts]
    terms += [result.term("total.total"), result.term("total.capacity"), result.term("total.headroom")]
    return Section(key, title, tuple(terms))


def memory_stages(single: MemoryEstimate) -> MemoryEstimate:
    """Memory of one GPU of every pipeline stage, one row each, beside ``single``, the most loaded GPU's estimate
    (whose inputs and advice it keeps): which stage binds, and how much room the others have (the stages differ
    in layers, in micro-batches in flight, in the embedding and the head)."""
    w, layout = single.workload, single.layout
    capacity = Capacity.of(single.cluster.hardware)
    rows = []
    gpus = tuple(gpu_memory(w, layout, stage) for stage in range(layout.pp))
    for stage, gpu in enumerate(gpus):
        stage_result = Result("memory", "", (), memory_sections(w, layout, gpu, capacity, single.cluster.gpus_per_node))
        row = _memory_row(f"stage{stage + 1}", f"stage {stage + 1}", stage_result, STAGE_PARTS)
        shape = (stage_result.term("activations.layers_on_gpu"), stage_result.term("activations.in_flight"))
        rows.append(replace(row, terms=(*shape, *row.terms)))
    totals = [gpu.total for gpu in gpus]
    heaviest = max(range(layout.pp), key=totals.__getitem__)
    lightest = min(range(layout.pp), key=totals.__getitem__)
    spread = (
        f"most loaded: stage {heaviest + 1} ({totals[heaviest] / GB:,.2f} GB); least: stage {lightest + 1} "
        f"({totals[lightest] / GB:,.2f} GB)"
    )
    notes = [spread if layout.pp > 1 else "one pipeline stage: every GPU holds the same", *single.report.notes]
    report = checked(
        Result(
            "memory-stages",
            f"{single.report.title}, stage by stage",
            single.report.inputs,
            tuple(rows),
            tuple(notes),
            layout="grid",
            stack=tuple(k.rpartition(".")[2] for k in STAGE_PARTS),
            capacity="capacity",
            headline=(
                f"{single.workload.model.label}, {layout.code} on {single.cluster.label}, the most loaded stage "
                f"({heaviest + 1} of {layout.pp}): {verdict(gpus[heaviest], capacity.bytes)}",
                *([spread] if layout.pp > 1 else []),
            ),
        )
    )
    return replace(single, report=report, stages=gpus)


def verdict(gpu: GpuMemory, capacity: float) -> str:
    """The memory's answer in a line: fits (with the headroom), tight or does NOT fit, and the largest part."""
    part, size = gpu.binding
    used = f"{gpu.total / GB:,.1f} GB of {capacity / GB:,.1f} GB per GPU"
    largest = f"the largest part is {part} ({size / GB:,.1f} GB)"
    return {
        "fits": f"fits, {used} ({(capacity - gpu.total) / GB:,.1f} GB free); {largest}",
        "tight": f"tight, {used} with the allocator's fragmentation; {largest}",
    }.get(gpu.verdict(capacity), f"does NOT fit, {used}; {largest}")


def verdict_note(w: Workload, layout: Layout, gpu: GpuMemory, capacity: float, named: bool = True) -> str:
    """``fits``; ``tight`` (only the allocator's fragmentation overflows: how it fragments decides); or ``does NOT
    fit``, naming the largest part and the levers that would make it fit."""
    verdict, total = gpu.verdict(capacity), gpu.total
    if verdict == "fits":
        return f"fits: {total / GB:,.1f} GB of {capacity / GB:,.1f} GB {how_counted(w.framework)}"
    if verdict == "tight":
        return (
            f"tight: {(total - gpu.fragmentation) / GB:,.1f} GB without fragmentation, {total / GB:,.1f} GB with the "
            f"{w.framework.name} profile's {w.framework.allocator.fragmentation:.0%}, of {capacity / GB:,.1f} GB: how "
            "PyTorch's allocator fragments decides (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True helps)"
        )
    part, size = gpu.binding
    return (
        f"does NOT fit: {total / GB:,.1f} GB needed of {capacity / GB:,.1f} GB; the largest part is {part} "
        f"({size / GB:,.1f} GB)" + levers.fit_advice(w, layout, capacity, named)
    )


@dataclass(frozen=True)
class MemorySweepEstimate(Estimate):
    """Memory at several values of one setting: one ``MemoryEstimate`` per value, in ``rows``."""

    rows: tuple[tuple[str, MemoryEstimate], ...]


def memory_sweep(
    *, sweep: str, model: ModelLike, gpus: ClusterLike = "1xH100", **settings: Unpack[MemorySettings]
) -> MemorySweepEstimate:
    """``memory`` at each value of one setting, ``sweep="seq=1k,4k,16k"``, ``"micro-batch=1,2,4"``, ``"zero=0,1,2,3"``
    or a parallel degree (``"tp=1,2,4,8"``, pp, cp, ep): one row each, to see how the parts grow or shrink."""
    accept(settings, MemorySettings, "memory_sweep")
    name, values = _sweep(sweep)
    rows = []
    for value in values:
        one: MemorySettings = {"seq": value} if name == "seq" else {name.replace("-", "_"): _sweep_count(name, value)}  # type: ignore[misc]
        merged: MemorySettings = {**settings, **one}
        rows.append((value, memory(model=model, gpus=gpus, **merged)))
    sections = [_memory_row(f"{name}={value}", f"{name}={value}", row.report, STAGE_PARTS) for value, row in rows]
    first = rows[0][1].report
    inputs = tuple(i for i in first.inputs if i.key not in ("seq_len", "micro_batch"))
    report = Result(
        "memory-sweep",
        f"{first.title}, sweeping {SWEEPABLE[name]}",
        inputs,
        tuple(sections),
        (f"capacity {first.term('total.capacity').text} per GPU",),
        layout="grid",
        stack=tuple(k.rpartition(".")[2] for k in STAGE_PARTS),
        capacity="capacity",
        headline=(sweep_headline(first.headline[0].partition(":")[0], sections),),
    )
    return MemorySweepEstimate(report, tuple(rows))


def sweep_headline(what: str, rows: list[Section]) -> str:
    """Which of a sweep's rows fit, and the least memory among those that do not."""
    fit = [row.title for row in rows if row.term("total").value <= row.term("capacity").value]
    over = [row for row in rows if row.title not in fit]
    if not over:
        return f"{what}: fits at {', '.join(fit)}"
    least = min(over, key=lambda row: row.term("total").value)
    missing = f"{least.term('total').formatted(compact=True)} of {least.term('capacity').formatted(compact=True)}"
    return (
        f"{what}: fits at {', '.join(fit) or 'none of them'}; not at {', '.join(row.title for row in over)} "
        f"({least.title} needs {missing} per GPU)"
    )


def _sweep_count(name: str, value: str) -> int:
    """A swept count: ZeRO's stage from 0, the others from 1."""
    if name == "zero":
        if value not in ("0", "1", "2", "3"):
            raise LmcalcError(f"{setting('sweep')} zero takes the stages 0, 1, 2 and 3, not {value!r}")
        return int(value)
    return whole_count(value, "sweep")


def _sweep(text: str) -> tuple[str, list[str]]:
    """``seq=1k,4k`` -> ('seq', ['1k', '4k'])."""
    name, _, values = text.partition("=")
    name = name.strip().lower()
    items = [v.strip() for v in values.split(",") if v.strip()]
    if name not in SWEEPABLE or not items:
        raise LmcalcError(f"cannot read {setting('sweep')} {text!r}; expected {SWEEP_EXAMPLES}")
    return name, items
