"""Launching the ranks of a collective benchmark, and gathering what they measured.

* Under ``torchrun`` (``RANK`` and ``WORLD_SIZE`` in the environment) every rank measures in its own
  process on its own device (NCCL on GPUs, gloo on CPUs); rank 0 gets the measurements, the others ``[]``.
* Otherwise ``world_size`` local processes are spawned (``torch.multiprocessing.spawn``). They meet
  through a file in a private temporary directory (a ``FileStore``, so no TCP rendezvous server is
  opened: torch's ``TCPStore`` listens on every interface whatever host it is given), and gloo (or NCCL's
  bootstrap) is bound to the loopback interface, so nothing leaves 127.0.0.1.

torch is imported inside the functions.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

from lmcalc.bench.choices import BACKENDS
from lmcalc.bench.comm.measurement import CommMeasurement, CommSettings
from lmcalc.bench.comm.ranks import measure_all
from lmcalc.errors import LmcalcError, setting

if TYPE_CHECKING:
    import torch

TIMEOUT_S = 600


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
    settings: CommSettings, world_size: int | None = None, backend: str = "auto"
) -> list[CommMeasurement]:
    """Measure ``settings``' collectives at each of its sizes over ``world_size`` ranks.

    ``backend``: ``gloo`` (CPU tensors), ``nccl`` (one GPU per rank) or ``auto`` (NCCL when there are
    enough GPUs, else gloo). Under torchrun the launch's own ranks are used (``world_size`` None or
    equal to ``WORLD_SIZE``) and only rank 0 gets the measurements; otherwise ``world_size`` local
    processes (default 2) are spawned and this process gets them all. A collective whose output is
    wrong raises RuntimeError; bad arguments raise LmcalcError before anything starts.
    """
    if backend not in BACKENDS:
        raise LmcalcError(f"{setting('backend')} must be one of {', '.join(BACKENDS)}; got {backend!r}")
    import torch.distributed as dist

    if not dist.is_available():
        raise LmcalcError("this PyTorch build has no torch.distributed")
    if launched_by_torchrun():
        env_world = int(os.environ["WORLD_SIZE"])
        if world_size not in (None, env_world):
            raise LmcalcError(f"{setting('world_size')} {world_size} does not match torchrun's WORLD_SIZE={env_world}")
        settings.check_sizes(env_world)
        return _run_under_torchrun(settings, backend)
    world_size = 2 if world_size is None else world_size
    if world_size < 1:
        raise LmcalcError(f"{setting('world_size')} must be a positive number of processes; got {world_size}")
    settings.check_sizes(world_size)
    return _run_spawned(settings, world_size, _spawn_backend(backend, world_size))


def _spawn_backend(backend: str, world_size: int) -> str:
    import torch
    import torch.distributed as dist

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if backend == "auto":
        backend = "nccl" if dist.is_nccl_available() and gpus >= world_size else "gloo"
    if backend == "nccl" and (not dist.is_nccl_available() or gpus < world_size):
        raise LmcalcError(
            f"{setting('backend')} nccl needs one GPU per process: {world_size} asked, {gpus} here"
            + ("" if dist.is_nccl_available() else " (and this PyTorch has no NCCL)")
        )
    if backend == "gloo" and not dist.is_gloo_available():
        raise LmcalcError("this PyTorch build has no gloo backend")
    return backend


@dataclass(frozen=True)
class _Rendezvous:
    """How the spawned ranks meet: how many, over which backend, on which network interface, through which
    file store, and where rank 0 writes the measurements."""

    world_size: int
    backend: str  # gloo | nccl
    interface: str  # the loopback interface: gloo and NCCL's bootstrap are bound to it
    store_path: str
    out_path: str


def _run_spawned(settings: CommSettings, world_size: int, backend: str) -> list[CommMeasurement]:
    import torch.multiprocessing as mp

    interface = loopback_interface()
    with tempfile.TemporaryDirectory(prefix="lmcalc-comm-") as tmp:
        store, out = os.path.join(tmp, "store"), os.path.join(tmp, "measurements.json")
        rendezvous = _Rendezvous(world_size, backend, interface, store, out)
        mp.spawn(_spawn_worker, args=(rendezvous, settings), nprocs=world_size, join=True)
        with open(out, encoding="utf-8") as handle:
            rows = json.load(handle)
    return [CommMeasurement(**{**row, "rank_medians_s": tuple(row["rank_medians_s"])}) for row in rows]


def _spawn_worker(rank: int, rendezvous: _Rendezvous, settings: CommSettings) -> None:
    """One spawned rank: join the group through the file store, on the loopback interface only."""
    import torch
    import torch.distributed as dist

    r = rendezvous
    os.environ["GLOO_SOCKET_IFNAME"] = r.interface
    os.environ["NCCL_SOCKET_IFNAME"] = r.interface
    if r.backend == "nccl":
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // r.world_size))
    store = dist.FileStore(r.store_path, r.world_size)
    dist.init_process_group(
        r.backend,
        store=store,
        rank=rank,
        world_size=r.world_size,
        timeout=timedelta(seconds=TIMEOUT_S),
        device_id=device if r.backend == "nccl" else None,
    )
    try:
        rows = measure_all(settings, device, r.backend, "spawn")
    finally:
        dist.destroy_process_group()
    if rank == 0:
        with open(r.out_path, "w", encoding="utf-8") as handle:
            json.dump([asdict(row) for row in rows], handle)


def _run_under_torchrun(settings: CommSettings, backend: str) -> list[CommMeasurement]:
    import torch
    import torch.distributed as dist

    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() and dist.is_nccl_available() else "gloo"
    device = _torchrun_device(backend)
    created = not dist.is_initialized()
    if created:
        dist.init_process_group(backend, device_id=device if backend == "nccl" else None)
    elif dist.get_backend() != backend:
        raise LmcalcError(f"the process group already uses {dist.get_backend()}, not {backend}")
    try:
        rows = measure_all(settings, device, backend, "torchrun")
        reports = dist.get_rank() == 0
    finally:
        if created:
            dist.destroy_process_group()
    return rows if reports else []


def _torchrun_device(backend: str) -> torch.device:
    """This rank's device: its own GPU (``LOCAL_RANK``) for NCCL, the CPU for gloo."""
    import torch

    if backend != "nccl":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise LmcalcError(f"{setting('backend')} nccl: no CUDA device is available to this rank")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    torch.cuda.set_device(device)
    return device
