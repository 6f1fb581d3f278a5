"""The terms and sections of ``lmcalc memory --inference``: the weights, the KV cache (and a hybrid's state), and
what one GPU holds, each with its formula and numbers (``engine.inference.serving`` computes them)."""

from __future__ import annotations

from lmcalc.engine.inference.serving import (
    QUANT_SCALE_BYTES,
    InferenceMemory,
    Serving,
    kv_heads_per_gpu,
    serving_dtype_bytes,
)
from lmcalc.engine.inference.state_terms import state_terms
from lmcalc.engine.memory.terms import Capacity, capacity_terms, overhead_term
from lmcalc.result import Section, Term
from lmcalc.specs import ModelSpec
from lmcalc.units import group

KV_CACHE_SOURCE = "DeepSeek-V2 (arXiv:2405.04434) §2.1, Table 1: KV cache per token"
TP_SOURCE = "vLLM QKVParallelLinear / ModelConfig.get_num_kv_heads: KV heads split, or replicated when H_kv < TP"


def _weights_section(spec: ModelSpec, memory: InferenceMemory, weights_dtype: str) -> Section:
    n, tp = memory.params, memory.tp
    per_param = serving_dtype_bytes(weights_dtype, "weights dtype")
    terms = [
        Term(
            "params",
            "Parameters held",
            n,
            "params",
            "every tensor" + (", all routed experts" if spec.moe else ""),
            group(n),
            "lmcalc.engine.model.params.count_params",
            note=f"each token uses {spec.moe.computed_k:g} of {spec.moe.num_experts} routed experts, "
            "but all of them are held in memory"
            if spec.moe
            else "",
        ),
        Term(
            "weights",
            f"Weights ({weights_dtype})",
            memory.weights,
            "bytes",
            "N · bytes per weight",
            f"{group(n)} × {per_param:g} B",
            note="every parameter at this dtype; quantised checkpoints often keep the embedding, head and norms "
            "in 16-bit (not modelled); "
            + (
                "group scales counted below, zero-points not counted"
                if memory.quant_scales
                else "quantisation scales and zero-points not counted"
            ),
        ),
    ]
    if memory.quant_scales:
        groups = memory.quant_scales / QUANT_SCALE_BYTES
        terms.append(
            Term(
                "quant_scales",
                "Quantisation scales (fp16 per group)",
                memory.quant_scales,
                "bytes",
                f"⌈N / group⌉ · {QUANT_SCALE_BYTES} B",
                f"{group(groups)} groups × {QUANT_SCALE_BYTES} B",
                "assumption: one fp16 scale per group, as GPTQ/AWQ group-wise quantisation; zero-points not counted",
            )
        )
    scales = " + scales" if memory.quant_scales else ""
    terms.append(
        Term(
            "weights_per_gpu",
            "Weights per GPU",
            memory.weights_per_gpu,
            "bytes",
            f"(weights{scales}) / TP",
            f"{group(memory.weights + memory.quant_scales)} B / {tp}",
            note="approximate: norms and routers are replicated on every TP rank" if tp > 1 else "",
        )
    )
    return Section("weights", "Weights", tuple(terms))


