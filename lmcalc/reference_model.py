"""A plain PyTorch implementation of any ModelSpec: the real thing lmcalc's numbers are checked against.

It is written to be read: one class per block, the layers in the order the engine counts them. It builds on any
device, ``meta`` included (a 405B model in seconds, no memory), in two attention flavours: ``eager`` (scores
materialised, K/V expanded to every head for GQA as transformers' repeat_kv does) and ``flash``
(``F.scaled_dot_product_attention`` with native GQA; on CUDA only its fused kernels). RMSNorm saves only its input and
the reciprocal RMS, as fused kernels (Apex, Transformer Engine, Liger) do. MoE routing is real top-k on real data; on
the meta device, where values do not exist, tokens are spread evenly over the experts (the FLOP total does not depend
on the split: every routed token-expert pair costs the same).

torch is imported here and nowhere in the accounting path.
"""

from __future__ import annotations

import math
from contextlib import nullcontext

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.checkpoint import checkpoint

from lmcalc.engine.choices import Attention as AttentionImpl
from lmcalc.engine.choices import Recompute
from lmcalc.errors import LmcalcError, setting
from lmcalc.reference_kernels import RMSNorm, XIELUFunction
from lmcalc.reference_sparse import Indexer
from lmcalc.specs import ModelSpec

FUSED_CUDA_KERNELS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION]
"""``flash`` on CUDA: any of PyTorch's fused attention kernels (each saves the output and the row
log-sum-exp, not the scores), never the math fallback."""
NO_KERNEL = "No available kernel"  # how PyTorch's sdpa says that no enabled kernel takes the case
DROPOUT_P = 0.1  # the GPT-2/GPT-3 setting, used when the spec says the model trained with dropout


def make_norm(spec: ModelSpec, size: int, **kw) -> nn.Module:
    if spec.norm_kind == "rmsnorm":
        return RMSNorm(size, weight=spec.norm_weight, **kw)
    if not spec.norm_weight:  # OLMo's: no weight, no bias
        return nn.LayerNorm(size, elementwise_affine=False, **kw)
    return nn.LayerNorm(size, bias=spec.norm_kind == "layernorm", **kw)


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on the last dimension (Su et al. 2021), the half-split form Llama uses."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def _l2_norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:  # Llama4TextL2Norm: on an fp32 copy, no weight
    return (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)).type_as(x)


def _repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    """Each head ``groups`` times, expanded then reshaped: a copy, but a view for one KV head of one sequence."""
    b, kv, s, d = x.shape
    return x[:, :, None].expand(b, kv, groups, s, d).reshape(b, kv * groups, s, d)


