"""Reading the attention of the types whose attention is their own, for ``hf_config``'s Llama-like reader: ModernBERT's
decoder (its norms, fused GeGLU and head transform with it), Laguna's head gate and DeepSeek sparse attention's
indexer (DeepSeek-V3.2, GLM-5, A.X K2); CPM-Ant's whole layer, its prompt and its score bias; ZAYA's CCA
attention and router; and Inkling's branch convolutions and relative logits. Each returns ModelSpec fields, or the
indexer's."""

from __future__ import annotations

from typing import Any

from lmcalc.errors import LmcalcError
from lmcalc.hf_fields import get as _get


def modernbert(config: dict[str, Any], origin: str) -> dict[str, Any]:
    """ModernBERT's decoder (ModernBertDecoderForCausalLM): LayerNorms (without biases unless ``norm_bias``), one after
    the embedding that stands in for layer 0's attention norm, a GeGLU through one fused ``Wi``, biases on q, k, v
    and Wo where ``attention_bias`` says, a prediction-head transform (dense, GELU, norm) before the tied decoder and
    its bias (``decoder_bias``)."""
    for field in ("embedding_dropout", "attention_dropout", "mlp_dropout"):
        if config.get(field):
            raise LmcalcError(f"{origin}: config.json {field} {config[field]}: ModernBERT's dropout is not modelled")
    if config.get("classifier_bias") or (config.get("classifier_activation") or "gelu") != (
        config.get("hidden_activation") or "gelu"
    ):
        raise LmcalcError(f"{origin}: config.json classifier_bias or a classifier_activation other than "
                          "hidden_activation: ModernBERT's head transform is read without a bias, with the MLP's "
                          "activation")  # fmt: skip
    fields: dict[str, Any] = {
        "norm_kind": "layernorm" if config.get("norm_bias") else "layernorm_nobias",
        "num_kv_heads": None,  # ModernBertDecoderAttention: as many key-value heads as heads, whatever the config says
        "embedding_norm": True,
        "first_attention_norm": False,
        "head_transform": True,
        "head_bias": bool(config.get("decoder_bias", True)),
        "fused_linears": ["gate_up"],
    }
    return fields


def laguna(config: dict[str, Any], origin: str, heads: int) -> dict[str, Any]:
    """Laguna's per-head gate (``gating`` true or "per-head": g_proj h → H; a per-channel gate is not read) and its
    heads, one count for every layer (``num_attention_heads_per_layer``: counts that differ are not read)."""
    if config.get("gating", True) not in (True, "per-head"):
        raise LmcalcError(f"{origin}: config.json gating {config.get('gating')!r}: lmcalc reads Laguna's per-head gate "
                          "(gating true or \"per-head\") only")  # fmt: skip
    per_layer = set(config.get("num_attention_heads_per_layer") or [heads])
    if len(per_layer) > 1:
        raise LmcalcError(f"{origin}: config.json num_attention_heads_per_layer differs between layers "
                          f"({sorted(per_layer)}); lmcalc reads one head count for every layer")  # fmt: skip
    return {"attention_head_gate": "fp32", "num_heads": per_layer.pop()}


def indexer(config: dict[str, Any], origin: str, layers: int, kind: str = "") -> dict[str, Any]:
    """DeepSeek-V3.2's and GLM-5's indexer (DeepseekV32Indexer, GlmMoeDsaIndexer); GLM-5's indexer_types "shared"
    marks a layer that reuses the previous layer's selection and builds no indexer (GlmMoeDsaAttention). HYV4Config
    writes its own where config.json gives none: a full indexer in layer 0 and every fourth from layer 1. The layers
    above the topmost full one (``above_last``) run no indexer when the step peaks at it (formulas §3.7)."""
    shared = config.get("indexer_types") or []
    if kind == "hy_v4" and not shared:
        shared = ["full" if i == 0 or (i - 1) % 4 == 0 else "shared" for i in range(layers)]
    own = layers - sum(t == "shared" for t in shared[:layers])
    indexed = [i for i in range(layers) if i >= len(shared) or shared[i] != "shared"]
    return {
        "heads": _get(config, origin, "index_n_heads"),
        "head_dim": _get(config, origin, "index_head_dim"),
        "top_k": _get(config, origin, "index_topk"),
        "own_layers": own if own < layers else None,
        "above_last": layers - 1 - indexed[-1] if indexed else 0,
    }


