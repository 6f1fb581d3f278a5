"""Tokens before the text: CPM-Ant's prompt (``specs.PromptSpec``; Han et al. 2022; transformers' CpmAntModel), the
tensors it adds; GIT's image tokens (``specs.ImagePrefixSpec``; Wang et al. 2022), its image encoder's FLOPs; and the
FLOPs of a model whose layers also compute the P tokens prepended to every sequence of s. ``engine.model``'s counts
take them from here."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields, replace
from typing import TYPE_CHECKING, TypeVar

from lmcalc.engine.model.tensors import Dim, Site, WeightTensor, tensor
from lmcalc.result import Term
from lmcalc.specs import ModelSpec
from lmcalc.units import group

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


def prefix_tokens(spec: ModelSpec) -> int:
    """P, the tokens every layer computes before a sequence's own: a prompt's, or the images'."""
    if spec.prompt:
        return spec.prompt.length
    return spec.image_prefix.prefix if spec.image_prefix else 0


def image_encoder_flops(spec: ModelSpec) -> tuple[float, float]:
    """Forward FLOPs per sequence of GIT's image encoder (GitVisionModel, GitProjection), and of them its patch
    embedding's: for each image of n tokens, the patch embedding 2·C·p²·v a patch (n − 1), each layer's q, k, v, o and
    MLP 2·(4·v² + 2·v·f_v) a token and its attention over the n tokens, 2·2·n·v a token, and the projection to the
    decoder, 2·v·h a token."""
    m = spec.image_prefix
    if m is None:
        return 0.0, 0.0
    n, v = m.tokens, m.width
    stem = 2 * m.channels * m.patch**2 * v * (n - 1)
    layer = 2 * n * (4 * v * v + 2 * v * m.ffn_size) + 4 * n * n * v
    return m.images * (stem + m.layers * layer + 2 * n * v * spec.hidden_size), m.images * stem


def prefixed(spec: ModelSpec, seq_len: int, forward: Callable[[int], Flops]) -> Flops:
    """Forward FLOPs per token of the s tokens a sequence holds where every layer also computes the P tokens before
    them: the layers' FLOPs per token of s + P, times (s + P)/s; the logits of the s alone (CPM-Ant's head) or of all
    s + P (GIT's); and an image encoder's FLOPs a sequence, over its s tokens."""
    P = prefix_tokens(spec)
    if not P:
        return forward(seq_len)
    whole = seq_len + P
    fwd = forward(whole)
    scale = whole / seq_len
    every = spec.image_prefix is not None  # GIT's head runs on the image's positions too
    scaled = {f.name: getattr(fwd, f.name) * (scale if f.name != "logits" or every else 1) for f in fields(fwd)}
    if every:
        encoder, stem = image_encoder_flops(spec)
        scaled |= {"encoder": encoder / seq_len, "stem": stem / seq_len}
    return replace(fwd, **scaled)


def prefix_note(spec: ModelSpec, seq_len: int) -> str:
    """What the forward rows count of the tokens before the text; "" where there are none."""
    P = prefix_tokens(spec)
    if not P:
        return ""
    what = f"the prompt's {P} tokens" if spec.prompt else f"the images' {P} tokens"
    head = "; the head too" if spec.image_prefix else "; the head reads the s alone"
    return (f"every layer also computes {what} before the s = {seq_len}: its rows count (s + P)/s = "
            f"{(seq_len + P) / seq_len:.4g} of a token's, at s + P keys{head}")  # fmt: skip


def encoder_terms(spec: ModelSpec, encoder: float, seq_len: int) -> tuple[Term, ...]:
    """GIT's image encoder row: its forward FLOPs a sequence, over the sequence's s tokens."""
    m = spec.image_prefix
    if m is None:
        return ()
    n, v = m.tokens, m.width
    return (
        Term("encoder", "Image encoder (fwd, per token)", encoder, "FLOPs",
             "images · (2·C·p²·v·(n−1) + L_v·(2·n·(4·v² + 2·v·f_v) + 4·n²·v) + 2·n·v·h) / s",
             f"{m.images} × (2·{m.channels}·{m.patch}²·{v}·{n - 1} + {m.layers}·(2·{n}·(4·{v}² + 2·{v}·{m.ffn_size}) "
             f"+ 4·{n}²·{v}) + 2·{n}·{v}·{spec.hidden_size}) / {seq_len}", "Wang et al. 2022 (GIT)",
             note=f"{group(image_encoder_flops(spec)[0])} FLOPs an image sequence; trained with the decoder, its "
             "patch embedding's backward the weight's alone (the pixels need no gradient)"),
    )  # fmt: skip


def image_encoder_params(spec: ModelSpec) -> int:
    """GIT's image encoder and projection's parameters (GitVisionModel, GitProjection), held beside the decoder's
    by the GPU that embeds: the class embedding (v), the patch convolution without a bias (C·p²·v), the positions
    (n·v), the pre- and post-norms (2·v each), each layer's q, k, v and output projections with biases
    (4·(v² + v)), two norms (4·v) and MLP (2·v·f_v + f_v + v), the projection to h with its bias and its norm
    (v·h + 3·h), and a temporal embedding a frame where a sequence reads several (v each); 0 without one."""
    m = spec.image_prefix
    if m is None:
        return 0
    v, f, h = m.width, m.ffn_size, spec.hidden_size
    layer = 4 * (v * v + v) + 4 * v + 2 * v * f + f + v
    embeddings = v + m.channels * m.patch**2 * v + m.tokens * v
    frames = m.images * v if m.images > 1 else 0
    return embeddings + 4 * v + m.layers * layer + v * h + 3 * h + frames
