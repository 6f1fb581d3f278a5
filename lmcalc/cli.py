"""The ``lmcalc`` command line: parse flags, resolve presets, call the estimates, render. No arithmetic.

Errors in the user's input are printed as one line (``lmcalc: error: ...``) with exit code 2; the
accounting commands never import torch.
"""

from __future__ import annotations

import json
import math
import os
import sys
from contextvars import ContextVar
from dataclasses import replace
from typing import Annotated

import typer

from lmcalc import __version__
from lmcalc import estimates as est
from lmcalc import presets as pr
from lmcalc.engine import layout as ly
from lmcalc.engine.memory import OVERHEAD_ALLOWANCE_BYTES
from lmcalc.engine.optimal import TOKENS_PER_PARAM
from lmcalc.errors import LmcalcError
from lmcalc.render import render
from lmcalc.result import Result
from lmcalc.units import GiB, parse_bytes, parse_count, parse_shape

OVERHEAD_DEFAULT = f"{OVERHEAD_ALLOWANCE_BYTES / GiB:g}GiB"

app = typer.Typer(
    name="lmcalc",
    help="What an LLM training run costs before you rent a GPU: parameters, FLOPs, memory per GPU, time.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=True,
)
presets_app = typer.Typer(help="List, show and check the built-in and your own presets.", no_args_is_help=True)
app.add_typer(presets_app, name="presets")

JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document with the same figures.")]
ExplainOpt = Annotated[bool, typer.Option("--explain", help="Print the derivation: formula, numbers, sources.")]
ModelOpt = Annotated[
    str, typer.Option("--model", "-m", help="Model preset name, family name, YAML file or HF config.json.")
]
PrecisionOpt = Annotated[str, typer.Option("--precision", help="Precision recipe (lmcalc presets list precisions).")]
OptimizerOpt = Annotated[str, typer.Option("--optimizer", help="Optimizer (lmcalc presets list optimizers).")]
SeqOpt = Annotated[
    str | None,
    typer.Option(
        "--seq", help="Sequence length in tokens: 4096, or 8K = 8192 (binary K). Default: min(model context, 8192)."
    ),
]
RecomputeOpt = Annotated[str, typer.Option("--recompute", help="Activation recomputation: none | selective | full.")]
AttentionOpt = Annotated[
    str,
    typer.Option("--attention", help="Attention kernel: flash (fused, no s² scores) | eager (scores materialised)."),
]
OverheadOpt = Annotated[
    str, typer.Option("--overhead", help="Allowance for CUDA context, workspaces and fragmentation (e.g. 2GiB, 0).")
]


def _choice(value: str, options: tuple[str, ...], flag: str) -> str:
    key = value.strip().lower()
    if key not in options:
        raise LmcalcError(f"{flag} must be one of {', '.join(options)}; got {value!r}")
    return key


def _finite(value: float | None, flag: str, allow_zero: bool = False) -> float | None:
    """A float flag that is a finite positive number (or zero, if allowed); nan and inf are refused."""
    if value is not None and not (math.isfinite(value) and (value > 0 or (allow_zero and value == 0))):
        wanted = "zero or a positive number" if allow_zero else "a positive number"
        raise LmcalcError(f"{flag} must be {wanted}, got {value}")
    return value


def _positive_int(value: int, flag: str) -> int:
    if value <= 0:
        raise LmcalcError(f"{flag} must be a positive integer, got {value}")
    return value


def _non_negative_int(value: int, flag: str) -> int:
    """A count that may be zero (warm-up calls), never negative."""
    if value < 0:
        raise LmcalcError(f"{flag} must be 0 or more, got {value}")
    return value


def _seq(value: str | None, model=None, flag: str = "--seq") -> est.Given:
    """Tokens per sequence from ``flag`` (``--seq``, or ``--context`` for serving), else the model's default."""
    if value is None:
        return est.default_seq_len(model)
    seq = parse_count(value, flag, binary=True)
    if not seq.is_integer():
        raise LmcalcError(f"{flag} must be a whole number of tokens, got {value!r}")
    return est.Given(int(seq), flag)


_CAPTURE: ContextVar[list[Result] | None] = ContextVar("lmcalc_capture", default=None)


def _emit(result: Result, as_json: bool, explain: bool) -> None:
    captured = _CAPTURE.get()
    if captured is not None:  # lmcalc.estimate(): hand the result back instead of printing it
        captured.append(result)
        return
    render(result, as_json=as_json, explain=explain)


def _bench_file(calibration: str | None, run: str):
    """The benchmark results file: --calibration's, else the default one; refused if it does not exist."""
    from pathlib import Path

    from lmcalc.bench import results

    path = Path(calibration).expanduser() if calibration else results.default_path()
    if not path.exists():
        raise LmcalcError(
            f"no such benchmark file: {path}" if calibration else f"no benchmark results yet ({path}): {run}"
        )
    return path


def _measured_peak(peak: str, calibration: str | None, hardware, recipe) -> tuple[float, str] | None:
    """The measured FLOP/s for this GPU and the recipe's dtype from a benchmark file, or None for --peak spec."""
    from lmcalc.bench import results

    if _choice(peak, ("spec", "measured"), "--peak") == "spec" and calibration is None:
        return None
    path = _bench_file(calibration, f"run 'lmcalc bench --dtype {recipe.compute_dtype}' on one {hardware.name}")
    found = results.measured_peak(results.load(path), hardware.name, recipe.compute_dtype)
    if found is None:
        raise LmcalcError(
            f"{path} has no {recipe.compute_dtype} measurement for {hardware.name}; run "
            f"'lmcalc bench --dtype {recipe.compute_dtype}' on one (or use --peak spec)"
        )
    flops, record = found
    return flops, f"{record.kind} benchmark on {record.device}, {record.when}, {path}"


def _measured_efficiency(calibration: str | None, hardware, recipe, model: str) -> est.Given:
    """The compute efficiency from ``lmcalc bench step`` results: the HFU of a measured step on this GPU."""
    from lmcalc.bench import results

    dtype = recipe.compute_dtype
    run = f"run 'lmcalc bench step -m MODEL --dtype {dtype}' on one {hardware.name} (or give --efficiency)"
    path = _bench_file(calibration, run)
    found = results.measured_step_efficiency(results.load(path), hardware.name, dtype, model)
    if found is None:
        raise LmcalcError(f"{path} has no {dtype} training step measured on {hardware.name}; {run}")
    hfu, record = found
    measured = record.figures["model"]
    which = "this model's" if measured == model else f"{measured}'s (the largest step measured)"
    return est.Given(hfu, f"measured: HFU of {which} step, {record.device}, {record.when}, {path}")


