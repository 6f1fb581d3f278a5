"""The Byte Latent Transformer beyond its local decoder's layers (``byte_specs.ByteLatentSpec``; Pagnoni et al. 2024;
transformers 5.24's BltModel): the tensors of the hashed n-gram embeddings, the local encoder, the cross-attention
between bytes and patches, the global transformer and the entropy model, and their FLOPs on s bytes cut into P
patches (``byte_specs.patches``). The decoder's layers, the byte embedding and the head are the ``ModelSpec``'s own,
counted by ``engine.model.params`` and ``engine.model.flops`` per byte like any model's."""

from __future__ import annotations

from lmcalc.engine.choices import AttnConvention
from lmcalc.engine.model.attended import effective_keys, local_keys
from lmcalc.engine.model.tensors import Dim, Site, WeightTensor, linear, tensor
from lmcalc.result import Term
from lmcalc.specs import ByteStackSpec, ModelSpec
from lmcalc.units import group

GROUPS = ("hash_embedding", "byte_encoder", "patch_cross_attention", "global_transformer", "patcher")
"""The parameter groups BLT adds; ``engine.model.flops`` counts their FLOPs here, by the tokens each runs on."""
LABELS = {
    "hash_embedding": "Hashed n-gram embeddings",
    "byte_encoder": "Local encoder's layers",
    "patch_cross_attention": "Byte-patch cross-attention and patch projections",
    "global_transformer": "Global transformer over patches",
    "patcher": "Entropy model (patcher, frozen)",
}


def patches(seq_len: int) -> int:
    """P, the patches transformers 5.24's BltModel makes of s bytes where every byte starts one: s + 1 (the last
    empty). Without the entropy model (patch_in_forward false, or a patching_mode other than entropy) it makes these
    always; with it, where every byte's next-byte entropy exceeds the threshold, as an untrained model's does. A
    trained entropy model merges bytes into fewer patches, which this count does not know: it is the most."""
    return seq_len + 1


def _stack(name: str, group: str, stack: ByteStackSpec, symbol: str) -> list[WeightTensor]:
    """A stack's layers: q, k, v, o, the SwiGLU's three matrices and two RMSNorms, in each of its layers."""
    h, f = Dim(stack.width, f"h_{symbol}"), Dim(stack.ffn_size, f"f_{symbol}")
    q, kv = Dim(stack.heads * stack.head_dim, f"H_{symbol}·d_{symbol}"), Dim(stack.kv_heads * stack.head_dim,
                                                                            f"H_kv,{symbol}·d_{symbol}")  # fmt: skip
    site = Site(group, stack.layers, f"L_{symbol}")
    tensors = linear(f"{name}.q_proj", site, q, h, False) + linear(f"{name}.k_proj", site, kv, h, False)
    tensors += linear(f"{name}.v_proj", site, kv, h, False) + linear(f"{name}.o_proj", site, h, q, False)
    tensors += linear(f"{name}.gate_proj", site, f, h, False) + linear(f"{name}.up_proj", site, f, h, False)
    tensors += linear(f"{name}.down_proj", site, h, f, False)
    return tensors + [tensor(f"{name}.norms", Site(group, 2 * stack.layers, f"2·L_{symbol}"), (h,), False)]


def _cross(name: str, site: Site, h: Dim, heads: int, kv_heads: int, d: int) -> list[WeightTensor]:
    """One cross-attention (BltCrossAttention): q and o of H·d, k and v of H_kv·d, RMSNorms of h on queries and keys."""
    q, kv = Dim(heads * d, "H·d"), Dim(kv_heads * d, "H_kv·d")
    tensors = linear(f"{name}.q_proj", site, q, h, False) + linear(f"{name}.k_proj", site, kv, h, False)
    tensors += linear(f"{name}.v_proj", site, kv, h, False) + linear(f"{name}.o_proj", site, h, q, False)
    norms = Site(site.group, 2 * site.count, f"2·{site.count_symbol}")
    return tensors + [tensor(f"{name}.qk_norms", norms, (h,), False)]


