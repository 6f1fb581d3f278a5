"""What a trained layer keeps for backward under a fine-tuning method (``engine.memory.activations`` lists what a fully
trained layer keeps): a tensor only frozen weights' gradients needed is dropped (a frozen linear layer keeps no input,
a frozen norm no normalised value), and each adapter adds what it keeps (Hu et al. 2021 eq. 3: ``B·A·dropout(x)``;
DoRA's two products)."""

from __future__ import annotations

from lmcalc.engine.finetune.method import LinearModule, adapted_modules, in_layer, weight_trained
from lmcalc.engine.memory.adapters import adapter_bytes, adapter_copies
from lmcalc.engine.memory.blocks import module_share
from lmcalc.engine.memory.routing import routed_symbol
from lmcalc.engine.memory.saved import ROUTED, SavedTensor
from lmcalc.engine.memory.ssm import MixerKind
from lmcalc.engine.workload import Workload


def needed(w: Workload, tensor: SavedTensor, adapted: set[str]) -> bool:
    """Whether a tensor kept for weight gradients is still kept: some module it feeds is trained, or adapted and
    reads it directly (no dropout, no cast copy of its own)."""
    if not tensor.for_weights:
        return True
    if any(weight_trained(w.model, w.method, leaf) for leaf in tensor.for_weights):
        return True
    return not adapter_copies(w) and any(leaf in adapted for leaf in tensor.for_weights)


def under_method(
    w: Workload, tensors: list[SavedTensor], moe_layer: bool, mixer: MixerKind = "average"
) -> list[SavedTensor]:
    """A trained layer's tensors under a fine-tuning method: what only frozen weights' gradients needed is dropped
    (a frozen linear layer keeps no input, a frozen norm no normalised value); each adapter adds the rank-r output of
    A that B reads, and where it keeps a copy of its input (``adapters.adapter_copies``) that copy and a dropout mask
    (PEFT: ``lora_B(lora_A(dropout(x)))``, Hu et al. 2021 eq. 3)."""
    # the indexer runs under torch.no_grad (DeepSeek sparse attention's, as transformers runs it): its adapters keep
    # nothing
    shares = {m: module_share(w.model, m, mixer) for m in adapted_modules(w.model, w.method)
              if in_layer(m, moe_layer) and m.group != "indexer"}  # fmt: skip
    modules = [m for m, share in shares.items() if share]
    adapted = {f"{ROUTED}{m.leaf}" if m.group == "experts" else m.leaf for m in modules}
    kept = [t for t in tensors if needed(w, t, adapted)]
    act, adapter, r = w.precision.activation_bytes, adapter_bytes(w), w.method.lora_rank
    for m in modules:
        rows, rows_symbol = adapter_rows(w, m)
        if shares[m] != 1:  # a hybrid's average layer: its attention's adapters in A of its L layers, its mixer's
            rows, rows_symbol = rows * shares[m], f"{shares[m]:.4g}·{rows_symbol}"
        block = "attention" if m.group == "attention" else "mlp"
        split = "seq" if m.inputs == w.model.hidden_size else "tp"
        label = f"{m.name} adapter"
        rank, rank_symbol = r * m.rank_scale, "r" if m.rank_scale == 1 else f"{m.rank_scale}r"
        kept.append(SavedTensor(f"{label}: A·x (B's input)", f"{rows_symbol}·{rank_symbol}", rows * rank, adapter,
                                split="none", block=block))  # fmt: skip
        if adapter_copies(w):
            n, symbol = rows * m.inputs, f"{rows_symbol}·{m.inputs}"
            kept.append(
                SavedTensor(f"{label}: its input copy (A's input)", symbol, n, adapter, split=split, block=block)
            )
            if w.method.lora_dropout > 0:
                kept.append(SavedTensor(f"{label}: dropout mask", symbol, n, w.mask_bytes, split=split, block=block))
        if w.method.dora:  # (m/‖W+sBA‖ − 1)·(W·x) + m/‖W+sBA‖·s·B·A·x: the magnitude's gradient needs both products
            out_split = "seq" if m.outputs == w.model.hidden_size else "tp"
            n, symbol = rows * m.outputs, f"{rows_symbol}·{m.outputs}"
            for what in ("the base output W·x", "the scaled adapter output s·B·A·x"):
                kept.append(SavedTensor(f"{label}: {what} (DoRA)", symbol, n, act, split=out_split, block=block))
            kept.append(SavedTensor(f"{label}: norm and scales (DoRA)", f"3·{m.outputs}", 3 * m.outputs, act,
                                    split="none", block=block))  # fmt: skip
    return kept


def adapter_rows(w: Workload, module: LinearModule) -> tuple[float, str]:
    """How many token rows pass through one copy of an adapted module in a micro-batch: all of them, k per token
    over the routed experts of a layer (counted together), each shared expert's."""
    moe = w.model.moe
    if module.group == "experts" and moe:
        return w.routed_copies * w.tokens, f"{routed_symbol(w)}·s·b"
    if module.group == "shared_experts" and moe:
        return moe.shared_experts * w.tokens, "E_shared·s·b"
    return w.tokens, "s·b"


def dropout_mask_of(tensor: SavedTensor, modules: set[str]) -> bool:
    """Whether ``tensor`` is the dropout mask of one of these adapted modules: a dropout whose input needs no
    gradient keeps no mask."""
    return tensor.label.endswith("adapter: dropout mask") and tensor.label.split(" ", 1)[0] in modules
