"""What a layer's attention and feed-forward can be beyond the plain ones: multi-head latent attention (DeepSeek-V2/V3)
and a mixture of experts, with which layers route. ``specs.ModelSpec`` holds them; the rest of lmcalc takes them from
``specs``.

The annotations are types, not text (no ``from __future__ import annotations``), for the reason ``specs`` gives."""

import functools
import math
from typing import Literal, Self

from pydantic import Field, model_validator

from lmcalc.errors import LmcalcError
from lmcalc.spec_base import (
    MAX_DIMENSION,
    MAX_LAYERS,
    Dimension,
    LayerCount,
    LayerIndex,
    NonNegativeInt,
    PositiveInt,
    Spec,
    StrictBool,
    no_items,
)

NO_TOP_K = (
    "the model's experts_per_token (config.json's num_experts_per_tok) is null: how many experts a token uses is "
    "unknown, so only lmcalc params counts it; give the top-k for FLOPs, memory or time"
)

CDMOE_UNTRAINABLE = (
    "transformers 5.24's DogeCDMoE cannot train with norm_topk_prob true (it divides softmax's output in place, which "
    "softmax's backward needs): lmcalc params, flops and the serving memory count it; set norm_topk_prob false to "
    "estimate a training step"
)


class MoESpec(Spec):
    """Mixture-of-experts feed-forward: routed experts, always-on shared experts, leading dense layers."""

    num_experts: Dimension
    experts_per_token: Dimension | None = Field(
        description="routed experts each token uses (top-k); null where config.json leaves it null (DeepSeek-V2's "
        "class default): the parameters count, and every estimate that needs k refuses"
    )
    shared_experts: NonNegativeInt = Field(0, le=MAX_DIMENSION)
    expert_ffn_size: Dimension
    dense_layers: LayerIndex = Field(0, description="leading layers that keep a dense FFN of ffn_size")
    router_bias: StrictBool = Field(
        False,
        description="a learned per-expert bias on the router (gpt-oss); DeepSeek-V3's balancing bias is a buffer set "
        "by a rule, not a parameter",
    )
    router_fp32: StrictBool = Field(
        False,
        description="the model's code runs the router's matmul in fp32 on an fp32 copy of its input (transformers' "
        "DeepSeek-V2/V3, GLM-4.5, ERNIE 4.5, EXAONE MoE and Hunyuan routers), read under a framework profile whose "
        "moe.router is model",
    )
    shared_expert_ffn_size: Dimension | None = Field(
        None, description="inner width of the shared experts when it differs from expert_ffn_size (Qwen2-MoE)"
    )
    latent_size: Dimension | None = Field(
        None,
        description="l: the routed experts' input and output width, where each MoE layer projects a token from h "
        "down to it before them and back after (Nemotron 3 Super's latent MoE, NemotronHMoE's fc1/fc2_latent_proj)",
    )
    shared_expert_gate: StrictBool = Field(
        False, description="a sigmoid gate (h → 1) on the shared experts' output (Qwen2-MoE's shared_expert_gate)"
    )
    moe_every: PositiveInt = Field(
        1,
        description="every how many layers one is MoE: layer i (from 0) is MoE when (i + 1) is a multiple of this "
        "(decoder_sparse_step, Llama 4's interleave_moe_layer_step); the others keep a dense FFN of ffn_size",
    )
    dense_layer_ids: tuple[LayerIndex, ...] = Field(
        default_factory=no_items, description="further layers (from 0) with a dense FFN (Qwen MoE's mlp_only_layers)"
    )
    output_norm: StrictBool = Field(
        False,
        description="a norm on the MoE block's output (routed and shared experts summed), before the residual add "
        "(A.X K1's post_mlp_layernorm)",
    )
    node_limit: PositiveInt | None = Field(
        None,
        description="node-limited routing: each token is sent to experts on at most this many nodes (DeepSeek-V3: "
        "4, its 8 expert groups of which each token picks 4)",
    )
    expert_loop: StrictBool = Field(
        False,
        description="the model's own code runs its experts one at a time and adds each weighted output back with "
        "index_add (transformers' LongcatFlashExperts, which has no grouped_mm path), read under a framework profile "
        "whose moe.router is model",
    )
    dense_dispatch: StrictBool = Field(
        False,
        description="the model's own code sends every token to every expert, its input scaled by the router's score "
        "(zero where the expert was not picked: transformers' Llama4TextMoe), read under a framework profile whose "
        "moe.router is model: E rows a token computed and kept, not k",
    )
    peft_v4_names: Literal["mixtral", "qwen2_moe"] | None = Field(
        None,
        description="PEFT (0.21) maps the model type's transformers-4 expert and router names onto the 3-D expert "
        "tensors and bare router weight that transformers 5 stores, by Mixtral's names (w1, w3, w2, gate) or "
        "Qwen2-MoE's (gate_proj, up_proj, down_proj, gate): LoRA then adapts the router at rank r and each routed "
        "expert, gate and up as one adapter of rank 2r, down at rank r, and under Qwen2-MoE's names no nn.Linear "
        "called gate_proj, up_proj or down_proj (dense layers, shared experts, an attention gate); None: the routed "
        "experts and a bare router weight carry no adapter",
    )
    router_linear: StrictBool = Field(
        False,
        description="the router is an nn.Linear in the reference implementation (Llama 4, Phi-3.5-MoE, DBRX, AFMoE, "
        "JetMoE, Gemma 4), which LoRA's all-linear adapts; else a bare weight (transformers 5's TopKRouter)",
    )
    attention_experts: NonNegativeInt = Field(
        0,
        le=MAX_DIMENSION,
        description="experts of the attention too (JetMoE's mixture of attention heads): the query and output "
        "projections are this many experts of H_kv heads each, every token routed by a router of its own to k of "
        "them, so that it attends with H = k·H_kv heads over one shared K and V; a bias of h on their output",
    )
    router_scores_shared: StrictBool = Field(
        False,
        description="the router scores the shared experts too (E + shared rows), their weights normalised with "
        "the routed ones' (Inkling's shared-expert sink)",
    )
    router_rank: Dimension | None = Field(
        None,
        description="ZAYA's router: h → r with a bias, the previous MoE layer's r-wide state added at a learned "
        "scale (r), an RMSNorm and two r × r layers with biases, scores for E + 1 classes (the last a skip, which "
        "transformers sends to expert 0 at weight 0); None: a linear router",
    )
    output_bias: StrictBool = Field(
        False, description="a bias of h on the routed experts' summed output (JetMoE's MoE bias), in each MoE layer"
    )
    zero_experts: NonNegativeInt = Field(
        0,
        le=MAX_DIMENSION,
        description="zero-computation experts beside the routed ones (LongCat-Flash's 256): the router scores E + Z "
        "experts and picks k, and a pick of one of these passes the token through, scaled by its weight",
    )
    branch_norms: StrictBool = Field(
        False,
        description="Gemma 4's MoE block beside its dense MLP (the MLP as the one shared expert): a norm before the "
        "experts and one after each branch, 3·h a layer; the router reads the layer's input, normed without a weight "
        "and scaled by a learned vector (h), and scales each expert's weight by a learned factor (E)",
    )

    @model_validator(mode="after")
    def _top_k_fits(self) -> Self:
        if self.experts_per_token is not None and self.experts_per_token > self.num_experts + self.zero_experts:
            zero = f" and zero_experts ({self.zero_experts})" if self.zero_experts else ""
            raise ValueError(
                f"experts_per_token ({self.experts_per_token}) exceeds num_experts ({self.num_experts}){zero}"
            )
        return self

    @property
    def k(self) -> int:
        """The routed experts each token uses; refused in one line where the spec leaves it null."""
        if self.experts_per_token is None:
            raise LmcalcError(NO_TOP_K)
        return self.experts_per_token

    @property
    def computed_k(self) -> float:
        """The routed experts a token computes: k, or with zero-computation experts k·E/(E + Z), the share of the k
        picks that fall on real experts when the router spreads them evenly over all E + Z (LongCat-Flash: 8 of 12,
        the average its technical report gives, §2.1)."""
        return self.k * self.num_experts / (self.num_experts + self.zero_experts) if self.zero_experts else self.k

    @property
    def router_outputs(self) -> int:
        """The experts the router scores: E, and the zero-computation ones (E + Z), ZAYA's skip class (E + 1), or
        the shared experts too (Inkling's)."""
        skip = 1 if self.router_rank else 0
        return self.num_experts + self.zero_experts + skip + (self.shared_experts if self.router_scores_shared else 0)

    @property
    def shared_width(self) -> int:
        return self.shared_expert_ffn_size or self.expert_ffn_size

    def is_moe_layer(self, layer: int) -> bool:
        """Whether layer ``layer`` (from 0) routes its tokens to experts."""
        return layer >= self.dense_layers and (layer + 1) % self.moe_every == 0 and layer not in self.dense_layer_ids


