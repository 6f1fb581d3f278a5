"""Memory of a training step on one GPU: model states (ZeRO-sharded), activations, and an allowance.

Model states follow Rajbhandari et al. 2020 (ZeRO) §3.1: with mixed-precision Adam each parameter costs
2 bytes (16-bit weights) + 2 (16-bit gradients) + K = 12 (fp32 master, momentum, variance) = 16 bytes.
ZeRO-1 shards the optimizer states (and master copy) over the N_d data-parallel ranks, ZeRO-2 also the
gradients, ZeRO-3 also the parameters (§5.1, Figure 1).

Activations follow Korthikanti et al. 2022 §4.1 (eq. 1: sbh(34 + 5as/h) bytes per GPT-3 layer), written
out tensor by tensor instead of as one constant, so that the same derivation covers SwiGLU (gate, up,
activation and product: 4·s·b·f instead of GELU's 8·sbh + 8·sbh for f = 4h), GQA (K and V at H_kv
heads), models trained without dropout (no masks), MoE (k routed experts per token) and
FlashAttention (no s² score matrix; the per-row log-sum-exp instead).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from lmcalc.engine.flops import Recompute
from lmcalc.engine.params import WeightTensor, count_params, weight_tensors
from lmcalc.result import Term
from lmcalc.specs import ModelSpec, OptimizerSpec, OptimizerState, PrecisionRecipe
from lmcalc.units import GiB

AttentionImpl = Literal["eager", "flash"]

OVERHEAD_ALLOWANCE_BYTES = 2 * GiB
"""Allowance for what is not model state or activations: the CUDA context, cuBLAS/NCCL workspaces and
the caching allocator's fragmentation. It is a round, deliberately conservative allowance, not a
measurement (CUDA contexts alone take several hundred MiB and vary by driver and GPU); users change it
with ``--overhead``. On a GPU, ``lmcalc validate`` compares the predicted peak of real training steps
with ``torch.cuda.max_memory_allocated`` (which excludes the CUDA context)."""

MASK_BYTES = 1  # dropout masks are stored as bool / uint8 (Korthikanti et al. 2022 §4.1)
CPU_MASK_BYTES = 4  # PyTorch's CPU dropout keeps a float mask (CUDA keeps a bool one)
LOGSUMEXP_BYTES = 4  # FlashAttention keeps the per-row log-sum-exp in fp32 (Dao et al. 2022 Alg. 1)
LOGITS_BYTES = 4  # the cross-entropy works on fp32 logits (Korthikanti et al. 2022 §4.1, "4sbv")
STAT_BYTES = 4  # norm statistics (mean, 1/std, 1/rms) are kept in fp32
TOKEN_ID_BYTES = 8  # token ids and targets are int64 (the embedding and the loss keep them)
ROUTING_BYTES_PER_ASSIGNMENT = 3 * 8 + 4  # per (token, expert) pair: three int64 index tensors, one fp32 weight


@dataclass(frozen=True)
class SavedTensor:
    """A tensor kept for the backward pass: ``elements`` of ``bytes_per_element`` each."""

    label: str
    symbol: str
    elements: float
    bytes_per_element: float
    attention_core: bool = False  # recomputed under selective recomputation
    split: str = "tp"  # "tp": split over tensor-parallel ranks; "seq": only with sequence parallelism; "none"
    block: str = "attention"  # what keeps it: a layer's "attention" or "mlp" half (its norm included), or
    # outside the layers, the "embedding" side or the "head" side (final norm, output head, loss)

    @property
    def bytes(self) -> float:
        return self.elements * self.bytes_per_element


def _norm_saved(
    spec: ModelSpec, label: str, rows: float, width: int, act_bytes: float, width_sym: str, rows_sym: str = "s·b"
) -> list[SavedTensor]:
    """A norm keeps its input and its per-row statistics (LayerNorm: mean and 1/std; RMSNorm: 1/rms)."""
    return [
        SavedTensor(f"{label} input", f"{rows_sym}·{width_sym}", rows * width, act_bytes, split="seq"),
        *_norm_stats(spec, label, rows, rows_sym),
    ]


def _norm_stats(spec: ModelSpec, label: str, rows: float, rows_sym: str, split: str = "seq") -> list[SavedTensor]:
    """One fp32 value per row for each statistic the norm keeps: LayerNorm's mean and 1/std, RMSNorm's 1/rms."""
    names = ("1/rms",) if spec.norm_kind == "rmsnorm" else ("mean", "1/std")
    return [SavedTensor(f"{label} {name} (fp32)", rows_sym, rows, STAT_BYTES, split=split) for name in names]


def _attention_saved(
    spec: ModelSpec, sb: float, act_bytes: float, attention: AttentionImpl, recompute: Recompute
) -> list[SavedTensor]:
    H, dqk, dv, h = spec.num_heads, spec.qk_head_dim, spec.v_head_dim, spec.hidden_size
    tensors = [SavedTensor("QKV projection input (norm output)", "s·b·h", sb * h, act_bytes, split="seq")]
    if spec.mla:
        m = spec.mla
        if m.q_lora_rank:
            tensors += _norm_saved(spec, "query latent norm", sb, m.q_lora_rank, act_bytes, "r_q")
            tensors.append(
                SavedTensor("query up-projection input", "s·b·r_q", sb * m.q_lora_rank, act_bytes, split="seq")
            )
        kv_width = m.kv_lora_rank + m.qk_rope_head_dim
        tensors.append(
            SavedTensor(
                "KV latent (with the shared RoPE key)", "s·b·(r_kv+d_rope)", sb * kv_width, act_bytes, split="seq"
            )
        )
        tensors += _norm_stats(spec, "KV latent norm", sb, "s·b")
        tensors.append(SavedTensor("KV up-projection input", "s·b·r_kv", sb * m.kv_lora_rank, act_bytes, split="seq"))
        tensors.append(SavedTensor("Q (nope ‖ rope)", "s·b·H·d_qk", sb * H * dqk, act_bytes))
        tensors.append(SavedTensor("K (nope ‖ shared rope)", "s·b·H·d_qk", sb * H * dqk, act_bytes))
        tensors.append(SavedTensor("V", "s·b·H·d_v", sb * H * dv, act_bytes))
    else:
        # Eager attention expands K and V to all H heads before the matmul (repeat_kv) unless that
        # expansion sits inside the recomputed core; fused kernels read the H_kv heads directly.
        expanded = attention == "eager" and recompute != "selective"
        kv = H if expanded else spec.kv_heads
        kv_sym = "H" if expanded or kv == H else "H_kv"
        if spec.qk_norm != "none":
            norm_rows = sb if spec.qk_norm == "full" else sb * H
            tensors += [
                SavedTensor("Q before QK-norm", "s·b·H·d", sb * H * dqk, act_bytes),
                SavedTensor("K before QK-norm", "s·b·H_kv·d", sb * spec.kv_heads * dqk, act_bytes),
                # A full-width QK-norm has one row per token for Q and one for K; a per-head one, one per head.
                *_norm_stats(spec, "Q-norm", norm_rows, "s·b" if spec.qk_norm == "full" else "s·b·H", "tp"),
                *_norm_stats(
                    spec,
                    "K-norm",
                    sb if spec.qk_norm == "full" else sb * spec.kv_heads,
                    "s·b" if spec.qk_norm == "full" else "s·b·H_kv",
                    "tp",
                ),
            ]
        rope = " (after RoPE)" if spec.position_embedding == "rope" else ""
        tensors += [
            SavedTensor("Q" + rope, "s·b·H·d", sb * H * dqk, act_bytes),
            SavedTensor("K" + rope, f"s·b·{kv_sym}·d", sb * kv * dqk, act_bytes),
            SavedTensor("V", f"s·b·{kv_sym}·d", sb * kv * dv, act_bytes),
        ]
    return tensors


def layer_saved_tensors(
    spec: ModelSpec,
    seq_len: int,
    micro_batch: int,
    act_bytes: float,
    attention: AttentionImpl,
    moe_layer: bool,
    recompute: Recompute = "none",
    mask_bytes: float = MASK_BYTES,
) -> list[SavedTensor]:
    """What one transformer layer saves for backward, following Korthikanti et al. 2022 §4.1."""
    s, b, h = seq_len, micro_batch, spec.hidden_size
    sb = s * b
    H, dv = spec.num_heads, spec.v_head_dim
    tensors = _norm_saved(spec, "attention norm", sb, h, act_bytes, "h")
    tensors += _attention_saved(spec, sb, act_bytes, attention, recompute)
    if attention == "eager":
        tensors.append(SavedTensor("softmax output", "b·H·s²", b * H * s * s, act_bytes, attention_core=True))
        if spec.dropout:
            tensors.append(SavedTensor("attention dropout mask", "b·H·s²", b * H * s * s, mask_bytes, True))
            tensors.append(SavedTensor("attention dropout output", "b·H·s²", b * H * s * s, act_bytes, True))
        tensors.append(SavedTensor("output projection input", "s·b·H·d_v", sb * H * dv, act_bytes))
    else:
        tensors.append(SavedTensor("log-sum-exp per row (fp32)", "b·H·s", b * H * s, LOGSUMEXP_BYTES, True))
        # The fused kernel's output, kept for its backward, is laid out (b, s, H, d): the output
        # projection's input is a view of the same storage, so it is counted once.
        tensors.append(SavedTensor("attention output = output projection input", "s·b·H·d_v", sb * H * dv, act_bytes))
    if spec.dropout:
        tensors.append(SavedTensor("residual dropout mask (attention)", "s·b·h", sb * h, mask_bytes, split="seq"))
    return tensors + [
        replace(t, block="mlp") for t in _mlp_saved(spec, sb, act_bytes, moe_layer and bool(spec.moe), mask_bytes)
    ]


def _mlp_saved(spec: ModelSpec, sb: float, act_bytes: float, moe_layer: bool, mask_bytes: float) -> list[SavedTensor]:
    """The MLP half of a layer: its norm, the MLP (dense or routed), the residual dropout after it."""
    h = spec.hidden_size
    tensors = _norm_saved(spec, "MLP norm", sb, h, act_bytes, "h")
    if moe_layer and spec.moe:
        moe = spec.moe
        k, f_e = moe.experts_per_token, moe.expert_ffn_size
        tensors.append(
            SavedTensor("router / shared-expert input (norm output)", "s·b·h", sb * h, act_bytes, split="seq")
        )
        tensors.append(SavedTensor("router probabilities (fp32)", "s·b·E", sb * moe.num_experts, 4, split="seq"))
        tensors.append(
            SavedTensor(
                "routing indices (int64, 3 copies) and weights (fp32)",
                "s·b·k",
                sb * k,
                ROUTING_BYTES_PER_ASSIGNMENT,
                split="seq",
            )
        )
        tensors.append(SavedTensor("tokens gathered for their experts", "k·s·b·h", k * sb * h, act_bytes, split="seq"))
        tensors += _ffn_saved(spec, k * sb, f_e, act_bytes, "k·s·b", "f_e", with_input=False)
        tensors.append(
            SavedTensor(
                "expert outputs (for the routing-weight product)", "k·s·b·h", k * sb * h, act_bytes, split="seq"
            )
        )
        tensors.append(
            SavedTensor(
                "weighted expert outputs (index_add keeps its source)", "k·s·b·h", k * sb * h, act_bytes, split="seq"
            )
        )
        if moe.shared_experts:
            tensors += _ffn_saved(
                spec, moe.shared_experts * sb, f_e, act_bytes, "E_shared·s·b", "f_e", with_input=False
            )
    else:
        tensors += _ffn_saved(spec, sb, spec.ffn_size, act_bytes, "s·b", "f")
    if spec.dropout:
        tensors.append(SavedTensor("residual dropout mask (MLP)", "s·b·h", sb * h, mask_bytes, split="seq"))
    return tensors


def _ffn_saved(
    spec: ModelSpec, rows: float, width: int, act_bytes: float, rows_sym: str, width_sym: str, with_input: bool = True
) -> list[SavedTensor]:
    h = spec.hidden_size
    tensors = (
        [SavedTensor("MLP input (norm output)", f"{rows_sym}·h", rows * h, act_bytes, split="seq")]
        if with_input
        else []
    )
    if spec.ffn_kind == "gelu_mlp":
        return tensors + [
            SavedTensor("GELU input", f"{rows_sym}·{width_sym}", rows * width, act_bytes),
            SavedTensor("down projection input (GELU output)", f"{rows_sym}·{width_sym}", rows * width, act_bytes),
        ]
    act = "SiLU" if spec.ffn_kind == "swiglu" else "GELU"
    return tensors + [
        SavedTensor(f"gate output ({act} input)", f"{rows_sym}·{width_sym}", rows * width, act_bytes),
        SavedTensor("up output", f"{rows_sym}·{width_sym}", rows * width, act_bytes),
        SavedTensor(f"{act}(gate)", f"{rows_sym}·{width_sym}", rows * width, act_bytes),
        SavedTensor("down projection input (product)", f"{rows_sym}·{width_sym}", rows * width, act_bytes),
    ]


def model_saved_tensors(
    spec: ModelSpec, seq_len: int, micro_batch: int, act_bytes: float, mask_bytes: float = MASK_BYTES
) -> list[SavedTensor]:
    """Saved tensors outside the layers: token ids, embedding dropout, final norm, head input, fp32 logits."""
    sb, h = seq_len * micro_batch, spec.hidden_size
    embedding = [SavedTensor("token ids and targets (int64)", "2·s·b", 2 * sb, TOKEN_ID_BYTES, split="none")]
    if spec.dropout:
        embedding.append(SavedTensor("embedding dropout mask", "s·b·h", sb * h, mask_bytes, split="seq"))
    head = _norm_saved(spec, "final norm", sb, h, act_bytes, "h") + [
        SavedTensor("output head input", "s·b·h", sb * h, act_bytes, split="seq"),
        SavedTensor("logits (fp32, for the cross-entropy)", "s·b·V", sb * spec.vocab_size, LOGITS_BYTES),
    ]
    return [replace(t, block="embedding") for t in embedding] + [replace(t, block="head") for t in head]


@dataclass(frozen=True)
class ActivationMemory:
    dense_layer: list[SavedTensor]
    moe_layer: list[SavedTensor]
    dense_layers: int
    moe_layers: int
    checkpoint_bytes: float  # per layer under full recompute: the layer input
    outside: list[SavedTensor]
    recompute: Recompute

    @property
    def dense_layer_bytes(self) -> float:
        return sum(t.bytes for t in self.dense_layer)

    @property
    def moe_layer_bytes(self) -> float:
        return sum(t.bytes for t in self.moe_layer)

    @property
    def recompute_working_bytes(self) -> float:
        """Under full recomputation, one layer's activations are rebuilt at a time during backward."""
        if self.recompute != "full":
            return 0.0
        return max(self.dense_layer_bytes if self.dense_layers else 0.0, self.moe_layer_bytes)

    @property
    def layers_bytes(self) -> float:
        if self.recompute == "full":
            return (self.dense_layers + self.moe_layers) * self.checkpoint_bytes + self.recompute_working_bytes
        return self.dense_layers * self.dense_layer_bytes + self.moe_layers * self.moe_layer_bytes

    @property
    def model_bytes(self) -> float:
        return sum(t.bytes for t in self.outside)

    @property
    def total(self) -> float:
        return self.layers_bytes + self.model_bytes


