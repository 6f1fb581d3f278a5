"""The layout search behind ``lmcalc plan``: every valid split, those that fit, ranked by throughput.

It follows the Ultra-Scale Playbook's recipe. First make one replica fit: TP within a node, then PP
over layers, CP for long sequences, EP for experts, ZeRO and recomputation to trade memory. Then reach
the global batch with data parallelism and gradient accumulation. Among what fits, the fastest wins.
The search only asks the memory model (``engine.layout``) and the time model (``engine.steptime``);
it holds no formula of its own.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field

from lmcalc.engine.flops import Recompute
from lmcalc.engine.layout import GpuMemory, Layout, check_layout, most_loaded_gpu, stage_layer_counts
from lmcalc.engine.memory import AttentionImpl
from lmcalc.engine.steptime import DEFAULT_COMPUTE_EFFICIENCY, StepTime, step_time
from lmcalc.errors import LmcalcError
from lmcalc.specs import Cluster, ModelSpec, OptimizerSpec, PrecisionRecipe

MICRO_BATCHES = (1, 2, 4, 8, 16)
VIRTUAL_STAGES = (2, 3, 4)
RECOMPUTE: tuple[Recompute, ...] = ("none", "selective", "full")


@dataclass(frozen=True)
class Pins:
    """Constraints the user fixed; None leaves a dimension to the search."""

    tp: int | None = None
    pp: int | None = None
    cp: int | None = None
    ep: int | None = None
    zero: int | None = None
    micro_batch: int | None = None
    recompute: Recompute | None = None
    max_tp: int | None = None
    max_pp: int = 64
    max_cp: int = 16
    tp_within_node: bool = True
    first_stage_layers: int | None = None  # uneven pipeline stages; None: an even split
    last_stage_layers: int | None = None
    embedding_in_split: bool = False  # the embedding / the loss counted as a layer in the split (Megatron-LM)
    loss_in_split: bool = False

    @property
    def stage_split(self) -> bool:
        """Whether --first-stage-layers or --last-stage-layers pins the split of the layers."""
        return self.first_stage_layers is not None or self.last_stage_layers is not None


@dataclass(frozen=True)
class Candidate:
    layout: Layout
    recompute: Recompute
    memory: GpuMemory
    time: StepTime


@dataclass
class Plan:
    evaluated: int = 0
    fitting: list[Candidate] = field(default_factory=list)
    closest: Candidate | None = None  # the smallest overflow, when nothing fits
    capacity: float = 0.0


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _powers_of_two(limit: int) -> list[int]:
    return [2**i for i in range(limit.bit_length()) if 2**i <= limit]


def layouts(
    model: ModelSpec, cluster: Cluster, seq_len: int, global_batch: int, pins: Pins, attention: AttentionImpl
) -> Iterator[tuple[Layout, Recompute]]:
    """Every layout that can exist for this model, cluster, sequence and global batch (in sequences)."""
    gpus, per_node = cluster.count, cluster.gpus_per_node
    max_tp = pins.max_tp or (per_node if pins.tp_within_node else gpus)
    tps = (
        [pins.tp]
        if pins.tp
        else [t for t in _powers_of_two(max_tp) if model.num_heads % t == 0 and (model.mla or model.kv_heads % t == 0)]
    )
    pps = [pins.pp] if pins.pp else [p for p in range(1, min(pins.max_pp, model.num_layers) + 1) if gpus % p == 0]
    cps = (
        [pins.cp]
        if pins.cp
        else [c for c in _powers_of_two(pins.max_cp) if seq_len % c == 0 and (c == 1 or attention == "flash")]
    )
    zeros = [pins.zero] if pins.zero is not None else [0, 1, 2, 3]
    micro = [pins.micro_batch] if pins.micro_batch else list(MICRO_BATCHES)
    recomputes = [pins.recompute] if pins.recompute else list(RECOMPUTE)
    units = model.num_layers + int(pins.embedding_in_split) + int(pins.loss_in_split)  # what the chunks share
    for tp, pp, cp in itertools.product(tps, pps, cps):
        if gpus % (tp * pp * cp):
            continue
        dp = gpus // (tp * pp * cp)
        experts = model.moe.num_experts if model.moe else 1
        eps = [pins.ep] if pins.ep else [e for e in _divisors(experts) if (dp * cp) % e == 0]
        for ep, zero, mb in itertools.product(eps, zeros, micro):
            if global_batch % (dp * mb):
                continue
            accum = global_batch // (dp * mb)
            schedules = [("1f1b", 1, first, last) for first, last in _stage_splits(model, pp, pins)]
            if pp > 1 and accum % pp == 0:  # pinned uneven stages that do not split over v chunks are refused
                first, last = pins.first_stage_layers, pins.last_stage_layers
                schedules += [("interleaved", v, first, last) for v in VIRTUAL_STAGES if units >= pp * v]
            for (schedule, virtual, first, last), recompute in itertools.product(schedules, recomputes):
                yield (
                    Layout(
                        dp=dp,
                        tp=tp,
                        pp=pp,
                        cp=cp,
                        ep=ep,
                        zero=zero,
                        sequence_parallel=tp > 1,
                        micro_batch=mb,
                        grad_accum=accum,
                        schedule=schedule,  # type: ignore[arg-type]
                        virtual_stages=virtual,
                        first_stage_layers=first,
                        last_stage_layers=last,
                        embedding_in_split=pins.embedding_in_split,
                        loss_in_split=pins.loss_in_split,
                    ),
                    recompute,
                )


LIGHTER_LAST_STAGE = (1, 2)  # layers taken off the last stage, which also computes the logits


def _stage_splits(model: ModelSpec, pp: int, pins: Pins) -> list[tuple[int | None, int | None]]:
    """(first, last) stage layer counts to try under 1F1B: the pinned ones; else the even split, and the last
    stage one or two layers lighter, the remedy for a large vocabulary's logits (Megatron-LM's
    --decoder-last-pipeline-num-layers)."""
    if pins.stage_split:
        return [(pins.first_stage_layers, pins.last_stage_layers)]
    splits: list[tuple[int | None, int | None]] = [(None, None)]
    if pins.embedding_in_split or pins.loss_in_split:  # the counted units set the split
        return splits
    if pp > 1:
        even_last = stage_layer_counts(model, Layout(pp=pp))[-1]
        splits += [(None, even_last - k) for k in LIGHTER_LAST_STAGE if even_last - k >= 1]
    return splits


def plan(
    model: ModelSpec,
    cluster: Cluster,
    seq_len: int,
    global_batch: int,
    precision: PrecisionRecipe,
    optimizer: OptimizerSpec,
    pins: Pins,
    attention: AttentionImpl = "flash",
    efficiency: float = DEFAULT_COMPUTE_EFFICIENCY,
    overhead_bytes: float = 0.0,
) -> Plan:
    """Evaluate every layout; keep those that fit, fastest first, or the one that misses by least."""
    if global_batch < 1:
        raise LmcalcError("the global batch must hold at least one sequence")
    result = Plan(capacity=cluster.hardware.memory_bytes)
    cache: dict = {}
    refusal: tuple[int, str] | None = None  # the deepest pipeline's: PP = 1 says only that stages need PP ≥ 2
    for layout, recompute in layouts(model, cluster, seq_len, global_batch, pins, attention):
        try:  # pinned degrees are taken as given: the same checks as `lmcalc memory` keep them honest
            check_layout(model, layout, cluster, seq_len, attention, pins.tp_within_node)
        except LmcalcError as exc:
            if refusal is None or layout.pp > refusal[0]:
                refusal = (layout.pp, str(exc))
            continue
        result.evaluated += 1
        memory = most_loaded_gpu(
            model, layout, precision, optimizer, seq_len, attention, recompute, overhead_bytes, cache=cache
        )
        if memory.total > result.capacity:
            if result.closest is None or memory.total < result.closest.memory.total:
                result.closest = Candidate(
                    layout,
                    recompute,
                    memory,
                    _time(model, layout, seq_len, precision, cluster, recompute, efficiency, cache),
                )
            continue
        result.fitting.append(
            Candidate(
                layout,
                recompute,
                memory,
                _time(model, layout, seq_len, precision, cluster, recompute, efficiency, cache),
            )
        )
    if not result.evaluated and refusal:
        raise LmcalcError(f"no layout can exist with these constraints: {refusal[1]}")
    result.fitting.sort(key=lambda c: (-round(c.time.tokens_per_s, 6), c.memory.total))  # ties: more headroom
    return result


def _time(
    model: ModelSpec,
    layout: Layout,
    seq_len: int,
    precision: PrecisionRecipe,
    cluster: Cluster,
    recompute: Recompute,
    efficiency: float,
    cache: dict,
) -> StepTime:
    return step_time(
        model, layout, seq_len, precision, cluster.hardware, cluster.gpus_per_node, recompute, efficiency, cache=cache
    )
