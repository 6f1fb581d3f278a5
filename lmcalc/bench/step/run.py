"""Running and timing the steps: build the reference model, step it, read the memory it held.

One step is what a training loop does: forward, fp32 cross-entropy against the next token, backward,
``AdamW.step()`` and ``zero_grad``, on one fixed batch of random tokens (so the loss must fall: proof that
the optimizer really steps), timed by ``lmcalc.bench.timing.time_calls``.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from lmcalc import measure
from lmcalc.bench.device import Device
from lmcalc.bench.dtypes import DTYPES
from lmcalc.bench.step.config import SEED, StepSetup
from lmcalc.bench.step.measurement import StepMeasurement
from lmcalc.bench.step.predict import check_fits, predict_memory, smaller_presets
from lmcalc.bench.timing import synchronize, time_calls
from lmcalc.errors import LmcalcError, setting
from lmcalc.reference_model import ReferenceModel, loss
from lmcalc.validate import cpu_fallback_reason


def run_steps(setup: StepSetup, device: Device) -> StepMeasurement:
    """Time ``setup.repeats`` AdamW training steps after ``setup.warmup`` untimed ones, on ``device``.

    The engine's memory prediction is checked against the device first. On CUDA the allocator's peak is
    reset after the warm-up, once the optimizer states exist, and read after the timed steps.
    ``setup.threads`` sets ``torch.set_num_threads`` for the run (restored after): on a CPU shared with
    other work, fewer threads than cores can be several times faster.
    """
    torch_device = device.torch_device
    setup = replace(setup, dtype=setup.dtype_on(torch_device.type))
    prediction = predict_memory(setup, torch_device.type)
    # A step that falls back to the math kernel materialises the scores as eager attention does.
    worst_case = (
        predict_memory(replace(setup, attention="eager"), torch_device.type)
        if torch_device.type == "cpu" and cpu_fallback_reason(setup.model, setup.attention)
        else prediction
    )
    check_fits(worst_case, setup, device)

    previous_threads = torch.get_num_threads()
    if setup.threads is not None:
        torch.set_num_threads(setup.threads)
    try:
        used_threads = torch.get_num_threads()
        seconds, losses, peak = _timed_steps(setup, torch_device)
    except torch.OutOfMemoryError:
        raise LmcalcError(
            f"{setup.model.name} at s={setup.seq_len}, b={setup.micro_batch} ran out of memory on the "
            f"{device.name}; try {smaller_presets(setup.model)} or a shorter {setting('seq')} / smaller "
            f"{setting('micro_batch')}"
        ) from None
    finally:
        torch.set_num_threads(previous_threads)
    return StepMeasurement(setup, device, tuple(seconds), tuple(losses), prediction, peak, used_threads)


def _timed_steps(setup: StepSetup, torch_device: torch.device) -> tuple[list[float], list[float], float | None]:
    """Seconds per timed step, the loss of every step, and the peak bytes of a step less the module's
    buffers: on CUDA the allocator's peak over the timed steps, less cuBLAS's workspaces (allocated
    before the model, ``measure.cuda_workspaces``); on a CPU the live storages of one more,
    untimed step (``measure.StorageTracker``: tracking every operator would slow the timed ones)."""
    s = setup
    workspaces = measure.cuda_workspaces(torch_device) if torch_device.type == "cuda" else 0
    torch.manual_seed(SEED)
    dtype = DTYPES[s.dtype_on(torch_device.type)].torch()
    model = ReferenceModel(s.model, s.attention, max_seq=s.seq_len, device=torch_device, dtype=dtype)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=s.learning_rate, foreach=True)  # the GPU default, everywhere
    tokens = torch.randint(0, s.model.vocab_size, (s.micro_batch, s.seq_len)).to(torch_device)
    losses: list[torch.Tensor] = []

    def training_step(_: int) -> None:
        value = loss(model, tokens, s.recompute)
        value.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(value.detach())  # read after the timing: no host sync inside a step

    for i in range(s.warmup):
        training_step(i)
    synchronize(torch_device)
    if torch_device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(torch_device)
    seconds = time_calls(training_step, torch_device, 0, s.repeats)
    synchronize(torch_device)
    buffers = measure.tensor_bytes(model.buffers())
    peak: float | None = None
    if torch_device.type == "cuda":
        peak = float(torch.cuda.max_memory_allocated(torch_device) - buffers - workspaces)
    elif torch_device.type == "cpu":
        peak = float(measure.tracked_step(model, optimizer, tokens, s.recompute).peak - buffers)
    return seconds, [float(v) for v in losses], peak
