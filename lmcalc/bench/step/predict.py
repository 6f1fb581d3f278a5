"""What the engine says about a benchmark step before it runs: its FLOPs, its memory, and whether it fits.

* **Model FLOPs** per step = 3 × the engine's forward count per token × b·s (``engine.model.flops.step_flops``),
  attention counted full; recomputation is hardware work and enters the hardware FLOPs only.
* **Memory**: the engine's peak of a plain PyTorch step (``engine.memory.step_peak``), with the precision recipe
  plain PyTorch matches (``RECIPE_FOR_DTYPE``) and AdamW.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lmcalc.bench.device import Device
from lmcalc.bench.step.config import FLOP_CONVENTION, OPTIMIZER, RECIPE_FOR_DTYPE, StepSetup
from lmcalc.engine.choices import AttnConvention, Recompute
from lmcalc.engine.memory.gpu_memory import gpu_memory
from lmcalc.engine.memory.step_peak import StepPeak, plain_step_peak
from lmcalc.engine.model import flops as fl
from lmcalc.engine.model.params import count_params
from lmcalc.engine.parallel.layout import Layout
from lmcalc.engine.workload import Workload, dropout_mask_bytes
from lmcalc.errors import LmcalcError, setting
from lmcalc.presets import framework_profile, resolve_optimizer, resolve_precision
from lmcalc.specs import ModelSpec
from lmcalc.units import format_quantity, group

MEMINFO = "/proc/meminfo"
CPU_RAM_FRACTION = 0.5  # leave the other half of the machine's RAM to everything else
CPU_FALLBACK_LIMIT_BYTES = 4e9  # when MemTotal cannot be read: a limit any laptop meets
SMALLER_PRESETS = ("llama-3.2-1b", "gpt2-124m")


def model_flops_per_step(
    spec: ModelSpec, seq_len: int, micro_batch: int, convention: AttnConvention = FLOP_CONVENTION
) -> float:
    """3 · forward FLOPs per token · b · s: the work MFU is measured against (no recomputation)."""
    return fl.step_flops(spec, seq_len, convention=convention).model * seq_len * micro_batch


def hardware_flops_per_step(spec: ModelSpec, seq_len: int, micro_batch: int, recompute: Recompute) -> float:
    """Model FLOPs plus the forward work recomputation redoes in backward (Korthikanti et al. 2022 App. A)."""
    extra = fl.step_flops(spec, seq_len, recompute, FLOP_CONVENTION).recomputed
    return model_flops_per_step(spec, seq_len, micro_batch) + extra * seq_len * micro_batch


@dataclass(frozen=True)
class MemoryPrediction:
    """The engine's bytes for this step: model states under ``recipe`` with AdamW, and activations."""

    recipe: str
    bytes_per_param: float
    params: int
    states: float
    activations: float
    step: StepPeak  # the phases of the step: states and activations do not all live at once

    @property
    def total(self) -> float:
        return self.step.peak


def predict_memory(setup: StepSetup, device_type: str) -> MemoryPrediction:
    """States and saved activations of the whole model on one device (``gpu_memory`` on the trivial layout)
    and the step's peak, phase by phase (``plain_step_peak``), for ``setup`` on a ``device_type`` device.

    Dropout masks are bool on CUDA; PyTorch's CPU dropout keeps its mask in the input's dtype.
    """
    precision = resolve_precision(RECIPE_FOR_DTYPE[setup.dtype_on(device_type)]).spec
    optimizer = resolve_optimizer(OPTIMIZER).spec
    mask_bytes = dropout_mask_bytes(device_type, precision)
    s = setup
    w = Workload(
        s.model,
        precision,
        optimizer,
        s.seq_len,
        s.micro_batch,
        s.attention,
        s.recompute,
        mask_bytes,
        framework=framework_profile(),
    )
    one_device = gpu_memory(w, Layout(), 0)  # the whole model on one device, no ZeRO
    n = count_params(s.model).total
    return MemoryPrediction(
        precision.name, one_device.states / n, n, one_device.states, one_device.activations, plain_step_peak(w)
    )


def _gb(value: float) -> str:
    return format_quantity(value, "bytes", compact=True)


def ram_bytes() -> float | None:
    """MemTotal from ``/proc/meminfo`` (kB there are KiB), or None where it cannot be read."""
    try:
        with open(MEMINFO, encoding="utf-8") as info:
            for line in info:
                if line.startswith("MemTotal:"):
                    return float(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def memory_limit(device: Device) -> tuple[float, str]:
    """The most a step may need here, and how that limit was set."""
    if device.torch_device.type == "cuda":
        capacity = float(torch.cuda.get_device_properties(device.torch_device).total_memory)
        return capacity, f"the {_gb(capacity)} of the {device.name}"
    ram = ram_bytes()
    if ram is None:
        return CPU_FALLBACK_LIMIT_BYTES, f"{CPU_FALLBACK_LIMIT_BYTES / 1e9:g} GB (the machine's RAM is unknown)"
    limit = CPU_RAM_FRACTION * ram
    return limit, f"half of this machine's {_gb(ram)} RAM"


def smaller_presets(spec: ModelSpec) -> str:
    """The presets to suggest instead of ``spec``: ``a smaller preset (llama-3.2-1b, gpt2-124m)``."""
    names = [name for name in SMALLER_PRESETS if name != spec.name]
    return f"a smaller preset ({', '.join(names)})"


def check_fits(prediction: MemoryPrediction, setup: StepSetup, device: Device) -> None:
    """Refuse, in one line, a step the engine predicts will not fit (before anything is allocated)."""
    limit, why = memory_limit(device)
    if prediction.total <= limit:
        return
    p, spec = prediction, setup.model
    raise LmcalcError(
        f"{spec.name} at s={setup.seq_len}, b={setup.micro_batch} needs about {_gb(p.total)} at its peak "
        f"({p.bytes_per_param:g} bytes × {group(p.params)} parameters for {p.recipe} "
        f"AdamW, {_gb(p.activations)} of activations), more than {why}; "
        f"try {smaller_presets(spec)} or a shorter {setting('seq')} / smaller {setting('micro_batch')}"
    )
