"""DeepSeek-V4's layers (DeepSeek-AI 2026, DeepSeek-V4 §2.2-2.3; transformers' DeepseekV4Attention,
DeepseekV4CSACompressor, DeepseekV4HCACompressor, DeepseekV4Indexer, DeepseekV4HyperConnection): their weight tensors,
the keys a query reads in each kind of layer, the indexer's key scores and the hyper-connections' stream mixing.
``engine.model.params`` lists the tensors in build order; ``engine.model.flops`` takes the rest, and its rows of the
detailed count come from ``compressed_terms``."""

from __future__ import annotations

from lmcalc.engine.choices import AttnConvention
from lmcalc.engine.model.tensors import Dim, Site, WeightTensor, linear, norm, tensor
from lmcalc.result import Term
from lmcalc.specs import ModelSpec
from lmcalc.units import group

CSA_INDEXER_NOTE = (
    "the CSA layers' indexers score every compressed entry a query may pick, without gradients (transformers' "
    "top-k indices carry none), so they count once in training"
)


def compressed_attention_tensors(spec: ModelSpec) -> list[WeightTensor]:
    """Each layer's attention: the query's down-projection h → r_q, its norm and up-projection r_q → H·d; the one
    key-value head h → d and its norm; the output's g groups, each H·d/g → r_o (a block-diagonal matrix of H·d·r_o
    elements), then g·r_o → h; a sink a head. A CSA layer's compressor makes two series of d a token (values and
    gates, h → 2·d each, a position bias of m × 2·d, a norm of d); an HCA layer's one (h → d each, m' × d, d)."""
    c = spec.compressed_attention
    if c is None:
        return []
    h, heads, d = Dim(spec.hidden_size, "h"), spec.num_heads, spec.head_size
    site, r_q = Site("attention", spec.num_layers, "L"), Dim(c.q_lora_rank, "r_q")
    q, grouped = Dim(heads * d, "H·d"), Dim(c.output_groups * c.output_rank, "g·r_o")
    tensors = (
        linear("attn.q_a", site, r_q, h, False)
        + norm("attn.q_a_norm", site, r_q, spec)
        + linear("attn.q_b", site, q, r_q, False)
        + linear("attn.kv", site, Dim(d, "d"), h, False)
        + norm("attn.kv_norm", site, Dim(d, "d"), spec)
        + [tensor("attn.o_a.weight", site, (grouped, Dim(heads * d // c.output_groups, "H·d/g")), True)]
        + linear("attn.o_b", site, h, grouped, False)
        + [tensor("attn.sinks", site, (Dim(heads, "H"),), False)]
    )
    kinds = (("csa", c.csa_layer_ids, c.csa_rate, 2, "m", "2·d"), ("hca", c.hca_layer_ids, c.hca_rate, 1, "m'", "d"))
    for kind, layers, rate, series, m_sym, width_sym in kinds:
        if not layers:
            continue
        where, width = Site("attention", len(layers), f"L_{kind.upper()}"), Dim(series * d, width_sym)
        tensors += linear(f"{kind}_compressor.kv", where, width, h, False)
        tensors += linear(f"{kind}_compressor.gate", where, width, h, False)
        tensors.append(tensor(f"{kind}_compressor.position_bias", where, (Dim(rate, m_sym), width), False))
        tensors += norm(f"{kind}_compressor.kv_norm", where, Dim(d, "d"), spec)
    return tensors + _indexer_tensors(spec)


def _indexer_tensors(spec: ModelSpec) -> list[WeightTensor]:
    """A CSA layer's lightning indexer: a compressor of its own at d_I (h → 2·d_I for values and gates, m × 2·d_I,
    a norm of d_I), queries from the query latent (r_q → H_I·d_I) and a weight a head (h → H_I)."""
    c = spec.compressed_attention
    if c is None or not c.csa_layer_ids:
        return []
    h, ix = Dim(spec.hidden_size, "h"), c.indexer
    site, width = Site("indexer", len(c.csa_layer_ids), "L_CSA"), Dim(2 * ix.head_dim, "2·d_I")
    return (
        linear("indexer.kv", site, width, h, False)
        + linear("indexer.gate", site, width, h, False)
        + [tensor("indexer.position_bias", site, (Dim(c.csa_rate, "m"), width), False)]
        + norm("indexer.kv_norm", site, Dim(ix.head_dim, "d_I"), spec)
        + linear("indexer.q_b", site, Dim(ix.heads * ix.head_dim, "H_I·d_I"), Dim(c.q_lora_rank, "r_q"), False)
        + linear("indexer.weights", site, Dim(ix.heads, "H_I"), h, False)
    )


def hyper_connection_tensors(spec: ModelSpec) -> list[WeightTensor]:
    """mHC's: around each of a layer's two sub-layers, the projection of the n streams n·h → (2+n)·n, its bias and
    three scales (iHC's, HY V4's: n·h → 2·n and two scales); before the final norm, the last collapse n·h → n, its
    bias and a scale."""
    hc = spec.hyper_connections
    if hc is None:
        return []
    n, streams = hc.streams, Dim(hc.streams * spec.hidden_size, "n·h")
    mixes = Dim((2 + n) * n, "(2+n)·n") if hc.mixing else Dim(2 * n, "2·n")
    scales = Dim(3, "3") if hc.mixing else Dim(2, "2")
    layers, once = Site("hyper_connections", spec.num_layers, "L"), Site("hyper_connections", 1, "1")
    tensors = []
    for sublayer in ("attn_hc", "ffn_hc"):
        tensors += [
            tensor(f"{sublayer}.fn", layers, (mixes, streams), True),
            tensor(f"{sublayer}.base", layers, (mixes,), False),
            tensor(f"{sublayer}.scale", layers, (scales,), False),
        ]
    return tensors + [
        tensor("hc_head.fn", once, (Dim(n, "n"), streams), True),
        tensor("hc_head.base", once, (Dim(n, "n"),), False),
        tensor("hc_head.scale", once, (Dim(1, "1"),), False),
    ]


def stream_mixing_flops(spec: ModelSpec) -> float:
    """Forward FLOPs a token of mHC beyond its weights: each sub-layer mixes the n streams of h by an n × n matrix
    (a batched matmul, which FlopCounterMode counts), 2·n²·h, twice a layer."""
    hc = spec.hyper_connections
    return 0.0 if hc is None or not hc.mixing else spec.num_layers * 2 * 2 * hc.streams**2 * spec.hidden_size


def entries_read(seq_len: int, rate: int, cap: int | None = None) -> int:
    """Σ over the queries j = 1..s of the compressed entries query j may read, ⌊j/m⌋ (an entry holds m tokens and is
    read once they have all gone by), each at most ``cap`` (a CSA query reads the top k_I): in closed form,
    S(x) = m·q·(q−1)/2 + q·(r+1) with q, r = divmod(x, m), and with a cap k, S(min(s, k·m − 1)) + k·(s − k·m + 1)
    beyond k·m."""

    def below(x: int) -> int:
        q, r = divmod(x, rate)
        return rate * q * (q - 1) // 2 + q * (r + 1)

    if cap is None or seq_len < cap * rate:
        return below(seq_len)
    return below(cap * rate - 1) + cap * (seq_len - cap * rate + 1)


def _window_keys(seq_len: int, window: int) -> float:
    """Keys a query of a causal sliding window of w sees, averaged over s positions (``flops.local_keys``)."""
    s, w = seq_len, window
    return (s + 1) / 2 if s <= w else (w * (w + 1) / 2 + (s - w) * w) / s


def layer_keys(spec: ModelSpec, layer: int, seq_len: int, convention: AttnConvention) -> float:
    """Keys a query of layer ``layer`` reads, averaged over the s positions. Full (what FlopCounterMode counts in
    transformers' eager attention, every key scored and then masked): the s tokens and the s // m compressed entries.
    Causal (what the sparse kernel reads): the window's keys, and the entries gone by, at most the k_I its indexer
    picks in a CSA layer."""
    c = spec.compressed_attention
    assert c is not None and spec.sliding_window is not None
    rate = c.rate(layer)
    if convention == "full":
        return seq_len + (seq_len // rate if rate else 0)
    cap = c.indexer.top_k if layer in c.csa_layer_ids else None
    entries = entries_read(seq_len, rate, cap) / seq_len if rate else 0.0
    return _window_keys(seq_len, spec.sliding_window) + entries


def mean_keys(spec: ModelSpec, seq_len: int, convention: AttnConvention) -> float:
    """``layer_keys`` averaged over the layers."""
    return sum(layer_keys(spec, i, seq_len, convention) for i in range(spec.num_layers)) / spec.num_layers


def indexer_keys(spec: ModelSpec, seq_len: int, convention: AttnConvention) -> float:
    """Compressed entries a CSA layer's indexer scores a query against, averaged over the positions: s // m (full:
    transformers scores all, then masks the future ones) or those gone by (causal)."""
    c = spec.compressed_attention
    assert c is not None
    if convention == "full":
        return seq_len // c.csa_rate
    return entries_read(seq_len, c.csa_rate) / seq_len


def indexer_flops(spec: ModelSpec, seq_len: int, convention: AttnConvention) -> float:
    """Forward FLOPs a token of the CSA layers' indexers beyond their weights: each of the H_I heads scores the
    query against every compressed key it may pick, 2·d_I a key (DeepSeek-V4 §2.3.1, eq. 16; the weighted sum over
    the heads is element-wise)."""
    c = spec.compressed_attention
    if c is None or not c.csa_layer_ids:
        return 0.0
    ix = c.indexer
    return len(c.csa_layer_ids) * indexer_keys(spec, seq_len, convention) * 2 * ix.heads * ix.head_dim


def compressed_terms(
    spec: ModelSpec, indexer: float, streams: float, seq_len: int, convention: AttnConvention
) -> list[Term]:
    """DeepSeek-V4's and HY V4's rows of the detailed count: the CSA layers' indexers (``indexer``, their forward
    FLOPs a token) and the hyper-connections' projections and stream mixing (``streams``)."""
    c, hc, terms = spec.compressed_attention, spec.hyper_connections, []
    if c is not None and c.csa_layer_ids:
        ix, n, keys = c.indexer, len(c.csa_layer_ids), indexer_keys(spec, seq_len, convention)
        scores = indexer_flops(spec, seq_len, convention)
        terms.append(
            Term("indexer", "CSA indexers (fwd only, per token)", indexer, "FLOPs",
                 "2 · Σ indexer weight elements + 2 · L_CSA · T · H_I · d_I",
                 f"2 × {group((indexer - scores) / 2)} + 2 × {n} × {keys:g} × {ix.heads} × {ix.head_dim}",
                 "DeepSeek-AI 2026 (DeepSeek-V4) §2.3.1", note=f"T compressed entries a query; {CSA_INDEXER_NOTE}")
        )  # fmt: skip
    if hc is not None and not hc.mixing:  # HY V4's iHC: its projections alone
        terms.append(Term("streams", "Hyper-connections (fwd, per token)", streams, "FLOPs",
                          "2 · Σ iHC projection elements", f"2 × {group(streams / 2)}"))  # fmt: skip
    elif hc is not None:
        mixing = stream_mixing_flops(spec)
        terms.append(
            Term("streams", "Hyper-connections (fwd, per token)", streams, "FLOPs",
                 "2 · Σ mHC projection elements + L · 2 · 2·n²·h",
                 f"2 × {group((streams - mixing) / 2)} + {spec.num_layers} × 2 × 2 × {hc.streams}² × "
                 f"{spec.hidden_size}", "Xie et al. 2026 (mHC); DeepSeek-AI 2026 (DeepSeek-V4) §2.2",
                 note="each sub-layer's n × n mixing of the streams is a batched matmul")
        )  # fmt: skip
    return terms
