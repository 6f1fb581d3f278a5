"""The layout search: every layout that fits, ranked by throughput (``plan``), and the best one derived term by
term."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Unpack, cast

from lmcalc.engine.choices import PEAK_SOURCES, RECOMPUTE_MODES, SCHEDULES, positive_integer
from lmcalc.engine.memory.terms import Capacity, memory_sections
from lmcalc.engine.parallel.layout import LAYOUT_CODE_KEY
from lmcalc.engine.parallel.layout_checks import check_framework_runs
from lmcalc.engine.time.terms import compute_text, speed_text, step_time_section
from lmcalc.engine.workload import Workload
from lmcalc.errors import LmcalcError, flag, setting
from lmcalc.estimates import measured
from lmcalc.estimates.inputs import (
    ClusterLike,
    Given,
    ModelLike,
    accept,
    checked,
    choice,
    count,
    method_inputs,
    model_input,
    optimizer_text,
    stored_text,
)
from lmcalc.estimates.layout_settings import PinSettings, SearchSettings, SplitSettings
from lmcalc.estimates.setting_groups import subset, with_defaults
from lmcalc.estimates.settings import PlanSettings, TrainingSettings, WorkloadSettings
from lmcalc.estimates.shown import Estimate
from lmcalc.estimates.time import run_tokens
from lmcalc.estimates.training import (
    TrainingSetup,
    pipeline_split,
    training_setup,
)
from lmcalc.result import Input, Result, Section, Term
from lmcalc.units import GB, format_quantity, group

if TYPE_CHECKING:  # the planner is imported when a plan is asked for, not at start-up
    from lmcalc.engine.search import plan as pl
    from lmcalc.specs import Cluster


# ------------------------------------------------------------------------------------------------- plan


@dataclass(frozen=True)
class PlanEstimate(Estimate):
    """Every layout that fits, fastest first (``layouts``; ``report`` ranks them all), and the best one derived
    term by term (``derivation``, what ``--explain`` shows)."""

    derivation: Result
    layouts: tuple[pl.Candidate, ...]
    evaluated: int

    @property
    def best(self) -> pl.Candidate:
        return self.layouts[0]

    def shown(self, explain: bool = False) -> Result:
        """What ``lmcalc plan`` prints: the fastest ``SHOWN_LAYOUTS`` ranked (its ``--top`` default), or with
        ``explain`` the best layout's derivation."""
        if explain:
            return self.derivation
        more = len(self.report.sections) - SHOWN_LAYOUTS
        if more <= 0:
            return self.report
        rest = f"{more:,} more ranked in .report, every layout that fits in .layouts"
        return replace(self.report, sections=self.report.sections[:SHOWN_LAYOUTS], notes=(*self.report.notes, rest))


SHOWN_LAYOUTS = 10
"""The layouts a plan's ``str()`` and ``show()`` rank: the fastest ten, as ``lmcalc plan`` without ``--top``."""


