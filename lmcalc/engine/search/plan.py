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
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

from lmcalc.engine.choices import Recompute
from lmcalc.engine.memory.gpu_memory import GpuMemory, most_loaded_gpu, most_loaded_total
from lmcalc.engine.parallel.layout import Layout
from lmcalc.engine.parallel.layout_checks import check_layout
from lmcalc.engine.search import progress
from lmcalc.engine.search.space import (
    MAX_MICRO_BATCH,
    VIRTUAL_STAGES,
    Degrees,
    Pins,
    degree_layouts,
    layouts,
)
from lmcalc.engine.search.workers import run_balanced, search_workers
from lmcalc.engine.time.rates import Machine
from lmcalc.engine.time.steptime import StepTime, step_figures, step_time_on
from lmcalc.engine.workload import Workload
from lmcalc.errors import LmcalcError
from lmcalc.specs import Cluster

__all__ = ["MAX_MICRO_BATCH", "VIRTUAL_STAGES", "Candidate", "Pins", "Plan", "layouts", "plan"]


@dataclass(slots=True, unsafe_hash=True)  # slots: one per layout that fits; not frozen (the docstring)
class Candidate:
    """One layout the search evaluated, the workload it runs (its micro-batch and recomputation), and its figures:
    the most loaded GPU's total memory, the throughput, the MFU and the step time. Its memory and step time in full,
    term by term, are made when first asked for, from the engine's caches (the search keeps only the figures: a
    search in several processes sends back no more). Read-only, though not frozen: a search makes one for each
    layout that fits (344,000 for DeepSeek-V3 on 2,048 H800, and again in the parent for its workers'), and a
    frozen dataclass's ``__init__`` sets each field through ``object.__setattr__``, 1.2 µs a candidate against 0.3
    µs (docs/performance.md). Its hash is its compared fields', as a frozen one's."""

    layout: Layout
    workload: Workload
    memory_total: float  # bytes on the most loaded GPU
    tokens_per_s: float
    mfu: float  # model FLOPs / (step time · GPUs · peak), as ``StepTime.mfu``
    step_s: float  # seconds a step, ``StepTime.total``
    machine: Machine = field(repr=False, compare=False)
    efficiency: float | None = field(default=None, repr=False, compare=False)
    _memory: GpuMemory | None = field(default=None, repr=False, compare=False)
    _time: StepTime | None = field(default=None, repr=False, compare=False)

    @property
    def memory(self) -> GpuMemory:
        if self._memory is None:
            object.__setattr__(self, "_memory", most_loaded_gpu(self.workload, self.layout))
        assert self._memory is not None
        return self._memory

    @property
    def time(self) -> StepTime:
        if self._time is None:
            object.__setattr__(self, "_time", step_time_on(self.workload, self.layout, self.machine, self.efficiency))
        assert self._time is not None
        return self._time

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


@dataclass
class Plan:
    evaluated: int = 0
    fitting: list[Candidate] = field(default_factory=list)
    closest: Candidate | None = None  # the smallest overflow, when nothing fits
    capacity: float = 0.0


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
            if _pauses == 0 and _resume:  # what the searches made moves to the oldest generation unwalked: the
                gc.freeze()  # first young collection would walk all of it and free nothing (0.4 s for DeepSeek-V3)
                gc.unfreeze()
                gc.enable()


def plan(
    base: Workload,
    cluster: Cluster,
    global_batch: int,
    pins: Pins,
    efficiency: float | None = None,
    workers: int | None = None,
) -> Plan:
    """Evaluate every layout of the ``base`` workload, its micro-batch and recomputation searched within the
    pins; keep those that fit, fastest first, or the one that misses by least.

    A layout's memory does not fall as its micro-batch grows with the sequences per step fixed: under 1F1B
    stage i holds min(p − i, m) micro-batches of b sequences, min((p − i)·b, m·b) sequences' worth, and so
    on chunk by chunk under the interleaved schedule, while the transients grow with b. ``layouts`` gives a
    layout's micro-batches smallest first, so once one overflows at a recomputation mode, the larger ones of
    the same layout and mode are counted as evaluated, and not fitting, without their memory being computed
    (the closest miss, the smallest overflow, is never among them).

    ``workers``: processes to search in (``engine.search.workers``); None: as many as the machine's cores, up to
    ``workers.MAX_WORKERS``, for a search of ``workers.PARALLEL_FROM`` layouts or more, else one. The result
    is the same in any number."""
    if global_batch < 1:
        raise LmcalcError("the global batch must hold at least one sequence")
    _check_dp_pin(cluster, global_batch, pins)
    search = Search(base, cluster, global_batch, pins, efficiency)
    sizes = degree_layouts(base, cluster, global_batch, pins)  # each (TP, PP, CP) and about how many layouts it makes
    degrees, estimate = list(sizes), sum(sizes.values())
    count = workers if workers is not None else search_workers(estimate)
    if progress.current() is not None:  # reported from one thread: forked workers could not report
        count = 1
    with _collector_paused():
        if count > 1 and len(degrees) > 1:
            jobs = _jobs(sizes)
            found = run_balanced(lambda job: _search_job(search, jobs[job]), len(jobs), count, _packed,
                                 lambda packed: _unpacked(packed, search))  # fmt: skip
            by_degrees = {d: part for job in found for d, part in job}
            parts = [by_degrees[d] for d in degrees]
        else:
            parts = [_search_part(search, degrees, estimate)]
        return _merged(parts, cluster)  # the sort makes a key a candidate: with the collector still paused


