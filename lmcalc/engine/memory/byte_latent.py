"""What the Byte Latent Transformer's training step keeps for backward beyond its local decoder's layers (Pagnoni et al.
2024, *Byte Latent Transformer: Patches Scale Better Than Tokens*; transformers 5.24's BltForCausalLM), on s bytes cut
into P = s + 1 patches (``engine.model.byte_latent.patches``): the hashed n-gram embeddings' indices; the local
encoder's layers over the bytes (Llama-like layers at its widths, ``encoder_workload``); the patches made of them
(``patch_reduce``: a scatter_reduce taking each patch's maximum over its bytes), projected to k queries a patch that
attend over the bytes in the encoder's last cross-attention; the global transformer's layers over the P patches
(``global_workload``); the decoder's projection of the patches to k keys a patch, and before each decoder layer a
cross-attention of the bytes over them. Every cross-attention (BltCrossAttention) normalises its queries and its keys
with RMSNorms of h and runs transformers' eager attention (or SDPA) under a dense additive mask that keeps each
byte's own patch. The decoder's layers, its final norm, the head and the loss are lmcalc's layers' and
``engine.memory.outside_layers``'.

The entropy model (BltPatcher) runs in the forward with its parameters frozen (``requires_grad_(False)``), on token
ids that need no gradient: autograd records nothing of it, and it keeps nothing. Neither does an encoder
cross-attention that a later one overwrites (``encoder_cross_every_layer``): no gradient reaches it, and its graph
is freed when the next patches replace it. Under gradient checkpointing (transformers' GradientCheckpointingLayer) the
encoder's, the global transformer's and the decoder's layers keep their input alone; the cross-attentions, the patch
reduction and the projections are no such layers and keep what they keep unchecked."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import replace

from lmcalc.engine.memory.activations import layer_kept_tensors, layer_saved_tensors, lowest_layer_unkept
from lmcalc.engine.memory.adapters import adapter_bytes, adapter_copies
from lmcalc.engine.memory.norms import norm_saved
from lmcalc.engine.memory.saved import LOGSUMEXP_BYTES, SavedTensor
from lmcalc.engine.model.byte_latent import patches
from lmcalc.engine.model.tensors import Dim
from lmcalc.engine.workload import Workload
from lmcalc.specs import ByteStackSpec, ModelSpec

TOKEN_ID_BYTES = 8  # int64 indices (the hash embeddings' and the scatter's)


def _stack_model(spec: ModelSpec, stack: ByteStackSpec, layers: int, window: int | None) -> ModelSpec:
    """A Llama-like model of one of BLT's stacks: its widths and layers, no byte latent parts, ``window`` its keys'."""
    fields = spec.model_dump(exclude={"byte_latent", "head_vocab", "display_name"})
    return ModelSpec.model_validate(fields | {
        "hidden_size": stack.width, "num_heads": stack.heads, "num_kv_heads": stack.kv_heads,
        "head_dim": stack.head_dim, "ffn_size": stack.ffn_size, "num_layers": layers, "sliding_window": window,
    })  # fmt: skip


@functools.lru_cache(maxsize=256)
def encoder_workload(w: Workload) -> Workload:
    """The workload of BLT's local encoder layers: over the s bytes within the bytes' window, at the encoder's widths
    (BltLocalEncoder's layers are BltTransformerLayers, as the decoder's); ``w`` itself for any other model."""
    b = w.model.byte_latent
    if b is None:
        return w
    return replace(w, model=_stack_model(w.model, b.encoder, b.encoder.layers, w.model.sliding_window))


@functools.lru_cache(maxsize=256)
def global_workload(w: Workload) -> Workload:
    """The workload of BLT's global transformer: its layers over the P patches, causal over all of them, at its
    widths."""
    b = w.model.byte_latent
    assert b is not None
    return replace(w, model=_stack_model(w.model, b.global_stack, b.global_stack.layers, None),
                   seq_len=patches(w.seq_len))  # fmt: skip


def _repeated(tensors: tuple[SavedTensor, ...] | list[SavedTensor], n: int, name: str, symbol: str
              ) -> list[SavedTensor]:  # fmt: skip
    return [replace(t, label=f"{name} {t.label}, {n} layers", symbol=f"{symbol}·{t.symbol}", elements=n * t.elements,
                    split="none", block="embedding") for t in tensors]  # fmt: skip


def stack_checkpoint(w: Workload) -> SavedTensor:
    """What a checkpointed layer of one of BLT's stacks keeps: its input (BltTransformerLayer is transformers'
    GradientCheckpointingLayer), over the stack's rows at its width."""
    return SavedTensor("layer input", "s·b·h", w.tokens * w.model.hidden_size, w.precision.activation_bytes,
                       split="seq")  # fmt: skip