@functools.lru_cache(maxsize=4096)  # the planner asks per stage, thousands of times
def moe_layers_in(moe: MoESpec, mixer_only: tuple[int, ...], start: int, stop: int) -> int:
    """MoE layers among layers ``start`` to ``stop - 1``, less the layers that are a mixer alone (``mixer_only``)."""
    return sum(moe.is_moe_layer(i) and i not in mixer_only for i in range(start, stop))


class GlobalAttentionSpec(Spec):
    """The global (full-attention) layers' attention at widths of their own, beside the local layers' (Gemma 4:
    global_head_dim 512 where the sliding-window layers have head_dim 256), and K = V there: one projection makes
    the keys and, normed apart and not rotated, the values (attention_k_eq_v)."""

    head_dim: Dimension = Field(description="d_g, a global layer's head size (global_head_dim)")
    kv_heads: Dimension | None = Field(
        None, description="H_kv,g, a global layer's key-value heads (num_global_key_value_heads); None: num_kv_heads"
    )
    k_eq_v: StrictBool = Field(
        False, description="no V projection in the global layers: the values are the key projection's output"
    )


class KvSharingSpec(Spec):
    """The last layers attend with the keys and values of the last earlier layer of their kind, local or global
    (Gemma 3n, Gemma 4: num_kv_shared_layers): they have no K or V projection or norm of their own, and no cache."""

    layers: LayerCount = Field(description="how many of the last layers reuse an earlier layer's K and V")
    double_wide_mlp: StrictBool = Field(
        False, description="those layers' MLPs twice as wide, 2·f (Gemma 4's use_double_wide_mlp)"
    )