class Attention(nn.Module):
    """Multi-head attention with GQA/MQA, optional QKV bias and QK-norm, or DeepSeek's latent attention."""

    def __init__(self, spec: ModelSpec, impl: AttentionImpl, local: bool = False, **kw):
        super().__init__()
        self.spec, self.impl, self.local = spec, impl, local
        h, heads, kv, d = spec.hidden_size, spec.num_heads, spec.kv_heads, spec.head_size
        qkv_bias, out_bias = spec.attention_bias in ("qkv", "all"), spec.attention_bias in ("out", "all")
        if spec.mla:
            m = spec.mla
            if m.q_lora_rank:
                self.q_a = nn.Linear(h, m.q_lora_rank, bias=qkv_bias, **kw)
                self.q_a_norm = make_norm(spec, m.q_lora_rank, **kw)
                self.q_b = nn.Linear(m.q_lora_rank, heads * m.qk_head_dim, bias=qkv_bias, **kw)
            else:
                self.q = nn.Linear(h, heads * m.qk_head_dim, bias=qkv_bias, **kw)
            self.kv_a = nn.Linear(h, m.kv_lora_rank + m.qk_rope_head_dim, bias=qkv_bias, **kw)
            self.kv_a_norm = make_norm(spec, m.kv_lora_rank, **kw)
            self.kv_b = nn.Linear(m.kv_lora_rank, heads * (m.qk_nope_head_dim + m.v_head_dim), bias=qkv_bias, **kw)
            self.o = nn.Linear(heads * m.v_head_dim, h, bias=out_bias, **kw)
            self.indexer = Indexer(spec, **kw) if m.indexer else None  # DeepSeek sparse attention
            return
        kv, dv = self.kv_heads, spec.v_head_dim  # MiMo-V2-Flash: a local layer's own KV heads, values of d_v
        self.q = nn.Linear(h, heads * d, bias=qkv_bias, **kw)
        self.k = nn.Linear(h, kv * d, bias=qkv_bias, **kw)
        self.v = nn.Linear(h, kv * dv, bias=qkv_bias, **kw)
        self.o = nn.Linear(heads * dv, h, bias=out_bias, **kw)
        if spec.qk_norm == "full":
            self.q_norm, self.k_norm = make_norm(spec, heads * d, **kw), make_norm(spec, kv * d, **kw)
        elif spec.qk_norm == "per_head":
            self.q_norm, self.k_norm = make_norm(spec, d, **kw), make_norm(spec, d, **kw)
        if spec.differential_attention:  # DiffLlama: λ's four vectors, and a weightless norm per head pair
            self.lambda_q1, self.lambda_k1, self.lambda_q2, self.lambda_k2 = (
                nn.Parameter(torch.zeros(d, **kw)) for _ in range(4)
            )
            self.pair_norm = RMSNorm(2 * d, weight=False, **kw)
        if spec.sub_norms:  # BitNet: a norm on the attention's output, before the output projection
            self.sub_norm = make_norm(spec, heads * d, **kw)
        if spec.attention_sinks and (local or not spec.sinks_local_only):  # gpt-oss: a logit per head in each softmax
            self.sinks = nn.Parameter(torch.zeros(heads, **kw))

    @property
    def kv_heads(self) -> int:  # this layer's: a local layer's own where the model gives them
        return self.spec.local_kv_heads if self.local and self.spec.local_kv_heads else self.spec.kv_heads

    def project(self, x, cos, sin, causal_bias):
        """Queries, keys and values as (batch, heads, seq, dim), RoPE applied, and the mask the attention takes: the
        causal one, or DeepSeek sparse attention's selection."""
        spec = self.spec
        b, s, _ = x.shape
        heads = spec.num_heads
        if spec.mla:
            m = spec.mla
            q_latent = self.q_a_norm(self.q_a(x)) if m.q_lora_rank else None  # the indexer's queries read it too
            q = (self.q_b(q_latent) if m.q_lora_rank else self.q(x)).view(b, s, heads, m.qk_head_dim).transpose(1, 2)
            q_nope, q_rope = q.split([m.qk_nope_head_dim, m.qk_rope_head_dim], dim=-1)
            latent, k_rope = self.kv_a(x).split([m.kv_lora_rank, m.qk_rope_head_dim], dim=-1)
            kv = self.kv_b(self.kv_a_norm(latent)).view(b, s, heads, m.qk_nope_head_dim + m.v_head_dim)
            k_nope, v = kv.transpose(1, 2).split([m.qk_nope_head_dim, m.v_head_dim], dim=-1)
            k_rope = rotary(k_rope.view(b, 1, s, m.qk_rope_head_dim), cos, sin).expand(b, heads, s, -1)
            q = torch.cat((q_nope, rotary(q_rope, cos, sin)), dim=-1)
            k = torch.cat((k_nope, k_rope), dim=-1)
            if self.indexer is not None:
                causal_bias = self.indexer.selection(x, q_latent, causal_bias)
            return q, k, v.contiguous(), causal_bias  # V on its own, not a view that keeps the up-projection alive
        kv, d, dv = self.kv_heads, spec.head_size, spec.v_head_dim
        q, k, v = self.q(x), self.k(x), self.v(x)
        if spec.qkv_clip:  # OLMo: each clamped in place, which keeps its input
            q, k, v = (t.clamp_(-spec.qkv_clip, spec.qkv_clip) for t in (q, k, v))
        if spec.qk_norm == "full":
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = (t.view(b, s, n, w).transpose(1, 2) for t, n, w in ((q, heads, d), (k, kv, d), (v, kv, dv)))
        if spec.qk_norm == "per_head":
            q, k = self.q_norm(q), self.k_norm(k)
        if spec.position_embedding == "rope":
            q, k = rotary(q, cos, sin), rotary(k, cos, sin)
        if self.local and spec.local_qk_l2_norm:  # Llama 4: a weightless L2 norm a head, upcast to fp32
            return _l2_norm(q), _l2_norm(k), v, causal_bias
        return q, k, v, causal_bias

    def core(self, q, k, v, causal_bias):
        """softmax(QKᵀ/√d + causal mask)·V."""
        p = DROPOUT_P if (self.spec.drops("attention") and self.training) else 0.0
        groups = q.shape[1] // k.shape[1]
        if self.impl == "flash":
            # A CUDA case no fused kernel takes would silently run the math kernel, which keeps the fp32
            # b·H·s² scores: refuse it, so that a memory check never measures the wrong kernel.
            try:
                masked = self.local or getattr(self, "indexer", None) is not None  # the window's or the selection's
                mask = {"attn_mask": causal_bias[..., : q.shape[2], : q.shape[2]]} if masked else {"is_causal": True}
                with sdpa_kernel(FUSED_CUDA_KERNELS) if q.device.type == "cuda" else nullcontext():
                    return F.scaled_dot_product_attention(q, k, v, dropout_p=p, enable_gqa=groups > 1, **mask)
            except RuntimeError as exc:
                if NO_KERNEL not in str(exc):
                    raise
                gqa = " with grouped-query attention" if groups > 1 else ""
                raise LmcalcError(
                    f"no fused attention kernel on this {q.device.type} takes {str(q.dtype).removeprefix('torch.')}, "
                    f"head size {q.shape[-1]}{gqa}; try {setting('attention')} eager or another {setting('dtype')}"
                ) from exc
        if groups > 1:  # eager GQA: every query head gets its group's K and V, as transformers' repeat_kv expands them
            k, v = _repeat_kv(k, groups), _repeat_kv(v, groups)
        s = q.shape[2]
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
        if self.spec.attention_softcap:  # Gemma 2: c·tanh(scores/c) before the mask; tanh keeps its output
            cap = self.spec.attention_softcap
            scores = cap * torch.tanh(scores / cap)
        scores = scores + causal_bias[..., :s, :s]
        if self.spec.eager_score_clamp:  # XGLM: max(scores, the dtype's minimum), which keeps the scores
            scores = torch.maximum(scores, torch.tensor(torch.finfo(scores.dtype).min, device=scores.device))
        if hasattr(self, "sinks") and self.spec.sink_scale:  # Granite SWA: the output scaled by σ(lse − sink)
            scale = (torch.logsumexp(scores, dim=-1) - self.sinks.view(1, -1, 1)).float().sigmoid()
            out = F.dropout(torch.softmax(scores, dim=-1), p, self.training) @ v
            return out * scale.unsqueeze(-1).to(out.dtype)
        if hasattr(self, "sinks"):  # the sink joins each row's softmax, then is dropped
            sink = self.sinks.view(1, -1, 1, 1).expand(scores.shape[0], -1, s, 1)
            probs = torch.softmax(torch.cat((scores, sink), dim=-1), dim=-1)[..., :s]
        else:
            probs = torch.softmax(scores, dim=-1)
        return F.dropout(probs, p, self.training) @ v

    def attend(self, q, k, v, causal_bias, selective: bool):
        if selective:  # Korthikanti et al. 2022: recompute only the attention core in backward
            return checkpoint(self.core, q, k, v, causal_bias, use_reentrant=False)
        return self.core(q, k, v, causal_bias)

    def differential(self, q, k, v, causal_bias, selective: bool):
        """Ye et al. 2025 (DiffLlama's form): one attention over each half of V's heads, repeated to all of them;
        per head pair, the first's output less λ times the second's, normalised and scaled by 1 − λ_init (λ_init's
        value, 0.8 here, changes nothing lmcalc counts)."""
        halves = (half.repeat(1, 2, 1, 1) for half in v.chunk(2, dim=1))
        out = torch.cat([self.attend(q, k, half, causal_bias, selective) for half in halves], dim=-1)
        first, second = out.chunk(2, dim=1)  # (b, H/2, s, 2d) each: the head pairs
        lam = torch.exp((self.lambda_q1 * self.lambda_k1).sum()) - torch.exp((self.lambda_q2 * self.lambda_k2).sum())
        return (1 - 0.8) * self.pair_norm(first - (lam + 0.8) * second)

    def forward(self, x, cos, sin, causal_bias, selective: bool):
        b, s, _ = x.shape
        q, k, v, causal_bias = self.project(x, cos, sin, causal_bias)
        if self.spec.differential_attention:
            out = self.differential(q, k, v, causal_bias, selective)
        else:
            out = self.attend(q, k, v, causal_bias, selective)
        out = out.transpose(1, 2).reshape(b, s, -1)
        return self.o(self.sub_norm(out) if self.spec.sub_norms else out)


