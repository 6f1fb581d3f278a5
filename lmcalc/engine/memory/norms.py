"""What a norm keeps for backward, as the framework profile's rule and the model's code say (``norm_keeps``): its
input or an fp32 copy of it, its per-row statistics, and the normalised value its weight's multiply needs; and
BitNet's sub-norms, which put a norm between a projection and what it read."""

from __future__ import annotations

from dataclasses import replace

from lmcalc.engine.memory.saved import SavedTensor
from lmcalc.engine.model.params import Dim
from lmcalc.engine.model_code import norm_keeps
from lmcalc.engine.workload import Workload
from lmcalc.specs import ModelSpec

STAT_BYTES = 4  # norm statistics (mean, 1/std, 1/rms) are kept in fp32
NORM = ("norm",)  # a norm's weight


def norm_saved(w: Workload, label: str, rows: Dim, width: Dim, split: str = "seq") -> list[SavedTensor]:
    """A norm keeps its input and its per-row statistics (LayerNorm: mean and 1/std; RMSNorm: 1/rms). Written
    unfused with an upcast (the framework profile's ``norm`` rule, ``NormKeeps``), it keeps an fp32 copy of its
    input instead, and the normalised value the weight's multiply needs: in the activation dtype where the cast
    comes first (``fp32_input``), in fp32 where the multiply does (``fp32_normalised``). Hugging Face's
    CohereLayerNorm (``fp32_centred``) keeps no copy of its input but the centred input twice, made once for the
    variance and once for the product with 1/std, and no mean."""
    act, symbol, n = w.precision.activation_bytes, f"{rows.symbol}·{width.symbol}", rows.size * width.size
    keeps = norm_keeps(w)
    if keeps == "input":
        return [SavedTensor(f"{label} input", symbol, n, act, split=split), *norm_stats(w.model, label, rows, split)]
    if keeps == "fp32_centred":
        return [
            *(
                SavedTensor(f"{label} centred input x − mean (fp32, {use})", symbol, n, 4, split=split)
                for use in ("for the variance", "for the product")
            ),
            SavedTensor(f"{label} 1/std (fp32)", rows.symbol, rows.size, STAT_BYTES, split=split),
            SavedTensor(f"{label} normalised value (fp32, before the weight)", symbol, n, 4, split=split,
                        for_weights=NORM),
        ]  # fmt: skip
    if keeps == "fp32_normalised":
        normalised = SavedTensor(f"{label} normalised value (fp32, before the weight)", symbol, n, 4, split=split,
                                 for_weights=NORM)  # fmt: skip
    else:
        normalised = SavedTensor(f"{label} normalised value (before the weight)", symbol, n, act, split=split,
                                 for_weights=NORM)  # fmt: skip
    return [
        SavedTensor(f"{label} input (fp32 copy)", symbol, n, 4, split=split),
        *norm_stats(w.model, label, rows, split, written=True),
        *([normalised] if w.model.norm_weight else []),  # without a weight, no multiply keeps it
    ]


def norm_stats(spec: ModelSpec, label: str, rows: Dim, split: str = "seq", written: bool = False
               ) -> list[SavedTensor]:  # fmt: skip
    """One fp32 value per row for each statistic the norm keeps: LayerNorm's mean and 1/std, RMSNorm's 1/rms; an
    RMSNorm ``written`` as the model's code (not one kernel) that takes 1/rms with torch.pow (``norm_rms_pow``)
    keeps the power's input too, mean(x²) + ε."""
    names = ("1/rms",) if spec.norm_kind == "rmsnorm" else ("mean", "1/std")
    if spec.norm_kind == "rmsnorm" and written and spec.norm_rms_pow:
        names = ("mean(x²) + ε", "1/rms")
    return [SavedTensor(f"{label} {name} (fp32)", rows.symbol, rows.size, STAT_BYTES, split=split) for name in names]


def sub_normed(w: Workload, tensors: list[SavedTensor], reads: tuple[str, ...], width: Dim, projection: str
                ) -> list[SavedTensor]:  # fmt: skip
    """BitNet's sub-norm before a projection (BitNetAttention's attn_sub_norm, BitNetMLP's ffn_sub_norm): the
    projection keeps the norm's output, and the norm keeps what a norm keeps of the tensor the projection read
    before. Where a fused attention kernel keeps that tensor as its output, it stays, and the norm's input is it."""
    rows, out = Dim(w.tokens, "s·b"), []
    for t in tensors:
        if t.for_weights != reads and t.label != "attention output = output projection input":
            out.append(t)
            continue
        norm = norm_saved(w, f"{projection} projection's sub-norm", rows, width, "tp")
        if t.for_weights != reads:  # the kernel's output, which the norm reads
            out += [replace(t, label="attention output (kept by the kernel)")]
            norm = [n for n in norm if not n.label.endswith(" input")]
        label = f"{projection} projection input (the sub-norm's output)"
        act = w.precision.activation_bytes
        out += [*norm, SavedTensor(label, t.symbol, t.elements, act, split=t.split, block=t.block, for_weights=reads)]
    return out


def norm_gate_saved(w: Workload, label: str) -> list[SavedTensor]:
    """A gated norm's gate (``ModelSpec.gated_norm_rank``: A.X K2's AXK2GatedRMSNorm, y·σ(W₂·SiLU(W₁·y)) with the
    sigmoid and the product in fp32, then cast back): the norm's output, which W₁ and the product read, W₁'s output
    for the SiLU, the SiLU's output for W₂, and the sigmoid's fp32 output for the product. The gated output, cast
    back, is what the next projection keeps."""
    act, sb, h, r = w.precision.activation_bytes, w.tokens, w.model.hidden_size, w.model.gated_norm_rank or 0
    return [
        SavedTensor(f"{label} output (the gate's input)", "s·b·h", sb * h, act, split="seq"),
        SavedTensor(f"{label} gate: W₁ output (SiLU input)", "s·b·r_g", sb * r, act, split="seq"),
        SavedTensor(f"{label} gate: SiLU output (W₂ input)", "s·b·r_g", sb * r, act, split="seq"),
        SavedTensor(f"{label} gate: sigmoid output (fp32)", "s·b·h", sb * h, 4, split="seq"),
    ]
