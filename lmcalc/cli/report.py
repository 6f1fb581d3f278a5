"""``lmcalc report``: one self-contained HTML page of the estimates ``lmcalc.api.report`` makes, with their
derivations and pictures."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Annotated, Any

import typer

from lmcalc.cli.app import error_message
from lmcalc.cli.help import OUTPUT_PANEL
from lmcalc.cli.launch import with_launch
from lmcalc.cli.options import (
    BATCH_OPTIONS,
    ENERGY_OPTIONS,
    METHOD_OPTIONS,
    PIN_OPTIONS,
    RUN_OPTIONS,
    SPLIT_OPTIONS,
    WORKLOAD_OPTIONS,
    MfuOpt,
    ModelOpt,
    with_options,
)
from lmcalc.errors import LmcalcError
from lmcalc.result import Result

if TYPE_CHECKING:
    from lmcalc.estimates.plan import PlanEstimate
    from lmcalc.estimates.report import ReportEstimates

REPORT_TOP_LAYOUTS = 10


@with_launch
@with_options(ENERGY_OPTIONS, at="energy")
@with_options(METHOD_OPTIONS, at="method")
@with_options(SPLIT_OPTIONS, at="split")
@with_options(PIN_OPTIONS, at="pins")
@with_options(RUN_OPTIONS, at="run")
@with_options(BATCH_OPTIONS, at="batch")
@with_options(WORKLOAD_OPTIONS, at="workload")
def report(
    model: ModelOpt,
    gpus: Annotated[str, typer.Option("--gpus", help="Cluster, e.g. 1024xH100 or 64x8xH100.")],
    output: Annotated[
        str,
        typer.Option("--output", "-o", help="The HTML file to write, e.g. report.html.", rich_help_panel=OUTPUT_PANEL),
    ],
    mfu: MfuOpt = None,
    workload: dict[str, Any] | None = None,
    batch: dict[str, Any] | None = None,
    run: dict[str, Any] | None = None,
    pins: dict[str, Any] | None = None,
    split: dict[str, Any] | None = None,
    method: dict[str, Any] | None = None,
    energy: dict[str, Any] | None = None,
    force: Annotated[
        bool, typer.Option("--force", help="Replace OUTPUT if it exists.", rich_help_panel=OUTPUT_PANEL)
    ] = False,
) -> None:
    """One self-contained HTML page: a summary, parameters, FLOPs, and the training time and memory of the fastest
    parallel layout the search finds (within the layout flags given, which pin it), with the ranked layouts,
    derivations and plots."""
    from lmcalc.atomic import new_file, write_atomic
    from lmcalc.cli.launch import added_notes
    from lmcalc.estimates import report as estimates
    from lmcalc.html_report import render_report

    groups = (workload, batch, run, pins, split, method, energy)
    settings = {name: value for group in groups if group is not None for name, value in group.items()}
    target = new_file(output, force)
    found = estimates.report(model=model, gpus=gpus, mfu=mfu, **settings)
    if added_notes():  # --from: on the page's summary, what was read from the launch config and what was not
        found = replace(found, summary=replace(found.summary, notes=(*found.summary.notes, *added_notes())))
    write_atomic(target, render_report(f"{found.params.model.label} on {found.cluster.label}", page_parts(found)))
    print("\n".join(found.summary.headline))
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


def _picture(draw: Callable[[Any], str], result: Result | PlanEstimate) -> str:
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
    ranked, derived = plan.report, plan.derivation
    table = replace(ranked, sections=ranked.sections[:REPORT_TOP_LAYOUTS])
    step = replace(derived, sections=tuple(s for s in derived.sections if s.key == "time"))  # its memory is above
    return [(table, _picture(plots.plan_svg, plan)), (step, "")]
