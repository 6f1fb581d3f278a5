"""Timing that measures the device, not the host: CUDA events on GPUs, a synchronised clock elsewhere.

The method follows careful matmul benchmarks (stas00's mamf-finder; AMD's max-achievable-FLOPs
method): warm-up iterations first (first calls autotune and allocate), then many timed repeats, each
timed on its own, reporting the median and the spread rather than one mean.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

QUEUE_AHEAD_CYCLES = 2_000_000  # ~1 ms at a 2 GHz GPU clock: the host's start-up of the timed loop
QUEUE_AHEAD_CYCLES_PER_CALL = 100_000  # ~50 µs per call: well over the host's time to launch one matmul


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def time_calls(
    fn: Callable[[int], object],
    device: torch.device,
    warmup: int,
    repeats: int,
    before_each: Callable[[], object] | None = None,
) -> list[float]:
    """Seconds taken by each of ``repeats`` calls ``fn(i)`` after ``warmup`` untimed ones.

    ``before_each``, if given, runs before every timed call, untimed and followed by a device
    synchronisation: the barrier that lines up the ranks of a collective. The host then waits at each call,
    so on CUDA no spin kernel queues the calls ahead (there is no queue to keep full).
    """
    for i in range(warmup):
        fn(i)
    synchronize(device)
    if device.type == "cuda":
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(repeats)]
        # An idle GPU records a call's start event before the host has launched its kernel, so a call faster
        # than its launch would be timed as the launch. A spin kernel queued first keeps the GPU busy while
        # the host queues every call behind it; then each pair of events brackets the kernels alone.
        spin = getattr(torch.cuda, "_sleep", None)  # a private helper PyTorch's own tests use
        if spin is not None and before_each is None:
            spin(int(QUEUE_AHEAD_CYCLES_PER_CALL * repeats + QUEUE_AHEAD_CYCLES))
        for i, (start, end) in enumerate(events):
            if before_each is not None:
                before_each()
                synchronize(device)
            start.record()
            fn(warmup + i)
            end.record()
        torch.cuda.synchronize(device)
        return [start.elapsed_time(end) / 1e3 for start, end in events]
    times = []
    for i in range(repeats):
        if before_each is not None:
            before_each()
        synchronize(device)
        began = time.perf_counter()
        fn(warmup + i)
        synchronize(device)
        times.append(time.perf_counter() - began)
    return times


@dataclass(frozen=True)
class Stats:
    """Median and spread of repeated timings, in seconds."""

    median: float
    fastest: float
    slowest: float
    repeats: int

    @classmethod
    def of(cls, seconds: list[float]) -> Stats:
        return cls(statistics.median(seconds), min(seconds), max(seconds), len(seconds))

    @property
    def spread(self) -> float:
        """(slowest − fastest) / median."""
        return (self.slowest - self.fastest) / self.median
