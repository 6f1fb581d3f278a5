"""What DeepSeek-V4's attention and the hyper-connections of DeepSeek-V4 and HY V4 keep for backward, as transformers
5.24 runs them in PyTorch (DeepseekV4Attention, DeepseekV4CSACompressor, DeepseekV4HCACompressor,
DeepseekV4HyperConnection, DeepseekV4HyperHead; HYV4HyperConnection, HYV4HyperHead), tensor by tensor: the eager path,
the only one their PreTrainedModels take (no SDPA, no FlashAttention: heads of 512, a sink a head, keys appended
inside the layer).

**Hyper-connections** (mHC, Xie et al. 2026; DeepSeek-V4 §2.2). Around each sub-layer the n streams (b, s, n, h, in
the activation dtype) are flattened and upcast to fp32 (a copy, n·h a token), normed without a weight (the copy and
1/rms kept) and projected; the fp32 projection's output, its sigmoids and the softmax of the n × n mixing are kept,
and each Sinkhorn-Knopp division (2·T − 1 of them for T iterations) keeps its n × n dividend and its n sums. The
collapse keeps the streams (bf16) and the collapse weights; the spread keeps the sub-layer's output and the spread
weights, and the mixing's batched matmul the mixing matrix (cast) and the streams again. iHC (HY V4) runs all of it in
fp32 with no mixing: the flattened copy (its norm keeps only 1/rms), the projection's output and its product with
1/rms, two sigmoids, the collapse and spread weights, the streams, and an fp32 copy of the sub-layer's output. A
checkpointed HY V4 step peaks in a rebuilt layer's forward at its indexer's scores, its iHC run and the attention's
locals alive, inside the backward of its n streams' output (``ihc_indexer_moment``).

**DeepSeek-V4's attention**: the query latent's norm (fp32 weight), Q's weightless per-head norm (an fp32 copy for
the power, Q itself and 1/rms in both dtypes), the one K=V head's norm, RoPE on the last d_rope channels of Q, K=V and
the output (each call keeps cos and sin repeated to d_rope, b-independent: the positions are one row), Q, the keys
(the window's s tokens with the compressed entries appended, one head that every query head reads as a view where
b = 1 and a copy of H heads otherwise), the scores' softmax in fp32 over K + 1 columns (the sinks stay fp32 and
promote the concatenation), its row maxima's indices and its cast without the sink column, the output copied to
(b, s, H·d) for the g groups' batched matmul, and o_b's input (g·r_o). A CSA compressor keeps its two overlapping
series laid out (b, s/m, 2·m, d) in bf16, the softmax of their gates in fp32 and its cast, its norm and RoPE on
the entries; an HCA compressor the values' projection (a view of it), the gates' softmax and its cast, its norm and
RoPE. The lightning indexer keeps nothing: its top-k indices carry no gradient, so its graph is freed in the forward
(its scores, b·s·H_I·s/m in fp32, are a forward transient).

A GPU kernel would keep less: a fused attention keeps the log-sum-exp in place of the b·H·s·K scores, a fused mHC
kernel (DeepSeek's TileLang one) recomputes the Sinkhorn iterations in backward instead of keeping 2·T − 1 matrices,
and a fused RoPE keeps no cos/sin copies. lmcalc counts transformers' path.
"""

from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

from lmcalc.engine.memory.compressed_fused import fused_attention_saved, fused_head_saved, fused_streams_saved
from lmcalc.engine.memory.norms import norm_saved
from lmcalc.engine.memory.saved import SavedTensor
from lmcalc.engine.model.tensors import Dim
from lmcalc.engine.workload import Workload

SINKHORN_ITERATIONS = 20  # DeepseekV4Config.hc_sinkhorn_iters' default, as the released V4 configs keep it
INDEX_BYTES = 8  # int64: the row maxima's indices


def streams_saved(w: Workload) -> list[SavedTensor]:
    """What a layer's hyper-connections keep, around its attention and its MLP (each tensor in its sub-layer's
    block); none without hyper-connections."""
    hc = w.model.hyper_connections
    if hc is None:
        return []
    mhc = fused_streams_saved(w) if fused(w) else _mhc_saved(w)  # HY V4's iHC: no fused kernel of Megatron-Core's
    sublayer = mhc if hc.mixing else _ihc_saved(w)
    return [replace(t, label=f"{name} {t.label}", block=block) for block, name in (("attention", "attn_hc"),
            ("mlp", "ffn_hc")) for t in sublayer]  # fmt: skip


