"""An accelerator as its spec sheet and measurements describe it (``HardwareSpec``), and a cluster of them
(``Cluster``). ``specs`` re-exports both; the rest of lmcalc takes them from there.

The annotations are types, not text (no ``from __future__ import annotations``), for the reason ``specs`` gives."""

from dataclasses import dataclass

from pydantic import Field

from lmcalc.spec_base import ComputeDtype, NamedSpec, PositiveFloat, PositiveInt, no_entries, no_items


class HardwareSpec(NamedSpec):
    """One accelerator as its spec sheet describes it: dense peaks, memory, links, power."""

    display_name: str = ""
    aliases: tuple[str, ...] = Field(default_factory=no_items)
    vendor: str
    memory_bytes: PositiveInt = Field(description="device memory in bytes, stated exactly (see memory_note)")
    memory_label: str = Field(description="the spec sheet's wording, e.g. '80 GB HBM3'")
    memory_note: str = ""
    cuda_memory_bytes: PositiveInt | None = Field(
        None,
        description="device memory as CUDA gives it to a process (cudaMemGetInfo's total, torch's total_memory), as "
        "measured; source under sources['cuda_memory']. None: not measured, the label's bytes are budgeted",
    )
    memory_bandwidth_tbps: PositiveFloat = Field(description="HBM bandwidth in TB/s (1e12 bytes/s)")
    peak_tflops_dense: dict[ComputeDtype, PositiveFloat] = Field(
        description="dense (no 2:4 sparsity) peak TFLOP/s per dtype (int8 in TOP/s)"
    )
    sparsity_note: str = ""
    gpus_per_node: PositiveInt = 8
    intra_node_gbps: PositiveFloat | None = Field(
        None, description="scale-up bandwidth per GPU, one direction, GB/s (NVLink, xGMI, ICI)"
    )
    inter_node_gbps: PositiveFloat | None = Field(
        None, description="scale-out bandwidth per GPU, one direction, GB/s (NIC Gb/s / 8)"
    )
    tdp_watts: PositiveFloat | None = None
    architecture: str | None = Field(
        None, description="the chip generation (ampere, hopper, blackwell, cdna3, tpu-v5p, ...): picks kernel rates"
    )
    compute_units: PositiveInt | None = Field(
        None, description="streaming multiprocessors (NVIDIA), compute units (AMD) or cores: wave quantisation"
    )
    matmul_tflops: dict[ComputeDtype, PositiveFloat] = Field(
        default_factory=no_entries,
        description="maximum achievable matmul TFLOP/s per dtype, measured at the best shape (MAMF); "
        "source under sources['matmul']",
    )
    intra_node_busbw_gbps: PositiveFloat | None = Field(
        None,
        description="measured ring all-reduce bus bandwidth within a node at large messages, GB/s "
        "(nccl-tests busbw); source under sources['collectives']",
    )
    inter_node_busbw_gbps: PositiveFloat | None = Field(
        None,
        description="measured ring bus bandwidth per GPU across nodes at large messages, GB/s; "
        "source under sources['collectives']",
    )
    scale_up_gpus: PositiveInt | None = Field(
        None,
        description="devices one scale-up fabric joins when it is larger than a node (GB200 NVL72: 72; a TPU "
        "slice's ICI); None: the node",
    )
    sources: dict[str, str] = Field(default_factory=no_entries, description="source per group of figures")
    notes: tuple[str, ...] = Field(default_factory=no_items)
    clock_fraction: float = Field(
        1.0,
        gt=0,
        le=1,
        description="the tensor cores' clock as a fraction of the one the peaks and matmul rates were taken at (a "
        "power cap or a locked clock): matmul and attention rates scale with it, memory and links do not",
    )

    def peak_flops(self, dtype: str) -> float:
        """Dense peak in FLOP/s (not TFLOP/s) for a compute dtype."""
        return self.peak_tflops_dense[dtype] * 1e12  # type: ignore[index]

    @property
    def capacity_bytes(self) -> int:
        """The memory a training or serving process can fill: CUDA's total where measured, else the label's bytes.
        An HBM GPU's label counts binary gigabytes as GB (an H100's "80 GB" is 79.19 GiB to CUDA, 85.03 x 10^9
        bytes: 6 % above the label read as decimal); a GDDR card with ECC on gives CUDA a little less than its label
        (a T4's "16 GB" is 14.75 GiB, 15.84 x 10^9 bytes)."""
        return self.cuda_memory_bytes or self.memory_bytes

    @property
    def capacity_label(self) -> str:
        """``80 GB HBM3, 79.19 GiB to CUDA``, or the label alone where CUDA's total is not measured."""
        if self.cuda_memory_bytes is None:
            return self.memory_label
        return f"{self.memory_label}, {self.cuda_memory_bytes / 2**30:.2f} GiB to CUDA"

    @property
    def label(self) -> str:
        return self.display_name or self.name

    def scale_up_domain(self, gpus_per_node: int) -> int:
        """The GPUs one scale-up fabric joins: a node's, or an NVLink domain of several nodes (GB200 NVL72's 72)."""
        return max(gpus_per_node, self.scale_up_gpus or 1)


@dataclass(frozen=True)
class Cluster:
    """``count`` accelerators of one kind, ``gpus_per_node`` to a node (parsed from ``128x8xH100``)."""

    hardware: HardwareSpec
    count: int
    gpus_per_node: int

    @property
    def nodes(self) -> int:
        return -(-self.count // self.gpus_per_node)

    @property
    def scale_up(self) -> int:
        """The GPUs one scale-up fabric joins (``HardwareSpec.scale_up_domain``)."""
        return self.hardware.scale_up_domain(self.gpus_per_node)

    @property
    def label(self) -> str:
        if self.nodes > 1 and self.gpus_per_node > 1 and self.count % self.gpus_per_node == 0:
            return f"{self.nodes}x{self.gpus_per_node}x{self.hardware.name}"
        return f"{self.count}x{self.hardware.name}"
