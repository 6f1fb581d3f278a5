"""Memory of serving a model: the weights, the KV cache, and how many sequences fit on one GPU.

Inference keeps no gradients, no optimizer states and no activations for a backward pass (the lecture:
"we don't do this during inference, we don't have to do all this back prop"). A GPU holds the weights,
the key/value cache of every sequence it is generating, and transient working memory (the forward
pass's activations, logits, kernel workspaces), which the overhead allowance covers.

The KV cache: every attention layer keeps, for each token already seen, what later tokens attend to
(DeepSeek-V2, arXiv:2405.04434, §2.1 and Table 1, per token and layer):

- multi-head, grouped-query and multi-query attention keep K and V for the H_kv key-value heads:
  H_kv·(d_k + d_v) = 2·H_kv·d elements (MHA: H_kv = H; GQA, Ainslie et al. 2023: H_kv < H;
  MQA, Shazeer 2019: H_kv = 1);
- multi-head latent attention (DeepSeek-V2/V3, §2.1.2–2.1.3) keeps the compressed KV latent c^KV
  (d_c = kv_lora_rank) and the decoupled RoPE key k^R that all heads share (d_h^R = qk_rope_head_dim):
  d_c + d_h^R elements. This is what inference engines cache: the K and V up-projections are absorbed
  into the query and output projections, and vLLM stores MLA as one "head" of kv_lora_rank +
  qk_rope_head_dim (``ModelConfig.get_num_kv_heads``: "When using MLA during decode it becomes MQA").

The whole cache is tokens × layers × elements per token and layer × bytes of the KV dtype. Every layer
of the models lmcalc describes has attention, MoE ones included (MoE changes only the feed-forward).
A local layer (sliding window: Mistral 7B, Gemma 2/3, gpt-oss, Cohere2; Llama 4's chunks) never attends
further back than its window w, so it keeps a rolling cache of min(w, s) tokens (transformers' sliding-window
caches, vLLM's hybrid KV-cache manager); a global layer keeps all s. One sequence then keeps
(L_global·s + L_local·min(w, s)) token-layers.

Tensor parallelism over ``tp`` GPUs follows vLLM's ``QKVParallelLinear``: the query heads are split,
and the KV heads are split when H_kv ≥ TP (TP must divide H_kv) or replicated when H_kv < TP (TP must
be a multiple of H_kv), so each GPU caches max(1, H_kv/TP) heads. MLA's latent is shared by all heads,
so every TP rank caches all of it. The weights are taken as evenly split, N·bytes/TP: an approximation,
since norms and routers are replicated on every rank.

The memory of one GPU is W/TP + b·s·c + overhead, with c the cache bytes per token on that GPU, so
it is linear in b·s: the largest batch at context s is ⌊(C − W/TP − overhead) / (s·c)⌋ and the longest
context at batch b is ⌊(C − W/TP − overhead) / (b·c)⌋. Paged caches allocate in blocks (vLLM: 16
tokens), which rounds each sequence up to a block; that rounding is not counted.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from math import ceil

from lmcalc.engine.inference.compressed_cache import CompressedCache, compressed_cache
from lmcalc.engine.model.branch_convs import branch_conv_state
from lmcalc.engine.model.byte_latent import byte_cache_elements, byte_cache_layers
from lmcalc.engine.model.numerics import DTYPE_ALIASES, SERVING_DTYPES, dtype_bytes
from lmcalc.engine.model.params import count_params
from lmcalc.engine.model.prefix import prefix_tokens
from lmcalc.engine.parallel.layout_checks import check_tp_heads
from lmcalc.engine.workload import OVERHEAD_ALLOWANCE_BYTES
from lmcalc.errors import LmcalcError
from lmcalc.specs import ModelSpec
from lmcalc.units import GB

QUANTIZED_WEIGHT_DTYPES = ("int8", "int4")
"""Integer weight formats that carry group-wise scales when ``quant_group_size`` is given."""

QUANT_SCALE_BYTES = 2
"""One fp16 scale per group of weights in group-wise integer quantisation (GPTQ, Frantar et al. 2022, arXiv:2210.17323,
'grouping'; AWQ, Lin et al. 2023, default group size 128). An assumption of lmcalc's, counted only when a
group size is given: zero-points (asymmetric schemes), per-channel and per-tensor scales are not counted."""


def serving_dtype_bytes(name: str, what: str) -> float:
    """Bytes of one weight or cache element stored as ``name``; ``what`` names the setting in errors."""
    key = DTYPE_ALIASES.get(name.lower(), name.lower())
    if key not in SERVING_DTYPES:
        raise LmcalcError(f"unknown {what} '{name}'; accepted: {', '.join(SERVING_DTYPES)} (fp8 = fp8-e4m3)")
    return dtype_bytes(key)


def kv_elements_per_token_per_layer(spec: ModelSpec) -> float:
    """Cache elements one token leaves in one attention layer: H_kv·(d_k + d_v), or d_c + d_rope for MLA, with a
    sparse-attention indexer's key, d_I, in the layers that run one (DeepSeek-V3.2 §2.1: the indexer scores every
    cached key), averaged over the layers; where the global layers have widths of their own (Gemma 4), a global
    layer's 2·H_kv,g·d_g (K = V caches both: K is normed with a weight and rotated, V normed without one)."""
    g = spec.global_attention
    if g is not None:
        return (g.kv_heads or spec.kv_heads) * 2 * g.head_dim
    if spec.byte_latent:  # BLT's local encoder's and decoder's layers, averaged
        return byte_cache_elements(spec)
    if spec.compressed_attention:  # DeepSeek-V4's one key-value head, read as both K and V: cached once
        return spec.head_size
    if spec.mla:  # a global layer's: the indexer runs in none of the local ones (dots.3 Note's)
        global_layers = spec.num_layers - spec.local_layers
        indexer_keys = spec.indexer.head_dim * spec.indexer_layers / max(global_layers, 1) if spec.indexer else 0
        return spec.mla.kv_lora_rank + spec.mla.qk_rope_head_dim + indexer_keys
    return spec.kv_heads * (spec.qk_head_dim + spec.v_head_dim)


