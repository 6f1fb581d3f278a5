"""The closed choices of ``lmcalc bench``, each defined once: the devices, the collectives, the process-group
backends, and the dtypes each benchmark accepts (what a dtype is, its torch name and its format, is
``bench.dtypes.DTYPES``). The benchmarks check their settings against these, and the command line's help
lists them, so neither can fall behind the other; nothing here imports torch.
"""

from __future__ import annotations

from typing import Literal, get_args

DeviceChoice = Literal["auto", "cuda", "cpu", "mps"]
Op = Literal["all-reduce", "all-gather", "reduce-scatter"]
Backend = Literal["auto", "gloo", "nccl"]
MatmulDtype = Literal["fp32", "tf32", "fp16", "bf16", "fp8"]
CommDtype = Literal["fp32", "bf16", "fp16"]
StepDtype = Literal["fp32", "bf16"]

DEVICES: tuple[DeviceChoice, ...] = get_args(DeviceChoice)
"""``auto`` takes the first available of CUDA, MPS and the CPU."""
OPS: tuple[Op, ...] = get_args(Op)
BACKENDS: tuple[Backend, ...] = get_args(Backend)
"""``auto``: NCCL when there is a GPU for every rank, else gloo."""
MATMUL_DTYPES: tuple[MatmulDtype, ...] = get_args(MatmulDtype)
COMM_DTYPES: tuple[CommDtype, ...] = get_args(CommDtype)
STEP_DTYPES: tuple[StepDtype, ...] = get_args(StepDtype)
"""A training step runs in fp32 or bf16: what a model in that dtype and ``torch.optim.AdamW`` keep."""
