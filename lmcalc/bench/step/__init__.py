"""``lmcalc bench step``: real training steps of the reference model, timed, turned into tokens/s and MFU.

One step is what a training loop does: forward, fp32 cross-entropy, backward, ``AdamW.step()`` and
``zero_grad``. The model is ``ReferenceModel`` (the module ``lmcalc validate`` checks the engine
against) in one dtype throughout, with ``torch.optim.AdamW`` keeping its states in that dtype, on one
fixed batch of random tokens, scored against the next token (so the loss must fall: proof that the
optimizer really steps). AdamW's multi-tensor ``foreach`` kernels, its default on a GPU, are asked for
on every device, so that the memory prediction describes what runs.

Conventions, each stated once here and again in the result's notes:

* **Model FLOPs** per step = 3 × the engine's forward count per token × b·s (backward = 2 × forward,
  Kaplan et al. 2020 §2.1), with attention counted **full** (every query against all s keys): the
  convention of Korthikanti et al. 2022 eq. (7) and PaLM (Chowdhery et al. 2022 Appendix B), and the
  one ``FlopCounterMode`` agrees with. The causal count (half the attention) is shown beside it.
  Recomputation is hardware work, not model work: it enters HFU only (PaLM §4.1).
* **MFU** = model FLOPs per step / (median step time × the device's dense peak for the dtype), the
  peak from ``Device.peak`` (a hardware preset, or a labelled estimate on a CPU). Where the device has
  no peak for the dtype, MFU is reported as not available; no peak is ever invented.
* **Memory**: the engine's peak of a plain PyTorch step (``engine.memory.step_peak``: the largest of backward
  start, backward end and the optimizer step, with the precision recipe plain PyTorch matches: ``fp32``
  for an fp32 model, ``bf16-pure`` for a bf16 one; AdamW), against ``torch.cuda.max_memory_allocated``
  on CUDA, and against the live storages of one more, untimed step on a CPU (``measure.StorageTracker``,
  as a CPU has no allocator statistics), both less the module's buffers (rotary tables, causal mask),
  and on CUDA less cuBLAS's workspaces too (``measure.cuda_workspaces``).

The parts: ``config`` (``StepSetup``, the step to run), ``predict`` (the engine's FLOPs and memory for it,
and the check that it fits), ``run`` (building, stepping and timing the model), ``measurement``
(``StepMeasurement`` and the figures derived from it) and ``report`` (the result and the record).
"""

from lmcalc.bench.choices import STEP_DTYPES
from lmcalc.bench.step.config import FLOP_CONVENTION, LEARNING_RATE, OPTIMIZER, RECIPE_FOR_DTYPE, SEED, StepSetup
from lmcalc.bench.step.measurement import StepMeasurement, peak_key
from lmcalc.bench.step.predict import (
    MemoryPrediction,
    check_fits,
    hardware_flops_per_step,
    memory_limit,
    model_flops_per_step,
    predict_memory,
    ram_bytes,
    smaller_presets,
)
from lmcalc.bench.step.report import records, step_result
from lmcalc.bench.step.run import run_steps

__all__ = [
    "FLOP_CONVENTION",
    "LEARNING_RATE",
    "OPTIMIZER",
    "RECIPE_FOR_DTYPE",
    "SEED",
    "STEP_DTYPES",
    "MemoryPrediction",
    "StepMeasurement",
    "StepSetup",
    "check_fits",
    "hardware_flops_per_step",
    "memory_limit",
    "model_flops_per_step",
    "peak_key",
    "predict_memory",
    "ram_bytes",
    "records",
    "run_steps",
    "smaller_presets",
    "step_result",
]