def plan(*, model: ModelLike, gpus: ClusterLike, **settings: Unpack[PlanSettings]) -> PlanEstimate:
    """Every valid layout that fits, ranked by predicted throughput (the Ultra-Scale Playbook's question; the
    report ranks the first ``top`` of them, all by default, and ``layouts`` holds every one). The
    degrees, ZeRO stage, micro-batch, recomputation, pipeline schedule and virtual stages given are pinned, the
    others searched (virtual stages past 1 imply the interleaved schedule); the micro-batch is searched up to
    ``max_micro_batch`` (default ``MAX_MICRO_BATCH``, 16). Sequence parallelism is on wherever TP > 1 unless
    ``sequence_parallel`` is False. The pipeline split settings (``SplitSettings``) are pinned as given.
    ``global_batch`` is in tokens (binary: 4M = 4,194,304). Compute is timed kernel by kernel against the
    hardware preset's measured matmul rate, or the rate ``lmcalc bench`` measured on this GPU type (``peak``
    "measured", from the default results file or ``calibration``); or, given an ``efficiency`` (or
    ``measured_efficiency``: the HFU of a step ``lmcalc bench step`` measured), as hardware FLOPs at that
    fraction of the dense peak. A fine-tune (``settings``: the method and offload, ``MethodSettings``) is planned
    for ``dataset_tokens`` × ``epochs``."""

    accept(settings, PlanSettings, "plan")
    given = with_defaults(settings, PlanSettings)
    # the search varies the micro-batch and the recomputation within the pins
    setup = training_setup(model, gpus, cast(TrainingSettings, subset(given, WorkloadSettings)), given)
    pins = search_pins(given, given)
    efficiency, measured_efficiency, calibration = (
        given["efficiency"], given["measured_efficiency"], given["calibration"]
    )  # fmt: skip
    eff = None
    if efficiency is not None:
        if measured_efficiency or calibration:
            raise LmcalcError(
                f"give {setting('efficiency')} or {setting('measured_efficiency')}/{setting('calibration')}, not both"
            )
        if not (math.isfinite(efficiency) and 0 < efficiency <= 1):
            raise LmcalcError(f"{setting('efficiency')} must be in (0, 1], got {efficiency}")
        eff = Given(efficiency, flag("efficiency"))
    matmul_measured = choice(given["peak"], PEAK_SOURCES, "peak") == "measured"
    if measured_efficiency or calibration and not matmul_measured:
        w = setup.workload
        eff = measured.measured_efficiency(calibration, setup.cluster.hardware, w.precision, w.model.name)
    if matmul_measured:
        setup = _with_measured_matmul(setup, calibration)
    global_tokens = count(given["global_batch"], "global_batch", binary=True)
    train_tokens = run_tokens(
        given["tokens"], given["dataset_tokens"], given["epochs"], setup.model, setup.workload.method
    )
    top = given["top"]
    if top is not None and not positive_integer(top):
        raise LmcalcError(f"{setting('top')} takes a positive whole number of layouts, or None for all; got {top!r}")
    return plan_estimate(setup, global_tokens, pins, eff, train_tokens, top)


def search_pins(given: Mapping[str, Any], limits: Mapping[str, Any] | None = None) -> pl.Pins:
    """What the layout search is told: the settings pinned (``PinSettings``, the pipeline split's) and, for
    ``plan``, how far it searches (``SearchSettings``); ``report`` searches as far as the defaults go."""
    from lmcalc.engine.search import plan as pl

    pinned = with_defaults(given, PinSettings)
    limit = with_defaults(limits or {}, SearchSettings)
    recompute, schedule = pinned["recompute"], pinned["schedule"]
    return pl.Pins(
        tp=pinned["tp"],
        pp=pinned["pp"],
        cp=pinned["cp"],
        ep=pinned["ep"],
        etp=pinned["etp"],
        dp=pinned["dp"],
        zero=pinned["zero"],
        micro_batch=pinned["micro_batch"],
        recompute=choice(recompute, RECOMPUTE_MODES, "recompute") if recompute else None,
        schedule=choice(schedule, SCHEDULES, "schedule") if schedule else None,
        virtual_stages=pinned["virtual_stages"],
        sequence_parallel=pinned["sequence_parallel"],
        max_micro_batch=pl.MAX_MICRO_BATCH if limit["max_micro_batch"] is None else limit["max_micro_batch"],
        max_pp=limit["max_pp"],
        max_cp=limit["max_cp"],
        tp_within_node=not limit["tp_across_nodes"],
        split=pipeline_split(cast(SplitSettings, subset(given, SplitSettings))),
        hsdp=pinned["hsdp"],
        hsdp_shard_optimizer=pinned["hsdp_shard_optimizer"],
    )