def activation_memory(
    spec: ModelSpec,
    seq_len: int,
    micro_batch: int,
    act_bytes: float,
    attention: AttentionImpl = "flash",
    recompute: Recompute = "none",
    mask_bytes: float = MASK_BYTES,
) -> ActivationMemory:
    """Bytes saved for backward in one training step (Korthikanti et al. 2022 §4, tensor by tensor).

    Selective recomputation drops the attention core's tensors (Korthikanti §4.2.2); full recomputation
    keeps each layer's input and rebuilds one layer at a time (§4.2.3, Table 2).
    """

    def kept(moe_layer: bool) -> list[SavedTensor]:
        tensors = layer_saved_tensors(
            spec, seq_len, micro_batch, act_bytes, attention, moe_layer, recompute, mask_bytes
        )
        return [t for t in tensors if not (recompute == "selective" and t.attention_core)]

    n_moe = spec.moe_layers
    return ActivationMemory(
        dense_layer=kept(False),
        moe_layer=kept(True) if spec.moe else [],
        dense_layers=spec.num_layers - n_moe,
        moe_layers=n_moe,
        checkpoint_bytes=seq_len * micro_batch * spec.hidden_size * act_bytes,
        outside=model_saved_tensors(spec, seq_len, micro_batch, act_bytes, mask_bytes),
        recompute=recompute,
    )


