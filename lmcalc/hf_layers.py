"""Which layers of a config.json's model do what: the windows of local attention and which layers attend globally,
which layers route to experts, and a hybrid's mixers in the layers that do not attend (Gated DeltaNet, Mamba-2,
LFM2's short convolutions).
``hf_config`` reads the rest of each type; these readers take the config as its class reads it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lmcalc.errors import LmcalcError
from lmcalc.hf_attention import inkling, inkling2, zaya
from lmcalc.hf_defaults import LAYER_PATTERNS
from lmcalc.hf_dots import KIND as DOTS3
from lmcalc.hf_dots import dots3_config, dots3_note
from lmcalc.hf_fields import get as _get
from lmcalc.hf_loops import LOOPED, dory, hrm_text, inkling2_loop, looped_config
from lmcalc.hf_widths import GEMMA3N, GEMMA4, MLLAMA, gemma3n, gemma4, mllama
from lmcalc.units import group

if TYPE_CHECKING:
    from lmcalc.specs import ModelSpec

LOCAL_LAYER_TYPES = {"sliding_attention": "sliding", "chunked_attention": "chunked", "hybrid_sliding": "sliding"}
"""The layer_types of a local layer, and the ModelSpec.local_attention each means."""


ROUTER_FP32 = ("deepseek_v2", "deepseek_v3", "deepseek_v32", "glm_moe_dsa", "axk1", "dots1", "ernie4_5_moe",
               "exaone_moe", "glm4_moe", "glm4_moe_lite", "hunyuan_v1_moe", "solar_open", "kolibri1",
               "hy_v3", "flint", "kimi_linear", "bailing_hybrid", "beam", "mimo_v2_flash", "axk2", "hy_v4")  # fmt: skip
"""Types whose transformers router multiplies an fp32 copy of its input by an fp32 weight (DeepseekV3TopkRouter:
F.linear(hidden_states.type(torch.float32), ...); HunYuanMoEV1Gate: hidden_states.float(); HYV3TopKRouter)."""


def every_n(flags: list[bool], origin: str, what: str) -> int | None:
    """The N of "layer i is special when (i + 1) is a multiple of N" that ``flags`` (per layer) follow; None when
    no layer is special."""
    if not any(flags):
        return None
    for every in range(1, len(flags) + 1):
        if all(flag == ((i + 1) % every == 0) for i, flag in enumerate(flags)):
            return every
    raise LmcalcError(f"{origin}: the {what} layers do not follow an every-N pattern lmcalc can describe")


def global_layers(flags: list[bool], origin: str) -> dict[str, Any]:
    """``global_every`` (and ``global_from_first``) for per-layer global ``flags``: every N-th layer from the N-th
    (Gemma), or from the first (GPT-Neo, CWM: layer i when i is a multiple of N); else the global layers by index
    (``global_layer_ids``: Flint's)."""
    if any(flags) and len(flags) > 1 and flags[0]:
        for every in range(1, len(flags) + 1):
            if all(flag == (i % every == 0) for i, flag in enumerate(flags)):
                return {"global_every": every, "global_from_first": True}
    try:
        return {"global_every": every_n(flags, origin, "global")}
    except LmcalcError:
        return {"global_layer_ids": [i for i, flag in enumerate(flags) if flag]}


def windows(config: dict[str, Any], kind: str, layers: int, origin: str) -> dict[str, Any]:
    """The sliding window (or Llama 4's attention chunk) and which layers attend globally."""
    types = config.get("layer_types")
    if kind == "llama4_text":
        window, local = config.get("attention_chunk_size"), "chunked"
        if not types:  # no_rope_layers[i] = 1: a RoPE layer, which attends within its chunk
            rope = config.get("no_rope_layers") or [
                int((i + 1) % config.get("no_rope_layer_interval", 4) != 0) for i in range(layers)
            ]
            types = ["chunked_attention" if r else "full_attention" for r in rope]
    elif kind == "flint" and not types:  # FlintConfig: global in layers 0 and 1, every fourth from 5, and the last
        window, local = config.get("sliding_window"), "sliding"
        types = [
            "full_attention" if i < 2 or i % 4 == 1 or i == layers - 1 else "sliding_attention" for i in range(layers)
        ]
    else:
        window, local = config.get("sliding_window"), "sliding"
        if kind in ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe") and not config.get("use_sliding_window"):
            window = None
        pattern = config.get("sliding_window_pattern")
        if window and not types and isinstance(pattern, str) and pattern:  # EXAONE 4's "LLLG": a letter a layer
            types = [
                "full_attention" if pattern[i % len(pattern)] == "G" else "sliding_attention" for i in range(layers)
            ]
        if window and not types and pattern:  # Gemma 3, Cohere2: every pattern-th layer is global
            types = ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(layers)]
        if window and not types and kind in LAYER_PATTERNS:  # the class's own pattern (hf_defaults.LAYER_PATTERNS)
            every, first = LAYER_PATTERNS[kind]
            types = [
                "sliding_attention" if (i if first else i + 1) % every else "full_attention" for i in range(layers)
            ]
    if not window:
        return {}
    flags = [t not in LOCAL_LAYER_TYPES for t in types] if types else [False] * layers
    if types and not any(t in LOCAL_LAYER_TYPES for t in types):
        return {}
    if types:
        local = LOCAL_LAYER_TYPES[next(t for t in types if t in LOCAL_LAYER_TYPES)]
    return {"sliding_window": window, "local_attention": local, **global_layers(flags, origin)}


