"""Rendering a Result: rich tables, the ``--explain`` derivation, and ``--json``. Computes nothing."""

from __future__ import annotations

import json
from typing import TextIO

from lmcalc.result import Result, Term, json_safe
from lmcalc.units import column_format


def to_json(result: Result) -> str:
    """The result as strict JSON: a figure that is not available (NaN) is ``null``."""
    return json.dumps(json_safe(result.as_json()), indent=2, ensure_ascii=False, allow_nan=False)


def _console(file: TextIO | None = None):
    from rich.console import Console

    return Console(file=file, highlight=False, soft_wrap=False, markup=False, emoji=False)


def _inputs_table(result: Result):
    from rich.table import Table

    table = Table(title="Inputs", title_justify="left", show_edge=False, pad_edge=False)
    table.add_column(result.inputs_header)
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


def grid_columns(result: Result) -> list[tuple[str, str, list[str]]]:
    """A comparison's columns, one per term: its label, its unit (named once, in the header) and each row's
    number, with a check's verdict. The terminal and the HTML report both print these."""
    columns = []
    for j, first in enumerate(result.sections[0].terms):
        terms = [section.terms[j] for section in result.sections]
        same = len({t.unit for t in terms}) == 1
        unit, number = column_format(first.unit, (t.value for t in terms)) if same else ("", None)
        cells = [
            (number(t.value) if number else t.formatted(compact=True)) + {True: " ✓", False: " ✗", None: ""}[t.ok]
            for t in terms
        ]
        columns.append((first.label, unit, cells))
    return columns


def _longest(texts) -> int:
    return max((len(word) for text in texts for word in text.split()), default=0)


def unit_of_header(label: str, unit: str) -> str:
    """The unit a column's header adds to its label: none when the label says it already (``Layers on this GPU``
    in layers, ``tokens/s/GPU``)."""
    said = label.lower().split()
    return "" if unit.lower() in (label.lower(), *said) else unit


def _header(label: str, unit: str) -> str:
    """A column's header: its label, and under it its unit."""
    unit = unit_of_header(label, unit)
    return f"{label}\n{unit}" if unit else label


def _grid_table(result: Result, transposed: bool = False, spacing: int = 1, whole: bool = True):
    """One row per section, one column per term: every header word whole, every number on one line; the rows'
    names (a layout's code) wrap when the terminal is narrow. ``transposed``: a row per term and a column per
    section, for a few sections of many terms (a sweep). ``spacing``: blanks each side of a cell. Not ``whole``:
    narrower still, every cell folds. Returns the table and the least width it needs whole."""
    from rich.table import Table

    table = Table(show_edge=False, pad_edge=False, padding=(0, spacing))
    columns = grid_columns(result)
    titles = [section.title for section in result.sections]
    if transposed:
        rows = [(label, [unit, *cells]) for label, unit, cells in columns]
        heads = [
            ("unit", [unit for _, unit, _ in columns]),
            *((t, [c[i] for *_, c in columns]) for i, t in enumerate(titles)),
        ]
    else:
        rows = [(title, [cells[i] for *_, cells in columns]) for i, title in enumerate(titles)]
        heads = [(_header(label, unit), cells) for label, unit, cells in columns]
    names = [name for name, _ in rows]
    widths = [max(len(name) if len(name) <= 24 else _longest(names) for name in names)]
    table.add_column("", min_width=widths[0] if whole else None, overflow="fold")
    for head, cells in heads:
        widths.append(max(_longest([head]), *map(len, cells)))
        table.add_column(head, justify="right", min_width=widths[-1] if whole else None, overflow="fold")
    for name, cells in rows:
        table.add_row(name, *cells)
    return table, sum(widths) + (2 * spacing + 1) * (len(widths) - 1)


def print_grid(result: Result, console) -> None:
    """A comparison as a grid; turned round (a row per term) when only that fits the terminal; else with the cells
    closer together; folded, never cut, when nothing fits."""
    for turned, spacing in ((False, 1), (True, 1), (False, 0)):
        table, width = _grid_table(result, turned, spacing)
        if width <= console.width:
            break
    else:
        table = _grid_table(result, whole=False)[0]
    console.print(table)


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


OVER_TEXT = " {:.0f} % of capacity: does not fit"
TIGHT_TEXT = " {:.0f} % of capacity: tight"
"""Past capacity only by the allocator's fragmentation (``GpuMemory.verdict``)."""


def _bar(terms: list[Term], capacity: float, cells_wide: int = BAR_WIDTH):
    """One stacked bar ``cells_wide`` characters long: each part's share of the GPU's memory, '│' at capacity,
    red past it."""
    from rich.text import Text

    scale = cells_wide / capacity
    bar = Text()
    used = 0.0
    for term, style in zip(terms, BAR_STYLES, strict=False):
        start, used = used, used + term.value * scale
        cells = min(round(used), cells_wide) - min(round(start), cells_wide)  # the bar stops at capacity
        bar.append("█" * cells, style=style)
    if sum(term.value for term in terms) <= capacity:  # the bytes decide, not the rounded cells
        bar.append("·" * (cells_wide - min(round(used), cells_wide)), style="dim")
        bar.append("│", style="bold")
    else:
        fragmentation = sum(t.value for t in terms if t.key.endswith("fragmentation"))
        tight = used - fragmentation * scale <= cells_wide
        bar.append((TIGHT_TEXT if tight else OVER_TEXT).format(100 * used / cells_wide), style="bold red")
    return bar


def _legend(terms: list[Term], width: int) -> list:
    """The parts' colours and names, as lines of at most ``width`` characters, each part whole on one line."""
    from rich.text import Text

    lines = [Text()]
    for term, style in zip(terms, BAR_STYLES, strict=False):
        item = f"{term.label}  "
        if lines[-1].plain and len(lines[-1].plain) + 2 + len(item.rstrip()) > width:
            lines.append(Text())
        lines[-1].append("█ ", style=style)
        lines[-1].append(item)
    return lines


def print_bars(result: Result, console) -> None:
    """The memory picture: parts stacked against the capacity line, one bar per row of a sweep."""
    from rich.text import Text

    rows = result.stack_rows()
    width = max(len(label) for label, _, _ in rows)
    console.print()
    for label, terms, capacity in rows:
        cells_wide = max(20, min(BAR_WIDTH, console.width - width - 1 - len(OVER_TEXT.format(1000))))
        console.print(Text.assemble(f"{label:<{width}} ", _bar(terms, capacity, cells_wide)))
    for line in _legend(rows[0][1], console.width):
        console.print(line)


def print_table(result: Result, file: TextIO | None = None) -> None:
    console = _console(file)
    console.print(result.title, style="bold")
    for line in result.headline:
        console.print(line, style="bold")
    if result.inputs:
        console.print(_inputs_table(result))
        console.print()
    if result.layout == "grid":
        print_grid(result, console)
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
    for line in result.headline:
        console.print(line, style="bold")
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


def print_brief(result: Result, file: TextIO | None = None) -> None:
    """The answer alone: the headline's lines (the title when a result has none)."""
    for line in result.headline or (result.title,):
        print(line, file=file)


def render(
    result: Result, *, as_json: bool = False, explain: bool = False, brief: bool = False, file: TextIO | None = None
) -> None:
    if brief:
        print_brief(result, file)
    elif as_json:
        print(to_json(result), file=file)
    elif explain:
        print_explain(result, file)
    else:
        print_table(result, file)
