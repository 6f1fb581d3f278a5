"""What each use of a shared block keeps for backward (Zamba, Glorioso et al. 2024, and Zamba 2; transformers'
ZambaAttentionDecoderLayer, Zamba2AttentionDecoderLayer and the hybrid layers that call them): the blocks' weights
are held once (``engine.model.shared_block``), but every use runs the block on its own input, so every use keeps
its own activations, as a layer of its own would.

A use, in the order transformers runs it: the layer's input concatenated with the token embedding (2·h wide; the
concatenation keeps nothing), an RMSNorm over it, Q, K and V from its output (each plus its use's own rank-r
adapter where Zamba 2 has them), attention with H heads of d = 2·h/H, the output projection back to h, an RMSNorm
(no residual inside the block), a gated MLP of f (Zamba 2's gate and up fused, plus its use's adapter), and the use's
own linear layer h → h, whose output is added to the input of the layer's Mamba mixer. ``shared_uses_saved`` places
the uses in lmcalc's layers: the average layer keeps G/L of one, a layer that runs a use keeps it whole (``MixerKind``
"shared"), a Mamba layer alone none. ``shared_block_checkpointed`` is what full recomputation keeps beyond each
layer's input: the embedding every use reads again."""

from __future__ import annotations

from dataclasses import replace

from lmcalc.engine.memory.eager_scores import eager_scores_saved
from lmcalc.engine.memory.ffn import UP, ffn_saved
from lmcalc.engine.memory.norms import norm_saved
from lmcalc.engine.memory.saved import LOGSUMEXP_BYTES, SavedTensor
from lmcalc.engine.memory.ssm import MixerKind, share
from lmcalc.engine.model.tensors import Dim
from lmcalc.engine.workload import Workload

ADAPTER_UP = ("up",)
"""The adapters' second linear layers (r → 2·h or r → 2·f): their weights' gradients read the rank-r output."""


def shared_use_saved(w: Workload) -> list[SavedTensor]:
    """What one use of a shared block keeps: its input norm over 2·h (the profile's norm rule), the norm's output
    (Q, K, V and their adapters read it), each adapter's rank-r output, Q, K and V at d = 2·h/H, the attention core
    (the fused kernel's log-sum-exp and output, or eager attention's scores), the MLP norm over h and the gated MLP
    (the profile's MLP rule), the MLP adapter's rank-r output, and the use's linear layer's input."""
    spec, act, sb, b, s = w.model, w.precision.activation_bytes, w.tokens, w.micro_batch, w.seq_len
    block = spec.shared_block
    if block is None:
        return []
    h, heads, d, kv = spec.hidden_size, spec.num_heads, spec.head_size, spec.kv_heads
    rows, r = Dim(sb, "s·b"), block.adapter_rank
    adapters = bool(r and block.attention_adapters)
    tensors = norm_saved(w, "shared block input norm (layer input ‖ embedding)", rows, Dim(2 * h, "2·h"))
    tensors.append(SavedTensor("shared block Q, K and V input (norm output)", "s·b·2·h", sb * 2 * h, act, split="seq",
                               for_weights=("q", "k", "v", *(("down",) if adapters else ()))))  # fmt: skip
    if adapters and r:
        tensors.append(SavedTensor("Q, K and V adapters' rank-r outputs", "3·s·b·r", 3 * sb * r, act, split="none",
                                   for_weights=ADAPTER_UP))  # fmt: skip
    # eager attention expands K and V to all H heads (repeat_kv), but one head of one sequence expands as a view
    expanded = w.attention == "eager" and kv != heads and not (kv == 1 and b == 1)
    kv_heads, kv_symbol = (heads, "H") if expanded or kv == heads else (kv, "H_kv")
    ranks = None if expanded else kv
    tensors += [
        SavedTensor("shared block Q", "s·b·H·d", sb * heads * d, act),
        SavedTensor("shared block K", f"s·b·{kv_symbol}·d", sb * kv_heads * d, act, most_tp_ranks=ranks),
        SavedTensor("shared block V", f"s·b·{kv_symbol}·d", sb * kv_heads * d, act, most_tp_ranks=ranks),
    ]
    if w.attention == "eager":
        tensors += eager_scores_saved(w, False)
        tensors.append(SavedTensor("shared block output projection input", "s·b·H·d", sb * heads * d, act,
                                   for_weights=("o",)))  # fmt: skip
    else:
        tensors += [
            SavedTensor("shared block log-sum-exp per row (fp32)", "b·H·s", b * heads * s, LOGSUMEXP_BYTES, True),
            SavedTensor("shared block attention output = output projection input", "s·b·H·d", sb * heads * d, act),
        ]
    mlp = norm_saved(w, "shared block MLP norm", rows, Dim(h, "h"))
    mlp += [replace(t, label=f"shared block {t.label}",
                    for_weights=t.for_weights + (("down",) if r and t.for_weights == UP else ()))
            for t in ffn_saved(w, rows, Dim(spec.ffn_size, "f"))]  # fmt: skip
    if r:
        mlp.append(SavedTensor("MLP adapter's rank-r output", "s·b·r", sb * r, act, split="none",
                               for_weights=ADAPTER_UP))  # fmt: skip
    mlp.append(SavedTensor("the use's linear layer input (the block's output)", "s·b·h", sb * h, act, split="seq",
                           for_weights=("linear",)))  # fmt: skip
    return tensors + [replace(t, block="mlp") for t in mlp]


def shared_uses_saved(w: Workload, mixer: MixerKind) -> list[SavedTensor]:
    """The uses' share of a layer: G/L of one use in the average layer, a whole use in a layer that runs one
    (``mixer`` "shared"), none in a layer of one other kind."""
    block = w.model.shared_block
    if block is None or mixer not in ("average", "shared"):
        return []
    use = shared_use_saved(w)
    return use if mixer == "shared" else [share(t, block.uses, w.model.num_layers) for t in use]


def shared_block_checkpointed(w: Workload) -> list[SavedTensor]:
    """Under full recomputation, what the checkpoints keep beyond each layer's input where a shared block runs: the
    token embedding's copy every use concatenates with its input (transformers' ``original_hidden_states``, an
    argument of every checkpointed layer), alive until the lowest use's backward."""
    if w.model.shared_block is None or w.recompute != "full":
        return []
    tokens, h = w.tokens, w.model.hidden_size
    return [SavedTensor("token embedding's copy, which every shared block use reads", "s·b·h", tokens * h,
                        w.precision.activation_bytes, split="seq")]  # fmt: skip
