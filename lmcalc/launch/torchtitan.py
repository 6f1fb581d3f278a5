"""A torchtitan training config (TOML): the model by name and flavor, its parallelism (FSDP as ZeRO-3, TP with
sequence parallelism, PP, CP, EP), activation checkpointing, float8 or MX, and the batch. Sections and keys as
torchtitan's ``JobConfig`` reads them (``torchtitan/config/job_config.py``, torchtitan 0.2–0.3; the keys a
section moved to later, ``[parallelism]`` from ``[training]``, are read in either).
"""

from __future__ import annotations

from typing import Any

from lmcalc.launch.config import Launch, Reading, Taken, exact_preset, whole
from lmcalc.launch.deepspeed import dotted
from lmcalc.launch.torchtitan_pipeline import read_pipeline

MODELS = {
    ("llama3", "8B"): "llama-3.1-8b",
    ("llama3", "70B"): "llama-3.1-70b",
    ("llama3", "405B"): "llama-3.1-405b",
    ("deepseek_v3", "671B"): "deepseek-v3",
}
"""torchtitan's model flavors → lmcalc's presets (torchtitan/models/llama3/__init__.py: the Llama 3.1 shapes, with
its 128,256-token tokenizer); another flavor is looked up by name (``qwen3`` ``8B``: qwen3-8b)."""
DEGREES = {
    "tensor_parallel_degree": "tp",
    "pipeline_parallel_degree": "pp",
    "context_parallel_degree": "cp",
    "expert_parallel_degree": "ep",
    "expert_tensor_parallel_degree": "etp",
}
SECTIONS = ("parallelism", "training")
UNMODELLED = {
    "parallelism.enable_async_tensor_parallel": "async TP's overlapped collectives",
    "compile.enable": "torch.compile's fusions (fewer saved activations, other kernels)",
    "training.compile": "torch.compile's fusions (fewer saved activations, other kernels)",
    "activation_checkpoint.selective_ac_option": "which layers or ops selective checkpointing keeps",
    "float8.enable_fsdp_float8_all_gather": "FSDP's all-gather in float8",
    "quantize.linear.float8.enable_fsdp_float8_all_gather": "FSDP's all-gather in float8",
    "training.mixed_precision_reduce": "the gradient reduce's dtype",
}


def arguments_of(text: str) -> dict[str, Any] | None:
    """torchtitan 0.3's command-line overrides (``--parallelism.tensor_parallel_degree 8``) as the TOML's sections
    would hold them; None where the text has none."""
    from lmcalc.launch.megatron import words_of

    words = words_of(text, "")
    found: dict[str, Any] = {}
    for i, word in enumerate(words):
        if word.startswith("--") and "." in word[2:]:
            section, _, key = word[2:].partition(".")
            value = words[i + 1] if i + 1 < len(words) and not words[i + 1].startswith("--") else "true"
            found.setdefault(section, {})[key] = _value(value)
    return found or None


def _value(text: str) -> Any:
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return text


def read_torchtitan(data: dict[str, Any], source: str) -> Launch:
    """The settings of a torchtitan TOML (or of its command-line overrides, ``arguments_of``)."""
    reading = Reading("torchtitan", source)
    reading.take("framework", "torchtitan", "(a torchtitan config)")
    keys = dotted(data)
    used: set[str] = set()

    def value(name: str) -> tuple[str, Any] | None:
        for section in SECTIONS:
            key = f"{section}.{name}"
            if key in keys:
                used.add(key)
                return key, keys[key]
        return None

    _read_model(keys, reading, used)
    for name, keyword in DEGREES.items():
        found = value(name)
        if found is not None and whole(found[1], found[0], source) > 0:
            reading.take(keyword, whole(found[1], found[0], source), found[0])
    read_pipeline(value, reading)
    sequence_parallel = value("enable_sequence_parallel")  # torchtitan 0.3; before, TP always shards the norms too
    if "tp" in reading.taken and reading.taken["tp"].value > 1:
        on = sequence_parallel is None or sequence_parallel[1] in (True, "true")
        reading.take("sequence_parallel", on, sequence_parallel[0] if sequence_parallel else reading.taken["tp"].key)
    # torchtitan's defaults where the file is silent (job_config.py): FSDP over every GPU left (-1), selective AC
    shard = value("data_parallel_shard_degree") or ("parallelism.data_parallel_shard_degree (default)", -1)
    replicate = value("data_parallel_replicate_degree")
    if whole(shard[1], shard[0], source) != 1:  # -1: every GPU the other degrees leave
        reading.take("zero", 3, shard[0])
        _read_resharding(value("fsdp_reshard_after_forward"), reading)
        if replicate is not None and whole(replicate[1], replicate[0], source) > 1:  # HSDP: FSDP in each group
            reading.take("hsdp", whole(replicate[1], replicate[0], source), replicate[0])
    _read_batch(value, reading)
    _read_precision(keys, reading, used)
    optimizer = keys.get("optimizer.name")
    if isinstance(optimizer, str) and optimizer.lower() in ("adamw", "adam"):
        used.add("optimizer.name")
        reading.take("optimizer", optimizer.lower(), "optimizer.name")
    mode = keys.get("activation_checkpoint.mode", "selective")
    used.add("activation_checkpoint.mode")
    key = "activation_checkpoint.mode" + ("" if "activation_checkpoint.mode" in keys else " (default)")
    if str(mode) in ("none", "selective", "full"):
        reading.take("recompute", str(mode), key)
    else:
        reading.cannot(key, mode, "a memory budget for checkpointing (lmcalc's are none, selective and full)")
    for key, given in keys.items():
        if key in UNMODELLED:
            reading.cannot(key, given, UNMODELLED[key])
        elif key not in used:
            reading.leave(key)
    return reading.launch()


