"""Parameter count: every weight tensor of the model, listed in the order the model is built.

The count follows the module structure of the reference implementations (GPT-2/nanoGPT, Llama, Mixtral,
Qwen2, OLMo 2, DeepSeek-V3): token embedding, learned positions, then per layer the attention
projections, their biases and norms, the feed-forward (dense, or router + routed and shared experts),
then the final norm and the output head. Nothing is approximated: the total is a sum of products of
integer shapes, and a test compares it with each model's published count and with ``nn.Module``.

Each tensor also says whether it is a matmul weight (2 FLOPs per element per token in the forward
pass, Kaplan et al. 2020 §2.1) and how many copies of it one token touches (MoE routes to top-k).
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

from lmcalc.result import Section, Term
from lmcalc.specs import ModelSpec
from lmcalc.units import group

GROUPS = ("embedding", "position", "attention", "norm", "mlp", "router", "experts", "shared_experts", "head")
GROUP_LABELS = {
    "embedding": "Token embedding",
    "position": "Position embedding (learned)",
    "attention": "Attention projections",
    "norm": "Norms",
    "mlp": "Dense MLP",
    "router": "MoE router",
    "experts": "Routed experts",
    "shared_experts": "Shared experts",
    "head": "Output head (untied)",
}


@dataclass(frozen=True)
class WeightTensor:
    """``count`` copies of a tensor of ``shape``; ``active`` of them are used by each token."""

    name: str
    group: str
    shape: tuple[int, ...]
    symbols: tuple[str, ...]
    count: int
    count_symbol: str
    active: float
    matmul: bool

    @property
    def numel(self) -> int:
        return prod(self.shape)

    @property
    def total(self) -> int:
        return self.count * self.numel

    @property
    def active_total(self) -> float:
        return self.active * self.numel


def _norm(name: str, group_: str, size: int, symbol: str, spec: ModelSpec, count: int, count_symbol: str):
    tensors = [WeightTensor(f"{name}.weight", group_, (size,), (symbol,), count, count_symbol, count, False)]
    if spec.norm_kind == "layernorm":
        tensors.append(WeightTensor(f"{name}.bias", group_, (size,), (symbol,), count, count_symbol, count, False))
    return tensors


def _linear(
    name: str,
    group_: str,
    out: int,
    inp: int,
    out_sym: str,
    in_sym: str,
    count: int,
    count_symbol: str,
    bias: bool,
    active: float | None = None,
) -> list[WeightTensor]:
    used = count if active is None else active
    tensors = [WeightTensor(f"{name}.weight", group_, (out, inp), (out_sym, in_sym), count, count_symbol, used, True)]
    if bias:
        tensors.append(WeightTensor(f"{name}.bias", group_, (out,), (out_sym,), count, count_symbol, used, False))
    return tensors


def _attention(spec: ModelSpec, n: int) -> list[WeightTensor]:
    h, heads, kv, d = spec.hidden_size, spec.num_heads, spec.kv_heads, spec.head_size
    qkv_bias = spec.attention_bias in ("qkv", "all")
    out_bias = spec.attention_bias == "all"
    if spec.mla:
        m = spec.mla
        tensors: list[WeightTensor] = []
        if m.q_lora_rank:
            tensors += _linear("attn.q_a", "attention", m.q_lora_rank, h, "r_q", "h", n, "L", qkv_bias)
            tensors += _norm("attn.q_a_norm", "attention", m.q_lora_rank, "r_q", spec, n, "L")
            tensors += _linear(
                "attn.q_b", "attention", heads * m.qk_head_dim, m.q_lora_rank, "H·d_qk", "r_q", n, "L", qkv_bias
            )
        else:
            tensors += _linear("attn.q", "attention", heads * m.qk_head_dim, h, "H·d_qk", "h", n, "L", qkv_bias)
        tensors += _linear(
            "attn.kv_a", "attention", m.kv_lora_rank + m.qk_rope_head_dim, h, "(r_kv+d_rope)", "h", n, "L", qkv_bias
        )
        tensors += _norm("attn.kv_a_norm", "attention", m.kv_lora_rank, "r_kv", spec, n, "L")
        tensors += _linear(
            "attn.kv_b",
            "attention",
            heads * (m.qk_nope_head_dim + m.v_head_dim),
            m.kv_lora_rank,
            "H·(d_nope+d_v)",
            "r_kv",
            n,
            "L",
            qkv_bias,
        )
        tensors += _linear("attn.o", "attention", h, heads * m.v_head_dim, "h", "H·d_v", n, "L", out_bias)
        return tensors
    tensors = _linear("attn.q", "attention", heads * d, h, "H·d", "h", n, "L", qkv_bias)
    tensors += _linear("attn.k", "attention", kv * d, h, "H_kv·d", "h", n, "L", qkv_bias)
    tensors += _linear("attn.v", "attention", kv * d, h, "H_kv·d", "h", n, "L", qkv_bias)
    tensors += _linear("attn.o", "attention", h, heads * d, "h", "H·d", n, "L", out_bias)
    if spec.qk_norm == "full":
        tensors += _norm("attn.q_norm", "attention", heads * d, "H·d", spec, n, "L")
        tensors += _norm("attn.k_norm", "attention", kv * d, "H_kv·d", spec, n, "L")
    elif spec.qk_norm == "per_head":
        tensors += _norm("attn.q_norm", "attention", d, "d", spec, n, "L")
        tensors += _norm("attn.k_norm", "attention", d, "d", spec, n, "L")
    return tensors


def _ffn(
    prefix: str,
    group_: str,
    spec: ModelSpec,
    width: int,
    width_sym: str,
    count: int,
    count_symbol: str,
    active: float | None = None,
) -> list[WeightTensor]:
    h, bias = spec.hidden_size, spec.mlp_bias
    if spec.ffn_kind == "gelu_mlp":
        return _linear(f"{prefix}.fc", group_, width, h, width_sym, "h", count, count_symbol, bias, active) + _linear(
            f"{prefix}.proj", group_, h, width, "h", width_sym, count, count_symbol, bias, active
        )
    return (
        _linear(f"{prefix}.gate", group_, width, h, width_sym, "h", count, count_symbol, bias, active)
        + _linear(f"{prefix}.up", group_, width, h, width_sym, "h", count, count_symbol, bias, active)
        + _linear(f"{prefix}.down", group_, h, width, "h", width_sym, count, count_symbol, bias, active)
    )


def weight_tensors(spec: ModelSpec) -> list[WeightTensor]:
    """Every parameter tensor of the model, in build order, with multiplicities."""
    h, L = spec.hidden_size, spec.num_layers
    tensors = [WeightTensor("embed.weight", "embedding", (spec.vocab_size, h), ("V", "h"), 1, "1", 1, False)]
    if spec.position_embedding == "learned":
        tensors.append(
            WeightTensor("pos_embed.weight", "position", (spec.max_seq_len, h), ("s_max", "h"), 1, "1", 1, False)
        )
    tensors += _attention(spec, L)
    tensors += _norm("attn_norm", "norm", h, "h", spec, L, "L")
    tensors += _norm("mlp_norm", "norm", h, "h", spec, L, "L")
    moe = spec.moe
    if moe is None:
        tensors += _ffn("mlp", "mlp", spec, spec.ffn_size, "f", L, "L")
    else:
        n_moe = spec.moe_layers
        if moe.dense_layers:
            tensors += _ffn("dense_mlp", "mlp", spec, spec.ffn_size, "f", moe.dense_layers, "L_dense")
        tensors.append(
            WeightTensor("router.weight", "router", (moe.num_experts, h), ("E", "h"), n_moe, "L_moe", n_moe, True)
        )
        if moe.router_bias:
            tensors.append(
                WeightTensor("router.bias", "router", (moe.num_experts,), ("E",), n_moe, "L_moe", n_moe, False)
            )
        tensors += _ffn(
            "experts",
            "experts",
            spec,
            moe.expert_ffn_size,
            "f_e",
            n_moe * moe.num_experts,
            "L_moe·E",
            active=n_moe * moe.experts_per_token,
        )
        if moe.shared_experts:
            tensors += _ffn(
                "shared_experts",
                "shared_experts",
                spec,
                moe.expert_ffn_size,
                "f_e",
                n_moe * moe.shared_experts,
                "L_moe·E_shared",
            )
    tensors += _norm("final_norm", "norm", h, "h", spec, 1, "1")
    if not spec.tied_embeddings:
        tensors.append(WeightTensor("lm_head.weight", "head", (spec.vocab_size, h), ("V", "h"), 1, "1", 1, False))
    return tensors


@dataclass(frozen=True)
class ParamCount:
    """Totals of a model's parameters: by group, all of them, and those one token uses."""

    by_group: dict[str, int]
    total: int
    active: int
    embedding: int

    @property
    def non_embedding(self) -> int:
        return self.total - self.embedding


