"""Reading the GPT family's config.json: GPT-2 and GPTBigCode, GPT-NeoX, Falcon and BLOOM, GPT-J, CodeGen and Phi
(attention and MLP side by side), OPT and BioGPT, GPT-Neo, MPT and DBRX; and which activation each type's MLP calls.
``hf_config`` dispatches here; each reader returns ModelSpec fields, as there."""

from __future__ import annotations

from typing import Any

from lmcalc.errors import LmcalcError, token
from lmcalc.hf_fields import get as _get
from lmcalc.hf_fields import rotary_fraction
from lmcalc.hf_layers import global_layers

RELUS = ("relu", "relu2")  # ACT2FN's ReLU and ReLUSquaredActivation
RELU_MLPS = ("arcee", "nemotron", "persimmon", "jais2", "nanochat", "opt", "biogpt", "nemotron_h")
"""Two-matrix MLPs that call hidden_act, squared ReLU by default."""
XIELU_MLPS = ("apertus", "apertus1p5_text")
"""Two-matrix MLPs that call hidden_act, xIELU by default (Apertus)."""
GELUS = ("gelu", "gelu_pytorch_tanh", "gelu_new", "gelu_fast", "gelu_python")  # bloom_gelu aside
PARALLEL_GELU = ("gptj", "codegen", "phi")
ACTIVATION = {"gpt2": ("activation_function", "gelu_new"), "gpt_neox": ("hidden_act", "gelu"),
              "gptj": ("activation_function", "gelu_new"), "codegen": ("activation_function", "gelu_new"),
              "phi": ("hidden_act", "gelu_new"), "opt": ("activation_function", "relu"),
              "gpt_neo": ("activation_function", "gelu_new"),
              "gpt_bigcode": ("activation_function", "gelu_pytorch_tanh"),
              "falcon": ("activation", "gelu"), "starcoder2": ("hidden_act", "gelu_pytorch_tanh"),
              "gemma": ("hidden_act", "gelu_pytorch_tanh"), "gemma2": ("hidden_activation", "gelu_pytorch_tanh"),
              "gemma3_text": ("hidden_activation", "gelu_pytorch_tanh"),
              "gemma3n_text": ("hidden_activation", "gelu_pytorch_tanh"),
              "recurrent_gemma": ("hidden_activation", "gelu_pytorch_tanh"),
              "gemma4_text": ("hidden_activation", "gelu_pytorch_tanh"),
              "gemma4_unified_text": ("hidden_activation", "gelu_pytorch_tanh"),
              "vaultgemma": ("hidden_activation", "gelu_pytorch_tanh"),
              "modernbert-decoder": ("hidden_activation", "gelu"),
              "nemotron_h": ("mlp_hidden_act", "relu2"), "xglm": ("activation_function", "gelu")}  # fmt: skip
"""The config field each type's MLP calls ACT2FN with, and the config class's default, where not hidden_act and
silu (GPT2MLP: activation_function; FalconMLP: activation; Gemma2MLP and Gemma3MLP: hidden_activation)."""


OPENAI_ACT = {"gelu": "gelu_new", "relu": "relu"}
"""modeling_openai.py's ACT_FNS by ``afn``: its gelu is gelu_new, written op by op (silu and swish are refused)."""


def activation(config: dict[str, Any], kind: str) -> str:
    """The activation the type's MLP calls (``ACTIVATION``), as ACT2FN names it."""
    key, default = ACTIVATION.get(kind, ("hidden_act", "silu"))
    act = str(config.get(key) or default).lower()
    # GemmaConfig.__post_init__: the legacy "gelu" of the released configs means the tanh approximation
    return "gelu_pytorch_tanh" if kind == "gemma" and act == "gelu" else act


