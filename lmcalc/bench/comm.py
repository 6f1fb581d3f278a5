"""``lmcalc bench-comm``: collective bandwidth measured with torch.distributed, reported as nccl-tests does.

What is reported (NVIDIA nccl-tests, doc/PERFORMANCE.md and the ``GetBw`` functions in src/*.cu; the
reference notes ``hardware_facts.yaml`` section ``methods.nccl_tests``):

    algbw = S / t                   S in bytes, t in seconds, GB = 1e9 bytes
    busbw = algbw × factor          all-reduce 2(n−1)/n; all-gather and reduce-scatter (n−1)/n

S is the buffer for all-reduce, and the whole array for all-gather (n × each rank's input) and
reduce-scatter (n × each rank's output). busbw is what a ring puts over each rank's busiest link, so it
can be compared with one link's bandwidth whatever the number of ranks (the model of
``lmcalc.engine.comm``).

How it runs:

* Under ``torchrun`` (``RANK`` and ``WORLD_SIZE`` in the environment) every rank measures in its own
  process on its own device (NCCL on GPUs, gloo on CPUs); rank 0 gets the measurements, the others ``[]``.
* Otherwise ``world_size`` local processes are spawned (``torch.multiprocessing.spawn``). They meet
  through a file in a private temporary directory (a ``FileStore``, so no TCP rendezvous server is
  opened: torch's ``TCPStore`` listens on every interface whatever host it is given), and gloo (or NCCL's
  bootstrap) is bound to the loopback interface, so nothing leaves 127.0.0.1.

How it is timed (the pattern of ``lmcalc.bench.timing.time_calls``): inputs are random; one call is
checked against values each rank recomputes locally (nccl-tests' ``-c``); then ``warmup`` untimed calls
and ``repeats`` timed ones, each after a barrier and a device synchronisation (CUDA events on GPUs, a
host clock around the call and a synchronisation elsewhere). t is the **median over repeats of the
slowest rank's time in that repeat**: a collective is finished only when its last rank is. nccl-tests
instead averages one loop of iterations over ranks, so its t can be a little lower; that mean is kept
too (``mean_s``). torch's all-reduce works in place (the values grow from repeat to repeat, up to inf
in long runs, which does not slow the sums); all-gather and reduce-scatter are out of place (nccl-tests
reports both ways for each).

torch imports stay inside functions: size parsing, the factors and the result need no torch.
"""

from __future__ import annotations

import json
import os
import re
import socket
import statistics
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from lmcalc.errors import LmcalcError
from lmcalc.result import Input, Result, Section, Term

if TYPE_CHECKING:
    import torch

    from lmcalc.bench.results import Record

OPS = ("all-reduce", "all-gather", "reduce-scatter")
BACKENDS = ("auto", "gloo", "nccl")
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
_TORCH_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
_EPS = {"fp32": 2.0**-23, "bf16": 2.0**-7, "fp16": 2.0**-10}
SIZE_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
"""K, M, G, T are binary, as nccl-tests reads ``-b 1M -e 1G``."""
SOURCE = "NVIDIA nccl-tests doc/PERFORMANCE.md"
TIMEOUT_S = 600


# ---------------------------------------------------------------------------------------------- sizes

_SIZE_RE = re.compile(r"^(\d+)([KMGT]?)(IB|B)?$", re.IGNORECASE)
_SIZE_HELP = "expected bytes with an optional binary suffix K, M, G, T (2^10 … 2^40, as nccl-tests), e.g. 64K or 1MiB"


def parse_size(text: str) -> int:
    """Bytes in ``64K``, ``1M``, ``1MiB``, ``1G``, ``4096`` or ``4096B``; K/M/G/T are powers of 2^10."""
    match = _SIZE_RE.match(text.strip())
    if not match:
        raise LmcalcError(f"cannot read message size {text!r}; {_SIZE_HELP}")
    digits, unit, tail = match.group(1), match.group(2).upper(), (match.group(3) or "").upper()
    if unit and tail == "B":
        raise LmcalcError(
            f"message size {text!r} is ambiguous: write {digits}{unit} or {digits}{unit}iB "
            f"({unit} = 2^{10 * 'KMGT'.index(unit) + 10} bytes, as nccl-tests)"
        )
    if not unit and tail == "IB":
        raise LmcalcError(f"cannot read message size {text!r}; {_SIZE_HELP}")
    value = int(digits) * SIZE_UNITS[unit]
    if value <= 0:
        raise LmcalcError(f"message size must be at least 1 byte, got {text!r}")
    return value


