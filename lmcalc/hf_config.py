"""Reading a Hugging Face ``config.json`` as plain JSON (no transformers, no network) into ModelSpec fields.

Every type in ``SUPPORTED`` (and in ``hf_defaults.BUILDS_AS``, read as the type whose model it builds) is read so
that the count equals the parameters transformers (5.24) builds from the same config, exactly; tests/test_hf_types.py
builds each on the meta device and compares, and scripts/hf_coverage.py tries every decoder-only type transformers
registers. A field is first read as the type's configuration class reads it: an alias under its field's name and a
field the file leaves out at the class's default (``hf_defaults``, written from the classes). The quirks come from
each type's modelling code, not from its config, so they live here, type by type: which norms a layer has, which
projections carry biases, whether attention and MLP run in parallel; ``hf_gpt`` reads the GPT family's configs
(GPT-2 to MPT and DBRX) and ``hf_layers`` which layers attend locally, route to experts or run a hybrid's mixer.
A multimodal config (``text_config`` inside) is read as its text model; the vision tower is counted apart where known,
else named in a note. Other types are refused with a clear message rather than guessed at (``hf_meta.UnreadType``:
``lmcalc params`` may count them with transformers): a wrong count called exact is worse than none.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Any

from lmcalc.errors import LmcalcError, token
from lmcalc.hf_attention import cpmant, indexer, laguna, modernbert
from lmcalc.hf_blocks import MAMBA_STACKS, mamba_stack, nemotron_h, recurrent_gemma, rwkv, xlstm, zamba, zamba2
from lmcalc.hf_blt import KIND as BLT
from lmcalc.hf_blt import blt_config
from lmcalc.hf_compressed import deepseek_v4
from lmcalc.hf_defaults import ATTRIBUTE_MAPS, BUILDS_AS, CLASS_DEFAULTS, DECODER_TYPES
from lmcalc.hf_dots import KIND as DOTS3
from lmcalc.hf_fields import check_fields, check_layer_count, rotary_fraction
from lmcalc.hf_fields import get as _get
from lmcalc.hf_gpt import (
    GELUS,
    PARALLEL_GELU,
    RELU_MLPS,
    RELUS,
    XIELU_MLPS,
    activation,
    ctrl,
    dropout,
    gelu,
    git,
    gpt2,
    gpt_neo,
    gpt_neox_japanese,
    mpt_family,
    neox_family,
    openai_gpt,
    opt_family,
    parallel_gelu,
    xglm,
)
from lmcalc.hf_layers import (
    FINISHED,
    deltanet,
    kimi_delta,
    lightning,
    local_attention,
    longcat_moe,
    mamba2,
    minimax_m3,
    moe,
    prepared,
    short_conv,
    windows,
)
from lmcalc.hf_meta import UnreadType
from lmcalc.hf_moe_storage import moe_storage
from lmcalc.hf_vision import vision_fields
from lmcalc.hf_widths import GEMMA3N, GEMMA4, MLLAMA, drafter_fields, gemma4_layer_types

LLAMA_LIKE = (
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "olmo2", "olmoe", "deepseek_v2",
    "deepseek_v3", "gemma", "gemma2", "gemma3_text", "granite", "smollm3", "phi3", "ernie4_5", "glm4", "glm4_moe",
    "gpt_oss", "cohere", "cohere2", "starcoder2", "llama4_text", "jamba", "granitemoe", "granitemoeshared",
    "flex_olmo", "minimax_m2", "dots1", "phimoe", "ministral3", "helium", "olmo3", "vaultgemma", "glm", "hyperclovax",
    "minicpm3", "youtu", "stablelm", "cwm", "exaone4", "seed_oss", "ernie4_5_moe", "mellum", "arcee", "nemotron",
    "persimmon", "qwen3_next", "qwen3_5_text", "qwen3_5_moe_text", "bamba", "granitemoehybrid", "solar_open",
    "ministral", "granite_swa", "granitemoe_swa", "jais2", "hunyuan_v1_dense", "exaone_moe", "glm4_moe_lite", "olmo",
    "nanochat", "apertus", "apertus1p5_text", "hunyuan_v1_moe", "cohere2_moe", "aria_text", "kolibri1", "afmoe",
    "hy_v3", "lfm2", "lfm2_moe", "olmo_hybrid", "falcon_h1", "bitnet", "diffllama", "emu3_text_model", "deepseek_v32",
    "glm_moe_dsa", "minimax", "axk1", "flint", "kimi_linear", "bailing_hybrid", "laguna", "lara_mini", "lfm3",
    "beam", "modernbert-decoder", "mimo_v2_flash", "minimax_m3_vl_text", "longcat_flash", "axk2", "jetmoe", "hy_v4",
    "doge", "dory", "hrm_text", "phi4_multimodal", "zaya", "inkling_text", "inkling2_text", "inkling2_loop_text", DOTS3,
    GEMMA3N,
    *GEMMA4, MLLAMA,
)  # fmt: skip
SINGLE_BLOCKS = ("nemotron_h", *MAMBA_STACKS)
"""Types whose layers are each a mixer or an FFN alone (``hf_blocks``): Nemotron-H's, and the Mamba models', every
one a Mamba block."""
DELTANET = ("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text")
"""Hybrids of Gated DeltaNet and gated attention (Qwen3-Next, Qwen3.5): ModelSpec.deltanet, attention_output_gate; OLMo
Hybrid's (``olmo_hybrid``) are read the same way, its attention without the gate."""
GPT_FAMILY = ("gpt2", "gpt_bigcode", *PARALLEL_GELU, "gpt_neox", "falcon", "bloom", "opt", "biogpt", "gpt_neo", "mpt",
              "dbrx", "openai-gpt", "ctrl", "xglm", "gpt_neox_japanese", "git")  # fmt: skip