def gelu(config: dict[str, Any], kind: str, origin: str) -> str:
    """The activation of a type whose MLP is two matrices (up, down): a GELU, or where the type's code allows it ReLU
    or squared ReLU (``RELUS``), refused when it is another."""
    act = activation(config, kind)
    known = GELUS + (RELUS if kind in RELU_MLPS else ()) + (("xielu",) if kind in XIELU_MLPS else ())
    if act not in known:
        key = ACTIVATION.get(kind, ("hidden_act",))[0]
        raise LmcalcError(
            f"{origin}: config.json {key} {token(act)} is not an activation lmcalc knows for {kind}'s MLP "
            f"({', '.join(known)})"
        )
    return act


def dropout(config: dict[str, Any], sites: dict[str, str], default: float = 0.0) -> dict[str, Any]:
    """``dropout`` and ``dropout_at`` from each site's probability, ``sites`` naming the config field of each (the
    embedding's output, the attention probabilities, each sub-layer's output): the sites whose probability is
    above 0."""
    at = tuple(site for site, key in sites.items() if (config.get(key, default) or 0) > 0)
    return {"dropout": bool(at), **({"dropout_at": at} if at else {})}


def gpt2(config: dict[str, Any], kind: str, fields: dict[str, Any], origin: str) -> dict[str, Any]:
    """GPT-2, and GPTBigCode (StarCoder 1, SantaCoder): GPT-2's layout with multi-query attention by default."""
    hidden, heads = _get(config, origin, "n_embd"), _get(config, origin, "n_head")
    return fields | {
        "hidden_size": hidden,
        "num_layers": _get(config, origin, "n_layer"),
        "num_heads": heads,
        # GPTBigCodeAttention: one key-value head when multi_query (its class default)
        "num_kv_heads": 1 if kind == "gpt_bigcode" and config.get("multi_query", True) else heads,
        "ffn_size": _get(config, origin, "n_inner", default=4 * hidden),
        "ffn_kind": "gelu_mlp",
        "activation": gelu(config, kind, origin),
        "norm_kind": "layernorm",
        "attention_bias": "all",
        "mlp_bias": True,
        "position_embedding": "learned",
        "max_seq_len": _get(config, origin, "n_positions", "n_ctx"),
        # GPT2Attention's eager_attention_forward: softmax in the scores' dtype
        "eager_softmax": "activation" if kind == "gpt2" else "fp32",
        # GPT2Config's and GPTBigCodeConfig's dropout probabilities default to 0.1
        **dropout(config, {"embedding": "embd_pdrop", "attention": "attn_pdrop", "residual": "resid_pdrop"}, 0.1),
    }


def openai_gpt(config: dict[str, Any], kind: str, fields: dict[str, Any], origin: str) -> dict[str, Any]:
    """GPT-1 (Radford et al. 2018): GPT-2's tensors with each LayerNorm after its residual add (Block: ln_1(x + a),
    ln_2(n + m)) and none before the tied head; an MLP of 4·h whose ``afn`` is modeling_openai.py's ACT_FNS."""
    hidden, afn = _get(config, origin, "n_embd"), str(config.get("afn") or "gelu")
    if afn not in OPENAI_ACT:
        raise LmcalcError(f"{origin}: config.json afn {token(afn)} is not an activation lmcalc knows for "
                          f"openai-gpt's MLP ({', '.join(OPENAI_ACT)})")  # fmt: skip
    return fields | {
        "hidden_size": hidden,
        "num_layers": _get(config, origin, "n_layer"),
        "num_heads": _get(config, origin, "n_head"),
        "ffn_size": 4 * hidden,
        "ffn_kind": "gelu_mlp",
        "activation": OPENAI_ACT[afn],
        "norm_kind": "layernorm",
        "post_norm": True,
        "attention_bias": "all",
        "mlp_bias": True,
        "position_embedding": "learned",
        "max_seq_len": _get(config, origin, "n_positions"),
        "eager_softmax": "activation",  # Attention._attn: softmax in the scores' dtype
        **dropout(config, {"embedding": "embd_pdrop", "attention": "attn_pdrop", "residual": "resid_pdrop"}, 0.1),
    }


