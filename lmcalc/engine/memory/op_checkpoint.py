"""Per-operator selective activation checkpointing, as torchtitan applies it (derivation: docs/formulas.md §5.5).

torchtitan's ``SelectiveAC`` (torchtitan/distributed/activation_checkpoint.py at b5bcd76c; the same rule at 9dec370
in torchtitan/models/llama/parallelize_llama.py) wraps each transformer block in PyTorch's selective checkpoint
(``torch.utils.checkpoint.create_selective_checkpoint_contexts``). Of the operators the block's forward runs, its
policy keeps the outputs of the matmuls, all but every second one in the order they run, of the attention kernel
(its output and fp32 log-sum-exp; eager attention's batched products) and of routing's top-k, and recomputes every
other operator in the backward pass; the checkpoint itself keeps the block's input. The router's matmul is always
recomputed and not counted (``force_recompute_mm_shapes_by_fqns``, ``moe.router.gate`` by default); the experts'
grouped GEMMs are not on the policy's list, so they are recomputed too.

In the backward pass the block's forward runs again, its kept outputs taken from the cache, and autograd saves what
the block saves without recomputation: the layer being differentiated holds that whole set beside the kept one, less
the kept tensors that are the same storages (``gpu_memory.selective_rebuilt``).

Not modelled: the outputs of the collectives the policy also keeps (TP's reduce-scatters, expert parallelism's
all-to-alls), and the per-token gather of the RoPE table.
"""

from __future__ import annotations

from typing import NamedTuple

from lmcalc.engine.memory.saved import LOGSUMEXP_BYTES, SavedTensor
from lmcalc.engine.model.op_policy import Matmul, block_matmuls
from lmcalc.engine.model_code import norm_keeps
from lmcalc.engine.workload import Workload

TOPK_BYTES = 4 + 8  # routing's top-k: the fp32 score and the int64 expert index of each token-expert assignment
ROW_PARALLEL = ("o", "down", "proj")  # their outputs are partial sums, full width on every tensor-parallel rank


class Kept(NamedTuple):
    """A tensor the policy keeps, and whether autograd saves the same storage when the block runs again."""

    tensor: SavedTensor
    reused: bool


def op_checkpoint_kept(w: Workload, moe_layer: bool) -> tuple[Kept, ...]:
    """What one block keeps through the forward pass under torchtitan's per-operator policy."""
    spec, act, sb = w.model, w.precision.activation_bytes, w.tokens
    h = spec.hidden_size
    routed = moe_layer and bool(spec.moe)
    kept = [Kept(SavedTensor("block input (the checkpoint's)", "s·b·h", sb * h, act, split="seq"),
                 norm_keeps(w) == "input")]  # fmt: skip
    matmuls = block_matmuls(spec, routed, w.framework.recompute.fused_qkv)
    for i, m in enumerate(matmuls, start=1):
        if m.name == "o":  # the attention kernel runs between the projections and the output projection
            kept.extend(_attention_kernel(w))
        if i % 2 == 0:
            continue
        row = m.name in ROW_PARALLEL
        label = f"{m.name} output (matmul {i} of {len(matmuls)}{', a partial sum under TP' if row else ''})"
        tensor = SavedTensor(label, f"s·b·{m.symbol}", sb * m.width, act, split="none" if row else "tp",
                             block="attention" if i <= _output_projection(matmuls) else "mlp")  # fmt: skip
        kept.append(Kept(tensor, _reused(w, m.name)))
    if routed:
        assert spec.moe is not None
        k = spec.moe.k
        kept.append(Kept(SavedTensor("routing top-k: scores (fp32) and indices", "s·b·k", sb * k, TOPK_BYTES,
                                     split="seq", block="mlp"), False))  # fmt: skip
    return tuple(kept)


def _output_projection(matmuls: tuple[Matmul, ...]) -> int:
    """The attention's output projection's place in the count (1-based): the matmuls after it are the MLP's."""
    return next(i for i, m in enumerate(matmuls, start=1) if m.name == "o")


def _attention_kernel(w: Workload) -> list[Kept]:
    """The attention kernel's outputs, kept whatever their place in the count: a fused kernel's output and fp32
    log-sum-exp, or eager attention's two batched products (the scores and the values)."""
    spec, act, sb, b, s = w.model, w.precision.activation_bytes, w.tokens, w.micro_batch, w.seq_len
    H, dv = spec.num_heads, spec.v_head_dim
    out = SavedTensor("attention output (the kernel's)", "s·b·H·d_v", sb * H * dv, act)
    if w.attention == "eager":
        return [Kept(SavedTensor("attention scores (the batched matmul's)", "b·H·s²", b * H * s * s, act), False),
                Kept(out, True)]  # fmt: skip
    return [Kept(out, True), Kept(SavedTensor("log-sum-exp per row (fp32)", "b·H·s", b * H * s, LOGSUMEXP_BYTES), True)]


def _reused(w: Workload, name: str) -> bool:
    """Whether autograd, running the block again, saves this matmul's output itself: a gated MLP's gate output (the
    activation's input), a GELU MLP's up output, and V where it is its own matmul (the kernel reads it unchanged);
    not Q or K (RoPE makes new ones), a fused QKV output (split into copies) or an output projection's."""
    if name in ("gate", "up"):  # an unfused gated MLP's activation and product read them unchanged
        return w.model.ffn_kind != "gelu_mlp" and w.framework.mlp.gated == "unfused" or w.model.ffn_kind == "gelu_mlp"
    return name in ("fc", "v")