def _mhc_saved(w: Workload) -> list[SavedTensor]:
    """One sub-layer's mHC (DeepseekV4HyperConnection and the decoder layer's spread and mixing)."""
    act, t, h = w.precision.activation_bytes, w.tokens, w.model.hidden_size
    assert w.model.hyper_connections is not None
    n = w.model.hyper_connections.streams
    divisions = 2 * SINKHORN_ITERATIONS - 1
    return [
        SavedTensor("streams (the collapse's and the mixing's input)", "s·b·n·h", t * n * h, act, split="seq"),
        SavedTensor("flattened streams, fp32 copy (the norm's input)", "s·b·n·h", t * n * h, 4, split="seq"),
        SavedTensor("norm 1/rms (fp32)", "s·b", t, 4, split="seq"),
        SavedTensor("normed streams (the projection's input, fp32)", "s·b·n·h", t * n * h, 4, split="seq"),
        SavedTensor("projection output (fp32)", "s·b·(2+n)·n", t * (2 + n) * n, 4, split="seq"),
        SavedTensor("collapse and spread sigmoids (fp32)", "2·s·b·n", 2 * t * n, 4, split="seq"),
        SavedTensor("mixing softmax (fp32)", "s·b·n²", t * n * n, 4, split="seq"),
        SavedTensor(
            f"Sinkhorn dividends, {divisions} (fp32)", f"{divisions}·s·b·n²", divisions * t * n * n, 4, split="seq"
        ),  # fmt: skip
        SavedTensor(f"Sinkhorn sums, {divisions} (fp32)", f"{divisions}·s·b·n", divisions * t * n, 4, split="seq"),
        SavedTensor("collapse weights (fp32)", "s·b·n", t * n, 4, split="seq"),
        SavedTensor("mixing matrix, cast", "s·b·n²", t * n * n, act, split="seq"),
        SavedTensor("spread weights, cast", "s·b·n", t * n, act, split="seq"),
        SavedTensor("sub-layer output (the spread's input)", "s·b·h", t * h, act, split="seq"),
    ]


def _ihc_saved(w: Workload) -> list[SavedTensor]:
    """One sub-layer's iHC (HYV4HyperConnection, in fp32 whatever the autocast, and the decoder layer's spread)."""
    act, t, h = w.precision.activation_bytes, w.tokens, w.model.hidden_size
    assert w.model.hyper_connections is not None
    n = w.model.hyper_connections.streams
    return [
        SavedTensor("streams (the collapse's input)", "s·b·n·h", t * n * h, act, split="seq"),
        SavedTensor("flattened streams, fp32 copy (the projection's input)", "s·b·n·h", t * n * h, 4, split="seq"),
        SavedTensor("norm 1/rms (fp32)", "s·b", t, 4, split="seq"),
        SavedTensor(
            "projection output and its product with 1/rms (fp32)", "2·s·b·2·n", 2 * t * 2 * n, 4, split="seq"
        ),  # fmt: skip
        SavedTensor("collapse and spread sigmoids (fp32)", "2·s·b·n", 2 * t * n, 4, split="seq"),
        SavedTensor("collapse and spread weights (fp32)", "2·s·b·n", 2 * t * n, 4, split="seq"),
        SavedTensor("sub-layer output, fp32 copy (the spread's input)", "s·b·h", t * h, 4, split="seq"),
    ]


class IndexerMoment(NamedTuple):
    """A HY V4 layer's forward at its indexer's scores, beyond the indexer's own tensors (``ihc_indexer_moment``)."""

    forward: float  # the attention's tensors alive then that the layer does not keep
    kept_before: float  # the share of the layer's saved tensors made by then (under recomputation, of the rebuilt ones)
    output_gradient: float  # under full recomputation, the gradient of the layer's output, n streams wide


