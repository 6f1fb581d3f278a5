"""The phases of one training step on one GPU, and what each holds beyond the persistent parts (docs/formulas.md
§5.10).

PyTorch's autograd frees the tensors a node saved once that node's backward has run, so the tensors alive at once
change through the step, and a GPU runs out at its busiest moment, not on the sum of everything the step ever makes.
Four moments bound it: the loss's backward (every saved activation and the logits' gradients), the final norm's
backward (the head side freed), a layer's backward (the head side freed, the layer rebuilt under full recomputation,
its gradients) and the optimizer step (the activations freed). ``gpu_memory`` adds the largest to the model states.
What each phase holds was read from every storage live in a real transformers step on the CPU
(scripts/hf_step_peak.py, tests/test_step_phases.py).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import NamedTuple

from lmcalc.engine.finetune.method import adapted_modules
from lmcalc.engine.memory.activations import layer_saved_tensors
from lmcalc.engine.memory.adapter_moment import mlp_adapter_moment
from lmcalc.engine.memory.adapters import adapter_copies
from lmcalc.engine.memory.branch_convs import combine_gradient_bytes, shared_sum_peak
from lmcalc.engine.memory.byte_latent import forward_frame as byte_forward_frame
from lmcalc.engine.memory.cca import STREAM_BYTES, rebuilt_forward_end
from lmcalc.engine.memory.compressed import ihc_indexer_moment
from lmcalc.engine.memory.fp8_storage import grad_output_bytes, te_fp8
from lmcalc.engine.memory.fsdp_buffers import NO_QUEUE, GradQueue
from lmcalc.engine.memory.image_prefix import decoder_workload, image_logits_bytes
from lmcalc.engine.memory.indexer_moment import (
    above_last_indexer,
    adapted_output_gradient,
    indexed_layer,
    mla_indexer_locals,
    shared_expert_freed,
)
from lmcalc.engine.memory.inkling2 import block_residual_backward, messages_held, rebuilt_combine_peak
from lmcalc.engine.memory.ngpt import sub_norm_backward
from lmcalc.engine.memory.prompt_prefix import (
    bias_gradient,
    forward_frame,
    prompt_length,
    prompt_loss_transient,
    without_prompt,
)
from lmcalc.engine.memory.retrieval_experts import retrieval_backward_peak, retrieval_forward_peak
from lmcalc.engine.memory.routing import weighted_outputs
from lmcalc.engine.memory.sdpa_math import math_backward_peak
from lmcalc.engine.model_code import gelu_ops_kept, norm_keeps
from lmcalc.engine.parallel.pipeline import StageLayers
from lmcalc.engine.workload import Workload


class UnmadeGrads(NamedTuple):
    """The shares of a stage's gradients that do not exist yet at each backward phase, in ``StepPhases``' order.
    Where the framework makes the gradients in the backward and frees them after the step (``grads_lifetime: step``)
    and the step is one micro-batch, the loss's backward runs before any, the final norm's after the head's, the top
    layer's after the head's and its own (counted whole), the first layer's before the embedding's (a tied
    embedding's shared matrix among them: AccumulateGrad makes its gradient once, from both parts, in the
    embedding's backward); else none is missing (``NONE_UNMADE``)."""

    loss: float = 0.0
    norm: float = 0.0
    layer: float = 0.0
    first_layer: float = 0.0


NONE_UNMADE = UnmadeGrads()


@dataclass(frozen=True)
class StageActivations:
    total: float  # bytes saved by the forward passes at the stage's busiest moment
    in_flight: float  # micro-batches in flight then, counted in passes through all the stage's layers
    outside: float  # of the total, the bytes outside the layers (embedding side, head side)
    rebuilt: float  # the one layer full recomputation rebuilds in the backward pass (not in the total)
    head: float = 0.0  # of the total, one micro-batch's head side (last stage): freed once its loss's backward has run
    first_layer: float = 0.0  # of the total, the stage's first layer's (its checkpointed input under full recompute)
    unmade: UnmadeGrads = NONE_UNMADE  # the gradients not made yet at each backward phase (``UnmadeGrads``)

    @property
    def with_rebuilt(self) -> float:
        """The saved activations and the rebuilt layer: every tensor kept for backward, counted as the saved-tensor
        hooks count them (the head side's still there)."""
        return self.total + self.rebuilt


RMSNORM_BACKWARD_COPIES = 6
"""fp32 tensors of a norm's input size live in the backward of transformers' RMSNorm (LlamaRMSNorm: x.float(), pow,
mean, rsqrt, multiply, cast back) at its busiest: the fp32 input it kept, and five gradients (through the cast, the
multiply, the mean's division and the power). Read from the storages live at the step's peak with
scripts/hf_step_peak.py on the CPU (llama-wide: the final norm's backward, once the head side is freed, binds)."""


MOE_COMBINE_FP32_GRADIENTS = 3
"""h-wide fp32 tensors per token-expert assignment that the backward of transformers' MoE combine holds at once
(transformers/integrations/moe.py grouped_mm_experts_forward: each expert output times its fp32 routing weight,
index-added into an fp32 sum, cast back): the gathered output gradient and the two products' gradients, beside the
expert output's gradient cast back to the activation dtype; read from the storages live at the step's peak with
scripts/hf_step_peak.py on the CPU (mixtral-wide)."""


def combine_cast_gradient(w: Workload) -> float:
    """Bytes per token-expert assignment and hidden element that the MoE combine's backward holds beyond its
    ``MOE_COMBINE_FP32_GRADIENTS`` gradients and the layer's saved tensors: the expert output's gradient cast back
    to the activation dtype, made (autograd casts a node's outputs to its inputs' dtypes) while the product's node
    still keeps the expert outputs it saved. Under full recomputation (torch.utils.checkpoint, non-reentrant) the
    rebuilt layer's tensors are handed to the node that unpacks them (the checkpoint drops its own reference), so
    the expert outputs, k·s·b·h in the activation dtype, are freed as the product's backward returns, before the
    cast of that same size is made: nothing beyond the three gradients, which the un-permute's backward
    (``weighted_out[inv_perm]``: the gradient it receives, its zeros and the gradient put into them) holds too, the
    whole rebuilt layer alive. Read from the storages live at the step's peak with scripts/hf_step_peak.py on the
    CPU (mixtral-wide, with and without checkpointing)."""
    return 0.0 if w.recompute == "full" else w.precision.activation_bytes


SQUARE_BACKWARD_TENSORS = 3
"""f-wide tensors a two-matrix squared-ReLU MLP's backward holds at once at the square (torch.square, PowBackward0:
grad · (2 · x)): the down projection's input gradient, 2 · x and their product; read from the storages live at the
step's peak with scripts/hf_step_peak.py on the CPU (rwkv-wide: its channel mix)."""


class Transients(NamedTuple):
    """What a backward holds at once beyond the saved activations, where the framework profile counts it."""

    loss: float  # the loss's logit-sized tensors (the last stage)
    layer: float  # one layer's activation gradients at its busiest, and its output's gradient (``backward_transients``)
    norm: float = 0.0  # a norm's backward written op by op in fp32: its fp32 input and gradients (the final norm's)
    embedding: float = 0.0  # a tied embedding's own part of the shared matrix's gradient, beside the head's part
    forward: float = 0.0  # a layer's forward beyond what it keeps: an indexer's scores (``indexer_peak``)
    kept_before: float = 0.0  # of a layer's saved tensors, the share made before that moment
    output_gradient: float = 0.0  # the gradient of a layer's output, alive while the layer is rebuilt
    held: float = 0.0  # of the head side, what the layers' moments still hold (Inkling 2's looped message residuals)


class StepPhases(NamedTuple):
    """The bytes each phase of a training step holds beyond the persistent parts (``step_phases``)."""

    loss_backward: float  # every saved activation and the loss's logit-sized gradients
    norm_backward: float  # the saved activations less the freed head side, a norm's fp32 backward
    layer_backward: float  # the saved activations less the freed head side, the rebuilt layer, its gradients
    first_layer_backward: float  # what the first layer and the embedding side keep, the layer's gradients
    embedding_backward: float  # a tied embedding's: both parts of the shared matrix's gradient
    optimizer_step: float  # the activations freed: the end of the step's temporaries
    layer_forward: float = 0.0  # a layer's forward (or its rebuild) at an indexer's scores or CDMoE's sums: the top
    # layer's, or the topmost that runs an indexer of its own (``indexer_moment.indexed_layer``)

    @property
    def busiest(self) -> float:
        return max(self)

    @property
    def binding(self) -> str:
        """The phase that holds the most, in words."""
        return PHASE_NAMES[self.index(self.busiest)]


PHASE_NAMES = (
    "the loss's backward",
    "the final norm's backward",
    "a layer's backward",
    "the first layer's backward",
    "the embedding's backward",
    "the optimizer step",
    "a layer's forward (its indexer's scores, its CDMoE's key sums, a rebuilt ZAYA layer's end, a LoRA adapter "
    "of its MLP), or the forward's end (CPM-Ant's, BLT's)",
)


def step_phases(
    held: StageActivations,
    transients: Transients,
    step_transient: float,
    grads: float = 0.0,
    queue: GradQueue = NO_QUEUE,
) -> StepPhases:
    """The step's phases on one GPU: the loss's backward runs with every activation still saved; the final norm's
    backward once the loss and the head have freed what they saved for that micro-batch (``held.head``, of which
    ``transients.norm`` counts the norm's own fp32 input again); by the top layer's backward the layer is rebuilt
    under full recomputation and its activation gradients live; the first layer's backward holds what it and the
    embedding side kept, and a tied embedding's backward both parts of the shared matrix's gradient (the head's,
    waiting in ``transients.layer`` until then, and its own) before AccumulateGrad sums them; the optimizer step runs
    once the activations are freed. PyTorch's autograd frees a node's saved tensors once it has run
    (docs/formulas.md §5.10), so the rebuilt layer never lives beside the logits' gradients. ``grads``: the stage's
    gradient bytes, of which ``held.unmade`` says what share each phase does not hold yet (the persistent parts count
    them all). From the top layer down to the first the activations fall and the gradients grow layer by layer, so
    the two ends bound every layer's backward. Megatron-FSDP's gradient buckets in flight (``queue``) grow as the
    layers' activations fall, so the layer's phase is the top layer's with the most they add beyond what the layers
    above have freed (``GradQueue.layer_peak``). (On a stage without the head, ``transients.norm`` stands for a
    layer's own norms: one fp32 copy too many, the one the layer keeps.)"""
    after_head, unmade, embedding_side = held.total - held.head, held.unmade, held.outside - held.head
    return StepPhases(
        held.total + transients.loss - unmade.loss * grads,
        after_head + transients.norm + queue.head - unmade.norm * grads,
        after_head
        + held.rebuilt
        + transients.layer
        + transients.held
        + queue.layer_peak(held.first_layer)
        - unmade.layer * grads,
        embedding_side
        + held.first_layer
        + held.rebuilt
        + transients.layer
        + queue.first_layer
        - unmade.first_layer * grads,
        embedding_side + 2 * transients.embedding + queue.embedding,
        step_transient,
        _layer_forward(held, transients, (unmade.layer if held.rebuilt else unmade.loss) * grads),
    )


def _layer_forward(held: StageActivations, t: Transients, unmade: float) -> float:
    """The top layer's forward at its indexer's scores (``Transients.forward``), the head side not made yet: every
    layer below it saved, the top one up to that moment and its input, which the residual branch holds (where the
    topmost layer that runs an indexer of its own is lower, GLM-5's and HY V4's, ``Transients.forward`` leaves out
    what the layers above it would save, ``indexer_moment.above_last_indexer``); under full
    recomputation, the checkpointed inputs, the rebuilt layer up to that moment and its output's gradient (of the
    input's size), less the gradients not made by then (``unmade``). 0 where no forward transient is counted."""
    if not t.forward:
        return 0.0
    after_head = held.total - held.head
    if held.rebuilt:
        return after_head + t.held + t.kept_before * held.rebuilt + t.output_gradient + t.forward - unmade
    return after_head - (1 - t.kept_before) * held.first_layer + t.output_gradient + t.forward - unmade


@functools.lru_cache(maxsize=1 << 16)
def backward_transients(w: Workload, tp: int, cp: int, built: StageLayers) -> Transients:
    """What a backward holds beyond the saved tensors, where the framework profile counts transients: on the last
    stage, the loss's logit-sized tensors (the head's output, upcast copies, the logits' gradients); on every stage,
    one layer's MLP activation gradients during its backward (a gated MLP's two, a GELU MLP's one; a routed layer's
    for one expert; under Transformer Engine's fp8, with their quantised copies) beside the gradient of its output,
    and, where a trained head is tied to the embedding on the
    same GPU and autograd accumulates the gradients, the head's gradient of the shared matrix, which waits from the
    head's backward to the embedding's to be summed with that part (AccumulateGrad sees the matrix once, with both
    parts), and then, in the embedding's backward, the embedding's part beside it; and an RMSNorm's fp32 backward."""
    if not w.framework.transients:
        return Transients(0.0, 0.0)
    if w.model.prompt:  # CPM-Ant's layers over the prompt's tokens and the text's (engine.memory.prompt_prefix)
        return _prompt_transients(w, backward_transients(without_prompt(w), tp, cp, built), built)
    if w.model.image_prefix:  # GIT's layers over the image's tokens and the text's; its loss over the text's, beside
        layers = backward_transients(decoder_workload(w), tp, cp, built)  # the image positions' logits
        text = replace(w, model=decoder_workload(w).model)
        image = image_logits_bytes(w) / (tp * cp) if built.head else 0.0
        loss = backward_transients(text, tp, cp, built).loss + image
        return layers._replace(loss=loss)
    spec, act, sb = w.model, w.precision.activation_bytes, w.tokens
    split = tp * cp
    loss = w.framework.loss.transient_bytes * sb * spec.vocab_size / split if built.head else 0.0
    if w.framework.loss.fused_linear and built.head:
        loss = fused_loss_chunk(sb, spec.hidden_size, spec.vocab_size) * spec.vocab_size * act / split
    # beyond the MLP's saved tensors, its output projection's input freed: a GELU kernel's input gradient; a gated
    # MLP's gate and up gradients; a GELU written op by op, the gradients of its last product's two factors
    gradients = 1 if spec.ffn_kind == "gelu_mlp" and not gelu_ops_kept(w) else 2
    if spec.ffn_kind == "gelu_mlp" and spec.activation == "relu2":  # the square's backward: grad · (2·x), op by op
        gradients = SQUARE_BACKWARD_TENSORS
    if _output_projection_adapted(w):  # its input's gradient made twice, through W and through B·A, then summed
        gradients = max(gradients, ADAPTED_INPUT_GRADIENTS)
    fp8 = te_fp8(w)  # Transformer Engine quantises the output gradient of fc1 beside it, for its backward
    per_element = act + (grad_output_bytes(fp8) if fp8 else 0.0)
    layer = gradients * sb * spec.ffn_size * per_element / split if built.dense else 0.0
    if built.moe and spec.moe:
        moe = spec.moe
        routed = w.routed_copies * sb / moe.num_experts * moe.expert_ffn_size
        layer = max(layer, gradients * routed * per_element / split)
        rule = w.framework.moe
        if not (weighted_outputs(w) or rule.probs_in_activation):  # weighted in fp32 after the experts (grouped_mm)
            assignments = moe.k * sb
            combine = MOE_COMBINE_FP32_GRADIENTS * combine_gradient_bytes(w) + combine_cast_gradient(w)
            freed = shared_expert_freed(w, layer_saved_tensors(w, True))  # DeepSeek-V3.2's: run first
            layer = max(layer, (assignments * spec.hidden_size * combine - freed) / split)
    layer = max(layer, sub_norm_backward(w, layer_saved_tensors(w, False)) / split)  # Dory's MLP sub-norm (fp32)
    layer = max(layer, block_residual_backward(w) / split)  # Inkling 2's widest block residual's fp32 norm
    layer = max(layer, retrieval_backward_peak(w))  # Doge's CDMoE: its second product's backward (TP = 1)
    for routed in [False] * bool(built.dense) + [True] * bool(built.moe and spec.moe):  # SDPA's math path: its
        layer = max(layer, math_backward_peak(w, layer_saved_tensors(w, routed), tp, cp))  # fp32 b·H·s² gradients
    stream = STREAM_BYTES if spec.cca else act  # ZAYA's residual stream, and so its gradient, is fp32
    layer += sb * spec.hidden_size * stream / cp  # the gradient of the layer's output, which the residual branch holds
    norm = 0.0
    if norm_keeps(w) in ("fp32_input", "fp32_normalised"):  # an RMSNorm written op by op in fp32: its backward's fp32
        # copies of its input (Gemma's, which multiplies by 1 + w in fp32, keeps one more and makes one gradient fewer)
        norm = RMSNORM_BACKWARD_COPIES * 4 * sb * spec.hidden_size / cp
    tied = 0.0
    if (
        spec.tied_embeddings
        and built.head
        and built.embedding
        and w.method.kind == "full"
        and not w.framework.speed.fused_grad_accumulation
    ):
        tied = spec.vocab_size * spec.hidden_size / tp * w.precision.grad_bytes
    forward = indexer_peak(w, cp)
    if spec.byte_latent and w.recompute != "full" and built.head:  # BLT's forward's end (memory.byte_latent)
        return Transients(loss, layer + tied, norm, tied, byte_forward_frame(w), 1.0)
    if built.moe and (shared := shared_sum_peak(w, layer_saved_tensors(w, True))):  # Inkling's rebuilt MoE layer
        rebuilt = shared.forward / split, shared.kept_before, shared.output_gradient / split
        return Transients(loss, layer + tied, norm, tied, *rebuilt)
    messages = messages_held(w) / cp if built.head else 0.0  # Inkling 2's looped model's, until its later runs'
    if built.moe and (top := rebuilt_combine_peak(w, layer_saved_tensors(w, True, "global"))):  # Inkling 2's rebuilt
        rebuilt = top.forward / split, top.kept_before, top.output_gradient / split  # top layer at its fp32 combine
        return Transients(loss, layer + tied, norm, tied, *rebuilt, held=messages)
    if messages:  # not checkpointed: the top layer's backward holds them
        return Transients(loss, layer + tied, norm, tied, held=messages)
    if built.dense and (cdmoe := retrieval_forward_peak(w)):  # Doge's CDMoE: its layer's forward at its last add,
        return Transients(loss, layer + tied, norm, tied, cdmoe, 1.0, sb * spec.hidden_size * act / cp)  # all made
    if end := rebuilt_forward_end(w, layer_saved_tensors(w, bool(built.moe))):  # ZAYA's rebuilt layer (memory.cca)
        return Transients(loss, layer + tied - end.freed / cp, norm, tied, end.forward / cp, 1.0,
                          end.output_gradient / cp)  # fmt: skip
    dense_layer = layer_saved_tensors(w, False) if built.dense and not forward else ()
    if dense_layer and (up := mlp_adapter_moment(w, dense_layer, tp, built.layers)):
        return Transients(loss, layer + tied, norm, tied, up.forward / cp, up.kept_before, up.output_gradient / cp)
    if not forward:
        return Transients(loss, layer + tied, norm, tied)
    kept, core_share = indexed_layer(w, bool(built.moe), built.head)  # the topmost layer with an indexer of its own;
    forward -= above_last_indexer(w, tp, cp) if built.head else 0.0  # those above reuse its selection (not run yet)
    if ihc := ihc_indexer_moment(w, kept, core_share, tp):  # HY V4: its iHC first, n streams' gradients
        return Transients(loss, layer + tied, norm, tied, forward + ihc.forward / cp, ihc.kept_before,
                          ihc.output_gradient / cp)  # fmt: skip
    output_gradient = sb * spec.hidden_size * act / cp  # of the layer rebuilt, alive while it runs its forward
    forward += mla_indexer_locals(w, kept, tp) / cp  # DeepSeek-V3.2's MLA: its forward's locals
    output_gradient += adapted_output_gradient(w, bool(built.moe)) / cp  # LoRA's scaled B output's
    return Transients(loss, layer + tied, norm, tied, forward, core_share, output_gradient)


def _prompt_transients(w: Workload, layers: Transients, built: StageLayers) -> Transients:
    """CPM-Ant's: ``layers``, its layers' over s + P tokens, with its own loss's (``prompt_loss_transient``) and the
    score bias's gradient beside each layer's backward; where the layers are not checkpointed, the forward's end, at
    the final norm's fp32 copy, every layer's tensors kept and the forward's own bias, mask and segment embedding
    alive (``Transients.forward`` with the whole top layer kept)."""
    loss = prompt_loss_transient(w) if built.head else 0.0
    layer = layers.layer + (bias_gradient(w) if w.method.kind == "full" else 0.0)  # a frozen table: no gradient
    if w.recompute == "full" or not built.head:
        return layers._replace(loss=loss, layer=layer)
    return layers._replace(
        loss=loss,
        layer=layer,
        forward=forward_frame(w),
        kept_before=1.0,
        output_gradient=(
            (w.seq_len + prompt_length(w)) * w.micro_batch * w.model.hidden_size * w.precision.activation_bytes
        ),
    )


def indexer_peak(w: Workload, cp: int) -> float:
    """A sparse-attention indexer's scores at their busiest, where the profile copies its key for every query
    (``attention.indexer_key_copy``): the copy, b·s·d_I·s, and the scores, b·s·H_I·s, both fp32, the queries this GPU
    holds against every key; beside them its queries and its key, b·(H_I + 1)·s·d_I, as projected and as
    concatenated after RoPE (in the activation dtype) and in fp32. Whole on each TP rank, as the indexer is. Read
    from the storages live at the step's peak with scripts/hf_step_peak.py on the CPU (deepseek-v32-small)."""
    ix = w.model.indexer
    if ix is None or not (w.framework.transients and w.framework.attention.indexer_key_copy):
        return 0.0
    queries_key = w.tokens * (ix.heads + 1) * ix.head_dim * (2 * w.precision.activation_bytes + 4)
    return (4 * w.tokens * w.seq_len * (ix.head_dim + ix.heads) + queries_key) / cp


ADAPTED_INPUT_GRADIENTS = 2
"""Input-sized gradients an adapted linear layer's backward holds beyond the tensors saved, once the input its
adapter kept is freed (PEFT's ``result + lora_B(lora_A(x))·s`` over a frozen W): the gradient through W, the one
through B·A and their sum, three at once less the input (read from the storages live at the step's peak with
scripts/hf_step_peak.py on the CPU: gpt-neox-wide, LoRA on every linear layer)."""


def _output_projection_adapted(w: Workload) -> bool:
    """Whether a dense MLP's output projection carries a LoRA adapter that reads its input directly (no dropout,
    no cast copy): its backward then holds ``ADAPTED_INPUT_GRADIENTS`` gradients of the f-wide input."""
    if not w.method.adapters or adapter_copies(w):
        return False
    ffn = w.model.ffn_size
    return any(m.group == "mlp" and m.inputs == ffn for m in adapted_modules(w.model, w.method))


def fused_loss_chunk(tokens: int, hidden: int, vocab: int) -> int:
    """Rows of logits a fused linear cross-entropy makes at once (Liger-Kernel,
    src/liger_kernel/ops/fused_linear_cross_entropy.py): the tokens split so that a chunk of logits is about the
    size of the head's input, next_pow2(⌈BT / ⌈V/h⌉⌉) rows, at most the tokens; its gradient is made in place."""
    factor = -(-vocab // hidden)
    rows = -(-tokens // factor)
    return min(tokens, 1 << (rows - 1).bit_length())
