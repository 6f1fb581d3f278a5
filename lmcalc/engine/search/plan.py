"""The layout search behind ``lmcalc plan``: every valid split, those that fit, ranked by throughput.

It follows the Ultra-Scale Playbook's recipe. First make one replica fit: TP within a node, then PP
over layers, CP for long sequences, EP for experts (within DP·CP with the experts split by TP, or folded over
TP·CP·DP with whole experts: Megatron-Core's MoE parallel folding), ZeRO and recomputation to trade memory. Then reach
the global batch with data parallelism and gradient accumulation. Among what fits, the fastest wins.
The search only asks the memory model (``engine.memory.gpu_memory``) and the time model (``engine.time.steptime``);
it holds no formula of its own.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

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
from lmcalc.engine.memory.gpu_memory import GpuMemory, most_loaded_gpu
from lmcalc.engine.parallel.layout import Layout, check_layout, check_tp_heads, framework_runs
from lmcalc.engine.parallel.pipeline import PipelineSplit, stage_layer_counts
from lmcalc.engine.time.rates import Machine
from lmcalc.engine.time.steptime import StepTime, step_time_on
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

    def __post_init__(self) -> None:
        for name in (
            "tp", "pp", "cp", "ep", "etp", "dp", "micro_batch", "virtual_stages", "max_micro_batch", "max_tp", "max_pp",
            "max_cp",
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


@dataclass(frozen=True, slots=True)  # slots: one per layout that fits
class Candidate:
    """One layout the search evaluated, the workload it runs (its micro-batch and recomputation), its most
    loaded GPU's memory and its step time."""

    layout: Layout
    workload: Workload
    memory: GpuMemory
    time: StepTime

    @property
    def recompute(self) -> Recompute:
        return self.workload.recompute

    @property
    def micro_batch(self) -> int:
        return self.workload.micro_batch

    @property
    def dp(self) -> int:
        return self.layout.dp

    @property
    def tp(self) -> int:
        return self.layout.tp

    @property
    def pp(self) -> int:
        return self.layout.pp

    @property
    def cp(self) -> int:
        return self.layout.cp

    @property
    def ep(self) -> int:
        return self.layout.ep

    @property
    def zero(self) -> int:
        return self.layout.zero

    @property
    def tokens_per_s(self) -> float:
        return self.time.tokens_per_s

    @property
    def mfu(self) -> float:
        return self.time.mfu


@dataclass
class Plan:
    evaluated: int = 0
    fitting: list[Candidate] = field(default_factory=list)
    closest: Candidate | None = None  # the smallest overflow, when nothing fits
    capacity: float = 0.0


def _divisors(n: int, limit: int | None = None) -> list[int]:
    """The divisors of ``n``, up to ``limit`` where one is given."""
    return [d for d in range(1, min(n, limit or n) + 1) if n % d == 0]


def _powers_of_two(limit: int) -> list[int]:
    return [2**i for i in range(limit.bit_length()) if 2**i <= limit]


def _splits_heads(model: ModelSpec, tp: int) -> bool:
    """Whether TP can split the model's attention heads (``layout.check_tp_heads``)."""
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


def _search_space(base: Workload, cluster: Cluster, pins: Pins) -> _SearchSpace:
    """TP in powers of two that split the heads (within a node unless told otherwise), PP that divides the GPUs,
    CP in powers of two that divide the sequence (fused attention only), every ZeRO stage and recomputation mode,
    and the pipeline splits of each schedule; a pinned dimension takes its pin alone."""
    model = base.model
    gpus, per_node = cluster.count, cluster.gpus_per_node
    max_tp = pins.max_tp or (per_node if pins.tp_within_node else gpus)
    tps = [pins.tp] if pins.tp else [t for t in _powers_of_two(max_tp) if _splits_heads(model, t)]
    pps = [pins.pp] if pins.pp else [p for p in range(1, min(pins.max_pp, model.num_layers) + 1) if gpus % p == 0]
    if base.method.kind == "freeze" and not pins.pp:
        pps = [1]  # frozen layers are modelled on one stage (check_layout)
    cps = (
        [pins.cp]
        if pins.cp
        else [c for c in _powers_of_two(pins.max_cp) if base.seq_len % c == 0 and (c == 1 or base.attention == "flash")]
    )
    zeros = [pins.zero] if pins.zero is not None else list(ZERO_STAGES)
    recomputes = [pins.recompute] if pins.recompute else list(RECOMPUTE_MODES)
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
    return _SearchSpace(tps, pps, cps, zeros, recomputes, splits_1f1b, interleaved)


