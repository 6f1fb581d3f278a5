"""A micro-batch of a pipeline stage as one GPU sees it (its tokens and heads under TP, CP, EP and expert TP), and
the bytes its memory-bound kernels move: norms, residual adds, rotary embeddings, a hybrid's Mamba-2 or Gated
DeltaNet kernels around its scan, layout copies, the MLP activation, MoE permutation, the loss over the logits and
the embedding's gradient (docs/formulas.md §8.5).

Byte counts of an element-wise kernel: it reads each input and writes each output once. A fused kernel does the
whole operation in one pass; an unfused PyTorch form pays one pass per operation (an upcast, a square, a mean,
a multiply, a downcast...). The backward pass of an element-wise operation reads the saved input and the
output's gradient and writes the input's gradient. Which are fused is the framework profile's
(``framework_specs.NormRule``, ``MlpRule``, ``RotaryRule``, ``AttentionRule``, ``LossRule``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from lmcalc.engine.model_code import gelu_ops_kept, norm_keeps
from lmcalc.engine.parallel.layout import Grid
from lmcalc.engine.parallel.pipeline import StageLayers
from lmcalc.engine.workload import Workload
from lmcalc.specs import ModelSpec

CLAMP_FORWARD = 8
"""Passes over a clamped SwiGLU's inner width (in its dtype) that the clamps add forward: Megatron-Core's
``weighted_bias_quick_geglu_impl`` clamps the gate and the up halves and concatenates them before its fused kernel
(read 1 write 1 each, then read 2 write 2: megatron/core/fusions/fused_bias_geglu.py); Hugging Face's
``GptOssExperts`` clamps both and makes α·g and up + 1 op by op (the same 8)."""
CLAMP_BACKWARD = 10
"""And backward: each clamp's gradient reads its input and the incoming gradient and writes its own (3 + 3), and the
two halves' gradients are concatenated (read 2 write 2)."""
COMBINE_FP32_FORWARD = 8
"""Bytes an element of the experts' fp32 outputs that an fp32 combine's product with the routing weights moves forward
(``_moe_permute_traffic``): it reads the output and writes the product, 4 bytes each."""
COMBINE_FP32_BACKWARD = 24
"""And backward: the outputs' gradient, the incoming gradient times the weights (read 4, write 4); the weights', the
incoming gradient times the saved outputs (read 4 + 4, write 4), summed over h (read 4)."""


@dataclass(frozen=True)
class StageShape:
    """One micro-batch of a stage as one GPU sees it, with TP, CP and EP (``grid``) splitting it: the sizes its
    kernels are counted in."""

    w: Workload
    grid: Grid
    built: StageLayers
    tokens: float  # through each GEMM of the TP group
    hidden_tokens: float  # element-wise work on h
    expert_tokens: float  # through the routed experts of the expert TP group (ETP), before routing's k copies
    heads: float
    kv_heads: float  # whole KV heads after the gather

    @property
    def act_bytes(self) -> float:
        return self.w.precision.activation_bytes


def stage_shape(w: Workload, grid: Grid, built: StageLayers) -> StageShape:
    """The tokens and heads one GPU of the stage works on: CP splits the sequence, TP the heads (and, with sequence
    parallelism, the tokens of the element-wise work on h)."""
    tp, cp, sequence_parallel = grid.tp, grid.cp, grid.sequence_parallel
    model = w.model
    tokens = w.micro_batch * w.seq_len / cp  # through each GEMM of the TP group
    hidden_tokens = tokens / tp if sequence_parallel and tp > 1 else tokens  # element-wise work on h
    # the expert TP group gathers its GPUs' tokens (without SP, TP's share theirs and ETP is TP: check_expert_grid)
    expert_tokens = tokens if tp > 1 and not sequence_parallel else hidden_tokens * grid.etp
    heads = model.num_heads / tp
    kv_heads = max(1.0, (model.num_heads if model.mla else model.mean_kv_heads) / tp)  # whole KV heads after the gather
    return StageShape(w, grid, built, tokens, hidden_tokens, expert_tokens, heads, kv_heads)


