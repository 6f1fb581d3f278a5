"""CPM-Ant's prompt (``specs.PromptSpec``; Han et al. 2022; transformers' CpmAntModel): the tensors it adds, and the
FLOPs of a model whose layers also compute the P prompt tokens prepended to every sequence of s. ``engine.model``'s
counts take them from here."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields, replace
from typing import TYPE_CHECKING, TypeVar

from lmcalc.engine.model.tensors import Dim, Site, WeightTensor, tensor
from lmcalc.specs import ModelSpec

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

Flops = TypeVar("Flops", bound="DataclassInstance")
"""``engine.model.flops.ForwardFlops``: FLOPs by where they are spent, the logits among them."""


def prompt_tensors(spec: ModelSpec) -> list[WeightTensor]:
    """The prompts' rows in the embedding (T prompts of P rows, h wide), the segment embedding (n_seg × h), and the
    score bias table shared by the layers ((n_seg² + buckets) × H: CpmAntSegmentPositionEmbedding)."""
    p = spec.prompt
    if p is None:
        return []
    h, embedding = Dim(spec.hidden_size, "h"), Site("embedding", 1, "1")
    rows = Dim(p.segments**2 + p.buckets, "(n_seg²+n_b)")
    return [
        tensor("embed.prompt_rows", embedding, (Dim(p.types * p.length, "T·P"), h), False),
        tensor("segment_embed.weight", embedding, (Dim(p.segments, "n_seg"), h), False),
        tensor("position_bias.weight", Site("position", 1, "1"), (rows, Dim(spec.num_heads, "H")), False),
    ]


def prefixed(spec: ModelSpec, seq_len: int, forward: Callable[[int], Flops]) -> Flops:
    """Forward FLOPs per token of the s tokens a sequence holds where every layer also computes the P prompt tokens
    before them: the layers' FLOPs per token of s + P, times (s + P)/s; the logits of the s alone."""
    p = spec.prompt
    if p is None:
        return forward(seq_len)
    whole = seq_len + p.length
    fwd = forward(whole)
    scale = whole / seq_len
    scaled = {f.name: getattr(fwd, f.name) * (1 if f.name == "logits" else scale) for f in fields(fwd)}
    return replace(fwd, **scaled)
