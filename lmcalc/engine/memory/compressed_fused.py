"""What DeepSeek-V4's attention and hyper-connections keep for backward as Megatron-Core runs them with its fused
kernels (``AttentionRule.compressed_kernels`` fused: Megatron-Bridge's DeepSeek-V4 performance recipes set
``apply_dsa_kernel_fusion``, which Megatron-Core turns into its cuDNN DSA backend), tensor by tensor.

Read from Megatron-LM cae55c1f09, the ``dev`` commit Megatron-Bridge 4ab94dfad pins (``.dev.commit``), under
megatron/core/transformer/experimental_attention_variant/: deepseek_v4_hybrid_attention.py (the projections, norms and
the grouped output), csa.py (``CompressedSparseAttention``, its ``Compressor`` and ``CSAIndexer``) and
csa_utils/fused_sparse_attention.py (FlashMLA's ``flash_mla_sparse_fwd`` forward, cuDNN's DSA sparse backward); and
transformer_layer.py with fused_mhc_kernels.py for the hyper-connections.

Each query gathers only its key list: the window's w keys, and in a CSA layer the indexer's top k_I entries, in an HCA
layer every entry closed (⌊s/m′⌋). The kernel keeps Q, the keys (the window's K = V with the entries appended), the
int32 indices, its bf16 output and the fp32 log-sum-exp: nothing s × s. The indexer's loss is differentiated inside the
forward, which keeps only its gradients. The fused mHC keeps the n streams once (bf16) and its small fp32 factors.

``mla_up_proj`` (an output-discarding checkpoint around the query's up-projection, its norm and RoPE, and the key's
projection, norm and RoPE) drops the pre-norm Q, Q itself, K = V and the key norm's input
(``engine.memory.module_recompute``).
"""

from __future__ import annotations

from lmcalc.engine.memory.norms import norm_saved
from lmcalc.engine.memory.saved import SavedTensor
from lmcalc.engine.model.tensors import Dim
from lmcalc.engine.workload import Workload

INDEX_BYTES = 4  # the sparse kernel's key indices, int32
UP_PROJECTED = ("pre-norm Q (the compiled norm's input)", "Q (after RoPE: the kernel's)", "K = V (the window's keys)",
                "KV norm input")  # fmt: skip
"""What ``mla_up_proj``'s checkpoint drops in DeepSeek-V4's attention (deepseek_v4_hybrid_attention.py:866-888)."""


def fused_attention_saved(w: Workload, rate: int, sparse: bool) -> list[SavedTensor]:
    """One layer's attention after its norm: the window alone (``rate`` 0), CSA (``sparse``) or HCA."""
    spec, act, b, s, t = w.model, w.precision.activation_bytes, w.micro_batch, w.seq_len, w.tokens
    c = spec.compressed_attention
    assert c is not None
    h, H, d, r_q = spec.hidden_size, spec.num_heads, spec.head_size, c.q_lora_rank
    window = min(spec.sliding_window or s, s)
    entries = s // rate if rate else 0
    gathered = (min(c.indexer.top_k, entries) if sparse else entries) + window  # keys a query reads
    gathered_symbol = "(k_I+w)" if sparse else "(⌊s/m′⌋+w)" if rate else "w"
    rows = Dim(t, "s·b")
    tensors = [
        SavedTensor("attention input (norm output: q_a's, kv's and the compressors' input)", "s·b·h", t * h, act,
                    split="seq", for_weights=("q_a", "kv", "compressor")),
        *norm_saved(w, "query latent norm", rows, Dim(r_q, "r_q"), split="seq"),
        SavedTensor("query up-projection input (and the indexer's)", "s·b·r_q", t * r_q, act, split="seq",
                    for_weights=("q_b",)),
        SavedTensor(UP_PROJECTED[0], "s·b·H·d", t * H * d, act),
        SavedTensor(UP_PROJECTED[1], "s·b·H·d", t * H * d, act),
        SavedTensor(UP_PROJECTED[2], "s·b·d", t * d, act, split="none"),
        SavedTensor(UP_PROJECTED[3], "s·b·d", t * d, act, split="none"),
        SavedTensor("key indices a query gathers (int32)", f"s·b·{gathered_symbol}", t * gathered, INDEX_BYTES,
                    attention_core=True),
        SavedTensor("attention output (the kernel's)", "s·b·H·d", t * H * d, act, attention_core=True),
        SavedTensor("log-sum-exp (fp32)", "s·b·H", t * H, 4, attention_core=True),
        SavedTensor("grouped output projection input (after the inverse RoPE)", "s·b·H·d", t * H * d, act,
                    for_weights=("o_a",)),
        SavedTensor("o_b input", "s·b·g·r_o", t * c.output_groups * c.output_rank, act, for_weights=("o_b",)),
    ]  # fmt: skip
    if not rate:
        return tensors
    m = "m" if sparse else "m′"
    tensors.append(SavedTensor("the keys with the compressed entries appended", f"b·(s+⌊s/{m}⌋)·d",
                               b * (s + entries) * d, act, split="none", attention_core=True))  # fmt: skip
    tensors += _compressor(w, rate, sparse, d, "CSA compressor" if sparse else "HCA compressor")
    if sparse:
        tensors += _indexer(w, rate)
    return tensors