def count_params(spec: ModelSpec) -> ParamCount:
    tensors = weight_tensors(spec)
    by_group: dict[str, int] = {}
    for t in tensors:
        by_group[t.group] = by_group.get(t.group, 0) + t.total
    total = sum(by_group.values())
    active = round(sum(t.active_total for t in tensors))
    embedding = by_group.get("embedding", 0) + by_group.get("position", 0)
    return ParamCount(by_group=by_group, total=total, active=active, embedding=embedding)


def matches_published(spec: ModelSpec, total: int) -> bool:
    """``total`` equals the published count, to the significant figures its source prints."""
    digits = spec.published_params_sig_figs
    return (float(f"{total:.{digits}g}") if digits else total) == spec.published_params


def _group_formula(tensors: list[WeightTensor], active: bool = False) -> tuple[str, str]:
    parts, numbers = [], []
    for t in tensors:
        count_sym = t.count_symbol if not active or t.active == t.count else "L_moe·k"
        count = t.active if active else t.count
        shape = "·".join(t.symbols)
        parts.append(shape if count_sym == "1" else f"{count_sym}·{shape}")
        dims = "×".join(str(d) for d in t.shape)
        numbers.append(dims if count == 1 else f"{group(count)}×{dims}")
    return " + ".join(parts), " + ".join(numbers)