def _with_measured_matmul(setup: TrainingSetup, calibration: str | None) -> TrainingSetup:
    """The setup with its GPU's figures replaced by what ``lmcalc bench`` measured on one: the matmul rate (its
    model-shape benchmark, the FLOP-weighted rate of a model's own matmuls, where there is one; else the best
    shape), and the NCCL bus bandwidth within a node where ``lmcalc bench comm`` measured one."""
    hardware, recipe = setup.cluster.hardware, setup.workload.precision
    found = measured.measured_peak("measured", calibration, hardware, recipe)
    assert found is not None  # "measured" always reads the file, or refuses
    flops, source = found
    dtype = recipe.compute_dtype
    update: dict[str, object] = {
        "matmul_tflops": {**hardware.matmul_tflops, dtype: flops / 1e12},
        "sources": {**hardware.sources, "matmul": f"measured {dtype}: {source}"},
    }
    busbw = measured.measured_busbw(calibration, hardware)
    if busbw is not None:
        update["intra_node_busbw_gbps"] = busbw[0] / 1e9
        update["sources"] = {**update["sources"], "collectives": busbw[1]}  # type: ignore[dict-item]
    return replace(setup, cluster=replace(setup.cluster, hardware=hardware.model_copy(update=update)))


def layout_text(candidate: pl.Candidate) -> str:
    layout = candidate.layout
    return f"{layout.label}, mb={candidate.micro_batch}, GA={layout.grad_accum}, recompute {candidate.recompute}"


RECOMPUTE_CODES = {"none": "", "selective": "rc=sel", "full": "rc=full"}
PLAN_CODE_KEY = f"{LAYOUT_CODE_KEY}; mb: micro-batch; GA: micro-batches per step; rc: activation recomputation"


def layout_code(candidate: pl.Candidate) -> str:
    """``layout_text`` in a table's narrow column: ``DP64 TP4 PP16 Z1 SP v4 mb1 GA8 rc=sel`` (``PLAN_CODE_KEY``)."""
    layout = candidate.layout
    return " ".join(
        part
        for part in (
            layout.code,
            f"mb{candidate.micro_batch}",
            f"GA{layout.grad_accum}",
            RECOMPUTE_CODES[candidate.recompute],
        )
        if part
    )


def layout_fields(candidate: pl.Candidate) -> tuple[tuple[str, Any], ...]:
    """The layout of ``candidate`` field by field, as ``--json`` gives it to scripts (``layout_text`` for people)."""
    layout, split = candidate.layout, candidate.layout.split
    return (
        ("dp", layout.dp),
        ("tp", layout.tp),
        ("pp", layout.pp),
        ("cp", layout.cp),
        ("ep", layout.ep),
        ("etp", layout.expert_tp),
        ("zero", layout.zero),
        ("hsdp", layout.hsdp),
        ("hsdp_shard_optimizer", layout.hsdp_shard_optimizer),
        ("sequence_parallel", layout.sequence_parallel),
        ("schedule", split.schedule),
        ("virtual_stages", split.virtual_stages),
        ("micro_batch", candidate.micro_batch),
        ("grad_accum", layout.grad_accum),
        ("recompute", candidate.recompute),
        ("first_stage_layers", split.first_stage_layers),
        ("last_stage_layers", split.last_stage_layers),
        ("embedding_in_split", split.embedding_in_split),
        ("loss_in_split", split.loss_in_split),
    )


