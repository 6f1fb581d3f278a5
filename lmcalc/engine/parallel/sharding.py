"""Which share of the model one GPU holds: tensor parallelism's split of each weight, the layers of its
pipeline stage, expert parallelism's share of the experts, and ZeRO's sharding of the model states.

Sharding is data. Each weight tensor says which dimension tensor parallelism splits (Megatron-LM,
Shoeybi et al. 2019: column-parallel Q/K/V, FC1/gate/up and the vocabulary of the embedding and the
head; row-parallel attention output and FC2/down; norms, routers and MLA's low-rank down-projections
replicated), which layers hold it (pipeline stages split the layers; the embedding lives on the first
stage, the final norm and head on the last), and whether expert parallelism splits its copies. ZeRO
then shards the resulting per-GPU states over the data-parallel replicas (Rajbhandari et al. 2020 §5.1):
DP × CP for dense tensors, the experts' EDP = DP × CP × TP / (ETP × EP) for the routed experts, whose matrices
expert TP (ETP, TP unless set apart: Megatron-Core's MoE parallel folding) splits.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

from lmcalc.engine.choices import ZeroStage
from lmcalc.engine.finetune.method import (
    NF4_TENSOR_CONSTANTS,
    Method,
    frozen_bytes_per_element,
    frozen_share,
    quantised,
    trained_tensors,
)
from lmcalc.engine.model.flops import ModelPart
from lmcalc.engine.model.params import (
    AVERAGED_SYMBOLS,
    WeightTensor,
    copies_per_layer,
    mtp_collapse_params,
    weight_tensors,
)
from lmcalc.engine.model.prefix import image_encoder_params
from lmcalc.engine.model.width_params import CROSS_SYMBOL, idle
from lmcalc.engine.parallel.pipeline import StageLayers, stage_layers
from lmcalc.engine.workload import Workload, canonical
from lmcalc.recipe_specs import PrecisionRecipe
from lmcalc.specs import ModelSpec

if TYPE_CHECKING:
    from lmcalc.engine.parallel.layout import Layout, ModelSplit, StateShards

# Megatron-LM's tensor-parallel split, by module name: column-parallel modules split their output
# dimension (weight and bias), row-parallel ones their input dimension (weight only).
COLUMN_PARALLEL = {"q", "k", "v", "q_b", "kv_b", "fc", "gate", "up", "embed", "lm_head", "attn_gate", "gate_up"}
ROW_PARALLEL = {"o", "proj", "down"}
SHARED_SYMBOLS = ("B", "G")
"""The count symbols of Zamba's shared blocks (``engine.model.shared_block``): the blocks' weights, held B times (G
where each use has its own), and what each of the G uses holds of its own."""

ModelState = Literal["params", "grads", "master", "optimizer"]
ZERO_SHARDS_FROM: dict[ModelState, ZeroStage] = {"params": 3, "grads": 2, "master": 1, "optimizer": 1}
"""The ZeRO stage from which each model state is sharded over the data-parallel replicas (Rajbhandari et al.
2020 §5.1, Figure 1): ZeRO-1 the optimizer states (and the fp32 master copy, which the optimizer owns),
ZeRO-2 also the gradients, ZeRO-3 also the parameters."""


def zero_shards(state: ModelState, zero: ZeroStage) -> bool:
    """Whether ZeRO stage ``zero`` shards the model state ``state`` (params, grads, master, optimizer)."""
    return zero >= ZERO_SHARDS_FROM[state]


def gathered_to_backward(w: Workload, zero: ZeroStage) -> bool:
    """Whether ZeRO-2 is FSDP's: the weights kept only as sharded fp32 master copies (``master_only``), each layer's
    16-bit weights all-gathered in its forward and kept until its backward (FSDP2's ``reshard_after_forward=False``,
    torchtitan's ``fsdp_reshard_after_forward = "never"``; FSDP1's SHARD_GRAD_OP), the gradients reduce-scattered
    in each backward. Every layer's weights are then whole at the start of the backward, as ZeRO-2's are."""
    return zero == 2 and w.framework.states.weights == "master_only"


def zero_divisor(state: ModelState, zero: ZeroStage, replicas: int) -> int:
    """Over how many GPUs ``state`` is spread: the data-parallel replicas once ZeRO shards it, else 1."""
    return replicas if zero_shards(state, zero) else 1


def tp_divisor(tensor: WeightTensor, model: ModelSpec, tp: int) -> int:
    """Over how many tensor-parallel GPUs ``tensor`` is split: TP for Megatron-LM's column- and row-parallel
    weights (and a full-width QK-norm, which follows its projection), 1 for what is replicated."""
    module, _, param = tensor.name.rpartition(".")
    leaf = module.rsplit(".", 1)[-1]
    column = leaf in COLUMN_PARALLEL or (leaf in ("q_norm", "k_norm") and model.qk_norm == "full")
    return tp if column or (leaf in ROW_PARALLEL and param == "weight") else 1


def split_divisor(tensor: WeightTensor, model: ModelSpec, split: ModelSplit) -> int:
    """``tp_divisor`` under ``split``: the routed experts' matrices split by ETP, the rest by TP."""
    return tp_divisor(tensor, model, split.etp if tensor.group == "experts" else split.tp)


