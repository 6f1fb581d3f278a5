"""What Inkling 2's text model keeps for backward (Thinking Machines 2026; transformers 5.24's
Inkling2SlidingDecoderLayer, Inkling2FullDecoderLayer, Inkling2BlockAttentionResidual, Inkling2ScaledL2Clip,
Inkling2L2Clip, Inkling2DynamicShortConvolution, Inkling2GatedOutputProjection, Inkling2TopKRouter and
Inkling2Experts), its layers written out whole, as its own code runs them: in the activation dtype, in fp32 where it
upcasts.

Before each sub-layer a block attention residual (``Inkling2BlockAttentionResidual``) stacks the m states (the blocks
so far, every ``n_layers_per_attn_res_block`` layers' inputs, and the partial one) in fp32 and attends over them with
q learned queries: its unweighted RMSNorm keeps the fp32 stack (4·s·b·m·h) and 1/rms (4·s·b·m), the product with the
queries the normalised stack (4·s·b·m·h, its K and V) and the fp32 probabilities (4·s·b·q·m); the first layer's
attention reads its input directly, a local layer's attention has one query, a global one's three (Q's, K's and V's
inputs), every MLP one. Its norms (``Inkling2RMSNorm``) keep the fp32 input, 1/rms and the fp32 normalised value (the
weight multiplies it before the cast): one before a local layer's attention, three before a global one's. Q and the
relative states are scaled (a learned scale, copied to fp32 where the model is not) and L2-clipped in fp32: the fp32
copy the scale's gradient needs, the scaled value, its norm, the reciprocal, the clamp's input and output, and in a
global layer the log scale of the positions (4·s); K is clipped the same way without the scale, V normed without a
weight. A local layer's K and V convolutions keep their fp32 input; a global layer's dynamic ones the unfolded windows
and the per-token weights, each 4·s·b·H_kv·d·K. The relative bias keeps what Inkling's does (r_proj's output, the
gather's input, index and mask); the scores get a sink logit a head and token, so the fp32 softmax is b·H·s·(s+1),
cast back without the sink (b·H·s²); K and V are repeated to the H heads (a view for one KV head of one sequence).
The output gate keeps its fp32 sigmoid and the attention output's fp32 copy, o_proj the gated product. Each of the
two branch convolutions keeps its fp32 input. The router keeps its fp32 input (for its weight), the sigmoid scores,
the top-k index, the k weights and their sum; the experts (transformers' grouped_mm on 3-D weights) the gathered
tokens, six fp32 tensors of the softcapped SwiGLU (the two tanh outputs, the gate's softcapped value, its sigmoid and
their product, the up's softcapped value), down's input (the SwiGLU's output, cast) and output, the gathered weights
(fp32), three int64 indices and the int32 offsets. Under gradient checkpointing the checkpoints hold, beside each
layer's input, the blocks' states and the relative distances (``checkpoint_kept``); a layer's backward peaks in its
widest block residual's fp32 norm (``block_residual_backward``).

The layers differ by the blocks they read: a layer of each kind is the average of its kind's layers
(``model.branch_convs.block_counts``), whose sum is exact. A frozen weight (LoRA) keeps nothing for its gradient:
the linear layers' inputs but where an adapter reads them, the norms' normalised values, the clips' fp32 copies for
their scales, the relative states for the table, the router's input, the experts' gathered tokens and down's input."""

from __future__ import annotations

from dataclasses import replace

from lmcalc.engine.memory.branch_convs import INDEX_BYTES, SharedSum
from lmcalc.engine.memory.inkling2_loop import (
    Variant,
    block_storages,
    freed_before_later_runs,
    gates_saved,
    last_later_run,
    message_counts,
    run_variants,
)
from lmcalc.engine.memory.norms import NORM
from lmcalc.engine.memory.saved import ROUTED, SavedTensor
from lmcalc.engine.memory.ssm import KINDS, AttentionKind, MixerKind, share
from lmcalc.engine.model.branch_convs import block_counts
from lmcalc.engine.workload import Workload

FP32 = 4
OFFSET_BYTES = 4  # int32: grouped_mm's offsets, one an expert
CLIP_SCALES = ("clip_scale",)  # the learned scales before Q's and the relative states' L2 clips
TABLE = ("relative_table",)  # the relative bias profiles (Inkling2RelativePositionBias.proj)
Q_READERS = ("q", "attn_gate", "sink_proj", "r_proj")  # the linear layers that read a global layer's Q input
LOCAL_READERS = (*Q_READERS, "k", "v")  # and a local layer's one input


