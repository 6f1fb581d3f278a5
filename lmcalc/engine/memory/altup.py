"""What Gemma 3n's alternating updates keep for backward (Baykal et al. 2023, AltUp; ``AltUpSpec``), as
transformers 5.24 runs them (modeling_gemma3n.py: Gemma3nTextAltUp, Gemma3nTextLaurelBlock, Gemma3nTextMLP,
Gemma3nTextModel). The hidden state is n streams of h: a layer's input and a checkpoint's are n·s·b·h.

In each layer, the router runs twice, on the active stream before the layer (predict) and on the layer's output
(correct): each time its norm (an fp32 copy, two statistics, the normalised value), its scaled input (s·b·h), the
tanh of its n outputs (in fp32) and the coefficients' input (s·b·n). The prediction mixes the n streams by an n × n
matrix a token, a batched product that keeps both (n·s·b·h and s·b·n²); the correction multiplies the layer's
innovation, repeated over the streams, by a coefficient each (n·s·b·h and n·s·b); the active stream's output scale
keeps the stream (s·b·h). LAuReL keeps its up-projection's input (s·b·r) and its norm's. The first layers' MLPs
(``sparse_layers``: activation_sparsity_pattern) cut the gate at a Gaussian quantile: the gate's output before the
cut (s·b·f) and its standard deviation (s·b) are kept beside the ReLU's output, which GELU reads."""

from __future__ import annotations

from lmcalc.engine.memory.adapters import adapter_bytes, adapter_copies
from lmcalc.engine.memory.blocks import block_kind
from lmcalc.engine.memory.norms import norm_saved
from lmcalc.engine.memory.saved import SavedTensor
from lmcalc.engine.memory.ssm import KINDS, MixerKind
from lmcalc.engine.model.params import Dim
from lmcalc.engine.workload import Workload
from lmcalc.specs import ModelSpec

ALTUP_PREDICTION = ("AltUp router norm (predict)", "AltUp router input (predict", "AltUp router tanh (predict",
                    "AltUp prediction_coefs input", "AltUp streams", "AltUp prediction coefficients")  # fmt: skip
"""The labels of what the prediction keeps: nothing in the lowest layer under LoRA, whose input needs no gradient."""


def altup_saved(w: Workload, mixer: MixerKind = "average") -> list[SavedTensor]:
    """One layer's AltUp and LAuReL tensors, and its sparse MLP's: in the average layer at the share of the layers
    that have one, in a layer of one kind (``mixer``) whole where a layer of that kind has one (the largest of the
    kind, which a rebuilt layer is). Under full recomputation the streams the prediction mixes are the layer's input,
    kept by the checkpoint."""
    a = w.model.altup
    if a is None:
        return []
    act, sb, h, n = w.precision.activation_bytes, w.tokens, w.model.hidden_size, a.streams
    rows, width = Dim(sb, "s·b"), Dim(h, "h")
    tensors: list[SavedTensor] = []
    for step, coefs in (("predict", "prediction_coefs"), ("correct", "correction_coefs")):
        tensors += norm_saved(w, f"AltUp router norm ({step})", rows, width)
        tensors += [
            SavedTensor(f"AltUp router input ({step}, scaled)", "s·b·h", sb * h, act, split="seq",
                        for_weights=("router",)),
            SavedTensor(f"AltUp router tanh ({step}, fp32)", "s·b·n", sb * n, 4, split="none"),
            SavedTensor(f"AltUp {coefs} input ({step})", "s·b·n", sb * n, act, split="none", for_weights=(coefs,)),
        ]  # fmt: skip
    if w.recompute != "full":
        tensors.append(SavedTensor("AltUp streams (the layer's input), the prediction's product input", "n·s·b·h",
                                   n * sb * h, act, split="seq"))  # fmt: skip
    tensors += [
        SavedTensor("AltUp prediction coefficients", "s·b·n²", sb * n * n, act, split="none"),
        SavedTensor("AltUp innovation, repeated over the streams", "n·s·b·h", n * sb * h, act, split="seq"),
        SavedTensor("AltUp correction coefficients", "n·s·b", n * sb, act, split="none"),
        SavedTensor(
            "AltUp active stream (the output scale's product)",
            "s·b·h",
            sb * h,
            act,
            split="seq",
            for_weights=("output_scale",),
        ),
    ]
    if a.laurel_rank:
        r = a.laurel_rank
        tensors.append(SavedTensor("LAuReL up-projection input", "s·b·r_L", sb * r, act, split="none",
                                   for_weights=("right",)))  # fmt: skip
        tensors += norm_saved(w, "LAuReL norm", rows, width)
    if a.sparse_layers:  # the Gaussian top-k of the first layers' gates, at their share of the layers
        share, f = a.sparse_layers / w.model.num_layers, w.model.ffn_size
        if mixer in KINDS:
            share = float(any(_kind(w.model, i) == mixer for i in range(a.sparse_layers)))
        tensors += [
            SavedTensor("sparse gate: its output before the cut (the std's input)", f"{share:.4g}·s·b·f",
                        share * sb * f, act, split="tp", block="mlp"),
            SavedTensor("sparse gate: its standard deviation", f"{share:.4g}·s·b", share * sb, act, split="none",
                        block="mlp"),
        ]  # fmt: skip
    return tensors