@dataclass
class MemoryTraffic:
    """The memory-bound kernels' bytes, forward and backward, and the kernels launched, added kernel by kernel in
    the order a stage runs them (the order of the sums is kept: figures are compared to the last bit)."""

    forward: float = 0.0
    backward: float = 0.0
    kernels: float = 0.0

    def add(self, forward: float, backward: float, kernels: float) -> None:
        self.forward += forward
        self.backward += backward
        self.kernels += kernels

    def launch(self, kernels: float) -> None:
        """Kernels that move bytes counted elsewhere (gradient accumulation, fp8 casts)."""
        self.kernels += kernels


def memory_bound_traffic(s: StageShape, traffic: MemoryTraffic) -> None:
    """The memory-bound kernels of the layers, then of the head and of the embedding, in that order."""
    _norm_traffic(s, traffic)
    _residual_traffic(s, traffic)
    _rotary_traffic(s, traffic)
    _mixer_traffic(s, traffic)
    _layout_copy_traffic(s, traffic)
    _mlp_activation_traffic(s, traffic)
    _expert_bias_traffic(s, traffic)
    _moe_permute_traffic(s, traffic)
    _router_traffic(s, traffic)
    _loss_traffic(s, traffic)
    _embedding_traffic(s, traffic)
    _mtp_traffic(s, traffic)


def _norm_traffic(s: StageShape, traffic: MemoryTraffic) -> None:
    """Norms: one to four per layer on h, and BitNet's two sub-norms; any fp32 form (activations.norm_keeps:
    Hugging Face's RMSNorm, Cohere's centred LayerNorm) is PyTorch's element-wise kernels one after another, timed
    as the upcasting RMSNorm's."""
    e, layers = s.act_bytes, s.built.layers
    unfused_norm = norm_keeps(s.w) != "input"
    norm_forward = 28 + 4 * e if unfused_norm else 2 * e
    model = s.w.model
    norms = _sites_per_layer(model) if model.norms_per_layer == 2 else float(model.norms_per_layer)
    norm_elements = norms * layers * s.hidden_tokens * model.hidden_size
    if model.sub_norms:  # BitNet's: on this GPU's heads of the attention output and its share of the gated product
        norms += 2
        norm_elements += layers * s.tokens * (s.heads * model.v_head_dim + model.ffn_size / s.grid.tp)
    traffic.add(
        norm_forward * norm_elements,
        (2 * norm_forward if unfused_norm else 3 * e) * norm_elements,
        norms * layers * ((6 + 10) if unfused_norm else 2),
    )


def _sites_per_layer(model: ModelSpec) -> float:
    """Norm and residual sites a layer: one before each token mixer and each FFN, 2 a layer, but 1 in a layer that is
    a mixer or an FFN alone (Nemotron-H's blocks, a Mamba model's layers): (L_mixer + L_ffn) / L of the stage's
    layers."""
    return (model.mixer_layers + model.ffn_layers) / model.num_layers


def _residual_traffic(s: StageShape, traffic: MemoryTraffic) -> None:
    """Residual adds (and dropout on both branches), one after each mixer and each FFN; with hyper-connections, the
    streams' kernels in their place (``_stream_traffic``)."""
    if s.w.model.hyper_connections:
        _stream_traffic(s, traffic)
        return
    e, sites = s.act_bytes, _sites_per_layer(s.w.model) * s.built.layers
    residual_elements = sites * s.hidden_tokens * s.w.model.hidden_size
    traffic.add(3 * e * residual_elements, 3 * e * residual_elements, 2 * sites)
    if s.w.model.drops("residual"):
        traffic.add((2 * e + 1) * residual_elements, (2 * e + 1) * residual_elements, 2 * sites)


