"""How well the planner predicts published runs: MFU given the published layout, and the rank of that
layout among everything the planner would choose from (docs/plan-accuracy.md, ``scripts/plan_accuracy.py``).

A harness for the docs and the tests, not a command: it lives beside the scripts, outside the package.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmcalc.engine.layout import Layout
from lmcalc.engine.plan import Pins, plan
from lmcalc.engine.steptime import DEFAULT_COMPUTE_EFFICIENCY, StepTime, step_time
from lmcalc.engine.workload import Workload
from lmcalc.estimates.training import build_layout, pipeline_split, split_settings
from lmcalc.presets import read_yaml, resolve_hardware, resolve_model, resolve_optimizer, resolve_precision
from lmcalc.specs import Cluster, ModelSpec

MFU_TOLERANCE = 0.20  # relative
TOP_RANK = 10
PRECISION, OPTIMIZER = "bf16-mixed", "adamw"  # what every published run trained with
OVERHEAD_BYTES = 0.0  # the runs are judged on model states and activations alone, without lmcalc's allowance


@dataclass(frozen=True)
class PublishedRun:
    id: str
    source: str
    cluster: Cluster
    layout: Layout
    workload: Workload  # the model, sequence, micro-batch and recomputation as published
    mfu: float
    assumed: str
    toolset: Pins  # what the authors' software offered: the search space their choice was made in
    toolset_note: str

    @property
    def model(self) -> ModelSpec:
        return self.workload.model


def gpt_model(name: str, hidden: int, layers: int, heads: int) -> ModelSpec:
    """A Megatron GPT of Korthikanti et al. 2022 Table 3: vocabulary 51,200, 4h GELU MLP, sequence 2048."""
    return ModelSpec(
        name=name,
        vocab_size=51200,
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        ffn_size=4 * hidden,
        ffn_kind="gelu_mlp",
        norm_kind="layernorm",
        attention_bias="all",
        mlp_bias=True,
        tied_embeddings=True,
        position_embedding="learned",
        max_seq_len=2048,
        dropout=True,
    )


def load_runs(path: Path) -> list[PublishedRun]:
    precision, optimizer = resolve_precision(PRECISION).spec, resolve_optimizer(OPTIMIZER).spec
    runs = []
    for row in read_yaml(path)["runs"]:
        model: Any = row["model"]
        spec = resolve_model(model["preset"]).spec if "preset" in model else gpt_model(row["id"], **model["gpt"])
        hardware = resolve_hardware(row["hardware"]).spec
        cluster = Cluster(hardware=hardware, count=row["gpus"], gpus_per_node=min(hardware.gpus_per_node, row["gpus"]))
        settings = dict(row["layout"])
        micro_batch = settings.pop("micro_batch")
        workload = Workload(
            spec,
            precision,
            optimizer,
            row["seq"],
            micro_batch,
            recompute=row["recompute"],
            overhead_bytes=OVERHEAD_BYTES,
        )
        toolset = row.get("toolset", {})
        pins = dict(toolset.get("pins", {}))
        split = split_settings(pins)
        pins = {key: value for key, value in pins.items() if key not in split}
        runs.append(
            PublishedRun(
                row["id"],
                row["source"],
                cluster,
                build_layout(cluster, settings),
                workload,
                row["mfu"],
                row.get("assumed", ""),
                Pins(**pins, split=pipeline_split(split)),
                toolset.get("why", ""),
            )
        )
    return runs


@dataclass(frozen=True)
class Accuracy:
    run: PublishedRun
    predicted_mfu: float
    rank: int | None  # of the published split among distinct splits that fit, fastest first
    splits: int
    toolset_rank: int | None  # the same, searching only what the authors' software offered
    toolset_splits: int
    rank_as_published: int  # where the published configuration's own speed ranks, fitting or not
    behind_fastest: float  # the published configuration's predicted tokens/s over the fastest split's, minus 1

    @property
    def error(self) -> float:
        return self.predicted_mfu / self.run.mfu - 1

    @property
    def ok(self) -> bool:
        return abs(self.error) <= MFU_TOLERANCE and self.rank is not None and self.rank <= TOP_RANK


Split = tuple[int, int, int, int]


def _split(layout: Layout) -> Split:
    return (layout.tp, layout.pp, layout.cp, layout.dp)


def fastest_per_split(run: PublishedRun, pins: Pins, efficiency: float) -> dict[Split, float]:
    """Tokens/s of each split's fastest variant (ZeRO stage, micro-batch, recomputation, schedule) that fits,
    fastest split first."""
    layout = run.layout
    found = plan(run.workload, run.cluster, layout.dp * run.workload.micro_batch * layout.grad_accum, pins, efficiency)
    fastest: dict[Split, float] = {}
    for candidate in found.fitting:  # already fastest first
        fastest.setdefault(_split(candidate.layout), candidate.time.tokens_per_s)
    return fastest


def _rank(split: Split, fastest: dict[Split, float]) -> int | None:
    order = list(fastest)
    return order.index(split) + 1 if split in order else None


def published_step_time(run: PublishedRun, efficiency: float = DEFAULT_COMPUTE_EFFICIENCY) -> StepTime:
    """The step-time model's figures for the run's own layout (its MFU is what the paper's is compared with)."""
    return step_time(run.workload, run.layout, run.cluster, efficiency)


def assess(run: PublishedRun, efficiency: float = DEFAULT_COMPUTE_EFFICIENCY) -> Accuracy:
    time = published_step_time(run, efficiency)
    published = _split(run.layout)
    everything = fastest_per_split(run, Pins(), efficiency)
    # a run whose authors had every option lmcalc searches needs no second search
    toolset = everything if run.toolset == Pins() else fastest_per_split(run, run.toolset, efficiency)
    faster = sum(1 for split, speed in everything.items() if split != published and speed > time.tokens_per_s)
    return Accuracy(
        run,
        time.mfu,
        _rank(published, everything),
        len(everything),
        _rank(published, toolset),
        len(toolset),
        faster + 1,
        time.tokens_per_s / max(everything.values(), default=float("nan")) - 1,
    )
