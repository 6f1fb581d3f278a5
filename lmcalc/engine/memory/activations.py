"""What a training step saves for backward, tensor by tensor: one transformer layer, and what lies outside the
layers (token ids, the final norm, the head's input, the logits).

The tensors follow Korthikanti et al. 2022 §4.1 (eq. 1: sbh(34 + 5as/h) bytes per GPT-3 layer), written
out one by one instead of as one constant, so that the same derivation covers SwiGLU (gate, up, activation
and product: 4·s·b·f instead of GELU's 8·sbh + 8·sbh for f = 4h), GQA (K and V at H_kv heads), models
trained without dropout (no masks), MoE (k routed experts per token), multi-head latent attention, and
FlashAttention (no s² score matrix; the per-row log-sum-exp instead). How many of them a GPU holds at once,
over its layers, pipeline stage and micro-batches in flight, is ``engine.memory.gpu_memory``'s question.

Tensor parallelism splits what lies inside attention and the MLP (``SavedTensor.split``); K and V over at most
their H_kv heads, each rank keeping one whole KV head when TP exceeds them (``SavedTensor.tp_ways``), as
Megatron-Core does. Not modelled there: Megatron-Core gets that head by all-gathering the fused Q/K/V output
over TP, so where a profile keeps the fused output alive (``q_copies``/``k_copies`` > 1) the storage kept is
the gathered one, every head's, not the rank's slice.
"""

from __future__ import annotations

import functools
from dataclasses import replace

from lmcalc.engine.finetune.method import (
    MIXER_INPUTS,
    adapted_modules,
)
from lmcalc.engine.memory.altup import ALTUP_PREDICTION, altup_saved
from lmcalc.engine.memory.blocks import ffn_half, mixer_half
from lmcalc.engine.memory.branch_convs import branch_attention_saved, branch_mlp_saved
from lmcalc.engine.memory.cca import cca_attention_saved, residual_scaling_saved
from lmcalc.engine.memory.compressed import compressed_attention_saved, streams_saved
from lmcalc.engine.memory.differential import differential_saved
from lmcalc.engine.memory.dots_mla import LOCAL_SYMBOLS, local_widths, rope_key_norm_saved
from lmcalc.engine.memory.dynamic_mask import dynamic_mask_saved, residual_scale_saved
from lmcalc.engine.memory.eager_scores import eager_scores_saved
from lmcalc.engine.memory.ffn import DOWN, UP, ffn_saved
from lmcalc.engine.memory.fp8_storage import fp8_saved
from lmcalc.engine.memory.image_prefix import decoder_workload
from lmcalc.engine.memory.inkling2 import inkling2, inkling2_layer_saved
from lmcalc.engine.memory.masks import kinds_differ, selection_saved, window_mask_saved, window_masked_share
from lmcalc.engine.memory.method_kept import dropout_mask_of, under_method
from lmcalc.engine.memory.moa import attention_experts_saved
from lmcalc.engine.memory.module_recompute import module_kept
from lmcalc.engine.memory.ngpt import interpolation_saved, ngpt_attention_saved, ngpt_mlp_saved
from lmcalc.engine.memory.norms import norm_gate_saved, norm_saved, norm_stats, sub_normed
from lmcalc.engine.memory.op_checkpoint import op_checkpoint_kept
from lmcalc.engine.memory.prompt_prefix import prompt_layer_saved, without_prompt
from lmcalc.engine.memory.retrieval_experts import retrieval_experts_saved
from lmcalc.engine.memory.routing import expert_outputs_saved, routed_symbol, router_input_saved, router_saved
from lmcalc.engine.memory.saved import LOGSUMEXP_BYTES, ROUTED, SavedTensor
from lmcalc.engine.memory.sdpa_math import math_inputs_saved, math_scores_saved, sdpa_math_path
from lmcalc.engine.memory.shared_block import shared_uses_saved
from lmcalc.engine.memory.ssm import KINDS, AttentionKind, MixerKind, average_mixer, share
from lmcalc.engine.memory.widths import (
    at_widths,
    branch_norms_saved,
    global_symbols,
    kind_layers,
    kv_reused,
    mlp_widths,
    per_layer_input_saved,
    renamed,
)
from lmcalc.engine.model.params import Dim
from lmcalc.engine.model_code import fused_qkv_renewed, norm_keeps, output_renewed
from lmcalc.engine.workload import Workload
from lmcalc.specs import ModelSpec