def _stack_layers(w: Workload, stack: str) -> list[SavedTensor]:
    """The encoder's or the global transformer's layers, each as lmcalc's layer of its widths keeps it (under
    selective recomputation, less what it drops), or under full recomputation the input each checkpointed layer
    keeps."""
    b = w.model.byte_latent
    assert b is not None
    sw, n, symbol = ((encoder_workload(w), b.encoder.layers, "L_e") if stack == "encoder"
                     else (global_workload(w), b.global_stack.layers, "L_g"))  # fmt: skip
    layer = (stack_checkpoint(sw),) if w.recompute == "full" else layer_kept_tensors(sw, False)
    return _repeated(layer, n, stack, symbol)


def _adapter(w: Workload, label: str, rows: float, symbol: str, inputs: float) -> list[SavedTensor]:
    """What one LoRA adapter outside the layers keeps (``method_kept.under_method``'s rule): A·x for B, and where
    it keeps a copy of its input, that copy."""
    kept = [SavedTensor(f"{label} adapter: A·x (B's input)", f"{symbol}·r", rows * w.method.lora_rank,
                        adapter_bytes(w), split="none")]  # fmt: skip
    if adapter_copies(w):
        kept.append(SavedTensor(f"{label} adapter: its input copy", f"{symbol}·{inputs}", rows * inputs,
                                adapter_bytes(w), split="none"))  # fmt: skip
    return kept


def _cross_attention(w: Workload, name: str, queries: Dim, keys: Dim, stack: ByteStackSpec | ModelSpec,
                     kept_elsewhere: tuple[str, ...] = ()) -> list[SavedTensor]:  # fmt: skip
    """One BltCrossAttention over ``queries`` rows of h and ``keys`` rows: its query and key RMSNorms (what lmcalc's
    norms keep; a frozen weight's normalised value none), the projections' inputs (their outputs: q_proj's reads the
    query norm's, k_proj's and v_proj's the key norm's), Q, K and V (eager attention expands K and V to the H heads,
    repeat_kv), the fp32 softmax and its cast, the output projection's input; with SDPA's fused kernel its output
    (the output projection's input) and log-sum-exp instead of the scores, and the mask (``cross_masks``). The
    queries are added back after o_proj, which keeps nothing. In fp32 a norm's fp32 copy is its input
    (``x.float()`` is ``x``) and the softmax's cast its output: a norm whose input is counted elsewhere
    (``kept_elsewhere``: "query norm", "key norm") adds no copy, and the cast adds nothing."""
    act, full = w.precision.activation_bytes, w.method.kind == "full"
    h = Dim(w.model.hidden_size, "h")
    if isinstance(stack, ModelSpec):
        H, kv, d = stack.num_heads, stack.kv_heads, stack.head_size
    else:
        H, kv, d = stack.heads, stack.kv_heads, stack.head_dim
    eager = w.attention == "eager"
    kv_heads = H if eager else kv
    q, k = queries.size, keys.size

    def kept(label: str, symbol: str, elements: float, bytes_per_element: float) -> SavedTensor:
        return SavedTensor(f"{name} {label}", symbol, elements, bytes_per_element, split="none")

    tensors, fp32 = [], act == 4
    for norm, rows in (("query norm", queries), ("key norm", keys)):
        shared = fp32 and norm in kept_elsewhere
        tensors += [
            replace(t, label=f"{name} {t.label}", split="none")
            for t in norm_saved(w, norm, rows, h)
            if (full or not t.for_weights) and not (shared and t.label.endswith("input (fp32 copy)"))
        ]
    tensors += [
        kept("q_proj input (query norm output)", f"{queries.symbol}·h", q * h.size, act),
        kept("k_proj and v_proj input (key norm output)", f"{keys.symbol}·h", k * h.size, act),
        kept("Q", f"{queries.symbol}·H·d", q * H * d, act),
        kept("K and V", f"2·{keys.symbol}·H{'' if eager else '_kv'}·d", 2 * k * kv_heads * d, act),
    ]
    b = w.micro_batch
    scores = b * H * (q / b) * (k / b)
    if eager:  # eager_attention_forward: the softmax in fp32, its cast read by the product with V
        tensors.append(kept("softmax output (fp32)", f"b·H·{queries.symbol}·{keys.symbol}/b²", scores, 4))
        if not fp32:
            tensors.append(kept("softmax output, cast", f"b·H·{queries.symbol}·{keys.symbol}/b²", scores, act))
        tensors.append(kept("o_proj input", f"{queries.symbol}·H·d", q * H * d, act))
    else:  # a fused kernel: its output, laid out (b, q, H, d), which o_proj reads, and log-sum-exp
        tensors += [kept("attention output = o_proj input", f"{queries.symbol}·H·d", q * H * d, act),
                    kept("log-sum-exp (fp32)", f"b·H·{queries.symbol}/b", H * q, LOGSUMEXP_BYTES)]  # fmt: skip
    if w.method.adapters:
        tensors += _adapter(w, f"{name} q_proj", q, queries.symbol, h.size)
        tensors += _adapter(w, f"{name} k_proj", k, keys.symbol, h.size)
        tensors += _adapter(w, f"{name} v_proj", k, keys.symbol, h.size)
        tensors += _adapter(w, f"{name} o_proj", q, queries.symbol, H * d)
    return tensors