def _two_matrix_act(x: torch.Tensor, activation: str) -> torch.Tensor:
    """A two-matrix MLP's activation: a GELU kernel (tanh form), ReLU (OPT) or squared ReLU (Persimmon)."""
    if activation == "relu":
        return F.relu(x)
    if activation == "relu2":
        return torch.square(F.relu(x))
    return F.gelu(x, approximate="tanh")


SWIGLU_ALPHA = 1.702  # gpt-oss's σ(α·g) (GptOssConfig.swiglu_alpha)


def _clamped_swiglu(gate: torch.Tensor, up: torch.Tensor, limit: float) -> torch.Tensor:
    """gpt-oss's (up + 1)·g·σ(α·g), g clamped above and up both ways at ``limit``, op by op as GptOssExperts runs it."""
    gate, up = gate.clamp(max=limit), up.clamp(min=-limit, max=limit)
    return (up + 1) * (gate * torch.sigmoid(gate * SWIGLU_ALPHA))


def _gate_act(kind: str, activation: str):
    """A gated MLP's activation: SiLU (SwiGLU), ReLU or squared ReLU where the spec says (BitNet), else GELU."""
    if activation in ("relu", "relu2"):
        return lambda x: _two_matrix_act(x, activation)
    return F.silu if kind == "swiglu" else F.gelu


