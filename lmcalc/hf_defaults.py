"""What transformers 5.24.0's configuration classes give the fields lmcalc's reader
(``hf_config``) would otherwise fill itself, by model type, where a config.json leaves them out: written by
``python scripts/hf_class_defaults.py`` from each class's ``__init__`` defaults. Do not edit by hand."""

CLASS_DEFAULTS: dict[str, dict[str, object]] = {
    "gpt_neox": {"attention_bias": True},  # GPTNeoXConfig
    "llama": {"attention_bias": False, "mlp_bias": False},  # LlamaConfig
    "mistral": {"num_key_value_heads": 8},  # MistralConfig
    "mixtral": {"num_key_value_heads": 8},  # MixtralConfig
    "qwen2": {"num_key_value_heads": 32},  # Qwen2Config
    "qwen2_moe": {"num_key_value_heads": 16},  # Qwen2MoeConfig
    "qwen3": {"attention_bias": False, "head_dim": 128, "num_key_value_heads": 32},  # Qwen3Config
    "qwen3_moe": {"attention_bias": False, "num_key_value_heads": 4},  # Qwen3MoeConfig
    "olmo2": {"attention_bias": False},  # Olmo2Config
    "olmoe": {"attention_bias": False},  # OlmoeConfig
    "deepseek_v2": {"attention_bias": False, "mlp_bias": False},  # DeepseekV2Config
    "deepseek_v3": {"attention_bias": False, "num_key_value_heads": 128},  # DeepseekV3Config
    "gemma": {"attention_bias": False, "head_dim": 256, "num_key_value_heads": 16},  # GemmaConfig
    "gemma2": {"attention_bias": False, "head_dim": 256, "num_key_value_heads": 4},  # Gemma2Config
    "gemma3_text": {"attention_bias": False, "head_dim": 256, "num_key_value_heads": 4},  # Gemma3TextConfig
    "granite": {"attention_bias": False, "mlp_bias": False},  # GraniteConfig
    "smollm3": {"attention_bias": False, "mlp_bias": False, "num_key_value_heads": 4},  # SmolLM3Config
    "ernie4_5": {"use_bias": False, "head_dim": 128, "num_key_value_heads": 2},  # Ernie4_5Config
    "glm4": {"attention_bias": True, "head_dim": 128, "num_key_value_heads": 2},  # Glm4Config
    "glm4_moe": {"attention_bias": False, "num_key_value_heads": 8},  # Glm4MoeConfig
    "gpt_oss": {"attention_bias": True, "head_dim": 64, "num_key_value_heads": 8},  # GptOssConfig
    "cohere": {"attention_bias": False},  # CohereConfig
    "cohere2": {"attention_bias": False},  # Cohere2Config
    "starcoder2": {"use_bias": True, "num_key_value_heads": 2},  # Starcoder2Config
    "llama4_text": {"attention_bias": False, "head_dim": 128, "num_key_value_heads": 8},  # Llama4TextConfig
    "jamba": {"num_key_value_heads": 8},  # JambaConfig
}
