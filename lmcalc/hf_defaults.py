"""How transformers 5.24.0's configuration classes read a config.json, by model type: written by
``python scripts/hf_class_defaults.py`` (see its docstring). Do not edit by hand."""

from typing import Any

# one line a type: the lines are long, and pyproject.toml lets this file have them
# fmt: off
BUILDS_AS: dict[str, str] = {
    "exaone": "llama",
    "internlm3": "llama",
    "iquestcoder": "llama",
    "sarvam_mla": "deepseek_v3",
    "sarvam_moe": "glm4_moe",
}
"""A type whose causal-LM class is another type's own: read as that type."""
DECODER_TYPES: tuple[str, ...] = (
    "afmoe", "apertus", "apertus1p5_text", "arcee", "aria_text", "axk1", "axk2", "bailing_hybrid", "bamba", "beam",
    "biogpt", "bitnet", "bloom", "blt", "codegen", "cohere", "cohere2", "cohere2_moe", "cohere_compass_text",
    "cpmant", "ctrl", "cwm", "dbrx", "deepseek_v2", "deepseek_v3", "deepseek_v32", "deepseek_v4", "diffllama",
    "doge", "dory", "dots1", "dots3_note", "dots3_note_text", "emu3", "ernie4_5", "ernie4_5_moe", "exaone",
    "exaone4", "exaone_moe", "falcon", "falcon_h1", "falcon_mamba", "flex_olmo", "flint", "fuyu", "gemma", "gemma2",
    "gemma3", "gemma3_text", "gemma3n", "gemma3n_text", "gemma4", "gemma4_assistant", "gemma4_text",
    "gemma4_unified", "gemma4_unified_assistant", "gemma4_unified_text", "git", "glm", "glm4", "glm4_moe",
    "glm4_moe_lite", "glm_moe_dsa", "got_ocr2", "gpt-sw3", "gpt2", "gpt_bigcode", "gpt_neo", "gpt_neox",
    "gpt_neox_japanese", "gpt_oss", "gptj", "granite", "granite_swa", "granitemoe", "granitemoe_swa",
    "granitemoehybrid", "granitemoeshared", "helium", "hrm_text", "hunyuan_v1_dense", "hunyuan_v1_moe", "hy_v3",
    "hy_v4", "hyperclovax", "inkling2_loop_text", "inkling2_text", "inkling_text", "internlm3", "iquestcoder",
    "jais2", "jamba", "jetmoe", "kimi_linear", "kolibri1", "laguna", "lara_mini", "lfm2", "lfm2_moe", "lfm3",
    "llama", "llama4", "llama4_text", "longcat_flash", "mamba", "mamba2", "mellum", "mimo_v2_flash", "minicpm3",
    "minimax", "minimax_m2", "minimax_m3_vl_text", "ministral", "ministral3", "mistral", "mixtral", "mllama",
    "modernbert-decoder", "mpt", "nanochat", "nemotron", "nemotron_h", "olmo", "olmo2", "olmo3", "olmo_hybrid",
    "olmoe", "openai-gpt", "opt", "persimmon", "phi", "phi3", "phi4_multimodal", "phimoe", "qwen2", "qwen2_moe",
    "qwen3", "qwen3_5", "qwen3_5_moe", "qwen3_5_moe_text", "qwen3_5_text", "qwen3_moe", "qwen3_next", "qwen4_exp",
    "qwen4_exp_text", "recurrent_gemma", "rwkv", "sarvam_mla", "sarvam_moe", "seed_oss", "smollm3", "solar_open",
    "stablelm", "starcoder2", "vaultgemma", "xglm", "xlstm", "youtu", "zamba", "zamba2", "zaya",
)
"""The decoder-only types transformers registers as causal LMs (``scripts/hf_coverage.py``)."""
CLASS_DEFAULTS: dict[str, dict[str, Any]] = {
    "gpt2": {"activation_function": "gelu_new", "attn_pdrop": 0.1, "embd_pdrop": 0.1, "n_embd": 768, "n_head": 12, "n_layer": 12, "n_positions": 1024, "resid_pdrop": 0.1, "tie_word_embeddings": True, "vocab_size": 50257},  # GPT2Config
    "gpt_neox": {"attention_bias": True, "hidden_act": "gelu", "hidden_size": 6144, "intermediate_size": 24576, "max_position_embeddings": 2048, "num_attention_heads": 64, "num_hidden_layers": 44, "tie_word_embeddings": False, "use_parallel_residual": True, "vocab_size": 50432},  # GPTNeoXConfig
    "falcon": {"activation": "gelu", "alibi": False, "bias": False, "hidden_size": 4544, "max_position_embeddings": 2048, "multi_query": True, "new_decoder_architecture": False, "num_attention_heads": 71, "num_hidden_layers": 32, "parallel_attn": True, "tie_word_embeddings": True, "vocab_size": 65024},  # FalconConfig
    "bloom": {"hidden_size": 64, "n_head": 8, "n_layer": 2, "tie_word_embeddings": True, "vocab_size": 250880},  # BloomConfig
    "llama": {"attention_bias": False, "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 11008, "max_position_embeddings": 2048, "mlp_bias": False, "num_attention_heads": 32, "num_hidden_layers": 32, "tie_word_embeddings": False, "vocab_size": 32000},  # LlamaConfig
    "mistral": {"hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 14336, "max_position_embeddings": 131072, "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8, "sliding_window": 4096, "tie_word_embeddings": False, "vocab_size": 32000},  # MistralConfig
    "mixtral": {"hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 14336, "max_position_embeddings": 131072, "num_attention_heads": 32, "num_experts_per_tok": 2, "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 8, "tie_word_embeddings": False, "vocab_size": 32000},  # MixtralConfig
    "qwen2": {"hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 22016, "max_position_embeddings": 32768, "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32, "sliding_window": 4096, "tie_word_embeddings": False, "use_sliding_window": False, "vocab_size": 151936},  # Qwen2Config
    "qwen2_moe": {"decoder_sparse_step": 1, "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 5632, "max_position_embeddings": 32768, "moe_intermediate_size": 1408, "num_attention_heads": 16, "num_experts": 60, "num_experts_per_tok": 4, "num_hidden_layers": 24, "num_key_value_heads": 16, "shared_expert_intermediate_size": 5632, "sliding_window": 4096, "tie_word_embeddings": False, "use_sliding_window": False, "vocab_size": 151936},  # Qwen2MoeConfig
    "qwen3": {"attention_bias": False, "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 22016, "max_position_embeddings": 32768, "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32, "sliding_window": 4096, "tie_word_embeddings": False, "use_sliding_window": False, "vocab_size": 151936},  # Qwen3Config
    "qwen3_moe": {"attention_bias": False, "decoder_sparse_step": 1, "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 6144, "max_position_embeddings": 32768, "moe_intermediate_size": 768, "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8, "num_hidden_layers": 24, "num_key_value_heads": 4, "sliding_window": 4096, "tie_word_embeddings": False, "use_sliding_window": False, "vocab_size": 151936},  # Qwen3MoeConfig
    "olmo2": {"attention_bias": False, "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 11008, "max_position_embeddings": 2048, "num_attention_heads": 32, "num_hidden_layers": 32, "tie_word_embeddings": False, "vocab_size": 50304},  # Olmo2Config
    "olmoe": {"attention_bias": False, "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 2048, "max_position_embeddings": 4096, "num_attention_heads": 16, "num_experts": 64, "num_experts_per_tok": 8, "num_hidden_layers": 16, "tie_word_embeddings": False, "vocab_size": 50304},  # OlmoeConfig
    "deepseek_v2": {"attention_bias": False, "first_k_dense_replace": 0, "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 11008, "kv_lora_rank": 512, "max_position_embeddings": 2048, "mlp_bias": False, "moe_intermediate_size": 1407, "n_routed_experts": 64, "n_shared_experts": 2, "num_attention_heads": 32, "num_hidden_layers": 32, "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "tie_word_embeddings": False, "v_head_dim": 128, "vocab_size": 102400},  # DeepseekV2Config
    "deepseek_v3": {"attention_bias": False, "first_k_dense_replace": 3, "hidden_act": "silu", "hidden_size": 7168, "intermediate_size": 18432, "kv_lora_rank": 512, "max_position_embeddings": 4096, "moe_intermediate_size": 2048, "n_group": 8, "n_routed_experts": 256, "n_shared_experts": 1, "num_attention_heads": 128, "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 128, "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "tie_word_embeddings": False, "topk_group": 4, "v_head_dim": 128, "vocab_size": 129280},  # DeepseekV3Config
    "gemma": {"attention_bias": False, "head_dim": 256, "hidden_act": "gelu_pytorch_tanh", "hidden_size": 3072, "intermediate_size": 24576, "max_position_embeddings": 8192, "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 16, "tie_word_embeddings": True, "vocab_size": 256000},  # GemmaConfig
    "gemma2": {"attention_bias": False, "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 2304, "intermediate_size": 9216, "max_position_embeddings": 8192, "num_attention_heads": 8, "num_hidden_layers": 26, "num_key_value_heads": 4, "sliding_window": 4096, "tie_word_embeddings": True, "vocab_size": 256000},  # Gemma2Config
    "gemma3_text": {"attention_bias": False, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 2304, "intermediate_size": 9216, "max_position_embeddings": 131072, "num_attention_heads": 8, "num_hidden_layers": 26, "num_key_value_heads": 4, "sliding_window": 4096, "tie_word_embeddings": True, "vocab_size": 262208},  # Gemma3TextConfig
    "granite": {"attention_bias": False, "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 11008, "max_position_embeddings": 2048, "mlp_bias": False, "num_attention_heads": 32, "num_hidden_layers": 32, "tie_word_embeddings": False, "vocab_size": 32000},  # GraniteConfig
    "smollm3": {"attention_bias": False, "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 11008, "max_position_embeddings": 32768, "mlp_bias": False, "no_rope_layer_interval": 4, "num_attention_heads": 16, "num_hidden_layers": 36, "num_key_value_heads": 4, "tie_word_embeddings": True, "use_sliding_window": False, "vocab_size": 128256},  # SmolLM3Config
    "phi3": {"embd_pdrop": 0.0, "hidden_act": "silu", "hidden_size": 3072, "intermediate_size": 8192, "max_position_embeddings": 4096, "num_attention_heads": 32, "num_hidden_layers": 32, "resid_pdrop": 0.0, "tie_word_embeddings": False, "vocab_size": 32064},  # Phi3Config
    "ernie4_5": {"head_dim": 128, "hidden_act": "silu", "hidden_size": 1024, "intermediate_size": 3072, "max_position_embeddings": 131072, "num_attention_heads": 16, "num_hidden_layers": 18, "num_key_value_heads": 2, "tie_word_embeddings": True, "use_bias": False, "vocab_size": 103424},  # Ernie4_5Config
    "glm4": {"attention_bias": True, "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 13696, "max_position_embeddings": 131072, "num_attention_heads": 32, "num_hidden_layers": 40, "num_key_value_heads": 2, "tie_word_embeddings": False, "vocab_size": 151552},  # Glm4Config
    "glm4_moe": {"attention_bias": False, "first_k_dense_replace": 1, "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 10944, "max_position_embeddings": 131072, "moe_intermediate_size": 1408, "n_group": 1, "n_routed_experts": 128, "n_shared_experts": 1, "num_attention_heads": 96, "num_experts_per_tok": 8, "num_hidden_layers": 46, "num_key_value_heads": 8, "tie_word_embeddings": False, "topk_group": 1, "use_qk_norm": False, "vocab_size": 151552},  # Glm4MoeConfig
    "gpt_oss": {"attention_bias": True, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2880, "intermediate_size": 2880, "max_position_embeddings": 131072, "num_attention_heads": 64, "num_experts_per_tok": 4, "num_hidden_layers": 36, "num_key_value_heads": 8, "num_local_experts": 128, "sliding_window": 128, "tie_word_embeddings": False, "vocab_size": 201088},  # GptOssConfig
    "cohere": {"attention_bias": False, "hidden_act": "silu", "hidden_size": 8192, "intermediate_size": 22528, "max_position_embeddings": 8192, "num_attention_heads": 64, "num_hidden_layers": 40, "tie_word_embeddings": True, "use_qk_norm": False, "vocab_size": 256000},  # CohereConfig
    "cohere2": {"attention_bias": False, "hidden_act": "silu", "hidden_size": 8192, "intermediate_size": 22528, "max_position_embeddings": 8192, "num_attention_heads": 64, "num_hidden_layers": 40, "sliding_window": 4096, "tie_word_embeddings": True, "vocab_size": 256000},  # Cohere2Config
    "starcoder2": {"hidden_act": "gelu_pytorch_tanh", "hidden_size": 3072, "intermediate_size": 12288, "max_position_embeddings": 4096, "num_attention_heads": 24, "num_hidden_layers": 30, "num_key_value_heads": 2, "tie_word_embeddings": True, "use_bias": True, "vocab_size": 49152},  # Starcoder2Config
    "llama4_text": {"attention_bias": False, "attention_chunk_size": 8192, "head_dim": 128, "hidden_act": "silu", "hidden_size": 5120, "interleave_moe_layer_step": 1, "intermediate_size": 8192, "intermediate_size_mlp": 16384, "max_position_embeddings": 131072, "no_rope_layer_interval": 4, "num_attention_heads": 40, "num_experts_per_tok": 1, "num_hidden_layers": 48, "num_key_value_heads": 8, "num_local_experts": 16, "tie_word_embeddings": False, "use_qk_norm": True, "vocab_size": 202048},  # Llama4TextConfig
    "jamba": {"attn_layer_offset": 4, "attn_layer_period": 8, "expert_layer_offset": 1, "expert_layer_period": 2, "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 14336, "mamba_conv_bias": True, "mamba_d_conv": 4, "mamba_d_state": 16, "mamba_expand": 2, "mamba_proj_bias": False, "max_position_embeddings": 262144, "num_attention_heads": 32, "num_experts": 16, "num_experts_per_tok": 2, "num_hidden_layers": 32, "num_key_value_heads": 8, "tie_word_embeddings": False, "vocab_size": 65536},  # JambaConfig
    "exaone": {"attention_bias": False, "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 14336, "max_position_embeddings": 4096, "mlp_bias": False, "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8, "tie_word_embeddings": False, "vocab_size": 102400},  # ExaoneConfig
    "internlm3": {"attention_bias": False, "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 10240, "max_position_embeddings": 32768, "mlp_bias": False, "num_attention_heads": 32, "num_hidden_layers": 48, "num_key_value_heads": 2, "tie_word_embeddings": False, "vocab_size": 128512},  # InternLM3Config
    "iquestcoder": {"attention_bias": False, "head_dim": 128, "hidden_act": "silu", "hidden_size": 5120, "intermediate_size": 27648, "max_position_embeddings": 131072, "mlp_bias": False, "num_attention_heads": 40, "num_hidden_layers": 80, "num_key_value_heads": 8, "tie_word_embeddings": False, "vocab_size": 76800},  # IQuestCoderConfig
    "sarvam_mla": {"attention_bias": False, "first_k_dense_replace": 1, "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 16384, "kv_lora_rank": 512, "max_position_embeddings": 4096, "moe_intermediate_size": 2048, "n_group": 1, "n_routed_experts": 128, "n_shared_experts": 1, "num_attention_heads": 64, "num_experts_per_tok": 8, "num_hidden_layers": 32, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "tie_word_embeddings": False, "topk_group": 1, "v_head_dim": 128, "vocab_size": 262144},  # SarvamMLAConfig
    "sarvam_moe": {"attention_bias": False, "first_k_dense_replace": 1, "head_dim": 64, "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 8192, "max_position_embeddings": 131072, "moe_intermediate_size": 1024, "n_group": 1, "n_routed_experts": 128, "n_shared_experts": 1, "num_attention_heads": 64, "num_experts_per_tok": 6, "num_hidden_layers": 19, "num_key_value_heads": 4, "tie_word_embeddings": False, "topk_group": 1, "use_qk_norm": True, "vocab_size": 262144},  # SarvamMoEConfig
}
ATTRIBUTE_MAPS: dict[str, dict[str, str]] = {
    "gpt2": {"hidden_size": "n_embd", "max_position_embeddings": "n_positions", "num_attention_heads": "n_head", "num_hidden_layers": "n_layer"},
    "bloom": {"num_hidden_layers": "n_layer", "num_attention_heads": "n_head"},
    "mixtral": {"num_experts": "num_local_experts"},
    "qwen3_moe": {"num_experts": "num_local_experts"},
    "olmoe": {"num_local_experts": "num_experts"},
    "deepseek_v2": {"num_experts": "n_routed_experts"},
    "deepseek_v3": {"num_local_experts": "n_routed_experts", "num_mtp_layers": "num_nextn_predict_layers"},
    "glm4_moe": {"num_local_experts": "n_routed_experts", "num_mtp_layers": "num_nextn_predict_layers"},
    "gpt_oss": {"num_experts": "num_local_experts"},
    "jamba": {"num_local_experts": "num_experts"},
    "exaone": {"num_layers": "num_hidden_layers", "activation_function": "hidden_act"},
    "internlm3": {"qkv_bias": "attention_bias", "bias": "mlp_bias"},
    "sarvam_mla": {"num_local_experts": "n_routed_experts", "num_mtp_layers": "num_nextn_predict_layers", "num_experts": "n_routed_experts", "num_shared_experts": "n_shared_experts"},
    "sarvam_moe": {"num_local_experts": "n_routed_experts", "num_mtp_layers": "num_nextn_predict_layers", "num_experts": "n_routed_experts", "num_shared_experts": "n_shared_experts", "use_qkv_bias": "attention_bias"},
}
# fmt: on
