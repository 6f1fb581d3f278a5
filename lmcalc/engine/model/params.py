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

import functools
from dataclasses import dataclass

from lmcalc.engine.model.branch_convs import branch_conv_tensors
from lmcalc.engine.model.byte_latent import LABELS as BYTE_LATENT_LABELS
from lmcalc.engine.model.byte_latent import byte_latent_tensors
from lmcalc.engine.model.cca import cca_tensors, mlp_router_tensors
from lmcalc.engine.model.compressed_attention import compressed_attention_tensors, hyper_connection_tensors
from lmcalc.engine.model.drafter import drafter_tensors
from lmcalc.engine.model.layer_reuse import held_once, message_tensors, ngpt_tensors, runs_note, start_state
from lmcalc.engine.model.mixer_params import mixer_tensors
from lmcalc.engine.model.mla_params import indexer_tensors, mla_tensors
from lmcalc.engine.model.prefix import prompt_tensors
from lmcalc.engine.model.retrieval_experts import retrieval_expert_tensors
from lmcalc.engine.model.shared_block import shared_block_tensors
from lmcalc.engine.model.tensors import Dim, Site, WeightTensor, linear, norm, tensor
from lmcalc.engine.model.width_params import (
    WIDTH_SYMBOLS,
    altup_tensors,
    branch_norms,
    cross_attention_tensors,
    per_layer_input,
    widths_attention,
    widths_mlp,
)
from lmcalc.result import Section, Term
from lmcalc.specs import ModelSpec
from lmcalc.units import group

MIXER_SYMBOLS = ("L_attn", "L_ssm", "L_lin", "L_conv")
"""The count symbols of a hybrid's tensors that sit in some of its layers only: its attention's (A of its L layers)
and its other mixer's (Mamba's, Gated DeltaNet's, Mamba-2's and LFM2's short convolutions': the other L − A)."""
LOCAL_SYMBOLS = ("L_global", "L_local")
"""The count symbols of attention tensors that differ between the global and the local (sliding-window) layers: the
K and V projections where the local layers have key-value heads of their own, the sinks where only they have them."""
AVERAGED_SYMBOLS = (
    "L",
    "L_w",
    "(L−1)",
    "L_mix",
    "L_ffn",
    "L_I",
    "L_CSA",
    "L_HCA",
    *MIXER_SYMBOLS,
    *LOCAL_SYMBOLS,
    *WIDTH_SYMBOLS,
)
"""The count symbols of a layer's tensors that the average layer holds a share of: every layer's (L; a looped model's
held layers, L_w), the layers with an indexer of their own (L_I), a hybrid's mixers', the global or the local layers'
attention tensors, the norm before a mixer (L_mix) or an FFN (L_ffn) where some layers are one of them alone, Gemma
4's layers of other widths (``width_params``) and DeepSeek-V4's compressors (``compressed_attention``)."""
GROUPS = (
    "embedding", "per_layer_embedding", "position", "per_layer_input", "altup", "start_state", "attention", "indexer",
    "ssm", "hyper_connections", "shared_attention", "norm", "residual_scales", "loop_messages", "mlp", "shared_mlp",
    "router", "latent_moe",
    "experts", "shared_experts", "cross_attention", "head_transform", "drafter", *BYTE_LATENT_LABELS, "head",
)  # fmt: skip
GROUP_LABELS = {
    "embedding": "Token embedding",
    "per_layer_embedding": "Per-layer embeddings (PLE table)",
    "per_layer_input": "Per-layer inputs (PLE projections)",
    "altup": "AltUp streams and LAuReL",
    "start_state": "Low-level stack's first input (z_L)",
    "drafter": "Drafter projections (from and to the backbone)",
    "cross_attention": "Cross-attention layers (idle on text)",
    "position": "Position embedding (learned)",
    "attention": "Attention projections",
    "indexer": "Sparse-attention indexer",
    "hyper_connections": "Hyper-connections (mHC, iHC)",
    "shared_attention": "Shared blocks' attention (held once, run G times)",
    "shared_mlp": "Shared blocks' MLP (held once, run G times)",
    "ssm": "State-space, linear-attention and convolution mixers",
    "norm": "Norms",
    "residual_scales": "Residual scales",
    "loop_messages": "Loop messages (queries and gates)",
    "mlp": "Dense MLP",
    "router": "MoE router",
    "latent_moe": "MoE latent projections",
    "experts": "Routed experts",
    "shared_experts": "Shared experts",
    "head_transform": "Head transform (dense and norm)",
    "head": "Output head (untied)",
    **BYTE_LATENT_LABELS,
}


