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

from dataclasses import dataclass
from typing import Literal

from lmcalc.engine.flops import Recompute
from lmcalc.engine.params import WeightTensor, count_params, weight_tensors
from lmcalc.result import Section, Term
from lmcalc.specs import ModelSpec, OptimizerSpec, PrecisionRecipe
from lmcalc.units import GiB, format_quantity, group

AttentionImpl = Literal["eager", "flash"]

OVERHEAD_ALLOWANCE_BYTES = 2 * GiB
"""Allowance for what is not model state or activations: the CUDA context, cuBLAS/NCCL workspaces and
the caching allocator's fragmentation. It is a round, deliberately conservative allowance, not a
measurement (CUDA contexts alone take several hundred MiB and vary by driver and GPU); users change it
with ``--overhead``, and ``lmcalc validate`` measures the real figure on a GPU."""

MASK_BYTES = 1  # dropout masks are stored as bool / uint8 (Korthikanti et al. 2022 §4.1)
LOGSUMEXP_BYTES = 4  # FlashAttention keeps the per-row log-sum-exp in fp32 (Dao et al. 2022 Alg. 1)
LOGITS_BYTES = 4  # the cross-entropy works on fp32 logits (Korthikanti et al. 2022 §4.1, "4sbv")


@dataclass(frozen=True)
class SavedTensor:
    """A tensor kept for the backward pass: ``elements`` of ``bytes_per_element`` each."""

    label: str
    symbol: str
    elements: float
    bytes_per_element: float
    attention_core: bool = False  # recomputed under selective recomputation

    @property
    def bytes(self) -> float:
        return self.elements * self.bytes_per_element


def layer_saved_tensors(
    spec: ModelSpec, seq_len: int, micro_batch: int, act_bytes: float, attention: AttentionImpl, moe_layer: bool
) -> list[SavedTensor]:
    """What one transformer layer saves for backward, following Korthikanti et al. 2022 §4.1."""
    s, b, h = seq_len, micro_batch, spec.hidden_size
    sb = s * b
    H, dqk, dv = spec.num_heads, spec.qk_head_dim, spec.v_head_dim
    # Eager attention expands K and V to all H heads before the matmul (repeat_kv); fused kernels don't.
    kv = spec.kv_heads if (attention == "flash" and not spec.mla) else H
    kv_sym = "H_kv" if kv != H else "H"
    tensors = [
        SavedTensor("attention norm input", "s·b·h", sb * h, act_bytes),
        SavedTensor("QKV projection input", "s·b·h", sb * h, act_bytes),
        SavedTensor("Q (after RoPE)", "s·b·H·d_qk", sb * H * dqk, act_bytes),
        SavedTensor("K", f"s·b·{kv_sym}·d_qk", sb * kv * dqk, act_bytes),
        SavedTensor("V", f"s·b·{kv_sym}·d_v", sb * kv * dv, act_bytes),
    ]
    if attention == "eager":
        tensors.append(SavedTensor("softmax output", "b·H·s²", b * H * s * s, act_bytes, attention_core=True))
        if spec.dropout:
            tensors.append(SavedTensor("attention dropout mask", "b·H·s²", b * H * s * s, MASK_BYTES, True))
            tensors.append(SavedTensor("attention dropout output", "b·H·s²", b * H * s * s, act_bytes, True))
    else:
        tensors.append(
            SavedTensor(
                "attention output (for the fused backward)", "s·b·H·d_v", sb * H * dv, act_bytes, attention_core=True
            )
        )
        tensors.append(SavedTensor("log-sum-exp per row (fp32)", "b·H·s", b * H * s, LOGSUMEXP_BYTES, True))
    tensors.append(SavedTensor("output projection input", "s·b·H·d_v", sb * H * dv, act_bytes))
    if spec.dropout:
        tensors.append(SavedTensor("residual dropout mask (attention)", "s·b·h", sb * h, MASK_BYTES))
    tensors.append(SavedTensor("MLP norm input", "s·b·h", sb * h, act_bytes))
    if moe_layer and spec.moe:
        moe = spec.moe
        tensors.append(SavedTensor("router input", "s·b·h", sb * h, act_bytes))
        tensors.append(SavedTensor("router probabilities (fp32)", "s·b·E", sb * moe.num_experts, 4))
        copies = moe.experts_per_token + moe.shared_experts
        tensors += _ffn_saved(spec, sb * copies, moe.expert_ffn_size, act_bytes, "(k+E_shared)·s·b", "f_e")
    else:
        tensors += _ffn_saved(spec, sb, spec.ffn_size, act_bytes, "s·b", "f")
    if spec.dropout:
        tensors.append(SavedTensor("residual dropout mask (MLP)", "s·b·h", sb * h, MASK_BYTES))
    return tensors


