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
    LAYOUT_OPTIONS,
    METHOD_OPTIONS,
    ModelOpt,
    OptimizerOpt,
    PrecisionOpt,
    RecomputeOpt,
    SeqOpt,
    TrainingFrameworkOpt,
    with_defaults,
    with_options,
)
from lmcalc.errors import LmcalcError
from lmcalc.estimates.inputs import DEFAULT_OPTIMIZER, DEFAULT_PRECISION
from lmcalc.estimates.report import REPORT_ZERO
from lmcalc.result import Result

if TYPE_CHECKING:
    from lmcalc.estimates.plan import PlanEstimate

REPORT_TOP_LAYOUTS = 10


@with_options(ENERGY_OPTIONS, at="energy")
@with_options(METHOD_OPTIONS, at="method")
@with_options(with_defaults(LAYOUT_OPTIONS, zero=REPORT_ZERO), at="layout")
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
    layout: dict[str, Any] | None = None,
    recompute: RecomputeOpt = "selective",
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
    energy: dict[str, Any] | None = None,
    force: Annotated[bool, typer.Option("--force", help="Replace OUTPUT if it exists.")] = False,
) -> None:
    """One self-contained HTML page: parameters, FLOPs, training time, memory (of the layout given, ZeRO-3 by
    default) and the best parallel layouts, with derivations and plots."""
    from lmcalc import plots
    from lmcalc.atomic import new_file, write_atomic
    from lmcalc.estimates import report as estimates
    from lmcalc.html_report import render_report

    assert layout is not None and method is not None and energy is not None  # filled in by with_options
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
        **layout,
        **method,
        **energy,
    )
    memory = found.memory.report
    results = [
        (found.params.report, ""),
        (found.flops.report, ""),
        (found.train_time.report, ""),
        (memory, _picture(plots.memory_svg, memory)),
        *_plan_parts(found.plan, f"Layouts for {found.params.model.label} on {found.memory.cluster.label}"),
    ]
    write_atomic(target, render_report(f"{found.params.model.label} on {found.memory.cluster.label}", results))
    print(f"wrote {target}")


def _picture(draw: Callable[[Result], str], result: Result) -> str:
    """``draw(result)``, a picture for the report as inline SVG; without matplotlib, a line saying how to get it."""
    try:
        return draw(result)
    except LmcalcError:
        return "<p class='muted'>(install matplotlib for the picture: pip install 'lmcalc[plot]')</p>"


def _plan_parts(plan: PlanEstimate | LmcalcError, title: str) -> list[tuple[Result, str]]:
    """The report's layout search: the fastest layouts (all of them in the picture), then the best one derived.
    When nothing fits, the page says so and why, instead of failing."""
    from lmcalc import plots

    if isinstance(plan, LmcalcError):
        return [(Result("plan", title, (), (), (error_message(plan),)), "")]
    ranked = plan.report
    table = replace(ranked, sections=ranked.sections[:REPORT_TOP_LAYOUTS])
    return [(table, _picture(plots.plan_svg, ranked)), (plan.derivation, "")]
