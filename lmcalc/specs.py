"""Validated descriptions of what lmcalc reasons about: models, accelerators, precisions, optimizers (and, in
``framework_specs``, the training frameworks' rules).

Every preset file is parsed into one of these pydantic models once; the engine only ever sees these
objects, never raw YAML. Units are in the field names (``memory_bytes``, ``peak_tflops_dense``) so a
preset file cannot be read two ways.

The annotations are types, not text (no ``from __future__ import annotations``): pydantic would compile and evaluate
each field's annotation from its text when the class is defined, which every command pays at start-up.
"""

import functools
from collections.abc import Mapping
from typing import Any, Literal, Self

from pydantic import AliasChoices, Field, field_validator, model_validator

from lmcalc.byte_specs import ByteLatentSpec, ByteStackSpec
from lmcalc.errors import as_given
from lmcalc.hardware_specs import Cluster, HardwareSpec
from lmcalc.layer_kinds import LayerKinds
from lmcalc.layer_specs import (
    CDMOE_UNTRAINABLE,
    NO_TOP_K,
    AltUpSpec,
    BranchConvSpec,
    CcaSpec,
    CompressedAttentionSpec,
    CrossAttentionSpec,
    GlobalAttentionSpec,
    HyperConnectionSpec,
    IndexerSpec,
    KvSharingSpec,
    LocalMLASpec,
    MLASpec,
    MoESpec,
    PerLayerInputSpec,
    RetrievalExpertsSpec,
    SharedBlockSpec,
)
from lmcalc.mixer_specs import (
    RWKV_COUNTED_ONLY,
    DeltaNetSpec,
    LightningSpec,
    Mamba2Spec,
    MambaSpec,
    MLstmSpec,
    RgLruSpec,
    RwkvSpec,
    ShortConvSpec,
)
from lmcalc.model_rules import check_model
from lmcalc.pass_specs import DRAFTER_COUNTED_ONLY, DrafterSpec, ImagePrefixSpec, LayerReuseSpec, PromptSpec
from lmcalc.spec_base import (
    MAX_DIMENSION,
    MAX_LAYERS,
    MAX_NAME_LENGTH,
    MAX_WHOLE_NUMBER,
    ActivationKind,
    ComputeDtype,
    Dimension,
    DropoutSite,
    FfnKind,
    LayerCount,
    LayerIndex,
    NamedSpec,
    NonNegativeFloat,
    NonNegativeInt,
    NormKind,
    PositionKind,
    PositiveFloat,
    PositiveInt,
    Spec,
    StrictBool,
    WholeNumber,
    no_entries,
    no_items,
    whole_float_as_int,
)

__all__ = ["MAX_DIMENSION", "MAX_LAYERS", "MAX_WHOLE_NUMBER", "ActivationKind", "AltUpSpec", "BranchConvSpec",
           "CcaSpec", "ComputeDtype", "CompressedAttentionSpec", "HyperConnectionSpec", "SharedBlockSpec",
           "CrossAttentionSpec", "DeltaNetSpec", "DRAFTER_COUNTED_ONLY", "DrafterSpec", "Dimension", "DropoutSite",
           "FfnKind", "GlobalAttentionSpec", "ByteLatentSpec", "ByteStackSpec", "ImagePrefixSpec", "IndexerSpec",
           "KvSharingSpec", "LayerCount", "LayerIndex", "LayerReuseSpec", "LightningSpec", "LocalMLASpec", "MLASpec",
           "MLstmSpec", "Mamba2Spec", "MambaSpec", "MoESpec", "NO_TOP_K", "PerLayerInputSpec", "PromptSpec",
           "RetrievalExpertsSpec", "RWKV_COUNTED_ONLY", "RwkvSpec", "Cluster", "HardwareSpec", "NamedSpec",
           "NonNegativeFloat", "NonNegativeInt", "NormKind", "PositionKind", "PositiveFloat", "PositiveInt",
           "ShortConvSpec", "Spec", "StrictBool", "WholeNumber", "no_entries", "no_items"]  # fmt: skip
