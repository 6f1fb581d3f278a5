"""What Inkling's layers keep for backward beyond an attention layer with per-head QK norms and a SwiGLU or a routed
MLP (Thinking Machines 2026; transformers 5.24's InklingAttention, InklingShortConvolution, InklingRelativeLogits,
InklingMLP, InklingTopkRouter and InklingSharedExperts).

Each of a layer's four short convolutions (``InklingShortConvolution``) runs in fp32 on ``x.float()`` and adds its
input back: the depthwise convolution keeps that fp32 copy, over H_kv·d channels for K and V (the layer kind's
H_kv) and over h for the attention's output and the MLP's. The relative logits (``InklingRelativeLogits``) are made
densely: ``relative_states @ proj`` keeps r_proj's output (s·b·H·d_rel) for the table's gradient, the gather keeps
its input (b·H·s·E, E the kind's extent: rel_extent in a global layer, the window in a local one) and its int64
index (one s × s storage, expanded over b and H), and the masked_fill its boolean mask (s × s); the bias then adds to
the scores, which keep nothing more. A fused kernel (FlashAttention 4's score_mod) reads the relative states and the
table and materialises none of it: only r_proj's output is counted there, derived, not measured. Inkling applies no
RoPE (its reader says ``position_embedding`` none).

A dense MLP's output times its global scale keeps that output for the scale's gradient. The router
(``InklingTopkRouter``) runs in fp32 with the shared experts scored beside the routed ones, n = k + E_shared of them a
token: F.linear on fp32 copies of its input and of its weight, the logits (which the gather of the top k keeps), the
gather's index, logsigmoid's input and buffer, its output (for the logsumexp), the logsumexp, exp's output and the
weights times route_scale (for the global scale's gradient); the experts keep their three index tensors and the
weights in the activation dtype. Each shared expert's product with its weight γ keeps the SwiGLU's product and γ.
A frozen scale (LoRA) keeps nothing for its gradient, nor a frozen router for its weight's."""

from __future__ import annotations

from typing import NamedTuple

from lmcalc.engine.memory.saved import SavedTensor
from lmcalc.engine.memory.ssm import AttentionKind
from lmcalc.engine.workload import Workload

INDEX_BYTES = 8  # int64: the gather's index, the experts' token indices
SCALES = ("global_scale",)  # Inkling's learned scalars on each dense MLP and router, frozen under LoRA
ROUTER = ("router",)
TABLE = ("relative_table",)  # the relative logits' bias profiles (InklingRelativeLogits.proj)


def inkling(w: Workload) -> bool:
    """Whether the model is Inkling's text model (branch convolutions without Inkling 2's dynamic ones)."""
    b = w.model.branch_convs
    return b is not None and not b.dynamic_global


