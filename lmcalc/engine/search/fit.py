"""Solvers: the largest micro-batch, the longest sequence and the fewest GPUs that fit in memory.

Each one searches a single setting of a layout and asks the memory model (``engine.memory.gpu_memory``) whether the
most loaded GPU fits; memory grows with micro-batch and sequence length and shrinks as ZeRO spreads the
model states over more data-parallel GPUs, so a doubling search followed by bisection finds the limit.
The answer names the binding part of memory: the one that grows with the setting (activations for
micro-batch and sequence), or the model states when the GPU count is what is searched.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from lmcalc.engine.memory.gpu_memory import GpuMemory, most_loaded_gpu
from lmcalc.engine.parallel.layout import Layout
from lmcalc.engine.workload import Workload
from lmcalc.specs import ModelSpec

SEARCH_LIMIT = 1 << 24  # no search goes past 16M (sequences, tokens or data-parallel replicas)
SEQ_MULTIPLE = 128
"""Sequences are searched in multiples of 128 tokens (and of CP, which must divide them): the lengths runs use."""
UNTRAINED_SEQ_LIMIT = 1 << 20
"""A model whose positions are not a learned table is searched up to 2^20 tokens, or its context if longer."""

Variant = Callable[[int], tuple[Workload, Layout]]
"""The workload and layout with the searched setting at a value."""


@dataclass(frozen=True)
class Setting:
    """Everything but the searched value: the workload, the layout and the GPU's memory."""

    workload: Workload
    layout: Layout
    capacity: float

    def memory(self, variant: tuple[Workload, Layout] | None = None) -> GpuMemory:
        return most_loaded_gpu(*(variant or (self.workload, self.layout)))


@dataclass(frozen=True)
class Limit:
    """The largest (or smallest) value that fits, its memory, and the memory one step beyond."""

    value: int | None  # None: no value fits
    fits: GpuMemory | None
    beyond: GpuMemory | None
    beyond_value: int | None
    binding: str


def _largest(fits: Callable[[int], GpuMemory | None], step: int, limit: int) -> tuple[int | None, int]:
    """Largest multiple of ``step`` (up to ``limit``) for which ``fits`` returns memory, by doubling then bisection."""
    if fits(step) is None:
        return None, step
    lo = step
    while lo * 2 <= limit and fits(lo * 2) is not None:
        lo *= 2
    hi = min(lo * 2, limit + step)
    while hi - lo > step:
        mid = (lo + hi) // 2 // step * step
        if mid <= lo:
            break
        if fits(mid) is not None:
            lo = mid
        else:
            hi = mid
    return lo, hi


def _checker(setting: Setting, make: Variant) -> Callable[[int], GpuMemory | None]:
    def fits(value: int) -> GpuMemory | None:
        memory = setting.memory(make(value))
        return memory if memory.total <= setting.capacity else None

    return fits


def largest_micro_batch(setting: Setting) -> Limit:
    def make(b: int) -> tuple[Workload, Layout]:
        return replace(setting.workload, micro_batch=b), setting.layout

    value, over = _largest(_checker(setting, make), 1, SEARCH_LIMIT)
    return _limit(setting, value, over, make, "activations grow with the micro-batch")


def sequence_step(layout: Layout) -> int:
    """The step of the sequence search: a multiple of ``SEQ_MULTIPLE`` that CP divides."""
    return math.lcm(SEQ_MULTIPLE, layout.cp)


def sequence_limit(model: ModelSpec) -> int:
    """The longest sequence searched: a learned position table has no rows past the trained context; other
    positions go up to ``UNTRAINED_SEQ_LIMIT`` tokens or the context, whichever is longer."""
    if model.position_embedding == "learned":
        return model.max_seq_len
    return max(model.max_seq_len, UNTRAINED_SEQ_LIMIT)


def data_parallel_step(layout: Layout) -> int:
    """The step of the DP search: the smallest DP for which EP divides DP·CP (experts spread over DP·CP), and under
    HSDP, DP·CP makes its groups of an even number of replicas each."""
    step = layout.ep // math.gcd(layout.ep, layout.cp)
    if layout.hsdp > 1:
        groups = 2 * layout.hsdp
        step = math.lcm(step, groups // math.gcd(groups, layout.cp))
    return step


def longest_sequence(setting: Setting) -> Limit:
    """The longest sequence (a multiple of ``sequence_step``, at most ``sequence_limit``) that fits."""
    step, limit = sequence_step(setting.layout), sequence_limit(setting.workload.model)

    def make(s: int) -> tuple[Workload, Layout]:
        return replace(setting.workload, seq_len=s), setting.layout

    value, over = _largest(_checker(setting, make), step, limit)
    if value is not None and value + step > limit:  # memory never ran out: the limit did
        learned = setting.workload.model.position_embedding == "learned"
        reason = ("the model's learned positions" if learned else "the search limit") + f" ({limit} tokens), not memory"
        return Limit(value, setting.memory(make(value)), None, None, reason)
    return _limit(setting, value, over, make, "activations grow with the sequence")


def fewest_data_parallel(setting: Setting) -> Limit:
    """The smallest DP degree (a multiple of ``data_parallel_step``) that fits: ZeRO spreads the model states
    over it."""
    step = data_parallel_step(setting.layout)

    def make(dp: int) -> tuple[Workload, Layout]:
        return setting.workload, replace(setting.layout, dp=dp)

    fits = _checker(setting, make)
    dp = step
    while dp <= SEARCH_LIMIT and fits(dp) is None:
        dp *= 2
    if dp > SEARCH_LIMIT:
        memory = setting.memory(make(SEARCH_LIMIT))
        when = "even fully sharded" if setting.layout.zero else "with every GPU holding all model states (no ZeRO)"
        return Limit(None, None, memory, SEARCH_LIMIT, _binding(memory, when))
    lo, hi = dp // 2, dp  # lo does not fit (or is below step), hi fits
    while hi - lo > step:
        mid = (lo + hi) // 2 // step * step
        if mid <= lo:
            break
        if fits(mid) is not None:
            hi = mid
        else:
            lo = mid
    below = setting.memory(make(lo)) if lo >= step else None
    return Limit(
        hi,
        setting.memory(make(hi)),
        below,
        lo if lo >= step else None,
        "model states, which ZeRO spreads over the data-parallel GPUs"
        if setting.layout.zero
        else "model states: without ZeRO every data-parallel GPU holds them all",
    )


def _limit(setting: Setting, value: int | None, over: int, make: Variant, grows: str) -> Limit:
    beyond = setting.memory(make(over))
    if value is None:
        return Limit(None, None, beyond, over, _binding(beyond, "at the smallest setting"))
    return Limit(value, setting.memory(make(value)), beyond, over, grows)


def _binding(memory: GpuMemory, when: str) -> str:
    part, size = memory.binding
    return f"{part} ({size / 1e9:.1f} GB) {when}"