def local_attention(config: dict[str, Any], origin: str, fields: dict[str, Any]) -> dict[str, Any]:
    """MiMoV2FlashAttention: values of v_head_dim; in the sliding layers twice the KV heads and a sink a head. Its
    class reads ``sliding_window_size`` as a window one token wider."""
    size = config.get("sliding_window_size")
    window = fields.get("sliding_window") if size is None else _get(config, origin, "sliding_window_size") + 1
    local = {"sliding_window": window} if window and fields.get("sliding_window") else {}
    if local:  # each of its sliding layers: K and V at 2·H_kv heads, and sinks
        kv = fields["num_kv_heads"] or fields["num_heads"]
        local |= {"local_kv_heads": 2 * kv, "attention_sinks": True, "sinks_local_only": True}
    return {"value_head_dim": _get(config, origin, "v_head_dim"), **local}


def minimax_m3(config: dict[str, Any], origin: str, ffn_size: int) -> dict[str, Any]:
    """MiniMax-M3's text model: its dense layers' own width, the fused gate_up_proj of its dense and shared MLPs, its
    RoPE's concatenation at any share; refused where a layer runs its block-sparse attention (a lightning indexer
    over blocks of keys, not modelled)."""
    if "minimax_m3_sparse" in (config.get("layer_types") or []):
        raise LmcalcError(f"{origin}: config.json layer_types has minimax_m3_sparse layers: MiniMax-M3's block-sparse "
                          "attention (its lightning indexer) is not modelled")  # fmt: skip
    dense = config.get("dense_intermediate_size") or ffn_size
    return {"ffn_size": dense, "rotary_concat": True, "fused_linears": ["gate_up"]}