def plan_estimate(
    setup: TrainingSetup,
    global_batch_tokens: float,
    pins: pl.Pins,
    efficiency: Given | None,
    train_tokens: Given,
    shown: int | None = None,
) -> PlanEstimate:
    """One layout search, two views of it: the layouts that fit, ranked by throughput (the first ``shown`` of
    them in the report, all when None; ``layouts`` always holds every one), and the winner derived term by term
    (what ``--explain`` shows)."""
    base, cluster, model = setup.workload, setup.cluster, setup.model
    sequences = _sequences(global_batch_tokens, base.seq_len, train_tokens)
    found = _search(setup, sequences, pins, efficiency)
    rows = tie_rows(found.fitting, shown)
    sections = [_rank_section(rank, c, tied, cluster, train_tokens) for rank, (c, tied) in enumerate(rows, 1)]
    winner = found.fitting[0]
    inputs = _plan_inputs(setup, global_batch_tokens, sequences, train_tokens, efficiency, found)
    speed = speed_text(base.framework.speed, base.moe_a2a_overlap)
    assumptions = f"TP within a node unless allowed across; {base.framework.name}: {speed} (docs/formulas.md §8)"
    best = f"best: {layout_text(winner)}"
    ties = (TIES_NOTE,) if any(tied for _, tied in rows) else ()
    first = {t.key: t.formatted(compact=True) for t in sections[0].terms}
    headline = (
        f"{model.label} on {cluster.label}: the best of {len(found.fitting):,} layouts that fit is "
        f"{layout_code(winner)}{_offloaded(base)}",
        f"{first['tokens_per_s_per_gpu']}, MFU {first['mfu']}, {first['step_time']} a step, {first['memory']} per "
        f"GPU: {first['days']} for {format_quantity(train_tokens.value, 'tokens')}",
        *setup.assumed_line,
    )
    ranked = Result(
        "plan",
        f"Layouts for {model.label} on {cluster.label}",
        inputs,
        tuple(sections),
        (
            f"{best}; run 'lmcalc plan … --explain' for its derivation",
            *ties,
            f"layout code: {PLAN_CODE_KEY}",
            assumptions,
        ),
        layout="grid",
        headline=headline,
    )
    derived = Result(
        "plan",
        f"The best layout for {model.label} on {cluster.label}",
        inputs,
        winner_sections(winner, Capacity.of(cluster.hardware), cluster.gpus_per_node),
        (best, assumptions),
        headline=headline,
    )
    return PlanEstimate(checked(ranked), checked(derived), tuple(found.fitting), found.evaluated)


def _sequences(global_batch_tokens: float, seq: int, train_tokens: Given) -> int:
    """The global batch in sequences: at least one, and no more tokens than the run trains on."""
    sequences = round(global_batch_tokens / seq)
    if sequences < 1:
        raise LmcalcError(
            f"{setting('global_batch')} {global_batch_tokens:g} tokens is less than one sequence of {seq}"
        )
    if sequences * seq > train_tokens.value:
        raise LmcalcError(
            f"{setting('global_batch')} {group(sequences * seq)} tokens is more than the {group(train_tokens.value)} "
            f"training tokens ({train_tokens.origin}): the run would not make one step"
        )
    return sequences


def _search(setup: TrainingSetup, sequences: int, pins: pl.Pins, efficiency: Given | None) -> pl.Plan:
    """The search; when nothing fits, an error that names the closest miss and what it is mostly made of."""
    from lmcalc.engine.search import plan as pl

    cluster, model = setup.cluster, setup.model
    if pins.pp is not None:  # a pinned pipeline the framework cannot run: its own words, not "no layout can exist"
        check_framework_runs(setup.workload, pins.zero or 0, pins.pp)
    found = pl.plan(setup.workload, cluster, sequences, pins, efficiency.value if efficiency else None)
    if found.fitting:
        return found
    closest = found.closest
    if closest is None:
        raise LmcalcError(
            f"no layout of {model.name} can exist on {cluster.label} with these constraints "
            f"(global batch {sequences} sequences; check {setting('tp')}/{setting('pp')}/{setting('cp')} and the "
            "GPU count)"
        )
    m = closest.memory
    part, size = m.binding
    raise LmcalcError(
        f"nothing fits on {cluster.label} ({found.evaluated} layouts tried); closest: {layout_text(closest)} "
        f"needs {m.total / GB:,.1f} GB of {found.capacity / GB:,.1f} GB, "
        f"over by {(m.total - found.capacity) / GB:,.1f} GB, mostly {part} ({size / GB:,.1f} GB)"
    )


def _offloaded(w: Workload) -> str:
    """``, with the optimizer offloaded to the CPU``: what the best layout's memory and time assume leaves the GPU."""
    if not w.offload.optimizer:
        return ""
    return f", with the {w.offload.target.replace('+', ' and ')} offloaded to the {w.offload.device.upper()}"


TIES_NOTE = (
    "+N after a layout: N more layouts predicted at its throughput (--json lists them: details.rankN.tied); the row "
    "shows the one that holds the least memory"
)


