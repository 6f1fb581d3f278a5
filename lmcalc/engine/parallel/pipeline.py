"""Pipeline parallelism: which layers each stage builds, and how many micro-batches it holds in flight.

The split of the layers is one value, ``PipelineSplit``: the schedule and its virtual stages, uneven first
and last stages (Megatron-LM's --decoder-first/last-pipeline-num-layers), whether the embedding or the
loss counts as a layer (--account-for-embedding/loss-in-pipeline-split), or every part's layers named
(--pipeline-model-parallel-layout, ``layout_parts``). It checks itself against a model
(``check_split``); ``engine.parallel.layout`` holds it and imports this module, never the reverse: what this module
reads of a layout is its stages, micro-batches and split (``Pipelined``).

Under 1F1B (Narayanan et al. 2021 §2.2.1) a stage is one chunk of consecutive layers and stage i holds
min(p − i, m) micro-batches in flight. Under the interleaved schedule (§2.2.2) each stage holds v chunks,
placed as Megatron-LM places them, and its micro-batches in flight follow Megatron-LM's schedule chunk by
chunk (``held_in_flight``).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass, fields
from typing import NamedTuple, Protocol

from lmcalc.engine.choices import SCHEDULES, Schedule, positive_integer
from lmcalc.engine.parallel.pipeline_layout import check_layout, layout_parts, layout_slices
from lmcalc.errors import LmcalcError, setting
from lmcalc.specs import ModelSpec

Mix = tuple[int, int]
"""(dense layers, MoE layers) of one model chunk."""


@dataclass(frozen=True)
class PipelineSplit:
    """How the layers are split over the pipeline stages and in which order the stages run them."""

    schedule: Schedule = "1f1b"
    virtual_stages: int = 1  # model chunks per stage under the interleaved schedule
    first_stage_layers: int | None = None  # Megatron-LM's --decoder-first-pipeline-num-layers; None: even split
    last_stage_layers: int | None = None  # --decoder-last-pipeline-num-layers
    # Megatron-LM's --account-for-embedding-in-pipeline-split / --account-for-loss-in-pipeline-split: the
    # input embedding / the output layer and loss count as one layer each when the layers are split
    embedding_in_split: bool = False
    loss_in_split: bool = False
    # Megatron-Core's --pipeline-model-parallel-layout: every model part's layers, "Et*3|(tt|)*29,m|L"
    pipeline_layout: str | None = None
    # Megatron-Core's --mtp-num-layers: multi-token-prediction modules trained, on the last stage or in the m part
    mtp_layers: int = 0

    def __post_init__(self) -> None:
        if self.schedule not in SCHEDULES:
            raise LmcalcError(f"{setting('schedule')} must be one of {', '.join(SCHEDULES)}; got {self.schedule!r}")
        for name, value in (("virtual_stages", self.virtual_stages), *self.stage_layers_given.items()):
            if not positive_integer(value):
                raise LmcalcError(f"{setting(name)} must be a positive integer, got {value}")
        if self.pipeline_layout is not None:
            layout_parts(self.pipeline_layout)  # its grammar, checked once
        if isinstance(self.mtp_layers, bool) or not isinstance(self.mtp_layers, int) or self.mtp_layers < 0:
            raise LmcalcError(f"{setting('mtp_layers')} must be 0 or a positive integer, got {self.mtp_layers!r}")

    def __hash__(self) -> int:
        return self._hash

    @functools.cached_property  # once: the planner's caches hash the same few splits millions of times
    def _hash(self) -> int:
        return hash(tuple(getattr(self, f.name) for f in fields(self)))

    def __reduce__(self) -> tuple[type[PipelineSplit], tuple[object, ...]]:
        """Pickled as its fields, so that a copy made in another process (another hash seed) hashes anew."""
        return type(self), tuple(getattr(self, f.name) for f in fields(self))

    @property
    def chunks(self) -> int:
        """Model chunks per GPU: the virtual stages under the interleaved schedule, one under 1F1B."""
        return self.virtual_stages if self.schedule == "interleaved" else 1

    @property
    def units(self) -> int:
        """What the split counts beyond the layers: the embedding and the loss, where asked."""
        return int(self.embedding_in_split) + int(self.loss_in_split)

    @functools.cached_property  # the planner asks tens of thousands of times
    def stage_layers_given(self) -> dict[str, int]:
        """The uneven stages' layer counts that were given, by setting name."""
        given = {"first_stage_layers": self.first_stage_layers, "last_stage_layers": self.last_stage_layers}
        return {name: value for name, value in given.items() if value is not None}

    def label_parts(self, pp: int) -> list[str]:
        """How a layout's label describes the split (nothing at one stage, where there is none)."""
        parts = []
        if pp > 1:
            parts.append(f"{self.schedule}" + (f" v={self.virtual_stages}" if self.schedule == "interleaved" else ""))
        if self.first_stage_layers is not None:
            parts.append(f"first stage {self.first_stage_layers} layers")
        if self.last_stage_layers is not None:
            parts.append(f"last stage {self.last_stage_layers} layers")
        counted = [name for name, on in (("embedding", self.embedding_in_split), ("loss", self.loss_in_split)) if on]
        if counted:
            parts.append(f"{' and '.join(counted)} counted as a layer")
        if self.pipeline_layout is not None:
            parts.append(f"layout {self.pipeline_layout}")
        if self.mtp_layers:
            parts.append(f"{self.mtp_layers} MTP layer{'s' if self.mtp_layers > 1 else ''}")
        return parts

    def code_parts(self, pp: int) -> list[str]:
        """``label_parts`` in a layout code: ``v4 f6 l5 +emb +loss``."""
        parts = [f"v{self.virtual_stages}"] if pp > 1 and self.schedule == "interleaved" else []
        split = (("f", self.first_stage_layers), ("l", self.last_stage_layers))
        parts += [f"{tag}{n}" for tag, n in split if n is not None]
        parts += [f"[{self.pipeline_layout}]"] if self.pipeline_layout is not None else []
        parts += [tag for tag, on in (("+emb", self.embedding_in_split), ("+loss", self.loss_in_split)) if on]
        return parts + ([f"+mtp{self.mtp_layers}"] if self.mtp_layers else [])


