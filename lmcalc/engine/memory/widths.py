"""Gemma 4's layers that differ from one another (transformers 5.24 modeling_gemma4.py), in what they keep for
backward. A global layer at widths of its own (``GlobalAttentionSpec``: global_head_dim, num_global_key_value_heads)
keeps what a layer of a model at those widths would: Q, K and V, their norms' copies, the kernel's output and its
log-sum-exp at d_g over H_kv,g heads, and its own rotary tables. K = V changes nothing kept: k_norm and v_norm each
upcast the one projection's output apart. A layer among the last ``kv_sharing.layers`` makes no K or V of its own,
and its MLP may be twice as wide. Per-layer inputs add a gate, a projection and a norm to every layer and a
projection and a norm before them; the MoE block beside the dense MLP adds its norms and its router's."""

from __future__ import annotations

import functools
import re
from dataclasses import replace

from lmcalc.engine.memory.adapters import adapter_bytes, adapter_copies
from lmcalc.engine.memory.masks import window_masked_share
from lmcalc.engine.memory.norms import norm_saved
from lmcalc.engine.memory.saved import SavedTensor
from lmcalc.engine.memory.ssm import KINDS, AttentionKind, MixerKind
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


def renamed(tensors: list[SavedTensor], symbols: dict[str, str]) -> list[SavedTensor]:
    """``tensors`` with the symbols of their element counts renamed (a global layer's d as d_g, a double-wide MLP's f
    as 2·f), so that a formula says which width it counts."""
    if not symbols:
        return tensors
    pattern = re.compile(r"(?<![\w,])(" + "|".join(re.escape(k) for k in sorted(symbols, key=len, reverse=True))
                         + r")(?![\w,])")  # fmt: skip
    return [replace(t, symbol=pattern.sub(lambda m: symbols[m.group(1)], t.symbol)) for t in tensors]


def global_symbols(w: Workload, kind: AttentionKind) -> dict[str, str]:
    """The symbols a global layer at widths of its own counts in: d_g for d (and d_v), H_kv,g for H_kv where given."""
    g = w.model.global_attention
    if g is None or kind != "global":
        return {}
    return {"d": "d_g", "d_v": "d_g", **({"H_kv": "H_kv,g"} if g.kv_heads else {})}


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


def kind_layers(spec: ModelSpec) -> list[tuple[AttentionKind, bool, int]]:
    """Each kind of attention layer the model has, (kind, whether it reuses an earlier layer's K and V, how many):
    global and local, and of each those among the last ``kv_sharing.layers`` apart (Gemma 4)."""
    out: list[tuple[AttentionKind, bool, int]] = []
    for kind in ("global", "local"):
        layers = [i for i in range(spec.num_layers)
                  if spec.is_attention_layer(i) and spec.is_local_layer(i) == (kind == "local")]  # fmt: skip
        reusing = sum(spec.reuses_kv(i) for i in layers)
        out += [(kind, False, len(layers) - reusing), (kind, True, reusing)]
    return [entry for entry in out if entry[2]]


def kv_reused(w: Workload, kind: AttentionKind, tensors: list[SavedTensor]) -> list[SavedTensor]:
    """What a layer that attends with an earlier layer's K and V keeps of the attention (Gemma4TextAttention with
    ``is_kv_shared_layer``): no K- or V-norm of its own, and of K and V only the copy repeat_kv makes of them for every
    head (eager attention, or a fused kernel given the window's mask); the kernel keeps the earlier layer's K and V
    otherwise, counted in that layer."""
    spec = at_widths(w, kind).model
    expanded = w.attention == "eager" and not w.core_recomputed and not (spec.kv_heads == 1 and w.micro_batch == 1)
    copied = 1.0 if expanded else window_masked_share(w, kind)
    out = []
    for t in tensors:
        if t.label.startswith(("K-norm", "V-norm")):
            continue
        if t.label == "V" or t.label == "K" or t.label.startswith("K ("):
            if not copied:
                continue
            t = replace(t, elements=t.elements * copied)
        out.append(t)
    return out


@functools.lru_cache(maxsize=256)
def mlp_widths(w: Workload, mixer: MixerKind) -> tuple[tuple[Workload, int, int], ...]:
    """The MLP a layer of ``mixer`` has, as (workload, n, of): the model's, or with double-wide MLPs (Gemma 4's
    use_double_wide_mlp) one 2·f wide in a layer that reuses K and V; the average layer each at its share,
    (L − n_s)/L and n_s/L."""
    sharing = w.model.kv_sharing
    if not sharing or not sharing.double_wide_mlp:
        return ((w, 1, 1),)
    wide = replace(w, model=ModelSpec.model_validate({**w.model.model_dump(), "ffn_size": 2 * w.model.ffn_size}))
    if mixer in KINDS:
        return ((wide if mixer.endswith("_shared") else w, 1, 1),)
    L, n = w.model.num_layers, sharing.layers
    return (w, L - n, L), (wide, n, L)


