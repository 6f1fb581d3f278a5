"""Wall-clock time and cost of a run: FLOPs / (GPUs × dense peak FLOP/s × MFU).

Model FLOPs utilisation (MFU) is the fraction of the accelerator's peak that the model's own FLOPs
achieve (Chowdhery et al. 2022 §4.1 and Appendix B). Given an MFU, the time to train follows by
division; given a deadline, so does the number of GPUs. The peak is the spec sheet's DENSE figure for
the recipe's compute dtype (never the 2:4-sparsity headline, which is twice as large).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lmcalc.errors import LmcalcError, setting
from lmcalc.recipe_specs import PrecisionRecipe
from lmcalc.result import Term
from lmcalc.specs import MAX_WHOLE_NUMBER, HardwareSpec
from lmcalc.units import SECONDS_PER_DAY, SECONDS_PER_HOUR, sci

DEFAULT_MFU = 0.4
"""Default model FLOPs utilisation when the user gives none: an assumption, always labelled as one.
Well-tuned large dense runs publish a BF16 MFU of 0.38–0.43 on H100 (Llama 3 405B, Dubey et al. 2024
Table 4) and 0.415–0.563 on A100 (Korthikanti et al. 2022 Table 5, 22B–1T, with selective
recomputation). Narayanan et al. 2021's 44–52 % of peak count the recomputed forward pass too, so
they are hardware, not model, FLOPs utilisation."""


def check_mfu(mfu: float | None) -> float:
    """MFU is a fraction of the dense peak: in (0, 1]."""
    if mfu is None or not 0 < mfu <= 1:
        raise LmcalcError(f"{setting('mfu')} must be in (0, 1], got {mfu if mfu is None else format(mfu, 'g')}")
    return mfu


@dataclass(frozen=True)
class RunTime:
    flops: float
    gpus: float
    peak_flops_per_gpu: float
    mfu: float
    tokens: float

    @property
    def achieved_flops_per_s(self) -> float:
        return self.gpus * self.peak_flops_per_gpu * self.mfu

    @property
    def seconds(self) -> float:
        return self.flops / self.achieved_flops_per_s

    @property
    def days(self) -> float:
        return self.seconds / SECONDS_PER_DAY

    @property
    def gpu_hours(self) -> float:
        return self.gpus * self.seconds / SECONDS_PER_HOUR

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else math.inf


def peak_for(hardware: HardwareSpec, precision: PrecisionRecipe) -> float:
    """Dense peak FLOP/s of ``hardware`` at the recipe's compute dtype; a clear error if it has none."""
    if precision.compute_dtype not in hardware.peak_tflops_dense:
        have = ", ".join(hardware.peak_tflops_dense) or "none"
        raise LmcalcError(
            f"{hardware.name} has no {precision.compute_dtype} peak on its spec sheet (it has: {have}); "
            f"choose another {setting('precision')}"
        )
    return hardware.peak_flops(precision.compute_dtype)


def time_terms(
    run: RunTime,
    hardware: HardwareSpec,
    precision: PrecisionRecipe,
    price_per_gpu_hour: float | None,
    measured_source: str | None = None,
) -> tuple[Term, ...]:
    """The time figures; ``measured_source`` says where a measured peak came from (else the spec sheet)."""
    terms = [
        _peak_term(run, hardware, precision, measured_source),
        *_duration_terms(run),
        *_throughput_terms(run),
    ]
    if price_per_gpu_hour is not None:
        terms.append(
            Term(
                "cost",
                "Cost",
                run.gpu_hours * price_per_gpu_hour,
                "USD",
                "GPU-hours · price",
                f"{sci(run.gpu_hours, 4)} × {price_per_gpu_hour:g} $/GPU-hour",
            )
        )
    return tuple(terms)


