"""Checking the fields of a config.json that lmcalc reads before it uses them (``check_fields``), and which fields
those are (``READ_FIELDS``, whose class defaults ``lmcalc/hf_defaults.py`` holds). JSON has one number type and
Python's operators take text too ("768" * 4 is text repeated four times, and the string "false" is true)."""

from __future__ import annotations

from typing import Any

from lmcalc.errors import LmcalcError, token
from lmcalc.spec_base import MAX_LAYERS

WHOLE_NUMBERS = frozenset(
    {
        "vocab_size", "hidden_size", "n_embd", "n_embed", "num_hidden_layers", "n_layer", "num_attention_heads",
        "n_head", "num_key_value_heads", "num_kv_heads", "head_dim", "intermediate_size", "intermediate_size_mlp",
        "n_inner", "ffn_hidden_size", "max_position_embeddings", "n_positions", "n_ctx", "seq_length",
        "num_ln_in_parallel_attn", "sliding_window", "sliding_window_pattern", "attention_chunk_size",
        "no_rope_layer_interval", "num_local_experts", "n_routed_experts", "num_experts", "num_experts_per_tok",
        "experts_per_token", "n_shared_experts", "moe_intermediate_size", "shared_expert_intermediate_size",
        "first_k_dense_replace", "moe_layer_freq", "decoder_sparse_step", "interleave_moe_layer_step",
        "expert_layer_period", "expert_layer_offset", "n_group", "topk_group", "q_lora_rank", "kv_lora_rank",
        "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "mamba_expand", "mamba_d_state", "mamba_d_conv",
        "attn_layer_period", "attn_layer_offset", "num_nextn_predict_layers", "shared_intermediate_size",
        "moe_num_experts", "moe_k", "moe_num_shared_experts", "moe_layer_start_index", "moe_layer_end_index",
        "moe_layer_interval", "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
        "linear_value_head_dim", "linear_conv_kernel_dim", "full_attention_interval", "mamba_n_heads",
        "mamba_n_groups", "mamba_chunk_size", "ffn_dim", "word_embed_proj_dim", "num_layers", "num_heads",
        "window_size", "num_shared_experts", "d_model", "n_heads", "n_layers", "max_seq_len", "moe_topk",
        "prefix_dense_intermediate_size", "num_dense_layers", "conv_L_cache", "block_multiple_of", "block_ff_dim",
        "mamba_num_heads", "mamba_head_dim", "n_groups", "ssm_state_size", "conv_kernel", "chunk_size",
        "moe_shared_expert_intermediate_size", "moe_latent_size", "mamba_d_ssm", "state_size", "index_n_heads",
        "index_head_dim", "index_topk", "block_size", "dense_intermediate_size", "sliding_window_size",
        "zero_expert_num", "gated_norm_rank", "kv_channels", "global_head_dim", "num_global_key_value_heads",
        "num_kv_shared_layers", "hidden_size_per_layer_input", "vocab_size_per_layer_input", "top_k_experts",
        "altup_num_inputs", "laurel_rank", "attention_hidden_size", "context_length", "lru_width", "conv1d_width",
        "attention_window_size", "o_groups", "o_lora_rank", "hc_mult", "compress_rate_csa", "compress_rate_hca",
        "n_mamba_heads", "mamba_ngroups", "num_mem_blocks", "adapter_rank", "attention_head_dim",
        "keep_window_size", "n_input_layers", "n_recurrent_layers", "n_output_layers", "n_recurrent_loops",
        "H_cycles", "L_cycles", "num_layers_per_stack", "num_blocks", "embedding_dim", "ffn_round_up_to_multiple_of",
        "dim_head", "dim_ff", "prompt_length", "prompt_types", "segment_types", "position_bias_num_buckets",
        "cca_time0", "cca_time1", "router_hidden_size", "swa_num_attention_heads", "swa_num_key_value_heads",
        "swa_head_dim", "d_rel", "rel_extent", "conv_kernel_size", "unpadded_vocab_size", "n_layers_per_attn_res_block",
        "shared_experts_intermediate_size", "swa_q_lora_rank", "swa_kv_lora_rank", "swa_qk_nope_head_dim",
        "swa_qk_rope_head_dim", "swa_v_head_dim", "loop_layer_index_start", "loop_layer_index_end", "loop_num_passes",
        "loop_gate_rank",
    }
)  # fmt: skip
NUMBERS = frozenset(
    {"resid_pdrop", "embd_pdrop", "attn_pdrop", "attention_dropout", "residual_dropout", "attn_logit_softcapping",
     "final_logit_softcapping", "dropout", "hidden_dropout_prob", "attention_probs_dropout_prob",
     "activation_dropout", "embed_dropout", "resid_dropout", "clip_qkv", "rms_norm_eps",
     "block_ffn_dim_multiplier", "expand", "swiglu_limit", "logits_soft_cap", "qk_dim_factor", "v_dim_factor",
     "ffn_proj_factor", "output_logit_soft_cap"}
)  # fmt: skip
FLAGS = frozenset(
    {
        "tie_word_embeddings", "attention_bias", "use_bias", "mlp_bias", "bias", "use_parallel_residual",
        "new_decoder_architecture", "parallel_attn", "multi_query", "alibi", "use_sliding_window", "use_qk_norm",
        "mamba_conv_bias", "mamba_proj_bias", "lm_head_bias", "use_post_norm", "use_qkv_bias", "qk_layernorm",
        "attention_out_bias", "enable_bias", "do_layer_norm_before", "layer_norm_elementwise_affine", "conv_bias",
        "block_auto_adjust_ff_dim", "tie_embedding", "use_conv_bias", "projectors_bias", "mamba_rms_norm",
        "router_bias", "attention_k_eq_v", "use_double_wide_mlp", "enable_moe_block", "add_bias_linear",
        "use_shared_attention_adapter", "use_mem_rope", "is_moe", "use_dsa",
    }
)  # fmt: skip
TEXTS = frozenset(
    {
        "model_type",
        "hidden_act",
        "hidden_activation",
        "activation_function",
        "activation",
        "position_embedding_type",
        "mlp_hidden_act",
        "hybrid_override_pattern",
        "recurrent_kv_cache_mode",
        "mode",
    }
)
LISTS_OF_WHOLE_NUMBERS = frozenset(
    {
        "mlp_only_layers",
        "moe_layers",
        "no_rope_layers",
        "attn_layer_indices",
        "full_attn_idxs",
        "cross_attention_layers",
        "compress_ratios",
        "hybrid_layer_ids",
        "L_bp_cycles",
        "local_layer_ids",
    }
)
LISTS_OF_TEXTS = frozenset(
    {"layer_types", "mlp_layer_types", "attention_layers", "layers_block_type", "indexer_types", "block_types"}
)
VISION_WHOLE_NUMBERS = frozenset(
    {"hidden_size", "intermediate_size", "patch_size", "image_size", "num_channels", "num_hidden_layers"}
)
"""The fields of a config.json that lmcalc reads, by type: each is checked once, before it is used."""
READ_FIELDS = (WHOLE_NUMBERS | NUMBERS | FLAGS | (TEXTS - {"model_type"}) | LISTS_OF_WHOLE_NUMBERS | LISTS_OF_TEXTS) | {
    "mamba_dt_rank",
    "mamba_d_head",
}
"""The fields whose class defaults ``lmcalc/hf_defaults.py`` holds (``scripts/hf_class_defaults.py``)."""


