"""What a training step saves for backward outside the transformer layers: the token ids, the embedding's norm and
dropout, the final norm and the head's input, the logits the loss keeps, the rotary tables, and what gradient
checkpointing keeps alive for the rebuilt layers; and the input each checkpointed layer keeps
(``engine.memory.activations`` counts the layers)."""

from __future__ import annotations

import functools
from dataclasses import replace

from lmcalc.engine.finetune.method import adapted_modules
from lmcalc.engine.memory.activations import TOKEN_ID_BYTES, SavedTensor
from lmcalc.engine.memory.altup import altup_outside
from lmcalc.engine.memory.byte_latent import byte_latent_checkpoint_masks, byte_latent_saved, byte_latent_tables
from lmcalc.engine.memory.cca import cca_checkpoint, embedding_scaling_saved
from lmcalc.engine.memory.compressed import hyper_head_saved
from lmcalc.engine.memory.dots_mla import checkpoint_masks_kept
from lmcalc.engine.memory.dots_mla import rotary_tables as mla_tables
from lmcalc.engine.memory.image_prefix import decoder_workload, head_rows, image_encoder_saved
from lmcalc.engine.memory.inkling2 import (
    checkpoint_kept,
    final_residual_saved,
    fp32_norm_saved,
    inkling2,
    message_residual_saved,
)
from lmcalc.engine.memory.looped import stack_norms_saved
from lmcalc.engine.memory.masks import window_masked_share
from lmcalc.engine.memory.method_kept import needed
from lmcalc.engine.memory.ngpt import logit_scale_saved, loop_norms_saved, second_rotary_tables
from lmcalc.engine.memory.norms import norm_saved
from lmcalc.engine.memory.prompt_prefix import prompt_checkpoint, prompt_model_saved
from lmcalc.engine.memory.shared_block import shared_block_checkpointed
from lmcalc.engine.memory.widths import global_tables, per_layer_inputs_outside, shared_kv_kept
from lmcalc.engine.model.params import Dim
from lmcalc.engine.workload import Workload