def _ffn_saved(
    spec: ModelSpec, rows: float, width: int, act_bytes: float, rows_sym: str, width_sym: str
) -> list[SavedTensor]:
    h = spec.hidden_size
    if spec.ffn_kind == "gelu_mlp":
        return [
            SavedTensor("MLP input", f"{rows_sym}·h", rows * h, act_bytes),
            SavedTensor("GELU input", f"{rows_sym}·{width_sym}", rows * width, act_bytes),
            SavedTensor("down projection input (GELU output)", f"{rows_sym}·{width_sym}", rows * width, act_bytes),
        ]
    act = "SiLU" if spec.ffn_kind == "swiglu" else "GELU"
    return [
        SavedTensor("gate/up input", f"{rows_sym}·h", rows * h, act_bytes),
        SavedTensor(f"gate output ({act} input)", f"{rows_sym}·{width_sym}", rows * width, act_bytes),
        SavedTensor("up output", f"{rows_sym}·{width_sym}", rows * width, act_bytes),
        SavedTensor(f"{act}(gate)", f"{rows_sym}·{width_sym}", rows * width, act_bytes),
        SavedTensor("down projection input (product)", f"{rows_sym}·{width_sym}", rows * width, act_bytes),
    ]


def model_saved_tensors(spec: ModelSpec, seq_len: int, micro_batch: int, act_bytes: float) -> list[SavedTensor]:
    """Saved tensors outside the layers: embedding dropout, final norm, head input, fp32 logits."""
    sb, h = seq_len * micro_batch, spec.hidden_size
    tensors = []
    if spec.dropout:
        tensors.append(SavedTensor("embedding dropout mask", "s·b·h", sb * h, MASK_BYTES))
    tensors += [
        SavedTensor("final norm input", "s·b·h", sb * h, act_bytes),
        SavedTensor("output head input", "s·b·h", sb * h, act_bytes),
        SavedTensor("logits (fp32, for the cross-entropy)", "s·b·V", sb * spec.vocab_size, LOGITS_BYTES),
    ]
    return tensors


@dataclass(frozen=True)
class ActivationMemory:
    dense_layer_bytes: float
    moe_layer_bytes: float
    dense_layers: int
    moe_layers: int
    checkpoint_bytes: float  # per layer under full recompute: the layer input
    recompute_working_bytes: float  # one layer's activations rebuilt during its backward (full recompute)
    model_bytes: float
    recompute: Recompute

    @property
    def layers_bytes(self) -> float:
        if self.recompute == "full":
            return (self.dense_layers + self.moe_layers) * self.checkpoint_bytes + self.recompute_working_bytes
        return self.dense_layers * self.dense_layer_bytes + self.moe_layers * self.moe_layer_bytes

    @property
    def total(self) -> float:
        return self.layers_bytes + self.model_bytes


def _kept(tensors: list[SavedTensor], recompute: Recompute) -> list[SavedTensor]:
    return [t for t in tensors if not (recompute == "selective" and t.attention_core)]