def inkling2(w: Workload) -> bool:
    """Whether the model is Inkling 2's text model (branch convolutions, dynamic in the global layers)."""
    b = w.model.branch_convs
    return b is not None and b.dynamic_global


def fp32_norm_saved(w: Workload, label: str, copies: int = 1, block: str = "attention") -> list[SavedTensor]:
    """``copies`` Inkling2RMSNorms over s·b·h: each its fp32 input (or the fp32 tensor it reads), 1/rms and the fp32
    normalised value its weight multiplies."""
    sb, h, n = w.tokens, w.model.hidden_size, copies
    x = "" if n == 1 else f"{n}·"
    return [
        SavedTensor(f"{label} input (fp32)", f"{x}s·b·h", n * sb * h, FP32, split="seq", block=block),
        SavedTensor(f"{label} 1/rms (fp32)", f"{x}s·b", n * sb, FP32, split="seq", block=block),
        SavedTensor(f"{label} normalised value (fp32, before the weight)", f"{x}s·b·h", n * sb * h, FP32,
                    split="seq", block=block, for_weights=NORM),
    ]  # fmt: skip


def block_residual_saved(w: Workload, label: str, states: float, scores: float, block: str) -> list[SavedTensor]:
    """A block attention residual over ``states`` stacked states of s·b·h with ``scores`` = q·m query-state pairs a
    token (averages over a kind's layers): the fp32 stack, 1/rms, the normalised stack and the probabilities."""
    sb, h = w.tokens, w.model.hidden_size
    if not states or not scores:
        return []
    return [
        SavedTensor(f"{label}: stacked states (fp32, the norm's input)", "s·b·m·h", sb * states * h, FP32,
                    split="seq", block=block),
        SavedTensor(f"{label}: 1/rms (fp32)", "s·b·m", sb * states, FP32, split="seq", block=block),
        SavedTensor(f"{label}: normalised states (fp32, keys and values)", "s·b·m·h", sb * states * h, FP32,
                    split="seq", block=block),
        SavedTensor(f"{label}: probabilities (fp32)", "s·b·q·m", sb * scores, FP32, split="seq", block=block),
    ]  # fmt: skip


def _clip_saved(w: Workload, label: str, heads: int, width: int, scaled: bool, logged: bool) -> list[SavedTensor]:
    """An L2 clip of ``heads`` × ``width`` a token in fp32 (Inkling2ScaledL2Clip where ``scaled``, Inkling2L2Clip
    otherwise; Inkling2LogScaledL2Clip where ``logged``)."""
    sb, s, n = w.tokens, w.seq_len, heads * width
    tensors = []
    if scaled:
        if w.precision.activation_bytes != FP32:  # the scale's fp32 copy, for the input's gradient
            tensors.append(SavedTensor(f"{label} scale (fp32 copy)", "H·d", n, FP32, split="none"))
        tensors.append(SavedTensor(f"{label} input (fp32, for the scale's gradient)", "s·b·H·d", sb * n, FP32,
                                   for_weights=CLIP_SCALES))  # fmt: skip
    tensors += [
        SavedTensor(f"{label} {'scaled ' if scaled else ''}value (fp32)", "s·b·H·d", sb * n, FP32),
        SavedTensor(f"{label} norm, reciprocal, clamp input and output (fp32)", "4·s·b·H", 4 * sb * heads, FP32),
    ]
    if logged:  # the log scale of the positions, (1, s): one row over the micro-batch
        tensors.append(SavedTensor(f"{label} log scale of the positions (fp32)", "s", s, FP32, split="none"))
    return tensors