def parse_sizes(text: str) -> list[int]:
    """Message sizes from ``1M..1G`` (doubling from the first to the last, both included), ``1M,16M``
    or a mix (``64K,1M..4M``); repeats are dropped, the order kept."""
    if not text or not text.strip():
        raise LmcalcError("no message sizes given; expected e.g. 1M..1G or 64K,1M,16M")
    sizes: list[int] = []
    for item in text.split(","):
        if ".." in item:
            ends = item.split("..")
            if len(ends) != 2 or not ends[0].strip() or not ends[1].strip():
                raise LmcalcError(f"cannot read size range {item.strip()!r}; expected FIRST..LAST, e.g. 1M..1G")
            first, last = parse_size(ends[0]), parse_size(ends[1])
            if first > last:
                raise LmcalcError(f"size range {item.strip()!r} runs backwards; write the smaller size first")
            ratio, rest = divmod(last, first)
            if rest or ratio & (ratio - 1):
                raise LmcalcError(
                    f"size range {item.strip()!r}: the last size must be the first doubled a whole number of "
                    "times (e.g. 1M..1G)"
                )
            size = first
            while size <= last:
                sizes.append(size)
                size *= 2
        else:
            sizes.append(parse_size(item))
    return list(dict.fromkeys(sizes))


def size_label(nbytes: int) -> str:
    """``65536`` → ``64K``, ``1048576`` → ``1M``; a size that is no whole K, M, G or T stays in bytes."""
    for unit in ("T", "G", "M", "K"):
        if nbytes >= SIZE_UNITS[unit] and nbytes % SIZE_UNITS[unit] == 0:
            return f"{nbytes // SIZE_UNITS[unit]}{unit}"
    return str(nbytes)


# -------------------------------------------------------------------------------------- definitions


def busbw_factor(op: str, world_size: int) -> float:
    """nccl-tests' bus-bandwidth factor: all-reduce 2(n−1)/n, all-gather and reduce-scatter (n−1)/n."""
    n = world_size
    if op == "all-reduce":
        return 2 * (n - 1) / n
    if op in ("all-gather", "reduce-scatter"):
        return (n - 1) / n
    raise LmcalcError(f"unknown collective {op!r}; expected one of {', '.join(OPS)}")


def element_count(op: str, nbytes: int, world_size: int, dtype: str = "fp32") -> int:
    """Elements in the whole array for a requested size: all-gather and reduce-scatter round down to a
    multiple of the rank count, as nccl-tests does, so every rank holds an equal share."""
    count = nbytes // DTYPE_BYTES[dtype]
    if op != "all-reduce":
        count -= count % world_size
    least = 1 if op == "all-reduce" else world_size
    if count < least:
        raise LmcalcError(
            f"message size {nbytes} bytes is too small for {op} of {dtype} over {world_size} ranks; "
            f"the least is {least * DTYPE_BYTES[dtype]} bytes"
        )
    return count


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


# ------------------------------------------------------------------------------------ measurement


