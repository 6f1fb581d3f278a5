"""Device memory bandwidth: time a large copy; each copy reads and writes the buffer (2 × size bytes)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lmcalc.bench.device import Device
from lmcalc.bench.timing import Stats, time_calls

GPU_COPY_BYTES = 2 * 2**30
CPU_COPY_BYTES = 256 * 2**20


@dataclass(frozen=True)
class BandwidthMeasurement:
    size: int  # bytes of one buffer
    stats: Stats

    @property
    def bytes_moved(self) -> int:
        return 2 * self.size  # read once, written once

    @property
    def bytes_per_s(self) -> float:
        return self.bytes_moved / self.stats.median


def measure(device: Device, size: int | None = None, warmup: int = 5, repeats: int = 20) -> BandwidthMeasurement:
    size = size or (GPU_COPY_BYTES if device.torch_device.type != "cpu" else CPU_COPY_BYTES)
    elements = size // 4
    source = torch.randn(elements, device=device.torch_device)
    target = torch.empty_like(source)
    seconds = time_calls(lambda _: target.copy_(source), device.torch_device, warmup, repeats)
    return BandwidthMeasurement(elements * 4, Stats.of(seconds))