"""The types ``hf_gpt`` reads."""
SUPPORTED = (*GPT_FAMILY, *LLAMA_LIKE, *SINGLE_BLOCKS, "rwkv", "recurrent_gemma", "deepseek_v4", "zamba", "zamba2",
             "xlstm", "cpmant", BLT)  # fmt: skip
MULTIMODAL = {"gemma3": "gemma3_text", "llama4": "llama4_text", "mistral3": "mistral", "qwen3_5": "qwen3_5_text",
              "qwen3_5_moe": "qwen3_5_moe_text", "emu3": "emu3_text_model", "gemma4": "gemma4_text",
              "gemma4_unified": "gemma4_unified_text", "gemma3n": GEMMA3N, "mllama": MLLAMA}  # fmt: skip
"""Wrapper types whose ``text_config`` holds the language model (and the text type it defaults to)."""
DRAFTERS = {"gemma4_assistant": "gemma4_text", "gemma4_unified_assistant": "gemma4_unified_text"}
"""Wrappers whose ``text_config`` is not the whole model: Gemma 4's drafters for speculative decoding, whose causal
LM adds projections from and to the backbone's width (and their text model reuses its K and V in every layer)."""
FUSED = {"phi3": ["qkv", "gate_up"], "phi4_multimodal": ["qkv", "gate_up"], "codegen": ["qkv"], "glm4": ["gate_up"],
         "glm": ["gate_up"], "gpt2": ["qkv"],
         "gpt_bigcode": ["qkv"], "persimmon": ["qkv"], "gpt_neox": ["qkv"], "gpt_neox_japanese": ["qkv"],
         "falcon": ["qkv"], "bloom": ["qkv"], "mpt": ["qkv"], "dbrx": ["qkv"],
         "granitemoeshared": ["gate_up"], "granitemoehybrid": ["gate_up"]}  # fmt: skip
"""Types whose modules fuse weights (Phi-3's qkv_proj and gate_up_proj, GPT-NeoX's query_key_value): the same
count, one LoRA adapter each."""
SANDWICH_NORMS = ("gemma2", "gemma3_text", "glm4", "kolibri1", "afmoe", "lfm3", "beam", GEMMA3N, *GEMMA4)
"""Types with norms after both halves too, before the residual adds (Gemma 2's sandwich norms)."""
QK_NORM = {"olmo2": "full", "olmoe": "full", "qwen3": "per_head", "qwen3_moe": "per_head", "gemma3_text": "per_head",
           "flex_olmo": "full", "minimax_m2": "full", "dots1": "per_head", "olmo3": "full",
           "exaone4": "per_head", "mellum": "per_head", "hunyuan_v1_dense": "per_head",
           "hunyuan_v1_moe": "per_head", "exaone_moe": "per_head",
           "nanochat": "per_head",
           "apertus": "per_head", "apertus1p5_text": "per_head", "kolibri1": "per_head", "afmoe": "per_head",
           "hy_v3": "per_head", "lfm2": "per_head", "lfm2_moe": "per_head", "olmo_hybrid": "full", "flint": "per_head",
           "laguna": "per_head", "lara_mini": "per_head", "lfm3": "per_head", "beam": "per_head",
           "minimax_m3_vl_text": "per_head", "doge": "per_head",
           **dict.fromkeys((*DELTANET, GEMMA3N, *GEMMA4), "per_head")}  # fmt: skip
