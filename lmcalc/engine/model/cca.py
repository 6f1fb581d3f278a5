"""ZAYA's parts (``specs.CcaSpec``, ``MoESpec.router_rank``; transformers' ZayaCCAProjection, ZayaResidualScaling,
ZayaRouter): the tensors and FLOPs its compressed convolutional attention adds to plain attention's, its residual
scaling, and its MLP router. ``engine.model.params`` and ``engine.model.flops`` take them from here."""

from __future__ import annotations

from lmcalc.engine.model.tensors import Dim, Site, WeightTensor, linear, tensor
from lmcalc.specs import ModelSpec


def cca_tensors(spec: ModelSpec) -> list[WeightTensor]:
    """Each layer's convolutions over the queries' and keys' C = (H + H_kv)·d channels, depthwise (C × t0, a bias of
    C) and grouped a head (C × d × t1, a bias of C), and its key scale (H_kv); the residual scaling, a scale and a bias
    on the stream and on each branch at both of a layer's residual adds (8·h), and on the embedding (2·h)."""
    c = spec.cca
    if c is None:
        return []
    L, h, d = spec.num_layers, Dim(spec.hidden_size, "h"), Dim(spec.head_size, "d")
    channels = Dim((spec.num_heads + spec.kv_heads) * spec.head_size, "C")
    attention, scales = Site("attention", L, "L"), Site("residual_scales", L, "L")
    return [
        tensor("attn.conv_depthwise.weight", attention, (channels, Dim(c.depthwise, "t0")), False),
        tensor("attn.conv_depthwise.bias", attention, (channels,), False),
        tensor("attn.conv_grouped.weight", attention, (channels, d, Dim(c.grouped, "t1")), False),
        tensor("attn.conv_grouped.bias", attention, (channels,), False),
        tensor("attn.key_scale", attention, (Dim(spec.kv_heads, "H_kv"),), False),
        *(tensor(f"residual.{site}.{part}", scales, (h,), False)
          for site in ("attn", "mlp") for part in ("branch_scale", "branch_bias", "stream_scale", "stream_bias")),
        *(tensor(f"embed.{part}", Site("residual_scales", 1, "1"), (h,), False) for part in ("scale", "bias")),
    ]  # fmt: skip


def mlp_router_tensors(spec: ModelSpec, router: Site) -> list[WeightTensor]:
    """ZAYA's router in each MoE layer: h → r with a bias, the scale of the previous MoE layer's router state (r; not
    in the first layer), an RMSNorm of r, two r × r layers with biases, and r → E + 1 scores."""
    moe = spec.moe
    assert moe is not None and moe.router_rank is not None
    h, r = Dim(spec.hidden_size, "h"), Dim(moe.router_rank, "r")
    first = 1 if spec.is_moe_layer(0) else 0
    later = Site("router", router.count - first, "(L_moe−1)" if first else router.count_symbol)
    return [
        *linear("router", router, r, h, True),  # down_proj, named as other MoE routers: it reads the MLP input
        tensor("router.state_scale", later, (r,), False),
        tensor("router.norm.weight", router, (r,), False),
        *linear("router.fc1", router, r, r, True),
        *linear("router.fc2", router, r, r, True),
        *linear("router.out", router, Dim(moe.router_outputs, "(E+1)"), r, False),
    ]


def cca_flops(spec: ModelSpec, seq_len: int) -> tuple[float, float]:
    """Forward FLOPs per token of CCA beyond the projections' weights, and of them the part whose backward computes
    no input gradient: the depthwise convolution, 2·C·t0 an output over the s + t1 − 1 outputs the padded sequence
    gives; the grouped one, 2·C·d·t1 a token; and the delayed value's projection of one zero token a sequence
    (ZayaCCAProjection's first token's previous), 2·h·H_kv·d/2, its input needing no gradient."""
    c = spec.cca
    if c is None:
        return 0.0, 0.0
    d = spec.head_size
    channels = (spec.num_heads + spec.kv_heads) * d
    convs = 2 * channels * c.depthwise * (seq_len + c.grouped - 1) / seq_len + 2 * channels * d * c.grouped
    zero_token = 2 * spec.hidden_size * spec.kv_heads * d // 2 / seq_len
    layers = spec.attention_layers
    return layers * (convs + zero_token), layers * zero_token