def per_layer_input_saved(w: Workload) -> list[SavedTensor]:
    """What each layer's per-layer input keeps (Gemma4TextDecoderLayer: h → d_p, GELU, times the layer's d_p slice,
    d_p → h, a norm, added): the gate's input (the layer's output so far), its output (GELU's input), GELU's output
    (the product's), the product (the projection's input), and the norm's; the d_p slices the products keep are
    views of one tensor, counted outside the layers (``per_layer_inputs_outside``)."""
    ple = w.model.per_layer_input
    if ple is None:
        return []
    act, sb, h, d = w.precision.activation_bytes, w.tokens, w.model.hidden_size, ple.width
    rows = Dim(sb, "s·b")
    norm = norm_saved(w, "per-layer output norm", rows, Dim(h, "h"))
    return [
        SavedTensor("per-layer gate input (the layer's output so far)", "s·b·h", sb * h, act, split="seq",
                    for_weights=("per_layer_input_gate",)),
        SavedTensor("per-layer gate output (GELU input)", "s·b·d_p", sb * d, act, split="none"),
        SavedTensor("per-layer gate, GELU output (the product's)", "s·b·d_p", sb * d, act, split="none"),
        SavedTensor("per-layer projection input (the gated product)", "s·b·d_p", sb * d, act, split="none",
                    for_weights=("per_layer_projection",)),
        *norm,
    ]  # fmt: skip


def per_layer_inputs_outside(w: Workload, adapted: frozenset[str] = frozenset()) -> list[SavedTensor]:
    """What the per-layer inputs keep before the layers (Gemma4TextModel.project_per_layer_inputs): the projection's
    input (the scaled embedding, h → L·d_p), its norm over each d_p (an fp32 copy and two statistics, and the
    normalised value for the weight), and the sum every layer's product reads its d_p slice of, s·b·L·d_p. Under a
    fine-tuning method, the projection keeps its input and the norm keeps anything only where the projection is
    trained or adapted (``adapted``), for its output then needs a gradient."""
    ple = w.model.per_layer_input
    if ple is None:
        return []
    act, sb, h, d, L = w.precision.activation_bytes, w.tokens, w.model.hidden_size, ple.width, w.model.num_layers
    inputs = SavedTensor("per-layer inputs (the d_p slices each layer's product reads)", "s·b·L·d_p", sb * L * d, act,
                         split="none")  # fmt: skip
    if w.method.kind != "full" and "per_layer_model_projection" not in adapted:
        return [inputs]
    projection_input = [  # under full recomputation, the first layer's checkpointed input: counted there
        SavedTensor("per-layer projection input (the scaled embedding)", "s·b·h", sb * h, act, split="seq")
    ]
    norm = norm_saved(w, "per-layer projection norm", Dim(sb * L, "s·b·L"), Dim(d, "d_p"), split="none")
    if w.method.kind != "full":  # its weight frozen, the norm keeps no normalised value; the adapter keeps A·x
        norm = [t for t in norm if "normalised" not in t.label]
        label, adapter = "per_layer_model_projection adapter", adapter_bytes(w)
        norm.append(SavedTensor(f"{label}: A·x (B's input)", "s·b·r", sb * w.method.lora_rank, adapter, split="none"))
        if adapter_copies(w):  # its own copy of its input, and with lora_dropout the dropout's mask where the
            # embedding's output needs a gradient: under full recomputation (enable_input_require_grads), as the
            # lowest layer's adapters keep theirs (activations.lowest_layer_unkept)
            norm.append(SavedTensor(f"{label}: its input copy (A's input)", "s·b·h", sb * h, adapter, split="seq"))
            if w.method.lora_dropout > 0 and w.recompute == "full":
                norm.append(SavedTensor(f"{label}: dropout mask", "s·b·h", sb * h, w.mask_bytes, split="seq"))
    # Gemma 3n's layers take the streams, not the embedding: there the projection's input is no checkpoint's
    return [*(projection_input if w.recompute != "full" or w.model.altup else []), *norm, inputs]


def shared_kv_kept(w: Workload) -> list[SavedTensor]:
    """Under full recomputation, the K and V the last layer of each kind that makes its own stores for the layers
    that reuse them (Gemma4TextModel's shared_kv_states, a keyword argument of every layer): the checkpoint keeps the
    arguments until the rebuilt layers have run, so these stay alive through the backward, s·b·H_kv·d each."""
    if w.model.kv_sharing is None or w.recompute != "full":
        return []
    act, sb = w.precision.activation_bytes, w.tokens
    out = []
    for kind, reusing, _ in kind_layers(w.model):
        if not reusing:
            continue
        spec = at_widths(w, kind).model
        d_sym = "d_g" if kind == "global" and w.model.global_attention else "d"
        out += [
            SavedTensor(f"{kind} layers' shared {x} (kept for the rebuilt layers)", f"s·b·H_kv·{d_sym}",
                        sb * spec.kv_heads * spec.head_size, act, split="none")
            for x in ("K", "V")
        ]  # fmt: skip
    return out