def _attention(spec: ModelSpec, n: int) -> list[WeightTensor]:
    h, heads, kv, d = Dim(spec.hidden_size, "h"), spec.num_heads, spec.kv_heads, spec.head_size
    site = Site("attention", n, "L_attn" if spec.hybrid or spec.single_blocks else "L")
    qkv_bias = spec.attention_bias in ("qkv", "all")
    out_bias = spec.attention_bias in ("out", "all")
    if spec.mla:  # the biases on the down-projections and the output only (DeepseekV2Attention, DeepseekV3Attention)
        return mla_tensors(spec, site) + indexer_tensors(spec)  # its head gate too, at each kind's heads
    dv = spec.v_head_dim
    q, kv_dim, v_dim = Dim(heads * d, "H·d"), Dim(kv * d, "H_kv·d"), Dim(kv * dv, "H_kv·d_v" if dv != d else "H_kv·d")
    # Qwen3-Next's q_proj makes the queries and a sigmoid gate on the attention's output, each H·d wide; AFMoE's gate
    # is a projection of its own
    fused_gate = spec.attention_output_gate and not spec.attention_gate_proj
    if spec.moe and spec.moe.attention_experts:  # JetMoE's mixture of attention heads: q and o are k of E_a experts
        return (
            _attention_experts(spec, site, h, d)
            + linear("attn.k", site, kv_dim, h, False)
            + linear("attn.v", site, v_dim, h, False)
        )
    tensors = linear("attn.q", site, Dim(2 * heads * d, "2·H·d") if fused_gate else q, h, qkv_bias)
    if spec.attention_gate_proj:
        tensors += linear("attn.attn_gate", site, q, h, False)
    if spec.attention_gate_bias:  # Beam: one bias a head, broadcast over its d channels
        tensors.append(tensor("attn.attn_gate_bias", site, (Dim(heads, "H"),), False))
    if spec.local_kv_heads:  # MiMo-V2-Flash: the local layers' K and V at heads of their own
        global_site = Site("attention", n - spec.local_layers, "L_global")
        local_site, local_kv = Site("attention", spec.local_layers, "L_local"), spec.local_kv_heads
        tensors += linear("attn.k", global_site, kv_dim, h, qkv_bias)
        tensors += linear("attn.v", global_site, v_dim, h, qkv_bias)
        tensors += linear("attn_local.k", local_site, Dim(local_kv * d, "H_kv,local·d"), h, qkv_bias)
        tensors += linear("attn_local.v", local_site, Dim(local_kv * dv, "H_kv,local·d_v"), h, qkv_bias)
    else:
        tensors += linear("attn.k", site, kv_dim, h, qkv_bias) + linear("attn.v", site, v_dim, h, qkv_bias)
    tensors += linear("attn.o", site, h, Dim(heads * dv, "H·d_v") if dv != d else q, out_bias)
    if spec.qk_norm == "full":
        tensors += norm("attn.q_norm", site, q, spec)
        tensors += norm("attn.k_norm", site, kv_dim, spec)
    elif spec.qk_norm == "per_head":
        tensors += norm("attn.q_norm", site, Dim(d, "d"), spec)
        tensors += norm("attn.k_norm", site, Dim(d, "d"), spec)
    if spec.dynamic_mask_window:  # Doge: A a KV head, and dt_proj from the values to a score a KV head
        tensors.append(tensor("attn.A", site, (Dim(kv, "H_kv"),), False))
        tensors += linear("attn.dt_proj", site, Dim(kv, "H_kv"), v_dim, qkv_bias)
    if spec.differential_attention:  # λ = exp(λ_q1·λ_k1) − exp(λ_q2·λ_k2) + λ_init: four vectors of d (DiffLlama)
        lambdas = ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2")
        tensors += [tensor(f"attn.{name}", site, (Dim(d, "d"),), False) for name in lambdas]
    if spec.sub_norms:  # BitNet's norm on the attention's output, before the output projection (BitNetAttention)
        tensors += norm("attn.sub_norm", site, q, spec)
    if spec.last_layer_out_bias:  # GPT-NeoX-Japanese: the last layer's attention output alone has a bias
        tensors.append(tensor("attn.dense_bias", Site("attention", 1, "1"), (h,), False))
    if spec.attention_sinks:  # one learned logit per head, in every softmax's denominator (gpt-oss)
        sinks = Site("attention", spec.local_layers, "L_local") if spec.sinks_local_only else site
        tensors.append(tensor("attn.sinks", sinks, (Dim(heads, "H"),), False))
    return tensors + _head_gate(spec, site, h)


