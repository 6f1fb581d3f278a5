"""Multi-head latent attention's weight tensors (DeepSeek-V2 §2.1; transformers' DeepseekV3Attention) and DeepSeek
sparse attention's lightning indexer (DeepSeek-V3.2 §2.1): ``engine.model.params`` lists them in build order."""

from __future__ import annotations

from lmcalc.engine.model.tensors import Dim, Site, WeightTensor, linear, norm, tensor
from lmcalc.specs import ModelSpec


def mla_tensors(spec: ModelSpec, site: Site) -> list[WeightTensor]:
    """MLA's projections in the layers ``site`` counts: the query through the rank r_q where it has one, the joint KV
    latent with the shared RoPE key and its norm, the KV up-projection, the output; biases on the down-projections and
    the output only; HY V4's output gate of its own projection and sinks."""
    h, heads = Dim(spec.hidden_size, "h"), spec.num_heads
    qkv_bias = spec.attention_bias in ("qkv", "all")
    out_bias = spec.attention_bias in ("out", "all")
    assert spec.mla is not None
    m = spec.mla
    tensors: list[WeightTensor] = []
    q_dim = Dim(heads * m.qk_head_dim, "H·d_qk")
    if spec.attention_output_gate and not spec.attention_gate_proj:  # A.X K2: the up-projection makes the
        # queries and the output's gate, H·d_v
        q_dim = Dim(heads * (m.qk_head_dim + m.v_head_dim), "H·(d_qk+d_v)")
    if m.q_lora_rank:
        q_rank = Dim(m.q_lora_rank, "r_q")
        tensors += linear("attn.q_a", site, q_rank, h, qkv_bias)
        tensors += norm("attn.q_a_norm", site, q_rank, spec)
        q_in = Dim(2 * m.q_lora_rank, "2·r_q") if m.q_latent_concat else q_rank  # the normed latent ‖ the latent
        tensors += linear("attn.q_b", site, q_dim, q_in, False)
    else:
        tensors += linear("attn.q", site, q_dim, h, False)
    kv_rank = Dim(m.kv_lora_rank, "r_kv")
    tensors += linear("attn.kv_a", site, Dim(m.kv_lora_rank + m.qk_rope_head_dim, "(r_kv+d_rope)"), h, qkv_bias)
    tensors += norm("attn.kv_a_norm", site, kv_rank, spec)
    kv_up = Dim(heads * (m.qk_nope_head_dim + m.v_head_dim), "H·(d_nope+d_v)")
    tensors += linear("attn.kv_b", site, kv_up, kv_rank, False)
    tensors += linear("attn.o", site, h, Dim(heads * m.v_head_dim, "H·d_v"), out_bias)
    if spec.attention_gate_proj:  # HY V4: a sigmoid gate on the output from a projection of its own, h → H·d_v
        tensors += linear("attn.attn_gate", site, Dim(heads * m.v_head_dim, "H·d_v"), h, False)
    if spec.attention_sinks:  # HY V4: a learned logit a head, as gpt-oss's
        tensors.append(tensor("attn.sinks", site, (Dim(heads, "H"),), False))
    return tensors


def indexer_tensors(spec: ModelSpec) -> list[WeightTensor]:
    """DeepSeek sparse attention's lightning indexer in each layer that runs one (DeepseekV32Indexer): its queries from
    the query latent, one key from the hidden state with a LayerNorm, and a weight per head (DeepSeek-V3.2 §2.1)."""
    ix = spec.indexer
    if ix is None:
        return []
    assert spec.mla is not None and spec.mla.q_lora_rank is not None  # MLASpec requires the query latent
    h, d = Dim(spec.hidden_size, "h"), Dim(ix.head_dim, "d_I")
    site = Site("indexer", spec.indexer_layers, "L_I" if ix.own_layers else "L")
    return (
        linear("indexer.wq_b", site, Dim(ix.heads * ix.head_dim, "H_I·d_I"), Dim(spec.mla.q_lora_rank, "r_q"), False)
        + linear("indexer.wk", site, d, h, False)
        + [tensor("indexer.k_norm.weight", site, (d,), False), tensor("indexer.k_norm.bias", site, (d,), False)]
        + linear("indexer.weights_proj", site, Dim(ix.heads, "H_I"), h, False)
    )
