"""The accounting commands: parse the flags, call the Python API (``lmcalc.api``), render. No arithmetic, no torch
at start-up: each command imports the estimates it calls when it runs, so one command loads only its own."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Annotated, Any

import typer

from lmcalc.cli.app import emit, flags_given
from lmcalc.cli.completion import complete_gpus, complete_model
from lmcalc.cli.help import OUTPUT_PANEL
from lmcalc.cli.launch import with_launch
from lmcalc.cli.options import (
    BATCH_OPTIONS,
    ENERGY_OPTIONS,
    FINETUNE_OPTIONS,
    LAYOUT_OPTIONS,
    METHOD_OPTIONS,
    OFFLOAD_OPTIONS,
    PIN_OPTIONS,
    RUN_OPTIONS,
    SEARCH_OPTIONS,
    SERVING_OPTIONS,
    SPLIT_OPTIONS,
    TRAINING_OPTIONS,
    WORKLOAD_OPTIONS,
    AttentionOpt,
    BriefOpt,
    ExplainOpt,
    ForceOpt,
    JsonOpt,
    ModelOpt,
    OptimizerOpt,
    OverheadOpt,
    PrecisionOpt,
    RecomputeOpt,
    SeqOpt,
    TrainingFrameworkOpt,
    VsOpt,
    alternatives,
    with_options,
)
from lmcalc.engine.choices import ATTN_CONVENTIONS, FLOPS_BASES, PEAK_SOURCES
from lmcalc.engine.run.optimal import TOKENS_PER_PARAM
from lmcalc.errors import LmcalcError
from lmcalc.estimates.inputs import DEFAULT_ATTENTION, DEFAULT_RECOMPUTE
from lmcalc.estimates.settings import DEFAULT_OPTIMIZER, DEFAULT_PRECISION, ServingSettings
from lmcalc.launch.config import EMIT_KINDS
from lmcalc.result import Estimate, Result

FLOPS_BASIS_MEANINGS = {"6nd": "napkin, default", "detailed": "matmul count, causal"}
PEAK_MEANINGS = {"spec": "the dense spec-sheet peak", "measured": "lmcalc bench results"}


@with_launch
@with_options(ENERGY_OPTIONS, at="energy")
@with_options(OFFLOAD_OPTIONS, at="offload")
@with_options(FINETUNE_OPTIONS, at="method")
@with_options(RUN_OPTIONS, at="run")
def train_time(
    model: ModelOpt,
    gpus: Annotated[
        str | None, typer.Option("--gpus", help="Cluster: 1024xH100 or 128x8xH100.", autocompletion=complete_gpus)
    ] = None,
    run: dict[str, Any] | None = None,
    mfu: Annotated[
        float | None, typer.Option("--mfu", help="Model FLOPs utilisation in (0, 1]. Default: 0.4 (an assumption).")
    ] = None,
    precision: PrecisionOpt = DEFAULT_PRECISION,
    days: Annotated[float | None, typer.Option("--days", help="Solve for GPUs: finish within this many days.")] = None,
    gpu: Annotated[
        str | None,
        typer.Option(
            "--gpu", help="GPU type when solving for the GPU count with --days.", autocompletion=complete_gpus
        ),
    ] = None,
    flops_basis: Annotated[
        str, typer.Option("--flops-basis", help=f"{alternatives(FLOPS_BASES, FLOPS_BASIS_MEANINGS)}.")
    ] = "6nd",
    seq: SeqOpt = None,
    peak: Annotated[str, typer.Option("--peak", help=f"{alternatives(PEAK_SOURCES, PEAK_MEANINGS)}.")] = "spec",
    calibration: Annotated[
        str | None,
        typer.Option(
            "--calibration", help="Benchmark results file to take the measured peak from (implies --peak measured)."
        ),
    ] = None,
    method: dict[str, Any] | None = None,
    offload: dict[str, Any] | None = None,
    energy: dict[str, Any] | None = None,
    vs: VsOpt = None,
    as_json: JsonOpt = False,
    explain: ExplainOpt = False,
    brief: BriefOpt = False,
) -> None:
    """Days and GPU-hours to train (or fine-tune) a model on a cluster, or GPUs needed to meet a deadline."""
    from lmcalc.estimates import time as estimates

    assert run is not None and method is not None and offload is not None and energy is not None  # with_options

    def answer(cluster: str | None) -> Estimate:
        return estimates.train_time(
            model=model, gpus=cluster, mfu=mfu, precision=precision, days=days, gpu=gpu, flops_basis=flops_basis,
            seq=seq, peak=peak, calibration=calibration, **run, **method, **offload, **energy,
        )  # fmt: skip

    emit(compared(answer, gpus, vs, explain), as_json, explain, brief)


def compared(answer: Callable[[Any], Estimate], gpus: str | None, vs: list[str] | None, explain: bool) -> Estimate:
    """``answer(gpus)``, or with ``--vs`` the answers for ``gpus`` and each cluster after it side by side."""
    if not vs:
        return answer(gpus)
    if gpus is None:
        raise LmcalcError("--vs compares clusters with the one --gpus names: give --gpus too")
    if explain:
        raise LmcalcError("--explain derives one answer: give it without --vs (or run each cluster alone)")
    from lmcalc.estimates.compare import side_by_side

    clusters = [gpus, *vs]
    return side_by_side(labels=clusters, answers=[answer(cluster) for cluster in clusters])


@with_options(METHOD_OPTIONS, at="method")
def max_params(
    gpus: Annotated[str, typer.Option("--gpus", help="Cluster: 8xH100, 2x8xA100-80GB.", autocompletion=complete_gpus)],
    optimizer: OptimizerOpt = DEFAULT_OPTIMIZER,
    precision: PrecisionOpt = DEFAULT_PRECISION,
    seq: Annotated[str, typer.Option("--seq", help="Sequence length for the activation column.")] = "4096",
    micro_batch: Annotated[int, typer.Option("--micro-batch", help="Sequences per GPU for the activation column.")] = 1,
    attention: AttentionOpt = DEFAULT_ATTENTION,
    recompute: RecomputeOpt = DEFAULT_RECOMPUTE,
    framework: TrainingFrameworkOpt = None,
    overhead: OverheadOpt = None,
    like: Annotated[
        str,
        typer.Option(
            "--like", help="Model whose proportions the activation column scales.", autocompletion=complete_model
        ),
    ] = "llama-3.1-8b",
    method: dict[str, Any] | None = None,
    as_json: JsonOpt = False,
    explain: ExplainOpt = False,
    brief: BriefOpt = False,
) -> None:
    """The largest model whose training state fits the GPUs, for plain data parallelism and ZeRO-1/2/3."""
    from lmcalc.estimates import limits as estimates

    assert method is not None  # filled in by with_options
    estimate = estimates.max_params(
        gpus=gpus,
        optimizer=optimizer,
        precision=precision,
        seq=seq,
        micro_batch=micro_batch,
        attention=attention,
        recompute=recompute,
        framework=framework,
        overhead=overhead,
        like=like,
        **method,
    )
    emit(estimate, as_json, explain, brief)


def flops(
    model: ModelOpt,
    tokens: Annotated[
        str | None,
        typer.Option("--tokens", help="Training tokens. Default: the preset's published count, else 20 per parameter."),
    ] = None,
    seq: SeqOpt = None,
    attn_flops: Annotated[
        str, typer.Option("--attn-flops", help=f"Attention convention: {alternatives(ATTN_CONVENTIONS)}.")
    ] = "causal",
    recompute: RecomputeOpt = DEFAULT_RECOMPUTE,
    as_json: JsonOpt = False,
    explain: ExplainOpt = False,
    brief: BriefOpt = False,
) -> None:
    """Training FLOPs: 6·N·D, the detailed matmul count (causal or full attention), and PaLM's convention."""
    from lmcalc.estimates import counts as estimates

    emit(
        estimates.flops(model=model, tokens=tokens, seq=seq, attn_flops=attn_flops, recompute=recompute),
        as_json,
        explain,
        brief,
    )


