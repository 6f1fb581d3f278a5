"""Layers that are a mixer or an FFN alone, behind one norm (Nemotron-H's blocks: NemotronHBlock holds one norm and
one of Mamba-2, attention, an MLP or an MoE): which half of the average layer each keeps, and at what share.

The average layer keeps its mixer half (the norm before it, the mixer, what comes after it) at the share M/L of the
layers that have a mixer, and its FFN half in an MoE layer whole (every MoE layer has an FFN) and in the other L −
L_moe layers at the share of dense FFNs among them, L_dense/(L − L_moe). Summed over the layers this is exact: M
mixer halves, L_moe MoE halves and L_dense dense ones. One real layer (``MixerKind``: the larger layer the backward
rebuilds) keeps its mixer half alone, or its FFN half alone (kind "none")."""

from __future__ import annotations

from lmcalc.engine.finetune.method import LinearModule, in_mixer
from lmcalc.engine.memory.saved import SavedTensor
from lmcalc.engine.memory.ssm import KINDS, MixerKind, share
from lmcalc.engine.model.params import LOCAL_SYMBOLS, MIXER_SYMBOLS
from lmcalc.specs import ModelSpec

KIND_SYMBOLS = (*LOCAL_SYMBOLS, "L_local,kv", "L_global,kv")
"""A global or a local layer's own modules: every attention module's where the kinds' widths differ (Gemma 4's
``engine.model.width_params``), the K and V projections' counted over the layers that make their own."""
SHARING_SYMBOLS = ("(L−n_s)", "n_s")
"""Gemma 4's MLPs, of the layers that make their own K and V and of those that reuse them (double-wide there)."""


def mixer_share(spec: ModelSpec, kind: MixerKind) -> tuple[int, int]:
    """The share (n of every m layers) of the average layer's mixer half (``kind`` average) or of one real layer's."""
    if not spec.single_blocks or kind in ("attention", "other"):
        return 1, 1
    return (0, 1) if kind == "none" else (spec.mixer_layers, spec.num_layers)


def ffn_share(spec: ModelSpec, moe_layer: bool, kind: MixerKind) -> tuple[int, int]:
    """The share (n of every m layers) of the FFN half of the average dense or MoE layer (``kind`` average) or of
    one real layer of ``kind``: a layer with a mixer has its FFN where some layer of that kind has one."""
    if not spec.single_blocks or kind == "none" or moe_layer and kind == "average":
        return 1, 1
    if kind != "average":
        return int(any(_has(spec, i, kind) and spec.has_ffn(i) for i in range(spec.num_layers))), 1
    return spec.dense_ffn_layers, spec.num_layers - spec.moe_layers


def mixer_half(spec: ModelSpec, tensors: list[SavedTensor], kind: MixerKind) -> list[SavedTensor]:
    """The mixer half of the average layer (``kind`` average) or of one real layer of ``kind``."""
    return _at(tensors, *mixer_share(spec, kind))


def ffn_half(spec: ModelSpec, tensors: list[SavedTensor], moe_layer: bool, kind: MixerKind) -> list[SavedTensor]:
    """The FFN half of the average dense or MoE layer (``kind`` average) or of one real layer of ``kind``."""
    return _at(tensors, *ffn_share(spec, moe_layer, kind))


def _at(tensors: list[SavedTensor], n: int, of: int) -> list[SavedTensor]:
    if n == of:
        return tensors
    return [share(t, n, of) for t in tensors] if n else []


def module_share(spec: ModelSpec, module: LinearModule, mixer: MixerKind) -> float:
    """Of a layer, the copies of ``module`` it holds: a hybrid's attention's in A of its L layers and its other
    mixer's in the rest (the average layer), or all or none in a layer of one ``mixer``; an FFN's module at its half's
    share (``ffn_share``: less than 1 where some layers are a mixer alone); 1 for any other."""
    if module.count_symbol in SHARING_SYMBOLS:  # Gemma 4's MLPs: twice as wide where a layer reuses K and V
        if mixer in KINDS:
            return float((module.count_symbol == "n_s") == mixer.endswith("_shared"))
        return module.count / spec.num_layers
    if module.group in ("shared_attention", "shared_mlp") and spec.shared_block:  # run by the G uses
        return {"average": spec.shared_block.uses / spec.num_layers, "shared": 1.0}.get(mixer, 0.0)
    if module.group not in ("attention", "ssm"):
        n, of = ffn_share(spec, module.count_symbol.startswith("L_moe"), mixer)
        return n / of
    if module.count_symbol in KIND_SYMBOLS:  # the global or the local layers' own (MiMo-V2-Flash's K and V, Gemma 4's)
        if mixer in KINDS:  # a layer of one kind; one reusing K and V holds no K or V projection
            kind, own_kv = module.count_symbol.split(",")[0], module.count_symbol.endswith(",kv")
            return float(kind == f"L_{mixer.removesuffix('_shared')}" and not (own_kv and mixer.endswith("_shared")))
        return module.count / spec.attention_layers
    if module.count_symbol not in MIXER_SYMBOLS:
        return 1.0
    if mixer == "average":
        return module.count / spec.num_layers
    return 1.0 if mixer != "none" and in_mixer(module, mixer == "attention") else 0.0


def _has(spec: ModelSpec, layer: int, kind: MixerKind) -> bool:
    return block_kind(spec, layer) == kind


def block_kind(spec: ModelSpec, layer: int) -> MixerKind:
    """The kind of real layer ``layer`` is, for a model with single blocks or a hybrid: one that attends, one of its
    other mixer, one that runs both (the average layer of a hybrid whose mixers run side by side), or an FFN alone;
    for a model whose local layers attend with heads or sinks of their own, a global or a local one."""
    if spec.local_attention_differs:
        if spec.reuses_kv(layer):  # Gemma 4's last layers, attending with earlier layers' K and V
            return "local_shared" if spec.is_local_layer(layer) else "global_shared"
        return "local" if spec.is_local_layer(layer) else "global"
    if not spec.has_mixer(layer):
        return "none"
    if spec.shared_block and layer in spec.shared_block.layer_ids:  # Zamba's: a shared block's use, then Mamba
        return "shared"
    if spec.is_attention_layer(layer) and spec.is_other_mixer_layer(layer):  # Falcon-H1's: both, side by side
        return "average"
    return "attention" if spec.is_attention_layer(layer) else "other"