def activation_memory(
    spec: ModelSpec,
    seq_len: int,
    micro_batch: int,
    act_bytes: float,
    attention: AttentionImpl = "flash",
    recompute: Recompute = "none",
) -> ActivationMemory:
    dense = _kept(layer_saved_tensors(spec, seq_len, micro_batch, act_bytes, attention, False), recompute)
    moe = _kept(layer_saved_tensors(spec, seq_len, micro_batch, act_bytes, attention, True), recompute)
    dense_bytes = sum(t.bytes for t in dense)
    moe_bytes = sum(t.bytes for t in moe) if spec.moe else 0.0
    n_moe = spec.moe_layers
    working = max(dense_bytes, moe_bytes) if recompute == "full" else 0.0
    return ActivationMemory(
        dense_layer_bytes=dense_bytes,
        moe_layer_bytes=moe_bytes,
        dense_layers=spec.num_layers - n_moe,
        moe_layers=n_moe,
        checkpoint_bytes=seq_len * micro_batch * spec.hidden_size * act_bytes,
        recompute_working_bytes=working,
        model_bytes=sum(t.bytes for t in model_saved_tensors(spec, seq_len, micro_batch, act_bytes)),
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


def state_section(
    spec: ModelSpec, precision: PrecisionRecipe, optimizer: OptimizerSpec, zero_stage: int, dp: int
) -> Section:
    mem = state_memory(spec, precision, optimizer, zero_stage, dp)
    n = count_params(spec).total
    p_div, g_div, o_div = zero_divisors(zero_stage, dp)
    opt_unsharded = mem.optimizer * o_div

    def shard(div: int) -> str:
        return f" / {div}" if div > 1 else ""

    states = ", ".join(s.name for s in optimizer.states) or "no state"
    return Section(
        "state",
        f"Model states per GPU (ZeRO-{zero_stage}, DP = {dp})",
        (
            Term(
                "params",
                "Parameters",
                mem.params,
                "bytes",
                f"N · {precision.param_bytes:g} B{shard(p_div)}",
                f"{group(n)} × {precision.param_bytes:g}{shard(p_div)}",
                f"precision recipe {precision.name}",
            ),
            Term(
                "grads",
                "Gradients",
                mem.grads,
                "bytes",
                f"N · {precision.grad_bytes:g} B{shard(g_div)}",
                f"{group(n)} × {precision.grad_bytes:g}{shard(g_div)}",
                f"precision recipe {precision.name}",
            ),
            Term(
                "master",
                "Master weights (fp32)",
                mem.master,
                "bytes",
                f"N · {precision.master_bytes:g} B{shard(o_div)}",
                f"{group(n)} × {precision.master_bytes:g}{shard(o_div)}",
                f"precision recipe {precision.name}",
            ),
            Term(
                "optimizer",
                f"Optimizer states ({optimizer.name}: {states})",
                mem.optimizer,
                "bytes",
                "Σ states · N · bytes per state" + shard(o_div),
                f"{format_quantity(opt_unsharded, 'bytes')}{shard(o_div)}",
                "; ".join(optimizer.sources),
            ),
            Term(
                "total",
                "Model states",
                mem.total,
                "bytes",
                "params + grads + master + optimizer",
                source="Rajbhandari et al. 2020 (ZeRO) §3.1, §5.1",
            ),
        ),
    )


def activation_section(
    spec: ModelSpec, seq_len: int, micro_batch: int, act_bytes: float, attention: AttentionImpl, recompute: Recompute
) -> Section:
    act = activation_memory(spec, seq_len, micro_batch, act_bytes, attention, recompute)
    dense = _kept(layer_saved_tensors(spec, seq_len, micro_batch, act_bytes, attention, False), recompute)

    def formula(tensors: list[SavedTensor]) -> str:
        counts: dict[tuple[float, str], int] = {}
        for t in tensors:
            counts[(t.bytes_per_element, t.symbol)] = counts.get((t.bytes_per_element, t.symbol), 0) + 1
        return " + ".join(f"{n * b:g}·{symbol}" for (b, symbol), n in counts.items())

    terms = [
        Term(
            "dense_layer",
            "One dense layer" if spec.moe else "One layer",
            act.dense_layer_bytes,
            "bytes",
            formula(dense),
            f"s={seq_len}, b={micro_batch}, h={spec.hidden_size}, H={spec.num_heads}, "
            f"H_kv={spec.kv_heads}, f={spec.ffn_size}, {act_bytes:g} B/element",
            "Korthikanti et al. 2022 §4.1 eq. (1), tensor by tensor",
            note=f"{attention} attention; {recompute} recomputation",
        ),
    ]
    if spec.moe:
        moe = _kept(layer_saved_tensors(spec, seq_len, micro_batch, act_bytes, attention, True), recompute)
        terms.append(
            Term(
                "moe_layer",
                "One MoE layer",
                act.moe_layer_bytes,
                "bytes",
                formula(moe),
                f"k={spec.moe.experts_per_token}, E_shared={spec.moe.shared_experts}, f_e={spec.moe.expert_ffn_size}",
            )
        )
    if recompute == "full":
        terms.append(
            Term(
                "layers",
                "All layers (full recompute)",
                act.layers_bytes,
                "bytes",
                "L · s·b·h·bytes (layer inputs) + one layer rebuilt during its backward",
                f"{spec.num_layers} × {format_quantity(act.checkpoint_bytes, 'bytes')} + "
                f"{format_quantity(act.recompute_working_bytes, 'bytes')}",
                "Korthikanti et al. 2022 Table 2 (full recomputation: 2sbh per layer)",
            )
        )
    else:
        counts = f"{act.dense_layers} × dense" + (f" + {act.moe_layers} × MoE" if spec.moe else "")
        terms.append(
            Term(
                "layers",
                "All layers",
                act.layers_bytes,
                "bytes",
                counts,
                f"{act.dense_layers} × {format_quantity(act.dense_layer_bytes, 'bytes')}"
                + (f" + {act.moe_layers} × {format_quantity(act.moe_layer_bytes, 'bytes')}" if spec.moe else ""),
            )
        )
    model_tensors = model_saved_tensors(spec, seq_len, micro_batch, act_bytes)
    terms.append(
        Term(
            "outside_layers",
            "Embedding, final norm, head, logits",
            act.model_bytes,
            "bytes",
            formula(model_tensors),
            f"V={spec.vocab_size}",
            "Korthikanti et al. 2022 §4.3 (extra terms: final LN, output layer, fp32 logits)",
        )
    )
    terms.append(Term("total", "Activations", act.total, "bytes", "layers + outside the layers"))
    return Section("activations", f"Activations per GPU (micro-batch {micro_batch} × {seq_len} tokens)", tuple(terms))
