"""``lmcalc bench``: measure what the hardware delivers with PyTorch; the results feed the estimates. torch is
imported when a measurement runs, never at start-up."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from lmcalc import presets as pr
from lmcalc.bench.choices import BACKENDS, COMM_DTYPES, DEVICES, MATMUL_DTYPES, OPS, STEP_DTYPES
from lmcalc.cli.app import bench_app, emit
from lmcalc.cli.options import AttentionOpt, BriefOpt, ExplainOpt, JsonOpt, ModelOpt, RecomputeOpt, alternatives
from lmcalc.engine.choices import ATTENTION_KERNELS, RECOMPUTE_MODES
from lmcalc.errors import LmcalcError
from lmcalc.estimates.inputs import (
    DEFAULT_ATTENTION,
    DEFAULT_RECOMPUTE,
    choice,
    nbytes,
    non_negative_int,
    positive_int,
    seq_given,
)
from lmcalc.result import Result
from lmcalc.units import parse_shape

if TYPE_CHECKING:
    from lmcalc.bench.device import Device
    from lmcalc.bench.matmul import MatmulSettings, ModelShapes
    from lmcalc.bench.results import Record

DeviceOpt = Annotated[str, typer.Option("--device", help=f"{alternatives(DEVICES, {'auto': 'the first available'})}.")]
HardwareOpt = Annotated[
    str | None, typer.Option("--hardware", help="Hardware preset to compare with (default: matched by name).")
]
SaveOpt = Annotated[
    str | None,
    typer.Option(
        "--save",
        help="Results file (default: ~/.local/share/lmcalc/bench.json, for GPU results; a CPU result is saved only "
        "to a file named here).",
    ),
]
NoSaveOpt = Annotated[bool, typer.Option("--no-save", help="Do not write the results.")]


def _torch_or_fail() -> None:
    try:
        import torch  # noqa: F401
    except ImportError:
        raise LmcalcError("bench needs PyTorch: pip install 'lmcalc[bench]'") from None


@dataclass(frozen=True)
class _SaveTarget:
    """Where a command's records go: ``path``, or nowhere (None) for the reason ``note`` gives."""

    path: Path | None
    note: str = ""


def _save_target(save: str | None, no_save: bool, on_cpu: bool) -> _SaveTarget:
    """The results file to save to, checked before anything is measured (it must read as a results file and be
    writable). A CPU measurement goes to the default file only when asked: it can never stand for a GPU."""
    from lmcalc.bench import results

    if no_save:
        return _SaveTarget(None, "not saved (--no-save)")
    if save is None and on_cpu:
        default = results.default_path()
        return _SaveTarget(
            None, f"not saved: a CPU result goes to the default results file only when asked (--save {default})"
        )
    path = Path(save).expanduser() if save else results.default_path()
    results.check_target(path)
    return _SaveTarget(path)


def _save(records: list[Record], target: _SaveTarget) -> str:
    from lmcalc.bench import results

    if target.path is None:
        return target.note
    return f"saved to {results.save(target.path, records)}"


ANSWERS = (("achieved", "best", "busbw", "median"), ("tokens_per_s",), ("mfu", "ratio"))
"""What a measurement's headline gives, by term key: the rate measured, the throughput, and how it compares."""


def _headline(result: Result, on_cpu: bool, asked: str) -> Result:
    """The result with its first line saying, on a CPU, that no GPU was measured: why (``asked``: the flag or the
    reason that chose the CPU, or "" when PyTorch found no GPU), then the result's own title; and its headline: the
    rate measured (for collectives, the largest message's bus bandwidth) and how it compares with the peak."""
    rows = result.sections[-1:] if result.layout == "grid" else result.sections
    terms = {term.key: term for section in reversed(rows) for term in section.terms}
    found = [next(terms[key] for key in keys if key in terms) for keys in ANSWERS if any(k in terms for k in keys)]
    answer = f"{rows[0].title}: " + ", ".join(f"{term.label.lower()} {term.text}" for term in found)
    why = f"CPU ({asked}), not a GPU" if asked else "No GPU found; CPU measured"
    return replace(result, title=f"{why}: {result.title}" if on_cpu else result.title, headline=(answer,))