def git(config: dict[str, Any], kind: str, fields: dict[str, Any], origin: str) -> dict[str, Any]:
    """GIT's text decoder (Wang et al. 2022; GitForCausalLM): BERT's layer, each LayerNorm after its residual add
    (GitSelfOutput, GitOutput), biases everywhere, learned positions summed with the tokens and normed
    (GitEmbeddings), and a head with a bias (``output``), tied where tie_word_embeddings says. Its CLIP image encoder
    and projection are counted apart (``hf_vision``); a step runs the encoder on each image and the decoder on the
    image's tokens before the text's (``image_prefix``)."""
    hidden, vision = _get(config, origin, "hidden_size"), config.get("vision_config") or {}
    return fields | {
        "hidden_size": hidden,
        "num_layers": _get(config, origin, "num_hidden_layers"),
        "num_heads": _get(config, origin, "num_attention_heads"),
        "ffn_size": _get(config, origin, "intermediate_size"),
        "ffn_kind": "gelu_mlp",
        "activation": gelu(config, kind, origin),
        "norm_kind": "layernorm",
        "post_norm": True,
        "embedding_norm": True,
        "attention_bias": "all",
        "mlp_bias": True,
        "head_bias": True,
        "position_embedding": "learned",
        "max_seq_len": _get(config, origin, "max_position_embeddings"),
        "eager_softmax": "activation",  # GitSelfAttention: softmax in the scores' dtype
        **dropout(
            config,
            {
                "embedding": "hidden_dropout_prob",
                "attention": "attention_probs_dropout_prob",
                "residual": "hidden_dropout_prob",
            },
            0.1,
        ),  # fmt: skip
        "image_prefix": {  # GitVisionConfig's defaults: ViT-B/16 at 224 pixels
            "width": vision.get("hidden_size", 768),
            "ffn_size": vision.get("intermediate_size", 3072),
            "layers": vision.get("num_hidden_layers", 12),
            "heads": vision.get("num_attention_heads", 12),
            "image": vision.get("image_size", 224),
            "patch": vision.get("patch_size", 16),
            "channels": vision.get("num_channels", 3),
            "images": config.get("num_image_with_embedding") or 1,
        },
    }


def ctrl(config: dict[str, Any], kind: str, fields: dict[str, Any], origin: str) -> dict[str, Any]:
    """CTRL (Keskar et al. 2019): a pre-norm block with biases on Wq, Wk, Wv and dense, a ReLU MLP of ``dff``,
    sinusoidal positions added to the scaled embedding (no parameters), a final LayerNorm and a head tied to the
    embedding with a bias of its own (CTRLLMHeadModel). Dropout on the embedding and each sub-layer's output
    (MultiHeadAttention passes the probabilities none)."""
    return fields | {
        "hidden_size": _get(config, origin, "n_embd"),
        "num_layers": _get(config, origin, "n_layer"),
        "num_heads": _get(config, origin, "n_head"),
        "ffn_size": _get(config, origin, "dff"),
        "ffn_kind": "gelu_mlp",
        "activation": "relu",
        "norm_kind": "layernorm",
        "attention_bias": "all",
        "mlp_bias": True,
        "head_bias": True,
        "position_embedding": "sinusoidal",
        "max_seq_len": _get(config, origin, "n_positions"),
        "eager_softmax": "activation",  # BERT's eager_attention_forward: softmax in the scores' dtype
        **dropout(config, {"embedding": "embd_pdrop", "residual": "resid_pdrop"}, 0.1),
    }


