"""Muon's orthogonalisation in the optimizer step (Jordan et al. 2024, "Muon: an optimizer for hidden layers"): each
matrix's momentum update X (m × n, m ≤ n after a transpose) runs ``newton_schulz_steps`` iterations of

    A = X·Xᵀ (2·m²·n FLOPs),   B = b·A + c·A·A (2·m³),   X = a·X + B·X (2·m²·n),

4·m²·n + 2·m³ FLOPs each, as torch.optim.Muon's ``_zeropower_via_newtonschulz`` runs them (three GEMMs, in bf16)
and Megatron-Core's ``newton_schulz_tp``. They are timed as GEMMs of those shapes at the chip's bf16 rate. Where the
optimizer's states are sharded over the data-parallel replicas, each matrix is orthogonalised once, on the replica
that holds its states (Megatron-Core's layer-wise distributed optimizer), so a GPU takes its share of the stage's
matrices; a GPU takes the stage's matrices at the model's average per parameter, dense and routed experts apart.
A tensor-parallel rank orthogonalises its own shard (Megatron-Core's ``blockwise`` mode, Megatron-Bridge's default),
counted as its share of the whole matrix's time.
"""

from __future__ import annotations

import functools

from lmcalc.engine.finetune.method import Method, trained_tensors
from lmcalc.engine.parallel.states import orthogonalised
from lmcalc.engine.time import rates
from lmcalc.specs import HardwareSpec, ModelSpec

NS_BYTES = 2  # torch.optim.Muon orthogonalises in bf16 (``grad.bfloat16()``); Megatron-Core's "medium" fp32 precision


def matrix_flops(rows: int, cols: int, steps: int) -> float:
    """FLOPs of ``steps`` Newton-Schulz iterations on a rows × cols matrix: steps · (4·m²·n + 2·m³), m ≤ n."""
    m, n = sorted((rows, cols))
    return steps * (4 * m * m * n + 2 * m**3)


def _matrix_seconds(hardware: HardwareSpec, rows: int, cols: int, steps: int, cal: rates.Calibration) -> float:
    m, n = sorted((rows, cols))
    rate = rates.matmul_rate(hardware, "bf16").flops_per_s
    one = sum(
        rates.gemm_seconds(hardware, rate, shape, NS_BYTES, cal=cal) for shape in ((m, m, n), (m, m, m), (m, n, m))
    )
    return steps * one


@functools.lru_cache(maxsize=256)
def seconds_per_param(
    model: ModelSpec, method: Method, steps: int, hardware: HardwareSpec, cal: rates.Calibration
) -> tuple[float, float]:
    """Seconds of orthogonalisation per trained parameter of the model, (dense, routed experts): each class's
    matrices' Newton-Schulz time over all its trained parameters (its vectors, embedding and head included)."""
    time = {False: 0.0, True: 0.0}
    params = {False: 0.0, True: 0.0}
    for tensor, share in trained_tensors(model, method):
        expert = tensor.group == "experts" or tensor.name.startswith("experts.")
        params[expert] += tensor.total * share
        if steps and orthogonalised(tensor):
            rows, cols = tensor.shape
            time[expert] += tensor.count * share * _matrix_seconds(hardware, rows, cols, steps, cal)
    return tuple(time[e] / params[e] if params[e] else 0.0 for e in (False, True))  # type: ignore[return-value]


def orthogonalisation_seconds(
    model: ModelSpec, method: Method, steps: int, machine: rates.Machine, dense: float, experts: float
) -> float:
    """One GPU's orthogonalisation in a step: its ``dense`` and ``experts`` trained parameters (the share whose
    states it holds) at the model's seconds per parameter of each."""
    if not steps:
        return 0.0
    per_dense, per_expert = seconds_per_param(model, method, steps, machine.hardware, machine.calibration)
    return dense * per_dense + experts * per_expert