class Stages(NamedTuple):
    """The pipeline: ``pp`` stages and how the layers are split over them (``PipelineSplit``). What each stage builds
    (``split_stage_layers``) depends on these alone."""

    pp: int = 1
    split: PipelineSplit = PipelineSplit()


class Pipelined(Protocol):
    """What the pipeline's functions read of a layout: its stages, micro-batches per step, and split."""

    @property
    def pp(self) -> int: ...

    @property
    def grad_accum(self) -> int: ...

    @property
    def split(self) -> PipelineSplit: ...

    @property
    def stages(self) -> Stages: ...


@functools.lru_cache(maxsize=1 << 12)  # the planner checks the same few splits for every layout (a refusal is not kept)
def check_split(model: ModelSpec, pp: int, grad_accum: int, split: PipelineSplit, counted_even: bool = True) -> None:
    """Refuse a split of ``model``'s layers over ``pp`` stages that cannot exist, naming the constraint. (What a
    split can check alone, it checked when it was made.) ``counted_even``: the framework needs the layers and the
    counted embedding and loss to divide evenly (Megatron-LM asserts it; torchtitan deals the rest to the earlier
    stages)."""
    interleaved = split.schedule == "interleaved"
    if interleaved and split.virtual_stages < 2:
        raise LmcalcError(f"the interleaved schedule needs {setting('virtual_stages')} 2 or more (1 is plain 1F1B)")
    if interleaved and pp < 2:
        raise LmcalcError(f"the interleaved schedule needs pipeline stages: {setting('pp')} 2 or more")
    if not interleaved and split.virtual_stages != 1:
        raise LmcalcError(f"{setting('virtual_stages')} applies to {setting('schedule')} interleaved only")
    if pp > model.num_layers:
        raise LmcalcError(f"PP={pp} exceeds the {model.num_layers} layers of {model.name}")
    if split.pipeline_layout is not None:  # every part named: the other ways to split are refused beside it
        units = [name for name, on in (("embedding_in_split", split.embedding_in_split),
                                       ("loss_in_split", split.loss_in_split)) if on]  # fmt: skip
        check_layout(
            model, pp, split.chunks, split.pipeline_layout, split.mtp_layers, [*split.stage_layers_given, *units]
        )
    chunks = pp * split.virtual_stages
    if interleaved and model.num_layers + split.units < chunks and split.pipeline_layout is None:
        counted = f" + {split.units} counted in the split" if split.units else ""
        raise LmcalcError(
            f"the interleaved schedule needs at least one layer per chunk: {model.num_layers} layers{counted} "
            f"< PP × virtual stages = {chunks}"
        )
    if interleaved and grad_accum % pp:
        raise LmcalcError(
            f"the interleaved schedule needs micro-batches ({setting('grad_accum')} {grad_accum}) divisible by PP={pp}"
        )
    if split.units:
        _check_counted_units(model, pp, split, counted_even)
    if split.stage_layers_given:
        _check_stage_layers(model, pp, split)
    unit = model.sublayers  # a layer of the model's code holds this many of lmcalc's: no stage splits one
    if unit > 1 and any(n % unit for n in slice_sizes(model.num_layers, pp, split)):
        raise LmcalcError(
            f"PP={pp}{f' × {split.chunks} chunks' if split.chunks > 1 else ''} splits a layer of {model.name}: each of "
            f"its {model.num_layers // unit} layers is {unit} of the {model.num_layers} counted here, and a pipeline "
            f"chunk holds whole ones (the layers counted in each: {list(slice_sizes(model.num_layers, pp, split))})"
        )


