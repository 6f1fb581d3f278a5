"""What the layout search tries: the pins a user fixes, the values of each degree, and the layouts they make.

TP in powers of two that split the heads (within a node unless told otherwise), PP that divides the GPUs, CP in powers
of two that divide the sequence, EP that tiles the experts' grid (with ETP = TP, or folded at ETP = 1), every ZeRO
stage, recomputation mode, micro-batch and pipeline split the framework can run. ``engine.search.plan`` evaluates
them.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, replace

from lmcalc.engine.choices import (
    RECOMPUTE_MODES,
    SCHEDULES,
    ZERO_STAGES,
    Recompute,
    Schedule,
    ZeroStage,
    one_of,
    positive_integer,
)
from lmcalc.engine.parallel.layout import Layout, checked_layout
from lmcalc.engine.parallel.layout_checks import check_tp_heads, framework_runs
from lmcalc.engine.parallel.pipeline import PipelineSplit, stage_layer_counts
from lmcalc.engine.parallel.pipeline_layout import layout_parts
from lmcalc.engine.workload import Workload
from lmcalc.errors import LmcalcError, setting
from lmcalc.specs import Cluster, ModelSpec

MAX_MICRO_BATCH = 16
"""The largest micro-batch the search tries unless told otherwise: every size up to it that divides the
sequences each data-parallel replica takes per step (published runs use 3, 6, 10, 12 as well as powers of
two). In the step-time model a larger micro-batch amortises per-kernel, host and collective-latency costs and
fills GEMMs better, but lengthens the pipeline bubble, and its activations grow: past 16 sequences it seldom
wins, and it costs search time."""
VIRTUAL_STAGES = (2, 3, 4)


@dataclass(frozen=True)
class Pins:
    """Constraints the user fixed; None leaves a dimension to the search. The pipeline split's layer settings
    (uneven stages, the embedding or the loss counted) are pinned as they are given; the schedule and the
    virtual stages are searched unless pinned (virtual stages past 1 imply the interleaved schedule). Sequence
    parallelism is on wherever TP > 1 unless pinned off (Megatron-LM turns it off at TP = 1 itself)."""

    tp: int | None = None
    pp: int | None = None
    cp: int | None = None
    ep: int | None = None
    etp: int | None = None
    dp: int | None = None
    zero: ZeroStage | None = None
    micro_batch: int | None = None
    recompute: Recompute | None = None
    schedule: Schedule | None = None
    virtual_stages: int | None = None
    sequence_parallel: bool = True
    max_micro_batch: int = MAX_MICRO_BATCH
    max_tp: int | None = None
    max_pp: int = 64
    max_cp: int = 16
    tp_within_node: bool = True
    split: PipelineSplit = PipelineSplit()
    hsdp: int = 1  # HSDP's replica groups, as given: the search does not try others
    hsdp_shard_optimizer: bool = False  # HFSDP, as given

    def __post_init__(self) -> None:
        for name in (
            "tp", "pp", "cp", "ep", "etp", "dp", "micro_batch", "virtual_stages", "max_micro_batch", "max_tp", "max_pp",
            "max_cp", "hsdp",
        ):  # fmt: skip
            value = getattr(self, name)
            if value is not None and not positive_integer(value):
                raise LmcalcError(f"{setting(name)} must be a positive integer, got {value}")
        if self.zero is not None and self.zero not in ZERO_STAGES:
            raise LmcalcError(f"{setting('zero')} must be {one_of(ZERO_STAGES)}, got {self.zero}")
        if self.recompute is not None and self.recompute not in RECOMPUTE_MODES:
            raise LmcalcError(
                f"{setting('recompute')} must be one of {', '.join(RECOMPUTE_MODES)}; got {self.recompute!r}"
            )
        if self.schedule is not None and self.schedule not in SCHEDULES:
            raise LmcalcError(f"{setting('schedule')} must be one of {', '.join(SCHEDULES)}; got {self.schedule!r}")
        if not isinstance(self.sequence_parallel, bool):
            raise LmcalcError(f"{setting('sequence_parallel')} must be true or false, got {self.sequence_parallel!r}")
        if self.schedule == "1f1b" and self.virtual_stages not in (None, 1):
            raise LmcalcError(f"{setting('virtual_stages')} applies to {setting('schedule')} interleaved only")
        if self.schedule == "interleaved" and self.virtual_stages == 1:
            raise LmcalcError(f"the interleaved schedule needs {setting('virtual_stages')} 2 or more (1 is plain 1F1B)")
        if self.schedules == ("interleaved",) and self.pp == 1:
            raise LmcalcError(f"the interleaved schedule needs pipeline stages: {setting('pp')} 2 or more")

    @property
    def schedules(self) -> tuple[Schedule, ...]:
        """The schedules to try: the pinned one; interleaved where virtual stages past 1 are pinned, 1F1B where 1
        is; else both."""
        if self.schedule is not None:
            return (self.schedule,)
        if self.virtual_stages is not None:
            return ("interleaved",) if self.virtual_stages > 1 else ("1f1b",)
        return SCHEDULES


def _divisors(n: int, limit: int | None = None) -> list[int]:
    """The divisors of ``n``, up to ``limit`` where one is given."""
    return [d for d in range(1, min(n, limit or n) + 1) if n % d == 0]


def _powers_of_two(limit: int) -> list[int]:
    return [2**i for i in range(limit.bit_length()) if 2**i <= limit]


def _splits_heads(model: ModelSpec, tp: int) -> bool:
    """Whether TP can split the model's attention heads (``layout_checks.check_tp_heads``)."""
    try:
        check_tp_heads(model, tp)
    except LmcalcError:
        return False
    return True


