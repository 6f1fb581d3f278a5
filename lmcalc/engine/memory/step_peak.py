"""The peak memory of one plain-PyTorch training step, phase by phase (derivation: docs/formulas.md §5.8).

``lmcalc memory`` adds weights, gradients, optimizer states and activations as if they all lived at
once, as they do in Megatron-LM, whose gradient buffer is allocated for the whole run. A plain PyTorch
loop (``loss.backward(); optimizer.step(); optimizer.zero_grad(set_to_none=True)``) makes the gradients
during the backward pass, frees them after the step, and frees each saved activation once its backward
node has run (PyTorch's autograd engine). Activations shrink as gradients grow, so the live bytes are
largest at one of three moments, each on top of the weights W and optimizer states O:

1. **Backward start**: every activation A (Korthikanti et al. 2022 §4, as ``gpu_memory`` counts them
   on one GPU) is saved, and the loss's backward makes two fp32 tensors of the logits' size, the gradient of
   the log-softmax output (from ``nll_loss``) and that of its input: 2 · 4 · s·b·V bytes. The forward
   pass peaks lower (the head's output and its fp32 copy beside the saved log-softmax output:
   A + 6 · s·b·V in bf16, A + 4 · s·b·V in fp32), so it is not a phase here.
2. **Backward end**: the first layer runs its backward with every gradient made but its own and those
   of the untied input tables (token embedding, learned positions), holding its saved tensors (under
   full recomputation: its input and the rebuilt layer); at its MLP's activation backward, where it
   holds the most, a dense MLP's output projection has made its gradient. With tied embeddings the
   moment just after counts too: the output head's gradient of the shared matrix, waiting since the
   backward began, and the embedding's are summed into a third V·h tensor (out of place: the head's
   part arrives as a transposed view, which autograd cannot accumulate into).
3. **Optimizer step**: ``torch.optim.AdamW`` with its multi-tensor (``foreach``) kernels, its default on
   a GPU, computes ``exp_avg_sq.sqrt()`` for every parameter at once (``torch/optim/adam.py``,
   ``_multi_tensor_adam``): one temporary the size of a state, N · bytes per state, on top of G.

A layer's backward runs its MLP half first, then its attention half, and holds the most at one of
them. At the MLP's activation backward it keeps every tensor the layer saved and the gradients of a
gated MLP's gate and up outputs, 2 · s·b·f (the product's gradient is freed as the down projection's
saved input is); a GELU MLP's one, s·b·f; a routed MoE layer's of one expert at a time,
2 · (k·ρ·s·b / E) · f_e for an even routing (ρ: ``Workload.routed_share``), or of a shared expert,
2 · s·b·f_e. By the attention's backward the MLP half's saved tensors are freed, and it holds eager
attention's softmax output and input gradients, 2 · b·H·s² (an upper bound), or a fused kernel's dQ, dK and dV,
s·b·(H·d_qk + H_kv·(d_qk + d_v)); under selective recomputation also the rebuilt attention core (the
softmax output, or the log-sum-exp; eager GQA's K and V repeated to every head). The larger moment
counts at the first layer (moment 2), and at the last layer (moment 1), where the loss, the head and
the final norm have freed what they saved (the 4 · s·b·V log-softmax output, the head's and the norm's
inputs), and where under full recomputation the last layer is rebuilt.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from lmcalc.engine.memory.activations import (
    LOGITS_BYTES,
    layer_kept_tensors,
    layer_saved_tensors,
)
from lmcalc.engine.memory.gpu_memory import gpu_memory
from lmcalc.engine.memory.outside_layers import layer_checkpoint, model_saved_tensors
from lmcalc.engine.model.params import count_params, layer_params, weight_tensors
from lmcalc.engine.parallel.layout import Layout
from lmcalc.engine.workload import Workload
from lmcalc.result import Term
from lmcalc.specs import ModelSpec

LOSS_BACKWARD_TENSORS = 2  # nll_loss's gradient and log_softmax's gradient, both fp32 s·b·V
PHASES = ("backward_start", "backward_end", "optimizer_step")


@dataclass(frozen=True)
class LayerBackward:
    """What one layer's backward holds beyond the activations, at its two moments (bytes)."""

    saved: float  # the layer's saved tensors (full recompute: its input and the rebuilt layer)
    mlp_saved: float  # of which the MLP half's, freed before the attention's backward runs
    mlp: float  # the MLP's activation gradients held at once
    attention: float  # the attention's gradients (and, under selective recomputation, its rebuilt core)

    def moment(self, grads_mlp: float, grads_attention: float) -> float:
        """The larger of the MLP's and the attention's moment, each with the parameter gradients it has
        beyond what the phase counts (negative: those not made yet)."""
        return max(self.saved + self.mlp + grads_mlp, self.saved - self.mlp_saved + self.attention + grads_attention)


