"""Reading the Byte Latent Transformer (``blt``) as transformers 5.24's BltConfig reads it: four sub-configurations,
each at its class's defaults where config.json leaves it out (BltLocalEncoderConfig, BltLocalDecoderConfig,
BltGlobalTransformerConfig, BltPatcherConfig), around the top-level fields that size the hash tables, the patches'
k and the local window. lmcalc's ``ModelSpec`` layers are the local decoder's (a Llama-like stack over the bytes,
every layer within the window); the rest is ``byte_specs.ByteLatentSpec``."""

from __future__ import annotations

from typing import Any

from lmcalc.errors import LmcalcError, token

KIND = "blt"
TOP: dict[str, Any] = {"vocab_size": 260, "patch_in_forward": True, "patching_mode": "entropy",
                       "local_attention_window_len": 512, "cross_attn_k": 2, "encoder_hash_byte_group_size": None,
                       "encoder_hash_byte_group_vocab": 500002, "encoder_hash_byte_group_nb_functions": 1}  # fmt: skip
"""BltConfig's defaults for the fields lmcalc reads (the byte-group sizes default to 3 to 8)."""
STACK: dict[str, Any] = {"num_key_value_heads": None, "rms_norm_eps": 1e-5, "hidden_act": "silu"}
ENCODER = STACK | {"vocab_size": 260, "cross_attn_all_layers": False, "cross_attn_k": 2, "hidden_size": 1024,
                   "num_attention_heads": 16, "num_hidden_layers": 1, "intermediate_size": None,
                   "max_position_embeddings": 24576}  # fmt: skip
DECODER = STACK | {"cross_attn_all_layers": True, "cross_attn_k": 2, "hidden_size_global": 2048, "hidden_size": 1024,
                   "num_attention_heads": 16, "num_hidden_layers": 9, "intermediate_size": 2816,
                   "max_position_embeddings": 24576}  # fmt: skip
GLOBAL = STACK | {"hidden_size": 2048, "num_attention_heads": 16, "num_hidden_layers": 25, "intermediate_size": 5632}
PATCHER = STACK | {"vocab_size": 260, "hidden_size": 768, "num_hidden_layers": 14, "num_attention_heads": 12,
                   "intermediate_size": 2048, "sliding_window": 512}  # fmt: skip
"""Each sub-configuration class's defaults for the fields lmcalc reads."""


def _part(config: dict[str, Any], key: str, defaults: dict[str, Any], origin: str) -> dict[str, Any]:
    """A sub-configuration as its class reads it: config.json's fields over the class's defaults, the key-value heads
    the query heads where none are given, and the MLP 8·h/3 wide (floored) where intermediate_size is empty."""
    given = config.get(key) or {}
    if not isinstance(given, dict):
        raise LmcalcError(f"{origin}: config.json {key} must be an object, not {token(given)}")
    part = defaults | {name: value for name, value in given.items() if name in defaults}
    for name in ("hidden_size", "num_attention_heads", "num_hidden_layers"):
        if not isinstance(part[name], int) or isinstance(part[name], bool) or part[name] < 1:
            raise LmcalcError(f"{origin}: config.json {key}.{name} must be a whole number, not {token(part[name])}")
    part["num_key_value_heads"] = part["num_key_value_heads"] or part["num_attention_heads"]
    part["intermediate_size"] = part["intermediate_size"] or int(8 * part["hidden_size"] / 3)
    return part


def _stack(part: dict[str, Any]) -> dict[str, Any]:
    return {"width": part["hidden_size"], "layers": part["num_hidden_layers"], "heads": part["num_attention_heads"],
            "kv_heads": part["num_key_value_heads"], "ffn_size": part["intermediate_size"]}  # fmt: skip


def blt_config(config: dict[str, Any], origin: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The local decoder as a Mistral-like config.json (every layer within the window, local_attention_window_len;
    the encoder's byte embedding its embedding, the top-level vocabulary its head's rows), and the
    ``ByteLatentSpec`` fields. Refused where transformers' forward could not run: an encoder and a decoder of two
    widths (the decoder starts from the encoder's states), a decoder whose hidden_size_global is not the global
    transformer's width, or patches of more than one k."""
    top = TOP | {name: config[name] for name in TOP if name in config}
    encoder, decoder = (
        _part(config, f"{name}_config", defaults, origin)
        for name, defaults in (("encoder", ENCODER), ("decoder", DECODER))
    )
    latent, patcher = (
        _part(config, f"{name}_config", defaults, origin)
        for name, defaults in (("global", GLOBAL), ("patcher", PATCHER))
    )
    if encoder["hidden_size"] != decoder["hidden_size"] or decoder["hidden_size_global"] != latent["hidden_size"]:
        raise LmcalcError(f"{origin}: config.json's BLT must have an encoder as wide as its decoder and a decoder "
                          "whose hidden_size_global is the global transformer's hidden_size: transformers' forward "
                          "needs both")  # fmt: skip
    k = {top["cross_attn_k"], encoder["cross_attn_k"], decoder["cross_attn_k"]}
    if len(k) != 1:
        raise LmcalcError(f"{origin}: config.json gives cross_attn_k {sorted(k, key=str)} at the top and in the "
                          "encoder and decoder: transformers' forward needs one")  # fmt: skip
    groups = top["encoder_hash_byte_group_size"] or [3, 4, 5, 6, 7, 8]
    h, heads = decoder["hidden_size"], decoder["num_attention_heads"]
    local = {"vocab_size": encoder["vocab_size"], "hidden_size": h, "num_hidden_layers": decoder["num_hidden_layers"],
             "num_attention_heads": heads, "num_key_value_heads": decoder["num_key_value_heads"],
             "head_dim": h // heads, "intermediate_size": decoder["intermediate_size"],
             "hidden_act": decoder["hidden_act"], "rms_norm_eps": decoder["rms_norm_eps"],
             "max_position_embeddings": decoder["max_position_embeddings"], "tie_word_embeddings": False,
             "sliding_window": top["local_attention_window_len"]}  # fmt: skip
    byte_latent = {
        "cross_attn_k": k.pop(),
        "hash_vocab": top["encoder_hash_byte_group_vocab"],
        "hash_tables": len(groups) * top["encoder_hash_byte_group_nb_functions"],
        "encoder": _stack(encoder),
        "encoder_cross_every_layer": bool(encoder["cross_attn_all_layers"]),
        "decoder_cross_every_layer": bool(decoder["cross_attn_all_layers"]),
        "global_stack": _stack(latent),
        "entropy_patching": top["patching_mode"] == "entropy",
    }
    if top["patch_in_forward"]:
        byte_latent["patcher"] = _stack(patcher) | {"vocab_size": patcher["vocab_size"],
                                                    "window": patcher["sliding_window"]}  # fmt: skip
    head = {"head_vocab": top["vocab_size"]} if top["vocab_size"] != encoder["vocab_size"] else {}
    return local, {"byte_latent": byte_latent, **head}