def _is_whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _wrong_type(key: str, value: Any, vision: bool = False) -> str | None:
    """What ``value`` (config's ``key``) should have been, or None if it is right. Null stands for absent."""
    if value is None:
        return None
    if key == "sliding_window_pattern" and not vision:  # Gemma 3's 6, or EXAONE 4's "LLLG" (one letter a layer)
        return (
            None
            if _is_whole(value) or (isinstance(value, str) and set(value) <= {"L", "G"})
            else 'an integer or "L"s and "G"s'
        )
    if key == "intermediate_size" and not vision and isinstance(value, list):  # Gemma 3n's, a width a layer
        return None if value and all(_is_whole(v) for v in value) else "an integer or a list of integers"
    if key in (VISION_WHOLE_NUMBERS if vision else WHOLE_NUMBERS) and not _is_whole(value):
        return "an integer"
    if vision:
        return "true or false" if key == "vision_use_head" and not isinstance(value, bool) else None
    if key in ("mamba_dt_rank", "mamba_d_head") and not (_is_whole(value) or value == "auto"):
        return 'an integer or "auto"'
    if key in NUMBERS and not _is_number(value):
        return "a number"
    if key in FLAGS and not isinstance(value, bool):
        return "true or false"
    if key in TEXTS and not isinstance(value, str):
        return "text"
    if key in LISTS_OF_WHOLE_NUMBERS and not (isinstance(value, list) and all(_is_whole(v) for v in value)):
        return "a list of integers"
    if key in LISTS_OF_TEXTS and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
        return "a list of layer types"
    return None