def gpt_neox_japanese(config: dict[str, Any], kind: str, fields: dict[str, Any], origin: str) -> dict[str, Any]:
    """GPT-NeoX-Japanese: GPT-NeoX's fused query_key_value in a sequential pre-norm block, no biases but the last
    layer's on its attention output (GPTNeoXJapaneseAttention's dense_bias), an MLP of ``intermediate_multiple_size``
    times h, its own eager attention, dropout on the probabilities (``attention_dropout``) and on each sub-layer's
    output (``hidden_dropout``)."""
    hidden = _get(config, origin, "hidden_size")
    return fields | {
        "hidden_size": hidden,
        "num_layers": _get(config, origin, "num_hidden_layers"),
        "num_heads": _get(config, origin, "num_attention_heads"),
        "ffn_size": int(hidden * _get(config, origin, "intermediate_multiple_size")),
        "ffn_kind": "gelu_mlp",
        "activation": gelu(config, kind, origin),
        "norm_kind": "layernorm",
        "attention_bias": "none",
        "last_layer_out_bias": True,
        "position_embedding": "rope",
        "rotary_fraction": rotary_fraction(config, 1.0),  # GPTNeoXJapaneseConfig's default
        "max_seq_len": _get(config, origin, "max_position_embeddings"),
        "eager_softmax": "activation",  # GPTNeoXJapaneseAttention._attn: softmax in the scores' dtype
        **dropout(config, {"attention": "attention_dropout", "residual": "hidden_dropout"}),
    }


def xglm(config: dict[str, Any], kind: str, fields: dict[str, Any], origin: str) -> dict[str, Any]:
    """XGLM (Lin et al. 2021): fairseq's pre-norm block (q, k, v and out projections, fc1 and fc2, all with biases),
    sinusoidal positions offset by two rows added to the scaled embedding (no parameters), a final LayerNorm, a
    head tied to the embedding. Dropout (``dropout``) on the embedding and each sub-layer's output, and on the
    probabilities (``attention_dropout``); its attention is its own eager code (XGLMAttention)."""
    for key in ("activation_dropout", "layerdrop"):
        if (config.get(key) or 0) > 0:
            raise LmcalcError(f"{origin}: config.json {key} is above 0: not modelled for XGLM")
    if config.get("add_cross_attention"):
        raise LmcalcError(f"{origin}: config.json add_cross_attention is true: XGLM's cross-attention is not modelled")
    return fields | {
        "hidden_size": _get(config, origin, "d_model"),
        "num_layers": _get(config, origin, "num_layers"),
        "num_heads": _get(config, origin, "attention_heads"),
        "ffn_size": _get(config, origin, "ffn_dim"),
        "ffn_kind": "gelu_mlp",
        "activation": gelu(config, kind, origin),
        "norm_kind": "layernorm",
        "attention_bias": "all",
        "mlp_bias": True,
        "position_embedding": "sinusoidal",
        "max_seq_len": _get(config, origin, "max_position_embeddings"),
        "eager_softmax": "activation",  # XGLMAttention upcasts only fp16 scores
        "eager_score_clamp": True,
        **dropout(config, {"embedding": "dropout", "attention": "attention_dropout", "residual": "dropout"}, 0.1),
    }


def neox_family(config: dict[str, Any], kind: str, fields: dict[str, Any], origin: str) -> dict[str, Any]:
    """GPT-NeoX, Falcon and BLOOM: LayerNorm with biases, one fused query_key_value, a GELU MLP."""
    hidden = _get(config, origin, "hidden_size", "n_embed")
    heads = _get(config, origin, "num_attention_heads", "n_head")
    fields |= {
        "hidden_size": hidden,
        "num_layers": _get(config, origin, "num_hidden_layers", "n_layer"),
        "num_heads": heads,
        "ffn_kind": "gelu_mlp",
        # BLOOM's MLP calls its own GeLUFunction (modeling_bloom.py BloomGelu), whatever the config says
        "activation": "bloom_gelu" if kind == "bloom" else gelu(config, kind, origin),
        "norm_kind": "layernorm",
    }
    if kind == "gpt_neox":  # parallel residual by default, each branch with its own norm
        return fields | {
            "ffn_size": _get(config, origin, "intermediate_size"),
            "attention_bias": "all" if config.get("attention_bias", True) else "none",
            "mlp_bias": True,
            "parallel_block": bool(config.get("use_parallel_residual", True)),
            "position_embedding": "rope",
            "rotary_fraction": rotary_fraction(config, 0.25),  # GPTNeoXConfig's default, Pythia's rotary_pct
            "max_seq_len": _get(config, origin, "max_position_embeddings"),
        }
    if kind == "bloom":  # ALiBi (no position weights), a LayerNorm after the embedding
        return fields | {
            "ffn_size": 4 * hidden,
            "attention_bias": "all",
            "mlp_bias": True,
            "embedding_norm": True,
            "position_embedding": "none",
            "max_seq_len": config.get("seq_length") or 2048,  # BLOOM trained on 2,048-token sequences
        }
    new = bool(config.get("new_decoder_architecture"))  # falcon: 40B/180B's layout, or 7B's
    parallel = new or bool(config.get("parallel_attn", True))
    norms = (config.get("num_ln_in_parallel_attn") or 2) if new else (1 if parallel else 2)
    kv = config.get("num_kv_heads") if new else (1 if config.get("multi_query", True) else heads)
    bias = "all" if config.get("bias") else "none"
    return fields | {
        "num_kv_heads": kv or heads,
        "ffn_size": config.get("ffn_hidden_size") or 4 * hidden,
        "attention_bias": bias,
        "mlp_bias": bias == "all",
        "parallel_block": parallel,
        "norms_per_layer": norms,
        "position_embedding": "none" if config.get("alibi") else "rope",
        "max_seq_len": config.get("max_position_embeddings") or 2048,
        # FalconAttention calls SDPA itself: the 7B layout's one K/V head as it is, the 40B's broadcast to every head
        "sdpa_broadcast_kv": not new and (kv or heads) < heads,
    }


