"""What fits: the largest micro-batch, sequence and fewest GPUs for a layout (``fit``), and the largest model a
cluster can train (``max_params``)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Unpack

from lmcalc.engine.choices import ZeroStage
from lmcalc.engine.parallel.layout import Layout
from lmcalc.engine.parallel.layout_checks import check_layout
from lmcalc.engine.search import maxparams as mp
from lmcalc.engine.workload import Workload
from lmcalc.errors import LmcalcError, flag, setting
from lmcalc.estimates import levers as lever_rules
from lmcalc.estimates.inputs import (
    DEFAULT_ATTENTION,
    DEFAULT_RECOMPUTE,
    ClusterLike,
    FrameworkLike,
    ModelLike,
    OptimizerLike,
    PrecisionLike,
    accept,
    checked,
    framework_of,
    framework_text,
    how_counted,
    method_inputs,
    model_input,
    model_notes,
    optimizer_text,
    qlora_experts_note,
    recipe_text,
    stored_text,
)
from lmcalc.estimates.settings import (
    DEFAULT_OPTIMIZER,
    DEFAULT_PRECISION,
    Bytes,
    Count,
    MemorySettings,
    MethodSettings,
    TrainingSettings,
)
from lmcalc.estimates.shown import Estimate
from lmcalc.estimates.training import (
    TrainingSetup,
    build_layout,
    default_framework,
    layout_settings,
    recompute_input,
    training_settings,
    training_setup,
)
from lmcalc.result import Input, Result, Section, Term
from lmcalc.units import GB, GiB, format_quantity, group

if TYPE_CHECKING:  # the solvers are imported when a search is asked for, not at start-up
    from lmcalc.engine.search import fit as fit_engine
    from lmcalc.specs import Cluster


# ------------------------------------------------------------------------------------------------- fit


@dataclass(frozen=True)
class FitEstimate(Estimate):
    """What fits on one GPU type for a layout: each search's ``Limit`` (its value, the memory there, what binds)."""

    workload: Workload
    layout: Layout
    micro_batch: fit_engine.Limit
    seq: fit_engine.Limit
    dp: fit_engine.Limit


def fit(*, model: ModelLike, gpus: ClusterLike = "8xH100", **settings: Unpack[MemorySettings]) -> FitEstimate:
    """The largest micro-batch, the longest sequence and the fewest GPUs that fit a layout, and what binds each;
    ``settings`` as ``memory`` takes them."""
    accept(settings, MemorySettings, "fit")
    given_layout = layout_settings(settings)
    setup = training_setup(model, gpus, training_settings(settings), given_layout)
    return fit_estimate(setup, build_layout(setup.cluster, given_layout))


LIMITS = (
    ("micro_batch", "Largest micro-batch", "sequences", "b"),
    ("seq", "Longest sequence", "tokens", "s"),
    ("dp", "Fewest data-parallel replicas", "GPUs", "DP"),
)
"""``fit``'s three limits: key, label, unit and symbol."""


def fit_estimate(setup: TrainingSetup, layout: Layout) -> FitEstimate:
    """The largest micro-batch, the longest sequence and the fewest GPUs that fit, each with its binding part."""
    from lmcalc.engine.search import fit as fit_engine  # only this command searches

    w, cluster, model, note = setup.workload, setup.cluster, setup.model, setup.resolved.note
    check_layout(w, layout, cluster)
    capacity = cluster.hardware.capacity_bytes
    setting_ = fit_engine.Setting(w, layout, capacity)
    found_limits = (
        fit_engine.largest_micro_batch(setting_),
        fit_engine.longest_sequence(setting_),
        fit_engine.fewest_data_parallel(setting_),
    )
    sections = [_limit_section(kind, limit, layout, cluster) for kind, limit in zip(LIMITS, found_limits, strict=True)]
    if w.recompute != "full":
        sections.append(_checkpointed(w, layout, capacity))
    if found_limits[0].value is None:  # not even one sequence fits: what would
        sections.append(lever_rules.levers_section(w, layout, cluster, capacity, setup.framework_named))
    inputs = (
        model_input(model, note),
        Input("gpu", "GPU", cluster.hardware.name, origin=cluster.hardware.capacity_label),
        Input("layout", "Layout", layout.label, origin="searched one setting at a time from this layout"),
        Input("precision", "Precision recipe", w.precision.name, origin=stored_text(w)),
        Input("optimizer", "Optimizer", w.optimizer.name, origin=optimizer_text(w.optimizer)),
        Input("seq_len", "Sequence length", w.seq_len, "tokens", setup.seq.origin),
        Input("micro_batch", "Micro-batch", w.micro_batch, "sequences", flag("micro_batch")),
        recompute_input(w),
        setup.framework_input,
        *method_inputs(w),
    )
    notes = (
        *model_notes(model, note),
        *qlora_experts_note(w),
        "each line changes one setting and keeps the others; the fewest GPUs keeps TP, PP and CP and grows DP",
    )
    report = checked(
        Result(
            "fit",
            f"What fits on {cluster.hardware.name}: {model.label}",
            inputs,
            tuple(sections),
            notes,
            headline=fit_headline(f"{model.label}, {layout.code} on {cluster.hardware.name}", w, found_limits, sections)
            + setup.assumed_line,
        )
    )
    return FitEstimate(report, w, layout, *found_limits)