def moe(config: dict[str, Any], kind: str, layers: int, origin: str) -> dict[str, Any] | None:
    experts = (
        config.get("num_local_experts")
        or config.get("n_routed_experts")
        or config.get("num_experts")
        or config.get("moe_num_experts")  # ERNIE 4.5
    )
    if not experts:
        return None
    shared = (
        config.get("n_shared_experts")
        or config.get("moe_num_shared_experts")
        or config.get("num_shared_experts")
        or (1 if kind == "hunyuan_v1_moe" else 0)  # HunYuanMoEV1Moe's shared_mlp, of the experts' width
        or (1 if kind == "llama4_text" else 0)
    )
    shared_width = config.get("shared_expert_intermediate_size")  # Qwen2-MoE's one gated shared expert
    # GraniteMoeShared's and Granite 4's shared_mlp, added to the experts' output without a gate
    ungated_kinds = ("granitemoeshared", "granitemoehybrid", "minimax_m3_vl_text")  # MiniMax-M3's shared_experts too
    ungated = config.get("shared_intermediate_size") if kind in ungated_kinds else None
    if kind in ("kolibri1", "flint", "laguna", "lara_mini"):  # their shared expert: Qwen2-MoE's width, no gate
        shared_width, ungated = None, shared_width
    if kind in ("deepseek_v2", "axk2") and config.get("moe_layer_freq", 1) != 1 and not config.get("mlp_layer_types"):
        raise LmcalcError(f"{origin}: moe_layer_freq other than 1 is not supported")
    every = config.get("decoder_sparse_step") or config.get("interleave_moe_layer_step") or 1
    if kind == "jamba":  # layer i is MoE when i % expert_layer_period == expert_layer_offset
        every = config.get("expert_layer_period", 2)
        if config.get("expert_layer_offset", 1) != every - 1:
            raise LmcalcError(f"{origin}: Jamba's expert_layer_offset must be expert_layer_period − 1 for lmcalc")
    if kind == "llama4_text" and config.get("moe_layers") is not None:
        listed = set(config["moe_layers"])
        every = every_n([i in listed for i in range(layers)], origin, "MoE") or 1
    only = config.get("mlp_only_layers")
    dense_ids = list([0, 1] if only is None and kind == "flint" else only or [])  # FlintConfig's default: [0, 1]
    if config.get("mlp_layer_types"):  # Mellum: "dense" or "sparse", layer by layer
        dense_ids += [i for i, t in enumerate(config["mlp_layer_types"]) if t == "dense"]
    first_dense = config.get("first_k_dense_replace") or config.get("num_dense_layers") or 0
    if kind in ("glm4_moe_lite", "hy_v3", "hy_v4", "laguna", "mimo_v2_flash") and not config.get("mlp_layer_types"):
        first_dense = 1  # their classes' one dense layer
    if kind in ("axk1", "axk2", "kimi_linear") and not config.get("mlp_layer_types"):  # their classes: a kwarg, else 1
        first_dense = config.get("first_k_dense_replace", 1)
    if kind == "beam" and not config.get("mlp_layer_types"):  # BeamConfig: the first three layers dense
        first_dense = min(3, layers)
    if kind == "ernie4_5_moe":  # MoE where start <= i <= end and (i + 1) % interval == 0 (Ernie4_5_MoeDecoderLayer)
        first_dense, every = config.get("moe_layer_start_index") or 0, config.get("moe_layer_interval") or 1
        end = config.get("moe_layer_end_index")
        end = layers - 1 if end is None or end < 0 else end
        dense_ids += list(range(end + 1, layers))
    if not any(i >= first_dense and (i + 1) % every == 0 and i not in dense_ids for i in range(layers)):
        return None  # every layer keeps its dense MLP: the model builds no router and no expert
    return {
        "num_experts": experts,
        # DeepseekV2Config's class default is None: the count stands without it, and estimates that need k refuse
        "experts_per_token": None
        if kind == "deepseek_v2" and config.get("num_experts_per_tok") is None
        else _get(config, origin, "num_experts_per_tok", "experts_per_token", "moe_k", "moe_topk"),
        "shared_experts": shared + (1 if shared_width or ungated else 0),
        "expert_ffn_size": _get(config, origin, "moe_intermediate_size", "intermediate_size"),
        "shared_expert_ffn_size": shared_width or ungated or None,
        "shared_expert_gate": bool(shared_width),
        "dense_layers": first_dense,
        "moe_every": every,
        "dense_layer_ids": dense_ids,
        # gpt-oss's router is a Linear with a bias; DeepSeek-V3's and GLM-4.5's balancing bias is a buffer in
        # transformers (set by a rule, not trained), so not a parameter
        # ERNIE 4.5's e_score_correction_bias is an nn.Parameter (frozen): counted, as transformers counts it
        # AFMoE's expert_bias and Laguna's e_score_correction_bias are frozen nn.Parameters too
        "router_bias": kind in ("gpt_oss", "ernie4_5_moe", "afmoe", "laguna"),
        "dense_dispatch": kind == "llama4_text",  # Llama4TextMoe: every token through every expert, scaled
        "router_fp32": kind in ROUTER_FP32,
        "output_norm": kind == "axk1",  # AXK1MoE's post_mlp_layernorm on the block's output
        # group-limited routing: each token's experts come from topk_group of n_group groups, which training
        # places a group to a node (DeepSeek-V3 §2.1.2: node-limited routing)
        "node_limit": config.get("topk_group") if (config.get("n_group") or 1) > 1 else None,
    }


