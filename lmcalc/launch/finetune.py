"""Fine-tuning configs: Hugging Face ``TrainingArguments`` (JSON, or the YAML of TRL and the alignment handbook), an
axolotl YAML and a LLaMA-Factory YAML. All three run the Hugging Face Trainer, so they share its argument names
(``per_device_train_batch_size``, ``gradient_accumulation_steps``, ``gradient_checkpointing``, ``optim``,
``deepspeed``); each adds its own for the model and the adapters. A DeepSpeed config they point to is read too,
from beside the file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lmcalc.errors import LmcalcError
from lmcalc.launch.config import Launch, Reading, Taken, whole
from lmcalc.launch.deepspeed import read_deepspeed

OPTIMS = {
    "adamw_torch": "adamw", "adamw_torch_fused": "adamw", "adamw_hf": "adamw", "adamw_apex_fused": "adamw",
    "adamw": "adamw", "adam": "adam", "adafactor": "adafactor", "sgd": "sgd", "adagrad": "adagrad",
    "rmsprop": "rmsprop", "lion_32bit": "lion", "adamw_bnb_8bit": "adam-8bit", "adamw_8bit": "adam-8bit",
    "adam8bit": "adam-8bit", "adamw_torch_8bit": "adam-8bit", "paged_adamw_8bit": "paged-adamw-8bit",
    "paged_adamw_32bit": "paged-adamw", "paged_adamw": "paged-adamw",
}  # fmt: skip
"""``optim`` (transformers' ``OptimizerNames``, axolotl's ``optimizer``) → lmcalc's optimizer presets."""
COMMON = {
    "per_device_train_batch_size": "micro_batch",
    "micro_batch_size": "micro_batch",  # axolotl
    "gradient_accumulation_steps": "grad_accum",
    "max_seq_length": "seq",  # TRL's SFTConfig before 0.20
    "max_length": "seq",  # TRL's SFTConfig
    "sequence_len": "seq",  # axolotl
    "cutoff_len": "seq",  # LLaMA-Factory
    "lora_r": "lora_rank",  # axolotl, the alignment handbook
    "lora_rank": "lora_rank",  # LLaMA-Factory
    "lora_dropout": "lora_dropout",
    "context_parallel_size": "cp",  # axolotl's sequence parallelism (ring attention over the GPUs)
}
MODEL_KEYS = ("base_model", "model_name_or_path")
TARGET_KEYS = ("lora_target_modules", "lora_target", "lora_target_linear")
UNMODELLED = {
    "load_in_8bit": "an 8-bit base (lmcalc's quantised base is QLoRA's NF4)",
    "sample_packing": "packed sequences: the same tokens per micro-batch, their attention masked per document",
    "fsdp_config": "FSDP's own settings (lmcalc reads the sharding and the parameter offload)",
    "torch_compile": "torch.compile's fusions",
    "neftune_noise_alpha": "NEFTune's noise",
    "tiled_mlp": "the MLP computed in tiles along the sequence (ALST)",
    "activation_offloading": "activations offloaded to the CPU",
    "lora_modules_to_save": "modules trained in full beside the adapters (their weights, gradients and states)",
    "lora_target_parameters": "adapters on parameters PEFT targets by name (an MoE's 3-D expert tensors): lmcalc "
    "adapts the experts only as PEFT's module targets reach them for the model's type",
    "stage": "a training stage other than SFT or pre-training (DPO, PPO and KTO keep a reference model)",
}
LIGER_KEYS = ("use_liger_kernel", "enable_liger_kernel", "liger_rope", "liger_rms_norm", "liger_glu_activation",
              "liger_fused_linear_cross_entropy")  # fmt: skip


def read_finetune(data: dict[str, Any], source: str, kind: str, directory: Path | None) -> Launch:
    """The settings of a Trainer, axolotl or LLaMA-Factory config (``kind``); ``directory`` is where a DeepSpeed
    config it names is looked for (None: not read, said so)."""
    reading = Reading(kind, source)
    reading.take("framework", "transformers", f"({_FRAMEWORKS[kind]})")
    used: set[str] = set()
    for key, keyword in COMMON.items():
        if key in data and data[key] is not None:
            used.add(key)
            value = data[key] if keyword == "lora_dropout" else whole(data[key], key, source)
            reading.take(keyword, float(value) if keyword == "lora_dropout" else value, key)
    _read_model(data, reading, used)
    _read_method(data, reading, used, kind)
    _read_precision(data, reading, used)
    _read_memory_savers(data, reading, used)
    _read_sharding(data, reading, used, directory)
    for key in data:
        if key in UNMODELLED and data[key] not in (None, False, "sft", "pt"):
            reading.cannot(key, data[key], UNMODELLED[key])
        elif key not in used and key not in UNMODELLED:
            reading.leave(key)
    return reading.launch()


_FRAMEWORKS = {"trainer": "Hugging Face Trainer", "axolotl": "axolotl runs the Trainer",
               "llamafactory": "LLaMA-Factory runs the Trainer"}  # fmt: skip


def _read_model(data: dict[str, Any], reading: Reading, used: set[str]) -> None:
    for key in MODEL_KEYS:
        if isinstance(data.get(key), str):
            used.add(key)
            from lmcalc.preset_names import builtin_model_named

            name = data[key]
            preset = builtin_model_named(name.rstrip("/").rsplit("/", 1)[-1])
            reading.model = Taken("model", preset or name, key)  # a Hub id where no preset is that model
            return