@functools.lru_cache(maxsize=4096)
def model_saved_tensors(w: Workload) -> tuple[SavedTensor, ...]:
    """Saved tensors outside the layers: token ids, embedding dropout, final norm, head input, fp32 logits."""
    if w.model.prompt:  # CPM-Ant's: its ids, the score bias's buckets, its own loss (engine.memory.prompt_prefix)
        return prompt_model_saved(w)
    spec, act, sb = w.model, w.precision.activation_bytes, w.tokens
    h = spec.hidden_size
    embedding = [SavedTensor("token ids and targets (int64)", "2·s·b", 2 * sb, TOKEN_ID_BYTES, split="none")]
    if spec.embedding_norm and not w.method.adapters:  # BLOOM's LayerNorm on the embedding output (Inkling's RMSNorm);
        # under LoRA it and the embedding are frozen: its input needs no gradient, and it keeps nothing
        if inkling2(w):  # Inkling 2's weight multiplies the fp32 normalised value
            embedding += fp32_norm_saved(w, "embedding norm")
        else:
            embedding += norm_saved(w, "embedding norm", Dim(sb, "s·b"), Dim(h, "h"))
    if spec.drops("embedding"):
        embedding.append(SavedTensor("embedding dropout mask", "s·b·h", sb * h, w.mask_bytes, split="seq"))
    embedding += [t for t in embedding_scaling_saved(w) if needed(w, t, set())]  # ZAYA's, frozen under LoRA
    adapted = frozenset(m.leaf for m in adapted_modules(spec, w.method))
    embedding += per_layer_inputs_outside(w, adapted)  # Gemma 4's per-layer inputs, made before the layers
    embedding += altup_outside(w, spec.per_layer_input is not None, adapted)  # Gemma 3n's streams
    final = [] if spec.post_norm else norm_saved(w, "final norm", Dim(sb, "s·b"), Dim(h, "h"))  # GPT-1 has none
    final = hyper_head_saved(w) + final  # the hyper-connections' last collapse (DeepSeek-V4, HY V4)
    if inkling2(w):  # Inkling 2's last block residual, and its final norm's fp32 normalised value
        final = message_residual_saved(w) + final_residual_saved(w) + fp32_norm_saved(w, "final norm", block="head")
    if spec.head_transform:  # ModernBERT: dense (its input the final norm's output), GELU (a kernel: its input), norm
        final += [
            SavedTensor("head transform's dense input (final norm output)", "s·b·h", sb * h, act, split="seq"),
            SavedTensor("head transform's activation input (dense output)", "s·b·h", sb * h, act, split="seq"),
            *norm_saved(w, "head transform norm", Dim(sb, "s·b"), Dim(h, "h")),
        ]
    embedding += image_encoder_saved(w)  # GIT's image encoder and projection
    embedding += byte_latent_saved(w)  # BLT's encoder, patches, global transformer and cross-attention
    rows, symbol = head_rows(w)  # GIT's head reads the image's positions too
    head = [*final, SavedTensor("output head input", f"{symbol}·h", rows * h, act, split="seq",
                                for_weights=("lm_head",))]  # fmt: skip
    if w.method.kind != "full":  # a frozen final norm and head keep nothing for their weights' gradients
        head = [t for t in head if needed(w, t, set())]
    if w.framework.loss.fused_linear:  # the head's gradients made in the forward: its input's kept, not its input
        head = [t for t in head if t.label != "output head input"]
        head.append(SavedTensor("head input's gradient (made in the forward)", "s·b·h", sb * h, act, split="seq"))
    vocab = spec.head_vocab or spec.vocab_size  # the head's rows: Inkling 2's unpadded ones
    if spec.final_softcap:  # c·tanh(logits/c) (Gemma 2): tanh keeps its output, in the activation dtype (Beam: fp32)
        fp32 = spec.final_softcap_fp32
        head.append(SavedTensor(f"soft-capped logits (tanh output{', fp32' if fp32 else ''})", "s·b·V",
                                sb * vocab, 4 if fp32 else act))  # fmt: skip
    loss = w.framework.loss
    if loss.saved_bytes:
        head.append(SavedTensor("logits kept by the cross-entropy", "s·b·V", sb * vocab, loss.saved_bytes))
    head += logit_scale_saved(w)  # Dory's
    tables = []
    if w.framework.rotary.tables and spec.position_embedding == "rope":  # [1, 1, s, d_rope]: one per position
        # the dimensions RoPE rotates: transformers' default rope parameters take int(head_dim · partial factor)
        d = spec.mla.qk_rope_head_dim if spec.mla else int(spec.qk_head_dim * spec.rotary_fraction)
        tables = [
            SavedTensor(f"rotary {t} table", "s·d_rope", w.seq_len * d, act, split="none") for t in ("cos", "sin")
        ] + global_tables(w)
        tables = mla_tables(w) or tables  # dots.3 Note's: a pair for each kind of layer
        tables += second_rotary_tables(w, tables)  # Dory's: a pair for each kind of layer too
        tables += byte_latent_tables(w)  # BLT's encoder's and global transformer's pairs
    if w.framework.attention.checkpoint_keeps_mask and w.recompute == "full":
        tables += [replace(t, split="none") for t in _checkpoint_arguments(decoder_workload(w))] + shared_kv_kept(w)
        tables += checkpoint_masks_kept(w)  # dots.3 Note's indexed layers' mask
        tables += checkpoint_kept(w)  # Inkling 2's blocks' states and relative distances
        tables += byte_latent_checkpoint_masks(w)  # BLT's global transformer's
    embedding += shared_block_checkpointed(w)  # Zamba's: the embedding every use reads, under full recomputation
    embedding += stack_norms_saved(w)  # HRM's: each trained stack run's final norm but the model's last
    embedding += loop_norms_saved(w)  # Dory's: the input section's output and each loop's input, normalised
    return tuple(
        [replace(t, block="embedding") for t in embedding]
        + [replace(t, block="tables") for t in tables]
        + [replace(t, block="head") for t in head]
    )


@functools.lru_cache(maxsize=256)
def mtp_saved_tensors(w: Workload) -> tuple[tuple[SavedTensor, ...], tuple[SavedTensor, ...]]:
    """What one trained multi-token-prediction module saves beyond its layer's (DeepSeek-V3 §2.2; Megatron-Core's
    ``MultiTokenPredictionLayer``): where it is built, the norms of the next tokens' embedding and of the hidden
    state and the projection's input (their concatenation, 2h wide), or under full recomputation, which checkpoints
    the module whole, the embedding beside the hidden state; on the last stage, its final norm, the head's input and
    the logits the loss keeps, as the model's own head keeps them (alive with the model's: its backward runs after)."""
    sb, h, act, hc = w.tokens, w.model.hidden_size, w.precision.activation_bytes, w.model.hyper_connections
    rows, width = Dim(sb, "s·b"), Dim(h, "h")
    module = [*norm_saved(w, "MTP embedding norm", rows, width)]
    if hc is None:
        module += norm_saved(w, "MTP hidden norm", rows, width)
        module.append(SavedTensor("MTP projection input (the norms' outputs)", "s·b·2h", 2 * sb * h, act, split="seq"))
    else:  # mHC: the streams normed stream by stream, each norm's output its own projection's input
        module += norm_saved(w, "MTP streams' norm", Dim(hc.streams * sb, "n·s·b"), width)
        module += [SavedTensor("MTP e_proj input (the embedding's norm output)", "s·b·h", sb * h, act, split="seq"),
                   SavedTensor("MTP h_proj input (the streams' norm output)", "n·s·b·h", hc.streams * sb * h, act,
                               split="seq")]  # fmt: skip
    if w.recompute == "full":  # the module checkpointed whole: its two inputs, the hidden state its layer's checkpoint
        module = [SavedTensor("MTP checkpoint: the next tokens' embedding", "s·b·h", sb * h, act, split="seq")]
    head = [replace(t, label=f"MTP {t.label}") for t in model_saved_tensors(w) if t.block == "head"]
    if hc is not None:  # its own collapse, learned_output_contract in fp32 op by op, where the model's is fused or not
        head = [t for t in head if not t.label.startswith("MTP last collapse:")] + _mtp_collapse_saved(w, hc.streams)
    return tuple(module), tuple(head)