class StreamPasses(NamedTuple):
    """One sub-layer's hyper-connection kernels a token, forward: over the n streams' N = n·h values, ``streams``
    passes in the activation dtype (ε bytes each) and ``streams_fp32`` bytes of fp32 passes (4 each); over the h
    values of the sub-layer's input and output, ``width`` and ``width_fp32`` alike; the kernels launched forward and
    backward; and the backward's bytes, a multiple of the forward's (``backward``) where they are not counted apart,
    else its own passes in the activation dtype (``backward_streams``, ``backward_width``)."""

    streams: float
    streams_fp32: float
    width: float
    width_fp32: float
    kernels_forward: float
    kernels_backward: float
    backward: float = 0.0
    backward_streams: float = 0.0
    backward_width: float = 0.0

    def bytes(self, e: float, streams: float, width: float) -> tuple[float, float]:
        """(forward, backward) bytes over ``streams`` stream values and ``width`` values of the sub-layers' input and
        output, in an activation dtype of ``e`` bytes."""
        forward = (self.streams * e + self.streams_fp32) * streams + (self.width * e + self.width_fp32) * width
        return forward, self.backward * forward + (self.backward_streams * streams + self.backward_width * width) * e


MHC_FUSED = StreamPasses(3, 0, 2, 0, 3, 4, backward_streams=9, backward_width=3)
"""Megatron-Core's fused mHC (megatron/core/fusions/fused_mhc_kernels.py at cae55c1f09; its Triton and cuTile
kernels, transformer_layer.py's ``fused_h_res_h_post_bda``), a sub-layer: forward, ``h_aggregate`` reads the streams
and writes the collapse (R N, W h) and ``h_post_bda`` reads the streams and the sub-layer's output and writes the new
streams (R N + h, W N), with the Sinkhorn kernel on n × n; backward, ``h_post_bda``'s reads the gradient, the streams
and the output and writes both inputs' gradients (R 2N + h, W N + h), ``h_aggregate``'s reads the collapse's gradient
and the streams and writes theirs (R h + N, W N), and ``fused_add_3`` adds the streams' three gradients (R 3N, W N),
with Sinkhorn's backward. The projection ``fused_proj_rms_compute_h`` reads the streams as the projection's GEMM
(timed as one, ``kernels``), its backward's gradient as that GEMM's."""
MHC_EAGER = StreamPasses(8, 32, 2, 8, 144, 288, backward=2.0)
"""transformers' ``DeepseekV4HyperConnection`` and its decoder layer, a sub-layer, forward: the streams cast to fp32
(R N, W 4N), the unweighted RMSNorm's square, mean and product (R 12N, W 8N), the collapse's product with the pre
weights in fp32 (R N, W 4N), its sum over the streams (R 4N, W 4h) and cast back (R 4h, W h), then the post weights
times the sub-layer's output (R h, W N), the mixing matmul (R N, W N) and the add (R 2N, W N); 144 kernels, the
Sinkhorn normalisation's 117 among them (39 passes of a sum, an add and a division: the columns, then 19 iterations of
rows and columns, ``hc_sinkhorn_iters`` 20). The backward,
an autograd chain of element-wise kernels, counted as twice the forward (as an unfused norm's, ``_norm_traffic``).
Not counted: the n- and n²-wide tensors' bytes, a thousandth of the streams' at n = 4, h = 4,096."""
IHC_EAGER = StreamPasses(4, 48, 2, 16, 23, 46, backward=2.0)
"""transformers' ``HYV4HyperConnection`` (in fp32, autocast off) and ``HYV4DecoderLayer``'s spread, a sub-layer,
forward: the streams cast to fp32 (R N, W 4N), the norm's square and mean (R 8N, W 4N), the collapse's product in
fp32 (R N, W 4N), its sum (R 4N, W 4h) and cast (R 4h, W h), then the sub-layer's output cast to fp32 (R h, W 4h),
times the post weights (R 4h, W 4N), the residual cast to fp32 (R N, W 4N), the add (R 8N, W 4N) and the cast back
(R 4N, W N); 23 kernels. The backward as ``MHC_EAGER``'s."""