LOGITS_BYTES = 4  # the cross-entropy works on fp32 logits (Korthikanti et al. 2022 §4.1, "4sbv")
TOKEN_ID_BYTES = 8  # token ids and targets are int64 (the embedding and the loss keep them)

QKV = ("q", "k", "v", "qkv", "q_a", "kv_a", "attn_gate")  # the linear layers that read the attention norm's output


def _kv_heads(spec: ModelSpec, kind: AttentionKind) -> int:
    """The key-value heads of an attention layer of ``kind``: a local one's own where the model gives them."""
    return spec.local_kv_heads if kind == "local" and spec.local_kv_heads else spec.kv_heads


def _attention_saved(w: Workload, kind: AttentionKind) -> list[SavedTensor]:
    spec, act, sb = w.model, w.precision.activation_bytes, w.tokens
    H, dqk, dv, h = spec.num_heads, spec.qk_head_dim, spec.v_head_dim, spec.hidden_size
    rows = Dim(sb, "s·b")
    # one norm feeding both halves of a parallel block (Falcon-7B, Cohere): its output is the MLP's input too
    readers = (*QKV, *UP, "router") if spec.norms_per_layer == 1 else QKV
    if spec.hybrid:  # the norm's output in a hybrid's other layers: their input projections read it
        readers = (*readers, *MIXER_INPUTS, "output_gate")  # MiniMax's lightning attention's gate reads it too
    tensors = [
        SavedTensor("QKV projection input (norm output)", "s·b·h", sb * h, act, split="seq", for_weights=readers)
    ]
    if spec.mla:
        return tensors + _mla_saved(w, rows)
    # Eager attention expands K and V to all H heads before the matmul (repeat_kv) unless that expansion
    # sits inside the recomputed core; fused kernels read the H_kv heads directly. One KV head of one sequence
    # expands as a view (repeat_kv's reshape merges its size-1 head and batch dimensions), which the matmul keeps.
    heads = _kv_heads(spec, kind)
    if spec.moe and spec.moe.attention_experts:  # JetMoE: K and V repeated to the k experts' heads (memory.moa)
        heads = H
    expanded = w.attention == "eager" and not w.core_recomputed and not (heads == 1 and w.micro_batch == 1)
    kv = H if expanded else heads
    kv_sym = "H" if expanded or kv == H else "H_kv"
    kv_ranks = None if expanded else heads  # TP ranks past the KV heads share one (SavedTensor.tp_ways)
    if spec.qkv_clip:  # OLMo's clamp_, in place on each projection's output: it keeps its input
        clamped = (("Q", "H", H, dqk), ("K", "H_kv", heads, dqk), ("V", "H_kv", heads, dv))
        tensors += [SavedTensor(f"{x} before the clamp (qkv_clip)", f"s·b·{y}·d", sb * n * d, act)
                    for x, y, n, d in clamped]  # fmt: skip
    tensors += _qk_norm_saved(w, rows, kind)
    if kind == "local" and spec.local_qk_l2_norm:  # Llama4TextL2Norm: x.float() · rsqrt(mean(x²) + ε), no weight
        fp32 = norm_keeps(w) != "input"  # written with its upcast, or one kernel keeping its input
        for name, n, sym in (("Q", H, "H"), ("K", heads, "H_kv")):
            tensors += [SavedTensor(f"{name} L2-norm input{' (fp32 copy)' if fp32 else ''}", f"s·b·{sym}·d",
                                    sb * n * dqk, 4 if fp32 else act, most_tp_ranks=None if name == "Q" else heads),
                        SavedTensor(f"{name} L2-norm 1/rms (fp32)", f"s·b·{sym}", sb * n, 4)]  # fmt: skip
    if sdpa_math_path(w):  # PyTorch's math path keeps fp32 copies of Q, K and V, not the model's own
        return tensors + math_inputs_saved(w)
    rope = " (after RoPE)" if spec.position_embedding == "rope" else ""
    fp32 = w.attention == "eager" and spec.eager_fp32_scores  # Flint, GPT-J: the scores' product keeps fp32 copies
    qk, qk_bytes = (" (fp32 copy)", 4) if fp32 else (rope, act)
    return tensors + [
        SavedTensor("Q" + qk, "s·b·H·d", sb * H * dqk, qk_bytes),
        SavedTensor("K" + qk, f"s·b·{kv_sym}·d", sb * kv * dqk, qk_bytes, most_tp_ranks=kv_ranks),
        SavedTensor("V", f"s·b·{kv_sym}·d", sb * kv * dv, act, most_tp_ranks=kv_ranks),
        *_qkv_copies_saved(w, kv, kv_sym, kv_ranks, kind),
    ]


