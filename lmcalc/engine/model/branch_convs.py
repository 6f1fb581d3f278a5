"""Inkling's branch convolutions and relative logits (``specs.BranchConvSpec``; transformers' InklingAttention,
InklingShortConvolution, InklingRelativeLogits) and its learned global scales: the tensors they add and their FLOPs.
``engine.model.params`` and ``engine.model.flops`` take them from here."""

from __future__ import annotations

from lmcalc.engine.model.layer_reuse import message_flops
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
    each, the kind's H_kv; Inkling 2's global ones dynamic: that weight and weight_proj, h → H_kv·K) and the
    attention-output and MLP-output ones (h × K); Inkling 2's scales on the queries (H × d) and relative states
    (H × d_rel), its sink_proj (h → H) and its block residuals' queries (``block_tensors``); the global scales, one on
    each dense MLP and one on each router."""
    b = spec.branch_convs
    tensors: list[WeightTensor] = []
    if b is not None:
        L, h, K, d_rel = spec.num_layers, Dim(spec.hidden_size, "h"), Dim(b.kernel, "K"), Dim(b.relative_width, "d_rel")
        attention, H = Site("attention", L, "L"), Dim(spec.num_heads, "H")
        tensors += linear("attn.r_proj", attention, Dim(spec.num_heads * b.relative_width, "H·d_rel"), h, False)
        for symbol, layers, kv, extent in _kinds(spec):
            site = Site("attention", layers, symbol)
            tensors.append(tensor("attn.relative_table", site, (d_rel, Dim(extent, "extent")), False))
            tensors += [tensor(f"attn.{x}_conv", site, (Dim(kv, "H_kv·d"), K), False) for x in ("k", "v")]
            if b.dynamic_global and symbol == "L_global":  # and K's and V's inputs their own norms
                for x in ("k", "v"):
                    tensors += linear(f"attn.{x}_conv_weights", site, Dim(kv // spec.head_size * b.kernel, "H_kv·K"),
                                      h, False)  # fmt: skip
                    tensors.append(tensor(f"attn.{x}_input_norm", Site("norm", layers, symbol), (h,), False))
        tensors += [tensor(f"{x}_conv", attention, (h, K), False) for x in ("attn_out", "mlp_out")]
        if b.scaled_clips:
            tensors.append(tensor("attn.q_scale", attention, (H, Dim(spec.head_size, "d")), False))
            tensors.append(tensor("attn.relative_scale", attention, (H, d_rel), False))
        if b.sinks:
            tensors += linear("attn.sink_proj", attention, H, h, False)
        tensors += block_tensors(spec)
    if spec.global_scales:
        one = (Dim(1, "1"),)
        if spec.dense_ffn_layers:
            tensors.append(tensor("mlp.global_scale", Site("mlp", spec.dense_ffn_layers, "L_dense"), one, False))
        if spec.moe_layers:
            tensors.append(tensor("router.global_scale", Site("router", spec.moe_layers, "L_moe"), one, False))
    return tensors


def block_counts(spec: ModelSpec) -> list[tuple[int, int, int]]:
    """For each layer of a model with block attention residuals: its queries before attention (0 in the first layer,
    1 in a local one, 3 in a global one for Q, K and V), the states they attend over (the blocks so far and the
    partial one), and the states the MLP's input attends over (one more where the layer opens a block)."""
    b = spec.branch_convs
    assert b is not None and b.block_residual
    n, counts = b.block_residual, []
    for run in range(spec.num_layers):  # a looped model's run: its held layer's place (each pass restarts the blocks)
        i = spec.layer_reuse.weights[run] if spec.layer_reuse else run
        blocks = -(-i // n)  # the layers before i that open a block: 0, n, 2n, …
        queries = 0 if i == 0 else (1 if spec.is_local_layer(run) else 3)
        counts.append((queries, blocks + 1, blocks + 1 + (1 if i % n == 0 else 0)))
    return counts


def _held(spec: ModelSpec) -> int:
    """The layers the model holds: a looped model's held layers, else every layer."""
    return spec.layer_reuse.held if spec.layer_reuse else spec.num_layers


def block_tensors(spec: ModelSpec) -> list[WeightTensor]:
    """Block attention residuals' learned queries (Inkling2BlockAttentionResidual): h before each layer's MLP; h before
    a local layer's attention, 3·h before a global one's (Q, K and V), none in the first layer; h before the final
    norm."""
    b = spec.branch_convs
    if b is None or not b.block_residual:
        return []
    h, runs = spec.hidden_size, spec.layer_reuse.weights if spec.layer_reuse else range(spec.num_layers)
    firsts = {layer: run for run, layer in reversed(list(enumerate(runs)))}  # a held layer's queries, once
    counts = block_counts(spec)
    queries = sum(counts[run][0] for run in firsts.values()) + _held(spec) + 1
    return [tensor("block_residual.queries", Site("residual_scales", 1, "1"), (Dim(queries * h, "q·h"),), False)]


def block_flops(spec: ModelSpec) -> float:
    """Forward FLOPs per token of the block attention residuals: each query against the m states, QKᵀ and AV, 2·2·m·h
    a query (unweighted norms and the softmax element-wise), before each layer's attention and MLP and the final
    norm; and Inkling 2's loop messages (``layer_reuse.message_flops``)."""
    b = spec.branch_convs
    if b is None or not b.block_residual:
        return 0.0
    h, counts = spec.hidden_size, block_counts(spec)
    final = -(-_held(spec) // b.block_residual) + 1
    return 4 * h * (sum(q * m + m_mlp for q, m, m_mlp in counts) + final) + message_flops(spec, b.block_residual)


def branch_conv_flops(spec: ModelSpec, seq_len: int) -> float:
    """Forward FLOPs per token beyond the weights' matmuls: the relative states' product with the bias table,
    2·H·d_rel·extent a token; each convolution 2·channels·K an output, over the s + K − 1 outputs its padding of K − 1
    on both sides gives (causal_conv1d_fn keeps the first s)."""
    b = spec.branch_convs
    if b is None:
        return 0.0
    outputs = (seq_len + b.kernel - 1) / seq_len
    total = block_flops(spec)
    for symbol, layers, kv, extent in _kinds(spec):
        convs = 0 if b.dynamic_global and symbol == "L_global" else 2 * 2 * kv * b.kernel * outputs  # element-wise
        total += layers * (2 * spec.num_heads * b.relative_width * extent + convs)
    return total + spec.num_layers * 2 * 2 * spec.hidden_size * b.kernel * outputs


def branch_conv_state(spec: ModelSpec) -> int:
    """Bytes a sequence's convolutions keep in serving: each convolution's last K inputs, in fp32 (Inkling's cache)."""
    b = spec.branch_convs
    if b is None:
        return 0
    per_layer = sum(layers * 2 * kv for _, layers, kv, _ in _kinds(spec)) + spec.num_layers * 2 * spec.hidden_size
    return per_layer * b.kernel * 4
