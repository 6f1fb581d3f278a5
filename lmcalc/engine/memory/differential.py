"""What differential attention keeps for backward (Ye et al. 2025, "Differential Transformer"; DiffLlama's form in
transformers 5.24, DiffLlamaAttention).

Each layer runs the attention kernel twice with the same Q and K: once over the first half of V's heads and once
over the second, each half repeated back to H_kv heads. Per head pair, the first call's output less λ times the
second's is normalised over the pair's 2·d channels (a norm without a weight) and scaled by 1 − λ_init, and the
output projection reads that. So beside Q and K, a layer keeps each call's V half and what the kernel keeps of its
call; the two outputs concatenated, which λ's product keeps; what the pair's norm keeps; and the projection's input.
Eager attention repeats K to the H heads in each call, so K is kept twice there. tests/test_framework_transformers.py
(``diffllama-small``) measures them against transformers.
"""

from __future__ import annotations

from dataclasses import replace

from lmcalc.engine.memory.norms import STAT_BYTES
from lmcalc.engine.memory.saved import SavedTensor
from lmcalc.engine.model_code import norm_keeps
from lmcalc.engine.workload import Workload

KERNEL_OUTPUT = "attention output = output projection input"
"""A fused kernel's output, which the output projection reads as a view of it where attention is plain."""


def differential_saved(w: Workload, tensors: list[SavedTensor]) -> list[SavedTensor]:
    """The attention half of a layer, built for one call (its input, Q, K, V, the core and the output), as the two
    calls and the head pairs' combination keep it."""
    spec, act, sb = w.model, w.precision.activation_bytes, w.tokens
    H, dv = spec.num_heads, spec.v_head_dim
    per_call = w.attention == "eager" and not w.core_recomputed  # eager repeats K to H heads in each call
    out: list[SavedTensor] = []
    for t in tensors:
        if t.label == KERNEL_OUTPUT:  # each call's output, kept by its kernel alone (rebuilt with the core)
            out += [replace(t, label=f"attention output (kept by the kernel), {n} call", attention_core=True)
                    for n in ("first", "second")]  # fmt: skip
        elif t.for_weights == ("o",):  # the projection's input: made after the pairs' norm, below
            continue
        elif t.attention_core or t.label == "V" or (per_call and t.label.startswith("K")):
            out += [replace(t, label=f"{t.label}, {n} call") for n in ("first", "second")]
        else:
            out.append(t)
    width, pairs = sb * H * dv, sb * H // 2
    fused = norm_keeps(w) == "input"  # a kernel keeps the norm's input; transformers' composite an fp32 copy
    return out + [
        SavedTensor("both calls' outputs, concatenated (kept by λ's product)", "2·s·b·H·d_v", 2 * width, act),
        SavedTensor(f"head pairs' norm input{'' if fused else ' (fp32 copy)'}", "s·b·H·d_v", width,
                    act if fused else STAT_BYTES),
        SavedTensor("head pairs' norm 1/rms (fp32)", "s·b·H/2", pairs, STAT_BYTES),
        SavedTensor("output projection input (the pairs' normalised difference)", "s·b·H·d_v", width, act,
                    for_weights=("o",)),
    ]  # fmt: skip