def _mla_saved(w: Workload, rows: Dim) -> list[SavedTensor]:
    """Multi-head latent attention, after its input: the query latent (with its norm) where queries are
    compressed, the KV latent with the shared RoPE key, its norm, and the up-projected Q, K and V."""
    spec, act, sb = w.model, w.precision.activation_bytes, w.tokens
    H, dqk, dv = spec.num_heads, spec.qk_head_dim, spec.v_head_dim
    assert spec.mla is not None
    m = spec.mla
    tensors: list[SavedTensor] = []
    if m.q_lora_rank:
        tensors += norm_saved(w, "query latent norm", rows, Dim(m.q_lora_rank, "r_q"))
        width, symbol = (2 * m.q_lora_rank, "2·r_q") if m.q_latent_concat else (m.q_lora_rank, "r_q")
        label = "query up-projection input" + (" (the latent's norm output ‖ the latent)" if m.q_latent_concat else "")
        tensors.append(SavedTensor(label, f"s·b·{symbol}", sb * width, act, split="seq", for_weights=("q_b",)))
    if norm_keeps(w) == "input":  # a fused norm keeps its input: a slice of the latent, which keeps it whole
        kv_width = m.kv_lora_rank + m.qk_rope_head_dim
        tensors.append(
            SavedTensor("KV latent (with the shared RoPE key)", "s·b·(r_kv+d_rope)", sb * kv_width, act, split="seq")
        )
        tensors += norm_stats(spec, "KV latent norm", rows)
    else:  # an upcast first copies the slice: the norm keeps what the query latent's does
        tensors += norm_saved(w, "KV latent norm", rows, Dim(m.kv_lora_rank, "r_kv"))
    tensors += rope_key_norm_saved(w, rows)  # dots.3 Note's
    tensors.append(
        SavedTensor("KV up-projection input", "s·b·r_kv", sb * m.kv_lora_rank, act, split="seq", for_weights=("kv_b",))
    )
    tensors.append(SavedTensor("Q (nope ‖ rope)", "s·b·H·d_qk", sb * H * dqk, act))
    tensors.append(SavedTensor("K (nope ‖ shared rope)", "s·b·H·d_qk", sb * H * dqk, act))
    tensors.append(SavedTensor("V", "s·b·H·d_v", sb * H * dv, act))
    # V, a slice, keeps its storage whole: in the fused kernel, and in eager attention's matmul of one sequence (its
    # (b·H, s, d_v) a view where b is 1; a copy otherwise)
    one_sequence = w.attention == "eager" and w.micro_batch == 1 and not w.core_recomputed
    if w.framework.attention.mla_value_view and (w.attention == "flash" or one_sequence):
        tensors.append(
            SavedTensor("K's no-RoPE part, in V's storage", "s·b·H·d_nope", sb * H * m.qk_nope_head_dim, act)
        )
    return tensors


def _qk_norm_saved(w: Workload, rows: Dim, kind: AttentionKind) -> list[SavedTensor]:
    """A QK-norm's saved tensors: over the whole width of Q and of K (one row per token each), or per head. A norm
    kernel's input sliced from a fused QKV output that V keeps alive whole is a view of it, counted there
    (Persimmon's q_layernorm and k_layernorm)."""
    spec = w.model
    if spec.qk_norm == "none":
        return []
    if fused_qkv_renewed(w) and _v_view_share(w, kind) == 1 and norm_keeps(w) == "input":
        return [t for t in _qk_norm_saved_all(w, rows, kind) if not t.label.endswith(" input")]
    return _qk_norm_saved_all(w, rows, kind)


