"""Time and size of a run: how long training takes on a cluster (or how many GPUs meet a deadline), and the
compute-optimal model and data for a budget."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Unpack

from lmcalc.engine.choices import FLOPS_BASES
from lmcalc.engine.finetune.flops import method_step_flops, napkin_method_flops, napkin_method_flops_formula
from lmcalc.engine.finetune.method import FULL, Method, check_method
from lmcalc.engine.finetune.offload import NO_OFFLOAD, Offload
from lmcalc.engine.model import flops as fl
from lmcalc.engine.model.palm import napkin_section
from lmcalc.engine.run import optimal as opt
from lmcalc.engine.run.cost import RunTime, check_mfu, gpus_for_deadline, peak_for, time_terms, whole_gpus
from lmcalc.engine.run.energy import (
    Energy,
    energy_terms,
)
from lmcalc.errors import LmcalcError, flag, setting
from lmcalc.estimates.inputs import (
    ClusterLike,
    Given,
    ModelLike,
    PrecisionLike,
    accept,
    checked,
    choice,
    cluster_of,
    context_note,
    count,
    default_seq_len,
    finite,
    hardware_of,
    method_of,
    mfu_given,
    model_input,
    model_notes,
    offload_of,
    precision_of,
    recipe_text,
    resolve_model,
    seq_given,
    tokens_given,
)
from lmcalc.estimates.measured import measured_peak
from lmcalc.estimates.setting_groups import subset, with_defaults
from lmcalc.estimates.settings import (
    DEFAULT_PRECISION,
    Count,
    EnergySettings,
    FineTuneSettings,
    OffloadSettings,
    RunSettings,
    TrainTimeSettings,
)
from lmcalc.estimates.shown import Estimate
from lmcalc.presets import Resolved
from lmcalc.recipe_specs import PrecisionRecipe
from lmcalc.result import Input, Result, Section, Term
from lmcalc.specs import Cluster, HardwareSpec, ModelSpec
from lmcalc.units import sci


@dataclass(frozen=True)
class TrainTimeEstimate(Estimate):
    """How long ``run.flops`` take on ``run.gpus`` GPUs at an MFU: days, GPU-hours, throughput."""

    run: RunTime

    @property
    def days(self) -> float:
        return self.run.days

    @property
    def gpu_hours(self) -> float:
        return self.run.gpu_hours

    @property
    def gpus(self) -> float:
        return self.run.gpus

    @property
    def tokens_per_s(self) -> float:
        return self.run.tokens_per_s


def train_time(
    *,
    model: ModelLike,
    gpus: ClusterLike | None = None,
    mfu: float | None = None,
    precision: PrecisionLike = DEFAULT_PRECISION,
    days: float | None = None,
    gpu: str | HardwareSpec | None = None,
    flops_basis: str = "6nd",
    seq: Count | None = None,
    peak: str = "spec",
    calibration: str | None = None,
    **settings: Unpack[TrainTimeSettings],
) -> TrainTimeEstimate:
    """Days and GPU-hours to train a model on a cluster (``gpus``), or, with ``days`` and a GPU type (``gpu``),
    the GPUs needed to meet the deadline. ``peak="measured"`` (or a ``calibration`` file) takes the peak from
    ``lmcalc bench`` results instead of the spec sheet. A fine-tune (``settings``: the method, lora, qlora or
    freeze, with its settings) runs ``dataset_tokens`` × ``epochs`` tokens, never the preset's pretraining count.
    Energy and emissions take the GPU's TDP × ``power_fraction``, the data centre's ``pue`` and the grid's
    ``grid_gco2_per_kwh`` (engine.run.energy)."""
    accept(settings, TrainTimeSettings, "train_time")
    fine_tuning = subset(settings, FineTuneSettings)
    offload = offload_of(subset(settings, OffloadSettings))
    price_per_gpu_hour, energy = cost_and_energy(settings)
    how = method_of(fine_tuning)
    resolved = resolve_model(model, counting="flops" if how.kind == "full" else "")  # full training: FLOPs at an MFU
    spec = resolved.spec
    basis = choice(flops_basis, FLOPS_BASES, "flops_basis")
    check_method(spec, how)
    run = with_defaults(subset(settings, RunSettings), RunSettings)
    tokens_in = run_tokens(run["tokens"], run["dataset_tokens"], run["epochs"], spec, how)
    mfu_in = mfu_given(mfu)
    finite(days, "days")
    recipe = precision_of(precision)
    cluster, hardware = _where(gpus, gpu, days)
    seq_in = seq_given(seq, spec)
    found = measured_peak(peak, calibration, hardware, recipe)
    timing = Timing(cluster, hardware, days, seq_in, basis, price_per_gpu_hour, found, how, energy, offload)
    return train_time_estimate(resolved, tokens_in, mfu_in, recipe, timing)


def cost_and_energy(given: Mapping[str, Any]) -> tuple[float | None, Energy]:
    """The price per GPU-hour and the energy settings among ``given`` (``EnergySettings``, their defaults for those
    left out), each checked."""
    settings = with_defaults(subset(given, EnergySettings), EnergySettings)
    for name in EnergySettings.__annotations__:
        finite(settings[name], name, allow_zero=True)
    price = settings["price_per_gpu_hour"]
    return price, Energy(settings["power_fraction"], settings["pue"], settings["grid_gco2_per_kwh"]).check()


def _where(
    gpus: ClusterLike | None, gpu: str | HardwareSpec | None, days: float | None
) -> tuple[Cluster | None, HardwareSpec]:
    """The cluster the run is timed on and its GPU; with a deadline, no cluster (its GPU count is solved for) and
    the GPU type named by ``gpu`` or a count-less ``gpus``."""
    if days is not None:
        if gpus is not None and (gpu is not None or re.match(r"^\s*\d+\s*[x×]", str(gpus))):
            raise LmcalcError(
                f"with {setting('days')} the GPU count is what is solved for: name the GPU type alone "
                f"({setting('gpus')} H100 or {setting('gpu')} H100), or give {setting('gpus')} with a count and no "
                f"{setting('days')} to get the time"
            )
        gpu = gpu if gpus is None else str(gpus)  # --gpus H100 names the type, as --gpu does
        if gpu is None:
            gpu_flag = setting("gpu")
            raise LmcalcError(
                f"{setting('days')} needs the GPU type to count (e.g. {gpu_flag} H100, or {setting('gpus')} H100)"
            )
        return None, hardware_of(gpu)
    if gpus is None:
        raise LmcalcError(
            f"give {setting('gpus')} (e.g. {setting('gpus')} 1024xH100), or {setting('days')} with {setting('gpu')} "
            "to solve for the GPU count"
        )
    cluster = cluster_of(gpus)
    return cluster, cluster.hardware


def flops_basis_text(basis: str, method: Method) -> str:
    """What the FLOPs row counts, for the inputs table: 6·N·D, its fine-tuning form, or the detailed count."""
    if basis != "6nd":
        return "detailed"
    return "6·N·D" if method.kind == "full" else f"({napkin_method_flops_formula(method)})·D"


def run_tokens(tokens: Count | None, dataset: Count | None, epochs: float, model: ModelSpec, method: Method) -> Given:
    """The tokens a run trains on: ``dataset`` × ``epochs`` for a fine-tune, or ``tokens``, else (full training
    only) the preset's published count or 20 per parameter."""
    finite(epochs, "epochs")
    if dataset is not None:
        if tokens is not None:
            raise LmcalcError(
                f"give {setting('tokens')} (all the tokens the run trains on) or {setting('dataset_tokens')} with "
                f"{setting('epochs')}, not both"
            )
        size = count(dataset, "dataset_tokens")
        return Given(size * epochs, f"{flag('dataset_tokens')} {size:.4g} × {flag('epochs')} {epochs:g}")
    if epochs != 1:
        raise LmcalcError(f"{setting('epochs')} counts passes over {setting('dataset_tokens')}: give that too")
    if tokens is None and method.kind != "full":
        raise LmcalcError(
            f"a fine-tune ({method.kind}) needs {setting('dataset_tokens')} (and {setting('epochs')}): the tokens "
            "of its dataset, not the model's pretraining count"
        )
    return tokens_given(tokens, model)