class PerLayerInputSpec(Spec):
    """Per-layer embeddings (Gemma 3n, Gemma 4: PLE). A table of V_p rows holds every layer's small input, d_p wide;
    the hidden state after the embedding is projected to the same L·d_p, normed, and added. Each layer gates its
    own d_p slice with its output (h → d_p, the activation, the product), projects it back to h, norms it and adds
    it to the residual."""

    width: Dimension = Field(description="d_p, each layer's input width (hidden_size_per_layer_input)")
    vocab: Dimension = Field(description="V_p, the table's rows (vocab_size_per_layer_input)")


class AltUpSpec(Spec):
    """Alternating updates (Baykal et al. 2023, AltUp; Gemma 3n): the hidden state is ``streams`` copies of h, of
    which each layer computes one. Before it, a router (h → n, on the normed active stream) sets coefficients
    (n → n²) that mix the streams into predictions; after it, the same router on the layer's output sets a
    correction (n → n) of each stream by the layer's innovation, and a learned scale (h) the active one. Projections
    (h → h) make the n − 1 other streams from the embedding and bring them back before the final norm."""

    streams: Dimension = Field(description="n, the streams (altup_num_inputs)")
    laurel_rank: Dimension | None = Field(
        None,
        description="a learned low-rank residual beside each layer's attention (LAuReL, Menghani et al. 2024): "
        "h → r → h and a norm (h); None: none",
    )
    sparse_layers: NonNegativeInt = Field(
        0,
        le=MAX_LAYERS,
        description="the layers whose MLP gate is cut at a Gaussian quantile before its activation (the non-zero "
        "entries of activation_sparsity_pattern: the first 10 of Gemma 3n's 35); it keeps the gate's output and its "
        "standard deviation for backward and changes no count",
    )


class CrossAttentionSpec(Spec):
    """Layers that attend to an image's features and nothing else (Llama 3.2 Vision's cross-attention layers,
    MllamaCrossAttentionDecoderLayer): Q from the text, K and V from the projected vision features, per-head norms on
    Q and K, tanh gates on the attention and the MLP, and an MLP. On text alone transformers skips them: their weights
    count, and no token computes them, so lmcalc leaves them out of ``num_layers``."""

    layers: NonNegativeInt = Field(le=MAX_LAYERS, description="how many (the length of cross_attention_layers)")
    token_rows: NonNegativeInt = Field(
        0, le=MAX_DIMENSION, description="rows the token embedding has beyond the vocabulary (Mllama's 8)"
    )