SERVING_ONLY = tuple(ServingSettings.__annotations__)
MEMORY_SHARED = ("model", "gpus", "tp", "overhead", "plot", "force", "inference", "as_json", "explain", "brief")
"""Flags serving takes as well as training (``overhead`` defaults to the serving allowance, ``DEFAULT_OVERHEAD``)."""


@with_launch
@with_options(SERVING_OPTIONS, at="serving")
@with_options(LAYOUT_OPTIONS, at="layout")
@with_options(TRAINING_OPTIONS, at="training")
def memory(
    ctx: typer.Context,
    model: ModelOpt,
    gpus: Annotated[
        str, typer.Option("--gpus", help="Cluster, e.g. 8xH100 or 64x8xH100.", autocompletion=complete_gpus)
    ] = "1xH100",
    training: dict[str, Any] | None = None,
    layout: dict[str, Any] | None = None,
    sweep: Annotated[
        str | None,
        typer.Option(
            "--sweep",
            help="One row per value: seq=1k,4k,16k, micro-batch=1,2,4, zero=0,1,2,3, tp=1,2,4,8 (pp, cp, ep).",
        ),
    ] = None,
    stages: Annotated[
        bool,
        typer.Option("--stages", help="One row per pipeline stage: which stage binds, and the room the others have."),
    ] = False,
    plot: Annotated[
        str | None,
        typer.Option("--plot", help="Also draw the breakdown: memory.png / .svg / .pdf.", rich_help_panel=OUTPUT_PANEL),
    ] = None,
    force: ForceOpt = False,
    inference: Annotated[bool, typer.Option("--inference", help="Serving memory instead: weights + KV cache.")] = False,
    serving: dict[str, Any] | None = None,
    vs: VsOpt = None,
    as_json: JsonOpt = False,
    explain: ExplainOpt = False,
    brief: BriefOpt = False,
) -> None:
    """Memory of the most loaded GPU in one training step, for any DP/ZeRO/TP/SP/PP/CP/EP layout
    (or, with --inference, of serving: weights and KV cache)."""
    from lmcalc.estimates import memory as estimates
    from lmcalc.estimates.serving import inference as serving_memory

    assert training is not None and layout is not None and serving is not None  # filled in by with_options
    _check_serving_flags(ctx, inference)
    if inference:
        served = serving_memory(
            model=model,
            gpus=gpus,
            tp=layout["tp"] if flags_given(ctx, {"tp"}) else None,  # else the GPUs given, up to a node
            overhead=training["overhead"],
            **serving,
        )
        emit_with_plot(served.report, as_json, explain, brief, plot, force)
        return
    if stages and sweep is not None:
        raise LmcalcError("give --sweep or --stages, not both: each draws its own rows")
    if vs and (stages or sweep is not None or plot):
        raise LmcalcError("--vs draws a row per cluster: give it without --sweep, --stages and --plot")
    if vs:
        shown: Estimate = compared(
            lambda cluster: estimates.memory(model=model, gpus=cluster, **training, **layout), gpus, vs, explain
        )
    elif sweep is None:
        shown = estimates.memory(model=model, gpus=gpus, stages=stages, **training, **layout)
    else:
        shown = estimates.memory_sweep(sweep=sweep, model=model, gpus=gpus, **training, **layout)
    emit_with_plot(shown.report, as_json, explain, brief, plot, force)