@dataclass(frozen=True)
class Timing:
    """Where and how a run is timed: on ``cluster``, or on ``hardware`` within ``days``; the sequence length and
    FLOPs basis; the price; and a measured peak (FLOP/s, where it was measured) instead of the spec sheet's."""

    cluster: Cluster | None
    hardware: HardwareSpec
    days: float | None = None
    seq_len: Given | None = None
    basis: str = "6nd"
    price_per_gpu_hour: float | None = None
    measured_peak: tuple[float, str] | None = None
    method: Method = FULL
    energy: Energy = Energy()
    offload: Offload = NO_OFFLOAD


def training_flops(model: ModelSpec, tokens: float, seq_len: int, basis: str, method: Method = FULL) -> Term:
    """The FLOPs a run's time is computed from: 6·N·D (napkin) or the detailed causal count; under a fine-tuning
    method, what it trains (``engine.finetune.flops``)."""
    if method.kind != "full":
        if basis == "6nd":
            per_token, formula = napkin_method_flops(model, method)
            numbers = f"{sci(per_token, 4)} × {sci(tokens)}"
            return Term("training_flops", f"Training FLOPs ({method.label})", per_token * tokens, "FLOPs",
                        f"({formula})·D", numbers, "engine.finetune.flops: frozen weights take no weight gradient",
                        note="N: the base's parameters (active, for MoE)")  # fmt: skip
        step = method_step_flops(model, method, seq_len, "none", "causal")
        return Term("training_flops", f"Training FLOPs ({method.label}, detailed)", step.model * tokens, "FLOPs",
                    "(forward + input gradients + weight gradients + attention backward) per token · D",
                    f"({sci(step.forward, 4)} + {sci(step.input_grads, 4)} + {sci(step.weight_grads, 4)} + "
                    f"{sci(step.attention_backward, 4)}) × {sci(tokens)}",
                    "engine.finetune.flops; checked against FlopCounterMode on PEFT models")  # fmt: skip
    term = (
        napkin_section(model, tokens).term("total")
        if basis == "6nd"
        else fl.detailed_section(model, tokens, seq_len, "causal", "none").term("model_flops")
    )
    return replace(term, key="training_flops")  # one key in --json whichever basis was chosen


