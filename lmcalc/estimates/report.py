"""The estimates one report page holds, told as one story: the layout search finds the layout, and the page's
memory and training time are that layout's, at the throughput the search predicts for it."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Unpack, cast

from lmcalc.errors import LmcalcError, flag
from lmcalc.estimates.inputs import (
    ClusterLike,
    Given,
    ModelLike,
    count,
    mfu_given,
)
from lmcalc.estimates.layout_settings import SplitSettings
from lmcalc.estimates.setting_groups import subset, with_defaults
from lmcalc.estimates.settings import ReportSettings, TrainingSettings, WorkloadSettings
from lmcalc.result import Input, Result, Section
from lmcalc.units import GB, group

if TYPE_CHECKING:  # the estimates are imported when a report is made: the command line's start-up stays light
    from lmcalc.engine.search import plan as pl
    from lmcalc.estimates.counts import FlopsEstimate, ParamsEstimate
    from lmcalc.estimates.memory import MemoryEstimate
    from lmcalc.estimates.plan import PlanEstimate
    from lmcalc.estimates.time import Timing, TrainTimeEstimate
    from lmcalc.estimates.training import TrainingSetup
    from lmcalc.presets import Resolved
    from lmcalc.specs import Cluster
from lmcalc.recipe_specs import PrecisionRecipe

PINS = ("tp", "pp", "cp", "ep", "dp", "zero", "schedule", "virtual_stages", "micro_batch")
"""The layout settings a report pins its search with when they are given (and ``sequence_parallel`` when off)."""


@dataclass(frozen=True)
class ReportEstimates:
    """What a report holds. ``layout`` is the layout the page is about: the search's fastest that fits (within
    the pins given), else its closest miss, else None (no layout can exist). ``memory`` is that layout's memory,
    ``train_time`` its training time at the throughput the search predicts (at ``--mfu`` when given; when
    nothing fits, a hypothetical time at the MFU assumed), ``plan`` the search or its refusal, and ``summary``
    the answer in a few figures."""

    params: ParamsEstimate
    flops: FlopsEstimate
    train_time: TrainTimeEstimate
    memory: MemoryEstimate | None
    plan: PlanEstimate | LmcalcError
    layout: pl.Candidate | None
    summary: Result
    cluster: Cluster

    @property
    def fits(self) -> bool:
        """Whether a layout fits the cluster's memory (the search found one)."""
        return not isinstance(self.plan, LmcalcError)

    def __repr__(self) -> str:  # the estimates' own reprs run to millions of characters (a plan's every layout)
        return f"<ReportEstimates: {'; '.join(self.summary.headline) or self.summary.title}>"


