"""A large layout search split over the machine's cores: this process and forked ones each take the next job of the
search (a group of its (TP, PP, CP)) as they finish the last, and the forked ones send back figures, which the parent
puts back in the search's order (``engine.search.plan``).

The workers are forked, so they start with the parent's modules and read no file. A search in several processes finds
the same plan as in one: the same layouts, evaluated the same way, merged in the same order.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import threading
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from typing import Any, TypeVar

from lmcalc.errors import LmcalcError

MAX_WORKERS = 8
"""The most processes a search uses where the machine has more cores."""

PARALLEL_FROM = 100_000
"""The layouts from which a search is worth splitting. In one process a search takes about 27 µs a layout (Llama
3.1 405B on 16,384 H100: 21,060 in 0.57 s), so this size takes about 2.7 s. Split in two, DeepSeek-V3's 833,964
took 6.6 s where one process took 11.6 s (docs/performance.md): the fork, the figures sent back and the cache
entries both processes make cost about 0.8 s of the 5 s saved, about 0.1 s at this size."""

T = TypeVar("T")


def cores() -> int:
    """The cores this process may run on."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity else os.cpu_count() or 1


def search_workers(layouts: int) -> int:
    """How many processes to search ``layouts`` layouts in: one for a small search, where fork is not the start
    method the platform offers, or where other threads run (forking them is unsafe); else the cores, up to
    ``MAX_WORKERS``."""
    if layouts < PARALLEL_FROM or "fork" not in multiprocessing.get_all_start_methods():
        return 1
    if threading.active_count() > 1:
        return 1
    return max(1, min(cores(), MAX_WORKERS))


def run_balanced(
    work: Callable[[int], T], jobs: int, processes: int, pack: Callable[[T], Any], unpack: Callable[[Any], T]
) -> list[T]:
    """``work(job)`` for each job below ``jobs``, in ``processes`` processes: this one and ``processes`` − 1 forked
    ones. Each takes the next job as it finishes its last, so with the largest jobs first they finish together. A
    forked process sends each job's result as ``pack`` makes it, from a thread of its own so that sending never holds
    up its search, and this one reads them by ``unpack`` between its own jobs, so that little is left to read once
    the last job is done; its own results are never sent. The results come in the jobs' order."""
    context = multiprocessing.get_context("fork")
    taken = context.Value("i", 0)  # the next job: shared, under its lock

    def drain(between: Callable[[], None]) -> Iterator[tuple[int, T]]:
        while True:
            with taken.get_lock():
                job = taken.value
                taken.value = job + 1
            if job >= jobs:
                return
            yield job, work(job)
            between()

    def child(send: Connection) -> None:
        outbox: queue.SimpleQueue[tuple[str, Any] | None] = queue.SimpleQueue()

        def post() -> None:
            while (message := outbox.get()) is not None:
                send.send(message)
            send.close()

        poster = threading.Thread(target=post)  # started in the child: nothing else runs in it to fork with
        poster.start()
        try:
            for job, result in drain(lambda: None):
                outbox.put(("job", (job, pack(result))))
            outbox.put(("done", None))
        except BaseException as exc:  # sent to the parent, which raises it as a search in one process would
            outbox.put(("failed", exc))
        outbox.put(None)
        poster.join()

    results: dict[int, T] = {}
    children: list[tuple[multiprocessing.process.BaseProcess, Connection]] = []

    def take_in(wait: bool) -> None:
        """Read what the forked processes have sent: what has come, or (``wait``) all of it."""
        for process, receive in list(children):
            while wait or receive.poll():
                try:
                    kind, body = receive.recv()
                except EOFError:
                    process.join()
                    raise LmcalcError(
                        f"a search process ended without its results (exit code {process.exitcode}); "
                        "the machine may be short of memory"
                    ) from None
                if kind == "failed":
                    raise body
                if kind == "done":
                    children.remove((process, receive))
                    process.join()
                    break
                job, packed = body
                results[job] = unpack(packed)

    forked_processes = []
    try:
        for _ in range(processes - 1):
            receive, send = context.Pipe(duplex=False)
            forked = context.Process(target=child, args=(send,), daemon=True)
            forked.start()
            send.close()
            children.append((forked, receive))
            forked_processes.append(forked)
        results.update(drain(lambda: take_in(wait=False)))
        take_in(wait=True)
    finally:
        for left in forked_processes:
            if left.is_alive():
                left.terminate()
                left.join()
    return [results[job] for job in range(jobs)]
