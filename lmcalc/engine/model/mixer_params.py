"""The tensors of a hybrid's mixers in its layers that do not attend: Mamba (Jamba), Mamba-2 (Bamba, Granite 4,
Nemotron-H), Gated DeltaNet (Qwen3-Next, Qwen3.5), LFM2's gated short convolutions and MiniMax-01's lightning
attention, each as its transformers module builds it. ``engine.model.params.weight_tensors`` lists them after the
attention's."""

from __future__ import annotations

from lmcalc.engine.model.tensors import Dim, Site, WeightTensor, linear, tensor
from lmcalc.specs import ModelSpec


def mixer_tensors(spec: ModelSpec) -> list[WeightTensor]:
    """The tensors of the model's other mixer, in its M − A layers that do not attend (none but in a hybrid)."""
    mixers = (_mamba, _deltanet, _mamba2, _short_conv, _lightning, _rwkv, _rglru, _mlstm)
    return [t for mixer in mixers for t in mixer(spec)]


def _rglru(spec: ModelSpec) -> list[WeightTensor]:
    """Griffin's recurrent block (``RgLruSpec``; RecurrentGemmaRecurrentBlock, RecurrentGemmaRglru): linear_y and
    linear_x (h → w), the depthwise convolution (w × K, and a bias), the RG-LRU's decay (w), its input and recurrence
    gates (H blocks of w/H × w/H, a batched matmul each, and biases of H · w/H), and linear_out (w → h); every
    projection with a bias."""
    r = spec.rglru
    if r is None:
        return []
    h, w, bw = Dim(spec.hidden_size, "h"), Dim(r.width, "w"), Dim(r.block_width, "w/H")
    site = Site("ssm", spec.other_mixer_layers, "L_lin")
    tensors = linear("rglru.linear_y", site, w, h, True) + linear("rglru.linear_x", site, w, h, True)
    tensors += [
        tensor("rglru.conv.weight", site, (w, Dim(r.conv_kernel, "K")), False),
        tensor("rglru.conv.bias", site, (w,), False),
    ]
    tensors.append(tensor("rglru.recurrent_param", site, (w,), False))
    for gate in ("input_gate", "recurrent_gate"):
        tensors.append(tensor(f"rglru.{gate}_weight", site, (Dim(r.heads, "H"), bw, bw), True))
        tensors.append(tensor(f"rglru.{gate}_bias", site, (Dim(r.heads, "H"), bw), False))
    return tensors + linear("rglru.linear_out", site, h, w, True)


def _mlstm(spec: ModelSpec) -> list[WeightTensor]:
    """xLSTM's mLSTM layer (``MLstmSpec``; xLSTMLayer): q and k (h → d_qk), v and the output gate (h → d_v), the input
    and forget gates (h → NH, with biases), the per-head norm's weight over d_v, and out_proj (d_v → h)."""
    m = spec.mlstm
    if m is None:
        return []
    h, qk, v, heads = Dim(spec.hidden_size, "h"), Dim(m.qk_dim, "d_qk"), Dim(m.v_dim, "d_v"), Dim(m.heads, "NH")
    site = Site("ssm", spec.other_mixer_layers, "L_lin")
    tensors = linear("mlstm.q", site, qk, h, False) + linear("mlstm.k", site, qk, h, False)
    tensors += linear("mlstm.v", site, v, h, False) + linear("mlstm.ogate", site, v, h, False)
    tensors += linear("mlstm.igate", site, heads, h, True) + linear("mlstm.fgate", site, heads, h, True)
    tensors.append(tensor("mlstm.multihead_norm.weight", site, (v,), False))
    return tensors + linear("mlstm.out_proj", site, h, v, False)


def _rwkv(spec: ModelSpec) -> list[WeightTensor]:
    """RWKV-4's (``RwkvSpec``): the time mix's decay and bonus (a each), its token-shift coefficients for k, v and r
    (h each), its receptance, key and value (h → a) and output (a → h) projections; the channel mix's token-shift
    coefficients for k and r (h each) and its receptance (h → h), beside the FFN's key and value (RwkvSelfAttention,
    RwkvFeedForward)."""
    r = spec.rwkv
    if r is None:
        return []
    h, a = Dim(spec.hidden_size, "h"), Dim(r.attention_size, "a")
    site = Site("ssm", spec.other_mixer_layers, "L_lin")
    tensors = [tensor(f"time_mix.{name}", site, (a,), False) for name in ("time_decay", "time_first")]
    tensors += [tensor(f"time_mix.mix_{x}", site, (h,), False) for x in ("k", "v", "r")]
    for name in ("receptance", "key", "value"):
        tensors += linear(f"time_mix.{name}", site, a, h, False)
    tensors += linear("time_mix.output", site, h, a, False)
    channel = Site("mlp", spec.num_layers, "L")
    tensors += [tensor(f"channel_mix.mix_{x}", channel, (h,), False) for x in ("k", "r")]
    return tensors + linear("channel_mix.receptance", channel, h, h, False)


