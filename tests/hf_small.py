"""Small Hugging Face configs of the model types lmcalc reads, for the fine-tuning comparisons with PEFT
(tests/test_finetune_peft.py, test_finetune_flops.py), and lmcalc's model read from the very same config."""

from __future__ import annotations

import transformers

from lmcalc.hf_config import model_from_hf_config
from lmcalc.specs import ModelSpec


def small_config(arch: str, layers: int) -> transformers.PretrainedConfig:
    """A few-layer config of ``arch`` (widths of 96 to 128, vocabulary 512), dropout off."""
    llama_like = dict(vocab_size=512, hidden_size=128, num_attention_heads=4, num_hidden_layers=layers,
                      intermediate_size=352)  # fmt: skip
    if arch == "gpt2":
        return transformers.GPT2Config(vocab_size=512, n_embd=96, n_layer=layers, n_head=4, n_positions=256,
                                       resid_pdrop=0, embd_pdrop=0, attn_pdrop=0)  # fmt: skip
    if arch == "deepseek_v3":
        return transformers.DeepseekV3Config(
            vocab_size=512, hidden_size=128, num_attention_heads=4, num_key_value_heads=4, num_hidden_layers=layers,
            intermediate_size=256, moe_intermediate_size=64, n_routed_experts=8, num_experts_per_tok=2,
            n_shared_experts=1, first_k_dense_replace=1, q_lora_rank=48, kv_lora_rank=32, qk_nope_head_dim=16,
            qk_rope_head_dim=8, v_head_dim=16, n_group=2, topk_group=1,
        )  # fmt: skip
    extra = {
        "llama": dict(num_key_value_heads=2),
        "mistral": dict(num_key_value_heads=1),
        "qwen2": dict(num_key_value_heads=2),
        "qwen3": dict(num_key_value_heads=2, head_dim=48),
        "olmo2": dict(num_key_value_heads=4),
        "mixtral": dict(num_key_value_heads=2, num_local_experts=4),
        "phi3": dict(num_key_value_heads=2, pad_token_id=0, bos_token_id=1, eos_token_id=2),
        "gemma": dict(num_key_value_heads=2, head_dim=48, pad_token_id=0, bos_token_id=1, eos_token_id=2),
        # the 31B's layer kinds: sliding layers, then a global one at heads of 64 with one KV head and K = V
        "gemma4_text": dict(num_key_value_heads=2, head_dim=32, sliding_window=64, hidden_size_per_layer_input=0,
                            global_head_dim=64, num_global_key_value_heads=1, attention_k_eq_v=True,
                            layer_types=["sliding_attention"] * (layers - 1) + ["full_attention"]),
        # AltUp's four streams, LAuReL, per-layer inputs; no layer reusing K and V (layers of 2 make none)
        "gemma3n_text": dict(num_key_value_heads=2, head_dim=32, hidden_size_per_layer_input=16,
                             vocab_size_per_layer_input=512, laurel_rank=8, num_kv_shared_layers=0,
                             layer_types=["sliding_attention"] * (layers - 1) + ["full_attention"]),
    }[arch]  # fmt: skip
    classes = {"llama": "LlamaConfig", "mistral": "MistralConfig", "qwen2": "Qwen2Config", "qwen3": "Qwen3Config",
               "olmo2": "Olmo2Config", "mixtral": "MixtralConfig", "phi3": "Phi3Config",
               "gemma": "GemmaConfig", "gemma4_text": "Gemma4TextConfig",
               "gemma3n_text": "Gemma3nTextConfig"}  # fmt: skip
    return getattr(transformers, classes[arch])(**llama_like, **extra)


def lmcalc_model(config: transformers.PretrainedConfig) -> ModelSpec:
    """lmcalc's model, read by its own config.json reader from ``config``."""
    kind = config.model_type
    return ModelSpec.model_validate(model_from_hf_config(config.to_dict(), kind, f"{kind} config"))