def _per_layer_formula(spec: ModelSpec, kv_bytes: float, heads: int) -> tuple[str, str]:
    """``2·H_kv·d·bytes`` with its numbers, or MLA's ``(d_c + d_rope)·bytes``."""
    if spec.mla and spec.indexer:  # the indexer's key too, in the layers that run one (L_I of the global layers)
        m, ix, share = spec.mla, spec.indexer, f"{spec.indexer_layers}/{spec.num_layers - spec.local_layers}"
        return (  # a global layer's where the local layers have none (dots.3 Note's): L_I of the global layers
            f"(d_c + d_rope + d_I · L_I/{'L_global' if spec.local_layers else 'L'}) · bytes",
            f"({m.kv_lora_rank} + {m.qk_rope_head_dim} + {ix.head_dim} × {share}) × {kv_bytes:g} B",
        )
    b = spec.byte_latent
    if b is not None:  # BLT: the local encoder's layers and the decoder's, averaged
        e, L = b.encoder, spec.num_layers
        return ("(L_e · 2·H_kv,e·d_e + L_d · 2·H_kv·d)/(L_e + L_d) · bytes",
                f"({e.layers} × 2×{e.kv_heads}×{e.head_dim} + {L} × 2×{spec.kv_heads}×{spec.head_size})/"
                f"{e.layers + L} × {kv_bytes:g} B")  # fmt: skip
    if spec.mla:
        m = spec.mla
        return "(d_c + d_rope) · bytes", f"({m.kv_lora_rank} + {m.qk_rope_head_dim}) × {kv_bytes:g} B"
    if spec.compressed_attention:  # DeepSeek-V4: one key-value head, read as both K and V
        return "d · bytes", f"{spec.head_size} × {kv_bytes:g} B"
    if spec.global_attention:  # a global layer's, at its own widths (Gemma 4): ``heads`` its KV heads
        return "2 · H_kv,g · d_g · bytes", f"2 × {heads} × {spec.global_attention.head_dim} × {kv_bytes:g} B"
    if spec.qk_head_dim == spec.v_head_dim:
        return "2 · H_kv · d · bytes", f"2 × {heads} × {spec.head_size} × {kv_bytes:g} B"
    return "H_kv · (d_k + d_v) · bytes", f"{heads} × ({spec.qk_head_dim} + {spec.v_head_dim}) × {kv_bytes:g} B"


def _attention_kind(spec: ModelSpec) -> str:
    g = spec.global_attention
    if g is not None:
        kv = g.kv_heads or spec.kv_heads
        both = ", K = V: both cached, K normed with a weight and rotated, V normed without one" if g.k_eq_v else ""
        return (f"a global layer's K and V: {kv} KV heads of {g.head_dim}{both}; a local layer's {spec.kv_heads} of "
                f"{spec.head_size}")  # fmt: skip
    if spec.byte_latent:
        return (
            "BLT: K and V of every byte in the local encoder's and decoder's layers (transformers' DynamicLayer "
            "keeps them all, past the window); the global transformer and the cross-attention cache nothing"
        )
    if spec.compressed_attention:
        return (f"one key-value head of {spec.head_size} read as both K and V, cached once, in every layer's window; "
                "the compressed layers' entries below")  # fmt: skip
    if spec.mla and spec.indexer:
        where = "; in the global layers (the local ones: their own latent and key alone)" if spec.mla.local else ""
        return f"MLA with DeepSeek sparse attention: the KV latent, the shared RoPE key and the indexer's key{where}"
    if spec.mla:
        return "MLA: the compressed KV latent and the shared RoPE key"
    if spec.kv_heads == spec.num_heads:
        return f"MHA: K and V for all {spec.num_heads} heads"
    own = f"; in the global layers (the local ones have {spec.local_kv_heads})" if spec.local_kv_heads else ""
    if spec.kv_heads == 1:
        return f"MQA: K and V for 1 head shared by {spec.num_heads}{own}"
    return f"GQA: K and V for {spec.kv_heads} KV heads shared by {spec.num_heads} query heads{own}"


def _kv_section(spec: ModelSpec, memory: InferenceMemory, kv_dtype: str) -> Section:
    kv_bytes = serving_dtype_bytes(kv_dtype, "KV-cache dtype")
    b, s = memory.batch, memory.context
    terms = [
        *_kv_per_token_terms(spec, memory, kv_dtype, kv_bytes),
        *_window_terms(spec, memory),
        *state_terms(spec, memory, kv_bytes),
        *_compressed_terms(memory),
        *_kv_batch_terms(memory),
    ]
    if memory.tp > 1:
        terms.append(_kv_per_token_per_gpu_term(spec, memory, kv_bytes))
    terms.append(
        Term(
            "per_gpu",
            "Whole batch on one GPU",
            memory.kv_cache_per_gpu,
            "bytes",
            _batch_formula(memory, "per token on one GPU"),
            f"{b} × {_kept(memory, s, per_gpu=True)} × {group(memory.kv_per_token_per_gpu)} B",
        )
    )
    return Section("kv_cache", f"KV cache ({b} × {s} tokens)", tuple(terms))


