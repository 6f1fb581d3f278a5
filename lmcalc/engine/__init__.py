"""The accounting engine: pure functions of specs and of the values that describe a run (``Workload``,
``Layout``, ``Cluster``). No printing, no flags, no torch, no preset files.

Its packages are layers, lowest first (tests/test_architecture.py holds the order, docs/architecture.md tells it):
``choices``; ``model`` (parameters, FLOPs, number formats); ``finetune`` (the method, its FLOPs, offloading);
``workload``; ``model_code`` (what the model's code keeps) and ``parallel`` (layout, stages, sharding); ``memory``
and ``time``, which never import each other; ``search``, ``inference`` and ``run``, which ask them.

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
