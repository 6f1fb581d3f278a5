"""Reading a Hugging Face ``config.json`` as plain JSON (no transformers, no network) into ModelSpec fields.

Supported ``model_type`` families: gpt2, llama, mistral, mixtral, qwen2, qwen3, olmo2, deepseek_v3
(MLA + MoE), and the Llama-shaped gemma (GeGLU, head_dim apart from the width, tied), granite, smollm3 (its NoPE
layers have the same weights), phi3 (fused qkv_proj and gate_up_proj) and ernie4_5. Other types are refused with
a clear message rather than guessed at: their modules differ in ways a config does not spell out (GPT-J's rotary
and bias layout, GPT-NeoX's parallel block, Qwen2-MoE's gated shared expert, Gemma-2's extra norms), and a wrong
count called exact is worse than none. Write a YAML preset for those.
"""

from __future__ import annotations

from typing import Any

from lmcalc.errors import LmcalcError

_GELU_ACTS = {"gelu", "gelu_new", "gelu_pytorch_tanh", "gelu_fast"}
LLAMA_LIKE = (
    "llama", "mistral", "mixtral", "qwen2", "qwen3", "olmo2", "deepseek_v3", "gemma", "granite", "smollm3", "phi3",
    "ernie4_5",
)  # fmt: skip
SUPPORTED = ("gpt2", *LLAMA_LIKE)
TIED_BY_DEFAULT = ("gemma", "smollm3", "ernie4_5")
"""Types whose config class ties the head to the embedding when config.json does not say (transformers 5.24's
GemmaConfig, SmolLM3Config, Ernie4_5Config); the other Llama-like classes untie it."""
FUSED = {"phi3": ["qkv", "gate_up"]}
"""Types whose modules fuse weights (Phi-3's qkv_proj and gate_up_proj): the same count, one LoRA adapter each."""


def _get(config: dict[str, Any], origin: str, *keys: str, default: Any = ...) -> Any:
    for key in keys:
        if config.get(key) is not None:
            return config[key]
    if default is ...:
        raise LmcalcError(f"{origin}: config.json has none of the fields {', '.join(keys)}")
    return default


def model_from_hf_config(config: dict[str, Any], name: str, origin: str) -> dict[str, Any]:
    """ModelSpec fields for a HF config; the caller validates them."""
    model_type = str(config.get("model_type", "")).lower()
    if model_type not in SUPPORTED:
        raise LmcalcError(
            f"{origin}: config.json model_type {model_type or '(missing)'!r} is not supported (supported: "
            f"{', '.join(SUPPORTED)}); describe the model in a YAML preset instead (see docs/presets.md)"
        )
    if model_type == "gpt2":
        hidden = _get(config, origin, "n_embd")
        return {
            "name": name,
            "display_name": f"{name} (from config.json)",
            "vocab_size": _get(config, origin, "vocab_size"),
            "hidden_size": hidden,
            "num_layers": _get(config, origin, "n_layer"),
            "num_heads": _get(config, origin, "n_head"),
            "ffn_size": _get(config, origin, "n_inner", default=4 * hidden),
            "ffn_kind": "gelu_mlp",
            "norm_kind": "layernorm",
            "attention_bias": "all",
            "mlp_bias": True,
            "fused_linears": ["qkv"],  # GPT-2's c_attn
            "tied_embeddings": bool(config.get("tie_word_embeddings", True)),
            "position_embedding": "learned",
            "max_seq_len": _get(config, origin, "n_positions", "n_ctx"),
            # GPT2Config's dropout probabilities default to 0.1
            "dropout": any(config.get(key, 0.1) > 0 for key in ("resid_pdrop", "embd_pdrop", "attn_pdrop")),
            "sources": [origin],
        }
    act = str(_get(config, origin, "hidden_act", "hidden_activation", default="silu")).lower()
    ffn_kind = "geglu" if act in _GELU_ACTS else "swiglu"
    bias = bool(config.get("attention_bias", False))
    fields: dict[str, Any] = {
        "name": name,
        "display_name": f"{name} (from config.json)",
        "vocab_size": _get(config, origin, "vocab_size"),
        "hidden_size": _get(config, origin, "hidden_size"),
        "num_layers": _get(config, origin, "num_hidden_layers"),
        "num_heads": _get(config, origin, "num_attention_heads"),
        "num_kv_heads": config.get("num_key_value_heads"),
        "head_dim": config.get("head_dim"),
        "ffn_size": _get(config, origin, "intermediate_size"),
        "ffn_kind": ffn_kind,
        "norm_kind": "rmsnorm",
        "attention_bias": "qkv" if model_type.startswith("qwen2") else ("all" if bias else "none"),
        "mlp_bias": bool(config.get("mlp_bias", False)),
        # each config class's own default when config.json does not say (TIED_BY_DEFAULT)
        "tied_embeddings": bool(config.get("tie_word_embeddings", model_type in TIED_BY_DEFAULT)),
        "position_embedding": "rope",
        "max_seq_len": _get(config, origin, "max_position_embeddings"),
        "sources": [origin],
    }
    if model_type in FUSED:
        fields["fused_linears"] = FUSED[model_type]
    if model_type == "ernie4_5":
        fields["attention_bias"] = "all" if config.get("use_bias") else "none"
        fields["mlp_bias"] = bool(config.get("use_bias", False))
    if model_type == "olmo2":
        fields["qk_norm"] = "full"
    if model_type == "qwen3" or model_type.startswith("qwen3"):
        fields["qk_norm"] = "per_head"
    if config.get("kv_lora_rank"):
        fields["mla"] = {
            "q_lora_rank": config.get("q_lora_rank"),
            "kv_lora_rank": config["kv_lora_rank"],
            "qk_nope_head_dim": _get(config, origin, "qk_nope_head_dim"),
            "qk_rope_head_dim": _get(config, origin, "qk_rope_head_dim"),
            "v_head_dim": _get(config, origin, "v_head_dim"),
        }
        fields["num_kv_heads"] = None
    experts = config.get("num_local_experts") or config.get("n_routed_experts") or config.get("num_experts")
    if experts:
        fields["moe"] = {
            "num_experts": experts,
            "experts_per_token": _get(config, origin, "num_experts_per_tok"),
            "shared_experts": config.get("n_shared_experts") or 0,
            "expert_ffn_size": _get(config, origin, "moe_intermediate_size", "intermediate_size"),
            "dense_layers": config.get("first_k_dense_replace") or 0,
            "router_bias": model_type == "deepseek_v3",
            # group-limited routing: each token's experts come from topk_group of n_group groups, which training
            # places a group to a node (DeepSeek-V3 §2.1.2: node-limited routing)
            "node_limit": config.get("topk_group") if (config.get("n_group") or 1) > 1 else None,
        }
    return fields
