"""Memory per GPU for any parallel layout: DP/ZeRO, TP (+ sequence parallelism), PP, CP and EP.

Sharding is data. Each weight tensor says which dimension tensor parallelism splits (Megatron-LM,
Shoeybi et al. 2019: column-parallel Q/K/V, FC1/gate/up and the vocabulary of the embedding and the
head; row-parallel attention output and FC2/down; norms, routers and MLA's low-rank down-projections
replicated), which layers hold it (pipeline stages split the layers; the embedding lives on the first
stage, the final norm and head on the last), and whether expert parallelism splits its copies. ZeRO
then shards the resulting per-GPU states over the data-parallel replicas (Rajbhandari et al. 2020):
DP × CP for dense tensors, DP × CP / EP for experts.

Activations follow Korthikanti et al. 2022: tensors inside attention and the MLP are split by the
tensor-parallel degree t (eq. 2); the norm inputs, dropout masks and linear inputs are split too only
with sequence parallelism (eq. 4); context parallelism splits the sequence. Under 1F1B the first
pipeline stage holds p micro-batches in flight, each through L/p layers (eq. 5); under the interleaved
schedule every stage's count follows Megatron-LM's schedule chunk by chunk (``held_in_flight``), which
on the first stage is Korthikanti et al.'s 1 + (p − 1)/(p·v) times as much.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Literal, NamedTuple

from lmcalc.engine.flops import ForwardFlops, Recompute, forward_flops_per_token
from lmcalc.engine.memory import (
    MASK_BYTES,
    AttentionImpl,
    SavedTensor,
    capacity_terms,
    layer_saved_tensors,
    model_saved_tensors,
    optimizer_state_bytes,
    overhead_term,
    saved_formula,
    state_formula,
)
from lmcalc.engine.params import WeightTensor, weight_tensors
from lmcalc.errors import LmcalcError
from lmcalc.result import Section, Term
from lmcalc.specs import Cluster, ModelSpec, OptimizerSpec, PrecisionRecipe
from lmcalc.units import group

Schedule = Literal["1f1b", "interleaved"]

# Megatron-LM's tensor-parallel split, by module name: column-parallel modules split their output
# dimension (weight and bias), row-parallel ones their input dimension (weight only).
COLUMN_PARALLEL = {"q", "k", "v", "q_b", "kv_b", "fc", "gate", "up", "embed", "lm_head"}
ROW_PARALLEL = {"o", "proj", "down"}


@dataclass(frozen=True)
class Layout:
    """How a training step is spread over GPUs; the product dp·tp·pp·cp is the number of GPUs."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    zero: int = 0
    sequence_parallel: bool = False
    micro_batch: int = 1
    grad_accum: int = 1
    schedule: Schedule = "1f1b"
    virtual_stages: int = 1
    first_stage_layers: int | None = None  # Megatron-LM's --decoder-first-pipeline-num-layers; None: even split
    last_stage_layers: int | None = None  # --decoder-last-pipeline-num-layers
    # Megatron-LM's --account-for-embedding-in-pipeline-split / --account-for-loss-in-pipeline-split: the
    # input embedding / the output layer and loss count as one layer each when the layers are split
    embedding_in_split: bool = False
    loss_in_split: bool = False

    @property
    def gpus(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    @property
    def label(self) -> str:
        parts = [
            f"DP={self.dp}",
            f"TP={self.tp}",
            f"PP={self.pp}",
            f"CP={self.cp}",
            f"EP={self.ep}",
            f"ZeRO-{self.zero}",
        ]
        if self.sequence_parallel:
            parts.append("SP")
        if self.pp > 1:
            parts.append(f"{self.schedule}" + (f" v={self.virtual_stages}" if self.schedule == "interleaved" else ""))
        if self.first_stage_layers is not None:
            parts.append(f"first stage {self.first_stage_layers} layers")
        if self.last_stage_layers is not None:
            parts.append(f"last stage {self.last_stage_layers} layers")
        counted = [name for name, on in (("embedding", self.embedding_in_split), ("loss", self.loss_in_split)) if on]
        if counted:
            parts.append(f"{' and '.join(counted)} counted as a layer")
        return ", ".join(parts)

    @property
    def chunks(self) -> int:
        """Model chunks per GPU: the virtual stages under the interleaved schedule, one under 1F1B."""
        return self.virtual_stages if self.schedule == "interleaved" else 1

    @property
    def split(self) -> tuple:
        """Everything that decides which layers each stage holds (a cache key)."""
        return (self.pp, self.chunks, self.first_stage_layers, self.last_stage_layers, self.embedding_in_split,
                self.loss_in_split)  # fmt: skip

    @property
    def split_units(self) -> int:
        """What the pipeline split counts beyond the layers: the embedding and the loss, where asked."""
        return int(self.embedding_in_split) + int(self.loss_in_split)


def check_layout(
    model: ModelSpec,
    layout: Layout,
    cluster: Cluster | None,
    seq_len: int,
    attention: AttentionImpl,
    tp_within_node: bool = True,
) -> None:
    """Refuse a layout that cannot exist, naming the constraint that fails."""
    degrees = {
        "--dp": layout.dp,
        "--tp": layout.tp,
        "--pp": layout.pp,
        "--cp": layout.cp,
        "--ep": layout.ep,
        "--micro-batch": layout.micro_batch,
        "--grad-accum": layout.grad_accum,
        "--virtual-stages": layout.virtual_stages,
        "--first-stage-layers": layout.first_stage_layers,
        "--last-stage-layers": layout.last_stage_layers,
    }
    for flag, value in degrees.items():
        if value is not None and value < 1:
            raise LmcalcError(f"{flag} must be a positive integer, got {value}")
    if layout.zero not in (0, 1, 2, 3):
        raise LmcalcError(f"--zero must be 0, 1, 2 or 3, got {layout.zero}")
    if cluster and layout.gpus != cluster.count:
        raise LmcalcError(
            f"DP·TP·PP·CP = {layout.dp}·{layout.tp}·{layout.pp}·{layout.cp} = {layout.gpus} "
            f"does not equal the {cluster.count} GPUs of {cluster.label}"
        )
    check_tp_heads(model, layout.tp)
    if cluster and tp_within_node and layout.tp > cluster.gpus_per_node:
        raise LmcalcError(
            f"TP={layout.tp} spans more than the {cluster.gpus_per_node} GPUs of a node "
            "(tensor parallelism needs the intra-node links)"
        )
    if layout.schedule == "interleaved" and layout.virtual_stages < 2:
        raise LmcalcError("the interleaved schedule needs --virtual-stages 2 or more (1 is plain 1F1B)")
    if layout.schedule == "interleaved" and layout.pp < 2:
        raise LmcalcError("the interleaved schedule needs pipeline stages: --pp 2 or more")
    if layout.schedule != "interleaved" and layout.virtual_stages != 1:
        raise LmcalcError("--virtual-stages applies to --schedule interleaved only")
    if layout.pp > model.num_layers:
        raise LmcalcError(f"PP={layout.pp} exceeds the {model.num_layers} layers of {model.name}")
    stages = layout.pp * layout.virtual_stages
    if layout.schedule == "interleaved" and model.num_layers + layout.split_units < stages:
        counted = f" + {layout.split_units} counted in the split" if layout.split_units else ""
        raise LmcalcError(
            f"the interleaved schedule needs at least one layer per chunk: {model.num_layers} layers{counted} "
            f"< PP × virtual stages = {stages}"
        )
    if layout.schedule == "interleaved" and layout.grad_accum % layout.pp:
        raise LmcalcError(
            f"the interleaved schedule needs micro-batches (--grad-accum {layout.grad_accum}) "
            f"divisible by PP={layout.pp}"
        )
    _check_stage_layers(model, layout)
    if layout.ep > 1:
        if not model.moe:
            raise LmcalcError(f"EP={layout.ep} needs a mixture-of-experts model; {model.name} is dense")
        if model.moe.num_experts % layout.ep:
            raise LmcalcError(f"EP={layout.ep} does not divide the {model.moe.num_experts} experts of {model.name}")
        if (layout.dp * layout.cp) % layout.ep:
            raise LmcalcError(
                f"EP={layout.ep} must divide DP·CP = {layout.dp * layout.cp} (experts are spread "
                "over the data-parallel ranks)"
            )
    if seq_len % layout.cp:
        raise LmcalcError(f"CP={layout.cp} does not divide the sequence length {seq_len}")
    if layout.cp > 1 and attention != "flash":
        raise LmcalcError(
            "context parallelism needs fused attention (--attention flash): ring attention "
            "never materialises the s² scores"
        )


def check_tp_heads(model: ModelSpec, tp: int, replicate_kv: bool = False) -> None:
    """TP splits the attention heads evenly, and in training the KV heads too (Megatron-LM). Serving may
    instead replicate KV heads that are fewer than TP, when TP is a multiple of them (vLLM)."""
    if model.num_heads % tp:
        raise LmcalcError(f"TP={tp} does not divide the {model.num_heads} attention heads of {model.name}")
    kv = model.kv_heads
    if model.mla or kv % tp == 0:
        return
    if not replicate_kv or kv > tp:
        raise LmcalcError(f"TP={tp} does not divide the {kv} KV heads of {model.name}")
    if tp % kv:
        raise LmcalcError(
            f"TP={tp} is not a multiple of the {kv} KV heads of {model.name}, so they cannot be replicated"
        )


def _check_stage_layers(model: ModelSpec, layout: Layout) -> None:
    """Uneven first and last stages (Megatron-LM's --decoder-first/last-pipeline-num-layers) must leave every
    other stage at least one layer; under the interleaved schedule every stage's layers, the first's, the
    last's and the others' even share, must split evenly over its chunks."""
    given = {"--first-stage-layers": layout.first_stage_layers, "--last-stage-layers": layout.last_stage_layers}
    given = {flag: value for flag, value in given.items() if value is not None}
    if layout.split_units:
        _check_split_units(model, layout, given)
    if not given:
        return
    flags = " and ".join(given)
    plural = len(given) > 1
    if layout.pp < 2:
        raise LmcalcError(f"{flags} {'need' if plural else 'needs'} pipeline stages: --pp 2 or more")
    asked = sum(given.values())
    rest = model.num_layers - asked
    others = layout.pp - len(given)
    if rest < 0:
        raise LmcalcError(
            f"{flags} {'ask' if plural else 'asks'} for {asked} layers; {model.name} has {model.num_layers}"
        )
    if others == 0 and rest:
        raise LmcalcError(
            f"with --pp 2 there are no other stages: {flags} must add up to the {model.num_layers} layers of "
            f"{model.name}, not {asked}"
        )
    if rest < others:
        stages = "stage" if others == 1 else f"{others} stages"
        raise LmcalcError(
            f"{flags} {'leave' if plural else 'leaves'} {rest} of the {model.num_layers} layers for the other "
            f"{stages}, which {'needs at least one' if others == 1 else 'need at least one each'}"
        )
    v = layout.chunks
    uneven = [f"{flag} {value}" for flag, value in given.items() if value % v]
    if others and rest % (others * v) and v > 1:  # under 1F1B the earlier other stages take one more
        uneven.append(f"the other {others} stages' {rest} layers")
    if uneven:
        raise LmcalcError(
            f"with --virtual-stages {v} every stage's layers split evenly over its {v} chunks (Megatron-LM's layer "
            f"offsets assume it): {' and '.join(uneven)} do not"
        )


def _check_split_units(model: ModelSpec, layout: Layout, given: dict) -> None:
    """The embedding or the loss counted in the split (Megatron-LM's --account-for-*-in-pipeline-split)
    needs pipeline stages, replaces --first/--last-stage-layers, and, as Megatron-LM asserts, needs the
    layers and the counted units to divide evenly over the stages (and over their chunks, interleaved)."""
    flags = " and ".join(
        flag
        for flag, on in (
            ("--account-for-embedding-in-pipeline-split", layout.embedding_in_split),
            ("--account-for-loss-in-pipeline-split", layout.loss_in_split),
        )
        if on
    )
    if layout.pp < 2:
        raise LmcalcError(f"{flags} {'need' if layout.split_units > 1 else 'needs'} pipeline stages: --pp 2 or more")
    if given:
        raise LmcalcError(f"{flags} and {' and '.join(given)} both set the split of the layers: give one or the other")
    units = model.num_layers + layout.split_units
    chunks = layout.pp * layout.chunks
    if units % chunks:
        what = f"PP × virtual stages = {chunks}" if chunks != layout.pp else f"PP={layout.pp}"
        raise LmcalcError(
            f"with {flags}, the {model.num_layers} layers + {layout.split_units} = {units} must divide evenly "
            f"over {what} (Megatron-LM asserts it)"
        )


def stage_layer_counts(model: ModelSpec, layout: Layout) -> list[int]:
    """Layers on each pipeline stage: the --first/--last-stage-layers where given, and the rest split as evenly as
    possible over the other stages, the earlier ones taking one more when the split is uneven (Llama 3 405B's
    126 layers on 16 stages). With the embedding or the loss counted as a layer (Megatron-LM's
    --account-for-embedding/loss-in-pipeline-split), the layers and those units are split evenly, and the
    first or the last stage builds one layer fewer (Llama 3 405B: 126 + 2 = 16 × 8, so 7, 8, …, 8, 7)."""
    return [sum(dense + moe for dense, moe in chunks) for chunks in stage_chunk_mixes(model, layout)]


@functools.cache  # the planner asks for the same few splits thousands of times
def _layer_counts(layers: int, pp: int, first: int | None, last: int | None) -> tuple[int, ...]:
    fixed = {stage: n for stage, n in ((0, first), (pp - 1, last)) if n is not None}
    others = [stage for stage in range(pp) if stage not in fixed]
    counts = dict(fixed)
    if others:
        base, extra = divmod(layers - sum(fixed.values()), len(others))
        counts.update({stage: base + (1 if i < extra else 0) for i, stage in enumerate(others)})
    return tuple(counts[stage] for stage in range(pp))


def distinct_stages(model: ModelSpec, layout: Layout) -> tuple[int, ...]:
    """The stages that bound all the others: the first, the last, and the first stage of every mix of layers
    (its chunks' dense and MoE layers). A later stage with the same layers holds the same parameters, does the
    same work and keeps fewer micro-batches in flight, so it never needs more memory or more time
    (DeepSeek-V3: its 3 dense layers make stage 1 light, and stage 2, the first all-MoE stage, the heaviest)."""
    return _distinct_stages(*_split_args(model, layout))


@functools.cache
def _distinct_stages(*split_args) -> tuple[int, ...]:
    mixes = _chunk_mixes(*split_args)
    firsts = {mix: mixes.index(mix) for mix in mixes}
    return tuple(sorted({0, len(mixes) - 1, *firsts.values()}))


def stage_layers(model: ModelSpec, layout: Layout, stage: int) -> tuple[int, int]:
    """(dense layers, MoE layers) on pipeline stage ``stage`` (``stage_layer_counts``), over all its chunks."""
    chunks = stage_chunk_mixes(model, layout)[stage]
    return sum(dense for dense, _ in chunks), sum(moe for _, moe in chunks)


def stage_chunk_mixes(model: ModelSpec, layout: Layout) -> tuple[tuple[tuple[int, int], ...], ...]:
    """For every stage, the (dense, MoE) layers of each of its model chunks: one chunk under 1F1B, v under the
    interleaved schedule.

    The model's layers fill the chunks in order, and the dense layers come first in the model. Under 1F1B
    a stage is one chunk (``stage_layer_counts``). Under the interleaved schedule chunk j of stage i is
    the model's (j·p + i)-th slice of layers, as Megatron-LM's layer offset j·L/v + i·L/(p·v) places it.
    The L layers (plus the embedding and the loss where they count in the split) are dealt over the p·v
    slices as evenly as possible, earlier slices taking one more (Megatron-LM refuses a split that is not
    even; lmcalc models it this way); a counted embedding takes a layer's place in the first slice, a
    counted loss in the last. With --first/--last-stage-layers each stage's share is split evenly over its
    chunks (``check_layout`` refuses a share that does not divide)."""
    return _chunk_mixes(*_split_args(model, layout))


def _split_args(model: ModelSpec, layout: Layout) -> tuple:
    return (model.num_layers, model.moe.dense_layers if model.moe else model.num_layers, *layout.split)


@functools.cache  # the planner asks for the same few splits thousands of times
def _chunk_mixes(
    layers: int, dense_layers: int, pp: int, v: int, first: int | None, last: int | None, embedding: bool, loss: bool
) -> tuple[tuple[tuple[int, int], ...], ...]:
    if first is not None or last is not None:  # each stage's share, split evenly over its chunks
        stages = _layer_counts(layers, pp, first, last)
        sizes = tuple(stages[g % pp] // v for g in range(pp * v))
    else:  # the layers and the counted units dealt over the p·v slices, the counted units at the two ends
        base, extra = divmod(layers + int(embedding) + int(loss), pp * v)
        sizes = tuple(base + (1 if g < extra else 0) - int(embedding and g == 0) - int(loss and g == pp * v - 1)
                      for g in range(pp * v))  # fmt: skip
    mixes: list[list[tuple[int, int]]] = [[] for _ in range(pp)]
    start = 0
    for g, count in enumerate(sizes):  # slice g is chunk g // pp of stage g % pp
        dense = max(0, min(start + count, dense_layers) - start)
        mixes[g % pp].append((dense, count - dense))
        start += count
    return tuple(tuple(chunks) for chunks in mixes)


def _tp_divisor(tensor: WeightTensor, model: ModelSpec, tp: int) -> int:
    module, _, param = tensor.name.rpartition(".")
    leaf = module.rsplit(".", 1)[-1]
    column = leaf in COLUMN_PARALLEL or (leaf in ("q_norm", "k_norm") and model.qk_norm == "full")
    return tp if column or (leaf in ROW_PARALLEL and param == "weight") else 1


def _copies_on_stage(tensor: WeightTensor, model: ModelSpec, layout: Layout, stage: int) -> float:
    """How many copies of ``tensor`` one GPU of ``stage`` holds (before tensor-parallel splitting)."""
    dense, moe = stage_layers(model, layout, stage)
    first, last = stage == 0, stage == layout.pp - 1
    symbol = tensor.count_symbol
    if symbol == "1":
        if tensor.group in ("embedding", "position"):
            on_stage = first or (last and tensor.group == "embedding" and model.tied_embeddings)
        else:  # final norm, untied head
            on_stage = last
        return 1.0 if on_stage else 0.0
    if symbol == "L":
        return tensor.count / model.num_layers * (dense + moe)
    if symbol == "L_dense":
        return tensor.count / model.moe.dense_layers * dense  # type: ignore[union-attr]
    per_layer = tensor.count / model.moe_layers  # L_moe, L_moe·E, L_moe·E_shared
    if tensor.group == "experts":
        per_layer /= layout.ep
    return per_layer * moe


@dataclass(frozen=True)
class StageParams:
    dense: float  # parameters on one GPU of the stage, replicated over DP·CP
    experts: float  # routed-expert parameters on one GPU, replicated over DP·CP/EP


def stage_params(model: ModelSpec, layout: Layout, stage: int) -> StageParams:
    dense = experts = 0.0
    for tensor in weight_tensors(model):
        held = _copies_on_stage(tensor, model, layout, stage) * tensor.numel / _tp_divisor(tensor, model, layout.tp)
        if tensor.group == "experts":
            experts += held
        else:
            dense += held
    return StageParams(dense, experts)


def stage_forward_flops(model: ModelSpec, layout: Layout, stage: int, seq_len: int) -> ForwardFlops:
    """Forward FLOPs per token of pipeline stage ``stage`` (all its TP, CP and EP ranks together): the matmuls
    of the weights it holds that a token uses, its layers' attention (counted in full, as model FLOPs are),
    and the logits on the last stage. The stages of a layout add up to ``forward_flops_per_token``."""
    whole_experts = replace(layout, ep=1)  # the stage's work, whichever of its GPUs does it
    return forward_flops_per_token(
        model,
        seq_len,
        "full",
        share=lambda tensor: _copies_on_stage(tensor, model, whole_experts, stage) / tensor.count,
        layers=sum(stage_layers(model, layout, stage)),
        logits=stage == layout.pp - 1,
    )


@dataclass(frozen=True)
class GpuMemory:
    """The parts of one GPU's memory during a training step."""

    stage: int
    params: float
    grads: float
    master: float
    optimizer: float
    activations: float
    zero3_buffers: float
    overhead: float
    micro_batches_in_flight: float  # at the stage's busiest moment, in passes through all its layers
    activations_outside: float  # of the activations, the bytes outside the layers

    @property
    def states(self) -> float:
        return self.params + self.grads + self.master + self.optimizer

    @property
    def total(self) -> float:
        return self.states + self.activations + self.zero3_buffers + self.overhead


def _split_by_tp(tensor: SavedTensor, layout: Layout) -> bool:
    """TP splits attention/MLP internals always, the rest of a layer's tensors only under SP."""
    return tensor.split == "tp" or (tensor.split == "seq" and layout.sequence_parallel)


def _split(tensor: SavedTensor, layout: Layout) -> float:
    """Bytes of ``tensor`` on one GPU: split by TP (``_split_by_tp``) and by CP over the sequence."""
    return tensor.bytes / (layout.cp * (layout.tp if _split_by_tp(tensor, layout) else 1))


def _in_flight_term(model: ModelSpec, layout: Layout, gpu: GpuMemory) -> Term:
    """How many micro-batches the stage holds at its busiest (``held_in_flight``), with the schedule's count."""
    p, v, m, i = layout.pp, layout.chunks, layout.grad_accum, gpu.stage
    source = "Narayanan et al. 2021 §2.2 (1F1B)"
    if v == 1:
        formula, numbers = "min(PP − i, micro-batches per step), stage i counted from 0", f"min({p} − {i}, {m})"
        note = "under 1F1B the first stage holds one micro-batch per pipeline stage"
    else:
        passes = interleaved_passes_held(layout, i)
        chunks = " + ".join(str(dense + moe) for dense, moe in stage_chunk_mixes(model, layout)[i])
        formula = "forward passes through a chunk held by stage i (from 0): min(m·v, 2·(p − 1 − i) + (v − 1)·p + 1)"
        numbers = f"min({m}·{v}, 2·({p} − 1 − {i}) + ({v} − 1)·{p} + 1) = {passes} passes; layers per chunk {chunks}"
        source += "; Megatron-LM's interleaved warm-up + 1 (Korthikanti et al. 2022 §4.2.3 on the first stage)"
        note = (
            "counted in passes through all the stage's layers, at the stage's busiest moment (with uneven chunks it "
            "can come after the first backward pass)"
        )
    return Term("in_flight", "Micro-batches in flight", gpu.micro_batches_in_flight, "micro-batches", formula, numbers,
                source=source, note=note)  # fmt: skip


def _split_formula(tensors: list[SavedTensor], layout: Layout) -> str:
    """``saved_formula`` with each group of tensors over what splits it on one GPU: ``(…)/(TP·CP) + (…)/CP``."""
    groups: dict[str, list[SavedTensor]] = {}
    for tensor in tensors:
        by_tp = layout.tp > 1 and _split_by_tp(tensor, layout)
        factors = [name for name, applies in (("TP", by_tp), ("CP", layout.cp > 1)) if applies]
        divisor = f"({'·'.join(factors)})" if len(factors) > 1 else "".join(factors)
        groups.setdefault(divisor, []).append(tensor)
    if list(groups) == [""]:
        return saved_formula(tensors)
    return " + ".join(
        f"({saved_formula(group)})/{divisor}" if divisor else saved_formula(group) for divisor, group in groups.items()
    )


class StageActivations(NamedTuple):
    total: float  # bytes at the stage's busiest moment
    in_flight: float  # micro-batches in flight then, counted in passes through all the stage's layers
    outside: float  # of the total, the bytes outside the layers (embedding side, head side)


def stage_activation_bytes(
    model: ModelSpec,
    layout: Layout,
    stage: int,
    seq_len: int,
    act_bytes: float,
    attention: AttentionImpl,
    recompute: Recompute,
    mask_bytes: float = MASK_BYTES,
    cache: dict | None = None,
) -> StageActivations:
    """Activation bytes on one GPU of ``stage`` at its busiest, and the micro-batches it holds in flight then.

    ``cache``, a dict the caller keeps for one model, remembers per-layer figures across layouts (the
    planner evaluates thousands of layouts that share them)."""
    b = layout.micro_batch
    key = ("activations", seq_len, b, act_bytes, attention, recompute, mask_bytes, layout.tp, layout.sequence_parallel,
           layout.cp, layout.split, layout.grad_accum, stage)  # fmt: skip
    if cache is not None and key in cache:
        return cache[key]

    def layer_bytes(moe_layer: bool) -> float:
        key = (
            "layer",
            seq_len,
            b,
            act_bytes,
            attention,
            moe_layer,
            recompute,
            mask_bytes,
            layout.tp,
            layout.sequence_parallel,
            layout.cp,
        )
        if cache is not None and key in cache:
            return cache[key]
        tensors = layer_saved_tensors(model, seq_len, b, act_bytes, attention, moe_layer, recompute, mask_bytes)
        value = sum(_split(t, layout) for t in tensors if not (recompute == "selective" and t.attention_core))
        if cache is not None:
            cache[key] = value
        return value

    chunks = stage_chunk_mixes(model, layout)[stage]
    if recompute == "full":
        checkpoint = SavedTensor("layer input", "s·b·h", seq_len * b * model.hidden_size, act_bytes, split="seq")
        layers = [(dense + moe) * _split(checkpoint, layout) for dense, moe in chunks]
        dense, moe = stage_layers(model, layout, stage)
        working = max(layer_bytes(False) if dense else 0.0, layer_bytes(True) if moe else 0.0)
    else:
        layers = [dense * layer_bytes(False) + (moe * layer_bytes(True) if moe else 0.0) for dense, moe in chunks]
        working = 0.0
    embedding_side, head_side = stage_outside_bytes(model, layout, stage, seq_len, act_bytes, mask_bytes, cache)
    per_chunk = [*layers]
    per_chunk[0] += embedding_side  # the first chunk of the first stage begins with the embedding
    per_chunk[-1] += head_side  # the last chunk of the last stage ends with the head
    held, counts = held_in_flight(layout, stage, tuple(per_chunk))
    outside = counts[0] * embedding_side + counts[-1] * head_side
    per_micro_batch = sum(layers)
    in_flight = (held - outside) / per_micro_batch if per_micro_batch else float(counts[0])
    result = StageActivations(held + working, in_flight, outside)
    if cache is not None:
        cache[key] = result
    return result


def held_in_flight(layout: Layout, stage: int, chunk_bytes: tuple[float, ...]) -> tuple[float, tuple[int, ...]]:
    """The most bytes of saved activations a GPU of ``stage`` holds during a step, given the bytes one
    micro-batch leaves in each of its chunks, and how many micro-batches' forward passes through each chunk
    it holds at that moment. A micro-batch's activations are held from its forward pass through a chunk
    to its backward pass through it.

    1F1B (Narayanan et al. 2021 §2.2.1): stage i runs p − i − 1 forward passes, then one forward and one
    backward in turn, so it holds min(p − i, m) micro-batches at most.

    Interleaved (Narayanan et al. 2021 §2.2.2, as Megatron-LM schedules it): a GPU runs its chunks' forward
    passes in groups of p micro-batches, chunk after chunk, so its k-th forward pass goes through chunk
    ⌊k/p⌋ mod v, and its backward passes take the chunks in reverse order. Stage i first runs
    2·(p − i − 1) + (v − 1)·p forward passes (all m·v, if that is no fewer), then one forward and one
    backward in turn (current Megatron-LM; older releases ran every stage's forward passes first whenever
    m = p). On the first stage that is Korthikanti et al. 2022 §4.2.3's L·(1 + (p − 1)/(p·v)) layers of
    activations; later stages hold 2 chunks fewer each, not p/(p − i) times fewer as under 1F1B.
    When the chunks differ (an uneven split, the embedding or the head, dense and MoE layers) the busiest
    moment can fall after the first backward pass, so the steady state is followed through one period of
    p·v steps, after which the pattern repeats."""
    p, v, m = layout.pp, layout.chunks, layout.grad_accum
    if v == 1:
        n = min(p - stage, m)
        return n * chunk_bytes[0], (n,)
    total = m * v
    warm = interleaved_passes_held(layout, stage)
    counts = [(warm // (p * v)) * p + min(p, max(0, warm % (p * v) - j * p)) for j in range(v)]
    held = sum(n * size for n, size in zip(counts, chunk_bytes, strict=True))
    most, at_most = held, tuple(counts)
    if len(set(chunk_bytes)) > 1:
        for i in range(1, min(total - warm, p * v) + 1):
            forward = ((warm - 1 + i) // p) % v
            backward = v - 1 - ((i - 1) // p) % v
            counts[forward] += 1
            counts[backward] -= 1
            held += chunk_bytes[forward] - chunk_bytes[backward]
            if held > most:
                most, at_most = held, tuple(counts)
    return most, at_most


def interleaved_passes_held(layout: Layout, stage: int) -> int:
    """Chunk forward passes a GPU of ``stage`` has run and not yet run backward when its steady state begins
    under the interleaved schedule: Megatron-LM's warm-up, 2·(p − 1 − i) + (v − 1)·p, and the first steady
    forward pass; all m·v if the warm-up covers them."""
    p, v, m = layout.pp, layout.chunks, layout.grad_accum
    return min(m * v, 2 * (p - stage - 1) + (v - 1) * p + 1)


def stage_outside_bytes(
    model: ModelSpec,
    layout: Layout,
    stage: int,
    seq_len: int,
    act_bytes: float,
    mask_bytes: float,
    cache: dict | None = None,
) -> tuple[float, float]:
    """Saved bytes outside the layers that one micro-batch leaves on ``stage``: (the embedding side, the head
    side). Token ids and embedding dropout belong to the first stage; the final norm, head input and logits
    to the last."""
    embedding = head = 0.0
    for tensor in _outside(model, seq_len, layout.micro_batch, act_bytes, mask_bytes, cache):
        if tensor.block == "embedding":
            embedding += _split(tensor, layout) if stage == 0 else 0.0
        elif stage == layout.pp - 1:
            head += _split(tensor, layout)
    return embedding, head


def _outside(
    model: ModelSpec, seq_len: int, b: int, act_bytes: float, mask_bytes: float, cache: dict | None
) -> list[SavedTensor]:
    key = ("outside", seq_len, b, act_bytes, mask_bytes)
    if cache is None:
        return model_saved_tensors(model, seq_len, b, act_bytes, mask_bytes)
    if key not in cache:
        cache[key] = model_saved_tensors(model, seq_len, b, act_bytes, mask_bytes)
    return cache[key]


def cached_stage_params(model: ModelSpec, layout: Layout, stage: int, cache: dict | None) -> StageParams:
    key = ("params", layout.tp, layout.ep, layout.split, stage)
    if cache is None:
        return stage_params(model, layout, stage)
    if key not in cache:
        cache[key] = stage_params(model, layout, stage)
    return cache[key]


def gpu_memory(
    model: ModelSpec,
    layout: Layout,
    stage: int,
    precision: PrecisionRecipe,
    optimizer: OptimizerSpec,
    seq_len: int,
    attention: AttentionImpl,
    recompute: Recompute,
    overhead_bytes: float,
    mask_bytes: float = MASK_BYTES,
    cache: dict | None = None,
) -> GpuMemory:
    """Every part of one GPU's memory on pipeline stage ``stage``."""
    held = cached_stage_params(model, layout, stage, cache)
    replicas_dense = layout.dp * layout.cp
    replicas_experts = replicas_dense // layout.ep
    opt_key = ("optimizer", precision.name, optimizer.name)
    if cache is not None and opt_key in cache:
        opt_per_param = cache[opt_key]
    else:
        tensors = weight_tensors(model)
        opt_per_param = optimizer_state_bytes(tensors, precision, optimizer) / sum(t.total for t in tensors)
        if cache is not None:
            cache[opt_key] = opt_per_param

    def sharded(bytes_per_param: float, stage_min: int) -> float:
        if layout.zero >= stage_min:
            return bytes_per_param * (held.dense / replicas_dense + held.experts / replicas_experts)
        return bytes_per_param * (held.dense + held.experts)

    activations = stage_activation_bytes(
        model, layout, stage, seq_len, precision.activation_bytes, attention, recompute, mask_bytes, cache
    )
    zero3 = 0.0
    if layout.zero >= 3 and replicas_dense > 1:
        # ZeRO-3 gathers a layer's full parameters before using it and prefetches the next one.
        dense, moe = stage_layers(model, layout, stage)
        per_layer = (held.dense + held.experts) / max(1, dense + moe)
        zero3 = 2 * per_layer * precision.param_bytes
    return GpuMemory(
        stage=stage,
        params=sharded(precision.param_bytes, 3),
        grads=sharded(precision.grad_bytes, 2),
        master=sharded(precision.master_bytes, 1),
        optimizer=sharded(opt_per_param, 1),
        activations=activations.total,
        zero3_buffers=zero3,
        overhead=overhead_bytes,
        micro_batches_in_flight=activations.in_flight,
        activations_outside=activations.outside,
    )


def most_loaded_gpu(
    model: ModelSpec,
    layout: Layout,
    precision: PrecisionRecipe,
    optimizer: OptimizerSpec,
    seq_len: int,
    attention: AttentionImpl,
    recompute: Recompute,
    overhead_bytes: float,
    mask_bytes: float = MASK_BYTES,
    cache: dict | None = None,
) -> GpuMemory:
    """The pipeline stage whose GPUs need the most memory: usually the first, which holds the most
    micro-batches in flight, or the last, which holds the head and the logits; but a lighter first stage
    (--first-stage-layers, or DeepSeek-V3's dense layers) can leave the peak to the next (``distinct_stages``)."""
    return max(
        (
            gpu_memory(
                model,
                layout,
                s,
                precision,
                optimizer,
                seq_len,
                attention,
                recompute,
                overhead_bytes,
                mask_bytes,
                cache,
            )
            for s in distinct_stages(model, layout)
        ),
        key=lambda m: m.total,
    )


def memory_sections(
    model: ModelSpec,
    layout: Layout,
    gpu: GpuMemory,
    precision: PrecisionRecipe,
    optimizer: OptimizerSpec,
    seq_len: int,
    attention: AttentionImpl,
    recompute: Recompute,
    capacity: float,
    capacity_label: str,
    mask_bytes: float = MASK_BYTES,
) -> tuple[Section, ...]:
    """The memory of the most loaded GPU as terms: model states, activations, and the whole."""
    held = stage_params(model, layout, gpu.stage)
    n_stage = held.dense + held.experts
    rep_d, rep_e = layout.dp * layout.cp, layout.dp * layout.cp // layout.ep
    where = f"stage {gpu.stage + 1} of {layout.pp}" if layout.pp > 1 else "every GPU"
    on_gpu = f"one GPU of {where}" if layout.pp > 1 else "each GPU"

    def shard_text(stage_min: int) -> str:
        if layout.zero < stage_min or rep_d == 1:
            return ""
        if held.experts:
            return f", dense / {rep_d} and experts / {rep_e} (ZeRO-{layout.zero})"
        return f" / {rep_d} (ZeRO-{layout.zero} over DP·CP)"

    states_formula = (
        f"N_gpu = {group(round(n_stage))} parameters on {on_gpu} "
        f"(TP={layout.tp} splits the matrices, PP={layout.pp} the layers"
        + (f", EP={layout.ep} the experts" if layout.ep > 1 else "")
        + ")"
    )
    opt_formula = " + ".join(state_formula(s, precision, "N_gpu") for s in optimizer.states) or "0"
    state = Section(
        "state",
        f"Model states per GPU ({layout.label})",
        (
            Term(
                "params_per_gpu",
                "Parameters held (before ZeRO)",
                n_stage,
                "params",
                states_formula,
                source="Shoeybi et al. 2019 (Megatron-LM) tensor-parallel split",
            ),
            Term(
                "params",
                "Parameters",
                gpu.params,
                "bytes",
                f"N_gpu · {precision.param_bytes:g} B{shard_text(3)}",
                source=f"precision recipe {precision.name}",
            ),
            Term("grads", "Gradients", gpu.grads, "bytes", f"N_gpu · {precision.grad_bytes:g} B{shard_text(2)}"),
            Term(
                "master",
                "Master weights (fp32)",
                gpu.master,
                "bytes",
                f"N_gpu · {precision.master_bytes:g} B{shard_text(1)}",
            ),
            Term(
                "optimizer",
                f"Optimizer states ({optimizer.name})",
                gpu.optimizer,
                "bytes",
                f"({opt_formula}){shard_text(1)}" if shard_text(1) else opt_formula,
                source="; ".join(optimizer.sources),
            ),
            Term(
                "total",
                "Model states",
                gpu.states,
                "bytes",
                "params + grads + master + optimizer",
                source="Rajbhandari et al. 2020 (ZeRO) §3.1, §5.1",
            ),
        ),
    )
    dense, moe = stage_layers(model, layout, gpu.stage)
    b = layout.micro_batch
    split_text = (
        f"TP={layout.tp}"
        + (" with SP" if layout.sequence_parallel else " without SP")
        + (f", CP={layout.cp}" if layout.cp > 1 else "")
    )
    terms = []
    for moe_layer, count in ((False, dense), (True, moe)):
        if not count:
            continue
        tensors = [
            t
            for t in layer_saved_tensors(
                model, seq_len, b, precision.activation_bytes, attention, moe_layer, recompute, mask_bytes
            )
            if not (recompute == "selective" and t.attention_core)
        ]
        terms.append(
            Term(
                "moe_layer" if moe_layer else "dense_layer",
                ("One MoE layer" if moe_layer else "One dense layer" if model.moe else "One layer") + " on this GPU",
                sum(_split(t, layout) for t in tensors),
                "bytes",
                _split_formula(tensors, layout),
                f"s={seq_len}, b={b}, h={model.hidden_size}, H={model.num_heads}, H_kv={model.kv_heads}, "
                f"f={model.ffn_size}; divided for {split_text}",
                "Korthikanti et al. 2022 §4.1 eq. (1)–(4), tensor by tensor",
                note=f"{attention} attention; recomputation: {recompute}",
            )
        )
    counts = stage_layer_counts(model, layout)
    if len(set(counts)) == 1:
        layers_formula, layers_numbers = "L / PP", f"{model.num_layers} / {layout.pp}"
    else:
        layers_formula = f"stage {gpu.stage + 1}'s share of the L layers (stages differ)"
        layers_numbers = f"{model.num_layers} = " + " + ".join(str(n) for n in counts)
    terms.append(Term("layers_on_gpu", "Layers on this GPU", dense + moe, "layers", layers_formula, layers_numbers))
    terms.append(_in_flight_term(model, layout, gpu))
    outside = gpu.activations_outside
    terms.append(
        Term(
            "outside_layers",
            "Token ids, final norm, head input, logits",
            outside,
            "bytes",
            "per micro-batch holding them: embedding side (first stage), head side (last stage)",
            source="Korthikanti et al. 2022 §4.3 (extra terms)",
        )
    )
    terms.append(
        Term(
            "total",
            "Activations",
            gpu.activations,
            "bytes",
            "in flight · layers · one layer (+ embedding on the first stage, head and logits on the last)"
            + (" — full recompute keeps each layer's input and rebuilds one layer" if recompute == "full" else ""),
        )
    )
    acts = Section("activations", f"Activations per GPU (micro-batch {b} × {seq_len} tokens)", tuple(terms))
    total = gpu.total
    summary = Section(
        "total",
        f"Most loaded GPU ({where})",
        (
            Term("states", "Model states", gpu.states, "bytes"),
            Term("activations", "Activations", gpu.activations, "bytes"),
            Term(
                "zero3_buffers",
                "ZeRO-3 gathered parameters",
                gpu.zero3_buffers,
                "bytes",
                "2 × (this stage's parameters / its layers): the layer in use and the prefetched one"
                if layout.zero >= 3
                else "none (ZeRO-3 only)",
            ),
            overhead_term(gpu.overhead),
            Term("total", "Total", total, "bytes", "states + activations + buffers + overhead"),
            *capacity_terms(total, capacity, capacity_label),
        ),
    )
    return state, acts, summary
