"""What GIT's training step keeps for backward (Wang et al. 2022, *GIT: A Generative Image-to-text Transformer*;
transformers 5.24's GitForCausalLM), an image a sequence (``specs.ImagePrefixSpec``), as ``engine.model.prefix``
counts its FLOPs: its CLIP image encoder (GitVisionModel: a patch convolution, a pre-norm, L_v pre-norm layers with
quick-GELU MLPs, a post-norm), trained with the decoder, and the projection to the decoder's width (GitProjection: a
linear layer and a LayerNorm); then the decoder layers over the P image tokens and the s text tokens, each a layer of
lmcalc's over s + P tokens (``decoder_workload``: GIT's mask makes the image's block bidirectional, which changes
which scores are masked, not what eager attention keeps); the head over all s + P positions, the loss over the text's.
The text's embedding, its norm and dropout are the s text tokens' (``engine.memory.outside_layers``)."""

from __future__ import annotations

import functools
from dataclasses import replace

from lmcalc.engine.memory.norms import norm_saved
from lmcalc.engine.memory.saved import LOGSUMEXP_BYTES, SavedTensor
from lmcalc.engine.model.tensors import Dim
from lmcalc.engine.workload import Workload
from lmcalc.specs import ModelSpec

QUICK_GELU_KEPT = 2  # x·σ(1.702·x), op by op (QuickGELUActivation): the product keeps x and the sigmoid's output


@functools.lru_cache(maxsize=1024)
def decoder_workload(w: Workload) -> Workload:
    """The workload GIT's decoder layers run: sequences of s + P tokens, the image's before the text's, of a model
    without the image encoder (so that what reads it counts the layers once); ``w`` itself for any other model."""
    m = w.model.image_prefix
    if m is None:
        return w
    return replace(w, model=w.model.model_copy(update={"image_prefix": None}), seq_len=w.seq_len + m.prefix)


def image_encoder_trained(spec: ModelSpec, w: Workload) -> bool:
    """Whether the step trains the image encoder: under full training, as GIT trains it; under LoRA and the other
    methods lmcalc's adapters are the decoder's, and the encoder, frozen, reads pixels that need no gradient."""
    return spec.image_prefix is not None and w.method.kind == "full"


def image_encoder_saved(w: Workload) -> list[SavedTensor]:
    """What the image encoder and the projection keep for backward, for the b·images images of a micro-batch of n
    tokens each (v wide, H_v heads, an MLP of f_v): the patch convolution its input, the pixels cast to the model's
    dtype (C·I² a image); each LayerNorm what lmcalc's norms keep (the pre- and post-norms, two a layer, the
    projection's over h); a layer, with eager attention, the projections' input, Q, K and V, the softmax's fp32
    output and its cast (siglip's eager_attention_forward), the output projection's input, the MLP's input, quick
    GELU's input and sigmoid output, and fc2's input; with a fused kernel its output and log-sum-exp in place of
    the scores; under full recomputation a layer keeps its input alone (GitVisionEncoderLayer is a checkpointed
    layer: rebuilt after the decoder's backward, once its tensors are freed). The projection keeps its input, the
    post-norm's output. Nothing where the encoder is frozen."""
    m = w.model.image_prefix
    if m is None or not image_encoder_trained(w.model, w):
        return []
    act, images = w.precision.activation_bytes, w.micro_batch * m.images
    rows, width = Dim(images * m.tokens, "n·b"), Dim(m.width, "v")
    nbv, nbf = rows.size * m.width, rows.size * m.ffn_size
    pixels = images * m.channels * m.image**2
    tensors = [SavedTensor("image encoder: the pixels in the model's dtype (patch convolution input)", "b·C·I²",
                           pixels, act, split="none")]  # fmt: skip
    tensors += norm_saved(w, "image encoder pre-norm", rows, width, "none")
    if w.recompute == "full":
        layer = [SavedTensor("image encoder layer input (checkpointed)", "n·b·v", nbv, act, split="none")]
    else:
        layer = _encoder_layer_saved(w, rows, width, nbv, nbf)
    tensors += [replace(t, label=f"{t.label}, {m.layers} layers", symbol=f"L_v·{t.symbol}",
                        elements=m.layers * t.elements) for t in layer]  # fmt: skip
    tensors += norm_saved(w, "image encoder post-norm", rows, width, "none")
    tensors.append(SavedTensor("projection input (post-norm output)", "n·b·v", nbv, act, split="none"))
    tensors += norm_saved(w, "projection norm", rows, Dim(w.model.hidden_size, "h"), "none")
    return tensors


def _encoder_layer_saved(w: Workload, rows: Dim, width: Dim, nbv: float, nbf: float) -> list[SavedTensor]:
    """One image encoder layer's tensors, without recomputation (``image_encoder_saved``)."""
    m, act = w.model.image_prefix, w.precision.activation_bytes
    assert m is not None
    scores = w.micro_batch * m.images * m.heads * m.tokens**2
    if w.attention == "eager":  # siglip's eager_attention_forward: softmax in fp32, its cast read by the matmul
        core = [SavedTensor("image encoder softmax output (fp32)", "b·H_v·n²", scores, 4, split="none"),
                SavedTensor("image encoder softmax output, cast", "b·H_v·n²", scores, act, split="none")]  # fmt: skip
    else:  # a fused kernel: its output (the output projection reads a copy) and log-sum-exp
        core = [SavedTensor("image encoder attention output (kept by the kernel)", "n·b·v", nbv, act, split="none"),
                SavedTensor("image encoder log-sum-exp (fp32)", "b·H_v·n", scores / m.tokens, LOGSUMEXP_BYTES,
                            split="none")]  # fmt: skip
    return [
        *norm_saved(w, "image encoder attention norm", rows, width, "none"),
        SavedTensor("image encoder Q/K/V input (norm output)", "n·b·v", nbv, act, split="none"),
        SavedTensor("image encoder Q, K and V", "3·n·b·v", 3 * nbv, act, split="none"),
        *core,
        SavedTensor("image encoder output projection input", "n·b·v", nbv, act, split="none"),
        *norm_saved(w, "image encoder MLP norm", rows, width, "none"),
        SavedTensor("image encoder MLP input (norm output)", "n·b·v", nbv, act, split="none"),
        SavedTensor("image encoder quick GELU: input and σ(1.702·x)", "2·n·b·f_v", QUICK_GELU_KEPT * nbf, act,
                    split="none"),
        SavedTensor("image encoder fc2 input (quick GELU output)", "n·b·f_v", nbf, act, split="none"),
    ]  # fmt: skip


def head_rows(w: Workload) -> tuple[int, str]:
    """The rows the output head reads: GIT's runs on every position, the image's too, (s + P)·b; else s·b."""
    m = w.model.image_prefix
    return ((w.seq_len + m.prefix) * w.micro_batch, "(s+P)·b") if m else (w.tokens, "s·b")


def image_logits_bytes(w: Workload) -> float:
    """The logits of the image's positions, (P·b·V in the activation dtype), which GIT's head computes and its loss
    slices away (``logits[:, P:-1]``): alive with the loss's own tensors at the end of the forward."""
    m = w.model.image_prefix
    return m.prefix * w.micro_batch * w.model.vocab_size * w.precision.activation_bytes if m else 0.0