def _attention_saved(
    w: Workload, kind: AttentionKind, states: float, scores: float, variant: Variant = "plain"
) -> list[SavedTensor]:
    """A layer's attention half: the block residual, the norms, Q's, K's and V's projections, clips and
    convolutions, the relative bias, the eager scores with the sink, the gate and the attention-output convolution.
    A looped local layer (``variant``, ``engine.memory.inkling2_loop``) casts Q's, K's and V's inputs apart, and in a
    later pass norms three gated inputs."""
    spec, act, s, b, sb = w.model, w.precision.activation_bytes, w.seq_len, w.micro_batch, w.tokens
    h = spec.hidden_size
    branch = spec.branch_convs
    assert branch is not None
    local = kind == "local"
    H, d, dr, K = spec.num_heads, spec.head_size, branch.relative_width, branch.kernel
    kv = spec.local_kv_heads if local and spec.local_kv_heads else spec.kv_heads
    extent = (spec.sliding_window or branch.extent) if local else branch.extent
    tensors = block_residual_saved(w, "attention's block residual", states, scores, "attention")
    if local and variant != "plain" and (variant == "later" or act != FP32):  # three casts (or norms)
        later = variant == "later"
        label = "Q, K and V input norms (gated inputs)" if later else "attention norm"
        tensors += fp32_norm_saved(w, label, 3 if later else 1)
        tensors += [
            SavedTensor("Q input (the norm's output, cast)", "s·b·h", sb * h, act, split="seq", for_weights=Q_READERS),
            SavedTensor("K input (the norm's output, cast)", "s·b·h", sb * h, act, split="seq", for_weights=("k",)),
            SavedTensor("V input (the norm's output, cast)", "s·b·h", sb * h, act, split="seq", for_weights=("v",)),
        ]
    elif local:
        tensors += fp32_norm_saved(w, "attention norm")
        tensors.append(SavedTensor("Q, K, V, gate, sink and r_proj input (attention norm output)", "s·b·h", sb * h,
                                   act, split="seq", for_weights=LOCAL_READERS))  # fmt: skip
    else:
        tensors += fp32_norm_saved(w, "Q, K and V input norms", 3)
        tensors += [
            SavedTensor("Q input norm output (Q, gate, sink, r_proj input)", "s·b·h", sb * h, act, split="seq",
                        for_weights=Q_READERS),
            SavedTensor("K input norm output (K and its convolution weights' input)", "s·b·h", sb * h, act,
                        split="seq", for_weights=("k", "k_conv_weights")),
            SavedTensor("V input norm output (V and its convolution weights' input)", "s·b·h", sb * h, act,
                        split="seq", for_weights=("v", "v_conv_weights")),
        ]  # fmt: skip
    tensors += _clip_saved(w, "Q clip", H, d, True, not local)
    for x in ("K", "V"):
        if local:
            tensors.append(SavedTensor(f"{x} convolution input (fp32 copy)", "s·b·H_kv·d", sb * kv * d, FP32,
                                       most_tp_ranks=kv))  # fmt: skip
        else:
            tensors.append(SavedTensor(f"{x} dynamic convolution: windows and per-token weights (fp32)",
                                       "2·s·b·H_kv·d·K", 2 * sb * kv * d * K, FP32, most_tp_ranks=kv))  # fmt: skip
    tensors += _clip_saved(w, "K clip", kv, d, False, False)
    tensors += [
        SavedTensor("V norm input (fp32 copy)", "s·b·H_kv·d", sb * kv * d, FP32, most_tp_ranks=kv),
        SavedTensor("V norm 1/rms (fp32)", "s·b·H_kv", sb * kv, FP32, most_tp_ranks=kv),
    ]
    tensors += _clip_saved(w, "relative-state clip", H, dr, True, not local)
    tensors.append(SavedTensor("relative states (for the table's gradient)", "s·b·H·d_rel", sb * H * dr, act,
                               for_weights=TABLE))  # fmt: skip
    if w.attention == "eager":
        tensors += [
            SavedTensor("relative logits (the gather's input)", "b·H·s·E", b * H * s * extent, act, True),
            SavedTensor("relative distances (the gather's int64 index)", "s²", s * s, INDEX_BYTES, split="none"),
            SavedTensor("relative bias mask (masked_fill)", "s²", s * s, 1, split="none"),
        ]
    repeated = H if kv < H and not (kv == 1 and b == 1) else kv  # repeat_kv: a view for one head of one sequence
    symbol = "s·b·H·d" if repeated == H else "s·b·H_kv·d"
    tensors += [
        SavedTensor("Q (clipped)", "s·b·H·d", sb * H * d, act),
        SavedTensor("K (clipped, repeated to the heads)", symbol, sb * repeated * d, act),
        SavedTensor("V (normed, repeated to the heads)", symbol, sb * repeated * d, act),
    ]
    if w.attention == "eager":
        tensors.append(SavedTensor("softmax output with the sink (fp32)", "b·H·s·(s+1)", b * H * s * (s + 1), FP32,
                                   True, split="tp"))  # fmt: skip
        if act != FP32:  # cast without the sink; in fp32 the slice is a view of the softmax's output
            tensors.append(SavedTensor("attention probabilities (cast, without the sink)", "b·H·s²", b * H * s * s,
                                       act, True))  # fmt: skip
    else:
        tensors.append(SavedTensor("log-sum-exp per row (fp32)", "b·H·s", b * H * s, FP32, True))
    return tensors + [
        SavedTensor("output gate, sigmoid output (fp32)", "s·b·H·d", sb * H * d, FP32),
        SavedTensor("attention output (fp32 copy, for the gate's product)", "s·b·H·d", sb * H * d, FP32),
        SavedTensor("output projection input (the gated product)", "s·b·H·d", sb * H * d, act, for_weights=("o",)),
        SavedTensor("attention-output convolution input (fp32 copy)", "s·b·h", sb * h, FP32, split="seq"),
    ]


