"""Training FLOPs when not every weight is trained: LoRA, QLoRA and frozen layers.

A linear layer y = W·x costs 2·in·out FLOPs per token forward. Backward it computes up to two products of the same
size: the input's gradient (W^T·dy), needed when x needs a gradient, and the weight's (dy·x^T), needed when W is
trained (Narayanan et al. 2021 §5.1). Full training needs both everywhere: 3 × forward, the 6·N·D rule. A frozen
base needs only the first, and only where a gradient still flows:

* LoRA (Hu et al. 2021) freezes every base weight, so each base matmul costs 2 (forward) + 2 (input gradient) =
  4·in·out per token; about 4·N·D instead of 6·N·D. Each adapter B·A on a module adds its own forward
  2·r·(in + out), both weight gradients 2·r·(in + out), and the input gradients of B, and of A where x needs one.
* The lowest layer's input is the frozen embedding's output, which needs no gradient: there, the modules that read
  it (Q, K, V, or with only MLP adapters the whole attention half and the MLP's input projections) compute no input
  gradient. Under the freeze method the frozen bottom layers compute no backward at all; the lowest trained layer's
  norms are trained, so its projections still compute their input gradients, for the norms' weights.
* The attention core's two products (scores Q·K^T and values P·V, no weights) give in backward the gradient of
  each operand that needs one, each at the product's forward cost: twice the forward where Q, K and V all need
  gradients, less in the lowest layer when only some are adapted. The output head computes its input gradient,
  and its weight gradient only when trained.

Element-wise work is not counted, as in ``engine.model.flops``; recomputation redoes the forward of every layer a
gradient flows through (full), or its attention core (selective). This is what ``FlopCounterMode`` counts for a PEFT
model (tests/test_finetune_flops.py).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from lmcalc.engine.choices import AttnConvention, Recompute
from lmcalc.engine.finetune.method import (
    MIXER_INPUTS,
    LinearModule,
    Method,
    adapted_modules,
    in_layer,
    in_mixer,
    linear_modules,
    trained_params,
)
from lmcalc.engine.model.flops import attended_widths
from lmcalc.engine.model.mixer_flops import mixer_conv_flops, ssm_flops
from lmcalc.engine.model.palm import napkin_params
from lmcalc.engine.model.params import LOCAL_SYMBOLS, MIXER_SYMBOLS
from lmcalc.specs import ModelSpec

READS_ATTENTION_INPUT = ("q", "k", "v", "qkv", "q_a", "kv_a", "attn_gate", "output_gate", *MIXER_INPUTS)
READS_MLP_INPUT = ("gate", "up", "gate_up", "fc", "router")
OUTPUT_PROJECTIONS = ("o", "down", "proj", "out_proj")  # a half's last projection: it writes the residual stream
OPERANDS = (("q", "qkv", "q_a", "q_b"), ("k", "qkv", "kv_a", "kv_b"), ("v", "qkv", "kv_a", "kv_b"))
"""The projections whose outputs make the attention core's queries, keys and values."""


@dataclass(frozen=True)
class MethodFlops:
    """FLOPs per token of one training step under a fine-tuning method, by the work they do."""

    forward: float  # every matmul, adapters included
    input_grads: float  # the products that carry the gradient down to each input that needs one
    weight_grads: float  # the products that give the trained weights their gradients
    attention_backward: float
    recomputed: float  # forward work redone in the backward pass (hardware FLOPs only)

    @property
    def model(self) -> float:
        """What MFU counts: forward and backward, without recomputation."""
        return self.forward + self.input_grads + self.weight_grads + self.attention_backward

    @property
    def hardware(self) -> float:
        return self.model + self.recomputed


@dataclass(frozen=True)
class _Layer:
    moe: bool
    input_grad: bool  # the layer's input needs a gradient
    trained: bool  # the layer's weights are trained (full training, a layer above the frozen ones)
    attends: bool = True  # the layer attends (every one but a hybrid's other mixer's, and an FFN block alone)
    other: bool = False  # the layer runs a hybrid's other mixer (instead of attention, or beside it: Falcon-H1)
    feeds: bool = True  # the layer has an FFN (not a mixer block alone, Nemotron-H)