PARTIAL_ROTARY = {"glm": 0.5, "glm4": 0.5, "glm4_moe": 0.5, "stablelm": 0.25, "nemotron": 0.5, "persimmon": 0.5,
                  "qwen3_next": 0.25, "qwen3_5_text": 0.25, "qwen3_5_moe_text": 0.25, "bamba": 0.5,
                  "mimo_v2_flash": 0.334, "zaya": 0.5}  # fmt: skip
"""The classes' partial_rotary_factor where it is below 1 (their rope_parameters' default; tests/test_hf_types.py)."""
QK_NORM_OPTIONAL = {"glm4_moe": "per_head", "cohere": "full", "persimmon": "per_head"}  # use_qk_norm, qk_layernorm
QKV_BIAS_ONLY = ("qwen2", "qwen2_moe", "glm4", "glm4_moe", "glm", "helium", "stablelm", "solar_open")  # fmt: skip
"""Types whose attention_bias puts biases on q, k and v, none on the output (Qwen2's always)."""
NORM_WEIGHT_FP32 = ("gemma", "gemma2", "gemma3_text", "olmo2", "gpt_oss", "cohere", "cohere2", "cohere2_moe", "afmoe",
                    "flex_olmo", "olmo3",
                    "helium", "vaultgemma", "nemotron_h", "olmo_hybrid", "flint", "lara_mini", "beam",
                    "minimax_m3_vl_text", "recurrent_gemma", "deepseek_v4",
                    *DELTANET, GEMMA3N, *GEMMA4)  # fmt: skip
"""Types whose norms multiply by their weight in fp32 before the cast back (GemmaRMSNorm, Gemma2RMSNorm,
Gemma3RMSNorm, Olmo2RMSNorm, GptOssRMSNorm, CohereLayerNorm, NemotronHRMSNorm): ModelSpec.norm_weight_fp32."""
NORM_KIND = {"starcoder2": "layernorm", "nemotron": "layernorm", "persimmon": "layernorm", "phimoe": "layernorm",
             "stablelm": "layernorm", "jais2": "layernorm", "olmo": "layernorm", "cohere": "layernorm_nobias",
             "cohere2": "layernorm_nobias", "cohere2_moe": "layernorm_nobias"}  # fmt: skip
"""The norms of the Llama-like types whose norms are not RMSNorms: LayerNorms, with biases or without."""
RESIDUAL_DROPOUT = {"seed_oss": "residual_dropout", "emu3_text_model": "attention_dropout"}
"""Llama-like types that drop attention probabilities (attention_dropout) and each sub-layer's output, at this field."""
COHERE = ("cohere", "cohere2", "cohere2_moe")
"""Attention and MLP side by side from one norm (CohereDecoderLayer)."""
CLASS_LAYER_TYPES: dict[str, Callable[[int, int, dict[str, Any]], str]] = {
    "lara_mini": lambda i, _, __: ("linear", "sliding", "linear", "full", "sliding")[i % 5] + "_attention",
    "beam": lambda i, n, _: "full_attention" if (i + 1) % 6 == 0 or i == n - 1 else "sliding_attention",
    "lfm3": lambda i, _, __: "full_attention" if i % 4 == 2 else "sliding_attention" if i % 4 == 0 and i else "conv",
    "mimo_v2_flash": lambda i, _, __: "full_attention" if i == 0 or (i + 1) % 6 == 0 else "sliding_attention",
    "inkling_text": lambda i, _, config: (
        "hybrid_sliding"
        if (i in config["local_layer_ids"] if config.get("local_layer_ids") is not None else (i + 1) % 6)
        else "hybrid"
    ),
    "inkling2_text": lambda i, _, __: "hybrid" if (i + 1) % 6 == 0 else "hybrid_sliding",
    "modernbert-decoder": lambda i, _, config: (
        "sliding_attention" if i % (config.get("global_attn_every_n_layers") or 3) else "full_attention"
    ),
}
"""The layer_types (layer i of n) a class's ``__post_init__`` writes where config.json gives none: LaraMiniConfig's
released pattern (period 5), BeamConfig's every sixth layer and the last full, Lfm3Config's full, sliding and conv
layers, MiMoV2FlashConfig's first layer and every sixth full, InklingTextConfig's ``local_layer_ids`` local (else
all but every sixth), Inkling2TextConfig's all but every sixth, ModernBertDecoderConfig's every
global_attn_every_n_layers-th layer full from the first."""
NEVER_TIED = ("kimi_linear", "bailing_hybrid", MLLAMA, "xlstm", "cpmant", "inkling_text", "inkling2_text",
              "inkling2_loop_text")  # fmt: skip
