"""The parallel layout as a user gives it, or pins and bounds for a search (``estimates.settings`` holds the other
groups; the same declaration makes the Python API's keywords and the command line's options): how the layers split
over the pipeline stages (``SplitSettings``), a whole layout (``LayoutSettings``), what a layout search may be told
instead of searching it (``PinSettings``), and how far it searches and how it times what it finds
(``SearchSettings``)."""

from typing import Annotated, TypedDict

from lmcalc.engine.choices import RECOMPUTE_MODES, SCHEDULES, ZERO_STAGES, ZeroStage
from lmcalc.estimates.setting_groups import Setting, alternatives

_STAGE_LAYERS_TAIL = (
    "the other stages share the rest. Interleaved: every stage's layers must split evenly over its chunks. "
    "Default: an even split."
)
_COUNTED_TAIL = "Works with the interleaved schedule."
_SPLIT_HELP = {
    "first": "Layers on the first pipeline stage, which also holds the embedding (Megatron-LM's "
    f"--decoder-first-pipeline-num-layers); {_STAGE_LAYERS_TAIL}",
    "last": "Layers on the last pipeline stage, which also computes the logits (Megatron-LM's "
    f"--decoder-last-pipeline-num-layers); {_STAGE_LAYERS_TAIL}",
    "embedding": "Count the input embedding as one layer when the layers are split over the pipeline stages "
    f"(Megatron-LM's flag): the first stage builds one layer fewer. {_COUNTED_TAIL}",
    "loss": "Count the output layer and the loss as one layer when the layers are split over the pipeline "
    f"stages (Megatron-LM's flag): the last stage builds one layer fewer. {_COUNTED_TAIL}",
    "layout": "Every pipeline part's layers, as Megatron-Core's --pipeline-model-parallel-layout spells them: E the "
    "embedding, t a decoder layer, m a multi-token-prediction layer, L the loss, parts split by |, x*n and "
    "(ab|cd)*n repeated (DeepSeek-V3: 'Et*3|(tt|)*29,m|L'). PP × virtual stages parts.",
    "mtp": "Multi-token-prediction modules trained (Megatron-Core's --mtp-num-layers; DeepSeek-V3 trains 1), on the "
    "last stage or the layout's m part: each a layer like the last, a 2h→h projection and a pass through the head.",
}

_HSDP_HELP = (
    "HSDP: ZeRO shards within DP·CP / N GPUs, the N groups hold copies (torchtitan's data_parallel_replicate_degree, "
    "Megatron's --num-distributed-optimizer-instances)."
)
_HFSDP_HELP = "HFSDP: under HSDP, the optimizer sharded over all of DP·CP (Megatron-FSDP's outer 'optim'); --zero 3."


class SplitSettings(TypedDict, total=False):
    """How the layers split over the pipeline stages (Megatron-LM's flags), as the user gives it."""

    first_stage_layers: Annotated[int | None, Setting(None, _SPLIT_HELP["first"])]
    last_stage_layers: Annotated[int | None, Setting(None, _SPLIT_HELP["last"])]
    account_for_embedding_in_pipeline_split: Annotated[bool, Setting(False, _SPLIT_HELP["embedding"])]
    account_for_loss_in_pipeline_split: Annotated[bool, Setting(False, _SPLIT_HELP["loss"])]
    pipeline_layout: Annotated[str | None, Setting(None, _SPLIT_HELP["layout"])]
    mtp_layers: Annotated[int, Setting(0, _SPLIT_HELP["mtp"])]


class LayoutSettings(SplitSettings, total=False):
    """A parallel layout as the user gives it; DP, when not given, fills the GPUs the other degrees leave."""

    dp: Annotated[int | None, Setting(None, "Data-parallel degree (default: GPUs / (TP·PP·CP)).")]
    tp: Annotated[int, Setting(1, "Tensor-parallel degree (within a node).")]
    pp: Annotated[int, Setting(1, "Pipeline-parallel stages.")]
    cp: Annotated[int, Setting(1, "Context-parallel degree (splits the sequence; needs --attention flash).")]
    ep: Annotated[int, Setting(1, "Expert-parallel degree (MoE models; ETP·EP divides DP·CP·TP).")]
    etp: Annotated[
        int | None,
        Setting(
            None,
            "Expert tensor-parallel degree: splits each routed expert's matrices (Megatron-Core's "
            "--expert-tensor-parallel-size; default TP). Set apart from TP it folds EP over TP·CP·DP "
            "(MoE parallel folding).",
        ),
    ]
    zero: Annotated[
        ZeroStage,
        Setting(0, f"ZeRO stage {ZERO_STAGES[0]}-{ZERO_STAGES[-1]} over DP·CP (3 = FSDP full sharding)."),
    ]
    hsdp: Annotated[int, Setting(1, _HSDP_HELP)]
    hsdp_shard_optimizer: Annotated[bool, Setting(False, _HFSDP_HELP)]
    sequence_parallel: Annotated[
        bool, Setting(False, "Split norms, dropout and linear inputs over TP too (Korthikanti et al.).")
    ]
    grad_accum: Annotated[int, Setting(1, "Micro-batches per step (gradient accumulation).")]
    schedule: Annotated[str, Setting("1f1b", f"Pipeline schedule: {alternatives(SCHEDULES)}.")]
    virtual_stages: Annotated[int, Setting(1, "Model chunks per pipeline stage (interleaved schedule).")]