def params_section(spec: ModelSpec) -> Section:
    """The parameter breakdown as terms, each group with its formula and numbers substituted."""
    tensors = weight_tensors(spec)
    counts = count_params(spec)
    terms = []
    for name in GROUPS:
        members = [t for t in tensors if t.group == name]
        if not members:
            continue
        formula, numbers = _group_formula(members)
        terms.append(Term(name, GROUP_LABELS[name], counts.by_group[name], "params", formula, numbers))
    terms.append(
        Term(
            "total",
            "Total parameters",
            counts.total,
            "params",
            "sum of the rows above",
            " + ".join(group(counts.by_group[g]) for g in GROUPS if g in counts.by_group),
        )
    )
    if spec.moe:
        expert = [t for t in tensors if t.group == "experts"]
        formula, numbers = _group_formula(expert, active=True)
        terms.append(
            Term(
                "active",
                "Active parameters per token",
                counts.active,
                "params",
                f"total − routed experts + {formula}",
                f"{group(counts.total)} − {group(counts.by_group['experts'])} + ({numbers})",
                note=f"each token uses {spec.moe.experts_per_token} of {spec.moe.num_experts} routed "
                "experts per MoE layer",
            )
        )
    terms.append(
        Term(
            "non_embedding",
            "Non-embedding parameters",
            counts.non_embedding,
            "params",
            "total − token and position embeddings",
            f"{group(counts.total)} − {group(counts.embedding)}",
            note="the N of Kaplan et al. 2020; the output head counts when untied",
        )
    )
    return Section("params", "Parameters", tuple(terms))