def _kv_per_token_terms(spec: ModelSpec, memory: InferenceMemory, kv_dtype: str, kv_bytes: float) -> tuple[Term, Term]:
    """The cache of one token: in one layer, then in all the layers that keep one."""
    formula, numbers = _per_layer_formula(spec, kv_bytes, _global_kv_heads(spec))
    return (
        Term(
            "per_token_per_layer",
            f"Per token, one layer ({kv_dtype})",
            memory.kv_per_token_per_layer,
            "bytes",
            formula,
            numbers,
            KV_CACHE_SOURCE,
            note=_attention_kind(spec),
        ),
        Term(
            "per_token",
            "Per token, all layers",
            memory.kv_per_token,
            "bytes",
            "L · per token per layer",
            f"{memory.layers} × {group(memory.kv_per_token_per_layer)} B",
            note=_layers_note(spec),
        ),
    )


def _kv_batch_terms(memory: InferenceMemory) -> tuple[Term, Term]:
    """The cache of one sequence of the context (and a hybrid's state), then of the whole batch."""
    b, s = memory.batch, memory.context
    return (
        Term(
            "per_sequence",
            "Per sequence",
            float(memory.cached_tokens(s)) * memory.kv_per_token + memory.beyond_tokens(s),
            "bytes",
            f"{_kept(memory)} · per token" + (f" + {_beyond(memory)}" if memory.beyond_tokens(s) else ""),
            f"{_kept(memory, s)} × {group(memory.kv_per_token)} B" + _state_text(memory),
        ),
        Term(
            "total",
            "Whole batch",
            memory.kv_cache,
            "bytes",
            _batch_formula(memory, "per token"),
            f"{b} × ({_kept(memory, s)} × {group(memory.kv_per_token)} B{_state_text(memory)})",
        ),
    )


def _kv_per_token_per_gpu_term(spec: ModelSpec, memory: InferenceMemory, kv_bytes: float) -> Term:
    """Under TP, one token's cache on one GPU: its share of the KV heads (one at least), or MLA's whole latent."""
    L, tp = memory.layers, memory.tp
    kv = _global_kv_heads(spec)
    heads = kv_heads_per_gpu(spec, tp, kv)
    if spec.mla:
        formula, numbers = _per_layer_formula(spec, kv_bytes, spec.kv_heads)
        gpu_formula, gpu_numbers = "L · " + formula, f"{L} × {numbers}"
        gpu_note = "MLA's latent serves every head, so each TP rank caches all of it"
    else:
        layer_formula, layer_numbers = _per_layer_formula(spec, kv_bytes, heads)
        gpu_formula = "L · " + layer_formula.replace("H_kv", "max(1, H_kv/TP)")
        gpu_numbers = f"{L} × {layer_numbers}"
        gpu_note = (
            f"the {kv} KV heads are replicated over TP={tp}: one per GPU"
            if kv < tp
            else f"{kv} KV heads split over TP={tp}"
        )
    return Term(
        "per_token_per_gpu",
        "Per token on one GPU",
        memory.kv_per_token_per_gpu,
        "bytes",
        gpu_formula,
        gpu_numbers,
        TP_SOURCE,
        note=gpu_note,
    )


