"""Which device a benchmark runs on, which hardware preset it is, and the peak to compare against.

GPUs are matched to a preset by the name ``torch.cuda.get_device_name`` reports (hardware presets list
those names as aliases). A CPU has no spec-sheet peak in the presets; its FP32 peak is estimated as
physical cores × clock × FLOPs per cycle (FMA units × vector lanes × 2), the formula of the reference
notes (``cpu_peak_fp32``), and always labelled an estimate.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass, field
from typing import Any

import torch

from lmcalc.bench.choices import DEVICES
from lmcalc.engine.choices import one_of
from lmcalc.errors import LmcalcError, setting
from lmcalc.presets import normalise, registry, resolve_hardware
from lmcalc.specs import HardwareSpec

# FP32 FLOPs per cycle per core (two FMAs of 8 or 16 lanes, 2 FLOPs each), by vector unit; sources in
# ../shared/reference/hardware_facts.yaml methods.cpu_peak_fp32 (uncertain for the AVX-512 rows).
FLOPS_PER_CYCLE = {
    "avx512-2fma": 64,  # Intel Skylake-SP .. Sapphire Rapids server parts; AMD Zen 5
    "avx512-zen4": 32,  # AMD Zen 4 runs AVX-512 on 256-bit units
    "avx2-fma": 32,  # Haswell .. Coffee Lake, AMD Zen 2/3
    "avx": 16,  # Sandy/Ivy Bridge, no FMA
}


@dataclass(frozen=True)
class Device:
    torch_device: torch.device
    name: str
    hardware: HardwareSpec | None
    peak_tflops: dict[str, float] = field(default_factory=dict)
    peak_source: str = ""
    peak_is_estimate: bool = False

    def peak(self, dtype: str) -> float | None:
        """Dense peak in FLOP/s for ``dtype``, or None when neither a preset nor an estimate has one."""
        value = self.peak_tflops.get(dtype)
        return value * 1e12 if value else None


def match_hardware(name: str) -> HardwareSpec | None:
    """The preset whose name or alias is the device's reported name, if any."""
    reg = registry("hardware")
    key = normalise(name)
    if key in reg.names:
        return reg.spec(reg.names[key])  # type: ignore[return-value]
    return None


def _cpu_uarch() -> tuple[str, str]:
    caps: dict[str, Any] = getattr(torch.cpu, "get_capabilities", lambda: {})()
    vendor = platform.processor() or caps.get("cpu_name", "")
    name = caps.get("cpu_name") or vendor or "CPU"
    if caps.get("avx512_f"):
        amd = "AMD" in name.upper()
        return name, "avx512-zen4" if amd and not caps.get("avx512_vp2intersect") else "avx512-2fma"
    if caps.get("avx2") and caps.get("fma3"):
        return name, "avx2-fma"
    if caps.get("avx"):
        return name, "avx"
    return name, ""


def cpu_clock_hz() -> float | None:
    """The current clock of the first core from /proc/cpuinfo (Linux), or None."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("cpu MHz"):
                    return float(line.split(":")[1]) * 1e6
    except OSError:
        return None
    return None


def cpu_device() -> Device:
    name, uarch = _cpu_uarch()
    caps: dict[str, Any] = getattr(torch.cpu, "get_capabilities", lambda: {})()
    cores = caps.get("num_physical_cores") or os.cpu_count() or 1
    clock = cpu_clock_hz()
    if not uarch or clock is None:
        return Device(torch.device("cpu"), name, None, {}, "no FP32 peak: unknown vector unit or clock")
    per_cycle = FLOPS_PER_CYCLE[uarch]
    fp32 = cores * clock * per_cycle / 1e12
    source = (
        f"estimate: {cores} cores × {clock / 1e9:.2f} GHz × {per_cycle} FP32 FLOPs/cycle ({uarch}); "
        "peak = cores × clock × FMA units × lanes × 2 (hardware_facts.yaml, cpu_peak_fp32)"
    )
    return Device(torch.device("cpu"), name, None, {"fp32": fp32}, source, peak_is_estimate=True)


def detect(device: str = "auto", hardware: str | None = None) -> Device:
    """The device to benchmark (``auto``: CUDA, else MPS, else CPU) and its peak."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise LmcalcError(f"{setting('device')} cuda: no CUDA device is available here (try {setting('device')} cpu)")
    if device == "mps" and not torch.backends.mps.is_available():
        raise LmcalcError(f"{setting('device')} mps: no Apple GPU is available here (try {setting('device')} cpu)")
    if device not in DEVICES:
        raise LmcalcError(f"{setting('device')} must be {one_of(DEVICES)}; got {device!r}")
    if device == "cpu":
        if hardware is not None:
            raise LmcalcError(
                f"{setting('hardware')} names an accelerator preset; this run is on the CPU "
                f"(drop {setting('hardware')})"
            )
        return cpu_device()
    name = torch.cuda.get_device_name(0) if device == "cuda" else ("Apple GPU" if device == "mps" else "CPU")
    spec = resolve_hardware(hardware).spec if hardware else match_hardware(name)
    if spec is None:
        return Device(torch.device(device), name, None, {}, f"no hardware preset matches {name!r} (use --hardware)")
    source = spec.sources.get("compute", spec.name) + ("" if hardware is None else " (--hardware)")
    peak_tflops: dict[str, float] = {key: value for key, value in spec.peak_tflops_dense.items()}
    return Device(torch.device(device), name, spec, peak_tflops, source)