def _limit_section(
    kind: tuple[str, str, str, str], limit: fit_engine.Limit, layout: Layout, cluster: Cluster
) -> Section:
    """One limit: its value (or that none fits) and what binds it; for the fewest replicas, the GPUs and nodes they
    take; the memory at the limit."""
    (key, label, unit, symbol), capacity = kind, cluster.hardware.capacity_bytes
    found = limit.value is not None
    beyond = (
        f"; at {symbol} = {limit.beyond_value}: {limit.beyond.total / GB:.2f} GB"
        if limit.beyond is not None and limit.beyond_value is not None
        else ""
    )
    at_limit = f"at {symbol} = {limit.value}: {limit.fits.total / GB:.2f} GB" if limit.fits else "nothing fits"
    terms = [
        Term(
            "value",
            label if found else f"{label}: none fits",
            limit.value or 0,
            unit if key != "dp" else "replicas",
            f"{'smallest' if key == 'dp' else 'largest'} {symbol} with memory ≤ {capacity / GB:.4g} GB"
            if found
            else f"binding: {limit.binding}",
            at_limit + beyond,
            note=f"binding: {limit.binding}",
        )
    ]
    if key == "dp" and limit.value is not None:
        gpus = limit.value * layout.tp * layout.pp * layout.cp
        terms.append(
            Term(
                "gpus",
                "Fewest GPUs",
                gpus,
                "GPUs",
                "DP · TP · PP · CP",
                f"{limit.value} × {layout.tp} × {layout.pp} × {layout.cp}",
            )
        )
        terms.append(
            Term(
                "nodes",
                f"Nodes of {cluster.hardware.gpus_per_node}",
                -(-gpus // cluster.hardware.gpus_per_node),
                "nodes",
                "⌈GPUs / GPUs per node⌉",
            )
        )
    if limit.fits:
        terms.append(
            Term(
                "memory",
                "Memory at the limit",
                limit.fits.total,
                "bytes",
                "reserved + CUDA context + overhead allowance (as lmcalc memory counts it)",
            )
        )
    return Section(key, f"{label} — binding: {limit.binding}", tuple(terms))


def fit_headline(
    what: str, w: Workload, limits: tuple[fit_engine.Limit, ...], sections: list[Section]
) -> tuple[str, ...]:
    """The limits in a line and what binds them; when not even one sequence fits, the lever that fits best."""
    micro_batch, seq, dp = limits
    terms = {(section.key, term.key): term for section in sections for term in section.terms}
    if micro_batch.value is None:
        best = terms.get(("levers", "lever1"))
        lever = f"; the best lever: {best.label} ({best.formatted(compact=True)}, {best.formula})" if best else ""
        return (f"{what}: one sequence of {w.seq_len:,} tokens does NOT fit ({micro_batch.binding}){lever}",)
    fewest = f"{terms['dp', 'gpus'].text} at the fewest" if ("dp", "gpus") in terms else "no GPU count fits"
    longest = "no sequence fits at that micro-batch" if seq.value is None else f"sequence up to {seq.value:,} tokens"
    return (
        f"{what}: micro-batch up to {micro_batch.value} at {w.seq_len:,} tokens, {longest}, {fewest}",
        f"binding: {micro_batch.binding} (micro-batch); {dp.binding} (GPUs)",
    )


CHECKPOINTING = "Chen et al. 2016 (gradient checkpointing); Korthikanti et al. 2022 §4.2.3"


def _checkpointed(w: Workload, layout: Layout, capacity: float) -> Section:
    """The longest sequence and the largest micro-batch with gradient checkpointing (full recomputation), the
    lever fine-tuners pull first: each layer keeps only its input, and one layer is rebuilt at a time."""
    from lmcalc.engine.search import fit as fit_engine

    lever = lever_rules.Lever(*lever_rules.fully_recomputed(w), layout)  # the all-to-all overlap off with it
    setting_ = fit_engine.Setting(lever.workload, layout, capacity)
    seq, batch = fit_engine.longest_sequence(setting_), fit_engine.largest_micro_batch(setting_)
    terms = []
    for key, label, unit, limit in (
        ("seq", "Longest sequence", "tokens", seq),
        ("micro_batch", f"Largest micro-batch at {w.seq_len} tokens", "sequences", batch),
    ):
        where = f"{limit.fits.total / GB:.2f} GB at the limit" if limit.fits else "nothing fits"
        terms.append(
            Term(
                key,
                label,
                limit.value or 0,
                unit,
                f"{lever.text}, every other setting as above; {where}",
                note=f"binding: {limit.binding}",
                source=CHECKPOINTING,
            )  # fmt: skip
        )
    return Section("checkpointed", f"With gradient checkpointing ({lever.text})", tuple(terms))


# ------------------------------------------------------------------------------------------------- max-params


@dataclass(frozen=True)
class MaxParamsEstimate(Estimate):
    """The largest trainable model per sharding strategy, one ``MaxParamsRow`` each."""

    rows: tuple[mp.MaxParamsRow, ...]


def max_params(
    *,
    gpus: ClusterLike,
    optimizer: OptimizerLike = DEFAULT_OPTIMIZER,
    precision: PrecisionLike = DEFAULT_PRECISION,
    seq: Count = "4096",
    micro_batch: int = 1,
    attention: str = DEFAULT_ATTENTION,
    recompute: str = DEFAULT_RECOMPUTE,
    framework: FrameworkLike | None = None,
    overhead: Bytes | None = None,
    like: ModelLike = "llama-3.1-8b",
    **fine_tuning: Unpack[MethodSettings],
) -> MaxParamsEstimate:
    """The largest model whose training state fits the GPUs, for plain data parallelism and ZeRO-1/2/3; the
    activation column scales the proportions of the model ``like`` to each size. With a fine-tuning method
    (``fine_tuning``: LoRA or QLoRA and their settings, offload), the largest model that method can fine-tune."""
    accept(fine_tuning, MethodSettings, "max_params")
    if fine_tuning.get("method") == "freeze":
        raise LmcalcError(
            f"max-params scales the model, and {setting('freeze_layers')} counts the layers of one model: ask "
            "'lmcalc memory' or 'lmcalc fit' for the freeze method"
        )
    settings = TrainingSettings(
        seq=seq,
        micro_batch=micro_batch,
        precision=precision,
        optimizer=optimizer,
        attention=attention,
        recompute=recompute,
        framework=framework,
        overhead=overhead,
        **fine_tuning,
    )
    setup = training_setup(like, gpus, settings)
    return max_params_estimate(setup)


def max_params_estimate(setup: TrainingSetup) -> MaxParamsEstimate:
    w, cluster, template = setup.workload, setup.cluster, setup.model
    precision, optimizer = w.precision, w.optimizer
    capacity = cluster.hardware.capacity_bytes

    def runs(stage: int) -> Workload:  # no framework named: each ZeRO stage's own default, as memory's would be
        return replace(w, framework=framework_of(default_framework(w.method, {"zero": stage})[0]))

    workload_of = (lambda stage: w) if setup.framework_named else runs
    rows = mp.max_params(w, cluster, workload_of)
    sections = [_zero_section(row, capacity, template.name) for row in rows]
    inputs = (
        Input("cluster", "GPUs", cluster.label, origin=f"{cluster.count} × {cluster.hardware.label}"),
        Input("capacity", "Memory per GPU", capacity, "bytes", cluster.hardware.capacity_label),
        Input("precision", "Precision recipe", precision.name, origin=recipe_text(precision)),
        Input("optimizer", "Optimizer", optimizer.name, origin=optimizer_text(optimizer)),
        Input("framework", "Framework", w.framework.name, origin=framework_text(w.framework)),
        *method_inputs(w),
        Input("seq_len", "Sequence length (activations)", w.seq_len, "tokens", flag("seq")),
        Input("micro_batch", "Micro-batch (activations)", w.micro_batch, "sequences", flag("micro_batch")),
        Input("template", "Shape for activations", template.name, origin=flag("like")),
    )
    replicated, sharded = rows[0], rows[-1]
    napkin = (
        f"N = C / bytes per parameter: {capacity / GB:.4g} GB / {replicated.bytes_per_param:g} B = "
        f"{replicated.states_only / 1e9:.3g}B replicated on every GPU; fully sharded over {cluster.count} GPUs "
        f"{sharded.states_only / 1e9:.3g}B (the lecture's napkin: 8 × 80 GB / 16 B ≈ 40B on 8 H100s)"
        if replicated.zero_stage == 0
        else f"N = C / bytes per parameter: {_states_text(sharded, capacity, cluster.count)}"
    )
    notes = (
        napkin,
        f"activations assume the proportions of {template.name} scaled to N, {w.attention} attention, "
        f"recomputation: {w.recompute}; the whole-memory column takes the widest such shape that fits (whole KV "
        "groups), then at its width as many layers as fit",
        f"memory {how_counted(w.framework)}; each shape checked with the figure lmcalc memory gives for "
        f"{flag('gpus')} {cluster.label} {flag('zero')} N",
        *(
            f"{row.label} costed as {row.framework} runs it (no framework named: ZeRO-{row.zero_stage} without model "
            f"parallelism is a transformers model under DeepSpeed; {flag('framework')} to choose)"
            for row in rows
            if row.framework != w.framework.name
        ),
        *(
            (
                f"{flag('offload')} optimizer+params moves the weights off the GPU, which only ZeRO-3 fetches a layer "
                "at a time: the other strategies are left out, and the states-only limit is the host's memory",
            )
            if w.offload.params
            else ()
        ),  # fmt: skip
    )
    largest = max(rows, key=lambda row: row.with_activations)
    report = Result(
        "max-params",
        f"Largest trainable model on {cluster.label}",
        inputs,
        tuple(sections),
        notes,
        layout="grid",
        headline=max_params_headline(rows, largest, workload_of, cluster),
    )
    return MaxParamsEstimate(report, tuple(rows))


def _states_text(row: mp.MaxParamsRow, capacity: float, gpus: int) -> str:
    """The states-only figure of ``row`` and how it is reached: C, the GPUs that shard the states, the bytes a
    parameter."""
    if not math.isfinite(row.states_only):
        return "no limit on the GPU (every state offloaded: the host's memory limits them)"
    if row.zero_stage == 3 and gpus > 1:
        how = f"{gpus} × {capacity / GB:.4g} GB / {row.bytes_per_param * gpus:.4g} B a parameter"
    else:
        how = f"{capacity / GB:.4g} GB / {row.bytes_per_param:.4g} B a parameter"
    return f"{format_quantity(row.states_only, 'params')} ({how})"


def max_params_headline(
    rows: list[mp.MaxParamsRow], largest: mp.MaxParamsRow, workload_of: Callable[[int], Workload], cluster: Cluster
) -> tuple[str, ...]:
    """The answer, under which profile and workload; the states-only figure beside it and what binds between the
    two (the largest part of the memory at the answer); the lever that lifts it and how far; then the others."""
    capacity, w = cluster.hardware.capacity_bytes, workload_of(largest.zero_stage)
    n = format_quantity(largest.with_activations, "params")
    lines = [
        f"On {cluster.label} ({w.framework.name} profile): up to {n} with {largest.label}, the whole memory counted "
        f"at {w.seq_len:,} tokens × micro-batch {w.micro_batch}, recomputation {w.recompute}"
    ]
    memory = largest.memory
    states = _states_text(largest, capacity, cluster.count)
    if memory is None:
        return (*lines, f"states alone: {states}; but not even the smallest shape fits")
    part, _ = memory.binding
    host = f" (and {memory.offloaded / GB:.1f} GB of host memory a GPU)" if memory.offloaded else ""
    lines.append(
        f"states alone: {states}; at {n} the states take {memory.states_at_peak / GB:.1f} GB{host}, the activations "
        f"{memory.activations / GB:.1f} GB of {capacity / GB:.4g} GB: {part} bind"
    )
    for text, stage, lever_w, lever_cluster in _levers(part, largest.zero_stage, workload_of, cluster):
        lifted = mp.largest(lever_w, lever_cluster, stage)
        if lifted.with_activations > largest.with_activations:  # the first lever that lifts it
            offloaded = lifted.memory.offloaded if lifted.memory else 0.0
            host = f", with {offloaded / GB:,.0f} GB of host memory a GPU" if offloaded else ""
            lines.append(f"the lever: {text} lifts it to {format_quantity(lifted.with_activations, 'params')}{host}")
            break
    others = [row for row in rows if row.with_activations != largest.with_activations]  # one GPU: ZeRO shards none
    if others:
        lines.append("; ".join(f"{row.label}: {format_quantity(row.with_activations, 'params')}" for row in others))
    return tuple(lines)


Lever = tuple[str, ZeroStage, Workload, "Cluster"]
"""A lever for max-params' headline: its flags, the ZeRO stage, the workload and the cluster."""


def _levers(part: str, stage: ZeroStage, workload_of: Callable[[int], Workload], cluster: Cluster) -> list[Lever]:
    """What may lift a limit whose largest part is ``part``, in the order to try: for activations, full
    recomputation, then half the sequence; for the model states, twice the GPUs (ZeRO-3 shards the states over
    them), then the optimizer offloaded. Each: its flags, the ZeRO stage, the workload and the cluster."""
    w = workload_of(stage)
    if part == "activations":
        recomputed = lever_rules.Lever(*lever_rules.fully_recomputed(w), None)  # and the overlap off
        full: list[Lever] = [(recomputed.text, stage, recomputed.workload, cluster)]
        half: list[Lever] = [(f"{flag('seq')} {w.seq_len // 2}", stage, replace(w, seq_len=w.seq_len // 2), cluster)]
        return (full if w.recompute != "full" else []) + (half if w.seq_len > 1 else [])
    if part == "model states":
        more = replace(cluster, count=2 * cluster.count)
        levers: list[Lever] = [(f"{flag('gpus')} {more.label} with ZeRO-3", 3, workload_of(3), more)]
        if not w.offload.optimizer:
            offload = replace(w, offload=replace(w.offload, target="optimizer"))
            levers.append((f"{flag('offload')} optimizer", stage, offload, cluster))
        return levers
    return []


def _zero_section(row: mp.MaxParamsRow, capacity: float, template: str) -> Section:
    """One ZeRO stage's row: state bytes per parameter, and the largest N by states alone, with the fixed bytes,
    and with the whole memory of a shape scaled from the template."""
    return Section(
        f"zero{row.zero_stage}",
        row.label,
        (
            Term(
                "bytes_per_param",
                "State bytes per parameter per GPU",
                row.bytes_per_param,
                "bytes",
                BYTES_PER_PARAM_FORMULA[row.zero_stage],
                source="Rajbhandari et al. 2020 (ZeRO) §5.1",
                note=f"the model states as the {row.framework} profile keeps them",
            ),
            Term(
                "states_only",
                "Largest N (states only)",
                row.states_only,
                "params",
                "C / bytes per param",
                f"{group(capacity)} / {row.bytes_per_param:.6g}",
                note="" if math.isfinite(row.states_only) else "no state on the GPU: the host's memory limits N",
            ),
            Term(
                "with_overhead",
                "Largest N (+ fixed bytes)",
                row.with_overhead,
                "params",
                "(C − context − workspaces − allowance) / bytes per param",
                f"({group(capacity)} − {group(row.fixed_bytes)}) / {row.bytes_per_param:.6g}",
            ),
            Term(
                "with_activations",
                "Largest N (whole memory)",
                row.with_activations,
                "params",
                "parameters of the largest shape whose memory M (as lmcalc memory counts it) fits C: the widest of "
                "the template's proportions that fits (L_g layers), then L = L_g + ⌊(C − M(L_g)) / m⌋",
                _solved_text(row.solved, capacity),
                note=f"shape scaled from {template} by whole KV groups, then deepened layer by layer; never rounded up",
            ),
        ),
    )


def _solved_text(solved: mp.Solved | None, capacity: float) -> str:
    """The whole-memory answer's derivation in numbers: the rung, the bytes a layer adds, the layers added, the total
    and the total with one layer more."""
    if solved is None:
        return "nothing fits"
    m, rung = solved.layer_bytes, solved.rung_memory
    return (
        f"{mp.shape_text(solved.shape)}: L_g = {solved.rung_layers} ({format_quantity(solved.rung_params, 'params')}"
        f", M(L_g) = {rung / GB:.2f} GB), m = {m / GB:.3f} GB a layer, ⌊({capacity / GB:.4g} − {rung / GB:.2f}) / "
        f"{m / GB:.3f}⌋ = {solved.added_layers} more; activations {solved.memory.activations / GiB:.2f} GiB, total "
        f"{solved.memory.total / GB:.2f} GB (one layer more: {solved.beyond / GB:.2f} GB)"
    )


BYTES_PER_PARAM_FORMULA = {0: "p + g + (m + o)", 1: "p + g + (m + o)/n", 2: "p + (g + m + o)/n", 3: "(p + g + m + o)/n"}
"""Per-GPU state bytes per parameter at each ZeRO stage: p weights, g gradients, m master, o optimizer; n replicas."""