MTP_COLLAPSE = StreamPasses(1, 28, 1, 8, 13, 26, backward=2.0)
"""An MTP module's collapse of its n streams before its final norm (Megatron-Core's ``learned_output_contract`` at
cae55c1f09, in fp32 op by op), forward: the streams cast to fp32 (R N, W 4N), squared (R 4N, W 4N) and averaged
(R 4N), the weights times the streams (R 4N, W 4N), summed (R 4N, W 4h) and cast back (R 4h, W h); 13 kernels beside
its GEMM (the cast, the square, the mean, the ε, rsqrt, the product with 1/rms, the scale, the bias, sigmoid, the ε,
the product, the sum, the cast back). The backward as ``MHC_EAGER``'s."""


def _stream_traffic(s: StageShape, traffic: MemoryTraffic) -> None:
    """Hyper-connections (DeepSeek-V4's mHC, HY V4's iHC): the kernels that collapse the n streams into each
    sub-layer's input, spread its output back and mix or add the residual streams, two sub-layers a layer, in place of
    the residual adds (docs/formulas.md §8.5)."""
    hc, e = s.w.model.hyper_connections, s.act_bytes
    assert hc is not None
    fused = hc.mixing and s.w.framework.attention.compressed_kernels == "fused"
    passes = MHC_FUSED if fused else MHC_EAGER if hc.mixing else IHC_EAGER
    sublayers = 2 * s.built.layers
    streams = sublayers * s.hidden_tokens * hc.streams * s.w.model.hidden_size  # N values, every sub-layer's
    width = sublayers * s.hidden_tokens * s.w.model.hidden_size
    traffic.add(*passes.bytes(e, streams, width), sublayers * (passes.kernels_forward + passes.kernels_backward))


def _attention_layers(s: StageShape) -> float:
    """The stage's layers that attend (a hybrid's share of them, a shared block's uses among them: the attention
    kernel's calls, ``kernels._attention_work``)."""
    model = s.w.model
    return s.built.layers * model.attention_uses / model.num_layers


def _rotary_traffic(s: StageShape, traffic: MemoryTraffic) -> None:
    """Rotary embeddings on Q and K, in the layers that attend."""
    model, e, layers = s.w.model, s.act_bytes, _attention_layers(s)
    if not (model.position_embedding == "rope" or model.mla):
        return
    tables = s.w.framework.rotary.tables
    rope_dim = model.mla.qk_rope_head_dim if model.mla else model.head_size
    rope_elements = s.tokens * (s.heads + (s.heads if model.mla else s.kv_heads)) * rope_dim * layers
    per = 9 * e if tables else 2 * e
    traffic.add(per * rope_elements, per * rope_elements, layers * (2 * 11 if tables else 4))


