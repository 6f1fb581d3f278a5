"""The weight tensors of layers that differ from one another (Gemma 4, Google DeepMind 2026; transformers'
Gemma4TextModel): the global layers' attention at a head size and key-value heads of their own, with K = V; the last
layers attending with earlier layers' K and V and twice as wide an MLP; per-layer embeddings (PLE); the MoE block's
norms and router scales beside the dense MLP. Gemma 3n's AltUp streams and LAuReL (Gemma3nTextModel), and Llama 3.2
Vision's cross-attention layers, which text does not run (MllamaTextModel). ``engine.model.params`` lists them in
build order; ``altup_flops`` is what AltUp computes beyond its weights."""

from __future__ import annotations

from lmcalc.engine.model.tensors import Dim, Site, WeightTensor, linear, norm, tensor
from lmcalc.specs import ModelSpec

WIDTH_SYMBOLS = ("L_local", "L_global", "L_local,kv", "L_global,kv", "(L−n_s)", "n_s")
"""The count symbols of a layer's tensors in some of its layers only: a kind's attention (local or global), those of
its layers that make their own K and V, the MLPs of the layers that do and do not share them."""


def own_kv_layers(spec: ModelSpec, local: bool) -> int:
    """The local (or global) layers that make their own K and V: all but those among the last n_s that share."""
    first_shared = spec.num_layers - (spec.kv_sharing.layers if spec.kv_sharing else 0)
    return sum(spec.is_local_layer(i) == local for i in range(first_shared))


def widths_attention(spec: ModelSpec) -> list[WeightTensor]:
    """Each kind's attention at its own widths: local layers at H_kv heads of d, global ones at H_kv,g of d_g (d and
    H_kv where the model gives none); K and V only in the layers that make their own, V not at all in a global layer
    with K = V. Per-head RMSNorms on Q and K (of d or d_g); V's norm has no weight (Gemma4TextAttention)."""
    h, heads, g = Dim(spec.hidden_size, "h"), spec.num_heads, spec.global_attention
    bias, out_bias = spec.attention_bias in ("qkv", "all"), spec.attention_bias in ("out", "all")
    tensors: list[WeightTensor] = []
    for local in (True, False):
        d = spec.head_size if local or g is None else g.head_dim
        kv = spec.kv_heads if local or g is None or g.kv_heads is None else g.kv_heads
        layers = spec.local_layers if local else spec.attention_layers - spec.local_layers
        if not layers:
            continue
        kind, d_sym = ("local", "d") if local else ("global", "d" if g is None else "d_g")
        kv_sym = "H_kv" if local or g is None or g.kv_heads is None else "H_kv,g"
        site = Site("attention", layers, f"L_{kind}")
        own = Site("attention", own_kv_layers(spec, local), f"L_{kind},kv")
        q = Dim(heads * d, f"H·{d_sym}")
        tensors += linear(f"attn_{kind}.q", site, q, h, bias)
        if own.count:
            tensors += linear(f"attn_{kind}.k", own, Dim(kv * d, f"{kv_sym}·{d_sym}"), h, bias)
            if local or g is None or not g.k_eq_v:
                tensors += linear(f"attn_{kind}.v", own, Dim(kv * d, f"{kv_sym}·{d_sym}"), h, bias)
        tensors += linear(f"attn_{kind}.o", site, h, q, out_bias)
        tensors += norm(f"attn_{kind}.q_norm", site, Dim(d, d_sym), spec)
        if own.count:
            tensors += norm(f"attn_{kind}.k_norm", own, Dim(d, d_sym), spec)
    return tensors


def widths_mlp(spec: ModelSpec, ffn: Dim, site: Site) -> tuple[tuple[Site, Dim], ...]:
    """The MLPs' sites and widths in every layer (``site``): all at f, or with double-wide MLPs the sharing layers'
    at 2·f (Gemma4TextMLP; beside an MoE block, the one shared expert is that MLP)."""
    shared = spec.kv_sharing
    if not shared or not shared.double_wide_mlp:
        return ((site, ffn),)
    own = Site(site.group, spec.num_layers - shared.layers, "(L−n_s)")
    return (own, ffn), (Site(site.group, shared.layers, "n_s"), Dim(2 * ffn.size, f"2·{ffn.symbol}"))


def per_layer_input(spec: ModelSpec) -> list[WeightTensor]:
    """PLE: the table (V_p × L·d_p), the projection of the embedded token to the same L·d_p and its norm (d_p),
    once; in each layer, the gate (h → d_p), the projection back (d_p → h) and the norm after it (h)."""
    ple = spec.per_layer_input
    if ple is None:
        return []
    h, d, L = Dim(spec.hidden_size, "h"), Dim(ple.width, "d_p"), spec.num_layers
    stacked = Dim(L * ple.width, "L·d_p")
    once, layers = Site("per_layer_input", 1, "1"), Site("per_layer_input", L, "L")
    return (
        [tensor("per_layer_embed.weight", Site("per_layer_embedding", 1, "1"), (Dim(ple.vocab, "V_p"), stacked), False)]
        + linear("per_layer_model_projection", once, stacked, h, False)
        + norm("per_layer_projection_norm", once, d, spec)
        + linear("per_layer_input_gate", layers, d, h, False)
        + linear("per_layer_projection", layers, h, d, False)
        + norm("post_per_layer_input_norm", layers, h, spec)
    )


