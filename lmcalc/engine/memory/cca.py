"""What ZAYA's layer keeps for backward beyond a Llama MoE layer's (Zyphra's ZAYA1; Figliolia et al. 2025, *Compressed
Convolutional Attention*, arXiv:2510.04476; transformers 5.24's ZayaCCAProjection, ZayaQKNorm, ZayaResidualScaling,
ZayaRouter and ZayaDecoderLayer): the two convolutions' inputs over the queries' and keys' C = (H + H_kv)·d channels,
the delayed value's zero token, the weightless L2 norms of Q and K and the key scale, the residual scaling on a
residual stream kept in fp32, and the MLP router with the state it hands the next layer. Eager attention's scores,
Q, K, V and the output projection's input are plain attention's (``engine.memory.activations``); the experts are the
MoE block's (transformers' grouped_mm path). Checkpointed, a rebuilt layer peaks at the end of its forward
(``rebuilt_forward_end``)."""

from __future__ import annotations

from typing import NamedTuple

from lmcalc.engine.memory.norms import norm_saved
from lmcalc.engine.memory.saved import SavedTensor
from lmcalc.engine.model.params import Dim
from lmcalc.engine.workload import Workload

STREAM_BYTES = 4  # ZAYA keeps its residual stream in fp32 (its residual_in_fp32 path), whatever the model's dtype
INDEX_BYTES, BOOL_BYTES = 8, 1  # int64 indices; masked_fill's booleans


def cca_attention_saved(w: Workload) -> list[SavedTensor]:
    """A ZAYA layer's attention beyond plain attention's: q‖k, transposed and padded on the left by t0 + t1 − 2, is
    the depthwise convolution's input, and its s + t1 − 1 outputs the grouped convolution's (``convolution_backward``
    keeps its input for both gradients, so a frozen convolution keeps it too); v_proj_delayed's input, one zero token a
    sequence; each L2 norm keeps its input (the convolved value plus its residual, which the product with the scale
    keeps too), and ‖x‖ (which clamp_min keeps), its reciprocal and the scale √d/‖x‖, a value a head and token; the
    key scale's product keeps the normalised keys for its gradient (none where it is frozen). RoPE's products keep
    the tables alone (counted outside the layers)."""
    spec, c = w.model, w.model.cca
    if c is None:
        return []
    act, sb, b, s = w.precision.activation_bytes, w.tokens, w.micro_batch, w.seq_len
    H, Hkv, d, h = spec.num_heads, spec.kv_heads, spec.head_size, spec.hidden_size
    channels, pad = (H + Hkv) * d, c.depthwise + c.grouped - 2
    return [
        SavedTensor("CCA depthwise convolution input (q‖k, padded)", "b·C·(s+t0+t1−2)", b * channels * (s + pad), act),
        SavedTensor("CCA grouped convolution input", "b·C·(s+t1−1)", b * channels * (s + c.grouped - 1), act),
        SavedTensor("v_proj_delayed input (the zero token before each sequence)", "b·h", b * h, act, split="none",
                    for_weights=("v",)),
        SavedTensor("Q L2-norm input (convolved queries plus their residual)", "s·b·H·d", sb * H * d, act),
        SavedTensor("Q L2-norm: ‖q‖, its reciprocal, √d/‖q‖", "3·s·b·H", 3 * sb * H, act),
        SavedTensor("K L2-norm input (convolved keys plus their residual)", "s·b·H_kv·d", sb * Hkv * d, act,
                    most_tp_ranks=Hkv),
        SavedTensor("K L2-norm: ‖k‖, its reciprocal, √d/‖k‖", "3·s·b·H_kv", 3 * sb * Hkv, act, most_tp_ranks=Hkv),
        SavedTensor("normalised K (for the key scale's gradient)", "s·b·H_kv·d", sb * Hkv * d, act, most_tp_ranks=Hkv,
                    for_weights=("key_scale",)),
    ]  # fmt: skip


def residual_scaling_saved(w: Workload, half: str) -> list[SavedTensor]:
    """ZAYA's residual scaling after a layer's ``half``: (x + b_x)·s_x + (r + b_r)·s_r, each product keeping its sum
    for the scale's gradient (none where the scales are frozen): the branch's output plus its bias in the activation
    dtype, the residual stream plus its bias in fp32 (the stream is fp32)."""
    if w.model.cca is None:
        return []
    act, sb, h = w.precision.activation_bytes, w.tokens, w.model.hidden_size
    return [
        SavedTensor(f"{half} output plus its bias (its residual scale's product keeps it)", "s·b·h", sb * h, act,
                    split="seq", block=half, for_weights=("residual_scales",)),
        SavedTensor(f"residual stream plus its bias, fp32 ({half}'s residual scale keeps it)", "s·b·h", sb * h,
                    STREAM_BYTES, split="seq", block=half, for_weights=("residual_scales",)),
    ]  # fmt: skip