def _mixer_traffic(s: StageShape, traffic: MemoryTraffic) -> None:
    """A hybrid's Mamba-2 or Gated DeltaNet layers: the memory-bound kernels around the chunked scan (which is timed
    apart, ``rates.SCAN_FRACTION``), as Megatron-Core's training paths run them (docs/formulas.md §8.21.1), in element
    passes a token over this GPU's share of the channels.

    Mamba-2 (``MambaMixer._ssm_training``): mamba_ssm's ``mamba_split_conv1d_scan_combined`` convolves x‖B‖C (C
    channels) with its SiLU into a tensor the scan reads, R C + W C, and gates the scan's output by z inside the
    scan; the backward runs the convolution again (R C + W C) and then its own backward (R 2C + W C). The RMSNorm
    over the inner width I: R I + W I forward, R 2I + W I backward. Beyond one sequence a micro-batch, the mixer lays
    the input projection's output (P = 2I + 2GN + H) out batch-first and the scan's output back sequence-first with
    copies, R + W of each, forward and backward alike.

    Gated DeltaNet (``GatedDeltaNet.forward``): the convolution over q‖k‖v with its SiLU (R C + W C; backward R 2C +
    W C), the compiled preparation that L2-normalises q and k and lays q, k and v out for the kernel (R C + W C;
    backward R 2C + W C) and the gated output norm over the value width D (R 2D + W D; backward R 3D + W 2D); beyond
    one sequence a micro-batch, the copy of the norm's output back to sequence-first (R D + W D, both ways)."""
    model = s.w.model
    layers = s.built.layers * model.other_mixer_share
    mamba, delta = model.mamba2, model.deltanet
    if not layers or not (mamba or delta):
        return
    tp = s.grid.tp
    if mamba:
        conv, norm = mamba.conv_channels / tp, (mamba.inner / tp if mamba.gated_norm else 0.0)
        forward, backward = 2 * conv + 2 * norm, 5 * conv + 3 * norm
        kernels = 5 if mamba.gated_norm else 3
        if s.w.micro_batch > 1:
            projected = (2 * mamba.inner + 2 * mamba.groups * mamba.state + mamba.heads) / tp
            copies = 2 * projected + 2 * mamba.inner / tp
            forward, backward, kernels = forward + copies, backward + copies, kernels + 4
    else:
        assert delta is not None
        conv, out = delta.conv_channels / tp, delta.value_heads * delta.value_head_dim / tp
        forward, backward, kernels = 4 * conv + 3 * out, 6 * conv + 5 * out, 6
        if s.w.micro_batch > 1:
            forward, backward, kernels = forward + 2 * out, backward + 2 * out, kernels + 2
    elements = layers * s.tokens
    traffic.add(s.act_bytes * forward * elements, s.act_bytes * backward * elements, kernels * layers)


def _layout_copy_traffic(s: StageShape, traffic: MemoryTraffic) -> None:
    """Copies of Q, K and V the framework makes to lay them out for the kernel, in the layers that attend."""
    e, layers, rule = s.act_bytes, _attention_layers(s), s.w.framework.attention
    copy_elements = (
        s.tokens
        * s.w.model.head_size
        * layers
        * (s.heads * (rule.q_copies - 1) + s.kv_heads * (rule.k_copies - 1 + rule.v_copies - 1))
    )
    traffic.add(
        2 * e * copy_elements, 2 * e * copy_elements, 2 * layers * (rule.q_copies + rule.k_copies + rule.v_copies - 3)
    )


def _mlp_activation_traffic(s: StageShape, traffic: MemoryTraffic) -> None:
    """The MLP activation, per element of its inner width on this GPU; a clamped SwiGLU's clamps before it; and, under
    Megatron-Core's ``moe_act`` recomputation, the routed experts' activation run again in the backward pass."""
    model, built, e = s.w.model, s.built, s.act_bytes
    tp, moe = s.grid.tp, model.moe
    non_moe = model.num_layers - model.moe_layers  # of them, those with a dense FFN (not a mixer alone)
    dense_layers = built.dense * model.dense_ffn_layers / non_moe if non_moe else 0.0
    dense_width = dense_layers * s.tokens * model.ffn_size / tp
    routed = shared = 0.0
    if moe and built.moe:  # the routed experts' rows on this GPU: its expert TP group's k·ρ copies, split by ETP
        routed = built.moe * s.expert_tokens * moe.expert_ffn_size * s.w.routed_copies / s.grid.etp
        shared = built.moe * s.tokens * moe.shared_width * moe.shared_experts / tp
    width = dense_width + routed + shared
    if model.ffn_kind == "gelu_mlp":
        fused = not gelu_ops_kept(s.w)  # one kernel, or the model's GELU written op by op (engine.model_code)
        forward, backward, kernels = (2 * e, 3 * e, 2) if fused else (20 * e, 30 * e, 20)
    else:
        fused = s.w.framework.mlp.gated == "fused"
        forward, backward, kernels = (3 * e, 5 * e, 2) if fused else (5 * e, 9 * e, 5)
    if model.swiglu_limit:  # gpt-oss: two clamps and a concatenation (or α·g and up + 1), read 2 write 2 a width
        forward, backward, kernels = forward + CLAMP_FORWARD * e, backward + CLAMP_BACKWARD * e, kernels + 6
    traffic.add(forward * width, backward * width, (dense_layers + built.moe) * kernels)
    if routed and "moe_act" in s.w.recompute_modules and s.w.recompute == "selective":
        traffic.add(0.0, forward * routed, built.moe * kernels / 2)  # CheckpointWithoutOutput runs it again


