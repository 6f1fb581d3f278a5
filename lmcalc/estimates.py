"""The estimates behind each command, as result objects: the public Python API of lmcalc.

Each function takes validated specs and plain numbers, calls the engine, and returns a ``Result``
whose inputs say where every value came from (the user, a preset, or a documented default).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from lmcalc.engine import flops as fl
from lmcalc.engine import layout as ly
from lmcalc.engine import maxparams as mp
from lmcalc.engine import memory as mem
from lmcalc.engine import optimal as opt
from lmcalc.engine.numerics import FORMATS, dtype_bytes, tensor_elements
from lmcalc.engine.optimal import TOKENS_PER_PARAM
from lmcalc.engine.params import count_params, matches_published, params_section
from lmcalc.engine.time import DEFAULT_MFU, RunTime, check_mfu, gpus_for_deadline, peak_for, time_terms, whole_gpus
from lmcalc.errors import LmcalcError
from lmcalc.result import Input, Result, Section, Term
from lmcalc.specs import Cluster, HardwareSpec, ModelSpec, OptimizerSpec, PrecisionRecipe
from lmcalc.units import GB, GiB, group, sci

if TYPE_CHECKING:  # the planner is imported when a plan is asked for, not at start-up
    from lmcalc.engine import plan as pl

DEFAULT_SEQ_CAP = 8192


@dataclass(frozen=True)
class Given:
    """A value and where it came from, for the inputs table."""

    value: float
    origin: str


def checked(result: Result) -> Result:
    """Refuse to print a figure that overflowed or vanished: name it instead of printing inf or NaN."""
    for section in result.sections:
        for term in section.terms:
            if not math.isfinite(term.value):
                raise LmcalcError(
                    f"{term.label} is out of range ({term.value}) for these inputs; "
                    "check the sizes, --tokens, --days and --mfu"
                )
    return result


def default_tokens(model: ModelSpec) -> Given:
    """The preset's published training tokens, else the compute-optimal ~20 tokens per parameter."""
    if model.training_tokens:
        return Given(model.training_tokens, f"preset: {model.training_tokens_source or 'published'}")
    n = fl.napkin_params(model)
    return Given(
        TOKENS_PER_PARAM * n,
        f"default: compute-optimal 20 tokens/parameter (Hoffmann et al. 2022) × {group(n)}",
    )


def default_seq_len(model: ModelSpec) -> Given:
    seq = min(model.max_seq_len, DEFAULT_SEQ_CAP)
    return Given(seq, f"default: min(model context {model.max_seq_len}, {DEFAULT_SEQ_CAP})")


def default_mfu() -> Given:
    return Given(DEFAULT_MFU, "assumption: default MFU (published large runs reach 0.38–0.56; see docs)")


def _recipe_text(precision: PrecisionRecipe) -> str:
    return (
        f"{precision.param_bytes:g} B weights + {precision.grad_bytes:g} B grads + {precision.master_bytes:g} B "
        f"master + {precision.optimizer_state_bytes:g} B per optimizer state; matmuls at the "
        f"{precision.compute_dtype} peak"
    )


def _optimizer_text(optimizer: OptimizerSpec) -> str:
    return "states: " + (", ".join(s.name + (" (factored)" if s.factored else "") for s in optimizer.states) or "none")


def context_note(model: ModelSpec, seq_len: int) -> tuple[str, ...]:
    """Refuse a sequence the model cannot embed; flag one longer than its context."""
    if seq_len <= model.max_seq_len:
        return ()
    if model.position_embedding == "learned":
        raise LmcalcError(
            f"{model.name} has learned positions for {model.max_seq_len} tokens; "
            f"a sequence of {seq_len} does not fit them (use --seq {model.max_seq_len} or less)"
        )
    return (f"sequence length {seq_len} exceeds {model.name}'s context of {model.max_seq_len} tokens",)


def _model_input(model: ModelSpec, note: str) -> Input:
    return Input("model", "Model", model.name, origin=note or model.label)


def params_result(model: ModelSpec, note: str = "") -> Result:
    return Result(
        "params",
        f"Parameters of {model.label}",
        (_model_input(model, note),),
        (params_section(model),),
        _model_notes(model, note),
    )


def _model_notes(model: ModelSpec, note: str) -> tuple[str, ...]:
    notes = [note] if note else []
    if model.published_params:
        total = count_params(model).total
        digits = model.published_params_sig_figs
        verdict = "matches" if matches_published(model, total) else "DIFFERS FROM"
        notes.append(
            f"parameter count {group(total)} {verdict} the published {group(model.published_params)}"
            f"{f' (to {digits} significant figures)' if digits else ''}"
            + (f": {model.published_params_source}" if model.published_params_source else "")
        )
    return tuple(notes)


