"""Measurements of the reference model with PyTorch itself: parameters, FLOPs, bytes saved for backward.

These are the independent figures ``lmcalc validate`` sets beside the engine's. torch is imported here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.flop_counter import FlopCounterMode

from lmcalc.reference_model import AttentionImpl, Recompute, ReferenceModel, loss
from lmcalc.specs import ModelSpec


def build(
    spec: ModelSpec, attention: AttentionImpl, seq_len: int, device: str = "meta", dtype: torch.dtype = torch.float32
) -> ReferenceModel:
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


def saved_for_backward(
    model: ReferenceModel, tokens: torch.Tensor, recompute: Recompute = "none", layer: int | None = None
) -> SavedTensors:
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


CUDA_CHECK_SEQ = 1024
CUDA_CHECK_STEPS = 3


def cuda_peak_memory(spec: ModelSpec) -> tuple[float, float, str]:
    """Peak bytes allocated by real AdamW training steps on the GPU, and the engine's prediction.

    The model runs in bf16 with AdamW states in bf16 (the ``bf16-pure`` recipe: what plain PyTorch does
    with a bf16 model), flash attention, micro-batch 1 at ``CUDA_CHECK_SEQ`` tokens. The peak is read
    after the first step, once the optimizer states exist. Models too large for the GPU are checked at
    the small configuration's proportions scaled to a quarter of the GPU's memory.
    """
    from lmcalc.engine.maxparams import scaled_model
    from lmcalc.engine.memory import activation_memory, state_memory
    from lmcalc.engine.params import count_params
    from lmcalc.presets import resolve_optimizer, resolve_precision

    precision, adamw = resolve_precision("bf16-pure").spec, resolve_optimizer("adamw").spec
    capacity = torch.cuda.get_device_properties(0).total_memory
    model_spec = spec if 8 * count_params(spec).total < capacity / 4 else scaled_model(spec, capacity / 4 / 8)
    seq = min(CUDA_CHECK_SEQ, model_spec.max_seq_len)
    model = build(model_spec, "flash", seq, "cuda", torch.bfloat16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    tokens = torch.randint(0, model_spec.vocab_size, (1, seq), device="cuda")
    for step in range(CUDA_CHECK_STEPS):
        if step == 1:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        loss(model, tokens).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    measured = torch.cuda.max_memory_allocated()
    predicted = (
        state_memory(model_spec, precision, adamw, 0, 1).total
        + activation_memory(model_spec, seq, 1, precision.activation_bytes, "flash", "none").total
    )
    return predicted, float(measured), f"{model_spec.name}, bf16, s={seq}"