# ------------------------------------------------------------------------------------------------ a layout search


class PinSettings(TypedDict, total=False):
    """What a layout search (``plan``, ``report``) may be told instead of searching it; None searches it."""

    dp: Annotated[int | None, Setting(None, "Pin the data-parallel degree.")]
    tp: Annotated[int | None, Setting(None, "Pin the tensor-parallel degree.")]
    pp: Annotated[int | None, Setting(None, "Pin the pipeline-parallel degree.")]
    cp: Annotated[int | None, Setting(None, "Pin the context-parallel degree.")]
    ep: Annotated[int | None, Setting(None, "Pin the expert-parallel degree.")]
    etp: Annotated[
        int | None,
        Setting(None, "Pin the expert tensor-parallel degree (default: TP or 1, MoE parallel folding, are tried)."),
    ]
    zero: Annotated[ZeroStage | None, Setting(None, "Pin the ZeRO stage.")]
    hsdp: Annotated[int, Setting(1, _HSDP_HELP + " Kept by the search.")]
    hsdp_shard_optimizer: Annotated[bool, Setting(False, _HFSDP_HELP)]
    schedule: Annotated[str | None, Setting(None, f"Pin the pipeline schedule: {alternatives(SCHEDULES)}.")]
    virtual_stages: Annotated[
        int | None,
        Setting(None, "Pin the model chunks per pipeline stage (2 or more: the interleaved schedule; 1: 1F1B)."),
    ]
    sequence_parallel: Annotated[
        bool,
        Setting(
            True,
            "Sequence parallelism wherever TP > 1 (Korthikanti et al.), or nowhere.",
            flags=("--sequence-parallel/--no-sequence-parallel",),
        ),
    ]
    micro_batch: Annotated[int | None, Setting(None, "Pin the micro-batch.")]
    recompute: Annotated[str | None, Setting(None, f"Pin {alternatives(RECOMPUTE_MODES)}.")]


class SearchSettings(TypedDict, total=False):
    """How far ``plan`` searches, and how it times what it finds."""

    max_micro_batch: Annotated[
        int | None,
        Setting(
            None,
            "Largest micro-batch to try (default 16): every size up to it that divides the sequences each "
            "data-parallel replica takes per step.",
        ),
    ]
    max_pp: Annotated[int, Setting(64, "Largest pipeline degree to try.")]
    max_cp: Annotated[int, Setting(16, "Largest context-parallel degree to try.")]
    tp_across_nodes: Annotated[bool, Setting(False, "Allow TP groups larger than a node.")]
    efficiency: Annotated[
        float | None,
        Setting(
            None,
            "Time the compute as hardware FLOPs at this fraction of the dense peak, instead of kernel by kernel.",
        ),
    ]
    measured_efficiency: Annotated[
        bool,
        Setting(
            False,
            "Take that fraction from 'lmcalc bench step' results on this GPU type: the HFU of the "
            "model's own measured step, else of the largest step measured.",
        ),
    ]
    peak: Annotated[
        str,
        Setting(
            "spec",
            "The GPU figures the step is timed with: spec (the preset's measured maximum achievable matmul "
            "rate and bus bandwidths) or measured ('lmcalc bench' results on this GPU type: the matmul rate, the "
            "model's own shapes if benchmarked, and the NCCL bus bandwidth within a node if 'bench comm' ran).",
        ),
    ]
    calibration: Annotated[
        str | None,
        Setting(
            None, "Benchmark results file for --peak measured or --measured-efficiency (alone, implies the latter)."
        ),
    ]
