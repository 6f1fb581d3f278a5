"""Parsing and printing of quantities, with the unit always attached.

Counts (parameters, tokens, FLOPs) use decimal suffixes: K = 1e3, M = 1e6, B = G = 1e9, T = 1e12,
P = 1e15. Bytes are printed both in decimal GB (1e9 bytes, as spec sheets print them) and binary GiB
(2**30 bytes, as ``torch.cuda`` and ``nvidia-smi`` report them), because the two differ by 7% and
confusing them is a classic way to over-fill a GPU.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from decimal import Decimal

from lmcalc.errors import LmcalcError, echo

COUNT_SUFFIXES: dict[str, float] = {"": 1.0, "K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12, "P": 1e15}
BYTE_SUFFIXES: dict[str, float] = {
    "B": 1.0,
    "KB": 1e3,
    "MB": 1e6,
    "GB": 1e9,
    "TB": 1e12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
}
GB = 1e9
GiB = 2**30
SECONDS_PER_DAY = 86_400.0
SECONDS_PER_HOUR = 3_600.0

_COUNT_RE = re.compile(r"^\s*([+-]?[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]?)\s*$")
_BYTES_RE = re.compile(r"^\s*([+-]?[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")


BINARY_COUNT_SUFFIXES: dict[str, float] = {"": 1.0, "K": 2**10, "M": 2**20, "G": 2**30}


def parse_count(text: str | float | int, what: str = "count", binary: bool = False) -> float:
    """Parse ``15T``, ``1.4T``, ``300B``, ``4M``, ``1e12`` or a plain number into a positive float.

    With ``binary`` (sequence lengths), K, M and G are powers of two: ``8K`` is 8192, as context lengths
    are quoted; token and parameter counts are decimal (``15T`` = 15·10¹²)."""
    suffixes = BINARY_COUNT_SUFFIXES if binary else COUNT_SUFFIXES
    if isinstance(text, int | float):
        value = float(text)
    else:
        match = _COUNT_RE.match(str(text))
        if not match or match.group(2).upper() not in suffixes:
            accepted = "K, M or G (binary: 8K = 8192)" if binary else "K, M, B, T or P (e.g. 15T, 1.4T, 300B, 4M, 1e12)"
            raise LmcalcError(f"cannot read {what} {echo(text)}; expected a number with an optional suffix {accepted}")
        value = float(match.group(1)) * suffixes[match.group(2).upper()]
    if not math.isfinite(value) or value <= 0:
        raise LmcalcError(f"{what} must be a positive number, got {echo(text)}")
    return value


def parse_bytes(text: str | float | int, what: str = "size") -> float:
    """Parse ``80GB``, ``79.6GiB``, ``512MiB`` or a plain number of bytes."""
    if isinstance(text, int | float):
        value = float(text)
    else:
        match = _BYTES_RE.match(str(text))
        suffix = match.group(2).upper() if match else ""
        if not match or (suffix and suffix not in BYTE_SUFFIXES):
            raise LmcalcError(
                f"cannot read {what} {echo(text)}; expected bytes with an optional unit "
                "B, KB, MB, GB, TB (decimal) or KiB, MiB, GiB, TiB (binary), e.g. 2GiB"
            )
        value = float(match.group(1)) * BYTE_SUFFIXES.get(suffix, 1.0)
    if not math.isfinite(value) or value < 0:
        raise LmcalcError(f"{what} must be zero or a positive number of bytes, got {echo(text)}")
    return value


MAX_TENSOR_ELEMENTS = 2**64
"""The most elements a tensor shape may have (1.8·10¹⁹): more than a 64-bit machine can address, and still a
count whose bytes a float holds."""


def parse_shape(text: str) -> tuple[int, ...]:
    """Parse a tensor shape written ``12288x49152`` (or with ``×`` or ``,``)."""
    parts = re.split(r"[x×,*]", text.strip().lower())
    if not all(re.fullmatch(r"\s*[+-]?[0-9]+\s*", p) for p in parts):
        raise LmcalcError(f"cannot read shape {echo(text)}; expected sizes joined by 'x', e.g. 12288x49152")
    digits = max(len(p.strip().lstrip("+").lstrip("0")) for p in parts)  # read no size Python would refuse to
    dims = tuple(int(p) for p in parts) if digits <= 20 else (MAX_TENSOR_ELEMENTS + 1,)  # a size of 10^20 or more
    if "-" in text:
        raise LmcalcError(f"every dimension of shape {echo(text)} must be a positive integer")
    return check_shape(dims, text)


def check_shape(dims: tuple[int, ...], written: str) -> tuple[int, ...]:
    """``dims`` if each is a positive whole number and a machine could address their product; else the reason,
    quoting the shape as it was ``written``."""
    if not dims or any(isinstance(d, bool) or not isinstance(d, int) or d <= 0 for d in dims):
        raise LmcalcError(f"every dimension of shape {echo(written)} must be a positive integer")
    if math.prod(dims) > MAX_TENSOR_ELEMENTS:
        raise LmcalcError(
            f"shape {echo(written)} has more than 2^64 elements (1.8e19), more than a 64-bit machine can address"
        )
    return dims


def si(value: float, digits: int = 3) -> str:
    """``7.0e10 -> '70.0 B'``: a count with a decimal suffix (B = billion)."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    for suffix, scale in (("P", 1e15), ("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.{digits}g} {suffix}"
    return f"{value:.{digits}g}"


def sci(value: float, digits: int = 3) -> str:
    """Scientific notation for big counts: ``3.14e+23``."""
    return f"{value:.{digits - 1}e}"