def parallel_gelu(config: dict[str, Any], kind: str, fields: dict[str, Any], origin: str) -> dict[str, Any]:
    """GPT-J, CodeGen and Phi-1/2: attention and a GELU MLP side by side from one LayerNorm, biases on the MLP and on
    the output head (GPTJForCausalLM, CodeGenForCausalLM, PhiForCausalLM), RoPE on part of each head (not a FLOP lmcalc
    counts). GPT-J's and CodeGen's attention has no biases (CodeGen's q, k and v are one qkv_proj); Phi's has them
    all, and with ``qk_layernorm`` a LayerNorm over each head's queries and keys."""
    hidden = _get(config, origin, "n_embd", "hidden_size")
    phi = kind == "phi"
    heads = _get(config, origin, "n_head", "num_attention_heads")
    # RoPE on part of each head: Phi's partial_rotary_factor (PhiConfig's 0.5). GPT-J's and CodeGen's rotary_dim (64)
    # rotates Q and K laid out (b, s, H, d), before the heads' transpose, so the attention's output needs no copy and
    # they keep what a whole-head RoPE keeps: counted as one (measured: tests/test_framework_transformers.py)
    fraction = rotary_fraction(config, 0.5) if phi else 1.0
    return fields | {
        "hidden_size": hidden,
        "num_layers": _get(config, origin, "n_layer", "num_hidden_layers"),
        "num_heads": heads,
        "num_kv_heads": config.get("num_key_value_heads") if phi else None,
        "ffn_size": _get(config, origin, "intermediate_size" if phi else "n_inner", default=4 * hidden),
        "ffn_kind": "gelu_mlp",
        "activation": gelu(config, kind, origin),
        "norm_kind": "layernorm",
        "norms_per_layer": 1,
        "parallel_block": True,
        "attention_bias": "all" if phi else "none",
        "mlp_bias": True,
        "head_bias": True,
        "qk_norm": "per_head" if phi and config.get("qk_layernorm") else "none",
        "eager_fp32_scores": not phi,  # GPT-J's and CodeGen's eager attention: Q and K upcast, the softmax in fp32
        "position_embedding": "rope",
        "rotary_fraction": fraction,
        "max_seq_len": _get(config, origin, "n_positions", "max_position_embeddings"),
        **dropout(
            config,
            {
                "embedding": "embd_pdrop",
                "attention": "attention_dropout" if phi else "attn_pdrop",
                "residual": "resid_pdrop",
            },
        ),  # fmt: skip
    }


