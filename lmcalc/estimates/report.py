"""The estimates one report page holds: parameters, FLOPs, training time, memory and the layout search."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Unpack

from lmcalc.engine.choices import ZeroStage
from lmcalc.engine.energy import DEFAULT_GRID_GCO2_PER_KWH, DEFAULT_POWER_FRACTION, DEFAULT_PUE
from lmcalc.errors import LmcalcError
from lmcalc.estimates.inputs import (
    DEFAULT_OPTIMIZER,
    DEFAULT_PRECISION,
    ClusterLike,
    Count,
    FrameworkLike,
    LayoutSettings,
    MethodSettings,
    ModelLike,
    OptimizerLike,
    PrecisionLike,
    TrainingSettings,
    count,
    mfu_given,
)

if TYPE_CHECKING:  # the estimates are imported when a report is made: the command line's start-up stays light
    from lmcalc.estimates.counts import FlopsEstimate, ParamsEstimate
    from lmcalc.estimates.memory import MemoryEstimate
    from lmcalc.estimates.plan import PlanEstimate
    from lmcalc.estimates.time import TrainTimeEstimate

REPORT_ZERO: ZeroStage = 3  # the report's memory section shards the model states over every GPU unless told otherwise


class ReportSettings(LayoutSettings, MethodSettings, total=False):
    """What ``report`` takes as keywords besides its own: the layout of its memory section and the method."""


@dataclass(frozen=True)
class ReportEstimates:
    """What a report holds; ``plan`` is the search's refusal when no layout fits (the page says why)."""

    params: ParamsEstimate
    flops: FlopsEstimate
    train_time: TrainTimeEstimate
    memory: MemoryEstimate
    plan: PlanEstimate | LmcalcError


def report(
    *,
    model: ModelLike,
    gpus: ClusterLike,
    tokens: Count | None = None,
    mfu: float | None = None,
    seq: Count | None = None,
    recompute: str = "selective",
    global_batch: Count = "4M",
    precision: PrecisionLike = DEFAULT_PRECISION,
    optimizer: OptimizerLike = DEFAULT_OPTIMIZER,
    framework: FrameworkLike | None = None,
    dataset_tokens: Count | None = None,
    epochs: float = 1,
    power_fraction: float = DEFAULT_POWER_FRACTION,
    pue: float = DEFAULT_PUE,
    grid_gco2_per_kwh: float = DEFAULT_GRID_GCO2_PER_KWH,
    **settings: Unpack[ReportSettings],
) -> ReportEstimates:
    """Parameters, FLOPs, training time, the memory of the layout ``settings`` give (ZeRO-3 over every GPU unless
    told otherwise) and the layout search, whose pipeline split is pinned as they give it; a fine-tune (the
    method's ``settings``) of ``dataset_tokens`` × ``epochs``; energy and emissions with ``power_fraction``, ``pue``
    and ``grid_gco2_per_kwh`` (``engine.energy``)."""
    from lmcalc.engine import plan as pl
    from lmcalc.engine.energy import Energy
    from lmcalc.estimates.counts import flops_estimate, params_estimate
    from lmcalc.estimates.inputs import accept
    from lmcalc.estimates.memory import memory_estimate
    from lmcalc.estimates.plan import plan_estimate
    from lmcalc.estimates.time import Timing, run_tokens, train_time_estimate
    from lmcalc.estimates.training import (
        build_layout,
        layout_settings,
        method_settings,
        pipeline_split,
        split_settings,
        training_setup,
    )

    accept(settings, ReportSettings, "report")
    layout = layout_settings(settings)
    workload = TrainingSettings(
        seq=seq, precision=precision, optimizer=optimizer, recompute=recompute, framework=framework,
        **method_settings(settings),
    )  # fmt: skip
    setup = training_setup(model, gpus, workload)
    cluster, resolved = setup.cluster, setup.resolved
    tokens_in = run_tokens(tokens, dataset_tokens, epochs, setup.model, setup.workload.method)
    given: LayoutSettings = {"zero": REPORT_ZERO, **layout}
    memory = memory_estimate(setup, build_layout(cluster, given))
    energy = Energy(power_fraction, pue, grid_gco2_per_kwh)
    timing = Timing(cluster, cluster.hardware, seq_len=setup.seq, method=setup.workload.method, energy=energy.check())
    found: PlanEstimate | LmcalcError
    try:  # the search varies the micro-batch and the recomputation itself
        pins = pl.Pins(split=pipeline_split(split_settings(given)))
        found = plan_estimate(setup, count(global_batch, "global_batch", binary=True), pins, None, tokens_in)
    except LmcalcError as error:
        found = error
    return ReportEstimates(
        params_estimate(resolved),
        flops_estimate(resolved, tokens_in, setup.seq),
        train_time_estimate(resolved, tokens_in, mfu_given(mfu), setup.workload.precision, timing),
        memory,
        found,
    )
