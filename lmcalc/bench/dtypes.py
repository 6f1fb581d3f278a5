"""The one table of the dtypes a benchmark runs in: lmcalc's name, the torch dtype its tensors are stored in,
and the floating-point format behind it (``lmcalc.engine.model.numerics.FORMATS``: storage bytes, machine epsilon).

The formats stay in ``numerics``, which never imports torch; this table adds only what torch calls them, by
name, so that it too can be read without importing torch. Each benchmark accepts its own subset
(``bench.choices``: matmuls all five, collectives fp32, bf16 and fp16, training steps fp32 and bf16).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from lmcalc.engine.model.numerics import FORMATS, FloatFormat

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class BenchDtype:
    """One ``--dtype`` of ``lmcalc bench``: how its tensors are stored and the format's arithmetic."""

    name: str  # the --dtype value
    torch_name: str  # the torch dtype the tensors are stored in (an attribute of the torch module)
    format: FloatFormat

    @property
    def bytes(self) -> int:
        """Storage bytes of one element."""
        return int(self.format.storage_bytes)

    @property
    def eps(self) -> float:
        """Machine epsilon, 2^−(fraction bits)."""
        return self.format.eps

    def torch(self) -> torch.dtype:
        import torch

        return getattr(torch, self.torch_name)


DTYPES: dict[str, BenchDtype] = {
    d.name: d
    for d in (
        BenchDtype("fp32", "float32", FORMATS["fp32"]),
        BenchDtype("tf32", "float32", FORMATS["tf32"]),  # TF32 matmuls read and write fp32 tensors
        BenchDtype("bf16", "bfloat16", FORMATS["bf16"]),
        BenchDtype("fp16", "float16", FORMATS["fp16"]),
        BenchDtype("fp8", "float8_e4m3fn", FORMATS["fp8-e4m3"]),  # the E4M3 that training uses (Micikevicius 2022)
    )
}


def default_dtype(device_type: str) -> str:
    """bf16 on CUDA (what GPUs train in), fp32 elsewhere (CPUs have no fast bf16 matmul to rely on)."""
    return "bf16" if device_type == "cuda" else "fp32"
