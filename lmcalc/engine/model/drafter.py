"""Gemma 4's drafters for speculative decoding (``specs.DrafterSpec``; transformers' Gemma4AssistantForCausalLM,
Gemma4AssistantMaskedEmbedder): the projections from and to the backbone's width, the vocabulary's clusters, and what
training one runs that the counts of a model of its own would not: its logits from the chosen clusters alone, and
matmuls whose one input, the backbone's hidden state or K and V, needs no gradient."""

from __future__ import annotations

from lmcalc.engine.model.tensors import Dim, Site, WeightTensor, linear
from lmcalc.specs import ModelSpec


def drafter_tensors(spec: ModelSpec) -> list[WeightTensor]:
    """pre_projection (2·h_b → h: the backbone's hidden state beside the token's embedding), post_projection (h → h_b)
    and, with ordered embeddings, the clusters' scores (h → C); the head is the tied embedding."""
    d = spec.drafter
    if d is None:
        return []
    h, h_b, once = Dim(spec.hidden_size, "h"), d.backbone_width, Site("drafter", 1, "1")
    tensors = linear("pre_projection", once, h, Dim(2 * h_b, "2·h_b"), False)
    tensors += linear("post_projection", once, Dim(h_b, "h_b"), h, False)
    if d.centroids:
        tensors += linear("centroids", once, Dim(d.centroids, "C"), h, False)
    return tensors


def drafter_logits(spec: ModelSpec) -> float:
    """Forward FLOPs per token of the logits: the head's 2·h·V, or with clusters the k best clusters' rows alone,
    2·h·k·V/C (the masked embedder's product with the gathered rows; the other logits are filled, not computed)."""
    d = spec.drafter
    if d is None or not d.centroids:
        return 2 * spec.hidden_size * (spec.head_vocab or spec.vocab_size)  # Inkling 2's head: its unpadded rows
    return 2 * spec.hidden_size * d.top_centroids * (spec.vocab_size // d.centroids)


def frozen_inputs(spec: ModelSpec, attention_core: float) -> float:
    """Of a drafter's forward FLOPs per token, the matmuls whose one input needs no gradient, so that training runs
    them twice, not three times: pre_projection (the backbone's hidden state) and the attention core (QKᵀ and AV with
    the backbone's K and V: only the queries' and the probabilities' gradients)."""
    d = spec.drafter
    if d is None:
        return 0.0
    return 2 * 2 * d.backbone_width * spec.hidden_size + attention_core


def forward_alone(spec: ModelSpec) -> float:
    """Of a drafter's forward FLOPs per token, what a step's loss on its logits sends no gradient through:
    post_projection (its output feeds the next drafting step, not these logits) and the clusters' scores (their
    top-k picks rows, which carries no gradient)."""
    d = spec.drafter
    if d is None:
        return 0.0
    return 2 * spec.hidden_size * d.backbone_width + (2 * spec.hidden_size * d.centroids if d.centroids else 0)
