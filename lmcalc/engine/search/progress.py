"""How far a long search has gone, for a caller that shows it or stops it (``lmcalc serve``): a search reports the
layouts it has evaluated to the reporter set for the running thread, which may raise ``Cancelled`` to end it.

The engine holds no reporter of its own and prints nothing: without one, a report costs a context-variable read.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator

Reporter = Callable[[int, int], None]
"""``reporter(done, total)``: the layouts tried so far and about how many the search holds (``space.layout_estimate``,
which counts a layout once for all its recomputation modes)."""

EVERY = 512
"""Layouts between two reports: each is tried at up to three recomputation modes, about 80 µs in all at 27 µs a
try (``engine.search.workers``), so a report every 40 ms or so."""

_reporter: contextvars.ContextVar[Reporter | None] = contextvars.ContextVar("search_reporter", default=None)


class Cancelled(Exception):  # noqa: N818 (what happened, as the caller reads it)
    """Raised by a reporter to end the search that called it."""


@contextlib.contextmanager
def reporting(reporter: Reporter) -> Iterator[None]:
    """Searches started on this thread inside the block report to ``reporter``."""
    token = _reporter.set(reporter)
    try:
        yield
    finally:
        _reporter.reset(token)


def current() -> Reporter | None:
    """The reporter of the running thread's search, if any."""
    return _reporter.get()
