"""The rules a model spec's fields keep together (``ModelSpec``'s validator calls ``check_model``): shapes that tile,
one kind of hybrid mixer, the layer kinds and gates that exclude or need each other. Each broken rule is a
``ValueError`` naming the fields, which pydantic reports with the preset's path."""

from __future__ import annotations

from typing import Any


def check_model(spec: Any) -> None:
    """Raise ValueError where ``spec``'s fields contradict each other. ``spec`` is the ModelSpec being validated (not
    imported here: specs imports this module)."""
    if spec.head_dim is None and spec.mla is None and spec.hidden_size % spec.num_heads:
        raise ValueError(
            f"hidden_size {spec.hidden_size} is not divisible by num_heads {spec.num_heads} "
            "(set head_dim if the model's heads do not tile the hidden size)"
        )
    if spec.num_kv_heads is not None and spec.num_heads % spec.num_kv_heads:
        raise ValueError(f"num_kv_heads {spec.num_kv_heads} does not divide num_heads {spec.num_heads}")
    if spec.local_kv_heads is not None and (
        spec.num_heads % spec.local_kv_heads or not spec.local_layers or spec.hybrid or spec.mla
    ):
        raise ValueError(f"local_kv_heads {spec.local_kv_heads} must divide num_heads {spec.num_heads}, and needs "
                         "local layers (a sliding_window) in a model without MLA or other mixers")  # fmt: skip
    if spec.value_head_dim is not None and spec.mla is not None:
        raise ValueError("value_head_dim is for attention without MLA: MLA gives its own mla.v_head_dim")
    if spec.local_qk_l2_norm and (not spec.local_layers or spec.mla or spec.hybrid):
        raise ValueError(
            "local_qk_l2_norm needs local layers (a sliding_window or chunks), without MLA or other mixers"
        )
    if spec.sinks_local_only and not (spec.attention_sinks and spec.local_layers):
        raise ValueError("sinks_local_only needs attention_sinks and local layers (a sliding_window)")
    if spec.moe and spec.moe.attention_experts and spec.num_heads != spec.moe.k * spec.kv_heads:
        raise ValueError(
            f"moe.attention_experts: num_heads {spec.num_heads} must be experts_per_token × num_kv_heads "
            f"= {spec.moe.k} × {spec.kv_heads} (each token's k attention experts of H_kv heads each)"
        )
    if spec.num_layers % spec.sublayers:
        raise ValueError(f"sublayers {spec.sublayers} does not divide num_layers {spec.num_layers}")
    if spec.moe and spec.moe.dense_layers > spec.num_layers:
        raise ValueError(f"moe.dense_layers ({spec.moe.dense_layers}) exceeds num_layers ({spec.num_layers})")
    if spec.moe and not spec.moe_layers:
        raise ValueError("moe: no layer is an MoE layer (check dense_layers, moe_every and dense_layer_ids)")
    if (spec.global_every is not None or spec.global_layer_ids) and spec.sliding_window is None:
        raise ValueError("global_every and global_layer_ids need a sliding_window (which layers attend locally, "
                         "and over what span)")  # fmt: skip
    if spec.global_every is not None and spec.global_layer_ids:
        raise ValueError("give global_every or global_layer_ids, not both")
    if spec.sliding_window is not None and not spec.attention_layers:
        raise ValueError("sliding_window is attention's span, and no layer attends (drop it, or name the layers that "
                         "attend)")  # fmt: skip
    mixers = (spec.mamba, spec.mamba2, spec.deltanet, spec.short_conv, spec.lightning, spec.rwkv, spec.rglru,
              spec.mlstm)  # fmt: skip
    if sum(m is not None for m in mixers) > 1:
        raise ValueError(
            "a model has one kind of mixer in its layers that do not attend: mamba, mamba2, deltanet, short_conv, "
            "lightning, rwkv, rglru or mlstm"
        )
    if spec.rwkv and (spec.ffn_kind != "gelu_mlp" or spec.single_blocks or spec.moe):
        raise ValueError("rwkv's channel mix is the model's FFN: a two-matrix MLP (ffn_kind gelu_mlp) in every layer")
    if spec.norms_per_layer == 1 and not spec.parallel_block:
        raise ValueError("norms_per_layer 1 needs parallel_block: one norm can only feed both in a parallel block")
    if spec.differential_attention and (spec.mla or spec.num_heads % 2 or spec.kv_heads % 2 or spec.hybrid):
        raise ValueError("differential_attention needs an even number of heads and of KV heads, without MLA")
    if spec.post_norm and (spec.norms_per_layer != 2 or spec.parallel_block or spec.single_blocks or spec.hybrid):
        raise ValueError("post_norm is GPT-1's layer: a norm after attention's and the MLP's residual adds")
    if spec.sub_norms and (
        spec.moe or spec.mla or spec.hybrid or spec.attention_output_gate or spec.ffn_kind == "gelu_mlp"
    ):
        raise ValueError("sub_norms are BitNet's: a dense model with gated MLPs, without MLA, MoE or other mixers")
    if spec.attention_head_gate != "none" and spec.attention_output_gate:
        raise ValueError("attention_head_gate and attention_output_gate are two gates on one output: give one")
    if spec.attention_gate_bias and not spec.attention_gate_proj:
        raise ValueError("attention_gate_bias is a bias on the output gate's own projection: it needs "
                         "attention_gate_proj")  # fmt: skip
    if spec.attention_gate_proj and not spec.attention_output_gate:
        raise ValueError("attention_gate_proj needs attention_output_gate: it says where that gate is made")
    if not spec.first_attention_norm and not (spec.embedding_norm and spec.norms_per_layer == 2):
        raise ValueError("first_attention_norm false needs embedding_norm (its norm stands in for layer 0's) and "
                         "norms_per_layer 2")  # fmt: skip
    if spec.indexer and (
        spec.hybrid or spec.indexer_layers > spec.num_layers or (spec.sliding_window and spec.indexer.own_layers)
    ):
        raise ValueError("mla.indexer: every global layer attends to its top_k keys, without other mixers; "
                         "own_layers may not exceed num_layers, nor be given beside local layers (which run no "
                         "indexer and attend their window)")  # fmt: skip
    if spec.mla and spec.mla.local and (not spec.local_layers or spec.local_layers == spec.attention_layers):
        raise ValueError("mla.local gives the local layers their own widths: it needs local layers (a "
                         "sliding_window) and global ones")  # fmt: skip
    _check_layer_ids(spec)
    _check_single_blocks(spec)
    _check_layer_widths(spec)
    _check_compressed(spec)
    _check_shared_block(spec)
    _check_layer_reuse(spec)


