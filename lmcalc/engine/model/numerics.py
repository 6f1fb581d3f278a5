"""Floating-point formats and tensor sizes: the first napkin math of the lecture.

A binary floating-point format with e exponent bits and m fraction bits has exponent bias 2^(e−1) − 1,
machine epsilon 2^−m, smallest normal 2^(1−bias) and, when the all-ones exponent is reserved for
inf/NaN (IEEE 754), largest value (2 − 2^−m) · 2^(2^e − 2 − bias). FP8 E4M3 as used for training
("E4M3FN", Micikevicius et al. 2022 §3) has no infinities: only the all-ones exponent with all-ones
fraction is NaN, so its largest value is (2 − 2·2^−m) · 2^(2^e − 1 − bias) = 448.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

from lmcalc.errors import LmcalcError


@dataclass(frozen=True)
class FloatFormat:
    name: str
    exponent_bits: int
    fraction_bits: int
    storage_bytes: float
    finite_only: bool = False  # E4M3FN: no inf, NaN only at S.1111.111
    source: str = "IEEE 754-2008"

    @property
    def bits(self) -> int:
        return 1 + self.exponent_bits + self.fraction_bits

    @property
    def bias(self) -> int:
        return 2 ** (self.exponent_bits - 1) - 1

    @property
    def eps(self) -> float:
        return 2.0**-self.fraction_bits

    @property
    def smallest_normal(self) -> float:
        return 2.0 ** (1 - self.bias)

    @property
    def smallest_subnormal(self) -> float:
        return 2.0 ** (1 - self.bias - self.fraction_bits)

    @property
    def max(self) -> float:
        if self.finite_only:
            return (2 - 2 * self.eps) * 2.0 ** (2**self.exponent_bits - 1 - self.bias)
        return (2 - self.eps) * 2.0 ** (2**self.exponent_bits - 2 - self.bias)


FORMATS: dict[str, FloatFormat] = {
    f.name: f
    for f in (
        FloatFormat("fp64", 11, 52, 8),
        FloatFormat("fp32", 8, 23, 4),
        FloatFormat(
            "tf32", 8, 10, 4, source="NVIDIA A100 whitepaper: TF32 = fp32 range, 10-bit fraction; stored as fp32"
        ),
        FloatFormat("fp16", 5, 10, 2),
        FloatFormat("bf16", 8, 7, 2, source="Google Brain bfloat16: fp32's exponent, 7-bit fraction"),
        FloatFormat(
            "fp8-e4m3", 4, 3, 1, finite_only=True, source="Micikevicius et al. 2022, FP8 Formats for Deep Learning"
        ),
        FloatFormat("fp8-e5m2", 5, 2, 1, source="Micikevicius et al. 2022, FP8 Formats for Deep Learning"),
    )
}
INTEGER_BYTES = {"int8": 1.0, "int4": 0.5, "uint8": 1.0, "int32": 4.0, "int64": 8.0}
DTYPE_ALIASES = {
    "float32": "fp32",
    "float": "fp32",
    "float16": "fp16",
    "half": "fp16",
    "bfloat16": "bf16",
    "float64": "fp64",
    "double": "fp64",
    "fp8": "fp8-e4m3",
    "e4m3": "fp8-e4m3",
    "e5m2": "fp8-e5m2",
    "float8_e4m3fn": "fp8-e4m3",
    "float8_e5m2": "fp8-e5m2",
}

SERVING_DTYPES = ("fp32", "fp16", "bf16", "fp8-e4m3", "fp8-e5m2", "int8", "int4")
"""Storage formats a model's weights and KV cache can be served in (the aliases above are accepted too:
``fp8`` is ``fp8-e4m3``)."""


def dtype_bytes(name: str) -> float:
    """Storage bytes of one element of ``name`` (fp32, bf16, fp8, int8, int4, ...)."""
    key = DTYPE_ALIASES.get(name.lower(), name.lower())
    if key in FORMATS:
        return FORMATS[key].storage_bytes
    if key in INTEGER_BYTES:
        return INTEGER_BYTES[key]
    accepted = ", ".join([*FORMATS, *INTEGER_BYTES])
    raise LmcalcError(f"unknown dtype '{name}'; accepted: {accepted}")


def tensor_elements(shape: tuple[int, ...]) -> int:
    return prod(shape)