def _micro_batches(per_replica: int, pins: Pins) -> list[int]:
    """The micro-batches to try: the pinned one where it divides the sequences a replica takes per step, else
    each size up to ``pins.max_micro_batch`` that does."""
    if pins.micro_batch:
        return [pins.micro_batch] if per_replica % pins.micro_batch == 0 else []
    return _divisors(per_replica, pins.max_micro_batch)


def layouts(
    base: Workload, cluster: Cluster, global_batch: int, pins: Pins
) -> Iterator[tuple[Layout, tuple[Workload, ...]]]:
    """Every layout to try for the workload within the pins, the cluster and the global batch (in sequences),
    each with the workloads it runs: its micro-batch at each recomputation mode the pins allow. (Whether a
    layout can exist does not depend on recomputation: ``check_layout`` asks once per layout.) The micro-batch
    is each size up to ``pins.max_micro_batch`` that divides the sequences one replica takes per step."""
    space = _search_space(base, cluster, pins)
    gpus = cluster.count
    workloads: dict[int, tuple[Workload, ...]] = {}  # by micro-batch, made once: layouts share them
    pinned_interleaved = pins.schedules == ("interleaved",)
    experts = base.model.moe.num_experts if base.model.moe else 1
    for tp, pp, cp in itertools.product(space.tps, space.pps, space.cps):
        if gpus % (tp * pp * cp):
            continue
        dp = gpus // (tp * pp * cp)
        if (pins.dp and dp != pins.dp) or global_batch % dp:
            continue
        per_replica = global_batch // dp  # sequences one replica takes per step
        micro = _micro_batches(per_replica, pins)
        grids = [
            (etp, ep) for etp in _expert_tps(base, tp, pins) for ep in _expert_degrees(experts, dp * cp * tp, etp, pins)
        ]
        for (etp, ep), zero, mb in itertools.product(grids, space.zeros, micro):
            if pins.zero is None and not framework_runs(base, zero, pp):
                continue  # a layout its framework cannot launch (a pinned stage is tried, for check_layout to say why)
            accum = per_replica // mb
            splits = space.splits_1f1b[pp]
            if pp > 1 and (pinned_interleaved or accum % pp == 0):  # uneven stages must split over v chunks
                splits = splits + space.interleaved[pp]
            if mb not in workloads:
                workloads[mb] = tuple(replace(base, micro_batch=mb, recompute=rc) for rc in space.recomputes)
            for split in splits:
                layout = Layout(
                    dp=dp,
                    tp=tp,
                    pp=pp,
                    cp=cp,
                    ep=ep,
                    etp=etp,
                    zero=zero,
                    sequence_parallel=pins.sequence_parallel and tp > 1,
                    grad_accum=accum,
                    split=split,
                )
                yield layout, workloads[mb]


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
    return [e for e in _divisors(experts) if gpus % (etp * e) == 0]