def _qk_norm_saved_all(w: Workload, rows: Dim, kind: AttentionKind = None) -> list[SavedTensor]:
    spec, sb = w.model, w.tokens
    H, dqk, kv = spec.num_heads, spec.qk_head_dim, _kv_heads(spec, kind)  # a local layer's own KV heads (Inkling's)
    full = spec.qk_norm == "full"  # a full-width QK-norm has one row per token for Q and one for K
    q_rows, k_rows = (rows, rows) if full else (Dim(sb * H, "s·b·H"), Dim(sb * kv, "s·b·H_kv"))
    q_width = Dim(H * dqk, "H·d") if full else Dim(dqk, "d")
    k_width = Dim(kv * dqk, "H_kv·d") if full else Dim(dqk, "d")
    k_norm = [replace(t, most_tp_ranks=kv) for t in norm_saved(w, "K-norm", k_rows, k_width, "tp")]
    if spec.value_norm:  # Gemma's weightless v_norm on each head of V: what a norm keeps but the normalised value
        k_norm += [replace(t, label=t.label.replace("K-", "V-", 1)) for t in k_norm if "normalised" not in t.label]
    return [*norm_saved(w, "Q-norm", q_rows, q_width, "tp"), *k_norm]


def _qkv_copies_saved(
    w: Workload, kv: int, kv_sym: str, kv_ranks: int | None, kind: AttentionKind
) -> list[SavedTensor]:
    """Copies of Q, K and V beyond the kernel's own that the framework keeps alive (the profile's attention rule):
    a fused QKV output or a K/V copy, and the fused output V keeps alive as a view of it."""
    spec, act, sb = w.model, w.precision.activation_bytes, w.tokens
    H, dqk, dv = spec.num_heads, spec.qk_head_dim, spec.v_head_dim
    rule = w.framework.attention  # copies beyond the kernel's own: a fused QKV output or a K/V copy kept alive
    extra = [
        SavedTensor(f"{name} (another copy, kept alive)", symbol, elements, act, most_tp_ranks=ranks)
        for name, symbol, elements, copies, ranks in (
            ("Q", "s·b·H·d", sb * H * dqk, rule.q_copies, None),
            ("K", f"s·b·{kv_sym}·d", sb * kv * dqk, rule.k_copies, kv_ranks),
            ("V", f"s·b·{kv_sym}·d", sb * kv * dv, rule.v_copies, kv_ranks),
        )
        for _ in range(copies - 1)
    ]
    heads, view = _kv_heads(spec, kind), _v_view_share(w, kind)
    if fused_qkv_renewed(w) and view and not spec.qkv_clip:  # a clamp makes V a tensor of its own (DBRX's)
        symbol = "s·b·(H+H_kv)·d" if view == 1 else f"{view:g}·s·b·(H+H_kv)·d"
        extra.append(
            SavedTensor("fused QKV output's Q and K (kept alive with V, a view of it)", symbol,
                        sb * (H + heads) * dqk * view, act)
        )  # fmt: skip
    return extra


def _v_view_share(w: Workload, kind: AttentionKind) -> float:
    """Of the attention layers (of ``kind``), the share in which what attention keeps of V is a view of the
    projection's output, not a copy. repeat_kv copies V to H heads under GQA, eagerly or where the window's mask is
    given to a fused kernel; and eager attention's matmul folds the batch into the heads, which copies a strided V
    unless the micro-batch is one sequence."""
    spec = w.model
    every_head = _kv_heads(spec, kind) == spec.num_heads
    if w.attention == "eager":
        return 1.0 if every_head and w.micro_batch == 1 else 0.0
    return 1.0 if every_head else 1.0 - window_masked_share(w, kind)


