"""Megatron-LM's command-line arguments, as a launch script passes them to ``pretrain_gpt.py``: the parallel layout,
recomputation, batch, precision and the model's shape, read from the script's ``--flag value`` words.

A script is read as the shell would hand the words over, as far as that can be done without running it: lines
joined at a trailing backslash, comments dropped, ``NAME=value`` assignments substituted where a word names them
(``${TP:-8}`` takes its default when the script does not set ``TP``), and a word the script leaves to the
environment said so (``--tensor-model-parallel-size $TP``: not read). Flags and their defaults follow
``megatron/training/arguments.py`` (Megatron-LM core_v0.16.1).
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from lmcalc.errors import LmcalcError
from lmcalc.launch.config import Launch, Reading, whole

WHOLE = {
    "--tensor-model-parallel-size": "tp",
    "--pipeline-model-parallel-size": "pp",
    "--context-parallel-size": "cp",
    "--expert-model-parallel-size": "ep",
    "--expert-tensor-parallel-size": "etp",
    "--micro-batch-size": "micro_batch",
    "--virtual-pipeline-model-parallel-size": "virtual_stages",
    "--recompute-num-layers": "recompute_num_layers",
    "--decoder-first-pipeline-num-layers": "first_stage_layers",
    "--decoder-last-pipeline-num-layers": "last_stage_layers",
    "--seq-length": "seq",
    "--mtp-num-layers": "mtp_layers",
    "--num-distributed-optimizer-instances": "hsdp",
    "--min-offloaded-tensor-size": "min_offloaded_tensor_size",
}
"""The flags that give one of lmcalc's whole-number settings, each by the same name in the API."""
SWITCHES = {
    "--sequence-parallel": ("sequence_parallel", True),
    "--use-distributed-optimizer": ("zero", 1),  # the optimizer state and master weights sharded over DP: ZeRO-1
    "--grad-reduce-in-bf16": ("grad_reduce_in_bf16", True),
    "--fp8-param-gather": ("fp8_param_gather", True),
    "--account-for-embedding-in-pipeline-split": ("account_for_embedding_in_pipeline_split", True),
    "--account-for-loss-in-pipeline-split": ("account_for_loss_in_pipeline_split", True),
    "--moe-pad-expert-input-to-capacity": ("pad_to_capacity", True),
    "--moe-enable-deepep": ("moe_dispatcher", "deepep"),  # deprecated: the flex dispatcher's deepep backend
}
DISPATCHERS = {"alltoall": "alltoall", "deepep": "deepep", "hybridep": "hybridep"}
"""``--moe-token-dispatcher-type`` alltoall, or flex with its ``--moe-flex-dispatcher-backend`` (deepep by default),
as lmcalc's ``moe_dispatcher``; allgather (Megatron-Core's default) and the ncclep backend are not timed."""
SHARDING = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}
"""Megatron-FSDP's ``--data-parallel-sharding-strategy`` as a ZeRO stage: what it shards over data parallelism."""
FP8_RECIPES = {"delayed": "fp8-mixed", "tensorwise": "fp8-current", "blockwise": "fp8-blockwise", "mxfp8": "mxfp8"}
"""``--fp8-recipe`` (Transformer Engine's scaling recipe; delayed by default) → lmcalc's precision recipe."""
OPTIMIZERS = {"adam": "adamw", "sgd": "sgd-momentum", "muon": "muon", "dist_muon": "muon"}
"""``--optimizer``: Megatron's adam is Adam with decoupled weight decay (apex/TE FusedAdam, adam_w_mode), its
sgd keeps a momentum buffer (``--sgd-momentum`` 0.9), and its muon (dist_muon, deprecated: muon with the layer-wise
distributed optimizer) gives the embedding, the head and the vectors to Adam (lmcalc's muon)."""
SHAPE = ("--num-layers", "--hidden-size", "--ffn-hidden-size", "--num-attention-heads", "--num-query-groups",
         "--group-query-attention", "--kv-channels", "--max-position-embeddings", "--swiglu",
         "--untie-embeddings-and-output-weights", "--normalization", "--position-embedding-type", "--vocab-size",
         "--tokenizer-model", "--tokenizer-type", "--make-vocab-size-divisible-by", "--disable-bias-linear",
         "--add-qkv-bias", "--num-experts", "--moe-router-topk", "--moe-ffn-hidden-size", "--norm-epsilon")  # fmt: skip