def _max_context_formula(memory: InferenceMemory) -> tuple[str, str]:
    budget, b, c = group(memory.cache_budget), memory.batch, group(memory.kv_per_token_per_gpu)
    if memory.compressed:  # DeepSeek-V4: the window's cache stops at w, the compressed entries grow
        return (
            "the largest s ≤ s_max with batch · (min(w, s) · L · per token + entries(s) + fullest unclosed windows) ≤ "
            "cache budget, by bisection",
            f"budget {budget} B, batch {b}, L · per token {c} B, w = {memory.window}, s_max = {memory.max_seq_len}",
        )
    if memory.window is None:
        return "⌊cache budget / (batch · per token on one GPU)⌋", f"⌊{budget} / ({b} × {c})⌋"
    L, local, w, r = memory.layers, memory.local_layers, memory.window, memory.local_weight_per_gpu
    if r != 1:  # a local layer's token weighs r of a global one's (MiMo-V2-Flash)
        return (
            "T = cache budget / (batch · per token on one GPU); ⌊T·L / (L_global + r·L_local)⌋ up to the window, else "
            "⌊(T·L − r·L_local·w) / L_global⌋",
            f"T = {budget} / ({b} × {c}); L = {L}, L_local = {local}, w = {w}, r = {r}",
        )
    return (
        "T = cache budget / (batch · per token on one GPU); ⌊T⌋ up to the window, else ⌊(T·L − L_local·w) / L_global⌋",
        f"T = {budget} / ({b} × {c}); L = {L}, L_local = {local}, w = {w}",
    )


def _all_local_note(memory: InferenceMemory) -> str:
    if (
        memory.compressed
        or memory.window is None
        or memory.local_layers < memory.layers
        or memory.max_context < memory.max_seq_len
    ):
        return ""
    return "every layer keeps only its window: the cache stops growing there, and the trained context bounds it"


def _global_kv_heads(spec: ModelSpec) -> int:
    """A global layer's KV heads: its own where the global layers have widths of their own (Gemma 4)."""
    return (spec.global_attention.kv_heads if spec.global_attention else None) or spec.kv_heads


def _layers_note(spec: ModelSpec) -> str:
    if spec.drafter:
        return "a drafter: every layer attends with its backbone's K and V and caches nothing of its own"
    if spec.kv_sharing:
        n = spec.kv_sharing.layers
        return (f"L: the {spec.num_layers - n} layers that make their own K and V; the last {n} attend with an "
                "earlier layer's and cache nothing")  # fmt: skip
    reuse = spec.layer_reuse
    if reuse is not None:
        kept = "each keeps its own K and V" if reuse.cache == "every_run" else "only each held layer's last keeps K, V"
        return (f"L: the {len(reuse.cached_runs)} runs that cache, of {spec.num_layers} runs of {reuse.held} "
                f"layers; {kept}")  # fmt: skip
    if spec.shared_block:
        return (f"L: the {spec.shared_block.uses} uses of the shared blocks, each caching its own K and V; the "
                f"{spec.other_mixer_layers} Mamba layers keep a state")  # fmt: skip
    if spec.hybrid:
        return (f"L: the {spec.attention_layers} attention layers of {spec.num_layers}; the "
                f"{spec.other_mixer_layers} with another mixer keep a state")  # fmt: skip
    if spec.single_blocks:
        return f"L: the {spec.attention_layers} attention layers of {spec.num_layers}; the others are FFN blocks"
    return "every layer has attention (MoE changes only the feed-forward)" if spec.moe else ""


def _batch_formula(memory: InferenceMemory, per_token: str) -> str:
    """``batch · context · per token``, or with local layers, a hybrid's state or compressed entries what stands for
    them."""
    if memory.beyond_tokens(memory.context):
        return f"batch · ({_kept(memory)} · {per_token} + {_beyond(memory)})"
    return f"batch · {_kept(memory)} · {per_token}"


def _plus_beyond(memory: InferenceMemory) -> str:
    return f" + {_beyond(memory)}" if memory.beyond_tokens(memory.context) else ""


