"""What Doge's dynamic mask attention and its residual scales keep for backward (Shi et al. 2024, *Trainable Dynamic
Mask Sparse Attention*, arXiv:2508.02124; transformers 5.24's DogeAttention and DogeDecoderLayer), beyond the
attention of ``engine.memory.activations``: dt_proj's input, the three small tensors that turn its output into a
score a KV head and key, the two boolean masks its ``prepare_dynamic_mask`` fills by, the per-head mask a fused
kernel is given, and the layer input each residual scale multiplies."""

from __future__ import annotations

from lmcalc.engine.memory.saved import SavedTensor
from lmcalc.engine.model_code import norm_keeps
from lmcalc.engine.workload import Workload

BOOL_BYTES = 1  # masked_fill keeps its mask, a bool a score


def _v_shared(w: Workload) -> bool:
    """Whether the V attention keeps is a view of v_proj's output, which dt_proj reads: no repeat_kv copy (every head
    its own KV head, or one KV head, whose repeat merges a size-1 dimension) and, eagerly, no batch folded into the
    heads of a strided V (one sequence)."""
    spec = w.model
    no_repeat = spec.kv_heads in (1, spec.num_heads)
    return no_repeat and (w.attention != "eager" or w.micro_batch == 1)


def dynamic_mask_saved(w: Workload) -> list[SavedTensor]:
    """A Doge layer's dynamic mask, as DogeAttention builds it from the values:
    dt = exp(A · softplus(dt_proj(V))), a score a KV head and key, expanded over the queries, filled with the dtype's
    minimum where the causal mask masks (``masked_fill`` keeps the b·s² booleans of ``attention_mask != 0``) and,
    where the sequence is longer than keep_window_size k, where a key is not among the query's top k (the b·H_kv·s²
    booleans of ``active_mask == 0``; the top-k's indices are not kept: its values, which would keep them, are
    dropped). dt_proj keeps its input, v_proj's output, unless attention's V is a view of it; softplus keeps its
    input, the product with A the softplus output (for A's gradient: a frozen A keeps none), exp its output. Eager
    attention adds the mask to its scores, which keeps nothing more; a fused kernel (SDPA) is given it as an explicit
    bias repeated to the H heads, which it keeps, with K and V repeated to H heads (transformers'
    sdpa_attention_forward: a mask turns off SDPA's grouped-query path)."""
    spec, act, sb, b, s = w.model, w.precision.activation_bytes, w.tokens, w.micro_batch, w.seq_len
    H, Hkv, dv, k = spec.num_heads, spec.kv_heads, spec.v_head_dim, spec.dynamic_mask_window or s
    tensors = [] if _v_shared(w) else [
        SavedTensor("dt_proj input (v_proj's output)", "s·b·H_kv·d_v", sb * Hkv * dv, act, for_weights=("dt_proj",),
                    most_tp_ranks=Hkv)
    ]  # fmt: skip
    tensors += [
        SavedTensor("dynamic mask: softplus input and exp output", "2·s·b·H_kv", 2 * sb * Hkv, act, split="none"),
        SavedTensor("dynamic mask: softplus output (for A's gradient)", "s·b·H_kv", sb * Hkv, act, split="none",
                    for_weights=("A",)),
        SavedTensor("dynamic mask: the causal mask's booleans (masked_fill)", "b·s²", b * s * s, BOOL_BYTES,
                    split="none"),
    ]  # fmt: skip
    if s > k:
        tensors.append(SavedTensor("dynamic mask: the keys outside each query's top k (masked_fill's booleans)",
                                   "b·H_kv·s²", b * Hkv * s * s, BOOL_BYTES, split="none"))  # fmt: skip
    if w.attention == "eager":
        return tensors
    mask_heads, symbol = (1, "b·s²") if Hkv == 1 else (H, "b·H·s²")  # one KV head: repeat_kv's view of it
    tensors.append(SavedTensor("dynamic mask, repeated to the heads (the fused kernel's bias)", symbol,
                               b * mask_heads * s * s, act, attention_core=True, split="none"))  # fmt: skip
    if 1 < Hkv < H:  # repeat_kv copies K and V to the H heads, which the kernel keeps in place of the H_kv
        tensors += [
            SavedTensor(f"{name}: the other H − H_kv heads of its repeat_kv copy", "s·b·(H−H_kv)·d", sb * (H - Hkv) * d,
                        act, attention_core=True)
            for name, d in (("K", spec.qk_head_dim), ("V", dv))
        ]  # fmt: skip
    return tensors


def residual_scale_saved(w: Workload, half: str) -> list[SavedTensor]:
    """Doge's learned scale on a residual (``input_residual * residual + x``, h a half): the product keeps the
    residual, the half's input, for the scale's gradient (a frozen scale, as under LoRA, keeps none), unless its norm
    keeps that very storage (a norm that keeps its input, or an fp32 copy where the activations are fp32 already:
    x.float() is x)."""
    if not w.model.residual_scales or w.model.ngpt_scales:  # nGPT's interpolation keeps y − h (engine.memory.ngpt)
        return []
    same = norm_keeps(w) == "input" or (norm_keeps(w) != "fp32_centred" and w.precision.activation_bytes == 4)
    if same:
        return []
    act, sb = w.precision.activation_bytes, w.tokens
    return [SavedTensor(f"{half} residual (the residual scale's product keeps it)", "s·b·h", sb * w.model.hidden_size,
                        act, split="seq", block=half, for_weights=("residual_scale",))]  # fmt: skip