def flops_result(
    model: ModelSpec,
    tokens: Given,
    seq_len: Given,
    convention: fl.AttnConvention = "causal",
    recompute: fl.Recompute = "none",
    note: str = "",
) -> Result:
    napkin = fl.napkin_section(model, tokens.value)
    detailed = fl.detailed_section(model, tokens.value, int(seq_len.value), convention, recompute)
    palm = fl.palm_section(model, tokens.value, int(seq_len.value))
    other = "full" if convention == "causal" else "causal"
    other_model = fl.detailed_section(model, tokens.value, int(seq_len.value), other, "none").term("model_flops")
    compare = Section(
        "compare",
        "Conventions compared",
        (
            Term(
                "detailed_over_napkin",
                "Detailed / napkin",
                detailed.term("model_flops").value / napkin.term("total").value,
                "ratio",
                "detailed model FLOPs / 6·N·D",
            ),
            Term(
                "model_flops_other_convention",
                f"Detailed model FLOPs ({other} attention)",
                other_model.value,
                "FLOPs",
                other_model.formula,
                other_model.substituted,
                note="the other attention convention, for comparing MFU figures across tools",
            ),
            Term(
                "palm_over_napkin",
                "PaLM / napkin",
                palm.term("total").value / napkin.term("total").value,
                "ratio",
                "(6N + 12·L·H·Q·T)·D / 6·N·D",
            ),
        ),
    )
    inputs = (
        _model_input(model, note),
        Input("tokens", "Training tokens D", tokens.value, "tokens", tokens.origin),
        Input("seq_len", "Sequence length s", int(seq_len.value), "tokens", seq_len.origin),
        Input("attention_convention", "Attention FLOPs convention", convention, origin="--attn-flops"),
        Input("recompute", "Activation recomputation", recompute, origin="--recompute"),
    )
    notes = (*_model_notes(model, note), *context_note(model, int(seq_len.value)))
    return checked(
        Result(
            "flops",
            f"Training FLOPs of {model.label}",
            inputs,
            (napkin, detailed, palm, compare),
            notes,
        )
    )


def training_flops(model: ModelSpec, tokens: float, seq_len: int, basis: str) -> Term:
    """The FLOPs a run's time is computed from: 6·N·D (napkin) or the detailed causal count."""
    term = (
        fl.napkin_section(model, tokens).term("total")
        if basis == "6nd"
        else fl.detailed_section(model, tokens, seq_len, "causal", "none").term("model_flops")
    )
    return replace(term, key="training_flops")  # one key in --json whichever basis was chosen


def train_time_result(
    model: ModelSpec,
    tokens: Given,
    mfu: Given,
    precision: PrecisionRecipe,
    cluster: Cluster | None = None,
    hardware: HardwareSpec | None = None,
    days: float | None = None,
    seq_len: Given | None = None,
    basis: str = "6nd",
    price_per_gpu_hour: float | None = None,
    note: str = "",
    measured_peak: tuple[float, str] | None = None,
) -> Result:
    """Days to train on a cluster; or, with ``days`` and a GPU type, how many GPUs meet the deadline.

    ``measured_peak`` (FLOP/s, where it was measured) replaces the spec sheet's dense peak."""
    check_mfu(mfu.value)
    seq = seq_len or default_seq_len(model)
    flops_term = training_flops(model, tokens.value, int(seq.value), basis)
    hw = cluster.hardware if cluster else hardware
    if hw is None:
        raise LmcalcError("give --gpus (e.g. 1024xH100) or --days with --gpu (e.g. --days 30 --gpu H100)")
    peak = measured_peak[0] if measured_peak else peak_for(hw, precision)
    inputs = [
        _model_input(model, note),
        Input("tokens", "Training tokens D", tokens.value, "tokens", tokens.origin),
        Input("mfu", "MFU", mfu.value, origin=mfu.origin),
        Input("precision", "Precision recipe", precision.name, origin=_recipe_text(precision)),
        Input(
            "flops_basis",
            "FLOPs counted",
            "6·N·D" if basis == "6nd" else "detailed",
            origin="--flops-basis 6nd: the napkin rule (Kaplan et al. 2020)"
            if basis == "6nd"
            else f"--flops-basis detailed: causal matmul count at s = {int(seq.value)}",
        ),
    ]
    sections = [Section("flops", "Work", (flops_term,))]
    if days is not None:
        needed = gpus_for_deadline(flops_term.value, days, peak, mfu.value)
        count, nodes = whole_gpus(needed, hw.gpus_per_node)
        inputs += [Input("days", "Deadline", days, "days", "--days"), Input("gpu", "GPU", hw.name, origin=hw.label)]
        sections.append(
            Section(
                "deadline",
                "GPUs to meet the deadline",
                (
                    Term(
                        "gpus_exact",
                        "GPUs needed (exact)",
                        needed,
                        "GPUs",
                        "FLOPs / (days · 86,400 · peak · MFU)",
                        f"{sci(flops_term.value, 4)} / ({days:g} × 86400 × {sci(peak, 4)} × {mfu.value:g})",
                    ),
                    Term("gpus", "GPUs to rent", count, "GPUs", "⌈exact⌉", f"⌈{needed:.6g}⌉"),
                    Term(
                        "nodes",
                        f"Nodes of {hw.gpus_per_node}",
                        nodes,
                        "nodes",
                        "⌈GPUs / GPUs per node⌉",
                        f"⌈{count} / {hw.gpus_per_node}⌉",
                    ),
                ),
            )
        )
        run = RunTime(flops_term.value, count, peak, mfu.value, tokens.value)
    else:
        assert cluster is not None
        inputs.append(Input("cluster", "Cluster", cluster.label, origin=f"{cluster.count} × {hw.label}"))
        run = RunTime(flops_term.value, cluster.count, peak, mfu.value, tokens.value)
    source = measured_peak[1] if measured_peak else None
    sections.append(Section("time", "Time and throughput", time_terms(run, hw, precision, price_per_gpu_hour, source)))
    notes = [*_model_notes(model, note), *context_note(model, int(seq.value))]
    if measured_peak:
        notes.append(
            f"peak per GPU is the measured {measured_peak[0] / 1e12:.1f} TFLOP/s ({measured_peak[1]}), "
            "not the spec sheet: MFU then counts against what the hardware delivered"
        )
    if mfu.origin.startswith("assumption"):
        notes.append(f"MFU {mfu.value:g} is an assumption, not a measurement: pass --mfu (what your runs achieve)")
    return checked(
        Result("train-time", f"Training time of {model.label}", tuple(inputs), tuple(sections), tuple(notes))
    )