def ihc_indexer_moment(w: Workload, layer: tuple[SavedTensor, ...], core_share: float, tp: int) -> IndexerMoment | None:
    """Where a HY V4 layer (``layer``, its saved tensors, of which the share ``core_share`` is made before its
    attention core) stands when its indexer scores the keys, the moment a checkpointed step peaks at (the layer
    rebuilt in the backward). HYV4DecoderLayer runs the attention's iHC first, so all the iHC keeps but the streams
    (the layer's input) and the sub-layer output's fp32 copy is made by then. HYV4Attention.forward still holds as
    locals the gate's projection (s·b·H·d_v), q_b's output (s·b·H·(d_nope+d_rope)), kv_a's output (s·b·(r_kv+d_rope)),
    the RoPE outputs of Q and K (s·b·(H+1)·d_rope) and of the indexer's (s·b·(H_I+1)·d_rope), and the key half of
    kv_b's output, which V's view keeps (s·b·H·d_nope), in the activation dtype. Rebuilt, the layer runs inside its
    output's backward: the gradient of the final cast's output made fp32 (s·b·n·h·4) beside the residual's part of the
    input's gradient, cast back (s·b·n·h in the activation dtype). Read from the storages live at the step's peak
    with scripts/hf_step_peak.py on the CPU (hy-v4-small, checkpointed). None for a model without iHC and an
    indexer."""
    hc, mla = w.model.hyper_connections, w.model.mla
    if hc is None or hc.mixing or mla is None or mla.indexer is None:
        return None
    act, t, n, h, heads = w.precision.activation_bytes, w.tokens, hc.streams, w.model.hidden_size, w.model.num_heads
    by_head = heads * (mla.v_head_dim + mla.qk_head_dim + mla.qk_nope_head_dim + mla.qk_rope_head_dim) / tp
    shared = mla.kv_lora_rank + 2 * mla.qk_rope_head_dim + (mla.indexer.heads + 1) * mla.qk_rope_head_dim
    locals_ = t * (by_head + shared) * act
    ihc_before = sum(x.bytes for x in _ihc_saved(w)[1:-1])  # all but the streams and the sub-layer output's copy
    streams, total = t * n * h * act, sum(x.bytes for x in layer)
    core_before = core_share * total
    if w.recompute == "full":  # the streams are the checkpointed input, not rebuilt
        return IndexerMoment(locals_, (core_before + ihc_before) / (total - streams), t * n * h * (4 + act))
    return IndexerMoment(locals_, (core_before + ihc_before + streams) / total, 0.0)  # the input: the streams kept


def hyper_head_saved(w: Workload) -> list[SavedTensor]:
    """The last collapse before the final norm (DeepseekV4HyperHead, HYV4HyperHead): the last layer's streams, their
    fp32 copy, 1/rms, and mHC's normed copy (iHC multiplies the projection by 1/rms instead), the projection's output
    and the weights."""
    hc = w.model.hyper_connections
    if hc is None:
        return []
    if fused(w) and hc.mixing:
        return fused_head_saved(w)
    act, t, h, n = w.precision.activation_bytes, w.tokens, w.model.hidden_size, hc.streams
    normed = [SavedTensor("last collapse: normed streams (fp32)", "s·b·n·h", t * n * h, 4, split="seq")]
    return [
        SavedTensor("last collapse: the last layer's streams", "s·b·n·h", t * n * h, act, split="seq", block="head"),
        SavedTensor("last collapse: streams, fp32 copy", "s·b·n·h", t * n * h, 4, split="seq", block="head"),
        SavedTensor("last collapse: norm 1/rms (fp32)", "s·b", t, 4, split="seq", block="head"),
        *[replace(x, block="head") for x in (normed if hc.mixing else [])],
        SavedTensor(
            "last collapse: projection, sigmoid and weights (fp32)", "3·s·b·n", 3 * t * n, 4, split="seq", block="head"
        ),  # fmt: skip
    ]


def compressed_attention_saved(w: Workload, layer: int | None = None) -> list[SavedTensor]:
    """What DeepSeek-V4's attention keeps after its norm in layer ``layer`` (its kind: the window alone, CSA or HCA),
    or with ``layer`` None, averaged over the layers."""
    spec = w.model
    c = spec.compressed_attention
    assert c is not None
    if layer is not None:
        return _attention_saved(w, c.rate(layer), layer in c.csa_layer_ids)
    kinds = [(0, False, spec.num_layers - len(c.csa_layer_ids) - len(c.hca_layer_ids)),
             (c.csa_rate, True, len(c.csa_layer_ids)), (c.hca_rate, False, len(c.hca_layer_ids))]  # fmt: skip
    tensors: list[SavedTensor] = []
    for rate, sparse, count in kinds:
        if count:
            part = _attention_saved(w, rate, sparse)
            tensors += part if count == spec.num_layers else [_share(x, count, spec.num_layers) for x in part]
    return tensors


def _share(tensor: SavedTensor, layers: int, of: int) -> SavedTensor:
    return replace(tensor, elements=tensor.elements * layers / of, symbol=f"({layers}/{of})·{tensor.symbol}")


def fused(w: Workload) -> bool:
    """Whether the framework runs DeepSeek-V4's attention and mHC with its fused kernels (Megatron-Core's)."""
    return w.framework.attention.compressed_kernels == "fused"