def cross_masks(w: Workload) -> list[SavedTensor]:
    """The cross-attentions' additive masks (``_prepare_patch_cross_attention_mask``: b·q·kv in the activation
    dtype), which a fused kernel keeps for its backward (SDPA's with an explicit mask; eager attention adds it, which
    keeps nothing): the encoder's, P·k patch queries over the s bytes, and the decoder's, the s bytes over P·k patch
    keys, made once and read by every decoder cross-attention."""
    b = w.model.byte_latent
    if w.attention == "eager" or b is None:
        return []
    n = w.tokens * patches(w.seq_len) * b.cross_attn_k
    act = w.precision.activation_bytes
    return [SavedTensor(f"{which} cross-attention mask (kept by the kernel)", "b·s·P·k", n, act, split="none")
            for which in ("encoder", "decoder")]  # fmt: skip


def byte_latent_saved(w: Workload) -> list[SavedTensor]:
    """What BLT keeps for backward beyond its decoder's layers, the byte embedding's indices, the final norm and the
    head (``engine.memory.outside_layers``): the hash embeddings' indices (trained tables alone); the encoder's layers;
    the patch reduction (scatter_reduce keeps its zeros, its index, the encoder's output and its result, the
    encoder's patch projection's input); the encoder's last cross-attention, P·k patch queries over the s bytes; the
    global transformer's projection input where it has one, its layers over P patches, the decoder's patch
    projection's input (the global transformer's output); and each decoder cross-attention, the s bytes over P·k
    patch keys. Under LoRA, PEFT's adapters on each of the projections keep A·x too."""
    b = w.model.byte_latent
    if b is None:
        return []
    act, full = w.precision.activation_bytes, w.method.kind == "full"
    s, bb, h, k, g = w.seq_len, w.micro_batch, w.model.hidden_size, b.cross_attn_k, b.global_stack
    P = patches(s)
    bytes_, patch_rows = Dim(s * bb, "s·b"), Dim(P * bb, "P·b")
    queries = Dim(P * k * bb, "P·k·b")
    tensors = []
    if full:  # nn.Embedding keeps its indices for its weight's gradient: a frozen table keeps none
        tensors.append(SavedTensor("hash embeddings' indices (int64)", "n_hash·s·b", b.hash_tables * s * bb,
                                   TOKEN_ID_BYTES, split="none"))  # fmt: skip
    tensors += _stack_layers(w, "encoder")
    tensors += [
        SavedTensor("patch reduction: zeros it scatters into", "P·b·h", P * bb * h, act, split="none"),
        SavedTensor("patch reduction: byte-to-patch index (int64)", "s·b", s * bb, TOKEN_ID_BYTES, split="none"),
        SavedTensor("patch reduction: the encoder's output", "s·b·h", s * bb * h, act, split="none"),
        SavedTensor("patch reduction: its result (the encoder's patch projection input)", "P·b·h", P * bb * h, act,
                    split="none"),
    ]  # fmt: skip
    if w.method.adapters:
        tensors += _adapter(w, "encoder patch projection", P * bb, "P·b", h)
    # its keys' norm reads the encoder's output, which the patch reduction keeps
    tensors += _cross_attention(w, "encoder cross-attention", queries, bytes_, b.encoder, ("key norm",))
    if b.global_projection:
        tensors.append(SavedTensor("global projection input (the patches' k·h)", "P·b·k·h", P * bb * k * h, act,
                                   split="none"))  # fmt: skip
        if w.method.adapters:
            tensors += _adapter(w, "global projection", P * bb, "P·b", k * h)
    tensors += _stack_layers(w, "global")
    tensors.append(SavedTensor("decoder patch projection input (the global output)", "P·b·h_g",
                               patch_rows.size * g.width, act, split="none"))  # fmt: skip
    if w.method.adapters:
        tensors += _adapter(w, "decoder patch projection", P * bb, "P·b", g.width)
    # the first's queries are the encoder's output, which the patch reduction keeps; every one's keys' norm reads
    # the same patch keys, which fp32 keeps once
    crosses = w.model.num_layers if b.decoder_cross_every_layer else 1
    tensors += _cross_attention(w, "decoder cross-attention, the first", bytes_, queries, w.model,
                                ("query norm", "key norm"))  # fmt: skip
    if crosses > 1:
        one = _cross_attention(w, "decoder cross-attention", bytes_, queries, w.model, ("key norm",))
        tensors += [replace(t, label=f"{t.label}, {crosses - 1} more layers", symbol=f"(C_d−1)·{t.symbol}",
                            elements=(crosses - 1) * t.elements) for t in one]  # fmt: skip
    tensors += cross_masks(w)
    if act == 4:
        tensors.append(SavedTensor("decoder cross-attention key norm input (the patch keys every key norm reads)",
                                   "P·k·b·h", queries.size * h, act, split="none"))  # fmt: skip
    return tensors