def _layers_of(model: ModelSpec, method: Method) -> Counter[_Layer]:
    """Every layer as (dense or MoE, whether its input needs a gradient, whether its weights train, whether it
    attends), counted. Under LoRA a gradient flows from the lowest layer that holds an adapter up: a hybrid's
    attention adapters leave the layers below its first attention layer without one."""
    frozen = method.freeze_layers if method.kind == "freeze" else 0
    embedding_trained = method.kind == "full"
    kinds = [
        (model.is_moe_layer(i), model.is_attention_layer(i), model.is_other_mixer_layer(i), model.has_ffn(i))
        for i in range(model.num_layers)
    ]
    if method.adapters:
        adapted = adapted_modules(model, method)
        holds = [any(_in(m, *kind) for m in adapted) for kind in kinds]
        frozen = next((i for i, held in enumerate(holds) if held), model.num_layers)
    layers: Counter[_Layer] = Counter()
    for i, (moe, attends, other, feeds) in enumerate(kinds):
        trained = method.kind == "full" or (method.kind == "freeze" and i >= frozen)
        input_grad = embedding_trained or i > frozen
        layers[_Layer(moe, input_grad, trained, attends, other, feeds)] += 1
    return layers


def _in(module: LinearModule, moe: bool, attends: bool, other: bool, feeds: bool) -> bool:
    """Whether a layer of this kind holds ``module``: its mixers' where it has them, its FFN's where it has one."""
    if not (attends or other if module.group in ("attention", "ssm") else feeds):
        return False
    return in_layer(module, moe) and in_mixer(module, attends, other)


def dora_forward(module: LinearModule, r: int, model: ModelSpec) -> float:
    """DoRA's extra matmuls per forward pass of one layer's copies of ``module`` (PEFT's ``get_lora_weight``): B·A
    built as B(A(I)) from an in × in identity, 2·in·in·r + 2·in·r·out, for the weight norm; detached, so it has
    no backward."""
    copies = module.count / _layers_with(model, module.count_symbol)
    return copies * (2 * module.inputs * module.inputs * r + 2 * module.inputs * r * module.outputs)


def _layers_with(model: ModelSpec, count_symbol: str) -> int:
    """How many layers hold a module counted with ``count_symbol`` (a hybrid's attention or other mixer: its own)."""
    if count_symbol in MIXER_SYMBOLS:
        return model.attention_layers if count_symbol == "L_attn" else model.other_mixer_layers
    if count_symbol == "L":
        return model.num_layers
    if count_symbol in LOCAL_SYMBOLS:  # the average attention layer's share of them (a model without other mixers)
        return model.attention_layers
    return model.dense_ffn_layers if count_symbol == "L_dense" else model.moe_layers


def _per_layer_copies(model: ModelSpec, count_symbol: str, active: float) -> float:
    """Copies of a module one token uses in one layer that has it."""
    return active / _layers_with(model, count_symbol)


@dataclass(frozen=True)
class _MethodStep:
    """What each layer's count reads: the model, the method and the modules it adapts, the tokens of a micro-batch
    (DoRA's per-forward work is shared by them), and the attention core's two products per token."""

    model: ModelSpec
    method: Method
    adapted: frozenset[str]
    tokens: int
    scores: float  # Q·K^T
    values: float  # P·V
    mixer_conv: float = 0.0  # a hybrid's other mixer: its convolution, which has a weight
    mixer_core: float = 0.0  # and the rest of its core (a scan, a delta rule), which has none

    def core(self, attends: bool, other: bool) -> float:
        """A layer's work between its projections: the attention core, a hybrid's other mixer's, or both."""
        return (self.scores + self.values if attends else 0.0) + (self.mixer_conv + self.mixer_core if other else 0.0)