def opt_family(config: dict[str, Any], kind: str, fields: dict[str, Any], origin: str) -> dict[str, Any]:
    """OPT and BioGPT: GPT-2's block written fairseq's way (q, k, v and out projections, fc1 and fc2, all with biases
    unless OPT's ``enable_bias`` is false), learned positions offset by two rows (OPTLearnedPositionalEmbedding,
    BioGptLearnedPositionalEmbedding), the embedding tied to the head. OPT drops each sub-layer's output
    (``dropout``) and its attention probabilities (``attention_dropout``), not the embedding; BioGPT the embedding
    and each sub-layer's output (``hidden_dropout_prob``) and the probabilities."""
    opt = kind == "opt"
    hidden = _get(config, origin, "hidden_size")
    if opt and (config.get("word_embed_proj_dim") or hidden) != hidden:  # OPT-350m: project_in and project_out
        raise LmcalcError(f"{origin}: config.json word_embed_proj_dim differs from hidden_size: OPT's projections "
                          "of the embedding (OPT-350m) are not modelled")  # fmt: skip
    if opt and not (config.get("do_layer_norm_before", True) and not config.get("_remove_final_layer_norm")):
        raise LmcalcError(f"{origin}: config.json do_layer_norm_before is false: OPT's post-norm layers (OPT-350m) "
                          "are not modelled")  # fmt: skip
    if opt and not config.get("layer_norm_elementwise_affine", True):
        raise LmcalcError(f"{origin}: config.json layer_norm_elementwise_affine is false: not modelled for OPT")
    if not opt and (config.get("activation_dropout") or 0) > 0:
        raise LmcalcError(f"{origin}: config.json activation_dropout is above 0: BioGPT's dropout after its "
                          "activation is not modelled")  # fmt: skip
    bias = bool(config.get("enable_bias", True)) if opt else True
    sites = (
        {"attention": "attention_dropout", "residual": "dropout"}
        if opt
        else {"embedding": "hidden_dropout_prob", "attention": "attention_probs_dropout_prob",
              "residual": "hidden_dropout_prob"}
    )  # fmt: skip
    return fields | {
        "hidden_size": hidden,
        "num_layers": _get(config, origin, "num_hidden_layers"),
        "num_heads": _get(config, origin, "num_attention_heads"),
        "ffn_size": _get(config, origin, "ffn_dim" if opt else "intermediate_size"),
        "ffn_kind": "gelu_mlp",
        "activation": gelu(config, kind, origin),
        "norm_kind": "layernorm",
        "attention_bias": "all" if bias else "none",
        "mlp_bias": bias,
        "position_embedding": "learned",
        "max_seq_len": _get(config, origin, "max_position_embeddings"),
        "position_offset": 2,
        "eager_softmax": "fp32" if opt else "activation",  # BioGPT's eager_attention_forward does not upcast
        **dropout(config, sites),
    }


def gpt_neo(config: dict[str, Any], kind: str, fields: dict[str, Any], origin: str) -> dict[str, Any]:
    """GPT-Neo: GPT-2's block with q, k and v without biases (the output projection keeps its own), and layers that
    attend globally or within ``window_size`` tokens as ``attention_layers`` says (GPTNeoConfig expands it from
    ``attention_types``: global, local, global, … from the first layer)."""
    layers = _get(config, origin, "num_layers")
    kinds = config.get("attention_layers") or [
        kind_ for pattern, repeat in config.get("attention_types") or [] for _ in range(repeat) for kind_ in pattern
    ]
    if len(kinds) != layers or not set(kinds) <= {"global", "local"}:
        raise LmcalcError(f"{origin}: config.json attention_layers must name global or local for each of the "
                          f"{layers} layers")  # fmt: skip
    hidden = _get(config, origin, "hidden_size")
    local = {}
    if "local" in kinds:
        local = {"sliding_window": _get(config, origin, "window_size"), "local_attention": "sliding",
                 "window_buffer": True, **global_layers([k == "global" for k in kinds], origin)}  # fmt: skip
    return fields | {
        "hidden_size": hidden,
        "num_layers": layers,
        "num_heads": _get(config, origin, "num_heads"),
        "ffn_size": config.get("intermediate_size") or 4 * hidden,
        "ffn_kind": "gelu_mlp",
        "activation": gelu(config, kind, origin),
        "norm_kind": "layernorm",
        "attention_bias": "out",
        "mlp_bias": True,
        "position_embedding": "learned",
        "max_seq_len": _get(config, origin, "max_position_embeddings"),
        "eager_fp32_scores": True,  # GPTNeoSelfAttention._attn: Q and K upcast, the softmax in fp32, then cast
        **local,
        **dropout(
            config, {"embedding": "embed_dropout", "attention": "attention_dropout", "residual": "resid_dropout"}
        ),
    }