class IndexerSpec(Spec):
    """DeepSeek sparse attention's lightning indexer (DeepSeek-AI 2025, DeepSeek-V3.2 §2.1): a small multi-head
    scorer, q from the query latent and one shared key from the hidden state, picks the top_k keys each query attends
    to. As transformers and inference run it, forward only: its own training loss is not modelled."""

    heads: Dimension = Field(description="the indexer's heads, H_I (index_n_heads)")
    head_dim: Dimension = Field(description="the indexer's query and key width, d_I (index_head_dim)")
    top_k: Dimension = Field(description="keys each query attends to, k_I (index_topk)")
    own_layers: LayerCount | None = Field(
        None,
        description="layers that run an indexer of their own; the others reuse the previous one's selection "
        "(GLM-5's indexer_types 'shared'). None: every layer but the local ones, which attend their window alone "
        "(dots.3 Note's sliding-window layers)",
    )
    above_last: NonNegativeInt = Field(
        0,
        le=MAX_LAYERS,
        description="layers above the topmost one that runs an indexer of its own, which reuse a lower layer's "
        "selection (GLM-5's and HY V4's indexer_types ending in 'shared'); 0: the top layer runs one",
    )


class LocalMLASpec(Spec):
    """The local (sliding-window) layers' own MLA widths, where they differ from the global layers' (dots.3 Note's
    per_layer_config): every projection of ``MLASpec`` at these heads and ranks. Keys and values have as many heads as
    queries, as in every MLA."""

    heads: Dimension = Field(description="H_local, the local layers' query (and key-value) heads")
    q_lora_rank: Dimension = Field(description="r_q,local, their query latent")
    kv_lora_rank: Dimension = Field(description="r_kv,local, their joint key-value latent (what they cache)")
    qk_nope_head_dim: Dimension
    qk_rope_head_dim: Dimension
    v_head_dim: Dimension

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


class MLASpec(Spec):
    """Multi-head latent attention (DeepSeek-V2/V3): low-rank Q and joint low-rank K/V projections."""

    q_lora_rank: Dimension | None = Field(None, description="None: plain h x (heads*qk_head_dim) query")
    kv_lora_rank: Dimension
    qk_nope_head_dim: Dimension
    qk_rope_head_dim: Dimension
    v_head_dim: Dimension
    indexer: IndexerSpec | None = Field(None, description="DeepSeek sparse attention's indexer (DeepSeek-V3.2, GLM-5)")
    q_latent_concat: StrictBool = Field(
        False,
        description="the query up-projection reads the query latent's norm output beside the latent itself, 2·r_q "
        "wide (A.X K2's q_gate_proj); needs q_lora_rank",
    )
    rope_key_norm: StrictBool = Field(
        False,
        description="an RMSNorm of d_rope on the shared RoPE key before its rotation (dots.3 Note's "
        "k_rope_only_layernorm): d_rope weights a layer",
    )
    local: LocalMLASpec | None = Field(
        None, description="the local layers' own heads and widths (dots.3 Note); None: the global layers' alike"
    )

    @model_validator(mode="after")
    def _indexer_reads_query_latent(self) -> Self:
        if (self.indexer or self.q_latent_concat) and not self.q_lora_rank:
            raise ValueError("mla.indexer and mla.q_latent_concat read the query latent: they need q_lora_rank")
        if self.local and self.q_latent_concat:
            raise ValueError("mla.local and mla.q_latent_concat together are not modelled")
        return self

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


