"""The closed choices of a training setup, each defined once; the lists of accepted values are read from the
definitions (``typing.get_args``), so a new choice is one word added here.

* ``Recompute``: activation recomputation (Korthikanti et al. 2022 §4.2): none; selective, which drops the
  attention core's tensors and recomputes them in the backward pass; full, which keeps each layer's input
  and recomputes the whole layer.
* ``RecomputeMethod``: which layers full recomputation covers, as Megatron-Core's ``recompute_method`` with
  ``recompute_num_layers`` N says (megatron/core/recompute.py): ``uniform``, every layer, in units of N layers
  whose input is kept and which the backward rebuilds together; ``block``, the first N layers of each model chunk
  of a pipeline stage, one at a time, the others keeping everything.
* ``RecomputeModule``: what Megatron-Core's selective recomputation covers (``recompute_modules``,
  megatron/core/transformer/transformer_config.py): ``core_attn``, the attention core (its default); ``mlp``, a dense
  layer's MLP, checkpointed whole; ``moe``, an MoE layer's experts, router and shared experts; ``shared_experts``;
  ``moe_act``, the routed experts' activation output; ``layernorm``, a norm's output where the norm is not fused into
  the next linear; ``mla_up_proj``, multi-head latent attention's up-projected Q, K and V (DeepSeek-V4's Q and K = V,
  under Megatron-Core's fused kernels).
* ``OffloadModule``: what Megatron-Core's fine-grained activation offloading moves to the host (``offload_modules``,
  engine.memory.module_offload): ``expert_fc1``, the routed experts' first projection's input; ``fused_group_mlp``,
  all that the fused grouped MLP keeps.
* ``Attention``: the attention kernel: ``flash`` (fused, FlashAttention: the s² scores are never stored) or
  ``eager`` (scores materialised, as reference implementations write it).
* ``MoeDispatcher``: how an MoE layer's tokens reach their experts' GPUs: ``alltoall``, NCCL's all-to-all of each
  token's k copies (Megatron-Core's ``MoEAlltoAllTokenDispatcher``, torchtitan's standard dispatcher); ``deepep`` and
  ``hybridep``, one copy per GPU that holds one of its experts, and across nodes one per node, forwarded over NVLink
  there (DeepEP's normal kernels and NVIDIA's HybridEP: Megatron-Core's flex dispatcher).
* ``Schedule``: the pipeline schedule: 1F1B (Narayanan et al. 2021 §2.2.1) or interleaved (§2.2.2).
* ``ZeroStage``: what ZeRO shards over the data-parallel replicas (Rajbhandari et al. 2020 §5.1): 0 nothing,
  1 the optimizer states and master weights, 2 also the gradients, 3 also the parameters.
* ``AttnConvention``: how attention FLOPs are counted: ``causal`` (query i against keys 1..i) or ``full``
  (every query against all s keys, as ``FlopCounterMode`` and MFU conventions count).
* ``FlopsBasis``: what a training time is computed from: ``6nd`` (Kaplan et al. 2020's C = 6·N·D) or
  ``detailed`` (every matmul counted, causal attention).
* ``PeakSource``: which peak FLOP/s a time divides by: ``spec`` (the dense spec-sheet peak) or ``measured``
  (``lmcalc bench`` results).
"""

from __future__ import annotations

from typing import Literal, get_args

Recompute = Literal["none", "selective", "full"]
RecomputeMethod = Literal["uniform", "block"]
RecomputeModule = Literal["core_attn", "mlp", "moe", "shared_experts", "moe_act", "layernorm", "mla_up_proj"]
Attention = Literal["flash", "eager"]
MoeDispatcher = Literal["alltoall", "deepep", "hybridep"]
Schedule = Literal["1f1b", "interleaved"]
ZeroStage = Literal[0, 1, 2, 3]
AttnConvention = Literal["causal", "full"]
FlopsBasis = Literal["6nd", "detailed"]
PeakSource = Literal["spec", "measured"]

RECOMPUTE_MODES: tuple[Recompute, ...] = get_args(Recompute)
RECOMPUTE_METHODS: tuple[RecomputeMethod, ...] = get_args(RecomputeMethod)
RECOMPUTE_MODULES: tuple[RecomputeModule, ...] = get_args(RecomputeModule)
OffloadModule = Literal["expert_fc1", "fused_group_mlp"]
OFFLOAD_MODULES: tuple[OffloadModule, ...] = get_args(OffloadModule)
ATTENTION_KERNELS: tuple[Attention, ...] = get_args(Attention)
MOE_DISPATCHERS: tuple[MoeDispatcher, ...] = get_args(MoeDispatcher)
SCHEDULES: tuple[Schedule, ...] = get_args(Schedule)
ZERO_STAGES: tuple[ZeroStage, ...] = get_args(ZeroStage)
ATTN_CONVENTIONS: tuple[AttnConvention, ...] = get_args(AttnConvention)
FLOPS_BASES: tuple[FlopsBasis, ...] = get_args(FlopsBasis)
PEAK_SOURCES: tuple[PeakSource, ...] = get_args(PeakSource)


def one_of(options: tuple[object, ...]) -> str:
    """The options in words, for a message: ``0, 1, 2 or 3``."""
    words = [str(option) for option in options]
    return f"{', '.join(words[:-1])} or {words[-1]}" if len(words) > 1 else words[0]


def positive_integer(value: object) -> bool:
    """Whether ``value`` is a whole number of at least 1 (a bool is not one)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1
