"""Key figures of every preset at fixed settings, for the golden-file regression test.

Any change to a formula or a preset changes this table; the test shows the difference and the
command that regenerates the file (``python scripts/update_golden.py``), so the change is reviewed.
"""

from __future__ import annotations

from typing import Any

from lmcalc import estimates as est
from lmcalc.engine.layout import Layout
from lmcalc.presets import parse_cluster, registry, resolve_optimizer, resolve_precision

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
}


def model_figures(name: str) -> dict[str, Any]:
    spec = registry("models").specs[name]
    s = GOLDEN_SETTINGS
    seq = min(s["seq_len"], spec.max_seq_len)
    precision = resolve_precision(s["precision"]).spec
    flops = est.flops_result(spec, est.Given(s["tokens"], "golden"), est.Given(seq, "golden"))
    memory = est.memory_result(
        spec,
        parse_cluster(s["cluster_memory"]),
        precision,
        resolve_optimizer(s["optimizer"]).spec,
        Layout(dp=8, zero=s["zero_stage"], micro_batch=s["micro_batch"]),
        est.Given(seq, "golden"),
    )
    time = est.train_time_result(
        spec,
        est.Given(s["tokens"], "golden"),
        est.Given(s["mfu"], "golden"),
        precision,
        cluster=parse_cluster(s["cluster_time"]),
    )
    params = est.params_result(spec)
    figures = {
        "params_total": params.value("params.total"),
        "flops_per_token_causal": flops.value("detailed.training_per_token"),
        "flops_napkin_total": flops.value("napkin.total"),
        "memory_params": memory.value("state.params"),
        "memory_grads": memory.value("state.grads"),
        "memory_master": memory.value("state.master"),
        "memory_optimizer": memory.value("state.optimizer"),
        "memory_activations": memory.value("activations.total"),
        "memory_total": memory.value("total.total"),
        "days": time.value("time.days"),
    }
    if spec.moe:
        figures["params_active"] = params.value("params.active")
    return figures


def hardware_figures(name: str) -> dict[str, Any]:
    spec = registry("hardware").specs[name]
    return {
        "memory_bytes": spec.memory_bytes,
        "peak_tflops_dense": dict(spec.peak_tflops_dense),
        "memory_bandwidth_tbps": spec.memory_bandwidth_tbps,
    }


def golden_table() -> dict[str, Any]:
    return {
        "settings": GOLDEN_SETTINGS,
        "models": {name: model_figures(name) for name in sorted(registry("models").specs)},
        "hardware": {name: hardware_figures(name) for name in sorted(registry("hardware").specs)},
    }