def _version(value: bool) -> None:
    if value:
        print(f"lmcalc {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """What an LLM training run costs before you rent a GPU: parameters, FLOPs, memory per GPU, time."""


@app.command("train-time")
def train_time(
    model: ModelOpt,
    gpus: Annotated[str | None, typer.Option("--gpus", help="Cluster: 1024xH100 or 128x8xH100.")] = None,
    tokens: Annotated[
        str | None,
        typer.Option(
            "--tokens",
            help="Training tokens (15T, 300B). Default: the preset's published count, else 20 per parameter.",
        ),
    ] = None,
    mfu: Annotated[
        float | None, typer.Option("--mfu", help="Model FLOPs utilisation in (0, 1]. Default: 0.4 (an assumption).")
    ] = None,
    precision: PrecisionOpt = "bf16-mixed",
    days: Annotated[float | None, typer.Option("--days", help="Solve for GPUs: finish within this many days.")] = None,
    gpu: Annotated[
        str | None, typer.Option("--gpu", help="GPU type when solving for the GPU count with --days.")
    ] = None,
    flops_basis: Annotated[
        str, typer.Option("--flops-basis", help="6nd (napkin, default) | detailed (matmul count, causal).")
    ] = "6nd",
    seq: SeqOpt = None,
    price: Annotated[
        float | None, typer.Option("--price-per-gpu-hour", help="Price in $ per GPU-hour, for the cost.")
    ] = None,
    peak: Annotated[
        str, typer.Option("--peak", help="spec (the dense spec-sheet peak) | measured (lmcalc bench results).")
    ] = "spec",
    calibration: Annotated[
        str | None,
        typer.Option(
            "--calibration", help="Benchmark results file to take the measured peak from (implies --peak measured)."
        ),
    ] = None,
    as_json: JsonOpt = False,
    explain: ExplainOpt = False,
) -> None:
    """Days and GPU-hours to train a model on a cluster, or GPUs needed to meet a deadline."""
    resolved = pr.resolve_model(model)
    spec = resolved.spec
    basis = _choice(flops_basis, ("6nd", "detailed"), "--flops-basis")
    tokens_given = est.Given(parse_count(tokens, "--tokens"), "--tokens") if tokens else est.default_tokens(spec)
    mfu_given = est.Given(mfu, "--mfu") if mfu is not None else est.default_mfu()
    _finite(price, "--price-per-gpu-hour", allow_zero=True)
    _finite(days, "--days")
    recipe = pr.resolve_precision(precision).spec
    cluster = hardware = None
    if days is not None:
        if gpus is not None:
            raise LmcalcError(
                "give either --gpus (to get the time) or --days with --gpu (to get the GPU count), not both"
            )
        if gpu is None:
            raise LmcalcError("--days needs --gpu, the GPU type to count (e.g. --gpu H100)")
        hardware = pr.resolve_hardware(gpu).spec
    elif gpus is None:
        raise LmcalcError("give --gpus (e.g. --gpus 1024xH100), or --days with --gpu to solve for the GPU count")
    else:
        cluster = pr.parse_cluster(gpus)
    result = est.train_time_result(
        spec,
        tokens_given,
        mfu_given,
        recipe,
        cluster=cluster,
        hardware=hardware,
        days=days,
        seq_len=_seq(seq, spec),
        basis=basis,
        price_per_gpu_hour=price,
        note=resolved.note,
        measured_peak=_measured_peak(peak, calibration, cluster.hardware if cluster else hardware, recipe),
    )
    _emit(result, as_json, explain)


@app.command("max-params")
def max_params(
    gpus: Annotated[str, typer.Option("--gpus", help="Cluster: 8xH100, 2x8xA100-80GB.")],
    optimizer: OptimizerOpt = "adamw",
    precision: PrecisionOpt = "bf16-mixed",
    seq: Annotated[str, typer.Option("--seq", help="Sequence length for the activation column.")] = "4096",
    micro_batch: Annotated[int, typer.Option("--micro-batch", help="Sequences per GPU for the activation column.")] = 1,
    attention: AttentionOpt = "flash",
    recompute: RecomputeOpt = "none",
    overhead: OverheadOpt = OVERHEAD_DEFAULT,
    like: Annotated[
        str, typer.Option("--like", help="Model whose proportions the activation column scales.")
    ] = "llama-3.1-8b",
    as_json: JsonOpt = False,
    explain: ExplainOpt = False,
) -> None:
    """The largest model whose training state fits the GPUs, for plain data parallelism and ZeRO-1/2/3."""
    cluster = pr.parse_cluster(gpus)
    result = est.max_params_result(
        cluster,
        pr.resolve_precision(precision).spec,
        pr.resolve_optimizer(optimizer).spec,
        pr.resolve_model(like).spec,
        int(_seq(seq).value),
        _positive_int(micro_batch, "--micro-batch"),
        _choice(attention, ("flash", "eager"), "--attention"),  # type: ignore[arg-type]
        _choice(recompute, ("none", "selective", "full"), "--recompute"),  # type: ignore[arg-type]
        parse_bytes(overhead, "--overhead"),
    )
    _emit(result, as_json, explain)


@app.command("flops")
def flops(
    model: ModelOpt,
    tokens: Annotated[
        str | None,
        typer.Option("--tokens", help="Training tokens. Default: the preset's published count, else 20 per parameter."),
    ] = None,
    seq: SeqOpt = None,
    attn_flops: Annotated[str, typer.Option("--attn-flops", help="Attention convention: causal | full.")] = "causal",
    recompute: RecomputeOpt = "none",
    as_json: JsonOpt = False,
    explain: ExplainOpt = False,
) -> None:
    """Training FLOPs: 6·N·D, the detailed matmul count (causal or full attention), and PaLM's convention."""
    resolved = pr.resolve_model(model)
    spec = resolved.spec
    tokens_given = est.Given(parse_count(tokens, "--tokens"), "--tokens") if tokens else est.default_tokens(spec)
    result = est.flops_result(
        spec,
        tokens_given,
        _seq(seq, spec),
        _choice(attn_flops, ("causal", "full"), "--attn-flops"),  # type: ignore[arg-type]
        _choice(recompute, ("none", "selective", "full"), "--recompute"),  # type: ignore[arg-type]
        note=resolved.note,
    )
    _emit(result, as_json, explain)


DegreeHelp = {
    "dp": "Data-parallel degree (default: GPUs / (TP·PP·CP)).",
    "tp": "Tensor-parallel degree (within a node).",
    "pp": "Pipeline-parallel stages.",
    "cp": "Context-parallel degree (splits the sequence; needs --attention flash).",
    "ep": "Expert-parallel degree (MoE models; divides DP·CP).",
}

DpOpt = Annotated[int | None, typer.Option("--dp", help=DegreeHelp["dp"])]
TpOpt = Annotated[int, typer.Option("--tp", help=DegreeHelp["tp"])]
PpOpt = Annotated[int, typer.Option("--pp", help=DegreeHelp["pp"])]
CpOpt = Annotated[int, typer.Option("--cp", help=DegreeHelp["cp"])]
EpOpt = Annotated[int, typer.Option("--ep", help=DegreeHelp["ep"])]


FirstStageOpt = Annotated[
    int | None,
    typer.Option(
        "--first-stage-layers",
        help="Layers on the first pipeline stage, which also holds the embedding (Megatron-LM's "
        "--decoder-first-pipeline-num-layers); the other stages share the rest. Interleaved: every stage's "
        "layers must split evenly over its chunks. Default: an even split.",
    ),
]
LastStageOpt = Annotated[
    int | None,
    typer.Option(
        "--last-stage-layers",
        help="Layers on the last pipeline stage, which also computes the logits (Megatron-LM's "
        "--decoder-last-pipeline-num-layers); the other stages share the rest. Interleaved: every stage's "
        "layers must split evenly over its chunks. Default: an even split.",
    ),
]


EmbeddingSplitOpt = Annotated[
    bool,
    typer.Option(
        "--account-for-embedding-in-pipeline-split",
        help="Count the input embedding as one layer when the layers are split over the pipeline stages "
        "(Megatron-LM's flag): the first stage builds one layer fewer. Works with the interleaved schedule.",
    ),
]
LossSplitOpt = Annotated[
    bool,
    typer.Option(
        "--account-for-loss-in-pipeline-split",
        help="Count the output layer and the loss as one layer when the layers are split over the pipeline "
        "stages (Megatron-LM's flag): the last stage builds one layer fewer. Works with the interleaved schedule.",
    ),
]


def build_layout(
    cluster,
    dp: int | None,
    tp: int,
    pp: int,
    cp: int,
    ep: int,
    zero: int,
    sequence_parallel: bool,
    micro_batch: int,
    grad_accum: int,
    schedule: str,
    virtual_stages: int,
    first_stage_layers: int | None = None,
    last_stage_layers: int | None = None,
    embedding_in_split: bool = False,
    loss_in_split: bool = False,
) -> ly.Layout:
    """The layout the flags describe; DP fills the GPUs the other degrees leave."""
    for flag, value in (("--tp", tp), ("--pp", pp), ("--cp", cp), ("--ep", ep)):
        _positive_int(value, flag)
    if dp is None:
        if cluster.count % (tp * pp * cp):
            raise LmcalcError(f"TP·PP·CP = {tp * pp * cp} does not divide the {cluster.count} GPUs of {cluster.label}")
        dp = cluster.count // (tp * pp * cp)
    schedule = _choice(schedule, ("1f1b", "interleaved"), "--schedule")
    return ly.Layout(
        dp=dp,
        tp=tp,
        pp=pp,
        cp=cp,
        ep=ep,
        zero=zero,
        sequence_parallel=sequence_parallel,
        micro_batch=_positive_int(micro_batch, "--micro-batch"),
        grad_accum=_positive_int(grad_accum, "--grad-accum"),
        schedule=schedule,  # type: ignore[arg-type]
        virtual_stages=_positive_int(virtual_stages, "--virtual-stages"),
        first_stage_layers=first_stage_layers,
        last_stage_layers=last_stage_layers,
        embedding_in_split=embedding_in_split,
        loss_in_split=loss_in_split,
    )


SERVING_ONLY = ("batch", "context", "weights_dtype", "kv_dtype", "quant_group")
MEMORY_SHARED = ("model", "gpus", "tp", "overhead", "plot", "force", "inference", "as_json", "explain")


def _flags_given(ctx: typer.Context, names) -> list[str]:
    """The flags (as typed: ``--batch``) among the parameters ``names`` that the command line set. (The
    source is compared by name: typer carries its own copy of click's ``ParameterSource``.)"""
    given = [p for p in ctx.command.params if p.name in names]
    return [p.opts[0] for p in given if getattr(ctx.get_parameter_source(p.name), "name", "") == "COMMANDLINE"]


@app.command("memory")
def memory(
    ctx: typer.Context,
    model: ModelOpt,
    gpus: Annotated[str, typer.Option("--gpus", help="Cluster, e.g. 8xH100 or 64x8xH100.")] = "1xH100",
    seq: SeqOpt = None,
    micro_batch: Annotated[int, typer.Option("--micro-batch", help="Sequences per GPU per micro-batch.")] = 1,
    grad_accum: Annotated[
        int, typer.Option("--grad-accum", help="Micro-batches per step (gradient accumulation).")
    ] = 1,
    dp: DpOpt = None,
    tp: TpOpt = 1,
    pp: PpOpt = 1,
    cp: CpOpt = 1,
    ep: EpOpt = 1,
    zero: Annotated[int, typer.Option("--zero", help="ZeRO stage 0-3 over DP·CP (3 = FSDP full sharding).")] = 0,
    sequence_parallel: Annotated[
        bool,
        typer.Option(
            "--sequence-parallel", help="Split norms, dropout and linear inputs over TP too (Korthikanti et al.)."
        ),
    ] = False,
    schedule: Annotated[str, typer.Option("--schedule", help="Pipeline schedule: 1f1b | interleaved.")] = "1f1b",
    virtual_stages: Annotated[
        int, typer.Option("--virtual-stages", help="Model chunks per pipeline stage (interleaved schedule).")
    ] = 1,
    first_stage_layers: FirstStageOpt = None,
    last_stage_layers: LastStageOpt = None,
    embedding_in_split: EmbeddingSplitOpt = False,
    loss_in_split: LossSplitOpt = False,
    precision: PrecisionOpt = "bf16-mixed",
    optimizer: OptimizerOpt = "adamw",
    attention: AttentionOpt = "flash",
    recompute: RecomputeOpt = "none",
    overhead: OverheadOpt = OVERHEAD_DEFAULT,
    sweep: Annotated[
        str | None, typer.Option("--sweep", help="One row per value: seq=1k,4k,16k,64k or micro-batch=1,2,4,8.")
    ] = None,
    stages: Annotated[
        bool,
        typer.Option("--stages", help="One row per pipeline stage: which stage binds, and the room the others have."),
    ] = False,
    plot: Annotated[
        str | None, typer.Option("--plot", help="Also draw the breakdown: memory.png / .svg / .pdf.")
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Let --plot replace an existing file.")] = False,
    inference: Annotated[bool, typer.Option("--inference", help="Serving memory instead: weights + KV cache.")] = False,
    batch: Annotated[int, typer.Option("--batch", help="With --inference: sequences served at once.")] = 1,
    context: Annotated[
        str | None, typer.Option("--context", help="With --inference: tokens per sequence (8K = 8192).")
    ] = None,
    weights_dtype: Annotated[
        str, typer.Option("--weights-dtype", help="With --inference: bf16 | fp16 | fp8 | int8 | int4.")
    ] = "bf16",
    kv_dtype: Annotated[
        str, typer.Option("--kv-dtype", help="With --inference: KV-cache dtype (bf16 | fp16 | fp8).")
    ] = "bf16",
    quant_group: Annotated[
        int | None,
        typer.Option(
            "--quant-group", help="With --inference: count one fp16 scale per group of this many int8/int4 weights."
        ),
    ] = None,
    as_json: JsonOpt = False,
    explain: ExplainOpt = False,
) -> None:
    """Memory of the most loaded GPU in one training step, for any DP/ZeRO/TP/SP/PP/CP/EP layout
    (or, with --inference, of serving: weights and KV cache)."""
    resolved = pr.resolve_model(model)
    spec = resolved.spec
    cluster = pr.parse_cluster(gpus)
    serving = _flags_given(ctx, SERVING_ONLY)
    if not inference and serving:
        raise LmcalcError(
            f"{' and '.join(serving)} describe{'s' if len(serving) == 1 else ''} serving: add --inference "
            "(training uses --micro-batch and --seq)"
        )
    training = _flags_given(ctx, {p.name for p in ctx.command.params} - set(SERVING_ONLY) - set(MEMORY_SHARED))
    if inference and training:
        takes = [p.opts[0] for p in ctx.command.params if p.name in SERVING_ONLY] + ["--tp"]
        raise LmcalcError(
            f"{' and '.join(training)} describe{'s' if len(training) == 1 else ''} training, not serving: "
            f"drop {'it' if len(training) == 1 else 'them'}, or drop --inference "
            f"(serving takes {', '.join(takes[:-1])} and {takes[-1]})"
        )
    if inference:
        result = est.inference_result(
            spec,
            cluster,
            _positive_int(batch, "--batch"),
            _seq(context, spec, "--context"),
            weights_dtype,
            kv_dtype,
            _positive_int(tp, "--tp"),
            parse_bytes(overhead, "--overhead"),
            quant_group,
            note=resolved.note,
        )
        _emit_with_plot(result, as_json, explain, plot, force)
        return
    recipe, opt = pr.resolve_precision(precision).spec, pr.resolve_optimizer(optimizer).spec
    attention = _choice(attention, ("flash", "eager"), "--attention")
    recompute = _choice(recompute, ("none", "selective", "full"), "--recompute")
    overhead_bytes = parse_bytes(overhead, "--overhead")

    def one(seq_text: str | None, batch: int, each_stage: bool = False) -> Result:
        layout = build_layout(
            cluster,
            dp,
            tp,
            pp,
            cp,
            ep,
            zero,
            sequence_parallel,
            batch,
            grad_accum,
            schedule,
            virtual_stages,
            first_stage_layers,
            last_stage_layers,
            embedding_in_split,
            loss_in_split,
        )
        return est.memory_result(
            spec,
            cluster,
            recipe,
            opt,
            layout,
            _seq(seq_text, spec),
            attention,
            recompute,
            overhead_bytes,  # type: ignore[arg-type]
            note=resolved.note,
            stages=each_stage,
        )

    if stages and sweep is not None:
        raise LmcalcError("give --sweep or --stages, not both: each draws its own rows")
    if sweep is None:
        _emit_with_plot(one(seq, micro_batch, stages), as_json, explain, plot, force)
        return
    name, values = _sweep(sweep)
    rows = [(v, one(v, micro_batch) if name == "seq" else one(seq, _count_int(v, "--sweep"))) for v in values]
    _emit_with_plot(est.memory_sweep_result(rows, name), as_json, explain, plot, force)


def _emit_with_plot(result: Result, as_json: bool, explain: bool, plot: str | None, force: bool) -> None:
    """Render a memory result; with --plot, also draw its bars to a file and say where."""
    if plot:
        from lmcalc import plots

        written = plots.plot_memory(result, plot, force)
        result = replace(result, notes=(*result.notes, f"plot written to {written}"))
    _emit(result, as_json, explain)


@app.command("fit")
def fit_command(
    model: ModelOpt,
    gpus: Annotated[str, typer.Option("--gpus", help="Cluster whose GPU type (and layout) to fit on.")] = "8xH100",
    seq: SeqOpt = None,
    micro_batch: Annotated[int, typer.Option("--micro-batch", help="Sequences per GPU per micro-batch.")] = 1,
    grad_accum: Annotated[int, typer.Option("--grad-accum", help="Micro-batches per step.")] = 1,
    dp: DpOpt = None,
    tp: TpOpt = 1,
    pp: PpOpt = 1,
    cp: CpOpt = 1,
    ep: EpOpt = 1,
    zero: Annotated[int, typer.Option("--zero", help="ZeRO stage 0-3 over DP·CP.")] = 0,
    sequence_parallel: Annotated[
        bool, typer.Option("--sequence-parallel", help="Sequence parallelism with TP.")
    ] = False,
    schedule: Annotated[str, typer.Option("--schedule", help="Pipeline schedule: 1f1b | interleaved.")] = "1f1b",
    virtual_stages: Annotated[int, typer.Option("--virtual-stages", help="Model chunks per stage.")] = 1,
    first_stage_layers: FirstStageOpt = None,
    last_stage_layers: LastStageOpt = None,
    embedding_in_split: EmbeddingSplitOpt = False,
    loss_in_split: LossSplitOpt = False,
    precision: PrecisionOpt = "bf16-mixed",
    optimizer: OptimizerOpt = "adamw",
    attention: AttentionOpt = "flash",
    recompute: RecomputeOpt = "none",
    overhead: OverheadOpt = OVERHEAD_DEFAULT,
    as_json: JsonOpt = False,
    explain: ExplainOpt = False,
) -> None:
    """The largest micro-batch, the longest sequence and the fewest GPUs that fit, and what binds each."""
    resolved = pr.resolve_model(model)
    cluster = pr.parse_cluster(gpus)
    layout = build_layout(
        cluster,
        dp,
        tp,
        pp,
        cp,
        ep,
        zero,
        sequence_parallel,
        micro_batch,
        grad_accum,
        schedule,
        virtual_stages,
        first_stage_layers,
        last_stage_layers,
        embedding_in_split,
        loss_in_split,
    )
    result = est.fit_result(
        resolved.spec,
        cluster,
        pr.resolve_precision(precision).spec,
        pr.resolve_optimizer(optimizer).spec,
        layout,
        _seq(seq, resolved.spec),
        _choice(attention, ("flash", "eager"), "--attention"),  # type: ignore[arg-type]
        _choice(recompute, ("none", "selective", "full"), "--recompute"),  # type: ignore[arg-type]
        parse_bytes(overhead, "--overhead"),
        note=resolved.note,
    )
    _emit(result, as_json, explain)


@app.command("plan")
def plan_command(
    model: ModelOpt,
    gpus: Annotated[str, typer.Option("--gpus", help="Cluster, e.g. 64x8xH100.")],
    seq: SeqOpt = None,
    global_batch: Annotated[
        str, typer.Option("--global-batch", help="Tokens per step (binary: 4M = 4,194,304).")
    ] = "4M",
    top: Annotated[int, typer.Option("--top", help="How many of the fastest layouts to show.")] = 10,
    tp: Annotated[int | None, typer.Option("--tp", help="Pin the tensor-parallel degree.")] = None,
    pp: Annotated[int | None, typer.Option("--pp", help="Pin the pipeline-parallel degree.")] = None,
    cp: Annotated[int | None, typer.Option("--cp", help="Pin the context-parallel degree.")] = None,
    ep: Annotated[int | None, typer.Option("--ep", help="Pin the expert-parallel degree.")] = None,
    zero: Annotated[int | None, typer.Option("--zero", help="Pin the ZeRO stage.")] = None,
    micro_batch: Annotated[int | None, typer.Option("--micro-batch", help="Pin the micro-batch.")] = None,
    recompute: Annotated[str | None, typer.Option("--recompute", help="Pin none | selective | full.")] = None,
    max_pp: Annotated[int, typer.Option("--max-pp", help="Largest pipeline degree to try.")] = 64,
    max_cp: Annotated[int, typer.Option("--max-cp", help="Largest context-parallel degree to try.")] = 16,
    tp_across_nodes: Annotated[
        bool, typer.Option("--tp-across-nodes", help="Allow TP groups larger than a node.")
    ] = False,
    first_stage_layers: FirstStageOpt = None,
    last_stage_layers: LastStageOpt = None,
    embedding_in_split: EmbeddingSplitOpt = False,
    loss_in_split: LossSplitOpt = False,
    tokens: Annotated[str | None, typer.Option("--tokens", help="Training tokens, for the days column.")] = None,
    plot: Annotated[str | None, typer.Option("--plot", help="Also draw the ranked layouts: plan.png / .svg.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Let --plot replace an existing file.")] = False,
    efficiency: Annotated[
        float | None,
        typer.Option("--efficiency", help="Fraction of peak the compute reaches (default 0.6, calibrated)."),
    ] = None,
    measured_efficiency: Annotated[
        bool,
        typer.Option(
            "--measured-efficiency",
            help="Take the compute efficiency from 'lmcalc bench step' results on this GPU type: the HFU of the "
            "model's own measured step, else of the largest step measured.",
        ),
    ] = False,
    calibration: Annotated[
        str | None,
        typer.Option("--calibration", help="Benchmark results file for --measured-efficiency (implies it)."),
    ] = None,
    precision: PrecisionOpt = "bf16-mixed",
    optimizer: OptimizerOpt = "adamw",
    attention: AttentionOpt = "flash",
    overhead: OverheadOpt = OVERHEAD_DEFAULT,
    as_json: JsonOpt = False,
    explain: ExplainOpt = False,
) -> None:
    """Every valid layout that fits, ranked by predicted throughput (the Ultra-Scale Playbook's question)."""
    from lmcalc.engine import plan as pl

    resolved = pr.resolve_model(model)
    spec = resolved.spec
    cluster = pr.parse_cluster(gpus)
    if zero is not None and zero not in (0, 1, 2, 3):
        raise LmcalcError(f"--zero must be 0, 1, 2 or 3, got {zero}")
    for flag, value in (("--tp", tp), ("--pp", pp), ("--cp", cp), ("--ep", ep), ("--micro-batch", micro_batch)):
        if value is not None:
            _positive_int(value, flag)
    pins = pl.Pins(
        tp=tp,
        pp=pp,
        cp=cp,
        ep=ep,
        zero=zero,
        micro_batch=micro_batch,
        recompute=_choice(recompute, ("none", "selective", "full"), "--recompute") if recompute else None,  # type: ignore[arg-type]
        max_pp=_positive_int(max_pp, "--max-pp"),
        max_cp=_positive_int(max_cp, "--max-cp"),
        tp_within_node=not tp_across_nodes,
        first_stage_layers=first_stage_layers,
        last_stage_layers=last_stage_layers,
        embedding_in_split=embedding_in_split,
        loss_in_split=loss_in_split,
    )
    eff = None
    if efficiency is not None:
        if measured_efficiency or calibration:
            raise LmcalcError("give --efficiency or --measured-efficiency/--calibration, not both")
        if not (math.isfinite(efficiency) and 0 < efficiency <= 1):
            raise LmcalcError(f"--efficiency must be in (0, 1], got {efficiency}")
        eff = est.Given(efficiency, "--efficiency")
    recipe = pr.resolve_precision(precision).spec
    if measured_efficiency or calibration:
        eff = _measured_efficiency(calibration, cluster.hardware, recipe, spec.name)
    top_n = _positive_int(top, "--top")
    ranked, derived = est.plan_results(
        spec,
        cluster,
        _seq(seq, spec),
        parse_count(global_batch, "--global-batch", binary=True),
        recipe,
        pr.resolve_optimizer(optimizer).spec,
        pins,
        _choice(attention, ("flash", "eager"), "--attention"),  # type: ignore[arg-type]
        eff,
        parse_bytes(overhead, "--overhead"),
        est.Given(parse_count(tokens, "--tokens"), "--tokens") if tokens else None,
        note=resolved.note,
    )
    shown = derived if explain else ranked if as_json else replace(ranked, sections=ranked.sections[:top_n])
    if plot:
        from lmcalc import plots

        written = plots.plot_plan(ranked, plot, force)  # every layout that fits, whatever is shown
        shown = replace(shown, notes=(*shown.notes, f"plot written to {written}"))
    _emit(shown, as_json, explain)


bench_app = typer.Typer(
    help="Measure what the hardware delivers with PyTorch; results feed the estimates. Plain `lmcalc bench` times "
    "matmuls (one shape, --sweep, or a model's shapes with --model); the subcommands time memory bandwidth, "
    "collectives and training steps."
)
app.add_typer(bench_app, name="bench")
DeviceOpt = Annotated[str, typer.Option("--device", help="cuda | cpu | mps | auto (the first available).")]
HardwareOpt = Annotated[
    str | None, typer.Option("--hardware", help="Hardware preset to compare with (default: matched by name).")
]
SaveOpt = Annotated[
    str | None, typer.Option("--save", help="Results file (default: ~/.local/share/lmcalc/bench.json).")
]
NoSaveOpt = Annotated[bool, typer.Option("--no-save", help="Do not write the results.")]


def _torch_or_fail() -> None:
    try:
        import torch  # noqa: F401
    except ImportError:
        raise LmcalcError("bench needs PyTorch: pip install 'lmcalc[bench]'") from None


def _save(records, save: str | None, no_save: bool) -> str:
    from pathlib import Path

    from lmcalc.bench import results

    if no_save:
        return "not saved (--no-save)"
    path = results.save(Path(save).expanduser() if save else results.default_path(), records)
    return f"saved to {path}"


MatmulDtypeOpt = Annotated[
    str | None, typer.Option("--dtype", help="bf16 | fp16 | fp32 | tf32 | fp8 (default: bf16 on GPUs, fp32 on CPUs).")
]
ShapeOpt = Annotated[str | None, typer.Option("--shape", help="MxNxK, e.g. 8192x8192x8192.")]
SweepFlag = Annotated[bool, typer.Option("--sweep", help="Search a grid of shapes; report the best and the spread.")]
BenchModelOpt = Annotated[str | None, typer.Option("--model", "-m", help="Benchmark this model's own matmul shapes.")]
BenchTpOpt = Annotated[int, typer.Option("--tp", help="Tensor-parallel split of the model's shapes.")]
BenchSeqOpt = Annotated[str, typer.Option("--seq", help="Sequence length for --model shapes.")]
BenchBatchOpt = Annotated[int, typer.Option("--micro-batch", help="Micro-batch for --model shapes.")]
WarmupOpt = Annotated[int, typer.Option("--warmup", help="Untimed calls first.")]
RepeatsOpt = Annotated[int, typer.Option("--repeats", help="Timed calls per shape.")]


@bench_app.callback(invoke_without_command=True)
def bench_main(
    ctx: typer.Context,
    dtype: MatmulDtypeOpt = None,
    shape: ShapeOpt = None,
    sweep: SweepFlag = False,
    model: BenchModelOpt = None,
    tp: BenchTpOpt = 1,
    seq: BenchSeqOpt = "2048",
    micro_batch: BenchBatchOpt = 1,
    warmup: WarmupOpt = 10,
    repeats: RepeatsOpt = 50,
    device: DeviceOpt = "auto",
    hardware: HardwareOpt = None,
    save: SaveOpt = None,
    no_save: NoSaveOpt = False,
    as_json: JsonOpt = False,
    explain: ExplainOpt = False,
) -> None:
    """Matmul throughput (one shape, --sweep, or a model's shapes with --model) against the dense peak.

    Also registered as `lmcalc bench matmul` (below): a leaf command has no subcommand, so it runs here."""
    if ctx.invoked_subcommand is not None:
        return
    _torch_or_fail()
    from rich.progress import Progress

    from lmcalc.bench import matmul, report
    from lmcalc.bench.device import detect

    dev = detect(device, hardware)
    dtype = (dtype or ("bf16" if dev.torch_device.type == "cuda" else "fp32")).lower()
    warmup, repeats = _non_negative_int(warmup, "--warmup"), _positive_int(repeats, "--repeats")
    if model is not None:
        spec = pr.resolve_model(model).spec
        tokens = _positive_int(micro_batch, "--micro-batch") * int(_seq(seq).value)
        shapes = matmul.model_matmuls(spec, tokens, _positive_int(tp, "--tp"))
    elif sweep:
        shapes = None
    else:
        dims = parse_shape(shape) if shape else ((8192,) * 3 if dev.torch_device.type == "cuda" else (1024,) * 3)
        if len(dims) != 3:
            raise LmcalcError(f"--shape needs three sizes MxNxK (e.g. 4096x4096x4096), got {shape!r}")
        m, n, k = dims
        measurement = matmul.measure(m, n, k, dtype, dev, warmup, repeats)
        note = _save(report.matmul_records([measurement], dev), save, no_save)
        result = report.matmul_result([measurement], dev, sweep=False)
        _emit(replace(result, notes=(*result.notes, note)), as_json, explain)
        return
    grid = [(mm.m, mm.n, mm.k) for mm in shapes] if shapes else matmul.sweep_shapes(dev)
    unique = list(dict.fromkeys(grid))
    measured: dict[tuple[int, int, int], matmul.MatmulMeasurement] = {}
    with Progress(transient=True, disable=as_json) as progress:
        task = progress.add_task(f"{dtype} matmuls on {dev.name}", total=len(unique))
        for m, n, k in unique:
            measured[(m, n, k)] = matmul.measure(m, n, k, dtype, dev, warmup, repeats)
            progress.advance(task)
    if shapes:
        pairs = [(mm, measured[(mm.m, mm.n, mm.k)]) for mm in shapes]
        rate = matmul.flop_weighted_rate(pairs)
        note = _save([report.model_record(spec.name, rate, dtype, dev)], save, no_save)
        result = report.model_result(spec.name, tokens, tp, pairs, rate, dev)
    else:
        note = _save(report.matmul_records(list(measured.values()), dev), save, no_save)
        result = report.matmul_result(list(measured.values()), dev, sweep=True)
    _emit(replace(result, notes=(*result.notes, note)), as_json, explain)


bench_app.command("matmul", help="Matmul throughput against the dense peak (the same as plain `lmcalc bench`).")(
    bench_main
)


@bench_app.command("memory")
def bench_memory(
    size: Annotated[
        str | None, typer.Option("--size", help="Buffer size, e.g. 1GiB (default 2 GiB on GPUs, 256 MiB on CPUs).")
    ] = None,
    repeats: Annotated[int, typer.Option("--repeats", help="Timed copies.")] = 20,
    device: DeviceOpt = "auto",
    hardware: HardwareOpt = None,
    save: SaveOpt = None,
    no_save: NoSaveOpt = False,
    as_json: JsonOpt = False,
    explain: ExplainOpt = False,
) -> None:
    """Device memory bandwidth from a large copy (bytes read + written) against the spec sheet."""
    _torch_or_fail()
    from lmcalc.bench import bandwidth, report
    from lmcalc.bench.device import detect

    dev = detect(device, hardware)
    meas = bandwidth.measure(
        dev, int(parse_bytes(size, "--size")) if size else None, repeats=_positive_int(repeats, "--repeats")
    )
    note = _save([report.bandwidth_record(meas, dev)], save, no_save)
    result = report.bandwidth_result(meas, dev)
    _emit(replace(result, notes=(*result.notes, note)), as_json, explain)


@bench_app.command("comm")
def bench_comm(
    op: Annotated[
        str, typer.Option("--op", help="all-reduce | all-gather | reduce-scatter (comma list for several).")
    ] = "all-reduce",
    sizes: Annotated[
        str, typer.Option("--sizes", help="Message sizes, binary units: 1M..1G (doubling) or 1M,16M.")
    ] = "1M..64M",
    world_size: Annotated[
        int | None,
        typer.Option("--world-size", help="Local processes to spawn (default 2; under torchrun: WORLD_SIZE)."),
    ] = None,
    backend: Annotated[str, typer.Option("--backend", help="auto | nccl | gloo.")] = "auto",
    dtype: Annotated[str, typer.Option("--dtype", help="fp32 | bf16 | fp16.")] = "fp32",
    warmup: Annotated[int, typer.Option("--warmup", help="Untimed calls per size.")] = 5,
    repeats: Annotated[int, typer.Option("--repeats", help="Timed calls per size.")] = 20,
    save: SaveOpt = None,
    no_save: NoSaveOpt = False,
    as_json: JsonOpt = False,
    explain: ExplainOpt = False,
) -> None:
    """Collectives through torch.distributed (NCCL on GPUs under torchrun, gloo on CPU): algbw and busbw."""
    _torch_or_fail()
    from lmcalc.bench import comm

    ops = [o.strip() for o in op.split(",") if o.strip()]
    measurements = comm.run_collectives(
        ops if len(ops) > 1 else op,
        comm.parse_sizes(sizes),
        world_size,
        backend,
        _non_negative_int(warmup, "--warmup"),
        _positive_int(repeats, "--repeats"),
        dtype=dtype,
    )
    if not measurements:  # a rank other than 0 under torchrun: rank 0 reports
        return
    note = _save(comm.records(measurements, measurements[0].device), save, no_save)
    result = comm.comm_result(measurements)
    _emit(replace(result, notes=(*result.notes, note)), as_json, explain)


@bench_app.command("step")
def bench_step(
    model: ModelOpt,
    seq: Annotated[str, typer.Option("--seq", help="Sequence length (binary K: 1K = 1024).")] = "256",
    micro_batch: Annotated[int, typer.Option("--micro-batch", help="Sequences per step.")] = 1,
    dtype: Annotated[
        str | None, typer.Option("--dtype", help="fp32 | bf16 (default: bf16 on GPUs, fp32 on CPUs).")
    ] = None,
    attention: AttentionOpt = "flash",
    recompute: RecomputeOpt = "none",
    warmup: Annotated[int, typer.Option("--warmup", help="Untimed steps first.")] = 2,
    repeats: Annotated[int, typer.Option("--repeats", help="Timed steps.")] = 5,
    threads: Annotated[int | None, typer.Option("--threads", help="CPU threads for torch (default: torch's).")] = None,
    device: DeviceOpt = "auto",
    hardware: HardwareOpt = None,
    save: SaveOpt = None,
    no_save: NoSaveOpt = False,
    as_json: JsonOpt = False,
    explain: ExplainOpt = False,
) -> None:
    """Real AdamW training steps of the reference model: tokens/s, MFU, and memory against the engine."""
    _torch_or_fail()
    from lmcalc.bench import step
    from lmcalc.bench.device import detect

    spec = pr.resolve_model(model).spec
    measurement = step.run_steps(
        spec,
        int(_seq(seq).value),
        _positive_int(micro_batch, "--micro-batch"),
        detect(device, hardware),
        dtype,
        _choice(attention, ("flash", "eager"), "--attention"),  # type: ignore[arg-type]
        _choice(recompute, ("none", "selective", "full"), "--recompute"),  # type: ignore[arg-type]
        _non_negative_int(warmup, "--warmup"),
        _positive_int(repeats, "--repeats"),
        threads=_positive_int(threads, "--threads") if threads is not None else None,
    )
    note = _save(step.records(measurement), save, no_save)
    result = step.step_result(measurement)
    _emit(replace(result, notes=(*result.notes, note)), as_json, explain)


def _count_int(text: str, flag: str) -> int:
    value = parse_count(text, flag)
    if not value.is_integer():
        raise LmcalcError(f"{flag} needs whole numbers, got {text!r}")
    return int(value)


def _sweep(text: str) -> tuple[str, list[str]]:
    """``seq=1k,4k`` -> ('seq', ['1k', '4k'])."""
    name, _, values = text.partition("=")
    name = name.strip().lower()
    items = [v.strip() for v in values.split(",") if v.strip()]
    if name not in est.SWEEPABLE or not items:
        raise LmcalcError(f"cannot read --sweep {text!r}; expected seq=1k,4k,16k or micro-batch=1,2,4")
    return name, items


@app.command("optimal")
def optimal(
    ctx: typer.Context,
    compute: Annotated[str | None, typer.Option("--compute", help="Training budget in FLOPs, e.g. 1e24.")] = None,
    gpus: Annotated[str | None, typer.Option("--gpus", help="Or a cluster (with --days), e.g. 1024xH100.")] = None,
    days: Annotated[float | None, typer.Option("--days", help="With --gpus: days of training.")] = None,
    mfu: Annotated[
        float | None, typer.Option("--mfu", help="With --gpus: model FLOPs utilisation (default 0.4).")
    ] = None,
    tokens_per_param: Annotated[
        float, typer.Option("--tokens-per-param", help="The rule of thumb's ratio.")
    ] = TOKENS_PER_PARAM,
    precision: PrecisionOpt = "bf16-mixed",
    price: Annotated[float | None, typer.Option("--price-per-gpu-hour", help="Price in $ per GPU-hour.")] = None,
    as_json: JsonOpt = False,
    explain: ExplainOpt = False,
) -> None:
    """Compute-optimal parameters and tokens (Hoffmann et al. 2022) for a FLOP budget or a cluster and deadline."""
    _finite(days, "--days")
    _finite(tokens_per_param, "--tokens-per-param")
    _finite(price, "--price-per-gpu-hour", allow_zero=True)
    if compute is not None and gpus is not None:
        raise LmcalcError("give either --compute or --gpus with --days, not both")
    cluster_only = _flags_given(ctx, ("mfu", "price", "precision"))
    if gpus is None and cluster_only:
        verb = "applies" if len(cluster_only) == 1 else "apply"
        raise LmcalcError(f"{', '.join(cluster_only)} {verb} to a cluster: add --gpus and --days")
    cluster = pr.parse_cluster(gpus) if gpus else None
    recipe = pr.resolve_precision(precision).spec if cluster else None
    result = est.optimal_result(
        parse_count(compute, "--compute") if compute else None,
        cluster,
        days,
        recipe,
        est.Given(mfu, "--mfu") if mfu is not None else None,
        tokens_per_param,
        price,
    )
    _emit(result, as_json, explain)


@app.command("report")
def report(
    model: ModelOpt,
    gpus: Annotated[str, typer.Option("--gpus", help="Cluster, e.g. 1024xH100 or 64x8xH100.")],
    output: Annotated[str, typer.Option("--output", "-o", help="The HTML file to write, e.g. report.html.")],
    tokens: Annotated[
        str | None,
        typer.Option("--tokens", help="Training tokens. Default: the preset's published count, else 20 per parameter."),
    ] = None,
    mfu: Annotated[
        float | None, typer.Option("--mfu", help="Model FLOPs utilisation (default 0.4, an assumption).")
    ] = None,
    seq: SeqOpt = None,
    zero: Annotated[int, typer.Option("--zero", help="ZeRO stage for the memory section.")] = 3,
    recompute: RecomputeOpt = "selective",
    global_batch: Annotated[
        str, typer.Option("--global-batch", help="Tokens per step for the layout search (binary: 4M = 4,194,304).")
    ] = "4M",
    precision: PrecisionOpt = "bf16-mixed",
    optimizer: OptimizerOpt = "adamw",
    force: Annotated[bool, typer.Option("--force", help="Replace OUTPUT if it exists.")] = False,
) -> None:
    """One self-contained HTML page: parameters, FLOPs, training time, memory and the best parallel layouts, with
    derivations and plots."""

    from lmcalc import plots
    from lmcalc.atomic import new_file, write_atomic
    from lmcalc.html_report import render_report

    target = new_file(output, force)
    resolved = pr.resolve_model(model)
    spec, cluster = resolved.spec, pr.parse_cluster(gpus)
    recipe, opt = pr.resolve_precision(precision).spec, pr.resolve_optimizer(optimizer).spec
    tokens_given = est.Given(parse_count(tokens, "--tokens"), "--tokens") if tokens else est.default_tokens(spec)
    seq_given = _seq(seq, spec)
    layout = ly.Layout(dp=cluster.count, zero=zero)
    memory_result = est.memory_result(
        spec,
        cluster,
        recipe,
        opt,
        layout,
        seq_given,
        "flash",
        _choice(recompute, ("none", "selective", "full"), "--recompute"),  # type: ignore[arg-type]
        note=resolved.note,
    )
    results = [
        (est.params_result(spec, resolved.note), ""),
        (est.flops_result(spec, tokens_given, seq_given, note=resolved.note), ""),
        (
            est.train_time_result(
                spec,
                tokens_given,
                est.Given(mfu, "--mfu") if mfu is not None else est.default_mfu(),
                recipe,
                cluster=cluster,
                seq_len=seq_given,
                note=resolved.note,
            ),
            "",
        ),
        (memory_result, _report_picture(plots.memory_svg, memory_result)),
        *_report_plan(spec, cluster, seq_given, global_batch, recipe, opt, tokens_given, resolved.note),
    ]
    write_atomic(target, render_report(f"{spec.label} on {cluster.label}", results))
    print(f"wrote {target}")


REPORT_TOP_LAYOUTS = 10


def _report_picture(draw, result: Result) -> str:
    """``draw(result)``, a picture for the report as inline SVG; without matplotlib, a line saying how to get it."""
    try:
        return draw(result)
    except LmcalcError:
        return "<p class='muted'>(install matplotlib for the picture: pip install 'lmcalc[plot]')</p>"


def _report_plan(
    spec, cluster, seq_given, global_batch: str, recipe, opt, tokens, note: str
) -> list[tuple[Result, str]]:
    """The report's layout search: the fastest layouts (all of them in the picture), then the best one derived.
    When nothing fits, the page says so and why, instead of failing."""
    from lmcalc import plots
    from lmcalc.engine import plan as pl

    try:
        ranked, derived = est.plan_results(
            spec,
            cluster,
            seq_given,
            parse_count(global_batch, "--global-batch", binary=True),
            recipe,
            opt,
            pl.Pins(),
            tokens=tokens,
            note=note,
        )
    except LmcalcError as error:
        title = f"Layouts for {spec.label} on {cluster.label}"
        return [(Result("plan", title, (), (), (str(error),)), "")]
    table = replace(ranked, sections=ranked.sections[:REPORT_TOP_LAYOUTS])
    return [(table, _report_picture(plots.plan_svg, ranked)), (derived, "")]


@app.command("params")
def params(model: ModelOpt, as_json: JsonOpt = False, explain: ExplainOpt = False) -> None:
    """The exact parameter count, tensor group by tensor group."""
    resolved = pr.resolve_model(model)
    _emit(est.params_result(resolved.spec, resolved.note), as_json, explain)


@app.command("tensor")
def tensor(
    shape: Annotated[str, typer.Argument(help="Shape, e.g. 12288x49152.")],
    dtype: Annotated[str, typer.Option("--dtype", help="fp32, bf16, fp16, fp8, int8, int4, ...")] = "fp32",
    as_json: JsonOpt = False,
    explain: ExplainOpt = False,
) -> None:
    """Bytes of one tensor: elements × bytes per element."""
    _emit(est.tensor_result(parse_shape(shape), dtype), as_json, explain)


@app.command("dtypes")
def dtypes(as_json: JsonOpt = False, explain: ExplainOpt = False) -> None:
    """Floating-point formats: bits, largest value, smallest normal, machine epsilon."""
    _emit(est.dtypes_result(), as_json, explain)


@app.command("validate")
def validate(
    model: ModelOpt,
    seq: Annotated[
        str, typer.Option("--seq", help="Sequence length for the FLOP check (the CPU check caps it at 512).")
    ] = "1024",
    micro_batch: Annotated[int, typer.Option("--micro-batch", help="Sequences per step.")] = 1,
    recompute: Annotated[
        str | None,
        typer.Option("--recompute", help="Check one recomputation mode: none | selective | full (default: all three)."),
    ] = None,
    as_json: JsonOpt = False,
    explain: ExplainOpt = False,
) -> None:
    """Check lmcalc's counts against PyTorch: parameters, FlopCounterMode, bytes saved for backward."""
    try:
        import torch  # noqa: F401
    except ImportError:
        raise LmcalcError("validate needs PyTorch: pip install 'lmcalc[bench]'") from None
    from lmcalc.validate import passed, validate_result

    resolved = pr.resolve_model(model)
    modes = (
        ("none", "selective", "full")
        if recompute is None
        else (_choice(recompute, ("none", "selective", "full"), "--recompute"),)
    )
    result = validate_result(
        resolved.spec, int(_seq(seq).value), _positive_int(micro_batch, "--micro-batch"), modes, note=resolved.note
    )
    _emit(result, as_json, explain)
    if not passed(result):
        raise typer.Exit(1)


@presets_app.command("list")
def presets_list(
    kind: Annotated[
        str | None, typer.Argument(help="models | hardware | precisions | optimizers (default: all).")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """List presets with their aliases and where each was loaded from."""
    from lmcalc.preset_views import list_presets

    kinds = pr.KINDS if kind is None else (_choice(kind, pr.KINDS, "presets list KIND"),)
    list_presets(kinds, as_json)


@presets_app.command("show")
def presets_show(
    name: Annotated[str, typer.Argument(help="A preset name or alias of any kind.")],
    as_json: JsonOpt = False,
) -> None:
    """Show every field of a preset."""
    from lmcalc.preset_views import show_preset

    show_preset(name, as_json)


@presets_app.command("schema")
def presets_schema(
    kind: Annotated[str, typer.Argument(help="models | hardware | precisions | optimizers.")] = "models",
) -> None:
    """Print the JSON Schema of a preset file, for editors that validate YAML."""
    from lmcalc.preset_views import preset_schema

    print(json.dumps(preset_schema(_choice(kind, pr.KINDS, "presets schema KIND")), indent=2))


def run_captured(argv: list[str]) -> Result:
    """Run one command as the CLI would and return its result object instead of printing it."""
    captured: list[Result] = []
    token = _CAPTURE.set(captured)
    try:
        app(args=argv, prog_name="lmcalc", standalone_mode=False)
    except typer.TyperException as exc:
        raise LmcalcError(_usage_message(exc)) from None
    finally:
        _CAPTURE.reset(token)
    if not captured:
        raise LmcalcError(f"'{' '.join(argv)}' produced no result (use a command that computes one)")
    return captured[-1]


@presets_app.command("check")
def presets_check(
    files: Annotated[
        list[str] | None, typer.Argument(help="Preset files to check (default: every preset on the path).")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Validate preset files (schema; computed vs published parameter count); exit 1 on any failure."""
    from lmcalc.preset_views import check_presets

    if not check_presets(files or [], as_json):
        raise typer.Exit(1)


def _usage_message(exc: Exception) -> str:
    """A typer usage error (unknown option, missing value, bad type) as one line."""
    return " ".join(getattr(exc, "format_message", exc.__str__)().split("\n"))


def _one_line(text: str) -> str:
    """The message on one printable line: control characters from the user's input are escaped."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the app and turn every error into one line and a non-zero exit code."""
    try:
        code = app(args=argv, prog_name="lmcalc", standalone_mode=False)
    except LmcalcError as exc:
        print(f"lmcalc: error: {_one_line(str(exc))}", file=sys.stderr)
        sys.exit(2)
    except typer.Abort:
        print("lmcalc: aborted", file=sys.stderr)
        sys.exit(130)
    except typer.TyperException as exc:  # typer's usage errors: unknown option, missing value, bad type
        print(f"lmcalc: error: {_one_line(_usage_message(exc))} (see 'lmcalc --help')", file=sys.stderr)
        sys.exit(getattr(exc, "exit_code", 2))
    except Exception as exc:  # never show a traceback to a user, unless asked
        if os.environ.get("LMCALC_DEBUG"):
            raise
        print(
            f"lmcalc: internal error: {type(exc).__name__}: {_one_line(str(exc))} "
            "(set LMCALC_DEBUG=1 for the traceback)",
            file=sys.stderr,
        )
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)
