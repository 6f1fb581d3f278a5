"""What Inkling 2's looped model keeps beyond its layers (transformers 5.24's Inkling2LoopTextModel,
Inkling2LoopMessageAttentionResidual, Inkling2LoopMessageGate, Inkling2LoopSlidingLoopDecoderLayer and
Inkling2LoopFullLoopDecoderLayer): each pass of the looped section after the first restarts from the section's input
and the blocks before it, and each of its runs reads the previous pass's messages.

A looped layer's run is one of three: the first pass's, which casts its input norm's output three times (Q's, K's and
V's inputs, each its own ``.to``; one tensor in fp32, where the cast is the tensor itself), a later pass's, which
mixes four messages into Q's, K's, V's and the MLP's inputs through four gates, or a layer outside the section. A
gate (``(1 − tanh(F·g))·x + tanh(M·g)·m`` with g = D·[norm(x), norm(m)]) keeps in fp32 the two 1/rms of its weightless
norms, the forget gate's tanh, 1 − it and the message gate's tanh (3·4·s·b·h), D's input (the normalised pair, cast,
2·h) and g (fp32, r: F's and M's input), beside the x and m it reads. A later pass's local layer norms each gated
input (three norms where the first pass has one), its global layer's three norms read gated inputs too: the block
residual's output (x) stays kept by the gates, beside the gates' outputs the norms keep. The messages themselves
(4·s·b·4·h fp32 a later run: one storage, its four views read by the gates) are made outside the layers, by the
message residual (``message_states``), and kept whether or not the layers are checkpointed: by the gates, or by the
checkpoint of the layer they are passed to."""

from __future__ import annotations

from lmcalc.engine.memory.saved import SavedTensor
from lmcalc.engine.workload import Workload
from lmcalc.specs import ModelSpec

FP32 = 4
Variant = str  # "plain", "first" (a looped layer's first pass) or "later" (a pass that reads messages)


def looped(spec: ModelSpec) -> bool:
    """Whether the model is Inkling 2's looped model (its looped section passes messages)."""
    return spec.layer_reuse is not None and spec.layer_reuse.messages is not None


def run_variants(spec: ModelSpec) -> list[Variant]:
    """Of each run, in order: a plain layer's, a looped layer's first pass or a later one (``repeats``)."""
    reuse = spec.layer_reuse
    if reuse is None or reuse.messages is None:
        return ["plain"] * spec.num_layers
    repeats, runs = set(reuse.repeats), [reuse.weights.count(layer) for layer in reuse.weights]
    return ["later" if run in repeats else "first" if runs[run] > 1 else "plain" for run in range(spec.num_layers)]


def message_states(spec: ModelSpec) -> int:
    """The states each message residual reads: the previous pass's blocks but the one its first layer opens (the
    section's input, already among the blocks before it), and that pass's output."""
    reuse, branch = spec.layer_reuse, spec.branch_convs
    assert reuse is not None and branch is not None and branch.block_residual
    looped_layers = [layer for layer in set(reuse.weights) if reuse.weights.count(layer) > 1]
    start, end, n = min(looped_layers), max(looped_layers) + 1, branch.block_residual
    return max(0, -(-end // n) - -(-start // n) - 1) + 1


def gates_saved(w: Workload, kind: str | None) -> list[SavedTensor]:
    """What a later pass's run keeps for its four message gates, and beyond the first pass's norms: the gates' inputs
    (the block residual's outputs, which the first pass's norms kept; the norms now keep the gates' outputs in their
    place) and the MLP gate's output, which the MLP norm now reads in place of its input."""
    act, sb, h = w.precision.activation_bytes, w.tokens, w.model.hidden_size
    reuse = w.model.layer_reuse
    assert reuse is not None and reuse.messages is not None
    r = reuse.messages.gate_rank
    tensors = [
        SavedTensor("message gates: forget tanh, 1 − it, message tanh (fp32)", "4·3·s·b·h", 12 * sb * h, FP32,
                    split="seq"),
        SavedTensor("message gates: the two norms' 1/rms (fp32)", "4·2·s·b", 8 * sb, FP32, split="seq"),
        SavedTensor("message gates: down's input (the normalised pair, cast)", "4·s·b·2h", 8 * sb * h, act,
                    split="seq", for_weights=("gate_down",)),
        SavedTensor("message gates: down's output (fp32, the forget and message gates' input)", "4·s·b·r", 4 * sb * r,
                    FP32, split="seq", for_weights=("forget_gate", "message_gate")),
        SavedTensor("MLP message gate's output (the MLP norm's input; its input kept by the gate)", "s·b·h", sb * h,
                    FP32, split="seq", block="mlp"),
    ]  # fmt: skip
    if kind == "local":
        tensors.append(SavedTensor("Q, K and V gates' input (the block residual's output)", "s·b·h", sb * h, FP32,
                                   split="seq"))  # fmt: skip
    else:  # the norms read the gates' outputs, the gates the block residual's three
        tensors.append(SavedTensor("Q, K and V gates' inputs (the block residual's three outputs)", "3·s·b·h",
                                   3 * sb * h, FP32, split="seq"))  # fmt: skip
    return tensors


def block_storages(spec: ModelSpec, upto: int | None = None) -> int:
    """The blocks' states the checkpoints hold, in states of s·b·h: each stack of blocks a run reads is one storage
    (``torch.cat`` makes a new one after a layer that opens a block), each later pass making its own from the stack
    before the section, which it restarts from. With ``upto``, the stacks the runs up to that one read."""
    branch = spec.branch_convs
    assert branch is not None and branch.block_residual
    weights = spec.layer_reuse.weights if spec.layer_reuse else tuple(range(spec.num_layers))
    variants = run_variants(spec)
    start = min((layer for layer, v in zip(weights, variants, strict=True) if v != "plain"), default=-1)
    seen: set[int] = set()
    storage, size, total, at_start = 0, 0, 0, (0, 0)
    for run, layer in enumerate(weights[: None if upto is None else upto + 1]):
        if layer == start and variants[run] == "first":
            at_start = (storage, size)
        elif layer == start:
            storage, size = at_start
        if size and storage not in seen:
            seen.add(storage)
            total += size
        if layer % branch.block_residual == 0:
            storage, size = run + 1, size + 1
    return total


def message_counts(spec: ModelSpec) -> tuple[int, int]:
    """The later runs (each reading messages) and the states each of their message residuals reads."""
    if not looped(spec):
        return 0, 0
    assert spec.layer_reuse is not None
    return len(spec.layer_reuse.repeats), message_states(spec)


def last_later_run(spec: ModelSpec) -> int | None:
    """The run that reads messages whose layer the backward rebuilds first: the section's last layer in the last
    pass; None where no run reads messages."""
    return max((run for run, v in enumerate(run_variants(spec)) if v == "later"), default=None)


def freed_before_later_runs(spec: ModelSpec) -> int:
    """States of s·b·h the checkpoints have freed by the time the backward rebuilds the last later run: the inputs of
    the runs after it (the layers after the section) and the stacks of blocks only those runs read."""
    run = last_later_run(spec)
    if run is None:
        return 0
    return spec.num_layers - 1 - run + block_storages(spec) - block_storages(spec, run)