def launched_by_torchrun() -> bool:
    """True when this process is one rank of a ``torchrun`` (or other env://) launch."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def loopback_interface() -> str:
    """The name of the loopback network interface (``lo`` on Linux, ``lo0`` on macOS)."""
    names = {name for _, name in socket.if_nameindex()}
    for name in ("lo", "lo0"):
        if name in names:
            return name
    raise LmcalcError(
        "cannot find the loopback network interface (lo or lo0) to keep the local processes on 127.0.0.1; "
        "launch with torchrun instead"
    )


def run_collectives(
    op: str | Sequence[str],
    sizes_bytes: Sequence[int],
    world_size: int | None = None,
    backend: str = "auto",
    warmup: int = 5,
    repeats: int = 20,
    *,
    dtype: str = "fp32",
    check: bool = True,
    seed: int = 0,
) -> list[CommMeasurement]:
    """Measure ``op`` (one of ``OPS``, or several) at each size over ``world_size`` ranks.

    ``backend``: ``gloo`` (CPU tensors), ``nccl`` (one GPU per rank) or ``auto`` (NCCL when there are
    enough GPUs, else gloo). Under torchrun the launch's own ranks are used (``world_size`` None or
    equal to ``WORLD_SIZE``) and only rank 0 gets the measurements; otherwise ``world_size`` local
    processes (default 2) are spawned and this process gets them all. A collective whose output is
    wrong raises RuntimeError; bad arguments raise LmcalcError before anything starts.
    """
    ops = _check_ops(op)
    sizes = [int(s) for s in sizes_bytes]
    if not sizes:
        raise LmcalcError("no message sizes given")
    if dtype not in DTYPE_BYTES:
        raise LmcalcError(f"--dtype for collectives must be one of {', '.join(DTYPE_BYTES)}; got {dtype!r}")
    if backend not in BACKENDS:
        raise LmcalcError(f"--backend must be one of {', '.join(BACKENDS)}; got {backend!r}")
    if warmup < 0 or repeats < 1:
        raise LmcalcError(f"need warmup ≥ 0 and repeats ≥ 1; got warmup {warmup}, repeats {repeats}")
    import torch.distributed as dist

    if not dist.is_available():
        raise LmcalcError("this PyTorch build has no torch.distributed")
    settings = {"dtype": dtype, "warmup": warmup, "repeats": repeats, "check": check, "seed": seed}
    if launched_by_torchrun():
        env_world = int(os.environ["WORLD_SIZE"])
        if world_size not in (None, env_world):
            raise LmcalcError(f"--world-size {world_size} does not match torchrun's WORLD_SIZE={env_world}")
        _check_sizes(ops, sizes, env_world, dtype)
        return _run_under_torchrun(ops, sizes, backend, settings)
    world_size = 2 if world_size is None else world_size
    if world_size < 1:
        raise LmcalcError(f"--world-size must be a positive number of processes; got {world_size}")
    _check_sizes(ops, sizes, world_size, dtype)
    return _run_spawned(ops, sizes, world_size, _spawn_backend(backend, world_size), settings)


def _check_ops(op: str | Sequence[str]) -> list[str]:
    names = [op] if isinstance(op, str) else list(op)
    ops = [name.strip().lower().replace("_", "-") for name in names]
    for name, given in zip(ops, names, strict=True):
        if name not in OPS:
            raise LmcalcError(f"unknown collective {given!r}; expected one of {', '.join(OPS)}")
    if not ops:
        raise LmcalcError(f"no collective given; expected one of {', '.join(OPS)}")
    return list(dict.fromkeys(ops))


def _check_sizes(ops: list[str], sizes: list[int], world_size: int, dtype: str) -> None:
    for op in ops:
        for size in sizes:
            element_count(op, size, world_size, dtype)


def _spawn_backend(backend: str, world_size: int) -> str:
    import torch
    import torch.distributed as dist

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if backend == "auto":
        backend = "nccl" if dist.is_nccl_available() and gpus >= world_size else "gloo"
    if backend == "nccl" and (not dist.is_nccl_available() or gpus < world_size):
        raise LmcalcError(
            f"--backend nccl needs one GPU per process: {world_size} asked, {gpus} here"
            + ("" if dist.is_nccl_available() else " (and this PyTorch has no NCCL)")
        )
    if backend == "gloo" and not dist.is_gloo_available():
        raise LmcalcError("this PyTorch build has no gloo backend")
    return backend


def _run_spawned(ops: list[str], sizes: list[int], world_size: int, backend: str, settings: dict) -> list:
    import torch.multiprocessing as mp

    interface = loopback_interface()
    with tempfile.TemporaryDirectory(prefix="lmcalc-comm-") as tmp:
        store, out = os.path.join(tmp, "store"), os.path.join(tmp, "measurements.json")
        mp.spawn(
            _spawn_worker,
            args=(world_size, backend, interface, store, out, ops, sizes, settings),
            nprocs=world_size,
            join=True,
        )
        with open(out, encoding="utf-8") as handle:
            rows = json.load(handle)
    return [CommMeasurement(**{**row, "rank_medians_s": tuple(row["rank_medians_s"])}) for row in rows]


def _spawn_worker(
    rank: int,
    world_size: int,
    backend: str,
    interface: str,
    store_path: str,
    out_path: str,
    ops: list[str],
    sizes: list[int],
    settings: dict,
) -> None:
    """One spawned rank: join the group through the file store, on the loopback interface only."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    os.environ["GLOO_SOCKET_IFNAME"] = interface
    os.environ["NCCL_SOCKET_IFNAME"] = interface
    if backend == "nccl":
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    store = dist.FileStore(store_path, world_size)
    dist.init_process_group(
        backend,
        store=store,
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=TIMEOUT_S),
        **({"device_id": device} if backend == "nccl" else {}),
    )
    try:
        rows = _measure_all(ops, sizes, device, backend, "spawn", settings)
    finally:
        dist.destroy_process_group()
    if rank == 0:
        with open(out_path, "w", encoding="utf-8") as handle:
            json.dump([asdict(row) for row in rows], handle)


