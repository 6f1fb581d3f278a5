"""Reading Gemma 4's text models (``gemma4_text``, ``gemma4_unified_text``) as transformers 5.24's Gemma4TextConfig
reads them: the global layers' head size and key-value heads (``per_layer_config``, or the ``global_head_dim`` and
``num_global_key_value_heads`` its ``__post_init__`` turns into one), K = V, the last layers sharing K and V with
double-wide MLPs, per-layer embeddings and the MoE block beside the dense MLP; Gemma 3n's (``gemma3n_text``): shared
K and V, per-layer embeddings, AltUp and LAuReL; and Llama 3.2 Vision's (``mllama_text_model``): the cross-attention
layers text skips (``engine.model.width_params``)."""

from __future__ import annotations

from typing import Any

from lmcalc.errors import LmcalcError, token
from lmcalc.hf_fields import get as _get

GEMMA4 = ("gemma4_text", "gemma4_unified_text")
GEMMA3N = "gemma3n_text"
GLOBAL_HEAD_DIM = 512  # Gemma4TextConfig.__post_init__: kwargs.pop("global_head_dim", 512)
GEMMA_NORMS = {"norm_rms_pow": True, "value_norm": True}
"""Gemma3nRMSNorm's and Gemma4RMSNorm's torch.pow(mean(x²) + ε, −½), and their attention's weightless v_norm."""
LAYER_FIELDS = ("head_dim", "num_key_value_heads")
"""What a per_layer_config entry may override for lmcalc to read it."""


def _global_widths(config: dict[str, Any], layer_types: list[str], origin: str) -> dict[str, Any]:
    """The global layers' head size and KV heads: from ``per_layer_config`` (as a saved config writes it), alike in
    every full-attention layer and absent from the others; else ``global_head_dim`` (512) and, with K = V only,
    ``num_global_key_value_heads``, as the class's ``__post_init__`` builds that mapping."""
    k_eq_v = bool(config.get("attention_k_eq_v"))
    overrides = config.get("per_layer_config")
    if overrides is None:
        kv = config.get("num_global_key_value_heads") if k_eq_v else None
        return {"head_dim": config.get("global_head_dim", GLOBAL_HEAD_DIM), "kv_heads": kv, "k_eq_v": k_eq_v}
    if not isinstance(overrides, dict):
        raise LmcalcError(f"{origin}: config.json per_layer_config must be an object, not {token(overrides)}")
    full = {i for i, t in enumerate(layer_types) if t == "full_attention"}
    try:  # saved with the layer as text, padded ('05')
        entries = {int(k): v for k, v in overrides.items()}
    except (TypeError, ValueError):
        raise LmcalcError(f"{origin}: config.json per_layer_config's keys must be layer numbers") from None
    distinct = {repr(sorted(v.items())) if isinstance(v, dict) else repr(v) for v in entries.values()}
    if set(entries) != full or len(distinct) != 1:
        raise LmcalcError(
            f"{origin}: config.json per_layer_config must give every full-attention layer ({len(full)}) the same "
            "head_dim and num_key_value_heads and no other layer any: lmcalc reads Gemma 4's two layer kinds"
        )
    entry = next(iter(entries.values()))
    if not isinstance(entry, dict) or set(entry) - set(LAYER_FIELDS):
        raise LmcalcError(
            f"{origin}: config.json per_layer_config may set {' and '.join(LAYER_FIELDS)} only, not {token(entry)}"
        )
    head_dim = entry.get("head_dim", _get(config, origin, "head_dim"))
    return {"head_dim": head_dim, "kv_heads": entry.get("num_key_value_heads"), "k_eq_v": k_eq_v}


def gemma4(config: dict[str, Any], origin: str, fields: dict[str, Any]) -> dict[str, Any]:
    """Gemma 4's fields beside a Gemma 3-like reading (sandwich norms, per-head QK norms, sliding windows)."""
    if config.get("use_bidirectional_attention") == "all":
        raise LmcalcError(f"{origin}: config.json use_bidirectional_attention 'all' (no causal mask) is not modelled")
    layers = fields["num_layers"]
    types = config.get("layer_types") or []
    fields = {**fields, **GEMMA_NORMS, "global_attention": _global_widths(config, types, origin)}
    shared = config.get("num_kv_shared_layers") or 0
    if shared:
        fields["kv_sharing"] = {"layers": shared, "double_wide_mlp": bool(config.get("use_double_wide_mlp"))}
    width = config.get("hidden_size_per_layer_input")
    if width:  # Gemma4TextConfig's default 256; Gemma4UnifiedTextConfig has none
        fields["per_layer_input"] = {"width": width, "vocab": _get(config, origin, "vocab_size_per_layer_input")}
    fields.pop("moe", None)  # num_experts alone builds nothing: enable_moe_block does
    if config.get("enable_moe_block"):
        fields["moe"] = {
            "num_experts": _get(config, origin, "num_experts"),
            "experts_per_token": _get(config, origin, "top_k_experts"),
            "expert_ffn_size": _get(config, origin, "moe_intermediate_size"),
            "shared_experts": 1,  # the dense MLP, beside the experts in every layer
            "shared_expert_ffn_size": fields["ffn_size"],
            "branch_norms": True,
        }
    if layers and types and len(types) != layers:
        raise LmcalcError(f"{origin}: config.json layer_types gives {len(types)} layer types for {layers} layers")
    return fields