def report(*, model: ModelLike, gpus: ClusterLike, **settings: Unpack[ReportSettings]) -> ReportEstimates:
    """Parameters, FLOPs, the layout search (``plan``), and the memory and training time of the layout it finds
    fastest. The degrees, ZeRO stage, schedule, virtual stages, sequence parallelism, recomputation and pipeline
    split given are pinned in the search, the others searched, as ``plan`` does. The training time runs at the
    throughput the search predicts for that layout, unless ``mfu`` is given; when no layout fits, the page shows
    the closest one's memory and a hypothetical time at the MFU assumed. A fine-tune (the method's ``settings``)
    of ``dataset_tokens`` × ``epochs``; the cost at ``price_per_gpu_hour``; energy and emissions with
    ``power_fraction``, ``pue`` and ``grid_gco2_per_kwh`` (``engine.run.energy``)."""
    from lmcalc.estimates.counts import flops_estimate, params_estimate
    from lmcalc.estimates.inputs import accept
    from lmcalc.estimates.plan import plan_estimate, search_pins
    from lmcalc.estimates.time import Timing, cost_and_energy, run_tokens
    from lmcalc.estimates.training import training_setup

    accept(settings, ReportSettings, "report")
    given = with_defaults(settings, ReportSettings)
    mfu = given["mfu"]
    price_per_gpu_hour, energy = cost_and_energy(given)
    setup = training_setup(model, gpus, cast(TrainingSettings, subset(given, WorkloadSettings)), given)
    cluster, resolved = setup.cluster, setup.resolved
    tokens_in = run_tokens(
        given["tokens"], given["dataset_tokens"], given["epochs"], setup.model, setup.workload.method
    )
    pins = search_pins(given)
    batch_tokens = count(given["global_batch"], "global_batch", binary=True)
    found: PlanEstimate | LmcalcError
    try:
        found = plan_estimate(setup, batch_tokens, pins, None, tokens_in)
        chosen: pl.Candidate | None = found.best
    except LmcalcError as error:
        found, chosen = error, _closest_miss(setup, batch_tokens, pins)
    timing = Timing(
        cluster, cluster.hardware, seq_len=setup.seq, price_per_gpu_hour=price_per_gpu_hour,
        method=setup.workload.method, energy=energy,
    )  # fmt: skip
    time = _train_time(resolved, tokens_in, mfu, setup.workload.precision, timing, found)
    memory = _memory_of(setup, chosen, found, _pins_text(pins, cast(SplitSettings, given)))
    return ReportEstimates(
        params_estimate(resolved),
        flops_estimate(resolved, tokens_in, setup.seq),
        time,
        memory,
        found,
        chosen,
        report_summary(time, memory, found, chosen),
        cluster,
    )


def _closest_miss(setup: TrainingSetup, batch_tokens: float, pins: pl.Pins) -> pl.Candidate | None:
    """The layout that misses the memory by least when the search found none that fits (``plan_estimate`` says so
    in words; this is the layout itself, for the memory section); None when no layout can exist."""
    from lmcalc.engine.search import plan as pl

    sequences = round(batch_tokens / setup.workload.seq_len)  # the global batch as plan_estimate counts it
    if sequences < 1:
        return None
    try:
        searched = pl.plan(setup.workload, setup.cluster, sequences, pins)
    except LmcalcError:
        return None
    return None if searched.fitting else searched.closest  # layouts fit: the search was refused for another reason


def _pins_text(pins: pl.Pins, split: SplitSettings) -> str:
    """The settings the search was pinned with, as flags: ``--tp 4 --zero 3``, or ``no pins``."""
    given = [f"{flag(name)} {getattr(pins, name)}" for name in PINS if getattr(pins, name) is not None]
    given += [f"{flag('recompute')} {pins.recompute}"] if pins.recompute else []
    given += [] if pins.sequence_parallel else ["--no-sequence-parallel"]
    given += [flag(name) for name in SplitSettings.__annotations__ if split.get(name)]
    return "pinned " + " ".join(given) if given else "no pins"


def _memory_of(
    setup: TrainingSetup, chosen: pl.Candidate | None, plan: PlanEstimate | LmcalcError, pins: str
) -> MemoryEstimate | None:
    """The memory section: of the search's fastest layout, or of its closest miss when none fits, with its micro-
    batch and recomputation; the inputs say the search chose them (and what it was pinned with)."""
    from lmcalc.estimates.memory import memory_estimate
    from lmcalc.estimates.plan import layout_code

    if chosen is None:
        return None
    memory = memory_estimate(replace(setup, workload=chosen.workload), chosen.layout)
    if isinstance(plan, LmcalcError):
        chosen_by, whose = f"the closest to fitting ({pins}): none fits", "the closest layout"
    else:
        chosen_by, whose = f"the plan's fastest of {len(plan.layouts):,} that fit ({pins})", "the plan's best layout"
    searched = ("layout", "micro_batch", "grad_accum", "recompute")
    inputs = tuple(replace(i, origin=chosen_by) if i.key in searched else i for i in memory.report.inputs)
    title = f"Training memory per GPU: {setup.model.label}, {whose} ({layout_code(chosen)})"
    return replace(memory, report=replace(memory.report, title=title, inputs=inputs))