_PAUSE_LOCK = threading.Lock()
_pauses = 0  # searches running with the collector paused
_resume = False  # whether the collector was on when the first of them began


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause Python's cycle collector while a search runs, and resume it as it was once the last running search
    ends. A search makes hundreds of thousands of small objects and no reference cycle; each time the heap grows
    by a quarter the collector walks them all and frees nothing (2.3 s of the DeepSeek-V3 search of
    benchmarks/plan_search.py). Counted, so that searches on several threads (``lmcalc serve``) leave it on."""
    global _pauses, _resume
    with _PAUSE_LOCK:
        if _pauses == 0:
            _resume = gc.isenabled()
            gc.disable()
        _pauses += 1
    try:
        yield
    finally:
        with _PAUSE_LOCK:
            _pauses -= 1
            if _pauses == 0 and _resume:
                gc.enable()


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


def plan(
    base: Workload,
    cluster: Cluster,
    global_batch: int,
    pins: Pins,
    efficiency: float | None = None,
) -> Plan:
    """Evaluate every layout of the ``base`` workload, its micro-batch and recomputation searched within the
    pins; keep those that fit, fastest first, or the one that misses by least.

    A layout's memory does not fall as its micro-batch grows with the sequences per step fixed: under 1F1B
    stage i holds min(p − i, m) micro-batches of b sequences, min((p − i)·b, m·b) sequences' worth, and so
    on chunk by chunk under the interleaved schedule, while the transients grow with b. ``layouts`` gives a
    layout's micro-batches smallest first, so once one overflows at a recomputation mode, the larger ones of
    the same layout and mode are counted as evaluated, and not fitting, without their memory being computed
    (the closest miss, the smallest overflow, is never among them)."""
    if global_batch < 1:
        raise LmcalcError("the global batch must hold at least one sequence")
    _check_dp_pin(cluster, global_batch, pins)
    with _collector_paused():
        return _search(base, cluster, global_batch, pins, efficiency)


def _search(base: Workload, cluster: Cluster, global_batch: int, pins: Pins, efficiency: float | None) -> Plan:
    """``plan``'s search."""
    result = Plan(capacity=cluster.hardware.memory_bytes)
    machine = Machine(cluster)
    refusal: tuple[int, str] | None = None  # the deepest pipeline's: PP = 1 says only that stages need PP ≥ 2
    overflowed: set[tuple[object, ...]] = set()  # (a layout but its micro-batches, recomputation) that overflowed
    for layout, workloads in layouts(base, cluster, global_batch, pins):
        try:  # pinned degrees are taken as given: the same checks as `lmcalc memory` keep them honest
            check_layout(workloads[0], layout, cluster, pins.tp_within_node)
        except LmcalcError as exc:
            if refusal is None or layout.pp > refusal[0]:
                refusal = (layout.pp, exc.args[0])
            continue
        family = (layout.dp, layout.tp, layout.pp, layout.cp, layout.ep, layout.etp, layout.zero, layout.split)
        for w in workloads:
            result.evaluated += 1
            if (family, w.recompute) in overflowed:  # a smaller micro-batch of it did not fit: nor does this one
                continue
            memory = most_loaded_gpu(w, layout)
            if memory.total > result.capacity:
                overflowed.add((family, w.recompute))
                if result.closest is None or memory.total < result.closest.memory.total:
                    result.closest = Candidate(layout, w, memory, step_time_on(w, layout, machine, efficiency))
                continue
            result.fitting.append(Candidate(layout, w, memory, step_time_on(w, layout, machine, efficiency)))
    if not result.evaluated and refusal:
        raise LmcalcError(f"no layout can exist with these constraints: {refusal[1]}")
    result.fitting.sort(key=lambda c: (-round(c.time.tokens_per_s, 6), c.memory.total))  # ties: more headroom
    return result


def _check_dp_pin(cluster: Cluster, global_batch: int, pins: Pins) -> None:
    """Refuse a pinned DP that no layout can have: one that does not divide the GPUs or the global batch, or does
    not make the GPUs with the other degrees when they are all pinned too."""
    dp = pins.dp
    if dp is None:
        return
    if cluster.count % dp:
        raise LmcalcError(f"DP={dp} does not divide the {cluster.count} GPUs of {cluster.label}")
    if global_batch % dp:
        raise LmcalcError(f"DP={dp} does not divide the global batch of {global_batch} sequences")
    if pins.tp and pins.pp and pins.cp and dp * pins.tp * pins.pp * pins.cp != cluster.count:
        raise LmcalcError(
            f"DP·TP·PP·CP = {dp}·{pins.tp}·{pins.pp}·{pins.cp} = {dp * pins.tp * pins.pp * pins.cp} "
            f"does not equal the {cluster.count} GPUs of {cluster.label}"
        )