def byte_latent_tensors(spec: ModelSpec) -> list[WeightTensor]:
    """BLT's tensors beyond the decoder's layers, byte embedding, final norm and head: the encoder's layers, its
    patch projection (h → k·h) and cross-attention layers, the global transformer (and its projection from k·h_e
    where that differs from h_g), the decoder's patch projection (h_g → k·h) and cross-attention layers, the hash
    tables, and the entropy model (its embedding, layers, norm and head)."""
    b = spec.byte_latent
    if b is None:
        return []
    h, k, e, g = Dim(spec.hidden_size, "h"), b.cross_attn_k, b.encoder, b.global_stack
    once, crossing = Site("patch_cross_attention", 1, "1"), Dim(k * spec.hidden_size, "k·h")
    tensors = _stack("encoder.layers", "byte_encoder", e, "e")
    tensors += linear("encoder.patch_embedding_projection", once, crossing, h, False)
    tensors += _cross("encoder.cross_attn", Site("patch_cross_attention", b.encoder_crosses, "C_e"), h, e.heads,
                      e.kv_heads, e.head_dim)  # fmt: skip
    tensors += _stack("global.layers", "global_transformer", g, "g")
    if b.global_projection:
        tensors += linear("global.token_embedding_projection", Site("global_transformer", 1, "1"),
                          Dim(g.width, "h_g"), crossing, False)  # fmt: skip
    tensors += linear("decoder.patch_embedding_projection", once, crossing, Dim(g.width, "h_g"), False)
    crosses = spec.num_layers if b.decoder_cross_every_layer else 1
    tensors += _cross("decoder.cross_attn", Site("patch_cross_attention", crosses, "C_d"), h, spec.num_heads,
                      spec.kv_heads, spec.head_size)  # fmt: skip
    rows = Dim(b.hash_tables * b.hash_vocab, "n_hash·V_hash")
    tensors.append(tensor("encoder_hash_tok_embedding", Site("hash_embedding", 1, "1"), (rows, h), False))
    p = b.patcher
    if p is not None:
        hp, vp, frozen = Dim(p.width, "h_p"), Dim(p.vocab_size, "V_p"), Site("patcher", 1, "1")
        tensors.append(tensor("patcher.embed_tokens", frozen, (vp, hp), False))
        tensors += _stack("patcher.layers", "patcher", p, "p")
        tensors += [tensor("patcher.norm", frozen, (hp,), False), tensor("patcher.lm_head", frozen, (vp, hp), False)]
    return tensors


def _layers(stack: ByteStackSpec, tokens: float, keys: float) -> float:
    """Forward FLOPs of a stack's layers over ``tokens`` positions, each query scored against ``keys`` keys: its
    weights' 2 FLOPs an element a position, and 2·2·keys·H·d for QKᵀ and AV."""
    h, d = stack.width, stack.head_dim
    weights = stack.layer_params - 2 * h  # the norms compute nothing the count sees
    return stack.layers * tokens * (2 * weights + 4 * keys * stack.heads * d)


def _cross_flops(h: int, heads: int, kv_heads: int, d: int, queries: float, keys: float) -> float:
    """One cross-attention's forward FLOPs: q and o over the queries, k and v over the keys, and every query
    against every key, QKᵀ and AV (its mask keeps a patch's own bytes, but the kernel computes them all)."""
    return 2 * queries * 2 * h * heads * d + 2 * keys * 2 * h * kv_heads * d + 4 * queries * keys * heads * d


def _local_keys(seq_len: int, window: int | None, convention: AttnConvention) -> float:
    """Keys a query of a byte-level stack is scored against: every key (full), or within its window (causal)."""
    if convention == "full" or window is None:
        return effective_keys(seq_len, convention)
    return local_keys(seq_len, window, "sliding")