def copies_on_stage(tensor: WeightTensor, model: ModelSpec, built: StageLayers, ep: int) -> float:
    """How many copies of ``tensor`` one GPU of a stage that builds ``built`` holds (before tensor-parallel
    splitting), with the routed experts spread over ``ep`` GPUs."""
    symbol = tensor.count_symbol
    if symbol == "1":  # the cross-attention's one tensor here is the embedding's rows beyond the vocabulary
        if tensor.group in ("embedding", "position", "cross_attention"):
            on_stage = built.embedding or (built.head and tensor.group == "embedding" and model.tied_embeddings)
        else:  # final norm, untied head
            on_stage = built.head
        return 1.0 if on_stage else 0.0
    if symbol.split("·")[0] in SHARED_SYMBOLS:  # a shared block's, or its uses' own: on the one stage (PP = 1,
        return float(tensor.count)  # layout_checks.check_layout), all of them
    if symbol in AVERAGED_SYMBOLS or symbol == CROSS_SYMBOL:  # a hybrid's stage: its layers taken at the model's
        # mix; Llama 3.2 Vision's cross-attention layers, spread through the stack (every fifth), at their share
        return tensor.count / model.num_layers * built.layers
    if symbol == "L_dense":  # the layers that do not route, at the model's mix of dense FFNs and none
        return copies_per_layer(model, tensor) * built.dense
    per_layer = copies_per_layer(model, tensor)  # L_moe, L_moe·E, L_moe·E_shared
    if tensor.group == "experts":
        per_layer /= ep
    return per_layer * built.moe


@dataclass(frozen=True)
class StageParams:
    dense: float  # parameters on one GPU of the stage, replicated over DP·CP
    experts: float  # routed-expert parameters on one GPU, replicated over EDP = DP·CP·TP / (ETP·EP)

    @property
    def total(self) -> float:
        return self.dense + self.experts


@functools.lru_cache(maxsize=256)
def states_workload(w: Workload) -> Workload:
    """``w`` with one sequence per micro-batch and no recomputation. The model states and the traffic that moves
    them depend on neither, so figures of them cached under this workload serve every micro-batch and
    recomputation mode the planner tries."""
    return canonical(replace(w, micro_batch=1, recompute="none"))


def trained_precision(w: Workload) -> PrecisionRecipe:
    """The recipe the trained weights follow: the workload's, except PEFT's fp32 adapters over a pure 16-bit model
    (``autocast_adapter_dtype``, its default, without autocast's mixed recipe), whose weights, gradients and
    optimizer states are fp32 (torch.optim.AdamW makes its states in the parameter's dtype)."""
    p = w.precision
    if w.method.adapters and w.method.fp32_adapters and p.master_bytes == 0 and p.param_bytes < 4:
        return _fp32_trained(p)
    return p


@functools.cache
def _fp32_trained(p: PrecisionRecipe) -> PrecisionRecipe:
    return p.model_copy(update={"param_bytes": 4.0, "grad_bytes": 4.0, "optimizer_state_bytes": 4.0})


def stage_params(w: Workload, layout: Layout, stage: int) -> StageParams:
    """The parameters one GPU of pipeline stage ``stage`` holds, before ZeRO shards them."""
    return _params_held(w.model, layout.state_shards.split, stage_layers(w.model, layout, stage))


@functools.lru_cache(maxsize=1 << 16)  # the planner asks for the same stages thousands of times
def _params_held(model: ModelSpec, split: ModelSplit, built: StageLayers) -> StageParams:
    """The parameters one GPU holds of a stage that builds ``built``, before ZeRO shards them."""
    dense = experts = 0.0
    for tensor in weight_tensors(model):
        held = copies_on_stage(tensor, model, built, split.ep) * tensor.numel / split_divisor(tensor, model, split)
        if tensor.group == "experts":
            experts += held
        else:
            dense += held
    encoder = image_encoder_params(model) if built.embedding else 0  # GIT's image encoder (TP = 1: check_kept_whole)
    return StageParams(dense + mtp_own_params(model, split.tp, built) + encoder, experts)


def mtp_own_params(model: ModelSpec, tp: int, built: StageLayers) -> float:
    """What the trained multi-token-prediction modules hold on one GPU of their stage beyond their layers (counted
    with the stage's): each module's two input norms, its 2h → h projection (column-parallel) and its final norm
    (``model.params.mtp_params``; with mHC its two h → h projections and its streams' collapse, whole on every TP
    rank), and the word embedding, which Megatron-Core builds on the stage that runs them (gpt_model.py:
    ``pre_process or mtp_process``) unless the stage holds it already; with tied embeddings the last stage's output
    layer keeps its own matrix beside it (``skip_weight_param_allocation`` on the first stage only)."""
    if not built.mtp:
        return 0.0
    h = model.hidden_size
    embedding = 0.0 if built.embedding else model.vocab_size * h / tp
    return built.mtp * (3 * h + 2 * h * h / tp + mtp_collapse_params(model)) + embedding