@dataclass(frozen=True)
class StepPeak:
    """Bytes live at each phase of a plain PyTorch AdamW step, and the largest of them."""

    weights: float
    optimizer_states: float  # the optimizer's states (a plain loop keeps no master copy)
    gradients: float
    activations: float  # saved by the forward pass (full recompute: layer inputs; the rebuilt layer is later)
    loss_backward: float  # the logits-sized gradients of the cross-entropy
    head_side: float  # saved by the final norm, the head and the loss: freed before the last layer's backward
    last_layer: LayerBackward  # the first to run its backward; ``saved``: beyond A (full recompute: the rebuilt layer)
    first_layer: LayerBackward  # the last to run its backward
    embedding_gradient: float  # V·h · bytes per gradient
    early_mlp: float  # gradient bytes made as the last layer's MLP backward runs (head, final norm, MLP output)
    early_attention: float  # ... and as its attention's runs (head, final norm, its MLP half)
    late_mlp: float  # gradient bytes not made yet as the first layer's MLP backward runs
    late_attention: float  # ... and as its attention's runs
    tied: bool
    optimizer_temporary: float  # foreach AdamW's sqrt of the second moment, one per parameter
    sbv: float  # s·b·V, for the formulas

    @property
    def backward_start_extra(self) -> float:
        """Above A as the backward starts: the cross-entropy's gradients, or the last layer's moment once
        the loss, the head and the final norm have freed what they saved (the fp32 log-softmax output,
        the head's and the norm's inputs)."""
        last = self.last_layer.moment(self.early_mlp, self.early_attention)
        return max(self.loss_backward, last - self.head_side)

    @property
    def phases(self) -> dict[str, float]:
        base = self.weights + self.optimizer_states
        return {
            "backward_start": base + self.activations + self.backward_start_extra,
            "backward_end": base + self.gradients + self.backward_end_extra,
            "optimizer_step": base + self.gradients + self.optimizer_temporary,
        }

    @property
    def backward_end_extra(self) -> float:
        """Above G at the end of backward: the first layer's saved tensors and backward gradients, less
        the gradients not made by then; or, tied, the embedding's two gradient parts being summed."""
        layer = self.first_layer.moment(-self.late_mlp, -self.late_attention)
        return max(layer, 2 * self.embedding_gradient) if self.tied else layer

    @staticmethod
    def _gb(value: float) -> str:
        return f"{value / 1e9:.4g} GB"

    @property
    def backward_peak(self) -> float:
        """The most the backward pass holds: the larger of its start and its end."""
        return max(self.phases["backward_start"], self.phases["backward_end"])

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=self.phases.__getitem__)

    @property
    def peak(self) -> float:
        return self.phases[self.peak_phase]

    def terms(self) -> tuple[Term, ...]:
        """Each component and each phase, with its formula: what ``--explain`` and ``--json`` read."""
        return (*self._component_terms(), *self._phase_terms())

    def _component_terms(self) -> tuple[Term, ...]:
        """What the phases are made of: the states, the activations and each backward's extra tensors."""
        gb = self._gb
        return (
            Term("weights", "Weights W", self.weights, "bytes", "N · bytes per weight"),
            Term("optimizer_states", "Optimizer states O", self.optimizer_states, "bytes", "N · bytes per state"),
            Term("gradients", "Gradients G", self.gradients, "bytes", "N · bytes per gradient"),
            Term("activations", "Activations A", self.activations, "bytes", "tensors saved for backward"),
            Term(
                "loss_backward",
                "Cross-entropy backward",
                self.loss_backward,
                "bytes",
                f"{LOSS_BACKWARD_TENSORS} · {LOGITS_BYTES:g} · s·b·V",
                f"{LOSS_BACKWARD_TENSORS} × {LOGITS_BYTES:g} × {self.sbv:.6g}",
                "nll_loss and log_softmax gradients, fp32",
            ),
            Term(
                "layer_backward",
                "A layer's backward gradients",
                self.first_layer.mlp,
                "bytes",
                "MLP: gated 2·s·b·f, GELU s·b·f, routed 2·(k·ρ·s·b/E)·f_e (ρ: an expert capacity's rows, 1 dropless)",
                note=f"then the attention's: {gb(self.first_layer.attention)} (eager 2·b·H·s², fused dQ+dK+dV; "
                "selective: + the rebuilt core), once the MLP half's saved tensors are freed",
            ),
            Term(
                "first_layer",
                "First layer's activations",
                self.first_layer.saved,
                "bytes",
                "one layer's saved tensors (full recompute: rebuilt layer + its input)",
            ),
            Term(
                "optimizer_temporary",
                "AdamW temporary",
                self.optimizer_temporary,
                "bytes",
                "N · bytes per state",
                source="torch.optim.AdamW foreach: exp_avg_sq.sqrt() for every parameter at once",
            ),
        )

    def _phase_terms(self) -> tuple[Term, ...]:
        """The bytes live at each of the three phases, and the largest of them."""
        phases = self.phases
        gb = self._gb
        base = f"{gb(self.weights)} + {gb(self.optimizer_states)}"
        src = "lmcalc.engine.memory.step_peak (PyTorch's autograd frees saved tensors once their node has run)"
        return (
            Term(
                "backward_start",
                "At backward start",
                phases["backward_start"],
                "bytes",
                "W + O + A + max(cross-entropy backward, the last layer's backward − the head side's saved tensors)",
                f"{base} + {gb(self.activations)} + {gb(self.backward_start_extra)}",
                source=src,
            ),
            Term(
                "backward_end",
                "At backward end",
                phases["backward_end"],
                "bytes",
                "W + O + G + max(first layer + its backward − gradients not made yet, 2 · V·h)"
                if self.tied
                else "W + O + G + first layer + its backward − gradients not made yet",
                f"{base} + {gb(self.gradients)} + {gb(self.backward_end_extra)}",
            ),
            Term(
                "optimizer_step",
                "At the optimizer step",
                phases["optimizer_step"],
                "bytes",
                "W + O + G + AdamW temporary",
                f"{base} + {gb(self.gradients)} + {gb(self.optimizer_temporary)}",
            ),
            Term(
                "peak",
                "Predicted peak",
                self.peak,
                "bytes",
                "max of the three phases",
                note=f"at the {self.peak_phase.replace('_', ' ')}",
            ),
        )