def _mamba(spec: ModelSpec) -> list[WeightTensor]:
    """A state-space layer's tensors, as Mamba (Gu & Dao 2023, §3.4) and Jamba's transformers module build them: the
    input projection to x and the gate z (2·d_in × h), the causal depthwise convolution (d_in × d_conv, and a bias),
    the projection of x to Δ's rank and to B and C (r + 2N) × d_in, Δ's up-projection (d_in × r, with a bias),
    A (d_in × N, kept as its log), D (d_in), the output projection (h × d_in), and Jamba's RMSNorms on Δ, B and C."""
    m = spec.mamba
    if m is None:
        return []
    h, d_in, N, r = Dim(spec.hidden_size, "h"), Dim(m.d_inner, "d_in"), Dim(m.d_state, "N"), Dim(m.dt_rank, "r")
    site = Site("ssm", spec.other_mixer_layers, "L_ssm")
    tensors = linear("ssm.in_proj", site, Dim(2 * m.d_inner, "2·d_in"), h, m.proj_bias)
    tensors.append(tensor("ssm.conv.weight", site, (d_in, Dim(m.d_conv, "d_conv")), False))
    if m.conv_bias:
        tensors.append(tensor("ssm.conv.bias", site, (d_in,), False))
    tensors += linear("ssm.x_proj", site, Dim(m.dt_rank + 2 * m.d_state, "(r+2N)"), d_in, False)
    tensors += linear("ssm.dt_proj", site, d_in, r, True)
    tensors += [tensor("ssm.A_log", site, (d_in, N), False), tensor("ssm.D", site, (d_in,), False)]
    tensors += linear("ssm.out_proj", site, h, d_in, m.proj_bias)
    if m.inner_norms:
        tensors += [
            tensor(f"ssm.{name}_norm.weight", site, (size,), False) for name, size in (("dt", r), ("b", N), ("c", N))
        ]
    return tensors


def _mamba2(spec: ModelSpec) -> list[WeightTensor]:
    """A Mamba-2 layer's tensors, as transformers' Bamba and Granite 4 build them: the input projection to z (I), x (I),
    B and C (G·N each) and Δ (H), the causal depthwise convolution over x‖B‖C and its bias, Δ's bias, A (as its log)
    and D per head, the gated RMSNorm's weight (I), the output projection (h × I)."""
    m = spec.mamba2
    if m is None:
        return []
    h, site = Dim(spec.hidden_size, "h"), Site("ssm", spec.other_mixer_layers, "L_ssm")
    heads, inner = Dim(m.heads, "H"), Dim(m.inner, "I")
    width = Dim(2 * m.inner + 2 * m.groups * m.state + m.heads, "(2·I+2·G·N+H)")
    tensors = linear("ssm.in_proj", site, width, h, m.proj_bias)
    conv = Dim(m.conv_channels, "(I+2·G·N)")
    tensors.append(tensor("ssm.conv.weight", site, (conv, Dim(m.conv_kernel, "K")), False))
    if m.conv_bias:
        tensors.append(tensor("ssm.conv.bias", site, (conv,), False))
    tensors += [tensor(f"ssm.{name}", site, (heads,), False) for name in ("dt_bias", "A_log", "D")]
    if m.gated_norm:
        tensors.append(tensor("ssm.norm.weight", site, (inner,), False))
    tensors += linear("ssm.out_proj", site, h, inner, m.proj_bias)
    return tensors


def _short_conv(spec: ModelSpec) -> list[WeightTensor]:
    """A gated short-convolution layer's tensors, as transformers' Lfm2ShortConv builds them: the input projection to
    B, C and x (3h × h), the causal depthwise convolution (h × K), the output projection (h × h), each with a bias
    where conv_bias says so."""
    m = spec.short_conv
    if m is None:
        return []
    h, site = Dim(spec.hidden_size, "h"), Site("ssm", spec.other_mixer_layers, "L_conv")
    tensors = linear("conv.in_proj", site, Dim(3 * spec.hidden_size, "3h"), h, m.bias)
    tensors.append(tensor("conv.conv.weight", site, (h, Dim(m.conv_kernel, "K")), False))
    if m.bias:
        tensors.append(tensor("conv.conv.bias", site, (h,), False))
    return tensors + linear("conv.out_proj", site, h, h, m.bias)