def _train_time(
    resolved: Resolved,
    tokens: Given,
    mfu: float | None,
    precision: PrecisionRecipe,
    timing: Timing,
    plan: PlanEstimate | LmcalcError,
) -> TrainTimeEstimate:
    """The training time: at the throughput the search predicts for its best layout, stated as the MFU of the FLOPs
    the time section counts (6·N·D; the search's own MFU counts the detailed model FLOPs, attention included, so
    the two MFUs differ and the days agree); at ``mfu`` when given, with the prediction beside it; when no layout
    fits, at the MFU given or assumed, titled hypothetical."""
    from lmcalc.estimates.plan import layout_code
    from lmcalc.estimates.time import train_time_estimate

    if isinstance(plan, LmcalcError):
        time = train_time_estimate(resolved, tokens, mfu_given(mfu), precision, timing)
        label = timing.cluster.label if timing.cluster else timing.hardware.name
        exists = "can exist" not in str(plan)  # the search's refusal: none fits, or none can exist at all
        missing = f"fits the memory of {label}" if exists else "can exist with these settings"
        note = (
            f"hypothetical: no layout {missing} (see the layouts below), so no run on it reaches this time; it is "
            f"what {label} would take at MFU {time.run.mfu:g} if one did"
        )
        title = f"Training time of {resolved.spec.label}: hypothetical, {'no layout fits' if exists else 'no layout'}"
        return replace(time, report=replace(time.report, title=title, notes=(note, *time.report.notes)))
    best = plan.best
    predicted = _mfu_at(best.tokens_per_s, tokens, precision, timing, resolved)
    code = layout_code(best)
    plan_mfu = f"the plan's MFU column, {100 * best.mfu:.3g} %, counts the detailed model FLOPs, attention included"
    if mfu is None:
        origin = f"the plan's best layout ({code}) at its predicted {best.tokens_per_s:,.0f} tokens/s, as MFU of the "
        given = Given(predicted, origin + f"FLOPs counted here ({plan_mfu})")
        time = train_time_estimate(resolved, tokens, given, precision, timing)
        inputs = tuple(replace(i, label="MFU of these FLOPs") if i.key == "mfu" else i for i in time.report.inputs)
        return replace(time, report=replace(time.report, inputs=inputs))
    time = train_time_estimate(resolved, tokens, mfu_given(mfu), precision, timing)
    days = tokens.value / best.tokens_per_s / 86_400
    note = (
        f"{flag('mfu')} {mfu:g} gives {time.days:,.1f} days; the plan predicts {best.tokens_per_s:,.0f} tokens/s for "
        "its best "
        f"layout ({code}): {days:,.1f} days, MFU {predicted:.3f} of the FLOPs counted here ({plan_mfu})"
    )
    return replace(time, report=replace(time.report, notes=(note, *time.report.notes)))


def _mfu_at(
    tokens_per_s: float, tokens: Given, precision: PrecisionRecipe, timing: Timing, resolved: Resolved
) -> float:
    """The MFU at which ``train_time_estimate`` reaches ``tokens_per_s``: the FLOPs it counts per token, times the
    tokens per second, over the cluster's dense peak (``engine.run.cost.RunTime``, solved for the MFU)."""
    from lmcalc.engine.run.cost import peak_for
    from lmcalc.estimates.inputs import default_seq_len
    from lmcalc.estimates.time import training_flops

    seq = timing.seq_len or default_seq_len(resolved.spec)
    flops = training_flops(resolved.spec, tokens.value, int(seq.value), timing.basis, timing.method).value
    assert timing.cluster is not None  # a report times a cluster
    return flops / tokens.value * tokens_per_s / (timing.cluster.count * peak_for(timing.hardware, precision))


