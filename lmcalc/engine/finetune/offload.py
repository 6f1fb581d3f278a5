"""Offloading model states off the GPU: ZeRO-Offload, ZeRO-Infinity and FSDP's CPU offload.

* ``optimizer`` (ZeRO-Offload, Ren et al. 2021 §4): the optimizer states and the fp32 master weights live in host
  memory, and the optimizer step runs on the CPU. Each step the GPU sends its 16-bit gradients down, the CPU keeps
  an fp32 copy of them, updates, and sends the 16-bit weights back up. The GPU keeps the 16-bit weights and
  gradients.
* ``optimizer+params`` (ZeRO-Infinity's parameter offload, Rajbhandari et al. 2021; FSDP ``CPUOffload(
  offload_params=True)``): the 16-bit weights and gradients go to the host as well, and each layer's weights are
  fetched to the GPU for its forward and again for its backward pass, as ZeRO-3 gathers them. It is ZeRO-3's
  (``--zero 3``).
* On NVMe (ZeRO-Infinity) the same states sit on the node's NVMe drives instead of in host memory; the host's
  staging buffers are not counted.

What offload costs in time, per step and GPU: the transfers over the GPU's host link (PCIe) and the CPU's
optimizer step, at a stated link bandwidth and a stated CPU optimizer throughput, both assumptions the user can
replace. lmcalc counts them as not overlapped with the GPU's work: an upper bound, since DeepSpeed overlaps the
gradient copy with the backward pass and can delay the parameter update by one step (Ren et al. 2021 §4.2).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, get_args

from lmcalc.engine.choices import one_of
from lmcalc.errors import LmcalcError, setting

OffloadTarget = Literal["none", "optimizer", "optimizer+params"]
OffloadDevice = Literal["cpu", "nvme"]
OFFLOAD_TARGETS: tuple[OffloadTarget, ...] = get_args(OffloadTarget)
OFFLOAD_DEVICES: tuple[OffloadDevice, ...] = get_args(OffloadDevice)

HOST_LINK_GBPS = 25.0
"""Host-to-GPU bandwidth, one direction, GB/s: an assumption, 80 % of PCIe 4.0 ×16's 31.5 GB/s per direction
(PCI-SIG), about what pinned-memory copies reach. Replace it with ``host_link_gbps`` (PCIe 5.0 ×16: 63 GB/s)."""

CPU_OPTIMIZER_PARAMS_PER_S = 1e9
"""Parameters a node's CPUs update per second with a vectorised Adam (DeepSpeed's CPUAdam): an assumption of the
right order for a server socket, not a measurement; replace it with ``cpu_optimizer_params_per_s``."""

FP32_GRAD_COPY = 4  # the CPU optimizer keeps an fp32 copy of the gradients it receives (Ren et al. 2021 §4.1)


@dataclass(frozen=True)
class Offload:
    """What leaves the GPU, where to, and the two rates its time is counted at."""

    target: OffloadTarget = "none"
    device: OffloadDevice = "cpu"
    host_link_gbps: float = HOST_LINK_GBPS
    cpu_optimizer_params_per_s: float = CPU_OPTIMIZER_PARAMS_PER_S

    def __post_init__(self) -> None:
        if self.target not in OFFLOAD_TARGETS:
            raise LmcalcError(f"{setting('offload')} must be one of {one_of(OFFLOAD_TARGETS)}; got {self.target!r}")
        if self.device not in OFFLOAD_DEVICES:
            raise LmcalcError(
                f"{setting('offload_device')} must be one of {one_of(OFFLOAD_DEVICES)}; got {self.device!r}"
            )
        for name in ("host_link_gbps", "cpu_optimizer_params_per_s"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise LmcalcError(f"{setting(name)} must be a positive number, got {value}")

    @property
    def optimizer(self) -> bool:
        """Whether the optimizer states and master weights leave the GPU."""
        return self.target != "none"

    @property
    def params(self) -> bool:
        """Whether the weights and gradients leave the GPU too."""
        return self.target == "optimizer+params"

    @property
    def label(self) -> str:
        return "none" if self.target == "none" else f"{self.target} to {self.device.upper()}"


NO_OFFLOAD = Offload()


@dataclass(frozen=True)
class OffloadTime:
    """Seconds a step spends on offload, per GPU: transfers over the host link and the CPU's optimizer step."""

    transfers: float
    cpu_optimizer: float
    bytes_moved: float  # over one GPU's host link per step

    @property
    def total(self) -> float:
        return self.transfers + self.cpu_optimizer


def offload_time(
    offload: Offload, trained_params: float, grad_bytes: float, param_bytes: float, gpus_per_host: int
) -> OffloadTime:
    """One step's optimizer offload on one GPU whose shard holds ``trained_params`` trained parameters: their
    gradients down and their updated weights up over its host link, and the CPU's step, whose CPUs the
    ``gpus_per_host`` GPUs of a node share."""
    if not offload.optimizer:
        return OffloadTime(0.0, 0.0, 0.0)
    moved = trained_params * (grad_bytes + param_bytes)
    cpu = gpus_per_host * trained_params / offload.cpu_optimizer_params_per_s
    return OffloadTime(moved / (offload.host_link_gbps * 1e9), cpu, moved)


def fetch_seconds(offload: Offload, weight_bytes: float) -> float:
    """Parameter offload, per micro-batch: this GPU's ``weight_bytes`` of weights fetched from the host for the
    forward pass and again for the backward pass (ZeRO-Infinity, FSDP CPU offload)."""
    return 2 * weight_bytes / (offload.host_link_gbps * 1e9) if offload.params else 0.0


def check_offload(offload: Offload, zero: int) -> None:
    """Parameter offload is ZeRO-3's: the weights are gathered a layer at a time."""
    if offload.params and zero != 3:
        raise LmcalcError(
            f"{setting('offload')} optimizer+params offloads the weights, which only ZeRO-3 / FSDP full sharding "
            f"fetches a layer at a time: use {setting('zero')} 3 (got ZeRO-{zero})"
        )
