"""torchtitan's pipeline split and schedule, read from a training config and written to one.

torchtitan/distributed/pipeline_parallel.py (torchtitan 238fa995) splits the model into p·v parts: one a rank under
a single-stage schedule (``1F1B``), two by default under a multi-stage one (``Interleaved1F1B``), rank r holding
parts r, r + p, …. Unless ``module_fqns_per_model_part`` names each part's modules, ``generate_llm_fqn_per_model_part``
deals the layers over the parts as evenly as it can, earlier parts taking one more, with the embedding and the output
weighed as ``pipeline_parallel_first_stage_less_layers`` and ``..._last_stage_less_layers`` layers (1 each by
default). That is lmcalc's split with the embedding and the loss counted as a layer (Megatron-LM's
``--account-for-embedding-in-pipeline-split`` and ``--account-for-loss-in-pipeline-split``;
``engine.parallel.pipeline.slice_sizes``).
"""

from __future__ import annotations

import contextlib
import itertools
import re
from typing import Any

from lmcalc.engine.choices import Schedule
from lmcalc.engine.parallel.pipeline import PipelineSplit, slice_sizes
from lmcalc.errors import LmcalcError
from lmcalc.launch.config import Reading, whole

SCHEDULES: dict[str, Schedule] = {"1F1B": "1f1b", "Interleaved1F1B": "interleaved"}
"""torchtitan's ``pipeline_parallel_schedule`` (torch.distributed.pipelining's classes) that lmcalc times."""
PARTS_PER_RANK = {"1f1b": 1, "interleaved": 2}
"""The parts a rank holds when the config does not name them: one under 1F1B, two under a multi-stage schedule."""
LESS = ("pipeline_parallel_first_stage_less_layers", "pipeline_parallel_last_stage_less_layers")
PARTS = "module_fqns_per_model_part"
_LAYER = re.compile(r"^layers\.(\d+)$")


def read_pipeline(value: Any, reading: Reading) -> None:
    """The schedule and the split of a config with PP above 1, as lmcalc's settings; what lmcalc cannot express,
    said. ``value(name)`` finds a key of ``[parallelism]`` (or ``[training]``) as ``(key, value)``."""
    if "pp" not in reading.taken or reading.taken["pp"].value <= 1:
        return
    pp = reading.taken["pp"].value
    key, name = value("pipeline_parallel_schedule") or ("parallelism.pipeline_parallel_schedule (default)", "1F1B")
    if str(name) not in SCHEDULES:
        reading.cannot(key, name, f"lmcalc times {' and '.join(SCHEDULES)}")
        return
    schedule = SCHEDULES[str(name)]
    per_stage = value("pipeline_parallel_layers_per_stage")
    if per_stage is not None:
        reading.cannot(per_stage[0], per_stage[1], "parts by layers per part: give --virtual-stages and the split")
        return
    parts = value(PARTS)
    if parts is not None:
        split = _split_of_parts(parts, pp, schedule, reading)
    else:
        counted = [_counted(value(less), less, reading) for less in LESS]
        if None in counted:
            return
        split = PipelineSplit(schedule, PARTS_PER_RANK[schedule], embedding_in_split=bool(counted[0]),
                              loss_in_split=bool(counted[1]))  # fmt: skip
    if split is None:
        return
    reading.take("schedule", schedule, key)
    if split.schedule == "interleaved":
        reading.take("virtual_stages", split.virtual_stages, PARTS if parts else key)
    where = PARTS if parts else "pipeline_parallel_first/last_stage_less_layers"
    for keyword, given in (("first_stage_layers", split.first_stage_layers),
                           ("last_stage_layers", split.last_stage_layers),
                           ("account_for_embedding_in_pipeline_split", split.embedding_in_split),
                           ("account_for_loss_in_pipeline_split", split.loss_in_split)):  # fmt: skip
        if given:
            reading.take(keyword, given, where)


def _counted(found: tuple[str, Any] | None, name: str, reading: Reading) -> bool | None:
    """Whether the embedding (or the output) counts as a layer: torchtitan's weight of 1 (its default), or 0."""
    if found is None:
        return True
    weight = whole(found[1], found[0], reading.source)
    if weight not in (0, 1):
        what = "the embedding" if "first" in name else "the output"
        reading.cannot(found[0], weight, f"{what} weighed as {weight} layers in the split (lmcalc: 0 or 1)")
        return None
    return weight == 1


def _split_of_parts(found: tuple[str, Any], pp: int, schedule: Schedule, reading: Reading) -> PipelineSplit | None:
    """The split that gives each named part the layers it names, among those lmcalc expresses: the first and last
    stages' layers given, or the layers dealt evenly with the embedding or the loss counted as a layer or not."""
    key, parts = found
    if not isinstance(parts, list) or not all(isinstance(p, list) for p in parts) or len(parts) % pp:
        reading.cannot(key, parts, f"a list of model parts, PP × parts per rank of them (PP {pp})")
        return None
    sizes = tuple(sum(bool(_LAYER.match(str(m))) for m in part) for part in parts)
    order = [int(match.group(1)) for part in parts for m in part if (match := _LAYER.match(str(m)))]
    v = len(parts) // pp
    if order != list(range(len(order))) or (schedule == "1f1b") != (v == 1):
        reading.cannot(key, f"{len(parts)} parts", "the layers in order, one part a rank under 1F1B, more otherwise")
        return None
    stages = [sum(sizes[g] for g in range(stage, len(parts), pp)) for stage in (0, pp - 1)]
    candidates = [PipelineSplit(schedule, v, first_stage_layers=stages[0], last_stage_layers=stages[1])
                  if min(stages) > 0 else None]  # fmt: skip
    candidates += [PipelineSplit(schedule, v, embedding_in_split=e, loss_in_split=lo)
                   for e, lo in itertools.product((False, True), repeat=2)]  # fmt: skip
    for split in candidates:
        with contextlib.suppress(LmcalcError):  # a split that cannot deal these layers over these parts
            if split is not None and slice_sizes(len(order), pp, split) == sizes:
                return split
    reading.cannot(key, f"parts of {', '.join(map(str, sizes))} layers", "a split lmcalc does not express")
    return None


def pipeline_keys(layers: int, pp: int, split: PipelineSplit) -> dict[str, object]:
    """The ``[parallelism]`` keys that give torchtitan the schedule and the split: the less-layers weights where
    torchtitan's own rule makes lmcalc's split, else every part's modules named."""
    schedule = next(name for name, ours in SCHEDULES.items() if ours == split.schedule)
    keys: dict[str, object] = {"pipeline_parallel_schedule": schedule}
    if (
        split.pipeline_layout is None
        and not split.stage_layers_given
        and split.chunks == PARTS_PER_RANK[split.schedule]
    ):
        keys[LESS[0]], keys[LESS[1]] = int(split.embedding_in_split), int(split.loss_in_split)
        return keys
    sizes, start, parts = slice_sizes(layers, pp, split), 0, []
    for g, count in enumerate(sizes):
        part = [f"layers.{i}" for i in range(start, start + count)]
        parts.append(
            (["tok_embeddings"] if g == 0 else []) + part + (["norm", "output"] if g == len(sizes) - 1 else [])
        )
        start += count
    keys[PARTS] = parts
    return keys