def byte_latent_flops(spec: ModelSpec, seq_len: int, convention: AttnConvention) -> tuple[float, float]:
    """Forward FLOPs per byte of what BLT runs beside its decoder's layers, on sequences of s bytes cut into P
    patches: what training differentiates (the encoder's layers, its last cross-attention, the global transformer, the
    decoder's patch projection and cross-attention), and what runs forward alone: the entropy model (frozen, without
    gradients) and, where the encoder cross-attends after every layer, each but the last, whose patches the next
    layer's overwrite (BltLocalEncoder reduces them anew from the bytes), so no gradient reaches it."""
    b = spec.byte_latent
    if b is None:
        return 0.0, 0.0
    s, P, h, k, e, g = seq_len, patches(seq_len), spec.hidden_size, b.cross_attn_k, b.encoder, b.global_stack
    cross = 2 * P * h * k * h + _cross_flops(h, e.heads, e.kv_heads, e.head_dim, P * k, s)  # with its projection
    encoder = _layers(e, s, _local_keys(s, spec.sliding_window, convention)) + cross
    latent = _layers(g, P, effective_keys(P, convention)) + (2 * P * k * h * g.width if b.global_projection else 0)
    crosses = spec.num_layers if b.decoder_cross_every_layer else 1
    decoder = 2 * P * g.width * k * h + crosses * _cross_flops(h, spec.num_heads, spec.kv_heads, spec.head_size, s,
                                                                P * k)  # fmt: skip
    p, overwritten = b.patcher, (b.encoder_crosses - 1) * cross
    patcher = 0.0 if p is None or not b.entropy_patching else _layers(p, s, _local_keys(s, p.window, convention)) + \
        2 * s * p.width * p.vocab_size  # fmt: skip
    return (encoder + latent + decoder) / s, (patcher + overwritten) / s


def byte_latent_terms(spec: ModelSpec, trained: float, forward_only: float, seq_len: int) -> tuple[Term, ...]:
    """The detailed count's rows for BLT's encoder, global transformer and cross-attention, and what it runs forward
    alone: its entropy model and the encoder's overwritten cross-attentions."""
    b = spec.byte_latent
    if b is None:
        return ()
    P, g = patches(seq_len), b.global_stack
    rows = [Term(
        "byte_latent", "Encoder, global transformer, cross-attention (fwd, per byte)", trained, "FLOPs",
        "(L_e layers over s + patch projection and cross-attention, P·k queries over s bytes + L_g layers over P "
        "+ decoder's patch projection + C_d·cross-attention, s queries over P·k keys) / s",
        f"s = {seq_len} bytes, P = {P} patches, k = {b.cross_attn_k}, L_e = {b.encoder.layers}, L_g = {g.layers} of "
        f"{g.width}", "Pagnoni et al. 2024 (BLT); transformers' BltModel",
        note=f"{group(round(trained * seq_len))} FLOPs a sequence; P = s + 1, every byte its own patch, as "
        "transformers cuts them without a trained entropy model (a trained one's longer patches leave fewer, and the "
        "global transformer less to compute); a cross-attention scores every query against every key, as its kernel "
        "does",
    )]  # fmt: skip
    if forward_only:
        p, overwritten = b.patcher, b.encoder_crosses - 1
        parts = ([f"the entropy model ({p.layers} layers of {p.width}, head {p.width} × {p.vocab_size})"]
                 if p is not None and b.entropy_patching else [])  # fmt: skip
        parts += [f"the encoder's first {overwritten} cross-attentions, whose patches the next overwrites"] * bool(
            overwritten
        )
        rows.append(Term(
            "byte_forward_only", "Entropy model, overwritten cross-attention (fwd only, per byte)", forward_only,
            "FLOPs", "(L_p layers over s + 2·s·h_p·V_p + (C_e − 1)·encoder cross-attention) / s", "; ".join(parts),
            note="run without gradients (the entropy model is frozen; nothing reads the overwritten patches): counted "
            "once in training",
        ))  # fmt: skip
    return tuple(rows)


def byte_cache_layers(spec: ModelSpec) -> int:
    """The layers that cache K and V in BLT: the local encoder's and decoder's (transformers' EncoderDecoderCache
    holds them, each DynamicLayer every byte, past the window); the global transformer and the cross-attention cache
    nothing, run again over the patches at each step."""
    return spec.byte_latent.encoder.layers + spec.num_layers if spec.byte_latent else 0


def byte_cache_elements(spec: ModelSpec) -> float:
    """K and V elements a byte leaves in a BLT's cache layer, averaged over them: (L_e·2·H_kv,e·d_e +
    L_d·2·H_kv·d)/(L_e + L_d)."""
    b = spec.byte_latent
    if b is None:
        return 0.0
    e = b.encoder
    cached = e.layers * 2 * e.kv_heads * e.head_dim + spec.num_layers * 2 * spec.kv_heads * spec.head_size
    return cached / byte_cache_layers(spec)