"""Re-exported: the rest of lmcalc takes every spec and spec type from here."""


class ModelSpec(LayerKinds, NamedSpec):
    """A decoder-only transformer, described the way its config file and paper describe it."""

    display_name: str = Field("", max_length=MAX_NAME_LENGTH)
    aliases: tuple[str, ...] = Field(default_factory=no_items)
    family_aliases: tuple[str, ...] = Field(
        default_factory=no_items, description="short family names (e.g. llama-70b) that default to this model"
    )
    vocab_size: Dimension
    hidden_size: Dimension
    num_layers: LayerCount
    num_heads: Dimension
    num_kv_heads: Dimension | None = Field(None, description="GQA/MQA key-value heads; default num_heads")
    head_dim: Dimension | None = Field(None, description="default hidden_size / num_heads")
    value_head_dim: Dimension | None = Field(None, description="values' head width, without MLA; default head_dim "
                                             "(MiMo-V2-Flash: 128 against 192)")  # fmt: skip
    local_kv_heads: Dimension | None = Field(None, description="the local (sliding-window) layers' own KV heads "
                                             "(MiMo-V2-Flash: 8, its global layers 4)")  # fmt: skip
    ffn_size: Dimension = Field(description="intermediate size of a dense FFN")
    ffn_kind: FfnKind
    activation: ActivationKind = Field(
        "gelu",
        validation_alias=AliasChoices("activation", "gelu"),
        description="the activation a gelu_mlp or geglu FFN calls, named as Hugging Face's hidden_act "
        "(transformers/activations.py ACT2FN): gelu and gelu_pytorch_tanh are torch's GELU kernel (GPT-NeoX, Falcon; "
        "StarCoder2, Gemma); gelu_new (GPT-2's NewGELUActivation), gelu_fast and gelu_python are written op by op; "
        "bloom_gelu is modeling_bloom.py's GeLUFunction, which keeps its input; relu keeps its output (OPT), relu2 "
        "squares it (Persimmon, Nemotron, Arcee: ReLUSquaredActivation); xielu is Apertus's xIELU (XIELUActivation: "
        "two learnt scalars). Older presets call the field gelu",
    )
    norm_kind: NormKind
    norm_weight_fp32: StrictBool = Field(
        False,
        description="the norms multiply by their weight in fp32 before the cast back (modeling_gemma2.py "
        "Gemma2RMSNorm: (1 + w.float()) times the fp32 normalised value, then type_as(x); Gemma, Gemma 3, "
        "OLMo 2's Olmo2RMSNorm, gpt-oss's GptOssRMSNorm, CohereLayerNorm); False: the normalised value is cast back "
        "first (modeling_llama.py LlamaRMSNorm: weight * hidden_states.to(input_dtype)) or the norm is one kernel",
    )
    norm_weight: StrictBool = Field(
        True,
        description="the norms scale by a learned weight (and a LayerNorm adds a bias); False: they have neither and "
        "normalise in fp32 before the cast back (OLMo's OlmoLayerNorm, nanochat's NanoChatRMSNorm), the query and "
        "key norms too",
    )
    norm_rms_pow: StrictBool = Field(
        False,
        description="the RMSNorms take 1/rms as torch.pow(mean(x²) + ε, −½), which keeps its input as well as its "
        "output: two fp32 values a row for backward, not rsqrt's one (Gemma3nRMSNorm, Gemma4RMSNorm)",
    )
    value_norm: StrictBool = Field(
        False,
        description="a weightless RMSNorm on each head of V (Gemma 3n's and Gemma 4's v_norm): no parameters; for "
        "backward it keeps what the model's norms keep of their input",
    )
    eager_score_clamp: StrictBool = Field(
        False,
        description="the model's eager attention clamps its masked scores at the dtype's minimum with torch.max, "
        "which keeps them for backward (XGLMAttention): one more b·H·s² tensor",
    )
    eager_fp32_scores: StrictBool = Field(
        False,
        description="the model's own eager attention multiplies fp32 copies of Q and of K (repeated to every head), "
        "which the product keeps, and keeps its softmax over the scores and a sink column in fp32 and its cast copy "
        "(Flint's eager_attention_forward)",
    )
    sdpa_broadcast_kv: StrictBool = Field(False, description="the model's own SDPA call passes K and V at their "
                                          "fewer heads without enable_gqa, broadcast (Falcon-7B's)")  # fmt: skip
    eager_softmax: Literal["fp32", "activation"] = Field(
        "fp32",
        description="the dtype the model's own eager attention runs its softmax in (read under a framework profile "
        "whose attention.eager_softmax is model): fp32 then a cast (transformers' eager_attention_forward for "
        "Llama and most), or the activation dtype (GPT-2's and BioGPT's)",
    )
    qkv_clip: PositiveFloat | None = Field(
        None,
        description="queries, keys and values clamped to ±qkv_clip in place after their projections (OLMo's and "
        "DBRX's clip_qkv): each clamp keeps its input for backward",
    )
    rotary_fraction: PositiveFloat = Field(
        1.0,
        le=1,
        description="the share of each head's dimensions RoPE rotates, the rest passed through (partial_rotary_factor: "
        "GLM-4 0.5, StableLM 0.25, Qwen3-Next 0.25)",
    )
    rotary_concat: StrictBool = Field(False, description="RoPE concatenates a head's rotated and passed parts, at a "
                                      "whole head too (MiniMax-M3)")  # fmt: skip
    qk_norm: Literal["none", "full", "per_head"] = Field("none", description="norm on projected queries and keys: "
                                                         "over all heads (OLMo 2) or per head")  # fmt: skip
    sublayers: PositiveInt = Field(1, description="layers counted here in each layer of the model's code "
                                   "(LongCat-Flash: 2), which gradient checkpointing rebuilds together")  # fmt: skip
    attention_bias: Literal["none", "qkv", "out", "all"] = Field(
        "none", description="biases on Q, K and V (qkv), on the output projection (out: GPT-Neo), or on all four"
    )
    last_layer_out_bias: StrictBool = Field(
        False, description="a bias on the last layer's attention output alone (GPT-NeoX-Japanese's dense_bias): h more"
    )
    mlp_bias: StrictBool = False
    swiglu_limit: PositiveFloat | None = Field(
        None,
        description="gpt-oss's clamped SwiGLU, (up + 1)·g·σ(α·g) with the gate g clamped above and up both ways at "
        "this limit (GptOssExperts, MiniMax-M3); written op by op it keeps seven f-wide tensors a row, not four",
    )
    mlp_fp32: StrictBool = Field(
        False,
        description="the gated MLP's activation and product computed in fp32 by the model's own code (Beam): "
        "transformers' profile keeps fp32 copies of the gate's and the up projection's outputs and the fp32 "
        "activation, the product cast back",
    )
    norms_per_layer: Literal[1, 2, 4] = Field(
        2,
        description="1: one norm feeds attention and MLP (the parallel blocks of Falcon-7B and Cohere); 2: one "
        "before each; 4: also one after each, before the residual add (Gemma 2/3 and GLM-4's sandwich norms)",
    )
    parallel_block: StrictBool = Field(
        False,
        description="attention and MLP both read the layer's input and add to one residual (GPT-J, GPT-NeoX, Falcon, "
        "Cohere)",
    )
    embedding_norm: StrictBool = Field(False, description="a norm right after the token embedding (BLOOM)")
    first_attention_norm: StrictBool = Field(
        True, description="layer 0 has its attention norm; false: the embedding's norm stands in for it (ModernBERT)"
    )
    head_transform: StrictBool = Field(
        False,
        description="a dense h × h layer, the MLP's activation and a norm between the final norm and the output head "
        "(BERT's prediction-head transform: ModernBERT's lm_head.dense and lm_head.norm)",
    )
    post_norm: StrictBool = Field(
        False,
        description="each norm follows its sub-layer's residual add, LayerNorm(x + sublayer(x)) (Vaswani et al. "
        "2017; GPT-1), and no norm precedes the head",
    )
    sub_norms: StrictBool = Field(
        False,
        description="BitNet's sub-layer norms (Sub-LN, Wang et al. 2022, Foundation Transformers §2.1): one on the "
        "attention's output before the output projection, one on the gated product before the down projection",
    )
    attention_sinks: StrictBool = Field(
        False, description="a learned logit per head that every softmax includes (gpt-oss): H parameters per layer"
    )
    sinks_local_only: StrictBool = Field(False, description="with attention_sinks, sinks in the local layers alone "
                                         "(MiMo-V2-Flash)")  # fmt: skip
    sinks_fp32: StrictBool = Field(
        False,
        description="with attention_sinks, the sinks held in fp32 (transformers' _keep_in_fp32_modules_strict: "
        "DeepSeek-V4, HY V4): eager attention's concatenation with them promotes the scores, so the softmax is kept "
        "in fp32 with the sink column and its cast without it",
    )
    local_qk_l2_norm: StrictBool = Field(False, description="Llama 4's use_qk_norm: a weightless L2 norm on each "
                                         "head of Q and K, upcast to fp32, in its local layers alone")  # fmt: skip
    sink_scale: StrictBool = Field(
        False,
        description="with attention_sinks, each sink scales its head's output by σ(lse − sink) after a plain softmax "
        "(Granite SWA), not a softmax column (gpt-oss)",
    )
    sliding_window: Dimension | None = Field(
        None, description="local attention's span in tokens; None: every layer attends to the whole sequence"
    )
    local_attention: Literal["sliding", "chunked"] = Field(
        "sliding",
        description="sliding: each query sees the window of keys before it (Mistral, Gemma 2/3, gpt-oss); chunked: "
        "the keys of its own chunk of that size up to itself (Llama 4)",
    )
    global_every: PositiveInt | None = Field(
        None,
        description="with a sliding_window, layer i (from 0) attends globally when (i + 1) is a multiple of this "
        "(Gemma 2: 2, Gemma 3: 6, Cohere2: 4, gpt-oss: 2, Llama 4: 4); None: every layer is local",
    )
    window_buffer: StrictBool = Field(False, description="the local layers mask their window from a buffer of their "
                                      "own (GPTNeoSelfAttention.bias): the model makes one eager mask")  # fmt: skip
    global_from_first: StrictBool = Field(
        False,
        description="the global layers are i where i (from 0) is a multiple of global_every: the first layer "
        "attends globally (GPT-Neo: 2, Code World Model: 4)",
    )
    global_layer_ids: tuple[LayerIndex, ...] = Field(
        default_factory=no_items,
        description="with a sliding_window, the layers (from 0) that attend globally where no global_every says it "
        "(Flint: layers 0 and 1, every fourth from 5, and the last); empty: global_every decides",
    )
    attention_softcap: PositiveFloat | None = Field(
        None, description="tanh soft-capping of attention logits (Gemma 2); transformers then runs eager attention"
    )
    final_softcap: PositiveFloat | None = Field(None, description="tanh soft-capping of the output logits (Gemma 2)")
    final_softcap_fp32: StrictBool = Field(
        False, description="that soft-capping computed on an fp32 copy of the logits (Beam): tanh keeps fp32"
    )
    fused_linears: tuple[Literal["qkv", "gate_up", "kv"], ...] = Field(
        default_factory=no_items,
        description="weights the reference implementation stores as one matrix (GPT-2's c_attn: qkv; Phi-3's "
        "qkv_proj and gate_up_proj; JetMoE's kv_proj: kv): the count is the same, but a LoRA adapter on it spans "
        "the fused output",
    )
    tied_embeddings: StrictBool
    head_bias: StrictBool = Field(
        False, description="a bias on the output head, kept when the head's weight is tied (GPT-J, CodeGen, Phi-2)"
    )
    position_embedding: PositionKind
    max_seq_len: Dimension
    position_offset: NonNegativeInt = Field(
        0,
        le=MAX_DIMENSION,
        description="rows of a learned position table before position 0: the table holds max_seq_len + "
        "position_offset rows (OPT's and BioGPT's 2, fairseq's padding offset)",
    )
    dropout: StrictBool = Field(False, description="trained with dropout: masks are saved for backward")
    dropout_at: tuple[DropoutSite, ...] = Field(
        ("embedding", "attention", "residual"),
        description="where dropout runs, with dropout true: on the embedding's output, on the attention "
        "probabilities, on each sub-layer's output before the residual add (GPT-2: all three; OPT: the residual "
        "alone, its attention_dropout 0)",
    )
    mla: MLASpec | None = None
    moe: MoESpec | None = None
    mamba: MambaSpec | None = None
    deltanet: DeltaNetSpec | None = None
    mamba2: Mamba2Spec | None = None
    short_conv: ShortConvSpec | None = None
    lightning: LightningSpec | None = None
    rwkv: RwkvSpec | None = Field(None, description="RWKV-4's time and channel mixes in every layer")
    rglru: RgLruSpec | None = Field(None, description="Griffin's recurrent blocks (RecurrentGemma)")
    mlstm: MLstmSpec | None = Field(None, description="xLSTM's mLSTM layers in every layer")
    global_attention: GlobalAttentionSpec | None = Field(None, description="the global layers' own widths (Gemma 4)")
    kv_sharing: KvSharingSpec | None = Field(None, description="the last layers reuse earlier K and V (Gemma 4)")
    per_layer_input: PerLayerInputSpec | None = Field(None, description="per-layer embeddings (Gemma 3n, 4's PLE)")
    altup: AltUpSpec | None = Field(None, description="alternating updates and LAuReL (Gemma 3n)")
    cross_attention: CrossAttentionSpec | None = Field(None, description="image layers, idle on text (Llama 3.2 V)")
    compressed_attention: CompressedAttentionSpec | None = Field(
        None, description="compressed sparse and heavily compressed attention (DeepSeek-V4)"
    )
    hyper_connections: HyperConnectionSpec | None = Field(None, description="n residual streams (DeepSeek-V4's mHC)")
    shared_block: SharedBlockSpec | None = Field(None, description="blocks run at several depths (Zamba 2)")
    dynamic_mask_window: Dimension | None = Field(
        None,
        description="Doge's dynamic mask attention: a learned A a KV head and dt_proj (H_kv·d → H_kv) score each key "
        "from its value, and a query attends to the top this many keys; None: none",
    )
    retrieval_experts: RetrievalExpertsSpec | None = Field(None, description="single-neuron experts (Doge's CDMoE)")
    residual_scales: StrictBool = Field(
        False, description="a learned scale (h) on each residual (Doge's; nGPT's rates α_A, α_M, Dory's): 2·h a layer"
    )
    ngpt_scales: StrictBool = Field(
        False,
        description="nGPT's learned scales (Dory's): s_qk and the output gate's s (H·d each), s_u and s_v in the MLP "
        "(f each), a logit scale a token (V)",
    )
    layer_reuse: LayerReuseSpec | None = Field(None, description="layers run more than once a pass (Dory, HRM)")
    prompt: PromptSpec | None = Field(None, description="prompt tokens prepended to every sequence (CPM-Ant)")
    image_prefix: ImagePrefixSpec | None = Field(None, description="an image encoder's tokens before the text (GIT)")
    cca: CcaSpec | None = Field(None, description="compressed convolutional attention and residual scaling (ZAYA)")
    branch_convs: BranchConvSpec | None = Field(None, description="short convolutions, relative logits (Inkling)")
    global_scales: StrictBool = Field(False, description="a learned scalar on each dense MLP and router (Inkling's)")
    drafter: DrafterSpec | None = Field(None, description="a speculative-decoding drafter (Gemma 4's assistants)")
    byte_latent: ByteLatentSpec | None = Field(None, description="BLT's encoder, global transformer and patcher")
    head_vocab: Dimension | None = Field(None, description="the head's rows where fewer than the embedding's "
                                         "(Inkling 2's unpadded_vocab_size); None: vocab_size")  # fmt: skip
    mixer_only_layer_ids: tuple[LayerIndex, ...] = Field(
        default_factory=no_items,
        description="layers that are a token mixer alone, behind one norm and without an FFN (Nemotron-H's Mamba-2 "
        "and attention blocks: NemotronHBlock holds one norm and one mixer)",
    )
    ffn_only_layer_ids: tuple[LayerIndex, ...] = Field(
        default_factory=no_items,
        description="layers that are an FFN alone, dense or MoE, behind one norm and without a token mixer "
        "(Nemotron-H's MLP and MoE blocks)",
    )
    differential_attention: StrictBool = Field(
        False,
        description="differential attention (Ye et al. 2025, DiffLlama): two softmax attentions share Q and K, each "
        "over half of V's heads; their difference, weighed by λ (4·d learned per layer), is normalised per head pair",
    )
    attention_output_gate: StrictBool = Field(
        False,
        description="the query projection also makes a per-channel sigmoid gate on the attention's output "
        "(Qwen3-Next, Qwen3.5: q_proj of 2·H·d)",
    )
    attention_gate_proj: StrictBool = Field(False, description="that gate is a projection of its own, attn_gate "
                                            "(AFMoE's self_attn.gate_proj, h → H·d), not half of the query projection: "
                                            "the same parameters and FLOPs, a LoRA adapter of its own")  # fmt: skip
    attention_gate_bias: StrictBool = Field(False, description="a learned bias a head added to that gate's projection "
                                            "before its sigmoid (Beam's gate_bias: H a layer); needs "
                                            "attention_gate_proj")  # fmt: skip
    attention_gate_fp32: StrictBool = Field(False, description="that gate's sigmoid and its product with the "
                                            "attention's output computed in fp32 (A.X K2)")  # fmt: skip
    gated_norm_rank: Dimension | None = Field(None, description="each layer's input norm, and an MoE layer's MLP norm, "
                                              "gated by a low-rank MLP: y·σ(W₂·SiLU(W₁·y)), W₁ h → r (A.X K2's "
                                              "AXK2GatedRMSNorm, Megatron's GatedNormWrapper)")  # fmt: skip
    attention_head_gate: Literal["none", "fp32", "activation"] = Field(
        "none",
        description="a gate per head on the attention's output, projected from the layer's input by a module of its "
        "own, g_proj (h → H), its activation computed in fp32 (the Bailing hybrid's MLA, a sigmoid; Laguna's "
        "attention, a softplus) or in the activation dtype (LFM3's sigmoid)",
    )
    mtp_modules: LayerIndex = Field(
        0,
        description="multi-token-prediction modules (DeepSeek-V3 §2.2, GLM-4.5, DeepSeek-V4): two norms, a (2h → h) "
        "projection (with mHC two h → h and a collapse of the streams) and one more layer each, sharing the embedding "
        "and head; reported apart, not in the total (transformers does not build them, and the published totals "
        "leave them out)",
    )
    vision_params: NonNegativeInt | None = Field(
        None,
        description="a multimodal model's vision tower and projector, reported beside the text model's count and "
        "never in it: lmcalc estimates the language model",
    )
    published_params: PositiveInt | None = None
    published_params_sig_figs: PositiveInt | None = Field(
        None, description="None: the published count is exact; else how many significant figures it has"
    )
    published_params_rounding: Literal["nearest", "down"] = Field(
        "nearest",
        description="how the published figure was cut to its significant figures: rounded to the nearest, or cut "
        "down (dots.llm1's 142B for 142.77 B, InternLM3's 8B for 8.80 B)",
    )
    published_params_scope: Literal["total", "without_embeddings"] = Field(
        "total",
        description="what the published count counts: every parameter, or all but the token embedding and the "
        "output head (V·h each; Kimi Linear's card, the non-embedding figures of Qwen's)",
    )
    published_params_source: str = ""
    training_tokens: PositiveFloat | None = Field(None, le=MAX_WHOLE_NUMBER)
    training_tokens_source: str = ""
    notes: tuple[str, ...] = Field(default_factory=no_items)
    sources: tuple[str, ...] = Field(default_factory=no_items)

    @field_validator("norms_per_layer", mode="before")
    @classmethod
    def _norms_a_whole_number(cls, value: Any) -> Any:
        """A literal of ints takes true as 1, and pydantic cannot make a literal strict: a boolean is refused here."""
        value = whole_float_as_int(value)
        if type(value) is not int:
            raise ValueError(f"must be 1, 2 or 4, not {as_given(value)}")
        return value

    @model_validator(mode="after")
    def _shapes_consistent(self) -> Self:
        check_model(self)  # lmcalc/model_rules.py
        return self

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """A copy validated afresh: its counts of layers by kind are cached, and ``update`` may change them."""
        del deep  # every field is immutable: a new, validated model shares nothing mutable
        return type(self).model_validate(self.model_dump() | dict(update or {}))

    def drops(self, site: DropoutSite) -> bool:
        """Whether dropout runs at ``site`` (``dropout_at``), its mask kept for backward."""
        return self.dropout and site in self.dropout_at

    @property
    def attention_calls(self) -> int:
        """Attention kernels a layer runs: two where differential attention runs one per half of V."""
        return 2 if self.differential_attention else 1

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads

    @property
    def head_size(self) -> int:
        return self.head_dim or self.hidden_size // self.num_heads

    @property
    def qk_head_dim(self) -> int:
        return self.mla.qk_head_dim if self.mla else self.head_size

    @property
    def v_head_dim(self) -> int:
        return self.mla.v_head_dim if self.mla else self.value_head_dim or self.head_size

    @property
    def counted_only(self) -> str:
        """Why lmcalc counts this model's parameters, FLOPs (and training time at an MFU) and serving memory alone, not
        its training memory or step time; "" where it counts everything: xLSTM padded, Gemma 4's drafters (transformers
        trains none). RWKV-4, RecurrentGemma, Zamba, xLSTM, Doge, ZAYA, HRM, Dory, CPM-Ant, GIT, dots.3
        Note, Inkling, Inkling 2 and its looped model, DeepSeek-V4, HY V4, Llama 3.2 Vision's text model and BLT are
        modelled whole (docs/formulas.md §2.21, §2.36.1, §2.37)."""
        if self.mlstm and self.mlstm.padded:
            return RWKV_COUNTED_ONLY
        if self.drafter:  # transformers trains none (docs/hf-types.md)
            return DRAFTER_COUNTED_ONLY
        if self.retrieval_experts and self.retrieval_experts.normalized:  # Doge's CDMoE: autograd refuses its step
            return CDMOE_UNTRAINABLE
        return ""

    @functools.cached_property  # a frozen spec's; the planner asks per layout
    def mean_kv_heads(self) -> float:
        """Key-value heads averaged over the attention layers: H_kv but where the local layers have their own."""
        local = self.local_layers / self.attention_layers if self.local_kv_heads and self.attention_layers else 0.0
        return (1 - local) * self.kv_heads + local * (self.local_kv_heads or 0)

    @property
    def indexer(self) -> IndexerSpec | None:
        """DeepSeek sparse attention's indexer, where the model's MLA has one."""
        return self.mla.indexer if self.mla else None

    @property
    def indexer_layers(self) -> int:
        """Layers that run an indexer of their own (every layer but the local ones, unless ``own_layers`` says fewer);
        0 without one."""
        if self.indexer is None:
            return 0
        return self.indexer.own_layers or self.num_layers - self.local_layers

    @property
    def label(self) -> str:
        return self.display_name or self.name
