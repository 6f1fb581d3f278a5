"""Measurements of the reference model with PyTorch itself: parameters, FLOPs, bytes saved for backward.

These are the independent figures ``lmcalc validate`` sets beside the engine's. torch is imported here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.flop_counter import FlopCounterMode

from lmcalc.reference_model import AttentionImpl, Recompute, ReferenceModel, loss
from lmcalc.specs import ModelSpec


def build(spec: ModelSpec, attention: AttentionImpl, seq_len: int, device: str = "meta",
          dtype: torch.dtype = torch.float32) -> ReferenceModel:
    model = ReferenceModel(spec, attention, max_seq=seq_len, device=device, dtype=dtype)
    return model.train()


def parameter_count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def training_step_flops(model: ReferenceModel, seq_len: int, micro_batch: int) -> int:
    """FLOPs of one forward + backward step as ``FlopCounterMode`` counts them (no values needed on meta)."""
    device = next(model.parameters()).device
    tokens = torch.zeros(micro_batch, seq_len, dtype=torch.long, device=device)
    with FlopCounterMode(display=False) as counter:
        loss(model, tokens).backward()
    return counter.get_total_flops()


@dataclass(frozen=True)
class SavedTensors:
    """Bytes of the distinct storages autograd keeps for backward (parameters and buffers excluded)."""

    bytes: int
    count: int


def saved_for_backward(model: ReferenceModel, tokens: torch.Tensor, recompute: Recompute = "none",
                       layer: int | None = None) -> SavedTensors:
    """Run the forward pass with ``saved_tensors_hooks`` and add up what autograd keeps, by storage.

    With ``layer`` only that transformer block runs, on the embedded tokens: what full recomputation
    rebuilds, one layer at a time, during the backward pass.
    """
    state = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    storages: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in state:
            storages[storage.data_ptr()] = max(storages.get(storage.data_ptr(), 0), storage.nbytes())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        if layer is not None:
            s = tokens.shape[1]
            x = model.embed(tokens).detach().requires_grad_()
            model.layers[layer](x, model.cos[:s], model.sin[:s], model.causal_bias, False)
        else:
            loss(model, tokens, recompute)
    return SavedTensors(sum(storages.values()), len(storages))


def peak_saved_bytes(model: ReferenceModel, tokens: torch.Tensor, recompute: Recompute) -> int:
    """Bytes held for backward at its peak: everything saved by the forward pass, plus, under full
    recomputation, the largest single layer rebuilt during backward (dense and MoE layers differ)."""
    held = saved_for_backward(model, tokens, recompute).bytes
    if recompute != "full":
        return held
    spec = model.spec
    first_moe = spec.moe.dense_layers if spec.moe else None
    kinds = {0 if not spec.moe or spec.moe.dense_layers else first_moe, first_moe}
    return held + max(saved_for_backward(model, tokens, layer=i).bytes for i in kinds if i is not None)