def _mlp_saved(w: Workload, states: float) -> list[SavedTensor]:
    """A layer's MLP half: the block residual, the norm, the fp32 router, the grouped experts' softcapped SwiGLU
    and the MLP-output convolution."""
    spec, act, sb, h = w.model, w.precision.activation_bytes, w.tokens, w.model.hidden_size
    moe = spec.moe
    assert moe is not None
    k, f, E = moe.k, moe.expert_ffn_size, moe.num_experts
    kT = k * sb
    tensors = block_residual_saved(w, "MLP's block residual", states, states, "mlp")
    tensors += fp32_norm_saved(w, "MLP norm", block="mlp")
    tensors += [
        SavedTensor("router input (fp32)", "s·b·h", sb * h, FP32, split="seq", for_weights=("router",)),
        SavedTensor("router scores (sigmoid, fp32)", "s·b·E", sb * E, FP32, split="seq"),
        SavedTensor("top-k index (int64)", "s·b·k", kT, INDEX_BYTES, split="seq"),
        SavedTensor("top-k weights and their sum (fp32)", "s·b·(k+1)", sb * (k + 1), FP32, split="seq"),
        SavedTensor("tokens gathered for their experts", "k·s·b·h", kT * h, act, split="seq",
                    for_weights=(f"{ROUTED}gate",)),
        SavedTensor("softcapped SwiGLU: two tanh outputs, the capped gate, its sigmoid, their product and the "
                    "capped up (fp32)", "6·k·s·b·f_e", 6 * kT * f, FP32, split="seq"),
    ]  # fmt: skip
    tensors += [
        SavedTensor(
            "down input (the SwiGLU's output, cast)",
            "k·s·b·f_e",
            kT * f,
            act,
            split="seq",
            for_weights=(f"{ROUTED}down",),
        ),
        SavedTensor("down output (for the routing weights' gradient)", "k·s·b·h", kT * h, act, split="seq"),
        SavedTensor("routing weights, gathered (fp32)", "k·s·b", kT, FP32, split="seq"),
        SavedTensor("the experts' token indices (three int64)", "3·k·s·b", 3 * kT, INDEX_BYTES, split="seq"),
        SavedTensor("grouped_mm offsets (int32)", "E", E, OFFSET_BYTES, split="none"),
        SavedTensor("MLP-output convolution input (fp32 copy)", "s·b·h", sb * h, FP32, split="seq"),
    ]
    return [replace(t, block="mlp") for t in tensors]


def _variant_saved(
    w: Workload, kind: AttentionKind, counts: list[tuple[int, int, int]], variant: Variant
) -> list[SavedTensor]:
    """A layer of ``kind`` and ``variant`` (``inkling2_loop.run_variants``): the average of those ``counts``."""
    n = len(counts)
    attention_states = sum(m for q, m, _ in counts if q) / n
    attention_scores = sum(q * m for q, m, _ in counts) / n
    mlp_states = sum(m for _, _, m in counts) / n
    kept = _attention_saved(w, kind, attention_states, attention_scores, variant) + _mlp_saved(w, mlp_states)
    return kept + (gates_saved(w, kind) if variant == "later" else [])