@dataclass(frozen=True)
class Search:
    """What a search is asked: the workload (its micro-batch and recomputation searched), the cluster, the global
    batch in sequences, the pins, and the one-number efficiency where it replaces the kernel model."""

    base: Workload
    cluster: Cluster
    global_batch: int
    pins: Pins
    efficiency: float | None = None
    machine: Machine = field(init=False, repr=False, compare=False)  # the cluster, timed: made once

    def __post_init__(self) -> None:
        object.__setattr__(self, "machine", Machine(self.cluster))


@dataclass
class _Part:
    """What a search over some (TP, PP, CP) found: layouts evaluated, those that fit (in the search's order, then
    ``ranked``), the smallest overflow and the deepest pipeline's refusal."""

    evaluated: int = 0
    fitting: list[Candidate] = field(default_factory=list)
    closest: Candidate | None = None
    refusal: tuple[int, str] | None = None  # the deepest pipeline's: PP = 1 says only that stages need PP ≥ 2
    ranks: list[tuple[float, float]] = field(default_factory=list)  # each fitting layout's ``_rank``, once ranked

    def ranked(self) -> _Part:
        """The part with its fitting layouts in the plan's order (``_rank``; ties in the search's order) and their
        ranks beside them: sorted in the process that searched it, so that the plan merges sorted runs."""
        ranks = [_rank(c) for c in self.fitting]
        order = sorted(range(len(ranks)), key=ranks.__getitem__)  # stable: ties keep the search's order
        self.fitting, self.ranks = [self.fitting[i] for i in order], [ranks[i] for i in order]
        return self


def _rank(c: Candidate) -> tuple[float, float]:
    """Where a fitting layout stands in the plan: the fastest first (tokens/s to the sixth decimal), then the most
    headroom."""
    return -round(c.tokens_per_s, 6), c.memory_total


def _search_part(search: Search, degrees: list[Degrees], estimate: int = 0) -> _Part:
    """``plan``'s search over ``degrees``, reporting its progress against ``estimate`` layouts where a reporter is
    set (``progress``)."""
    part = _Part()
    reporter = progress.current()
    overflowed: dict[tuple[object, ...], set[Recompute]] = {}  # a layout but its micro-batch: modes that overflowed
    cluster, pins = search.cluster, search.pins
    capacity, machine, efficiency = cluster.hardware.capacity_bytes, search.machine, search.efficiency

    def candidate(layout: Layout, w: Workload, memory: float) -> Candidate:  # its figures: the rest is remade
        tokens_per_s, mfu, step = step_figures(w, layout, machine, efficiency)  # on demand, for the few shown
        return Candidate(layout, w, memory, tokens_per_s, mfu, step, machine, efficiency)

    for seen, (layout, workloads) in enumerate(layouts(search.base, cluster, search.global_batch, pins, degrees), 1):
        if reporter is not None and seen % progress.EVERY == 0:
            reporter(seen, estimate)
        try:  # pinned degrees are taken as given: the same checks as `lmcalc memory` keep them honest
            check_layout(workloads[0], layout, cluster, pins.tp_within_node)
        except LmcalcError as exc:
            if part.refusal is None or layout.pp > part.refusal[0]:
                part.refusal = (layout.pp, exc.args[0])
            continue
        family = (layout.dp, layout.tp, layout.pp, layout.cp, layout.ep, layout.etp, layout.zero, layout.split)
        overflowed_modes = overflowed.get(family, ())  # looked up once for the layout's modes
        for w in workloads:
            part.evaluated += 1
            if w.recompute in overflowed_modes:  # a smaller micro-batch of it did not fit: nor does this one
                continue
            memory = most_loaded_total(w, layout)
            if memory > capacity:
                overflowed.setdefault(family, set()).add(w.recompute)
                if part.closest is None or memory < part.closest.memory_total:
                    part.closest = candidate(layout, w, memory)
                continue
            part.fitting.append(candidate(layout, w, memory))
    return part.ranked()


