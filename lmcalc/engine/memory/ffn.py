"""What a feed-forward keeps for backward: its input, and what its activation keeps, by kind. A two-matrix MLP's
GELU keeps its input (a kernel) or the intermediates of the ops it is written in, and the down projection its
output; ReLU keeps its output, which is the down projection's input too; squared ReLU keeps ReLU's output and the
square. A gated MLP (SwiGLU, GeGLU) keeps the gate's and the up projection's outputs, the activation's output where
the framework runs it unfused, and the product; gpt-oss's clamped SwiGLU, unfused, also the clamped gate, σ(α·g),
g·σ(α·g) and up + 1, and fused (Megatron-Core: the clamps and a concatenation run before the kernel, which keeps the
clamped halves) the halves before the clamps too. ``engine.memory.activations`` places these in a layer, dense or
routed (rows: the layer's tokens, or the experts' routed rows)."""

from __future__ import annotations

from lmcalc.engine.memory.saved import SavedTensor
from lmcalc.engine.model.params import Dim
from lmcalc.engine.model_code import gelu_ops_kept
from lmcalc.engine.workload import Workload

UP = ("gate", "up", "gate_up", "fc")  # the linear layers that read the MLP norm's output
DOWN = ("down", "proj")  # the MLP's output projection


def ffn_saved(w: Workload, rows: Dim, width: Dim, with_input: bool = True) -> list[SavedTensor]:
    """The tensors a feed-forward of ``width`` keeps for ``rows`` rows, with its input unless another reads it."""
    act, h = w.precision.activation_bytes, w.model.hidden_size
    inner = f"{rows.symbol}·{width.symbol}"
    tensors = (
        [SavedTensor("MLP input (norm output)", f"{rows.symbol}·h", rows.size * h, act, split="seq", for_weights=UP)]
        if with_input
        else []
    )
    n = rows.size * width.size
    rule = w.framework.mlp
    gelu = w.model.ffn_kind != "swiglu" and (w.model.ffn_kind == "gelu_mlp" or rule.gated == "unfused")
    ops = gelu_ops_kept(w) if gelu else ()  # a GELU written op by op, where a kernel keeps its input
    if w.model.ffn_kind == "gelu_mlp" and w.model.activation == "relu":  # relu keeps its output: the down input
        return [
            *tensors,
            SavedTensor("down projection input (ReLU output, kept by ReLU too)", inner, n, act, for_weights=DOWN),
        ]
    if w.model.ffn_kind == "gelu_mlp" and w.model.activation == "relu2":  # relu's output, kept by relu and by square
        return [
            *tensors,
            SavedTensor("ReLU output (kept by ReLU and by the square)", inner, n, act),
            SavedTensor("down projection input (the square)", inner, n, act, for_weights=DOWN),
        ]
    if w.model.ffn_kind == "gelu_mlp" and w.model.activation == "xielu":  # Apertus: its where keeps the x > 0 mask
        written = [f"xIELU, op by op: {label}" for label in ops]
        return tensors + [
            *(SavedTensor(label, inner, n, act) for label in written or ["xIELU input"]),
            *([SavedTensor("xIELU, op by op: x > 0 (bool)", inner, n, 1)] if written else []),
            SavedTensor("down projection input (xIELU output)", inner, n, act, for_weights=DOWN),
        ]
    if w.model.ffn_kind == "gelu_mlp":
        labels = [f"GELU, op by op: {label}" for label in ops] or ["GELU input"]
        return tensors + [
            *(SavedTensor(label, inner, n, act) for label in labels),
            SavedTensor("down projection input (GELU output)", inner, n, act, for_weights=DOWN),
        ]
    fn = "SiLU" if w.model.ffn_kind == "swiglu" else "GELU"
    labels = [f"the gate's GELU, op by op: {label}" for label in ops] or [f"gate output ({fn} input)"]
    relu = {
        "relu": ["ReLU(gate) (kept by ReLU and by the product)"],  # relu keeps its output, the product too
        # BitNet's squared ReLU: relu's output, kept by relu and by the square; the square, by the product
        "relu2": ["ReLU(gate) (kept by ReLU and by the square)", "ReLU(gate)² (kept by the product)"],
    }
    labels = relu.get(w.model.activation, labels)
    if w.model.swiglu_limit and rule.gated == "unfused":  # gpt-oss's clamps, (up + 1)·g·σ(α·g), op by op
        return tensors + [
            SavedTensor("gate and up outputs (the clamps' inputs)", f"2·{inner}", 2 * n, act),
            *(SavedTensor(label, inner, n, act) for label in ("clamped gate", "σ(α·gate)", "gate·σ(α·gate)", "up + 1")),
            SavedTensor("down projection input (product)", inner, n, act, for_weights=DOWN),
        ]
    clamped = (  # Megatron-Core's fused path: the clamps before the kernel keep their input, the fc1 output
        [
            SavedTensor(
                "gate and up outputs before the clamps (the clamps' inputs)",
                f"{rows.symbol}·2·{width.symbol}",
                2 * n,
                act,
            )
        ]
        if w.model.swiglu_limit and rule.gated == "fused"
        else []
    )
    if w.model.mlp_fp32 and rule.gated == "unfused" and not ops and w.model.activation not in relu:  # Beam
        return tensors + [
            *(SavedTensor(f"{label} (fp32 copy)", inner, n, 4) for label in [*labels, "up output", f"{fn}(gate)"]),
            SavedTensor("down projection input (product, cast back)", inner, n, act, for_weights=DOWN),
        ]
    return tensors + [
        *clamped,
        *(SavedTensor(label, inner, n, act) for label in labels),
        SavedTensor("up output", inner, n, act),
        *(
            [SavedTensor(f"{fn}(gate)", inner, n, act)]
            if rule.gated == "unfused" and w.model.activation not in relu
            else []
        ),
        SavedTensor("down projection input (product)", inner, n, act, for_weights=DOWN),
    ]