@functools.lru_cache(maxsize=4096)
def layer_saved_tensors(w: Workload, moe_layer: bool, mixer: MixerKind = "average") -> tuple[SavedTensor, ...]:
    """What one transformer layer (a dense one, or an MoE one) saves for backward, following Korthikanti et
    al. 2022 §4.1; ``layer_kept_tensors`` drops what selective recomputation rebuilds. A hybrid's layer is the
    average of its layers, or with ``mixer`` one that attends or one of its other mixer; a model whose local layers
    attend with heads or sinks of their own, the average of its global and local layers or one of them."""
    if w.model.image_prefix:  # GIT's: its layers over the image's tokens and the text's
        return layer_saved_tensors(decoder_workload(w), moe_layer, mixer)
    if w.model.prompt:  # CPM-Ant's: a layer over the prompt's tokens and the text's (engine.memory.prompt_prefix)
        return prompt_layer_saved(w, layer_saved_tensors(without_prompt(w), moe_layer, mixer))
    if inkling2(w):  # Inkling 2's layers, written out whole (engine.memory.inkling2); every one routes
        kept = inkling2_layer_saved(w, mixer)
        return fp8_saved(w, tuple(kept if w.method.kind == "full" else under_method(w, kept, True, mixer)))
    spec, mask, h, sb = w.model, w.mask_bytes, w.model.hidden_size, w.tokens
    H, dv = spec.num_heads, spec.v_head_dim
    tensors = norm_saved(w, "attention norm", Dim(sb, "s·b"), Dim(h, "h"))
    tensors += norm_gate_saved(w, "attention norm") if spec.gated_norm_rank else []
    kept_by_every_layer = len(tensors) + 1  # the norm's, and its output: the mixer's input in every layer
    if kinds_differ(w) and mixer not in KINDS:  # the average of A_g and A_l layers (of those reusing K and V apart)
        for kind, reusing, n in kind_layers(spec):
            tensors += [share(t, n, spec.attention_layers) for t in _attention_block(w, kind, reusing)]
    elif mixer in KINDS:
        tensors += _attention_block(w, "local" if mixer.startswith("local") else "global", mixer.endswith("_shared"))
    else:
        tensors += _attention_block(w, None)
    tensors += altup_saved(w, mixer)  # Gemma 3n's streams, router and LAuReL
    if spec.differential_attention:
        tensors = tensors[:kept_by_every_layer] + differential_saved(w, tensors[kept_by_every_layer:])
    if spec.sub_norms:
        tensors = sub_normed(w, tensors, ("o",), Dim(H * dv, "H·d_v"), "output")
    if spec.hybrid:  # a hybrid: the average layer, attention in A of its L layers, another mixer in the rest
        tensors = tensors[:kept_by_every_layer] + average_mixer(w, tensors[kept_by_every_layer:], mixer)
    if spec.norms_per_layer == 4:  # a sandwich norm on the attention's output (Gemma 2/3): its input is new
        tensors += norm_saved(w, "post-attention norm", Dim(sb, "s·b"), Dim(h, "h"))
    if spec.drops("residual"):
        tensors.append(SavedTensor("residual dropout mask (attention)", "s·b·h", sb * h, mask, split="seq"))
    tensors += residual_scale_saved(w, "attention") + residual_scaling_saved(w, "attention")  # Doge's, ZAYA's
    tensors += interpolation_saved(w, "attention")  # Dory's nGPT residual
    mlp = [
        replace(t if n == of else share(t, n, of), block="mlp")
        for wide, n, of in mlp_widths(w, mixer)
        for t in renamed(_mlp_saved(wide, moe_layer and bool(spec.moe)), {"f": "2·f"} if wide is not w else {})
        + per_layer_input_saved(wide)
    ]
    tensors = mixer_half(spec, tensors, mixer) + ffn_half(spec, mlp, moe_layer, mixer) + shared_uses_saved(w, mixer)
    tensors += streams_saved(w)  # the hyper-connections around both halves (DeepSeek-V4, HY V4)
    return fp8_saved(
        w,
        tuple(tensors if w.method.kind == "full" else under_method(w, tensors, moe_layer and bool(spec.moe), mixer)),
    )


