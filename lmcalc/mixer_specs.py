"""The mixers of a hybrid's layers that do not attend: Mamba (Jamba), Mamba-2 (Bamba, Granite 4), Gated DeltaNet
(Qwen3-Next, Qwen3.5), the gated short convolution (LFM2) and lightning attention (MiniMax-01), each with the layers
that attend instead (``ModelSpec.is_attention_layer``).

The annotations are types, not text (no ``from __future__ import annotations``), for the reason ``specs`` gives."""

from typing import Self

from pydantic import Field, model_validator

from lmcalc.spec_base import Dimension, LayerIndex, NonNegativeInt, PositiveInt, Spec, StrictBool, no_items


class MambaSpec(Spec):
    """Selective state-space mixers (Mamba, Gu & Dao 2023, §3) in the layers that do not attend: a hybrid such as
    Jamba (Lieber et al. 2024), whose layer i attends when i % attention_every == attention_offset, or a Mamba model
    whose layers are all Mamba blocks (attention_every None)."""

    d_inner: Dimension = Field(description="the inner width: mamba_expand × hidden_size")
    d_state: Dimension = Field(description="N, the state size per channel")
    d_conv: Dimension = Field(description="the causal depthwise convolution's kernel")
    dt_rank: Dimension = Field(description="the rank of Δ's projection")
    conv_bias: StrictBool = True
    proj_bias: StrictBool = Field(False, description="biases on the in and out projections")
    inner_norms: StrictBool = Field(False, description="RMSNorms on Δ, B and C (Jamba)")
    attention_every: PositiveInt | None = Field(description="None: no layer attends (Mamba, Falcon Mamba)")
    attention_offset: NonNegativeInt = 0

    @model_validator(mode="after")
    def _offset_in_period(self) -> Self:
        if self.attention_every is not None and self.attention_offset >= self.attention_every:
            raise ValueError(f"attention_offset ({self.attention_offset}) must be below attention_every")
        return self


class Mamba2Spec(Spec):
    """Mamba-2 mixers (Dao & Gu 2024, "Transformers are SSMs", §7: the state-space dual) in the layers that do not
    attend, as transformers' Bamba and Granite 4 build them: one input projection to the gate z, x, B and C (G groups
    of the state size N) and Δ (one a head), a causal depthwise convolution over x‖B‖C, Δ's bias, A and D per head,
    a gated RMSNorm over the inner width, and the output projection. The layers in attention_layer_ids attend."""

    inner: Dimension = Field(description="I, the inner width: heads × head_dim (mamba_expand × hidden_size)")
    heads: Dimension = Field(description="H, the SSM heads (mamba_n_heads)")
    groups: Dimension = Field(1, description="G, the groups B and C are shared over (mamba_n_groups)")
    state: Dimension = Field(description="N, the state size (mamba_d_state)")
    conv_kernel: Dimension = Field(description="the causal depthwise convolution's kernel (mamba_d_conv)")
    chunk: Dimension = Field(256, description="the chunked scan's chunk length (mamba_chunk_size)")
    conv_bias: StrictBool = True
    proj_bias: StrictBool = Field(False, description="biases on the in and out projections")
    gated_norm: StrictBool = Field(
        True, description="a gated RMSNorm with a weight over the inner width (Falcon-H1 without mamba_rms_norm: none)"
    )
    parallel: StrictBool = Field(
        False,
        description="every layer runs attention and Mamba-2 side by side on one norm's output, their outputs summed "
        "(Falcon-H1's FalconH1DecoderLayer); attention_layer_ids then names none",
    )
    attention_layer_ids: tuple[LayerIndex, ...] = Field(
        default_factory=no_items, description="the layers (from 0) that attend; the others run Mamba-2 alone"
    )

    @model_validator(mode="after")
    def _heads_tile(self) -> Self:
        if self.inner % self.heads or self.heads % self.groups:
            raise ValueError(f"inner ({self.inner}) must tile into heads ({self.heads}), heads into groups")
        if self.parallel and self.attention_layer_ids:
            raise ValueError("parallel Mamba-2 runs beside attention in every layer: attention_layer_ids names none")
        return self

    @property
    def head_dim(self) -> int:
        return self.inner // self.heads

    @property
    def conv_channels(self) -> int:
        """x, B and C, convolved together: I + 2·G·N."""
        return self.inner + 2 * self.groups * self.state


