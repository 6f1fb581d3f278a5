"""What a recurrent layer keeps for backward as Hugging Face transformers writes it in PyTorch, op by op, the scan a
loop over the tokens (no fused kernel): Griffin's recurrent block (RecurrentGemma's RG-LRU). ``engine.memory.ssm``
puts it in the average layer of its hybrid; the norm before it and its output, which the block's projections read,
are every layer's (``engine.memory.activations``)."""

from __future__ import annotations

from lmcalc.engine.memory.saved import SavedTensor
from lmcalc.engine.workload import Workload

SCAN_BYTES = 4  # RecurrentGemmaRglru._rnn_scan accumulates in fp32 (acc_dtype) whatever the model's dtype


def rglru_saved(w: Workload) -> list[SavedTensor]:
    """What a recurrent block (De et al. 2024, *Griffin*, §2.4 eq. 1–4; RecurrentGemmaRecurrentBlock and
    RecurrentGemmaRglru) keeps for backward, element by element as PyTorch runs it:

    * the y branch: linear_y's output (GeLU's input) and GeLU's output, which the final product keeps;
    * the x branch: linear_x's output (the convolution's input) and the convolution's output over s + K − 1
      positions a sequence (padded by K − 1 on both sides, cut to the first s: the RG-LRU's input, a view of it);
      with more than one sequence the gates' batched products read a copy of it, regrouped into heads;
    * the RG-LRU: the two gates' sigmoid outputs, −8·r (its product with softplus(Λ) keeps it), a = exp(−8·r·
      softplus(Λ)) and a² = exp(2·log a), 1 − a² (the square root's own backward keeps it), the gated input i·x and
      the multiplier √(1 − a²) (their product keeps both);
    * the scan, a Python loop over the s tokens: each step's product a_t·state keeps a_t cast to fp32 and the
      state before it (fp32): 2·s vectors of b·w;
    * the scan's output and the product with the y branch, linear_out's input.

    Per token: 13 tensors of w at the activations' bytes, the convolution's output, and 2·w fp32 of the scan. Not
    counted: a vector of w a layer (softplus(Λ)) and the reset masks (s bools), under 0.1 % at any width. The paper's
    scan is a fused kernel (its Pallas linear scan on TPU) that keeps far less; this is the path transformers runs."""
    r, act, sb, b, s = w.model.rglru, w.precision.activation_bytes, w.tokens, w.micro_batch, w.seq_len
    assert r is not None
    width = sb * r.width
    tensors = [
        SavedTensor("y branch: linear_y output (GeLU input)", "s·b·w", width, act),
        SavedTensor("y branch: GeLU output", "s·b·w", width, act),
        SavedTensor("x branch: linear_x output (convolution input)", "s·b·w", width, act),
        SavedTensor(
            "convolution output, s + K − 1 a sequence", "b·(s+K−1)·w", b * (s + r.conv_kernel - 1) * r.width, act
        ),
    ]
    if b > 1:  # reshape(b·s, H, w/H) of the cut, transposed output cannot be a view once it merges b and s
        tensors.append(SavedTensor("RG-LRU input regrouped into heads (the gates' input)", "s·b·w", width, act))
    return tensors + [
        SavedTensor("input and recurrence gates (sigmoid outputs)", "2·s·b·w", 2 * width, act),
        SavedTensor("−8·r (the decay's product keeps it)", "s·b·w", width, act),
        SavedTensor("a and a² (exp outputs)", "2·s·b·w", 2 * width, act),
        SavedTensor("1 − a² (the bounded square root's input)", "s·b·w", width, act),
        SavedTensor("gated input i·x and multiplier √(1 − a²)", "2·s·b·w", 2 * width, act),
        SavedTensor("scan: a_t and the state before it, each step (fp32)", "2·s·b·w", 2 * width, SCAN_BYTES),
        SavedTensor("scan output (the product with the y branch keeps it)", "s·b·w", width, act),
        SavedTensor("linear_out input (the gated product)", "s·b·w", width, act, for_weights=("linear_out",)),
    ]


MIX_COEFFICIENTS = ("time_mix",)
"""What the token-shifted inputs (and the norms' outputs) are kept for: the mixing coefficients' gradients, which a
frozen base (LoRA) does not compute, so that the mixes' products then keep nothing but the coefficients."""
WKV_STEP_TENSORS = 12
"""fp32 vectors of b·a one step of rwkv_linear_attention_cpu's loop leaves saved: the key cast to fp32, k + u, the two
exponentials and the numerator and denominator of the output, the decayed maximum, the two exponentials of the state
update and the three new states (numerator, denominator, maximum), which the next step's products keep."""


def rwkv_saved(w: Workload) -> list[SavedTensor]:
    """What an RWKV-4 layer (Peng et al. 2023 §4.1 and 4.2, eq. 11–17; RwkvSelfAttention, RwkvFeedForward) keeps for
    backward beyond its two norms, their outputs and its channel mix's squared-ReLU MLP, as transformers runs it off
    CUDA (``rwkv_linear_attention_cpu``: the WKV recurrence a Python loop over the tokens, accumulated in fp32):

    * the time mix: the token-shifted norm output (the mixes' products keep it beside the norm output), the three
      mixes (the receptance, key and value projections' inputs), the value projection's output (each step's product
      keeps a slice of it), the receptance's sigmoid output, the scan's ``WKV_STEP_TENSORS`` fp32 vectors a step, the
      WKV output (kept by the product with the receptance) and the output projection's input;
    * the channel mix, beside the MLP: its token-shifted input, its two mixes (the key's and the receptance's
      projection inputs; the key's is the MLP's own), its receptance's sigmoid output and the MLP's output, which
      the gating product keeps.

    The CUDA kernel transformers loads where ninja and CUDA are present (RwkvLinearAttention) keeps far less: its
    inputs and output. Not counted: a vector of a a layer (−exp(w))."""
    r, act, sb, h = w.model.rwkv, w.precision.activation_bytes, w.tokens, w.model.hidden_size
    assert r is not None
    a = sb * r.attention_size
    return [
        SavedTensor("time mix: token-shifted input", "s·b·h", sb * h, act, for_weights=MIX_COEFFICIENTS),
        SavedTensor(
            "time mix: key, value and receptance mixes",
            "3·s·b·h",
            3 * sb * h,
            act,
            for_weights=("key", "value", "receptance"),
        ),  # fmt: skip
        SavedTensor("value (each WKV step's product keeps a slice)", "s·b·a", a, act),
        SavedTensor("receptance (sigmoid output)", "s·b·a", a, act),
        SavedTensor("WKV scan: 12 vectors a step (fp32)", "12·s·b·a", WKV_STEP_TENSORS * a, SCAN_BYTES),
        SavedTensor("WKV output (the receptance's product keeps it)", "s·b·a", a, act),
        SavedTensor("output projection input (the gated product)", "s·b·a", a, act, for_weights=("output",)),
        SavedTensor(
            "channel mix: token-shifted input", "s·b·h", sb * h, act, block="mlp", for_weights=MIX_COEFFICIENTS
        ),
        SavedTensor(
            "channel mix: key and receptance mixes",
            "2·s·b·h",
            2 * sb * h,
            act,
            block="mlp",
            for_weights=("fc", "receptance"),
        ),  # fmt: skip
        SavedTensor("channel mix: receptance (sigmoid output)", "s·b·h", sb * h, act, block="mlp"),
        SavedTensor("channel mix: the MLP's output (the gating product keeps it)", "s·b·h", sb * h, act, block="mlp"),
    ]
