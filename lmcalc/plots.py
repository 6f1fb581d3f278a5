"""Pictures of results (matplotlib, an optional extra): the memory breakdown and the ranked layouts.

Like the other renderers, these compute nothing: they read the terms of a Result. A file is written
to a temporary name and renamed into place, and an existing file is only replaced when asked (--force).
"""

from __future__ import annotations

from pathlib import Path

from lmcalc.atomic import atomic_target, new_file
from lmcalc.errors import LmcalcError
from lmcalc.result import Result

GB = 1e9
COLOURS = (
    "#4C72B0",
    "#55A868",
    "#C44E52",
    "#8172B2",
    "#CCB974",
    "#64B5CD",
    "#8C8C8C",
    "#DD8452",
    "#937860",
    "#DA8BC3",
    "#2F4F4F",
    "#B8860B",
)


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only, no display needed
        import matplotlib.pyplot as plt
    except ImportError:
        raise LmcalcError("--plot needs matplotlib: pip install 'lmcalc[plot]'") from None
    return plt


def plain(text: str) -> str:
    """``text`` as matplotlib should print it: a ``$`` (in a model's name, say) escaped, or two of them would open
    mathtext, which draws the text between them as a formula or fails on it."""
    return text.replace("$", r"\$")


def _target(path: str, force: bool) -> Path:
    if Path(path).suffix.lower() not in (".png", ".svg", ".pdf"):
        raise LmcalcError(f"--plot {path!r}: the file name must end in .png, .svg or .pdf")
    return new_file(path, force)


def _save(figure, target: Path) -> Path:
    """Write ``figure`` to ``target`` through a temporary file beside it, and close it."""
    try:
        with atomic_target(target, suffix=target.suffix) as temporary:
            figure.savefig(
                temporary, bbox_inches="tight", dpi=150, metadata={"Date": None} if target.suffix != ".png" else None
            )
    finally:
        _pyplot().close(figure)
    return target


def plot_memory(result: Result, path: str, force: bool = False) -> Path:
    """Stacked bars of the memory parts against the GPU's capacity: one bar, or one per sweep value."""
    target = _target(path, force)  # refuse an existing file before drawing anything
    return _save(memory_figure(result), target)


def memory_svg(result: Result) -> str:
    """The memory picture as inline SVG text (for the self-contained HTML report)."""
    return _inline_svg(memory_figure(result))


def plan_svg(result: Result) -> str:
    """The ranked layouts' picture as inline SVG text (for the self-contained HTML report)."""
    return _inline_svg(plan_figure(result))


def _inline_svg(figure) -> str:
    import io

    buffer = io.StringIO()
    figure.savefig(buffer, format="svg", bbox_inches="tight", metadata={"Date": None})
    _pyplot().close(figure)
    svg = buffer.getvalue()
    return svg[svg.index("<svg") :]  # inline: no XML prolog, no DOCTYPE


def memory_figure(result: Result):
    if not result.stack:
        raise LmcalcError("--plot draws memory results only")
    plt = _pyplot()
    rows = result.stack_rows("this step")
    figure, axes = plt.subplots(figsize=(max(4.0, 1.2 * len(rows) + 3), 4.5))
    bottoms = [0.0] * len(rows)
    for index, label in enumerate(term.label for term in rows[0][1]):
        heights = [terms[index].value / GB for _, terms, _ in rows]
        colour = COLOURS[index % len(COLOURS)]
        axes.bar([plain(name) for name, _, _ in rows], heights, bottom=bottoms, label=plain(label), color=colour)
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    capacity = rows[0][2] / GB
    axes.axhline(capacity, color="black", linestyle="--", linewidth=1)
    axes.text(len(rows) - 0.5, capacity, f" GPU memory {capacity:.0f} GB", va="bottom", ha="right", fontsize=8)
    axes.set_ylabel("GB per GPU (10⁹ bytes)")
    axes.set_title(plain(result.title), fontsize=10)
    axes.legend(fontsize=7, loc="upper left")
    figure.tight_layout()
    return figure


def plot_plan(result: Result, path: str, force: bool = False) -> Path:
    """The ranked layouts: memory per GPU against MFU, the winner marked."""
    target = _target(path, force)
    return _save(plan_figure(result), target)


def plan_figure(result: Result):
    ranked = [s for s in result.sections if s.key.startswith("rank")]
    if not ranked:
        raise LmcalcError("--plot draws plan results only")
    plt = _pyplot()
    memory = [s.term("memory").value / GB for s in ranked]
    mfu = [s.term("mfu").value for s in ranked]
    figure, axes = plt.subplots(figsize=(6, 4.5))
    axes.scatter(memory, mfu, s=12, color=COLOURS[0], alpha=0.6, label="layouts that fit")
    axes.scatter(memory[:1], mfu[:1], s=60, color=COLOURS[2], label=plain(ranked[0].title[:60]))
    axes.set_xlabel("memory of the most loaded GPU (GB)")
    axes.set_ylabel("predicted MFU (%)")
    axes.set_title(plain(result.title), fontsize=10)
    axes.legend(fontsize=7, loc="lower right")
    figure.tight_layout()
    return figure