def _names(names: Iterable[str]) -> str:
    return " and ".join(setting(name) for name in names)


def _check_stage_layers(model: ModelSpec, pp: int, split: PipelineSplit) -> None:
    """Uneven first and last stages must leave every other stage at least one layer; under the interleaved
    schedule every stage's layers, the first's, the last's and the others' even share, must split evenly over
    its chunks (Megatron-LM's layer offsets assume it)."""
    given = split.stage_layers_given  # named (``_names``) only in a refusal: the planner checks thousands of splits
    plural = len(given) > 1
    if pp < 2:
        raise LmcalcError(f"{_names(given)} {'need' if plural else 'needs'} pipeline stages: {setting('pp')} 2 or more")
    asked = sum(given.values())
    rest = model.num_layers - asked
    others = pp - len(given)
    if rest < 0:
        raise LmcalcError(
            f"{_names(given)} {'ask' if plural else 'asks'} for {asked} layers; {model.name} has {model.num_layers}"
        )
    if others == 0 and rest:
        raise LmcalcError(
            f"with {setting('pp')} 2 there are no other stages: {_names(given)} must add up to the {model.num_layers} "
            f"layers of {model.name}, not {asked}"
        )
    if rest < others:
        stages = "stage" if others == 1 else f"{others} stages"
        raise LmcalcError(
            f"{_names(given)} {'leave' if plural else 'leaves'} {rest} of the {model.num_layers} layers for the other "
            f"{stages}, which {'needs at least one' if others == 1 else 'need at least one each'}"
        )
    v = split.chunks
    uneven = [f"{setting(name)} {value}" for name, value in given.items() if value % v]
    if others and rest % (others * v) and v > 1:  # under 1F1B the earlier other stages take one more
        uneven.append(f"the other {others} stages' {rest} layers")
    if uneven:
        raise LmcalcError(
            f"with {setting('virtual_stages')} {v} every stage's layers split evenly over its {v} chunks "
            f"(Megatron-LM's layer offsets assume it): {' and '.join(uneven)} do not"
        )


def _check_counted_units(model: ModelSpec, pp: int, split: PipelineSplit, even: bool) -> None:
    """The embedding or the loss counted in the split needs pipeline stages, replaces the uneven stages' layer
    counts, and, as Megatron-LM asserts, needs the layers and the counted units to divide evenly over the
    stages (and over their chunks, interleaved)."""
    counted = [name for name, on in (("embedding_in_split", split.embedding_in_split),
                                     ("loss_in_split", split.loss_in_split)) if on]  # fmt: skip
    flags = _names(counted)
    if pp < 2:
        raise LmcalcError(
            f"{flags} {'need' if split.units > 1 else 'needs'} pipeline stages: {setting('pp')} 2 or more"
        )
    if split.stage_layers_given:
        raise LmcalcError(
            f"{flags} and {_names(split.stage_layers_given)} both set the split of the layers: give one or the other"
        )
    units = model.num_layers + split.units
    chunks = pp * split.chunks
    if even and units % chunks:
        what = f"PP × virtual stages = {chunks}" if chunks != pp else f"PP={pp}"
        raise LmcalcError(
            f"with {flags}, the {model.num_layers} layers + {split.units} = {units} must divide evenly "
            f"over {what} (Megatron-LM asserts it)"
        )


