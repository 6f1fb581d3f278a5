"""Reading DeepSeek-V4 (``deepseek_v4``) as transformers 5.24's DeepseekV4Config reads it: ``layer_types`` (or the
legacy ``compress_ratios``, one 0, 4 or 128 a layer), else its ``__post_init__``'s pattern; ``compress_rates`` (or
the legacy ``compress_rate_csa`` and ``compress_rate_hca``); the grouped output projection, the indexer and the
hyper-connections' streams (``engine.model.compressed_attention``)."""

from __future__ import annotations

from typing import Any

from lmcalc.errors import LmcalcError, token
from lmcalc.hf_fields import get as _get

KINDS = {"sliding_attention": 0, "compressed_sparse_attention": 4, "heavily_compressed_attention": 128}
"""DeepSeek-V4's layer types and the legacy compress_ratios that name them (DEEPSEEK_V4_LAYER_TYPES)."""
RATES = {"compressed_sparse_attention": 4, "heavily_compressed_attention": 128}
"""DeepseekV4Config.default_compress_rates: m for CSA, m' for HCA."""
DEFAULT_ROTARY = 64 / 512
"""DeepseekV4Config.default_partial_rotary_factor: qk_rope_head_dim 64 of head_dim 512."""


def v4_layer_types(config: dict[str, Any], layers: int, origin: str) -> list[str]:
    """The layers' kinds: ``layer_types``, else ``compress_ratios`` (0, 4 or 128 a layer), else the class's pattern,
    two HCA layers then CSA and HCA in turn (CSA at odd places after the first two); cut to ``layers``."""
    types = config.get("layer_types")
    if types is None and config.get("compress_ratios") is not None:
        by_ratio = {ratio: kind for kind, ratio in KINDS.items()}
        ratios = config["compress_ratios"]
        unknown = [r for r in ratios if r not in by_ratio] if isinstance(ratios, list) else [ratios]
        if unknown:
            raise LmcalcError(f"{origin}: config.json compress_ratios has {token(unknown[0])}, not 0, 4 or 128")
        types = [by_ratio[r] for r in ratios]
    if types is None:
        after = ["compressed_sparse_attention" if i % 2 else "heavily_compressed_attention" for i in range(layers - 2)]
        types = ["heavily_compressed_attention"] * min(layers, 2) + after
    if not isinstance(types, list) or len(types) < layers:
        raise LmcalcError(f"{origin}: config.json layer_types must list the {layers} layers' kinds")
    unknown = sorted({str(t) for t in types[:layers]} - set(KINDS))
    if unknown:
        raise LmcalcError(f"{origin}: config.json layer_types has {token(unknown[0])}, not one of {', '.join(KINDS)}")
    return list(types[:layers])


def _rates(config: dict[str, Any], origin: str) -> dict[str, int]:
    """``compress_rates`` over the class's defaults, with the legacy scalars folded in as its ``__post_init__`` does."""
    given = config.get("compress_rates") or {}
    if not isinstance(given, dict):
        raise LmcalcError(f"{origin}: config.json compress_rates must be an object, not {token(given)}")
    rates = {**RATES, **given}
    for legacy, kind in (("compress_rate_csa", "compressed_sparse_attention"),
                         ("compress_rate_hca", "heavily_compressed_attention")):  # fmt: skip
        if config.get(legacy) is not None:
            rates[kind] = config[legacy]
    return rates


def deepseek_v4(config: dict[str, Any], fields: dict[str, Any], origin: str) -> dict[str, Any]:
    """ModelSpec fields for a DeepSeek-V4 config (DeepseekV4ForCausalLM): every layer MoE (a hash router in the first
    ones changes which experts, not how many) with one shared expert of the experts' width whatever
    ``n_shared_experts`` says, SwiGLU clamped at ``swiglu_limit``; one key-value head of ``head_dim``; a sliding window
    in every layer; the query rank, output groups, compressors, indexer and streams (``compressed_attention``,
    ``hyper_connections``); RMSNorms; ``qk_rope_head_dim`` (legacy) or ``partial_rotary_factor`` of each head
    rotated. The multi-token-prediction layers are not built."""
    if config.get("mlp_bias"):
        raise LmcalcError(f"{origin}: config.json mlp_bias true (biases on DeepSeek-V4's shared expert alone) is not "
                          "modelled")  # fmt: skip
    layers, head_dim = _get(config, origin, "num_hidden_layers"), _get(config, origin, "head_dim")
    types, rates = v4_layer_types(config, layers, origin), _rates(config, origin)
    rope = config.get("qk_rope_head_dim")
    rotary = rope / head_dim if rope is not None else config.get("partial_rotary_factor") or DEFAULT_ROTARY
    expert_width = _get(config, origin, "moe_intermediate_size")
    return fields | {
        "hidden_size": _get(config, origin, "hidden_size"),
        "num_layers": layers,
        "num_heads": _get(config, origin, "num_attention_heads"),
        "num_kv_heads": 1,  # DeepseekV4Attention: kv_proj makes one head, read as both K and V
        "head_dim": head_dim,
        "ffn_size": expert_width,  # no layer has a dense MLP
        "ffn_kind": "swiglu",
        "norm_kind": "rmsnorm",
        "swiglu_limit": _get(config, origin, "swiglu_limit"),
        "rotary_fraction": rotary,
        "attention_sinks": True,
        "sinks_fp32": True,  # DeepseekV4PreTrainedModel keeps them in fp32
        "sliding_window": _get(config, origin, "sliding_window"),
        "position_embedding": "rope",
        "max_seq_len": _get(config, origin, "max_position_embeddings"),
        "moe": {
            "num_experts": _get(config, origin, "n_routed_experts", "num_local_experts"),
            "experts_per_token": config.get("num_experts_per_tok"),
            "shared_experts": 1,  # DeepseekV4SparseMoeBlock's shared_experts: one DeepseekV4MLP
            "expert_ffn_size": expert_width,
        },
        "compressed_attention": {
            "q_lora_rank": _get(config, origin, "q_lora_rank"),
            "output_groups": _get(config, origin, "o_groups"),
            "output_rank": _get(config, origin, "o_lora_rank"),
            "csa_layer_ids": [i for i, t in enumerate(types) if t == "compressed_sparse_attention"],
            "hca_layer_ids": [i for i, t in enumerate(types) if t == "heavily_compressed_attention"],
            "csa_rate": rates["compressed_sparse_attention"],
            "hca_rate": rates["heavily_compressed_attention"],
            "indexer": {
                "heads": _get(config, origin, "index_n_heads"),
                "head_dim": _get(config, origin, "index_head_dim"),
                "top_k": _get(config, origin, "index_topk"),
            },
        },
        "hyper_connections": {"streams": _get(config, origin, "hc_mult")},
    }