def _attention_experts(spec: ModelSpec, site: Site, h: Dim, d: int) -> list[WeightTensor]:
    """JetMoE's mixture of attention heads (JetMoeMoA): E_a experts a layer, each a query projection h → H_kv·d and
    an output projection back, a token's k of them chosen by a router of its own (h → E_a), and a bias of h on the
    summed output. One token's k experts make its H = k·H_kv query heads, so it uses H·d·h of each projection."""
    assert spec.moe is not None
    moe, kv = spec.moe, Dim(spec.kv_heads * d, "H_kv·d")
    experts = Site("attention", site.count * moe.attention_experts, f"{site.count_symbol}·E_a",
                   active=site.count * moe.k if moe.experts_per_token else None)  # fmt: skip
    return (
        linear("attn.router", site, Dim(moe.attention_experts, "E_a"), h, False)
        + linear("attn.q", experts, kv, h, False)
        + linear("attn.o", experts, h, kv, False)
        + [tensor("attn.output_bias", site, (h,), False)]
    )


def _head_gate(spec: ModelSpec, site: Site, h: Dim) -> list[WeightTensor]:
    """A head-wise output gate's projection, h → H (the Bailing hybrid's g_proj: PEFT's g_proj adapts it)."""
    return linear("attn.g", site, Dim(spec.num_heads, "H"), h, False) if spec.attention_head_gate != "none" else []


def _layer_norms(spec: ModelSpec, h: Dim) -> list[WeightTensor]:
    """The norms of each layer: one before attention and one before the MLP; only the first in a parallel block
    that feeds both from one norm; and with sandwich norms, one more after each, before the residual add. A layer
    that is a mixer or an FFN alone (Nemotron-H) has the one norm before it: M norms before mixers, F before FFNs."""
    L = spec.num_layers
    norms = Site("norm", L, "L")
    before_mixers = norms if spec.mixer_layers == L else Site("norm", spec.mixer_layers, "L_mix")
    if not spec.first_attention_norm:  # ModernBERT's layer 0 reads the embedding's norm
        before_mixers = Site("norm", L - 1, "(L−1)")
    tensors = norm("attn_norm", before_mixers, h, spec)
    if spec.norms_per_layer >= 2 and spec.ffn_layers:  # a Mamba model's blocks: a mixer alone, every one
        tensors += norm("mlp_norm", norms if spec.ffn_layers == L else Site("norm", spec.ffn_layers, "L_ffn"), h, spec)
    if spec.norms_per_layer == 4:
        tensors += norm("post_attn_norm", norms, h, spec) + norm("post_mlp_norm", norms, h, spec)
    if spec.residual_scales:  # Doge's input_residual and post_attention_residual
        scales = Site("residual_scales", L, "L")
        tensors += [tensor(f"{name}_residual_scale", scales, (h,), False) for name in ("attn", "mlp")]
    if spec.gated_norm_rank:  # A.X K2: a low-rank gate on every layer's input norm and on an MoE layer's MLP norm
        r = Dim(spec.gated_norm_rank, "r_g")
        for name, site in (("attn_norm", before_mixers), ("mlp_norm", Site("norm", spec.moe_layers, "L_moe"))):
            tensors += linear(f"{name}.gate.fc1", site, r, h, False) + linear(f"{name}.gate.fc2", site, h, r, False)
    return tensors


