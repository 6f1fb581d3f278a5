"""Reading dots.3 Note's text model (``dots3_note_text``, and the ``dots3_note`` wrapper's) as transformers 5.24's
Dots3NoteTextConfig reads it: MLA in every layer, the sliding-window layers' at heads and ranks of their own
(``per_layer_config``, or the ``swa_*`` fields its ``__post_init__`` turns into one), an RMSNorm on the shared RoPE
key, a sigmoid gate a head from ``g_proj``, DeepSeek sparse attention's indexer in the other layers
(``indexed_attention``), and DeepSeek-V3's MoE with one shared MLP of ``n_shared_experts`` widths."""

from __future__ import annotations

from typing import Any

from lmcalc.errors import LmcalcError, token
from lmcalc.hf_fields import get as _get

KIND = "dots3_note_text"
LAYER_KINDS = ("sliding_attention", "indexed_attention", "full_attention")
MLA_FIELDS = ("num_attention_heads", "num_key_value_heads", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
              "qk_rope_head_dim", "v_head_dim")  # fmt: skip
"""What a layer's per_layer_config entry may set for lmcalc to read it (and head_dim, which only sizes RoPE)."""
SWA_DEFAULTS = {"num_attention_heads": 64, "num_key_value_heads": 64, "q_lora_rank": 1024, "kv_lora_rank": 1024,
                "head_dim": 256, "qk_nope_head_dim": 192, "v_head_dim": 128}  # fmt: skip
"""Dots3NoteTextConfig.__post_init__'s widths for the sliding-window layers, where config.json gives no
per_layer_config (each read from ``swa_<field>`` first; qk_rope_head_dim from ``swa_qk_rope_head_dim``, else
head_dim − qk_nope_head_dim)."""


def dots3_config(config: dict[str, Any], origin: str) -> dict[str, Any]:
    """``config`` with what Dots3NoteTextConfig.__post_init__ derives: ``mlp_layer_types`` (from
    ``first_k_dense_replace``, 1, and ``moe_layer_freq``, 1, which are then dropped), ``layer_types`` (indexed
    attention in layers 0 and 1 and every fourth from 1, sliding elsewhere, unless ``use_sliding_window`` is false;
    ``use_dsa`` false makes the indexed layers full_attention ones, true the other way), the window
    (``sliding_window_size``, 512, where ``sliding_window`` is null), the shared MLP's width
    (``moe_shared_expert_intermediate_size`` over ``shared_experts_intermediate_size``) and ``per_layer_config``."""
    layers = _get(config, origin, "num_hidden_layers")
    config = dict(config)
    first, every = config.pop("first_k_dense_replace", None), config.pop("moe_layer_freq", None)
    first, every = 1 if first is None else first, 1 if every is None else every
    if not config.get("mlp_layer_types"):
        config["mlp_layer_types"] = [
            "sparse" if i >= first and (every and i % every == 0) else "dense" for i in range(layers)
        ]
    use_dsa = config.get("use_dsa", None if "per_layer_config" in config else True)
    if not config.get("layer_types"):
        full = "full_attention" if use_dsa is False else "indexed_attention"
        sliding = config.get("use_sliding_window", True)
        config["layer_types"] = [
            full if not sliding or i < 2 or i % 4 == 1 else "sliding_attention" for i in range(layers)
        ]
    if use_dsa is not None:  # the indexed layers full ones, or the other way
        old, new = ("full_attention", "indexed_attention") if use_dsa else ("indexed_attention", "full_attention")
        config["layer_types"] = [new if t == old else t for t in config["layer_types"]]
    if config.get("sliding_window") is None:
        config["sliding_window"] = config.get("sliding_window_size", 512)
    shared = config.get("moe_shared_expert_intermediate_size")
    if shared is not None:
        config["shared_experts_intermediate_size"] = shared
    if config.get("per_layer_config") is None:  # the swa_* fields, as its __post_init__ reads them
        swa = {name: config.get(f"swa_{name}", default) for name, default in SWA_DEFAULTS.items()}
        swa["qk_rope_head_dim"] = config.get("swa_qk_rope_head_dim", swa["head_dim"] - swa["qk_nope_head_dim"])
        types = config["layer_types"]
        config["per_layer_config"] = {i: swa for i, t in enumerate(types) if t == "sliding_attention"}
    return config