MatmulDtypeOpt = Annotated[
    str | None,
    typer.Option("--dtype", help=f"{alternatives(MATMUL_DTYPES)} (default: bf16 on GPUs, fp32 on CPUs)."),
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
    brief: BriefOpt = False,
) -> None:
    """Matmul throughput (one shape, --sweep, or a model's shapes with --model) against the dense peak.

    Also registered as `lmcalc bench matmul` (below): a leaf command has no subcommand, so it runs here."""
    if ctx.invoked_subcommand is not None:
        return
    _torch_or_fail()
    from lmcalc.bench import matmul
    from lmcalc.bench.device import detect
    from lmcalc.bench.dtypes import default_dtype

    dev = detect(device, hardware)
    settings = matmul.MatmulSettings(
        (dtype or default_dtype(dev.torch_device.type)).lower(),
        non_negative_int(warmup, "warmup"),
        positive_int(repeats, "repeats"),
    )
    on_cpu = dev.torch_device.type == "cpu"
    target = _save_target(save, no_save, on_cpu)
    if model is not None:
        spec = pr.resolve_model(model).spec
        tokens = positive_int(micro_batch, "micro_batch") * int(seq_given(seq).value)
        shapes = matmul.ModelShapes(spec, tokens, positive_int(tp, "tp"))
        result, note = _bench_model_shapes(shapes, settings, dev, target, as_json)
    elif sweep:
        result, note = _bench_sweep(settings, dev, target, as_json)
    else:
        result, note = _bench_one_shape(shape, settings, dev, target)
    result = _headline(result, on_cpu, "--device cpu" if device == "cpu" else "")
    emit(replace(result, notes=(*result.notes, note)), as_json, explain, brief)


def _bench_model_shapes(
    shapes: ModelShapes, settings: MatmulSettings, dev: Device, target: _SaveTarget, hidden: bool
) -> tuple[Result, str]:
    """A model's own matmul shapes, measured under a progress bar (``hidden`` for --json): the result, and where the
    records were saved."""
    from lmcalc.bench import matmul, report

    with _progress_bar(f"{settings.dtype} matmuls on {dev.name}", hidden=hidden) as progress:
        measured = matmul.measure_model(shapes, settings, dev, progress)
    note = _save([report.model_record(measured, dev)], target)
    return report.model_result(measured, dev), note


def _bench_sweep(settings: MatmulSettings, dev: Device, target: _SaveTarget, hidden: bool) -> tuple[Result, str]:
    """A grid of shapes, measured under a progress bar: the best and the spread, and where the records were saved."""
    from lmcalc.bench import matmul, report

    with _progress_bar(f"{settings.dtype} matmuls on {dev.name}", hidden=hidden) as progress:
        measurements = matmul.measure_shapes(matmul.sweep_shapes(dev), settings, dev, progress)
    note = _save(report.matmul_records(measurements, dev), target)
    return report.matmul_result(measurements, dev, sweep=True), note


def _bench_one_shape(
    shape: str | None, settings: MatmulSettings, dev: Device, target: _SaveTarget
) -> tuple[Result, str]:
    """One MxNxK shape (``shape``, or the device's default one): the result, and where the record was saved."""
    from lmcalc.bench import matmul, report

    dims = parse_shape(shape) if shape else matmul.default_shape(dev)
    if len(dims) != 3:
        raise LmcalcError(f"--shape needs three sizes MxNxK (e.g. 4096x4096x4096), got {shape!r}")
    m, n, k = dims
    measurement = matmul.measure((m, n, k), settings, dev)
    note = _save(report.matmul_records([measurement], dev), target)
    return report.matmul_result([measurement], dev, sweep=False), note


@contextmanager
def _progress_bar(description: str, hidden: bool) -> Iterator[Callable[[int, int], object]]:
    """A transient rich progress bar, and the callback that moves it: (shapes measured, shapes in all)."""
    from rich.progress import Progress

    with Progress(transient=True, disable=hidden) as bar:
        task = bar.add_task(description, total=None)
        yield lambda done, total: bar.update(task, completed=done, total=total)


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
    brief: BriefOpt = False,
) -> None:
    """Device memory bandwidth from a large copy (bytes read + written) against the spec sheet."""
    _torch_or_fail()
    from lmcalc.bench import bandwidth, report
    from lmcalc.bench.device import detect

    dev = detect(device, hardware)
    buffer_bytes, timed = int(nbytes(size, "size")) if size else None, positive_int(repeats, "repeats")
    on_cpu = dev.torch_device.type == "cpu"
    target = _save_target(save, no_save, on_cpu)
    meas = bandwidth.measure(dev, buffer_bytes, repeats=timed)
    note = _save([report.bandwidth_record(meas, dev)], target)
    result = _headline(report.bandwidth_result(meas, dev), on_cpu, "--device cpu" if device == "cpu" else "")
    emit(replace(result, notes=(*result.notes, note)), as_json, explain, brief)