def _ffn(prefix: str, site: Site, spec: ModelSpec, width: Dim, io: Dim | None = None) -> list[WeightTensor]:
    """A feed-forward block of inner ``width`` from and to ``io`` (h unless a latent MoE's experts say): GELU's fc and
    proj, or a gated MLP's gate, up and down."""
    h, bias = io or Dim(spec.hidden_size, "h"), spec.mlp_bias
    if spec.ffn_kind == "gelu_mlp":
        # Apertus's xIELU learns two scalars, α_p and α_n, in every MLP (transformers' XIELUActivation)
        alphas = [tensor(f"{prefix}.act.{a}", site, (Dim(1, "1"),), False) for a in ("alpha_p", "alpha_n")]
        return (
            linear(f"{prefix}.fc", site, width, h, bias)
            + linear(f"{prefix}.proj", site, h, width, bias)
            + (alphas if spec.activation == "xielu" else [])
        )
    return (
        linear(f"{prefix}.gate", site, width, h, bias)
        + linear(f"{prefix}.up", site, width, h, bias)
        + linear(f"{prefix}.down", site, h, width, bias)
        + (norm(f"{prefix}.sub_norm", site, width, spec) if spec.sub_norms else [])  # BitNet's, before down (BitNetMLP)
    )


@functools.lru_cache(maxsize=256)  # a frozen spec's tensors never change; the planner asks thousands of times
def weight_tensors(spec: ModelSpec) -> tuple[WeightTensor, ...]:
    """Every parameter tensor of the model, in build order, with multiplicities."""
    h, L = Dim(spec.hidden_size, "h"), spec.num_layers
    vocab, once = Dim(spec.vocab_size, "V"), Site("embedding", 1, "1")
    tensors = [tensor("embed.weight", once, (vocab, h), False), *prompt_tensors(spec)]
    if spec.position_embedding == "learned":
        offset = spec.position_offset  # OPT's two rows before position 0
        rows = Dim(spec.max_seq_len + offset, f"(s_max+{offset})" if offset else "s_max")
        tensors.append(tensor("pos_embed.weight", Site("position", 1, "1"), (rows, h), False))
    if spec.embedding_norm:
        tensors += norm("embed_norm", Site("norm", 1, "1"), h, spec)
    tensors += per_layer_input(spec) + altup_tensors(spec) + start_state(spec)
    if spec.global_attention or spec.kv_sharing:  # Gemma 4: each kind's attention at its own widths
        tensors += widths_attention(spec)
    elif spec.compressed_attention:  # DeepSeek-V4: its compressors and indexers beside a window in every layer
        tensors += compressed_attention_tensors(spec)
    elif spec.attention_layers:  # a hybrid's layers may all be state-space ones (Granite 4's class defaults)
        tensors += _attention(spec, spec.attention_layers)
    tensors += mixer_tensors(spec) + hyper_connection_tensors(spec) + shared_block_tensors(spec) + cca_tensors(spec)
    tensors += branch_conv_tensors(spec) + message_tensors(spec) + drafter_tensors(spec)
    tensors += _layer_norms(spec, h) + ngpt_tensors(spec)
    moe = spec.moe
    if moe is None and spec.ffn_layers:
        if spec.ffn_layers < L:
            tensors += _ffn("mlp", Site("mlp", spec.ffn_layers, "L_dense"), spec, Dim(spec.ffn_size, "f"))
        every = widths_mlp(spec, Dim(spec.ffn_size, "f"), Site("mlp", L, "L")) if spec.ffn_layers == L else ()
        for dense, width in every:  # Gemma 4's sharing layers' at 2·f
            tensors += _ffn("mlp", dense, spec, width)
        tensors += retrieval_expert_tensors(spec)  # Doge's CDMoE beside its SwiGLU, the shared expert
    elif moe is not None:
        n_moe, f_e = spec.moe_layers, Dim(moe.expert_ffn_size, "f_e")
        if spec.dense_ffn_layers:
            tensors += _ffn("dense_mlp", Site("mlp", spec.dense_ffn_layers, "L_dense"), spec, Dim(spec.ffn_size, "f"))
        router = Site("router", n_moe, "L_moe")
        scored = Dim(moe.router_outputs, "(E+Z)") if moe.zero_experts else Dim(moe.num_experts, "E")
        if moe.router_scores_shared:  # Inkling's router scores the shared experts too
            scored = Dim(moe.router_outputs, "(E+E_shared)")
        if moe.router_rank:  # ZAYA's MLP router
            tensors += mlp_router_tensors(spec, router)
        else:
            tensors += linear("router", router, scored, h, moe.router_bias) + branch_norms(spec)
        # null: unknown, and count_params says no active count; a zero-computation expert computes nothing
        k = moe.computed_k if moe.experts_per_token else None
        routed = Site("experts", n_moe * moe.num_experts, "L_moe·E", active=n_moe * k if k else None)
        latent = Dim(moe.latent_size, "l") if moe.latent_size else None  # Nemotron 3 Super's experts work at l
        if latent:
            site = Site("latent_moe", n_moe, "L_moe")
            tensors += linear("latent.fc1", site, latent, h, spec.mlp_bias) + linear("latent.fc2", site, h, latent,
                                                                                    spec.mlp_bias)  # fmt: skip
        tensors += _ffn("experts", routed, spec, f_e, latent)
        if moe.shared_experts:
            shared = Site("shared_experts", n_moe * moe.shared_experts, "L_moe·E_shared")
            f_s = Dim(moe.shared_width, "f_s") if moe.shared_expert_ffn_size else f_e
            for site, width in widths_mlp(spec, f_s, shared):  # Gemma 4's: the dense MLP, 2·f_s where K, V shared
                tensors += _ffn("shared_experts", site, spec, width)
            if moe.shared_expert_gate:  # sigmoid(x·w) scales the shared experts' output (Qwen2-MoE)
                tensors += linear("shared_expert_gate", Site("shared_experts", n_moe, "L_moe"), Dim(1, "1"), h, False)
        if moe.output_bias:  # JetMoE: a bias on the experts' summed output
            tensors.append(tensor("router.output_bias", Site("router", n_moe, "L_moe"), (h,), False))
        if moe.output_norm:  # A.X K1: a norm on the experts' summed output, in each MoE layer
            tensors += norm("moe_output_norm", Site("norm", n_moe, "L_moe"), h, spec)
    tensors += cross_attention_tensors(spec) + byte_latent_tensors(spec)  # BLT's beside its decoder's layers
    if not spec.post_norm:  # a post-norm model's last layer ends in its norm (GPT-1): none before the head
        tensors += norm("final_norm", Site("norm", 1, "1"), h, spec)
    if spec.head_transform:  # BERT's prediction-head transform: dense, activation, norm (ModernBERT's lm_head)
        transform = Site("head_transform", 1, "1")
        tensors += linear("head_transform.dense", transform, h, h, False)
        tensors += norm("head_transform.norm", transform, h, spec)
    if not spec.tied_embeddings:
        rows = Dim(spec.head_vocab, "V_head") if spec.head_vocab else vocab  # Inkling 2's unpadded head
        tensors.append(tensor("lm_head.weight", Site("head", 1, "1"), (rows, h), False))
    if spec.head_bias:  # its own tensor, tied head or not (GPTJForCausalLM, PhiForCausalLM)
        tensors.append(tensor("lm_head.bias", Site("head", 1, "1"), (vocab,), False))
    return tuple(held_once(spec, tensors))  # a looped model's layer weights: held once, run at each pass


