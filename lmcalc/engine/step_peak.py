"""The peak memory of one plain-PyTorch training step, phase by phase (derivation: docs/formulas.md §5.8).

``lmcalc memory`` adds weights, gradients, optimizer states and activations as if they all lived at
once, as they do in Megatron-LM, whose gradient buffer is allocated for the whole run. A plain PyTorch
loop (``loss.backward(); optimizer.step(); optimizer.zero_grad(set_to_none=True)``) makes the gradients
during the backward pass, frees them after the step, and frees each saved activation once its backward
node has run (PyTorch's autograd engine). Activations shrink as gradients grow, so the live bytes are
largest at one of three moments, each on top of the weights W and optimizer states O:

1. **Backward start**: every activation A (Korthikanti et al. 2022 §4, as ``activation_memory`` counts
   them) is saved, and the loss's backward makes two fp32 tensors of the logits' size, the gradient of
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

A layer's backward also holds a few activation-sized gradients at once: a gated MLP (SwiGLU, GeGLU)
those of the gate and up outputs, 2 · s·b·f (the product's gradient is freed as the down projection's
saved input is); a GELU MLP one, s·b·f; a routed MoE layer those of one expert at a time,
2 · (k·s·b / E) · f_e for an even routing, or of a shared expert, 2 · s·b·f_e; eager attention the
softmax's output and input gradients, 2 · b·H·s² (an upper bound); fused attention dQ, dK and dV,
s·b·(H·d_qk + H_kv·(d_qk + d_v)). The largest is added at the first layer (moment 2), and at the
last layer (moment 1), where the loss has already freed its saved 4 · s·b·V log-softmax output.
"""

from __future__ import annotations

from dataclasses import dataclass

from lmcalc.engine.flops import Recompute
from lmcalc.engine.memory import LOGITS_BYTES, MASK_BYTES, AttentionImpl, activation_memory, state_memory
from lmcalc.engine.params import count_params, weight_tensors
from lmcalc.result import Term
from lmcalc.specs import ModelSpec, OptimizerSpec, PrecisionRecipe

LOSS_BACKWARD_TENSORS = 2  # nll_loss's gradient and log_softmax's gradient, both fp32 s·b·V
PHASES = ("backward_start", "backward_end", "optimizer_step")


