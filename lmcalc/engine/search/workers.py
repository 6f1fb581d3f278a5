"""A large layout search split over the machine's cores: each worker process searches its share of the (TP, PP, CP)
and sends back figures, which the parent puts back in the search's order (``engine.search.plan``).

The workers are forked, so they start with the parent's modules and read no file. A search in several processes finds
the same plan as in one: the same layouts, evaluated the same way, merged in the same order.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any, TypeVar

MAX_WORKERS = 8
"""The most processes a search uses where the machine has more cores."""

PARALLEL_FROM = 100_000
"""The layouts from which a search is worth splitting. In one process a search takes about 27 µs a layout (Llama
3.1 405B on 16,384 H100: 21,060 in 0.57 s), so this size takes about 2.7 s; forking and sending back the figures
of DeepSeek-V3's 833,964 took about 1.3 s in all (docs/performance.md), about 0.16 s at this size."""

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


def run_shares(work: Callable[..., T], shares: Sequence[tuple[Any, ...]]) -> list[T]:
    """``work(*share)`` for each share, each in a forked process of its own; the results in the shares' order."""
    context = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(max_workers=len(shares), mp_context=context) as pool:
        futures = [pool.submit(work, *share) for share in shares]
        return [future.result() for future in futures]