def _attention_block(w: Workload, kind: AttentionKind, reusing_kv: bool = False) -> list[SavedTensor]:
    """What a layer's attention keeps after its norm, in a layer of ``kind`` (None: every attention layer alike), one
    that attends with an earlier layer's K and V where ``reusing_kv``."""
    if w.model.compressed_attention:  # DeepSeek-V4's, its layers of three kinds averaged (engine.memory.compressed)
        return compressed_attention_saved(w)
    if reusing_kv:
        return kv_reused(w, kind, _attention_block(w, kind))
    if global_symbols(w, kind):  # a global layer at its own widths (Gemma 4), its formula in d_g
        return renamed(_attention_block(at_widths(w, kind), kind), global_symbols(w, kind))
    if local := local_widths(w, kind):  # a local layer at MLA widths of its own (dots.3 Note), in H,local ...
        return renamed(_attention_block(local, kind), LOCAL_SYMBOLS)
    spec, act, mask = w.model, w.precision.activation_bytes, w.mask_bytes
    s, b, sb = w.seq_len, w.micro_batch, w.tokens
    H, dv = spec.num_heads, spec.v_head_dim
    tensors = _attention_saved(w, kind) + (dynamic_mask_saved(w) if spec.dynamic_mask_window else [])
    tensors += cca_attention_saved(w)  # ZAYA's convolutions and L2 norms
    if spec.attention_sinks and spec.sink_scale:  # Granite SWA: output · σ(lse − sink), the scale in fp32
        tensors += [SavedTensor("attention output before the sinks' scale", "s·b·H·d_v", sb * H * dv, act, True),
                    SavedTensor("the sinks' scale σ(lse − sink) (fp32)", "b·H·s", b * H * s, 4, True),
                    SavedTensor("the sinks' scale, cast", "b·H·s", b * H * s, act, True)]  # fmt: skip
    if w.attention == "eager":
        tensors += eager_scores_saved(w, spec.attention_sinks and (kind == "local" or not spec.sinks_local_only))
        if spec.drops("attention"):
            tensors.append(SavedTensor("attention dropout mask", "b·H·s²", b * H * s * s, mask, True))
            tensors.append(SavedTensor("attention dropout output", "b·H·s²", b * H * s * s, act, True))
        if not (spec.moe and spec.moe.attention_experts):  # JetMoE's output experts read a gathered copy instead
            tensors.append(SavedTensor("output projection input", "s·b·H·d_v", sb * H * dv, act, for_weights=("o",)))
    elif sdpa_math_path(w):  # no fused kernel takes the call (engine.memory.sdpa_math): the s × s scores in fp32
        tensors += math_scores_saved(w)
    else:
        tensors.append(SavedTensor("log-sum-exp per row (fp32)", "b·H·s", b * H * s, LOGSUMEXP_BYTES, True))
        # The fused kernel's output, kept for its backward, is laid out (b, s, H, d): the output projection's
        # input is a view of the same storage, so it is counted once; unless Q, made from a fused QKV slice or
        # concatenated by a partial RoPE, lays the output out (b, H, s, d) and the projection (or the output gate)
        # reads a copy (model_code.output_renewed).
        if output_renewed(w):
            gated = spec.attention_output_gate
            tensors.append(SavedTensor("attention output, kept by the kernel", "s·b·H·d_v", sb * H * dv, act))
            tensors.append(SavedTensor(f"{'output gate' if gated else 'output projection'} input (its copy, laid "
                                       "out (b, s, H, d))", "s·b·H·d_v", sb * H * dv, act,
                                       for_weights=() if gated else ("o",)))  # fmt: skip
        else:
            tensors.append(SavedTensor("attention output = output projection input", "s·b·H·d_v", sb * H * dv, act))
        tensors += window_mask_saved(w, kind) + selection_saved(w)
    if spec.moe and spec.moe.attention_experts:
        tensors += attention_experts_saved(w)
    if spec.attention_output_gate or spec.attention_head_gate != "none":  # o_proj reads attention · gate
        width, symbol = (H * dv, "s·b·H·d_v") if spec.attention_output_gate else (H, "s·b·H")
        if spec.attention_head_gate == "fp32":  # sigmoid (Bailing) or softplus (Laguna) of g_proj(x).float()
            tensors.append(SavedTensor("head gate, its activation's output or input (fp32)", symbol, sb * width, 4))
        gate_bytes = 4 if spec.attention_gate_fp32 else act  # A.X K2's sigmoid of the gate, upcast
        tensors += [  # the product keeps the gate and the attention's output (counted above)
            SavedTensor("output gate, its activation's output", symbol, sb * width, gate_bytes),
            SavedTensor("output projection input (the gated product)", "s·b·H·d_v", sb * H * dv, act),
        ]
    tensors += branch_attention_saved(w, kind)  # Inkling's convolutions and relative logits
    return ngpt_attention_saved(w, tensors)  # Dory's scales and sub-norm (engine.memory.ngpt)


def kept_before_core(w: Workload, moe_layer: bool) -> float:
    """Of what a layer saves, the share made before its attention core: its norm, projections, Q, K and V, the moment
    a sparse-attention indexer scores its keys."""
    tensors = layer_saved_tensors(w, moe_layer)
    total = sum(t.bytes for t in tensors)
    before = 0.0
    for t in tensors:
        if t.attention_core or t.block != "attention":
            break
        before += t.bytes
    return before / total if total else 0.0


