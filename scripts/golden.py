"""Key figures of every preset at fixed settings, for the golden-file regression test.

Any change to a formula or a preset changes this table; the test shows the difference and the
command that regenerates the file (``python scripts/update_golden.py``), so the change is reviewed.
"""

from __future__ import annotations

from typing import Any

from lmcalc import api
from lmcalc.presets import registry

GOLDEN_SETTINGS = {
    "seq_len": 4096,
    "micro_batch": 1,
    "cluster_memory": "8xH100",
    "zero_stage": 3,
    "cluster_time": "1024xH100",
    "tokens": 1e12,
    "mfu": 0.4,
    "precision": "bf16-mixed",
    "optimizer": "adamw",
    "framework": "idealised",
}
FRAMEWORK_MODEL = "llama-3.1-8b"  # the model each framework profile's figures are taken on


def model_figures(name: str) -> dict[str, Any]:
    spec = registry("models").specs[name]
    s = GOLDEN_SETTINGS
    seq = min(s["seq_len"], spec.max_seq_len)
    flops = api.flops(model=spec, tokens=s["tokens"], seq=seq)
    memory = api.memory(
        model=spec,
        gpus=s["cluster_memory"],
        seq=seq,
        micro_batch=s["micro_batch"],
        precision=s["precision"],
        optimizer=s["optimizer"],
        dp=8,
        zero=s["zero_stage"],
        framework=s["framework"],
    )
    time = api.train_time(
        model=spec, gpus=s["cluster_time"], tokens=s["tokens"], mfu=s["mfu"], precision=s["precision"]
    )
    params = api.params(model=spec)
    figures = {
        "params_total": params.total,
        "flops_per_token_causal": flops.value("detailed.training_per_token"),
        "flops_napkin_total": flops.value("napkin.total"),
        "memory_params": memory.gpu.params,
        "memory_grads": memory.gpu.grads,
        "memory_master": memory.gpu.master,
        "memory_optimizer": memory.gpu.optimizer,
        "memory_activations": memory.gpu.activations,
        "memory_total": memory.total,
        "days": time.days,
    }
    if spec.moe:
        figures["params_active"] = params.active
    return figures


def hardware_figures(name: str) -> dict[str, Any]:
    spec = registry("hardware").specs[name]
    return {
        "memory_bytes": spec.memory_bytes,
        "peak_tflops_dense": dict(spec.peak_tflops_dense),
        "memory_bandwidth_tbps": spec.memory_bandwidth_tbps,
    }


def framework_figures(name: str) -> dict[str, Any]:
    """One profile's parts of the most loaded GPU, for ``FRAMEWORK_MODEL`` at the golden settings with ZeRO-1 and
    ZeRO-3 (8 GPUs), each where the framework runs it (torchtitan has no ZeRO-1)."""
    s = GOLDEN_SETTINGS
    figures = {}
    for zero in (z for z in (1, 3) if z in registry("frameworks").spec(name).parallelism.zero_stages):
        gpu = api.memory(
            model=FRAMEWORK_MODEL, gpus=s["cluster_memory"], seq=s["seq_len"], zero=zero, framework=name
        ).gpu
        figures[f"zero{zero}"] = {
            "states": gpu.states,
            "activations": gpu.activations,
            "framework_buffers": gpu.framework_buffers,
            "transient": gpu.transient,
            "reserved": gpu.reserved,
            "total": gpu.total,
        }
    return figures


def golden_table() -> dict[str, Any]:
    return {
        "settings": GOLDEN_SETTINGS,
        # a counted-only preset (ModelSpec.counted_only) has no training memory to pin
        "models": {
            name: model_figures(name)
            for name, spec in sorted(registry("models").specs.items())
            if not spec.counted_only
        },  # fmt: skip
        "hardware": {name: hardware_figures(name) for name in sorted(registry("hardware").specs)},
        "frameworks": {name: framework_figures(name) for name in sorted(registry("frameworks").specs)},
    }