def _check_serving_flags(ctx: typer.Context, inference: bool) -> None:
    """Refuse serving's flags without --inference, and training's with it: each describes the other job."""
    serving_flags = flags_given(ctx, SERVING_ONLY)
    if not inference and serving_flags:
        raise LmcalcError(
            f"{' and '.join(serving_flags)} describe{'s' if len(serving_flags) == 1 else ''} serving: add --inference "
            "(training uses --micro-batch and --seq)"
        )
    given = {p.name for p in ctx.command.params if p.name}
    training_flags = flags_given(ctx, given - set(SERVING_ONLY) - set(MEMORY_SHARED))
    if inference and training_flags:
        takes = [p.opts[0] for p in ctx.command.params if p.name in SERVING_ONLY] + ["--tp"]
        raise LmcalcError(
            f"{' and '.join(training_flags)} describe{'s' if len(training_flags) == 1 else ''} training, not serving: "
            f"drop {'it' if len(training_flags) == 1 else 'them'}, or drop --inference "
            f"(serving takes {', '.join(takes[:-1])} and {takes[-1]})"
        )


def emit_with_plot(result: Result, as_json: bool, explain: bool, brief: bool, plot: str | None, force: bool) -> None:
    """Render a memory result; with --plot, also draw its bars to a file and say where."""
    if plot:
        from lmcalc import plots

        written = plots.plot_memory(result, plot, force)
        result = replace(result, notes=(*result.notes, f"plot written to {written}"))
    emit(result, as_json, explain, brief)