def mlp_router_saved(w: Workload) -> list[SavedTensor]:
    """ZAYA's router, after down_proj (whose input, the MLP norm's output, the experts share): the previous layer's
    router state, which the product with its scale keeps (counted in every layer: the first, which has none, keeps
    s·b·r less); the RMSNorm of r as the model's code writes it; the inputs of fc1, of each GELU, of fc2 and of the
    output layer; the softmax's output over E + 1 classes (kept by the softmax and the gather); the gather's int64
    indices and masked_fill's booleans of the skip picks. Then the experts' rows: the three int64 indices the
    grouped_mm path keeps a pick (the rows it gathers, and each pick's weight by token and slot), each pick's weight
    for its product, and the experts' offsets (E int32)."""
    spec, act, sb = w.model, w.precision.activation_bytes, w.tokens
    moe = spec.moe
    assert moe is not None and moe.router_rank is not None
    rows, r, k = Dim(sb, "s·b"), Dim(moe.router_rank, "r"), moe.k
    out = r.size * sb
    return [
        SavedTensor("router state from the previous layer (for its scale's gradient)", "s·b·r", out, act, split="seq",
                    for_weights=("router_state_scale",)),
        *norm_saved(w, "router norm", rows, r),
        SavedTensor("router fc1 input (its norm's output)", "s·b·r", out, act, split="seq", for_weights=("fc1",)),
        SavedTensor("router GELU inputs (fc1's and fc2's outputs)", "2·s·b·r", 2 * out, act, split="seq"),
        SavedTensor("router fc2 and output layer inputs (the GELUs' outputs)", "2·s·b·r", 2 * out, act, split="seq",
                    for_weights=("fc2", "out")),
        SavedTensor("router softmax output (E + 1 classes)", "s·b·(E+1)", sb * moe.router_outputs, act, split="seq"),
        SavedTensor("top-k indices (the gather's, int64) and the skip picks' booleans", "s·b·k", sb * k,
                    INDEX_BYTES + BOOL_BYTES, split="seq"),
        SavedTensor("each pick's row indices (three, int64) and its weight", "s·b·k", sb * k, 3 * INDEX_BYTES + act,
                    split="seq"),
        SavedTensor("the experts' row offsets (int32)", "E", moe.num_experts, 4, split="none"),
    ]  # fmt: skip


def embedding_scaling_saved(w: Workload) -> list[SavedTensor]:
    """ZAYA's scale on the embedding, (e + b)·s: the product keeps the sum for the scale's gradient."""
    if w.model.cca is None:
        return []
    elements, act = w.tokens * w.model.hidden_size, w.precision.activation_bytes
    return [SavedTensor("embedding plus its bias (its scale's product keeps it)", "s·b·h", elements, act, split="seq",
                        for_weights=("residual_scales",))]  # fmt: skip


def cca_checkpoint(w: Workload) -> SavedTensor:
    """What full recomputation keeps of a ZAYA layer: its input, the fp32 residual stream, and the router state the
    previous layer hands it (s·b·r in the activation dtype; none before the first layer)."""
    moe, act, sb = w.model.moe, w.precision.activation_bytes, w.tokens
    r = moe.router_rank or 0 if moe else 0
    return SavedTensor("layer input (the fp32 residual stream) and the router state", f"s·b·(4h + {act:g}r)",
                       sb * (STREAM_BYTES * w.model.hidden_size + act * r), 1, split="seq")  # fmt: skip


def checkpoint_kept_again(w: Workload, stream_kept: bool, scale_trained: bool) -> float:
    """Of a ZAYA layer's checkpoint, the bytes its rebuilt forward keeps again, counted once: the fp32 stream where
    its norm's fp32 copy is the stream itself (``stream_kept``: fp32 activations), the router state where the product
    with its trained scale keeps it."""
    moe, act, sb = w.model.moe, w.precision.activation_bytes, w.tokens
    r = moe.router_rank or 0 if moe else 0
    return (STREAM_BYTES * w.model.hidden_size if stream_kept else 0) * sb + (act * r * sb if scale_trained else 0)


class RebuiltEnd(NamedTuple):
    """A rebuilt ZAYA layer at the end of its forward, and what its backward has freed by its MLP's
    (``rebuilt_forward_end``), in bytes."""

    forward: float  # beyond the tensors the layer keeps (all made by then)
    output_gradient: float  # the gradient of the layer's output, alive while it is rebuilt
    freed: float  # of the layer's saved tensors, those its MLP's residual scaling frees before the MLP's backward


def rebuilt_forward_end(w: Workload, layer: tuple[SavedTensor, ...]) -> RebuiltEnd | None:
    """Where a ZAYA layer (``layer``, its saved tensors) rebuilt under full recomputation peaks: at the end of its
    forward, in the MLP's residual scaling (ZayaResidualScaling), where the rebuild has made every tensor the layer
    keeps and holds beside them the fp32 stream between the halves (s·b·h·4, the scaling's residual), the MLP's
    output and its scaled product (2·s·b·h in the activation dtype); the rebuild runs inside the backward of the
    layer's output, whose gradient is fp32 beside its cast for the MLP's branch (s·b·h·(4 + 2) in bf16). The
    backward then frees the MLP scaling's sums before the MLP's own backward (the MoE combine's) runs. Where the
    scales are frozen (LoRA) their products keep no sums, but the rebuild stops only as the stream's product packs
    its scale, the stream plus its bias just made beside it: s·b·h·4 more. Read from the storages live at the step's
    peak with scripts/hf_step_peak.py on the CPU (zaya-wide, checkpointed, fully trained and under LoRA). None for
    any other model or step."""
    if w.model.cca is None or w.recompute != "full":
        return None
    act, sbh = w.precision.activation_bytes, w.tokens * w.model.hidden_size
    freed = sum(x.bytes for x in layer if x.block == "mlp" and "residual scale" in x.label)
    stream_sum = 0.0 if freed else sbh * STREAM_BYTES  # frozen scales: the sum, not kept, alive as the rebuild stops
    return RebuiltEnd(sbh * (STREAM_BYTES + 2 * act) + stream_sum, sbh * (STREAM_BYTES + act), freed)