def deltanet(config: dict[str, Any], kind: str, layers: int, origin: str) -> dict[str, Any]:
    """Qwen3-Next's, Qwen3.5's, OLMo Hybrid's and Lara Mini's Gated DeltaNet layers (``linear_*``), attention in
    every layer ``layer_types`` does not call linear_attention (Qwen3NextConfig: every ``full_attention_interval``-th
    layer, from that one; by index where no period says, Lara Mini's sliding and full layers), and the gate Qwen's
    attention's q_proj makes for its output."""
    types = config.get("layer_types") or [
        "full_attention" if (i + 1) % (config.get("full_attention_interval") or 4) == 0 else "linear_attention"
        for i in range(layers)
    ]
    full = [t != "linear_attention" for t in types]  # Lara Mini attends in sliding_attention layers too
    if kind == "olmo_hybrid" and not config.get("layer_types") and not any(full):  # OlmoHybridConfig: the last
        full[-1] = True
    if not any(full):
        raise LmcalcError(f"{origin}: config.json layer_types has no full_attention layer; lmcalc reads hybrids only")
    pattern = global_layers(full, origin)
    if "global_layer_ids" in pattern:  # no period: the layers that attend by index
        layout = {"attention_layer_ids": pattern["global_layer_ids"]}
    else:
        every = pattern["global_every"]
        layout = {"attention_every": every, "attention_offset": 0 if pattern.get("global_from_first") else every - 1}
    if kind == "olmo_hybrid":  # OlmoHybridConfig.__post_init__: the heads', 3/4 of h over them, twice that for v
        heads = _get(config, origin, "num_attention_heads")
        key_heads = config.get("linear_num_key_heads") or heads
        key_dim = config.get("linear_key_head_dim") or int(0.75 * _get(config, origin, "hidden_size") / key_heads)
        computed = {"linear_num_key_heads": key_heads, "linear_num_value_heads": heads,
                    "linear_key_head_dim": key_dim, "linear_value_head_dim": 2 * key_dim}  # fmt: skip
        config = computed | {k: v for k, v in config.items() if v is not None}
    return {
        # OLMo Hybrid's attention is OLMo 3's, Lara Mini's Qwen3's: without a gate
        "attention_output_gate": kind not in ("olmo_hybrid", "lara_mini"),
        "deltanet": {
            "key_heads": _get(config, origin, "linear_num_key_heads"),
            "value_heads": _get(config, origin, "linear_num_value_heads"),
            "key_head_dim": _get(config, origin, "linear_key_head_dim"),
            "value_head_dim": _get(config, origin, "linear_value_head_dim"),
            "conv_kernel": _get(config, origin, "linear_conv_kernel_dim"),
            **layout,
            # Qwen3_5GatedDeltaNet's (and Lara Mini's) four input projections
            "split_projections": kind.startswith("qwen3_5") or kind == "lara_mini",
            "separate_projections": kind == "olmo_hybrid",  # OlmoHybridGatedDeltaNet's six, and its o_proj
        },
    }


