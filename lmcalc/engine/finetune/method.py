"""How a model is trained: every weight, low-rank adapters on a frozen base, adapters on a 4-bit base, or only the
top layers. The fine-tuning method decides which weights carry gradients and optimizer states, what the frozen
ones cost, and which linear layers grow adapters.

* ``full``: every weight is trained (pretraining and full fine-tuning).
* ``lora``: the base is frozen in the compute dtype; each targeted linear layer W (out × in) gains a trained
  low-rank update B·A with A (r × in) and B (out × r), so it computes W·x + (α/r)·B·A·x (Hu et al. 2021, §4.1,
  eq. 3). Adapter parameters per targeted module: r·(in + out).
* ``qlora``: LoRA on a base whose linear weights are stored in 4-bit NormalFloat with double quantisation (Dettmers
  et al. 2023, §3): per 64-element block one 8-bit absmax, itself quantised with one fp32 scale per 256 blocks,
  i.e. 4 + 8/64 + 32/(64·256) = 4.127 bits per weight, and per tensor bitsandbytes' small constants
  (``nf4_bytes``). The output head, embeddings, norms, routers and biases stay unquantised.
* DoRA (Liu et al. 2024, with ``lora`` or ``qlora``): each adapted W becomes m · (W + s·B·A)/‖W + s·B·A‖, with a
  trained magnitude m of ``out`` values per module; PEFT computes the norm (detached, §4.3) from the whole B·A
  every forward pass.
* ``freeze``: the embedding and the bottom ``freeze_layers`` layers are frozen; the layers above them, the final
  norm and an untied head are trained as in full fine-tuning.

Module names are lmcalc's, one per linear layer of a block: ``q``, ``k``, ``v``, ``o`` (attention), ``q_a``,
``q_b``, ``kv_a``, ``kv_b`` (multi-head latent attention), ``attn_gate`` (AFMoE's gate on the attention's output,
which ``gate`` takes too, as PEFT's ``gate_proj`` does), ``gate``, ``up``, ``down`` (gated MLPs, dense, routed
or shared experts alike), ``fc``, ``proj`` (GELU MLPs), ``router``, and where the reference implementation fuses
weights (``ModelSpec.fused_linears``) ``qkv`` and ``gate_up``. Hugging Face spellings are read too (``q_proj``,
``gate_proj``, GPT-2's ``c_attn``, ``c_fc``, ``c_proj``). ``all-linear`` is PEFT's: every linear layer but the
output head.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace
from typing import Literal, get_args

from lmcalc.engine.choices import one_of, positive_integer
from lmcalc.engine.model.params import AVERAGED_SYMBOLS, MIXER_SYMBOLS, WeightTensor, weight_tensors
from lmcalc.engine.model.width_params import CROSS_SYMBOL
from lmcalc.errors import LmcalcError, setting
from lmcalc.specs import ModelSpec

MethodKind = Literal["full", "lora", "qlora", "freeze"]
METHODS: tuple[MethodKind, ...] = get_args(MethodKind)
ADAPTER_METHODS = ("lora", "qlora")
ALL_LINEAR = "all-linear"

NF4_BLOCK = 64  # elements per first-level absmax (bitsandbytes' default blocksize for 4-bit; Dettmers et al. 2023)
NF4_BLOCK2 = 256  # first-level absmaxes per second-level fp32 scale (double quantisation)
NF4_TENSOR_CONSTANTS = 4 + 16 * 4 + 256 * 4
"""Bytes bitsandbytes keeps with every 4-bit tensor beside its blocks (QuantState, measured on the CPU): the fp32
offset subtracted from the absmaxes before their 8-bit quantisation, the 16-value fp32 NF4 code and the 256-value
fp32 code of the second-level quantisation."""

LINEAR_NAMES: tuple[str, ...] = ("q", "k", "v", "qkv", "kv", "o", "q_a", "q_b", "kv_a", "kv_b", "gate", "up", "gate_up")
LINEAR_NAMES += ("down", "fc", "proj", "router", "attn_gate")  # attn_gate: AFMoE's gate on the attention output
LINEAR_NAMES += ("in_proj_qkvz", "in_proj_ba", "in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")  # Gated DeltaNet
LINEAR_NAMES += ("in_proj", "x_proj", "dt_proj", "out_proj")  # Mamba's and Mamba-2's, and Gated DeltaNet's output
LINEAR_NAMES += ("g", "b", "a")  # OLMo Hybrid's Gated DeltaNet: its output gate's, β's and α's own projections
LINEAR_NAMES += ("output_gate",)  # MiniMax's lightning attention: the sigmoid gate's projection
LINEAR_NAMES += ("f", "f_a", "f_b", "g_a", "g_b")  # Kimi Delta Attention's forget and output gates, low-rank or not
LINEAR_NAMES += ("linear_y", "linear_x", "linear_out")  # RecurrentGemma's recurrent block: its two branches, output
HF_NAMES: dict[str, tuple[str, ...]] = {
    "q_proj": ("q",),
    "k_proj": ("k",),
    "v_proj": ("v",),
    "o_proj": ("o",),
    "qkv_proj": ("qkv",),
    "kv_proj": ("kv",),
    "c_attn": ("qkv",),
    "query_key_value": ("qkv",),
    "q_a_proj": ("q_a",),
    "q_b_proj": ("q_b",),
    "kv_a_proj_with_mqa": ("kv_a",),
    "kv_b_proj": ("kv_b",),
    "gate_proj": ("gate",),
    "up_proj": ("up",),
    "gate_up_proj": ("gate_up",),
    "down_proj": ("down",),
    "c_fc": ("fc",),
    "c_proj": ("o", "proj"),  # GPT-2 names both its attention output and its MLP output c_proj: PEFT adapts both
    "w1": ("gate",),
    "w3": ("up",),
    "w2": ("down",),
    "g_proj": ("g",),
    "b_proj": ("b",),
    "a_proj": ("a",),
    "f_proj": ("f",),
    "f_a_proj": ("f_a",),
    "f_b_proj": ("f_b",),
    "g_a_proj": ("g_a",),
    "g_b_proj": ("g_b",),
    "router_gate": ("router",),  # Doge's CDMoE's router (DogeCDMoE.router_gate)
}
"""Hugging Face module names, read as lmcalc's (PEFT matches a target against the end of a module's name)."""
TWO_MATRIX = {"up": "fc", "down": "proj"}
"""A gated MLP's up and down, read as a two-matrix MLP's first and second matrix where the model has one."""


MIXER_INPUTS = ("in_proj", "in_proj_qkvz", "in_proj_ba", "in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "g", "b",
                "a", "f", "f_a", "g_a", "linear_y", "linear_x")  # fmt: skip
"""A hybrid's other mixers' input projections (Mamba-2's, Gated DeltaNet's, LFM2's, Kimi Delta Attention's gates,
RecurrentGemma's two branches): what read the layer's norm (OLMo Hybrid's Gated DeltaNet and KDA read it by q, k and v
too, and MiniMax's lightning attention by q‖k‖v and its output gate)."""


@dataclass(frozen=True)
class Method:
    """What is trained, and with which adapters. ``lora_targets`` holds lmcalc's module names (``parse_targets``)
    or ``all-linear``; ``lora_dropout`` is PEFT's ``lora_dropout``; ``freeze_layers`` counts the bottom layers the
    ``freeze`` method keeps frozen; ``kbit_upcast``: QLoRA's unquantised weights (embeddings, norms, head) are cast
    to fp32, as ``peft.prepare_model_for_kbit_training`` does; ``fp32_adapters``: the adapters in fp32 over a 16-bit
    model, PEFT's default (``autocast_adapter_dtype=True``), else in the model's dtype."""

    kind: MethodKind = "full"
    lora_rank: int = 16
    lora_targets: tuple[str, ...] = (ALL_LINEAR,)
    lora_dropout: float = 0.0
    freeze_layers: int = 0
    kbit_upcast: bool = True
    dora: bool = False
    fp32_adapters: bool = True
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.kind not in METHODS:
            raise LmcalcError(f"{setting('method')} must be one of {one_of(METHODS)}; got {self.kind!r}")
        if not positive_integer(self.lora_rank):
            raise LmcalcError(f"{setting('lora_rank')} must be a positive integer, got {self.lora_rank}")
        if not 0 <= self.lora_dropout < 1:
            raise LmcalcError(f"{setting('lora_dropout')} must be at least 0 and below 1, got {self.lora_dropout}")
        if isinstance(self.freeze_layers, bool) or not isinstance(self.freeze_layers, int) or self.freeze_layers < 0:
            raise LmcalcError(f"{setting('freeze_layers')} must be a whole number of layers, got {self.freeze_layers}")
        if self.kind == "freeze" and self.freeze_layers == 0:
            raise LmcalcError(
                f"the freeze method needs {setting('freeze_layers')}: how many bottom layers stay frozen (the layers "
                "above them, the final norm and the head are trained)"
            )
        if self.dora and not self.adapters:
            raise LmcalcError(f"{setting('dora')} decomposes LoRA's update: it needs the lora or qlora method")
        if self.kind != "freeze" and self.freeze_layers:
            raise LmcalcError(f"{setting('freeze_layers')} applies to the freeze method only, not {self.kind}")
        for target in self.lora_targets:
            if target != ALL_LINEAR and target not in LINEAR_NAMES:
                raise LmcalcError(f"unknown LoRA target {target!r}: use parse_targets to read Hugging Face names")
        key = (self.kind, self.lora_rank, self.lora_targets, self.lora_dropout, self.freeze_layers, self.kbit_upcast,
               self.dora, self.fp32_adapters)  # fmt: skip
        object.__setattr__(self, "_hash", hash(key))

    def __hash__(self) -> int:
        return self._hash

    @property
    def adapters(self) -> bool:
        """Whether the method trains low-rank adapters on a frozen base (LoRA, QLoRA)."""
        return self.kind in ADAPTER_METHODS

    @property
    def label(self) -> str:
        if self.adapters:
            targets = ",".join(self.lora_targets)
            dropout = f", dropout {self.lora_dropout:g}" if self.lora_dropout else ""
            name = ("LoRA" if self.kind == "lora" else "QLoRA") + (" + DoRA" if self.dora else "")
            return f"{name} r={self.lora_rank} on {targets}{dropout}"
        if self.kind == "freeze":
            return f"freeze the bottom {self.freeze_layers} layers"
        return "full (every weight trained)"


FULL = Method()


def parse_targets(text: str | tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """lmcalc's module names for a comma-separated list of targets, in lmcalc's or Hugging Face's spelling."""
    words = [w.strip() for w in text.split(",")] if isinstance(text, str) else [str(w).strip() for w in text]
    words = [w for w in words if w]
    if not words:
        raise LmcalcError(f"{setting('lora_targets')} names no module; use e.g. q,k,v,o or {ALL_LINEAR}")
    names: list[str] = []
    for word in words:
        key = word.lower().replace("-", "_")
        if key in ("all_linear", "all"):
            return (ALL_LINEAR,)
        found = (key,) if key in LINEAR_NAMES else HF_NAMES.get(key)
        if found is None:
            raise LmcalcError(
                f"unknown LoRA target {word!r}; accepted: {', '.join(LINEAR_NAMES)}, their Hugging Face names "
                f"({', '.join(HF_NAMES)}) or {ALL_LINEAR}"
            )
        names += [name for name in found if name not in names]
    return tuple(names)


@dataclass(frozen=True)
class LinearModule:
    """``count`` copies of one linear layer (out × in) of the model; ``active`` of them used by each token."""

    name: str  # "attn.q", "experts.down", "attn.qkv" (fused), "lm_head"
    leaf: str  # "q", "down", "qkv", "lm_head"
    group: str
    inputs: int
    outputs: int
    count: int
    count_symbol: str
    active: float
    rank_scale: int = 1  # its adapter's rank in units of r: 2 for PEFT's one adapter over fused gate and up experts


def _leaf(tensor: WeightTensor) -> str:
    return tensor.name.removesuffix(".weight").rsplit(".", 1)[-1]


def _value_halves(v: LinearModule) -> tuple[LinearModule, LinearModule]:
    """ZAYA's v as ZayaCCAProjection builds it: v_proj_current and v_proj_delayed, each half of its outputs."""
    current, delayed = (replace(v, name=f"attn.v_{half}", outputs=v.outputs // 2) for half in ("current", "delayed"))
    return current, delayed


@functools.lru_cache(maxsize=256)
def linear_modules(model: ModelSpec) -> tuple[LinearModule, ...]:
    """Every linear layer of the model as its reference implementation builds it, fused weights fused, the output
    head last."""
    modules: list[LinearModule] = []
    for t in weight_tensors(model):
        if not t.name.endswith(".weight") or len(t.shape) != 2 or not (t.matmul or t.name == "lm_head.weight"):
            continue
        name = t.name.removesuffix(".weight")
        modules.append(LinearModule(name, _leaf(t), t.group, t.shape[1], t.shape[0], t.count, t.count_symbol, t.active))
    if model.cca:  # ZAYA's value: two nn.Linear of H_kv·d/2, the token's and the one before (PEFT adapts each)
        modules = [half for m in modules for half in (_value_halves(m) if m.name == "attn.v" else (m,))]
    for fused, parts in (("qkv", ("q", "k", "v")), ("gate_up", ("gate", "up")), ("kv", ("k", "v"))):
        if fused not in model.fused_linears:
            continue
        merged: list[LinearModule] = []
        for module in modules:
            if module.leaf == parts[0]:
                prefix = module.name.rsplit(".", 1)[0]
                members = [m for m in modules if m.leaf in parts and m.name.rsplit(".", 1)[0] == prefix]
                outputs = sum(m.outputs for m in members)
                merged.append(
                    LinearModule(
                        f"{prefix}.{fused}",
                        fused,
                        module.group,
                        module.inputs,
                        outputs,
                        module.count,
                        module.count_symbol,
                        module.active,
                    )  # fmt: skip
                )
            elif module.leaf not in parts:
                merged.append(module)
        modules = merged
    return tuple(modules)


def adapted_modules(model: ModelSpec, method: Method) -> tuple[LinearModule, ...]:
    """The linear layers that carry adapters under ``method`` (none unless it is LoRA or QLoRA)."""
    if not method.adapters:
        return ()
    modules = linear_modules(model)
    if method.lora_targets == (ALL_LINEAR,):
        return _as_peft_adapts(model, method, tuple(m for m in modules if m.leaf != "lm_head"))
    leaves = {m.leaf for m in modules}
    # a two-matrix MLP's matrices are fc and proj here; Nemotron, Nemotron-H, Arcee and Apertus call them up_proj and
    # down_proj, which PEFT's up_proj and down_proj match
    requested = tuple(TWO_MATRIX.get(t, t) if "fc" in leaves else t for t in method.lora_targets)
    for target in requested:
        if target not in leaves:
            hint = ""
            if target in ("q", "k", "v") and "qkv" in leaves:
                hint = f" ({model.label} stores Q, K and V as one fused weight: target qkv)"
            elif target in ("k", "v") and "kv" in leaves:
                hint = f" ({model.label} stores K and V as one fused weight: target kv)"
            elif target in ("gate", "up") and "gate_up" in leaves:
                hint = f" ({model.label} stores gate and up as one fused weight: target gate_up)"
            names = ", ".join(sorted(leaves - {"lm_head"}, key=LINEAR_NAMES.index))
            raise LmcalcError(
                f"LoRA target {target!r} matches no linear layer of {model.label}{hint}; its layers: {names}"
            )
    # gate is Hugging Face's gate_proj, which AFMoE's attention gate is called too: PEFT adapts both; LFM2 names its
    # attention's output projection out_proj, as its convolutions' (Lfm2Attention.out_proj): PEFT's out_proj takes both
    targets = set(requested) | ({"attn_gate"} if "gate" in requested else set())
    targets |= {"o"} if "out_proj" in targets and model.short_conv else set()
    return _as_peft_adapts(model, method, tuple(m for m in modules if m.leaf in targets))


SWALLOWED = ("gate", "up", "down", "attn_gate")
"""lmcalc's names for the nn.Linear layers Hugging Face calls gate_proj, up_proj and down_proj."""


def _as_peft_adapts(model: ModelSpec, method: Method, chosen: tuple[LinearModule, ...]) -> tuple[LinearModule, ...]:
    """The ``chosen`` modules as PEFT adapts them. transformers 5 stores an MoE layer's routed experts as 3-D tensors
    and most routers as a bare weight, which LoRA's module targets never match: PEFT reaches them only where it maps
    the type's transformers-4 names onto them (``MoESpec.peft_v4_names``), each expert's gate and up as one adapter
    of rank 2r over their fused weight, down and the router at rank r; a router that is an nn.Linear
    (``MoESpec.router_linear``) is adapted as one. JetMoE's attention experts are 3-D tensors too."""
    moe = model.moe
    if moe is None:
        return chosen
    routed = [m for m in chosen if m.group == "experts"]
    leaves = {m.leaf for m in routed}
    if moe.peft_v4_names and len(leaves & {"gate", "up"}) == 1:
        raise LmcalcError(f"PEFT fuses {model.label}'s experts' gate and up into one weight (gate_up_proj) and adapts "
                          "them together: target both or neither")  # fmt: skip
    kept = []
    for m in chosen:
        if m.group == "router" or m.name == "attn.router":  # JetMoE's attention experts' router: an nn.Linear
            if moe.peft_v4_names or moe.router_linear:
                kept.append(m)
        elif m.count_symbol.endswith("·E_a") or (m.group == "shared_experts" and model.branch_convs):
            continue  # 3-D tensors: JetMoE's attention experts, Inkling's shared experts (InklingSharedExperts)
        elif moe.peft_v4_names == "qwen2_moe" and m.group != "experts" and m.leaf in SWALLOWED:
            continue  # PEFT maps the names gate_proj, up_proj and down_proj to the experts' tensors alone
        elif m.group != "experts":
            kept.append(m)
        elif moe.peft_v4_names and m.leaf == "gate":  # LongCat's fused weight holds its zero experts' rows too
            held = m.count * (moe.num_experts + moe.zero_experts) // moe.num_experts
            symbol = m.count_symbol.replace("E", "(E+Z)")
            fused = replace(m, name="experts.gate_up", leaf="gate_up", outputs=2 * m.outputs, rank_scale=2)
            kept.append(replace(fused, count=held, count_symbol=symbol) if moe.zero_experts else fused)
        elif moe.peft_v4_names and m.leaf != "up":
            kept.append(replace(m, rank_scale=2) if m.leaf == "gate_up" else m)
    if chosen and not kept:
        raise LmcalcError(
            f"LoRA targets {', '.join(method.lora_targets)} match only {model.label}'s routed experts or router, "
            "which transformers 5 stores outside nn.Linear and PEFT's LoRA does not adapt for this model type; "
            "target its attention or shared experts"
        )
    wrapped = [m for m in kept if m.group == "experts" or (m.group == "router" and not moe.router_linear)]
    if method.dora and wrapped:  # PEFT's ParamWrapper, which takes no DoRA
        raise LmcalcError(f"PEFT cannot put DoRA on {model.label}'s routed experts or router, which transformers 5 "
                          "stores outside nn.Linear (lora.ParamWrapper does not work with use_dora); target the "
                          f"attention and shared experts alone, or leave {setting('dora')} off")  # fmt: skip
    return tuple(kept)


@functools.lru_cache(maxsize=1024)
def adapter_tensors(model: ModelSpec, method: Method) -> tuple[WeightTensor, ...]:
    """The adapters' weights: for each targeted module, A (r × in) and B (out × r) (Hu et al. 2021 §4.1), and with
    DoRA a magnitude vector of ``out`` (Liu et al. 2024)."""
    tensors = []
    for m in adapted_modules(model, method):
        r = method.lora_rank * m.rank_scale
        for part, shape, symbols in (("A", (r, m.inputs), ("r", "in")), ("B", (m.outputs, r), ("out", "r"))):
            tensors.append(
                WeightTensor(
                    f"{m.name}.lora_{part}.weight", "adapters", shape, symbols, m.count, m.count_symbol, m.active, True
                )  # fmt: skip
            )
        if method.dora:  # DoRA's magnitude: one trained scale per output (Liu et al. 2024, eq. 5)
            tensors.append(WeightTensor(f"{m.name}.lora_magnitude", "adapters", (m.outputs,), ("out",), m.count,
                                        m.count_symbol, m.active, False))  # fmt: skip
    return tuple(tensors)


def quantised(tensor: WeightTensor) -> bool:
    """Whether QLoRA stores ``tensor`` in 4 bits: the weight of every linear layer of the blocks (bitsandbytes
    replaces their ``nn.Linear``), not the head (transformers leaves the output embedding unquantised), nor the
    routers, embeddings, norms or biases, nor an MoE's routed experts (and JetMoE's attention experts), which
    transformers 5 stores as 3-D tensors that bitsandbytes' 4-bit loading passes over and leaves in the compute
    dtype (``hf_moe_storage``; bitsandbytes issue #1849)."""
    return (
        tensor.matmul
        and tensor.name.endswith(".weight")
        and len(tensor.shape) == 2
        and tensor.group not in ("router", "experts")
        and not tensor.count_symbol.endswith("·E_a")
    )


def dora_temporaries(model: ModelSpec, method: Method) -> int:
    """Elements DoRA's forward holds at once for its largest adapted module's weight norm, as PEFT computes it:
    the in × in identity B·A is built from, B·A itself (out × in) and W + s·B·A (out × in). An estimate of the
    peak of these temporaries, which the forward frees module by module; not measured."""
    modules = adapted_modules(model, method) if method.dora else ()
    return max((m.inputs * m.inputs + 2 * m.outputs * m.inputs for m in modules), default=0)


def largest_quantised(model: ModelSpec) -> int:
    """Weights of the largest matrix QLoRA stores in 4 bits: the size of the buffer it is dequantised into."""
    return max((t.numel for t in weight_tensors(model) if quantised(t)), default=0)


def nf4_bytes(numel: int) -> int:
    """Bytes of one tensor of ``numel`` weights in NF4 with double quantisation, as bitsandbytes' ``quantize_4bit``
    (blocksize 64, compress_statistics) stores it: packed 4-bit pairs, an 8-bit absmax per 64-weight block, an fp32
    scale per 256 blocks, and the tensor's constants (``NF4_TENSOR_CONSTANTS``)."""
    blocks = math.ceil(numel / NF4_BLOCK)
    return math.ceil(numel / 2) + blocks + 4 * math.ceil(blocks / NF4_BLOCK2) + NF4_TENSOR_CONSTANTS


NF4_BITS_PER_WEIGHT = 4 + 8 / NF4_BLOCK + 32 / (NF4_BLOCK * NF4_BLOCK2)  # 4.127 (Dettmers et al. 2023 §3)


def frozen_share(model: ModelSpec, method: Method, tensor: WeightTensor) -> float:
    """The fraction of ``tensor``'s copies that ``method`` leaves frozen (1 for the whole base under LoRA; BLT's
    entropy model always, which BltModel builds with ``requires_grad`` false)."""
    if tensor.group == "patcher":
        return 1.0
    if method.kind == "full":
        return 0.0
    if method.adapters:
        return 1.0
    frozen_layers = min(method.freeze_layers, model.num_layers)
    symbol = tensor.count_symbol
    if symbol == "1":  # the embedding (and a head tied to it, and Mllama's rows beyond the vocabulary) stays frozen;
        # the final norm, an untied head train
        return 1.0 if tensor.group in ("embedding", "position", "cross_attention") else 0.0
    if symbol in AVERAGED_SYMBOLS or symbol == CROSS_SYMBOL:  # a hybrid's layer tensors, at its mix of layers;
        # Llama 3.2 Vision's cross-attention layers, spread through the stack
        return frozen_layers / model.num_layers
    frozen_moe = model.moe_layers_in(0, frozen_layers)  # the frozen layers are the lowest ones
    if symbol == "L_dense":
        return (sum(model.has_ffn(i) for i in range(frozen_layers)) - frozen_moe) / model.dense_ffn_layers
    return frozen_moe / model.moe_layers


@functools.lru_cache(maxsize=1024)
def trained_tensors(model: ModelSpec, method: Method) -> tuple[tuple[WeightTensor, float], ...]:
    """The tensors ``method`` trains, each with the share of its copies trained: every weight (full), the adapters
    (LoRA, QLoRA), or what lies above the frozen layers (freeze)."""
    if method.adapters:
        return tuple((t, 1.0) for t in adapter_tensors(model, method))
    shares = ((t, 1.0 - frozen_share(model, method, t)) for t in weight_tensors(model))
    return tuple((t, share) for t, share in shares if share > 0)


def frozen_bytes_per_element(method: Method, tensor: WeightTensor, param_bytes: float) -> float:
    """Bytes of one frozen weight: 4-bit NormalFloat (blocks and their scales, without the per-tensor constants)
    for QLoRA's quantised weights, fp32 for its others when ``kbit_upcast``, else the recipe's weight bytes."""
    if method.kind == "qlora":
        return NF4_BITS_PER_WEIGHT / 8 if quantised(tensor) else (4.0 if method.kbit_upcast else param_bytes)
    return param_bytes


def weight_trained(model: ModelSpec, method: Method, leaf: str) -> bool:
    """Whether ``method`` trains the weight of the layer module ``leaf`` (a linear layer's name, ``norm``, or
    ``lm_head``) in the layers it trains: every weight there under full and freeze training, but a head tied to
    the frozen embedding; none under LoRA and QLoRA."""
    if method.adapters:
        return False
    if leaf == "lm_head" and method.kind == "freeze":
        return not model.tied_embeddings
    return True


def in_layer(module: LinearModule, moe_layer: bool) -> bool:
    """Whether a linear module belongs to a dense layer (``moe_layer`` False) or to an MoE layer."""
    # a hybrid's mixers (at its mix), and Gemma 4's MLPs, of one width where a layer makes its own K and V and of
    # another where it reuses them ((L−n_s) and n_s of the L): each layer has one
    symbol = module.count_symbol.removesuffix("_w")  # a looped model's held layers (model.layer_reuse.held_once)
    if module.group in ("attention", "ssm") or symbol in ("L", "(L−n_s)", "n_s"):
        return True
    if symbol == "L_dense":
        return not moe_layer
    return moe_layer


def in_mixer(module: LinearModule, attends: bool, other: bool | None = None) -> bool:
    """Whether a linear module belongs to a layer that attends (``attends``) or runs a hybrid's other mixer
    (``other``; by default, the layers that do not attend; both in Falcon-H1's): its attention's where it attends,
    its other mixer's where it runs it, every other module in both."""
    if module.count_symbol == "L_attn":
        return attends
    return (not attends if other is None else other) if module.count_symbol in MIXER_SYMBOLS else True


def trained_params(model: ModelSpec, method: Method) -> float:
    """How many parameters ``method`` trains: the adapters, the weights above the frozen layers, or all."""
    return sum(t.total * share for t, share in trained_tensors(model, method))


def frozen_params(model: ModelSpec, method: Method) -> float:
    """How many of the model's parameters ``method`` leaves frozen."""
    return sum(t.total * frozen_share(model, method, t) for t in weight_tensors(model))


def check_method(model: ModelSpec, method: Method) -> None:
    """Refuse a method the model cannot take: targets it lacks, more frozen layers than it has."""
    if model.mamba and method.kind != "full":
        raise LmcalcError(
            f"{model.label} is a hybrid with Mamba layers: lmcalc models its full training only, not {method.kind} "
            "(their adapters and frozen layers are not modelled; Mamba-2 and Gated DeltaNet hybrids take LoRA)"
        )
    adapted_modules(model, method)
    if method.kind == "freeze" and method.freeze_layers >= model.num_layers:
        raise LmcalcError(
            f"{setting('freeze_layers')} ({method.freeze_layers}) must leave at least one of the {model.num_layers} "
            f"layers of {model.label} trained"
        )