def branch_attention_saved(w: Workload, kind: AttentionKind) -> list[SavedTensor]:
    """An Inkling attention's K and V convolutions' fp32 inputs, its relative logits (r_proj's output; eagerly the
    dense bias's gather input, index and mask too) and the attention-output convolution's fp32 input."""
    if not inkling(w):
        return []
    spec, act, s, b, sb = w.model, w.precision.activation_bytes, w.seq_len, w.micro_batch, w.tokens
    branch = spec.branch_convs
    assert branch is not None
    local = kind == "local"
    kv = (spec.local_kv_heads if local and spec.local_kv_heads else spec.kv_heads) * spec.head_size
    H, extent = spec.num_heads, (spec.sliding_window or branch.extent) if local else branch.extent
    tensors = [
        SavedTensor(f"{x} convolution input (fp32 copy)", "s·b·H_kv·d", sb * kv, 4, most_tp_ranks=kv // spec.head_size)
        for x in ("K", "V")
    ]
    tensors.append(SavedTensor("relative states (r_proj output, for the table's gradient)", "s·b·H·d_rel",
                               sb * H * branch.relative_width, act, for_weights=TABLE))  # fmt: skip
    if w.attention == "eager":
        tensors += [
            SavedTensor("relative logits (the gather's input)", "b·H·s·E", b * H * s * extent, act, True),
            SavedTensor("relative distances (the gather's int64 index)", "s²", s * s, INDEX_BYTES, split="none"),
            SavedTensor("relative bias mask (masked_fill)", "s²", s * s, 1, split="none"),
        ]
    tensors.append(SavedTensor("attention-output convolution input (fp32 copy)", "s·b·h", sb * spec.hidden_size, 4,
                               split="seq"))  # fmt: skip
    return tensors


def branch_mlp_saved(w: Workload, moe_layer: bool) -> list[SavedTensor]:
    """An Inkling MLP's: a dense one's output before its global scale (for the scale's gradient), each shared
    expert's SwiGLU product before γ and γ, and the MLP-output convolution's fp32 input."""
    if not inkling(w):
        return []
    spec, act, sb, h = w.model, w.precision.activation_bytes, w.tokens, w.model.hidden_size
    tensors = []
    if not moe_layer:
        tensors.append(SavedTensor("MLP output, before its global scale (for the scale's gradient)", "s·b·h", sb * h,
                                   act, split="seq", for_weights=SCALES))  # fmt: skip
    elif spec.moe and spec.moe.shared_experts:
        n, f = spec.moe.shared_experts, spec.moe.shared_width
        tensors += [
            SavedTensor("shared-expert product, before γ", "E_shared·s·b·f_s", n * sb * f, act, split="seq"),
            SavedTensor("shared-expert weights γ", "s·b·E_shared", sb * n, act, split="seq"),
        ]
    tensors.append(SavedTensor("MLP-output convolution input (fp32 copy)", "s·b·h", sb * h, 4, split="seq"))
    return tensors


def branch_router_saved(w: Workload, k: int) -> list[SavedTensor] | None:
    """What Inkling's fp32 router keeps beyond its input, under a profile that runs the model's code; None
    otherwise (the profile's router rule)."""
    if not inkling(w) or w.framework.moe.router != "model":
        return None
    spec, act, sb, h = w.model, w.precision.activation_bytes, w.tokens, w.model.hidden_size
    moe = spec.moe
    assert moe is not None
    n, scored = k + moe.shared_experts, moe.router_outputs
    tensors = []
    if act != 4:  # in fp32 .float() is the tensor itself: the input (kept), the weight (a parameter)
        tensors.append(SavedTensor("router input (fp32 copy)", "s·b·h", sb * h, 4, split="seq", for_weights=ROUTER))
        tensors.append(SavedTensor("router weight (fp32 copy)", "(E+E_shared)·h", scored * h, 4, split="none"))
    return tensors + [
        SavedTensor("router logits (fp32; the top k's gather keeps them)", "s·b·(E+E_shared)", sb * scored, 4,
                    split="seq"),
        SavedTensor("top-k index (int64), the gather's", "s·b·k", sb * k, INDEX_BYTES, split="seq"),
        SavedTensor("logsigmoid's input, buffer and output, exp's output (fp32)", "4·s·b·n", 4 * sb * n, 4,
                    split="seq"),
        SavedTensor("logsumexp (fp32)", "s·b", sb, 4, split="seq"),
        SavedTensor("weights times route_scale (fp32, for the global scale's gradient)", "s·b·n", sb * n, 4,
                    split="seq", for_weights=SCALES),
        SavedTensor("the experts' token indices (three int64)", "3·s·b·k", 3 * sb * k, INDEX_BYTES, split="seq"),
        SavedTensor("routing weights", "s·b·k", sb * k, act, split="seq"),
    ]  # fmt: skip


def combine_gradient_bytes(w: Workload) -> float:
    """Bytes an element of the MoE combine's backward gradients takes (``phases.MOE_COMBINE_FP32_GRADIENTS``): fp32
    where the routing weights are (transformers' routers keep them so and the product upcasts), the activation dtype
    in Inkling's, whose router casts them back before the experts."""
    return w.precision.activation_bytes if inkling(w) else 4


class SharedSum(NamedTuple):
    """A rebuilt Inkling MoE layer's forward at its shared experts' fp32 sum (``shared_sum_peak``)."""

    forward: float  # bytes beyond what the layer keeps: the routed experts' sum, down's output, its fp32 copy and sum
    kept_before: float  # the share of the layer's saved tensors made by then: all but the MLP-output convolution's
    output_gradient: float  # the layer output's gradient, and the MLP-output convolution's backward that waits on it


def shared_sum_peak(w: Workload, layer: tuple[SavedTensor, ...]) -> SharedSum | None:
    """Where a rebuilt Inkling MoE layer (``layer``, its saved tensors) peaks in its forward, under full
    recomputation. The rebuild starts inside the backward of the layer's last op, the MLP-output convolution, which
    by then holds beside the output's gradient its fp32 copy, the fp32 gradient padded to the convolution's s + K − 1
    outputs (b·h·(s+K−1)) and one more fp32 copy (s·b·h); the rebuilt forward then peaks where InklingSharedExperts
    sums its experts' outputs in fp32 (``down.float().sum(dim=0)``): down's output (E_shared·s·b·h), its fp32 copy
    and the fp32 sum (s·b·h) alive at once with the routed experts' summed output (s·b·h) and their inverse order
    (s·b·k, int64), beside everything the layer keeps but the MLP-output convolution's input, which comes after.
    Read from the storages live at the step's peak with scripts/hf_step_peak.py on the CPU (inkling-wide, LoRA,
    checkpointed). None for any other model or step."""
    moe, branch = w.model.moe, w.model.branch_convs
    if not inkling(w) or moe is None or branch is None or not moe.shared_experts or w.recompute != "full":
        return None
    act, sbh = w.precision.activation_bytes, w.tokens * w.model.hidden_size
    padded = w.micro_batch * w.model.hidden_size * (w.seq_len + branch.kernel - 1) * 4
    after = sum(t.bytes for t in layer if t.label.startswith("MLP-output convolution"))
    forward = moe.shared_experts * sbh * (act + 4) + sbh * 4 + sbh * act + w.tokens * moe.k * INDEX_BYTES
    return SharedSum(forward, 1 - after / sum(t.bytes for t in layer), sbh * (act + 2 * 4) + padded)