def kimi_delta(config: dict[str, Any], kind: str, layers: int, origin: str) -> dict[str, Any]:
    """Kimi Linear's and the Bailing hybrid's Kimi Delta Attention layers, MLA where ``layer_types`` says
    full_attention. KimiLinearConfig reads a checkpoint's ``linear_attn_config`` (its 1-indexed full_attn_layers and
    kda_layers, head_dim, num_heads, short_conv_kernel_size) over its own linear_* fields; without either, layer i
    attends when i is a positive multiple of 4. BailingHybridConfig's KDA takes the attention's heads and head_dim,
    and attends in every ``layer_group_size``-th layer; its gates are full projections, Kimi's of rank head_dim."""
    if kind == "kimi_linear":
        linear = config.get("linear_attn_config") or {}
        heads = linear.get("num_heads") or _get(config, origin, "linear_num_heads", default=32)
        head_dim = linear.get("head_dim") or _get(config, origin, "linear_head_dim", default=128)
        kernel = linear.get("short_conv_kernel_size") or _get(config, origin, "linear_conv_kernel_dim", default=4)
        types = config.get("layer_types")
        if not types and "full_attn_layers" in linear and "kda_layers" in linear:
            full_ids = {i - 1 for i in linear["full_attn_layers"]}  # 1-indexed in the checkpoint
            types = ["full_attention" if i in full_ids else "linear_attention" for i in range(layers)]
        types = types or ["full_attention" if i and i % 4 == 0 else "linear_attention" for i in range(layers)]
    else:  # BailingHybridConfig.__post_init__: the attention's heads and head_dim, where linear_* are not given
        heads = config.get("linear_num_heads") or _get(config, origin, "num_attention_heads")
        head_dim = config.get("linear_head_dim") or _get(config, origin, "head_dim", default=128)
        kernel = config.get("linear_conv_kernel_dim") or _get(config, origin, "short_conv_kernel_size", default=4)
        group = _get(config, origin, "layer_group_size", default=6)
        types = config.get("layer_types") or [
            "full_attention" if (i + 1) % group == 0 else "linear_attention" for i in range(layers)
        ]
    attending = [i for i, t in enumerate(types[:layers]) if t == "full_attention"]
    if not attending:
        raise LmcalcError(f"{origin}: config.json layer_types has no full_attention layer; lmcalc reads hybrids only")
    return {
        "deltanet": {
            "key_heads": heads,
            "value_heads": heads,
            "key_head_dim": head_dim,
            "value_head_dim": head_dim,
            "conv_kernel": kernel,
            "separate_projections": True,
            "channel_decay": True,
            "gate_rank": head_dim if kind == "kimi_linear" else None,
            "attention_layer_ids": attending,
        },
    }


MAMBA2_FIELDS = {"groups": "mamba_n_groups", "state": "mamba_d_state", "conv_kernel": "mamba_d_conv",
                 "chunk": "mamba_chunk_size", "conv_bias": "mamba_conv_bias",
                 "proj_bias": "mamba_proj_bias"}  # fmt: skip
"""Where a hybrid's config.json (Bamba, Granite 4, Falcon-H1) spells each Mamba2Spec field."""


def mamba2_mixer(
    config: dict[str, Any], origin: str, inner: int, heads: int, names: dict[str, str] = MAMBA2_FIELDS
) -> dict[str, Any]:
    """A Mamba-2 mixer's Mamba2Spec fields, each read from the config field ``names`` gives for it (Mamba2Config
    spells them n_groups, state_size, conv_kernel, chunk_size, use_conv_bias and use_bias)."""
    return {
        "inner": inner,
        "heads": heads,
        "groups": config.get(names["groups"]) or 1,
        "state": _get(config, origin, names["state"]),
        "conv_kernel": _get(config, origin, names["conv_kernel"]),
        "chunk": config.get(names["chunk"]) or 256,
        "conv_bias": bool(config.get(names["conv_bias"], True)),
        "proj_bias": bool(config.get(names["proj_bias"])),
    }