def memory_result(
    model: ModelSpec,
    cluster: Cluster,
    precision: PrecisionRecipe,
    optimizer: OptimizerSpec,
    layout: ly.Layout,
    seq_len: Given,
    attention: mem.AttentionImpl = "flash",
    recompute: fl.Recompute = "none",
    overhead_bytes: float = mem.OVERHEAD_ALLOWANCE_BYTES,
    note: str = "",
    stages: bool = False,
) -> Result:
    """Memory of the most loaded GPU of one training step, for any parallel layout; with ``stages``, of one GPU
    of every pipeline stage (``memory_stages_result``)."""
    seq = int(seq_len.value)
    ly.check_layout(model, layout, cluster, seq, attention)
    gpu = ly.most_loaded_gpu(model, layout, precision, optimizer, seq, attention, recompute, overhead_bytes)
    capacity = cluster.hardware.memory_bytes
    sections = ly.memory_sections(
        model,
        layout,
        gpu,
        precision,
        optimizer,
        seq,
        attention,
        recompute,
        capacity,
        f"{cluster.hardware.name}: {cluster.hardware.memory_label}",
    )
    inputs = (
        _model_input(model, note),
        Input("cluster", "GPUs", cluster.label, origin=f"{cluster.count} × {cluster.hardware.label}"),
        Input(
            "layout",
            "Layout",
            layout.label,
            origin="--dp --tp --pp --cp --ep --zero --sequence-parallel --schedule --virtual-stages"
            + (" --first/--last-stage-layers" if layout.first_stage_layers or layout.last_stage_layers else "")
            + (" --account-for-embedding/loss-in-pipeline-split" if layout.split_units else ""),
        ),
        Input("precision", "Precision recipe", precision.name, origin=_recipe_text(precision)),
        Input("optimizer", "Optimizer", optimizer.name, origin=_optimizer_text(optimizer)),
        Input("seq_len", "Sequence length", seq, "tokens", seq_len.origin),
        Input("micro_batch", "Micro-batch", layout.micro_batch, "sequences", "--micro-batch"),
        Input("grad_accum", "Micro-batches per step", layout.grad_accum, "micro-batches", "--grad-accum"),
        Input("attention", "Attention kernel", attention, origin="--attention"),
        Input("recompute", "Activation recomputation", recompute, origin="--recompute"),
    )
    total = gpu.total
    notes = [*_model_notes(model, note), *context_note(model, seq)]
    notes.append(
        "fits"
        if total <= capacity
        else f"does NOT fit: {total / GB:,.1f} GB needed of {capacity / GB:,.1f} GB"
        + _fit_advice(model, layout, precision, optimizer, seq, attention, recompute, overhead_bytes, capacity)
    )
    single = checked(
        Result(
            "memory",
            f"Training memory per GPU: {model.label}",
            inputs,
            sections,
            tuple(notes),
            stack=MEMORY_STACK,
            capacity="total.capacity",
        )
    )
    if not stages:
        return single
    return memory_stages_result(single, model, precision, optimizer, layout, seq, attention, recompute, overhead_bytes)


MEMORY_STACK = (
    "state.params",
    "state.grads",
    "state.master",
    "state.optimizer",
    "total.activations",
    "total.zero3_buffers",
    "total.overhead",
)
SWEEPABLE = {"seq": "sequence length", "micro-batch": "micro-batch"}


def _memory_row(key: str, title: str, result: Result, parts: tuple[str, ...] = MEMORY_STACK) -> Section:
    """One row of a memory grid: the ``parts`` (what the bars stack), the total against the capacity."""
    terms = [replace(result.term(k), key=k.rpartition(".")[2]) for k in parts]
    terms += [result.term("total.total"), result.term("total.capacity"), result.term("total.headroom")]
    return Section(key, title, tuple(terms))


STAGE_PARTS = ("total.states", "total.activations", "total.zero3_buffers", "total.overhead")
"""What a stage's row stacks: the model states summed, so that the layers and micro-batches in flight fit beside."""


def memory_sweep_result(results: list[tuple[str, Result]], name: str) -> Result:
    """Memory results at several values of one setting, one row each: how the parts grow."""
    sections = [_memory_row(f"{name}={value}", f"{name}={value}", result) for value, result in results]
    first = results[0][1]
    inputs = tuple(i for i in first.inputs if i.key not in ("seq_len", "micro_batch"))
    return Result(
        "memory-sweep",
        f"{first.title}, sweeping {SWEEPABLE[name]}",
        inputs,
        tuple(sections),
        (f"capacity {first.term('total.capacity').text} per GPU",),
        layout="grid",
        stack=tuple(k.rpartition(".")[2] for k in MEMORY_STACK),
        capacity="capacity",
    )