@dataclass(frozen=True)
class _SearchSpace:
    """The values each dimension of the layout search takes within the pins, the cluster and the model."""

    tps: list[int]
    pps: list[int]
    cps: list[int]
    zeros: list[ZeroStage]
    recomputes: list[Recompute]
    splits_1f1b: dict[int, list[PipelineSplit]]  # by PP
    interleaved: dict[int, list[PipelineSplit]]  # by PP, for the micro-batches that fill its chunks


@functools.lru_cache(maxsize=16)
def _search_space(base: Workload, cluster: Cluster, pins: Pins) -> _SearchSpace:
    """TP in powers of two that split the heads (within a node unless told otherwise), PP that divides the GPUs,
    CP in powers of two that divide the sequence (fused attention only), every ZeRO stage and recomputation mode,
    and the pipeline splits of each schedule; a pinned dimension takes its pin alone. Made once for a search (its
    parts each ask): the engine's caches are keyed by the splits, and equal splits made anew compare field by field
    where the same ones compare by identity."""
    model = base.model
    gpus, per_node = cluster.count, cluster.gpus_per_node
    max_tp = pins.max_tp or (per_node if pins.tp_within_node else gpus)
    tps = [pins.tp] if pins.tp else [t for t in _powers_of_two(max_tp) if _splits_heads(model, t)]
    pps = [pins.pp] if pins.pp else [p for p in range(1, min(pins.max_pp, model.num_layers) + 1) if gpus % p == 0]
    if (base.method.kind == "freeze" or model.shared_block) and not pins.pp:
        pps = [1]  # frozen layers and shared blocks are modelled on one stage (check_layout)
    cps = (
        [pins.cp]
        if pins.cp
        else [c for c in _powers_of_two(pins.max_cp) if base.seq_len % c == 0 and (c == 1 or base.attention == "flash")]
    )
    zeros = [pins.zero] if pins.zero is not None else list(ZERO_STAGES)
    recomputes = [pins.recompute] if pins.recompute else list(RECOMPUTE_MODES)
    if base.moe_a2a_overlap and not pins.recompute:  # Megatron-Core runs the overlap without full recomputation
        recomputes.remove("full")
    units = model.num_layers + pins.split.units  # what the chunks share
    pinned_interleaved = pins.schedules == ("interleaved",)
    splits_1f1b = {pp: _stage_splits(base, pp, pins) if "1f1b" in pins.schedules else [] for pp in pps}
    virtual = (pins.virtual_stages,) if pins.virtual_stages else VIRTUAL_STAGES
    interleaved = {  # a pinned schedule is tried where it cannot be, so that check_layout says why nothing can
        pp: [
            replace(pins.split, schedule="interleaved", virtual_stages=v)
            for v in virtual
            if pinned_interleaved or units >= pp * v
        ]
        if "interleaved" in pins.schedules
        else []
        for pp in pps
    }
    if pins.split.pipeline_layout is not None:  # the layout names every part: PP a divisor of its parts, v the rest
        parts = len(layout_parts(pins.split.pipeline_layout))
        pps = [pp for pp in pps if parts % pp == 0]
        splits_1f1b = {pp: [replace(pins.split, schedule="1f1b", virtual_stages=1)] if parts == pp else []
                       for pp in pps}  # fmt: skip
        interleaved = {pp: [replace(pins.split, schedule="interleaved", virtual_stages=parts // pp)]
                       if parts > pp > 1 else [] for pp in pps}  # fmt: skip
    return _SearchSpace(tps, pps, cps, zeros, recomputes, splits_1f1b, interleaved)


def _micro_batches(per_replica: int, pins: Pins) -> list[int]:
    """The micro-batches to try: the pinned one where it divides the sequences a replica takes per step, else
    each size up to ``pins.max_micro_batch`` that does."""
    if pins.micro_batch:
        return [pins.micro_batch] if per_replica % pins.micro_batch == 0 else []
    return _divisors(per_replica, pins.max_micro_batch)


Degrees = tuple[int, int, int]  # TP, PP, CP: a DP follows from them


def model_degrees(base: Workload, cluster: Cluster, global_batch: int, pins: Pins) -> list[Degrees]:
    """The (TP, PP, CP) the search tries, in its order: those that divide the GPUs into a DP that divides the
    global batch (and is the pinned one, where DP is pinned)."""
    space, gpus = _search_space(base, cluster, pins), cluster.count
    degrees = []
    for tp, pp, cp in itertools.product(space.tps, space.pps, space.cps):
        if gpus % (tp * pp * cp):
            continue
        dp = gpus // (tp * pp * cp)
        if (pins.dp and dp != pins.dp) or global_batch % dp:
            continue
        degrees.append((tp, pp, cp))
    return degrees


def layouts(
    base: Workload, cluster: Cluster, global_batch: int, pins: Pins, degrees: list[Degrees] | None = None
) -> Iterator[tuple[Layout, tuple[Workload, ...]]]:
    """Every layout to try for the workload within the pins, the cluster and the global batch (in sequences),
    each with the workloads it runs: its micro-batch at each recomputation mode the pins allow. (Whether a
    layout can exist does not depend on recomputation: ``check_layout`` asks once per layout.) The micro-batch
    is each size up to ``pins.max_micro_batch`` that divides the sequences one replica takes per step. ``degrees``:
    only these (TP, PP, CP), in this order (default: ``model_degrees``)."""
    space = _search_space(base, cluster, pins)
    gpus = cluster.count
    workloads: dict[int, tuple[Workload, ...]] = {}  # by micro-batch, made once: layouts share them
    pinned_interleaved, hsdp, hfsdp = pins.schedules == ("interleaved",), pins.hsdp, pins.hsdp_shard_optimizer
    experts = base.model.moe.num_experts if base.model.moe else 1
    for tp, pp, cp in model_degrees(base, cluster, global_batch, pins) if degrees is None else degrees:
        dp = gpus // (tp * pp * cp)
        per_replica = global_batch // dp  # sequences one replica takes per step
        micro = _micro_batches(per_replica, pins)
        grids = [
            (etp, ep) for etp in _expert_tps(base, tp, pins) for ep in _expert_degrees(experts, dp * cp * tp, etp, pins)
        ]
        sequence_parallel = pins.sequence_parallel and tp > 1
        for (etp, ep), zero, mb in itertools.product(grids, space.zeros, micro):
            expert_tp = None if etp == tp else etp  # as Layout spells the default
            if pins.zero is None and not framework_runs(base, zero, pp):
                continue  # a layout its framework cannot launch (a pinned stage is tried, for check_layout to say why)
            accum = per_replica // mb
            splits = space.splits_1f1b[pp]
            if pp > 1 and (pinned_interleaved or accum % pp == 0):  # uneven stages must split over v chunks
                splits = splits + space.interleaved[pp]
            if mb not in workloads:
                workloads[mb] = _micro_batch_workloads(base, mb, tuple(space.recomputes))
            for split in splits:  # degrees checked as the space was made: set without Layout's checks again
                yield (
                    checked_layout((dp, tp, pp, cp, ep, zero, sequence_parallel, accum, expert_tp, split, hsdp, hfsdp)),
                    workloads[mb],
                )


@functools.lru_cache(maxsize=256)
def _micro_batch_workloads(base: Workload, micro_batch: int, recomputes: tuple[Recompute, ...]) -> tuple[Workload, ...]:
    """The workloads of a layout at ``micro_batch``, one for each recomputation mode: made once for a search, its
    parts each asking, so that the engine's caches find them by identity (equal workloads made anew compare field
    by field)."""
    return tuple(replace(base, micro_batch=micro_batch, recompute=rc) for rc in recomputes)


def _expert_tps(base: Workload, tp: int, pins: Pins) -> list[int]:
    """The experts' TP to try beside attention's TP: the pinned one; else TP (Megatron-Core's default) and, for an
    MoE model under TP > 1 with sequence parallelism, 1: whole experts, EP folded over TP (MoE parallel folding)."""
    if pins.etp:
        return [pins.etp]
    fold = base.model.moe is not None and tp > 1 and pins.sequence_parallel
    return [tp, 1] if fold else [tp]


def _expert_degrees(experts: int, gpus: int, etp: int, pins: Pins) -> list[int]:
    """EP to try: the pinned degree; else each divisor of the experts that tiles the stage's TP·CP·DP ``gpus``
    with ETP (``check_expert_grid``)."""
    if pins.ep:
        return [pins.ep]
    return [e for e in _divisors(experts, limit=gpus // etp) if gpus % (etp * e) == 0]  # EP·ETP tiles the GPUs


LIGHTER_LAST_STAGE = (1, 2)  # layers taken off the last stage, which also computes the logits


def _stage_splits(base: Workload, pp: int, pins: Pins) -> list[PipelineSplit]:
    """1F1B splits to try: the pinned one; else the even split, and the last stage one or two layers lighter,
    the remedy for a large vocabulary's logits (Megatron-LM's --decoder-last-pipeline-num-layers)."""
    pinned = replace(pins.split, schedule="1f1b", virtual_stages=1)
    if pins.split.stage_layers_given or pins.split.units or pp == 1:  # the pins or the counted units set it
        return [pinned]
    even_last = stage_layer_counts(base.model, Layout(pp=pp))[-1]
    return [pinned] + [
        replace(pinned, last_stage_layers=even_last - k) for k in LIGHTER_LAST_STAGE if even_last - k >= 1
    ]


def layout_estimate(base: Workload, cluster: Cluster, global_batch: int, pins: Pins) -> int:
    """About how many layouts ``layouts`` gives, without making them: what decides whether to search in several
    processes."""
    return sum(degree_layouts(base, cluster, global_batch, pins).values())


def degree_layouts(base: Workload, cluster: Cluster, global_batch: int, pins: Pins) -> dict[Degrees, int]:
    """About how many layouts ``layouts`` gives for each (TP, PP, CP) of ``model_degrees``, in its order, without
    making them."""
    space, gpus = _search_space(base, cluster, pins), cluster.count
    experts = base.model.moe.num_experts if base.model.moe else 1
    counts = {}
    for tp, pp, cp in model_degrees(base, cluster, global_batch, pins):
        dp = gpus // (tp * pp * cp)
        grids = sum(len(_expert_degrees(experts, dp * cp * tp, etp, pins)) for etp in _expert_tps(base, tp, pins))
        splits = len(space.splits_1f1b[pp]) + len(space.interleaved[pp])
        counts[tp, pp, cp] = grids * len(space.zeros) * len(_micro_batches(global_batch // dp, pins)) * splits
    return counts
