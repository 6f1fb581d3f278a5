"""Megatron-Core's pipeline layout (``--pipeline-model-parallel-layout``): every model part's layers spelt out, such
as ``Et*3|(tt|)*29,m|L`` for DeepSeek-V3 (megatron/core/transformer/pipeline_parallel_layer_layout.py, core_v0.16.1).
``engine.parallel.pipeline`` takes a layout as one more way to split the layers (``PipelineSplit.pipeline_layout``):
part g is chunk g // p of stage g % p, and its decoder layers (``t``) are the slice's. The embedding (``E``) opens the
first part and the loss (``L``) closes the last, where lmcalc keeps them; the multi-token-prediction layers (``m``)
come after them, in one part: as many as are trained (``PipelineSplit.mtp_layers``, Megatron-Core's --mtp-num-layers).
"""

from __future__ import annotations

import functools
import re
from typing import TYPE_CHECKING

from lmcalc.errors import LmcalcError, setting

if TYPE_CHECKING:
    from lmcalc.specs import ModelSpec

LAYOUT_UNITS = {"E": "the embedding", "t": "a decoder layer", "m": "a multi-token-prediction layer", "L": "the loss"}
"""The letters of Megatron-Core's pipeline layout (``PipelineParallelLayerLayout.parse_str_to_list``)."""
MAX_LAYOUT_UNITS = 100_000
"""The most units a layout may spell out once its repetitions are unrolled (a model has some thousands at most)."""
_REPEATS = (re.compile(r"\(([^)]+)\)\*(\d+)"), re.compile(r"(.)\*(\d+)"))
"""Megatron-Core's two unrolling passes, in its order: ``(ab|cd)*n`` first, then ``x*n``."""


@functools.cache
def layout_parts(layout: str) -> tuple[str, ...]:
    """The model parts a Megatron-Core pipeline layout names, in order, each as its letters (``LAYOUT_UNITS``):
    commas dropped, ``(…)*n`` and then ``x*n`` unrolled, parts split at ``|``
    (megatron/core/transformer/pipeline_parallel_layer_layout.py, core_v0.16.1). Part g is chunk g // p of stage
    g % p, as lmcalc's slices are."""
    shown = _shown(layout)
    too_long = LmcalcError(f"{shown} spells out more than {MAX_LAYOUT_UNITS:,} units")
    text = layout.replace(",", "")
    if len(text) > MAX_LAYOUT_UNITS:
        raise too_long
    for pattern in _REPEATS:
        grown = [len(text)]  # the text's length as the pass unrolls it, bounded before anything is built

        def unrolled(match: re.Match[str], grown: list[int] = grown) -> str:
            times = match.group(2)
            grown[0] += len(match.group(1)) * int(times) - len(match.group(0)) if len(times) <= 6 else MAX_LAYOUT_UNITS
            if grown[0] > MAX_LAYOUT_UNITS:
                raise too_long
            return match.group(1) * int(times)

        text = pattern.sub(unrolled, text)
    unknown = sorted(set(text) - set(LAYOUT_UNITS) - {"|"})
    if unknown:
        known = ", ".join(f"{letter} ({what})" for letter, what in LAYOUT_UNITS.items())
        raise LmcalcError(f"{shown}: {unknown[0]!r} is not a layer; a layout spells {known}, parts split by | and "
                          "repeated by *n")  # fmt: skip
    return tuple(text.split("|"))


def _shown(layout: str) -> str:
    """The setting and its value, as an error quotes it (a long layout cut short)."""
    return f"{setting('pipeline_layout')} {layout[:60] + ('…' if len(layout) > 60 else '')!r}"


def check_layout(model: ModelSpec, pp: int, chunks: int, layout: str, mtp_layers: int, other: list[str]) -> None:
    """A layout names every part of the split: PP × chunks of them, the model's layers in all, the embedding
    first and the loss last, and as many multi-token-prediction layers as are trained, in one part that is a
    stage's last chunk (Megatron-Core's ``validate_layer_layout``); it replaces the other ways to split, the
    ``other`` settings given beside it."""
    if other:
        others = " and ".join(map(setting, other))
        raise LmcalcError(f"{setting('pipeline_layout')} and {others} both set the split of the layers: give one or "
                          "the other")  # fmt: skip
    parts = layout_parts(layout)
    if len(parts) % pp:
        raise LmcalcError(f"{setting('pipeline_layout')} names {len(parts)} parts, which PP={pp} does not divide")
    if len(parts) != pp * chunks:
        v = len(parts) // pp
        asked = f"{setting('schedule')} interleaved {setting('virtual_stages')} {v}" if v > 1 else "1F1B"
        raise LmcalcError(f"{setting('pipeline_layout')} names {len(parts)} parts: {v} a stage over PP={pp}; give "
                          f"{asked}")  # fmt: skip
    joined = "".join(parts)
    if joined.count("t") != model.num_layers:
        raise LmcalcError(f"{setting('pipeline_layout')} places {joined.count('t')} decoder layers (t); "
                          f"{model.name} has {model.num_layers}")  # fmt: skip
    if not parts[0].startswith("E") or joined.count("E") != 1 or not parts[-1].endswith("L") or joined.count("L") != 1:
        raise LmcalcError(f"{_shown(layout)}: the embedding (E) must open the first part "
                          "and the loss (L) close the last, once each")  # fmt: skip
    if "m" in joined and "t" in joined[joined.index("m") :]:
        raise LmcalcError(f"{_shown(layout)}: the multi-token-prediction layers (m) come "
                          "after every decoder layer")  # fmt: skip
    placed = joined.count("m")
    if placed != mtp_layers:
        raise LmcalcError(f"{_shown(layout)} places {placed} multi-token-prediction layer{'s' * (placed != 1)} (m) "
                          f"and {setting('mtp_layers')} is {mtp_layers}: Megatron-Core needs them equal")  # fmt: skip
    holding = [g for g, part in enumerate(parts) if "m" in part]
    if len(holding) > 1 or (holding and holding[0] // pp != chunks - 1):
        raise LmcalcError(f"{_shown(layout)}: Megatron-Core puts the multi-token-prediction layers (m) in one part, "
                          "a stage's last virtual stage (pipeline_parallel_layer_layout.py)")  # fmt: skip


def layout_slices(layout: str, slices: int) -> tuple[int, ...]:
    """The decoder layers of each part of ``layout``, which must name ``slices`` parts (PP × chunks)."""
    parts = layout_parts(layout)
    if len(parts) != slices:
        raise LmcalcError(f"{setting('pipeline_layout')} names {len(parts)} parts, not PP × chunks = {slices}")
    return tuple(part.count("t") for part in parts)