def memory_stages_result(
    single: Result,
    model: ModelSpec,
    precision: PrecisionRecipe,
    optimizer: OptimizerSpec,
    layout: ly.Layout,
    seq: int,
    attention: mem.AttentionImpl,
    recompute: fl.Recompute,
    overhead_bytes: float,
) -> Result:
    """Memory of one GPU of every pipeline stage, one row each, beside ``single``, the most loaded GPU's result
    (whose inputs and advice it keeps): which stage binds, and how much room the others have (the stages differ
    in layers, in micro-batches in flight, in the embedding and the head)."""
    capacity = single.term("total.capacity")
    cache: dict = {}
    rows, totals = [], []
    for stage in range(layout.pp):
        gpu = ly.gpu_memory(
            model, layout, stage, precision, optimizer, seq, attention, recompute, overhead_bytes, cache=cache
        )
        parts = ly.memory_sections(
            model, layout, gpu, precision, optimizer, seq, attention, recompute, capacity.value, capacity.formula
        )
        stage_result = Result("memory", "", (), parts)
        row = _memory_row(f"stage{stage + 1}", f"stage {stage + 1}", stage_result, STAGE_PARTS)
        shape = (stage_result.term("activations.layers_on_gpu"), stage_result.term("activations.in_flight"))
        rows.append(replace(row, terms=(*shape, *row.terms)))
        totals.append(gpu.total)
    heaviest = max(range(layout.pp), key=totals.__getitem__)
    lightest = min(range(layout.pp), key=totals.__getitem__)
    spread = (
        f"most loaded: stage {heaviest + 1} ({totals[heaviest] / GB:,.2f} GB); least: stage {lightest + 1} "
        f"({totals[lightest] / GB:,.2f} GB)"
    )
    notes = [spread if layout.pp > 1 else "one pipeline stage: every GPU holds the same", *single.notes]
    return checked(
        Result(
            "memory-stages",
            f"{single.title}, stage by stage",
            single.inputs,
            tuple(rows),
            tuple(notes),
            layout="grid",
            stack=tuple(k.rpartition(".")[2] for k in STAGE_PARTS),
            capacity="capacity",
        )
    )


def _fit_advice(
    model: ModelSpec,
    layout: ly.Layout,
    precision: PrecisionRecipe,
    optimizer: OptimizerSpec,
    seq: int,
    attention: mem.AttentionImpl,
    recompute: mem.Recompute,
    overhead_bytes: float,
    capacity: float,
) -> str:
    """The levers of this command the user has not pulled, each with what the GPU would then need, most
    effective first; then more GPUs. Selective recomputation is offered only with eager attention: with
    FlashAttention the s² scores it drops are never stored."""
    levers: list[tuple[str, ly.Layout, mem.Recompute]] = []
    if layout.zero < 3 and layout.dp * layout.cp > 1:
        levers.append(("--zero 3", replace(layout, zero=3), recompute))
    if layout.tp > 1 and not layout.sequence_parallel:
        levers.append(("--sequence-parallel", replace(layout, sequence_parallel=True), recompute))
    if recompute == "none" and attention == "eager":
        levers.append(("--recompute selective", layout, "selective"))
    if recompute != "full":
        levers.append(("--recompute full", layout, "full"))
    if layout.micro_batch > 1:
        levers.append(("--micro-batch 1", replace(layout, micro_batch=1), recompute))
    tried = []
    for flag, changed, recomputed in levers:
        total = ly.most_loaded_gpu(
            model, changed, precision, optimizer, seq, attention, recomputed, overhead_bytes
        ).total
        tried.append((total, f"{flag} ({total / GB:,.1f} GB{', fits' if total <= capacity else ''})"))
    advice = [text for _, text in sorted(tried)]
    advice.append("more GPUs" if layout.zero else "more GPUs with --zero")
    return "; try " + ", ".join(advice)