def _jobs(sizes: dict[Degrees, int]) -> list[list[Degrees]]:
    """The search's jobs for several processes (``workers.run_balanced``): its (TP, PP, CP) grouped by TP and CP, whose
    layouts share the most of the engine's caches (their kernels and collectives), the groups with the most layouts
    first, so that the processes, each taking the next as it finishes, end together."""
    groups: dict[tuple[int, int], list[Degrees]] = {}
    for tp, pp, cp in sizes:
        groups.setdefault((tp, cp), []).append((tp, pp, cp))
    return sorted(groups.values(), key=lambda group: -sum(sizes[d] for d in group))


def _search_job(search: Search, degrees: list[Degrees]) -> list[tuple[Degrees, _Part]]:
    """One job of a search in several processes: each of its (TP, PP, CP) searched on its own."""
    return [(d, _search_part(search, [d])) for d in degrees]


def _packed(job: list[tuple[Degrees, _Part]]) -> list[tuple[Degrees, CompactPart]]:
    """A forked process's job as it sends it back: its parts as figures."""
    return [(d, CompactPart.of(part)) for d, part in job]


def _unpacked(packed: list[tuple[Degrees, CompactPart]], search: Search) -> list[tuple[Degrees, _Part]]:
    return [(d, part.rebuilt(search)) for d, part in packed]


def _merged(parts: list[_Part], cluster: Cluster) -> Plan:
    """The plan the parts make, in the search's order: the first of the smallest overflows, the first refusal of
    the deepest pipeline, the fitting layouts fastest first (ties: more headroom, then the search's order). Each
    part comes ranked (``_Part.ranked``), so the fitting layouts are sorted runs, which Timsort merges; a stable
    sort of sorted runs is the stable sort of them all."""
    result = Plan(capacity=cluster.hardware.capacity_bytes)
    refusal: tuple[int, str] | None = None
    fitting: list[Candidate] = []
    ranks: list[tuple[float, float]] = []
    for part in parts:
        result.evaluated += part.evaluated
        fitting += part.fitting
        ranks += part.ranks
        if part.closest and (result.closest is None or part.closest.memory_total < result.closest.memory_total):
            result.closest = part.closest
        if part.refusal and (refusal is None or part.refusal[0] > refusal[0]):
            refusal = part.refusal
    if not result.evaluated and refusal:
        raise LmcalcError(f"no layout can exist with these constraints: {refusal[1]}")
    assert len(ranks) == len(fitting)  # every part ranked
    result.fitting = [fitting[i] for i in sorted(range(len(ranks)), key=ranks.__getitem__)]
    return result


Compact = tuple[Layout, int, Recompute, float, float, float, float]  # a candidate as figures: layout, micro-batch,
# recomputation, memory total, tokens/s, MFU, step time


@dataclass(frozen=True)
class CompactPart:
    """A ``_Part`` as a worker sends it back, ranked: each candidate as its layout, workload settings and figures."""

    evaluated: int
    fitting: list[Compact]
    closest: Compact | None
    refusal: tuple[int, str] | None

    @classmethod
    def of(cls, part: _Part) -> CompactPart:
        def compact(c: Candidate) -> Compact:
            w = c.workload
            return (c.layout, w.micro_batch, w.recompute, c.memory_total, c.tokens_per_s, c.mfu, c.step_s)

        closest = compact(part.closest) if part.closest else None
        return cls(part.evaluated, [compact(c) for c in part.fitting], closest, part.refusal)

    def rebuilt(self, search: Search) -> _Part:
        """The part again, its candidates' memory and step time made when first asked for."""
        workloads: dict[tuple[int, Recompute], Workload] = {}
        machine = search.machine

        def candidate(c: Compact) -> Candidate:
            layout, mb, rc, total, tokens, mfu, step = c
            if (mb, rc) not in workloads:
                workloads[mb, rc] = replace(search.base, micro_batch=mb, recompute=rc)
            return Candidate(layout, workloads[mb, rc], total, tokens, mfu, step, machine, search.efficiency)

        closest = candidate(self.closest) if self.closest else None
        fitting = [candidate(c) for c in self.fitting]  # ranked where it was searched: the ranks made again
        return _Part(self.evaluated, fitting, closest, self.refusal, [_rank(c) for c in fitting])


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
