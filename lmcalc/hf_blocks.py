"""Reading the config.json of the types whose layers are single blocks: Nemotron-H's (NVIDIA's Nemotron-H, Nemotron
Nano 2 and Nemotron 3), each one norm and one of a Mamba-2 mixer, attention without position encoding, a squared-ReLU
MLP or an MoE of squared-ReLU experts (transformers' NemotronHBlock); and the Mamba models', each one norm and a Mamba
or Mamba-2 mixer (MambaBlock, FalconMambaBlock, Mamba2Block). ``hf_config`` dispatches here; the readers return
ModelSpec fields, as there."""

from __future__ import annotations

from typing import Any

from lmcalc.errors import LmcalcError, token
from lmcalc.hf_fields import get as _get
from lmcalc.hf_gpt import gelu
from lmcalc.hf_layers import mamba2_mixer

BLOCK_LETTERS = {"M": "linear_attention", "*": "full_attention", "-": "mlp", "E": "moe"}
"""``hybrid_override_pattern``'s letters, as NemotronHConfig._pattern_to_list reads them."""
DEFAULT_BLOCKS = ["linear_attention", "moe", "full_attention", "mlp"]
"""NemotronHConfig.__post_init__'s blocks where config.json gives neither ``layers_block_type`` nor the pattern."""
LEGACY_NAMES = {"mamba": "linear_attention", "attention": "full_attention"}
"""Older block names transformers remaps (configuration_utils._LEGACY_LAYER_TYPE_REMAP), as Nemotron 3.5's configs
write them."""
MAMBA_ALIASES = {"mamba_n_groups": "n_groups", "mamba_d_conv": "conv_kernel", "mamba_conv_bias": "use_conv_bias",
                 "mamba_chunk_size": "chunk_size"}  # fmt: skip
"""The older spellings NemotronHConfig.__post_init__ takes for its Mamba fields."""


def _blocks(config: dict[str, Any], origin: str) -> list[str]:
    """Each layer's block: ``layers_block_type`` (``layer_types``), else ``hybrid_override_pattern``, else the
    class's four; the depth is their number (the class ignores num_hidden_layers)."""
    blocks = config.get("layers_block_type") or config.get("layer_types")
    if not blocks and config.get("hybrid_override_pattern"):
        pattern = config["hybrid_override_pattern"]
        unknown = sorted(set(pattern) - set(BLOCK_LETTERS))
        if unknown:
            raise LmcalcError(f"{origin}: config.json hybrid_override_pattern has {token(unknown[0])}, not one of "
                              f"{', '.join(BLOCK_LETTERS)}")  # fmt: skip
        blocks = [BLOCK_LETTERS[letter] for letter in pattern]
    blocks = [LEGACY_NAMES.get(block, block) for block in blocks or DEFAULT_BLOCKS]
    unknown = sorted(set(blocks) - set(BLOCK_LETTERS.values()))
    if unknown:
        raise LmcalcError(f"{origin}: config.json layers_block_type has {token(unknown[0])}, not one of "
                          f"{', '.join(BLOCK_LETTERS.values())}")  # fmt: skip
    return list(blocks)