def _expert_bias_traffic(s: StageShape, traffic: MemoryTraffic) -> None:
    """The routed experts' output bias where the model has one (gpt-oss): Megatron-Core adds it expert by expert,
    t + b·p on each local expert's rows, then concatenates them (6 passes over the rows' h-wide outputs forward; the
    bias's and the routing weights' gradients, two products and two sums, 6 backward)."""
    model, built = s.w.model, s.built
    if not (model.moe and model.mlp_bias and built.moe):
        return
    rows = s.expert_tokens * s.w.routed_copies  # this GPU's routed rows, each an output of its expert (h, or l)
    local = model.moe.num_experts / s.grid.ep
    elements = built.moe * rows * s.w.expert_width.size
    traffic.add(6 * s.act_bytes * elements, 6 * s.act_bytes * elements, built.moe * (6 * local + 2))


def _moe_permute_traffic(s: StageShape, traffic: MemoryTraffic) -> None:
    """MoE: permute the routed tokens to their experts and back, forward and backward (k·ρ rows a token: with a
    capacity, the padded rows too); where the combine weights the experts' outputs in fp32 (``MoeRule.outputs_fp32``:
    torchtitan's ``(out.float() · w).to(out.dtype)``), that round trip op by op too."""
    moe, e = s.w.model.moe, s.act_bytes
    if not (moe and s.built.moe):
        return
    routed = s.hidden_tokens * s.w.routed_copies * s.w.expert_width.size * s.built.moe  # h, or a latent MoE's l
    traffic.add(2 * 2 * e * routed, 2 * 2 * e * routed, 12 * s.built.moe)
    if s.w.framework.moe.outputs_fp32:
        # forward, the product (read 4, write 4); backward, the outputs' gradient (grad · w: read 4, write 4) and the
        # weights' (grad · out, read 4 + 4, write 4, then its sum over h, read 4); in a narrower dtype, the cast up
        # and back each way (read e, write 4; read 4, write e)
        casts = 0 if e == 4 else 2 * (e + 4)
        kernels = (1 + 3 + (4 if casts else 0)) * s.built.moe
        traffic.add((COMBINE_FP32_FORWARD + casts) * routed, (COMBINE_FP32_BACKWARD + casts) * routed, kernels)


def _router_traffic(s: StageShape, traffic: MemoryTraffic) -> None:
    """MoE: the router's memory-bound kernels around its matmul, as the framework profile lists them
    (``speed.router``): each moves its bytes per (token, expert) score over this GPU's tokens and the E experts'
    scores, and per element of the router's input (h a token), in each MoE layer; with an expert capacity, the drop
    mask's kernels too."""
    rule, moe, layers = s.w.framework.speed.router, s.w.model.moe, s.built.moe
    if not (rule and moe and layers):
        return
    forward, backward = rule.forward, rule.backward
    if s.w.capacity_factor is not None:
        padded = s.w.pad_to_capacity
        forward += tuple(k for k in rule.capacity_forward if not (padded and k.unpadded_only))
        backward += rule.capacity_backward
    scores, inputs = s.hidden_tokens * moe.num_experts * layers, s.hidden_tokens * s.w.model.hidden_size * layers
    traffic.add(
        scores * sum(k.bytes_per_score for k in forward) + inputs * sum(k.bytes_per_input for k in forward),
        scores * sum(k.bytes_per_score for k in backward) + inputs * sum(k.bytes_per_input for k in backward),
        layers * (len(forward) + len(backward)),
    )