def _peak_term(run: RunTime, hardware: HardwareSpec, precision: PrecisionRecipe, measured_source: str | None) -> Term:
    """The peak per GPU: a rate ``lmcalc bench`` measured, or the spec sheet's dense peak at the recipe's compute
    dtype."""
    dtype = precision.compute_dtype
    if measured_source:
        return Term(
            "peak_per_gpu",
            f"Peak per GPU (measured {dtype})",
            run.peak_flops_per_gpu,
            "FLOP/s",
            "lmcalc bench",
            f"{run.peak_flops_per_gpu / 1e12:.1f} TFLOP/s",
            measured_source,
            note="a measured rate, used instead of the spec sheet's dense peak",
        )
    return Term(
        "peak_per_gpu",
        f"Peak per GPU (dense {dtype})",
        run.peak_flops_per_gpu,
        "FLOP/s",
        f"spec sheet, dense {dtype}",
        f"{hardware.peak_tflops_dense[dtype]:g} TFLOP/s",
        hardware.sources.get("compute", ""),
        note=hardware.sparsity_note,
    )


def _duration_terms(run: RunTime) -> tuple[Term, ...]:
    """The cluster's achieved FLOP/s, and the time the FLOPs take at it: seconds, days, GPU-hours."""
    return (
        Term(
            "achieved",
            "Achieved by the cluster",
            run.achieved_flops_per_s,
            "FLOP/s",
            "GPUs · peak · MFU",
            f"{run.gpus:g} × {sci(run.peak_flops_per_gpu, 4)} × {run.mfu:g}",
        ),
        Term(
            "seconds",
            "Training time (seconds)",
            run.seconds,
            "s",
            "FLOPs / achieved FLOP/s",
            f"{sci(run.flops, 4)} / {sci(run.achieved_flops_per_s, 4)}",
        ),
        Term("days", "Training time (days)", run.days, "days", "seconds / 86,400", f"{sci(run.seconds, 4)} / 86400"),
        Term(
            "gpu_hours",
            "GPU-hours",
            run.gpu_hours,
            "GPU-hours",
            "GPUs · seconds / 3,600",
            f"{run.gpus:g} × {sci(run.seconds, 4)} / 3600",
        ),
    )


def _throughput_terms(run: RunTime) -> tuple[Term, ...]:
    """Tokens per second, of the cluster and of one GPU."""
    return (
        Term(
            "tokens_per_s",
            "Throughput",
            run.tokens_per_s,
            "tokens/s",
            "D / seconds",
            f"{sci(run.tokens)} / {sci(run.seconds, 4)}",
        ),
        Term(
            "tokens_per_s_per_gpu",
            "Throughput per GPU",
            run.tokens_per_s / run.gpus,
            "tokens/s/GPU",
            "D / seconds / GPUs",
            f"{sci(run.tokens_per_s, 4)} / {run.gpus:g}",
        ),
    )


def gpus_for_deadline(flops: float, days: float, peak_flops_per_gpu: float, mfu: float) -> float:
    """GPUs needed to finish ``flops`` in ``days`` (a real number; round up to buy whole GPUs). Refused where the
    deadline is so short that the count is past what a float counts in whole GPUs (2⁵³), or past any float at all
    (``--days 1e-308``)."""
    one_gpu = days * SECONDS_PER_DAY * peak_flops_per_gpu * mfu  # the FLOPs one GPU delivers by the deadline
    needed = flops / one_gpu if one_gpu > 0 else math.inf
    if not needed <= MAX_WHOLE_NUMBER:
        raise LmcalcError(
            f"{setting('days')} {days:g} is too short: it needs more than 2^53 GPUs ({sci(flops, 4)} FLOPs at "
            f"{sci(peak_flops_per_gpu * mfu, 4)} FLOP/s a GPU); give a longer deadline"
        )
    return needed


def whole_gpus(gpus: float, per_node: int) -> tuple[int, int]:
    """The whole number of GPUs and of full nodes that meet the deadline."""
    count = math.ceil(gpus - 1e-9)
    nodes = math.ceil(count / per_node)
    return count, nodes
