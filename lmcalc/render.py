"""Rendering a Result: rich tables, the ``--explain`` derivation, and ``--json``. Computes nothing."""

from __future__ import annotations

import json
from typing import TextIO

from lmcalc.result import Result, Term, json_safe


def to_json(result: Result) -> str:
    """The result as strict JSON: a figure that is not available (NaN) is ``null``."""
    return json.dumps(json_safe(result.as_json()), indent=2, ensure_ascii=False, allow_nan=False)


def _console(file: TextIO | None = None):
    from rich.console import Console

    return Console(file=file, highlight=False, soft_wrap=False, markup=False, emoji=False)


def _inputs_table(result: Result):
    from rich.table import Table

    table = Table(title="Inputs", title_justify="left", show_edge=False, pad_edge=False)
    table.add_column("Input")
    table.add_column("Value", justify="right")
    table.add_column("From", style="dim")
    for item in result.inputs:
        table.add_row(item.label, item.text, item.origin)
    return table


def _section_table(title: str, terms: tuple[Term, ...]):
    from rich.table import Table

    table = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
    table.add_column("Figure")
    table.add_column("Value", justify="right", style="bold")
    table.add_column("Formula", style="dim")
    for term in terms:
        table.add_row(term.label, term.text, term.formula)
    return table


def _grid_table(result: Result):
    from rich.table import Table

    first = result.sections[0].terms
    table = Table(show_edge=False, pad_edge=False)
    table.add_column("")
    for term in first:
        table.add_column(term.label, justify="right")
    for section in result.sections:
        table.add_row(section.title, *(t.formatted(compact=True) for t in section.terms))
    return table


BAR_WIDTH = 60
BAR_STYLES = (
    "blue",
    "cyan",
    "magenta",
    "yellow",
    "green",
    "white",
    "bright_black",
    "bright_blue",
    "bright_cyan",
    "bright_magenta",
    "bright_yellow",
    "bright_green",
)
"""One style for each part a memory bar can stack (``estimates.memory.MEMORY_STACK``), so none is left out."""


def _bar(terms: list[Term], capacity: float):
    """One stacked bar: each part's share of the GPU's memory, '│' at capacity, red past it."""
    from rich.text import Text

    scale = BAR_WIDTH / capacity
    bar = Text()
    used = 0.0
    for term, style in zip(terms, BAR_STYLES, strict=False):
        start, used = used, used + term.value * scale
        cells = min(round(used), BAR_WIDTH) - min(round(start), BAR_WIDTH)  # the bar stops at capacity
        bar.append("█" * cells, style=style)
    if sum(term.value for term in terms) <= capacity:  # the bytes decide, not the rounded cells
        bar.append("·" * (BAR_WIDTH - min(round(used), BAR_WIDTH)), style="dim")
        bar.append("│", style="bold")
    else:
        bar.append(f" {100 * used / BAR_WIDTH:.0f} % of capacity: does not fit", style="bold red")
    return bar


def _legend(terms: list[Term]):
    from rich.text import Text

    legend = Text()
    for term, style in zip(terms, BAR_STYLES, strict=False):
        legend.append("█ ", style=style)
        legend.append(f"{term.label}  ")
    return legend


def print_bars(result: Result, console) -> None:
    """The memory picture: parts stacked against the capacity line, one bar per row of a sweep."""
    from rich.text import Text

    rows = result.stack_rows()
    width = max(len(label) for label, _, _ in rows)
    console.print()
    for label, terms, capacity in rows:
        console.print(Text.assemble(f"{label:<{width}} ", _bar(terms, capacity)))
    console.print(_legend(rows[0][1]))


def print_table(result: Result, file: TextIO | None = None) -> None:
    console = _console(file)
    console.print(result.title, style="bold")
    if result.inputs:
        console.print(_inputs_table(result))
        console.print()
    if result.layout == "grid":
        console.print(_grid_table(result))
    else:
        for section in result.sections:
            console.print(_section_table(section.title, section.terms))
            console.print()
    if result.stack:
        print_bars(result, console)
    for note in result.notes:
        console.print(f"• {note}", style="italic")


def term_lines(term: Term) -> list[tuple[str, str]]:
    """A term's derivation, line by line with a style: formula, numbers substituted, value, source, note.
    ``--explain`` and the HTML report both print these."""
    lines = [(f"= {term.formula}", "")] if term.formula else []
    if term.substituted and term.substituted not in (term.formula, term.text):
        lines.append((f"= {term.substituted}", ""))
    lines.append((f"= {term.text}", "bold"))
    lines += [(f"{name}: {text}", "dim") for name, text in (("source", term.source), ("note", term.note)) if text]
    return lines


def print_explain(result: Result, file: TextIO | None = None) -> None:
    """Every figure as a derivation: formula, numbers substituted, result, and the source of constants."""
    console = _console(file)
    from rich.text import Text

    console.print(f"{result.title} — derivation", style="bold")
    console.print()
    if result.inputs:
        console.print("Inputs", style="bold")
    for item in result.inputs:
        console.print(
            Text.assemble(f"  {item.label} = {item.text}", (f"   ({item.origin})" if item.origin else "", "dim"))
        )
    step = 0
    for section in result.sections:
        console.print()
        console.print(section.title, style="bold")
        for term in section.terms:
            step += 1
            console.print(f"  {step}. {term.label}")
            for text, style in term_lines(term):
                console.print(Text.assemble("       ", (text, style)))
    if result.notes:
        console.print()
        for note in result.notes:
            console.print(f"• {note}", style="italic")


def render(result: Result, *, as_json: bool = False, explain: bool = False, file: TextIO | None = None) -> None:
    if as_json:
        print(to_json(result), file=file)
    elif explain:
        print_explain(result, file)
    else:
        print_table(result, file)
