"""A layer that attends at widths of its own kind keeps what a layer of a model at those widths would: Gemma 4's
global layers (``GlobalAttentionSpec``: global_head_dim, num_global_key_value_heads) keep Q, K and V, their norms'
copies, the kernel's output and its log-sum-exp at d_g over H_kv,g heads, and their own rotary tables, d_g wide.
K = V changes nothing kept: k_norm and v_norm each upcast the one projection's output apart, and the kernel keeps
the rotated K and the normed V (transformers 5.24 modeling_gemma4.py, Gemma4TextAttention.forward)."""

from __future__ import annotations

import functools
from dataclasses import replace

from lmcalc.engine.memory.norms import norm_saved
from lmcalc.engine.memory.saved import SavedTensor
from lmcalc.engine.memory.ssm import AttentionKind
from lmcalc.engine.model.params import Dim
from lmcalc.engine.workload import Workload
from lmcalc.specs import ModelSpec


@functools.lru_cache(maxsize=256)
def at_widths(w: Workload, kind: AttentionKind) -> Workload:
    """The workload as a layer of ``kind`` sees it: a global layer's own head size and KV heads where the model
    gives them, the model as it is otherwise."""
    g = w.model.global_attention
    if g is None or kind != "global":
        return w
    fields = w.model.model_dump(exclude={"global_attention"})
    widths = {"head_dim": g.head_dim, "num_kv_heads": g.kv_heads or w.model.kv_heads, "value_head_dim": None}
    return replace(w, model=ModelSpec.model_validate({**fields, **widths}))


def global_tables(w: Workload) -> list[SavedTensor]:
    """The global layers' rotary tables where their head size is their own: cos and sin, s·d_g each, made once a
    micro-batch beside the local layers' (Gemma4TextRotaryEmbedding, one pair a layer type)."""
    g = w.model.global_attention
    if g is None:
        return []
    act = w.precision.activation_bytes
    return [
        SavedTensor(f"rotary {t} table (global layers)", "s·d_g", w.seq_len * g.head_dim, act, split="none")
        for t in ("cos", "sin")
    ]


def branch_norms_saved(w: Workload) -> list[SavedTensor]:
    """Gemma 4's MoE block beside the dense MLP (``MoESpec.branch_norms``), beyond what an MoE layer with one shared
    expert keeps: the experts' own norm on the residual (pre_feedforward_layernorm_2), a norm on each branch's output
    (post_feedforward_layernorm_1 and _2), and the router's (Gemma4TextRouter): a weightless norm on the residual,
    its output cast and kept for the learned scale's gradient, and the scaled copy the projection reads."""
    act, sb, h = w.precision.activation_bytes, w.tokens, w.model.hidden_size
    rows, width = Dim(sb, "s·b"), Dim(h, "h")
    router_norm = [t for t in norm_saved(w, "router norm", rows, width) if "normalised" not in t.label]
    return [
        *norm_saved(w, "experts' norm", rows, width),
        *router_norm,
        SavedTensor("router norm output (for the scale's product)", "s·b·h", sb * h, act, split="seq",
                    for_weights=("router",)),
        SavedTensor("router projection input (scaled)", "s·b·h", sb * h, act, split="seq", for_weights=("router",)),
        *norm_saved(w, "dense branch's output norm", rows, width),
        *norm_saved(w, "experts' output norm", rows, width),
    ]  # fmt: skip
