"""The Byte Latent Transformer (Pagnoni et al. 2024, BLT; transformers' BltForCausalLM): a model over bytes whose
``ModelSpec`` layers are its local decoder's, beside what ``ByteLatentSpec`` holds: the hashed n-gram embeddings, the
local encoder, the global transformer over patches, the cross-attention between bytes and patches each way, and the
entropy model that cuts the bytes into patches. ``specs.ModelSpec`` holds it; the rest of lmcalc takes it from
``specs``.

The annotations are types, not text (no ``from __future__ import annotations``), for the reason ``specs`` gives."""

from pydantic import Field

from lmcalc.spec_base import Dimension, LayerIndex, Spec, StrictBool


class ByteStackSpec(Spec):
    """One of BLT's Llama-like stacks (BltTransformerLayer): each layer an RMSNorm, attention of ``heads`` query and
    ``kv_heads`` key-value heads of ``width // heads`` (no biases), an RMSNorm and a SwiGLU MLP of ``ffn_size``."""

    width: Dimension = Field(description="the stack's width (hidden_size)")
    layers: LayerIndex = Field(description="its layers (num_hidden_layers)")
    heads: Dimension = Field(description="its query heads (num_attention_heads)")
    kv_heads: Dimension = Field(description="its key-value heads (num_key_value_heads)")
    ffn_size: Dimension = Field(description="its MLP's width (intermediate_size)")

    @property
    def head_dim(self) -> int:
        """d = width // heads, as BltSelfAttention sizes a head whatever head_dim says."""
        return self.width // self.heads

    @property
    def layer_params(self) -> int:
        """One layer's weights: q and o (h·H·d each), k and v (h·H_kv·d each), the MLP (3·h·f), two norms (2·h)."""
        h, d = self.width, self.head_dim
        return 2 * h * self.heads * d + 2 * h * self.kv_heads * d + 3 * h * self.ffn_size + 2 * h


class PatcherSpec(ByteStackSpec):
    """BLT's entropy model (BltPatcher): a small byte-level transformer, its embedding, norm and head of its own,
    frozen (``requires_grad`` false) and run forward in every forward pass to cut the bytes into patches."""

    vocab_size: Dimension = Field(description="its byte vocabulary (patcher_config.vocab_size)")
    window: Dimension | None = Field(None, description="its attention window (sliding_window); None: every byte")


class ByteLatentSpec(Spec):
    """What BLT computes beside its local decoder's layers (the ``ModelSpec``'s): each byte's embedding plus its
    hashed n-gram embeddings (``hash_tables`` tables of ``hash_vocab`` rows, one a byte-group size and hash function);
    the local encoder's layers over the bytes; at each of its cross-attention layers, each patch's maximum over its
    bytes projected to k queries (h → k·h) that attend over the bytes; the global transformer over the P patches
    (their k·h_e-wide states, projected to its width where that differs); the global states projected to k keys a patch
    (h_g → k·h), which the decoder's bytes attend to at each of its cross-attention layers before its layer. Every
    cross-attention normalises its queries and keys (RMSNorms of h) and adds its queries back."""

    cross_attn_k: Dimension = Field(description="k, the queries (encoder) or keys (decoder) a patch makes")
    hash_vocab: Dimension = Field(description="rows of one hash table (encoder_hash_byte_group_vocab)")
    hash_tables: Dimension = Field(description="the hash tables: byte-group sizes × hash functions")
    encoder: ByteStackSpec = Field(description="the local encoder's layers (its width the decoder's)")
    encoder_cross_every_layer: StrictBool = Field(
        False, description="a cross-attention after every encoder layer (cross_attn_all_layers); false: the last alone"
    )
    decoder_cross_every_layer: StrictBool = Field(
        True, description="a cross-attention before every decoder layer (cross_attn_all_layers); false: the first alone"
    )
    global_stack: ByteStackSpec = Field(description="the global transformer over patches (no final norm)")
    entropy_patching: StrictBool = Field(
        True, description="the patcher cuts the patches in the forward (patching_mode entropy); false: built, idle"
    )
    patcher: PatcherSpec | None = Field(
        None, description="the entropy model, run in every forward pass (patch_in_forward); None: not built"
    )

    @property
    def encoder_crosses(self) -> int:
        """The encoder's cross-attention layers: one a layer, or one."""
        return self.encoder.layers if self.encoder_cross_every_layer else 1

    @property
    def global_projection(self) -> bool:
        """Whether the global transformer projects the patches' k·h_e-wide states to its width (BLT 7B's)."""
        return self.cross_attn_k * self.encoder.width != self.global_stack.width
