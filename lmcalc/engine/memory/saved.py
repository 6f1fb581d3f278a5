"""A tensor kept for the backward pass, as every activation count in ``engine.memory`` lists it: its elements, bytes,
which parallel ranks split it, and which weights' gradients need it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lmcalc.engine.parallel.layout import ActivationLayout, Layout

LOGSUMEXP_BYTES = 4  # FlashAttention keeps the per-row log-sum-exp in fp32 (Dao et al. 2022 Alg. 1)
ROUTED = "experts."  # a routed expert's weight in ``SavedTensor.for_weights``, apart from a shared expert's of its leaf


@dataclass(frozen=True)
class SavedTensor:
    """A tensor kept for the backward pass: ``elements`` of ``bytes_per_element`` each."""

    label: str
    symbol: str
    elements: float
    bytes_per_element: float
    attention_core: bool = False  # recomputed under selective recomputation
    split: str = "tp"  # "tp": split over tensor-parallel ranks; "seq": only with sequence parallelism; "none": by
    # neither, but by CP over the sequence as all are; "whole": by nothing (a weight's copy, on every GPU)
    block: str = "attention"  # what keeps it: a layer's "attention" or "mlp" half (its norm included), or
    # outside the layers, the "embedding" side, the "head" side (final norm, output head, loss), or the rotary
    # "tables" every stage makes once per micro-batch
    most_tp_ranks: int | None = None  # K and V: their H_kv heads; more TP ranks share a head (``tp_ways``)
    for_weights: tuple[str, ...] = ()  # kept only for these modules' weight gradients (a linear layer's input,
    # a norm's normalised value): a frozen module does not keep it (``engine.finetune.method``)
    routed: bool = False  # kept by the routed experts' MLP (their grouped GEMMs and activation; module_offload)

    @property
    def bytes(self) -> float:
        return self.elements * self.bytes_per_element

    def ways(self, layout: Layout | ActivationLayout) -> int:
        """Over how many GPUs of ``layout`` the tensor is split: CP's ways, times TP's where TP splits it (attention and
        MLP internals always, the rest of a layer's tensors only under sequence parallelism)."""
        by_tp = self.split == "tp" or (self.split == "seq" and layout.sequence_parallel)
        return self.cp_ways(layout.cp) * (self.tp_ways(layout.tp) if by_tp else 1)

    def cp_ways(self, cp: int) -> int:
        """Over how many of ``cp`` context-parallel ranks the tensor is split: all of them, as the sequence is, but
        for a weight's copy (``split`` whole), which every GPU keeps."""
        return 1 if self.split == "whole" else cp

    def tp_ways(self, tp: int) -> int:
        """Over how many of ``tp`` tensor-parallel ranks the tensor is split, when TP splits it: all of them, or
        for K and V at most their H_kv heads, since past them each rank keeps one whole KV head (Megatron-Core
        core_v0.16.1, megatron/core/transformer/attention.py:289-293 and 1398-1411: the fused Q/K/V output is
        all-gathered over TP and each rank slices out its group's K and V; ``layout_checks.check_tp_heads``)."""
        return min(tp, self.most_tp_ranks) if self.most_tp_ranks else tp


def saved_formula(tensors: tuple[SavedTensor, ...] | list[SavedTensor]) -> str:
    """``8·s·b·h + 4·b·H·s² + ...``: bytes times element count, like terms merged."""
    counts: dict[tuple[str, float], float] = {}
    for t in tensors:
        counts[(t.symbol, t.bytes_per_element)] = counts.get((t.symbol, t.bytes_per_element), 0) + t.bytes_per_element
    return " + ".join(f"{total:g}·{symbol}" for (symbol, _), total in counts.items())