"""Types whose ForCausalLM ties no weights (``_tied_weights_keys = {}``, or none: xLSTMForCausalLM): an untied head
whatever tie_word_embeddings says."""
NO_NORM_WEIGHT = ("olmo", "nanochat")
"""Types whose norms have no weight (OlmoLayerNorm, NanoChatRMSNorm): ModelSpec.norm_weight false. nanochat's also
normalises the embedding (its final norm, called once before the layers too)."""


def _common(config: dict[str, Any], kind: str, name: str, origin: str) -> dict[str, Any]:
    return {
        "name": name,
        "display_name": f"{name} (from config.json)",
        "vocab_size": _get(config, origin, "vocab_size"),
        # the class default is merged in; a class whose _tied_weights_keys is empty ties nothing, whatever the field
        "tied_embeddings": _flag(config, "tie_word_embeddings", False, origin) and kind not in NEVER_TIED,
        "fused_linears": FUSED.get(kind, []),
        "norm_weight_fp32": kind in NORM_WEIGHT_FP32,
        "sources": [origin],
    }


def _flag(config: dict[str, Any], key: str, default: bool, origin: str) -> bool:
    """A boolean field, read strictly: JSON's true or false (the string "false" is not false)."""
    value = config.get(key, default)
    if not isinstance(value, bool):
        raise LmcalcError(f"{origin}: config.json {key} must be true or false, not {token(value)}")
    return value


def _floored_head_dim(config: dict[str, Any], origin: str) -> int | None:
    """Without a ``head_dim``, transformers' attention takes hidden_size // num_attention_heads, floored where the
    heads do not tile the hidden size (Glm4MoeConfig's defaults: 4096 // 96 = 42); None where they do, for the spec
    to divide."""
    hidden, heads = _get(config, origin, "hidden_size"), _get(config, origin, "num_attention_heads")
    if isinstance(hidden, int) and isinstance(heads, int) and heads > 0 and hidden % heads:
        return hidden // heads
    return None


def _stablelm_parallel(config: dict[str, Any], kind: str) -> bool:
    """StableLM's GPT-NeoX-style parallel block from one norm (``use_parallel_residual``; its class default false)."""
    return kind == "stablelm" and bool(config.get("use_parallel_residual"))


def _post_norms(config: dict[str, Any], kind: str) -> bool:
    """HyperCLOVA X's norms on each sub-layer's output as well (``use_post_norm``, its class default true)."""
    return kind == "hyperclovax" and bool(config.get("use_post_norm", True))