def train_time_estimate(
    resolved: Resolved, tokens: Given, mfu: Given, precision: PrecisionRecipe, where: Timing
) -> TrainTimeEstimate:
    """Days to train on a cluster; or, with a deadline and a GPU type, how many GPUs meet it."""
    model, note = resolved.spec, resolved.note
    check_mfu(mfu.value)
    seq = where.seq_len or default_seq_len(model)
    flops_term = training_flops(model, tokens.value, int(seq.value), where.basis, where.method)
    hw, cluster, days, measured = where.hardware, where.cluster, where.days, where.measured_peak
    peak = measured[0] if measured else peak_for(hw, precision)
    inputs = [
        model_input(model, note),
        Input("tokens", "Training tokens D", tokens.value, "tokens", tokens.origin),
        Input("mfu", "MFU", mfu.value, origin=mfu.origin),
        Input("precision", "Precision recipe", precision.name, origin=recipe_text(precision)),
        *(
            [Input("method", "Fine-tuning method", where.method.label, origin=flag("method"))]
            if where.method.kind != "full"
            else []
        ),  # fmt: skip
        Input(
            "flops_basis",
            "FLOPs counted",
            flops_basis_text(where.basis, where.method),
            origin=f"{flag('flops_basis')} 6nd: the napkin rule (Kaplan et al. 2020)"
            if where.basis == "6nd"
            else f"{flag('flops_basis')} detailed: causal matmul count at s = {int(seq.value)}",
        ),
    ]
    sections = [Section("flops", "Work", (flops_term,))]
    if days is not None:
        deadline, gpu_count = _deadline_section(flops_term.value, days, peak, mfu.value, hw)
        inputs += [Input("days", "Deadline", days, "days", flag("days")), Input("gpu", "GPU", hw.name, origin=hw.label)]
        sections.append(deadline)
        run = RunTime(flops_term.value, gpu_count, peak, mfu.value, tokens.value)
    else:
        assert cluster is not None
        inputs.append(Input("cluster", "Cluster", cluster.label, origin=f"{cluster.count} × {hw.label}"))
        run = RunTime(flops_term.value, cluster.count, peak, mfu.value, tokens.value)
    source = measured[1] if measured else None
    sections.append(
        Section("time", "Time and throughput", time_terms(run, hw, precision, where.price_per_gpu_hour, source))
    )
    if energy := energy_terms(run.gpu_hours, hw, where.energy):
        sections.append(Section("energy", "Energy and emissions", energy))
    notes = [*model_notes(model, note), *context_note(model, int(seq.value))]
    if measured:
        notes.append(
            f"peak per GPU is the measured {measured[0] / 1e12:.1f} TFLOP/s ({measured[1]}), "
            "not the spec sheet: MFU then counts against what the hardware delivered"
        )
    if where.offload.optimizer:
        inputs.append(Input("offload", "Offload", where.offload.label, origin=flag("offload")))
        notes.append(offload_note(where.offload))
    if mfu.assumed:
        assumed = f"MFU {mfu.value:g} is an assumption, not a measurement"
        notes.append(f"{assumed}: pass {flag('mfu')} (what your runs achieve)")
    report = checked(
        Result("train-time", f"Training time of {model.label}", tuple(inputs), tuple(sections), tuple(notes))
    )
    return TrainTimeEstimate(replace(report, headline=time_headline(report, model, hw, run)), run)


