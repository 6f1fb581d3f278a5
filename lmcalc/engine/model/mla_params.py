"""Multi-head latent attention's weight tensors (DeepSeek-V2 §2.1; transformers' DeepseekV3Attention) and DeepSeek
sparse attention's lightning indexer (DeepSeek-V3.2 §2.1): ``engine.model.params`` lists them in build order."""

from __future__ import annotations

from typing import NamedTuple

from lmcalc.engine.model.tensors import Dim, Site, WeightTensor, linear, norm, tensor
from lmcalc.specs import LocalMLASpec, MLASpec, ModelSpec


def mla_tensors(spec: ModelSpec, site: Site) -> list[WeightTensor]:
    """MLA's projections in the layers ``site`` counts; where the local layers have widths of their own (dots.3 Note's
    ``mla.local``), the global layers' at the model's widths (L_global) and the local layers' at theirs (L_local)."""
    assert spec.mla is not None
    local = spec.mla.local
    if local is None:
        return _mla_kind(spec, site, _Widths.of(spec, spec.num_heads, spec.mla))
    global_site = Site("attention", site.count - spec.local_layers, "L_global")
    return _mla_kind(spec, global_site, _Widths.of(spec, spec.num_heads, spec.mla)) + _mla_kind(
        spec, Site("attention", spec.local_layers, "L_local"), _Widths.of(spec, local.heads, local, ",local")
    )


class _Widths(NamedTuple):
    """One kind of layer's MLA widths, each a size and its symbol."""

    heads: Dim
    q_rank: Dim | None
    kv_rank: Dim
    rope: Dim
    qk: Dim  # H·d_qk
    kv_up: Dim  # H·(d_nope+d_v)
    out: Dim  # H·d_v

    @classmethod
    def of(cls, spec: ModelSpec, heads: int, m: MLASpec | LocalMLASpec, kind: str = "") -> _Widths:
        h = f"H{kind}"
        qk = Dim(heads * m.qk_head_dim, f"{h}·d_qk{kind}")
        if spec.attention_output_gate and not spec.attention_gate_proj:  # A.X K2: the up-projection makes the
            # queries and the output's gate, H·d_v
            qk = Dim(heads * (m.qk_head_dim + m.v_head_dim), "H·(d_qk+d_v)")
        return cls(
            Dim(heads, h),
            Dim(m.q_lora_rank, f"r_q{kind}") if m.q_lora_rank else None,
            Dim(m.kv_lora_rank, f"r_kv{kind}"),
            Dim(m.qk_rope_head_dim, f"d_rope{kind}"),
            qk,
            Dim(heads * (m.qk_nope_head_dim + m.v_head_dim), f"{h}·(d_nope{kind}+d_v{kind})"),
            Dim(heads * m.v_head_dim, f"{h}·d_v{kind}"),
        )


def _mla_kind(spec: ModelSpec, site: Site, w: _Widths) -> list[WeightTensor]:
    """One kind of layer's MLA: the query through the rank r_q where it has one, the joint KV latent with the shared
    RoPE key and its norm (and dots.3 Note's norm on the RoPE key), the KV up-projection, the output; biases on the
    down-projections and the output only; HY V4's output gate of its own projection and sinks; a gate a head from a
    projection of its own (the Bailing hybrid's and dots.3 Note's g_proj, h → H)."""
    h = Dim(spec.hidden_size, "h")
    qkv_bias = spec.attention_bias in ("qkv", "all")
    out_bias = spec.attention_bias in ("out", "all")
    assert spec.mla is not None
    m = spec.mla
    tensors: list[WeightTensor] = []
    if w.q_rank:
        tensors += linear("attn.q_a", site, w.q_rank, h, qkv_bias)
        tensors += norm("attn.q_a_norm", site, w.q_rank, spec)
        q_in = Dim(2 * w.q_rank.size, "2·r_q") if m.q_latent_concat else w.q_rank  # the normed latent ‖ the latent
        tensors += linear("attn.q_b", site, w.qk, q_in, False)
    else:
        tensors += linear("attn.q", site, w.qk, h, False)
    latent = Dim(w.kv_rank.size + w.rope.size, f"({w.kv_rank.symbol}+{w.rope.symbol})")
    tensors += linear("attn.kv_a", site, latent, h, qkv_bias)
    tensors += norm("attn.kv_a_norm", site, w.kv_rank, spec)
    tensors += linear("attn.kv_b", site, w.kv_up, w.kv_rank, False)
    tensors += linear("attn.o", site, h, w.out, out_bias)
    if m.rope_key_norm:  # dots.3 Note: an RMSNorm on the shared RoPE key (k_rope_only_layernorm)
        tensors += norm("attn.k_rope_norm", site, w.rope, spec)
    if spec.attention_gate_proj:  # HY V4: a sigmoid gate on the output from a projection of its own, h → H·d_v
        tensors += linear("attn.attn_gate", site, w.out, h, False)
    if spec.attention_sinks:  # HY V4: a learned logit a head, as gpt-oss's
        tensors.append(tensor("attn.sinks", site, (w.heads,), False))
    if spec.attention_head_gate != "none":  # PEFT's g_proj adapts it
        tensors += linear("attn.g", site, w.heads, h, False)
    return tensors


def indexer_tensors(spec: ModelSpec) -> list[WeightTensor]:
    """DeepSeek sparse attention's lightning indexer in each layer that runs one (DeepseekV32Indexer): its queries from
    the query latent, one key from the hidden state with a LayerNorm, and a weight per head (DeepSeek-V3.2 §2.1)."""
    ix = spec.indexer
    if ix is None:
        return []
    assert spec.mla is not None and spec.mla.q_lora_rank is not None  # MLASpec requires the query latent
    h, d = Dim(spec.hidden_size, "h"), Dim(ix.head_dim, "d_I")
    site = Site("indexer", spec.indexer_layers, "L_I" if spec.indexer_layers < spec.num_layers else "L")
    return (
        linear("indexer.wq_b", site, Dim(ix.heads * ix.head_dim, "H_I·d_I"), Dim(spec.mla.q_lora_rank, "r_q"), False)
        + linear("indexer.wk", site, d, h, False)
        + [tensor("indexer.k_norm.weight", site, (d,), False), tensor("indexer.k_norm.bias", site, (d,), False)]
        + linear("indexer.weights_proj", site, Dim(ix.heads, "H_I"), h, False)
    )
