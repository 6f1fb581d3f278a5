"""How well the planner predicts published runs: MFU given the published layout, and the rank of that
layout among everything the planner would choose from (docs/plan-accuracy.md, ``scripts/plan_accuracy.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmcalc.engine.layout import Layout
from lmcalc.engine.plan import Pins, plan
from lmcalc.engine.steptime import DEFAULT_COMPUTE_EFFICIENCY, step_time
from lmcalc.presets import read_yaml, resolve_hardware, resolve_model, resolve_optimizer, resolve_precision
from lmcalc.specs import Cluster, ModelSpec

MFU_TOLERANCE = 0.20  # relative
TOP_RANK = 10


@dataclass(frozen=True)
class PublishedRun:
    id: str
    source: str
    model: ModelSpec
    cluster: Cluster
    layout: Layout
    recompute: str
    seq: int
    mfu: float
    assumed: str


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
    runs = []
    for row in read_yaml(path)["runs"]:
        model: Any = row["model"]
        spec = resolve_model(model["preset"]).spec if "preset" in model else gpt_model(row["id"], **model["gpt"])
        hardware = resolve_hardware(row["hardware"]).spec
        cluster = Cluster(hardware=hardware, count=row["gpus"], gpus_per_node=min(hardware.gpus_per_node, row["gpus"]))
        runs.append(
            PublishedRun(
                row["id"],
                row["source"],
                spec,
                cluster,
                Layout(**row["layout"]),
                row["recompute"],
                row["seq"],
                row["mfu"],
                row.get("assumed", ""),
            )
        )
    return runs


@dataclass(frozen=True)
class Accuracy:
    run: PublishedRun
    predicted_mfu: float
    rank: int | None  # of the published split among distinct splits that fit, fastest first
    splits: int

    @property
    def error(self) -> float:
        return self.predicted_mfu / self.run.mfu - 1

    @property
    def ok(self) -> bool:
        return abs(self.error) <= MFU_TOLERANCE and self.rank is not None and self.rank <= TOP_RANK


def assess(run: PublishedRun, efficiency: float = DEFAULT_COMPUTE_EFFICIENCY) -> Accuracy:
    precision = resolve_precision("bf16-mixed").spec
    time = step_time(
        run.model,
        run.layout,
        run.seq,
        precision,
        run.cluster.hardware,
        run.cluster.gpus_per_node,
        run.recompute,
        efficiency,
    )  # type: ignore[arg-type]
    sequences = run.layout.dp * run.layout.micro_batch * run.layout.grad_accum
    found = plan(
        run.model,
        run.cluster,
        run.seq,
        sequences,
        precision,
        resolve_optimizer("adamw").spec,
        Pins(),
        efficiency=efficiency,
    )
    order: list[tuple[int, int, int, int]] = []
    for candidate in found.fitting:  # fastest first; a split's rank is that of its fastest variant
        split = (candidate.layout.tp, candidate.layout.pp, candidate.layout.cp, candidate.layout.dp)
        if split not in order:
            order.append(split)
    published = (run.layout.tp, run.layout.pp, run.layout.cp, run.layout.dp)
    rank = order.index(published) + 1 if published in order else None
    return Accuracy(run, time.mfu, rank, len(order))