def tie_rows(fitting: list[pl.Candidate], shown: int | None) -> list[tuple[pl.Candidate, tuple[pl.Candidate, ...]]]:
    """The ranked rows: each the fastest layout left (the search's order puts the one with the most headroom first
    among equals) with the layouts that tie it, the first ``shown`` rows (all when None)."""
    rows: list[tuple[pl.Candidate, list[pl.Candidate]]] = []
    for candidate in fitting:
        if rows and _speed(candidate) == _speed(rows[-1][0]):
            rows[-1][1].append(candidate)
        elif shown is not None and len(rows) == shown:
            break
        else:
            rows.append((candidate, []))
    return [(first, tuple(tied)) for first, tied in rows]


def _speed(candidate: pl.Candidate) -> float:
    return round(candidate.tokens_per_s, 6)  # the search's sort key: equal here is a tie there


def _rank_section(
    rank: int, c: pl.Candidate, tied: tuple[pl.Candidate, ...], cluster: Cluster, train_tokens: Given
) -> Section:
    """One ranked layout: its throughput, MFU, step time, memory and days, and its layout as fields (the search's
    figures of it: nothing is timed again), with the layouts that tie it."""
    return Section(
        f"rank{rank}",
        f"{rank}. {layout_code(c)}" + (f" +{len(tied)}" if tied else ""),
        (
            Term("tokens_per_s", "throughput", c.tokens_per_s, "tokens/s", "tokens per step / step time"),
            Term("tokens_per_s_per_gpu", "per GPU", c.tokens_per_s / cluster.count, "tokens/s/GPU"),
            Term("mfu", "MFU", 100 * c.mfu, "%", "model FLOPs / (step time · GPUs · peak)"),
            Term("step_time", "step", c.step_s, "s", "compute + exposed communication + bubble"),
            Term("memory", "memory/GPU", c.memory_total, "bytes", "most loaded GPU"),
            Term(
                "days",
                "days",
                train_tokens.value / c.tokens_per_s / 86_400,
                "days",
                "training tokens / tokens per second / 86,400",
            ),
        ),
        (*layout_fields(c), ("tied", tuple(layout_code(t) for t in tied))),
    )


def _plan_inputs(
    setup: TrainingSetup,
    global_batch_tokens: float,
    sequences: int,
    train_tokens: Given,
    efficiency: Given | None,
    found: pl.Plan,
) -> tuple[Input, ...]:
    """The plan's inputs table: what was searched for, on what, and how many layouts were tried."""
    base, cluster, seq = setup.workload, setup.cluster, setup.workload.seq_len
    return (
        model_input(setup.model, setup.resolved.note),
        Input("cluster", "GPUs", cluster.label, origin=f"{cluster.count} × {cluster.hardware.label}"),
        Input("seq_len", "Sequence length", seq, "tokens", setup.seq.origin),
        Input(
            "global_batch",
            "Global batch",
            sequences,
            "sequences",
            f"{flag('global_batch')} {group(global_batch_tokens)} tokens / {seq} per sequence",
        ),
        Input("tokens", "Training tokens", train_tokens.value, "tokens", train_tokens.origin),
        Input("precision", "Precision recipe", base.precision.name, origin=stored_text(base)),
        Input("optimizer", "Optimizer", base.optimizer.name, origin=optimizer_text(base.optimizer)),
        setup.framework_input,
        *method_inputs(base),
        (
            Input("efficiency", "Compute efficiency", efficiency.value, origin=efficiency.origin)
            if efficiency
            else Input("compute", "Compute", "kernels", origin=compute_text(base, cluster))
        ),
        Input("evaluated", "Layouts evaluated", found.evaluated, origin=f"{len(found.fitting)} fit in memory"),
    )


def winner_sections(winner: pl.Candidate, capacity: Capacity, gpus_per_node: int) -> tuple[Section, ...]:
    """The winning layout's memory and time, term by term, for ``plan --explain``."""
    memory = memory_sections(winner.workload, winner.layout, winner.memory, capacity, gpus_per_node)
    return (*memory, step_time_section(winner.time, winner.layout, offload=winner.workload.offload))