@with_launch
@with_options(LAYOUT_OPTIONS, at="layout")
@with_options(TRAINING_OPTIONS, at="training")
def fit(
    model: ModelOpt,
    gpus: Annotated[
        str, typer.Option("--gpus", help="Cluster whose GPU type (and layout) to fit on.", autocompletion=complete_gpus)
    ] = "8xH100",
    training: dict[str, Any] | None = None,
    layout: dict[str, Any] | None = None,
    as_json: JsonOpt = False,
    explain: ExplainOpt = False,
    brief: BriefOpt = False,
) -> None:
    """The largest micro-batch, the longest sequence and the fewest GPUs that fit, and what binds each."""
    from lmcalc.estimates import limits as estimates

    assert training is not None and layout is not None  # filled in by with_options
    emit(estimates.fit(model=model, gpus=gpus, **training, **layout), as_json, explain, brief)


@with_launch
@with_options(METHOD_OPTIONS, at="method")
@with_options(RUN_OPTIONS, at="run")
@with_options(SEARCH_OPTIONS, at="search")
@with_options(SPLIT_OPTIONS, at="split")
@with_options(PIN_OPTIONS, at="pins")
@with_options(BATCH_OPTIONS, at="batch")
@with_options(WORKLOAD_OPTIONS, at="workload")
def plan(
    model: ModelOpt,
    gpus: Annotated[str, typer.Option("--gpus", help="Cluster, e.g. 64x8xH100.", autocompletion=complete_gpus)],
    workload: dict[str, Any] | None = None,
    batch: dict[str, Any] | None = None,
    top: Annotated[
        str,
        typer.Option(
            "--top",
            help="How many of the fastest layouts to show, in tables and JSON alike; all: every one.",
            rich_help_panel=OUTPUT_PANEL,
        ),
    ] = "10",
    pins: dict[str, Any] | None = None,
    split: dict[str, Any] | None = None,
    search: dict[str, Any] | None = None,
    run: dict[str, Any] | None = None,
    method: dict[str, Any] | None = None,
    plot: Annotated[
        str | None,
        typer.Option("--plot", help="Also draw the ranked layouts: plan.png / .svg.", rich_help_panel=OUTPUT_PANEL),
    ] = None,
    emit_kind: Annotated[
        str | None,
        typer.Option(
            "--emit",
            help=f"Print the chosen layout as a framework's config instead: {alternatives(EMIT_KINDS)} (--from reads "
            "it back).",
            rich_help_panel=OUTPUT_PANEL,
        ),
    ] = None,
    rank: Annotated[
        int,
        typer.Option(
            "--rank", help="With --emit: the layout of this rank (1: the fastest).", rich_help_panel=OUTPUT_PANEL
        ),
    ] = 1,
    force: ForceOpt = False,
    vs: VsOpt = None,
    as_json: JsonOpt = False,
    explain: ExplainOpt = False,
    brief: BriefOpt = False,
) -> None:
    """Every valid layout that fits, ranked by predicted throughput (the Ultra-Scale Playbook's question)."""
    from lmcalc.estimates import plan as estimates

    groups = (workload, batch, pins, split, search, run, method)
    settings = {name: value for group in groups if group is not None for name, value in group.items()}
    text = top.strip()
    # more than 12 digits is more layouts than any search finds: every one, without reading the number
    top_n = None if text.lower() == "all" or (text.isdigit() and len(text) > 12) else int(text) if text.isdigit() else 0
    if top_n == 0:
        raise LmcalcError(f"--top takes a positive whole number of layouts, or all; got {top!r}")
    if emit_kind is not None:
        if vs or plot or as_json or explain or brief:
            raise LmcalcError("--emit prints a framework's config alone: give it without --vs, --plot, --json, "
                              "--explain and --brief")  # fmt: skip
        from lmcalc.launch.emit import emit_plan

        print(emit_plan(estimates.plan(model=model, gpus=gpus, top=None, **settings), emit_kind, rank), end="")
        return
    if vs:
        if plot:
            raise LmcalcError("--vs draws a row per cluster: give it without --plot")
        best = compared(lambda cluster: estimates.plan(model=model, gpus=cluster, top=1, **settings), gpus, vs, explain)
        emit(best, as_json, explain, brief)
        return
    # a plot draws every layout that fits (``layouts`` holds each one's figures); the table and JSON show the top
    found = estimates.plan(model=model, gpus=gpus, top=top_n, **settings)
    ranked = found.report
    shown = found.derivation if explain else ranked
    if plot:
        from lmcalc import plots

        written = plots.plot_plan(found, plot, force)  # every layout that fits, whatever is shown
        shown = replace(shown, notes=(*shown.notes, f"plot written to {written}"))
    emit(shown, as_json, explain, brief)