class FeedForward(nn.Module):
    """GELU or ReLU MLP (GPT, OPT) or gated MLP (SwiGLU: Llama; GeGLU: Gemma)."""

    def __init__(self, spec: ModelSpec, width: int, **kw):
        super().__init__()
        h, bias = spec.hidden_size, spec.mlp_bias
        self.kind, self.activation, self.limit = spec.ffn_kind, spec.activation, spec.swiglu_limit
        if self.kind == "gelu_mlp":
            self.fc, self.proj = nn.Linear(h, width, bias=bias, **kw), nn.Linear(width, h, bias=bias, **kw)
            if self.activation == "xielu":  # Apertus: two learnt scalars
                self.alpha_p, self.alpha_n = (nn.Parameter(torch.zeros(1, **kw)) for _ in range(2))
        else:
            self.gate, self.up = nn.Linear(h, width, bias=bias, **kw), nn.Linear(h, width, bias=bias, **kw)
            self.down = nn.Linear(width, h, bias=bias, **kw)
            self.sub_norm = make_norm(spec, width, **kw) if spec.sub_norms else None  # BitNet's, before down

    def forward(self, x):
        if self.kind == "gelu_mlp" and self.activation == "xielu":  # Apertus: one kernel, keeping its input
            return self.proj(XIELUFunction.apply(self.fc(x), self.alpha_p, self.alpha_n))
        if self.kind == "gelu_mlp":
            return self.proj(_two_matrix_act(self.fc(x), self.activation))
        if self.limit:
            return self.down(_clamped_swiglu(self.gate(x), self.up(x), self.limit))
        product = _gate_act(self.kind, self.activation)(self.gate(x)) * self.up(x)
        return self.down(self.sub_norm(product) if self.sub_norm is not None else product)


def batched_experts(experts: nn.ModuleList, xs: torch.Tensor) -> torch.Tensor:
    """Every expert on its own (tokens × h) slice of ``xs`` (experts × tokens × h), as batched matmuls."""

    def linear(name: str, inputs: torch.Tensor) -> torch.Tensor:
        layers = [getattr(e, name) for e in experts]
        out = torch.bmm(inputs, torch.stack([layer.weight for layer in layers]).transpose(1, 2))
        if layers[0].bias is not None:
            out = out + torch.stack([layer.bias for layer in layers])[:, None, :]
        return out

    if experts[0].kind == "gelu_mlp":
        return linear("proj", _two_matrix_act(linear("fc", xs), str(experts[0].activation)))
    limit: float | None = getattr(experts[0], "limit")  # noqa: B009 (typed: an nn.Module's attribute is not)
    if limit:
        return linear("down", _clamped_swiglu(linear("gate", xs), linear("up", xs), limit))
    act = _gate_act(str(experts[0].kind), str(experts[0].activation))
    return linear("down", act(linear("gate", xs)) * linear("up", xs))


