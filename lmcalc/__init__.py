"""lmcalc: what an LLM training run costs before you rent a GPU — parameters, FLOPs, memory, time.

The accounting engine is pure Python; torch is imported only by ``bench`` and the PyTorch cross-checks.
"""

__version__ = "0.1.0"