def _check_layer_reuse(spec: Any) -> None:
    """Looped layers: one run a layer of the spec, each held layer run as one kind every time (local or global, MoE
    or dense: its tensors are that kind's), without MLA, other mixers or layers of other widths; runs without
    gradients only where every layer attends alike, so that they cost the average run; loop messages only beside
    block attention residuals."""
    r = spec.layer_reuse
    if r is None:
        return
    if len(r.weights) != spec.num_layers:
        raise ValueError(f"layer_reuse.weights names {len(r.weights)} runs, but num_layers is {spec.num_layers}: "
                         "one run a layer")  # fmt: skip
    others = (spec.mla, spec.hybrid, spec.single_blocks, spec.shared_block, spec.compressed_attention,
              spec.hyper_connections, spec.global_attention, spec.kv_sharing, spec.sinks_local_only,
              spec.local_qk_l2_norm, spec.per_layer_input, spec.altup, spec.cross_attention, spec.mtp_modules,
              spec.dynamic_mask_window)  # fmt: skip
    kinds: dict[int, tuple[bool, bool]] = {}
    for run, layer in enumerate(r.weights):
        kind = kinds.setdefault(layer, (spec.is_local_layer(run), spec.is_moe_layer(run)))
        if kind != (spec.is_local_layer(run), spec.is_moe_layer(run)):
            raise ValueError(f"layer_reuse: held layer {layer} runs as two kinds of layer (local or global, MoE or "
                             "dense): each held layer holds one kind's tensors")  # fmt: skip
    if any(others):
        raise ValueError("layer_reuse is for layers that hold the same tensors in every run: attention and an FFN, "
                         "without MLA, other mixers or layers of other widths")  # fmt: skip
    if r.no_grad_runs and spec.sliding_window:
        raise ValueError("layer_reuse.no_grad_runs needs every layer to attend alike (no sliding_window)")
    if r.messages and not (spec.branch_convs and spec.branch_convs.block_residual):
        raise ValueError("layer_reuse.messages are Inkling 2's: they need branch_convs.block_residual")


def _check_shared_block(spec: Any) -> None:
    """Zamba's and Zamba 2's shared blocks: beside Mamba (or Mamba-2) in every layer; Q, K and V adapters of 2·h only
    where K and V are as wide as Q."""
    b = spec.shared_block
    if b is None:
        return
    if spec.mamba is None and spec.mamba2 is None or spec.attention_layers:
        raise ValueError("shared_block is Zamba's and Zamba 2's: Mamba or Mamba-2 in every layer, and no attention "
                         "layer of its own")  # fmt: skip
    if b.attention_adapters and spec.kv_heads != spec.num_heads:
        raise ValueError("shared_block.attention_adapters add 2·h to K and V: they need num_kv_heads = num_heads")


