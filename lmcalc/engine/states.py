"""Model states per parameter: weights, gradients, the master copy and the optimizer's states, in bytes.

With mixed-precision Adam each parameter costs 2 bytes (16-bit weights) + 2 (16-bit gradients) + K = 12
(fp32 master, momentum, variance) = 16 bytes (Rajbhandari et al. 2020 (ZeRO) §3.1); the precision recipe
gives the first three, the optimizer its states: one per state tensor and parameter, except for
factored states (Adafactor: a row and a column statistic per matrix) and block-wise quantised ones (8-bit
Adam: one fp32 scale per block). How ZeRO shards them is ``engine.sharding``'s rule.
"""

from __future__ import annotations

import functools

from lmcalc.engine.choices import ZeroStage
from lmcalc.engine.method import FULL, Method, trained_tensors
from lmcalc.engine.sharding import zero_divisor
from lmcalc.specs import ModelSpec, OptimizerSpec, OptimizerState, PrecisionRecipe

SCALE_BYTES = 4  # block-wise quantised optimizer states keep one fp32 scale per block (Dettmers et al. 2022)


def optimizer_state_bytes(
    model: ModelSpec, precision: PrecisionRecipe, optimizer: OptimizerSpec, method: Method = FULL
) -> float:
    """Bytes of every optimizer state for the whole model (unsharded): of the weights ``method`` trains."""
    trained = trained_tensors(model, method)
    n_params = sum(t.total * share for t, share in trained)
    total = 0.0
    for state in optimizer.states:
        per_element = state.bytes if state.bytes is not None else precision.optimizer_state_bytes
        if state.factored:
            # Shazeer & Stern 2018: a row and a column statistic per matrix instead of r·c values.
            elements = sum(t.count * share * (sum(t.shape) if len(t.shape) == 2 else t.numel) for t, share in trained)
        else:
            elements = n_params
        total += elements * per_element
        if state.quantization_block:
            total += n_params / state.quantization_block * SCALE_BYTES
    return total


@functools.lru_cache(maxsize=1024)
def optimizer_bytes_per_param(
    model: ModelSpec, precision: PrecisionRecipe, optimizer: OptimizerSpec, method: Method = FULL
) -> float:
    """Optimizer bytes per trained parameter of ``model`` (exact for unfactored optimizers)."""
    trained = sum(t.total * share for t, share in trained_tensors(model, method))
    return optimizer_state_bytes(model, precision, optimizer, method) / trained


def bytes_per_param(precision: PrecisionRecipe, optimizer_bytes: float, zero_stage: ZeroStage, dp: int) -> float:
    """Per-GPU bytes of model state per parameter after ZeRO sharding over ``dp`` replicas, with
    ``optimizer_bytes`` of optimizer states per parameter."""
    return (
        precision.param_bytes / zero_divisor("params", zero_stage, dp)
        + precision.grad_bytes / zero_divisor("grads", zero_stage, dp)
        + (precision.master_bytes + optimizer_bytes) / zero_divisor("optimizer", zero_stage, dp)
    )


def state_formula(state: OptimizerState, precision: PrecisionRecipe, n: str = "N") -> str:
    per_element = state.bytes if state.bytes is not None else precision.optimizer_state_bytes
    text = f"Σ_matrices (rows + cols) · {per_element:g} B" if state.factored else f"{n} · {per_element:g} B"
    if state.quantization_block:
        text += f" + {n} / {state.quantization_block} · {SCALE_BYTES} B"
    return f"{text} ({state.name})"