@functools.lru_cache(maxsize=1 << 14)
def trained_held(model: ModelSpec, method: Method, split: ModelSplit, built: StageLayers) -> StageParams:
    """The trained parameters one GPU holds of a stage that builds ``built``: all of them under full training
    (``_params_held``); the adapters (LoRA, QLoRA), which lmcalc keeps whole on every tensor-parallel rank; the
    layers above the frozen ones (freeze)."""
    if method.kind == "full":
        return _params_held(model, split, built)
    dense = experts = 0.0
    for tensor, share in trained_tensors(model, method):
        divisor = 1 if tensor.group == "adapters" else split_divisor(tensor, model, split)
        held = copies_on_stage(tensor, model, built, split.ep) * share * tensor.numel / divisor
        if tensor.group == "experts" or tensor.name.startswith("experts."):
            experts += held
        else:
            dense += held
    return StageParams(dense, experts)


@functools.lru_cache(maxsize=1 << 14)
def idle_held(model: ModelSpec, method: Method, split: ModelSplit, built: StageLayers) -> float:
    """The trained parameters one GPU holds of a stage that builds ``built`` that no step computes (Llama 3.2 Vision's
    cross-attention layers on text, and their adapters: ``width_params.idle``), all dense. They are held; where
    autograd makes the gradients, none is made for them, and PyTorch's optimizers make states only for a gradient."""
    trained = ((t, 1.0) for t in weight_tensors(model)) if method.kind == "full" else trained_tensors(model, method)
    return sum(
        copies_on_stage(t, model, built, split.ep)
        * share
        * t.numel
        / (1 if t.group == "adapters" else split_divisor(t, model, split))
        for t, share in trained
        if idle(t)
    )


def updated_held(w: Workload, split: ModelSplit, built: StageLayers) -> StageParams:
    """The trained parameters one GPU holds of a stage that the optimizer steps: all of them, but where autograd
    makes the gradients (the profile's ``grads_lifetime`` "step"), not those no step computes (``idle_held``)."""
    held = trained_held(w.model, w.method, split, built)
    if w.framework.states.grads_lifetime != "step":
        return held
    return StageParams(held.dense - idle_held(w.model, w.method, split, built), held.experts)


@functools.lru_cache(maxsize=1 << 14)
def frozen_held(
    model: ModelSpec, method: Method, param_bytes: float, split: ModelSplit, built: StageLayers
) -> StageParams:
    """The bytes of frozen weights one GPU holds of a stage that builds ``built`` (``method.frozen_bytes_per_element``
    each; a 4-bit tensor also keeps its constants), split like ``StageParams`` into dense and routed-expert bytes."""
    dense = experts = 0.0
    if method.kind == "full":
        return StageParams(0.0, 0.0)
    for tensor in weight_tensors(model):
        share = frozen_share(model, method, tensor)
        if not share:
            continue
        copies = copies_on_stage(tensor, model, built, split.ep) * share
        held = (
            copies
            * tensor.numel
            / split_divisor(tensor, model, split)
            * frozen_bytes_per_element(method, tensor, param_bytes)
        )
        if method.kind == "qlora" and quantised(tensor):
            held += copies * NF4_TENSOR_CONSTANTS
        if tensor.group == "experts":
            experts += held
        else:
            dense += held
    if built.embedding:  # GIT's image encoder: frozen under LoRA (its weights whole: QLoRA refused, check_layout)
        dense += image_encoder_params(model) * param_bytes
    return StageParams(dense, experts)


def stage_part(model: ModelSpec, built: StageLayers) -> ModelPart:
    """The part of the model a stage that builds ``built`` computes (all its TP, CP and EP ranks together):
    the share of each weight tensor's copies it holds, its layers, and whether it computes the logits."""
    # a tensor of no copies (a hybrid's other mixer where every layer attends) has no share to hold
    shares = tuple(copies_on_stage(t, model, built, 1) / t.count if t.count else 0.0 for t in weight_tensors(model))
    return ModelPart(shares, built.layers, built.head)


def sharded_state_bytes(bytes_per_param: float, state: ModelState, held: StageParams, shards: StateShards) -> float:
    """Bytes of one model state on a GPU holding ``held``: ``bytes_per_param`` for each parameter, spread over
    the replicas (DP·CP) for dense tensors and EDP for experts once ``shards``' ZeRO stage shards ``state``, or
    under HSDP over one group of them (all of them for the optimizer's states under HFSDP)."""
    if zero_shards(state, shards.zero):
        dense, experts = shards.shards_of(state)
        return bytes_per_param * (held.dense / dense + held.experts / experts)
    return bytes_per_param * (held.dense + held.experts)
