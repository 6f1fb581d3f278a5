"""What a hybrid's state-space (Mamba) layers keep for backward, and the average layer of a hybrid: attention in
some layers, a state-space mixer in the others (``engine.memory.activations`` counts the rest of a layer)."""

from __future__ import annotations

from dataclasses import replace

from lmcalc.engine.memory.saved import SavedTensor
from lmcalc.engine.workload import Workload


def _share(tensor: SavedTensor, layers: int, of: int) -> SavedTensor:
    """``tensor`` as kept by ``layers`` of every ``of`` layers, on average."""
    return replace(tensor, elements=tensor.elements * layers / of, symbol=f"({layers}/{of})·{tensor.symbol}")


SCAN_CHUNK = 2048  # mamba_ssm's selective scan keeps its fp32 state once per chunk of this many tokens


def _ssm_saved(w: Workload) -> list[SavedTensor]:
    """What a state-space layer keeps for backward, as mamba_ssm's fused path keeps it (``mamba_inner_fn``, its
    default checkpoint level, which rebuilds the convolution's output and Δ in backward): the input projection's
    output x‖z, the x_proj output (Δ's low rank, B, C), contiguous B and C, the scan's output y, and the scan's
    fp32 state (d_in × 2N) once per chunk of 2,048 tokens. An estimate of a fused kernel's choices, not checked
    against a measurement here (no mamba_ssm on the CPU); transformers' PyTorch scan keeps far more: a state per
    token."""
    m, act, sb = w.model.mamba, w.precision.activation_bytes, w.tokens
    assert m is not None
    chunks = -(-w.seq_len // SCAN_CHUNK) * w.micro_batch
    return [
        SavedTensor("x and z (input projection output)", "s·b·2·d_in", sb * 2 * m.d_inner, act),
        SavedTensor("Δ, B, C (x_proj output)", "s·b·(r+2N)", sb * (m.dt_rank + 2 * m.d_state), act),
        SavedTensor("B and C (contiguous copies)", "s·b·2N", sb * 2 * m.d_state, act),
        SavedTensor("scan output y", "s·b·d_in", sb * m.d_inner, act),
        SavedTensor(
            "scan state per chunk of 2,048 tokens (fp32)", "⌈s/2048⌉·b·d_in·2N", chunks * m.d_inner * 2 * m.d_state, 4
        ),
    ]


def average_mixer(w: Workload, attention: list[SavedTensor]) -> list[SavedTensor]:
    """A hybrid's token mixer as the average layer keeps it: the attention's tensors in A of its L layers, the
    state-space layer's in the other L − A."""
    spec = w.model
    L, A = spec.num_layers, spec.attention_layers
    return [_share(t, A, L) for t in attention] + [_share(t, L - A, L) for t in _ssm_saved(w)]