def nemotron_h(config: dict[str, Any], fields: dict[str, Any], origin: str) -> dict[str, Any]:
    """ModelSpec fields for a Nemotron-H config: its blocks as single-block layers (``mixer_only_layer_ids``,
    ``ffn_only_layer_ids``), Mamba-2 in the ``linear_attention`` blocks (NemotronHMamba2Mixer: heads × head_dim wide,
    biases where ``use_bias``), attention without biases or RoPE (NemotronHAttention), and in the ``moe`` blocks
    routed experts with one ungated shared expert of its own width and an fp32 router (NemotronHMoE), the experts at
    ``moe_latent_size`` between two projections where it is set (Nemotron 3 Super's latent MoE)."""
    config = {MAMBA_ALIASES.get(key, key): value for key, value in config.items()}
    blocks = _blocks(config, origin)
    ids = {kind: [i for i, block in enumerate(blocks) if block == kind] for kind in BLOCK_LETTERS.values()}
    fields |= {
        "hidden_size": _get(config, origin, "hidden_size"),
        "tied_embeddings": False,  # NemotronHForCausalLM ties nothing (_tied_weights_keys = {}), whatever the field
        "num_layers": len(blocks),
        "num_heads": _get(config, origin, "num_attention_heads"),
        "num_kv_heads": config.get("num_key_value_heads"),
        "head_dim": config.get("head_dim"),
        "ffn_size": _get(config, origin, "intermediate_size"),
        "ffn_kind": "gelu_mlp",
        "activation": gelu(config, "nemotron_h", origin),
        "norm_kind": "rmsnorm",
        "mlp_bias": bool(config.get("mlp_bias")),
        "position_embedding": "none",
        "max_seq_len": _get(config, origin, "max_position_embeddings"),
        "mixer_only_layer_ids": ids["linear_attention"] + ids["full_attention"],
        "ffn_only_layer_ids": ids["mlp"] + ids["moe"],
    }
    if ids["linear_attention"]:
        heads, head_dim = _get(config, origin, "mamba_num_heads"), _get(config, origin, "mamba_head_dim")
        fields["mamba2"] = {
            "inner": heads * head_dim,
            "heads": heads,
            "groups": _get(config, origin, "n_groups"),
            "state": _get(config, origin, "ssm_state_size"),
            "conv_kernel": _get(config, origin, "conv_kernel"),
            "chunk": _get(config, origin, "chunk_size"),
            "conv_bias": bool(config.get("use_conv_bias", True)),
            "proj_bias": bool(config.get("use_bias")),
            "attention_layer_ids": ids["full_attention"],
        }
    if ids["moe"]:
        fields["moe"] = {
            "num_experts": _get(config, origin, "n_routed_experts", "num_local_experts"),
            "experts_per_token": _get(config, origin, "num_experts_per_tok"),
            "expert_ffn_size": _get(config, origin, "moe_intermediate_size"),
            "shared_experts": 1,  # one NemotronHMLP, whatever n_shared_experts says
            "shared_expert_ffn_size": _get(config, origin, "moe_shared_expert_intermediate_size"),
            "dense_layer_ids": ids["mlp"],
            "router_fp32": True,  # NemotronHTopkRouter: an fp32 weight, times an fp32 copy of its input
            "node_limit": config.get("topk_group") if (config.get("n_group") or 1) > 1 else None,
            "latent_size": config.get("moe_latent_size"),  # fc1_latent_proj/fc2_latent_proj around the experts
        }
    if config.get("num_nextn_predict_layers"):  # NemotronHForCausalLM ignores its mtp.* weights
        fields["notes"] = [*fields.get("notes", []), "its multi-token-prediction layers are not counted"]
    return fields


MAMBA_STACKS = ("mamba", "falcon_mamba", "mamba2")
"""Types whose layers are all a Mamba (or Mamba-2) block alone: a norm and the mixer, no attention and no FFN
(transformers' MambaBlock, FalconMambaBlock, Mamba2Block)."""
MAMBA2_CONFIG_FIELDS = {"groups": "n_groups", "state": "state_size", "conv_kernel": "conv_kernel",
                        "chunk": "chunk_size", "conv_bias": "use_conv_bias", "proj_bias": "use_bias"}  # fmt: skip
"""Where Mamba2Config spells each Mamba2Spec field."""
NO_POSITION_LIMIT = 1_048_576
"""What stands for the trained context of a model without positions and without max_position_embeddings."""