SUMMARY_TERMS = (
    "time.days",
    "time.gpu_hours",
    "time.cost",
    "energy.gpu_energy",
    "energy.facility_energy",
    "energy.co2",
)
"""What the summary repeats of the training time, in this order (the cost with a price, the energy with a TDP)."""


def report_summary(
    time: TrainTimeEstimate,
    memory: MemoryEstimate | None,
    plan: PlanEstimate | LmcalcError,
    chosen: pl.Candidate | None,
) -> Result:
    """The answer first: the layout and whether it fits, then the days, GPU-hours, cost, energy and emissions. Its
    figures are the sections' own terms, so the summary cannot disagree with them."""
    from lmcalc.estimates.plan import layout_code

    shown = time.report
    terms = []
    if memory is not None:
        terms.append(replace(memory.report.term("total.total"), key="memory", label="Memory of the most loaded GPU"))
    for key in SUMMARY_TERMS:
        try:
            terms.append(shown.term(key))
        except KeyError:
            continue  # no price given, or no TDP in the GPU's preset
    (mfu,) = [i for i in shown.inputs if i.key == "mfu"]
    (tokens,) = [i for i in shown.inputs if i.key == "tokens"]
    fits = not isinstance(plan, LmcalcError)
    if memory is None:
        verdict, whose = "no", "no layout can exist with these settings (see the layouts below)"
    else:
        verdict = f"{'yes' if fits else 'no'}: {memory.total / GB:,.1f} GB of {memory.capacity / GB:,.0f} GB"
        whose = "the most loaded GPU of the layout below" + ("" if fits else ", the closest to fitting")
    if isinstance(plan, LmcalcError):
        chosen_by = "the closest to fitting" if chosen else "none"
    else:
        chosen_by = f"the fastest of {group(len(plan.layouts))} that fit, of {group(plan.evaluated)} evaluated"
    stated = _one_mfu(mfu, plan)
    inputs = (
        Input("fits", "Fits in memory", verdict, origin=whose),
        Input("layout", "Layout", layout_code(chosen) if chosen else "none", origin=chosen_by),
        tokens,
        stated,
    )
    notes = [n for n in shown.notes if n.startswith(("hypothetical:", flag("mfu")))]
    if shown.inputs and not any(t.key == "cost" for t in terms):
        notes.append(f"cost: give {flag('price_per_gpu_hour')} (e.g. 2.5, in $ per GPU-hour) for the run's cost")
    title = f"Summary: {shown.title.removeprefix('Training time of ')}"
    on = "no layout can exist"
    if memory is not None and chosen is not None:
        held = f"{memory.total / GB:,.1f} GB of {memory.capacity / GB:,.0f} GB per GPU"
        on = f"{layout_code(chosen)} {'fits' if fits else 'does not fit (the closest)'}, {held}"
    spent = ", ".join(t.text for t in terms if t.key in ("days", "gpu_hours", "cost"))
    headline = (f"{title.removeprefix('Summary: ')}: {on}", f"{spent} for {tokens.text} at MFU {stated.text}")
    sections = (Section("summary", "The run", tuple(terms)),)
    return Result("report", title, inputs, sections, tuple(notes), headline=headline, inputs_header="Figure")


def _one_mfu(mfu: Input, plan: PlanEstimate | LmcalcError) -> Input:
    """The MFU the page states: the layout search's (the model FLOPs, attention counted in full, over the step time,
    the GPUs and the dense peak), as its table gives it; where no layout fits or ``--mfu`` is given, the time
    section's."""
    if isinstance(plan, LmcalcError) or mfu.origin == flag("mfu"):
        return mfu
    return Input(
        "mfu",
        "MFU",
        round(100 * plan.best.mfu, 1),
        "%",
        "the plan's: model FLOPs of a step, attention counted in full / (step time · GPUs · dense peak); the time "
        "section states the same throughput as MFU of its 6·N·D",
    )