def _check_compressed(spec: Any) -> None:
    """DeepSeek-V4's attention: one key-value head, a sliding window in every layer, no MLA or other mixers, and
    head groups that split the H·d output evenly."""
    c = spec.compressed_attention
    if c is None:
        return
    if spec.kv_heads != 1 or spec.sliding_window is None or spec.mla or spec.hybrid or spec.global_attention:
        raise ValueError("compressed_attention is DeepSeek-V4's: num_kv_heads 1, a sliding_window in every layer, "
                         "without MLA, other mixers or global_attention")  # fmt: skip
    if (spec.num_heads * spec.head_size) % c.output_groups:
        raise ValueError(f"compressed_attention.output_groups {c.output_groups} must divide num_heads × head_dim "
                         f"({spec.num_heads * spec.head_size})")  # fmt: skip


def _check_layer_widths(spec: Any) -> None:
    """Gemma 4's layers of other widths: global attention of its own, K and V shared from earlier layers, per-layer
    inputs, the MoE block's branch norms. They are plain attention's and a gated MLP's, without MLA or other mixers."""
    g, shared = spec.global_attention, spec.kv_sharing
    if (g or shared or spec.per_layer_input or spec.altup) and (
        spec.mla or spec.hybrid or spec.single_blocks or spec.local_kv_heads
    ):
        raise ValueError("global_attention, kv_sharing and per_layer_input are for plain attention in every layer, "
                         "without MLA, other mixers or local_kv_heads")  # fmt: skip
    if g and g.kv_heads is not None and spec.num_heads % g.kv_heads:
        raise ValueError(f"global_attention.kv_heads {g.kv_heads} does not divide num_heads {spec.num_heads}")
    if g and spec.value_head_dim is not None:
        raise ValueError("global_attention gives the global layers' head size to keys and values alike: no "
                         "value_head_dim")  # fmt: skip
    if shared and shared.layers >= spec.num_layers and not spec.drafter:  # a drafter's come from its backbone
        raise ValueError(f"kv_sharing.layers ({shared.layers}) must leave a layer that makes its own K and V "
                         f"(num_layers {spec.num_layers})")  # fmt: skip
    if shared and not spec.drafter:
        first = spec.num_layers - shared.layers
        makers = {spec.is_local_layer(i) for i in range(first)}
        if any(spec.is_local_layer(i) not in makers for i in range(first, spec.num_layers)):
            raise ValueError("kv_sharing: a sharing layer's kind (local or global) has no earlier layer to share from")
    if (
        spec.moe
        and spec.moe.branch_norms
        and (spec.moe.shared_experts != 1 or spec.moe.shared_expert_gate or spec.moe_layers != spec.num_layers)
    ):
        raise ValueError("moe.branch_norms is Gemma 4's block in every layer: its dense MLP as the one shared expert, "
                         "ungated")  # fmt: skip
    if shared and shared.double_wide_mlp and spec.moe and not spec.moe.branch_norms:
        raise ValueError("kv_sharing.double_wide_mlp widens the dense MLPs: with MoE, Gemma 4's (moe.branch_norms)")


def _check_single_blocks(spec: Any) -> None:
    alone = (*spec.mixer_only_layer_ids, *spec.ffn_only_layer_ids)
    if not alone:
        return
    if len(set(alone)) < len(alone):
        raise ValueError("a layer is listed twice in mixer_only_layer_ids and ffn_only_layer_ids")
    if max(alone) >= spec.num_layers:
        raise ValueError(f"layer {max(alone)} of mixer_only_layer_ids or ffn_only_layer_ids is not below "
                         f"num_layers ({spec.num_layers})")  # fmt: skip
    if spec.norms_per_layer != 2:
        raise ValueError("mixer_only_layer_ids and ffn_only_layer_ids need norms_per_layer 2: one norm each")
    if not spec.mixer_layers:
        raise ValueError("ffn_only_layer_ids leaves no layer with a mixer")


def _check_layer_ids(spec: Any) -> None:
    """Every layer a list names is one of the model's: an index from 0 below num_layers."""
    kind = next((n for n in ("mamba2", "deltanet", "short_conv", "lightning", "rglru") if getattr(spec, n)), "")
    c = spec.compressed_attention
    listed = {
        "global_layer_ids": spec.global_layer_ids,
        "moe.dense_layer_ids": spec.moe.dense_layer_ids if spec.moe else (),
        f"{kind}.attention_layer_ids": getattr(spec, kind).attention_layer_ids if kind else (),
        "compressed_attention.csa_layer_ids": spec.compressed_attention.csa_layer_ids if c else (),
        "compressed_attention.hca_layer_ids": spec.compressed_attention.hca_layer_ids if c else (),
        "shared_block.layer_ids": spec.shared_block.layer_ids if spec.shared_block else (),
    }
    for field, layers in listed.items():
        beyond = [layer for layer in layers if layer >= spec.num_layers]
        if beyond:
            raise ValueError(f"{field} names layer {beyond[0]}, but the layers are 0 to {spec.num_layers - 1} "
                             f"(num_layers {spec.num_layers})")  # fmt: skip
