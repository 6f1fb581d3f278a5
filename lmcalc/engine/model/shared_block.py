"""Transformer blocks run at several depths (Zamba and Zamba 2, Glorioso et al. 2024; transformers' ZambaHybridLayer,
Zamba2AttentionDecoderLayer, Zamba2MLP, Zamba2HybridLayer): their weights, held once a block and computed at every
use, and what each use adds of its own. ``engine.model.params`` lists them; a ``Site`` whose ``active`` count (the
uses) exceeds its ``count`` (the blocks) is how FLOPs come from the uses and the parameter count from the weights."""

from __future__ import annotations

from lmcalc.engine.model.tensors import Dim, Site, WeightTensor, linear, norm
from lmcalc.specs import ModelSpec


def shared_block_tensors(spec: ModelSpec) -> list[WeightTensor]:
    """Each of the B blocks (G where the uses do not share them): a norm on the layer's input beside the embedding
    (2·h), Q, K and V from it (2·h → H·d, H_kv·d, d = 2·h/H by default), the output H·d → h, a norm (h) and a gated
    MLP of f (h → 2·f, f → h, biases where the MLPs have them); each of the G uses: Zamba 2's MLP adapter
    h → r → 2·f, with ``attention_adapters`` Q's, K's and V's 2·h → r → 2·h, and the linear h → h that feeds the
    layer's Mamba mixer."""
    b = spec.shared_block
    if b is None:
        return []
    h, wide, f = Dim(spec.hidden_size, "h"), Dim(2 * spec.hidden_size, "2·h"), spec.ffn_size
    heads, d, uses = spec.num_heads, spec.head_size, b.uses
    held = "B" if b.tied else "G"  # untied, each use holds a block of its own
    attention = Site("shared_attention", b.held, held, active=uses)  # held B times, computed G times
    mlp = Site("shared_mlp", b.held, held, active=uses)
    q, kv = Dim(heads * d, "H·d"), Dim(spec.kv_heads * d, "H_kv·d")
    tensors = (
        norm("shared.input_norm", attention, wide, spec)
        + linear("shared.q", attention, q, wide, False)
        + linear("shared.k", attention, kv, wide, False)
        + linear("shared.v", attention, kv, wide, False)
        + linear("shared.o", attention, h, q, False)
        + norm("shared.pre_ff_norm", mlp, h, spec)
        + linear("shared.gate_up", mlp, Dim(2 * f, "2·f"), h, spec.mlp_bias)
        + linear("shared.down", mlp, h, Dim(f, "f"), spec.mlp_bias)
    )
    each_attention, each_mlp = Site("shared_attention", uses, "G"), Site("shared_mlp", uses, "G")
    if b.adapter_rank:  # Zamba 2's
        r = Dim(b.adapter_rank, "r")
        if b.attention_adapters:
            for name in ("q", "k", "v"):
                tensors += linear(f"adapter.{name}.down", each_attention, r, wide, False)
                tensors += linear(f"adapter.{name}.up", each_attention, wide, r, False)
        tensors += linear("adapter.gate_up.down", each_mlp, r, h, False)
        tensors += linear("adapter.gate_up.up", each_mlp, Dim(2 * f, "2·f"), r, False)
    return tensors + linear("shared.linear", each_mlp, h, h, False)