def branch_norms(spec: ModelSpec) -> list[WeightTensor]:
    """Gemma 4's MoE block (``MoESpec.branch_norms``): the router's scale on its normed input (h) and on each
    expert's weight (E), a norm before the experts and one after each branch (3·h), in each MoE layer."""
    if spec.moe is None or not spec.moe.branch_norms:
        return []
    h, n = Dim(spec.hidden_size, "h"), spec.moe_layers
    router, norms = Site("router", n, "L_moe"), Site("norm", n, "L_moe")
    tensors = [
        tensor("router.scale", router, (h,), False),
        tensor("router.per_expert_scale", router, (Dim(spec.moe.num_experts, "E"),), False),
    ]
    for name in ("pre_experts_norm", "post_experts_norm", "post_shared_norm"):
        tensors += norm(name, norms, h, spec)
    return tensors


def altup_tensors(spec: ModelSpec) -> list[WeightTensor]:
    """AltUp's (``AltUpSpec``): in each layer the router (h → n) and its norm (h), the prediction coefficients
    (n → n²), the correction coefficients (n → n) and the active stream's output scale (h); once, the projections
    making and unmaking the n − 1 other streams (h → h each); and LAuReL's h → r → h and its norm (h) in each layer
    (Gemma3nTextAltUp, Gemma3nTextLaurelBlock)."""
    a = spec.altup
    if a is None:
        return []
    h, n, L = Dim(spec.hidden_size, "h"), Dim(a.streams, "n"), spec.num_layers
    others, layers = Site("altup", 2 * (a.streams - 1), "2·(n−1)"), Site("altup", L, "L")
    tensors = (
        linear("altup.stream_projections", others, h, h, False)
        + linear("altup.router", layers, n, h, False)
        + norm("altup.router_norm", layers, h, spec)
        + linear("altup.prediction_coefs", layers, Dim(a.streams**2, "n²"), n, False)
        + linear("altup.correction_coefs", layers, n, n, False)
        + [tensor("altup.output_scale", layers, (h,), False)]
    )
    if a.laurel_rank:
        r = Dim(a.laurel_rank, "r_L")
        tensors += linear("laurel.left", layers, r, h, False) + linear("laurel.right", layers, h, r, False)
        tensors += norm("laurel.norm", layers, h, spec)
    return tensors


def altup_flops(spec: ModelSpec) -> float:
    """Forward FLOPs a token of AltUp's beyond its weights' one product each: the router runs twice a layer (on the
    prediction and on the layer's output), 2·h·n more, and the predictions mix the n streams of h by an n × n matrix
    a token, 2·h·n² (a batched matmul, which FlopCounterMode counts)."""
    a = spec.altup
    if a is None:
        return 0.0
    return spec.num_layers * (2 * spec.hidden_size * a.streams + 2 * spec.hidden_size * a.streams**2)


CROSS_SYMBOL = "L_x"
"""The count symbol of Llama 3.2 Vision's cross-attention layers' tensors (and of their LoRA adapters)."""


def idle(tensor: WeightTensor) -> bool:
    """Whether no text step computes ``tensor``: a cross-attention layer's (or its adapter's), which MllamaTextModel
    skips without image states, so autograd gives it no gradient. The embedding's rows beyond the vocabulary are not
    idle in this sense: they are rows of the embedding's one weight, whose gradient is made whole."""
    return tensor.count_symbol == CROSS_SYMBOL


def cross_attention_tensors(spec: ModelSpec) -> list[WeightTensor]:
    """Llama 3.2 Vision's cross-attention layers (``CrossAttentionSpec``), which text alone does not run: each a query
    projection h → H·d, key and value projections h → H_kv·d (of the projected vision features), the output
    projection, per-head norms on Q and K (d each), a tanh gate on the attention and one on the MLP (1 each), two
    norms (h) and a dense MLP; and the token embedding's rows beyond the vocabulary. Every one is held, and no token
    uses any (``Site.active`` 0), so FLOPs and the active count leave them out."""
    x = spec.cross_attention
    if x is None:
        return []
    h, heads, d = Dim(spec.hidden_size, "h"), spec.num_heads, spec.head_size
    layers = Site("cross_attention", x.layers, CROSS_SYMBOL, active=0)
    q, kv = Dim(heads * d, "H·d"), Dim(spec.kv_heads * d, "H_kv·d")
    tensors = (
        linear("cross_attn.q", layers, q, h, False)
        + linear("cross_attn.k", layers, kv, h, False)
        + linear("cross_attn.v", layers, kv, h, False)
        + linear("cross_attn.o", layers, h, q, False)
        + norm("cross_attn.q_norm", layers, Dim(d, "d"), spec)
        + norm("cross_attn.k_norm", layers, Dim(d, "d"), spec)
        + [tensor(f"cross_attn.{gate}_gate", layers, (Dim(1, "1"),), False) for gate in ("attn", "mlp")]
        + norm("cross_attn.input_norm", layers, h, spec)
        + norm("cross_attn.post_attention_norm", layers, h, spec)
    )
    f = Dim(spec.ffn_size, "f")
    tensors += linear("cross_mlp.gate", layers, f, h, False) + linear("cross_mlp.up", layers, f, h, False)
    tensors += linear("cross_mlp.down", layers, h, f, False)
    if x.token_rows:
        rows = Site("cross_attention", 1, "1", active=0)
        tensors.append(tensor("embed.image_token_rows", rows, (Dim(x.token_rows, "8"), h), False))
    return tensors
