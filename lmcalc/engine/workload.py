"""The workload: what is trained and how, on one model replica, as one frozen, validated value.

Every memory, FLOP and time estimate of a training step starts from the same handful of facts: the
model, the sequence length and micro-batch, the precision recipe and the optimizer, the attention kernel
and the recomputation mode, and two allowances (the bytes of a dropout mask element, the per-GPU
overhead). They travel together as a ``Workload``; engine functions take ``(workload, layout[, stage])``
or ``(workload, layout, cluster)``. A workload is hashable, and memoised engine functions are keyed by it
(its hash is computed once, when it is made), so a field added here is part of every cached figure.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from lmcalc.engine.choices import ATTENTION_KERNELS, RECOMPUTE_MODES, Attention, Recompute
from lmcalc.errors import LmcalcError, setting
from lmcalc.specs import ModelSpec, OptimizerSpec, PrecisionRecipe
from lmcalc.units import GiB

OVERHEAD_ALLOWANCE_BYTES = 2 * GiB
"""Allowance for what is not model state or activations: the CUDA context, cuBLAS/NCCL workspaces and
the caching allocator's fragmentation. It is a round, deliberately conservative allowance, not a
measurement (CUDA contexts alone take several hundred MiB and vary by driver and GPU); users change it
with ``--overhead``. On a GPU, ``lmcalc validate`` compares the predicted peak of real training steps
with ``torch.cuda.max_memory_allocated`` (which excludes the CUDA context)."""

MASK_BYTES = 1  # dropout masks are stored as bool / uint8 (Korthikanti et al. 2022 §4.1)


def dropout_mask_bytes(device_type: str, precision: PrecisionRecipe) -> float:
    """Bytes of one dropout-mask element on a device: a bool on CUDA (``MASK_BYTES``); PyTorch's CPU dropout
    keeps its mask in the input's dtype, the recipe's activation bytes."""
    return MASK_BYTES if device_type == "cuda" else precision.activation_bytes


@dataclass(frozen=True)
class Workload:
    """What is trained and how, on one model replica: everything an estimate needs besides the parallel
    layout and the hardware."""

    model: ModelSpec
    precision: PrecisionRecipe  # bytes of weights, gradients, master copy, optimizer states, activations
    optimizer: OptimizerSpec
    seq_len: int  # tokens per sequence
    micro_batch: int = 1  # sequences per GPU per micro-batch
    attention: Attention = "flash"
    recompute: Recompute = "none"
    mask_bytes: float = MASK_BYTES  # bytes of one dropout-mask element (see dropout_mask_bytes)
    overhead_bytes: float = OVERHEAD_ALLOWANCE_BYTES  # per-GPU allowance beyond states and activations
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("seq_len", "micro_batch"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise LmcalcError(f"{setting(name)} must be a positive integer, got {value}")
        for name, options in (("attention", ATTENTION_KERNELS), ("recompute", RECOMPUTE_MODES)):
            if getattr(self, name) not in options:
                raise LmcalcError(f"{setting(name)} must be one of {', '.join(options)}; got {getattr(self, name)!r}")
        if not self.mask_bytes > 0:
            raise LmcalcError(f"{setting('mask_bytes')} must be a positive number of bytes, got {self.mask_bytes}")
        if not self.overhead_bytes >= 0:
            raise LmcalcError(
                f"{setting('overhead_bytes')} must be zero or a positive number of bytes, got {self.overhead_bytes}"
            )
        compared = tuple(getattr(self, f.name) for f in fields(self) if f.compare)
        object.__setattr__(self, "_hash", hash(compared))  # once: a spec's hash walks all its fields

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self) -> tuple[type[Workload], tuple[object, ...]]:
        """Pickled as its fields, so that a copy made in another process (another hash seed) hashes anew."""
        return type(self), tuple(getattr(self, f.name) for f in fields(self) if f.init)

    @property
    def tokens(self) -> int:
        """Tokens in one micro-batch: b · s."""
        return self.seq_len * self.micro_batch