def optimizer_state_bytes(tensors: list[WeightTensor], precision: PrecisionRecipe, optimizer: OptimizerSpec) -> float:
    """Bytes of every optimizer state for the whole model (unsharded)."""
    n_params = sum(t.total for t in tensors)
    total = 0.0
    for state in optimizer.states:
        per_element = state.bytes if state.bytes is not None else precision.optimizer_state_bytes
        if state.factored:
            # Shazeer & Stern 2018: a row and a column statistic per matrix instead of r·c values.
            elements = sum(t.count * (sum(t.shape) if len(t.shape) == 2 else t.numel) for t in tensors)
        else:
            elements = n_params
        total += elements * per_element
        if state.quantization_block:
            total += n_params / state.quantization_block * 4  # one fp32 scale per block (Dettmers et al. 2022)
    return total


@dataclass(frozen=True)
class StateMemory:
    """Per-GPU bytes of each model state after ZeRO sharding over ``dp`` ranks."""

    params: float
    grads: float
    master: float
    optimizer: float
    zero_stage: int
    dp: int

    @property
    def total(self) -> float:
        return self.params + self.grads + self.master + self.optimizer


def zero_divisors(zero_stage: int, dp: int) -> tuple[int, int, int]:
    """How many ways (params, grads, optimizer+master) are split: ZeRO §5.1 stages 0–3."""
    return (dp if zero_stage >= 3 else 1, dp if zero_stage >= 2 else 1, dp if zero_stage >= 1 else 1)