def kv_heads_per_gpu(spec: ModelSpec, tp: int, heads: int | None = None) -> int:
    """KV heads cached on each of ``tp`` GPUs: H_kv/TP, or 1 (replicated) when H_kv < TP; MLA's latent is 1. ``heads``:
    a local layer's own (``ModelSpec.local_kv_heads``) instead of H_kv."""
    _check_positive(tp, "tensor-parallel degree (TP)", "GPUs")
    check_tp_heads(spec, tp, replicate_kv=True)
    return 1 if spec.mla else max(1, (heads or spec.kv_heads) // tp)


def local_cache_weight(spec: ModelSpec, tp: int | None = None) -> Fraction:
    """A local layer's cache per token as a share of a global layer's: H_kv,local / H_kv where the local layers have
    KV heads of their own (MiMo-V2-Flash: 2), H_kv·d / (H_kv,g·d_g) where the global ones have widths of their own
    (Gemma 4), (r_kv,local + d_rope,local) / (r_kv + d_rope + d_I) where the local layers have MLA of their own widths
    (dots.3 Note: their latent, whole on every GPU of TP), else 1; with ``tp``, on one GPU of TP (each at least one
    head)."""
    local_mla = spec.mla.local if spec.mla else None
    if local_mla is not None:
        local = local_mla.kv_lora_rank + local_mla.qk_rope_head_dim
        return Fraction(local) / Fraction(kv_elements_per_token_per_layer(spec))
    g = spec.global_attention
    if g is not None:
        global_heads = g.kv_heads or spec.kv_heads
        if tp is None:
            return Fraction(spec.kv_heads * spec.head_size, global_heads * g.head_dim)
        local_gpu, global_gpu = kv_heads_per_gpu(spec, tp), kv_heads_per_gpu(spec, tp, global_heads)
        return Fraction(local_gpu * spec.head_size, global_gpu * g.head_dim)
    if not spec.local_kv_heads:
        return Fraction(1)
    if tp is None:
        return Fraction(spec.local_kv_heads, spec.kv_heads)
    return Fraction(kv_heads_per_gpu(spec, tp, spec.local_kv_heads), kv_heads_per_gpu(spec, tp))


def kv_elements_per_token_per_layer_per_gpu(spec: ModelSpec, tp: int) -> float:
    """What one GPU of ``tp`` caches per token and layer: its KV heads, or the whole MLA latent."""
    heads = kv_heads_per_gpu(spec, tp)
    g = spec.global_attention
    if g is not None:  # a global layer's (Gemma 4): its own KV heads of d_g
        return kv_heads_per_gpu(spec, tp, g.kv_heads or spec.kv_heads) * 2 * g.head_dim
    if spec.mla or spec.compressed_attention:  # the latent, or DeepSeek-V4's one head: whole on every rank
        return kv_elements_per_token_per_layer(spec)
    if spec.byte_latent:  # BLT's encoder layers split as the decoder's
        return kv_elements_per_token_per_layer(spec) * heads / spec.kv_heads
    return heads * (spec.qk_head_dim + spec.v_head_dim)


def weights_bytes(spec: ModelSpec, weights_dtype: str) -> float:
    """Every parameter (all experts of an MoE) at the weight dtype; quantisation scales not included."""
    return count_params(spec).total * serving_dtype_bytes(weights_dtype, "weights dtype")


def quant_scale_bytes(spec: ModelSpec, weights_dtype: str, quant_group_size: int | None) -> float:
    """One fp16 scale per ``quant_group_size`` weights for int8/int4 group-wise quantisation; 0 when not asked."""
    if quant_group_size is None or weights_dtype.lower() not in QUANTIZED_WEIGHT_DTYPES:
        return 0.0
    _check_positive(quant_group_size, "quantisation group size", "weights")
    return ceil(count_params(spec).total / quant_group_size) * QUANT_SCALE_BYTES


def _check_positive(value: int, what: str, unit: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise LmcalcError(f"{what} must be a positive whole number of {unit}, got {value!r}")


@dataclass(frozen=True)
class InferenceMemory:
    """Memory of serving ``batch`` sequences of ``context`` tokens, for the whole model and for one GPU of ``tp``."""

    params: int
    weights: float  # whole model
    quant_scales: float  # whole model; 0 unless a group size was given
    kv_per_token_per_layer: float  # whole model, bytes
    kv_per_token_per_layer_per_gpu: float  # bytes on one GPU of tp
    layers: int
    batch: int
    context: int
    tp: int
    overhead: float
    capacity: float
    local_layers: int = 0  # layers that keep only the last ``window`` tokens
    window: int | None = None
    max_seq_len: int = 0  # the longest context, where a cache of local layers alone stops growing
    state_per_sequence: float = 0.0  # bytes a hybrid's state-space layers keep per sequence, whatever its length
    local_weight: Fraction = Fraction(1)  # a local layer's cache per token over a global one's (local_cache_weight)
    local_weight_per_gpu: Fraction = Fraction(1)  # the same on one GPU of TP
    compressed: CompressedCache | None = None  # DeepSeek-V4's compressed layers' entries and compressor state

    def cached_tokens(self, context: int, per_gpu: bool = False) -> Fraction:
        """Tokens a layer keeps for one sequence of ``context`` tokens, on average over the layers: all of them in
        global layers, the last ``window`` in local ones, each weighed by its cache per token over a global layer's
        (``local_weight``; on one GPU, ``per_gpu``)."""
        if self.window is None:
            return Fraction(context)
        if not self.layers:  # a drafter's layers all read its backbone's cache
            return Fraction(0)
        weight = self.local_weight_per_gpu if per_gpu else self.local_weight
        local = self.local_layers * min(self.window, context) * weight
        return ((self.layers - self.local_layers) * context + local) / self.layers

    @property
    def weights_per_gpu(self) -> float:
        return (self.weights + self.quant_scales) / self.tp

    @property
    def kv_per_token(self) -> float:
        return self.layers * self.kv_per_token_per_layer

    @property
    def kv_per_token_per_gpu(self) -> float:
        return self.layers * self.kv_per_token_per_layer_per_gpu

    def beyond_tokens(self, context: int) -> float:
        """What a sequence keeps beside its tokens' keys and values: a hybrid's state, and DeepSeek-V4's compressed
        entries and compressors' state at ``context`` tokens (whole on every TP rank)."""
        return self.state_per_sequence + (self.compressed.per_sequence(context) if self.compressed else 0.0)

    @property
    def kv_cache(self) -> float:
        """The whole cache of the batch, counted once (no TP replication)."""
        per_sequence = float(self.cached_tokens(self.context)) * self.kv_per_token
        return self.batch * (per_sequence + self.beyond_tokens(self.context))

    @property
    def kv_cache_per_gpu(self) -> float:
        """The batch's cache on one GPU; a hybrid's states whole on every rank (lmcalc does not split them)."""
        per_sequence = float(self.cached_tokens(self.context, True)) * self.kv_per_token_per_gpu
        return self.batch * (per_sequence + self.beyond_tokens(self.context))

    @property
    def total_per_gpu(self) -> float:
        return self.weights_per_gpu + self.kv_cache_per_gpu + self.overhead

    @property
    def cache_budget(self) -> float:
        """What one GPU has left for the cache after the weights and the overhead allowance."""
        return self.capacity - self.weights_per_gpu - self.overhead

    @property
    def keeps_nothing(self) -> bool:
        """Whether a sequence keeps no cache or state on the model's side (a drafter reads its backbone's)."""
        return not self.layers and not self.state_per_sequence and self.compressed is None

    @property
    def max_batch(self) -> int:
        """The most sequences of ``context`` tokens whose cache fits: ⌊budget / (s·c)⌋; 0 where a sequence keeps
        nothing (``keeps_nothing``: no cache of its own bounds the batch)."""
        if self.keeps_nothing:
            return 0
        per_sequence = self.cached_tokens(self.context, True) * Fraction(self.kv_per_token_per_gpu)
        return _whole_fit(self.cache_budget, per_sequence + Fraction(self.beyond_tokens(self.context)))

    @property
    def max_context(self) -> int:
        """The most tokens per sequence at ``batch`` sequences whose cache fits: ⌊budget / (b·c)⌋; with local
        layers, past the window only the global layers' caches grow (``max_seq_len`` when there are none)."""
        budget = Fraction(self.cache_budget) - self.batch * Fraction(self.state_per_sequence)
        if self.compressed:
            return self._max_compressed_context(budget)
        if not self.kv_per_token_per_gpu:  # no layer attends: the states do not grow with the context
            return self.max_seq_len if budget >= 0 else 0
        tokens = max(Fraction(0), budget) / (self.batch * Fraction(self.kv_per_token_per_gpu))
        if self.window is None:
            return int(tokens // 1)
        # T is the layers' average (cached_tokens); a local layer counts its local_weight for each token it keeps
        global_layers, weight = self.layers - self.local_layers, self.local_weight_per_gpu
        if tokens * self.layers < (global_layers + self.local_layers * weight) * self.window:  # within the window
            return int(tokens * self.layers / (global_layers + self.local_layers * weight) // 1)
        if not global_layers:
            return self.max_seq_len
        return int((tokens * self.layers - self.local_layers * weight * self.window) // global_layers)

    def _max_compressed_context(self, budget: Fraction) -> int:
        """DeepSeek-V4's: the longest context up to the trained one whose window and compressed cache, the
        compressors' state at its fullest (``CompressedCache.most``, which never falls as the context grows), fit
        ``budget`` at ``batch`` sequences; found by bisection."""
        compressed = self.compressed
        assert compressed is not None

        def fits(context: int) -> bool:
            window = self.cached_tokens(context, True) * Fraction(self.kv_per_token_per_gpu)
            return self.batch * (window + Fraction(compressed.most(context))) <= budget

        low, high = 0, self.max_seq_len
        if fits(high):
            return high
        while low < high - 1:  # fits(low) or low == 0; not fits(high)
            middle = (low + high) // 2
            low, high = (middle, high) if fits(middle) else (low, middle)
        return low if fits(low) else 0


def _whole_fit(budget: float, bytes_each: float | Fraction) -> int:
    """⌊budget / bytes_each⌋, in exact arithmetic so that a cache filling the GPU to the byte still fits."""
    return int(Fraction(budget) // Fraction(bytes_each))


@dataclass(frozen=True)
class Serving:
    """What is served and how: the model, ``batch`` sequences of ``context`` tokens each, the dtypes of the
    weights and of the KV cache, the tensor-parallel GPUs, and the allowances."""

    model: ModelSpec
    context: int  # tokens per sequence
    batch: int = 1  # sequences served at once
    weights_dtype: str = "bf16"
    kv_dtype: str = "bf16"
    tp: int = 1
    quant_group_size: int | None = None  # one fp16 scale per group of this many int8/int4 weights; None: none
    overhead_bytes: float = OVERHEAD_ALLOWANCE_BYTES


def inference_memory(serving: Serving, capacity_bytes: float) -> InferenceMemory:
    """Weights and KV cache of ``serving``; refuses settings where the weights alone do not fit a GPU."""
    spec, tp, overhead_bytes = serving.model, serving.tp, serving.overhead_bytes
    _check_positive(serving.batch, "batch", "sequences")
    _check_positive(serving.context, "context", "tokens")
    kv_bytes = serving_dtype_bytes(serving.kv_dtype, "KV-cache dtype")
    memory = InferenceMemory(
        params=count_params(spec).total,
        weights=weights_bytes(spec, serving.weights_dtype),
        quant_scales=quant_scale_bytes(spec, serving.weights_dtype, serving.quant_group_size),
        kv_per_token_per_layer=kv_elements_per_token_per_layer(spec) * kv_bytes,
        kv_per_token_per_layer_per_gpu=kv_elements_per_token_per_layer_per_gpu(spec, tp) * kv_bytes,
        layers=cache_layers(spec, local=None),
        batch=serving.batch,
        context=serving.context,
        tp=tp,
        overhead=overhead_bytes,
        capacity=capacity_bytes,
        local_layers=cache_layers(spec, local=True),
        window=spec.sliding_window,
        max_seq_len=spec.max_seq_len,
        state_per_sequence=state_bytes(spec, kv_bytes),
        local_weight=local_cache_weight(spec),
        local_weight_per_gpu=local_cache_weight(spec, tp),
        compressed=compressed_cache(spec, kv_bytes),
    )
    if memory.cache_budget < 0:
        raise LmcalcError(
            f"the weights alone do not fit: {memory.weights_per_gpu / GB:.2f} GB per GPU (TP={tp}) + "
            f"{overhead_bytes / GB:.2f} GB overhead > {capacity_bytes / GB:.2f} GB of GPU memory, "
            f"short by {-memory.cache_budget / GB:.2f} GB; try a larger TP or a smaller weights dtype"
        )
    return memory


def cache_layers(spec: ModelSpec, local: bool | None) -> int:
    """The attention layers that keep a cache (all of them, or the ``local`` ones; None: both kinds): all but those
    that attend with an earlier layer's K and V (Gemma 4's last ``kv_sharing.layers``), which cache nothing; and each
    use of a shared block (Zamba 2's), which caches its own K and V; of a looped model's runs, those that keep a
    cache (each, or each held layer's last: ``LayerReuseSpec.cached_runs``)."""
    if spec.byte_latent:  # BLT's encoder and decoder layers, each keeping every byte whatever its window
        return 0 if local else byte_cache_layers(spec)
    first_shared = spec.num_layers - (spec.kv_sharing.layers if spec.kv_sharing else 0)
    uses = spec.shared_block.uses if spec.shared_block and local is not True else 0
    cached = spec.layer_reuse.cached_runs if spec.layer_reuse else range(first_shared)
    return uses + sum(
        spec.is_attention_layer(i) and (local is None or spec.is_local_layer(i) == local)
        for i in range(first_shared)
        if i in cached
    )


def state_bytes(spec: ModelSpec, kv_bytes: float) -> float:
    """Bytes a hybrid keeps per sequence in place of a KV cache in its layers that do not attend: Mamba's states at
    the cache's bytes (``ssm_state_elements``); Gated DeltaNet's convolution state (its last K inputs of q‖k‖v) at the
    cache's bytes and its recurrent state (H_v · d_k · d_v) in fp32, as transformers' Qwen3-Next cache and fla keep
    it; LFM2's short convolutions their last K inputs, as its cache keeps them; lightning attention its H × d × d
    state (K·V summed with decay) at the cache's bytes, as MiniMax's cache keeps it; RWKV-4 its five h-wide states a
    layer, the two token shifts at the cache's bytes and WKV's three in fp32, as RwkvModel keeps them; Griffin's
    recurrent blocks their convolution's last K − 1 inputs and the RG-LRU's state in fp32, as RecurrentGemma's
    blocks keep them; xLSTM's mLSTM a head's matrix memory (d_k × d_v), normaliser (d_k) and max at the cache's bytes,
    as xLSTMCache keeps them; CPM-Ant's prompt and GIT's images, the K and V of their P tokens in every layer;
    ZAYA's CCA its convolutions' last inputs and the delayed value a layer, beside its K and V; Inkling's its four
    convolutions' last K inputs a layer, in fp32."""
    layers = spec.other_mixer_layers
    if spec.prompt or spec.image_prefix:  # CPM-Ant's prompt, GIT's images: P tokens every layer caches first
        return prefix_tokens(spec) * cache_layers(spec, None) * kv_elements_per_token_per_layer(spec) * kv_bytes
    if spec.branch_convs:  # Inkling's four convolutions a layer, their last K inputs in fp32
        return branch_conv_state(spec)
    if spec.cca:  # ZAYA's: the convolutions' last t0 + t1 − 2 inputs of q‖k, and the last token's delayed value
        c, channels = spec.cca, (spec.num_heads + spec.kv_heads) * spec.head_size
        per_layer = channels * (c.depthwise + c.grouped - 2) + spec.kv_heads * spec.head_size // 2
        return spec.attention_layers * per_layer * kv_bytes
    x = spec.mlstm
    if x:  # each head's matrix memory C, its normaliser n and its max m (xLSTMCache, at the model's dtype)
        return layers * x.heads * (x.key_head_dim * x.value_head_dim + x.key_head_dim + 1) * kv_bytes
    if spec.rwkv:  # both mixes' token-shift inputs at the cache's bytes; WKV's numerator, denominator, max in fp32
        return layers * spec.hidden_size * (2 * kv_bytes + 3 * 4)
    if spec.rglru:  # the convolution's last K − 1 inputs (w wide after a prompt), the RG-LRU's state in fp32
        return layers * spec.rglru.width * ((spec.rglru.conv_kernel - 1) * kv_bytes + 4)
    if spec.short_conv:  # the convolution's last K inputs of B·x (LFM2's cache)
        return layers * spec.hidden_size * spec.short_conv.conv_kernel * kv_bytes
    if spec.lightning:  # the running state, H × d × d (MiniMaxCache's linear cache)
        return layers * spec.lightning.heads * spec.lightning.head_dim**2 * kv_bytes
    if spec.mamba2:  # the convolution's last K inputs of x‖B‖C, and the H × P × N state in fp32 (Bamba's cache)
        m = spec.mamba2
        return layers * (m.conv_channels * m.conv_kernel * kv_bytes + m.heads * m.head_dim * m.state * 4)
    g = spec.deltanet
    if g is None:
        return ssm_state_elements(spec) * kv_bytes
    return layers * (g.conv_channels * g.conv_kernel * kv_bytes + g.value_heads * g.key_head_dim * g.value_head_dim * 4)


def ssm_state_elements(spec: ModelSpec) -> int:
    """What a hybrid's state-space layers keep per sequence in place of a KV cache, whatever its length (Gu & Dao
    2023 §3.3; transformers' Jamba cache): the convolution's last d_conv inputs and the d_in × N state, per layer."""
    m = spec.mamba
    return 0 if m is None else spec.other_mixer_layers * m.d_inner * (m.d_conv + m.d_state)
