"""Memory per GPU of serving a model: its weights (any dtype, int8/int4 included) and the KV cache on the GPUs
given, the largest batch and the longest context that fit, and the fewest GPUs it would fit on
(``lmcalc memory --inference``)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Unpack

from lmcalc.engine.inference import serving as inf
from lmcalc.engine.inference import terms as inf_terms
from lmcalc.engine.memory.terms import Capacity
from lmcalc.engine.parallel.layout_checks import check_tp_heads
from lmcalc.errors import LmcalcError, flag, setting
from lmcalc.estimates.inputs import (
    DEFAULT_OVERHEAD,
    ClusterLike,
    Given,
    ModelLike,
    accept,
    checked,
    cluster_of,
    context_note,
    model_input,
    model_notes,
    nbytes,
    positive_int,
    resolve_model,
    seq_given,
)
from lmcalc.estimates.setting_groups import with_defaults
from lmcalc.estimates.settings import Bytes, ServingSettings
from lmcalc.estimates.shown import Estimate
from lmcalc.presets import Resolved
from lmcalc.result import Input, Result
from lmcalc.specs import Cluster, HardwareSpec, ModelSpec
from lmcalc.units import format_quantity


def _given_tp(serving: inf.Serving, cluster: Cluster) -> int:
    """The tensor-parallel group the GPUs given make: the most GPUs of one node that divide the GPUs given and that
    the heads split over (``check_tp_heads`` with replicated KV heads)."""
    within = min(cluster.count, cluster.gpus_per_node)
    for tp in range(within, 1, -1):
        if within % tp == 0 and _splits(serving.model, tp):
            return tp
    return 1


def _splits(model: ModelSpec, tp: int) -> bool:
    try:
        check_tp_heads(model, tp, replicate_kv=True)
    except LmcalcError:
        return False
    return True


def _replicas_note(cluster: Cluster, tp: int) -> tuple[str, ...]:
    replicas = cluster.count // tp
    if replicas < 2:
        return ()
    return (f"{cluster.label} serve as {replicas} replicas of TP={tp}: the batch and the memory are each replica's",)


def _fewest_line(serving: inf.Serving, cluster: Cluster, capacity: float) -> tuple[str, ...]:
    """The headline's line on the fewest GPUs serving fits, where that is fewer than the GPUs it is on."""
    fewest = _serving_tp(serving, cluster, capacity)
    if fewest >= serving.tp:
        return ()
    try:
        held = inf.inference_memory(replace(serving, tp=fewest), capacity)
    except LmcalcError:  # the weights alone do not fit
        return ()
    if held.total_per_gpu > capacity:
        return ()
    each = format_quantity(held.total_per_gpu, "bytes", compact=True)
    on = f"{fewest} GPUs (TP={fewest}), {each} per GPU" if fewest > 1 else f"one GPU, {each}"
    return (f"it would fit on as few as {on}",)


def _serving_tp(serving: inf.Serving, cluster: Cluster, capacity: float) -> int:
    """1 when ``serving`` (weights, KV cache and the allowance) fits one GPU; else the smallest power-of-two split
    of the cluster's GPUs that serving can take (``check_tp_heads`` with replicated KV heads) and that it fits;
    else the smallest the weights fit, so that the table says how far the cache misses; else the largest split,
    so that the error says by how much the weights miss even then."""
    weights_fit = largest = None
    for tp in (2**k for k in range(cluster.count.bit_length()) if 2**k <= cluster.count):
        try:
            check_tp_heads(serving.model, tp, replicate_kv=True)
        except LmcalcError:
            continue
        largest = tp
        try:
            held = inf.inference_memory(replace(serving, tp=tp), capacity)
        except LmcalcError:  # the weights alone do not fit
            continue
        if held.total_per_gpu <= capacity:
            return tp
        weights_fit = weights_fit or tp
    return weights_fit or largest or 1


@dataclass(frozen=True)
class InferenceEstimate(Estimate):
    """Serving memory per GPU: ``memory`` holds the weights, the KV cache and the largest batch and context."""

    serving: inf.Serving
    memory: inf.InferenceMemory

    @property
    def max_batch(self) -> int:
        return self.memory.max_batch

    @property
    def max_context(self) -> int:
        return self.memory.max_context