def group(value: float) -> str:
    """An exact integer with thousands separators, or a float to 6 significant figures (an integer too large for a
    float, too: ``1e+400``)."""
    if isinstance(value, int) and abs(value) >= 10**21:
        return f"{Decimal(value).normalize():.6g}"
    if float(value).is_integer() and abs(value) < 1e21:
        return f"{int(value):,}"
    return f"{value:.6g}"


SINGULAR = {
    "params": "param",
    "tokens": "token",
    "GPUs": "GPU",
    "sequences": "sequence",
    "nodes": "node",
    "layers": "layer",
    "micro-batches": "micro-batch",
    "days": "day",
    "replicas": "replica",
}


def format_quantity(value: float, unit: str, compact: bool = False) -> str:
    """Print a value with its unit the way an engineer would read it (``compact``: bytes in GB only)."""
    if math.isnan(value):
        return "n/a"
    if value == 1 and unit in SINGULAR:
        unit = SINGULAR[unit]
    if unit == "bytes":
        if abs(value) >= 1e9:
            return f"{value / GB:,.2f} GB" + ("" if compact else f" ({value / GiB:,.2f} GiB)")
        if abs(value) >= 1e6:
            return f"{value / 1e6:,.2f} MB" + ("" if compact else f" ({value / 2**20:,.2f} MiB)")
        return f"{group(value)} bytes"
    if unit == "FLOP/s":
        for prefix, scale in (("E", 1e18), ("P", 1e15), ("T", 1e12), ("G", 1e9)):
            if abs(value) >= scale:
                return f"{value / scale:,.4g} {prefix}FLOP/s"
        return f"{value:.4g} FLOP/s"
    if unit == "FLOPs":
        return f"{sci(value)} FLOPs"
    if unit == "elements":
        return f"{group(value)} elements"
    if unit in ("params", "tokens", "GPUs", "sequences", "nodes", "replicas", *SINGULAR.values()):
        # whole tokens, sequences and GPUs are printed exactly up to ten million (no K/M to misread)
        exact_below = 1e4 if unit in ("params", "param") else 1e7
        text = group(value) if abs(value) < exact_below else si(value, 4)
        return f"{text} {unit}"
    if unit == "GPU-hours" and abs(value) >= 100:
        return f"{value:,.0f} {unit}"
    if unit == "USD":
        return f"${value:,.0f}"
    if unit == "Wh":
        for prefix, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
            if abs(value) >= scale:
                return f"{value / scale:,.4g} {prefix}Wh"
        return f"{value:,.4g} Wh"
    if unit == "kg CO2e":
        return f"{value / 1000:,.4g} t CO2e" if abs(value) >= 1000 else f"{value:,.4g} kg CO2e"
    if unit == "":
        return f"{value:.6g}"
    if unit == "s" and 0 < abs(value) < 1:
        return f"{value * 1e3:.4g} ms" if abs(value) >= 1e-3 else f"{value * 1e6:.4g} µs"
    if unit == "ratio":
        return f"{value:.4g}"
    if unit == "%":
        return f"{value:.3g} %"
    return f"{value:,.4g} {unit}"


PREFIXES = (("P", 1e15), ("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3))
RATE_PREFIXES = (("E", 1e18), ("P", 1e15), ("T", 1e12), ("G", 1e9))


def column_format(unit: str, values: Iterable[float]) -> tuple[str, Callable[[float], str]]:
    """How a table's column of ``values`` in ``unit`` is printed: the unit its header names once (``GB``,
    ``B params``, ``K tokens/s``) and each cell's number without it, on one scale so the rows compare at a
    glance. A cell that is not available (NaN) reads ``n/a``."""
    top = max((abs(v) for v in values if math.isfinite(v)), default=0.0)

    def scaled(name: str, scale: float, spec: str) -> tuple[str, Callable[[float], str]]:
        return name, lambda v: "n/a" if math.isnan(v) else format(v / scale, spec)

    if unit == "bytes":
        name, scale = next(((n, s) for n, s in (("GB", GB), ("MB", 1e6)) if top >= s), ("bytes", 1.0))
        return scaled(name, scale, ",.2f" if scale > 1 else ",.6g")
    if unit == "FLOP/s":
        prefix, scale = next(((p, s) for p, s in RATE_PREFIXES if top >= s), ("", 1.0))
        return scaled(f"{prefix}FLOP/s", scale, ",.4g")
    if unit == "FLOPs":
        return unit, lambda v: "n/a" if math.isnan(v) else sci(v)
    if unit in ("params", "tokens", "tokens/s", "tokens/s/GPU", "GPUs", "sequences") and top >= 1e4:
        prefix, scale = next((p, s) for p, s in PREFIXES if top >= s)
        return scaled(f"{prefix} {unit}", scale, ",.4g")
    if unit in ("GPU-hours", "USD") and top >= 1e4:  # whole hours and dollars, in thousands or millions
        prefix, scale = next((p, s) for p, s in PREFIXES if top >= s)
        return scaled(f"{prefix} {unit}" if unit != "USD" else f"{prefix} $", scale, ",.4g")
    if unit in ("Wh", "kg CO2e") and top >= 1e3:  # as ``format_quantity`` scales them
        prefixes = (("G", 1e9), ("M", 1e6), ("k", 1e3)) if unit == "Wh" else (("t", 1e3),)
        prefix, scale = next((p, s) for p, s in prefixes if top >= s)
        return scaled(f"{prefix}Wh" if unit == "Wh" else "t CO2e", scale, ",.4g")
    if unit == "%":
        return scaled(unit, 1.0, ".3g")
    if unit in ("", "ratio"):  # as ``format_quantity`` prints them
        return scaled("", 1.0, ".6g" if unit == "" else ".4g")
    return scaled(unit, 1.0, ",.4g")
