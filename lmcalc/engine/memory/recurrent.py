"""What a recurrent layer keeps for backward as Hugging Face transformers writes it in PyTorch, op by op, the scan a
loop over the tokens (no fused kernel): Griffin's recurrent block (RecurrentGemma's RG-LRU). ``engine.memory.ssm``
puts it in the average layer of its hybrid; the norm before it and its output, which the block's projections read,
are every layer's (``engine.memory.activations``)."""

from __future__ import annotations

from lmcalc.engine.memory.norms import NORM
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


MLSTM_STEP_SCALARS = 8
"""fp32 values of b·NH one step of transformers' ``mlstm_recurrent_step_native`` leaves saved: logsigmoid(f)'s buffer,
the sum log σ(f) + m the max keeps, the two gates' exponentials, exp(−m), q·n and its |·| (the maximum's other
input is exp(−m)), and the denominator the division keeps."""


def mlstm_saved(w: Workload) -> list[SavedTensor]:
    """What an mLSTM layer (Beck et al. 2024, *xLSTM*, §2.3 eq. 19–27, its chunkwise form of Beck et al. 2025,
    *xLSTM 7B*, §3; transformers' xLSTMLayer with its own kernels, ``mode`` "inference", the class default, which
    its training step runs too) keeps for backward beyond its norm and the norm's output, which its six projections
    read, element by element as PyTorch runs it:

    * the gates: the soft-capped input and forget pre-activations (tanh's outputs, 2·s·b·NH);
    * the whole chunks, s_c = L·⌊s/L⌋ tokens, run by ``mlstm_chunkwise_native_autograd`` on contiguous copies of q, k,
      v and the gates: q, k and v; the decayed keys a chunk updates C by; logsigmoid(f)'s input and buffer; the
      decays to the chunk's end and to each query (exp outputs); the L × L decay matrix D, the scores Q·Kᵀ and
      their product D ∘ QKᵀ a head and chunk (3·s_c·b·NH·L); the gated queries; the states C and n each chunk
      starts from (the running ones the update's product keeps and the copies the queries read: 2·⌊s/L⌋·b·NH·(d_k·
      d_v + d_k)); the max's indices (int64) and both arguments, the denominator's |·|, its input, exp(−m) and the
      divisor; the numerator; the L × L causal mask (bools) once a layer;
    * the rest, r = s − s_c tokens, ``mlstm_recurrent_step_native`` a step at a time on copies of k, v and the gates:
      each step's state before it (cloned), k·vᵀ and the new state (3·r·b·NH·d_k·d_v), n cloned and new, the scaled
      query, the numerator, and ``MLSTM_STEP_SCALARS`` values a head;
    * the output: the kernel's output (the norm's input), the per-head norm's centred input, 1/std (fp32) and
      normalised value, the output gate's sigmoid and the norm's output (the gate's product keeps both), and
      out_proj's input.

    Checked in fp32 (tests/test_xlstm_memory.py), the one precision transformers' step trains in: in bf16 its
    kernels multiply fp32-gated keys by bf16 values and fail. Under bf16-mixed every tensor here is counted at 2
    bytes, a floor: autocast leaves the element-work promoted to the fp32 states. Not counted: each chunk's and
    step's running maximum (b·NH values). The fused Triton kernels of NX-AI's mlstm_kernels keep far less (their
    inputs, the chunk states and the maxima); the config's ``mode`` train (its own copies of q, k and v) keeps about
    5 % more of the whole (docs/formulas.md §2.29)."""
    m, act, sb, b = w.model.mlstm, w.precision.activation_bytes, w.tokens, w.micro_batch
    assert m is not None
    NH, dk, dv, L = m.heads, m.key_head_dim, m.value_head_dim, m.chunk
    chunks, rest = divmod(w.seq_len, L)
    whole = b * chunks * L  # the tokens the chunkwise kernel runs, over the micro-batch
    rows = b * NH  # the (sequence, head) pairs: each a recurrence of its own
    tensors = [SavedTensor("input and forget gates (soft cap's tanh outputs)", "2·s·b·NH", 2 * sb * NH, act)]
    if chunks:
        sc = "s_c·b"
        # the products read the first ⌊s/L⌋ of the ⌊s/L⌋ + 1 states in place where the batch, the heads and the chunks
        # merge as a view (one chunk, or one head of one sequence); else a copy of them
        whole_store = chunks == 1 or rows == 1
        read = "(⌊s/L⌋+1)" if whole_store else "⌊s/L⌋"
        tensors += [
            SavedTensor(
                "chunks: q, k and v (contiguous copies)", f"{sc}·(2·d_qk+d_v)", whole * (2 * m.qk_dim + m.v_dim), act
            ),
            SavedTensor("chunks: decayed keys (C's update)", f"{sc}·d_qk", whole * m.qk_dim, act),
            SavedTensor("chunks: gated queries (they read C and n)", f"{sc}·d_qk", whole * m.qk_dim, act),
            SavedTensor("chunks: D, QKᵀ and D ∘ QKᵀ, L × L a head and chunk", f"3·{sc}·NH·L", 3 * whole * NH * L, act),
            SavedTensor(
                "chunks: forget gate and logsigmoid's buffer, the two decays, the max's two arguments, the "
                "denominator's |·| input, output and exp(−m), the divisor",
                f"10·{sc}·NH",
                10 * whole * NH,
                act,
            ),
            SavedTensor("chunks: the max's indices (int64)", f"{sc}·NH", whole * NH, 8),
            SavedTensor("chunks: numerator", f"{sc}·d_v", whole * m.v_dim, act),
            SavedTensor(
                "chunks: C and n each chunk starts from (the update's product keeps them)",
                "⌊s/L⌋·b·NH·(d_k·d_v+d_k)",
                chunks * rows * (dk * dv + dk),
                act,
            ),
            SavedTensor(
                "chunks: C and n the queries read (a copy; one chunk: the states' store, the last state's too)",
                f"{read}·b·NH·(d_k·d_v+d_k)",
                (chunks + 1 if whole_store else chunks) * rows * (dk * dv + dk),
                act,
            ),
            SavedTensor("chunks: causal mask (bool)", "L²", L * L, 1, split="none"),
        ]
    if rest:
        rb = b * rest
        tensors += [
            SavedTensor("steps: k and v (copies)", "r·b·(d_qk+d_v)", rb * (m.qk_dim + m.v_dim), act),
            SavedTensor("steps: input and forget gates (copies)", "2·r·b·NH", 2 * rb * NH, act),
            SavedTensor(
                "steps: C before (cloned), k·vᵀ and C after, a step", "3·r·b·NH·d_k·d_v", 3 * rb * NH * dk * dv, act
            ),
            SavedTensor("steps: n before (cloned) and after, the scaled query", "3·r·b·d_qk", 3 * rb * m.qk_dim, act),
            SavedTensor("steps: numerator", "r·b·d_v", rb * m.v_dim, act),
            SavedTensor(
                "steps: the gates' and the denominator's scalars",
                f"{MLSTM_STEP_SCALARS}·r·b·NH",
                MLSTM_STEP_SCALARS * rb * NH,
                act,
            ),
        ]
    return tensors + [
        SavedTensor("kernel output (the per-head norm's input)", "s·b·d_v", sb * m.v_dim, act),
        SavedTensor("per-head norm: centred input", "s·b·d_v", sb * m.v_dim, act),
        SavedTensor(
            "per-head norm: normalised value (before the weight)", "s·b·d_v", sb * m.v_dim, act, for_weights=NORM
        ),  # fmt: skip
        SavedTensor("per-head norm: 1/std (fp32)", "s·b·NH", sb * NH, 4),
        SavedTensor("output gate (sigmoid output) and the norm's output", "2·s·b·d_v", 2 * sb * m.v_dim, act),
        SavedTensor("out_proj input (the gated product)", "s·b·d_v", sb * m.v_dim, act, for_weights=("out_proj",)),
    ]
