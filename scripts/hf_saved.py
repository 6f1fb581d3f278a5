"""What Hugging Face transformers really keeps for backward: a measurement harness for lmcalc's activation model.

A harness for the docs and the tests, not a command: it lives beside the scripts, outside the package, and it
imports torch and transformers (the package never does).

For a named config (``CASES``: llama, qwen2, mistral, mixtral and gpt2, each "small" and at the real model's width
cut to two layers; and small two-layer Gemma 2, Gemma 3, GPT-NeoX, Falcon in both layouts, Cohere, Qwen2-MoE, gpt-oss,
Phi-3 and StarCoder2, h 128, each with its own quirks on), :func:`measure` builds the model with random weights in
train mode, runs the forward and the loss the way ``Trainer`` does (``model(input_ids=..., labels=...).loss``) and
counts the bytes of the distinct storages autograd keeps for backward, two ways:

* hooks: under ``torch.autograd.graph.saved_tensors_hooks`` every tensor autograd packs is recorded; the total is
  the sum of the distinct storages (keyed by ``untyped_storage().data_ptr()``) that are still alive once the forward
  has returned, parameters and module buffers excluded. This is the figure of record (``Measurement.total_bytes``).
* walk: the autograd graph is walked from ``loss.grad_fn`` through ``next_functions`` and each node's ``_saved_*``
  tensors (``saved_tensors`` for Python functions) are read, which names the node that keeps each tensor
  (``Measurement.tensors``). The walk cannot see what the non-reentrant checkpoint keeps for its layers (their
  inputs live in the checkpoint frame, not in a node), nor read the nodes inside a checkpointed layer without
  replaying it; those come from the hooks and are named after the module and torch function that saved them.

With checkpointing (``model.gradient_checkpointing_enable()`` with transformers' default kwargs, which in 5.x are
``{"use_reentrant": False}``), the forward keeps each layer's input plus whatever lies outside the layers, and the
checkpointed layers' keyword arguments (rotary cos/sin, masks, position ids) are held by the checkpoint's closure
rather than by autograd: they are listed apart (``Measurement.closure``). ``Measurement.rebuild`` is what one decoder
layer keeps when it is replayed: each layer's forward run standalone, under the hooks, on a fresh leaf copy of its
input with the very keyword arguments the model passed it, and the layer that adds the most kept (layers differ
where some are MoE, or attend over a sliding window). What is alive for backward at the peak is
forward-kept + closures + the rebuilt layer's new tensors (tests/test_framework_transformers.py compares it with
lmcalc's total, and the rebuilt layer with lmcalc's rebuilt one).

``python scripts/hf_saved.py [--case NAME ...] [--quick]`` prints the tables.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import inspect
import math
import sys
import time
import warnings
import weakref
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import transformers
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import (
    AutoModelForCausalLM,
    CohereConfig,
    FalconConfig,
    Gemma2Config,
    Gemma3TextConfig,
    GPT2Config,
    GPTNeoXConfig,
    GptOssConfig,
    LlamaConfig,
    MistralConfig,
    MixtralConfig,
    Phi3Config,
    PretrainedConfig,
    Qwen2Config,
    Qwen2MoeConfig,
    Starcoder2Config,
)
from transformers.initialization import no_init_weights

transformers.logging.set_verbosity_error()

# --------------------------------------------------------------------------------------------------------------------
# The cases
# --------------------------------------------------------------------------------------------------------------------

LAYERS = 2  # every case is cut to two decoder layers


@dataclass(frozen=True)
class Case:
    name: str
    config_class: type[PretrainedConfig]
    kwargs: dict[str, Any]  # the config class's kwargs, exactly as passed
    source: str  # what the widths are copied from
    dropout_knobs: tuple[str, ...] = ()  # config fields set from measure(..., dropout=) (gpt2 only)
    attentions: tuple[str, ...] = ("sdpa", "eager")  # the attn_implementations transformers runs the model with
    checkpointable: bool = True  # whether transformers runs it with gradient checkpointing (OpenAI GPT: not)
    routing: Callable[[torch.nn.Module], None] | None = None  # sets where the router sends tokens (LongCat-Flash)
    images: bool = False  # the model reads an image a sequence beside the text (GIT's pixel_values)

    def config(self, dropout: float | None = None) -> PretrainedConfig:
        kwargs = dict(self.kwargs)
        if dropout is not None:
            for knob in self.dropout_knobs:
                kwargs[knob] = dropout
        return self.config_class(**kwargs)


_LLAMA_ROPE = {  # Llama-3.1's llama3 RoPE scaling (irrelevant to memory, kept for fidelity)
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
_GPT2_DROPOUT = ("resid_pdrop", "embd_pdrop", "attn_pdrop")

MIXTRAL_REAL = dict(
    vocab_size=32000,
    hidden_size=4096,
    intermediate_size=14336,
    num_attention_heads=32,
    num_key_value_heads=8,
    num_hidden_layers=LAYERS,
    num_local_experts=8,
    num_experts_per_tok=2,
    max_position_embeddings=32768,
    sliding_window=None,
    rms_norm_eps=1e-5,
    rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
    attention_dropout=0.0,
    router_jitter_noise=0.0,
    tie_word_embeddings=False,
)
"""mistralai/Mixtral-8x7B-v0.1's widths, cut to LAYERS layers."""

SMALL = dict(
    vocab_size=2048,
    hidden_size=256,
    num_attention_heads=4,
    num_key_value_heads=2,
    num_hidden_layers=LAYERS,
    max_position_embeddings=2048,
    attention_dropout=0.0,
    tie_word_embeddings=False,
)
"""What the small Llama-family cases share: GQA with 4 heads and 2 KV heads, h 256, V 2048, LAYERS layers."""

WINDOW = 64  # the sliding window of the Gemma and gpt-oss cases: shorter than every measured sequence
EAGER_ONLY = ("eager",)  # Gemma 2 and gpt-oss: their PreTrainedModel sets _supports_sdpa = False (soft-capping, sinks)
SDPA_ONLY = ("sdpa",)  # Falcon: FalconPreTrainedModel._check_and_enable_sdpa sets sdpa whatever is asked
NARROW_MHA = {key: value for key, value in SMALL.items() if key != "num_key_value_heads"} | {"hidden_size": 128}
"""What the narrow cases share: SMALL's vocabulary, layers and untied head at h 128, 4 heads of 32, no GQA."""
NARROW = {**NARROW_MHA, "num_key_value_heads": 2, "head_dim": 32}
"""The narrow cases with grouped-query attention: 2 KV heads."""

WIDE = {**SMALL, "vocab_size": 256, "hidden_size": 512, "num_attention_heads": 8}
"""What the wide cases share: SMALL's layers and GQA at h 512 (8 heads, 2 KV heads), V 256."""

CASES: dict[str, Case] = {
    # ---- Llama ----
    "llama-small": Case(
        "llama-small",
        LlamaConfig,
        {**SMALL, "intermediate_size": 896, "rms_norm_eps": 1e-5},
        "small Llama, GQA 4 heads / 2 kv heads",
    ),
    "llama-real": Case(
        "llama-real",
        LlamaConfig,
        dict(
            vocab_size=128256,
            hidden_size=4096,
            intermediate_size=14336,
            num_attention_heads=32,
            num_key_value_heads=8,
            num_hidden_layers=LAYERS,
            max_position_embeddings=131072,
            rms_norm_eps=1e-5,
            rope_parameters=_LLAMA_ROPE,
            attention_dropout=0.0,
            tie_word_embeddings=False,
        ),
        "meta-llama/Llama-3.1-8B widths, 2 layers",
    ),
    # ---- Qwen2 ----
    "qwen2-small": Case(
        "qwen2-small",
        Qwen2Config,
        {**SMALL, "intermediate_size": 1024, "rms_norm_eps": 1e-6, "use_sliding_window": False},
        "small Qwen2 (q/k/v bias), GQA 4 heads / 2 kv heads",
    ),
    "qwen2-real": Case(
        "qwen2-real",
        Qwen2Config,
        dict(
            vocab_size=152064,
            hidden_size=3584,
            intermediate_size=18944,
            num_attention_heads=28,
            num_key_value_heads=4,
            num_hidden_layers=LAYERS,
            max_position_embeddings=32768,
            rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            attention_dropout=0.0,
            use_sliding_window=False,
            tie_word_embeddings=False,
        ),
        "Qwen/Qwen2.5-7B widths, 2 layers",
    ),
    # ---- Mistral ----
    "mistral-small": Case(
        "mistral-small",
        MistralConfig,
        {**SMALL, "intermediate_size": 896, "sliding_window": 4096, "rms_norm_eps": 1e-5},
        "small Mistral, GQA 4 heads / 2 kv heads, sliding window 4096 (> any measured sequence)",
    ),
    "mistral-real": Case(
        "mistral-real",
        MistralConfig,
        dict(
            vocab_size=32000,
            hidden_size=4096,
            intermediate_size=14336,
            num_attention_heads=32,
            num_key_value_heads=8,
            num_hidden_layers=LAYERS,
            max_position_embeddings=32768,
            sliding_window=4096,
            rms_norm_eps=1e-5,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            attention_dropout=0.0,
            tie_word_embeddings=False,
        ),
        "mistralai/Mistral-7B-v0.1 widths, 2 layers",
    ),
    # ---- Mixtral ----
    "mixtral-small": Case(
        "mixtral-small",
        MixtralConfig,
        {
            **SMALL,
            "intermediate_size": 512,
            "num_local_experts": 8,
            "num_experts_per_tok": 2,
            "sliding_window": None,
            "rms_norm_eps": 1e-5,
            "router_jitter_noise": 0.0,
        },
        "small Mixtral, 8 experts top-2, GQA 4 heads / 2 kv heads",
    ),
    "mixtral-real": Case(
        "mixtral-real",
        MixtralConfig,
        MIXTRAL_REAL,
        "mistralai/Mixtral-8x7B-v0.1 widths, 2 layers",
    ),
    "mixtral-real-4e": Case(
        "mixtral-real-4e",
        MixtralConfig,
        {**MIXTRAL_REAL, "num_local_experts": 4},
        "mistralai/Mixtral-8x7B-v0.1 widths with 4 experts (top-2), 2 layers: half the weights to build",
    ),
    # ---- GPT-2: keeps its default dropout 0.1 (resid/embd/attn) unless measure(..., dropout=) says otherwise ----
    "gpt2-small": Case(
        "gpt2-small",
        GPT2Config,
        dict(vocab_size=2048, n_embd=256, n_head=4, n_layer=LAYERS, n_positions=1024),
        "small GPT-2 (tied embeddings, dropout 0.1 by default)",
        _GPT2_DROPOUT,
    ),
    "gpt2-real": Case(
        "gpt2-real",
        GPT2Config,
        dict(vocab_size=50257, n_embd=768, n_head=12, n_layer=LAYERS, n_positions=1024),
        "openai-community/gpt2 (GPT-2 small) widths, 2 layers, dropout 0.1 by default",
        _GPT2_DROPOUT,
    ),
    # ---- the other architectures lmcalc reads: small (h 128), two layers, their own quirks switched on ----
    "gemma2-small": Case(
        "gemma2-small",
        Gemma2Config,
        {**NARROW, "intermediate_size": 384, "query_pre_attn_scalar": 32, "sliding_window": WINDOW},
        f"small Gemma 2: sandwich norms, GeGLU, soft-capped logits (eager only), layer 0 sliding over {WINDOW}",
        attentions=EAGER_ONLY,
    ),
    "gemma3-small": Case(
        "gemma3-small",
        Gemma3TextConfig,
        {
            **NARROW,
            "intermediate_size": 384,
            "query_pre_attn_scalar": 32,
            "sliding_window": WINDOW,
            "layer_types": ["sliding_attention", "full_attention"],
        },
        f"small Gemma 3: sandwich norms, per-head QK-norm, GeGLU, layer 0 sliding over {WINDOW}, layer 1 global",
    ),
    "gpt-neox-small": Case(
        "gpt-neox-small",
        GPTNeoXConfig,
        {**NARROW_MHA, "intermediate_size": 512},
        "small GPT-NeoX: parallel residual, LayerNorm with bias, fused QKV, rotary on a quarter of each head",
    ),
    "falcon-small": Case(
        "falcon-small",
        FalconConfig,
        {**NARROW_MHA, "ffn_hidden_size": 512, "new_decoder_architecture": True, "num_kv_heads": 2},
        "small Falcon, 40B/180B layout (new_decoder_architecture): two norms, parallel block, GQA 4 / 2",
        attentions=SDPA_ONLY,
    ),
    "falcon-7b-small": Case(
        "falcon-7b-small",
        FalconConfig,
        {**NARROW_MHA, "ffn_hidden_size": 512, "new_decoder_architecture": False, "multi_query": True},
        "small Falcon, 7B layout: one norm feeding a parallel block, multi-query attention",
        attentions=SDPA_ONLY,
    ),
    "cohere-small": Case(
        "cohere-small",
        CohereConfig,
        {**NARROW, "intermediate_size": 384},
        "small Cohere (Command R): one LayerNorm without bias feeding a parallel block, GQA 4 / 2",
    ),
    "qwen2-moe-small": Case(
        "qwen2-moe-small",
        Qwen2MoeConfig,
        {
            **NARROW,
            "intermediate_size": 384,
            "moe_intermediate_size": 64,
            "shared_expert_intermediate_size": 256,
            "num_experts": 8,
            "num_experts_per_tok": 2,
            "decoder_sparse_step": 2,
            "use_sliding_window": False,
        },
        "small Qwen2-MoE: layer 0 dense, layer 1 MoE (decoder_sparse_step 2), 8 experts top-2, a gated shared expert",
    ),
    "gpt-oss-small": Case(
        "gpt-oss-small",
        GptOssConfig,
        {
            **NARROW,
            "intermediate_size": 128,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "sliding_window": WINDOW,
        },
        f"small gpt-oss: attention sinks and biases (eager only), 4 experts top-2 with biases, layer 0 sliding "
        f"over {WINDOW}",
        attentions=EAGER_ONLY,
    ),
    "phi3-small": Case(
        "phi3-small",
        Phi3Config,
        {**NARROW, "intermediate_size": 384, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2},
        "small Phi-3: fused qkv_proj and gate_up_proj, GQA 4 / 2",
    ),
    "starcoder2-small": Case(
        "starcoder2-small",
        Starcoder2Config,
        {**NARROW, "intermediate_size": 512, "bos_token_id": 1, "eos_token_id": 2},
        "small StarCoder2: LayerNorm with bias, a tanh-GELU MLP with biases, GQA 4 / 2",
    ),
    # ---- wide: a vocabulary far narrower than the layers, so that a layer's backward, not the loss's, is the
    # step's busiest phase (hf_step_peak.py; tests/test_step_phases.py) ----
    "llama-wide": Case(
        "llama-wide",
        LlamaConfig,
        {**WIDE, "intermediate_size": 1536, "rms_norm_eps": 1e-5},
        "Llama with h 512 and V 256: a layer's backward outweighs the loss's",
    ),
    "mixtral-wide": Case(
        "mixtral-wide",
        MixtralConfig,
        {
            **WIDE,
            "intermediate_size": 1536,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "sliding_window": None,
            "router_jitter_noise": 0.0,
        },  # fmt: skip
        "Mixtral with h 512 and V 256, 4 experts top-2",
    ),
    "gpt2-wide": Case(
        "gpt2-wide",
        GPT2Config,
        dict(vocab_size=256, n_embd=512, n_head=8, n_layer=LAYERS, n_positions=1024),
        "GPT-2 with h 512 and V 256 (tied embeddings; its gelu_new written op by op)",
        _GPT2_DROPOUT,
    ),
    "gpt-neox-wide": Case(
        "gpt-neox-wide",
        GPTNeoXConfig,
        {**{k: v for k, v in WIDE.items() if k != "num_key_value_heads"}, "intermediate_size": 2048},
        "GPT-NeoX with h 512 and V 256 (torch's GELU kernel)",
    ),
}
N384 = {**NARROW, "intermediate_size": 384}
"""The narrow cases' layers with an MLP of 384."""
MOE4 = {**NARROW, "intermediate_size": 64, "num_local_experts": 4, "num_experts_per_tok": 2}
"""The narrow cases' layers with 4 experts of 64, top-2."""
DSA_SMALL = dict(q_lora_rank=64, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=32,
                 num_key_value_heads=4, index_n_heads=4, index_head_dim=32, index_topk=64, first_k_dense_replace=1,
                 n_routed_experts=4, n_shared_experts=1, moe_intermediate_size=64, num_experts_per_tok=2, n_group=1,
                 topk_group=1)  # fmt: skip