@dataclass(frozen=True)
class StepPeak:
    """Bytes live at each phase of a plain PyTorch AdamW step, and the largest of them."""

    weights: float
    optimizer_states: float  # the optimizer's states (a plain loop keeps no master copy)
    gradients: float
    activations: float  # saved by the forward pass (full recompute: layer inputs; the rebuilt layer is later)
    loss_backward: float  # the logits-sized gradients of the cross-entropy
    first_layer: float  # one layer's activations while the first layer runs its backward
    layer_backward: float  # the activation gradients a layer's backward holds at once (the largest layer)
    embedding_gradient: float  # V·h · bytes per gradient
    not_yet_made: float  # gradients made after the first layer's backward starts: its own, untied tables'
    tied: bool
    optimizer_temporary: float  # foreach AdamW's sqrt of the second moment, one per parameter
    sbv: float  # s·b·V, for the formulas

    @property
    def phases(self) -> dict[str, float]:
        base = self.weights + self.optimizer_states
        return {
            # the last layer's backward runs once the loss's saved fp32 log-softmax output is freed
            "backward_start": base
            + self.activations
            + max(self.loss_backward, self.layer_backward - LOGITS_BYTES * self.sbv),
            "backward_end": base + self.gradients + self.backward_end_extra,
            "optimizer_step": base + self.gradients + self.optimizer_temporary,
        }

    @property
    def backward_end_extra(self) -> float:
        """Above G at the end of backward: the first layer's activations and backward gradients, less
        the gradients not made by then; or, tied, the embedding's two gradient parts being summed."""
        layer = self.first_layer + self.layer_backward - self.not_yet_made
        return max(layer, 2 * self.embedding_gradient) if self.tied else layer

    @staticmethod
    def _gb(value: float) -> str:
        return f"{value / 1e9:.4g} GB"

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=self.phases.__getitem__)

    @property
    def peak(self) -> float:
        return self.phases[self.peak_phase]

    def terms(self) -> tuple[Term, ...]:
        """Each component and each phase, with its formula: what ``--explain`` and ``--json`` read."""
        phases = self.phases
        gb = self._gb
        base = f"{gb(self.weights)} + {gb(self.optimizer_states)}"
        start_extra = max(self.loss_backward, self.layer_backward - LOGITS_BYTES * self.sbv)
        src = "lmcalc.engine.step_peak (PyTorch's autograd frees saved tensors once their node has run)"
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
                self.layer_backward,
                "bytes",
                "gated MLP 2·s·b·f, GELU MLP s·b·f, eager 2·b·H·s², fused dQ+dK+dV (the largest)",
            ),
            Term(
                "first_layer",
                "First layer's activations",
                self.first_layer,
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
            Term(
                "backward_start",
                "At backward start",
                phases["backward_start"],
                "bytes",
                "W + O + A + max(cross-entropy backward, a layer's backward gradients − 4·s·b·V)",
                f"{base} + {gb(self.activations)} + {gb(start_extra)}",
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


def plain_step_peak(
    spec: ModelSpec,
    seq_len: int,
    micro_batch: int,
    precision: PrecisionRecipe,
    optimizer: OptimizerSpec,
    attention: AttentionImpl = "flash",
    recompute: Recompute = "none",
    mask_bytes: float = MASK_BYTES,
) -> StepPeak:
    """Phase-by-phase peak of ``loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)`` on one
    device, no parallelism, with ``torch.optim.AdamW``'s default foreach kernels. The recipe is the
    model's own dtype (``fp32``, ``bf16-pure``): a plain loop keeps no separate master copy."""
    if precision.master_bytes:
        raise ValueError(
            f"plain_step_peak models a model trained in its own dtype; {precision.name} keeps a master copy "
            "(autocast or a mixed-precision framework), which this timeline does not describe"
        )
    n = count_params(spec).total
    states = state_memory(spec, precision, optimizer, 0, 1)
    act = activation_memory(spec, seq_len, micro_batch, precision.activation_bytes, attention, recompute, mask_bytes)
    if recompute == "full":
        first_layer = act.checkpoint_bytes + act.recompute_working_bytes
    else:
        first_layer = act.dense_layer_bytes if act.dense_layers else act.moe_layer_bytes
    sbv = seq_len * micro_batch * spec.vocab_size
    act_bytes = precision.activation_bytes
    return StepPeak(
        weights=states.params,
        optimizer_states=states.master + states.optimizer,
        gradients=states.grads,
        activations=act.total - act.recompute_working_bytes,  # what the forward pass leaves saved
        loss_backward=LOSS_BACKWARD_TENSORS * LOGITS_BYTES * sbv,
        first_layer=first_layer,
        layer_backward=layer_backward_bytes(spec, seq_len, micro_batch, act_bytes, attention),
        embedding_gradient=spec.vocab_size * spec.hidden_size * precision.grad_bytes,
        not_yet_made=first_layer_late_params(spec) * precision.grad_bytes,
        tied=spec.tied_embeddings,
        optimizer_temporary=n * precision.optimizer_state_bytes,
        sbv=sbv,
    )


def layer_backward_bytes(
    spec: ModelSpec, seq_len: int, micro_batch: int, act_bytes: float, attention: AttentionImpl
) -> float:
    """The activation gradients one layer's backward holds at once, for the layer where it is largest."""
    sb = seq_len * micro_batch
    gated = 1 if spec.ffn_kind == "gelu_mlp" else 2
    mlp = gated * sb * spec.ffn_size
    if spec.moe:
        moe = spec.moe
        routed = 2 * moe.experts_per_token * sb / moe.num_experts * moe.expert_ffn_size
        shared = 2 * sb * moe.expert_ffn_size if moe.shared_experts else 0
        moe_mlp = max(routed, shared)
        mlp = max(mlp, moe_mlp) if spec.moe_layers < spec.num_layers else moe_mlp
    if attention == "eager":
        attn = 2 * micro_batch * spec.num_heads * seq_len**2
    else:
        attn = sb * (spec.num_heads * spec.qk_head_dim + spec.kv_heads * (spec.qk_head_dim + spec.v_head_dim))
    return max(mlp, attn) * act_bytes


MLP_OUTPUT_PROJECTIONS = ("mlp.down.", "mlp.proj.")  # a dense MLP's last matmul: its backward runs first


def first_layer_late_params(spec: ModelSpec) -> int:
    """Parameters whose gradients do not exist yet when the first layer's backward holds the most: the
    first layer's own (dense or MoE, as it is) and the input tables (the token embedding when untied
    from the head, a learned position table). That moment is the MLP's activation backward (SwiGLU's
    or GELU's), so a dense MLP's output projection has made its gradient by then."""
    first_is_moe = bool(spec.moe) and spec.moe_layers == spec.num_layers
    per_layer = {"L": spec.num_layers, "L_dense": spec.num_layers - spec.moe_layers, "L_moe": spec.moe_layers}
    late = 0
    for t in weight_tensors(spec):
        kind = t.count_symbol.split("·")[0]
        if t.group == "position" or (t.group == "embedding" and not spec.tied_embeddings):
            late += t.total  # tied, the output head's part of the gradient is there from the start
        elif t.name.startswith(MLP_OUTPUT_PROJECTIONS) and not first_is_moe:
            continue
        elif kind in per_layer and (kind == "L" or (kind == "L_moe") == first_is_moe):
            late += t.total // per_layer[kind]
    return late