def _kind(spec: ModelSpec, layer: int) -> MixerKind:
    """The kind of layer ``layer`` is, as a layer of one kind is asked for: global or local (reusing K and V apart)."""
    if spec.local_attention_differs:
        return block_kind(spec, layer)
    return "local" if spec.is_local_layer(layer) else "global"


def altup_outside(w: Workload, embedding_counted: bool, adapted: frozenset[str] = frozenset()) -> list[SavedTensor]:
    """Before and after the layers (Gemma3nTextModel): the n − 1 projections making the other streams from the
    embedding and those unmaking them before the final norm, each rescaled to the first stream's magnitude, keep their
    output and its rescaled copy (2·s·b·h) and the new magnitude's clamp and root (2·s·b); the first stream's
    magnitude is kept once a side (s·b); the embedding's output, which the first projections and its magnitude read
    (``embedding_counted``: where the per-layer inputs' projection keeps it already), and the last layer's n streams,
    which the unmaking projections and the magnitude read. Under a fine-tuning method the making side keeps nothing
    (the frozen embedding's output needs no gradient) unless its projections are adapted, and each projection adapted
    (``adapted``) keeps what an adapter keeps: A·x, and its input copy and dropout mask where it makes them."""
    a = w.model.altup
    if a is None:
        return []
    act, sb, h, n = w.precision.activation_bytes, w.tokens, w.model.hidden_size, a.streams
    # full recomputation: enable_input_require_grads makes the embedding's output need a gradient (the lowest layer's)
    frozen = w.method.kind != "full" and w.recompute != "full" and "stream_projections" not in adapted
    tensors = [] if embedding_counted or frozen else [
        SavedTensor("embedding output (the streams' source)", "s·b·h", sb * h, act, split="seq")
    ]  # fmt: skip
    if "stream_projections" in adapted:
        tensors += _projection_adapters(w, a.streams - 1)
    for side in ("unmaking",) if frozen else ("making", "unmaking"):
        tensors += [
            SavedTensor(f"AltUp {side} projections' outputs and their rescaled copies", "2·(n−1)·s·b·h",
                        2 * (n - 1) * sb * h, act, split="seq"),
            SavedTensor(f"AltUp {side} projections' magnitudes (clamp, root) and the first stream's",
                        "(2·(n−1)+1)·s·b", (2 * (n - 1) + 1) * sb, act, split="none"),
        ]  # fmt: skip
    tensors.append(SavedTensor("the last layer's streams (the unmaking projections' input)", "n·s·b·h", n * sb * h,
                               act, split="seq"))  # fmt: skip
    return tensors


def _projection_adapters(w: Workload, projections: int) -> list[SavedTensor]:
    """The LoRA adapters of the 2·(n − 1) stream projections: A·x each (s·b·r); where an adapter copies its input
    (``adapter_copies``), that copy (s·b·h), and with lora_dropout its mask, on the unmaking side always and on the
    making side where the embedding's output needs a gradient (full recomputation: enable_input_require_grads)."""
    sb, h, r, adapter = w.tokens, w.model.hidden_size, w.method.lora_rank, adapter_bytes(w)
    label = "AltUp stream projections' adapters"
    tensors = [SavedTensor(f"{label}: A·x", "2·(n−1)·s·b·r", 2 * projections * sb * r, adapter, split="none")]
    if adapter_copies(w):
        tensors.append(SavedTensor(f"{label}: input copies", "2·(n−1)·s·b·h", 2 * projections * sb * h, adapter,
                                   split="seq"))  # fmt: skip
        if w.method.lora_dropout > 0:
            sides = 2 if w.recompute == "full" else 1
            tensors.append(SavedTensor(f"{label}: dropout masks", f"{sides}·(n−1)·s·b·h", sides * projections * sb * h,
                                       w.mask_bytes, split="seq"))  # fmt: skip
    return tensors
