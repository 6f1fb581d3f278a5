"""Full recomputation, unit by unit: what each chunk of a stage keeps for one micro-batch and the largest unit the
backward rebuilds (``recomputed_chunks``), which kinds of layer a hybrid's rebuilt layer can be (``mixer_kinds``),
and the layers the freeze method leaves keeping nothing (``trained_chunks``). ``engine.memory.gpu_memory`` prices
them on a layout."""

from __future__ import annotations

import functools
from collections.abc import Callable

from lmcalc.engine.memory.blocks import block_kind
from lmcalc.engine.memory.looped import trained_runs
from lmcalc.engine.memory.ssm import MixerKind
from lmcalc.engine.workload import Workload
from lmcalc.specs import ModelSpec


@functools.lru_cache(maxsize=256)
def mixer_kinds(spec: ModelSpec, moe_layer: bool) -> frozenset[MixerKind]:
    """The mixers a hybrid's dense (or MoE) layers have: LFM2-MoE's first, dense layers may all be convolutions;
    where some layers are an FFN alone (Nemotron-H), "none" among them; global and local layers where they differ."""
    if not spec.hybrid and not spec.single_blocks and not spec.local_attention_differs:
        return frozenset()
    return frozenset(block_kind(spec, i) for i in range(spec.num_layers) if spec.is_moe_layer(i) == moe_layer)


@functools.lru_cache(maxsize=256)
def window_kinds(spec: ModelSpec, moe_layer: bool) -> frozenset[MixerKind]:
    """Of a model whose local layers keep more than its global ones under a profile (an explicit window mask): the
    kinds its dense (or MoE) layers have, global or local; none for a hybrid's or single blocks', whose kinds are
    their mixers (``mixer_kinds``)."""
    if spec.hybrid or spec.single_blocks:
        return frozenset()
    return frozenset(
        "local" if spec.is_local_layer(i) else "global"
        for i in range(spec.num_layers)
        if spec.is_moe_layer(i) == moe_layer
    )


def recomputed_chunks(
    w: Workload,
    chunk_flags: tuple[tuple[bool, ...], ...],
    checkpoint: float,
    one_layer: Callable[[bool], float],
    largest: Callable[[bool], float],
) -> tuple[list[float], float]:
    """Under full recomputation, the bytes each chunk of a stage (its layers' MoE flags, ``chunk_flags``) keeps for
    one micro-batch, and the largest unit the backward rebuilds (Megatron-Core's megatron/core/recompute.py):
    ``uniform`` keeps the input of every unit of ``recompute_num_layers`` layers and rebuilds a whole unit at once;
    ``block`` keeps only the input of the first ``recompute_num_layers`` layers of each chunk, rebuilt one at a time,
    and everything of the chunk's other layers. A unit of several layers is taken at the average layer; a single one
    as ``largest`` says (a hybrid's larger mixer). The layers counted are the model code's (``ModelSpec.sublayers``
    of lmcalc's each: LongCat-Flash's two), which a checkpoint keeps and rebuilds whole."""
    unit = w.model.sublayers
    n, kept, rebuilt = w.recompute_num_layers * unit, [], 0.0
    dense, moe = one_layer(False), (one_layer(True) if w.model.moe else 0.0)

    def layers_bytes(flags: tuple[bool, ...]) -> float:
        routed = sum(flags)
        return (len(flags) - routed) * dense + routed * moe

    for flags in _trained_flags(w, chunk_flags):
        block = w.recompute_method == "block"
        recomputed = flags[:n] if block else flags
        if block:
            kept.append(-(-len(recomputed) // unit) * checkpoint + layers_bytes(flags[n:]))
        else:
            kept.append(-(-len(flags) // n) * checkpoint)  # ⌈layers / N⌉ units
        step = unit if block else n  # the layers rebuilt at once
        if step == 1:  # one layer rebuilt at a time: the larger kind among those recomputed
            if recomputed:
                rebuilt = max(rebuilt, largest(True) if any(recomputed) else 0.0)
                rebuilt = max(rebuilt, largest(False) if not all(recomputed) else 0.0)
        else:
            units = (recomputed[i : i + step] for i in range(0, len(recomputed), step))
            rebuilt = max(rebuilt, *(layers_bytes(unit_flags) for unit_flags in units), 0.0)
    return kept, rebuilt


def _trained_flags(w: Workload, chunks: tuple[tuple[bool, ...], ...]) -> tuple[tuple[bool, ...], ...]:
    """``trained_chunks`` in the model's order: under the freeze method, the frozen bottom layers dropped; a looped
    model's runs without gradients dropped (one stage: ``layout_checks.check_layout``)."""
    if w.model.layer_reuse and w.model.layer_reuse.no_grad_runs:
        return (tuple(flag for flag, trained in zip(chunks[0], trained_runs(w.model), strict=True) if trained),)
    if w.method.kind != "freeze":
        return chunks
    return (chunks[0][w.method.freeze_layers :],)


def trained_chunks(w: Workload, chunks: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int], ...]:
    """The (dense, MoE) layers of each chunk that keep activations: all of them, but under the freeze method (one
    stage, ``layout_checks.check_layout``) the frozen bottom layers, which no gradient reaches, keep nothing, and so
    do a looped model's runs without gradients (HRM's early low-level cycles, run under torch.no_grad; one stage)."""
    if w.model.layer_reuse and w.model.layer_reuse.no_grad_runs:
        runs = [i for i, trained in enumerate(trained_runs(w.model)) if trained]
        moe = sum(w.model.is_moe_layer(i) for i in runs)
        return ((len(runs) - moe, moe),)
    if w.method.kind != "freeze":
        return chunks
    (dense, moe), frozen = chunks[0], w.method.freeze_layers
    return ((max(0, dense - frozen), moe - max(0, frozen - dense)),)