def _kind_saved(w: Workload, kind: AttentionKind, largest: bool = False) -> list[SavedTensor]:
    """A layer of ``kind``: the average of the kind's layers, whose block residuals read different counts of
    states, and of a looped model's, whose runs differ by pass (``inkling2_loop.run_variants``); with ``largest``, a
    looped model's largest variant (the layer as the backward rebuilds it: a later pass's)."""
    spec = w.model
    runs = [(c, v) for i, (c, v) in enumerate(zip(block_counts(spec), run_variants(spec), strict=True))
            if spec.is_local_layer(i) == (kind == "local")]  # fmt: skip
    if not runs:
        return _variant_saved(w, kind, [(0, 0, 0)], "plain")
    variants = {v: [c for c, of in runs if of == v] for _, v in runs}
    kept = {v: _variant_saved(w, kind, counts, v) for v, counts in variants.items()}
    if len(kept) == 1:
        return next(iter(kept.values()))
    if largest:
        return max(kept.values(), key=lambda tensors: sum(t.bytes for t in tensors))
    return [share(t, len(variants[v]), len(runs)) for v, tensors in kept.items() for t in tensors]


def inkling2_layer_saved(w: Workload, mixer: MixerKind) -> list[SavedTensor]:
    """What an Inkling 2 layer keeps for backward: one of ``mixer``'s kind (global or local; a looped model's largest
    run of it), or the average of all."""
    spec = w.model
    if mixer in KINDS:
        return _kind_saved(w, "local" if mixer.startswith("local") else "global", largest=True)
    local = sum(spec.is_local_layer(i) for i in range(spec.num_layers))
    kinds: tuple[tuple[AttentionKind, int], ...] = (("global", spec.num_layers - local), ("local", local))
    return [share(t, n, spec.num_layers) for kind, n in kinds if n for t in _kind_saved(w, kind)]