class CompressedAttentionSpec(Spec):
    """DeepSeek-V4's attention (DeepSeek-AI 2026, DeepSeek-V4 §2.3; transformers' DeepseekV4Attention). One key-value
    head of ``head_dim`` is read as both K and V; the queries pass through a rank r_q; a sink a head; the output goes
    through g groups each projected to r_o, then r_o·g → h. Every layer attends over a sliding window. A compressed
    sparse attention (CSA) layer also attends over one entry a window of m tokens, two overlapping series of 2·d
    gated and summed, of which its indexer picks k_I; a heavily compressed attention (HCA) layer over one entry a
    window of m' tokens, all of them."""

    q_lora_rank: Dimension = Field(description="r_q, the queries' rank (q_lora_rank)")
    output_groups: Dimension = Field(description="g, the output projection's head groups (o_groups)")
    output_rank: Dimension = Field(description="r_o, each group's projected width (o_lora_rank)")
    csa_layer_ids: tuple[LayerIndex, ...] = Field(
        default_factory=no_items, description="the layers (from 0) of compressed sparse attention"
    )
    hca_layer_ids: tuple[LayerIndex, ...] = Field(
        default_factory=no_items, description="the layers (from 0) of heavily compressed attention"
    )
    csa_rate: Dimension = Field(4, description="m, the tokens a CSA entry compresses")
    hca_rate: Dimension = Field(128, description="m', the tokens an HCA entry compresses")
    indexer: IndexerSpec = Field(description="the CSA layers' lightning indexer (index_n_heads, _head_dim, _topk)")

    @model_validator(mode="after")
    def _kinds_apart(self) -> Self:
        both = sorted(set(self.csa_layer_ids) & set(self.hca_layer_ids))
        if both:
            raise ValueError(f"layer {both[0]} is in both csa_layer_ids and hca_layer_ids: a layer has one kind")
        return self

    def rate(self, layer: int) -> int:
        """Tokens one compressed entry of layer ``layer`` holds; 0 for a layer of sliding-window attention alone."""
        return self.csa_rate if layer in self.csa_layer_ids else self.hca_rate if layer in self.hca_layer_ids else 0


class HyperConnectionSpec(Spec):
    """Manifold-constrained hyper-connections (mHC; Xie et al. 2026, as DeepSeek-V4 §2.2 uses them): the residual is
    n streams of h. Around each sub-layer, a projection of the n streams (n·h → (2+n)·n) sets how they collapse
    into its input, how its output spreads back, and an n × n mixing of the streams, made doubly stochastic by
    Sinkhorn-Knopp iterations; a last collapse (n·h → n) before the final norm."""

    streams: Dimension = Field(description="n, the residual streams (hc_mult)")
    mixing: StrictBool = Field(
        True,
        description="the n × n mixing of the streams (mHC, DeepSeek-V4: a projection to (2+n)·n, three scales); "
        "false: the streams collapse and spread only (iHC, HY V4: a projection to 2·n, two scales)",
    )


class SharedBlockSpec(Spec):
    """Transformer blocks whose weights are run at several depths (Zamba, Glorioso et al. 2024; Zamba 2; transformers'
    ZambaHybridLayer, Zamba2HybridLayer). At each layer of ``layer_ids`` one of ``blocks`` blocks, taken in turn, reads
    the layer's input beside the token embedding (2·h, normed), attends with H heads of d (2·h/H by default), and runs
    a gated MLP of ``ffn_size``; Zamba 2's low-rank adapter of its own at each use (``adapter_rank``) adds to the MLP's
    gate and up projection (and, with ``attention_adapters``, to Q, K and V); a linear layer of the use's own (h → h)
    adds the result to the input of that layer's Mamba mixer. The blocks' weights are held once and computed at every
    use."""

    layer_ids: tuple[LayerIndex, ...] = Field(description="the layers (from 0) that run a shared block first")
    blocks: Dimension = Field(1, description="B, the distinct blocks, used in turn (num_mem_blocks)")
    adapter_rank: Dimension | None = Field(None, description="r, each use's adapters' rank (adapter_rank); None: none")
    attention_adapters: StrictBool = Field(
        False, description="adapters on Q, K and V too (use_shared_attention_adapter), 2·h → r → 2·h each"
    )
    adapter_slots: NonNegativeInt | None = Field(
        None,
        le=MAX_LAYERS,
        description="the uses a block builds adapters for, where config.json's hybrid_layer_ids lists another number "
        "of layers than run a block (transformers builds them; no token runs the extra ones); None: G",
    )
    tied: StrictBool = Field(
        True,
        description="the uses of a block share its weights; false: each use has a block of its own (transformers "
        "ties them only where tie_word_embeddings is true)",
    )

    @property
    def uses(self) -> int:
        """G, the layers that run a block."""
        return len(self.layer_ids)

    @property
    def held(self) -> int:
        """The blocks whose weights the model holds: B where the uses share them, else G."""
        return self.blocks if self.tied else self.uses

    def adapter_elements(self, hidden: int, ffn: int) -> int:
        """One use's adapters: the MLP's h → r → 2·f, and with ``attention_adapters`` Q's, K's and V's 2·h → r → 2·h."""
        r = self.adapter_rank or 0
        return r * (hidden + 2 * ffn) + (3 * r * 4 * hidden if self.attention_adapters else 0)


