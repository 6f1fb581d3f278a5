"""What ``run_steps`` measured, and the figures derived from it: tokens/s, model FLOP/s, MFU and HFU.

* tokens/s = b·s / median step time.
* **MFU** = model FLOPs per step / (median step time × the device's dense peak for the dtype), the peak
  from ``Device.peak`` (a hardware preset, or a labelled estimate on a CPU); Chowdhery et al. 2022 (PaLM)
  §4.1 and App. B. Where the device has no peak for the dtype, MFU is None: no peak is ever invented.
* **HFU**: the same with the hardware FLOPs, recomputation counted (PaLM §4.1).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lmcalc.bench.device import Device
from lmcalc.bench.step.config import StepSetup
from lmcalc.bench.step.predict import MemoryPrediction, hardware_flops_per_step, model_flops_per_step
from lmcalc.bench.timing import Stats


def peak_key(device: Device, dtype: str) -> str:
    """The ``peak_tflops_dense`` key the matmuls run at: fp32 on CUDA is TF32 when torch allows it."""
    if dtype == "fp32" and device.torch_device.type == "cuda" and torch.get_float32_matmul_precision() != "highest":
        return "tf32"
    return dtype


@dataclass(frozen=True)
class StepMeasurement:
    """What ``run_steps`` timed and read, with the figures derived from it."""

    setup: StepSetup
    device: Device
    seconds: tuple[float, ...]  # one per timed step
    losses: tuple[float, ...]  # every step, warm-up included, in order
    predicted: MemoryPrediction
    measured_peak_bytes: float | None  # less module buffers: CUDA allocator or CPU live storages; None on MPS
    threads: int  # torch.get_num_threads() during the run

    @property
    def dtype(self) -> str:
        return self.setup.dtype_on(self.device.torch_device.type)

    @property
    def stats(self) -> Stats:
        return Stats.of(list(self.seconds))

    @property
    def tokens_per_s(self) -> float:
        return self.setup.tokens / self.stats.median

    @property
    def model_flops(self) -> float:
        s = self.setup
        return model_flops_per_step(s.model, s.seq_len, s.micro_batch)

    @property
    def hardware_flops(self) -> float:
        s = self.setup
        return hardware_flops_per_step(s.model, s.seq_len, s.micro_batch, s.recompute)

    @property
    def achieved_flops_per_s(self) -> float:
        return self.model_flops / self.stats.median

    @property
    def peak_key(self) -> str:
        return peak_key(self.device, self.dtype)

    @property
    def peak_flops_per_s(self) -> float | None:
        return self.device.peak(self.peak_key)

    def utilisation(self, flops_per_step: float) -> float | None:
        """``flops_per_step`` / (median step time × peak), or None where the device has no peak."""
        peak = self.peak_flops_per_s
        return flops_per_step / (self.stats.median * peak) if peak else None

    @property
    def mfu(self) -> float | None:
        return self.utilisation(self.model_flops)

    @property
    def hfu(self) -> float | None:
        return self.utilisation(self.hardware_flops)