class MoE(nn.Module):
    """Top-k routed experts (softmax router, Mixtral; with a score bias, DeepSeek-V3) plus shared experts; dropless,
    or with a capacity (``with_capacity``). Zero-computation experts (LongCat-Flash) pass their tokens through."""

    capacity_factor: float | None = None  # dropless

    def __init__(self, spec: ModelSpec, **kw):
        super().__init__()
        moe = spec.moe
        assert moe is not None
        self.k, self.num_experts, self.slots = moe.k, moe.num_experts, moe.router_outputs
        self.router = nn.Linear(spec.hidden_size, self.slots, bias=False, **kw)
        if moe.router_bias:
            self.router_bias = nn.Parameter(torch.zeros(self.slots, **kw))
        self.experts = nn.ModuleList(FeedForward(spec, moe.expert_ffn_size, **kw) for _ in range(moe.num_experts))
        self.shared = nn.ModuleList(FeedForward(spec, moe.shared_width, **kw) for _ in range(moe.shared_experts))
        if moe.shared_expert_gate:  # Qwen2-MoE: sigmoid(x·w) scales the shared experts' output
            self.shared_gate = nn.Linear(spec.hidden_size, 1, bias=False, **kw)

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        probs = torch.softmax(self.router(x).float(), dim=-1)
        # DeepSeek-V3 adds its bias only to choose the experts; the weights are the unbiased scores.
        scores = probs + self.router_bias if hasattr(self, "router_bias") else probs
        experts = scores.topk(self.k, dim=-1).indices
        weights = probs.gather(-1, experts)
        order = experts.reshape(-1).argsort()
        token_of = order // self.k
        flat_weights = weights.reshape(-1)[order].to(x.dtype)
        if x.is_meta and self.capacity_factor is not None:
            raise ValueError("a capacity drops tokens by the routing's values, which the meta device has none of")
        if self.capacity_factor is not None and self.slots > self.num_experts:
            raise ValueError("an expert capacity beside zero-computation experts is not modelled")
        if x.is_meta and token_of.numel() % self.slots == 0:
            # No values on meta: an even split, run as one batched matmul per projection (the FLOP
            # total is the same for any split: every routed token-expert pair costs the same).
            rows, weighted, E = token_of.view(self.slots, -1), flat_weights.view(self.slots, -1, 1), self.num_experts
            y = torch.cat([batched_experts(self.experts, x[rows[:E]]) * weighted[:E], x[rows[E:]] * weighted[E:]])
            out = torch.zeros_like(x).index_add(0, token_of, y.reshape(-1, x.shape[-1]))
        elif x.is_meta:
            raise ValueError("on the meta device, tokens × experts_per_token must split evenly over the experts")
        elif self.capacity_factor is not None:
            counts = torch.bincount(experts.reshape(-1), minlength=self.num_experts).tolist()
            out = self._to_capacity(x, token_of, flat_weights, counts)
        else:
            counts = torch.bincount(experts.reshape(-1), minlength=self.slots).tolist()
            out = torch.zeros_like(x)
            start = 0
            passes = (nn.Identity(),) * (self.slots - self.num_experts)  # zero-computation experts
            for expert, count in zip((*self.experts, *passes), counts, strict=True):
                if count:
                    rows = token_of[start : start + count]
                    y = expert(x[rows]) * flat_weights[start : start + count, None]
                    out = out.index_add(0, rows, y)
                start += count
        shared_out = sum((shared(x) for shared in self.shared), torch.zeros_like(x))
        if hasattr(self, "shared_gate"):
            shared_out = torch.sigmoid(self.shared_gate(x)) * shared_out
        return (out + shared_out).reshape(shape)

    def _to_capacity(self, x, token_of, flat_weights, counts):
        """Each expert keeps its first ``capacity`` = ⌈k·T·C/E⌉ tokens, drops the rest, and computes its input padded
        with zero rows to ``capacity`` (Megatron-Core's drop-and-pad, GShard's fixed expert buffers): the padding
        points at a zero row appended to the tokens, and its outputs, weighted 0, at a row dropped after."""
        tokens, h = x.shape
        capacity = math.ceil(self.k * tokens * self.capacity_factor / self.num_experts)
        padded = torch.cat([x, x.new_zeros(1, h)])
        out = x.new_zeros(tokens + 1, h)
        start = 0
        for expert, count in zip(self.experts, counts, strict=True):
            kept, pad = min(count, capacity), capacity - min(count, capacity)
            rows = torch.cat([token_of[start : start + kept], token_of.new_full((pad,), tokens)])
            weights = torch.cat([flat_weights[start : start + kept], flat_weights.new_zeros(pad)])
            out = out.index_add(0, rows, expert(padded[rows]) * weights[:, None])
            start += count
        return out[:tokens]