def mamba2(config: dict[str, Any], kind: str, hidden: int, layers: int, origin: str) -> dict[str, Any]:
    """Bamba's and Granite 4's Mamba-2 layers (``mamba_*``), attention in Bamba's ``attn_layer_indices`` or where
    Granite 4's ``layer_types`` says attention (full_attention, or its older "attention"); Granite 4 attends without
    RoPE unless ``position_embedding_type`` is rope. Falcon-H1 runs Mamba-2 beside attention in every layer, over
    ``mamba_d_ssm`` channels where given, with a gated norm only where ``mamba_rms_norm`` says so."""
    if kind == "bamba":
        attending = sorted(config.get("attn_layer_indices") or [])
    elif kind == "falcon_h1":  # FalconH1DecoderLayer: attention and Mamba-2 side by side in every layer
        attending = []
        if bool(config.get("mamba_proj_bias")) != bool(config.get("projectors_bias")):
            raise LmcalcError(f"{origin}: config.json mamba_proj_bias and projectors_bias differ: a bias on Mamba-2's "
                              "input projection alone, or its output projection alone, is not modelled")  # fmt: skip
    else:
        types = config.get("layer_types") or []
        attending = [i for i, t in enumerate(types) if t in ("full_attention", "attention")]
    heads, inner = _get(config, origin, "mamba_n_heads"), config.get("mamba_expand", 2) * hidden
    if kind == "falcon_h1" and config.get("mamba_d_ssm") is not None:  # FalconH1Mixer's width where given
        inner = config["mamba_d_ssm"]
    head_dim = config.get("mamba_d_head")
    if isinstance(head_dim, int) and head_dim * heads != inner:
        raise LmcalcError(
            f"{origin}: config.json mamba_d_head × mamba_n_heads must be the Mamba-2 inner width ({inner})"
        )
    fields: dict[str, Any] = {
        "mamba2": mamba2_mixer(config, origin, inner, heads)
        | {
            "gated_norm": kind != "falcon_h1" or bool(config.get("mamba_rms_norm")),
            "parallel": kind == "falcon_h1",
            "attention_layer_ids": attending,
        }
    }
    if kind == "granitemoehybrid" and config.get("position_embedding_type") != "rope":
        fields["position_embedding"] = "none"
    return fields