def _layer_widths(config: dict[str, Any], origin: str) -> list[dict[str, Any]]:
    """Each layer's MLA widths: the model's, with its ``per_layer_config`` entry over them."""
    layers = _get(config, origin, "num_hidden_layers")
    overrides = config["per_layer_config"]
    if not isinstance(overrides, dict):
        raise LmcalcError(f"{origin}: config.json per_layer_config must be an object, not {token(overrides)}")
    try:  # saved with the layer as text, padded ('02')
        entries = {int(k): v for k, v in overrides.items()}
    except (TypeError, ValueError):
        raise LmcalcError(f"{origin}: config.json per_layer_config's keys must be layer numbers") from None
    model = {name: config.get(name) for name in MLA_FIELDS}
    widths = []
    for i in range(layers):
        entry = entries.pop(i, {})
        if not isinstance(entry, dict) or set(entry) - {*MLA_FIELDS, "head_dim"}:
            raise LmcalcError(f"{origin}: config.json per_layer_config may set {', '.join(MLA_FIELDS)} and head_dim "
                              f"only, not {token(entry)}")  # fmt: skip
        widths.append(model | {"head_dim": config.get("head_dim")} | entry)
    if entries:
        raise LmcalcError(f"{origin}: config.json per_layer_config names layer {min(entries)} of {layers}")
    return widths


def dots3_note(config: dict[str, Any], origin: str, fields: dict[str, Any]) -> dict[str, Any]:
    """dots.3 Note's fields beside DeepSeek-V3's reading (Dots3NoteTextAttention, Dots3NoteTextMoE): the local layers'
    MLA widths (``mla.local``), the RoPE key's norm, the head gate, the indexer in the indexed layers, one shared MLP
    of n_shared_experts · shared_experts_intermediate_size, and MLPs without biases whatever mlp_bias says."""
    types = config["layer_types"]
    if set(types) - set(LAYER_KINDS) or len(types) != fields["num_layers"]:
        raise LmcalcError(f"{origin}: config.json layer_types must give each of the {fields['num_layers']} layers one "
                          f"of {', '.join(LAYER_KINDS)}")  # fmt: skip
    if "indexed_attention" in types and "full_attention" in types:
        raise LmcalcError(f"{origin}: config.json layer_types has both indexed_attention and full_attention layers: "
                          "lmcalc runs the indexer in every layer that attends beyond a window")  # fmt: skip
    widths = _layer_widths(config, origin)
    # RoPE's share of each kind's head_dim, qk_rope_head_dim / head_dim, which the class writes over any the file gives
    shares = {w["qk_rope_head_dim"] / w["head_dim"] for w in widths if w["head_dim"]}
    widths = [{k: v for k, v in w.items() if k != "head_dim"} for w in widths]  # it sizes nothing else
    kinds = {t: [w for w, u in zip(widths, types, strict=True) if u == t] for t in set(types)}
    local = kinds.pop("sliding_attention", [])
    if any(w != widths[0] for ws in kinds.values() for w in ws) or any(w != local[0] for w in local):
        raise LmcalcError(f"{origin}: config.json per_layer_config must give every sliding_attention layer the same "
                          "widths and the other layers none of their own: lmcalc reads two kinds of layer")  # fmt: skip
    mla: dict[str, Any] = fields["mla"] | {"rope_key_norm": True}
    model = widths[0] if kinds else local[0]
    if local and local[0] != model:
        w = local[0]
        mla["local"] = {"heads": w["num_attention_heads"], **{k: w[k] for k in MLA_FIELDS[2:]}}
    if "indexed_attention" in types:
        mla["indexer"] = {"heads": _get(config, origin, "index_n_heads"),
                          "head_dim": _get(config, origin, "index_head_dim"),
                          "top_k": _get(config, origin, "index_topk")}  # fmt: skip
    fields = fields | {"mla": mla, "attention_head_gate": "activation", "mlp_bias": False,
                       "rotary_fraction": shares.pop() if len(shares) == 1 else 1.0}  # fmt: skip
    if fields.get("moe"):
        width = _get(config, origin, "n_shared_experts") * _get(config, origin, "shared_experts_intermediate_size")
        fields["moe"] = fields["moe"] | {"shared_experts": 1, "shared_expert_ffn_size": width, "router_fp32": True}
    return fields
