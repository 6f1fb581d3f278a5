"""``lmcalc report``: one self-contained HTML page of the estimates ``lmcalc.api.report`` makes, with their
derivations and pictures."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Annotated, Any

import typer

from lmcalc.cli.app import error_message
from lmcalc.cli.options import (
    ENERGY_OPTIONS,
    METHOD_OPTIONS,
    PIN_OPTIONS,
    SPLIT_OPTIONS,
    ModelOpt,
    OptimizerOpt,
    PrecisionOpt,
    SeqOpt,
    TrainingFrameworkOpt,
    alternatives,
    with_options,
)
from lmcalc.engine.choices import RECOMPUTE_MODES
from lmcalc.errors import LmcalcError
from lmcalc.estimates.inputs import DEFAULT_OPTIMIZER, DEFAULT_PRECISION
from lmcalc.result import Result

if TYPE_CHECKING:
    from lmcalc.estimates.plan import PlanEstimate
    from lmcalc.estimates.report import ReportEstimates

REPORT_TOP_LAYOUTS = 10


@with_options(ENERGY_OPTIONS, at="energy")
@with_options(METHOD_OPTIONS, at="method")
@with_options(SPLIT_OPTIONS, at="split")
@with_options(PIN_OPTIONS, at="pins")
def report(
    model: ModelOpt,
    gpus: Annotated[str, typer.Option("--gpus", help="Cluster, e.g. 1024xH100 or 64x8xH100.")],
    output: Annotated[str, typer.Option("--output", "-o", help="The HTML file to write, e.g. report.html.")],
    tokens: Annotated[
        str | None,
        typer.Option("--tokens", help="Training tokens. Default: the preset's published count, else 20 per parameter."),
    ] = None,
    mfu: Annotated[
        float | None,
        typer.Option(
            "--mfu",
            help="Model FLOPs utilisation for the training time. Default: the throughput the layout search predicts "
            "for its best layout (when none fits, 0.4, an assumption).",
        ),
    ] = None,
    seq: SeqOpt = None,
    pins: dict[str, Any] | None = None,
    recompute: Annotated[str | None, typer.Option("--recompute", help=f"Pin {alternatives(RECOMPUTE_MODES)}.")] = None,
    split: dict[str, Any] | None = None,
    global_batch: Annotated[
        str, typer.Option("--global-batch", help="Tokens per step for the layout search (binary: 4M = 4,194,304).")
    ] = "4M",
    precision: PrecisionOpt = DEFAULT_PRECISION,
    optimizer: OptimizerOpt = DEFAULT_OPTIMIZER,
    framework: TrainingFrameworkOpt = None,
    dataset_tokens: Annotated[
        str | None, typer.Option("--dataset-tokens", help="A fine-tune's dataset in tokens; the run is × --epochs.")
    ] = None,
    epochs: Annotated[float, typer.Option("--epochs", help="Passes over --dataset-tokens.")] = 1,
    method: dict[str, Any] | None = None,
    price: Annotated[
        float | None, typer.Option("--price-per-gpu-hour", help="Price in $ per GPU-hour, for the cost.")
    ] = None,
    energy: dict[str, Any] | None = None,
    force: Annotated[bool, typer.Option("--force", help="Replace OUTPUT if it exists.")] = False,
) -> None:
    """One self-contained HTML page: a summary, parameters, FLOPs, and the training time and memory of the fastest
    parallel layout the search finds (within the layout flags given, which pin it), with the ranked layouts,
    derivations and plots."""
    from lmcalc.atomic import new_file, write_atomic
    from lmcalc.estimates import report as estimates
    from lmcalc.html_report import render_report

    assert pins is not None and split is not None and method is not None and energy is not None  # with_options
    target = new_file(output, force)
    found = estimates.report(
        model=model,
        gpus=gpus,
        tokens=tokens,
        mfu=mfu,
        seq=seq,
        recompute=recompute,
        global_batch=global_batch,
        precision=precision,
        optimizer=optimizer,
        framework=framework,
        dataset_tokens=dataset_tokens,
        epochs=epochs,
        price_per_gpu_hour=price,
        **pins,
        **split,
        **method,
        **energy,
    )
    write_atomic(target, render_report(f"{found.params.model.label} on {found.cluster.label}", page_parts(found)))
    print(f"wrote {target}")


def page_parts(found: ReportEstimates) -> list[tuple[Result, str]]:
    """The page's results in order, each with its picture: the summary, parameters, FLOPs, time, memory, layouts."""
    from lmcalc import plots

    memory = [(found.memory.report, _picture(plots.memory_svg, found.memory.report))] if found.memory else []
    return [
        (found.summary, ""),
        (found.params.report, ""),
        (found.flops.report, ""),
        (found.train_time.report, ""),
        *memory,
        *_plan_parts(found.plan),
    ]


def _picture(draw: Callable[[Result], str], result: Result) -> str:
    """``draw(result)``, a picture for the report as inline SVG; without matplotlib, a line saying how to get it."""
    try:
        return draw(result)
    except LmcalcError:
        return "<p class='muted'>(install matplotlib for the picture: pip install 'lmcalc[plot]')</p>"


def _plan_parts(plan: PlanEstimate | LmcalcError) -> list[tuple[Result, str]]:
    """The report's layout search: the fastest layouts (all of them in the picture), then the best one derived.
    When nothing fits, the page says so and why, instead of failing."""
    from lmcalc import plots

    if isinstance(plan, LmcalcError):
        return [(Result("plan", "Layouts: none fits", (), (), (error_message(plan),)), "")]
    ranked = plan.report
    table = replace(ranked, sections=ranked.sections[:REPORT_TOP_LAYOUTS])
    return [(table, _picture(plots.plan_svg, ranked)), (plan.derivation, "")]