def short_conv(config: dict[str, Any], origin: str, adjust_ffn: bool = True) -> dict[str, Any]:
    """LFM2's gated short convolutions in the layers ``layer_types`` calls conv (Lfm2Config: where absent, every layer
    not in ``full_attn_idxs`` is one; without either, every layer attends), and the width of its SwiGLU: the config's
    intermediate_size (``block_ff_dim`` where given) taken to 2/3, times ``block_ffn_dim_multiplier``, rounded up to
    a multiple of ``block_multiple_of`` (Lfm2MLP, when ``block_auto_adjust_ff_dim`` and ``adjust_ffn``: LFM2-MoE's
    dense layers take intermediate_size as it is); ``tie_embedding`` stands for tie_word_embeddings, as the class
    reads it."""
    layers = _get(config, origin, "num_hidden_layers")
    types = config.get("layer_types")
    if not types:
        full = config.get("full_attn_idxs")
        types = ["full_attention" if full is None or i in full else "conv" for i in range(layers)]
    ffn = config.get("block_ff_dim") or _get(config, origin, "intermediate_size")
    if adjust_ffn and config.get("block_auto_adjust_ff_dim", True):
        ffn = int(2 * ffn / 3)
        if config.get("block_ffn_dim_multiplier") is not None:
            multiple = config.get("block_multiple_of") or 256
            ffn = multiple * -(-int(config["block_ffn_dim_multiplier"] * ffn) // multiple)
    fields: dict[str, Any] = {"ffn_size": ffn}
    if "tie_embedding" in config:
        fields["tied_embeddings"] = bool(config["tie_embedding"])
    if "conv" in types:
        fields["short_conv"] = {
            "conv_kernel": _get(config, origin, "conv_L_cache"),
            "bias": bool(config.get("conv_bias")),
            "attention_layer_ids": [i for i, t in enumerate(types) if t != "conv"],
        }
    return fields


def lightning(config: dict[str, Any], origin: str, layers: int, hidden: int, heads: int) -> dict[str, Any]:
    """MiniMax-01's lightning attention in the layers ``layer_types`` calls linear_attention (MiniMaxConfig: where
    absent, every second layer, from layer 1), softmax attention in the others; the heads and their width are the
    attention's (MiniMaxLightningAttention: head_dim, else hidden_size / num_attention_heads)."""
    types = config.get("layer_types") or [
        "full_attention" if (i + 1) % 2 else "linear_attention" for i in range(layers)
    ]
    if "linear_attention" not in types[:layers]:
        return {}
    return {
        "lightning": {
            "heads": heads,
            "head_dim": config.get("head_dim") or hidden // heads,
            "block": _get(config, origin, "block_size", default=256),
            "attention_layer_ids": [i for i, t in enumerate(types[:layers]) if t != "linear_attention"],
        }
    }


def prepared(config: dict[str, Any], kind: str, origin: str) -> dict[str, Any]:
    """A config with the fields its class derives, before the common reader reads them: LongCat-Flash's layers
    counted as lmcalc counts them, two sub-layers (attention and a dense MLP each) in each of its ``num_layers``
    (LongcatFlashConfig.num_hidden_layers is 2·num_layers); JetMoE's heads, k·H_kv (JetMoeConfig sets
    num_attention_heads so whatever config.json says); Gemma 3n's MLP width, a list of one width a layer; a looped
    model's layer runs (``hf_loops``)."""
    if kind == "longcat_flash":
        return {**config, "num_hidden_layers": 2 * _get(config, origin, "num_layers")}
    if kind in LOOPED:  # Dory's and HRM's layer runs
        return looped_config(config, kind, origin)
    if kind == DOTS3:  # its layer kinds, MLP kinds and per-layer widths
        return dots3_config(config, origin)
    if kind == "jetmoe":
        heads = _get(config, origin, "num_key_value_heads") * _get(config, origin, "num_experts_per_tok")
        return {**config, "num_attention_heads": heads}
    widths = config.get("intermediate_size")
    if isinstance(widths, list):  # Gemma3nTextConfig's, a width a layer: lmcalc's layers share one
        if kind != "gemma3n_text" or len(set(widths)) != 1:
            what = "differ from layer to layer" if kind == "gemma3n_text" else "are a list"
            raise LmcalcError(f"{origin}: config.json intermediate_size {what}: lmcalc's dense layers share one width")
        layers = config.get("num_hidden_layers")
        if len(widths) != layers:
            raise LmcalcError(f"{origin}: config.json intermediate_size gives {len(widths)} widths for {layers} layers")
        return {**config, "intermediate_size": widths[0]}
    return config


def longcat_moe(config: dict[str, Any], routed: dict[str, Any], ffn_size: int) -> dict[str, Any]:
    """LongCat-Flash's shortcut MoE (LongcatFlashDecoderLayer): it reads the first sub-layer's MLP input and its
    output joins the second's, so a pair of sub-layers computes what an MoE layer whose shared expert is the dense
    MLP and a dense layer compute (every other sub-layer routes: MoE on the second of each pair here, which a
    pipeline chunk holds whole). Its router scores the zero-computation experts too,
    in fp32 (LongcatFlashTopkRouter), and may carry a bias (``router_bias``); its experts run one at a time."""
    return routed | {
        "moe_every": 2,
        "shared_experts": 1,
        "shared_expert_ffn_size": ffn_size,
        "zero_experts": config.get("zero_expert_num") or 0,
        "router_bias": bool(config.get("router_bias")),
        "router_fp32": True,
        "expert_loop": True,  # LongcatFlashExperts: a Python loop over the experts hit, each added back by index_add
    }


def transformers_unused(spec: ModelSpec) -> int:
    """Parameters transformers 5.24 builds that the model never reads: LongcatFlashExperts' ``gate_up_proj`` holds
    E + Z experts where its ``down_proj`` holds E, so each zero-computation expert gets 2·f_e·h weights that no token
    uses and no checkpoint fills (L_moe·Z·2·f_e·h); and Zamba 2's adapters no use runs: an untied block holds those
    of every use of its turn (n_b of turn b), though it runs its own, Σ_b n_b² − G; and a block holds adapters for
    every layer config.json's hybrid_layer_ids lists, which may be more than run a block (0 for other models)."""
    moe, shared = spec.moe, spec.shared_block
    if shared is not None:  # block b holds the adapters of the uses i ≡ b (mod B) among those it builds them for
        slots = shared.uses if shared.adapter_slots is None else shared.adapter_slots
        turns = [sum(i % shared.blocks == b for i in range(slots)) for b in range(shared.blocks)]
        held = sum(turns) if shared.tied else sum(turns[j % shared.blocks] for j in range(shared.uses))
        return max(0, held - shared.uses) * shared.adapter_elements(spec.hidden_size, spec.ffn_size)
    return spec.moe_layers * moe.zero_experts * 2 * moe.expert_ffn_size * spec.hidden_size if moe else 0


def with_unused_noted(spec: ModelSpec) -> ModelSpec:
    """``spec`` with a note of ``transformers_unused``, where there are any."""
    unused = transformers_unused(spec)
    if not unused:
        return spec
    if spec.shared_block is not None:
        why = "Zamba2's blocks hold adapters for more uses than run them (untied blocks, or hybrid_layer_ids)"
    else:
        assert spec.moe is not None
        why = (f"LongcatFlashExperts' gate_up_proj has rows for the {spec.moe.zero_experts} zero-computation experts "
               "too (L_moe·Z·2·f_e·h)")  # fmt: skip
    note = f"transformers 5.24 builds {group(unused)} more parameters than these: {why}, which no token reads"
    return spec.model_copy(update={"notes": (*spec.notes, note)})


def axk2(config: dict[str, Any], origin: str, fields: dict[str, Any]) -> dict[str, Any]:
    """A.X K2 (AXK2Attention, AXK2DecoderLayer): DeepSeek-V3.2's MLA and indexer, with one query up-projection
    (``q_gate_proj``) that reads the query latent's norm output beside the latent itself and makes the queries and a
    sigmoid gate, computed in fp32, on the attention's output; every layer's input norm, and an MoE layer's MLP
    norm, gated by a low-rank MLP (``gated_norm_rank``)."""
    return fields | {
        "mla": fields["mla"] | {"q_latent_concat": True},
        "attention_output_gate": True,
        "attention_gate_fp32": True,
        "gated_norm_rank": _get(config, origin, "gated_norm_rank"),
    }


def jetmoe(config: dict[str, Any], origin: str, fields: dict[str, Any]) -> dict[str, Any]:
    """JetMoE (JetMoeAttention, JetMoeMoE): a mixture of attention heads over one shared K and V (``kv_proj``) with
    heads of ``kv_channels``, the query and output projections experts as the MLP's are, each with a router of its
    own and a bias on its output; its experts run one at a time."""
    return fields | {
        "head_dim": _get(config, origin, "kv_channels"),
        "fused_linears": ["kv"],
        "moe": fields["moe"] | {"attention_experts": fields["moe"]["num_experts"], "output_bias": True,
                                "expert_loop": True},
    }  # fmt: skip


FINISHED = {"axk2": axk2, "jetmoe": jetmoe, "dory": dory, "hrm_text": hrm_text, "zaya": zaya, "inkling_text": inkling,
            "inkling2_text": inkling2, "inkling2_loop_text": inkling2_loop, DOTS3: dots3_note,
            GEMMA3N: gemma3n, MLLAMA: mllama, **dict.fromkeys(GEMMA4, gemma4)}  # fmt: skip
"""Types whose fields the common reader leaves to a function of their own, which finishes them."""