def mamba_stack(config: dict[str, Any], kind: str, fields: dict[str, Any], origin: str) -> dict[str, Any]:
    """ModelSpec fields for a Mamba, Falcon Mamba or Mamba-2 config: every layer a mixer alone behind its norm
    (``mixer_only_layer_ids``), so no layer attends or has an FFN; the head tied where ``tie_word_embeddings`` says
    (MambaConfig's default: tied). Mamba's mixer is ``intermediate_size`` (``expand`` × h) wide with Δ's rank
    ``time_step_rank`` (``auto``: ⌈h/16⌉); Falcon Mamba's adds RMSNorms without weights on Δ, B and C; Mamba-2's has
    ``num_heads`` heads of ``head_dim`` over ``expand`` × h, ``n_groups`` groups, a gated norm."""
    hidden, layers = _get(config, origin, "hidden_size"), _get(config, origin, "num_hidden_layers")
    inner = config.get("intermediate_size") or int(config.get("expand", 2) * hidden)  # MambaConfig: expand × h if none
    fields |= {
        "hidden_size": hidden,
        "num_layers": layers,
        "num_heads": 1,  # no layer attends: a count no tensor uses
        "ffn_size": inner,  # no layer has an FFN: a width no tensor uses
        "ffn_kind": "swiglu",
        "norm_kind": "rmsnorm",
        "position_embedding": "none",
        "max_seq_len": config.get("max_position_embeddings") or NO_POSITION_LIMIT,
        "mixer_only_layer_ids": list(range(layers)),
        "notes": [
            *fields.get("notes", []),
            f"{kind}: no position encoding and no max_position_embeddings; "
            f"{NO_POSITION_LIMIT:,} tokens stand for its context",
        ],  # fmt: skip
    }
    if kind == "mamba2":
        heads, inner = _get(config, origin, "num_heads"), int(config.get("expand", 2) * hidden)  # Mamba2Mixer's
        if heads * _get(config, origin, "head_dim") != inner:
            raise LmcalcError(f"{origin}: config.json num_heads × head_dim must be expand × hidden_size ({inner})")
        fields["mamba2"] = mamba2_mixer(config, origin, inner, heads, MAMBA2_CONFIG_FIELDS)
        return fields
    fields["mamba"] = mamba_mixer(config, origin, hidden, inner, MAMBA_CONFIG_FIELDS)
    return fields


MAMBA_CONFIG_FIELDS = ("state_size", "conv_kernel", "time_step_rank", "use_conv_bias", "use_bias")
"""Where MambaConfig spells a Mamba mixer's state, kernel, Δ rank and biases (ZambaConfig: ``ZAMBA_MAMBA_FIELDS``)."""
ZAMBA_MAMBA_FIELDS = ("mamba_d_state", "mamba_d_conv", "mamba_dt_rank", "mamba_conv_bias", "mamba_proj_bias")


