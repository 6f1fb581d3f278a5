"""A DeepSpeed config (JSON): the ZeRO stage and what it offloads, the micro-batch and accumulation, bf16 or fp16, the
optimizer. Keys as DeepSpeed's own config reads them (``deepspeed/runtime/config.py``, ``zero/config.py``, 0.19).

``"auto"``, which the Hugging Face Trainer's integration fills from its own arguments, is said as such: the value
comes from the Trainer's arguments (``--from`` a Trainer config that points here reads both).
"""

from __future__ import annotations

from typing import Any

from lmcalc.launch.config import Launch, Reading, whole

OPTIMIZERS = {"adam": "adamw", "adamw": "adamw", "fusedadam": "adamw", "cpuadam": "adamw", "lion": "lion",
              "adagrad": "adagrad", "sgd": "sgd-momentum"}  # fmt: skip
"""DeepSpeed's ``optimizer.type`` (lowercased) → lmcalc's optimizer: its Adam and AdamW keep the same two states,
and its Adam decouples weight decay by default (``adam_w_mode``)."""
UNMODELLED = {
    "zero_optimization.overlap_comm": "the reduce overlapped with the backward: its buffers and time",
    "zero_optimization.contiguous_gradients": "gradients copied into one buffer as they are made",
    "zero_optimization.reduce_bucket_size": "the gradient bucket's size (lmcalc takes DeepSpeed's default)",
    "zero_optimization.allgather_bucket_size": "the all-gather bucket's size (lmcalc takes DeepSpeed's default)",
    "zero_optimization.stage3_prefetch_bucket_size": "ZeRO-3's prefetch size (lmcalc takes DeepSpeed's default)",
    "zero_optimization.stage3_max_live_parameters": "ZeRO-3's live parameters (lmcalc takes DeepSpeed's default)",
    "zero_optimization.max_live_parameters": "ZeRO-3's live parameters (lmcalc takes DeepSpeed's default)",
    "zero_optimization.max_reuse_distance": "ZeRO-3's parameter reuse (lmcalc takes DeepSpeed's default)",
    "zero_optimization.stage3_max_reuse_distance": "ZeRO-3's parameter reuse (lmcalc takes DeepSpeed's default)",
    "zero_optimization.prefetch_bucket_size": "ZeRO-3's prefetch size (lmcalc takes DeepSpeed's default)",
    "zero_optimization.param_persistence_threshold": "the parameters ZeRO-3 keeps whole",
    "zero_optimization.stage3_param_persistence_threshold": "the parameters ZeRO-3 keeps whole",
    "zero_optimization.sub_group_size": "ZeRO-3's optimizer step in sub-groups",
    "activation_checkpointing.partition_activations": "checkpoints split over TP (Megatron-DeepSpeed's)",
    "activation_checkpointing.cpu_checkpointing": "checkpoints offloaded to the CPU",
    "zero_optimization.zero_hpz_partition_size": "ZeRO++'s secondary partition",
    "zero_optimization.zero_quantized_weights": "ZeRO++'s quantised weights",
    "zero_optimization.zero_quantized_gradients": "ZeRO++'s quantised gradients",
    "zero_optimization.offload_param.nvme_path": "where NVMe offload writes",
    "zero_optimization.offload_optimizer.nvme_path": "where NVMe offload writes",
}
READ = {
    "zero_optimization.stage", "zero_optimization.offload_optimizer.device", "zero_optimization.offload_param.device",
    "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size", "bf16.enabled",
    "fp16.enabled", "optimizer.type", "zero_optimization.offload_optimizer.pin_memory",
    "zero_optimization.offload_param.pin_memory",
}  # fmt: skip


def read_deepspeed(data: dict[str, Any], source: str, reading: Reading | None = None) -> Launch:
    """The settings of a DeepSpeed config, into ``reading`` where another config points here (a Trainer's)."""
    reading = reading or Reading("deepspeed", source)
    if reading.kind == "deepspeed":
        reading.take("framework", "deepspeed", "(a DeepSpeed config)")
    keys = dotted(data)
    for key, value in keys.items():
        if value == "auto" and (key in READ or key in UNMODELLED):
            reading.cannot(key, value, "filled in by the Hugging Face Trainer from its own arguments")
        elif key in UNMODELLED:
            reading.cannot(key, value, UNMODELLED[key])
        elif key not in READ:
            reading.leave(key)
    _read_zero(keys, reading, source)
    for key, keyword in (("train_micro_batch_size_per_gpu", "micro_batch"), ("gradient_accumulation_steps",
                                                                             "grad_accum")):  # fmt: skip
        if key in keys and keys[key] != "auto":
            reading.take(keyword, whole(keys[key], key, source), key)
    if "train_batch_size" in keys and keys["train_batch_size"] != "auto":
        reading.global_batch_sequences = whole(keys["train_batch_size"], "train_batch_size", source)
    if keys.get("bf16.enabled") is True:
        reading.take("precision", "bf16-mixed", "bf16.enabled")
    elif keys.get("fp16.enabled") is True:
        reading.take("precision", "fp16-mixed", "fp16.enabled")
    elif reading.kind == "deepspeed" and "auto" not in (keys.get("bf16.enabled"), keys.get("fp16.enabled")):
        reading.take("precision", "fp32", "(neither bf16 nor fp16 enabled)")  # DeepSpeed trains in fp32 then
    optimizer = keys.get("optimizer.type")
    if isinstance(optimizer, str) and optimizer != "auto":
        if optimizer.lower() in OPTIMIZERS:
            reading.take("optimizer", OPTIMIZERS[optimizer.lower()], "optimizer.type")
        else:
            reading.cannot("optimizer.type", optimizer, f"lmcalc's optimizers: {', '.join(sorted(set(OPTIMIZERS)))}")
    return reading.launch()


def _read_zero(keys: dict[str, Any], reading: Reading, source: str) -> None:
    """The ZeRO stage, and what is offloaded: the optimizer (ZeRO-Offload) and with ZeRO-3 the parameters."""
    stage = keys.get("zero_optimization.stage")
    if stage is not None and stage != "auto":
        reading.take("zero", whole(stage, "zero_optimization.stage", source), "zero_optimization.stage")
    optimizer = str(keys.get("zero_optimization.offload_optimizer.device", "none")).lower()
    params = str(keys.get("zero_optimization.offload_param.device", "none")).lower()
    if params in ("cpu", "nvme"):
        reading.take("offload", "optimizer+params", "zero_optimization.offload_param.device")
        reading.take("offload_device", params, "zero_optimization.offload_param.device")
    elif optimizer in ("cpu", "nvme"):
        reading.take("offload", "optimizer", "zero_optimization.offload_optimizer.device")
        reading.take("offload_device", optimizer, "zero_optimization.offload_optimizer.device")


def dotted(data: Any, prefix: str = "") -> dict[str, Any]:
    """Each leaf of nested mappings by its dotted path (``zero_optimization.stage``); a list is a leaf."""
    if not isinstance(data, dict):
        return {prefix: data} if prefix else {}
    found: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict) and value:
            found |= dotted(value, path)
        else:
            found[path] = value
    return found