def _run_under_torchrun(ops: list[str], sizes: list[int], backend: str, settings: dict) -> list[CommMeasurement]:
    import torch
    import torch.distributed as dist

    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() and dist.is_nccl_available() else "gloo"
    if backend == "nccl":
        if not torch.cuda.is_available():
            raise LmcalcError("--backend nccl: no CUDA device is available to this rank")
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    created = not dist.is_initialized()
    if created:
        kwargs: dict[str, Any] = {"device_id": device} if backend == "nccl" else {}
        dist.init_process_group(backend, **kwargs)
    elif dist.get_backend() != backend:
        raise LmcalcError(f"the process group already uses {dist.get_backend()}, not {backend}")
    try:
        rows = _measure_all(ops, sizes, device, backend, "torchrun", settings)
        reports = dist.get_rank() == 0
    finally:
        if created:
            dist.destroy_process_group()
    return rows if reports else []


def _measure_all(
    ops: list[str], sizes: list[int], device: torch.device, backend: str, launcher: str, settings: dict
) -> list[CommMeasurement]:
    """Every op at every size on this rank; all ranks return the same measurements."""
    import torch.distributed as dist

    world_size, rank = dist.get_world_size(), dist.get_rank()
    rows = []
    for op in ops:
        for requested in sizes:
            count = element_count(op, requested, world_size, settings["dtype"])
            call = _collective(op, count, world_size, rank, device, settings["dtype"], settings["seed"])
            error = _check_call(call, op, count, world_size, device, settings) if settings["check"] else None
            times = _time_repeats(call, device, settings["warmup"], settings["repeats"])
            table = _gather_times(times, device)
            slowest = [max(column) for column in zip(*table, strict=True)]
            rows.append(
                CommMeasurement(
                    op=op,
                    size_bytes=count * DTYPE_BYTES[settings["dtype"]],
                    requested_bytes=requested,
                    world_size=world_size,
                    backend=backend,
                    launcher=launcher,
                    device=device.type,
                    dtype=settings["dtype"],
                    warmup=settings["warmup"],
                    repeats=settings["repeats"],
                    median_s=statistics.median(slowest),
                    fastest_s=min(slowest),
                    slowest_s=max(slowest),
                    mean_s=statistics.fmean(t for row in table for t in row),
                    rank_medians_s=tuple(statistics.median(row) for row in table),
                    max_error=error,
                )
            )
            del call
    return rows


def rank_input(
    op: str, count: int, world_size: int, rank: int, dtype: str, device: torch.device, seed: int = 0
) -> torch.Tensor:
    """Rank ``rank``'s random input (uniform in [0, 1)), which any rank can regenerate to check results:
    ``count`` elements for all-reduce and reduce-scatter, ``count / n`` for all-gather."""
    import torch

    generator = torch.Generator(device=device).manual_seed(seed * 1_000_003 + rank)
    length = count // world_size if op == "all-gather" else count
    return torch.rand(length, generator=generator, device=device, dtype=getattr(torch, _TORCH_DTYPES[dtype]))


def expected_output(
    op: str, count: int, world_size: int, rank: int, dtype: str, device: torch.device, seed: int = 0
) -> torch.Tensor:
    """What rank ``rank`` should hold after ``op``, computed locally in fp32 from every rank's input:
    all-reduce the sum, all-gather the concatenation, reduce-scatter this rank's share of the sum."""
    import torch

    inputs = (rank_input(op, count, world_size, r, dtype, device, seed).float() for r in range(world_size))
    if op == "all-gather":
        return torch.cat(list(inputs))
    total = torch.zeros(count, device=device)
    for tensor in inputs:
        total += tensor
    if op == "reduce-scatter":
        share = count // world_size
        return total[rank * share : (rank + 1) * share]
    return total