@dataclass
class _LayerFlops:
    """One layer's FLOPs per token, added up module by module in the order the layer runs them."""

    forward: float = 0.0
    input_grads: float = 0.0
    weight_grads: float = 0.0
    attention_backward: float = 0.0
    output_grad: bool = False  # whether the layer's output needs a gradient
    outputs: dict[str, bool] = field(default_factory=dict)  # whether each projection's output needs a gradient


def method_step_flops(
    model: ModelSpec,
    method: Method,
    seq_len: int,
    recompute: Recompute = "none",
    convention: AttnConvention = "full",
    micro_batch: int = 1,
) -> MethodFlops:
    """FLOPs per token of a training step that trains what ``method`` trains (module docstring), in micro-batches
    of ``micro_batch`` sequences (DoRA's per-forward work is shared by a micro-batch's tokens)."""
    (qk_width, v_width), conv = attended_widths(model, seq_len, convention), mixer_conv_flops(model)
    step = _MethodStep(
        model,
        method,
        frozenset(m.name for m in adapted_modules(model, method)),
        seq_len * micro_batch,
        2 * model.num_heads * qk_width * model.attention_calls,
        2 * model.num_heads * v_width * model.attention_calls,
        conv,
        ssm_flops(model, seq_len) - conv,
    )
    forward = input_grads = weight_grads = attention_backward = recomputed = 0.0
    out_grad = False  # whether the last layer's output needs a gradient
    for layer, n in _layers_of(model, method).items():
        flops = _layer_flops(step, layer)
        attention_backward += n * flops.attention_backward
        forward += n * flops.forward
        input_grads += n * flops.input_grads
        weight_grads += n * flops.weight_grads
        if flops.output_grad:
            f = flops.forward
            selective = step.scores + step.values if layer.attends else 0.0
            recomputed += n * (f if recompute == "full" else selective if recompute == "selective" else 0.0)
        out_grad = out_grad or flops.output_grad
    logits = 2 * model.hidden_size * model.vocab_size
    head_trained = method.kind == "full" or (method.kind == "freeze" and not model.tied_embeddings)
    forward += logits
    input_grads += logits if out_grad else 0.0
    weight_grads += logits if head_trained else 0.0
    return MethodFlops(forward, input_grads, weight_grads, attention_backward, recomputed)


def _layer_flops(step: _MethodStep, layer: _Layer) -> _LayerFlops:
    """One layer: its attention half (a hybrid's other mixer in its layers that do not attend), then the core's
    backward, for the operands that need a gradient, then its MLP half, and the core's forward."""
    modules = [
        m
        for m in linear_modules(step.model)
        if m.leaf != "lm_head" and _in(m, layer.moe, layer.attends, layer.other, layer.feeds)
    ]
    flops = _LayerFlops()
    x_grad = layer.input_grad
    for half in ("attention", "mlp"):
        half_modules = [m for m in modules if (m.group in ("attention", "ssm")) == (half == "attention")]
        any_out = _half_flops(step, half_modules, x_grad, layer.trained, flops)
        if half == "attention" and layer.attends:
            q, k, v = (any(flops.outputs.get(leaf, False) for leaf in leaves) for leaves in OPERANDS)
            # each product's backward gives the gradient of each operand that needs one, at its forward's cost
            flops.attention_backward = step.scores * (q + k) + step.values * ((q or k) + v)
        if half == "attention" and layer.other:
            # a hybrid's other mixer: the convolution's input gradient where its input projection's output needs
            # one, its weight's where the layer trains; the core's products, both operands', twice its forward
            separate = bool(step.model.deltanet and step.model.deltanet.separate_projections)  # OLMo's, KDA's q, k, v
            fused = ("qkv",) if step.model.lightning else ()  # MiniMax's lightning attention: q‖k‖v, as attention's
            mixed = any(
                flops.outputs.get(leaf, False) for leaf in MIXER_INPUTS + (("q", "k", "v") if separate else fused)
            )
            flops.input_grads += step.mixer_conv if mixed else 0.0
            flops.weight_grads += step.mixer_conv if layer.trained else 0.0
            flops.attention_backward += 2 * step.mixer_core if mixed else 0.0
        x_grad = x_grad or any_out  # the residual stream after the half
    flops.forward += step.core(layer.attends, layer.other)
    flops.output_grad = x_grad
    return flops


