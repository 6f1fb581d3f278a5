"""The estimates behind each command, by family: counts (params, flops, tensor, dtypes), time (train-time,
optimal), memory (memory, sweeps, stages, inference), limits (fit, max-params), plan, and the report's set.

Each family's public functions are the Python API (``lmcalc.api``): keyword-only, named like the command, their
arguments named like its flags. They resolve what the user gave once (``inputs``), ask the engine, and return an
estimate: the ``Result`` the renderers show, and the figures as typed attributes.
"""