class StageLayers(NamedTuple):
    """What one pipeline stage builds: its dense and MoE layers (over all its chunks), and whether it holds the
    embedding (the first stage) and the output head (the last). The layers include those of the trained
    multi-token-prediction modules the stage builds (``mtp``; each a decoder layer of the model's last layer's
    kind), whose projections, norms and embedding lookups are counted apart; their passes through the head and
    their losses run on the last stage (``mtp_heads``), where Megatron-Core's output layer is."""

    dense: int
    moe: int
    embedding: bool
    head: bool
    mtp: int = 0
    mtp_heads: int = 0

    @property
    def layers(self) -> int:
        return self.dense + self.moe


def stage_layers(model: ModelSpec, layout: Pipelined, stage: int) -> StageLayers:
    """The layers ``stage`` builds (``stage_chunk_mixes``), and whether it holds the embedding or the head."""
    return _stage_layers(*_model_layers(model), layout.pp, layout.split)[stage]


@functools.cache
def _stage_layers(layers: int, moe_flags: tuple[bool, ...], pp: int, split: PipelineSplit) -> tuple[StageLayers, ...]:
    mixes = _chunk_mixes(layers, moe_flags, pp, split)
    return tuple(
        StageLayers(
            sum(dense for dense, _ in chunks),
            sum(moe for _, moe in chunks),
            stage == 0,
            stage == pp - 1,
            split.mtp_layers if stage == mtp_place(pp, split)[0] else 0,
            split.mtp_layers if stage == pp - 1 else 0,
        )
        for stage, chunks in enumerate(mixes)
    )


def mtp_place(pp: int, split: PipelineSplit) -> tuple[int, int]:
    """The (stage, chunk) that builds the trained MTP modules: the part the layout's m's are in (part g is chunk
    g // p of stage g % p), else the last chunk of the last stage (Megatron-Core's ``mtp_on_this_rank``)."""
    parts = layout_parts(split.pipeline_layout) if split.pipeline_layout is not None else ()
    part = next((g for g, letters in enumerate(parts) if "m" in letters), pp * split.chunks - 1)
    return part % pp, part // pp


def stage_layer_counts(model: ModelSpec, layout: Pipelined) -> list[int]:
    """Layers on each pipeline stage: the uneven first/last stages' counts where given, and the rest split as
    evenly as possible over the other stages, the earlier ones taking one more when the split is uneven (Llama 3
    405B's 126 layers on 16 stages). With the embedding or the loss counted as a layer, the layers and those
    units are split evenly, and the first or the last stage builds one layer fewer (Llama 3 405B: 126 + 2 =
    16 × 8, so 7, 8, …, 8, 7)."""
    return [sum(dense + moe for dense, moe in chunks) for chunks in stage_chunk_mixes(model, layout)]


def stage_chunk_mixes(model: ModelSpec, layout: Pipelined) -> tuple[tuple[Mix, ...], ...]:
    """For every stage, the (dense, MoE) layers of each of its model chunks: one chunk under 1F1B, v under the
    interleaved schedule.

    The model's layers fill the chunks in order, each dense or MoE as the model has it (DeepSeek-V3: the
    first 3 dense; Llama 4 Maverick: every other one MoE). Under 1F1B
    a stage is one chunk (``stage_layer_counts``). Under the interleaved schedule chunk j of stage i is
    the model's (j·p + i)-th slice of layers, as Megatron-LM's layer offset j·L/v + i·L/(p·v) places it.
    The L layers (plus the embedding and the loss where they count in the split) are dealt over the p·v
    slices as evenly as possible, earlier slices taking one more (Megatron-LM refuses a split that is not
    even; lmcalc models it this way); a counted embedding takes a layer's place in the first slice, a
    counted loss in the last. With uneven first/last stages each stage's share is split evenly over its
    chunks (``check_split`` refuses a share that does not divide)."""
    return _chunk_mixes(*_model_layers(model), layout.pp, layout.split)


