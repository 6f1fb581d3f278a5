"""One self-contained HTML page of results: the tables, every derivation, and the pictures.

No network: styles are inline, the picture is inline SVG, and nothing is fetched from a CDN. Like the
other renderers it computes nothing: it lays out the terms of the Results it is given.
"""

from __future__ import annotations

from datetime import UTC, datetime
from html import escape

from lmcalc import __version__
from lmcalc.render import grid_columns, term_lines, unit_of_header
from lmcalc.result import Input, Result, Section

STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2rem auto; padding: 0 1rem; max-width: 70rem; color: #222;
  overflow-wrap: break-word; }
h1 { font-size: 1.6rem; } h2 { font-size: 1.25rem; margin-top: 2.2rem; border-bottom: 1px solid #ccc; }
h3 { font-size: 1rem; margin: 1.2rem 0 0.4rem; }
table { border-collapse: collapse; margin: 0.4rem 0 1rem; }
th, td { padding: 0.2rem 0.7rem; border-bottom: 1px solid #eee; text-align: left; vertical-align: top; }
td.value { text-align: right; font-weight: 600; white-space: nowrap; }
td.formula, .muted { color: #666; } ul.notes { color: #444; font-style: italic; }
table.grid td.value, table.grid th { padding: 0.2rem 0.45rem; } table.grid th { text-align: right; }
td.code { font-family: ui-monospace, monospace; font-size: 12.5px; min-width: 12rem; }
details { margin: 0.3rem 0 1rem; } summary { cursor: pointer; color: #245; }
.derivation { font-family: ui-monospace, monospace; font-size: 12.5px; white-space: pre-wrap; }
figure { margin: 1rem 0; } figure svg { max-width: 100%; height: auto; }
"""


def _section_table(section: Section) -> str:
    rows = "".join(
        f"<tr><td>{escape(t.label)}</td><td class='value'>{escape(t.text)}</td>"
        f"<td class='formula'>{escape(t.formula)}</td></tr>"
        for t in section.terms
    )
    return (
        f"<h3>{escape(section.title)}</h3><table><tr><th>Figure</th><th>Value</th><th>Formula</th></tr>{rows}</table>"
    )


def _grid_table(result: Result) -> str:
    """A comparison (e.g. ranked layouts): one row per section, one column per term, each column's unit named once,
    in its header (``render.grid_columns``, as the terminal prints it), so that 800 px hold the ranked layouts."""
    columns = grid_columns(result)
    heads = [(label, unit_of_header(label, unit)) for label, unit, _ in columns]
    head = "".join(f"<th>{escape(f'{label} ({unit})' if unit else label)}</th>" for label, unit in heads)
    rows = "".join(
        f"<tr><td class='code'>{escape(section.title)}</td>"
        + "".join(f"<td class='value'>{escape(cells[i])}</td>" for _, _, cells in columns)
        + "</tr>"
        for i, section in enumerate(result.sections)
    )
    return f"<table class='grid'><tr><th></th>{head}</tr>{rows}</table>"


def _derivation(result: Result) -> str:
    lines = []
    for section in result.sections:
        lines.append(section.title)
        for term in section.terms:
            lines.append(f"  {term.label}")
            lines += [f"      {text}" for text, _ in term_lines(term)]
    return (
        f"<details><summary>Derivation</summary><div class='derivation'>{escape(chr(10).join(lines))}</div></details>"
    )


def _input_text(given: Input) -> str:
    """An input as the page prints it: a bare fraction (an MFU the search predicts) to four figures, not seventeen."""
    if isinstance(given.value, float) and not given.unit:
        return f"{given.value:.4g}"
    return given.text


def _result_html(result: Result, picture: str) -> str:
    inputs = "".join(
        f"<tr><td>{escape(i.label)}</td><td class='value'>{escape(_input_text(i))}</td>"
        f"<td class='muted'>{escape(i.origin)}</td></tr>"
        for i in result.inputs
    )
    parts = [f"<h2>{escape(result.title)}</h2>"]
    if inputs:
        header = escape(result.inputs_header)
        parts.append(f"<table><tr><th>{header}</th><th>Value</th><th>From</th></tr>{inputs}</table>")
    if result.layout == "grid" and result.sections:
        parts.append(_grid_table(result))
    else:
        parts += [_section_table(section) for section in result.sections]
    if picture:
        parts.append(f"<figure>{picture}</figure>")
    if result.notes:
        parts.append("<ul class='notes'>" + "".join(f"<li>{escape(n)}</li>" for n in result.notes) + "</ul>")
    if result.sections:
        parts.append(_derivation(result))
    return "\n".join(parts)


def render_report(title: str, results: list[tuple[Result, str]]) -> str:
    """The page: each result with its optional inline picture (SVG text)."""
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    body = "\n".join(_result_html(result, picture) for result, picture in results)
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>{escape(title)}</title><style>{STYLE}</style></head><body>"
        f"<h1>{escape(title)}</h1><p class='muted'>lmcalc {__version__}, {stamp}. Every figure below carries its "
        "formula; open “Derivation” for the numbers substituted and the sources.</p>"
        f"{body}</body></html>\n"
    )