def _nested(config: dict[str, Any], key: str, origin: str) -> dict[str, Any]:
    """MPT's ``attn_config``, DBRX's ``attn_config`` and ``ffn_config``: an object of fields, or empty when absent."""
    value = config.get(key) or {}
    if not isinstance(value, dict):
        raise LmcalcError(f"{origin}: config.json {key} must be an object of fields, not {token(value)}")
    return value


def mpt_family(config: dict[str, Any], kind: str, fields: dict[str, Any], origin: str) -> dict[str, Any]:
    """MPT and DBRX (Databricks): one fused Wqkv, no biases, LayerNorms without a bias (torch's kernel), Q, K and V
    clamped to ±``clip_qkv`` where set. MPT attends with ALiBi (MptModel builds it whatever ``alibi`` says), its MLP
    a GELU of 4·h (MptMLP ignores ``expansion_ratio``), dropping with ``attn_pdrop`` the attention probabilities and
    each sub-layer's output; DBRX with RoPE and key-value heads of its own, every layer routing to SwiGLU experts
    (``ffn_config``), dropping the probabilities (``attn_pdrop``) and each sub-layer's output (``resid_pdrop``)."""
    attn = _nested(config, "attn_config", origin)
    hidden, heads = _get(config, origin, "d_model"), _get(config, origin, "n_heads")
    common = {
        "hidden_size": hidden,
        "num_layers": _get(config, origin, "n_layers"),
        "num_heads": heads,
        "norm_kind": "layernorm_nobias",
        "attention_bias": "none",
        "mlp_bias": False,
        "max_seq_len": _get(config, origin, "max_seq_len"),
        "qkv_clip": attn.get("clip_qkv"),
    }
    if kind == "mpt":
        if attn.get("qk_ln"):
            raise LmcalcError(f"{origin}: config.json attn_config.qk_ln is true: MPT's QK LayerNorm is not modelled")
        p = {"attention": attn.get("attn_pdrop") or 0}
        return (
            fields
            | common
            | {
                "ffn_size": 4 * hidden,
                "ffn_kind": "gelu_mlp",
                "activation": "gelu",  # MptMLP: nn.GELU(approximate="none")
                "position_embedding": "none",
                **dropout(p | {"residual": p["attention"]}, {"attention": "attention", "residual": "residual"}),
            }
        )
    ffn = _nested(config, "ffn_config", origin)
    act = str((ffn.get("ffn_act_fn") or {}).get("name", "silu"))
    if act != "silu":
        raise LmcalcError(f"{origin}: config.json ffn_config.ffn_act_fn {token(act)} is not modelled for DBRX (silu)")
    experts, width = _get(ffn, origin, "moe_num_experts"), _get(ffn, origin, "ffn_hidden_size")
    return (
        fields
        | common
        | {
            "num_kv_heads": _get(attn, origin, "kv_n_heads"),
            "ffn_size": width,
            "ffn_kind": "swiglu",
            "position_embedding": "rope",
            "moe": {
                "num_experts": experts,
                "experts_per_token": _get(ffn, origin, "moe_top_k"),
                "expert_ffn_size": width,
                "expert_loop": True,  # DbrxExperts: one expert at a time, each added back with index_add
            },
            **dropout(
                {"attention": attn.get("attn_pdrop"), "residual": config.get("resid_pdrop")},
                {"attention": "attention", "residual": "residual"},
            ),  # fmt: skip
        }
    )