def check_fields(config: dict[str, Any], origin: str, within: str = "") -> None:
    """Refuse a field lmcalc reads whose value has the wrong type, naming it: ``n_embd`` ``"768"`` would count 14 P
    parameters. The text model's and the vision tower's fields of a multimodal config are checked too."""
    for key, value in config.items():
        wanted = _wrong_type(key, value, vision=within == "vision_config")
        if wanted:
            raise LmcalcError(
                f"{origin}: config.json {within + '.' if within else ''}{key} must be {wanted}, not {token(value)}"
            )
    for nested in ("text_config", "vision_config"):
        if not within and isinstance(config.get(nested), dict):
            check_fields(config[nested], origin, nested)


def get(config: dict[str, Any], origin: str, *keys: str, default: Any = ...) -> Any:
    for key in keys:
        if config.get(key) is not None:
            return config[key]
    if default is ...:
        raise LmcalcError(f"{origin}: config.json has none of the fields {', '.join(keys)}")
    return default


def rotary_fraction(config: dict[str, Any], default: float) -> float:
    """The share of each head RoPE rotates: ``partial_rotary_factor``, as transformers 5 writes it (in
    rope_parameters, or one rope_parameters a layer type: their common share, MiMo-V2-Flash's 0.334; where the layer
    types differ, Laguna's and LFM3's, the whole head, as the layers that rotate all of it lay it out) or as older
    files do (beside it, or GPT-NeoX's ``rotary_pct``: Pythia's 0.25), else the class's ``default``."""
    rope = config.get("rope_parameters")
    if isinstance(rope, dict) and rope and all(isinstance(r, dict) for r in rope.values()):  # one a layer type
        factors = {r.get("partial_rotary_factor") for r in rope.values()}
        rope = {"partial_rotary_factor": factors.pop() if len(factors) == 1 else None}
    nested = rope.get("partial_rotary_factor") if isinstance(rope, dict) else None
    factor = nested if nested is not None else config.get("partial_rotary_factor", config.get("rotary_pct"))
    if factor is None:
        return default
    if isinstance(factor, bool) or not isinstance(factor, int | float) or not 0 < factor <= 1:
        raise LmcalcError(f"config.json partial_rotary_factor must be a number in (0, 1], not {token(factor)}")
    return float(factor)


LAYER_COUNT_FIELDS = ("num_hidden_layers", "n_layer", "n_layers", "num_layers")
"""The fields a config.json gives its layer count in (each type reads one of them)."""


def check_layer_count(config: dict[str, Any], origin: str) -> None:
    """Refuse more layers than a model may have (``MAX_LAYERS``) before the readers build a list a layer (Gemma 3's
    layer types, which 10⁹ layers would never finish): the spec's own bound, said before it can be checked."""
    for key in LAYER_COUNT_FIELDS:
        layers = config.get(key)
        if isinstance(layers, int) and not isinstance(layers, bool) and layers > MAX_LAYERS:
            raise LmcalcError(f"{origin}: config.json {key} must be at most {MAX_LAYERS:,}, not {token(layers)}")