def with_capacity(model: nn.Module, capacity_factor: float) -> nn.Module:
    """``model`` with every MoE layer's experts at a capacity of ``capacity_factor`` times their balanced share,
    padded to it (``MoE._to_capacity``); on tensors with values (the capacity drops by the routing's values)."""
    for module in model.modules():
        if isinstance(module, MoE):
            module.capacity_factor = capacity_factor
    return model


class Block(nn.Module):
    """Pre-norm attention then MLP (post-norm: GPT-1's norm after each residual add); with sandwich norms (Gemma
    2/3), a norm on each output too; a parallel block (GPT-NeoX, Falcon, Cohere) adds both to the residual at once,
    from one norm or from one each."""

    def __init__(self, spec: ModelSpec, layer: int, impl: AttentionImpl, **kw):
        super().__init__()
        h, moe_layer = spec.hidden_size, spec.is_moe_layer(layer)
        self.attn_norm = make_norm(spec, h, **kw)
        self.attn = Attention(spec, impl, spec.is_local_layer(layer), **kw)
        if spec.norms_per_layer >= 2:
            self.mlp_norm = make_norm(spec, h, **kw)
        if spec.norms_per_layer == 4:
            self.post_attn_norm, self.post_mlp_norm = make_norm(spec, h, **kw), make_norm(spec, h, **kw)
        self.mlp = MoE(spec, **kw) if moe_layer else FeedForward(spec, spec.ffn_size, **kw)
        self.p, self.parallel = DROPOUT_P if spec.drops("residual") else 0.0, spec.parallel_block
        self.post_norm = spec.post_norm
        if spec.last_layer_out_bias and layer == spec.num_layers - 1:  # GPT-NeoX-Japanese's dense_bias
            self.out_bias = nn.Parameter(torch.zeros(h, **kw))

    def forward(self, x, cos, sin, causal_bias, selective: bool = False):
        def post(name: str, y):
            return getattr(self, name)(y) if hasattr(self, name) else y

        if self.post_norm:  # GPT-1: each norm after its residual add
            x = self.attn_norm(x + F.dropout(self.attn(x, cos, sin, causal_bias, selective), self.p, self.training))
            return self.mlp_norm(x + F.dropout(self.mlp(x), self.p, self.training))
        normed = self.attn_norm(x)
        attn = post("post_attn_norm", self.attn(normed, cos, sin, causal_bias, selective))
        attn = F.dropout(attn + self.out_bias if hasattr(self, "out_bias") else attn, self.p, self.training)
        if self.parallel:
            mlp_in = self.mlp_norm(x) if hasattr(self, "mlp_norm") else normed
            return x + attn + F.dropout(self.mlp(mlp_in), self.p, self.training)
        x = x + attn
        return x + F.dropout(post("post_mlp_norm", self.mlp(self.mlp_norm(x))), self.p, self.training)


