"""What the model's own code keeps for backward, where the spec names how it is written: its norms (``norm_keeps``,
by the framework profile's rule), its GELU, and whether its attention's output is laid out for a copy
(``output_renewed``). Memory counts these tensors and time counts their kernels' bytes, so
they live below both.

What a GELU keeps for backward, as the model's code calls it (the model spec's ``gelu``, named as Hugging Face's
``hidden_act``; transformers 5.24, transformers/activations.py ACT2FN).

A GELU kernel keeps its input and nothing else (its output is kept by the operation that reads it: the down
projection, or a GeGLU's product). A GELU written op by op keeps what each of its operations needs for its own
gradient: a multiply by a Python number keeps nothing, a multiply of two tensors keeps both, ``pow`` and ``erf``
their input, ``tanh`` its output. tests/test_model_code.py runs each one under saved-tensor hooks.
"""

from __future__ import annotations

from lmcalc.engine.workload import Workload
from lmcalc.framework_specs import NormKeeps
from lmcalc.specs import ActivationKind

OPS_KEPT: dict[ActivationKind, tuple[str, ...]] = {
    "gelu": (),  # torch.nn.functional.gelu
    "gelu_pytorch_tanh": (),  # torch.nn.functional.gelu(approximate="tanh")
    "bloom_gelu": (),  # modeling_bloom.py GeLUFunction: an autograd.Function that saves its input
    # NewGELUActivation: 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))
    "gelu_new": ("x (kept by pow)", "tanh output", "0.5·x", "1 + tanh"),
    # FastGELUActivation: 0.5·x·(1 + tanh(x·0.7978845608·(1 + 0.044715·x·x)))
    "gelu_fast": ("x", "0.044715·x", "0.7978845608·x", "1 + 0.044715·x²", "tanh output", "0.5·x", "1 + tanh"),
    # GELUActivation(use_gelu_python=True): x·0.5·(1 + erf(x/√2)); x itself is not kept
    "gelu_python": ("x/√2 (erf's input)", "0.5·x", "1 + erf"),
    "relu": (),  # torch.relu: its output, which the down projection keeps as its input (memory.ffn.ffn_saved)
    "relu2": (),  # ReLUSquaredActivation: relu's output, kept by relu and by square, then the square
    # XIELUActivation's Python form: where(x > 0, αp·x·x + β·x, (expm1(min(x, ε)) − x)·αn + β·x)
    "xielu": ("x (kept by min and by the products)", "αp·x", "expm1 output", "expm1(min(x, ε)) − x"),
}
"""The f-wide tensors each GELU written op by op keeps, its output aside; () for a kernel."""


def gelu_ops_kept(w: Workload) -> tuple[str, ...]:
    """What the model's GELU keeps, its output aside, where it runs op by op (the framework profile's ``mlp.gelu``
    is ``model`` and the model's code writes it so); () where it is one kernel, which keeps its input."""
    return OPS_KEPT[w.model.activation] if w.framework.mlp.gelu == "model" else ()


def eager_softmax(w: Workload) -> str:
    """The dtype eager attention's softmax runs in under the workload's framework profile: the profile's rule, or
    under the rule ``model`` the model's code's (the spec's ``eager_softmax``)."""
    rule = w.framework.attention.eager_softmax
    return w.model.eager_softmax if rule == "model" else rule


def norm_keeps(w: Workload) -> NormKeeps:
    """What the model's norms keep under the workload's framework profile (``NormKeeps``): the rule for its kind of
    norm, a LayerNorm without a bias taking the LayerNorm's rule unless the profile gives it its own, and an RMSNorm
    under the rule ``model`` as the model's code is written (the spec's ``norm_weight_fp32``). A norm without a weight
    (the spec's ``norm_weight``) keeps its fp32 copy of the input where the model's code runs (rule ``model``), else
    its input."""
    rule = w.framework.norm
    if not w.model.norm_weight:  # no weight: the model's code upcasts and normalises (OLMo, nanochat), a kernel doesn't
        return "fp32_input" if rule.rmsnorm == "model" else "input"
    if w.model.norm_kind == "rmsnorm":
        if rule.rmsnorm != "model":
            return rule.rmsnorm
        return "fp32_normalised" if w.model.norm_weight_fp32 else "fp32_input"  # upcast, the weight as the code does
    nobias = rule.layernorm_nobias if w.model.norm_kind == "layernorm_nobias" else None
    if nobias == "model":  # Cohere's own, upcast, or torch's kernel
        return "fp32_centred" if w.model.norm_weight_fp32 else "input"
    return nobias or rule.layernorm


def fused_qkv_renewed(w: Workload) -> bool:
    """Whether Q and K are sliced from a fused QKV output and then made anew (by RoPE or a QK-norm), where the
    profile's ``attention.fused_qkv_view`` says the slices are views: V then keeps the whole fused output alive,
    and the new Q, made from a strided slice, is laid out (b, H, s, d), so a fused kernel's output is too and the
    output projection reads a copy of it (transpose(1, 2).contiguous())."""
    spec = w.model
    renewed = spec.position_embedding == "rope" or spec.qk_norm != "none"
    return w.framework.attention.fused_qkv_view and "qkv" in spec.fused_linears and renewed and not spec.mla


def output_renewed(w: Workload) -> bool:
    """Whether a fused kernel's output is laid out (b, H, s, d), so that the output projection reads a copy of it: Q
    made anew from a fused QKV slice (``fused_qkv_renewed``), or concatenated from its rotated and passed parts
    where RoPE rotates part of each head, MLA's d_rope of d_qk too (the profile's ``attention.partial_rotary_cat``;
    transformers' apply_rotary_pos_emb), or always (``rotary_concat``: MiniMax-M3's)."""
    spec = w.model
    rope = spec.position_embedding == "rope"
    partial = spec.mla is not None or (spec.rotary_fraction < 1 or spec.rotary_concat) and rope
    return fused_qkv_renewed(w) or (w.framework.attention.partial_rotary_cat and partial)