def _mtp_collapse_saved(w: Workload, n: int) -> list[SavedTensor]:
    """An MTP module's collapse of its layer's n streams (Megatron-Core's ``learned_output_contract`` at cae55c1f09):
    the streams' fp32 copy (the square's and the weighted sum's operand), 1/rms, and the projection's n outputs, their
    product with 1/rms, the sigmoid and the weights, each fp32."""
    t, h = w.tokens, w.model.hidden_size
    return [SavedTensor("MTP collapse: streams, fp32 copy", "s·b·n·h", t * n * h, 4, split="seq", block="head"),
            SavedTensor("MTP collapse: norm 1/rms (fp32)", "s·b", t, 4, split="seq", block="head"),
            SavedTensor("MTP collapse: projection, scaled, sigmoid and weights (fp32)", "4·s·b·n", 4 * t * n, 4,
                        split="seq", block="head")]  # fmt: skip


def _checkpoint_arguments(w: Workload) -> list[SavedTensor]:
    """The layers' keyword arguments that gradient checkpointing keeps alive until the rebuilt layers have run
    (the profile's ``attention.checkpoint_keeps_mask``): with eager attention the additive mask of each kind of
    layer the model has (global and sliding: one each, made apart; one where the local layers mask their window
    from a buffer, ``window_buffer``) and the position ids; with fused attention the
    sliding layers' boolean mask where the window makes one (``masks.window_masked_share``), [1, 1, s, s] expanded over
    the batch, so s² bytes. Not counted: the position ids (8·s bytes) with fused attention, which are kept too."""
    spec, act, b, s = w.model, w.precision.activation_bytes, w.micro_batch, w.seq_len
    if w.attention == "eager":
        kinds = [kind for kind, layers in (("global", spec.attention_layers - spec.local_layers),
                                           ("sliding", spec.local_layers)) if layers]  # fmt: skip
        if spec.window_buffer:  # GPT-Neo's local layers mask their window themselves: one mask for every layer
            kinds = ["all"]
        return [
            *(
                SavedTensor(f"eager attention mask, {kind} layers (kept for the rebuilt layers)", "b·s²", b * s * s,
                            act)
                for kind in kinds
            ),
            SavedTensor("position ids (int64, kept for the rebuilt layers)", "s", s, TOKEN_ID_BYTES),
        ]  # fmt: skip
    if window_masked_share(w):
        return [SavedTensor("boolean window mask, sliding layers (kept for the rebuilt layers)", "s²", s * s, 1)]
    return []


def layer_checkpoint(w: Workload) -> SavedTensor:
    """What full recomputation keeps of each layer: its input (Korthikanti et al. 2022 §4.2.3, Table 2)."""
    if w.model.cca:  # ZAYA's: its fp32 stream and the router state
        return cca_checkpoint(w)
    if w.model.prompt:  # CPM-Ant's: over the prompt's tokens and the text's
        return prompt_checkpoint(w)
    if w.model.image_prefix:  # GIT's: over the image's tokens and the text's
        return layer_checkpoint(decoder_workload(w))
    if w.model.altup or w.model.hyper_connections:  # Gemma 3n's AltUp, DeepSeek-V4's and HY V4's: n streams of h
        n = (w.model.altup or w.model.hyper_connections).streams  # type: ignore[union-attr]
        return SavedTensor("layer input (n streams)", "n·s·b·h", n * w.tokens * w.model.hidden_size,
                           w.precision.activation_bytes, split="seq")  # fmt: skip
    return SavedTensor(
        "layer input", "s·b·h", w.tokens * w.model.hidden_size, w.precision.activation_bytes, split="seq"
    )