@bench_app.command("comm")
def bench_comm(
    op: Annotated[str, typer.Option("--op", help=f"{alternatives(OPS)} (comma list for several).")] = "all-reduce",
    sizes: Annotated[
        str, typer.Option("--sizes", help="Message sizes, binary units: 1M..1G (doubling) or 1M,16M.")
    ] = "1M..64M",
    world_size: Annotated[
        int | None,
        typer.Option("--world-size", help="Local processes to spawn (default 2; under torchrun: WORLD_SIZE)."),
    ] = None,
    backend: Annotated[str, typer.Option("--backend", help=f"{alternatives(BACKENDS)}.")] = "auto",
    dtype: Annotated[str, typer.Option("--dtype", help=f"{alternatives(COMM_DTYPES)}.")] = "fp32",
    warmup: Annotated[int, typer.Option("--warmup", help="Untimed calls per size.")] = 5,
    repeats: Annotated[int, typer.Option("--repeats", help="Timed calls per size.")] = 20,
    save: SaveOpt = None,
    no_save: NoSaveOpt = False,
    as_json: JsonOpt = False,
    explain: ExplainOpt = False,
    brief: BriefOpt = False,
) -> None:
    """Collectives through torch.distributed (NCCL on GPUs under torchrun, gloo on CPU): algbw and busbw."""
    _torch_or_fail()
    from lmcalc.bench import comm

    ops = [o.strip() for o in op.split(",") if o.strip()]
    settings = comm.CommSettings(
        ops if len(ops) > 1 else op,
        comm.parse_sizes(sizes),
        dtype,
        non_negative_int(warmup, "warmup"),
        positive_int(repeats, "repeats"),
    )
    import torch

    target = _save_target(save, no_save, on_cpu=backend == "gloo" or not torch.cuda.is_available())
    measurements = comm.run_collectives(settings, world_size, backend)
    if not measurements:  # a rank other than 0 under torchrun: rank 0 reports
        return
    on_cpu = measurements[0].device == "cpu"  # gloo: asked for, or fewer GPUs than ranks, or none
    if on_cpu and target.path is not None and save is None:
        target = _save_target(save, no_save, on_cpu)
    asked = "--backend gloo" if backend == "gloo" else "fewer GPUs than ranks" if torch.cuda.is_available() else ""
    note = _save(comm.records(measurements, measurements[0].device), target)
    result = _headline(comm.comm_result(measurements), on_cpu, asked)
    emit(replace(result, notes=(*result.notes, note)), as_json, explain, brief)


@bench_app.command("step")
def bench_step(
    model: ModelOpt,
    seq: Annotated[str, typer.Option("--seq", help="Sequence length (binary K: 1K = 1024).")] = "256",
    micro_batch: Annotated[int, typer.Option("--micro-batch", help="Sequences per step.")] = 1,
    dtype: Annotated[
        str | None,
        typer.Option("--dtype", help=f"{alternatives(STEP_DTYPES)} (default: bf16 on GPUs, fp32 on CPUs)."),
    ] = None,
    attention: AttentionOpt = DEFAULT_ATTENTION,
    recompute: RecomputeOpt = DEFAULT_RECOMPUTE,
    warmup: Annotated[int, typer.Option("--warmup", help="Untimed steps first.")] = 2,
    repeats: Annotated[int, typer.Option("--repeats", help="Timed steps.")] = 5,
    threads: Annotated[int | None, typer.Option("--threads", help="CPU threads for torch (default: torch's).")] = None,
    device: DeviceOpt = "auto",
    hardware: HardwareOpt = None,
    save: SaveOpt = None,
    no_save: NoSaveOpt = False,
    as_json: JsonOpt = False,
    explain: ExplainOpt = False,
    brief: BriefOpt = False,
) -> None:
    """Real AdamW training steps of the reference model: tokens/s, MFU, and memory against the engine."""
    _torch_or_fail()
    from lmcalc.bench import step
    from lmcalc.bench.device import detect

    spec = pr.resolve_model(model).spec
    seq_len, sequences = int(seq_given(seq).value), positive_int(micro_batch, "micro_batch")
    dev = detect(device, hardware)
    setup = step.StepSetup(
        spec,
        seq_len,
        sequences,
        dtype,
        choice(attention, ATTENTION_KERNELS, "attention"),
        choice(recompute, RECOMPUTE_MODES, "recompute"),
        non_negative_int(warmup, "warmup"),
        positive_int(repeats, "repeats"),
        threads=positive_int(threads, "threads") if threads is not None else None,
    )
    on_cpu = dev.torch_device.type == "cpu"
    target = _save_target(save, no_save, on_cpu)
    measurement = step.run_steps(setup, dev)
    note = _save(step.records(measurement), target)
    result = _headline(step.step_result(measurement), on_cpu, "--device cpu" if device == "cpu" else "")
    emit(replace(result, notes=(*result.notes, note)), as_json, explain, brief)
