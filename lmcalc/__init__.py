"""lmcalc: what an LLM training run costs before you rent a GPU — parameters, FLOPs, memory, time.

The functions of ``lmcalc.api`` are importable from here (``lmcalc.plan(...)``, ``lmcalc.memory(...)``), loaded
when first used. The accounting engine is pure Python; torch is imported only by ``bench`` and the PyTorch
cross-checks.
"""

import importlib
import importlib.util
from typing import Any

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # A submodule not yet imported (``from lmcalc import presets``) is the import system's to load, not the API's.
    if importlib.util.find_spec(f"{__name__}.{name}") is None:
        api = importlib.import_module("lmcalc.api")
        if name in api.__all__:
            value = getattr(api, name)
            globals()[name] = value  # found once: later uses read the module's own attribute
            return value
    raise AttributeError(f"module 'lmcalc' has no attribute {name!r}")