"""The flags that give the model's shape (read together into a model)."""
UNMODELLED = {
    "--overlap-grad-reduce": "the reduce-scatter overlapped with the backward: time, not modelled per bucket",
    "--overlap-param-gather": "the all-gather overlapped with the forward: time, not modelled per bucket",
    "--tp-comm-overlap": "TP communication overlapped with GEMMs (userbuffers): their buffers and time",
    "--cuda-graph-impl": "CUDA graphs: their static buffers",
    "--enable-cuda-graph": "CUDA graphs: their static buffers",
    "--cpu-offloading": "activation offload to the CPU",
    "--step-batch-size-schedule": "a batch-size ramp (lmcalc takes the global batch it ends at)",
    "--rampup-batch-size": "a batch-size ramp (lmcalc takes the global batch it ends at)",
    "--multi-latent-attention": "MLA's shape from Megatron's flags (give --model)",
    "--moe-shared-expert-intermediate-size": "a shared expert's shape from Megatron's flags (give --model)",
    "--moe-layer-freq": "dense and MoE layers interleaved, from Megatron's flags (give --model)",
    "--num-layers-per-virtual-pipeline-stage": "chunks by layers per chunk (give --virtual-stages)",
    "--fp8-amax-history-len": "delayed scaling's amax history",
    "--manual-gc": "when Python's collector runs",
}
"""Flags that bear on memory or time which lmcalc does not read, and what each asks."""
_ASSIGNMENT = re.compile(r"^(?:export\s+)?([A-Za-z_]\w*)=(.*)$")
_VARIABLE = re.compile(r"\$\{([A-Za-z_]\w*)(?::?-([^}]*))?\}|\$([A-Za-z_]\w*)")
_FLAG = re.compile(r"^--[a-z0-9][a-z0-9-]*$")
MAX_WORDS = 100_000


def read_megatron(text: str, source: str) -> Launch:
    """The settings of a Megatron-LM launch script or argument list."""
    reading = Reading("megatron", source)
    reading.take("framework", "megatron", "pretrain_gpt.py")
    words = words_of(text, source)
    flags = flags_of(words)
    precision = _read_precision(flags, reading)
    for name, value in flags.items():
        if name in WHOLE:
            if _unresolved(value, name, reading):
                continue
            reading.take(WHOLE[name], whole(value, name, source), name)
        elif name in SWITCHES:
            keyword, given = SWITCHES[name]
            if keyword != "zero" or "zero" not in reading.taken:  # Megatron-FSDP's strategy says more
                reading.take(keyword, given, name)
        elif name == "--recompute-granularity":
            reading.take("recompute", _one_of(value, ("full", "selective"), name, source), name)
        elif name == "--recompute-method":
            reading.take("recompute_method", _one_of(value, ("uniform", "block"), name, source), name)
        elif name == "--recompute-modules":
            reading.take("recompute_modules", ",".join(str(value).split()), name)
        elif name in ("--offload-modules", "--fine-grained-activation-offloading"):  # read together
            if "--offload-modules" not in flags or "--fine-grained-activation-offloading" not in flags:
                reading.leave(name)
            elif name == "--offload-modules":
                reading.take("offload_modules", ",".join(str(value).split()), name)
        elif name == "--moe-expert-capacity-factor":
            reading.take("capacity_factor", float(value), name)
        elif name == "--data-parallel-sharding-strategy":  # Megatron-FSDP (--use-megatron-fsdp)
            if str(value) not in SHARDING:
                reading.cannot(name, value, f"Megatron-FSDP's strategies are {', '.join(SHARDING)}")
            elif "--use-megatron-fsdp" in flags:
                reading.take("zero", SHARDING[str(value)], name)
        elif name == "--outer-dp-sharding-strategy":  # Megatron-FSDP's HSDP: the optimizer across the instances too
            if str(value) not in ("no_shard", "optim"):
                reading.cannot(name, value, "Megatron-FSDP's outer strategies are no_shard and optim")
            else:
                reading.take("hsdp_shard_optimizer", str(value) == "optim", name)
        elif name == "--pipeline-model-parallel-layout":
            if not _unresolved(value, name, reading):
                reading.take("pipeline_layout", str(value), name)
        elif name == "--optimizer":
            reading.take("optimizer", OPTIMIZERS.get(str(value), str(value)), name)
        elif name == "--moe-token-dispatcher-type":
            kind = "flex" if str(value) == "flex" else str(value)
            backend = str(flags.get("--moe-flex-dispatcher-backend", "deepep")) if kind == "flex" else kind
            if backend in DISPATCHERS:
                reading.take("moe_dispatcher", DISPATCHERS[backend], name)
            else:
                reading.cannot(
                    name,
                    value if kind != "flex" else f"flex ({backend})",
                    "lmcalc times the alltoall dispatcher and the flex one's deepep and hybridep backends",
                )
        elif name == "--moe-flex-dispatcher-backend":  # read with --moe-token-dispatcher-type flex
            if flags.get("--moe-token-dispatcher-type") != "flex":
                reading.leave(name)
        elif name == "--cross-entropy-fusion-impl":  # with --cross-entropy-loss-fusion; native keeps the fp32 copy
            if str(value) == "te" and "--cross-entropy-loss-fusion" in flags:
                reading.take("te_cross_entropy", True, name)
            else:
                reading.leave(name)
        elif name in UNMODELLED:
            reading.cannot(name, value, UNMODELLED[name])
        elif name not in SHAPE and name not in precision and name not in _BATCH:
            reading.leave(name)
    if "pipeline_layout" in reading.taken and "virtual_stages" not in reading.taken:  # the layout's parts say v
        _layout_chunks(reading)
    if "virtual_stages" in reading.taken and reading.taken["virtual_stages"].value > 1:  # chunks: the interleaved 1F1B
        key = reading.taken["virtual_stages"].key
        reading.take("schedule", "interleaved", key)
    _read_batch(flags, reading)
    _read_gpus(words, reading)
    from lmcalc.launch.megatron_model import model_of_flags

    model_of_flags(flags, reading)
    return reading.launch()