def _beyond(memory: InferenceMemory) -> str:
    return "compressed" if memory.compressed else "state"


def _state_text(memory: InferenceMemory) -> str:
    beyond = memory.beyond_tokens(memory.context)
    return f" + {group(beyond)} B" if beyond else ""


def _compressed_terms(memory: InferenceMemory) -> tuple[Term, ...]:
    """DeepSeek-V4's compressed layers: their entries, and their compressors' state, for one sequence."""
    c, s = memory.compressed, memory.context
    if c is None:
        return ()
    b, m, m2, d, d_i = f"{c.kv_bytes:g} B", c.csa_rate, c.hca_rate, c.head_dim, c.indexer_dim
    source = "DeepSeek-AI 2026 (DeepSeek-V4) §2.3; transformers' DeepseekV4CSACache and DeepseekV4HCACache"
    return (
        Term("compressed_entries", "Compressed entries per sequence", c.entries(s), "bytes",
             "(L_CSA · ⌊s/m⌋ · (d + d_I) + L_HCA · ⌊s/m'⌋ · d) · bytes",
             f"({c.csa_layers} × {s // m} × ({d} + {d_i}) + {c.hca_layers} × {s // m2} × {d}) × {b}", source,
             note="one entry a closed window of m tokens (CSA, with its indexer's key) or m' (HCA); whole on every "
             "TP rank"),
        Term("compressor_state", "Compressors' unclosed windows per sequence", c.unclosed(s), "bytes",
             "(L_CSA · ((s mod m) · 2 · (2·d + 2·d_I) + 2·m·(d + d_I)) + L_HCA · (s mod m') · 2 · d) · bytes",
             f"({c.csa_layers} × ({s % m} × 2 × ({2 * d} + {2 * d_i}) + {2 * m * (d + d_i) if s >= m else 0}) + "
             f"{c.hca_layers} × {s % m2} × 2 × {d}) × {b}", source,
             note="the values and gates of the tokens whose window has not closed, and a CSA layer's last closed "
             "window's first series, which the next entry overlaps"),
    )  # fmt: skip


def _kept(memory: InferenceMemory, context: int | None = None, per_gpu: bool = False) -> str:
    """The context, or with local layers the tokens a layer keeps on average: the symbol, or its value."""
    if context is None:
        return "context" if memory.window is None else "kept"
    return f"{context}" if memory.window is None else f"{float(memory.cached_tokens(context, per_gpu)):,.6g}"


def _window_terms(spec: ModelSpec, memory: InferenceMemory) -> tuple[Term, ...]:
    """With local layers: the tokens a layer keeps for one sequence, on average over the layers (none where no layer
    keeps a cache: a drafter's)."""
    if memory.window is None or not memory.layers:
        return ()
    w, s, L, local = memory.window, memory.context, memory.layers, memory.local_layers
    note = f"the {local} {spec.local_attention}-attention layers keep only the last {w:,} tokens"
    if memory.local_weight == 1:
        formula = "(L_global · context + L_local · min(w, context)) / L"
        numbers = f"({L - local} × {s} + {local} × {min(w, s)}) / {L}"
    else:  # MiMo-V2-Flash, Gemma 4: each token of a local layer is r of a global layer's
        formula = "(L_global · context + L_local · r · min(w, context)) / L"
        numbers = f"({L - local} × {s} + {local} × {memory.local_weight} × {min(w, s)}) / {L}"
        g, mla = spec.global_attention, spec.mla
        m = mla.local if mla else None
        ratio = (f"H_kv · d / (H_kv,g · d_g) = {spec.kv_heads}·{spec.head_size}/({_global_kv_heads(spec)}·"
                 f"{g.head_dim})" if g else f"H_kv,local / H_kv = {spec.local_kv_heads}/{spec.kv_heads}")  # fmt: skip
        if (
            mla is not None and m is not None
        ):  # dots.3 Note: the local layers' own latent and RoPE key, over a global layer's cache
            d_i = f" + {spec.indexer.head_dim}" if spec.indexer else ""
            ratio = (f"(d_c,local + d_rope,local) / (d_c + d_rope{' + d_I' if d_i else ''}) = ({m.kv_lora_rank} + "
                     f"{m.qk_rope_head_dim})/({mla.kv_lora_rank} + {mla.qk_rope_head_dim}{d_i})")  # fmt: skip
        note += (f", at r = {ratio} of a global layer's cache per token (r = {memory.local_weight_per_gpu} on one "
                 f"GPU of TP={memory.tp})")  # fmt: skip
    return (Term("kept", "Tokens kept per layer (average)", float(memory.cached_tokens(s)), "tokens", formula, numbers,
                 note=note),)  # fmt: skip


