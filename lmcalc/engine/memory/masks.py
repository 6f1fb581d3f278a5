"""The masks an attention layer keeps for backward beyond its kernel's own tensors: a sliding window's or a sparse
attention's selection given to a fused kernel as an explicit mask (with K and V repeated to every head), and the
selection's indices a sparse kernel takes; and whether a model's global and local layers therefore keep different
tensors (``kinds_differ``). ``engine.memory.activations`` places them in a layer."""

from __future__ import annotations

from lmcalc.engine.memory.saved import SavedTensor
from lmcalc.engine.memory.ssm import AttentionKind
from lmcalc.engine.workload import Workload

INDEX32_BYTES = 4  # the top-k indices a sparse attention kernel takes are int32 (FlashMLA, DeepseekV32Indexer)


def window_masked_share(w: Workload, kind: AttentionKind = None) -> float:
    """Of the attention layers (of ``kind``), the share whose fused kernel is given an explicit mask (the profile's
    ``attention.window_mask``): the sliding-window layers, once the sequence reaches the window (transformers'
    masking_utils._ignore_causal_mask_sdpa: below it the causal flag serves)."""
    spec = w.model
    if w.framework.attention.window_mask and w.attention == "flash" and spec.indexer:
        return 1.0  # DeepSeek sparse attention: each layer's selection, as a mask (DeepseekV32Attention)
    if not (w.framework.attention.window_mask and w.attention == "flash" and spec.sliding_window):
        return 0.0
    if w.seq_len < spec.sliding_window or kind == "global":
        return 0.0
    return 1.0 if kind == "local" else spec.local_layers / spec.attention_layers


def kinds_differ(w: Workload) -> bool:
    """Whether a layer that attends globally keeps other tensors than one that attends locally: the model says so
    (MiMo-V2-Flash's own KV heads and sinks), or the profile gives the local layers' fused kernel an explicit mask
    (``_window_masked_share``) and the global ones none."""
    return w.model.local_attention_differs or 0 < window_masked_share(w) < 1


def window_mask_saved(w: Workload, kind: AttentionKind) -> list[SavedTensor]:
    """What an explicit window mask adds to a layer of ``kind`` on average (``_window_masked_share``): the mask, kept
    by the kernel in the activation dtype, and K and V repeated to the H heads (repeat_kv), which the kernel keeps in
    place of the H_kv heads (the local layers'), copies but where one KV head repeats as a view (RecurrentGemma's MQA);
    all of it rebuilt with the kernel under selective recomputation."""
    share = window_masked_share(w, kind)
    if not share:
        return []
    spec, act, sb, b, s = w.model, w.precision.activation_bytes, w.tokens, w.micro_batch, w.seq_len
    H, Hkv = spec.num_heads, spec.local_kv_heads or spec.kv_heads
    tensors = [
        SavedTensor(f"the {'indexer' if spec.indexer else 'window'}'s mask (kept by the kernel)", f"{share:g}·b·s²",
                    b * s * s * share, act, attention_core=True, split="none")
    ]  # fmt: skip
    if 1 < Hkv < H:  # one KV head: repeat_kv's reshape merges a size-1 dimension, a view of K and V (no copy)
        tensors += [
            SavedTensor(f"{name}: the other H − H_kv heads of its repeat_kv copy", f"{share:g}·s·b·(H−H_kv)·d",
                        sb * (H - Hkv) * d * share, act, attention_core=True)
            for name, d in (("K", spec.qk_head_dim), ("V", spec.v_head_dim))
        ]  # fmt: skip
    return tensors


def selection_saved(w: Workload) -> list[SavedTensor]:
    """What a sparse attention kernel keeps of DeepSeek sparse attention's selection: the indices of each query's
    top k_I keys, int32 (FlashMLA's and Megatron-Core's sparse MLA kernels take them), in the layers that select
    (the others reuse that storage). transformers instead masks a dense kernel (``_window_mask_saved``)."""
    spec = w.model
    if spec.indexer is None or w.framework.attention.window_mask:
        return []
    b, s, k = w.micro_batch, w.seq_len, min(w.seq_len, spec.indexer.top_k)
    share = spec.indexer_layers / spec.num_layers
    return [SavedTensor("the indexer's top-k key indices (int32)", f"{share:g}·b·s·min(s, k_I)", b * s * k * share,
                        INDEX32_BYTES, split="none")]  # fmt: skip