def gemma3n(config: dict[str, Any], origin: str, fields: dict[str, Any]) -> dict[str, Any]:
    """Gemma 3n's fields beside a Gemma 3-like reading: the last ``num_kv_shared_layers`` (15 by default) sharing K
    and V, per-layer embeddings, AltUp's ``altup_num_inputs`` streams and LAuReL's ``laurel_rank``."""
    fields = {**fields, **GEMMA_NORMS}
    shared = config.get("num_kv_shared_layers") or 0
    if shared:
        fields = {**fields, "kv_sharing": {"layers": shared}}
    width = config.get("hidden_size_per_layer_input")
    if width:
        fields = {
            **fields,
            "per_layer_input": {"width": width, "vocab": _get(config, origin, "vocab_size_per_layer_input")},
        }
    laurel = config.get("laurel_rank") or None
    altup = {"streams": _get(config, origin, "altup_num_inputs"), "laurel_rank": laurel,
             "sparse_layers": _sparse_layers(config, fields["num_layers"], origin)}  # fmt: skip
    return {**fields, "altup": altup}


def _sparse_layers(config: dict[str, Any], layers: int, origin: str) -> int:
    """The layers activation_sparsity_pattern cuts the MLP gate of (Gemma3nTextConfig: absent, the first 10 where
    there are more than 10 layers, else none)."""
    pattern = config.get("activation_sparsity_pattern")
    if pattern is None:
        return 10 if layers > 10 else 0
    if isinstance(pattern, (int, float)) and not isinstance(pattern, bool):
        return layers if pattern > 0 else 0
    if (
        not isinstance(pattern, list)
        or len(pattern) != layers
        or not all(isinstance(p, (int, float)) and not isinstance(p, bool) for p in pattern)
    ):
        raise LmcalcError(
            f"{origin}: config.json activation_sparsity_pattern must give a number for each of the {layers} layers, "
            f"not {token(pattern)}"
        )
    return sum(p > 0 for p in pattern)


MLLAMA = "mllama_text_model"
MLLAMA_CROSS_LAYERS = (3, 8, 13, 18, 23, 28, 33, 38)  # MllamaTextConfig.__post_init__'s, where none are given
MLLAMA_IMAGE_ROWS = 8  # MllamaTextModel: nn.Embedding(config.vocab_size + 8, hidden_size)


def mllama(config: dict[str, Any], origin: str, fields: dict[str, Any]) -> dict[str, Any]:
    """Llama 3.2 Vision's text model: Llama's self-attention layers, and at ``cross_attention_layers`` layers that
    attend to the image alone, which text skips (``CrossAttentionSpec``): lmcalc's layers are the others."""
    layers = fields["num_layers"]
    listed = config.get("cross_attention_layers")
    cross = {i for i in (MLLAMA_CROSS_LAYERS if listed is None else listed) if 0 <= i < layers}
    if len(cross) == layers:
        raise LmcalcError(f"{origin}: config.json cross_attention_layers leaves no layer that attends to the text")
    cross_attention = {"layers": len(cross), "token_rows": MLLAMA_IMAGE_ROWS}
    return {**fields, "num_layers": layers - len(cross), "cross_attention": cross_attention}


def gemma4_layer_types(config: dict[str, Any], layers: int) -> list[str]:
    """Gemma4TextConfig's layer_types: config.json's, else every sixth layer full; the last forced full either way."""
    types = list(config.get("layer_types") or [])
    if not types:
        types = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(layers)]
    return [*types[:-1], "full_attention"] if types else types


def drafter_fields(config: dict[str, Any], origin: str) -> dict[str, Any]:
    """A Gemma 4 drafter's own fields (Gemma4AssistantConfig, Gemma4UnifiedAssistantConfig): the backbone's width,
    and the vocabulary's clusters where ``use_ordered_embeddings``."""
    ordered = config.get("use_ordered_embeddings")
    default = 3840 if str(config.get("model_type")) == "gemma4_unified_assistant" else 1536  # the classes' defaults
    return {
        "drafter": {
            "backbone_width": config.get("backbone_hidden_size") or default,
            **({"centroids": config.get("num_centroids") or 2048,
                "top_centroids": config.get("centroid_intermediate_top_k") or 32} if ordered else {}),
        },
        "notes": [f"a drafter for speculative decoding ({config.get('model_type')}): every layer attends with its "
                  "backbone's K and V; the backbone's own work is not counted here"],
    }  # fmt: skip