def layers_averaged(spec: ModelSpec, count_symbol: str) -> int:
    """Over how many layers a layer tensor's copies are spread in the average layer of its kind: the MoE layers
    (L_moe, L_moe·E, L_moe·E_shared), the others (a dense FFN's L_dense, where some layers route), or every layer."""
    kind = count_symbol.split("·")[0]
    if kind == "L_moe":
        return spec.moe_layers
    return spec.num_layers - spec.moe_layers if kind == "L_dense" else spec.num_layers


def copies_per_layer(spec: ModelSpec, tensor: WeightTensor) -> float:
    """Copies of a layer tensor in the average layer of its kind (dense or MoE): a fraction for a hybrid's mixers,
    the shared experts' count, each routed expert's E."""
    return tensor.count / layers_averaged(spec, tensor.count_symbol)


@dataclass(frozen=True)
class ParamCount:
    """Totals of a model's parameters: by group, all of them, and those one token uses."""

    by_group: dict[str, int]
    total: int
    active: int | None  # None: an MoE model whose top-k is null (MoESpec.experts_per_token)
    embedding: int

    @property
    def non_embedding(self) -> int:
        return self.total - self.embedding


def active_params(spec: ModelSpec) -> int:
    """The parameters one token uses; refused in one line where an MoE model's top-k is null (``MoESpec.k``)."""
    active = count_params(spec).active
    if active is None:
        assert spec.moe is not None
        return spec.moe.k  # raises: the top-k is unknown
    return active


