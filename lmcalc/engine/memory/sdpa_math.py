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
"""

from __future__ import annotations

from lmcalc.engine.memory.saved import SavedTensor
from lmcalc.engine.workload import MASK_BYTES, Workload

MATH_BYTES = 4  # the math path computes in fp32 (query_acc, key_acc, value_acc)


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
        SavedTensor("V (fp32 copy, math path)", symbol, sb * heads * dv, fp32, True, most_tp_ranks=ranks),
    ]


def math_scores_saved(w: Workload) -> list[SavedTensor]:
    """The math path's b·H·s² tensors (the softmax's output, and with dropout its mask and output) and the output
    projection's input."""
    spec, b, s, sb = w.model, w.micro_batch, w.seq_len, w.tokens
    H, dv = spec.num_heads, spec.v_head_dim
    scores = b * H * s * s
    tensors = [SavedTensor("softmax output (fp32, math path)", "b·H·s²", scores, MATH_BYTES, True)]
    if spec.drops("attention"):
        # PyTorch's CPU dropout keeps its mask in its input's dtype, the fp32 scores here; CUDA's a bool
        mask = w.mask_bytes if w.mask_bytes == MASK_BYTES else MATH_BYTES
        tensors += [
            SavedTensor("attention dropout mask (math path)", "b·H·s²", scores, mask, True),
            SavedTensor("attention dropout output (fp32, math path)", "b·H·s²", scores, MATH_BYTES, True),
        ]
    act = w.precision.activation_bytes
    return tensors + [SavedTensor("output projection input", "s·b·H·d_v", sb * H * dv, act, for_weights=("o",))]
