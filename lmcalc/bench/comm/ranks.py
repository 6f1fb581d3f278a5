"""Measuring on one rank of a process group that is already up: every rank runs this, and every rank returns
the same measurements.

Inputs are random; one call is checked against values each rank recomputes locally (nccl-tests' ``-c``);
then ``warmup`` untimed calls and ``repeats`` timed ones with ``lmcalc.bench.timing.time_calls``, each after
a barrier. t is the median over repeats of the slowest rank's time in that repeat. torch's all-reduce works
in place (the values grow from repeat to repeat, up to inf in long runs, which does not slow the sums);
all-gather and reduce-scatter are out of place. torch is imported inside the functions.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import TYPE_CHECKING

from lmcalc.bench.comm.measurement import Collective, CommMeasurement, CommSettings, element_count
from lmcalc.bench.dtypes import DTYPES

if TYPE_CHECKING:
    import torch


def measure_all(settings: CommSettings, device: torch.device, backend: str, launcher: str) -> list[CommMeasurement]:
    """Every op at every size on this rank (``backend`` and ``launcher`` are recorded with each)."""
    import torch.distributed as dist

    world_size = dist.get_world_size()
    rows = []
    for op in settings.ops:
        for requested in settings.sizes:
            count = element_count(op, requested, world_size, settings.dtype)
            collective = Collective(op, count, world_size, settings.dtype, settings.seed)
            error, table = _timed(collective, settings, device)
            slowest = [max(column) for column in zip(*table, strict=True)]
            rows.append(
                CommMeasurement(
                    op=op,
                    size_bytes=collective.size_bytes,
                    requested_bytes=requested,
                    world_size=world_size,
                    backend=backend,
                    launcher=launcher,
                    device=device.type,
                    dtype=settings.dtype,
                    warmup=settings.warmup,
                    repeats=settings.repeats,
                    median_s=statistics.median(slowest),
                    fastest_s=min(slowest),
                    slowest_s=max(slowest),
                    mean_s=statistics.fmean(t for row in table for t in row),
                    rank_medians_s=tuple(statistics.median(row) for row in table),
                    max_error=error,
                )
            )
    return rows


def _timed(
    collective: Collective, settings: CommSettings, device: torch.device
) -> tuple[float | None, list[list[float]]]:
    """The checked call's largest error (None when not checked) and every rank's seconds per repeat, rows
    by rank; each repeat starts after a barrier."""
    from lmcalc.bench.timing import time_calls

    call = _prepare(collective, device)
    error = _check_call(call, collective, device) if settings.check else None
    times = time_calls(call, device, settings.warmup, settings.repeats, lambda: _barrier(device))
    return error, _gather_times(times, device)


def rank_input(collective: Collective, rank: int, device: torch.device) -> torch.Tensor:
    """Rank ``rank``'s random input (uniform in [0, 1)), which any rank can regenerate to check results:
    ``count`` elements for all-reduce and reduce-scatter, ``count / n`` for all-gather."""
    import torch

    c = collective
    generator = torch.Generator(device=device).manual_seed(c.seed * 1_000_003 + rank)
    length = c.count // c.world_size if c.op == "all-gather" else c.count
    return torch.rand(length, generator=generator, device=device, dtype=DTYPES[c.dtype].torch())


def expected_output(collective: Collective, rank: int, device: torch.device) -> torch.Tensor:
    """What rank ``rank`` should hold after the collective, computed locally in fp32 from every rank's input:
    all-reduce the sum, all-gather the concatenation, reduce-scatter this rank's share of the sum."""
    import torch

    c = collective
    inputs = (rank_input(c, r, device).float() for r in range(c.world_size))
    if c.op == "all-gather":
        return torch.cat(list(inputs))
    total = torch.zeros(c.count, device=device)
    for tensor in inputs:
        total += tensor
    if c.op == "reduce-scatter":
        share = c.count // c.world_size
        return total[rank * share : (rank + 1) * share]
    return total


class _Call:
    """One collective on preallocated buffers; ``output`` is what the check reads."""

    def __init__(self, fn: Callable[[], object], output: torch.Tensor) -> None:
        self.fn, self.output = fn, output

    def __call__(self, _index: int = 0) -> None:
        self.fn()


def _prepare(collective: Collective, device: torch.device) -> _Call:
    """This rank's input and output buffers, and the call that runs the collective on them."""
    import torch
    import torch.distributed as dist

    c = collective
    data = rank_input(c, dist.get_rank(), device)
    if c.op == "all-reduce":  # in place, as torch offers it: S = the buffer
        return _Call(lambda: dist.all_reduce(data), data)
    if c.op == "all-gather":  # S = the gathered whole
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        whole = torch.empty(c.count, device=device, dtype=data.dtype)
        return _Call(lambda: gather(whole, data), whole)
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    share = torch.empty(c.count // c.world_size, device=device, dtype=data.dtype)  # S = the whole before scattering
    return _Call(lambda: scatter(share, data), share)


def _check_call(call: _Call, collective: Collective, device: torch.device) -> float:
    """Run the collective once on the fresh inputs and compare with the locally computed result; the
    largest error over all ranks, raising if it is beyond rounding (n² ulps of the largest sum, n)."""
    import torch
    import torch.distributed as dist

    c = collective
    call()
    expected = expected_output(c, dist.get_rank(), device)
    error = torch.tensor([(call.output.float() - expected).abs().max().item()], dtype=torch.float64, device=device)
    dist.all_reduce(error, op=dist.ReduceOp.MAX)
    worst = float(error.item())
    tolerance = 0.0 if c.op == "all-gather" else c.world_size * c.world_size * DTYPES[c.dtype].eps
    if not worst <= tolerance:
        raise RuntimeError(
            f"{c.op} of {c.count} {c.dtype} elements over {c.world_size} ranks ({dist.get_backend()}) gave wrong "
            f"values: largest error {worst:.3g}, allowed {tolerance:.3g}"
        )
    return worst


def _barrier(device: torch.device) -> None:
    import torch.distributed as dist

    if device.type == "cuda":
        dist.barrier(device_ids=[device.index])
    else:
        dist.barrier()


def _gather_times(times: list[float], device: torch.device) -> list[list[float]]:
    """Every rank's per-repeat times, rows by rank."""
    import torch
    import torch.distributed as dist

    mine = torch.tensor(times, dtype=torch.float64, device=device)
    rows = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(rows, mine)
    return [row.tolist() for row in rows]
