"""PyTorch's math path for ``scaled_dot_product_attention``: what attention keeps for backward where no fused kernel
takes the call and PyTorch's composite implementation runs instead.

torch 2.13's ``_scaled_dot_product_attention_math`` (aten/src/ATen/native/transformers/attention.cpp) copies Q, K
and V to fp32 (unless ``torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(True)``, off by default, on every
device), scales Q and Kᵀ by √scale each, expands K and V to Q's heads (``repeat_interleave`` under enable_gqa, else
matmul's broadcast), multiplies, adds the mask in place, takes ``_safe_softmax`` and, with dropout, ``at::dropout``;
then the product with V, cast back. Autograd keeps, each in fp32: the scaled Q (b·H·s·d), Kᵀ and V at H heads (one
head of one sequence broadcasts as a view: matmul's reshape merges its size-1 head and batch dimensions), the
softmax's output (b·H·s², which the product with V reads as a view) and, with dropout, the dropout's mask (on the
CPU in its input's dtype, fp32) and output. It keeps no log-sum-exp and no bf16 Q, K or V; the output projection
keeps its input, the output laid out (b, s, H·d). Measured on the CPU under saved-tensor hooks
(tests/test_framework_transformers.py, Falcon-7B and GPTBigCode small).

When it runs (the framework profile's ``attention`` rules): the fused kernels' shared check
(sdp_utils_cpp.h ``check_batch_size_and_num_heads_dense``, called by the CPU's flash kernel and by CUDA's flash,
memory-efficient and cuDNN kernels) refuses K and V at fewer heads than Q unless enable_gqa is passed, so a model that
calls SDPA itself with its one K/V head (``ModelSpec.sdpa_broadcast_kv``) runs the math path on a GPU as on the CPU
(``broadcast_kv_math``); the CPU's flash kernel also refuses dropout (``check_for_dropout``), CUDA's flash kernel
takes it, so attention dropout sends only a CPU run there (``dropout_math``).

Its backward (``math_backward_peak``) makes its b·H·s² gradients in fp32 too, on a GPU as on the CPU: autograd
differentiates the composite op by op (the product with V's ``MmBackward``, ``_safe_softmax``'s
``_softmax_backward_data`` in the softmax's dtype, the dropout's mask product), all on the fp32 copies.
"""

from __future__ import annotations

from lmcalc.engine.memory.saved import SavedTensor
from lmcalc.engine.workload import MASK_BYTES, Workload

MATH_BYTES = 4  # the math path computes in fp32 (query_acc, key_acc, value_acc)
SOFTMAX = "softmax output (fp32, math path)"
DROPOUT_MASK = "attention dropout mask (math path)"
DROPOUT_OUTPUT = "attention dropout output (fp32, math path)"
VALUE = "V (fp32 copy, math path)"


def sdpa_math_path(w: Workload) -> bool:
    """Whether the workload's fused attention runs PyTorch's math path instead of a fused kernel: K and V broadcast
    without enable_gqa (the model's own call), or attention dropout where the profile runs it there (the CPU)."""
    if w.attention != "flash":
        return False
    rule, spec = w.framework.attention, w.model
    broadcast = rule.broadcast_kv_math and spec.sdpa_broadcast_kv and spec.kv_heads < spec.num_heads
    return broadcast or (rule.dropout_math and spec.drops("attention"))


def math_inputs_saved(w: Workload) -> list[SavedTensor]:
    """Q, K and V as the math path keeps them: fp32 copies, K and V at every head unless one head of one sequence is
    broadcast (a view of its fp32 copy)."""
    spec, sb = w.model, w.tokens
    H, dqk, dv = spec.num_heads, spec.qk_head_dim, spec.v_head_dim
    view = spec.sdpa_broadcast_kv and spec.kv_heads == 1 and w.micro_batch == 1
    heads, symbol, ranks = (1, "s·b·d", 1) if view else (H, "s·b·H·d", None)
    fp32 = MATH_BYTES
    return [
        SavedTensor("Q, scaled (fp32 copy, math path)", "s·b·H·d", sb * H * dqk, fp32, True),
        SavedTensor("Kᵀ, scaled (fp32 copy, math path)", symbol, sb * heads * dqk, fp32, True, most_tp_ranks=ranks),
        SavedTensor(VALUE, symbol, sb * heads * dv, fp32, True, most_tp_ranks=ranks),
    ]