class DeltaNetSpec(Spec):
    """Gated DeltaNet mixers (Yang, Kautz & Hatamizadeh 2025, "Gated Delta Networks", §3) in the layers that do not
    attend, as Qwen3-Next and Qwen3.5 build them (transformers' Qwen3NextGatedDeltaNet): q and k in key heads, v and
    the output gate z in value heads, a causal depthwise convolution over q, k and v, a decay α and a write strength β
    per value head, a gated RMSNorm on each head's output. Layer i attends when i % attention_every ==
    attention_offset (Qwen3-Next: every fourth layer, from the fourth), or when attention_layer_ids names it. Kimi
    Delta Attention (``channel_decay``) is the same rule with a decay per key channel."""

    key_heads: Dimension = Field(description="H_k, linear_num_key_heads")
    value_heads: Dimension = Field(description="H_v, linear_num_value_heads (a multiple of H_k)")
    key_head_dim: Dimension = Field(description="d_k, linear_key_head_dim")
    value_head_dim: Dimension = Field(description="d_v, linear_value_head_dim")
    conv_kernel: Dimension = Field(description="the causal depthwise convolution's kernel, linear_conv_kernel_dim")
    chunk: Dimension = Field(64, description="the chunked delta rule's chunk length (fla's and transformers' 64)")
    split_projections: StrictBool = Field(
        False,
        description="q‖k‖v, z, β and α projected by four modules (Qwen3.5's in_proj_qkv, in_proj_z, in_proj_b, "
        "in_proj_a), not two (Qwen3-Next's in_proj_qkvz and in_proj_ba): the same weights, but a LoRA adapter each",
    )
    separate_projections: StrictBool = Field(
        False,
        description="q, k, v, the output gate, β and α each projected by a module of its own and the output by o_proj "
        "(OLMo Hybrid's q_proj, k_proj, v_proj, g_proj, b_proj, a_proj): the same weights, six LoRA adapters in",
    )
    channel_decay: StrictBool = Field(
        False,
        description="Kimi Delta Attention (Kimi Team 2025, arXiv:2510.26692 §3): a decay per key channel, not per "
        "head, its forget gate projected to H·d_k with Δ's bias per channel (Kimi Linear, Bailing hybrid); q, k and "
        "v by three modules of their own, as separate_projections, in heads of one width",
    )
    gate_rank: Dimension | None = Field(
        None,
        description="with channel_decay, the rank r of the forget gate's and the output gate's two-step projections "
        "(Kimi Linear's f_a_proj h → r, f_b_proj r → H·d_k, and g_a_proj, g_b_proj, with r = d_k); None: each gate "
        "one projection from h (Bailing's f_proj and g_proj)",
    )
    attention_every: PositiveInt | None = Field(None, description="layer i attends when i % attention_every == offset")
    attention_offset: NonNegativeInt = 0
    attention_layer_ids: tuple[LayerIndex, ...] = Field(
        default_factory=no_items,
        description="the layers (from 0) that attend, where no period describes them (Kimi Linear's 3, 7, …, 23 and "
        "the last); give this or attention_every",
    )

    @model_validator(mode="after")
    def _heads_and_offset(self) -> Self:
        if (self.attention_every is None) == (not self.attention_layer_ids):
            raise ValueError("give the layers that attend by attention_every or by attention_layer_ids: one of them")
        if self.attention_every is not None and self.attention_offset >= self.attention_every:
            raise ValueError(f"attention_offset ({self.attention_offset}) must be below attention_every")
        if self.split_projections and self.separate_projections:
            raise ValueError("split_projections and separate_projections are two layouts: give one")
        if self.value_heads % self.key_heads:
            raise ValueError(f"value_heads ({self.value_heads}) must be a multiple of key_heads ({self.key_heads})")
        kda_shape = self.key_heads == self.value_heads and self.key_head_dim == self.value_head_dim
        if self.channel_decay and not (self.separate_projections and kda_shape):
            raise ValueError("channel_decay (Kimi Delta Attention) projects q, k and v apart "
                             "(separate_projections), in heads of one width: key_heads = value_heads, key_head_dim = "
                             "value_head_dim")  # fmt: skip
        if self.gate_rank is not None and not self.channel_decay:
            raise ValueError("gate_rank is the rank of Kimi Delta Attention's gates: it needs channel_decay")
        return self

    @property
    def decay_width(self) -> int:
        """The decay's width a token: H_v·d_k per key channel (Kimi Delta Attention), else H_v, one a value head."""
        return self.value_heads * self.key_head_dim if self.channel_decay else self.value_heads

    @property
    def conv_channels(self) -> int:
        """q, k and v, convolved together: 2·H_k·d_k + H_v·d_v."""
        return 2 * self.key_heads * self.key_head_dim + self.value_heads * self.value_head_dim


class ShortConvSpec(Spec):
    """LFM2's gated short convolutions (Liquid AI's LFM2 technical report: "double-gated short convolution") in the
    layers that do not attend, as transformers' Lfm2ShortConv builds them: one input projection of h to B, C and x (3h),
    the product B·x through a causal depthwise convolution of a few taps (conv_L_cache), gated again by C, and the
    output projection (h × h). The layers in attention_layer_ids attend."""

    conv_kernel: Dimension = Field(description="K, the causal depthwise convolution's taps (conv_L_cache)")
    bias: StrictBool = Field(False, description="biases on the convolution and both projections (conv_bias)")
    attention_layer_ids: tuple[LayerIndex, ...] = Field(description="the layers (from 0) that attend")