def max_params_result(
    cluster: Cluster,
    precision: PrecisionRecipe,
    optimizer: OptimizerSpec,
    template: ModelSpec,
    seq_len: int,
    micro_batch: int,
    attention: mem.AttentionImpl = "flash",
    recompute: fl.Recompute = "none",
    overhead_bytes: float = mem.OVERHEAD_ALLOWANCE_BYTES,
) -> Result:
    capacity = cluster.hardware.memory_bytes
    rows = mp.max_params(
        capacity,
        cluster.count,
        precision,
        optimizer,
        template,
        overhead_bytes,
        seq_len,
        micro_batch,
        attention,
        recompute,
    )
    sections = []
    for row in rows:
        shape = row.activation_shape
        shape_text = (
            f"h={shape.hidden_size}, L={shape.num_layers}, H={shape.num_heads}, H_kv={shape.kv_heads}, "
            f"f={shape.ffn_size}"
            if shape
            else "nothing fits"
        )
        sections.append(
            Section(
                f"zero{row.zero_stage}",
                row.label,
                (
                    Term(
                        "bytes_per_param",
                        "State bytes per parameter per GPU",
                        row.bytes_per_param,
                        "bytes",
                        _bpp_formula(row.zero_stage),
                        source="Rajbhandari et al. 2020 (ZeRO) §5.1",
                    ),
                    Term(
                        "states_only",
                        "Largest N (states only)",
                        row.states_only,
                        "params",
                        "C / bytes per param",
                        f"{group(capacity)} / {row.bytes_per_param:.6g}",
                    ),
                    Term(
                        "with_overhead",
                        "Largest N (+ overhead)",
                        row.with_overhead,
                        "params",
                        "(C − overhead) / bytes per param",
                        f"({group(capacity)} − {group(overhead_bytes)}) / {row.bytes_per_param:.6g}",
                    ),
                    Term(
                        "with_activations",
                        "Largest N (+ overhead + activations)",
                        row.with_activations,
                        "params",
                        "largest N with N · bytes/param + activations(shape(N)) + overhead ≤ C",
                        f"activations {row.activation_bytes / GiB:.2f} GiB for {shape_text}",
                        note=f"shape scaled from {template.name}",
                    ),
                ),
            )
        )
    inputs = (
        Input("cluster", "GPUs", cluster.label, origin=f"{cluster.count} × {cluster.hardware.label}"),
        Input("capacity", "Memory per GPU", capacity, "bytes", cluster.hardware.memory_label),
        Input("precision", "Precision recipe", precision.name, origin=_recipe_text(precision)),
        Input("optimizer", "Optimizer", optimizer.name, origin=_optimizer_text(optimizer)),
        Input("overhead", "Overhead allowance", overhead_bytes, "bytes", "--overhead"),
        Input("seq_len", "Sequence length (activations)", seq_len, "tokens", "--seq"),
        Input("micro_batch", "Micro-batch (activations)", micro_batch, "sequences", "--micro-batch"),
        Input("template", "Shape for activations", template.name, origin="--like"),
    )
    replicated, sharded = rows[0], rows[-1]
    notes = (
        f"N = C / bytes per parameter: {capacity / GB:g} GB / {replicated.bytes_per_param:g} B = "
        f"{replicated.states_only / 1e9:.3g}B replicated on every GPU; fully sharded over {cluster.count} GPUs "
        f"{sharded.states_only / 1e9:.3g}B (the lecture's napkin: 8 × 80 GB / 16 B ≈ 40B on 8 H100s)",
        f"activations assume the proportions of {template.name} scaled to N, {attention} attention, "
        f"recomputation: {recompute}",
    )
    return Result(
        "max-params", f"Largest trainable model on {cluster.label}", inputs, tuple(sections), notes, layout="grid"
    )


def _bpp_formula(stage: int) -> str:
    return {0: "p + g + (m + o)", 1: "p + g + (m + o)/n", 2: "p + (g + m + o)/n", 3: "(p + g + m + o)/n"}[stage]


def tensor_result(shape: tuple[int, ...], dtype: str) -> Result:
    elements = tensor_elements(shape)
    per = dtype_bytes(dtype)
    total = elements * per
    dims = " × ".join(str(d) for d in shape)
    return Result(
        "tensor",
        f"Memory of a {'x'.join(map(str, shape))} {dtype} tensor",
        (Input("shape", "Shape", "x".join(map(str, shape))), Input("dtype", "dtype", dtype)),
        (
            Section(
                "tensor",
                "Tensor",
                (
                    Term("elements", "Elements", elements, "elements", "product of the dimensions", dims),
                    Term("bytes_per_element", "Bytes per element", per, "bytes", f"bits of {dtype} / 8"),
                    Term(
                        "bytes", "Size", total, "bytes", "elements × bytes per element", f"{group(elements)} × {per:g}"
                    ),
                    Term("gb", "Size (decimal GB)", total / GB, "GB", "bytes / 1e9"),
                    Term("gib", "Size (binary GiB)", total / GiB, "GiB", "bytes / 2^30"),
                ),
            ),
        ),
    )


def dtypes_result() -> Result:
    sections = []
    for f in FORMATS.values():
        sections.append(
            Section(
                f.name,
                f.name,
                (
                    Term(
                        "bits",
                        "Bits",
                        f.bits,
                        "bits",
                        "1 + e + m",
                        f"1 + {f.exponent_bits} + {f.fraction_bits}",
                        f.source,
                    ),
                    Term("exponent_bits", "Exponent bits", f.exponent_bits, "bits"),
                    Term("fraction_bits", "Fraction bits", f.fraction_bits, "bits"),
                    Term(
                        "max",
                        "Largest finite",
                        f.max,
                        "",
                        "(2 − 2·2^−m)·2^(2^e − 1 − bias)" if f.finite_only else "(2 − 2^−m)·2^(2^e − 2 − bias)",
                    ),
                    Term(
                        "smallest_normal", "Smallest normal", f.smallest_normal, "", "2^(1 − bias)", f"2^{1 - f.bias}"
                    ),
                    Term("eps", "Machine epsilon", f.eps, "", "2^−m", f"2^-{f.fraction_bits}"),
                ),
            )
        )
    return Result(
        "dtypes",
        "Floating-point formats",
        (),
        tuple(sections),
        ("bias = 2^(e−1) − 1; fp8-e4m3 is the E4M3FN variant (no inf, max 448)",),
        layout="grid",
    )


