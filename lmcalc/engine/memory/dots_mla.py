"""What dots.3 Note's attention keeps for backward beyond DeepSeek-V3.2's MLA (transformers 5.24's
Dots3NoteTextAttention and Dots3NoteTextModel): its sliding-window layers' MLA at heads and ranks of their own
(``MLASpec.local``), which keep what a layer of a model at those widths would, without an indexer; the RMSNorm on
the shared RoPE key (``k_rope_only_layernorm``); and the rotary tables, one pair for each kind of layer, the indexed
layers' in fp32 (made from ``inputs_embeds.float()``). The latents' scales (``q_lora_scale``, ``kv_lora_scale``)
keep nothing: a product with a number keeps no operand, and the up-projection keeps the scaled latent as DeepSeek's
keeps the norm's output. The gate a head is ``engine.memory.activations``'s (``attention_head_gate``); the
indexer, run under torch.no_grad, keeps nothing; the MoE is DeepSeek-V3's."""

from __future__ import annotations

import functools
from dataclasses import replace

from lmcalc.engine.memory.norms import norm_saved
from lmcalc.engine.memory.saved import SavedTensor
from lmcalc.engine.memory.ssm import AttentionKind
from lmcalc.engine.model.params import Dim
from lmcalc.engine.model_code import norm_keeps
from lmcalc.engine.workload import Workload
from lmcalc.specs import ModelSpec

LOCAL_SYMBOLS = {"H": "H,local", "r_q": "r_q,local", "r_kv": "r_kv,local", "d_qk": "d_qk,local", "d_v": "d_v,local",
                 "d_nope": "d_nope,local", "d_rope": "d_rope,local"}  # fmt: skip
"""The symbols a sliding-window layer's tensors count in, its own widths (as ``engine.model.mla_params`` names
its weights)."""


@functools.lru_cache(maxsize=256)
def local_widths(w: Workload, kind: AttentionKind) -> Workload | None:
    """The workload as a sliding-window layer of a model whose local layers have MLA widths of their own sees it:
    the model at those heads and ranks, without an indexer (those layers attend their window alone); None for a
    layer of another kind or a model without them."""
    mla = w.model.mla
    if mla is None or mla.local is None or kind != "local":
        return None
    local = mla.local
    widths = {"q_lora_rank": local.q_lora_rank, "kv_lora_rank": local.kv_lora_rank, "indexer": None, "local": None,
              "qk_nope_head_dim": local.qk_nope_head_dim, "qk_rope_head_dim": local.qk_rope_head_dim,
              "v_head_dim": local.v_head_dim}  # fmt: skip
    fields = w.model.model_dump()
    model = fields | {"num_heads": local.heads, "num_kv_heads": local.heads, "mla": fields["mla"] | widths}
    return replace(w, model=ModelSpec.model_validate(model))


def rope_key_norm_saved(w: Workload, rows: Dim) -> list[SavedTensor]:
    """The RMSNorm on the shared RoPE key before its rotation (dots.3 Note's k_rope_only_layernorm), a norm of d_rope
    on each token: what a norm keeps. Its input is a slice of the KV latent's projection: a norm that keeps its
    input keeps that storage, counted with the latent; in fp32 the upcast is the slice itself, which keeps the
    latent's storage whole, r_kv + d_rope a token (the KV latent norm reads a contiguous copy)."""
    m = w.model.mla
    if m is None or not m.rope_key_norm:
        return []
    tensors = norm_saved(w, "RoPE key norm", rows, Dim(m.qk_rope_head_dim, "d_rope"))
    if norm_keeps(w) == "input":
        return [t for t in tensors if not t.label.endswith(" input")]
    if w.precision.activation_bytes == 4:
        whole = SavedTensor("RoPE key norm input (a view of the KV latent, kept whole)", "s·b·(r_kv+d_rope)",
                            rows.size * (m.kv_lora_rank + m.qk_rope_head_dim), 4, split="seq")  # fmt: skip
        return [whole if t.label.endswith("input (fp32 copy)") else t for t in tensors]
    return tensors


def rotary_tables(w: Workload) -> list[SavedTensor] | None:
    """dots.3 Note's rotary tables (Dots3NoteTextRotaryEmbedding), cos and sin of s·d_rope for each kind of layer:
    the indexed layers' in fp32, the sliding ones' at their own d_rope in the activation dtype; None for a model
    whose MLA has no norm on its RoPE key (the tables every model has)."""
    spec = w.model
    m = spec.mla
    if m is None or not m.rope_key_norm:
        return None
    act, s = w.precision.activation_bytes, w.seq_len
    kinds = []
    if spec.attention_layers > spec.local_layers:
        kinds.append(("", m.qk_rope_head_dim, "d_rope", 4 if m.indexer else act))
    if spec.local_layers:
        d = m.local.qk_rope_head_dim if m.local else m.qk_rope_head_dim
        kinds.append((" (sliding layers)", d, "d_rope,local" if m.local else "d_rope", act))
    return [
        SavedTensor(f"rotary {t} table{which}{' (fp32)' if n == 4 != act else ''}", f"s·{symbol}", s * d, n,
                    split="none")
        for which, d, symbol, n in kinds
        for t in ("cos", "sin")
    ]  # fmt: skip


def checkpoint_masks_kept(w: Workload) -> list[SavedTensor]:
    """What gradient checkpointing keeps of dots.3 Note's layers' arguments beyond the sliding layers' window mask,
    with a fused kernel (the profile's ``attention.checkpoint_keeps_mask``): the indexed layers' causal mask, made
    as booleans whatever the kernel (``create_causal_mask(..., allow_is_causal_skip=False)``, for the indexer), one
    [1, 1, s, s] expanded over the batch, and the position ids (int64). Eager attention's masks are every model's
    (``outside_layers._checkpoint_arguments``)."""
    spec = w.model
    if not (spec.mla and spec.mla.rope_key_norm and spec.indexer) or w.attention == "eager":
        return []
    if not (w.framework.attention.checkpoint_keeps_mask and w.recompute == "full"):
        return []
    s = w.seq_len
    return [SavedTensor("boolean causal mask, indexed layers (kept for the rebuilt layers)", "s²", s * s, 1,
                        split="none"),
            SavedTensor("position ids (int64, kept for the rebuilt layers)", "s", s, 8, split="none")]  # fmt: skip