class LightningSpec(Spec):
    """MiniMax-01's lightning attention (MiniMax 2025, arXiv:2501.08313 §2.2; Qin et al. 2024) in the layers that do
    not attend, as transformers' MiniMaxLightningAttention builds it: one projection of h to SiLU(q‖k‖v) over H heads of
    d, linear attention with a per-head decay computed block by block (within a block as masked products, across
    blocks through an H × d × d state), an RMSNorm over H·d, a sigmoid gate from the layer's input, and the output
    projection. The layers in attention_layer_ids attend (softmax attention)."""

    heads: Dimension = Field(description="H, the heads (num_attention_heads)")
    head_dim: Dimension = Field(description="d, each head's width (head_dim, else hidden_size / heads)")
    block: Dimension = Field(256, description="B, the block length of the blockwise computation (block_size)")
    attention_layer_ids: tuple[LayerIndex, ...] = Field(description="the layers (from 0) that attend")


RWKV_COUNTED_ONLY = (
    "xLSTM's mode train_with_padding (mlstm.padded) is counted by lmcalc params, lmcalc flops, lmcalc "
    "train-time (full training, at an MFU) and the serving memory (memory --inference) alone: transformers 5.24 "
    "cannot train in it (xLSTMLayer unpacks a state its padded kernel does not return), so lmcalc's training "
    "memory, fine-tuning and step-time model do not take it (docs/formulas.md §2.29)"
)


class RwkvSpec(Spec):
    """RWKV-4 (Peng et al. 2023, *RWKV: Reinventing RNNs for the Transformer Era*; transformers' RwkvBlock): no layer
    attends. Each layer's time mix projects the token mixed with the one before (token shift, a coefficient a channel
    for each of r, k and v) to a receptance, a key and a value (h → a each), runs the WKV recurrence with a learned
    decay and bonus a channel (a each), gates it by sigmoid(r) and projects it back (a → h); its channel mix is an MLP
    of squared ReLU (key h → f, value f → h: the model's FFN) gated by sigmoid(receptance) (h → h), on token-shifted
    inputs (two coefficients of h)."""

    attention_size: Dimension = Field(description="a, the time mix's width (attention_hidden_size, else h)")


class RgLruSpec(Spec):
    """Griffin's recurrent blocks (De et al. 2024, *Griffin*; RecurrentGemma: RecurrentGemmaRecurrentBlock) in the
    layers that do not attend: two input projections h → w (one through GeLU, the gate y; one through a causal
    depthwise convolution of K taps into the RG-LRU), the RG-LRU's input and recurrence gates (block-diagonal, heads
    blocks of w/heads, with biases) and its decay a channel, and the output projection w → h, every projection with a
    bias. The layers in attention_layer_ids attend (local MQA)."""

    width: Dimension = Field(description="w, the recurrence's width (lru_width, else h)")
    heads: Dimension = Field(description="the gates' diagonal blocks (num_attention_heads)")
    conv_kernel: Dimension = Field(description="K, the causal depthwise convolution's taps (conv1d_width)")
    attention_layer_ids: tuple[LayerIndex, ...] = Field(description="the layers (from 0) that attend")

    @property
    def block_width(self) -> int:
        """A gate block's width, w // heads (RecurrentGemmaRglru floors it, and its gates' biases are heads of it)."""
        return self.width // self.heads


class MLstmSpec(Spec):
    """xLSTM's mLSTM layers (Beck et al. 2024, *xLSTM*; xLSTM-7B, Beck et al. 2025; transformers' xLSTMLayer) in every
    layer, none attending: queries and keys (h → d_qk each), values and the output gate (h → d_v each), input and
    forget gates a head (h → NH, with biases), the matrix memory C (d_qk/NH × d_v/NH a head) with exponential gating,
    a per-head norm over the values' width (a weight of d_v) and the output projection d_v → h. transformers runs it
    chunkwise in training (``chunk``), the tokens past the last whole chunk one step at a time, unless ``padded``."""

    heads: Dimension = Field(description="NH, the heads (num_heads)")
    qk_dim: Dimension = Field(description="d_qk, the queries' and keys' width over all heads (h × qk_dim_factor)")
    v_dim: Dimension = Field(description="d_v, the values' width over all heads (h × v_dim_factor)")
    chunk: Dimension = Field(64, description="L, the chunkwise kernel's chunk (chunk_size)")
    padded: StrictBool = Field(
        False,
        description="the sequence is padded to whole chunks (mode train_with_padding); false: the remainder "
        "runs step by step",
    )

    @model_validator(mode="after")
    def _heads_tile_the_widths(self) -> Self:
        if self.qk_dim % self.heads or self.v_dim % self.heads:
            raise ValueError(f"mlstm.heads ({self.heads}) must divide qk_dim ({self.qk_dim}) and v_dim ({self.v_dim})")
        return self

    @property
    def key_head_dim(self) -> int:
        return self.qk_dim // self.heads

    @property
    def value_head_dim(self) -> int:
        return self.v_dim // self.heads
