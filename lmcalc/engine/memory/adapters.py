"""What a LoRA adapter keeps beside A·x, as PEFT runs it: whether it keeps a copy of its input of its own, and in what
dtype it computes (``engine.memory.activations`` counts them in each layer, ``engine.memory.widths`` before them)."""

from __future__ import annotations

from lmcalc.engine.workload import Workload


def adapter_copies(w: Workload) -> bool:
    """Whether each adapter keeps its own copy of its input: the dropout's output when PEFT's ``lora_dropout`` is
    on; autocast's 16-bit cast under a mixed recipe (the recipe's master copy); PEFT's cast to the adapters' fp32
    (peft/tuners/lora/layer.py Linear.forward, ``_cast_input_dtype``) over 16-bit activations."""
    fp32_cast = w.method.fp32_adapters and w.precision.activation_bytes < 4
    return w.method.lora_dropout > 0 or w.precision.master_bytes > 0 or fp32_cast


def adapter_bytes(w: Workload) -> float:
    """Bytes per element of what an adapter computes: its input copy and A·x. fp32 adapters without autocast run in
    fp32 (PEFT casts the input to the adapters' dtype); under autocast (a mixed recipe) or with adapters in the
    model's dtype, in the activations' dtype."""
    if w.method.fp32_adapters and w.precision.master_bytes == 0:
        return 4.0
    return w.precision.activation_bytes
