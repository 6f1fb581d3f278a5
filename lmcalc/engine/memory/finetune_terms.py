"""What a fine-tuning method and offload do to one GPU's memory, as terms: the parameters trained and frozen,
the bytes of the frozen base, the adapters, and the model states kept off the GPU.

``engine.finetune.method`` says which weights train and what the frozen ones cost; ``engine.memory.gpu_memory``
finds the bytes; this module says how they were found, for the tables, ``--json`` and ``--explain`` alike.
"""

from __future__ import annotations

from lmcalc.engine.finetune.method import (
    NF4_BITS_PER_WEIGHT,
    NF4_BLOCK,
    NF4_BLOCK2,
    adapted_modules,
    frozen_params,
    trained_params,
)
from lmcalc.engine.finetune.offload import FP32_GRAD_COPY
from lmcalc.engine.memory.gpu_memory import GpuMemory
from lmcalc.engine.parallel.layout import Layout
from lmcalc.engine.parallel.pipeline import stage_layers
from lmcalc.engine.parallel.sharding import frozen_held, trained_held
from lmcalc.engine.workload import Workload
from lmcalc.result import Section, Term
from lmcalc.units import group

HU = "Hu et al. 2021 (LoRA) §4.1"
DORA = "Hu et al. 2021 (LoRA) §4.1; Liu et al. 2024 (DoRA) eq. 5; PEFT's DoraLinearLayer"
OFFLOAD_SOURCES = "Ren et al. 2021 (ZeRO-Offload) §4.1; Rajbhandari et al. 2021 (ZeRO-Infinity)"
QLORA = "Dettmers et al. 2023 (QLoRA) §3; bitsandbytes quantize_4bit (blocksize 64, compress_statistics)"


def method_section(w: Workload, layout: Layout, gpu: GpuMemory, gpus_per_node: int = 1) -> Section | None:
    """The fine-tuning method's and offload's terms for one GPU, or None under full training without offload; the
    ``gpus_per_node`` GPUs of a node share its host memory."""
    method, offload = w.method, w.offload
    if method.kind == "full" and not offload.optimizer:
        return None
    model, precision = w.model, w.precision
    built = stage_layers(model, layout, gpu.stage)
    terms: list[Term] = []
    if method.kind != "full":
        trained = trained_params(model, method)
        total = trained + frozen_params(model, method)
        split = layout.state_shards.split
        held = trained_held(model, method, split, built)
        frozen = frozen_held(model, method, precision.param_bytes, split, built)
        source = (DORA if method.dora else HU) if method.adapters else ""
        terms.append(Term("method", method.label, trained, "params", _trained_formula(w), _adapter_numbers(w),
                          source=source, note=f"of {group(round(total))} in all "
                          f"({100 * trained / total:.3g} % trained)"))  # fmt: skip
        terms.append(Term("trained_per_gpu", "Trained parameters on this GPU (N_train, before ZeRO)", held.total,
                          "params", "the adapters, kept whole on every TP rank" if method.adapters else
                          "the trained layers' share of the weights this GPU holds"))  # fmt: skip
        terms.append(Term("frozen_weights", "Frozen weights on this GPU (before ZeRO)", frozen.total, "bytes",
                          _frozen_formula(w), source=QLORA if method.kind == "qlora" else "",
                          note="no gradients, no master copy, no optimizer states"))  # fmt: skip
    if offload.optimizer:
        where = "host memory" if offload.device == "cpu" else "NVMe"
        per_node = gpu.offloaded * min(layout.gpus, gpus_per_node)
        parts = "master weights + optimizer states + an fp32 copy of the gradients"
        if offload.params:
            parts += " + 16-bit weights and gradients"
        terms.append(Term("offloaded", f"Offloaded to {where}, per GPU", gpu.offloaded, "bytes", parts,
                          source=OFFLOAD_SOURCES,
                          note=f"{FP32_GRAD_COPY} B per trained parameter for the gradients' fp32 copy"))  # fmt: skip
        terms.append(Term("offloaded_per_node", f"Offloaded to {where}, per node", per_node, "bytes",
                          "per GPU · GPUs of a node", note="the host's staging buffers are not counted"))  # fmt: skip
    return Section("method", "Fine-tuning method and offload", tuple(terms))


def _trained_formula(w: Workload) -> str:
    method = w.method
    if method.adapters:
        if method.dora:
            return "Σ adapted modules · (r·(in + out) + out)  (A: r × in, B: out × r, DoRA's magnitude: out)"
        return "Σ adapted modules · r·(in + out)  (A: r × in, B: out × r)"
    return f"every weight of layers {method.freeze_layers}..L−1, the final norm and an untied head"


def _adapter_numbers(w: Workload) -> str:
    if not w.method.adapters:
        return ""
    modules = adapted_modules(w.model, w.method)
    r = w.method.lora_rank
    return " + ".join(f"{group(m.count)}·{r * m.rank_scale}·({m.inputs} + {m.outputs})" for m in modules)


def _frozen_formula(w: Workload) -> str:
    method, precision = w.method, w.precision
    if method.kind == "qlora":
        rest = "fp32 (peft.prepare_model_for_kbit_training)" if method.kbit_upcast else f"{precision.param_bytes:g} B"
        experts = ", the routed experts (3-D tensors bitsandbytes passes over)" if w.model.moe else ""
        return (
            f"linear weights of the layers in NF4: {NF4_BITS_PER_WEIGHT:.4g} bits = 4 + 8/{NF4_BLOCK} + "
            f"32/({NF4_BLOCK}·{NF4_BLOCK2}) per weight, + 1,092 B per tensor; embeddings, norms, biases, routers"
            f"{experts} and the head at {rest}"
        )
    return f"frozen weights · {precision.param_bytes:g} B (the recipe's weight bytes)"