def _read_method(data: dict[str, Any], reading: Reading, used: set[str], kind: str) -> None:
    """Full, LoRA, QLoRA or freeze, and the adapters' targets."""
    adapter = data.get("adapter") or data.get("finetuning_type")
    four_bit = data.get("load_in_4bit") is True or str(data.get("quantization_bit")) == "4"
    used |= {"adapter", "finetuning_type", "load_in_4bit", "quantization_bit", "use_peft", "bnb_4bit_quant_type",
             "quantization_method", "lora_alpha"}  # fmt: skip
    if adapter in ("lora", "qlora") or data.get("use_peft") is True:
        method = "qlora" if adapter == "qlora" or four_bit else "lora"
        reading.take("method", method, "adapter" if "adapter" in data else "finetuning_type")
    elif adapter == "freeze":
        reading.take("method", "freeze", "finetuning_type")
        if "freeze_trainable_layers" in data:
            used.add("freeze_trainable_layers")
            reading.cannot(
                "freeze_trainable_layers",
                data["freeze_trainable_layers"],
                "the layers trained from the top; give --freeze-layers (the bottom layers kept frozen)",
            )
    elif adapter not in (None, "full"):
        reading.cannot("adapter", adapter, "lmcalc's methods are full, lora, qlora and freeze")
    for key in TARGET_KEYS:
        if key in data and data[key] is not None:
            used.add(key)
            value = data[key]
            if key == "lora_target_linear":
                if value is True:
                    reading.take("lora_targets", "all-linear", key)
            elif value == "all" or value == "all-linear":
                reading.take("lora_targets", "all-linear", key)
            else:
                listed = value if isinstance(value, list) else str(value).split(",")
                reading.take("lora_targets", ",".join(str(v).strip() for v in listed), key)


def _read_precision(data: dict[str, Any], reading: Reading, used: set[str]) -> None:
    used |= {"bf16", "fp16", "tf32"}
    if data.get("bf16") in (True, "auto", "true"):
        reading.take("precision", "bf16-mixed", "bf16")
    elif data.get("fp16") in (True, "true"):
        reading.take("precision", "fp16-mixed", "fp16")
    optim = data.get("optim") or data.get("optimizer")
    if isinstance(optim, str):
        used |= {"optim", "optimizer"}
        if optim in OPTIMS:
            reading.take("optimizer", OPTIMS[optim], "optim" if "optim" in data else "optimizer")
        else:
            reading.cannot("optim", optim, "not one of lmcalc's optimizers (lmcalc presets list optimizers)")


def _read_memory_savers(data: dict[str, Any], reading: Reading, used: set[str]) -> None:
    """Gradient checkpointing, the attention kernel, Liger's kernels."""
    used |= {"gradient_checkpointing", "flash_attention", "flash_attn", "sdp_attention", "xformers_attention",
             "attn_implementation", *LIGER_KEYS, "plugins", "gradient_checkpointing_kwargs"}  # fmt: skip
    if data.get("gradient_checkpointing") in (True, "true", "unsloth"):
        reading.take("recompute", "full", "gradient_checkpointing")
    elif reading.kind == "llamafactory" and data.get("disable_gradient_checkpointing") is not True:
        # LLaMA-Factory checkpoints every layer unless told not to (hparams/model_args.py:
        # disable_gradient_checkpointing is False by default; model/model_utils/checkpointing.py)
        reading.take("recompute", "full", "disable_gradient_checkpointing")
    used.add("disable_gradient_checkpointing")
    if data.get("attn_implementation") == "eager" or data.get("flash_attn") == "disabled":
        reading.take("attention", "eager", "attn_implementation" if "attn_implementation" in data else "flash_attn")
    plugins = data.get("plugins") or []
    if any(data.get(key) is True for key in LIGER_KEYS) or any("liger" in str(p).lower() for p in plugins):
        reading.take("framework", "liger", next((k for k in LIGER_KEYS if data.get(k) is True), "plugins"))


def _read_sharding(data: dict[str, Any], reading: Reading, used: set[str], directory: Path | None) -> None:
    """FSDP's sharding (``fsdp``: full_shard is ZeRO-3, shard_grad_op ZeRO-2, with offload) or a DeepSpeed config."""
    used |= {"fsdp", "deepspeed"}
    fsdp = data.get("fsdp")
    if fsdp:
        words = " ".join(fsdp) if isinstance(fsdp, list) else str(fsdp)
        if "full_shard" in words or "hybrid_shard" in words:
            reading.take("zero", 3, "fsdp")
        elif "shard_grad_op" in words:
            reading.take("zero", 2, "fsdp")
        fsdp_config = data.get("fsdp_config")
        offload = fsdp_config.get("fsdp_offload_params") if isinstance(fsdp_config, dict) else None
        if "offload" in words or offload is True:
            reading.take("offload", "optimizer+params", "fsdp" if "offload" in words else "fsdp_config")
    named = data.get("deepspeed")
    if isinstance(named, dict):
        read_deepspeed(named, reading.source, reading)
        reading.taken["framework"] = Taken("framework", "deepspeed", "deepspeed")
    elif isinstance(named, str):
        candidates = [directory / named, Path(named)] if directory is not None else []
        path = next((p for p in candidates if p.is_file()), None)
        if path is None:
            where = "read only from a file" if directory is None else f"no such file beside {reading.source}"
            reading.cannot("deepspeed", named, f"{where}; run from the folder it is named from, or give --zero")
            return
        try:
            ds = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise LmcalcError(f"{path}: not a DeepSpeed JSON ({exc})") from None
        read_deepspeed(ds if isinstance(ds, dict) else {}, str(path), reading)
        reading.taken["framework"] = Taken("framework", "deepspeed", "deepspeed")
