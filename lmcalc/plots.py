"""Pictures of results (matplotlib, an optional extra): the memory breakdown and the ranked layouts.

Like the other renderers, these compute nothing: they read the terms of a Result. A file is written
to a temporary name and renamed into place, and an existing file is only replaced when asked (--force).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from lmcalc.atomic import atomic_target, new_file
from lmcalc.errors import LmcalcError
from lmcalc.result import Result

if TYPE_CHECKING:
    from lmcalc.estimates.plan import PlanEstimate

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


def plan_svg(found: PlanEstimate) -> str:
    """The ranked layouts' picture as inline SVG text (for the self-contained HTML report)."""
    return _inline_svg(plan_figure(found))


def _inline_svg(figure) -> str:
    import io

    plt = _pyplot()
    buffer = io.StringIO()
    with plt.rc_context({"svg.fonttype": "none"}):  # text as text, not a path per glyph: a page a fraction the size
        figure.savefig(buffer, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(figure)
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
    axes.text(axes.get_xlim()[0], capacity, f" GPU memory {capacity:.0f} GB", va="bottom", ha="left", fontsize=8)
    axes.set_ylabel("GB per GPU (10⁹ bytes)")
    axes.set_title(plain(result.title), fontsize=10)
    axes.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)  # beside the bars
    figure.tight_layout()
    return figure


def plot_plan(found: PlanEstimate, path: str, force: bool = False) -> Path:
    """The ranked layouts: memory per GPU against MFU, the winner marked."""
    target = _target(path, force)
    return _save(plan_figure(found), target)


PP_MARKERS = ("o", "s", "^", "v", "D", "P", "X", "*", "h", "<", ">", "p", "d")
"""One marker per pipeline degree (hollow ones after these, then they repeat)."""
MERGE_FRACTION = 1 / 150
"""Layouts of one (TP, PP) group closer than this share of both axes are drawn as one point (a marker is about that
wide): the picture keeps its shape while a search of tens of thousands of layouts stays a small file."""
MAX_POINTS = 3000
"""The most points the picture draws: past it the merging cells double until it fits (about 110 bytes a point in
SVG, so the picture stays under about 350 kB and the report's page under 1 MB)."""


def plan_figure(found: PlanEstimate):
    """Memory per GPU against MFU, one colour per TP degree and one marker per PP degree, the best layout starred;
    the legend beside the axes, never over a point: every layout that fits, as the search ranked them."""
    plt = _pyplot()
    from matplotlib.lines import Line2D

    points = [(c.memory_total / GB, 100 * c.mfu, {"tp": c.tp, "pp": c.pp}) for c in found.layouts]  # the figures
    tps = sorted({d["tp"] for _, _, d in points})
    pps = sorted({d["pp"] for _, _, d in points})
    fraction = MERGE_FRACTION
    kept = _merged(points, fraction)
    while sum(map(len, kept.values())) > MAX_POINTS:
        fraction *= 2
        kept = _merged(points, fraction)
    figure, axes = plt.subplots(figsize=(7.5, 4.5))
    for (tp, pp), xy in sorted(kept.items()):
        index = pps.index(pp)
        colour = COLOURS[tps.index(tp) % len(COLOURS)]
        hollow = (index // len(PP_MARKERS)) % 2 == 1
        axes.plot(  # markers on a line drawn without its line: one marker defined, each point a <use> of it
            [x for x, _ in xy],
            [y for _, y in xy],
            linestyle="",
            marker=PP_MARKERS[index % len(PP_MARKERS)],
            markersize=4,
            markerfacecolor="none" if hollow else colour,
            markeredgecolor=colour,
            markeredgewidth=0.6,
            gid=f"layouts-tp{tp}-pp{pp}",
        )
    best_memory, best_mfu, _ = points[0]
    axes.scatter([best_memory], [best_mfu], s=160, marker="*", color="black", zorder=3, gid="best")
    handles = [Line2D([], [], linestyle="", marker="o", color=COLOURS[i % len(COLOURS)], label=f"TP={tp}")
               for i, tp in enumerate(tps)]  # fmt: skip
    handles += [
        Line2D([], [], linestyle="", marker=PP_MARKERS[i % len(PP_MARKERS)], color="#555555", label=f"PP={pp}",
               fillstyle="none" if (i // len(PP_MARKERS)) % 2 else "full")
        for i, pp in enumerate(pps)
    ]  # fmt: skip
    handles.append(Line2D([], [], linestyle="", marker="*", markersize=10, color="black", label="best: rank 1"))
    drawn = sum(len(xy) for xy in kept.values())
    axes.legend(
        handles=handles,
        fontsize=7,
        loc="upper left",
        bbox_to_anchor=(1.02, 1.0),
        borderaxespad=0.0,
        ncols=1 if len(handles) <= 18 else 2,
        title=f"{len(points):,} layouts" + (f"\n({drawn:,} points drawn)" if drawn < len(points) else ""),
        title_fontsize=7,
    )
    axes.set_xlabel("memory of the most loaded GPU (GB)")
    axes.set_ylabel("predicted MFU (%)")
    axes.set_title(plain(found.report.title), fontsize=10)
    figure.tight_layout()
    return figure


def _merged(
    points: list[tuple[float, float, dict]], fraction: float
) -> dict[tuple[int, int], list[tuple[float, float]]]:
    """The points to draw, by (TP, PP): of those of one group that fall in one cell of a grid ``fraction`` of the
    axes' span wide, the first (the fastest: the layouts come ranked)."""
    xs, ys = [x for x, _, _ in points], [y for _, y, _ in points]
    width = (max(xs) - min(xs)) * fraction or 1.0
    height = (max(ys) - min(ys)) * fraction or 1.0
    seen: set[tuple[int, int, int, int]] = set()
    kept: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for x, y, details in points:
        group = (details["tp"], details["pp"])
        cell = (*group, round(x / width), round(y / height))
        if cell not in seen:
            seen.add(cell)
            kept.setdefault(group, []).append((x, y))
    return kept