def count_params(spec: ModelSpec) -> ParamCount:
    tensors = weight_tensors(spec)
    by_group: dict[str, int] = {}
    for t in tensors:
        by_group[t.group] = by_group.get(t.group, 0) + t.total
    total = sum(by_group.values())
    unknown = spec.moe is not None and spec.moe.experts_per_token is None
    # a shared block's weights count once however often they run (Zamba 2: active G, count B)
    active = None if unknown else round(sum(min(t.active, t.count) * t.numel for t in tensors))
    embedding = sum(by_group.get(g, 0) for g in ("embedding", "per_layer_embedding", "position", "hash_embedding"))
    return ParamCount(by_group=by_group, total=total, active=active, embedding=embedding)


def _group_formula(tensors: list[WeightTensor], active: str = "") -> tuple[str, str]:
    """The tensors' sum as a formula and with its numbers; ``active``: the symbol of the routed experts' copies one
    token uses, where the formula counts those (the active parameters)."""
    parts, numbers = [], []
    for t in tensors:
        count_sym = t.count_symbol if not active or t.active == t.count else active
        count = t.active if active else t.count
        shape = "·".join(t.symbols)
        parts.append(shape if count_sym == "1" else f"{count_sym}·{shape}")
        dims = "×".join(str(d) for d in t.shape)
        numbers.append(dims if count == 1 else f"{group(count)}×{dims}")
    return " + ".join(parts), " + ".join(numbers)


MLP_OUTPUT_PROJECTIONS = ("mlp.down.", "mlp.proj.", "dense_mlp.down.", "dense_mlp.proj.")
"""A dense MLP's last matmul: its backward runs first, before the activation's."""
MLP_HALF_GROUPS = ("mlp", "experts", "router", "shared_experts")


def layer_params(spec: ModelSpec, moe_layer: bool, part: str = "all") -> int:
    """Parameters of one layer (dense or MoE): ``all``; the ``mlp half`` (its norm, MLP, router and
    experts), whose gradients exist by the time the attention's backward runs; or the ``mlp output``
    projection of a dense MLP, whose gradient exists by the time the MLP's activation backward runs."""
    total = 0.0
    for t in weight_tensors(spec):  # the average layer of its kind: a hybrid's mixers, single blocks' norms
        kind = t.count_symbol.split("·")[0]
        if kind not in (*AVERAGED_SYMBOLS, "L_moe" if moe_layer else "L_dense"):
            continue
        if part == "mlp half" and not (t.group in MLP_HALF_GROUPS or t.name.startswith("mlp_norm.")):
            continue
        if part == "mlp output" and not t.name.startswith(MLP_OUTPUT_PROJECTIONS):
            continue
        total += t.numel * copies_per_layer(spec, t)
    return round(total)


def mtp_params(spec: ModelSpec) -> int:
    """One multi-token-prediction module's own parameters (DeepSeek-V3 §2.2, Figure 3): RMSNorms on the hidden state
    and on the next token's embedding (2·h), their concatenation projected back to h (2h·h), one more layer like the
    model's last, and the norm before the shared head (h); the embedding and the head are the main model's. With
    mHC's n streams (DeepSeek-V4; Megatron-Core's ``MultiTokenPredictionLayer`` at cae55c1f09) the embedding and the
    streams are projected apart (h·h each, the streams' stream by stream), and the module collapses its layer's
    streams before its norm as the model does before its own (``mtp_collapse_params``)."""
    last = spec.num_layers - 1
    h = spec.hidden_size
    return 2 * h + 2 * h * h + layer_params(spec, spec.is_moe_layer(last)) + h + mtp_collapse_params(spec)


