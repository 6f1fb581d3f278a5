"""The keys each query is scored against, and the widths of its two products, averaged over a model's attention
layers (``engine.model.flops`` multiplies them by the heads): every key of the sequence under the full convention, as
``FlopCounterMode`` counts a masked kernel; under the causal one what a causal kernel computes, within the window in
local layers (sliding or chunked) and the indexer's top k_I in DeepSeek sparse attention's layers."""

from __future__ import annotations

from lmcalc.engine.choices import AttnConvention
from lmcalc.engine.model.compressed_attention import mean_keys
from lmcalc.specs import ModelSpec


def effective_keys(seq_len: int, convention: AttnConvention) -> float:
    """Keys each query is scored against, averaged over positions: s (full) or (s+1)/2 (causal)."""
    return seq_len if convention == "full" else (seq_len + 1) / 2


def local_keys(seq_len: int, window: int, kind: str) -> float:
    """Keys each query of a local layer sees, averaged over positions, as a causal kernel with a window computes
    them. Sliding (Beltagy et al. 2020; Mistral): query i sees min(i, w) keys, so (s+1)/2 while s ≤ w, and
    (w·(w+1)/2 + (s−w)·w)/s beyond. Chunked (Llama 4): query i sees the keys of its own chunk of w up to itself,
    (w+1)/2 on average over each whole chunk, and the last, partial chunk of r tokens (r+1)/2."""
    s, w = seq_len, window
    if kind == "sliding":
        return (s + 1) / 2 if s <= w else (w * (w + 1) / 2 + (s - w) * w) / s
    whole, rest = divmod(s, w)
    return (whole * w * (w + 1) / 2 + rest * (rest + 1) / 2) / s


def _global_and_local_keys(spec: ModelSpec, seq_len: int, convention: AttnConvention) -> tuple[float, float]:
    """Keys a query of a global layer and of a local layer is scored against, averaged over positions: all of them
    under the full convention; under the causal one (s+1)/2 in a global layer, or min(i, k_I) where an indexer picks
    them (DeepSeek sparse attention), and the window in a local layer."""
    keys = effective_keys(seq_len, convention)
    if convention == "full":
        return keys, keys
    if spec.indexer:  # DeepSeek sparse attention: query i attends to min(i, k_I) keys
        keys = local_keys(seq_len, spec.indexer.top_k, "sliding")
    window = local_keys(seq_len, spec.sliding_window, spec.local_attention) if spec.sliding_window else keys
    return keys, window


def attended_keys(spec: ModelSpec, seq_len: int, convention: AttnConvention) -> float:
    """Keys a query is scored against, averaged over positions and over the model's attention layers. The full
    convention counts every key of every layer (what ``FlopCounterMode`` counts: a masked-out score is still
    computed); the causal one counts what a causal kernel computes, over the window alone in local layers (sliding
    or chunked) and the indexer's picks in the others."""
    if spec.compressed_attention:  # DeepSeek-V4: a window and compressed entries, by layer kind
        return mean_keys(spec, seq_len, convention)
    if convention == "causal" and spec.dynamic_mask_window:  # Doge: query i attends to min(i, k) keys its mask keeps
        return local_keys(seq_len, spec.dynamic_mask_window, "sliding")
    keys, window = _global_and_local_keys(spec, seq_len, convention)
    local, attending = spec.local_layers, spec.attention_layers
    if not local or convention == "full":
        return keys
    return ((attending - local) * keys + local * window) / attending


def attended_widths(spec: ModelSpec, seq_len: int, convention: AttnConvention) -> tuple[float, float]:
    """Keys a query is scored against times the width of a query-key product, and of a value, averaged over the
    attention layers: k̄·d_qk and k̄·d_v, or where the global layers have widths of their own (Gemma 4's d_g), the
    average of the local layers' k_w·d and the global layers' k·d_g; where the local layers have MLA of their own
    heads and widths (dots.3 Note), each layer's keys times its heads' widths, over the model's H heads."""
    keys = attended_keys(spec, seq_len, convention)
    g, local_mla = spec.global_attention, spec.mla.local if spec.mla else None
    attending, local = spec.attention_layers, spec.local_layers
    if local_mla is not None:
        k, k_w = _global_and_local_keys(spec, seq_len, convention)
        share = local_mla.heads / spec.num_heads  # the local layers' heads, over the H the caller multiplies by
        qk = (local * k_w * share * local_mla.qk_head_dim + (attending - local) * k * spec.qk_head_dim) / attending
        v = (local * k_w * share * local_mla.v_head_dim + (attending - local) * k * spec.v_head_dim) / attending
        return qk, v
    if g is None:
        return keys * spec.qk_head_dim, keys * spec.v_head_dim
    k_w = local_keys(seq_len, spec.sliding_window, spec.local_attention) if spec.sliding_window else 0.0
    k = effective_keys(seq_len, convention)
    k_local = k if convention == "full" else k_w
    width = (local * k_local * spec.head_size + (attending - local) * k * g.head_dim) / attending
    return width, width