def offload_note(offload: Offload) -> str:
    """What an offload changes in a time counted from FLOPs and an MFU: nothing in the FLOPs, so the MFU has to carry
    it; ``plan`` times the transfers and the CPU's optimizer step."""
    target = offload.target
    return (
        f"{flag('offload')} {target}: the FLOPs are the same without it; the copies over the host link "
        f"({offload.host_link_gbps:g} GB/s) and the CPU's optimizer step lengthen each step, so give the MFU such a "
        f"run achieves, or let 'lmcalc plan … {flag('offload')} {target}' time them"
    )


def _deadline_section(flops: float, days: float, peak: float, mfu: float, hw: HardwareSpec) -> tuple[Section, int]:
    """The GPUs that meet a deadline: exact, whole GPUs to rent (a fraction of a GPU rents a whole one) and nodes."""
    needed = gpus_for_deadline(flops, days, peak, mfu)
    gpu_count, nodes = whole_gpus(max(needed, 1.0), hw.gpus_per_node)
    section = Section(
        "deadline",
        "GPUs to meet the deadline",
        (
            Term(
                "gpus_exact",
                "GPUs needed (exact)",
                needed,
                "GPUs",
                "FLOPs / (days · 86,400 · peak · MFU)",
                f"{sci(flops, 4)} / ({days:g} × 86400 × {sci(peak, 4)} × {mfu:g})",
            ),
            Term("gpus", "GPUs to rent", gpu_count, "GPUs", "⌈exact⌉", f"⌈{needed:.6g}⌉"),
            Term(
                "nodes",
                f"Nodes of {hw.gpus_per_node}",
                nodes,
                "nodes",
                "⌈GPUs / GPUs per node⌉",
                f"⌈{gpu_count} / {hw.gpus_per_node}⌉",
            ),
        ),
    )
    return section, gpu_count


def time_headline(report: Result, model: ModelSpec, hw: HardwareSpec, run: RunTime) -> tuple[str, ...]:
    """The answer first: days on the cluster (or the GPUs a deadline needs), GPU-hours and cost; then energy."""
    time = {term.key: term.text for term in next(s for s in report.sections if s.key == "time").terms}
    spent = f"{time['days']} ({time['gpu_hours']}{', ' + time['cost'] if 'cost' in time else ''}) at MFU {run.mfu:g}"
    if any(section.key == "deadline" for section in report.sections):
        gpus, nodes = report.term("deadline.gpus"), report.term("deadline.nodes")
        lines = [f"{gpus.text} ({nodes.text}) of {hw.label} train {model.label} in {spent}"]
    else:
        lines = [f"{model.label} on {run.gpus:,.0f} × {hw.label}: {spent}"]
    if any(section.key == "energy" for section in report.sections):
        lines.append(
            f"energy {report.term('energy.facility_energy').text} at the meter, {report.term('energy.co2').text}"
        )
    return tuple(lines)


@dataclass(frozen=True)
class OptimalEstimate(Estimate):
    """The compute-optimal allocations of ``compute`` FLOPs: by the rule of thumb and by the fitted frontier."""

    compute: float
    rule_of_thumb: opt.Allocation
    fitted: opt.Allocation