class CcaSpec(Spec):
    """ZAYA's compressed convolutional attention (Figliolia et al. 2025, CCA; transformers' ZayaCCAProjection): the
    queries and keys, H·d ‖ H_kv·d channels, go through a causal depthwise convolution of ``depthwise`` taps and a
    grouped one of ``grouped`` taps (a group a head, d channels), with biases, and each is added back to its mean over
    its group of heads; half of each value head comes from the token and half from the one before (two projections of
    H_kv·d/2); a learned key scale a KV head (QK L2-normed). The convolutions' last taps and the delayed value are the
    layer's state in serving. Its layers also scale and shift the residual stream and each branch (4·h a site, and
    2·h on the embedding)."""

    depthwise: Dimension = Field(description="the depthwise convolution's taps (cca_time0)")
    grouped: Dimension = Field(description="the grouped convolution's taps (cca_time1)")


class BranchConvSpec(Spec):
    """Inkling's (Thinking Machines 2026; transformers' InklingDecoderLayer, InklingAttention): four causal depthwise
    convolutions of ``kernel`` taps a layer, without biases, each added back to its input: on the keys and on the values
    (H_kv·d channels, the layer kind's), on the attention's output and on the MLP's (h). Its attention also adds a
    bias to the scores from each token's relative states: r_proj (h → H·d_rel) mixes a table of d_rel profiles over
    the distance (d_rel × ``extent`` in the global layers, × the window in the local ones)."""

    kernel: Dimension = Field(description="K, the convolutions' taps (conv_kernel_size)")
    relative_width: Dimension = Field(description="d_rel, a head's relative states (d_rel)")
    extent: Dimension = Field(description="the distances the global layers' bias reaches (rel_extent)")
    dynamic_global: StrictBool = Field(
        False,
        description="the global layers' K and V convolutions are dynamic (Inkling 2's): a static weight "
        "(K × H_kv·d) plus one made a token by weight_proj (h → H_kv·K), applied element-wise; their K and V read "
        "inputs of their own, each normed (two more norms of h)",
    )
    scaled_clips: StrictBool = Field(
        False,
        description="learned scales on the queries (H × d) and on the relative states (H × d_rel) before "
        "their L2 clips (Inkling 2's), in place of QK norms",
    )
    sinks: StrictBool = Field(False, description="a sink logit a head and token from sink_proj, h → H (Inkling 2's)")
    block_residual: Dimension | None = Field(
        None,
        description="block attention residuals every this many layers (Inkling 2's n_layers_per_attn_res_block)"
        ": each sub-layer's input attends, with a learned query (three for a global layer's Q, K and V), over the "
        "blocks' states so far",
    )


class RetrievalExpertsSpec(Spec):
    """Doge's CDMoE (Shi et al. 2024, *Cross Domain Mixture of Experts*; transformers' DogeCDMoE), beside the layer's
    SwiGLU of ffn_size, its shared expert: E single-neuron experts, expert e a row of ``down_embed`` and of
    ``up_embed`` (h each), retrieved by product keys (Lample et al. 2019): router_gate (h → 2·√E, no bias) scores two
    halves of √E keys, each half's top √E, the top k of their √E² sums; a token's output gains
    Σ_j softmax(scores)_j · act(down_embed[e_j]·x) · up_embed[e_j]."""

    experts: Dimension = Field(description="E, the single-neuron experts (num_experts)")
    top_k: Dimension = Field(description="k, the experts a token retrieves (num_experts_per_tok)")
    normalized: StrictBool = Field(
        False, description="norm_topk_prob: the k weights divided by their sum, in place on softmax's output"
    )

    @property
    def keys(self) -> int:
        """√E, the keys of each half (``math.floor(math.sqrt(num_experts))``)."""
        return math.isqrt(self.experts)

    @model_validator(mode="after")
    def _k_within_the_products(self) -> Self:
        if self.top_k > self.keys**2:
            raise ValueError(f"retrieval_experts.top_k ({self.top_k}) is more than the {self.keys}² products of "
                             f"keys that {self.experts} experts give (at most {self.keys**2})")  # fmt: skip
        return self
