"""Validated descriptions of what lmcalc reasons about: models, accelerators, precisions, optimizers (and, in
``framework_specs``, the training frameworks' rules).

Every preset file is parsed into one of these pydantic models once; the engine only ever sees these
objects, never raw YAML. Units are in the field names (``memory_bytes``, ``peak_tflops_dense``) so a
preset file cannot be read two ways.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# Spelled with Field(gt=0) rather than pydantic's PositiveInt, whose module (pydantic.types) costs
# 15 ms of start-up for nothing more.
PositiveInt = Annotated[int, Field(gt=0)]
PositiveFloat = Annotated[float, Field(gt=0)]

FfnKind = Literal["gelu_mlp", "swiglu", "geglu"]
NormKind = Literal["layernorm", "layernorm_nobias", "rmsnorm"]
PositionKind = Literal["learned", "rope", "none"]
ComputeDtype = Literal["fp64", "fp32", "tf32", "fp16", "bf16", "fp8", "int8"]


def _hashable(value: Any) -> Any:
    """``value`` with its lists and dicts made tuples, so that it can be hashed by its contents."""
    if isinstance(value, list | tuple):
        return tuple(_hashable(item) for item in value)
    if isinstance(value, dict):
        return tuple(sorted((key, _hashable(item)) for key, item in value.items()))
    return value


_HASHES: dict[int, int] = {}
"""Each live spec's hash, by ``id``: computed once (a model's walks some thirty fields), forgotten when the spec
is (``weakref.finalize``), before its ``id`` can be reused. A spec is frozen and its sequences are tuples, so its
hash cannot go stale (a hardware spec's dicts are the one thing a caller could still change in place: don't)."""


class Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    def __hash__(self) -> int:
        """Specs are values: equal specs hash equal, so they can key the engine's caches. A frozen spec never
        changes, so its hash is computed once."""
        known = _HASHES.get(id(self))
        if known is None:
            known = _HASHES[id(self)] = hash((type(self), _hashable(tuple(self.__dict__.values()))))
            weakref.finalize(self, _HASHES.pop, id(self), None)
        return known


class NamedSpec(Spec):
    """A spec a preset file holds, found by its name."""

    name: str


class MoESpec(Spec):
    """Mixture-of-experts feed-forward: routed experts, always-on shared experts, leading dense layers."""

    num_experts: PositiveInt
    experts_per_token: PositiveInt
    shared_experts: int = Field(0, ge=0)
    expert_ffn_size: PositiveInt
    dense_layers: int = Field(0, ge=0, description="leading layers that keep a dense FFN of ffn_size")
    router_bias: bool = Field(False, description="a learned per-expert bias on the router scores")
    node_limit: PositiveInt | None = Field(
        None,
        description="node-limited routing: each token is sent to experts on at most this many nodes (DeepSeek-V3: "
        "4, its 8 expert groups of which each token picks 4)",
    )

    @model_validator(mode="after")
    def _top_k_fits(self) -> MoESpec:
        if self.experts_per_token > self.num_experts:
            raise ValueError(f"experts_per_token ({self.experts_per_token}) exceeds num_experts ({self.num_experts})")
        return self


class MLASpec(Spec):
    """Multi-head latent attention (DeepSeek-V2/V3): low-rank Q and joint low-rank K/V projections."""

    q_lora_rank: PositiveInt | None = Field(None, description="None: plain h x (heads*qk_head_dim) query")
    kv_lora_rank: PositiveInt
    qk_nope_head_dim: PositiveInt
    qk_rope_head_dim: PositiveInt
    v_head_dim: PositiveInt

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


class ModelSpec(NamedSpec):
    """A decoder-only transformer, described the way its config file and paper describe it."""

    display_name: str = ""
    aliases: tuple[str, ...] = Field(default_factory=tuple)
    family_aliases: tuple[str, ...] = Field(
        default_factory=tuple, description="short family names (e.g. llama-70b) that default to this model"
    )
    vocab_size: PositiveInt
    hidden_size: PositiveInt
    num_layers: PositiveInt
    num_heads: PositiveInt
    num_kv_heads: PositiveInt | None = Field(None, description="GQA/MQA key-value heads; default num_heads")
    head_dim: PositiveInt | None = Field(None, description="default hidden_size / num_heads")
    ffn_size: PositiveInt = Field(description="intermediate size of a dense FFN")
    ffn_kind: FfnKind
    norm_kind: NormKind
    qk_norm: Literal["none", "full", "per_head"] = Field(
        "none", description="norm on projected queries and keys: over all heads (OLMo 2) or per head"
    )
    attention_bias: Literal["none", "qkv", "all"] = "none"
    mlp_bias: bool = False
    fused_linears: tuple[Literal["qkv", "gate_up"], ...] = Field(
        default_factory=tuple,
        description="weights the reference implementation stores as one matrix (GPT-2's c_attn: qkv; Phi-3's "
        "qkv_proj and gate_up_proj): the count is the same, but a LoRA adapter on it spans the fused output",
    )
    tied_embeddings: bool
    position_embedding: PositionKind
    max_seq_len: PositiveInt
    dropout: bool = Field(False, description="trained with dropout: masks are saved for backward")
    mla: MLASpec | None = None
    moe: MoESpec | None = None
    published_params: PositiveInt | None = None
    published_params_sig_figs: PositiveInt | None = Field(
        None, description="None: the published count is exact; else how many significant figures it has"
    )
    published_params_source: str = ""
    training_tokens: PositiveFloat | None = None
    training_tokens_source: str = ""
    notes: tuple[str, ...] = Field(default_factory=tuple)
    sources: tuple[str, ...] = Field(default_factory=tuple)

    @model_validator(mode="after")
    def _shapes_consistent(self) -> ModelSpec:
        if self.head_dim is None and self.mla is None and self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads} "
                "(set head_dim if the model's heads do not tile the hidden size)"
            )
        if self.num_kv_heads is not None and self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_kv_heads {self.num_kv_heads} does not divide num_heads {self.num_heads}")
        if self.moe and self.moe.dense_layers > self.num_layers:
            raise ValueError(f"moe.dense_layers ({self.moe.dense_layers}) exceeds num_layers ({self.num_layers})")
        return self

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads

    @property
    def head_size(self) -> int:
        return self.head_dim or self.hidden_size // self.num_heads

    @property
    def qk_head_dim(self) -> int:
        return self.mla.qk_head_dim if self.mla else self.head_size

    @property
    def v_head_dim(self) -> int:
        return self.mla.v_head_dim if self.mla else self.head_size

    @property
    def moe_layers(self) -> int:
        return self.num_layers - self.moe.dense_layers if self.moe else 0

    @property
    def label(self) -> str:
        return self.display_name or self.name


class HardwareSpec(NamedSpec):
    """One accelerator as its spec sheet describes it: dense peaks, memory, links, power."""

    display_name: str = ""
    aliases: tuple[str, ...] = Field(default_factory=tuple)
    vendor: str
    memory_bytes: PositiveInt = Field(description="device memory in bytes, stated exactly (see memory_note)")
    memory_label: str = Field(description="the spec sheet's wording, e.g. '80 GB HBM3'")
    memory_note: str = ""
    memory_bandwidth_tbps: PositiveFloat = Field(description="HBM bandwidth in TB/s (1e12 bytes/s)")
    peak_tflops_dense: dict[ComputeDtype, PositiveFloat] = Field(
        description="dense (no 2:4 sparsity) peak TFLOP/s per dtype (int8 in TOP/s)"
    )
    sparsity_note: str = ""
    gpus_per_node: PositiveInt = 8
    intra_node_gbps: PositiveFloat | None = Field(
        None, description="scale-up bandwidth per GPU, one direction, GB/s (NVLink, xGMI, ICI)"
    )
    inter_node_gbps: PositiveFloat | None = Field(
        None, description="scale-out bandwidth per GPU, one direction, GB/s (NIC Gb/s / 8)"
    )
    tdp_watts: PositiveFloat | None = None
    architecture: str | None = Field(
        None, description="the chip generation (ampere, hopper, blackwell, cdna3, tpu-v5p, ...): picks kernel rates"
    )
    compute_units: PositiveInt | None = Field(
        None, description="streaming multiprocessors (NVIDIA), compute units (AMD) or cores: wave quantisation"
    )
    matmul_tflops: dict[ComputeDtype, PositiveFloat] = Field(
        default_factory=dict,
        description="maximum achievable matmul TFLOP/s per dtype, measured at the best shape (MAMF); "
        "source under sources['matmul']",
    )
    intra_node_busbw_gbps: PositiveFloat | None = Field(
        None,
        description="measured ring all-reduce bus bandwidth within a node at large messages, GB/s "
        "(nccl-tests busbw); source under sources['collectives']",
    )
    inter_node_busbw_gbps: PositiveFloat | None = Field(
        None,
        description="measured ring bus bandwidth per GPU across nodes at large messages, GB/s; "
        "source under sources['collectives']",
    )
    scale_up_gpus: PositiveInt | None = Field(
        None,
        description="devices one scale-up fabric joins when it is larger than a node (GB200 NVL72: 72; a TPU "
        "slice's ICI); None: the node",
    )
    sources: dict[str, str] = Field(default_factory=dict, description="source per group of figures")
    notes: tuple[str, ...] = Field(default_factory=tuple)

    def peak_flops(self, dtype: str) -> float:
        """Dense peak in FLOP/s (not TFLOP/s) for a compute dtype."""
        return self.peak_tflops_dense[dtype] * 1e12  # type: ignore[index]

    @property
    def label(self) -> str:
        return self.display_name or self.name


class PrecisionRecipe(NamedSpec):
    """How many bytes each piece of training state takes, and which peak the matmuls run at."""

    aliases: tuple[str, ...] = Field(default_factory=tuple)
    description: str
    compute_dtype: ComputeDtype
    param_bytes: float = Field(ge=0, description="bytes per parameter of the weights used in forward/backward")
    grad_bytes: float = Field(ge=0)
    master_bytes: float = Field(ge=0, description="bytes per parameter of a separate fp32 master copy (0: none)")
    optimizer_state_bytes: float = Field(gt=0, description="bytes of one optimizer state element")
    activation_bytes: float = Field(gt=0, description="bytes of one saved activation element")
    sources: tuple[str, ...] = Field(default_factory=tuple)


class OptimizerState(Spec):
    """One tensor an optimizer keeps per parameter tensor (momentum, second moment, ...)."""

    name: str
    factored: bool = Field(False, description="stored as row + column statistics for matrices (Adafactor)")
    bytes: float | None = Field(None, gt=0, description="fixed bytes per element; None: the recipe's")
    quantization_block: PositiveInt | None = Field(
        None, description="one fp32 scale per block of this many elements (block-wise 8-bit states)"
    )
    min_quantized_elements: PositiveInt | None = Field(
        None,
        description="a quantised state of a tensor with fewer elements is kept in fp32 instead, without scales "
        "(bitsandbytes' min_8bit_size)",
    )
    map_bytes: float = Field(
        0, ge=0, description="bytes each quantised tensor's state keeps beside its elements: the quantisation map"
    )


class OptimizerSpec(NamedSpec):
    aliases: tuple[str, ...] = Field(default_factory=tuple)
    description: str
    states: tuple[OptimizerState, ...]
    sources: tuple[str, ...] = Field(default_factory=tuple)


@dataclass(frozen=True)
class Cluster:
    """``count`` accelerators of one kind, ``gpus_per_node`` to a node (parsed from ``128x8xH100``)."""

    hardware: HardwareSpec
    count: int
    gpus_per_node: int

    @property
    def nodes(self) -> int:
        return -(-self.count // self.gpus_per_node)

    @property
    def label(self) -> str:
        if self.nodes > 1 and self.gpus_per_node > 1 and self.count % self.gpus_per_node == 0:
            return f"{self.nodes}x{self.gpus_per_node}x{self.hardware.name}"
        return f"{self.count}x{self.hardware.name}"