def distinct_stages(model: ModelSpec, layout: Pipelined) -> tuple[int, ...]:
    """The stages that bound all the others: the first, the last, and the first stage of every mix of layers
    (its chunks' dense and MoE layers). A later stage with the same layers holds the same parameters, does the
    same work and keeps fewer micro-batches in flight, so it never needs more memory or more time
    (DeepSeek-V3: its 3 dense layers make stage 1 light, and stage 2, the first all-MoE stage, the heaviest)."""
    return _distinct_stages(*_model_layers(model), layout.pp, layout.split)


def distinct_stage_layers(model: ModelSpec, layout: Pipelined) -> tuple[tuple[int, StageLayers], ...]:
    """Each of the ``distinct_stages`` with the layers it builds (``stage_layers``): what the memory and the step
    time of a layout are computed over, asked for once per layout."""
    return split_stage_layers(model, layout.stages)


@functools.lru_cache(maxsize=1 << 12)  # asked once per layout and micro-batch: a model's layer flags hash once
def split_stage_layers(model: ModelSpec, stages: Stages) -> tuple[tuple[int, StageLayers], ...]:
    """``distinct_stage_layers`` of a pipeline's stages: all that they depend on."""
    return _distinct_stage_layers(*_model_layers(model), stages.pp, stages.split)


@functools.cache
def _distinct_stage_layers(
    layers: int, moe_flags: tuple[bool, ...], pp: int, split: PipelineSplit
) -> tuple[tuple[int, StageLayers], ...]:
    built = _stage_layers(layers, moe_flags, pp, split)
    return tuple((stage, built[stage]) for stage in _distinct_stages(layers, moe_flags, pp, split))


@functools.lru_cache(maxsize=64)  # asked once per layout: DeepSeek-V3's 61 flags were a third of its plan's time
def _model_layers(model: ModelSpec) -> tuple[int, tuple[bool, ...]]:
    """(layers, whether each is an MoE layer): all a split needs to know of a model."""
    return model.num_layers, tuple(model.is_moe_layer(i) for i in range(model.num_layers))


@functools.cache  # the planner asks for the same few splits thousands of times
def _distinct_stages(layers: int, moe_flags: tuple[bool, ...], pp: int, split: PipelineSplit) -> tuple[int, ...]:
    mixes = _chunk_mixes(layers, moe_flags, pp, split)
    firsts = {mix: mixes.index(mix) for mix in mixes}
    return tuple(sorted({0, len(mixes) - 1, *firsts.values()}))


def stage_chunk_flags(model: ModelSpec, layout: Pipelined | Stages) -> tuple[tuple[tuple[bool, ...], ...], ...]:
    """For every stage, whether each layer of each of its chunks is an MoE layer, in the model's order: the layers
    ``stage_chunk_mixes`` counts, where their order matters (Megatron's block recomputation takes the first of each
    chunk)."""
    return _chunk_flags(*_model_layers(model), layout.pp, layout.split)


def block_recomputed(model: ModelSpec, layout: Pipelined | Stages, stage: int, n: int) -> Mix:
    """The (dense, MoE) layers among the first ``n`` of each of ``stage``'s chunks: what Megatron-Core's block
    recomputation recomputes (megatron/core/recompute.py, ``recompute_method == 'block'``)."""
    chunks = stage_chunk_flags(model, layout)[stage]
    moe = sum(sum(flags[:n]) for flags in chunks)
    return (sum(min(n, len(flags)) for flags in chunks) - moe, moe)


@functools.cache
def _chunk_flags(
    layers: int, moe_flags: tuple[bool, ...], pp: int, split: PipelineSplit
) -> tuple[tuple[tuple[bool, ...], ...], ...]:
    _checked_chunks(layers, pp, split)
    flags: list[list[tuple[bool, ...]]] = [[] for _ in range(pp)]
    start = 0
    for g, count in enumerate(slice_sizes(layers, pp, split)):  # slice g is chunk g // pp of stage g % pp
        flags[g % pp].append(moe_flags[start : start + count])
        start += count
    stage, chunk = mtp_place(pp, split)  # the MTP modules' layers, of the last layer's kind
    flags[stage][chunk] += moe_flags[-1:] * split.mtp_layers
    return tuple(tuple(chunks) for chunks in flags)