def byte_latent_tables(w: Workload) -> list[SavedTensor]:
    """The rotary tables BLT's encoder and global transformer make beside the decoder's (each stack its own
    BltRotaryEmbedding): cos and sin over the s bytes at the encoder's head size, over the P patches at the global
    transformer's."""
    b = w.model.byte_latent
    if b is None:
        return []
    act, s, P = w.precision.activation_bytes, w.seq_len, patches(w.seq_len)
    return [SavedTensor(f"{stack} rotary {t} table", symbol, rows * d, act, split="none")
            for stack, symbol, rows, d in (("encoder", "s·d_e", s, b.encoder.head_dim),
                                           ("global", "P·d_g", P, b.global_stack.head_dim))
            for t in ("cos", "sin")]  # fmt: skip


def byte_latent_checkpoint_masks(w: Workload) -> list[SavedTensor]:
    """Under gradient checkpointing, the global transformer's additive causal mask over the P patches, which its
    checkpointed layers' closures keep (eager attention; the encoder's layers share the decoder's mask)."""
    if w.model.byte_latent is None or w.attention != "eager":
        return []
    P = patches(w.seq_len)
    return [SavedTensor("global eager attention mask (kept for the rebuilt layers)", "b·P²", w.micro_batch * P * P,
                        w.precision.activation_bytes, split="none")]  # fmt: skip