RESHARD_POLICIES = ("default", "always", "never")
"""``parallelism.fsdp_reshard_after_forward``: whether FSDP frees a layer's gathered weights after its forward
(torchtitan/distributed/fsdp.py get_fsdp_reshard_after_forward_policy; "default": always, but never under PP)."""


def _read_resharding(found: tuple[str, Any] | None, reading: Reading) -> None:
    """FSDP without resharding after forward keeps each layer's gathered weights to its backward: lmcalc's ZeRO-2
    under torchtitan's profile (``engine.parallel.sharding.gathered_to_backward``)."""
    key, policy = found or ("parallelism.fsdp_reshard_after_forward (default)", "default")
    if str(policy) not in RESHARD_POLICIES:
        reading.cannot(key, policy, f"torchtitan's policies are {', '.join(RESHARD_POLICIES)}")
        return
    pipelined = "pp" in reading.taken and reading.taken["pp"].value > 1
    if policy == "never" or (policy == "default" and pipelined):
        reading.take("zero", 2, key + (", under PP" if policy == "default" else ""))


def _read_model(keys: dict[str, Any], reading: Reading, used: set[str]) -> None:
    name, flavor = keys.get("model.name"), keys.get("model.flavor")
    if name is None:
        return
    used |= {"model.name", "model.flavor"}
    preset = MODELS.get((str(name), str(flavor))) or exact_preset(f"{name}-{flavor}")
    if preset is None:
        reading.cannot(
            "model.name, model.flavor", f"{name} {flavor}", "no built-in preset of that flavor; give --model"
        )
        return
    reading.model = Taken("model", preset, "model.name, model.flavor")


def _read_batch(value: Any, reading: Reading) -> None:
    source = reading.source
    seq = value("seq_len")
    if seq is not None:
        reading.take("seq", whole(seq[1], seq[0], source), seq[0])
    local = value("local_batch_size") or value("batch_size")
    micro = value("pipeline_parallel_microbatch_size") or ("parallelism.pipeline_parallel_microbatch_size (default)", 1)
    if "pp" in reading.taken and reading.taken["pp"].value > 1:
        reading.take("micro_batch", whole(micro[1], micro[0], source), micro[0])
        if local is not None:
            per_step = whole(local[1], local[0], source) // whole(micro[1], micro[0], source)
            reading.take("grad_accum", max(1, per_step), local[0])
    elif local is not None:
        reading.take("micro_batch", whole(local[1], local[0], source), local[0])
    total = value("global_batch_size")
    if total is not None and whole(total[1], total[0], source) > 0:
        reading.global_batch_sequences = whole(total[1], total[0], source)
        if seq is not None:
            reading.take("global_batch", reading.global_batch_sequences * reading.taken["seq"].value, total[0])
    steps = value("steps")
    if steps is not None and (seq is None or reading.global_batch_sequences is None):
        reading.cannot(steps[0], steps[1], "steps of a global batch the file leaves to DP (global_batch_size -1): "
                       "give --tokens")  # fmt: skip
    elif steps is not None and seq is not None and reading.global_batch_sequences is not None:
        tokens = whole(steps[1], steps[0], source) * reading.global_batch_sequences * reading.taken["seq"].value
        reading.take("tokens", tokens, steps[0])


def _read_precision(keys: dict[str, Any], reading: Reading, used: set[str]) -> None:
    """bf16 FSDP mixed precision, or float8 (tensorwise unless a rowwise recipe is named) or MX over it."""
    param = keys.get("training.mixed_precision_param") or keys.get("parallelism.mixed_precision_param")
    if param is not None:
        used |= {"training.mixed_precision_param", "parallelism.mixed_precision_param"}
        reading.take("precision", {"bfloat16": "bf16-mixed", "float32": "fp32"}.get(str(param), "bf16-mixed"),
                     "mixed_precision_param")  # fmt: skip
    converters = keys.get("model.converters", [])
    if isinstance(converters, list):
        used.add("model.converters")
        if "float8" in converters or "quantize.linear.float8" in converters:
            recipe = keys.get("float8.recipe_name") or keys.get("quantize.linear.float8.recipe_name")
            if recipe in (None, "tensorwise"):
                reading.take("precision", "fp8-current", "model.converters")
            else:
                reading.cannot("float8.recipe_name", recipe, "lmcalc's torchao float8 is tensorwise")
        if "mx" in converters or "quantize.linear.mx" in converters:
            reading.take("precision", "mxfp8", "model.converters")