def inference(
    *,
    model: ModelLike,
    gpus: ClusterLike = "1xH100",
    tp: int | None = None,
    overhead: Bytes | None = None,
    **settings: Unpack[ServingSettings],
) -> InferenceEstimate:
    """Serving memory per GPU: weights (any dtype, int8/int4 included), the KV cache, and what fits. Without ``tp``,
    the GPUs given serve as one tensor-parallel group (up to a node, as far as the heads split; more GPUs are
    replicas), and the headline adds the fewest GPUs it would fit. Without ``overhead``, the flat serving allowance
    (``DEFAULT_OVERHEAD``: serving has no framework profile to count the context, workspaces and the forward pass's
    activations)."""
    accept(settings, ServingSettings, "inference")
    given = with_defaults(settings, ServingSettings)
    resolved = resolve_model(model, counting="serving")
    spec, note = resolved.spec, resolved.note
    cluster = cluster_of(gpus)
    batch = positive_int(given["batch"], "batch")
    context_in = seq_given(given["context"], spec, "context")
    hardware = cluster.hardware
    capacity = Capacity.of(hardware)
    overhead_bytes = nbytes(DEFAULT_OVERHEAD if overhead is None else overhead, "overhead")
    context_len, quant_group = int(context_in.value), given["quant_group"]
    serving = inf.Serving(
        spec, context_len, batch, given["weights_dtype"], given["kv_dtype"], 1, quant_group, overhead_bytes
    )
    serving = replace(serving, tp=_given_tp(serving, cluster) if tp is None else positive_int(tp, "tp"))
    if serving.tp > cluster.count:
        raise LmcalcError(f"{setting('tp')} {serving.tp} needs more GPUs than the {cluster.count} of {cluster.label}")
    held = inf.inference_memory(serving, capacity.bytes)
    sections = inf_terms.inference_sections(serving, held, capacity)
    inputs = _serving_inputs(resolved, cluster, serving, tp is None, context_in)
    # memory would hold a longer context than the model was trained for: the table's note is said below it too
    beyond = next(s for s in sections if s.key == "per_gpu").term("max_context").note
    notes = (
        *model_notes(spec, note),
        *context_note(spec, serving.context),
        "inference keeps no gradients and no optimizer states: weights, the KV cache and a working allowance",
        *([beyond] if beyond else []),
        *_replicas_note(cluster, serving.tp),
    )
    report = checked(
        Result(
            "memory-inference",
            f"Inference memory per GPU: {spec.label}",
            inputs,
            sections,
            notes,
            stack=inf_terms.INFERENCE_STACK,
            capacity=inf_terms.INFERENCE_CAPACITY,
        )
    )
    headline = serving_headline(report, spec, hardware, serving.tp, cluster.count // serving.tp)
    if tp is None:
        headline += _fewest_line(serving, cluster, capacity.bytes)
    return InferenceEstimate(replace(report, headline=headline), serving, held)


def _serving_inputs(
    resolved: Resolved, cluster: Cluster, serving: inf.Serving, chosen: bool, context: Given
) -> tuple[Input, ...]:
    """Serving's inputs table; the tensor-parallel split is the fewest GPUs it fits where it was ``chosen``."""
    tp = serving.tp
    return (
        model_input(resolved.spec, resolved.note),
        Input("gpu", "GPU", cluster.hardware.name, origin=cluster.hardware.capacity_label),
        Input(
            "tp",
            "Tensor-parallel GPUs",
            tp,
            origin=f"{cluster.label}, one group within a node" if chosen and tp > 1 else flag("tp"),
        ),
        Input("batch", "Batch", serving.batch, "sequences", flag("batch")),
        Input("context", "Context", serving.context, "tokens", context.origin),
        Input("weights_dtype", "Weights dtype", serving.weights_dtype, origin=flag("weights_dtype")),
        Input("kv_dtype", "KV-cache dtype", serving.kv_dtype, origin=flag("kv_dtype")),
    )


def serving_headline(
    report: Result, spec: ModelSpec, hardware: HardwareSpec, tp: int, replicas: int = 1
) -> tuple[str, ...]:
    """Serving's answer: fits or not on each GPU (of ``replicas`` groups of ``tp``), and the largest batch and the
    longest context that do."""
    per_gpu = {term.key: term for term in next(s for s in report.sections if s.key == "per_gpu").terms}
    total, capacity = per_gpu["total"], per_gpu["capacity"]
    fits = "fits" if total.value <= capacity.value else "does NOT fit"
    on = f"on {tp} × {hardware.name} (TP={tp})" if tp > 1 else f"on one {hardware.name}"
    if replicas > 1:
        on = f"on {replicas * tp} × {hardware.name} ({replicas} replicas of TP={tp})"
    used = f"{total.formatted(compact=True)} of {capacity.formatted(compact=True)} per GPU"
    weights, cache = (per_gpu[key].formatted(compact=True) for key in ("weights", "kv_cache"))
    parts = f"weights {weights}, KV cache {cache}"
    room = "; ".join(f"{per_gpu[key].label.lower()}: {per_gpu[key].text}" for key in ("max_batch", "max_context"))
    if per_gpu["max_batch"].note.startswith("no cache of its own"):  # a drafter: its backbone's cache decides
        room = per_gpu["max_batch"].note
    return (f"{spec.label} {on}: {fits}, {used} ({parts})", room)
