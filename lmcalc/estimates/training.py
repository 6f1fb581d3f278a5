"""What a training estimate starts from: the workload the user's values describe, on the cluster they name, and
the parallel layout their settings give (``LayoutSettings``: the same keywords for the Python API and, as flags,
for the command line)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypedDict, Unpack, cast

from lmcalc import presets as pr
from lmcalc.engine.choices import ATTENTION_KERNELS, RECOMPUTE_MODES, SCHEDULES, ZeroStage
from lmcalc.engine.layout import Layout
from lmcalc.engine.memory_terms import Capacity
from lmcalc.engine.pipeline import PipelineSplit
from lmcalc.engine.workload import Workload
from lmcalc.errors import LmcalcError
from lmcalc.estimates.inputs import (
    TRAINING_DEFAULTS,
    ClusterLike,
    Given,
    ModelLike,
    TrainingSettings,
    choice,
    cluster_of,
    nbytes,
    optimizer_of,
    positive_int,
    precision_of,
    resolve_model,
    seq_given,
)
from lmcalc.specs import Cluster, ModelSpec


class SplitSettings(TypedDict, total=False):
    """How the layers split over the pipeline stages (Megatron-LM's flags), as the user gives it."""

    first_stage_layers: int | None
    last_stage_layers: int | None
    account_for_embedding_in_pipeline_split: bool
    account_for_loss_in_pipeline_split: bool


class LayoutSettings(SplitSettings, total=False):
    """A parallel layout as the user gives it; DP, when not given, fills the GPUs the other degrees leave."""

    dp: int | None
    tp: int
    pp: int
    cp: int
    ep: int
    zero: int
    sequence_parallel: bool
    grad_accum: int
    schedule: str
    virtual_stages: int


class MemorySettings(TrainingSettings, LayoutSettings, total=False):
    """A training workload and its parallel layout, as ``memory`` and ``fit`` take them."""


def training_settings(given: Mapping[str, Any], function: str) -> TrainingSettings:
    """The workload's settings among ``given`` (a ``MemorySettings``), the others checked (``_known``)."""
    return cast(TrainingSettings, _of(TrainingSettings, given, function))


def layout_settings(given: Mapping[str, Any], function: str) -> LayoutSettings:
    """The layout's settings among ``given`` (a ``MemorySettings``), the others checked (``_known``)."""
    return cast(LayoutSettings, _of(LayoutSettings, given, function))


def _of(kind: type, given: Mapping[str, Any], function: str) -> dict[str, Any]:
    """The settings among ``given`` that the TypedDict ``kind`` holds; a keyword that no setting of the function
    has is refused, as Python refuses an unexpected keyword argument (``**settings`` accepts any at run time)."""
    unknown = sorted(set(given) - set(MemorySettings.__annotations__))
    if unknown:
        raise TypeError(f"{function}() got an unexpected keyword argument {unknown[0]!r}")
    return {key: value for key, value in given.items() if key in kind.__annotations__}


def pipeline_split(schedule: str = "1f1b", virtual_stages: int = 1, **split: Unpack[SplitSettings]) -> PipelineSplit:
    """The pipeline split the settings describe."""
    return PipelineSplit(
        schedule=choice(schedule, SCHEDULES, "schedule"),
        virtual_stages=virtual_stages,
        first_stage_layers=split.get("first_stage_layers"),
        last_stage_layers=split.get("last_stage_layers"),
        embedding_in_split=split.get("account_for_embedding_in_pipeline_split", False),
        loss_in_split=split.get("account_for_loss_in_pipeline_split", False),
    )


def split_settings(settings: LayoutSettings) -> SplitSettings:
    """The pipeline split's settings among a layout's."""
    return {key: value for key, value in settings.items() if key in SplitSettings.__annotations__}  # type: ignore[return-value]


def build_layout(cluster: Cluster, settings: LayoutSettings) -> Layout:
    """The layout the settings describe on ``cluster``; DP fills the GPUs the other degrees leave. Checked
    against a workload by ``engine.layout.check_layout``."""
    tp, pp, cp, ep = settings.get("tp", 1), settings.get("pp", 1), settings.get("cp", 1), settings.get("ep", 1)
    for name, value in (("tp", tp), ("pp", pp), ("cp", cp), ("ep", ep)):
        positive_int(value, name)
    dp = settings.get("dp")
    if dp is None:
        if cluster.count % (tp * pp * cp):
            raise LmcalcError(f"TP·PP·CP = {tp * pp * cp} does not divide the {cluster.count} GPUs of {cluster.label}")
        dp = cluster.count // (tp * pp * cp)
    split = split_settings(settings)
    zero: ZeroStage = settings.get("zero", 0)  # type: ignore[assignment]  # check_layout refuses another
    return Layout(
        dp=dp,
        tp=tp,
        pp=pp,
        cp=cp,
        ep=ep,
        zero=zero,
        sequence_parallel=settings.get("sequence_parallel", False),
        grad_accum=positive_int(settings.get("grad_accum", 1), "grad_accum"),
        split=pipeline_split(
            settings.get("schedule", "1f1b"),
            positive_int(settings.get("virtual_stages", 1), "virtual_stages"),
            **split,
        ),
    )


def layout_origin(layout: Layout) -> str:
    """The settings a layout in an inputs table came from."""
    split = layout.split
    return (
        "--dp --tp --pp --cp --ep --zero --sequence-parallel --schedule --virtual-stages"
        + (" --first/--last-stage-layers" if split.first_stage_layers or split.last_stage_layers else "")
        + (" --account-for-embedding/loss-in-pipeline-split" if split.units else "")
    )


@dataclass(frozen=True)
class TrainingSetup:
    """A training workload on a cluster, resolved: what the memory, fit and plan estimates start from."""

    resolved: pr.Resolved  # the model, and a note when a family name chose it
    cluster: Cluster
    workload: Workload
    seq: Given  # the sequence length, and where it came from, for the inputs table

    @property
    def model(self) -> ModelSpec:
        return self.workload.model

    @property
    def capacity(self) -> Capacity:
        hardware = self.cluster.hardware
        return Capacity(hardware.memory_bytes, f"{hardware.name}: {hardware.memory_label}")


def training_setup(model: ModelLike, gpus: ClusterLike, settings: TrainingSettings) -> TrainingSetup:
    """The workload the user's settings describe (``TRAINING_DEFAULTS`` for those left out), on the cluster they
    name."""
    given: TrainingSettings = {**TRAINING_DEFAULTS, **settings}
    resolved = resolve_model(model)
    cluster = cluster_of(gpus)
    recipe, opt = precision_of(given["precision"]), optimizer_of(given["optimizer"])
    kernel = choice(given["attention"], ATTENTION_KERNELS, "attention")
    mode = choice(given["recompute"], RECOMPUTE_MODES, "recompute")
    overhead_bytes = nbytes(given["overhead"], "overhead")
    seq_in = seq_given(given["seq"], resolved.spec)
    workload = Workload(
        resolved.spec,
        recipe,
        opt,
        int(seq_in.value),
        given["micro_batch"],
        kernel,
        mode,
        overhead_bytes=overhead_bytes,
    )
    return TrainingSetup(resolved, cluster, workload, seq_in)