def optimal(
    ctx: typer.Context,
    compute: Annotated[str | None, typer.Option("--compute", help="Training budget in FLOPs, e.g. 1e24.")] = None,
    gpus: Annotated[
        str | None,
        typer.Option("--gpus", help="Or a cluster (with --days), e.g. 1024xH100.", autocompletion=complete_gpus),
    ] = None,
    days: Annotated[float | None, typer.Option("--days", help="With --gpus: days of training.")] = None,
    mfu: Annotated[
        float | None, typer.Option("--mfu", help="With --gpus: model FLOPs utilisation (default 0.4).")
    ] = None,
    tokens_per_param: Annotated[
        float, typer.Option("--tokens-per-param", help="The rule of thumb's ratio.")
    ] = TOKENS_PER_PARAM,
    precision: PrecisionOpt = DEFAULT_PRECISION,
    price: Annotated[float | None, typer.Option("--price-per-gpu-hour", help="Price in $ per GPU-hour.")] = None,
    as_json: JsonOpt = False,
    explain: ExplainOpt = False,
    brief: BriefOpt = False,
) -> None:
    """Compute-optimal parameters and tokens (Hoffmann et al. 2022) for a FLOP budget or a cluster and deadline."""
    from lmcalc.estimates import time as estimates

    given = flags_given(ctx, ("precision",))  # its default applies to a cluster only: given alone, it is refused
    estimate = estimates.optimal(
        compute=compute,
        gpus=gpus,
        days=days,
        mfu=mfu,
        tokens_per_param=tokens_per_param,
        precision=precision if given else None,
        price_per_gpu_hour=price,
    )
    emit(estimate, as_json, explain, brief)