def rebuilt_stack_layers(w: Workload, on_gpu: Callable[[SavedTensor], float], keeps_input: bool,
                         freed: bool = True) -> tuple[float, float]:  # fmt: skip
    """An encoder layer and a global transformer layer as the backward rebuilds them under full recomputation, each
    tensor's bytes on one GPU as ``on_gpu`` says, in the terms of a rebuilt decoder layer: where the rebuilt layer
    keeps its checkpointed input again (``keeps_input``), the caller takes the decoder layer's input off, so each
    stack's own input is taken off here and the decoder's put back. With ``freed``, less what the backward has freed
    before it rebuilds them: the decoder's side (its layers' inputs, its cross-attentions, its patch projection's
    input) before a global layer, and all but the encoder's layers and the hash indices before an encoder layer, so
    that the largest figure is the most a rebuilt layer adds to what is then held
    (``gpu_memory.largest_layer_bytes``)."""
    decoder = on_gpu(stack_checkpoint(w)) if keeps_input else 0.0
    saved = byte_latent_saved(w)
    decoder_own = sum(on_gpu(t) for t in saved if t.label.startswith("decoder"))
    encoder_own = sum(
        on_gpu(t)
        for t in saved
        if t.label.startswith("hash")
        or (t.label.startswith("encoder") and not t.label.startswith(("encoder cross-attention", "encoder patch")))
    )
    decoder_side = w.model.num_layers * on_gpu(stack_checkpoint(w)) + decoder_own
    before = (sum(on_gpu(t) for t in saved) - decoder_own + decoder_side - encoder_own, decoder_side)
    rebuilt = []
    for sw, gone in zip((encoder_workload(w), global_workload(w)), before, strict=True):
        layer = sum(on_gpu(t) for t in layer_kept_tensors(sw, False))
        own = on_gpu(stack_checkpoint(sw)) if keeps_input else 0.0
        rebuilt.append(layer - own + decoder - (gone if freed else 0.0))
    return rebuilt[0], rebuilt[1]


def forward_frame(w: Workload) -> float:
    """What BltModel's forward holds at its end without keeping it for backward, where the layers are not
    checkpointed: the peak of a step whose loss is small beside its layers. Its locals, alive until it returns: the
    hashed embeddings' sum (the encoder's input, s·b·h), the entropy model's logits (s·b·V_p, bound to ``_``), the
    bytes' causal mask and the global transformer's (eager attention's b·s² and b·P²), the two cross-attention masks
    (b·s·P·k each; a fused kernel keeps them, ``cross_masks``), the patches' k query states (the global input,
    P·k·b·h); the decoder's own, its patch keys (P·k·b·h; kept in fp32) and its last cross-attention's output (s·b·h);
    and the final norm as it ends (transformers' RMSNorm): its input, its fp32 copy and product with 1/rms, the cast
    and the weight's product, which the head reads. Read from the storages live at the step's peak with
    scripts/hf_step_peak.py on the CPU (blt-small: the forward's end binds)."""
    b = w.model.byte_latent
    assert b is not None
    act, sb, s, bb, h = w.precision.activation_bytes, w.tokens, w.seq_len, w.micro_batch, w.model.hidden_size
    P = patches(s)
    frame = sb * h * act + P * b.cross_attn_k * bb * h * act * (1 if act == 4 else 2) + sb * h * act
    if b.patcher is not None and b.entropy_patching:
        frame += sb * b.patcher.vocab_size * act + patcher_graph(w)
    if w.attention == "eager":
        frame += bb * (s * s + P * P) * act + sum(t.bytes for t in cross_masks(replace(w, attention="flash")))
    final_norm = sb * h * (act + 4 + 4 + act + act) + sb * 4
    return frame + final_norm


def patcher_graph(w: Workload) -> float:
    """Under LoRA, what the entropy model's graph holds through the forward: PEFT's all-linear adapts its linear
    layers too, whose adapters need gradients, so its forward records what its layers keep (lmcalc's layer of its
    widths over the s bytes, the lowest keeping nothing before its adapters), its rotary tables and its final norm's
    fp32 copy and 1/rms; no gradient reaches them, but the logits it returns, bound to ``_`` in BltModel's forward,
    hold them until that returns. Nothing without adapters (its weights are frozen)."""
    p = w.model.byte_latent.patcher if w.model.byte_latent else None
    if p is None or not w.method.adapters:
        return 0.0
    pw = replace(w, model=_stack_model(w.model, p, p.layers, p.window))
    layers = p.layers * sum(t.bytes for t in layer_saved_tensors(pw, False))
    layers -= sum(t.bytes for t in lowest_layer_unkept(pw))
    act, sb = w.precision.activation_bytes, w.tokens
    tables = 2 * w.seq_len * p.head_dim * act
    return layers + tables + sb * p.width * 4 + sb * 4