def _llama_like(config: dict[str, Any], kind: str, fields: dict[str, Any], origin: str) -> dict[str, Any]:
    if kind == "stablelm" and config.get("qk_layernorm"):  # StableLmLayerNormPerHead: bias-free, unlike its block's
        raise LmcalcError(f"{origin}: config.json qk_layernorm is true: StableLM's per-head norms are not modelled")
    if config.get("output_vocab_size") not in (None, config.get("vocab_size")):  # Apertus 1.5: a head of its own
        raise LmcalcError(f"{origin}: config.json output_vocab_size differs from vocab_size: not modelled")
    two_matrices = kind in ("starcoder2", *RELU_MLPS, *XIELU_MLPS)  # up and down, no gate
    act = gelu(config, kind, origin) if two_matrices else activation(config, kind)
    config = prepared(config, kind, origin)  # the fields a class derives (LongCat-Flash's layers, JetMoE's heads)
    layers = _get(config, origin, "num_hidden_layers")
    if kind in GEMMA4:  # Gemma4TextConfig: every sixth layer full, and the last whatever config.json says
        config = {**config, "layer_types": gemma4_layer_types(config, layers)}
    if kind in CLASS_LAYER_TYPES and not config.get("layer_types"):
        config = {**config, "layer_types": [CLASS_LAYER_TYPES[kind](i, layers, config) for i in range(layers)]}
    if kind == "modernbert-decoder" and not config.get("sliding_window"):  # its class: half of local_attention
        config = {**config, "sliding_window": (config.get("local_attention") or 128) // 2}
    bias = bool(config.get("attention_bias") or config.get("use_bias") or config.get("use_qkv_bias"))
    attention_bias = ("qkv" if bias or kind.startswith("qwen2") else "none") if kind in QKV_BIAS_ONLY else None
    if kind == "persimmon":  # query_key_value and dense, both with biases (PersimmonAttention)
        attention_bias = "all"
    if kind == "seed_oss":  # q, k and v from attention_bias, o from attention_out_bias (SeedOssAttention)
        out = bool(config.get("attention_out_bias"))
        attention_bias = {(True, True): "all", (True, False): "qkv", (False, True): "out"}.get((bias, out), "none")
    if kind in ("ernie4_5_moe",) and config.get("use_bias"):  # biases on the dense MLPs, not the routed experts
        raise LmcalcError(f"{origin}: config.json use_bias is true: ERNIE 4.5 MoE's biases are not modelled")
    fields |= {
        "hidden_size": _get(config, origin, "hidden_size"),
        "num_layers": layers,
        "num_heads": _get(config, origin, "num_attention_heads"),
        "num_kv_heads": config.get("num_key_value_heads"),
        "head_dim": config.get("head_dim") or _floored_head_dim(config, origin),
        # Llama 4's dense layers; where a config has no dense FFN at all (Qwen3.5-MoE: every layer routes) the
        # experts' width stands in, a width no layer uses
        "ffn_size": _get(config, origin, "intermediate_size_mlp", "intermediate_size", "moe_intermediate_size"),
        "ffn_kind": "gelu_mlp" if two_matrices else ("geglu" if act in GELUS else "swiglu"),
        **({"activation": act} if act in (*GELUS, *RELUS, "xielu") else {}),
        "norm_kind": NORM_KIND.get(kind, "rmsnorm"),
        "norm_weight": kind not in NO_NORM_WEIGHT,
        "qkv_clip": config.get("clip_qkv"),
        "embedding_norm": kind == "nanochat",
        "sub_norms": kind == "bitnet",  # BitNetAttention's attn_sub_norm, BitNetMLP's ffn_sub_norm
        "differential_attention": kind == "diffllama",  # DiffLlamaAttention's two calls, λ and groupnorm
        "attention_bias": attention_bias or ("all" if bias else "none"),
        # gpt-oss's experts carry biases; StarCoder2's and ERNIE's use_bias covers the MLP too
        "mlp_bias": kind in ("gpt_oss", "persimmon") or bool(config.get("mlp_bias") or config.get("use_bias")),
        "position_embedding": "rope",
        "max_seq_len": _get(config, origin, "max_position_embeddings"),
        "rotary_fraction": rotary_fraction(config, PARTIAL_ROTARY.get(kind, 1.0)),
        "qk_norm": QK_NORM.get(kind)
        or (QK_NORM_OPTIONAL.get(kind, "none") if config.get("use_qk_norm") or config.get("qk_layernorm") else "none"),
        "norms_per_layer": 4
        if kind in SANDWICH_NORMS or _post_norms(config, kind)
        else (1 if kind in COHERE or _stablelm_parallel(config, kind) else 2),
        "parallel_block": kind in COHERE or _stablelm_parallel(config, kind),
        "attention_sinks": kind in ("gpt_oss", "granite_swa", "granitemoe_swa", "flint"),
        "sink_scale": kind in ("granite_swa", "granitemoe_swa"),  # their eager_attention_forward: σ(lse − sink)
        # GptOssConfig's and MiniMaxM3VLTextConfig's default 7
        "swiglu_limit": config.get("swiglu_limit", 7.0) if kind in ("gpt_oss", "minimax_m3_vl_text") else None,
        "eager_fp32_scores": kind == "flint",  # Flint's eager attention: fp32 Q and K, its sink softmax in fp32
        **({"eager_softmax": "activation"} if kind == "llama4_text" else {}),  # Llama 4's eager softmax: in bf16
        "head_bias": bool(config.get("lm_head_bias")),  # PhimoeForCausalLM's option
        # Seed-OSS drops attention probabilities and each sub-layer's output (its class default 0.1), not the embedding;
        # Emu3's text model both at attention_dropout (Emu3DecoderLayer.dropout; its class default 0.1)
        **(
            dropout(config, {"attention": "attention_dropout", "residual": RESIDUAL_DROPOUT[kind]})
            if kind in RESIDUAL_DROPOUT
            else {}
        ),
        "attention_softcap": config.get("attn_logit_softcapping"),
        "final_softcap": config.get("final_logit_softcapping"),
        **windows(config, kind, layers, origin),
    }
    if config.get("kv_lora_rank"):
        fields["mla"] = {
            "q_lora_rank": config.get("q_lora_rank"),
            "kv_lora_rank": config["kv_lora_rank"],
            "qk_nope_head_dim": _get(config, origin, "qk_nope_head_dim"),
            "qk_rope_head_dim": _get(config, origin, "qk_rope_head_dim"),
            # MiniCPM3Config: hidden_size // num_attention_heads when not given
            "v_head_dim": _get(config, origin, "v_head_dim", default=fields["hidden_size"] // fields["num_heads"])
            if kind == "minicpm3"
            else _get(config, origin, "v_head_dim"),
        }
        if kind in ("deepseek_v32", "glm_moe_dsa", "axk2", "hy_v4"):  # DeepSeek sparse attention: MLA, an indexer
            fields["mla"]["indexer"] = indexer(config, origin, layers, kind)
        fields["num_kv_heads"] = None
    # Gemma 4's: hf_widths; Doge's num_experts is its CDMoE's (retrieval_experts, below)
    routed = moe(config, kind, layers, origin) if kind not in (*GEMMA4, "doge") else None
    if routed:
        fields["moe"] = longcat_moe(config, routed, fields["ffn_size"]) if kind == "longcat_flash" else routed
    if kind == "longcat_flash":  # each LongcatFlashDecoderLayer: two of lmcalc's layers (hf_layers.prepared)
        fields["sublayers"] = 2
    fields = FINISHED[kind](config, origin, fields) if kind in FINISHED else fields
    if kind == "cohere2_moe":  # its dense layers' own width; an RMSNorm (Llama's) where rms_norm_eps is given
        fields["ffn_size"] = config.get("prefix_dense_intermediate_size") or fields["ffn_size"]
        if config.get("rms_norm_eps") is not None:
            fields |= {"norm_kind": "rmsnorm", "norm_weight_fp32": False}
    if kind == "jamba":  # Mamba layers but every attn_layer_period-th; no position encoding
        hidden = fields["hidden_size"]
        rank = config.get("mamba_dt_rank", "auto")
        fields["position_embedding"] = "none"
        fields["mamba"] = {
            "d_inner": config.get("mamba_expand", 2) * hidden,
            "d_state": config.get("mamba_d_state", 16),
            "d_conv": config.get("mamba_d_conv", 4),
            "dt_rank": -(-hidden // 16) if rank == "auto" else rank,  # JambaConfig: ceil(hidden / 16)
            "conv_bias": config.get("mamba_conv_bias", True),
            "proj_bias": config.get("mamba_proj_bias", False),
            "inner_norms": True,
            "attention_every": config.get("attn_layer_period", 8),
            "attention_offset": config.get("attn_layer_offset", 4),
        }
    if kind in (*DELTANET, "olmo_hybrid", "lara_mini"):
        fields |= deltanet(config, kind, layers, origin)
    if kind in ("kimi_linear", "bailing_hybrid"):  # Kimi Delta Attention beside MLA
        fields |= kimi_delta(config, kind, layers, origin)
        if kind == "bailing_hybrid":  # BailingHybridAttention's g_proj, h → H, its sigmoid in fp32
            fields["attention_head_gate"] = "fp32"
        if kind == "kimi_linear":  # KimiLinearAttention applies no RoPE (its rope-sized latent slice is built still)
            fields["position_embedding"] = "none"
    if kind == "laguna":  # LagunaAttention: a softplus gate a head on the attention's output, from g_proj
        fields |= laguna(config, origin, fields["num_heads"])
    if kind == "modernbert-decoder":
        fields |= modernbert(config, origin)
    if kind == "mimo_v2_flash":
        fields |= local_attention(config, origin, fields)
    if kind == "llama4_text" and fields.get("sliding_window") and _flag(config, "use_qk_norm", True, origin):
        fields["local_qk_l2_norm"] = True  # Llama4TextL2Norm on Q and K in its RoPE (chunked) layers
    if kind == "minimax_m3_vl_text":
        fields |= minimax_m3(config, origin, fields["ffn_size"])
    if kind == "beam":  # BeamAttention: AFMoE's gate, with a bias a head before the sigmoid; its SwiGLU in fp32
        fields |= {"attention_output_gate": True, "attention_gate_proj": True, "attention_gate_bias": True,
                   "mlp_fp32": True, "final_softcap_fp32": True}  # fmt: skip
    if kind == "afmoe":  # AfmoeAttention: a sigmoid gate on the attention's output, from gate_proj
        fields |= {"attention_output_gate": True, "attention_gate_proj": True}
    if kind == "doge":  # DogeAttention's dynamic mask (A, dt_proj) and DogeDecoderLayer's residual scales
        fields |= {"dynamic_mask_window": _get(config, origin, "keep_window_size"), "residual_scales": True}
        if _flag(config, "is_moe", False, origin):  # DogeCDMoE in every layer, its SwiGLU the shared expert
            fields["retrieval_experts"] = {"experts": _get(config, origin, "num_experts"),
                                           "top_k": _get(config, origin, "num_experts_per_tok"),
                                           "normalized": _flag(config, "norm_topk_prob", False, origin)}  # fmt: skip
    if kind == "hy_v4":  # HYV4Attention: DeepSeek-V3.2's, a gate from gate_proj and sinks; iHC's streams
        fields |= {"attention_output_gate": True, "attention_gate_proj": True, "attention_sinks": True,
                   "sinks_fp32": True,  # HYV4PreTrainedModel keeps them in fp32
                   "hyper_connections": {"streams": _get(config, origin, "hc_mult"), "mixing": False}}  # fmt: skip
    if kind in ("bamba", "granitemoehybrid", "falcon_h1"):
        fields |= mamba2(config, kind, fields["hidden_size"], layers, origin)
    if kind == "minimax":  # lightning attention in every linear_attention layer (MiniMax-01)
        fields |= lightning(config, origin, layers, fields["hidden_size"], fields["num_heads"])
    if kind in ("lfm2", "lfm2_moe", "lfm3"):  # LFM2-MoE's dense layers and LFM3's take intermediate_size as it is
        fields |= short_conv(config, origin, adjust_ffn=kind == "lfm2")
    if kind == "lfm3" and config.get("use_attention_gate", True):  # Lfm3Attention: sigmoid(g_proj(x)) a head
        fields["attention_head_gate"] = "activation"
    if kind == "lfm3" and not config.get("use_sandwich_norm", True):
        fields["norms_per_layer"] = 2
    if config.get("num_nextn_predict_layers") and kind in ("deepseek_v3", "glm4_moe", "deepseek_v4"):  # reported apart,
        fields["mtp_modules"] = config["num_nextn_predict_layers"]  # not built by transformers
    elif config.get("num_nextn_predict_layers"):  # Mellum: a layer transformers does not build, of no known shape
        fields["notes"] = [*fields.get("notes", []), "its multi-token-prediction layers are not counted"]
    return fields


def _text_model(config: dict[str, Any], origin: str) -> tuple[dict[str, Any], str]:
    """The language model's config and its type: a multimodal config's ``text_config``, else the config itself."""
    kind = str(config.get("model_type", "")).lower()
    if kind == "dots3_note" and "text_config" not in config:  # Dots3NoteConfig: a text model written at the top
        return config, DOTS3
    if kind not in MULTIMODAL and kind not in DRAFTERS and "text_config" not in config:
        return config, kind
    text = config.get("text_config")
    if text is None and kind in DRAFTERS:  # a drafter's class builds its text model at that class's defaults
        text = {}
    if not isinstance(text, dict):
        raise LmcalcError(f"{origin}: config.json model_type {token(kind)} has no text_config to read")
    # the wrapper's tie_word_embeddings decides for the language model it builds
    text = {
        **text,
        **({"tie_word_embeddings": config["tie_word_embeddings"]} if "tie_word_embeddings" in config else {}),
    }
    return text, str(text.get("model_type") or MULTIMODAL.get(kind) or DRAFTERS.get(kind, "")).lower()


def _as_its_class_reads(text: dict[str, Any], kind: str) -> dict[str, Any]:
    """``text`` as ``kind``'s configuration class reads it: a field spelt by one of the class's aliases under its own
    name (ExaoneConfig's ``num_layers`` is ``num_hidden_layers``), and a field config.json leaves out at the class's
    default (GptOssConfig's ``attention_bias`` is true): ``lmcalc/hf_defaults.py``."""
    aliases = ATTRIBUTE_MAPS.get(kind, {})

    def stored(fields: dict[str, Any]) -> dict[str, Any]:  # under the name the class stores each field by
        return {aliases.get(key, key): value for key, value in fields.items()}

    # the defaults too: KimiLinearConfig's num_local_experts default is its num_experts, which config.json may give
    named = {**stored(CLASS_DEFAULTS.get(kind, {})), **stored(text)}
    for alias, field in aliases.items():  # and under the alias, which the readers may read
        if field in named:
            named[alias] = named[field]
    return named


def model_from_hf_config(config: dict[str, Any], name: str, origin: str) -> dict[str, Any]:
    """ModelSpec fields for a HF config; the caller validates them."""
    read = _read(config, name, origin)
    return read | {"moe": read["moe"] | moe_storage(_text_model(config, origin)[1])} if read.get("moe") else read


def _read(config: dict[str, Any], name: str, origin: str) -> dict[str, Any]:
    text, kind = _text_model(config, origin)
    if BUILDS_AS.get(kind, kind) not in SUPPORTED:
        named = f"config.json model_type {token(kind) if kind else '(missing)'}"
        if kind in DECODER_TYPES:
            raise UnreadType(
                f"{origin}: {named} is a transformers type lmcalc does not read yet (docs/hf-types.md says which it "
                "reads). Where transformers is installed, lmcalc params counts "
                "it on the meta device; or describe the model in a YAML preset (docs/presets.md)",
                config,
                kind,
                origin,
            )
        close = difflib.get_close_matches(kind, [*SUPPORTED, *BUILDS_AS, *MULTIMODAL], n=1)
        raise LmcalcError(
            f"{origin}: {named} is not a decoder-only type transformers 5.24 registers"
            f"{f' (did you mean {close[0]}?)' if close else ''}. lmcalc reads {', '.join(SUPPORTED)}; "
            f"{', '.join(BUILDS_AS)} as the type whose model they build; and {', '.join(MULTIMODAL)}'s text models. "
            "Describe the model in a YAML preset instead (docs/presets.md)"
        )
    check_fields(config, origin)
    multimodal = text is not config  # the text model of a multimodal config
    text = _as_its_class_reads(text, kind)
    check_fields(text, origin)  # the fields an alias spelt
    check_layer_count(text, origin)
    kind = BUILDS_AS.get(kind, kind)  # exaone builds LlamaForCausalLM: read as llama from here on
    drafter = str(config.get("model_type", "")).lower() in DRAFTERS  # its text model between projections of its own
    if kind == BLT:  # its local decoder as a Mistral-like model, beside its encoder, global transformer and patcher
        local, byte_latent = blt_config(text, origin)
        return _llama_like(local, "mistral", _common(local, "mistral", name, origin), origin) | byte_latent
    towers = (multimodal and not drafter) or kind == "phi4_multimodal"  # Phi-4-multimodal's encoders are inside
    fields = _common(text, kind, name, origin) | (vision_fields(config, text) if towers else {})
    if drafter:  # Gemma4AssistantConfig: every layer shares the backbone's K and V unless the file says how many
        text = {**text, "num_kv_shared_layers": text.get("num_kv_shared_layers") or text.get("num_hidden_layers")}
        read = _llama_like(text, kind, fields, origin)
        if read.get("per_layer_input") or read.get("moe") or read["kv_sharing"].get("double_wide_mlp"):
            raise LmcalcError(f"{origin}: a Gemma 4 drafter's text model has no per-layer inputs, MoE block or "
                              "double-wide MLPs (Gemma4AssistantConfig checks it): this one has")  # fmt: skip
        return read | drafter_fields(config, origin)
    if kind in ("gpt2", "gpt_bigcode"):
        return gpt2(text, kind, fields, origin)
    if kind == "openai-gpt":
        return openai_gpt(text, kind, fields, origin)
    if kind == "ctrl":
        return ctrl(text, kind, fields, origin)
    if kind == "git":  # its image encoder and projection apart
        return git(text, kind, fields | vision_fields(config, text), origin)
    if kind == "xglm":
        return xglm(text, kind, fields, origin)
    if kind == "gpt_neox_japanese":
        return gpt_neox_japanese(text, kind, fields, origin)
    if kind in ("gpt_neox", "falcon", "bloom"):
        return neox_family(text, kind, fields, origin)
    if kind in PARALLEL_GELU:
        return parallel_gelu(text, kind, fields, origin)
    if kind in ("opt", "biogpt"):
        return opt_family(text, kind, fields, origin)
    if kind == "gpt_neo":
        return gpt_neo(text, kind, fields, origin)
    if kind in ("mpt", "dbrx"):
        return mpt_family(text, kind, fields, origin)
    if kind in MAMBA_STACKS:
        return mamba_stack(text, kind, fields, origin)
    if kind == "rwkv":
        return rwkv(text, fields, origin)
    if kind == "xlstm":
        return xlstm(text, fields, origin)
    if kind == "cpmant":
        return cpmant(text, fields, origin)
    if kind == "recurrent_gemma":
        return recurrent_gemma(text, fields, origin)
    if kind == "deepseek_v4":
        return deepseek_v4(text, fields, origin)
    if kind == "zamba2":
        return zamba2(text, fields, origin)
    if kind == "zamba":
        return zamba(text, fields, origin)
    if kind in SINGLE_BLOCKS:
        return nemotron_h(text, fields, origin)
    return _llama_like(text, kind, fields, origin)