def fit_result(
    model: ModelSpec,
    cluster: Cluster,
    precision: PrecisionRecipe,
    optimizer: OptimizerSpec,
    layout: ly.Layout,
    seq_len: Given,
    attention: mem.AttentionImpl = "flash",
    recompute: fl.Recompute = "none",
    overhead_bytes: float = mem.OVERHEAD_ALLOWANCE_BYTES,
    note: str = "",
) -> Result:
    """The largest micro-batch, the longest sequence and the fewest GPUs that fit, each with its binding part."""
    from lmcalc.engine import fit  # only this command searches

    seq = int(seq_len.value)
    ly.check_layout(model, layout, cluster, seq, attention)
    capacity = cluster.hardware.memory_bytes
    setting = fit.Setting(model, layout, seq, precision, optimizer, attention, recompute, overhead_bytes, capacity)
    seq_step = math.lcm(128, layout.cp)
    seq_limit = model.max_seq_len if model.position_embedding == "learned" else max(model.max_seq_len, 1 << 20)
    dp_step = layout.ep // math.gcd(layout.ep, layout.cp)
    limits = (
        ("micro_batch", "Largest micro-batch", "sequences", "b", fit.largest_micro_batch(setting)),
        ("seq", "Longest sequence", "tokens", "s", fit.longest_sequence(setting, seq_step, seq_limit)),
        ("dp", "Fewest data-parallel replicas", "GPUs", "DP", fit.fewest_data_parallel(setting, dp_step)),
    )
    sections = []
    for key, label, unit, symbol, limit in limits:
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
                f"{'smallest' if key == 'dp' else 'largest'} {symbol} with memory ≤ {capacity / GB:g} GB"
                if found
                else f"binding: {limit.binding}",
                at_limit + beyond,
                note=f"binding: {limit.binding}",
            )
        ]
        if key == "dp" and found:
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
                    "states + activations + buffers + overhead",
                )
            )
        sections.append(Section(key, f"{label} — binding: {limit.binding}", tuple(terms)))
    inputs = (
        _model_input(model, note),
        Input("gpu", "GPU", cluster.hardware.name, origin=cluster.hardware.memory_label),
        Input("layout", "Layout", layout.label, origin="searched one setting at a time from this layout"),
        Input("precision", "Precision recipe", precision.name, origin=_recipe_text(precision)),
        Input("optimizer", "Optimizer", optimizer.name, origin=_optimizer_text(optimizer)),
        Input("seq_len", "Sequence length", seq, "tokens", seq_len.origin),
        Input("micro_batch", "Micro-batch", layout.micro_batch, "sequences", "--micro-batch"),
        Input("recompute", "Activation recomputation", recompute, origin="--recompute"),
    )
    notes = (
        *_model_notes(model, note),
        "each line changes one setting and keeps the others; the fewest GPUs keeps TP, PP and CP and grows DP",
    )
    return checked(
        Result("fit", f"What fits on {cluster.hardware.name}: {model.label}", inputs, tuple(sections), notes)
    )


def _layout_text(candidate) -> str:
    layout = candidate.layout
    return f"{layout.label}, mb={layout.micro_batch}, GA={layout.grad_accum}, recompute {candidate.recompute}"