def mtp_collapse_params(spec: ModelSpec) -> int:
    """An MTP module's collapse of its layer's n mHC streams (``hc_head_fn``, n × n·h; ``hc_head_base``, n;
    ``hc_head_scale``, 1), as the model's last; none without mHC."""
    hc = spec.hyper_connections
    return hc.streams * hc.streams * spec.hidden_size + hc.streams + 1 if hc is not None and hc.mixing else 0


def mtp_term(spec: ModelSpec) -> Term:
    h, n = spec.hidden_size, spec.mtp_modules
    collapse = mtp_collapse_params(spec)
    layer = mtp_params(spec) - 3 * h - 2 * h * h - collapse
    streams = " + n·n·h + n + 1" if collapse else ""
    return Term(
        "mtp",
        "MTP modules (apart)",
        n * mtp_params(spec),
        "params",
        f"n_mtp · (2·h + 2h·h + one layer + h{streams})",
        f"{n} × (2×{h} + 2×{h}×{h} + {group(layer)} + {h}" + (f" + {group(collapse)})" if collapse else ")"),
        "DeepSeek-V3 technical report §2.2" + ("; Megatron-Core's MTP layer with mHC" if collapse else ""),
        note="multi-token prediction: trained beside the model and dropped for inference, so not in the total; the "
        "embedding and head are shared",
    )


def params_section(spec: ModelSpec) -> Section:
    """The parameter breakdown as terms, each group with its formula and numbers substituted."""
    counts = count_params(spec)
    terms = list(_group_terms(spec, counts))
    if spec.moe and spec.moe.experts_per_token:  # a null top-k: no active count (MoESpec.k says why)
        terms.append(_active_term(spec, counts))
    terms.append(
        Term(
            "non_embedding",
            "Non-embedding parameters",
            counts.non_embedding,
            "params",
            f"total − token{', per-layer' if spec.per_layer_input else ''}{', hashed' if spec.byte_latent else ''} "
            "and position embeddings",
            f"{group(counts.total)} − {group(counts.embedding)}",
            note="the N of Kaplan et al. 2020; the output head counts when untied",
        )
    )
    if spec.mtp_modules:
        terms.append(mtp_term(spec))
    if spec.vision_params is not None:
        terms.append(
            Term(
                "vision",
                "Vision tower (apart)",
                spec.vision_params,
                "params",
                "every tensor of config.json's vision_config, and the projector to the text model",
                note="a multimodal model's vision tower and projector, not in the total: lmcalc estimates the language "
                "model",
            )
        )
    return Section("params", "Parameters", tuple(terms))


def _group_terms(spec: ModelSpec, counts: ParamCount) -> tuple[Term, ...]:
    """Each group of weight tensors the model has, with its formula, then their total."""
    tensors = weight_tensors(spec)
    terms = []
    for name in GROUPS:
        members = [t for t in tensors if t.group == name]
        if not members:
            continue
        formula, numbers = _group_formula(members)
        unknown = name == "experts" and counts.active is None
        note = "the top-k is null (num_experts_per_tok), so no count of the parameters a token uses" if unknown else ""
        terms.append(Term(name, GROUP_LABELS[name], counts.by_group[name], "params", formula, numbers, note=note))
    total = Term(
        "total",
        "Total parameters",
        counts.total,
        "params",
        "sum of the rows above",
        " + ".join(group(counts.by_group[g]) for g in GROUPS if g in counts.by_group),
        note=runs_note(spec),
    )
    return (*terms, total)


def _active_term(spec: ModelSpec, counts: ParamCount) -> Term:
    """An MoE model's parameters one token uses: the total less the routed experts, plus the k it is routed to."""
    assert spec.moe is not None
    expert = [t for t in weight_tensors(spec) if t.group == "experts"]
    moe = spec.moe
    zero = f" and passes {moe.k - moe.computed_k:g} through its zero-computation experts" if moe.zero_experts else ""
    formula, numbers = _group_formula(expert, active="L_moe·k·E/(E+Z)" if moe.zero_experts else "L_moe·k")
    return Term(
        "active",
        "Active parameters per token",
        active_params(spec),
        "params",
        f"total − routed experts + {formula}",
        f"{group(counts.total)} − {group(counts.by_group['experts'])} + ({numbers})",
        note=f"each token uses {moe.computed_k:g} of {moe.num_experts} routed experts per MoE layer{zero}",
    )