def _final_states(w: Workload) -> int:
    """The states the final block residual reads: every block and the last layer's output (a looped model's blocks
    are its held layers', each later pass restarting from the blocks before its section)."""
    branch, reuse = w.model.branch_convs, w.model.layer_reuse
    assert branch is not None and branch.block_residual
    return -(-(reuse.held if reuse else w.model.num_layers) // branch.block_residual) + 1


def final_residual_saved(w: Workload) -> list[SavedTensor]:
    """The block attention residual before the final norm: one query over every block and the last layer's output."""
    states = _final_states(w)
    return block_residual_saved(w, "final block residual", states, states, "head")


def message_residual_saved(w: Workload) -> list[SavedTensor]:
    """Inkling 2's looped model's message residuals (Inkling2LoopMessageAttentionResidual), one before each run of a
    later pass, outside the layers: four queries over the previous pass's m_msg states (``message_states``), and the
    four messages each makes (fp32, 4·s·b·h), which the gates or the checkpoints keep."""
    later, states = message_counts(w.model)
    if not later:
        return []
    sb, h = w.tokens, w.model.hidden_size
    return [
        *block_residual_saved(w, f"message residuals ({later} later runs)", later * states, later * 4 * states, "head"),
        SavedTensor(f"messages ({later} later runs, fp32)", "n·s·b·4·h", later * 4 * sb * h, FP32, split="seq",
                    block="head"),
    ]  # fmt: skip


def messages_held(w: Workload) -> float:
    """What the layers' backward holds of the head side in Inkling 2's looped model: the message residuals' tensors
    and messages (``message_residual_saved``), made outside the layers and freed only by each later run's own
    backward, so all alive when the backward reaches the last later run (``last_later_run``); under full
    recomputation less what the checkpoints have freed by then (``freed_before_later_runs``: the inputs of the layers
    after the section and the stacks of blocks only they read). 0 for any other model."""
    held = sum(t.bytes for t in message_residual_saved(w))
    if held and w.recompute == "full":
        held -= freed_before_later_runs(w.model) * w.precision.activation_bytes * w.tokens * w.model.hidden_size
    return held


def checkpoint_kept(w: Workload) -> list[SavedTensor]:
    """What gradient checkpointing keeps of Inkling 2's layers' arguments beyond their inputs until the rebuilt layers
    have run: the blocks' states each layer reads (one storage a count of blocks, m·s·b·h in the activation dtype,
    shared by the layers that read it), and the relative distances of each kind of layer (int64, s × s)."""
    spec = w.model
    if not inkling2(w) or w.recompute != "full":
        return []
    act, sb, h, s = w.precision.activation_bytes, w.tokens, spec.hidden_size, w.seq_len
    local = sum(spec.is_local_layer(i) for i in range(spec.num_layers))
    kinds = (local > 0) + (local < spec.num_layers)
    return [
        SavedTensor("the blocks' states the checkpoints hold", "Σm·s·b·h", block_storages(spec) * sb * h, act,
                    split="seq"),
        SavedTensor("relative distances a kind of layer (int64, the checkpoints')", "s²", kinds * s * s,
                    INDEX_BYTES, split="none"),
    ]  # fmt: skip


RESIDUAL_NORM_BACKWARD = 5  # fp32 tensors of the stack alive at once in the unweighted norm's backward, op by op


def block_residual_backward(w: Workload) -> float:
    """Bytes a layer's backward holds at once in its widest block residual's unweighted RMSNorm, written op by op in
    fp32: five tensors of the stack (m·s·b·h), read from the storages live at the step's peak with
    scripts/hf_step_peak.py on the CPU (inkling2-wide); 0 for any other model, and under full recomputation, where
    the rebuilt layer's share of that moment is not modelled (the checkpointed wide peaks, 4 % to 6 % under)."""
    if not inkling2(w) or w.recompute == "full":
        return 0.0
    widest = max(max(m if q else 0, m_mlp) for q, m, m_mlp in block_counts(w.model))
    return RESIDUAL_NORM_BACKWARD * FP32 * widest * w.tokens * w.model.hidden_size


def rebuilt_combine_peak(w: Workload, layer: tuple[SavedTensor, ...]) -> SharedSum | None:
    """Where the rebuilt top layer (``layer``, its saved tensors) peaks in its forward under full recomputation (as
    ``branch_convs.SharedSum``: bytes beyond what it keeps, the share of its saved bytes made by then, the gradients
    alive). The rebuild starts inside the backward of the layer's last op, the MLP-output convolution, which by then
    holds two fp32 copies of the output's gradient and the fp32 gradient padded to the convolution's s + K − 1
    outputs, beside the gradient of the final block residual's stack (m_f·s·b·h in the activation dtype, of which the
    layer's output gradient is a view). The forward then peaks where the experts (grouped_mm) weigh their outputs in
    fp32 and put them back in the tokens' order (2 × 4·k·s·b·h), everything the layer keeps made but the MLP-output
    convolution's input, and alive beside it what the code holds in variables: the router's logits (4·s·b·E), the
    scaled weights and the sorted expert ids with their fp32 copy for histc (4 + 8 + 4 bytes a pair), the MoE's input
    (the norm's output, cast), the fp32 residual the layer adds back at its end, and where the layer opens a block
    its blocks' states with its input (m − 1 of the MLP's m). Read from the storages live at the step's peak with
    scripts/hf_step_peak.py on the CPU (inkling2-wide, checkpointed). In a looped model (``inkling2_loop``) the run
    is the last later run, rebuilt with every message residual alive (``messages_held``): the stack gradient alive
    beside it is that of the blocks it reads (m_a − 1 states, d_a), which the layer after it reads too
    (inkling2-loop-small, checkpointed: its layer 3's second run). None for any other model or step."""
    spec = w.model
    if not inkling2(w) or w.recompute != "full" or spec.moe is None:
        return None
    act, sb, h, s, b = w.precision.activation_bytes, w.tokens, spec.hidden_size, w.seq_len, w.micro_batch
    kT, E = spec.moe.k * sb, spec.moe.num_experts
    branch = spec.branch_convs
    assert branch is not None and branch.block_residual
    top = spec.num_layers - 1
    run = later if (later := last_later_run(spec)) is not None else top
    held = spec.layer_reuse.weights[run] if spec.layer_reuse else run  # the held layer it runs
    _, states, mlp_states = block_counts(spec)[run]
    opened = mlp_states - 1 if held % branch.block_residual == 0 else 0
    combine = 2 * FP32 * kT * h  # the weighted outputs, and their copy in the tokens' order
    variables = FP32 * sb * E + (FP32 + INDEX_BYTES + FP32) * kT + act * sb * h + FP32 * sb * h + act * opened * sb * h
    after = sum(t.bytes for t in layer if t.label.startswith("MLP-output convolution"))
    stack = _final_states(w) if run == top else states - 1  # the stack whose gradient holds the output's
    gradients = act * stack * sb * h + 2 * FP32 * sb * h + FP32 * b * h * (s + branch.kernel - 1)
    return SharedSum(combine + variables, 1 - after / sum(t.bytes for t in layer), gradients)
