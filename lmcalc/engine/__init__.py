"""The accounting engine: pure functions of specs and of the values that describe a run (``Workload``,
``Layout``, ``Cluster``). No printing, no flags, no torch.

Functions the planner asks thousands of times are memoised with ``functools``, keyed by their arguments (frozen
values); ``clear_caches`` forgets every memoised figure.
"""

import sys


def clear_caches() -> None:
    """Forget every memoised engine figure: a long-running process that reads many models can free them, and a
    benchmark can time a search as a fresh process runs it."""
    for name, module in list(sys.modules.items()):
        if name.startswith(f"{__name__}.") and module is not None:
            for value in vars(module).values():
                if callable(getattr(value, "cache_clear", None)) and getattr(value, "__module__", "") == name:
                    value.cache_clear()