def _layout_chunks(reading: Reading) -> None:
    """The virtual stages a pipeline layout's parts make over PP (Megatron-Core derives them from the layout)."""
    from lmcalc.engine.parallel.pipeline_layout import layout_parts

    pp = reading.taken["pp"].value if "pp" in reading.taken else 1
    parts = len(layout_parts(reading.taken["pipeline_layout"].value))
    if pp > 0 and parts % pp == 0 and parts > pp:
        reading.take("virtual_stages", parts // pp, "--pipeline-model-parallel-layout")


_BATCH = ("--global-batch-size", "--train-iters", "--train-samples")


def words_of(text: str, source: str) -> list[str]:
    """The words the script hands over, its variables substituted where it sets them (``${NAME:-default}``); a
    quoted word of several (an array's ``"--fp8-format hybrid"``) is split again."""
    joined = re.sub(r"\\\r?\n", " ", text)
    values: dict[str, str] = {}
    kept: list[str] = []
    for line in joined.splitlines():
        stripped = line.strip()
        match = _ASSIGNMENT.match(stripped)
        if match and not stripped.endswith("("):
            values.setdefault(match.group(1), _substituted(_unquoted(match.group(2)), values))
            continue
        kept.append(_substituted(line, values))
    try:
        split = shlex.split("\n".join(kept), comments=True, posix=True)
    except ValueError:  # a quote the shell would close in a way this does not follow: line by line, those left out
        split = [word for line in kept for word in _split_line(line)]
    words = [part for word in split for part in (word.split() if word.startswith("--") else [word])]
    if len(words) > MAX_WORDS:
        raise LmcalcError(f"{source}: more than {MAX_WORDS:,} words; a launch script is far shorter")
    return words


def _split_line(line: str) -> list[str]:
    try:
        return shlex.split(line, comments=True, posix=True)
    except ValueError:
        return []


def _unquoted(text: str) -> str:
    try:
        parts = shlex.split(text, comments=True)
    except ValueError:
        return text
    return parts[0] if len(parts) == 1 else text


def _substituted(text: str, values: dict[str, str]) -> str:
    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(3)
        if name in values:
            return values[name]
        return match.group(2) if match.group(2) is not None else match.group(0)

    return _VARIABLE.sub(value, text)


def flags_of(words: list[str]) -> dict[str, Any]:
    """Each ``--flag`` and its value (``True`` where none follows), the last of a flag given twice."""
    flags: dict[str, Any] = {}
    for i, word in enumerate(words):
        if not _FLAG.match(word):
            continue
        following = words[i + 1] if i + 1 < len(words) else None
        is_value = following is not None and not following.startswith("--") and following not in (")", "\\")
        flags[word] = following if is_value else True
        if is_value and word in ("--recompute-modules", "--offload-modules"):  # a list: every word up to a flag
            values = [w for w in _until_flag(words[i + 1 :])]
            flags[word] = " ".join(values)
    return flags


def _until_flag(words: list[str]) -> list[str]:
    found = []
    for word in words:
        if word.startswith("--") or word == ")":
            break
        found.append(word)
    return found


def _unresolved(value: Any, name: str, reading: Reading) -> bool:
    """Whether the script leaves ``value`` to its environment (``$TP``); said so if it does."""
    if isinstance(value, str) and "$" in value:
        reading.cannot(name, value, "set by the environment the script runs in; give the flag beside --from")
        return True
    return False


def _one_of(value: Any, options: tuple[str, ...], name: str, source: str) -> str:
    if str(value) not in options:
        raise LmcalcError(f"{source}: {name} is {str(value)[:40]!r}; Megatron takes {' | '.join(options)}")
    return str(value)


def _read_precision(flags: dict[str, Any], reading: Reading) -> tuple[str, ...]:
    """The precision recipe: fp8 (by its scaling recipe) over bf16 or fp16, else bf16, fp16 or fp32."""
    read = ("--bf16", "--fp16", "--fp8-format", "--fp8-recipe", "--fp8")
    if "--fp8-format" in flags or "--fp8" in flags:
        recipe = str(flags.get("--fp8-recipe", "delayed"))
        if recipe not in FP8_RECIPES:
            reading.cannot("--fp8-recipe", recipe, f"lmcalc's fp8 recipes are {', '.join(FP8_RECIPES)}")
        else:
            reading.take("precision", FP8_RECIPES[recipe], "--fp8-format")
    elif "--bf16" in flags:
        reading.take("precision", "bf16-mixed", "--bf16")
    elif "--fp16" in flags:
        reading.take("precision", "fp16-mixed", "--fp16")
    else:
        reading.take("precision", "fp32", "(neither --bf16 nor --fp16)")
    return read


def _read_batch(flags: dict[str, Any], reading: Reading) -> None:
    """The global batch in tokens (``--global-batch-size`` sequences of ``--seq-length``) and the run's tokens
    (``--train-iters`` steps of it, or ``--train-samples`` sequences)."""
    source = reading.source
    seq = reading.taken.get("seq")
    if "--global-batch-size" in flags and not _unresolved(flags["--global-batch-size"], "--global-batch-size", reading):
        sequences = whole(flags["--global-batch-size"], "--global-batch-size", source)
        reading.global_batch_sequences = sequences
        if seq is not None:
            reading.take("global_batch", sequences * seq.value, "--global-batch-size")
    if seq is None:
        return
    if "--train-samples" in flags and not _unresolved(flags["--train-samples"], "--train-samples", reading):
        reading.take(
            "tokens", whole(flags["--train-samples"], "--train-samples", source) * seq.value, "--train-samples"
        )
    elif (
        "--train-iters" in flags
        and reading.global_batch_sequences is not None
        and not _unresolved(flags["--train-iters"], "--train-iters", reading)
    ):
        steps = whole(flags["--train-iters"], "--train-iters", source)
        reading.take("tokens", steps * reading.global_batch_sequences * seq.value, "--train-iters")


def _read_gpus(words: list[str], reading: Reading) -> None:
    """How many GPUs the script launches on, where it says (``GPUS_PER_NODE=8`` and ``NUM_NODES=4``, or torchrun's
    ``--nproc_per_node`` and ``--nnodes``, as numbers)."""
    per_node = _number_after(words, ("--nproc_per_node", "--nproc-per-node"))
    nodes = _number_after(words, ("--nnodes",))
    if per_node is not None:
        reading.gpu_count = per_node * (nodes or 1)


def _number_after(words: list[str], names: tuple[str, ...]) -> int | None:
    for i, word in enumerate(words[:-1]):
        name, _, inline = word.partition("=")
        if name in names:
            text = inline or words[i + 1]
            return int(text) if text.isdigit() else None
    return None