class ReferenceModel(nn.Module):
    """Embedding, L blocks, final norm, output head — in the order ``engine.model.params`` counts them."""

    def __init__(self, spec: ModelSpec, attention: AttentionImpl = "flash", max_seq: int | None = None, **kw):
        super().__init__()
        self.spec = spec
        h = spec.hidden_size
        self.embed = nn.Embedding(spec.vocab_size, h, **kw)
        if spec.position_embedding == "learned":
            self.pos_embed = nn.Embedding(spec.max_seq_len + spec.position_offset, h, **kw)
        if spec.embedding_norm:
            self.embed_norm = make_norm(spec, h, **kw)
        self.layers = nn.ModuleList(Block(spec, i, attention, **kw) for i in range(spec.num_layers))
        if not spec.post_norm:  # a post-norm model's last layer ends in its norm
            self.final_norm = make_norm(spec, h, **kw)
        if not spec.tied_embeddings:
            self.lm_head = nn.Linear(h, spec.vocab_size, bias=False, **kw)
        if spec.head_bias:  # its own tensor, tied head or not
            self.head_bias = nn.Parameter(torch.zeros(spec.vocab_size, **kw))
        seq = max_seq or spec.max_seq_len
        rope_dim = spec.mla.qk_rope_head_dim if spec.mla else spec.head_size
        device = kw.get("device")
        inv_freq = 1.0 / (10000 ** (torch.arange(0, rope_dim, 2, device=device, dtype=torch.float32) / rope_dim))
        angles = torch.outer(torch.arange(seq, device=device, dtype=torch.float32), inv_freq)
        angles = torch.cat((angles, angles), dim=-1)
        dtype = kw.get("dtype") or torch.get_default_dtype()
        self.register_buffer("cos", angles.cos().to(dtype), persistent=False)
        self.register_buffer("sin", angles.sin().to(dtype), persistent=False)
        mask = torch.full((seq, seq), float("-inf"), device=device, dtype=dtype).triu(1)
        self.register_buffer("causal_bias", mask, persistent=False)
        if spec.sliding_window is not None:  # local layers: the window of keys up to each query, or its chunk's
            w, position = spec.sliding_window, torch.arange(seq, device=device)
            if spec.local_attention == "sliding":
                outside = position[:, None] - position[None, :] >= w
            else:
                outside = position[:, None] // w != position[None, :] // w
            self.register_buffer("local_bias", mask.masked_fill(outside, float("-inf")), persistent=False)

    def run_layers(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, first: int, end: int, selective: bool = False
    ) -> torch.Tensor:
        """Layers ``first`` to ``end`` − 1 on ``x``."""
        for i in range(first, end):
            bias = self.get_buffer("local_bias") if self.spec.is_local_layer(i) else self.causal_bias
            x = self.layers[i](x, cos, sin, bias, selective)
        return x

    def forward(
        self, tokens: torch.Tensor, recompute: Recompute = "none", units: tuple[tuple[int, int], ...] | None = None
    ) -> torch.Tensor:
        """Logits for ``tokens`` of shape (batch, seq). Under full recomputation each layer of the model's code (its
        ``sublayers`` of the spec's) is checkpointed on its own, or, given ``units``, each (first, end) range of layers
        together and the layers outside them not at all (as Megatron-Core's uniform and block methods do)."""
        s = tokens.shape[1]
        x = self.embed(tokens)
        if hasattr(self, "embed_norm"):
            x = self.embed_norm(x)
        if hasattr(self, "pos_embed"):
            x = x + self.pos_embed(torch.arange(s, device=tokens.device) + self.spec.position_offset)
        if self.spec.position_embedding == "sinusoidal":  # a fixed table: sin(p/10000^(2i/h)) ‖ cos(...), no weights
            rates = 10000 ** (-torch.arange(0, self.spec.hidden_size, 2, device=tokens.device) / self.spec.hidden_size)
            angles = torch.outer(torch.arange(s, device=tokens.device, dtype=torch.float32), rates)
            x = x + torch.cat((angles.sin(), angles.cos()), dim=-1)[:, : self.spec.hidden_size].to(x.dtype)
        x = F.dropout(x, DROPOUT_P if self.spec.drops("embedding") else 0.0, self.training)
        cos, sin = self.get_buffer("cos")[:s], self.get_buffer("sin")[:s]
        if recompute == "full" and units is None:
            units = tuple((i, i + self.spec.sublayers) for i in range(0, len(self.layers), self.spec.sublayers))
        starts = dict(units or ())
        i = 0
        while i < len(self.layers):
            if i in starts:
                x = checkpoint(self.run_layers, x, cos, sin, i, starts[i], use_reentrant=False)
                i = starts[i]
            else:
                x = self.run_layers(x, cos, sin, i, i + 1, recompute == "selective")
                i += 1
        if hasattr(self, "final_norm"):
            x = self.final_norm(x)
        head = self.lm_head.weight if hasattr(self, "lm_head") else self.embed.weight
        logits = F.linear(x, head, getattr(self, "head_bias", None))
        if self.spec.final_softcap:  # Gemma 2: c·tanh(logits/c); tanh keeps its output
            logits = self.spec.final_softcap * torch.tanh(logits / self.spec.final_softcap)
        return logits


def loss(model: ReferenceModel, tokens: torch.Tensor, recompute: Recompute = "none",
         units: tuple[tuple[int, int], ...] | None = None) -> torch.Tensor:  # fmt: skip
    """Next-token cross-entropy in fp32, the way training scripts compute it. The targets are the tokens
    shifted by one (the last position wraps around to the first token, which keeps every shape at s)."""
    logits = model(tokens, recompute, units)
    targets = tokens.roll(-1, dims=1)
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))
