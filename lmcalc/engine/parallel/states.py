"""Model states per parameter: weights, gradients, the master copy and the optimizer's states, in bytes.

With mixed-precision Adam each parameter costs 2 bytes (16-bit weights) + 2 (16-bit gradients) + K = 12
(fp32 master, momentum, variance) = 16 bytes (Rajbhandari et al. 2020 (ZeRO) §3.1); the precision recipe
gives the first three, the optimizer its states: one per state tensor and parameter, except for
factored states (Adafactor: a row and a column statistic per matrix) and block-wise quantised ones (8-bit
Adam: one fp32 scale per block). How ZeRO shards them is ``engine.parallel.sharding``'s rule.
"""

from __future__ import annotations

import functools
import math

from lmcalc.engine.choices import ZeroStage
from lmcalc.engine.finetune.method import FULL, Method, trained_tensors
from lmcalc.engine.model.tensors import WeightTensor
from lmcalc.engine.parallel.sharding import zero_divisor
from lmcalc.recipe_specs import OptimizerSpec, OptimizerState, PrecisionRecipe
from lmcalc.specs import ModelSpec

SCALE_BYTES = 4  # block-wise quantised optimizer states keep one fp32 scale per block (Dettmers et al. 2022)
UNQUANTISED_BYTES = 4  # a tensor too small to quantise keeps its state in fp32 (bitsandbytes)


def optimizer_state_bytes(
    model: ModelSpec, precision: PrecisionRecipe, optimizer: OptimizerSpec, method: Method = FULL
) -> float:
    """Bytes of every optimizer state for the whole model (unsharded): of the weights ``method`` trains."""
    total = 0.0
    for state in optimizer.states:
        per_element = state.bytes if state.bytes is not None else precision.optimizer_state_bytes
        for tensor, share in trained_tensors(model, method):
            if keeps(state, tensor):
                total += tensor.count * share * _state_bytes(state, tensor.shape, per_element)
    return total


def orthogonalised(tensor: WeightTensor) -> bool:
    """Whether Muon orthogonalises ``tensor``'s update: a 2-D weight other than the embedding and the output head
    (Megatron-Core's ``_is_nonlinear_or_embedding`` leaves them to its scalar optimizer; torch.optim.Muon takes 2-D
    parameters alone; Jordan et al. 2024, "Muon")."""
    return len(tensor.shape) == 2 and tensor.group not in ("embedding", "head")


def keeps(state: OptimizerState, tensor: WeightTensor) -> bool:
    """Whether ``tensor`` keeps ``state``: every tensor, or only Muon's matrices, or only the others."""
    return state.params == "all" or orthogonalised(tensor) == (state.params == "matrices")


def trained_params(model: ModelSpec, method: Method = FULL) -> float:
    """The parameters ``method`` trains."""
    return sum(t.total * share for t, share in trained_tensors(model, method))


@functools.lru_cache(maxsize=256)
def matrix_params(model: ModelSpec, method: Method = FULL) -> float:
    """The trained parameters in the matrices Muon orthogonalises (``orthogonalised``)."""
    return sum(t.total * share for t, share in trained_tensors(model, method) if orthogonalised(t))


def _state_bytes(state: OptimizerState, shape: tuple[int, ...], per_element: float) -> float:
    """One tensor's bytes of one optimizer state: its elements (a factored state of a matrix keeps a row and a
    column statistic, Shazeer & Stern 2018), and for a block-wise quantised state one fp32 scale per block and its
    quantisation map, unless the tensor is too small to be quantised (Dettmers et al. 2022; bitsandbytes)."""
    numel = math.prod(shape)
    if state.factored and len(shape) == 2:
        return sum(shape) * per_element
    if not state.quantization_block:
        return numel * per_element
    if state.min_quantized_elements and numel < state.min_quantized_elements:
        return numel * UNQUANTISED_BYTES
    return numel * per_element + math.ceil(numel / state.quantization_block) * SCALE_BYTES + state.map_bytes


@functools.lru_cache(maxsize=1024)
def optimizer_bytes_per_param(
    model: ModelSpec, precision: PrecisionRecipe, optimizer: OptimizerSpec, method: Method = FULL
) -> float:
    """Optimizer bytes per trained parameter of ``model`` (exact for unfactored optimizers)."""
    return optimizer_state_bytes(model, precision, optimizer, method) / trained_params(model, method)


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
    n = {"all": n, "matrices": "N_matrices", "others": f"({n} − N_matrices)"}[state.params]
    text = f"Σ_matrices (rows + cols) · {per_element:g} B" if state.factored else f"{n} · {per_element:g} B"
    if state.quantization_block:
        text += f" + ⌈{n} / {state.quantization_block}⌉ · {SCALE_BYTES} B"
        if state.min_quantized_elements:
            text += f" (fp32 for tensors under {state.min_quantized_elements:,} elements)"
    return f"{text} ({state.name})"
