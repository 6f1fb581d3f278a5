"""Forward FLOPs per token of a hybrid's other mixers beyond their projections: Mamba's convolution and scan, Gated
DeltaNet's chunked delta rule, Mamba-2's chunked SSD, LFM2's short convolution and MiniMax-01's lightning attention
(``flops.forward_flops_per_token`` adds them as its ``ssm`` row, docs/formulas.md §2.9–§2.12 and §2.14)."""

from __future__ import annotations

from lmcalc.specs import LightningSpec, Mamba2Spec, MLstmSpec, ModelSpec


def ssm_flops(spec: ModelSpec, seq_len: int) -> float:
    """Forward FLOPs per token of one state-space or linear-attention layer beyond its projections.

    Mamba (Gu & Dao 2023, Algorithm 2): the causal depthwise convolution, 2·d_inner·d_conv (one multiply-add per
    channel and tap), and the scan's read-out y = C·h, 2·d_inner·N, the contraction PyTorch's reference scan runs as a
    batched matmul. The discretisation (exp(Δ·A), Δ·B·x) and the state update are element-wise, about 3·d_inner·N
    more, and not counted, as norms and activations are not (§3.3).

    Gated DeltaNet (Yang et al. 2025, §3.3, the chunkwise form fla and transformers run, chunks of C = 64): the
    convolution, 2·(2·H_k·d_k + H_v·d_v)·K, and per value head and token of the sequence padded to whole chunks
    (s' = C·⌈s/C⌉): K·βKᵀ and QKᵀ within the chunk, 2·C·d_k each; the state's read by K and by Q and its update
    Kᵀ·V, 2·d_k·d_v each; the intra-chunk attention times the new values, 2·C·d_v.

    LFM2's gated short convolution: the causal depthwise convolution over B·x, 2·h·K (its two gates, B·x and C·y,
    are element-wise).

    RWKV-4's WKV recurrence: element-wise (its exponentials and running sums a channel), none counted. Griffin's
    recurrent block: its depthwise convolution, 2·w·K (the RG-LRU's gates are matmuls of weights, its scan
    element-wise). xLSTM's mLSTM: ``mlstm_flops``."""
    if spec.mlstm:
        return mlstm_flops(spec.mlstm, seq_len)
    if spec.short_conv:
        return 2 * spec.hidden_size * spec.short_conv.conv_kernel
    if spec.rwkv:  # the WKV recurrence: element-wise, a few operations a channel and token
        return 0.0
    if spec.rglru:  # the depthwise convolution; the RG-LRU's scan is element-wise
        return 2 * spec.rglru.width * spec.rglru.conv_kernel
    if spec.lightning:
        return lightning_flops(spec.lightning, seq_len)
    if spec.mamba2:
        return mamba2_flops(spec.mamba2, seq_len)
    if spec.deltanet:
        g = spec.deltanet
        padded = g.chunk * -(-seq_len // g.chunk) / seq_len
        core = g.value_heads * (4 * g.chunk * g.key_head_dim + 2 * g.chunk * g.value_head_dim)
        core += g.value_heads * 6 * g.key_head_dim * g.value_head_dim
        return 2 * g.conv_channels * g.conv_kernel + padded * core
    m = spec.mamba
    return 0.0 if m is None else 2 * m.d_inner * m.d_conv + 2 * m.d_inner * m.d_state


def scan_recomputed_flops(spec: ModelSpec, seq_len: int) -> float:
    """Forward FLOPs per token of ``ssm_flops`` that the scan's backward runs again before its own: mamba_ssm's
    ``_mamba_chunk_scan_combined_bwd`` (ssd_combined.py at e9594ce; what Megatron-Core's ``MambaMixer`` trains through
    ``mamba_split_conv1d_scan_combined``, and transformers' Mamba-2 with its kernels) recomputes C·Bᵀ within each
    chunk (``_bmm_chunk_fwd``, 2·Q·N a token and head), each chunk's state (``_chunk_state_fwd``, 2·P·N), the states'
    passing and the cumulative decay (element-wise), rather than keep them; it does not recompute the output (2·Q·P +
    2·P·N). Counted per head over the padded sequence, as ``mamba2_flops`` counts them. 0 for other mixers, whose
    backward is taken to recompute nothing."""
    m = spec.mamba2
    if m is None:
        return 0.0
    padded = m.chunk * -(-seq_len // m.chunk) / seq_len
    return padded * 2 * m.heads * (m.chunk * m.state + m.head_dim * m.state)


def mixer_conv_flops(spec: ModelSpec) -> float:
    """Of ``ssm_flops``, the causal depthwise convolution's forward FLOPs per token, 2 · channels · K (the one part
    with a weight: a fine-tuning step's backward computes its gradient only where it trains); 0 without a mixer."""
    if spec.short_conv:
        return 2 * spec.hidden_size * spec.short_conv.conv_kernel
    if spec.mamba2 or spec.deltanet:
        m = spec.mamba2 or spec.deltanet
        assert m is not None
        return 2 * m.conv_channels * m.conv_kernel
    return 0.0 if spec.mamba is None else 2 * spec.mamba.d_inner * spec.mamba.d_conv


def mlstm_flops(m: MLstmSpec, seq_len: int) -> float:
    """Forward FLOPs per token of an mLSTM layer beyond its projections (Beck et al. 2025, the chunkwise form
    transformers' native kernel runs, chunks of L): per head, with d_k and d_v a head's widths, each chunk's state
    update Kᵀ·V (2·d_k·d_v a token), and within the chunk Q·Kᵀ (2·L·d_k), its gated product with V (2·L·d_v), the
    queries' read of the state before the chunk, Q·C (2·d_k·d_v) and Q·n (2·d_k). The s mod L tokens past the last
    whole chunk run one step at a time (the state's update k·vᵀ and its read by q, 2·d_k·d_v each, and q·n, 2·d_k),
    unless the sequence is padded to whole chunks."""
    d_k, d_v, L = m.key_head_dim, m.value_head_dim, m.chunk
    chunked, rest = (L * -(-seq_len // L), 0) if m.padded else (seq_len - seq_len % L, seq_len % L)
    per_chunked = 4 * d_k * d_v + 2 * L * (d_k + d_v) + 2 * d_k
    per_step = 4 * d_k * d_v + 2 * d_k
    return m.heads * (chunked * per_chunked + rest * per_step) / seq_len


def lightning_flops(m: LightningSpec, seq_len: int) -> float:
    """Forward FLOPs per token of a lightning-attention layer beyond its projections (MiniMax 2025, §2.2: the blockwise
    form transformers' MiniMaxLightningAttention runs, blocks of B): within each block of n tokens, Q·Kᵀ and its
    decayed product with V, 2·H·n²·d each; across blocks, Q by the running state and the state's update Kᵀ·V,
    2·H·d² each a token. Over a sequence of whole blocks and a last one of r tokens, Σn² = ⌊s/B⌋·B² + r²."""
    whole, rest = divmod(seq_len, m.block)
    squares = whole * m.block**2 + rest**2
    return m.heads * (4 * m.head_dim * squares / seq_len + 4 * m.head_dim**2)


def mamba2_flops(m: Mamba2Spec, seq_len: int) -> float:
    """Forward FLOPs per token of a Mamba-2 layer beyond its projections (Dao & Gu 2024, §7: the chunked SSD
    algorithm, chunks of length Q): the convolution over x‖B‖C, 2·(I + 2·G·N)·K; and per head, over the sequence
    padded to whole chunks (s' = Q·⌈s/Q⌉, c chunks), C·Bᵀ within each chunk (2·Q·N a token) and its product with x
    (2·Q·P), each chunk's state from its B and x (2·P·N) and the states' read by C (2·P·N), and the pass that carries
    the states from chunk to chunk, 2·P·N·(c + 1)² per head and sequence (transformers' einsum over c + 1 chunks,
    the zero initial state included)."""
    chunks = -(-seq_len // m.chunk)
    padded = m.chunk * chunks / seq_len
    P, N = m.head_dim, m.state
    core = padded * 2 * m.heads * (m.chunk * N + m.chunk * P + 2 * P * N)
    return 2 * m.conv_channels * m.conv_kernel + core + 2 * m.heads * P * N * (chunks + 1) ** 2 / seq_len
