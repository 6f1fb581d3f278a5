"""What a collective benchmark measures, and nccl-tests' definitions of what it reports.

    algbw = S / t                   S in bytes, t in seconds, GB = 1e9 bytes
    busbw = algbw × factor          all-reduce 2(n−1)/n; all-gather and reduce-scatter (n−1)/n

(NVIDIA nccl-tests, doc/PERFORMANCE.md and the ``GetBw`` functions in src/*.cu; the reference notes
``hardware_facts.yaml`` section ``methods.nccl_tests``.) No torch here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

from lmcalc.bench.choices import COMM_DTYPES, OPS, Op
from lmcalc.bench.dtypes import DTYPES
from lmcalc.engine.time.comm import ring_factor
from lmcalc.errors import LmcalcError, setting

SOURCE = "NVIDIA nccl-tests doc/PERFORMANCE.md"


def busbw_factor(op: str, world_size: int) -> float:
    """nccl-tests' bus-bandwidth factor: all-reduce 2(n−1)/n, all-gather and reduce-scatter (n−1)/n, the ring's
    bytes per GPU that the step-time model charges too (``engine.time.comm.ring_factor``)."""
    if op not in OPS:
        raise LmcalcError(f"unknown collective {op!r}; expected one of {', '.join(OPS)}")
    return ring_factor(cast(Op, op), world_size)


def element_count(op: str, nbytes: int, world_size: int, dtype: str = "fp32") -> int:
    """Elements in the whole array for a requested size: all-gather and reduce-scatter round down to a
    multiple of the rank count, as nccl-tests does, so every rank holds an equal share."""
    element = DTYPES[dtype].bytes
    count = nbytes // element
    if op != "all-reduce":
        count -= count % world_size
    least = 1 if op == "all-reduce" else world_size
    if count < least:
        raise LmcalcError(
            f"message size {nbytes} bytes is too small for {op} of {dtype} over {world_size} ranks; "
            f"the least is {least * element} bytes"
        )
    return count


@dataclass(frozen=True)
class CommSettings:
    """What to measure and how, the same on every rank: collectives (one of ``OPS``, or several, in any
    case, ``_`` for ``-``; repeats dropped), requested sizes in bytes, dtype, untimed calls per size, timed
    repeats per size, whether one call's output is checked first, and the seed of the random inputs."""

    ops: str | Sequence[str]
    sizes: Sequence[int]
    dtype: str = "fp32"
    warmup: int = 5
    repeats: int = 20
    check: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "ops", _checked_ops(self.ops))
        object.__setattr__(self, "sizes", tuple(int(s) for s in self.sizes))
        if not self.sizes:
            raise LmcalcError("no message sizes given")
        if self.dtype not in COMM_DTYPES:
            accepted = ", ".join(COMM_DTYPES)
            raise LmcalcError(f"{setting('dtype')} for collectives must be one of {accepted}; got {self.dtype!r}")
        if self.warmup < 0 or self.repeats < 1:
            raise LmcalcError(f"need warmup ≥ 0 and repeats ≥ 1; got warmup {self.warmup}, repeats {self.repeats}")

    def check_sizes(self, world_size: int) -> None:
        """Refuse a size too small for a collective over ``world_size`` ranks, before anything starts."""
        for op in self.ops:
            for size in self.sizes:
                element_count(op, size, world_size, self.dtype)


def _checked_ops(op: str | Sequence[str]) -> tuple[str, ...]:
    names = [op] if isinstance(op, str) else list(op)
    ops = [name.strip().lower().replace("_", "-") for name in names]
    for name, given in zip(ops, names, strict=True):
        if name not in OPS:
            raise LmcalcError(f"unknown collective {given!r}; expected one of {', '.join(OPS)}")
    if not ops:
        raise LmcalcError(f"no collective given; expected one of {', '.join(OPS)}")
    return tuple(dict.fromkeys(ops))


@dataclass(frozen=True)
class Collective:
    """One collective call over ``world_size`` ranks on ``count`` elements in all (the whole array):
    enough for any rank to regenerate every rank's input and the expected output."""

    op: str
    count: int
    world_size: int
    dtype: str = "fp32"
    seed: int = 0

    @property
    def size_bytes(self) -> int:
        """S, as nccl-tests counts it: the buffer for all-reduce, the whole array otherwise."""
        return self.count * DTYPES[self.dtype].bytes


@dataclass(frozen=True)
class CommMeasurement:
    """One collective at one size. Times are seconds; per repeat, the slowest rank's time is taken."""

    op: str
    size_bytes: int  # S: the bytes moved as nccl-tests counts them (after rounding to the rank count)
    requested_bytes: int
    world_size: int
    backend: str  # gloo | nccl
    launcher: str  # spawn (local processes) | torchrun
    device: str  # cpu | cuda
    dtype: str
    warmup: int
    repeats: int
    median_s: float  # median over repeats of the slowest rank
    fastest_s: float
    slowest_s: float
    mean_s: float  # mean over ranks and repeats: nccl-tests' statistic
    rank_medians_s: tuple[float, ...]
    max_error: float | None  # largest |output − expected| of the checked call; None when not checked

    @property
    def factor(self) -> float:
        return busbw_factor(self.op, self.world_size)

    @property
    def algbw_gbps(self) -> float:
        """S / t in GB/s (GB = 1e9 bytes)."""
        return self.size_bytes / self.median_s / 1e9

    @property
    def busbw_gbps(self) -> float:
        """algbw × factor in GB/s."""
        return self.algbw_gbps * self.factor