def _checked_chunks(layers: int, pp: int, split: PipelineSplit) -> int:
    """The chunks a stage holds (v), once more slices than layers (and counted units) are refused: here too, where
    ``check_split`` has not run yet (the planner splits a pinned PP before it checks the layout), so that a PP of 2³¹
    is a line, not 2³¹ empty slices."""
    v = split.chunks
    if pp * v > layers + split.units and split.pipeline_layout is None:  # a layout may name a part of no layer
        chunks = f"PP × virtual stages = {pp * v}" if v > 1 else f"PP={pp}"
        raise LmcalcError(f"{chunks} exceeds the {layers} layers: each stage's chunk builds at least one")
    return v


def slice_sizes(layers: int, pp: int, split: PipelineSplit) -> tuple[int, ...]:
    """The layers of each of the p·v slices, in the model's order (slice g is chunk g // p of stage g % p)."""
    v = _checked_chunks(layers, pp, split)
    if split.pipeline_layout is not None:  # every part's decoder layers, as named
        return layout_slices(split.pipeline_layout, pp * v)
    if split.stage_layers_given:  # each stage's share, split evenly over its chunks
        stages = _layer_counts(layers, pp, split.first_stage_layers, split.last_stage_layers)
        return tuple(stages[g % pp] // v for g in range(pp * v))
    # the layers and the counted units dealt over the p·v slices, the counted units at the two ends
    base, extra = divmod(layers + split.units, pp * v)
    return tuple(base + (1 if g < extra else 0) - int(split.embedding_in_split and g == 0)
                 - int(split.loss_in_split and g == pp * v - 1) for g in range(pp * v))  # fmt: skip


@functools.cache
def _chunk_mixes(
    layers: int, moe_flags: tuple[bool, ...], pp: int, split: PipelineSplit
) -> tuple[tuple[Mix, ...], ...]:
    _checked_chunks(layers, pp, split)
    mixes: list[list[Mix]] = [[] for _ in range(pp)]
    start = 0
    for g, count in enumerate(slice_sizes(layers, pp, split)):  # slice g is chunk g // pp of stage g % pp
        moe = sum(moe_flags[start : start + count])
        mixes[g % pp].append((count - moe, moe))
        start += count
    if split.mtp_layers:  # the MTP modules' layers, of the last layer's kind, where they are built
        stage, chunk = mtp_place(pp, split)
        dense, moe = mixes[stage][chunk]
        n, routed = split.mtp_layers, moe_flags[-1]
        mixes[stage][chunk] = (dense + (0 if routed else n), moe + (n if routed else 0))
    return tuple(tuple(chunks) for chunks in mixes)


def _layer_counts(layers: int, pp: int, first: int | None, last: int | None) -> tuple[int, ...]:
    fixed = {stage: n for stage, n in ((0, first), (pp - 1, last)) if n is not None}
    others = [stage for stage in range(pp) if stage not in fixed]
    counts = dict(fixed)
    if others:
        base, extra = divmod(layers - sum(fixed.values()), len(others))
        counts.update({stage: base + (1 if i < extra else 0) for i, stage in enumerate(others)})
    return tuple(counts[stage] for stage in range(pp))


def held_in_flight(layout: Pipelined, stage: int, chunk_bytes: tuple[float, ...]) -> tuple[float, tuple[int, ...]]:
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
    p, v, m = layout.pp, layout.split.chunks, layout.grad_accum
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


def interleaved_passes_held(layout: Pipelined, stage: int) -> int:
    """Chunk forward passes a GPU of ``stage`` has run and not yet run backward when its steady state begins
    under the interleaved schedule: Megatron-LM's warm-up, 2·(p − 1 − i) + (v − 1)·p, and the first steady
    forward pass; all m·v if the warm-up covers them."""
    p, v, m = layout.pp, layout.split.chunks, layout.grad_accum
    return min(m * v, 2 * (p - stage - 1) + (v - 1) * p + 1)