def plain_step_peak(w: Workload) -> StepPeak:
    """Phase-by-phase peak of ``loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)`` on one
    device, no parallelism, with ``torch.optim.AdamW``'s default foreach kernels. The recipe is the
    model's own dtype (``fp32``, ``bf16-pure``): a plain loop keeps no separate master copy."""
    spec, precision = w.model, w.precision
    if precision.master_bytes:
        raise ValueError(
            f"plain_step_peak models a model trained in its own dtype; {precision.name} keeps a master copy "
            "(autocast or a mixed-precision framework), which this timeline does not describe"
        )
    n = count_params(spec).total
    one_gpu = gpu_memory(w, Layout(), 0)  # the whole model on one device: the trivial layout
    first_is_moe = spec.is_moe_layer(0)
    last_is_moe = spec.is_moe_layer(spec.num_layers - 1)
    first, last = (layer_backward(w, moe) for moe in (first_is_moe, last_is_moe))
    full = w.recompute == "full"
    sbv = w.seq_len * w.micro_batch * spec.vocab_size
    return StepPeak(
        weights=one_gpu.params,
        optimizer_states=one_gpu.master + one_gpu.optimizer,
        gradients=one_gpu.grads,
        activations=one_gpu.activations,  # what the forward pass leaves saved
        loss_backward=LOSS_BACKWARD_TENSORS * LOGITS_BYTES * sbv,
        head_side=sum(t.bytes for t in model_saved_tensors(w) if t.block == "head"),
        # A holds the last layer's saved tensors already, or (full) only its input: the layer is rebuilt
        last_layer=replace(last, saved=last.saved if full else 0.0),
        first_layer=replace(first, saved=first.saved + (layer_checkpoint(w).bytes if full else 0.0)),
        embedding_gradient=spec.vocab_size * spec.hidden_size * precision.grad_bytes,
        **{
            key: count * precision.grad_bytes
            for key, count in early_and_late_params(spec, first_is_moe, last_is_moe).items()
        },
        tied=spec.tied_embeddings,
        optimizer_temporary=n * precision.optimizer_state_bytes,
        sbv=sbv,
    )