def optimal(
    *,
    compute: Count | None = None,
    gpus: ClusterLike | None = None,
    days: float | None = None,
    mfu: float | None = None,
    tokens_per_param: float = opt.TOKENS_PER_PARAM,
    precision: PrecisionLike | None = None,
    price_per_gpu_hour: float | None = None,
) -> OptimalEstimate:
    """Compute-optimal parameters and tokens (Hoffmann et al. 2022) for a FLOP budget (``compute``), or for a
    cluster (``gpus``) and a deadline (``days``); ``mfu``, ``precision`` (default bf16-mixed) and the price
    apply to a cluster only."""
    finite(days, "days")
    finite(tokens_per_param, "tokens_per_param")
    finite(price_per_gpu_hour, "price_per_gpu_hour", allow_zero=True)
    if compute is not None and gpus is not None:
        raise LmcalcError(f"give either {setting('compute')} or {setting('gpus')} with {setting('days')}, not both")
    cluster_only = [
        name
        for name, value in (("mfu", mfu), ("price_per_gpu_hour", price_per_gpu_hour), ("precision", precision))
        if value is not None
    ]
    if gpus is None and cluster_only:
        verb = "applies" if len(cluster_only) == 1 else "apply"
        names = ", ".join(setting(name) for name in cluster_only)
        raise LmcalcError(f"{names} {verb} to a cluster: add {setting('gpus')} and {setting('days')}")
    cluster = cluster_of(gpus) if gpus is not None else None
    recipe = precision_of(precision or DEFAULT_PRECISION) if cluster else None
    budget = count(compute, "compute") if compute is not None else None
    return optimal_estimate(budget, cluster, days, recipe, Budget(mfu_given(mfu), tokens_per_param, price_per_gpu_hour))


@dataclass(frozen=True)
class Budget:
    """How a cluster's budget is spent: at ``mfu``, allocated at ``tokens_per_param`` by the rule of thumb, at a
    price per GPU-hour."""

    mfu: Given
    tokens_per_param: float = opt.TOKENS_PER_PARAM
    price_per_gpu_hour: float | None = None


def optimal_estimate(
    compute: float | None, cluster: Cluster | None, days: float | None, precision: PrecisionRecipe | None, how: Budget
) -> OptimalEstimate:
    """The compute-optimal model size and tokens for a budget in FLOPs, or for a cluster and a deadline."""
    mfu = how.mfu
    budget: tuple[Section, ...] = ()
    inputs: list[Input] = []
    if compute is None:
        if cluster is None or days is None or precision is None:
            raise LmcalcError(
                f"give {setting('compute')} (e.g. 1e24), or {setting('gpus')} with {setting('days')} "
                f"(e.g. {setting('gpus')} 1024xH100 {setting('days')} 30)"
            )
        section = opt.budget_section(cluster, precision, mfu.value, days, how.price_per_gpu_hour)
        compute, budget = section.term("compute").value, (section,)
        inputs += [
            Input("cluster", "Cluster", cluster.label, origin=f"{cluster.count} × {cluster.hardware.label}"),
            Input("days", "Deadline", days, "days", flag("days")),
            Input("mfu", "MFU", mfu.value, origin=mfu.origin),
            Input("precision", "Precision recipe", precision.name, origin=recipe_text(precision)),
        ]
    else:
        inputs.append(Input("compute", "Compute budget", compute, "FLOPs", flag("compute")))
    sections = opt.optimal_sections(compute, how.tokens_per_param)
    if budget:
        assert cluster is not None and days is not None
        sections += (opt.throughput_section(sections, cluster, days),)
    notes: tuple[str, ...] = (
        "Hoffmann et al. 2022: ~20 tokens per parameter; the paper's fitted law (Approach 3, rounded constants) "
        "favours smaller models on more tokens (Besiroglu et al. 2024 discuss why)",
    )
    if cluster and mfu.assumed:
        notes += (f"MFU {mfu.value:g} is an assumption, not a measurement: pass {flag('mfu')}",)
    rule, fitted = (
        {t.key: t.text for t in next(s for s in sections if s.key == key).terms}
        for key in ("rule_of_thumb", "parametric_fit")
    )
    where = f" ({cluster.label}, {days:g} days at MFU {mfu.value:g})" if budget and cluster and days else ""
    headline = (
        f"For {sci(compute)} FLOPs{where}: {rule['params']} on {rule['tokens']} ({rule['tokens_per_param']} tokens per "
        f"parameter); the fitted frontier: {fitted['params']} on {fitted['tokens']}",
    )
    report = checked(
        Result(
            "optimal", "Compute-optimal model and data", tuple(inputs), (*budget, *sections), notes, headline=headline
        )
    )
    return OptimalEstimate(
        report, compute, opt.rule_of_thumb(compute, how.tokens_per_param), opt.CHINCHILLA_FIT.frontier(compute)
    )
