"""What a looped model's runs keep for backward (``specs.LayerReuseSpec``; transformers 5.24's HrmTextModel): a held
layer's weights count once (``engine.model.layer_reuse.held_once``), but each run computes on its own input, so each
run that trains keeps its own activations, as a layer of its own would. HRM runs its early low-level cycles under
``torch.no_grad`` (``no_grad_runs``): those runs keep nothing, not even a checkpointed input. Each run of one of HRM's
stacks ends with the stack's weightless RMSNorm (``HrmTextStack.final_norm``), outside the decoder layers and so
outside their checkpoints: every stack run that trains keeps that norm's tensors, the last one being the model's own
final norm (``engine.memory.outside_layers``)."""

from __future__ import annotations

from dataclasses import replace

from lmcalc.engine.memory.norms import norm_saved
from lmcalc.engine.memory.saved import SavedTensor
from lmcalc.engine.model.tensors import Dim
from lmcalc.engine.workload import Workload
from lmcalc.specs import ModelSpec


def trained_runs(spec: ModelSpec) -> tuple[bool, ...]:
    """Of each run (a layer of the spec, in order), whether it trains: all of them, but a looped model's runs without
    gradients."""
    reuse = spec.layer_reuse
    no_grad = set(reuse.no_grad_runs) if reuse else set()
    return tuple(run not in no_grad for run in range(spec.num_layers))


def stack_size(spec: ModelSpec) -> int:
    """The layers a stack runs at once: HRM's two stacks hold half the held layers each (``start_state``); 0 where
    the model has no stacks of its own."""
    reuse = spec.layer_reuse
    return reuse.held // 2 if reuse and reuse.start_state else 0


def stack_norms_saved(w: Workload) -> list[SavedTensor]:
    """HRM's stack norms beyond the model's final norm: one a stack run that trains (its runs of N layers less the
    runs without gradients, over N), less the last, which ``outside_layers`` counts as the final norm."""
    n = stack_size(w.model)
    if not n:
        return []
    stacks = sum(trained_runs(w.model)) // n - 1
    rows, width = Dim(w.tokens, "s·b"), Dim(w.model.hidden_size, "h")
    if stacks <= 0:
        return []
    label = f"stack final norm, {stacks} trained stack runs but the last"
    return [replace(t, symbol=f"{stacks}·{t.symbol}", elements=stacks * t.elements) for t in
            norm_saved(w, label, rows, width)]  # fmt: skip