def _compressor(w: Workload, rate: int, overlapping: bool, d: int, name: str) -> list[SavedTensor]:
    """A compressor (csa.py ``Compressor``): two linears from h to c·d (c = 2 where the windows overlap), its gates'
    softmax (fp32) with the gate weights and the values it pools, and the pooled entries' norm."""
    act, b, s, t = w.precision.activation_bytes, w.micro_batch, w.seq_len, w.tokens
    series, width = (2, "2·") if overlapping else (1, "")
    dim = "d_I" if name.startswith("indexer") else "d"
    m = "m" if overlapping else "m′"
    return [
        SavedTensor(f"{name} gates' softmax (fp32)", f"{width}s·b·{dim}", series * t * d, 4, split="none",
                    attention_core=True),
        SavedTensor(f"{name} gate weights", f"{width}s·b·{dim}", series * t * d, act, split="none",
                    attention_core=True),
        SavedTensor(f"{name} values, overlapped", f"{width}s·b·{dim}", series * t * d, act, split="none",
                    attention_core=True),
        SavedTensor(f"{name} entries' norm input", f"b·⌊s/{m}⌋·{dim}", b * (s // rate) * d, act, split="none",
                    attention_core=True),
    ]  # fmt: skip


def _indexer(w: Workload, rate: int) -> list[SavedTensor]:
    """The lightning indexer (csa.py ``CSAIndexer``): its own compressor at d_I, and the gradients of its KL loss,
    computed inside the forward (fused_sparse_attention.py:1273-1334) and kept for the backward: its queries', its
    compressed keys' and its head weights'."""
    spec, act, b, s, t = w.model, w.precision.activation_bytes, w.micro_batch, w.seq_len, w.tokens
    c = spec.compressed_attention
    assert c is not None
    ix = c.indexer
    keys = b * (s // rate) * ix.head_dim
    return _compressor(w, rate, True, ix.head_dim, "indexer compressor") + [
        SavedTensor("indexer: its queries' gradient", "s·b·H_I·d_I", t * ix.heads * ix.head_dim, act,
                    attention_core=True),
        SavedTensor("indexer: its keys' gradient", "b·⌊s/m⌋·d_I", keys, act, split="none", attention_core=True),
        SavedTensor("indexer: its head weights' gradient", "s·b·H_I", t * ix.heads, act, attention_core=True),
    ]  # fmt: skip


def fused_streams_saved(w: Workload) -> list[SavedTensor]:
    """One sub-layer's fused mHC (transformer_layer.py:2036-2092; fused_mhc_kernels.py): the n streams once, in the
    activation dtype (the projection, the collapse and the spread read views of them), its fp32 factors (1/rms, the
    projection's (2 + n)·n outputs, the collapse and spread weights and the n × n mixing), and the sub-layer's output,
    which the spread keeps."""
    act, t, h = w.precision.activation_bytes, w.tokens, w.model.hidden_size
    assert w.model.hyper_connections is not None
    n = w.model.hyper_connections.streams
    factors = 1 + (2 + n) * n + 2 * n + n * n
    return [
        SavedTensor("streams (the mHC kernels' input)", "s·b·n·h", t * n * h, act, split="seq"),
        SavedTensor("1/rms, projection, collapse, spread and mixing (fp32)", "s·b·(1+(2+n)·n+2·n+n²)", t * factors, 4,
                    split="seq"),
        SavedTensor("sub-layer output (the spread's input)", "s·b·h", t * h, act, split="seq"),
    ]  # fmt: skip


def fused_head_saved(w: Workload) -> list[SavedTensor]:
    """The last collapse before the final norm, as the layers' fused mHC runs it: the last layer's streams and the
    collapse's fp32 factors (1/rms, the projection's n outputs and the weights)."""
    act, t, h = w.precision.activation_bytes, w.tokens, w.model.hidden_size
    assert w.model.hyper_connections is not None
    n = w.model.hyper_connections.streams
    return [
        SavedTensor("last collapse: the last layer's streams", "s·b·n·h", t * n * h, act, split="seq", block="head"),
        SavedTensor("last collapse: 1/rms, projection and weights (fp32)", "s·b·(1+2·n)", t * (1 + 2 * n), 4,
                    split="seq", block="head"),
    ]  # fmt: skip