def _deltanet(spec: ModelSpec) -> list[WeightTensor]:
    """A Gated DeltaNet layer's tensors, as transformers' Qwen3NextGatedDeltaNet builds them (no biases): the input
    projections to q and k (H_k·d_k each), v and the output gate z (H_v·d_v each), and β and α (H_v each); the causal
    depthwise convolution over q, k and v (2·H_k·d_k + H_v·d_v channels × kernel); Δ's bias and A (H_v each, A kept
    as its log); the gated RMSNorm's weight (d_v, shared by the heads); the output projection (h × H_v·d_v). Qwen3.5
    and OLMo Hybrid hold the same input projections in four and six modules. Kimi Delta Attention (``channel_decay``)
    projects q, k, v and β alike, its forget gate to H·d_k (Δ's bias per channel too) and its output gate to H·d_v,
    each through rank r where ``gate_rank`` says so."""
    m = spec.deltanet
    if m is None:
        return []
    h, site = Dim(spec.hidden_size, "h"), Site("ssm", spec.other_mixer_layers, "L_lin")
    hv, qkvz = Dim(m.value_heads, "H_v"), Dim(2 * m.key_heads * m.key_head_dim + 2 * m.value_heads * m.value_head_dim,
                                              "(2·H_k·d_k+2·H_v·d_v)")  # fmt: skip
    vd = Dim(m.value_heads * m.value_head_dim, "H_v·d_v")
    if m.channel_decay:  # Kimi Delta Attention: q, k, v, β, and the two gates, low-rank or not
        kd = Dim(m.key_heads * m.key_head_dim, "H·d_k")
        tensors = linear("linear_attn.q", site, kd, h, False) + linear("linear_attn.k", site, kd, h, False)
        tensors += linear("linear_attn.v", site, vd, h, False)
        tensors += _gate(site, "f", kd, h, m.gate_rank) + linear("linear_attn.b", site, hv, h, False)
        tensors += _gate(site, "g", vd, h, m.gate_rank)
    elif m.separate_projections:  # OLMo Hybrid: a module each for q, k, v, the gate, β and α, and o_proj
        kd = Dim(m.key_heads * m.key_head_dim, "H_k·d_k")
        tensors = linear("linear_attn.q", site, kd, h, False) + linear("linear_attn.k", site, kd, h, False)
        tensors += linear("linear_attn.v", site, vd, h, False) + linear("linear_attn.g", site, vd, h, False)
        tensors += linear("linear_attn.b", site, hv, h, False) + linear("linear_attn.a", site, hv, h, False)
    elif m.split_projections:  # Qwen3.5: one module for q‖k‖v, one each for z, β and α
        tensors = linear("linear_attn.in_proj_qkv", site, Dim(m.conv_channels, "(2·H_k·d_k+H_v·d_v)"), h, False)
        tensors += linear("linear_attn.in_proj_z", site, vd, h, False)
        tensors += linear("linear_attn.in_proj_b", site, hv, h, False)
        tensors += linear("linear_attn.in_proj_a", site, hv, h, False)
    else:
        tensors = linear("linear_attn.in_proj_qkvz", site, qkvz, h, False)
        tensors += linear("linear_attn.in_proj_ba", site, Dim(2 * m.value_heads, "2·H_v"), h, False)
    conv = Dim(m.conv_channels, "(2·H_k·d_k+H_v·d_v)")
    tensors.append(tensor("linear_attn.conv.weight", site, (conv, Dim(m.conv_kernel, "K")), False))
    decay = Dim(m.decay_width, "H·d_k" if m.channel_decay else "H_v")  # Δ's bias: per key channel in KDA
    tensors += [tensor("linear_attn.dt_bias", site, (decay,), False), tensor("linear_attn.A_log", site, (hv,), False)]
    tensors.append(tensor("linear_attn.norm.weight", site, (Dim(m.value_head_dim, "d_v"),), False))
    tensors += linear("linear_attn.o" if m.separate_projections else "linear_attn.out_proj", site, h, vd, False)
    return tensors


def _gate(site: Site, name: str, width: Dim, h: Dim, rank: int | None) -> list[WeightTensor]:
    """Kimi Delta Attention's forget gate (``f``) or output gate (``g``): one projection h → width, or two through
    rank r (Kimi Linear's f_a_proj and f_b_proj, g_a_proj and g_b_proj)."""
    if rank is None:
        return linear(f"linear_attn.{name}", site, width, h, False)
    r = Dim(rank, "r")
    return linear(f"linear_attn.{name}_a", site, r, h, False) + linear(f"linear_attn.{name}_b", site, width, r, False)


def _lightning(spec: ModelSpec) -> list[WeightTensor]:
    """A lightning-attention layer's tensors, as transformers' MiniMaxLightningAttention builds them (no biases): the
    RMSNorm over the heads' output (H·d), the projection to q, k and v (3·H·d × h), the output gate's projection of the
    layer's input (H·d × h) and the output projection (h × H·d)."""
    m = spec.lightning
    if m is None:
        return []
    h, site = Dim(spec.hidden_size, "h"), Site("ssm", spec.other_mixer_layers, "L_lin")
    inner = Dim(m.heads * m.head_dim, "H·d")
    return (
        [tensor("lightning.norm.weight", site, (inner,), False)]
        + linear("lightning.qkv", site, Dim(3 * m.heads * m.head_dim, "3·H·d"), h, False)
        + linear("lightning.output_gate", site, inner, h, False)
        + linear("lightning.out_proj", site, h, inner, False)
    )