def math_scores_saved(w: Workload) -> list[SavedTensor]:
    """The math path's b·H·s² tensors (the softmax's output, and with dropout its mask and output) and the output
    projection's input."""
    spec, b, s, sb = w.model, w.micro_batch, w.seq_len, w.tokens
    H, dv = spec.num_heads, spec.v_head_dim
    scores = b * H * s * s
    tensors = [SavedTensor(SOFTMAX, "b·H·s²", scores, MATH_BYTES, True)]
    if spec.drops("attention"):
        # PyTorch's CPU dropout keeps its mask in its input's dtype, the fp32 scores here; CUDA's a bool
        mask = w.mask_bytes if w.mask_bytes == MASK_BYTES else MATH_BYTES
        tensors += [
            SavedTensor(DROPOUT_MASK, "b·H·s²", scores, mask, True),
            SavedTensor(DROPOUT_OUTPUT, "b·H·s²", scores, MATH_BYTES, True),
        ]
    act = w.precision.activation_bytes
    return tensors + [SavedTensor("output projection input", "s·b·H·d_v", sb * H * dv, act, for_weights=("o",))]


def math_backward_peak(w: Workload, layer: tuple[SavedTensor, ...], tp: int, cp: int) -> float:
    """Bytes the math path's backward holds at its busiest beyond the saved tensors of its layer (``layer``, in the
    order the forward makes them), on one of ``tp`` × ``cp`` ranks; 0 where SDPA runs a fused kernel or the layer
    keeps no math path's scores.

    Autograd runs a layer's nodes in the reverse of their making, so by the attention's backward the tensors the
    layer saved after the product with V (the output projection's input, the MLP's, a parallel block's MLP too, run
    after the attention) are freed. Two moments follow, each with the layer output's gradient and one more s·b·h
    gradient in flight (a parallel block's MLP input gradient, waiting for the attention's; a sequential block's
    residual sum), the first of which ``phases.backward_transients`` counts for every layer:

    * the product's backward (``MmBackward`` of P·V): the output's gradient cast to fp32 (b·s·H·d_v), dV at H heads
      (b·H·s·d_v) and dP (b·H·s²), all fp32, beside what the product saved;
    * the softmax's backward (``_softmax_backward_data``), without dropout: dP and dS, 2·b·H·s² in fp32, the product
      having freed V's fp32 copy and dV summed to the K/V heads (matmul's broadcast) beside them. With dropout its
      mask and output are freed by then, and the product's moment is the larger.

    Read from the storages live at the step's peak with scripts/hf_step_peak.py on the CPU (falcon-7b-small: the
    softmax's moment, with and without checkpointing; gpt-bigcode-small's dropout: the product's)."""
    scored = [i for i, t in enumerate(layer) if t.label in (SOFTMAX, DROPOUT_MASK, DROPOUT_OUTPUT)]
    if not (sdpa_math_path(w) and scored):  # a fused kernel, or a layer that does not attend
        return 0.0
    spec, b, s = w.model, w.micro_batch, w.seq_len
    H, kv_heads, dv = spec.num_heads, spec.kv_heads, spec.v_head_dim
    scores = b * H * s * s * MATH_BYTES / (tp * cp)
    heads_output = w.tokens * H * dv * MATH_BYTES / (tp * cp)  # b·s·H·d_v in fp32: the output's gradient, dV
    last_scores = scored[-1]
    made_after = sum(_on_rank(t, tp, cp) for t in layer[last_scores + 1 :])
    residual = w.tokens * spec.hidden_size * w.precision.activation_bytes / cp
    product = scores + 2 * heads_output
    if spec.drops("attention"):
        return product + residual - made_after
    value = sum(_on_rank(t, tp, cp) for t in layer if t.label == VALUE)
    reduced = w.tokens * kv_heads * dv * MATH_BYTES / (cp * min(tp, kv_heads))  # dV at the K/V heads
    return max(product, 2 * scores + reduced - value) + residual - made_after


def _on_rank(t: SavedTensor, tp: int, cp: int) -> float:
    """A layer's saved tensor on one of ``tp`` × ``cp`` ranks (TP's split of the attention and MLP internals)."""
    return t.bytes / (t.cp_ways(cp) * (t.tp_ways(tp) if t.split == "tp" else 1))