def layer_backward(w: Workload, moe_layer: bool) -> LayerBackward:
    """One layer's backward (dense or MoE): the saved tensors it holds as it runs (under selective
    recomputation without the attention core, which comes back as the attention's backward starts; under
    full recomputation the rebuilt layer), and the gradients each half holds at once."""
    spec, act_bytes = w.model, w.precision.activation_bytes
    sb = w.tokens
    kept = layer_kept_tensors(w, moe_layer)
    if spec.moe and moe_layer:
        moe = spec.moe
        routed = 2 * w.routed_copies * sb / moe.num_experts * moe.expert_ffn_size
        mlp = max(routed, 2 * sb * moe.shared_width if moe.shared_experts else 0)
    else:
        mlp = (1 if spec.ffn_kind == "gelu_mlp" else 2) * sb * spec.ffn_size
    attn: float
    if w.attention == "eager":
        attn = 2 * w.micro_batch * spec.num_heads * w.seq_len**2
    else:
        attn = sb * (spec.num_heads * spec.qk_head_dim + spec.mean_kv_heads * (spec.qk_head_dim + spec.v_head_dim))
    rebuilt = 0.0
    if w.recompute == "selective":  # the core runs again: its saved tensors, and eager GQA's repeated K and V
        rebuilt = sum(t.bytes for t in layer_saved_tensors(w, moe_layer) if t.attention_core)
        if w.attention == "eager" and not spec.mla and spec.mean_kv_heads < spec.num_heads:
            rebuilt += sb * spec.num_heads * (spec.qk_head_dim + spec.v_head_dim) * act_bytes
    return LayerBackward(
        saved=sum(t.bytes for t in kept),
        mlp_saved=sum(t.bytes for t in kept if t.block == "mlp"),
        mlp=mlp * act_bytes,
        attention=attn * act_bytes + rebuilt,
    )


def early_and_late_params(spec: ModelSpec, first_is_moe: bool, last_is_moe: bool) -> dict[str, int]:
    """Gradients at the layer moments, in parameters: made beyond A's count as the last layer runs its
    backward (the head's, or the tied matrix's head part, and the final norm's; then that layer's MLP
    output, or its MLP half), and not made yet as the first layer runs its (its own but the MLP output,
    or but the MLP half; and the input tables: an untied token embedding, a learned position table)."""
    head, tables = spec.vocab_size * spec.hidden_size, 0
    for t in weight_tensors(spec):
        if t.group == "position" or (t.group == "embedding" and not spec.tied_embeddings):
            tables += t.total
        elif t.name.startswith("final_norm."):
            head += t.total
    first = layer_params(spec, first_is_moe)
    return {
        "early_mlp": head + layer_params(spec, last_is_moe, "mlp output"),
        "early_attention": head + layer_params(spec, last_is_moe, "mlp half"),
        "late_mlp": tables + first - layer_params(spec, first_is_moe, "mlp output"),
        "late_attention": tables + first - layer_params(spec, first_is_moe, "mlp half"),
    }