def lowest_layer_unkept(w: Workload) -> tuple[SavedTensor, ...]:
    """The tensors the lowest layer keeps less than the others, without full recomputation: the attention norm it does
    without where the embedding's norm stands in for it (ModernBERT's: ``first_attention_norm`` false, its attention
    reading the layer's input), and what it leaves unkept under LoRA or QLoRA (``_frozen_input_unkept``)."""
    if w.recompute == "full":
        return ()
    frozen = _frozen_input_unkept(w)
    if w.model.first_attention_norm or not w.model.is_attention_layer(0):
        return frozen
    first = layer_kept_tensors(w, w.model.is_moe_layer(0))
    unnormed = tuple(t for t in first if t.label.startswith("attention norm"))
    return unnormed + tuple(t for t in frozen if t not in unnormed)


def _frozen_input_unkept(w: Workload) -> tuple[SavedTensor, ...]:
    """The tensors the lowest layer keeps less than the others under LoRA or QLoRA: its input (the frozen embedding's
    output) needs no gradient, so what lies before its first adapter keeps nothing: its attention norm and the dropout
    masks of the adapters that read it, or, when no attention module is adapted, its whole attention half, its MLP
    norm and the masks of the adapters that read that."""
    if not w.method.adapters:
        return ()
    modules = adapted_modules(w.model, w.method)
    if any(m.leaf == "stream_projections" for m in modules):  # Gemma 3n: adapted, they make its input need gradients
        return ()
    moe_first = w.model.is_moe_layer(0)
    kind: MixerKind = ("local" if w.model.is_local_layer(0) else "global") if inkling2(w) else "average"
    first = layer_kept_tensors(w, moe_first, kind)  # Inkling 2's first layer: of its kind (its norms differ)
    # the modules that read the lowest layer's norm: its attention's, or where it runs a hybrid's other mixer, that
    # mixer's input projections too (RecurrentGemma's first layer is recurrent; RWKV's time mix, through its mixes)
    reads_norm = QKV if w.model.is_attention_layer(0) else (*QKV, *MIXER_INPUTS, "key", "value", "receptance")
    if any(m.group == "attention" or m.leaf in reads_norm for m in modules):
        reads_input = {m.name for m in modules if m.leaf in reads_norm}
        leaves = {m.leaf for m in modules} | ({"q", "k", "v"} if any(m.leaf == "qkv" for m in modules) else set())
        # and a QK- or V-norm on a frozen projection's output (Qwen3's, Gemma's), Gemma 3n's AltUp prediction and a
        # frozen LAuReL: their inputs need no gradient either
        frozen = ("attention norm", *(f"{x.upper()}-norm" for x in "qkv" if x not in leaves), *ALTUP_PREDICTION)
        frozen += ("LAuReL",) if not leaves & {"left", "right"} else ()
        return tuple(t for t in first if t.label.startswith(frozen) or dropout_mask_of(t, reads_input))
    reads_input = {m.name for m in modules if m.leaf in (*UP, "router")}
    return tuple(
        t for t in first if t.block == "attention" or t.label.startswith("MLP norm") or dropout_mask_of(t, reads_input)
    )


def layer_kept_tensors(w: Workload, moe_layer: bool, mixer: MixerKind = "average") -> tuple[SavedTensor, ...]:
    """What one layer keeps through its forward pass: under selective recomputation, all but what the modules it
    names drop (the attention core by default, Korthikanti et al. 2022 §4.2.2; ``engine.memory.module_recompute``),
    which the backward pass rebuilds, or where the framework checkpoints operator by operator, what its policy keeps
    (``engine.memory.op_checkpoint``)."""
    w = decoder_workload(w)  # GIT's layers: over the image's tokens and the text's
    tensors = layer_saved_tensors(w, moe_layer, mixer)
    if w.recompute != "selective":
        return tensors
    if w.framework.recompute.selective == "matmuls":  # torchtitan's per-operator policy
        return tuple(kept.tensor for kept in op_checkpoint_kept(w, moe_layer))
    return module_kept(w, tensors, moe_layer)  # Megatron-Core's modules: the attention core by default


def _of_routed_experts(tensors: list[SavedTensor]) -> list[SavedTensor]:
    """The routed experts' tensors, kept for the experts' own weights (``experts.gate`` ...): a shared expert's
    adapter, its leaf named alike, keeps none of them where the experts are frozen (transformers 5's 3-D experts,
    which PEFT does not adapt)."""
    return [replace(t, for_weights=tuple(f"{ROUTED}{leaf}" for leaf in t.for_weights), routed=True) for t in tensors]


