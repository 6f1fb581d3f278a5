"""Inkling's branch convolutions and relative logits (``specs.BranchConvSpec``; transformers' InklingAttention,
InklingShortConvolution, InklingRelativeLogits) and its learned global scales: the tensors they add and their FLOPs.
``engine.model.params`` and ``engine.model.flops`` take them from here."""

from __future__ import annotations

from lmcalc.engine.model.tensors import Dim, Site, WeightTensor, linear, tensor
from lmcalc.specs import ModelSpec


def _kinds(spec: ModelSpec) -> list[tuple[str, int, int, int]]:
    """Each kind of attention layer: its count symbol, its layers, its K and V width (H_kv·d) and its bias's extent
    (the global layers' rel_extent, the local ones' window)."""
    b = spec.branch_convs
    assert b is not None
    local, d = spec.local_layers, spec.head_size
    kinds = [("L_global", spec.attention_layers - local, spec.kv_heads * d, b.extent)]
    if local:
        kinds.append(("L_local", local, (spec.local_kv_heads or spec.kv_heads) * d, spec.sliding_window or b.extent))
    return [kind for kind in kinds if kind[1]]


def branch_conv_tensors(spec: ModelSpec) -> list[WeightTensor]:
    """Each layer's r_proj (h → H·d_rel), its bias table (d_rel × its extent), the K and V convolutions (H_kv·d × K
    each, the kind's H_kv) and the attention-output and MLP-output ones (h × K); the global scales, one on each dense
    MLP and one on each router."""
    b = spec.branch_convs
    tensors: list[WeightTensor] = []
    if b is not None:
        L, h, K, d_rel = spec.num_layers, Dim(spec.hidden_size, "h"), Dim(b.kernel, "K"), Dim(b.relative_width, "d_rel")
        attention = Site("attention", L, "L")
        tensors += linear("attn.r_proj", attention, Dim(spec.num_heads * b.relative_width, "H·d_rel"), h, False)
        for symbol, layers, kv, extent in _kinds(spec):
            site = Site("attention", layers, symbol)
            tensors.append(tensor("attn.relative_table", site, (d_rel, Dim(extent, "extent")), False))
            tensors += [tensor(f"attn.{x}_conv", site, (Dim(kv, "H_kv·d"), K), False) for x in ("k", "v")]
        tensors += [tensor(f"{x}_conv", attention, (h, K), False) for x in ("attn_out", "mlp_out")]
    if spec.global_scales:
        one = (Dim(1, "1"),)
        if spec.dense_ffn_layers:
            tensors.append(tensor("mlp.global_scale", Site("mlp", spec.dense_ffn_layers, "L_dense"), one, False))
        if spec.moe_layers:
            tensors.append(tensor("router.global_scale", Site("router", spec.moe_layers, "L_moe"), one, False))
    return tensors


def branch_conv_flops(spec: ModelSpec, seq_len: int) -> float:
    """Forward FLOPs per token beyond the weights' matmuls: the relative states' product with the bias table,
    2·H·d_rel·extent a token; each convolution 2·channels·K an output, over the s + K − 1 outputs its padding of K − 1
    on both sides gives (causal_conv1d_fn keeps the first s)."""
    b = spec.branch_convs
    if b is None:
        return 0.0
    outputs = (seq_len + b.kernel - 1) / seq_len
    total = 0.0
    for _, layers, kv, extent in _kinds(spec):
        total += layers * (2 * spec.num_heads * b.relative_width * extent + 2 * 2 * kv * b.kernel * outputs)
    return total + spec.num_layers * 2 * 2 * spec.hidden_size * b.kernel * outputs


def branch_conv_state(spec: ModelSpec) -> int:
    """Bytes a sequence's convolutions keep in serving: each convolution's last K inputs, in fp32 (Inkling's cache)."""
    b = spec.branch_convs
    if b is None:
        return 0
    per_layer = sum(layers * 2 * kv for _, layers, kv, _ in _kinds(spec)) + spec.num_layers * 2 * spec.hidden_size
    return per_layer * b.kernel * 4
