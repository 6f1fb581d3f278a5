"""What ``lmcalc bench step`` runs: one frozen value, ``StepSetup``, checked when it is made. No torch here."""

from __future__ import annotations

from dataclasses import dataclass

from lmcalc.bench.choices import STEP_DTYPES
from lmcalc.bench.dtypes import default_dtype
from lmcalc.engine.choices import Attention, AttnConvention, Recompute
from lmcalc.errors import LmcalcError, setting
from lmcalc.specs import ModelSpec

RECIPE_FOR_DTYPE = {"fp32": "fp32", "bf16": "bf16-pure"}  # what a model in that dtype + torch.optim.AdamW keeps
FLOP_CONVENTION: AttnConvention = "full"  # Korthikanti et al. 2022 eq. (7); Chowdhery et al. 2022 App. B
OPTIMIZER = "adamw"
LEARNING_RATE = 1e-3  # any rate times the same; this one makes the loss visibly fall on a fixed batch
SEED = 0


@dataclass(frozen=True)
class StepSetup:
    """The training step to time: the model, b sequences of s tokens, one dtype throughout (None: bf16 on
    CUDA, fp32 elsewhere), the attention kernel and recomputation, ``warmup`` untimed steps then ``repeats``
    timed ones, AdamW's learning rate, and the CPU threads torch may use (None: torch's own count)."""

    model: ModelSpec
    seq_len: int
    micro_batch: int = 1
    dtype: str | None = None
    attention: Attention = "flash"
    recompute: Recompute = "none"
    warmup: int = 2
    repeats: int = 5
    learning_rate: float = LEARNING_RATE
    threads: int | None = None

    def __post_init__(self) -> None:
        if self.dtype and self.dtype not in STEP_DTYPES:
            raise LmcalcError(
                f"{setting('dtype')} must be one of {', '.join(STEP_DTYPES)} for a training step; got {self.dtype!r}"
            )
        counts = (self.seq_len, self.micro_batch, self.repeats, 1 if self.threads is None else self.threads)
        if min(counts) < 1 or self.warmup < 0:
            at_least_1 = ", ".join(setting(name) for name in ("seq", "micro_batch", "repeats"))
            raise LmcalcError(
                f"{at_least_1} and {setting('threads')} must be at least 1, {setting('warmup')} at least 0"
            )
        if self.seq_len > self.model.max_seq_len:
            raise LmcalcError(
                f"{setting('seq')} {self.seq_len} exceeds {self.model.name}'s context of "
                f"{self.model.max_seq_len} tokens"
            )

    @property
    def tokens(self) -> int:
        """Tokens per step: b · s."""
        return self.micro_batch * self.seq_len

    def dtype_on(self, device_type: str) -> str:
        """The dtype given, or the one a ``device_type`` trains in (``dtypes.default_dtype``)."""
        return self.dtype or default_dtype(device_type)