def plan_results(
    model: ModelSpec,
    cluster: Cluster,
    seq_len: Given,
    global_batch_tokens: float,
    precision: PrecisionRecipe,
    optimizer: OptimizerSpec,
    pins: pl.Pins,
    attention: mem.AttentionImpl = "flash",
    efficiency: Given | None = None,
    overhead_bytes: float = mem.OVERHEAD_ALLOWANCE_BYTES,
    tokens: Given | None = None,
    note: str = "",
) -> tuple[Result, Result]:
    """One layout search, two views of it: every layout that fits, ranked by throughput, and the winner
    derived term by term (what ``--explain`` shows)."""
    from lmcalc.engine import plan as pl
    from lmcalc.engine import steptime as st

    seq = int(seq_len.value)
    sequences = round(global_batch_tokens / seq)
    if sequences < 1:
        raise LmcalcError(f"--global-batch {global_batch_tokens:g} tokens is less than one sequence of {seq}")
    train_tokens = tokens or default_tokens(model)
    if sequences * seq > train_tokens.value:
        raise LmcalcError(
            f"--global-batch {group(sequences * seq)} tokens is more than the {group(train_tokens.value)} training "
            f"tokens ({train_tokens.origin}): the run would not make one step"
        )
    eff = efficiency or Given(
        st.DEFAULT_COMPUTE_EFFICIENCY, "assumption: calibrated on published runs (docs/plan-accuracy.md)"
    )
    found = pl.plan(model, cluster, seq, sequences, precision, optimizer, pins, attention, eff.value, overhead_bytes)
    if not found.fitting:
        closest = found.closest
        if closest is None:
            raise LmcalcError(
                f"no layout of {model.name} can exist on {cluster.label} with these constraints "
                f"(global batch {sequences} sequences; check --tp/--pp/--cp and the GPU count)"
            )
        m = closest.memory
        parts = {
            "model states": m.states,
            "activations": m.activations,
            "ZeRO-3 buffers": m.zero3_buffers,
            "overhead": m.overhead,
        }
        biggest = max(parts, key=parts.__getitem__)
        raise LmcalcError(
            f"nothing fits on {cluster.label} ({found.evaluated} layouts tried); closest: {_layout_text(closest)} "
            f"needs {m.total / GB:,.1f} GB of {found.capacity / GB:,.0f} GB, "
            f"over by {(m.total - found.capacity) / GB:,.1f} GB, mostly {biggest} ({parts[biggest] / GB:,.1f} GB)"
        )
    sections = []
    for rank, c in enumerate(found.fitting, start=1):
        t = c.time
        sections.append(
            Section(
                f"rank{rank}",
                f"{rank}. {_layout_text(c)}",
                (
                    Term("tokens_per_s", "tokens/s", t.tokens_per_s, "tokens/s", "tokens per step / step time"),
                    Term("tokens_per_s_per_gpu", "tokens/s/GPU", t.tokens_per_s / cluster.count, "tokens/s/GPU"),
                    Term("mfu", "MFU", 100 * t.mfu, "%", "model FLOPs / (step time · GPUs · peak)"),
                    Term("step_time", "step", t.total, "s", "compute + exposed communication + bubble"),
                    Term("memory", "memory/GPU", c.memory.total, "bytes", "most loaded GPU"),
                    Term(
                        "days",
                        "days",
                        train_tokens.value / t.tokens_per_s / 86_400,
                        "days",
                        "training tokens / tokens per second / 86,400",
                    ),
                ),
            )
        )
    winner = found.fitting[0]
    inputs = (
        _model_input(model, note),
        Input("cluster", "GPUs", cluster.label, origin=f"{cluster.count} × {cluster.hardware.label}"),
        Input("seq_len", "Sequence length", seq, "tokens", seq_len.origin),
        Input(
            "global_batch",
            "Global batch",
            sequences,
            "sequences",
            f"--global-batch {group(global_batch_tokens)} tokens / {seq} per sequence",
        ),
        Input("tokens", "Training tokens", train_tokens.value, "tokens", train_tokens.origin),
        Input("precision", "Precision recipe", precision.name, origin=_recipe_text(precision)),
        Input("optimizer", "Optimizer", optimizer.name, origin=_optimizer_text(optimizer)),
        Input("efficiency", "Compute efficiency", eff.value, origin=eff.origin),
        Input("evaluated", "Layouts evaluated", found.evaluated, origin=f"{len(found.fitting)} fit in memory"),
    )
    assumptions = (
        "TP within a node; TP, EP and PP communication exposed; DP gradient reduction overlaps the last "
        "micro-batch's backward pass; CP's K/V exchange is exposed too (docs/formulas.md)"
    )
    best = f"best: {_layout_text(winner)}"
    ranked = Result(
        "plan",
        f"Layouts for {model.label} on {cluster.label}",
        inputs,
        tuple(sections),
        (f"{best}; run 'lmcalc plan … --explain' for its derivation", assumptions),
        layout="grid",
    )
    derived = Result(
        "plan",
        f"The best layout for {model.label} on {cluster.label}",
        inputs,
        winner_sections(model, cluster, winner, seq, precision, optimizer, attention),
        (best, assumptions),
    )
    return checked(ranked), checked(derived)


ZERO_GATHER_FORMULA = {
    0: "none: no ZeRO sharding over data parallelism",
    1: "max(0, all-gather of the updated parameters − first forward of the next step)",
    2: "max(0, all-gather of the updated parameters − first forward of the next step)",
    3: "micro-batches · max(0, 2 · all-gather + reduce-scatter − compute per micro-batch)",
}


def winner_sections(
    model: ModelSpec,
    cluster: Cluster,
    winner,
    seq: int,
    precision: PrecisionRecipe,
    optimizer: OptimizerSpec,
    attention: mem.AttentionImpl,
) -> tuple[Section, ...]:
    """The winning layout's memory and time, term by term, for ``plan --explain``."""
    t = winner.time
    memory = ly.memory_sections(
        model,
        winner.layout,
        winner.memory,
        precision,
        optimizer,
        seq,
        attention,
        winner.recompute,
        cluster.hardware.memory_bytes,
        cluster.hardware.memory_label,
    )
    time = Section(
        "time",
        "Step time of the best layout",
        (
            Term(
                "compute",
                "Compute",
                t.compute,
                "s",
                "hardware FLOPs of the slowest stage / (GPUs per stage · peak · efficiency)",
                f"{t.stage_flops:.4e} / ({t.gpus // winner.layout.pp} × {t.peak:.4g} × {t.efficiency:g})",
                note=(
                    f"stage {t.slowest_stage + 1} of {winner.layout.pp} sets the pace: it does "
                    f"{t.stage_flops / t.hardware_flops:.1%} of the step's {t.hardware_flops:.4e} FLOPs, "
                    f"against an even {1 / winner.layout.pp:.1%}"
                    if winner.layout.pp > 1
                    else ""
                ),
            ),
            Term(
                "tp",
                "Tensor-parallel collectives (exposed)",
                t.tp,
                "s",
                "micro-batches · layers · (4, or 6 with full recompute) · all-reduce(s·b·h)",
            ),
            Term(
                "ep", "Expert all-to-all (exposed)", t.ep, "s", "micro-batches · MoE layers · 4 · all-to-all(k·s·b·h)"
            ),
            Term(
                "cp",
                "Context-parallel K/V exchange (exposed)",
                t.cp,
                "s",
                "micro-batches · layers · 3 · (CP − 1) · p2p(K, V)",
            ),
            Term("pp_p2p", "Pipeline sends", t.pp_p2p, "s", "micro-batches · 2 · p2p(s·b·h)"),
            Term(
                "bubble",
                "Pipeline bubble",
                t.bubble,
                "s",
                "(p − 1)/(v·m) · (compute + exposed communication)",
                source="Narayanan et al. 2021 §2.2",
            ),
            Term("dp", "Gradient reduction (exposed)", t.dp, "s", "max(0, reduce − backward of the last micro-batch)"),
            Term(
                "zero",
                "ZeRO parameter gathers (exposed)",
                t.zero,
                "s",
                ZERO_GATHER_FORMULA[winner.layout.zero if winner.layout.dp * winner.layout.cp > 1 else 0],
            ),
            Term("total", "Step time", t.total, "s", "sum of the rows above"),
            Term(
                "mfu",
                "MFU",
                100 * t.mfu,
                "%",
                "model FLOPs / (step time · GPUs · peak)",
                f"{t.model_flops:.4e} / ({t.total:.4g} × {t.gpus} × {t.peak:.4g})",
                note="model FLOPs count attention in full (the Korthikanti/PaLM convention)",
            ),
        ),
    )
    return (*memory, time)