def _attention_saved(w: Workload, rate: int, sparse: bool) -> list[SavedTensor]:
    if fused(w):  # Megatron-Core's sparse kernels (engine.memory.compressed_fused)
        return fused_attention_saved(w, rate, sparse)
    spec, act, b, s, t = w.model, w.precision.activation_bytes, w.micro_batch, w.seq_len, w.tokens
    c = spec.compressed_attention
    assert c is not None
    h, H, d, r_q = spec.hidden_size, spec.num_heads, spec.head_size, c.q_lora_rank
    rope = round(d * spec.rotary_fraction)
    rows = Dim(t, "s·b")
    entries = s // rate if rate else 0  # compressed entries a sequence closes
    keys = s + entries
    kind = "CSA " if sparse else "HCA " if rate else ""
    key_symbol = f"(s+⌊s/{'m' if sparse else 'm′'}⌋)" if rate else "s"
    expanded = b > 1  # the QK matmul folds the batch into the heads: one head of b > 1 sequences is copied
    tensors = [
        SavedTensor(
            "attention input (norm output: q_a's, kv's and the compressors' input)",
            "s·b·h",
            t * h,
            act,
            split="seq",
            for_weights=("q_a", "kv", "compressor"),
        ),  # fmt: skip
        *norm_saved(w, "query latent norm", rows, Dim(r_q, "r_q"), split="seq"),
        SavedTensor("query up-projection input", "s·b·r_q", t * r_q, act, split="seq", for_weights=("q_b",)),
        SavedTensor("Q-norm input, fp32 copy (the power's)", "s·b·H·d", t * H * d, 4),
        SavedTensor("Q-norm input", "s·b·H·d", t * H * d, act),
        SavedTensor("Q-norm 1/rms (fp32, and cast)", "s·b·H", t * H, 4 + act),
        *norm_saved(w, "KV norm", rows, Dim(d, "d"), split="seq"),
        SavedTensor(
            "RoPE cos and sin, repeated (Q, K=V and the output)", "6·s·d_rope", 6 * s * rope, act, split="none"
        ),  # fmt: skip
        SavedTensor("Q (after RoPE)", "s·b·H·d", t * H * d, act),
        SavedTensor(
            f"K = V{' with the compressed entries' if rate else ''}",
            f"b·{key_symbol}·d",
            b * keys * d,
            act,
            split="none",
        ),  # fmt: skip
        *(
            [SavedTensor("K repeated to H heads (the matmul's copy)", f"b·H·{key_symbol}·d", b * H * keys * d, act)]
            if expanded
            else []
        ),  # fmt: skip
        SavedTensor(
            "softmax with the sink column (fp32)",
            f"b·H·s·({key_symbol}+1)",
            b * H * s * (keys + 1),
            4,
            attention_core=True,
        ),  # fmt: skip
        SavedTensor("row maxima's indices (int64)", "b·H·s", b * H * s, INDEX_BYTES, attention_core=True),
        SavedTensor(
            "softmax, cast (without the sink column)", f"b·H·s·{key_symbol}", b * H * s * keys, act, attention_core=True
        ),  # fmt: skip
        SavedTensor("grouped output projection input (b, s, H·d)", "s·b·H·d", t * H * d, act, for_weights=("o_a",)),
        SavedTensor("o_b input", "s·b·g·r_o", t * c.output_groups * c.output_rank, act, for_weights=("o_b",)),
    ]
    if rate:
        tensors += _compressor_saved(w, rate, sparse, kind)
    return tensors


def _compressor_saved(w: Workload, rate: int, sparse: bool, kind: str) -> list[SavedTensor]:
    """A CSA or HCA compressor: its series and their gates' softmax over each window, the entries' norm and RoPE."""
    spec, act, b, s = w.model, w.precision.activation_bytes, w.micro_batch, w.seq_len
    d = spec.head_size
    rope = round(d * spec.rotary_fraction)
    entries = b * (s // rate)
    m = "m" if sparse else "m′"
    rows = Dim(entries, f"b·⌊s/{m}⌋")
    series, width = (2, "2·") if sparse else (1, "")
    if sparse:  # the two series laid out (b, s/m, 2·m, d): a new tensor
        values = SavedTensor(f"{kind}compressor series, laid out", f"2·b·⌊s/{m}⌋·{m}·d", 2 * entries * rate * d,
                             act, split="none")  # fmt: skip
    else:  # a view of the values' projection, which keeps it whole
        values = SavedTensor(f"{kind}compressor values (the projection's output)", "s·b·d", b * s * d, act,
                             split="none")  # fmt: skip
    return [
        values,
        SavedTensor(
            f"{kind}compressor gates' softmax (fp32)",
            f"{width}b·⌊s/{m}⌋·{m}·d",
            series * entries * rate * d,
            4,
            split="none",
        ),  # fmt: skip
        SavedTensor(
            f"{kind}compressor gates' softmax, cast",
            f"{width}b·⌊s/{m}⌋·{m}·d",
            series * entries * rate * d,
            act,
            split="none",
        ),  # fmt: skip
        *[
            replace(x, label=f"{kind}compressor {x.label}", split="none")
            for x in norm_saved(w, "entries' norm", rows, Dim(d, "d"))
        ],  # fmt: skip
        SavedTensor(
            f"{kind}compressor RoPE cos and sin", f"2·b·⌊s/{m}⌋·d_rope", 2 * entries * rope, act, split="none"
        ),  # fmt: skip
    ]