def _loss_traffic(s: StageShape, traffic: MemoryTraffic) -> None:
    """The loss over this GPU's share of the logits, forward and backward (about five passes in its dtype), and
    the final norm, on the stage that holds the head."""
    if s.built.head:
        _losses(s, traffic, 1)


def _losses(s: StageShape, traffic: MemoryTraffic, losses: int) -> None:
    """``losses`` losses over the logits with their final norms (the model's, or its MTP modules')."""
    model, e = s.w.model, s.act_bytes
    logits = s.tokens * model.vocab_size / s.grid.tp
    loss = s.w.framework.loss
    ell = loss.saved_bytes or e
    forward, backward = loss.moved_bytes or (e + 3 * ell, 2 * ell + e)
    traffic.add(losses * forward * logits, losses * backward * logits, 8 * losses)
    if not model.post_norm:  # a post-norm model (GPT-1) has no final norm
        norm = losses * s.hidden_tokens * model.hidden_size
        traffic.add(2 * e * norm, 3 * e * norm, 2 * losses)


def _embedding_traffic(s: StageShape, traffic: MemoryTraffic) -> None:
    """The embedding's lookup, and its dense gradient, zeroed, then added into, on the stage that holds it."""
    if not s.built.embedding:
        return
    e, h = s.act_bytes, s.w.model.hidden_size
    vocab_rows = s.w.model.vocab_size / s.grid.tp
    traffic.add(2 * e * s.hidden_tokens * h, e * vocab_rows * h + 2 * e * s.hidden_tokens * h, 3)


def _mtp_traffic(s: StageShape, traffic: MemoryTraffic) -> None:
    """Each trained multi-token-prediction module (DeepSeek-V3 §2.2; Megatron-Core's ``MultiTokenPredictionLayer``):
    where it is built, the next tokens' embedding looked up (its gradient added into the embedding copy's, zeroed
    there), the norms of it and of the hidden state and their concatenation (read 2 write 2 a width of h each way),
    or with mHC's n streams the streams' norm and the projections' outputs added; on the last stage, its own final
    norm and loss, after its collapse of the streams with mHC (``MTP_COLLAPSE``)."""
    n, hc = s.built.mtp, s.w.model.hyper_connections
    streams = hc.streams if hc is not None else 0
    if n:
        e, elements = s.act_bytes, n * s.hidden_tokens * s.w.model.hidden_size
        traffic.add(2 * e * elements, 2 * e * elements, 2 * n)  # the lookup; its gradient scattered back
        if hc is None:
            traffic.add(2 * 2 * e * elements, 2 * 3 * e * elements, 4 * n)  # two fused norms
            traffic.add(2 * 2 * e * elements, 2 * 2 * e * elements, 2 * n)  # the concatenation, its gradient split
        else:  # mHC: the embedding's norm and the streams', stream by stream; the two projections' outputs added,
            # the embedding's broadcast over the streams (R h + N, W N), its gradient summed back over them (R N, W h)
            normed = (1 + streams) * elements
            traffic.add(2 * e * normed, 3 * e * normed, 4 * n)
            traffic.add(e * (1 + 2 * streams) * elements, e * (streams + 1) * elements, 2 * n)
        if not s.built.embedding:  # the embedding copy's dense gradient, zeroed (Megatron builds it here)
            traffic.add(0.0, e * s.w.model.vocab_size / s.grid.tp * s.w.model.hidden_size, 1)
    if s.built.mtp_heads:  # on the last stage, where the output layer is
        if hc is not None:  # each module's collapse of its streams (learned_output_contract, in fp32 op by op)
            width = s.built.mtp_heads * s.hidden_tokens * s.w.model.hidden_size
            kernels = s.built.mtp_heads * (MTP_COLLAPSE.kernels_forward + MTP_COLLAPSE.kernels_backward)
            traffic.add(*MTP_COLLAPSE.bytes(s.act_bytes, streams * width, width), kernels)
        _losses(s, traffic, s.built.mtp_heads)