def _half_flops(
    step: _MethodStep, modules: list[LinearModule], x_grad: bool, trained: bool, flops: _LayerFlops
) -> bool:
    """One half of a layer, its attention or its MLP modules, added to ``flops``; whether any of their outputs
    needs a gradient. The half's first projections read its norm's output, which needs a gradient where the
    residual stream does or the norm's weight trains; the projections after them, where what they read does."""
    normed = x_grad or trained  # the half's norm output: a trained norm weight needs its gradient
    inner = normed  # whether what the half's first projections produce needs a gradient
    any_out = False
    for m in modules:
        reads_grad = normed if m.leaf in READS_ATTENTION_INPUT + READS_MLP_INPUT else inner
        m_out = _module_flops(step, m, reads_grad, trained, flops)
        any_out = any_out or m_out
        flops.outputs[m.leaf] = flops.outputs.get(m.leaf, False) or m_out
        if m.leaf not in OUTPUT_PROJECTIONS:
            inner = inner or m_out
    return any_out


def _module_flops(step: _MethodStep, m: LinearModule, reads_grad: bool, trained: bool, flops: _LayerFlops) -> bool:
    """One linear module's matmul, its input gradient where what it reads needs one and its weight gradient where it
    trains, and its adapter's, added to ``flops``; whether its output needs a gradient."""
    mm = 2 * m.inputs * m.outputs * _per_layer_copies(step.model, m.count_symbol, m.active)
    flops.forward += mm
    flops.input_grads += mm if reads_grad else 0.0
    flops.weight_grads += mm if trained else 0.0
    if m.name not in step.adapted:
        return reads_grad or trained
    _adapter_flops(step, m, mm, reads_grad, flops)
    return True


def _adapter_flops(step: _MethodStep, m: LinearModule, mm: float, reads_grad: bool, flops: _LayerFlops) -> None:
    """A module's LoRA adapter B·A: forward, both weight gradients, B's input gradient and A's where the module's
    input needs one; with DoRA, its weight norm's forward and, under dropout, the base product (``mm``) again."""
    r, method = step.method.lora_rank * m.rank_scale, step.method
    copies = _per_layer_copies(step.model, m.count_symbol, m.active)
    a, b = 2 * r * m.inputs * copies, 2 * r * m.outputs * copies
    flops.forward += a + b
    flops.weight_grads += a + b
    flops.input_grads += b + (a if reads_grad else 0.0)
    if method.dora:
        flops.forward += dora_forward(m, r, step.model) / step.tokens
        if method.lora_dropout:  # PEFT recomputes W·dropout(x) for DoRA's base term
            flops.forward += mm
            flops.input_grads += mm if reads_grad else 0.0


def napkin_method_flops(model: ModelSpec, method: Method) -> tuple[float, str]:
    """FLOPs per token by the napkin rule, and its formula, under a fine-tuning method: 6·N (Kaplan et al. 2020)
    for full training; 2·N forward + 2·N input gradients + 6·N_a for LoRA's N_a adapter parameters (forward and
    both gradients); 2·N forward + 4·N_t for the freeze method's N_t trained parameters, no gradient flowing below
    them. N counts the active parameters of an MoE model."""
    n = napkin_params(model)
    trained = trained_params(model, method)
    formula = napkin_method_flops_formula(method)
    if method.adapters:
        return 4 * n + 6 * trained, formula
    if method.kind == "freeze":
        return 2 * n + 4 * trained, formula
    return 6 * n, formula


def napkin_method_flops_formula(method: Method) -> str:
    """The napkin rule's per-token formula under ``method`` (``napkin_method_flops``)."""
    return {"full": "6·N", "freeze": "2·N + 4·N_trained"}.get(method.kind, "4·N + 6·N_adapters")
