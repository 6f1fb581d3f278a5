"""Answers side by side: the same question asked of a few clusters (``--gpus A --vs B``), one row each, their own
figures in the same columns. Nothing is computed here: each row's terms are the answer's own, so the table says what
the command says for each cluster alone."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lmcalc import result
from lmcalc.errors import LmcalcError
from lmcalc.estimates.shown import Estimate
from lmcalc.result import Input, Result, Section

COLUMNS = {
    "train-time": (
        "deadline.gpus",
        "time.peak_per_gpu",
        "time.tokens_per_s_per_gpu",
        "time.days",
        "time.gpu_hours",
        "time.cost",
        "energy.facility_energy",
    ),
    "memory": ("total.states", "total.activations", "total.total", "total.capacity", "total.headroom"),
    "plan": ("rank1.tokens_per_s_per_gpu", "rank1.mfu", "rank1.step_time", "rank1.memory", "rank1.days"),
}
"""The figures a comparison shows of each command's answer, in this order (those every answer has)."""


@dataclass(frozen=True)
class Comparison(Estimate):
    """The answers for each cluster, in the order asked (``answers``), and the table of them side by side."""

    answers: tuple[result.Estimate, ...]


def side_by_side(*, labels: Sequence[str], answers: Sequence[result.Estimate]) -> Comparison:
    """One table of ``answers`` (the same command's, one per cluster, named by ``labels``): a row each, the columns
    ``COLUMNS`` gives for the command, each cell the answer's own term; the headline is each answer's first line."""
    reports = [answer.report for answer in answers]
    command = reports[0].command
    if command not in COLUMNS:
        raise LmcalcError(f"answers are put side by side for {', '.join(COLUMNS)}; {command} has no such table")
    keys = [key for key in COLUMNS[command] if all(_has(report, key) for report in reports)]
    sections = tuple(
        Section(f"option{n}", _row_title(label, report), tuple(report.term(key) for key in keys), (("gpus", label),))
        for n, (label, report) in enumerate(zip(labels, reports, strict=True), 1)
    )
    first = reports[0]
    inputs = tuple(i for i in first.inputs if all(i in report.inputs for report in reports))  # what all share
    shown = Result(
        command,
        f"{first.title.split(' on ')[0]} on {' vs '.join(labels)}",  # a plan's title names its own cluster
        (Input("clusters", "GPUs compared", " vs ".join(labels), origin="--gpus, then each --vs"), *inputs),
        sections,
        ("each row is the command's answer for that cluster alone; the other inputs are the same for all",),
        layout="grid",
        headline=tuple(report.headline[0] if report.headline else report.title for report in reports),
    )
    return Comparison(shown, tuple(answers))


def _has(report: Result, key: str) -> bool:
    try:
        report.term(key)
    except KeyError:
        return False
    return True


def _row_title(label: str, report: Result) -> str:
    """The row's name: the cluster, and for a plan its best layout's code."""
    if report.command == "plan":
        best = next(s for s in report.sections if s.key == "rank1")
        return f"{label}: {best.title.removeprefix('1. ')}"
    return label