def mamba_mixer(
    config: dict[str, Any], origin: str, hidden: int, inner: int, names: tuple[str, str, str, str, str]
) -> dict[str, Any]:
    """A Mamba mixer in every layer, no layer attending (MambaSpec), each field read where ``names`` says; the Δ rank
    ⌈h/16⌉ where it is "auto"."""
    state, kernel, rank_field, conv_bias, proj_bias = names
    rank = config.get(rank_field, "auto")
    return {
        "d_inner": inner,
        "d_state": _get(config, origin, state),
        "d_conv": _get(config, origin, kernel),
        "dt_rank": -(-hidden // 16) if rank == "auto" else rank,  # MambaConfig, ZambaConfig: ceil(hidden / 16)
        "conv_bias": bool(config.get(conv_bias, True)),
        "proj_bias": bool(config.get(proj_bias)),
        "attention_every": None,
    }


def rwkv(config: dict[str, Any], fields: dict[str, Any], origin: str) -> dict[str, Any]:
    """ModelSpec fields for an RWKV-4 config (RwkvForCausalLM): every layer a time mix of ``attention_hidden_size``
    (else h) and a channel mix whose key and value are an MLP of squared ReLU, ``intermediate_size`` wide (else 4h),
    each behind a LayerNorm with a bias, and one more LayerNorm on the embedding's output (layer 0's pre_ln); no
    position encoding, ``context_length`` for its context."""
    hidden = _get(config, origin, "hidden_size")
    return fields | {
        "hidden_size": hidden,
        "num_layers": _get(config, origin, "num_hidden_layers"),
        "num_heads": 1,  # no layer attends: a count no tensor uses
        "ffn_size": config.get("intermediate_size") or 4 * hidden,  # RwkvFeedForward: 4 × h where none
        "ffn_kind": "gelu_mlp",
        "activation": "relu2",
        "norm_kind": "layernorm",
        "embedding_norm": True,
        "position_embedding": "none",
        "max_seq_len": _get(config, origin, "context_length", "max_position_embeddings"),
        "rwkv": {"attention_size": config.get("attention_hidden_size") or hidden},
    }


def xlstm(config: dict[str, Any], fields: dict[str, Any], origin: str) -> dict[str, Any]:
    """ModelSpec fields for an xLSTM config (xLSTMForCausalLM, transformers' own kernels): every layer an mLSTM layer
    of ``num_heads`` heads (queries and keys ``int(h · qk_dim_factor)`` wide, values ``int(h · v_dim_factor)``) and a
    SwiGLU of ``h · ffn_proj_factor`` rounded up to ``ffn_round_up_to_multiple_of``, each behind an RMSNorm; a final
    RMSNorm (built whatever ``add_out_norm`` says), no position encoding, the logits soft-capped at
    ``output_logit_soft_cap``. ``use_bias`` (a bias on every projection and norm) is refused."""
    hidden = _get(config, origin, "hidden_size", "embedding_dim")
    if config.get("embedding_dim") not in (None, hidden):
        raise LmcalcError(f"{origin}: config.json embedding_dim differs from hidden_size: xLSTM builds no projection "
                          "between them")  # fmt: skip
    if config.get("use_bias"):
        raise LmcalcError(f"{origin}: config.json use_bias is true: xLSTM's biased norms and projections are not "
                          "modelled")  # fmt: skip
    multiple = _get(config, origin, "ffn_round_up_to_multiple_of")
    ffn = int((hidden * _get(config, origin, "ffn_proj_factor") + multiple - 1) // multiple * multiple)
    mode = config.get("mode", "inference")
    return fields | {
        "hidden_size": hidden,
        "num_layers": _get(config, origin, "num_blocks", "num_hidden_layers"),  # the blocks xLSTMModel builds
        "num_heads": _get(config, origin, "num_heads"),
        "ffn_size": ffn,
        "ffn_kind": "swiglu",
        "norm_kind": "rmsnorm",
        "position_embedding": "none",
        "max_seq_len": NO_POSITION_LIMIT,
        "final_softcap": config.get("output_logit_soft_cap"),
        "mlstm": {
            "heads": _get(config, origin, "num_heads"),
            "qk_dim": int(hidden * _get(config, origin, "qk_dim_factor")),
            "v_dim": int(hidden * _get(config, origin, "v_dim_factor")),
            "chunk": _get(config, origin, "chunk_size"),
            "padded": mode == "train_with_padding",
        },
    }


def recurrent_gemma(config: dict[str, Any], fields: dict[str, Any], origin: str) -> dict[str, Any]:
    """ModelSpec fields for a RecurrentGemma config (RecurrentGemmaForCausalLM): ``block_types`` repeated over the
    layers (recurrent, recurrent, attention by default), Griffin's recurrent blocks of ``lru_width`` (else h) with
    ``num_attention_heads`` gate blocks and a convolution of ``conv1d_width`` taps, local attention over
    ``attention_window_size`` with ``num_key_value_heads`` (else every head) and a bias on its output, a GeGLU MLP of
    ``intermediate_size`` // 2 with biases, RMSNorms before each half, the logits soft-capped; half of each head
    rotated."""
    hidden, layers = _get(config, origin, "hidden_size"), _get(config, origin, "num_hidden_layers")
    heads = _get(config, origin, "num_attention_heads")
    kinds = list(config.get("block_types") or ("recurrent", "recurrent", "attention"))
    unknown = sorted(set(kinds) - {"recurrent", "attention"})
    if unknown:
        raise LmcalcError(f"{origin}: config.json block_types has {token(unknown[0])}, not recurrent or attention")
    attending = [i for i in range(layers) if kinds[i % len(kinds)] == "attention"]
    return fields | {
        "hidden_size": hidden,
        "num_layers": layers,
        "num_heads": heads,
        "num_kv_heads": config.get("num_key_value_heads"),
        "ffn_size": _get(config, origin, "intermediate_size") // 2,  # RecurrentGemmaMlp: intermediate_size // 2
        "ffn_kind": "geglu",
        "activation": gelu(config, "recurrent_gemma", origin),
        "norm_kind": "rmsnorm",
        "mlp_bias": True,
        "attention_bias": "all" if config.get("attention_bias") else "out",
        "position_embedding": "rope",
        "rotary_fraction": config.get("partial_rotary_factor", 0.5),
        "max_seq_len": config.get("max_position_embeddings") or NO_POSITION_LIMIT,
        **({"sliding_window": _get(config, origin, "attention_window_size")} if attending else {}),
        "final_softcap": config.get("logits_soft_cap"),
        "rglru": {
            "width": config.get("lru_width") or hidden,
            "heads": heads,
            "conv_kernel": _get(config, origin, "conv1d_width"),
            "attention_layer_ids": attending,
        },
    }


MAMBA, HYBRID = ("linear_attention",), ("hybrid",)
ZAMBA2_LAYERS = MAMBA + (MAMBA * 5 + HYBRID) * 7 + MAMBA * 4 + HYBRID + MAMBA * 3 + HYBRID + MAMBA * 2
"""Zamba2Config's layers where config.json gives none (Zamba2-2.7B's 54): Mamba-2 in each, a shared block first in
the hybrid ones."""


def zamba2(config: dict[str, Any], fields: dict[str, Any], origin: str) -> dict[str, Any]:
    """ModelSpec fields for a Zamba 2 config (Zamba2ForCausalLM): Mamba-2 in every layer behind its norm (of
    ``mamba_expand``·h, ``n_mamba_heads`` heads, the convolution's bias always), and in the ``hybrid`` layers of
    ``layers_block_type`` (``mamba``/``hybrid`` in older files) a shared block first (``shared_block``): attention over
    2·h with ``num_attention_heads`` heads of 2·h/H, a gated MLP of ``intermediate_size`` (else 4·h) with
    ``hidden_act``, ``num_mem_blocks`` blocks in turn, adapters of ``adapter_rank``; RoPE only with
    ``use_mem_rope``. transformers shares the blocks' weights between their uses only where ``tie_word_embeddings``
    ties the head too."""
    hidden, heads = _get(config, origin, "hidden_size"), _get(config, origin, "num_attention_heads")
    given = config.get("layers_block_type") or config.get("layer_types") or ZAMBA2_LAYERS
    blocks = [LEGACY_NAMES.get(b, b) for b in given]
    unknown = sorted(set(blocks) - {"linear_attention", "hybrid"})
    if unknown:
        raise LmcalcError(f"{origin}: config.json layers_block_type has {token(unknown[0])}, not mamba or hybrid")
    inner = config.get("mamba_expand", 2) * hidden
    return fields | {
        "hidden_size": hidden,
        "num_layers": len(blocks),
        "num_heads": heads,
        "num_kv_heads": config.get("num_key_value_heads"),
        "head_dim": 2 * hidden // heads,  # Zamba2Config: attention_head_dim = 2·h / H
        "ffn_size": config.get("intermediate_size") or 4 * hidden,
        "ffn_kind": "geglu",
        "activation": gelu(config, "zamba2", origin),
        "norm_kind": "rmsnorm",
        "mlp_bias": bool(config.get("add_bias_linear")),
        "position_embedding": "rope" if config.get("use_mem_rope") else "none",
        "max_seq_len": _get(config, origin, "max_position_embeddings"),
        "mixer_only_layer_ids": list(range(len(blocks))),
        "mamba2": {
            "inner": inner,
            "heads": _get(config, origin, "n_mamba_heads"),
            "groups": config.get("mamba_ngroups") or 1,
            "state": _get(config, origin, "mamba_d_state"),
            "conv_kernel": _get(config, origin, "mamba_d_conv"),
            "chunk": config.get("chunk_size") or 256,
            "conv_bias": True,  # Zamba2MambaMixer's conv1d: bias=True, whatever use_conv_bias says
            "proj_bias": bool(config.get("add_bias_linear")),
            "attention_layer_ids": [],
        },
        "shared_block": {
            "layer_ids": [i for i, b in enumerate(blocks) if b == "hybrid"],
            "blocks": config.get("num_mem_blocks") or 1,
            "adapter_rank": _get(config, origin, "adapter_rank"),
            "attention_adapters": bool(config.get("use_shared_attention_adapter")),
            # transformers ties the uses' blocks (_tied_weights_keys) only where it ties the embedding
            "tied": fields["tied_embeddings"],
            "adapter_slots": len(config["hybrid_layer_ids"]) if config.get("hybrid_layer_ids") else None,
        },
    }


def zamba(config: dict[str, Any], fields: dict[str, Any], origin: str) -> dict[str, Any]:
    """ModelSpec fields for a Zamba config (ZambaForCausalLM): Mamba in every layer behind its norm (its
    ``n_mamba_heads`` heads each a Mamba of d_inner/heads channels, which hold and compute what one Mamba of d_inner
    does: ZambaMambaMixer), and in the ``hybrid`` layers of ``layers_block_type`` (else two Mamba layers, a hybrid, then
    a hybrid where i % ``attn_layer_period`` is ``attn_layer_offset``) the one shared block first: attention over 2·h
    with ``num_attention_heads`` heads of ``attention_head_dim`` (2·h/H), no RoPE, a gated MLP of
    ``intermediate_size`` with ``hidden_act``, no adapters; its weights shared only where the head is tied."""
    hidden, heads, layers = (_get(config, origin, key) for key in ("hidden_size", "num_attention_heads",
                                                                    "num_hidden_layers"))  # fmt: skip
    period, offset = config.get("attn_layer_period", 6), config.get("attn_layer_offset", 4)
    default = ["linear_attention", "linear_attention", "hybrid"] + [
        "hybrid" if i % period == offset else "linear_attention" for i in range(layers - 3)
    ]
    blocks = [LEGACY_NAMES.get(b, b) for b in config.get("layers_block_type") or config.get("layer_types") or default]
    unknown = sorted(set(blocks) - {"linear_attention", "hybrid"})
    if unknown:
        raise LmcalcError(f"{origin}: config.json layers_block_type has {token(unknown[0])}, not mamba or hybrid")
    return fields | {
        "hidden_size": hidden,
        "num_layers": len(blocks),
        "num_heads": heads,
        "num_kv_heads": config.get("num_key_value_heads"),
        "head_dim": config.get("attention_head_dim") or 2 * hidden // heads,
        "ffn_size": _get(config, origin, "intermediate_size"),
        "ffn_kind": "geglu",
        "activation": gelu(config, "zamba", origin),
        "norm_kind": "rmsnorm",
        "position_embedding": "none",
        "max_seq_len": _get(config, origin, "max_position_embeddings"),
        "mixer_only_layer_ids": list(range(len(blocks))),
        "mamba": mamba_mixer(config, origin, hidden, config.get("mamba_expand", 2) * hidden, ZAMBA_MAMBA_FIELDS),
        "shared_block": {
            "layer_ids": [i for i, b in enumerate(blocks) if b == "hybrid"],
            "tied": fields["tied_embeddings"],  # as Zamba 2's: transformers ties the uses only with the head
        },
    }