class _Call:
    """One collective on preallocated buffers; ``output`` is what the check reads."""

    def __init__(self, fn: Callable[[], object], output: torch.Tensor) -> None:
        self.fn, self.output = fn, output

    def __call__(self) -> None:
        self.fn()


def _collective(op: str, count: int, world_size: int, rank: int, device, dtype: str, seed: int) -> _Call:
    import torch
    import torch.distributed as dist

    data = rank_input(op, count, world_size, rank, dtype, device, seed)
    if op == "all-reduce":  # in place, as torch offers it: S = the buffer
        return _Call(lambda: dist.all_reduce(data), data)
    if op == "all-gather":  # S = the gathered whole
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        whole = torch.empty(count, device=device, dtype=data.dtype)
        return _Call(lambda: gather(whole, data), whole)
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    share = torch.empty(count // world_size, device=device, dtype=data.dtype)  # S = the whole before scattering
    return _Call(lambda: scatter(share, data), share)


def _check_call(call: _Call, op: str, count: int, world_size: int, device, settings: dict) -> float:
    """Run the collective once on the fresh inputs and compare with the locally computed result; the
    largest error over all ranks, raising if it is beyond rounding (n² ulps of the largest sum, n)."""
    import torch
    import torch.distributed as dist

    call()
    rank, dtype = dist.get_rank(), settings["dtype"]
    expected = expected_output(op, count, world_size, rank, dtype, device, settings["seed"])
    error = torch.tensor([(call.output.float() - expected).abs().max().item()], dtype=torch.float64, device=device)
    dist.all_reduce(error, op=dist.ReduceOp.MAX)
    worst = float(error.item())
    tolerance = 0.0 if op == "all-gather" else world_size * world_size * _EPS[dtype]
    if not worst <= tolerance:
        raise RuntimeError(
            f"{op} of {count} {dtype} elements over {world_size} ranks ({dist.get_backend()}) gave wrong values: "
            f"largest error {worst:.3g}, allowed {tolerance:.3g}"
        )
    return worst


def _barrier(device) -> None:
    import torch.distributed as dist

    if device.type == "cuda":
        dist.barrier(device_ids=[device.index])
    else:
        dist.barrier()


def _time_repeats(call: _Call, device, warmup: int, repeats: int) -> list[float]:
    """Seconds per repeat, each after a barrier: ``time_calls``' pattern with the ranks lined up first."""
    import time

    import torch

    from lmcalc.bench.timing import synchronize

    for _ in range(warmup):
        call()
    synchronize(device)
    if device.type == "cuda":
        events = []
        for _ in range(repeats):
            _barrier(device)
            synchronize(device)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            call()
            end.record()
            events.append((start, end))
        torch.cuda.synchronize(device)
        return [start.elapsed_time(end) / 1e3 for start, end in events]
    times = []
    for _ in range(repeats):
        _barrier(device)
        synchronize(device)
        began = time.perf_counter()
        call()
        synchronize(device)
        times.append(time.perf_counter() - began)
    return times


def _gather_times(times: list[float], device) -> list[list[float]]:
    """Every rank's per-repeat times, rows by rank."""
    import torch
    import torch.distributed as dist

    mine = torch.tensor(times, dtype=torch.float64, device=device)
    rows = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(rows, mine)
    return [row.tolist() for row in rows]


# ------------------------------------------------------------------------------------------ output


def comm_result(measurements: Sequence[CommMeasurement], title: str | None = None) -> Result:
    """The ``bench-comm`` result: one row per size (per op and size when several ops were measured)."""
    if not measurements:
        raise LmcalcError("no collective measurements to report")
    first = measurements[0]
    ops = list(dict.fromkeys(m.op for m in measurements))
    several = len(ops) > 1
    sections = tuple(
        Section(
            key=f"{m.op}-{size_label(m.requested_bytes)}" if several else size_label(m.requested_bytes),
            title=f"{m.op} {size_label(m.requested_bytes)}" if several else size_label(m.requested_bytes),
            terms=_terms(m),
        )
        for m in measurements
    )
    inputs = (
        Input("op", "collective", ", ".join(ops)),
        Input("world_size", "world size", first.world_size, "ranks"),
        Input("backend", "backend", first.backend),
        Input("launch", "launched as", "torchrun" if first.launcher == "torchrun" else "local processes, 127.0.0.1"),
        Input("device", "device", first.device),
        Input("dtype", "dtype", first.dtype),
        Input("warmup", "warm-up calls", first.warmup),
        Input("repeats", "timed repeats", first.repeats),
    )
    notes = [
        "algbw = S / t (S in bytes, GB = 1e9 bytes); busbw = algbw × 2(n−1)/n for all-reduce and × (n−1)/n "
        "for all-gather and reduce-scatter, with S the whole array: the bus bandwidth of NVIDIA nccl-tests "
        "(doc/PERFORMANCE.md), comparable with one link's bandwidth whatever the rank count.",
        "t is the median over repeats of the slowest rank's time; each repeat starts after a barrier and "
        "ends after device synchronisation (nccl-tests averages over ranks instead, so it can read a little "
        "faster).",
    ]
    if any(m.backend == "gloo" and m.launcher == "spawn" for m in measurements):
        notes.append(
            "gloo between processes on one machine moves data through loopback sockets and memory copies: it "
            "measures this host's memory and kernel, not a network or a GPU interconnect."
        )
    if first.world_size == 1:
        notes.append("one rank: nothing crosses a link, so busbw is 0 by definition.")
    if all(m.max_error is not None for m in measurements):
        notes.append("every collective's output was checked once against values each rank recomputed locally.")
    return Result(
        command="bench-comm",
        title=title or f"Collective bandwidth: {', '.join(ops)} over {first.world_size} ranks ({first.backend})",
        inputs=inputs,
        sections=sections,
        notes=tuple(notes),
        layout="grid",
    )


def _terms(m: CommMeasurement) -> tuple[Term, ...]:
    n = m.world_size
    factor_text = "2(n−1)/n" if m.op == "all-reduce" else "(n−1)/n"
    factor_numbers = f"2·({n}−1)/{n}" if m.op == "all-reduce" else f"({n}−1)/{n}"
    whole = "the buffer" if m.op == "all-reduce" else "the whole array"
    return (
        Term(
            "size",
            "size",
            float(m.size_bytes),
            "bytes",
            formula=f"S = {whole}",
            note="" if m.size_bytes == m.requested_bytes else f"{m.requested_bytes} requested, rounded to {n} ranks",
        ),
        Term(
            "time",
            "time",
            m.median_s,
            "s",
            formula="median over repeats of the slowest rank",
            substituted=f"fastest {m.fastest_s:.4g} s, slowest {m.slowest_s:.4g} s, {m.repeats} repeats",
        ),
        Term(
            "algbw",
            "algbw",
            m.algbw_gbps,
            "GB/s",
            formula="S / t",
            substituted=f"{m.size_bytes} bytes / {m.median_s:.6g} s / 1e9",
            source=SOURCE,
        ),
        Term(
            "busbw",
            "busbw",
            m.busbw_gbps,
            "GB/s",
            formula=f"algbw × {factor_text}",
            substituted=f"{m.algbw_gbps:.6g} GB/s × {factor_numbers}",
            source=SOURCE,
        ),
    )


def records(measurements: Sequence[CommMeasurement], device_name: str, hardware: str | None = None) -> list[Record]:
    """One ``comm`` record per measurement, for ``lmcalc.bench.results.save``."""
    from lmcalc.bench.results import Record, software_versions

    software = software_versions()
    return [
        Record(
            kind="comm",
            device=device_name,
            hardware=hardware,
            dtype=m.dtype,
            figures={
                "op": m.op,
                "world_size": m.world_size,
                "backend": m.backend,
                "launcher": m.launcher,
                "size_bytes": m.size_bytes,
                "requested_bytes": m.requested_bytes,
                "median_s": m.median_s,
                "fastest_s": m.fastest_s,
                "slowest_s": m.slowest_s,
                "mean_s": m.mean_s,
                "warmup": m.warmup,
                "repeats": m.repeats,
                "algbw_gbps": m.algbw_gbps,
                "busbw_gbps": m.busbw_gbps,
                "busbw_factor": m.factor,
                "time_statistic": "median over repeats of the slowest rank",
                "max_error": m.max_error,
            },
            software=software,
        )
        for m in measurements
    ]