def state_formula(state: OptimizerState, precision: PrecisionRecipe, n: str = "N") -> str:
    per_element = state.bytes if state.bytes is not None else precision.optimizer_state_bytes
    text = f"Σ_matrices (rows + cols) · {per_element:g} B" if state.factored else f"{n} · {per_element:g} B"
    if state.quantization_block:
        text += f" + {n} / {state.quantization_block} · 4 B"
    return f"{text} ({state.name})"


def state_memory(
    spec: ModelSpec, precision: PrecisionRecipe, optimizer: OptimizerSpec, zero_stage: int, dp: int
) -> StateMemory:
    tensors = weight_tensors(spec)
    n = count_params(spec).total
    p_div, g_div, o_div = zero_divisors(zero_stage, dp)
    return StateMemory(
        params=n * precision.param_bytes / p_div,
        grads=n * precision.grad_bytes / g_div,
        master=n * precision.master_bytes / o_div,
        optimizer=optimizer_state_bytes(tensors, precision, optimizer) / o_div,
        zero_stage=zero_stage,
        dp=dp,
    )


def saved_formula(tensors: list[SavedTensor]) -> str:
    """``8·s·b·h + 4·b·H·s² + ...``: bytes times element count, like terms merged."""
    counts: dict[tuple[str, float], float] = {}
    for t in tensors:
        counts[(t.symbol, t.bytes_per_element)] = counts.get((t.symbol, t.bytes_per_element), 0) + t.bytes_per_element
    return " + ".join(f"{total:g}·{symbol}" for (symbol, _), total in counts.items())


def overhead_term(value: float, what: str = "CUDA context, workspaces, fragmentation") -> Term:
    return Term(
        "overhead",
        "Overhead allowance",
        value,
        "bytes",
        what,
        source="lmcalc allowance (not measured), change with --overhead",
    )


def capacity_terms(total: float, capacity: float, capacity_label: str, utilisation: bool = True) -> tuple[Term, ...]:
    """The GPU's memory, what is left of it (negative: does not fit) and, unless not wanted, the fraction used."""
    terms = (
        Term("capacity", "GPU memory", capacity, "bytes", capacity_label),
        Term(
            "headroom",
            "Headroom",
            capacity - total,
            "bytes",
            "capacity − total",
            note="negative: does not fit" if total > capacity else "",
        ),
    )
    if not utilisation:
        return terms
    return (*terms, Term("utilisation", "Fraction of memory used", 100 * total / capacity, "%", "total / capacity"))