"""MLA with DeepSeek sparse attention, h 128: an indexer that picks fewer keys than every measured sequence holds."""
T = transformers
NEWER: dict[str, tuple[type[PretrainedConfig], dict[str, Any], str]] = {
    "olmo3-small": (T.Olmo3Config, N384 | {"sliding_window": WINDOW},
                    "small OLMo 3: norms after attention and the MLP, QK-norm over all heads, sliding and global"),
    "exaone4-small": (T.Exaone4Config, N384 | {"sliding_window": WINDOW, "sliding_window_pattern": 2},
                      "small EXAONE 4: OLMo 2's norms, QK-norm per head, a sliding layer then a global one"),
    "helium-small": (T.HeliumConfig, N384 | {"head_dim": 32, "attention_bias": True},
                     "small Helium: biases on q, k and v, fp32-weighted RMSNorms"),
    "stablelm-small": (T.StableLmConfig, N384 | {"use_qkv_bias": True},
                       "small StableLM: LayerNorms with biases, biases on q, k and v, partial rotary"),
    "granitemoe-small": (T.GraniteMoeConfig, MOE4, "small Granite MoE: Granite's multipliers, 4 experts top-2"),
    "ministral3-small": (T.Ministral3Config, N384 | {"sliding_window": WINDOW},
                         "small Ministral 3: Mistral's layer, every layer sliding"),
    "glm-small": (T.GlmConfig, N384 | {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2},
                  "small GLM: a fused gate_up MLP, biases on q, k and v, partial rotary"),
    "cwm-small": (T.CwmConfig, N384 | {"sliding_window": WINDOW},
                  "small Code World Model: the first layer global, the second sliding"),
    "arcee-small": (T.ArceeConfig, N384, "small Arcee: a squared-ReLU MLP of two matrices"),
    "nemotron-small": (T.NemotronConfig, N384, "small Nemotron: LayerNorm1P with biases, squared ReLU, partial rotary"),
    "minimax-m2-small": (T.MiniMaxM2Config, MOE4, "small MiniMax-M2: QK-norm over all heads, 4 experts top-2"),
    "hyperclovax-small": (T.HyperCLOVAXConfig, N384,
                          "small HyperCLOVA X: Granite's layer with norms on each sub-layer's output"),
    "gptj-small": (T.GPTJConfig, dict(vocab_size=2048, n_embd=128, n_head=4, n_layer=LAYERS, n_positions=1024,
                                      rotary_dim=8, tie_word_embeddings=False),
                   "small GPT-J: attention and a GELU MLP side by side from one LayerNorm, a biased head"),
    "olmo-small": (T.OlmoConfig, N384 | {"clip_qkv": 8.0},
                   "small OLMo: LayerNorms without weight or bias, in fp32; q, k and v clamped in place"),
    "nanochat-small": (T.NanoChatConfig, N384,
                       "small nanochat: weightless RMSNorms (the embedding's too), squared ReLU, a soft-capped head"),
    "jais2-small": (T.Jais2Config, N384 | {"head_dim": 32},
                    "small Jais 2: LayerNorms with biases, biases everywhere, squared ReLU"),
    "hunyuan-dense-small": (T.HunYuanDenseV1Config, N384 | {"head_dim": 32},
                            "small Hunyuan dense: QK-norm per head after RoPE"),
    "exaone-moe-small": (T.ExaoneMoeConfig, MOE4 | {"num_experts": 4, "moe_intermediate_size": 64,
                                                    "num_shared_experts": 1, "head_dim": 32,
                                                    "sliding_window": WINDOW, "sliding_window_pattern": 2},
                         "small EXAONE MoE: QK-norm per head, a dense layer then a routed one with a shared expert"),
    "opt-small": (T.OPTConfig, dict(vocab_size=2048, hidden_size=128, num_attention_heads=4, num_hidden_layers=LAYERS,
                                    ffn_dim=384, max_position_embeddings=1024, tie_word_embeddings=False),
                  "small OPT: a ReLU MLP, biases, positions offset by two, dropout 0.1 on each sub-layer's output"),
    "biogpt-small": (T.BioGptConfig, dict(vocab_size=2048, hidden_size=128, num_attention_heads=4,
                                          num_hidden_layers=LAYERS, intermediate_size=384,
                                          max_position_embeddings=1024, attention_probs_dropout_prob=0.0,
                                          tie_word_embeddings=False),
                     "small BioGPT: OPT's block with a GELU, dropout 0.1 on the embedding and each sub-layer's output"),
    "gpt-neo-small": (T.GPTNeoConfig, dict(vocab_size=2048, hidden_size=128, num_heads=4, num_layers=LAYERS,
                                           attention_types=[[["global", "local"], 1]], window_size=WINDOW,
                                           max_position_embeddings=1024, embed_dropout=0.1, resid_dropout=0.1,
                                           tie_word_embeddings=False),
                      "small GPT-Neo: a global layer then a local one, biases on the output projection alone, "
                      "dropout on the embedding and each sub-layer's output"),
    "mpt-small": (T.MptConfig, dict(vocab_size=2048, d_model=128, n_heads=4, n_layers=LAYERS, max_seq_len=1024,
                                    attn_config=dict(clip_qkv=8.0), tie_word_embeddings=False),
                  "small MPT: one fused Wqkv clamped, LayerNorms without a bias, ALiBi, a GELU MLP of 4·h"),
    "dbrx-small": (T.DbrxConfig, dict(vocab_size=2048, d_model=128, n_heads=4, n_layers=LAYERS, max_seq_len=1024,
                                      attn_config=dict(kv_n_heads=2, clip_qkv=8.0, rope_theta=500000.0),
                                      ffn_config=dict(ffn_hidden_size=64, moe_num_experts=4, moe_top_k=2)),
                   "small DBRX: MPT's attention with RoPE and 2 key-value heads, 4 SwiGLU experts top-2"),
    "apertus-small": (T.ApertusConfig, N384, "small Apertus: a two-matrix MLP with xIELU, QK-norm per head"),
    "hunyuan-moe-small": (T.HunYuanMoEV1Config, NARROW | {"intermediate_size": 64, "num_experts": 4, "moe_topk": 2},
                          "small Hunyuan MoE: 4 experts top-2 and a shared MLP of their width, an fp32 router"),
    "cohere2-moe-small": (T.Cohere2MoeConfig, NARROW | {"intermediate_size": 64, "num_experts": 4,
                                                        "num_experts_per_tok": 2, "num_shared_experts": 1,
                                                        "first_k_dense_replace": 1, "sliding_window": WINDOW,
                                                        "prefix_dense_intermediate_size": 384},
                          "small Command A MoE: Cohere's parallel block, a dense layer then 4 experts top-2 with a "
                          "shared one"),
    "afmoe-small": (T.AfmoeConfig, NARROW | {"intermediate_size": 384, "moe_intermediate_size": 64, "num_experts": 4,
                                             "num_experts_per_tok": 2, "num_shared_experts": 1, "num_dense_layers": 1,
                                             "sliding_window": WINDOW, "global_attn_every_n_layers": 2},
                    "small AFMoE: a gate on the attention's output from its own projection, sandwich norms, a dense "
                    "layer then 4 experts top-2 with a shared one"),
    "lfm2-small": (T.Lfm2Config, N384 | {"full_attn_idxs": [1], "conv_bias": True, "block_multiple_of": 128},
                   "small LFM2: a gated short convolution in the first layer, attention with QK-norm in the second"),
    "beam-small": (T.BeamConfig, MOE4 | {"sliding_window": WINDOW, "num_experts": 4, "moe_intermediate_size": 64,
                                         "n_group": 1, "topk_group": 1,
                                         "mlp_layer_types": ["dense", "sparse"]},
                   "small Beam: AFMoE's output gate with a bias a head, QK-norm per head, sandwich norms; a sliding "
                   "layer with RoPE and a dense MLP, then a full one without RoPE, its queries scaled, 4 experts "
                   "top-2"),
    "modernbert-decoder-small": (T.ModernBertDecoderConfig, N384 | {"local_attention": 2 * WINDOW,
                                                                    "global_attn_every_n_layers": 2, "pad_token_id": 0,
                                                                    "bos_token_id": 1, "eos_token_id": 2},
                                 "small ModernBERT decoder: the embedding's LayerNorm for the first layer's, a full "
                                 "then a sliding layer, a fused GeGLU, a head transform before the tied decoder"),
    "lfm3-small": (T.Lfm3Config, N384 | {"sliding_window": WINDOW, "layer_types": ["conv", "sliding_attention"],
                                         "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2},
                   "small LFM3: a gated short convolution, then attention within a window with QK-norm, a sigmoid gate "
                   "a head on its output and sandwich norms"),
    "lfm2-moe-small": (T.Lfm2MoeConfig, NARROW | {"intermediate_size": 384, "moe_intermediate_size": 64,
                                                  "num_experts": 4, "num_experts_per_tok": 2, "num_dense_layers": 1,
                                                  "layer_types": ["conv", "full_attention"]},
                       "small LFM2-MoE: a convolution layer with a dense MLP, then attention with 4 experts top-2"),
    "nemotron-h-small": (T.NemotronHConfig, NARROW | {"intermediate_size": 384, "n_routed_experts": 4,
                                                      "num_experts_per_tok": 2, "moe_intermediate_size": 64,
                                                      "moe_shared_expert_intermediate_size": 96,
                                                      "hybrid_override_pattern": "*-*E"},
                         "small Nemotron-H, single blocks: attention alone, a squared-ReLU MLP alone, attention, an "
                         "MoE of 4 experts top-2 and a shared expert"),
    "nemotron-h-latent-small": (T.NemotronHConfig, NARROW | {"intermediate_size": 384, "n_routed_experts": 4,
                                                             "num_experts_per_tok": 2, "moe_intermediate_size": 64,
                                                             "moe_shared_expert_intermediate_size": 96,
                                                             "moe_latent_size": 48, "hybrid_override_pattern": "*-*E"},
                                "small Nemotron 3 Super-style latent MoE: as nemotron-h-small, the routed experts "
                                "working at a latent width of 48 between two projections"),
    "openai-gpt-small": (T.OpenAIGPTConfig, dict(vocab_size=2048, n_embd=128, n_head=4, n_layer=LAYERS,
                                                 n_positions=1024),
                         "small GPT-1: each LayerNorm after its residual add, none before the tied head, dropout 0.1 "
                         "on the embedding, the probabilities and each sub-layer's output"),
    "ctrl-small": (T.CTRLConfig, dict(vocab_size=2048, n_embd=128, n_head=4, n_layer=LAYERS, dff=384,
                                      n_positions=1024),
                   "small CTRL: sinusoidal positions, biases everywhere, a ReLU MLP, a tied head with a bias, dropout "
                   "0.1 on the embedding and each sub-layer's output"),
    "xglm-small": (T.XGLMConfig, dict(vocab_size=2048, d_model=128, attention_heads=4, num_layers=LAYERS,
                                      ffn_dim=384, max_position_embeddings=1024),
                   "small XGLM: sinusoidal positions, fairseq's block, its own eager attention (the masked scores "
                   "clamped), dropout 0.1 on the embedding, the probabilities and each sub-layer's output"),
    "diffllama-small": (T.DiffLlamaConfig, N384 | {"num_key_value_heads": 2},
                        "small DiffLlama: differential attention, two calls over the halves of V, 2 key-value heads"),
    "emu3-small": (T.Emu3Config, {"text_config": N384 | {"attention_dropout": 0.1, "pad_token_id": 0, "bos_token_id": 1,
                                                         "eos_token_id": 2}},
                   "small Emu3 text model: Llama's layer with dropout 0.1 on the attention probabilities (eager: "
                   "SDPA's dropout runs the CPU's math path, which no GPU run takes)"),
    "seed-oss-small": (T.SeedOssConfig, N384 | {"attention_dropout": 0.1},
                       "small Seed-OSS: dropout 0.1 on the attention probabilities and each sub-layer's output "
                       "(eager: SDPA's dropout runs the CPU's math path)"),
    "gpt-neox-japanese-small": (T.GPTNeoXJapaneseConfig, dict(vocab_size=2048, hidden_size=128,
                                                              num_attention_heads=4, num_hidden_layers=LAYERS,
                                                              intermediate_multiple_size=3,
                                                              max_position_embeddings=1024),
                                "small GPT-NeoX-Japanese: its own eager attention with dropout 0.1 on the "
                                "probabilities, a bias on the last layer's attention output alone"),
    "bitnet-small": (T.BitNetConfig, N384, "small BitNet: norms on the attention's output and on the gated "
                     "product, a squared-ReLU gate"),
    "axk1-small": (T.AXK1Config, N384 | {k: v for k, v in DSA_SMALL.items() if not k.startswith("index")}
                   | {"head_dim": 16},  # AXK1's rotary tables are head_dim wide: the RoPE part, qk_rope_head_dim
                   "small A.X K1: DeepSeek-V3's MLA and MoE, a norm on the MoE block's output"),
    "axk2-small": (T.AXK2Config, N384 | {k: v for k, v in DSA_SMALL.items() if k not in ("first_k_dense_replace",
                                                                                         "n_group", "topk_group")}
                   | {"head_dim": 16, "mlp_layer_types": ["dense", "sparse"], "gated_norm_rank": 16},
                   "small A.X K2: MLA whose query up-projection reads the normed latent beside the latent and gates "
                   "the output, DeepSeek sparse attention's indexer, gated input and MoE norms, a dense layer, then 4 "
                   "experts top-2 and a shared one"),
    "jetmoe-small": (T.JetMoeConfig, {k: v for k, v in NARROW.items() if k != "head_dim"}
                     | {"kv_channels": 32, "num_local_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 64},
                     "small JetMoE: attention of 4 experts top-2 (2 KV heads of 32 each) over one shared K and V, and "
                     "4 MLP experts top-2"),
    "flint-small": (T.FlintConfig, MOE4 | {"sliding_window": WINDOW, "shared_expert_intermediate_size": 96,
                                           "num_experts": 4, "layer_types": ["full_attention", "sliding_attention"]},
                    "small Flint: attention sinks with fp32 eager scores, QK-norm per head, RoPE on the sliding "
                    "layer alone, 4 experts top-2 and an ungated shared expert"),
    "laguna-small": (T.LagunaConfig, MOE4 | {"sliding_window": WINDOW, "shared_expert_intermediate_size": 96,
                                             "num_experts": 4, "layer_types": ["sliding_attention", "full_attention"]},
                     "small Laguna: a softplus gate a head on the attention's output from its own projection, QK-norm "
                     "per head, a sliding layer with a dense MLP, then a full one with 4 experts top-2 and an ungated "
                     "shared expert"),
    "mimo-v2-flash-small": (T.MiMoV2FlashConfig, MOE4 | {"sliding_window": WINDOW, "moe_intermediate_size": 64,
                                                        "num_key_value_heads": 1, "v_head_dim": 16},
                            "small MiMo-V2-Flash: keys of 32 and values of 16; a full layer with a dense MLP, then a "
                            "sliding one at twice the KV heads with sinks and 4 experts top-2 (eager: no SDPA)"),
    "minimax-m3-small": (T.MiniMaxM3VLTextConfig, NARROW | {"intermediate_size": 64, "num_local_experts": 4,
                                                            "num_experts_per_tok": 2, "dense_intermediate_size": 384,
                                                            "shared_intermediate_size": 96,
                                                            "mlp_layer_types": ["dense", "sparse"]},
                         "small MiniMax-M3 text model: Gemma-style norms, QK-norm per head, a dense layer, then 4 "
                         "experts top-2 and an ungated shared expert, every MLP a clamped SwiGLU"),
    "minimax-small": (T.MiniMaxConfig, MOE4 | {"block_size": 64},
                      "small MiniMax-01: softmax attention, then lightning attention in blocks of 64, 4 experts top-2"),
    "gemma4-small": (T.Gemma4TextConfig, N384 | {"sliding_window": WINDOW, "hidden_size_per_layer_input": 0,
                                               "layer_types": ["sliding_attention", "full_attention"],
                                               "global_head_dim": 64, "num_global_key_value_heads": 1,
                                               "attention_k_eq_v": True},
                     "small Gemma 4 (the 31B's layer kinds): a sliding layer with heads of 32, then a global one with "
                     "heads of 64 and one KV head whose keys are its values (K = V), V normed too"),
    "gemma4-moe-small": (T.Gemma4TextConfig, N384 | {"sliding_window": WINDOW, "hidden_size_per_layer_input": 0,
                                                   "layer_types": ["sliding_attention", "full_attention"],
                                                   "global_head_dim": 64, "num_global_key_value_heads": 1,
                                                   "attention_k_eq_v": True, "enable_moe_block": True,
                                                   "num_experts": 4, "top_k_experts": 2, "moe_intermediate_size": 64},
                         "small Gemma 4 (the 26B-A4B's kinds): gemma4-small's layers, each with an MoE block of 4 "
                         "experts top-2 beside its dense MLP, a norm before the experts and after each branch"),
    "gemma4-e-small": (T.Gemma4TextConfig, N384 | {"sliding_window": WINDOW, "num_hidden_layers": 4,
                                                 "layer_types": ["sliding_attention", "full_attention"] * 2,
                                                 "global_head_dim": 64, "num_global_key_value_heads": 1,
                                                 "attention_k_eq_v": True, "num_kv_shared_layers": 2,
                                                 "use_double_wide_mlp": True, "hidden_size_per_layer_input": 16,
                                                 "vocab_size_per_layer_input": 2048},
                       "small Gemma 4 (the E2B's and E4B's kinds): gemma4-small's two layers, then two more of the "
                       "same kinds that attend with their K and V, with MLPs twice as wide; per-layer inputs of 16"),
    "gemma3n-small": (T.Gemma3nTextConfig, N384 | {"sliding_window": WINDOW, "num_hidden_layers": 4,
                                                 "layer_types": ["sliding_attention", "full_attention"] * 2,
                                                 "num_kv_shared_layers": 2, "hidden_size_per_layer_input": 16,
                                                 "vocab_size_per_layer_input": 2048, "altup_num_inputs": 4,
                                                 "laurel_rank": 8,
                                                 "activation_sparsity_pattern": [0.95, 0.95, 0.0, 0.0]},
                      "small Gemma 3n: four streams (AltUp), LAuReL of rank 8, the first two layers' gates cut at a "
                      "Gaussian quantile, the last two reusing the first two's K and V; per-layer inputs of 16"),
    "deepseek-v32-small": (T.DeepseekV32Config, N384 | DSA_SMALL,
                           "small DeepSeek-V3.2: MLA with a lightning indexer of 4 heads picking 64 keys a query, "
                           "a dense layer, then 4 experts top-2 and a shared one"),
    "recurrent-gemma-small": (T.RecurrentGemmaConfig, N384 | {"num_key_value_heads": 1, "lru_width": 192,
                                                             "block_types": ["recurrent", "attention"],
                                                             "attention_window_size": WINDOW},
                              "small RecurrentGemma: a recurrent block (RG-LRU of 192 in 4 gate blocks, the scan "
                              "written in PyTorch, token by token), then local MQA within a window, half-rotary"),
    "recurrent-gemma-wide": (T.RecurrentGemmaConfig, WIDE | {"num_key_value_heads": 1, "intermediate_size": 1536,
                                                            "block_types": ["recurrent", "attention"],
                                                            "attention_window_size": WINDOW},
                             "RecurrentGemma with h 512 and V 256: a norm's or a layer's backward outweighs the "
                             "loss's"),
    "rwkv-small": (T.RwkvConfig, {"vocab_size": 2048, "hidden_size": 128, "attention_hidden_size": 96,
                                  "intermediate_size": 384, "num_hidden_layers": LAYERS, "context_length": 1024,
                                  "tie_word_embeddings": False},
                   "small RWKV-4: a time mix of 96 (the WKV recurrence a loop over the tokens off CUDA), a channel "
                   "mix of 384"),
    "rwkv-wide": (T.RwkvConfig, {"vocab_size": 256, "hidden_size": 512, "intermediate_size": 2048,
                                 "num_hidden_layers": LAYERS, "context_length": 1024, "tie_word_embeddings": False},
                  "RWKV-4 with h 512 and V 256: a layer's backward outweighs the loss's"),
}  # fmt: skip
"""Types lmcalc reads since issue #31, small (h 128, two layers): name: (config class, its kwargs, what it is)."""
CASES |= {name: Case(name, cls, kwargs, source) for name, (cls, kwargs, source) in NEWER.items()}
TOKENS = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}  # inside the 2,048-token vocabulary
MOE2 = {"moe_intermediate_size": 64, "num_experts_per_tok": 2}
MLA_MOE = {k: v for k, v in DSA_SMALL.items() if not k.startswith("index")}  # keys and values 32 wide: SDPA's kernel
TYPES: dict[str, tuple[type[PretrainedConfig], dict[str, Any], str]] = {
    "qwen3-small": (T.Qwen3Config, N384 | TOKENS | {"head_dim": 48}, "small Qwen3: QK-norm per head, heads of 48"),
    "qwen3-moe-small": (
        T.Qwen3MoeConfig,
        N384 | TOKENS | MOE2 | {"num_experts": 4, "mlp_only_layers": [0]},
        "small Qwen3-MoE: a dense layer, then 4 experts top-2",
    ),
    "olmo2-small": (T.Olmo2Config, N384 | TOKENS, "small OLMo 2: norms after each sub-layer, QK-norm over all heads"),
    "olmoe-small": (
        T.OlmoeConfig,
        N384 | TOKENS | {"num_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 64},
        "small OLMoE: 4 experts top-2",
    ),
    "gemma-small": (T.GemmaConfig, N384 | TOKENS | {"head_dim": 48}, "small Gemma: GeGLU, norms of 1 + w in fp32"),
    "granite-small": (T.GraniteConfig, N384 | TOKENS, "small Granite: Llama's layer with its multipliers"),
    "smollm3-small": (T.SmolLM3Config, N384 | TOKENS, "small SmolLM3: NoPE in every fourth layer"),
    "ernie4-5-small": (T.Ernie4_5Config, N384 | TOKENS | {"use_bias": True}, "small ERNIE 4.5: biases everywhere"),
    "glm4-small": (T.Glm4Config, N384 | TOKENS, "small GLM-4: sandwich norms, half-rotary, fused gate_up"),
    "glm4-moe-small": (
        T.Glm4MoeConfig,
        N384
        | TOKENS
        | MOE2
        | {
            "n_routed_experts": 4,
            "n_shared_experts": 1,
            "first_k_dense_replace": 1,
            "n_group": 1,
            "topk_group": 1,
            "use_qk_norm": True,
            "head_dim": 24,
        },
        "small GLM-4.5: a dense layer, then 4 experts top-2 and a shared one, QK-norm",
    ),
    "cohere2-small": (
        T.Cohere2Config,
        N384 | TOKENS | {"sliding_window": WINDOW, "sliding_window_pattern": 2},
        "small Cohere2: a sliding layer, then a global one",
    ),
    "flex-olmo-small": (
        T.FlexOlmoConfig,
        N384 | TOKENS | {"num_experts": 4, "num_experts_per_tok": 2},
        "small FlexOlmo: 4 experts top-2, QK-norm over all heads",
    ),
    "dots1-small": (
        T.Dots1Config,
        N384 | TOKENS | MOE2 | {"n_routed_experts": 4, "n_shared_experts": 1, "first_k_dense_replace": 1},
        "small dots.llm1: a dense layer, then 4 experts top-2 and a shared one",
    ),
    "phimoe-small": (
        T.PhimoeConfig,
        N384 | TOKENS | {"num_local_experts": 4, "num_experts_per_tok": 2, "lm_head_bias": True},
        "small Phi-3.5-MoE: LayerNorms, 4 experts top-2, a biased head",
    ),
    "ernie4-5-moe-small": (
        T.Ernie4_5_MoeConfig,
        N384
        | TOKENS
        | {
            "moe_num_experts": 4,
            "moe_k": 2,
            "moe_intermediate_size": 64,
            "moe_num_shared_experts": 1,
            "moe_layer_start_index": 1,
        },
        "small ERNIE 4.5 MoE: a dense layer, then 4 experts top-2 and a shared one",
    ),
    "solar-open-small": (
        T.SolarOpenConfig,
        N384 | TOKENS | MOE2 | {"n_routed_experts": 4, "n_shared_experts": 1, "attention_bias": True},
        "small Solar Open: 4 experts top-2 and a shared one, biases on Q, K and V",
    ),
    "vaultgemma-small": (
        T.VaultGemmaConfig,
        N384 | TOKENS | {"head_dim": 48, "sliding_window": WINDOW},
        "small VaultGemma: a sliding layer, then a global one (eager only)",
    ),
    "codegen-small": (
        T.CodeGenConfig,
        dict(vocab_size=2048, n_embd=128, n_layer=LAYERS, n_head=4, rotary_dim=16, n_positions=1024, n_ctx=1024)
        | TOKENS,
        "small CodeGen: GPT-J's parallel block with a fused qkv_proj, a quarter of each head rotated",
    ),
    "phi-small": (
        T.PhiConfig,
        NARROW_MHA | TOKENS | {"intermediate_size": 384, "qk_layernorm": True},
        "small Phi-2: a parallel block, biases, per-head LayerNorms on Q and K",
    ),
    "bloom-small": (
        T.BloomConfig,
        dict(vocab_size=2048, hidden_size=128, n_layer=LAYERS, n_head=4) | TOKENS,
        "small BLOOM: ALiBi, a LayerNorm on the embedding, biases (eager only)",
    ),
    "gpt-bigcode-small": (
        T.GPTBigCodeConfig,
        dict(vocab_size=2048, n_embd=128, n_layer=LAYERS, n_head=4, n_positions=1024) | TOKENS,
        "small StarCoder (GPTBigCode): one K/V head (multi_query), learned positions",
    ),
    "granitemoeshared-small": (
        T.GraniteMoeSharedConfig,
        N384
        | TOKENS
        | {"num_local_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 64, "shared_intermediate_size": 96},
        "small Granite MoE Shared: 4 experts top-2 and an ungated shared MLP",
    ),
    "apertus1p5-small": (T.Apertus1p5TextConfig, N384 | TOKENS, "small Apertus 1.5: xIELU, QK-norm per head"),
    "aria-text-small": (
        T.AriaTextConfig,
        N384 | TOKENS | {"moe_num_experts": 4, "moe_topk": 2, "moe_num_shared_experts": 1, "intermediate_size": 64},
        "small Aria text model: 4 experts top-2 and a shared one",
    ),
    "kolibri1-small": (
        T.Kolibri1Config,
        N384
        | TOKENS
        | MOE2
        | {"num_local_experts": 4, "shared_expert_intermediate_size": 96, "sliding_window": WINDOW},
        "small Kolibri 1: sandwich norms, 4 experts top-2 and an ungated shared expert, a window",
    ),
    "hy-v3-small": (
        T.HYV3Config,
        N384 | TOKENS | MOE2 | {"num_experts": 4, "num_shared_experts": 1, "mlp_layer_types": ["dense", "sparse"]},
        "small Hunyuan V3: a dense layer, then 4 experts top-2 and a shared one",
    ),
    "deepseek-v2-small": (
        T.DeepseekV2Config,
        N384 | TOKENS | MLA_MOE | {"head_dim": 16},
        "small DeepSeek-V2: MLA (values as wide as keys), a dense layer, then 4 experts top-2",
    ),
    "deepseek-v3-small": (
        T.DeepseekV3Config,
        N384 | TOKENS | MLA_MOE | {"head_dim": 16},
        "small DeepSeek-V3: MLA, a dense layer, then 4 experts top-2 and a shared one",
    ),
    "glm4-moe-lite-small": (
        T.Glm4MoeLiteConfig,
        N384 | TOKENS | MLA_MOE | {"head_dim": 16},  # its qk_rope_head_dim (Glm4MoeLiteConfig's attribute map)
        "small GLM-4.7-Flash: DeepSeek-V3's MLA and MoE",
    ),
    "minicpm3-small": (
        T.MiniCPM3Config,
        N384
        | TOKENS
        | {
            k: v
            for k, v in MLA_MOE.items()
            if "expert" not in k and k not in ("first_k_dense_replace", "n_group", "topk_group", "num_experts_per_tok")
        }
        | {"attention_bias": True},
        "small MiniCPM3: MLA with biases, a dense MLP",
    ),
    "youtu-small": (
        T.YoutuConfig,
        N384
        | TOKENS
        | {
            "q_lora_rank": None,
            "kv_lora_rank": 32,
            "qk_nope_head_dim": 16,
            "qk_rope_head_dim": 16,
            "head_dim": 16,  # its rotary tables are head_dim wide: the RoPE part
            "v_head_dim": 32,
            "num_key_value_heads": 4,
        },
        "small Youtu: MLA without a query latent, a dense MLP",
    ),
    "mellum-small": (
        T.MellumConfig,
        N384
        | TOKENS
        | MOE2
        | {
            "num_local_experts": 4,
            "sliding_window": WINDOW,
            "mlp_layer_types": ["dense", "sparse"],
            "layer_types": ["sliding_attention", "full_attention"],
        },
        "small Mellum: a sliding layer with a dense MLP, then a global one with 4 experts top-2",
    ),
    "ministral-small": (
        T.MinistralConfig,
        N384 | TOKENS | {"sliding_window": WINDOW, "layer_types": ["sliding_attention", "full_attention"]},
        "small Ministral: a sliding layer, then a global one",
    ),
    "glm-moe-dsa-small": (
        T.GlmMoeDsaConfig,
        N384 | TOKENS | DSA_SMALL | {"indexer_types": ["full", "shared"]},
        "small GLM-5: MLA with a lightning indexer in the first layer, whose selection the second "
        "reuses; a dense layer, then 4 experts top-2 and a shared one",
    ),
    "llama4-small": (
        T.Llama4TextConfig,
        N384
        | TOKENS
        | {
            "num_local_experts": 4,
            "num_experts_per_tok": 1,
            "intermediate_size": 64,
            "intermediate_size_mlp": 384,
            "interleave_moe_layer_step": 2,
            "attention_chunk_size": WINDOW,
            "no_rope_layer_interval": 2,
        },
        "small Llama 4: a chunked layer with a dense MLP, then a global one (no RoPE) with 4 experts "
        "top-1 and a shared one",
    ),
    "persimmon-small": (
        T.PersimmonConfig,
        N384 | TOKENS | {"num_key_value_heads": 4},
        "small Persimmon: a fused query_key_value, per-head LayerNorms on Q and K, half-rotary, a squared-ReLU MLP",
    ),
    "granite-swa-small": (
        T.GraniteSWAConfig,
        N384 | TOKENS | {"sliding_window": WINDOW},
        "small Granite SWA: sinks that scale each head's output by σ(lse − sink) (eager only)",
    ),
    "granitemoe-swa-small": (
        T.GraniteMoeSWAConfig,
        N384 | TOKENS | {"num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": WINDOW},
        "small Granite MoE SWA: 4 experts top-2, sinks scaling the output (eager only)",
    ),
    "longcat-flash-small": (
        T.LongcatFlashConfig,
        {k: v for k, v in NARROW.items() if k not in ("num_hidden_layers", "head_dim")}
        | TOKENS
        | {k: MLA_MOE[k] for k in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                                   "num_key_value_heads")}
        | {"num_layers": 1, "ffn_hidden_size": 384, "expert_ffn_hidden_size": 64, "n_routed_experts": 4,
           "zero_expert_num": 2, "moe_topk": 3, "head_dim": MLA_MOE["qk_rope_head_dim"]},
        "small LongCat-Flash: one layer of two MLA sub-layers with a dense MLP each, the first's input also routed "
        "to 4 experts and 2 zero-computation ones, top-3, two of the three picks real (``pin_zero_expert_picks``)",
    ),
}  # fmt: skip
"""Types lmcalc read before issue #31's measurements reached them, small (h 128, two layers), measured since
2026-12-06: name: (config class, its kwargs, what it is)."""
CASES |= {name: Case(name, cls, kwargs, source) for name, (cls, kwargs, source) in TYPES.items()}
ZAMBA = dict(vocab_size=2048, hidden_size=128, num_attention_heads=4, num_key_value_heads=4, intermediate_size=384,
             num_hidden_layers=3, layers_block_type=["mamba", "hybrid", "hybrid"], mamba_d_state=16,
             max_position_embeddings=1024, tie_word_embeddings=True, **TOKENS)  # fmt: skip
"""Zamba's and Zamba 2's small layers: h 128, V 2048, a tied head (which ties the uses' blocks too), a Mamba layer and
two that run the shared block; attention over 2·h with 4 heads of 64 (2·h/H), every head its own K and V."""
SHARED_BLOCKS: dict[str, tuple[type[PretrainedConfig], dict[str, Any], str]] = {
    "zamba-small": (T.ZambaConfig, ZAMBA | {"n_mamba_heads": 2},
                    "small Zamba: a Mamba layer (two heads of 128 channels, PyTorch's scan), then two layers that run "
                    "the one shared block (attention over 2·h, 4 heads of 64, a gated MLP of 384) before their Mamba"),
    "zamba2-small": (T.Zamba2Config, ZAMBA | {"n_mamba_heads": 4, "mamba_headdim": 64, "mamba_ngroups": 1,
                                              "adapter_rank": 8, "use_shared_attention_adapter": True},
                     "small Zamba 2: a Mamba-2 layer (4 heads of 64, PyTorch's chunked scan), then two layers that run "
                     "the one shared block, each use with its own rank-8 adapters on Q, K, V and the MLP"),
}  # fmt: skip
"""Zamba's and Zamba 2's shared blocks, three layers (transformers ties a block's weights only where two layers use it):
the uses' tensors are checked by module (``tests/test_shared_block_memory.py``); the Mamba layers run transformers'
PyTorch scan, which lmcalc does not model (it counts mamba_ssm's fused kernels)."""
CASES |= {name: Case(name, cls, kwargs, source) for name, (cls, kwargs, source) in SHARED_BLOCKS.items()}
MLLAMA_TEXT = {k: v for k, v in N384.items() if k != "head_dim"} | TOKENS
MLLAMA_TEXT |= {"num_hidden_layers": 3, "cross_attention_layers": [1]}
"""Llama 3.2 Vision's small text model (head size h/H, as MllamaTextCrossAttention and MllamaTextSelfAttention take
it): three layers, the middle one a cross-attention layer, which a step of text skips."""
CASES["mllama-small"] = Case(
    "mllama-small",
    T.MllamaConfig,
    {"text_config": MLLAMA_TEXT},
    "small Llama 3.2 Vision text model (MllamaForCausalLM): a self-attention layer, a cross-attention layer text "
    "skips, a self-attention layer; 8 embedding rows beyond V",
)
# GPTNeoPreTrainedModel, MptPreTrainedModel, OpenAI GPT's, XGLM's, GPT-NeoX-Japanese's and RWKV's: no SDPA; Emu3's and
# Seed-OSS's attention dropout: SDPA's runs the CPU's math path, which no GPU run takes
for _name in (
    "flint-small",
    "mimo-v2-flash-small",
    "vaultgemma-small",
    "bloom-small",
    "granite-swa-small",
    "granitemoe-swa-small",
    "gpt-neo-small",
    "mpt-small",
    "openai-gpt-small",
    "xglm-small",
    "emu3-small",
    "seed-oss-small",
    "gpt-neox-japanese-small",
    "rwkv-small",
    "rwkv-wide",
):
    CASES[_name] = replace(CASES[_name], attentions=EAGER_ONLY)
for _name in ("openai-gpt-small", "ctrl-small", "gpt-neox-japanese-small", "jetmoe-small"):  # no gradient checkpointing
    CASES[_name] = replace(CASES[_name], checkpointable=False)


def pin_zero_expert_picks(model: torch.nn.Module) -> None:
    """Send every token to k·E/(E + Z) real experts and the rest of its k picks to zero-computation ones, the share
    lmcalc counts (``MoESpec.computed_k``), instead of wherever random weights send it. LongCat-Flash's router adds
    its balancing bias (``e_score_correction_bias``) to the softmax scores, each below 1, before the top-k, so a bias
    of 1 on k experts picks those."""
    config = model.config
    experts, zero, k = config.n_routed_experts, config.zero_expert_num, config.moe_topk
    real = k * experts // (experts + zero)
    assert real * (experts + zero) == k * experts, "a config whose k·E/(E + Z) is whole"
    chosen = [*range(real), *range(experts, experts + k - real)]
    for module in model.modules():
        if hasattr(module, "e_score_correction_bias"):
            with torch.no_grad():
                module.e_score_correction_bias.zero_()
                module.e_score_correction_bias[chosen] = 1.0


CASES["longcat-flash-small"] = replace(CASES["longcat-flash-small"], routing=pin_zero_expert_picks)

# --------------------------------------------------------------------------------------------------------------------
COMPRESSED_SMALL = dict(vocab_size=2048, hidden_size=128, num_attention_heads=4, head_dim=32, num_hidden_layers=3,
                        max_position_embeddings=1024, tie_word_embeddings=False, n_routed_experts=4,
                        num_experts_per_tok=2, moe_intermediate_size=64, hc_mult=4, **TOKENS)  # fmt: skip
"""DeepSeek-V4's and HY V4's small layers: h 128, V 2048, three layers, 4 experts of 64 top-2 and one shared, four
residual streams (hc_mult, as both models' class defaults)."""
COMPRESSED: dict[str, tuple[type[PretrainedConfig], dict[str, Any], str]] = {
    "deepseek-v4-small": (T.DeepseekV4Config, COMPRESSED_SMALL | {
        "q_lora_rank": 64, "o_groups": 2, "o_lora_rank": 32, "index_n_heads": 4, "index_head_dim": 16,
        "index_topk": 8, "sliding_window": WINDOW, "partial_rotary_factor": 0.25, "mlp_layer_types": ["moe"] * 3,
        "compress_rates": {"compressed_sparse_attention": 4, "heavily_compressed_attention": 32},
        "layer_types": ["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"]},
        "small DeepSeek-V4: a layer of the window alone, a CSA layer (entries of 4 tokens, an indexer of 4 heads of "
        "16 picking 8) and an HCA layer (entries of 32), one KV head of 32 read as K and V, a sink a head, 2 output "
        "groups of 32, mHC over 4 streams, every layer 4 experts top-2 and a shared one"),
    "hy-v4-small": (T.HYV4Config, COMPRESSED_SMALL | DSA_SMALL | {"first_k_dense_replace": 1, "intermediate_size": 384},
                    "small HY V4: DeepSeek-V3.2's MLA and indexer (its own in layers 0 and 1, reused in 2), an output "
                    "gate of its own projection, sinks, a dense first layer, iHC over 4 streams"),
}  # fmt: skip
"""DeepSeek-V4 and HY V4, three layers, eager attention alone (their PreTrainedModels take no other): the
hyper-connections and compressed attention of ``engine.memory.compressed`` (tests/test_compressed_memory.py)."""
CASES |= {name: Case(name, cls, kwargs, source, attentions=EAGER_ONLY) for name, (cls, kwargs, source) in
          COMPRESSED.items()}  # fmt: skip

XLSTM_SMALL = dict(vocab_size=2048, hidden_size=128, num_heads=4, num_hidden_layers=LAYERS, chunk_size=64,
                   tie_word_embeddings=False, **TOKENS)  # fmt: skip
"""xLSTM's small layers: h 128, 4 heads (queries and keys of 16, values of 32), a SwiGLU of 384, V 2048, two layers,
the class's mode ("inference": whole chunks of 64 chunkwise, the rest token by token)."""
XLSTM: dict[str, tuple[type[PretrainedConfig], dict[str, Any], str]] = {
    "xlstm-small": (T.xLSTMConfig, XLSTM_SMALL, "small xLSTM: mLSTM layers of 4 heads run chunkwise in chunks of 64"),
    "xlstm-steps": (T.xLSTMConfig, XLSTM_SMALL | {"chunk_size": 48},
                    "small xLSTM with chunks of 48: the tokens past the last whole chunk run step by step"),
    "xlstm-train": (T.xLSTMConfig, XLSTM_SMALL | {"mode": "train"},
                    "small xLSTM in mode train: the kernel's own reshapes copy q, k and v (not modelled)"),
    "xlstm-wide": (T.xLSTMConfig, XLSTM_SMALL | {"vocab_size": 256, "hidden_size": 512, "num_heads": 8},
                   "xLSTM with h 512 and V 256: a layer's backward outweighs the loss's"),
}  # fmt: skip
"""xLSTM, eager (its layers attend nowhere), validated in fp32: transformers' kernels do not train in bf16
(``engine.memory.recurrent.mlstm_saved``)."""
CASES |= {name: Case(name, cls, kwargs, source, attentions=EAGER_ONLY) for name, (cls, kwargs, source) in
          XLSTM.items()}  # fmt: skip

DOGE_SMALL = dict(vocab_size=2048, hidden_size=128, intermediate_size=384, num_attention_heads=4,
                  num_key_value_heads=2, num_hidden_layers=LAYERS, keep_window_size=64, tie_word_embeddings=False,
                  **TOKENS)  # fmt: skip
"""Doge's small layers: h 128, 4 heads of 32 over 2 KV heads, a SwiGLU of 384, V 2048, two layers; its dynamic mask
keeps each query's top 64 keys, fewer than the measured sequences (128, 256)."""
DOGE_MOE = dict(is_moe=True, num_experts=256, num_experts_per_tok=16)
"""Doge's CDMoE beside the SwiGLU: 256 experts (16 keys a half), each token's top 16."""
DOGE: dict[str, tuple[type[PretrainedConfig], dict[str, Any], str]] = {
    "doge-small": (T.DogeConfig, DOGE_SMALL, "small Doge: dynamic mask attention keeping 64 keys, GQA 4/2"),
    "doge-mha": (T.DogeConfig, DOGE_SMALL | {"num_key_value_heads": 4, "keep_window_size": 2048},
                 "small Doge without GQA, its window past the sequence (no top-k)"),
    "doge-wide": (T.DogeConfig, DOGE_SMALL | {"vocab_size": 256, "hidden_size": 512, "num_attention_heads": 8,
                                              "intermediate_size": 1024},
                  "Doge with h 512 and V 256: a layer's backward outweighs the loss's"),
    "doge-moe": (T.DogeConfig, DOGE_SMALL | DOGE_MOE, "small Doge with its CDMoE: 256 one-neuron experts, 16 a token"),
    "doge-moe-wide": (T.DogeConfig, DOGE_SMALL | DOGE_MOE | {"vocab_size": 256, "hidden_size": 512,
                                                             "num_attention_heads": 8, "intermediate_size": 1024},
                      "Doge's CDMoE with h 512 and V 256: a layer's backward outweighs the loss's"),
}  # fmt: skip
"""Doge (``engine.memory.dynamic_mask``): its mask, added to eager attention's scores; with ``is_moe``, its CDMoE
(``engine.memory.retrieval_experts``)."""
CASES |= {name: Case(name, cls, kwargs, source) for name, (cls, kwargs, source) in DOGE.items()}

HRM_SMALL = dict(vocab_size=2048, hidden_size=128, intermediate_size=384, num_attention_heads=4, head_dim=32,
                 num_layers_per_stack=LAYERS, H_cycles=2, L_cycles=2, L_bp_cycles=[1], tie_word_embeddings=False,
                 **TOKENS)  # fmt: skip
"""HRM's small stacks: two of LAYERS layers, h 128, 4 heads of 32 (every head its own K and V), a SwiGLU of 384,
V 2048; two high-level cycles of two low-level runs, the first of each under torch.no_grad: 12 layer runs, 4 of them
without gradients."""
HRM: dict[str, tuple[type[PretrainedConfig], dict[str, Any], str]] = {
    "hrm-small": (T.HrmTextConfig, HRM_SMALL, "small HRM: stacks of two, 2 cycles of 2 low runs, 1 with gradients"),
    "hrm-wide": (T.HrmTextConfig, HRM_SMALL | {"vocab_size": 256, "hidden_size": 512, "num_attention_heads": 8,
                                               "head_dim": 64, "intermediate_size": 1024, "L_bp_cycles": [2]},
                 "HRM with h 512 and V 256, every low run with gradients: the runs' backward outweighs the loss's"),
}  # fmt: skip
"""HRM (``engine.memory.looped``): each trained run keeps its own activations, the runs under no_grad nothing."""
CASES |= {name: Case(name, cls, kwargs, source) for name, (cls, kwargs, source) in HRM.items()}

DORY_SMALL = dict(vocab_size=2048, hidden_size=128, intermediate_size=384, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=32, num_hidden_layers=4, n_input_layers=1, n_output_layers=1,
                  n_recurrent_loops=2, sliding_window=64,
                  layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
                  tie_word_embeddings=False, **TOKENS)  # fmt: skip
"""Dory's small layers: h 128, 4 heads of 32 over 2 KV heads, a SwiGLU of 384, V 2048; an input layer, a recurrent
section of two (one full, one sliding over a window of 64) run twice, an output layer: 6 layer runs of 4 held."""
DORY: dict[str, tuple[type[PretrainedConfig], dict[str, Any], str]] = {
    "dory-small": (T.DoryConfig, DORY_SMALL, "small Dory: nGPT layers, a recurrent section of two run twice"),
    "dory-wide": (T.DoryConfig, DORY_SMALL | {"vocab_size": 256, "hidden_size": 512, "num_attention_heads": 8,
                                              "num_key_value_heads": 4, "head_dim": 64, "intermediate_size": 1024},
                  "Dory with h 512 and V 256: the runs' backward outweighs the loss's"),
}  # fmt: skip
"""Dory (``engine.memory.ngpt``): nGPT's L2 norms, scales and interpolating residual, each run keeping its own."""
CASES |= {name: Case(name, cls, kwargs, source) for name, (cls, kwargs, source) in DORY.items()}

INKLING_SMALL = dict(vocab_size=2048, hidden_size=128, intermediate_size=384, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=32, swa_num_attention_heads=4, swa_num_key_value_heads=1,
                     swa_head_dim=32, sliding_window_size=64, d_rel=16, rel_extent=96, num_hidden_layers=LAYERS,
                     local_layer_ids=[0], mlp_layer_types=["dense", "sparse"], moe_intermediate_size=64,
                     n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, **TOKENS)  # fmt: skip
"""Inkling's small layers: h 128, 4 heads of 32, V 2048; layer 0 local (a window of 64, one KV head) with a dense
SwiGLU of 384, layer 1 global (two KV heads, relative logits over 96 distances) with 4 experts of 64 top-2 and a
shared one the router scores too; four convolutions of 4 taps a layer; the window and the extent shorter than the
measured sequences."""
INKLING: dict[str, tuple[type[PretrainedConfig], dict[str, Any], str]] = {
    "inkling-small": (T.InklingTextConfig, INKLING_SMALL, "small Inkling: branch convolutions, relative logits"),
    "inkling-wide": (T.InklingTextConfig, INKLING_SMALL | {"vocab_size": 256, "hidden_size": 512,
                                                          "num_attention_heads": 8, "num_key_value_heads": 4,
                                                          "swa_num_attention_heads": 8, "swa_num_key_value_heads": 2,
                                                          "head_dim": 64, "swa_head_dim": 64,
                                                          "intermediate_size": 1024, "moe_intermediate_size": 256},
                     "Inkling with h 512 and V 256: a layer's backward outweighs the loss's"),
}  # fmt: skip
"""Inkling (``engine.memory.branch_convs``): fp32 branch convolutions, a dense relative bias, its own router."""
CASES |= {name: Case(name, cls, kwargs, source, attentions=EAGER_ONLY)
          for name, (cls, kwargs, source) in INKLING.items()}  # fmt: skip

INKLING2_SMALL = dict(vocab_size=2048, unpadded_vocab_size=2000, hidden_size=128, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=32, swa_num_attention_heads=4, swa_num_key_value_heads=1,
                      swa_head_dim=32, sliding_window_size=64, d_rel=16, rel_extent=96, num_hidden_layers=LAYERS,
                      layer_types=["hybrid_sliding", "hybrid"], n_layers_per_attn_res_block=6,
                      moe_intermediate_size=64, n_routed_experts=4, num_experts_per_tok=2, **TOKENS)  # fmt: skip
"""Inkling 2's small layers: h 128, 4 heads of 32, V 2048 (a head of 2000 rows); layer 0 local (a window of 64, one
KV head), layer 1 global (two KV heads, dynamic K and V convolutions, relative logits over 96 distances), each an
MoE of 4 experts of 64 top-2 with softcapped SwiGLUs; sinks, gated outputs, clipped Q, K and relative states; layer
0 opens the one block of attention residuals, layer 1's attention reads it with three queries."""
INKLING2: dict[str, tuple[type[PretrainedConfig], dict[str, Any], str]] = {
    "inkling2-small": (T.Inkling2TextConfig, INKLING2_SMALL, "small Inkling 2: dynamic convolutions, block residuals"),
    "inkling2-wide": (T.Inkling2TextConfig, INKLING2_SMALL | {"vocab_size": 256, "unpadded_vocab_size": 250,
                                                            "hidden_size": 512, "num_attention_heads": 8,
                                                            "num_key_value_heads": 4, "swa_num_attention_heads": 8,
                                                            "swa_num_key_value_heads": 2, "head_dim": 64,
                                                            "swa_head_dim": 64, "moe_intermediate_size": 256,
                                                            "n_layers_per_attn_res_block": 1},
                      "Inkling 2 with h 512 and V 250, both layers opening a block: a layer's backward binds"),
}  # fmt: skip
"""Inkling 2 (``engine.memory.inkling2``): Inkling's convolutions, dynamic in the global layers, sinks, clips, a gated
output, block attention residuals and softcapped experts summed in fp32."""
INKLING2_LOOP_SMALL = INKLING2_SMALL | dict(num_hidden_layers=5, layer_types=["hybrid_sliding", "hybrid"] * 2
                                            + ["hybrid_sliding"], n_layers_per_attn_res_block=2,
                                            loop_layer_index_start=2, loop_layer_index_end=4, loop_num_passes=2,
                                            loop_gate_rank=16)  # fmt: skip
"""Inkling 2's looped model at the small layers in blocks of two: layers 0 (local) and 1 (global), a looped section of
layers 2 (local, opening the second block) and 3 (global) run twice, the second pass reading the first's messages
through four gates of rank 16, then layer 4 (local, opening the third block)."""
INKLING2_LOOP: dict[str, tuple[type[PretrainedConfig], dict[str, Any], str]] = {
    "inkling2-loop-small": (T.Inkling2LoopTextConfig, INKLING2_LOOP_SMALL,
                            "small looped Inkling 2: a section of two layers run twice, messages between passes"),
}  # fmt: skip
CASES |= {name: Case(name, cls, kwargs, source, attentions=EAGER_ONLY)
          for name, (cls, kwargs, source) in INKLING2_LOOP.items()}  # fmt: skip
CASES |= {name: Case(name, cls, kwargs, source, attentions=EAGER_ONLY)
          for name, (cls, kwargs, source) in INKLING2.items()}  # fmt: skip

ZAYA_SMALL = dict(vocab_size=2048, hidden_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                  num_hidden_layers=LAYERS, num_experts=4, moe_intermediate_size=256, router_hidden_size=64,
                  tie_word_embeddings=False, **TOKENS)  # fmt: skip
"""ZAYA's small layers: h 128, 4 heads of 32 over 2 KV heads, CCA's two convolutions of 2 taps over 192 channels,
every layer an MoE of 4 experts of 256 (top 1, and the skip class) behind an MLP router of 64, V 2048, two layers."""
ZAYA: dict[str, tuple[type[PretrainedConfig], dict[str, Any], str]] = {
    "zaya-small": (T.ZayaConfig, ZAYA_SMALL, "small ZAYA: CCA attention, GQA 4/2, 4 experts top 1, a router of 64"),
    "zaya-mha": (T.ZayaConfig, ZAYA_SMALL | {"num_key_value_heads": 4, "cca_time0": 3, "cca_time1": 4},
                 "small ZAYA without GQA, convolutions of 3 and 4 taps"),
    "zaya-wide": (T.ZayaConfig, ZAYA_SMALL | {"vocab_size": 256, "hidden_size": 512, "num_attention_heads": 8,
                                              "head_dim": 64, "moe_intermediate_size": 512, "router_hidden_size": 128},
                  "ZAYA with h 512 and V 256: a layer's backward outweighs the loss's"),
}  # fmt: skip
"""ZAYA (``engine.memory.cca``): CCA attention, its fp32 residual stream with scales, its MLP router."""
CASES |= {name: Case(name, cls, kwargs, source) for name, (cls, kwargs, source) in ZAYA.items()}

DOTS3_SMALL = dict(vocab_size=2048, hidden_size=128, intermediate_size=384, num_hidden_layers=3,
                   num_attention_heads=4, num_key_value_heads=4, q_lora_rank=64, kv_lora_rank=32, head_dim=32,
                   qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=32, index_n_heads=4, index_head_dim=32,
                   index_topk=64, sliding_window=64, n_routed_experts=4, n_shared_experts=1, moe_intermediate_size=64,
                   shared_experts_intermediate_size=64, num_experts_per_tok=2,
                   layer_types=["indexed_attention", "sliding_attention", "indexed_attention"],
                   swa_num_attention_heads=2, swa_num_key_value_heads=2, swa_q_lora_rank=48, swa_kv_lora_rank=64,
                   swa_head_dim=48, swa_qk_nope_head_dim=40, swa_v_head_dim=48, tie_word_embeddings=False,
                   **TOKENS)  # fmt: skip
"""dots.3 Note's small layers: h 128, V 2048, three layers (indexed, sliding, indexed; the first dense, the others 4
experts of 64 top-2 and a shared one of 64). The indexed layers' MLA: 4 heads, r_q 64, r_kv 32, keys 16 + 16 RoPE,
values 32, an indexer of 4 heads of 32 picking 64 keys; the sliding layers' (a window of 64): 2 heads, r_q 48, r_kv
64, keys 40 + 8 RoPE, values 48. Each kind's keys as wide as its values (SDPA's fused kernel on the CPU, which
runs its math kernel in fp32 otherwise); the window and the top k shorter than the measured sequences."""
DOTS3: dict[str, tuple[type[PretrainedConfig], dict[str, Any], str]] = {
    "dots3-small": (T.Dots3NoteTextConfig, DOTS3_SMALL,
                    "small dots.3 Note: MLA of two widths, a norm on the RoPE key, a gate a head, an indexer"),
    "dots3-wide": (T.Dots3NoteTextConfig, DOTS3_SMALL | {"vocab_size": 256, "hidden_size": 512,
                                                        "num_attention_heads": 8, "num_key_value_heads": 8,
                                                        "swa_num_attention_heads": 4, "swa_num_key_value_heads": 4,
                                                        "intermediate_size": 1024, "moe_intermediate_size": 256,
                                                        "shared_experts_intermediate_size": 256},
                   "dots.3 Note with h 512 and V 256: a layer's backward outweighs the loss's"),
}  # fmt: skip
"""dots.3 Note (``engine.memory.dots_mla``): DeepSeek-V3.2's MLA and MoE, its sliding layers at widths of their own."""
CASES |= {name: Case(name, cls, kwargs, source) for name, (cls, kwargs, source) in DOTS3.items()}

GIT_SMALL = dict(vocab_size=2048, hidden_size=128, intermediate_size=384, num_attention_heads=4,
                 num_hidden_layers=LAYERS, vision_config=dict(hidden_size=64, intermediate_size=256,
                                                              num_hidden_layers=LAYERS, num_attention_heads=2,
                                                              image_size=32, patch_size=8),
                 **TOKENS)  # fmt: skip
"""GIT's small decoder: h 128, 4 heads of 32, a GELU MLP of 384, V 2048, two layers, dropout 0.1 (the class's); its
CLIP image encoder two layers of 64 (2 heads, MLP 256, quick GELU) over a 32-pixel image in patches of 8: 17 tokens
(16 patches and the class token) before the text's."""
GIT: dict[str, tuple[type[PretrainedConfig], dict[str, Any], str]] = {
    "git-small": (T.GitConfig, GIT_SMALL, "small GIT: a 17-token image before the text"),
    "git-wide": (T.GitConfig, GIT_SMALL | {"vocab_size": 256, "hidden_size": 512, "num_attention_heads": 8,
                                           "intermediate_size": 1024,
                                           "vision_config": GIT_SMALL["vision_config"] | {"image_size": 64}},
                 "GIT with h 512 and V 256, a 65-token image: the layers' backward outweighs the loss's"),
}  # fmt: skip
"""GIT (``engine.memory.image_prefix``): its own eager attention over the image's tokens and the text, the image
encoder trained with it; each step reads one image a sequence (``Case.images``)."""
CASES |= {name: Case(name, cls, kwargs, source, attentions=EAGER_ONLY, images=True)
          for name, (cls, kwargs, source) in GIT.items()}  # fmt: skip

CPMANT_SMALL = dict(vocab_size=2048, hidden_size=128, num_attention_heads=4, dim_head=32, dim_ff=384,
                    num_hidden_layers=LAYERS, prompt_types=4, prompt_length=32, segment_types=4)  # fmt: skip
"""CPM-Ant's small layers: h 128, 4 heads of 32, a GeGLU of 384, V 2048, two layers; 32 prompt tokens before every
sequence (the class default), from 4 prompts' rows, and 4 segments (a sequence's tokens are segment 2)."""
CPMANT: dict[str, tuple[type[PretrainedConfig], dict[str, Any], str]] = {
    "cpmant-small": (T.CpmAntConfig, CPMANT_SMALL, "small CPM-Ant: 32 prompt tokens, a learned score bias"),
    "cpmant-wide": (T.CpmAntConfig, CPMANT_SMALL | {"vocab_size": 256, "hidden_size": 512, "num_attention_heads": 8,
                                                    "dim_head": 64, "dim_ff": 1024},
                    "CPM-Ant with h 512 and V 256: a layer's backward outweighs the loss's"),
}  # fmt: skip
"""CPM-Ant (``engine.memory.prompt_prefix``): its own eager attention over the prompt and the text, a score bias
shared by the layers; transformers gives it no SDPA."""


def checkpointable_blocks(model: torch.nn.Module) -> None:
    """CPM-Ant's blocks made GradientCheckpointingLayers, which transformers 5.24's CpmAntTransformerBlock is not
    (CpmAntPreTrainedModel leaves supports_gradient_checkpointing False, so gradient_checkpointing_enable refuses
    it): each block's forward then runs under transformers' own checkpoint wrapper, as in the models that have it,
    its hidden state, mask and bias passed by position. What a checkpoint around each block keeps, not what
    transformers runs."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    blocks = model.base_model.encoder.layers
    checkpointed = type(f"Checkpointed{type(blocks[0]).__name__}", (GradientCheckpointingLayer, type(blocks[0])), {})
    for block in blocks:
        block.__class__ = checkpointed
    model.supports_gradient_checkpointing = True


CASES |= {name: Case(name, cls, kwargs, source, attentions=EAGER_ONLY, routing=checkpointable_blocks)
          for name, (cls, kwargs, source) in CPMANT.items()}  # fmt: skip

BLT_SMALL = dict(vocab_size=260, cross_attn_k=2, local_attention_window_len=WINDOW, encoder_hash_byte_group_size=[3, 4],
                 encoder_hash_byte_group_vocab=512,
                 encoder_config=dict(hidden_size=128, num_attention_heads=4, num_hidden_layers=1,
                                     intermediate_size=384, cross_attn_k=2),
                 decoder_config=dict(hidden_size=128, num_attention_heads=4, num_hidden_layers=LAYERS,
                                     intermediate_size=384, hidden_size_global=256, cross_attn_k=2),
                 global_config=dict(hidden_size=256, num_attention_heads=4, num_hidden_layers=LAYERS,
                                    intermediate_size=512),
                 patcher_config=dict(hidden_size=64, num_attention_heads=2, num_hidden_layers=1,
                                     intermediate_size=128))  # fmt: skip
"""BLT's small stacks: the local encoder one layer of 128 (4 heads, a SwiGLU of 384) and its cross-attention, the
global transformer two layers of 256 over the patches (k = 2 a patch, so no projection), the local decoder two layers
of 128, each after a cross-attention; the bytes' window 64, two hash tables of 512 rows (3- and 4-byte groups); the
frozen entropy model one layer of 64. Untrained, it finds every byte's next byte uncertain: s + 1 patches."""
BLT: dict[str, tuple[type[PretrainedConfig], dict[str, Any], str]] = {
    "blt-small": (T.BltConfig, BLT_SMALL, "small BLT: a byte encoder and decoder around a global transformer"),
    "blt-wide": (
        T.BltConfig,
        BLT_SMALL
        | {
            "encoder_config": BLT_SMALL["encoder_config"]
            | {"hidden_size": 512, "num_attention_heads": 8, "intermediate_size": 1024},
            "decoder_config": BLT_SMALL["decoder_config"]
            | {"hidden_size": 512, "num_attention_heads": 8, "intermediate_size": 1024, "hidden_size_global": 1024},
            "global_config": BLT_SMALL["global_config"]
            | {"hidden_size": 1024, "num_attention_heads": 8, "intermediate_size": 2048},
        },
        "BLT with bytes 512 wide and patches 1,024: its layers outweigh its cross-attention",
    ),
}
"""BLT (``engine.memory.byte_latent``): its stacks over the bytes and the patches, the cross-attention between them."""
CASES |= {name: Case(name, cls, kwargs, source) for name, (cls, kwargs, source) in BLT.items()}

# Records
# --------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Kept:
    """One distinct storage kept for backward."""

    node: str  # the autograd node that keeps it (graph walk), or "<hook> torch-function" when the walk cannot name it
    attr: str  # the node attribute (``_saved_self``, ``saved_tensors[0]`` ...) or "" for hook-only tensors
    module: str  # the module whose forward was running when it was first packed ("model.layers.0.mlp" ...)
    shape: tuple[int, ...]
    dtype: str  # "bfloat16", "float32", "int64" ...
    bytes: int  # the whole storage's size (a view keeps its whole storage alive)
    note: str = ""  # "shared by layers 0,1", "layer input", "view of a larger storage" ...

    @property
    def scope(self) -> str:
        """``layer`` for tensors packed inside a decoder layer, else the outside module (embed, norm, lm_head, loss)."""
        return "layer" if _layer_index(self.module) is not None else (self.module or "loss (top-level forward)")


@dataclass
class Measurement:
    case: str
    attention: str
    seq_len: int
    micro_batch: int
    checkpointing: bool
    dtype: str
    layers: int
    total_bytes: int  # hooks: distinct alive storages the forward keeps (parameters and buffers excluded)
    walk_bytes: int  # the graph walk's total (differs by wrapped Python scalars and, checkpointed, the frames)
    tensors: list[Kept]  # the breakdown: every distinct storage, named by the walk where it can
    per_layer_bytes: dict[int, int]  # hooks total attributed to each decoder layer (shared storages counted once)
    outside_bytes: int  # hooks total outside the decoder layers
    closure: list[Kept] = field(default_factory=list)  # held by checkpoint closures, not autograd (checkpointing)
    closure_bytes: int = 0
    rebuild: list[Kept] = field(default_factory=list)  # one decoder layer replayed standalone (checkpointing)
    rebuild_layer: int = 0  # which: the one whose replay adds the most
    rebuild_bytes: int = 0  # all it keeps
    rebuild_new_bytes: int = 0  # less what is already alive (its input, the shared cos/sin, masks)
    use_reentrant: bool | None = None  # the checkpoint kwarg transformers used (None without checkpointing)
    attn_nodes: list[str] = field(default_factory=list)  # the attention node names seen (which SDPA kernel ran)
    experts_implementation: str | None = None
    walk_notes: list[str] = field(default_factory=list)  # how the walk and the hooks differ, when they do
    seconds: float = 0.0

    @property
    def tokens(self) -> int:
        return self.seq_len * self.micro_batch


# --------------------------------------------------------------------------------------------------------------------
# Tracking what is packed
# --------------------------------------------------------------------------------------------------------------------


def _layer_index(module: str) -> int | None:
    parts = module.split(".")
    for i, part in enumerate(parts[:-1]):
        if part in ("layers", "h", "blocks") and parts[i + 1].isdigit():
            return int(parts[i + 1])
    return None


def _storage_key(t: torch.Tensor) -> tuple[int, int] | None:
    try:
        storage = t.untyped_storage()
    except (RuntimeError, NotImplementedError):
        return None
    if storage.nbytes() == 0:
        return None
    return storage.data_ptr(), storage.nbytes()


class _FunctionName(TorchFunctionMode):
    """Remembers the outermost torch function running, to name what the hooks see."""

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.stack.append(getattr(func, "__qualname__", None) or getattr(func, "__name__", str(func)))
        try:
            return func(*args, **(kwargs or {}))
        finally:
            self.stack.pop()


@dataclass
class _Packed:
    refs: list[weakref.ReferenceType]  # one per pack of the storage: it is kept while any of them lives
    key: tuple[int, int]
    shape: tuple[int, ...]
    dtype: str
    modules: list[str]
    function: str

    def alive(self) -> bool:
        return any(ref() is not None for ref in self.refs)


class _Recorder:
    """saved_tensors_hooks that record every packed tensor (weakly: what the graph frees does not count)."""

    def __init__(self, model: torch.nn.Module, exclude: set[int]) -> None:
        self.exclude = exclude  # storage pointers of parameters and buffers
        self.by_key: dict[tuple[int, int], _Packed] = {}
        self.module_stack: list[str] = []
        self.function = _FunctionName()
        self.handles: list[Any] = []
        for name, module in model.named_modules():
            self.handles.append(module.register_forward_pre_hook(functools.partial(self._enter, name)))
            self.handles.append(module.register_forward_hook(functools.partial(self._leave, name), always_call=True))

    def _enter(self, name: str, module: torch.nn.Module, args: Any) -> None:
        self.module_stack.append(self._scoped(name))

    def _leave(self, name: str, module: torch.nn.Module, args: Any, output: Any) -> None:
        if self.module_stack and self.module_stack[-1] == self._scoped(name, leaving=True):
            self.module_stack.pop()

    def _scoped(self, name: str, leaving: bool = False) -> str:
        """``name``, or where one module object sits in several places (OpenAI GPT's ACT_FNS gelu, one instance in
        every layer's MLP; named_modules names it once, at its first place) the place it runs in: its leaf name
        under the module that called it."""
        stack = self.module_stack[:-1] if leaving else self.module_stack
        parent = stack[-1] if stack else ""
        leaf = name.rsplit(".", 1)[-1]
        return f"{parent}.{leaf}" if parent and "." in name and not name.startswith(parent + ".") else name

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        """Record ``t`` and hand autograd a detached alias of it (same storage, no grad_fn): a saved output packed
        as itself would hold its own node (tensor -> grad_fn -> saved variable -> tensor), a cycle through C++
        that Python's collector cannot see, and every graph, with the parameters it reaches, would leak."""
        key = _storage_key(t)
        if key is None or key[0] in self.exclude:
            return t
        packed = t.detach()
        module = self.module_stack[-1] if self.module_stack else ""
        function = self.function.stack[-1] if self.function.stack else ""
        old = self.by_key.get(key)
        if old is not None and old.alive():
            old.refs.append(weakref.ref(packed))
            if module not in old.modules:
                old.modules.append(module)
        else:
            self.by_key[key] = _Packed([weakref.ref(packed)], key, tuple(t.shape), _dtype(t), [module], function)
        return packed

    @staticmethod
    def unpack(t: torch.Tensor) -> torch.Tensor:
        return t

    @contextlib.contextmanager
    def recording(self) -> Iterator[None]:
        with torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack), self.function:
            yield

    def alive(self) -> dict[tuple[int, int], _Packed]:
        return {k: p for k, p in self.by_key.items() if p.alive()}

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles.clear()


class _Fp32Products(TorchDispatchMode):
    """bf16 matrix products computed in fp32 and rounded once to bf16, below autograd.

    On a CPU without AVX-512 BF16 or AMX, torch's bf16 GEMM is 10-100 times slower than its fp32 one (a GPT-2-width
    forward: 18 s against 1.7 s). Autograd runs above this mode: it sees the same bf16 operands and results, so it
    saves the same tensors and the measurement is unchanged (``tests/test_hf_saved_products.py`` compares the two);
    a bf16 GEMM accumulates in fp32 and rounds once too, so the values differ at most in the last bit. Only the
    products' transient fp32 copies are new, which the saved-tensor count never sees (nor does
    ``hf_step_peak.StorageLog``, which makes them inside its own handler: ``fp32_product``)."""

    PRODUCTS = frozenset(
        (
            torch.ops.aten.mm.default,
            torch.ops.aten.addmm.default,
            torch.ops.aten.bmm.default,
            torch.ops.aten.baddbmm.default,
            torch.ops.aten._grouped_mm.default,  # the MoE experts' grouped_mm (offsets: int32, left alone)
        )
    )

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        return fp32_product(func, args, kwargs or {})


def fp32_product(func: Any, args: tuple, kwargs: dict) -> Any:
    """``func`` on ``args``: a bf16 matrix product (``_Fp32Products.PRODUCTS``) computed in fp32 and rounded once to
    bf16, any other operator as it is. Called inside a dispatch mode's handler, the fp32 copies it makes are not
    dispatched to that mode: a mode that logs each operator's output (``hf_step_peak.StorageLog``) sees the one bf16
    result the bf16 kernel returns, with its shape and strides, and nothing more."""
    floats = [a for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()]
    if (
        func in _Fp32Products.PRODUCTS
        and floats
        and all(t.dtype == torch.bfloat16 for t in floats)
        and not kwargs.get("out")
        and kwargs.get("out_dtype") in (None, torch.bfloat16)
    ):
        up = [a.float() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]
        kwargs = {k: v for k, v in kwargs.items() if k != "out_dtype"}
        return func(*up, **kwargs).to(torch.bfloat16)
    return func(*args, **kwargs)


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


# --------------------------------------------------------------------------------------------------------------------
# The graph walk
# --------------------------------------------------------------------------------------------------------------------


def _saved_of(node: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor a node keeps, with the attribute it lives in."""
    for attr in dir(node):
        if not attr.startswith("_saved_"):
            continue
        try:
            value = getattr(node, attr)
        except Exception:  # a freed or undefined saved variable
            continue
        if isinstance(value, torch.Tensor):
            yield attr, value
        elif isinstance(value, (tuple, list)):
            for i, item in enumerate(value):
                if isinstance(item, torch.Tensor):
                    yield f"{attr}[{i}]", item
    if hasattr(node, "saved_tensors"):  # custom autograd.Function / custom_op backward nodes
        try:
            values = node.saved_tensors
        except Exception:
            values = ()
        for i, item in enumerate(values or ()):
            if isinstance(item, torch.Tensor):
                yield f"saved_tensors[{i}]", item


def _walk(root: Any, skip: set[Any]) -> tuple[dict[tuple[int, int], tuple[str, str, torch.Tensor]], set[str]]:
    """Storage key -> (node name, attribute, tensor) over the graph below ``root``; nodes in ``skip`` are crossed
    without reading what they keep (checkpointed layers: reading would replay them)."""
    found: dict[tuple[int, int], tuple[str, str, torch.Tensor]] = {}
    names: set[str] = set()
    seen: set[Any] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        names.add(node.name())
        if node not in skip:
            for attr, t in _saved_of(node):
                key = _storage_key(t)
                if key is not None and key not in found:
                    found[key] = (node.name(), attr, t)
        for next_node, _ in node.next_functions:
            if next_node is not None and next_node not in seen:
                stack.append(next_node)
    return found, names


# --------------------------------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------------------------------

_MODEL_CACHE: dict[tuple, torch.nn.Module] = {}


def build_model(
    case_name: str,
    attention: str,
    dtype: torch.dtype = torch.bfloat16,
    dropout: float | None = None,
    experts_implementation: str | None = None,
) -> torch.nn.Module:
    """The case's model with random weights (see ``_fill_weights``), train mode. The last one built is reused."""
    case = CASES[case_name]
    key = (case_name, str(dtype), dropout, experts_implementation)
    model = _MODEL_CACHE.get(key)
    if model is None:
        release_models()  # the previous one, before building the next
        torch.manual_seed(0)
        config = case.config(dropout)
        kwargs: dict[str, Any] = {"attn_implementation": attention, "dtype": dtype}
        if experts_implementation is not None:
            kwargs["experts_implementation"] = experts_implementation
        with no_init_weights():  # transformers' own init draws every weight one by one: 10-20 s at real width
            model = AutoModelForCausalLM.from_config(config, **kwargs)
        _fill_weights(model)
        if case.routing is not None:
            case.routing(model)
        model.tie_weights()  # init_weights, skipped above, is what ties GPT-2's head to its embedding
        _MODEL_CACHE[key] = model
    model.set_attn_implementation(attention)
    assert model.config._attn_implementation == attention, model.config._attn_implementation
    model.train()
    return model


def release_models() -> None:
    """Free the model ``build_model`` keeps (up to a few GB at real width)."""
    _MODEL_CACHE.clear()
    gc.collect()  # a model sits in reference cycles


_TILE = 1 << 20  # elements of the random block that the large weights repeat


@torch.no_grad()
def _fill_weights(model: torch.nn.Module) -> None:
    """Cheap random weights: N(0, 0.02) for every matrix up to ``_TILE`` elements (the MoE router among them, whose
    values decide how tokens spread over the experts), one random block of ``_TILE`` elements repeated through the
    larger ones (what is saved for backward does not depend on their values), norm weights 1 and biases 0."""
    block = torch.randn(_TILE) * 0.02
    for name, p in model.named_parameters():
        if p.dim() == 1:
            p.fill_(1.0 if name.endswith("weight") and ("norm" in name or "ln_" in name) else 0.0)
        elif p.numel() <= _TILE:
            p.normal_(0.0, 0.02)
        else:
            flat = p.view(-1)
            whole = flat.numel() // _TILE * _TILE
            flat[:whole].view(-1, _TILE).copy_(block.to(p.dtype).expand(whole // _TILE, _TILE))
            flat[whole:].copy_(block[: flat.numel() - whole])


class PinnedStorages(set):
    """Storage pointers, with the storages held alive. A pointer alone names a storage only while it lives: a module
    that replaces a buffer in its forward (CTRL casts ``pos_encoding`` to the input's dtype) frees the old one, and a
    tensor allocated later at that address passed for the buffer. One CI run lost the loss's 1 MiB log-probabilities
    that way."""

    def __init__(self, tensors: Iterable[torch.Tensor]) -> None:
        self.storages = [t.untyped_storage() for t in tensors]
        super().__init__(s.data_ptr() for s in self.storages)


def _exclude(model: torch.nn.Module) -> PinnedStorages:
    """The parameters' and buffers' storages, as they are before the forward."""
    return PinnedStorages([*model.parameters(), *model.buffers()])


def _decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    base = model.base_model  # .model, .transformer (GPT-2, Falcon, MPT, DBRX), .gpt_neox, or OPT's .model.decoder
    base = getattr(base, "decoder", base)
    if base is model:  # Llama4ForCausalLM is its own base model (its base_model_prefix names no module): its .model
        base = model.model
    if hasattr(base, "L_module"):  # HRM: its low- and high-level stacks, each run several times a forward
        return [*base.L_module.layers, *base.H_module.layers]
    if hasattr(base, "position_bias"):  # CPM-Ant: CpmAntEncoder's blocks
        base = base.encoder
    if hasattr(base, "image_encoder"):  # GIT: GitEncoder's layers, not its image encoder's
        return list(base.encoder.layer)
    if hasattr(base, "global_transformer"):  # BLT: its encoder's, global transformer's and decoder's, not the patcher's
        return [*base.local_encoder.layers, *base.global_transformer.layers, *base.local_decoder.layers]
    return list(next(getattr(base, name) for name in ("layers", "h", "blocks") if hasattr(base, name)))


def _tensors_in(obj: Any) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (tuple, list)):
        for item in obj:
            yield from _tensors_in(item)
    elif isinstance(obj, Mapping):  # a dict, or Gemma 4's KVSharingDict (a UserDict) of the layers' shared K and V
        for item in obj.values():
            yield from _tensors_in(item)


@contextlib.contextmanager
def _watch_checkpoints(
    layers: list[torch.nn.Module], internal: set[Any], closure: dict, inputs: dict
) -> Iterator[None]:
    """Wrap each layer's checkpoint function: note the nodes created inside (not to be read by the walk), the
    tensors its closure holds (the partial's keyword arguments) and the positional inputs checkpoint saves."""
    originals = []
    for index, layer in enumerate(layers):
        original = layer._gradient_checkpointing_func
        originals.append((layer, original))

        def wrapped(function: Callable, *args: Any, _original: Callable = original, _index: int = index) -> Any:
            for t in _tensors_in(getattr(function, "keywords", {})):
                key = _storage_key(t)
                if key is not None:
                    closure.setdefault(key, (t, _index))
            for t in _tensors_in(args):
                key = _storage_key(t)
                if key is not None:
                    inputs.setdefault(key, _index)
            out = _original(function, *args)
            stop = {t.grad_fn for t in _tensors_in(args) if t.grad_fn is not None}
            stack = [t.grad_fn for t in _tensors_in(out) if t.grad_fn is not None]
            while stack:
                node = stack.pop()
                if node in internal or node in stop:
                    continue
                internal.add(node)
                stack.extend(n for n, _ in node.next_functions if n is not None)
            return out

        layer._gradient_checkpointing_func = wrapped
    try:
        yield
    finally:
        for layer, original in originals:
            layer._gradient_checkpointing_func = original


def _enable_checkpointing(model: torch.nn.Module) -> bool:
    """Transformers' default checkpointing; returns the ``use_reentrant`` it chose."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # gradient_checkpointing_enable is a deprecated alias in 5.x
        model.gradient_checkpointing_enable()
    func = _decoder_layers(model)[0]._gradient_checkpointing_func
    return bool(func.keywords.get("use_reentrant", True))


def _disable_checkpointing(model: torch.nn.Module) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # gradient_checkpointing_disable is a deprecated alias in 5.x
        model.gradient_checkpointing_disable()
    for layer in _decoder_layers(model):
        layer.gradient_checkpointing = False


# --------------------------------------------------------------------------------------------------------------------
# Measuring
# --------------------------------------------------------------------------------------------------------------------


def image_inputs(case: Case, model: torch.nn.Module, micro_batch: int) -> dict[str, torch.Tensor]:
    """An image a sequence where the case reads one (GIT): ``pixel_values`` in fp32, as an image processor makes
    them, at the vision config's size."""
    if not case.images:
        return {}
    vision = model.config.vision_config
    generator = torch.Generator().manual_seed(3)
    shape = (micro_batch, vision.num_channels, vision.image_size, vision.image_size)
    return {"pixel_values": torch.randn(shape, generator=generator)}


def measure(
    case_name: str,
    attention: str,
    seq_len: int,
    micro_batch: int,
    checkpointing: bool,
    dtype: torch.dtype = torch.bfloat16,
    dropout: float | None = None,
    experts_implementation: str | None = None,
    num_items_in_batch: bool = False,
    use_cache: bool | None = None,
    lora: dict[str, Any] | None = None,
    fp32_adapters: bool = False,
    fp32_products: bool = True,
) -> Measurement:
    """What the forward (and the loss) keep for backward; with checkpointing also one rebuilt layer.

    ``dropout`` sets gpt2's resid/embd/attn dropout (None: its default 0.1; the other archs have none on).
    ``num_items_in_batch`` passes the token count as Trainer does when it knows it (loss reduction "sum" then a
    division; the saved set does not change). ``use_cache`` is passed to the model when not None; left None the
    config's default applies, as under Trainer (True for every case here: without checkpointing a DynamicCache is
    built in training too, and its torch.cat copies of K/V are what attention then saves). ``lora``: PEFT
    ``LoraConfig`` keyword arguments; the model is then built afresh, its adapters injected in place
    (``peft.inject_adapter_in_model``, in the model's dtype) and every other weight frozen, as ``get_peft_model``
    leaves it; with ``fp32_adapters`` the adapters stay fp32 (PEFT's default, ``autocast_adapter_dtype``) and the
    forward runs under ``torch.autocast`` in the model's dtype, as ``Trainer`` runs it with ``bf16=True``.
    ``fp32_products``: bf16 matrix products computed in fp32 below autograd (:class:`_Fp32Products`; the same tensors
    are kept, many times faster on a CPU without native bf16)."""
    if attention not in ("sdpa", "eager"):
        raise ValueError(f"attention must be 'sdpa' or 'eager', not {attention!r}")
    start = time.perf_counter()
    case = CASES[case_name]
    model = build_model(case_name, attention, dtype, dropout, experts_implementation)
    if lora is not None:
        model = _with_lora(model, lora, fp32_adapters)
    layers = _decoder_layers(model)
    use_reentrant = _enable_checkpointing(model) if checkpointing else None
    if not checkpointing:
        _disable_checkpointing(model)

    vocab = getattr(model.config, "unpadded_vocab_size", None) or model.config.vocab_size  # Inkling 2's head rows
    generator = torch.Generator().manual_seed(1)
    input_ids = torch.randint(0, vocab, (micro_batch, seq_len), generator=generator)
    kwargs: dict[str, Any] = {"input_ids": input_ids, "labels": input_ids} | image_inputs(case, model, micro_batch)
    if num_items_in_batch:
        kwargs["num_items_in_batch"] = torch.tensor(micro_batch * (seq_len - 1))
    if use_cache is not None:
        kwargs["use_cache"] = use_cache

    captured: dict[int, dict[str, Any]] = defaultdict(dict)  # each layer's arguments, for its replay

    def capture(index: int, module: torch.nn.Module, args: tuple, kw: dict) -> None:
        if "args" not in captured[index]:
            captured[index]["args"], captured[index]["kwargs"] = args, dict(kw)

    exclude = _exclude(model)
    recorder = _Recorder(model, exclude)
    internal: set[Any] = set()
    closure: dict = {}
    ckpt_inputs: dict = {}
    hooks = [
        layer.register_forward_pre_hook(functools.partial(capture, index), with_kwargs=True)
        for index, layer in enumerate(layers)
    ]
    try:
        with contextlib.ExitStack() as stack:
            if checkpointing:
                stack.enter_context(_watch_checkpoints(layers, internal, closure, ckpt_inputs))
            stack.enter_context(recorder.recording())
            if fp32_products:
                stack.enter_context(_Fp32Products())
            if fp32_adapters:
                stack.enter_context(torch.autocast("cpu", dtype=dtype))
            torch.manual_seed(2)
            out = model(**kwargs)
            loss = out.loss
        del out  # Trainer keeps only the loss through backward
        alive = recorder.alive()
        walked, node_names = _walk(loss.grad_fn, internal)
    finally:
        for handle in hooks:
            handle.remove()
        recorder.close()

    # ---- assemble the breakdown: the walk names what it reaches, the hooks fill in the rest ----
    tensors: list[Kept] = []
    per_layer: dict[int, int] = defaultdict(int)
    outside = 0
    notes: list[str] = []
    for key, packed in alive.items():
        modules = packed.modules
        layer_ids = sorted({i for m in modules if (i := _layer_index(m)) is not None})
        note_parts = []
        if len(layer_ids) > 1:
            note_parts.append("shared by layers " + ",".join(map(str, layer_ids)))
        if key in ckpt_inputs:
            note_parts.append(f"checkpoint input of layer {ckpt_inputs[key]}")
        if key in walked:
            node, attr, t = walked[key]
            shape, dt = tuple(t.shape), _dtype(t)
        else:
            node, attr = f"<hook> {packed.function or '?'}", ""
            shape, dt = packed.shape, packed.dtype
            if key in ckpt_inputs:
                node = "<checkpoint frame> saved input"
        if math.prod(shape) * _itemsize(dt) < key[1]:
            note_parts.append("view of a larger storage")
        first = modules[0]
        kept = Kept(node, attr, first, shape, dt, key[1], "; ".join(note_parts))
        tensors.append(kept)
        index = _layer_index(first)
        if index is None:
            outside += key[1]
        else:
            per_layer[index] += key[1]
    walk_bytes = sum(k[1] for k in walked if k[0] not in exclude)
    missing = [k for k in walked if k not in alive and k[0] not in exclude]
    scalars = [k for k in missing if walked[k][2].dim() == 0 and walked[k][2].dtype == torch.float64]
    if scalars:  # ``x * 0.5``: autograd keeps the wrapped Python number without calling the pack hook
        notes.append(f"{len(scalars)} wrapped Python scalar(s) (0-dim float64, 8 B each) seen by the walk only")
    for key in missing:
        if key in scalars:
            continue
        node, attr, t = walked[key]
        notes.append(f"walk-only {node}.{attr} {tuple(t.shape)} {_dtype(t)} {key[1]} B (not packed through the hooks)")
    hook_only = [k for k in alive if k not in walked]
    if hook_only:
        b = sum(k[1] for k in hook_only)
        notes.append(f"{len(hook_only)} storage(s), {b} B, seen by the hooks only (checkpoint frames / replay-only)")
    tensors.sort(key=lambda k: (_layer_index(k.module) if _layer_index(k.module) is not None else 10**6, -k.bytes))

    attn_nodes = sorted(n for n in node_names if "Attention" in n or "Softmax" in n or "Bmm" in n)

    m = Measurement(
        case=case.name,
        attention=attention,
        seq_len=seq_len,
        micro_batch=micro_batch,
        checkpointing=checkpointing,
        dtype=str(dtype).removeprefix("torch."),
        layers=len(layers),
        total_bytes=sum(k[1] for k in alive),
        walk_bytes=walk_bytes,
        tensors=tensors,
        per_layer_bytes=dict(per_layer),
        outside_bytes=outside,
        use_reentrant=use_reentrant,
        attn_nodes=attn_nodes,
        experts_implementation=_experts_implementation(model),
        walk_notes=notes,
    )

    if checkpointing:
        for key, (t, index) in closure.items():
            if key[0] in exclude:
                continue
            m.closure.append(
                Kept("<checkpoint closure>", f"layer {index} kwarg", "", tuple(t.shape), _dtype(t), key[1])
            )
        m.closure_bytes = sum(k.bytes for k in m.closure)
        del loss
        # the checkpoint replays a layer under the autocast state of its forward (torch.utils.checkpoint)
        with contextlib.ExitStack() as stack:
            if fp32_products:
                stack.enter_context(_Fp32Products())
            if fp32_adapters:
                stack.enter_context(torch.autocast("cpu", dtype=dtype))
            for index, layer in enumerate(layers):
                if index not in captured:  # a layer the forward skipped (Mllama's cross-attention on text alone)
                    continue
                kept, kept_bytes, new_bytes = _rebuild_layer(model, layer, captured[index], exclude)
                if index == 0 or new_bytes > m.rebuild_new_bytes:
                    m.rebuild, m.rebuild_bytes, m.rebuild_new_bytes = kept, kept_bytes, new_bytes
                    m.rebuild_layer = index
    m.seconds = time.perf_counter() - start
    return m


def _with_lora(model: torch.nn.Module, lora: dict[str, Any], fp32_adapters: bool = False) -> torch.nn.Module:
    """The model with PEFT's LoRA adapters injected and only they trained, in the model's dtype or in fp32; the
    cached model is dropped, since the adapters change it in place."""
    import peft  # only the LoRA cases need it

    _MODEL_CACHE.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = peft.inject_adapter_in_model(peft.LoraConfig(**lora), model)
    dtype = torch.float32 if fp32_adapters else model.get_input_embeddings().weight.dtype
    for name, p in model.named_parameters():
        p.requires_grad_("lora_" in name)
        if "lora_" in name:
            p.data = p.data.to(dtype)
    return model


def _experts_implementation(model: torch.nn.Module) -> str | None:
    """The experts implementation the MoE blocks dispatch to (None for dense models)."""
    if not any(type(m).__name__.endswith("Experts") for m in model.modules()):
        return None
    return model.config._experts_implementation


def _itemsize(dtype: str) -> int:
    return torch.empty((), dtype=getattr(torch, dtype)).element_size()


def _rebuild_layer(
    model: torch.nn.Module, layer: torch.nn.Module, captured: dict, exclude: set[int]
) -> tuple[list[Kept], int, int]:
    """A layer's forward, standalone, on a leaf copy of its input and the keyword arguments the model passed it."""
    args = list(captured["args"])
    kwargs = dict(captured["kwargs"])
    hidden = args[0].detach().clone().requires_grad_(True)
    args[0] = hidden
    for name in ("cache", "past_key_values", "layer_past"):
        if name in kwargs:
            kwargs[name] = None
    parameters = inspect.signature(layer.forward).parameters
    positional = list(parameters)[: len(args)]
    for i, name in enumerate(positional):  # RecurrentGemma's layers take use_cache and cache by position
        if name in ("use_cache", "cache"):
            args[i] = False if name == "use_cache" else None
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    if "use_cache" not in positional and ("use_cache" in parameters or takes_any):  # xLSTMBlock takes x, state alone
        kwargs["use_cache"] = False
    already = {k for t in _tensors_in((args, kwargs)) if (k := _storage_key(t)) is not None}
    recorder = _Recorder(model, exclude)
    flag = layer.gradient_checkpointing
    layer.gradient_checkpointing = False
    try:
        with recorder.recording():
            torch.manual_seed(3)
            out = layer(*args, **kwargs)
        out_t = next(_tensors_in(out))
        alive = recorder.alive()
        walked, _ = _walk(out_t.grad_fn, set())
    finally:
        layer.gradient_checkpointing = flag
        recorder.close()
    kept = []
    new = 0
    for key, packed in alive.items():
        if key in walked:
            node, attr, t = walked[key]
            shape, dt = tuple(t.shape), _dtype(t)
        else:
            node, attr, shape, dt = f"<hook> {packed.function}", "", packed.shape, packed.dtype
        note = ""
        if key == _storage_key(hidden):
            note = "layer input (already kept by the checkpoint)"
        elif key in already:
            note = "layer kwarg (already alive: shared cos/sin, mask, ids)"
        else:
            new += key[1]
        if math.prod(shape) * _itemsize(dt) < key[1]:
            note = "; ".join(filter(None, [note, "view of a larger storage"]))
        kept.append(Kept(node, attr, packed.modules[0], shape, dt, key[1], note))
    kept.sort(key=lambda k: -k.bytes)
    total = sum(k.bytes for k in kept)
    del out, out_t
    return kept, total, new


# --------------------------------------------------------------------------------------------------------------------
# Printing
# --------------------------------------------------------------------------------------------------------------------

GRID = [(128, 1), (128, 2), (256, 1), (256, 2)]


def _group(m: Measurement, items: list[Kept] | None = None) -> dict[tuple[str, str, str], int]:
    """Bytes by (scope, node, dtype); layer tensors are summed over layers."""
    out: dict[tuple[str, str, str], int] = defaultdict(int)
    for k in m.tensors if items is None else items:
        node = k.node + (f".{k.attr}" if k.attr and k.node.startswith(("_", "<")) else "")
        out[(k.scope, node, k.dtype)] += k.bytes
    return out


def _table(title: str, runs: list[Measurement], groups: list[dict[tuple[str, str, str], int]], per_layer: bool) -> None:
    rows = sorted({r for g in groups for r in g}, key=lambda r: (r[0] != "layer", r[0], r[1], r[2]))
    print(title)
    head = " ".join(f"{f's={m.seq_len},b={m.micro_batch}':>14}" for m in runs)
    unit = "B/tok/layer" if per_layer else "B/token"
    print(f"  {'scope':<28} {'node':<44} {'dtype':<9} {head} {unit + ' (last)':>18}")
    for r in rows:
        values = [g.get(r, 0) for g in groups]
        last = runs[-1]
        denom = last.tokens * (last.layers if (per_layer and r[0] == "layer") else 1)
        cells = " ".join(f"{v:>14,}" for v in values)
        print(f"  {r[0][:28]:<28} {r[1][:44]:<44} {r[2]:<9} {cells} {values[-1] / denom:>18.2f}")


def report(case_name: str, attention: str, checkpointing: bool, grid: list[tuple[int, int]], **kw: Any) -> None:
    runs = [measure(case_name, attention, s, b, checkpointing, **kw) for s, b in grid]
    last = runs[-1]
    ckpt = f"on (use_reentrant={last.use_reentrant})" if checkpointing else "off"
    experts = f" | experts={last.experts_implementation}" if last.experts_implementation else ""
    title = (
        f"\n=== {case_name} | {attention} | checkpointing={ckpt}{experts}"
        f" | attention nodes: {', '.join(last.attn_nodes) or '-'}"
    )
    _table(title, runs, [_group(m) for m in runs], per_layer=True)
    for m in runs:
        layer_each = ", ".join(f"L{i}={b:,}" for i, b in sorted(m.per_layer_bytes.items()))
        line = (
            f"  s={m.seq_len},b={m.micro_batch}: forward keeps {m.total_bytes:,} B (walk {m.walk_bytes:,})"
            f" = layers [{layer_each}] + outside {m.outside_bytes:,}"
        )
        if checkpointing:
            line += (
                f"; checkpoint closures {m.closure_bytes:,}; rebuilt layer {m.rebuild_bytes:,}"
                f" (new {m.rebuild_new_bytes:,}); peak = {m.total_bytes + m.closure_bytes + m.rebuild_new_bytes:,}"
            )
        print(line + f"  [{m.seconds:.1f}s]")
        for note in m.walk_notes:
            print(f"      note: {note}")
    if checkpointing:
        groups = []
        for m in runs:
            g: dict[tuple[str, str, str], int] = defaultdict(int)
            for k in m.rebuild:
                scope = "rebuilt layer" + (" (already alive)" if "already" in k.note else "")
                g[(scope, k.node, k.dtype)] += k.bytes
            groups.append(g)
        print(f"  rebuilt layer {last.rebuild_layer} (standalone replay, the largest):")
        _table("", runs, groups, per_layer=False)


def print_tensors(m: Measurement, limit: int | None = None) -> None:
    """Every kept storage, one a line."""
    for k in m.tensors[:limit]:
        print(f"  {k.module:<34} {k.node + '.' + k.attr:<52} {k.shape!s:<24} {k.dtype:<9} {k.bytes:>12,} {k.note}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", action="append", choices=sorted(CASES), help="default: every case")
    parser.add_argument("--attention", action="append", choices=["sdpa", "eager"])
    parser.add_argument("--quick", action="store_true", help="only s=128,b=1 and s=256,b=2")
    parser.add_argument("--no-checkpointing", action="store_true")
    parser.add_argument("--list", action="store_true", help="also list every tensor of the s=128,b=1 run")
    parser.add_argument("--dropout", type=float, default=None, help="gpt2 dropout (default: its 0.1)")
    parser.add_argument("--no-cache", action="store_true", help="pass use_cache=False (default: the config's True)")
    parser.add_argument("--experts", choices=["grouped_mm", "batched_mm", "eager"], help="MoE experts implementation")
    args = parser.parse_args(argv)
    grid = [GRID[0], GRID[-1]] if args.quick else GRID
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, dtype bfloat16, {LAYERS} layers")
    for name in args.case or list(CASES):
        print(f"\n##### {name}: {CASES[name].source}\n      {CASES[name].config_class.__name__}({CASES[name].kwargs})")
        for attention in [a for a in args.attention or ["sdpa", "eager"] if a in CASES[name].attentions]:
            for checkpointing in [False] if args.no_checkpointing or not CASES[name].checkpointable else [False, True]:
                extra: dict[str, Any] = {"dropout": args.dropout} if args.dropout is not None else {}
                if args.no_cache:
                    extra["use_cache"] = False
                if args.experts:
                    extra["experts_implementation"] = args.experts
                report(name, attention, checkpointing, grid, **extra)
                if args.list:
                    m = measure(name, attention, 128, 1, checkpointing, **extra)
                    print_tensors(m)
                    for k in m.closure:
                        print(f"  closure {k}")
                    for k in m.rebuild:
                        print(f"  rebuild {k}")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
