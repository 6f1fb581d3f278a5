"""A parallel layout: how one training step is spread over GPUs (whether it can exist for a workload and a cluster:
``engine.parallel.layout_checks``).

Data parallelism (DP, with ZeRO sharding over it), tensor parallelism (TP, with or without sequence
parallelism), pipeline parallelism (PP, with its split of the layers, ``engine.parallel.pipeline.PipelineSplit``),
context parallelism (CP) and expert parallelism (EP); DP·TP·PP·CP is the number of GPUs. The routed experts have
a grid of their own over the same TP·CP·DP GPUs of a stage (Megatron-Core's MoE parallel folding,
parallel_state.py: ``expert_decoder_rank_generator``): expert TP (ETP, TP unless set) splits each expert's
matrices, EP spreads the experts, and the EDP = TP·CP·DP / (ETP·EP) copies left are the experts' data-parallel
replicas, which reduce the experts' gradients and over which ZeRO shards their states.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field, fields
from typing import Any, NamedTuple

from lmcalc.engine.choices import ZERO_STAGES, ZeroStage, one_of, positive_integer
from lmcalc.engine.parallel.pipeline import PipelineSplit, Stages
from lmcalc.errors import LmcalcError, setting


class ActivationLayout(NamedTuple):
    """The part of a layout one GPU's activations depend on: how TP (with or without sequence parallelism) and
    CP split each tensor, and the pipeline that sets how many micro-batches each stage holds. DP, EP and ZeRO
    do not change them, so layouts that differ only there share their activations."""

    tp: int
    sequence_parallel: bool
    cp: int
    pp: int
    grad_accum: int
    split: PipelineSplit

    @property
    def stages(self) -> Stages:
        return Stages(self.pp, self.split)


class Grid(NamedTuple):
    """How tensor, context and expert parallelism split one micro-batch's work on a GPU: TP (with sequence
    parallelism, which only TP > 1 has to split), CP, EP and expert TP (ETP). A micro-batch's kernels and the
    collectives it waits for depend on these and the stage's layers, not on DP, PP or ZeRO, so layouts that differ
    only there share them."""

    tp: int = 1
    cp: int = 1
    ep: int = 1
    sequence_parallel: bool = False
    etp: int = 1  # the routed experts' TP (Layout.expert_tp)


class ModelSplit(NamedTuple):
    """How TP and EP split the weights one GPU holds, before ZeRO: TP the dense matrices, ETP each routed expert's
    and EP the routed experts among the GPUs."""

    tp: int = 1
    ep: int = 1
    etp: int = 1


class StateShards(NamedTuple):
    """How a stage's model states are spread over its GPUs: TP splits the matrices, ETP the routed experts' and
    EP the experts, and ZeRO stage ``zero`` shards them over the data-parallel copies: ``replicas`` (DP · CP) of the
    dense ones, ``expert_replicas`` (EDP) of the experts. The micro-batch, the pipeline's schedule and recomputation
    do not change them."""

    tp: int = 1
    ep: int = 1
    zero: ZeroStage = 0
    replicas: int = 1
    etp: int = 1
    groups: int = 1  # HSDP: ZeRO shards over each of these groups of the replicas and the groups hold copies
    outer: bool = False  # HSDP: the optimizer's states and master weights sharded across the groups too (HFSDP)

    @property
    def split(self) -> ModelSplit:
        return ModelSplit(self.tp, self.ep, self.etp)

    @property
    def expert_replicas(self) -> int:
        """EDP = TP·CP·DP / (ETP·EP): the copies of each routed expert (``replicas`` / EP when ETP = TP)."""
        return max(1, self.replicas * self.tp // (self.etp * self.ep))

    @property
    def shard(self) -> int:
        """The dense replicas ZeRO shards a state over: DP·CP, or under HSDP one group of them (DP·CP / groups)."""
        return self.replicas // self.groups

    @property
    def expert_shard(self) -> int:
        """The experts' replicas ZeRO shards a state over: EDP, or under HSDP one group of them (EDP / groups)."""
        return max(1, self.expert_replicas // self.groups)

    def shards_of(self, state: str) -> tuple[int, int]:
        """The (dense, expert) replicas ZeRO shards ``state`` over: one HSDP group's, or all of them for the
        optimizer's states and the master weights where HFSDP shards those across the groups too."""
        if self.outer and state in ("master", "optimizer"):
            return self.replicas, self.expert_replicas
        return self.shard, self.expert_shard


@dataclass(frozen=True, slots=True)  # slots: the planner makes hundreds of thousands
class Layout:
    """How a training step is spread over GPUs; the product dp·tp·pp·cp is the number of GPUs."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    zero: ZeroStage = 0
    sequence_parallel: bool = False
    grad_accum: int = 1  # micro-batches per step
    etp: int | None = None  # the routed experts' TP (Megatron-Core's expert_tensor_parallel_size); None: TP
    split: PipelineSplit = PipelineSplit()
    hsdp: int = 1  # HSDP's replica groups: ZeRO shards over DP·CP / hsdp GPUs, and each group holds a copy
    hsdp_shard_optimizer: bool = False  # HFSDP: the optimizer's states and master weights over all of DP·CP
    # its views, what each family of figures depends on (the caches' keys), made when first asked for: a layout
    # sent back from a search's worker process (``__reduce__``) may never be asked
    _views: tuple[ActivationLayout, Grid, StateShards, Stages] | None = field(
        init=False, repr=False, compare=False, default=None
    )
    _hash: int = field(init=False, repr=False, compare=False, default=0)

    def __post_init__(self) -> None:
        degrees = (self.dp, self.tp, self.pp, self.cp, self.ep, self.grad_accum)
        if set(map(type, degrees)) != {int} or min(degrees) < 1:  # at once: the planner makes millions of layouts
            for name, value in zip(("dp", "tp", "pp", "cp", "ep", "grad_accum"), degrees, strict=True):
                if not positive_integer(value):
                    raise LmcalcError(f"{setting(name)} must be a positive integer, got {value}")
        if self.zero not in ZERO_STAGES:
            raise LmcalcError(f"{setting('zero')} must be {one_of(ZERO_STAGES)}, got {self.zero}")
        if self.hsdp != 1 and not positive_integer(self.hsdp):
            raise LmcalcError(f"{setting('hsdp')} must be a positive integer, got {self.hsdp}")
        if not isinstance(self.hsdp_shard_optimizer, bool):
            raise LmcalcError(
                f"{setting('hsdp_shard_optimizer')} must be true or false, got {self.hsdp_shard_optimizer}"
            )
        if self.etp is not None:
            if not positive_integer(self.etp):
                raise LmcalcError(f"{setting('etp')} must be a positive integer, got {self.etp}")
            if self.etp == self.tp:  # the default, spelt out: one layout, one hash
                object.__setattr__(self, "etp", None)
        object.__setattr__(self, "_hash", _layout_hash(self))

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        """Pickled as its fields, checked already: a copy made in another process (another hash seed) hashes anew
        and makes its views when asked."""
        return _unpickled, _init_values(self)

    def _made_views(self) -> tuple[ActivationLayout, Grid, StateShards, Stages]:
        tp, cp, split, etp = self.tp, self.cp, self.split, self.expert_tp
        views = (
            ActivationLayout(tp, self.sequence_parallel, cp, self.pp, self.grad_accum, split),
            Grid(tp, cp, self.ep, self.sequence_parallel and tp > 1, etp),
            StateShards(tp, self.ep, self.zero, self.dp * cp, etp, self.hsdp, self.hsdp_shard_optimizer),
            Stages(self.pp, split),
        )
        object.__setattr__(self, "_views", views)
        return views

    # Four plain properties, read millions of times a search: a typed descriptor for them measured 1–2 % slower in the
    # DeepSeek-V3 search, and a __getattr__ (any at all makes every attribute read of the class go through it) 5–7 %
    @property
    def activation_layout(self) -> ActivationLayout:
        return (self._views or self._made_views())[0]

    @property
    def grid(self) -> Grid:
        return (self._views or self._made_views())[1]

    @property
    def state_shards(self) -> StateShards:
        return (self._views or self._made_views())[2]

    @property
    def stages(self) -> Stages:
        return (self._views or self._made_views())[3]

    @property
    def gpus(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    @property
    def data_replicas(self) -> int:
        """Copies of the dense model states that ZeRO can shard over: DP · CP."""
        return self.dp * self.cp

    @property
    def expert_tp(self) -> int:
        """ETP: over how many GPUs each routed expert's matrices are split (TP unless ``etp`` says otherwise)."""
        return self.tp if self.etp is None else self.etp

    @property
    def folded(self) -> bool:
        """Whether the experts' grid differs from attention's (ETP ≠ TP): Megatron-Core's MoE parallel folding."""
        return self.etp is not None

    @property
    def label(self) -> str:
        parts = [
            f"DP={self.dp}",
            f"TP={self.tp}",
            f"PP={self.pp}",
            f"CP={self.cp}",
            f"EP={self.ep}",
            *([f"ETP={self.etp}"] if self.etp is not None else []),
            f"ZeRO-{self.zero}",
            *(
                [f"HSDP={self.hsdp}" + (" (optimizer over all)" if self.hsdp_shard_optimizer else "")]
                if self.hsdp > 1
                else []
            ),
        ]
        if self.sequence_parallel:
            parts.append("SP")
        return ", ".join(parts + self.split.label_parts(self.pp))

    @property
    def code(self) -> str:
        """The label in a table's narrow column: ``DP64 TP4 PP16 Z1 SP v4`` (a degree of 1, ZeRO-0 and 1F1B
        left out; ``LAYOUT_CODE_KEY`` says how to read it)."""
        parts = [f"DP{self.dp}"]
        parts += [
            f"{name}{n}" for name, n in (("TP", self.tp), ("PP", self.pp), ("CP", self.cp), ("EP", self.ep)) if n > 1
        ]
        parts += [f"ETP{self.etp}"] if self.etp is not None else []
        parts += [f"Z{self.zero}"] if self.zero else []
        parts += [f"H{self.hsdp}" + ("o" if self.hsdp_shard_optimizer else "")] if self.hsdp > 1 else []
        parts += ["SP"] if self.sequence_parallel else []
        return " ".join(parts + self.split.code_parts(self.pp))


def _layout_hash(layout: Layout) -> int:
    return hash(
        (layout.dp, layout.tp, layout.pp, layout.cp, layout.ep, layout.grad_accum, layout.zero,
         layout.sequence_parallel, layout.split, layout.etp, layout.hsdp, layout.hsdp_shard_optimizer)
    )  # fmt: skip


LayoutFields = tuple[int, int, int, int, int, ZeroStage, bool, int, "int | None", PipelineSplit, int, bool]
"""A layout's fields in their order: DP, TP, PP, CP, EP, ZeRO, sequence parallelism, gradient accumulation, ETP
(None where it is TP), the pipeline split, HSDP's replica groups and whether HFSDP shards the optimizer across them."""


def checked_layout(values: LayoutFields) -> Layout:
    """The layout of ``values``, fields known to be valid: made without ``__post_init__``'s checks and the dataclass's
    keyword ``__init__``, 1.3 µs against 4.7 (the planner makes 278,000 for DeepSeek-V3 on 2,048 H800, from degrees
    it has checked; a search's worker sends back 170,000). The same layout as ``Layout(...)`` makes, to the hash."""
    dp, tp, pp, cp, ep, zero, sequence_parallel, grad_accum, etp, split, hsdp, hsdp_optimizer = values
    layout, set_field = _new(Layout), _set_field
    set_field(layout, "dp", dp)
    set_field(layout, "tp", tp)
    set_field(layout, "pp", pp)
    set_field(layout, "cp", cp)
    set_field(layout, "ep", ep)
    set_field(layout, "zero", zero)
    set_field(layout, "sequence_parallel", sequence_parallel)
    set_field(layout, "grad_accum", grad_accum)
    set_field(layout, "etp", etp)
    set_field(layout, "split", split)
    set_field(layout, "hsdp", hsdp)
    set_field(layout, "hsdp_shard_optimizer", hsdp_optimizer)
    set_field(layout, "_views", None)
    set_field(layout, "_hash", hash((dp, tp, pp, cp, ep, grad_accum, zero, sequence_parallel, split, etp, hsdp,
                                     hsdp_optimizer)))  # fmt: skip
    return layout


_new, _set_field = object.__new__, object.__setattr__


def _unpickled(*values: Any) -> Layout:
    """A pickled layout again, its fields set as they were (``Layout.__reduce__``), without checking them anew."""
    return checked_layout(values)


_INIT_FIELDS = tuple(f.name for f in fields(Layout) if f.init)
_init_values = operator.attrgetter(*_INIT_FIELDS)  # its fields in order, at once: a search pickles 170,000


LAYOUT_CODE_KEY = (
    "DP/TP/PP/CP/EP: the degrees (1 left out); ETP: the experts' TP where it is not TP; Z: the ZeRO stage; H: HSDP's "
    "replica groups (o: the optimizer sharded across them); SP: sequence parallel; v: virtual stages (interleaved); "
    "f/l: layers on the first/last stage; +emb/+loss: counted as a layer"
)