def _per_gpu_section(spec: ModelSpec, memory: InferenceMemory, capacity_spec: Capacity) -> Section:
    total, capacity = memory.total_per_gpu, memory.capacity
    budget, c = memory.cache_budget, memory.kv_per_token_per_gpu
    budget_text = f"({group(capacity)} − {group(memory.weights_per_gpu)} − {group(memory.overhead)}) B"
    max_context = memory.max_context
    return Section(
        "per_gpu",
        f"Memory per GPU (TP={memory.tp})",
        (
            Term(
                "weights",
                "Weights",
                memory.weights_per_gpu,
                "bytes",
                "(weights + scales) / TP" if memory.quant_scales else "weights / TP",
            ),
            Term(
                "kv_cache",
                "KV cache",
                memory.kv_cache_per_gpu,
                "bytes",
                _batch_formula(memory, "per token on one GPU"),
            ),
            overhead_term(memory.overhead, "CUDA context, workspaces, forward activations and logits, fragmentation"),
            Term("total", "Total", total, "bytes", "weights + KV cache + overhead"),
            *capacity_terms(total, capacity_spec, utilisation=False),
            Term(
                "cache_budget",
                "Memory left for the KV cache",
                budget,
                "bytes",
                "capacity − weights − overhead",
                budget_text,
            ),
            Term(
                "max_batch",
                f"Largest batch at {memory.context} tokens",
                memory.max_batch,
                "sequences",
                f"⌊cache budget / ({_kept(memory)} · per token on one GPU{_plus_beyond(memory)})⌋",
                f"⌊{group(budget)} / ({_kept(memory, memory.context)} × {group(c)}{_state_text(memory)})⌋",
                note=(
                    "no cache of its own: its backbone's cache bounds the batch"
                    if memory.keeps_nothing
                    else "not even one sequence of this context fits"
                    if memory.max_batch == 0
                    else ""
                ),
            ),
            Term(
                "max_context",
                f"Longest context at batch {memory.batch}",
                max_context,
                "tokens",
                *_max_context_formula(memory),
                note=_all_local_note(memory)
                or f"memory would hold a context of {max_context:,} tokens at batch {memory.batch}, beyond "
                f"{spec.name}'s trained context of {spec.max_seq_len:,} tokens"
                if max_context > spec.max_seq_len
                else "",
            ),
        ),
    )


INFERENCE_STACK = ("per_gpu.weights", "per_gpu.kv_cache", "per_gpu.overhead")
"""Term keys a memory bar stacks against ``INFERENCE_CAPACITY`` (see ``Result.stack``)."""
INFERENCE_CAPACITY = "per_gpu.capacity"


def inference_sections(serving: Serving, memory: InferenceMemory, capacity: Capacity) -> tuple[Section, ...]:
    """Serving memory as terms (``memory``, what ``inference_memory`` found for ``capacity``): the weights, the KV
    cache, and one GPU's total with the largest batch and context."""
    return (
        _weights_section(serving.model, memory, serving.weights_dtype),
        _kv_section(serving.model, memory, serving.kv_dtype),
        _per_gpu_section(serving.model, memory, capacity),
    )