def _mlp_saved(w: Workload, moe_layer: bool) -> list[SavedTensor]:
    """The MLP half of a layer: its norm, the MLP (dense or routed), the residual dropout after it."""
    spec, act, sb = w.model, w.precision.activation_bytes, w.tokens
    h = spec.hidden_size
    tensors = norm_saved(w, "MLP norm", Dim(sb, "s·b"), Dim(h, "h"))
    if spec.parallel_block and norm_keeps(w) == "input":  # the MLP norm reads the layer input, kept already
        tensors = [t for t in tensors if not t.label.endswith(" input")]
    if spec.norms_per_layer == 1:  # one norm feeds both halves: the MLP reads the attention norm's output
        tensors = []
    if moe_layer and spec.moe:
        moe = spec.moe
        tensors += norm_gate_saved(w, "MLP norm") if spec.gated_norm_rank else []
        k, f_e, io = moe.k, Dim(moe.expert_ffn_size, "f_e"), w.expert_width  # io: h, or a latent MoE's l
        rows, kr = w.routed_copies * sb, routed_symbol(w)  # the experts' rows: k·ρ a token (a capacity's padding)
        tensors += [
            *router_input_saved(w, sb),
            *router_saved(w, sb, k, rows, kr),
            *_of_routed_experts([
                SavedTensor("tokens gathered for their experts", f"{kr}·s·b·{io.symbol}", rows * io.size, act,
                            split="seq", for_weights=UP),
                *ffn_saved(w, Dim(rows, f"{kr}·s·b"), f_e, with_input=False),
            ]),
        ]  # fmt: skip
        tensors += expert_outputs_saved(w, rows, kr)
        if moe.latent_size:  # the projection back to h keeps its input, the experts' combined output; the one down
            # to l reads the norm output the router keeps
            tensors.append(SavedTensor("latent projection up input (the experts' combined output)", "s·b·l",
                                       sb * moe.latent_size, act, split="seq", for_weights=("fc2",)))  # fmt: skip
        if moe.shared_experts:
            f_s = Dim(moe.shared_width, "f_s") if moe.shared_expert_ffn_size else f_e
            tensors += ffn_saved(w, Dim(moe.shared_experts * sb, "E_shared·s·b"), f_s, with_input=False)
        if moe.shared_expert_gate:  # sigmoid(x·w_g) · shared(x): the product keeps both factors
            tensors += [
                SavedTensor("shared-expert output (for the gate's product)", "s·b·h", sb * h, act, split="seq"),
                SavedTensor("shared-expert gate, sigmoid output", "s·b", sb, act, split="seq"),
            ]
        if moe.output_norm:  # A.X K1: a norm on the summed output of the routed and shared experts
            tensors += norm_saved(w, "MoE output norm", Dim(sb, "s·b"), Dim(h, "h"))
        tensors += branch_norms_saved(w) if moe.branch_norms else []  # Gemma 4's, and its router's own norm
    else:
        tensors += retrieval_experts_saved(w, ffn_saved(w, Dim(sb, "s·b"), Dim(spec.ffn_size, "f")))  # Doge's CDMoE
        if spec.sub_norms:
            tensors = sub_normed(w, tensors, DOWN, Dim(spec.ffn_size, "f"), "down")
        tensors = ngpt_mlp_saved(w, tensors)  # Dory's scales and sub-norm
    tensors += branch_mlp_saved(w, moe_layer and bool(spec.moe))  # Inkling's scale, shared experts' γ, convolution
    if spec.norms_per_layer == 1:
        tensors = [t for t in tensors if "(norm output)" not in t.label]
    if spec.norms_per_layer == 4:  # a sandwich norm on the MLP's output
        tensors += norm_saved(w, "post-MLP norm", Dim(sb, "s·b"), Dim(h, "h"))
    if spec.drops("residual"):
        tensors.append(SavedTensor("residual dropout mask (MLP)", "s·b·h", sb * h, w.mask_bytes, split="seq"))
    return tensors + residual_scale_saved(w, "mlp") + residual_scaling_saved(w, "mlp") + interpolation_saved(w, "mlp")