def inference_result(
    model: ModelSpec,
    cluster: Cluster,
    batch: int,
    context: Given,
    weights_dtype: str,
    kv_dtype: str,
    tp: int,
    overhead_bytes: float = mem.OVERHEAD_ALLOWANCE_BYTES,
    quant_group_size: int | None = None,
    note: str = "",
) -> Result:
    """Serving memory per GPU: weights (any dtype, int8/int4 included), the KV cache, and what fits."""
    from lmcalc.engine import inference as inf

    if tp > cluster.count:
        raise LmcalcError(f"--tp {tp} needs more GPUs than the {cluster.count} of {cluster.label}")

    capacity = cluster.hardware.memory_bytes
    sections = inf.inference_sections(
        model,
        batch,
        int(context.value),
        weights_dtype,
        kv_dtype,
        capacity,
        tp,
        overhead_bytes,
        capacity_label=f"{cluster.hardware.name}: {cluster.hardware.memory_label}",
        quant_group_size=quant_group_size,
    )
    inputs = (
        _model_input(model, note),
        Input("gpu", "GPU", cluster.hardware.name, origin=cluster.hardware.memory_label),
        Input("tp", "Tensor-parallel GPUs", tp, origin="--tp"),
        Input("batch", "Batch", batch, "sequences", "--batch"),
        Input("context", "Context", int(context.value), "tokens", context.origin),
        Input("weights_dtype", "Weights dtype", weights_dtype, origin="--weights-dtype"),
        Input("kv_dtype", "KV-cache dtype", kv_dtype, origin="--kv-dtype"),
    )
    # memory would hold a longer context than the model was trained for: the table's note is said below it too
    beyond = next(s for s in sections if s.key == "per_gpu").term("max_context").note
    notes = (
        *_model_notes(model, note),
        *context_note(model, int(context.value)),
        "inference keeps no gradients and no optimizer states: weights, the KV cache and a working allowance",
        *([beyond] if beyond else []),
    )
    return checked(
        Result(
            "memory-inference",
            f"Inference memory per GPU: {model.label}",
            inputs,
            sections,
            notes,
            stack=inf.INFERENCE_STACK,
            capacity=inf.INFERENCE_CAPACITY,
        )
    )


def optimal_result(
    compute: float | None = None,
    cluster: Cluster | None = None,
    days: float | None = None,
    precision: PrecisionRecipe | None = None,
    mfu: Given | None = None,
    tokens_per_param: float = TOKENS_PER_PARAM,
    price_per_gpu_hour: float | None = None,
) -> Result:
    """The compute-optimal model size and tokens for a budget in FLOPs, or for a cluster and a deadline."""

    mfu = mfu or default_mfu()
    budget: tuple[Section, ...] = ()
    inputs: list[Input] = []
    if compute is None:
        if cluster is None or days is None or precision is None:
            raise LmcalcError("give --compute (e.g. 1e24), or --gpus with --days (e.g. --gpus 1024xH100 --days 30)")
        section = opt.budget_section(cluster, precision, mfu.value, days, price_per_gpu_hour)
        compute, budget = section.term("compute").value, (section,)
        inputs += [
            Input("cluster", "Cluster", cluster.label, origin=f"{cluster.count} × {cluster.hardware.label}"),
            Input("days", "Deadline", days, "days", "--days"),
            Input("mfu", "MFU", mfu.value, origin=mfu.origin),
            Input("precision", "Precision recipe", precision.name, origin=_recipe_text(precision)),
        ]
    else:
        inputs.append(Input("compute", "Compute budget", compute, "FLOPs", "--compute"))
    sections = opt.optimal_sections(compute, tokens_per_param)
    if budget:
        sections += (opt.throughput_section(sections, cluster, days),)  # type: ignore[arg-type]
    notes = (
        "Hoffmann et al. 2022: ~20 tokens per parameter; the paper's fitted law (Approach 3, rounded constants) "
        "favours smaller models on more tokens (Besiroglu et al. 2024 discuss why)",
    )
    if cluster and mfu.origin.startswith("assumption"):
        notes += (f"MFU {mfu.value:g} is an assumption, not a measurement: pass --mfu",)
    return checked(Result("optimal", "Compute-optimal model and data", tuple(inputs), (*budget, *sections), notes))