def cpmant(config: dict[str, Any], fields: dict[str, Any], origin: str) -> dict[str, Any]:
    """CPM-Ant (CpmAntForCausalLM): pre-norm layers of weighted RMSNorms, multi-head attention of ``dim_head`` a head
    without biases or positions (a learned bias on the scores instead, by segment pair and bucketed relative
    position), a GeGLU of ``dim_ff``; ``prompt_length`` prompt tokens before every sequence, from ``prompt_types``
    prompts' rows in the embedding, and a segment embedding (``prompt``). The head is never tied."""
    return fields | {
        "hidden_size": _get(config, origin, "hidden_size"),
        "num_layers": _get(config, origin, "num_hidden_layers"),
        "num_heads": _get(config, origin, "num_attention_heads"),
        "head_dim": _get(config, origin, "dim_head"),
        "ffn_size": _get(config, origin, "dim_ff"),
        "ffn_kind": "geglu",
        "activation": "gelu",
        "norm_kind": "rmsnorm",
        "position_embedding": "none",
        "eager_softmax": "activation",  # CpmAntAttention's nn.Softmax, in the scores' dtype
        "max_seq_len": 1_048_576,  # no positions: the bias's buckets saturate past position_bias_max_distance
        "prompt": {
            "length": _get(config, origin, "prompt_length"),
            "types": _get(config, origin, "prompt_types"),
            "segments": _get(config, origin, "segment_types"),
            "buckets": _get(config, origin, "position_bias_num_buckets"),
        },
    }


def zaya(config: dict[str, Any], origin: str, fields: dict[str, Any]) -> dict[str, Any]:
    """ZAYA (ZayaForCausalLM), finishing the common reader's fields: CCA attention (``cca``: ``cca_time0`` and
    ``cca_time1`` taps, the key scale; QK L2-normed without weights), the residual scaling, an MoE block of
    ``num_experts`` in every layer (top ``num_experts_per_tok`` of E + 1 classes, the last a skip) behind an MLP router
    of ``router_hidden_size``, and a head with a bias where ``lm_head_bias`` says."""
    moe = fields.get("moe") or {}
    return fields | {
        "qk_norm": "none",
        "head_bias": bool(config.get("lm_head_bias")),
        "cca": {"depthwise": _get(config, origin, "cca_time0"), "grouped": _get(config, origin, "cca_time1")},
        "moe": moe | {"router_rank": _get(config, origin, "router_hidden_size")},
    }


def inkling(config: dict[str, Any], origin: str, fields: dict[str, Any], kind: str = "inkling_text") -> dict[str, Any]:
    """Inkling's text model (InklingForCausalLM), finishing the common reader's fields: the local layers'
    (``hybrid_sliding``) own KV heads, the branch convolutions and relative logits (``branch_convs``: ``d_rel``,
    ``rel_extent``, ``conv_kernel_size``), per-head QK norms, a normed embedding, learned global scales, and a router
    that scores the shared experts too. Local layers of other heads or head size are refused."""
    for field, full in (("swa_num_attention_heads", "num_attention_heads"), ("swa_head_dim", "head_dim")):
        if config.get(field, config.get(full)) != config.get(full):
            raise LmcalcError(f"{origin}: config.json {field} differs from {full}: Inkling's local layers of other "
                              "widths are not modelled")  # fmt: skip
    local_kv = config.get("swa_num_key_value_heads")
    moe = fields.get("moe")
    convs = {"kernel": _get(config, origin, "conv_kernel_size"), "relative_width": _get(config, origin, "d_rel"),
             "extent": _get(config, origin, "rel_extent")}  # fmt: skip
    fields |= {"embedding_norm": True}
    if local_kv and local_kv != fields["num_kv_heads"]:
        fields["local_kv_heads"] = local_kv
    if kind == "inkling2_text":  # Inkling 2: clipped Q, K and relative states, dynamic global convolutions, sinks,
        # a gate on the output, block attention residuals, an unpadded head; no QK norms, global scales or shared
        head = config.get("unpadded_vocab_size")
        return fields | {
            "attention_output_gate": True, "attention_gate_proj": True, "position_embedding": "none",
            "final_softcap_fp32": True,  # no RoPE; the head's logits soft-capped in fp32
            **({"head_vocab": head} if head and head != fields["vocab_size"] else {}),
            "branch_convs": convs | {"dynamic_global": True, "scaled_clips": True, "sinks": True,
                                     "block_residual": _get(config, origin, "n_layers_per_attn_res_block")},
        }  # fmt: skip
    return fields | {
        "position_embedding": "none",  # no RoPE: the relative logits place the tokens
        "qk_norm": "per_head",
        "global_scales": True,
        "branch_convs": convs,
        **({"moe": moe | {"router_scores_shared": True}} if moe else {}),
    }


def inkling2(config: dict[str, Any], origin: str, fields: dict[str, Any]) -> dict[str, Any]:
    """Inkling 2's text model (Inkling2ForCausalLM): Inkling's layer outline with its own attention (``inkling``)."""
    return inkling(config, origin, fields, "inkling2_text")
