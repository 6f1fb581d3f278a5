"""Whether a parallel layout (``engine.parallel.layout.Layout``) can exist for a workload and a cluster: TP over
the attention heads, the framework's ZeRO stages beside a pipeline, the experts' grid (Megatron-Core's MoE parallel
folding), the pipeline's split, what TP and CP may split, and what multi-token prediction and the all-to-all overlap
need. ``check_layout`` refuses a layout that cannot exist, naming the constraint that fails, in quantities (the front
ends name the settings).
"""

from __future__ import annotations

import functools

from lmcalc.engine.choices import one_of
from lmcalc.engine.finetune.offload import check_offload
from lmcalc.engine.parallel.kept_whole import check_kept_whole
from lmcalc.engine.parallel.layout import Layout
from lmcalc.engine.parallel.pipeline import check_split
from lmcalc.engine.workload import Workload
from lmcalc.errors import LmcalcError, setting
from lmcalc.specs import Cluster, ModelSpec


def check_tp_heads(model: ModelSpec, tp: int, replicate_kv: bool = False) -> None:
    """TP splits the query heads evenly, and the KV heads too while there are at least as many as TP ranks.
    Past them, TP must be a multiple of the KV heads, and each rank keeps one whole KV head, shared by
    TP / H_kv ranks. Training (Megatron-Core) gets there by sub-sharding, serving (vLLM, ``replicate_kv``) by
    replicating the K/V weights; the two differ in what each rank's weights must split.

    Megatron-Core (core_v0.16.1, megatron/core/transformer/transformer_config.py:939-946) accepts query groups
    that are "a multiple or divisor of tensor_model_parallel_size". Past them (attention.py:289-301, 1398-1411,
    1465-1475) the fused Q/K/V projection stays one column-parallel weight of (H + 2·H_kv)·d rows split evenly
    (attention.py:1264; tensor_parallel/layers.py:842 divides the rows by TP, so TP must divide them), and its
    output is all-gathered over TP, each rank slicing out its group's K and V head and its H/TP query heads. A model
    none of whose layers attends (Mamba's) has no attention heads to split.

    Mamba-2 mixers split their heads and their B and C groups over TP: Megatron-Core's MambaMixer asserts that TP
    divides both (Megatron-LM@d98e8a64 megatron/core/ssm/mamba_mixer.py:262, 270). vLLM's MambaMixer2
    (``replicate_kv``) replicates groups that TP does not divide, but still splits the heads."""
    _check_mamba2(model, tp, replicate_kv)
    if not model.attention_layers:
        return
    if model.num_heads % tp:
        raise LmcalcError(f"TP={tp} does not divide the {model.num_heads} attention heads of {model.name}")
    if model.mla:
        local = model.mla.local  # dots.3 Note's sliding-window layers: MLA of their own heads
        if local is not None and local.heads % tp:
            raise LmcalcError(
                f"TP={tp} does not divide the {local.heads} heads of {model.name}'s sliding-window layers"
            )
        return
    g = model.global_attention  # a local layer's own KV heads (MiMo-V2-Flash), a global one's (Gemma 4)
    for kv in sorted({model.kv_heads, model.local_kv_heads or model.kv_heads, (g and g.kv_heads) or model.kv_heads}):
        _check_kv_heads(model, tp, kv, replicate_kv)


def _check_hsdp(layout: Layout) -> None:
    """HSDP's replica groups: a ZeRO stage to shard within each, DP·CP split into groups of two or more GPUs, and the
    experts' replicas (EDP) split the same way."""
    hsdp, replicas, experts = layout.hsdp, layout.data_replicas, layout.state_shards.expert_replicas
    if not layout.zero:
        raise LmcalcError(f"{setting('hsdp')} {hsdp} needs a ZeRO stage to shard within each group ({setting('zero')})")
    if replicas % hsdp or replicas == hsdp:
        raise LmcalcError(
            f"{setting('hsdp')} {hsdp} must split DP·CP = {replicas} into groups of two or more GPUs to shard over"
        )
    if layout.ep > 1 and experts % hsdp:
        raise LmcalcError(f"{setting('hsdp')} {hsdp} must divide the experts' data-parallel replicas (EDP = {experts})")


def _check_hfsdp(w: Workload, layout: Layout) -> None:
    """HFSDP: the optimizer sharded across HSDP's groups, over ZeRO-3 within them (Megatron-FSDP raises
    NotImplementedError for another inner strategy, param_and_grad_buffer.py), where the framework has it."""
    flag = setting("hsdp_shard_optimizer")
    if layout.hsdp == 1:
        raise LmcalcError(f"{flag} shards the optimizer across HSDP's groups: give {setting('hsdp')} 2 or more")
    if layout.zero != 3:
        raise LmcalcError(f"{flag} needs {setting('zero')} 3 within each group (Megatron-FSDP's optim_grads_params)")
    if not w.framework.parallelism.hsdp_shard_optimizer:
        raise LmcalcError(f"{w.framework.label} replicates every state across HSDP's groups: leave out {flag}")


def _check_mamba2(model: ModelSpec, tp: int, replicate_kv: bool) -> None:
    mamba = model.mamba2
    if mamba is None or tp == 1:
        return
    if mamba.heads % tp:
        raise LmcalcError(f"TP={tp} does not divide the {mamba.heads} Mamba-2 heads of {model.name}")
    if not replicate_kv and mamba.groups % tp:
        raise LmcalcError(
            f"TP={tp} does not divide the {mamba.groups} Mamba-2 groups of {model.name} (Megatron-Core splits B and C "
            "by group)"
        )


def _check_kv_heads(model: ModelSpec, tp: int, kv: int, replicate_kv: bool) -> None:
    if kv % tp == 0:
        return
    if kv > tp:
        raise LmcalcError(f"TP={tp} does not divide the {kv} KV heads of {model.name}")
    if tp % kv:
        reason = "so they cannot be replicated" if replicate_kv else "(past them, TP / H_kv ranks share each KV head)"
        raise LmcalcError(f"TP={tp} is not a multiple of the {kv} KV heads of {model.name} {reason}")
    rows = model.num_heads * model.head_size + kv * (model.head_size + model.v_head_dim)
    formula = "(H + 2·H_kv)·d" if model.v_head_dim == model.head_size else "H·d + H_kv·(d + d_v)"
    if not replicate_kv and rows % tp:
        raise LmcalcError(
            f"TP={tp} does not divide the {formula} = {rows:,} rows of the fused Q/K/V projection of "
            f"{model.name}, which Megatron-Core splits evenly when TP exceeds the {kv} KV heads"
        )


def framework_runs(w: Workload, zero: int, pp: int) -> bool:
    """Whether the workload's framework runs ZeRO-``zero`` (beside ``pp`` pipeline stages): its parallelism rule."""
    rule = w.framework.parallelism
    return zero in rule.zero_stages and (pp == 1 or (rule.pipeline and zero in rule.zero_stages_with_pipeline))


def check_framework_runs(w: Workload, zero: int, pp: int) -> None:
    """Refuse a pipeline, or a ZeRO stage, the workload's framework does not run (alone or beside the pipeline)."""
    if framework_runs(w, zero, pp):
        return
    framework = w.framework
    rule = framework.parallelism
    if pp > 1 and not rule.pipeline:
        raise LmcalcError(f"{framework.label} trains without pipeline stages ({setting('pp')} 1): {rule.instead}")
    where = f" with pipeline parallelism (PP={pp})" if zero in rule.zero_stages else ""
    stages = rule.zero_stages_with_pipeline if where else rule.zero_stages
    raise LmcalcError(
        f"{framework.label} does not run ZeRO-{zero}{where} ({setting('zero')} {one_of(stages)}): {rule.instead}"
    )


def check_layout(w: Workload, layout: Layout, cluster: Cluster | None = None, tp_within_node: bool = True) -> None:
    """Refuse a layout that cannot exist for the workload (and the cluster, when given), naming the constraint
    that fails. (What a layout can check alone, its degrees and ZeRO stage, it checked when it was made.) What TP
    and CP must split (``_splits_pass``) is looked up once per (TP, CP): where it passes, those checks are skipped;
    where it fails, they run in their place, so that the first constraint that fails is the one named."""
    model, split = w.model, layout.split
    splits_pass = _splits_pass(w, layout.tp, layout.cp)
    if cluster and layout.gpus != cluster.count:
        raise LmcalcError(
            f"DP·TP·PP·CP = {layout.dp}·{layout.tp}·{layout.pp}·{layout.cp} = {layout.gpus} "
            f"does not equal the {cluster.count} GPUs of {cluster.label}"
        )
    if not splits_pass:
        check_tp_heads(model, layout.tp)
    if cluster and tp_within_node and layout.tp > cluster.gpus_per_node:
        raise LmcalcError(
            f"TP={layout.tp} spans more than the {cluster.gpus_per_node} GPUs of a node "
            "(tensor parallelism needs the intra-node links)"
        )
    check_split(model, layout.pp, layout.grad_accum, split, not w.framework.parallelism.uneven_counted_split)
    check_framework_runs(w, layout.zero, layout.pp)
    check_offload(w.offload, layout.zero)
    if layout.hsdp > 1:
        _check_hsdp(layout)
    if layout.hsdp_shard_optimizer:
        _check_hfsdp(w, layout)
    if w.optimizer.newton_schulz_steps and layout.zero > 1:
        raise LmcalcError(
            f"{w.optimizer.name} orthogonalises each matrix whole: lmcalc models it at {setting('zero')} 0 or 1 "
            f"(Megatron-LM's muon and dist_muon), not ZeRO-{layout.zero}, whose element shards Megatron-LM refuses "
            "with it and DeepSpeed gathers back into matrices (not modelled)"
        )
    if w.cpu_offloading_num_layers and layout.pp > 1:  # megatron/core/transformer/transformer_config.py
        raise LmcalcError(
            f"{setting('cpu_offloading_num_layers')} works without pipeline parallelism (Megatron-Core refuses "
            f"PP={layout.pp} with CPU offloading)"
        )
    if w.offload_modules and layout.pp > 1:
        raise LmcalcError(
            f"{setting('offload_modules')} is modelled on one pipeline stage, not PP={layout.pp} (the groups each "
            "stage keeps on the GPU depend on the micro-batches in flight); use PP=1"
        )
    if model.shared_block and layout.pp > 1:
        raise LmcalcError(
            f"shared blocks (Zamba's) are modelled on one pipeline stage, not PP={layout.pp}: each stage would hold "
            "the blocks its layers use; use PP=1"
        )
    if model.layer_reuse and layout.pp > 1:
        raise LmcalcError(
            f"{model.name}'s looped layers are modelled on one pipeline stage, not PP={layout.pp}: a stage would hold "
            "the weights of every layer its runs use; use PP=1"
        )
    if model.layer_reuse and w.method.kind == "freeze":
        raise LmcalcError(
            f"the freeze method on {model.name}'s looped layers: its bottom runs share their weights with later runs, "
            "which train them; use full training or LoRA"
        )
    if model.image_prefix and layout.pp > 1:
        raise LmcalcError(
            f"{model.name}'s image encoder is modelled on one pipeline stage, not {setting('pp')} {layout.pp}: it "
            "would load the first stage beyond its layers; use PP=1"
        )
    if model.image_prefix and w.method.kind in ("qlora", "freeze"):
        raise LmcalcError(
            f"{setting('method')} {w.method.kind} on {model.name}: lmcalc does not model how it treats the image "
            "encoder (quantised or frozen with the bottom layers); use full training or LoRA"
        )
    if model.byte_latent and layout.pp > 1:
        raise LmcalcError(
            f"{model.name}'s encoder, global transformer and cross-attention are modelled on one pipeline stage, not "
            f"{setting('pp')} {layout.pp}: they would load the first stage beyond its layers; use PP=1"
        )
    if model.byte_latent and w.method.kind in ("qlora", "freeze"):
        raise LmcalcError(
            f"{setting('method')} {w.method.kind} on {model.name}: lmcalc does not model how it treats the encoder, "
            "the global transformer and the hash tables (quantised or frozen with the bottom layers); use full "
            "training or LoRA"
        )
    if model.prompt and layout.pp > 1:
        raise LmcalcError(
            f"{model.name}'s prompt and score bias are modelled on one pipeline stage, not {setting('pp')} "
            f"{layout.pp}: the first stage makes the bias and mask every layer reads; use PP=1"
        )
    if model.prompt and w.method.kind == "freeze":
        raise LmcalcError(
            f"{setting('method')} freeze on {model.name}: lmcalc does not model whether the score bias the frozen "
            "layers share with the trained ones trains; use full training or LoRA"
        )
    if split.mtp_layers:
        check_mtp(w, split.mtp_layers)
    if w.method.kind == "freeze" and layout.pp > 1:
        raise LmcalcError(
            f"the freeze method is modelled on one pipeline stage: PP={layout.pp} would give the stages unequal "
            "shares of frozen layers, which lmcalc does not count; use PP=1"
        )
    if layout.ep > 1:
        if model.retrieval_experts:  # Doge's CDMoE: two embedding tables whose rows every token retrieves by key
            raise LmcalcError(f"EP={layout.ep} would split {model.name}'s CDMoE experts, rows of two embedding tables "
                              "that lmcalc keeps whole on each rank; use EP=1")  # fmt: skip
        if not model.moe:
            raise LmcalcError(f"EP={layout.ep} needs a mixture-of-experts model; {model.name} is dense")
        if model.moe.num_experts % layout.ep:
            raise LmcalcError(f"EP={layout.ep} does not divide the {model.moe.num_experts} experts of {model.name}")
        check_expert_grid(model, layout)
    elif layout.folded:
        if not model.moe:
            raise LmcalcError(f"ETP={layout.etp} needs a mixture-of-experts model; {model.name} is dense")
        check_expert_grid(model, layout)
    if cluster and tp_within_node and layout.expert_tp > cluster.gpus_per_node:
        raise LmcalcError(
            f"ETP={layout.expert_tp} spans more than the {cluster.gpus_per_node} GPUs of a node "
            "(tensor parallelism needs the intra-node links)"
        )
    if w.moe_a2a_overlap:
        check_a2a_overlap(w, layout)
    if not splits_pass:
        _check_context(w, layout.cp)
        check_kept_whole(model, layout.tp, layout.cp)


@functools.lru_cache(maxsize=1024)  # the planner checks hundreds of thousands of layouts of a few (TP, CP)
def _splits_pass(w: Workload, tp: int, cp: int) -> bool:
    """Whether TP splits the workload's heads (``check_tp_heads``), CP its sequence (``_check_context``), and
    neither a layer lmcalc keeps whole (``check_kept_whole``): the checks of ``check_layout`` that depend on TP and
    CP alone."""
    try:
        check_tp_heads(w.model, tp)
        _check_context(w, cp)
        check_kept_whole(w.model, tp, cp)
    except LmcalcError:
        return False
    return True


def _check_context(w: Workload, cp: int) -> None:
    """CP must divide the sequence, and ring attention needs a fused attention kernel."""
    if w.seq_len % cp:
        raise LmcalcError(f"CP={cp} does not divide the sequence length {w.seq_len}")
    if cp > 1 and w.attention != "flash":
        raise LmcalcError(
            f"context parallelism needs fused attention ({setting('attention')} flash): ring attention "
            "never materialises the s² scores"
        )


def check_a2a_overlap(w: Workload, layout: Layout) -> None:
    """Megatron-Core's all-to-all overlap (``overlap_moe_expert_parallel_comm``) runs where its config allows it
    (megatron/core/transformer/transformer_config.py): an MoE model with EP > 1, interleaved stages where PP > 1, no
    full recomputation and no recomputed MoE, a 16-bit model. What no layout changes is checked first."""
    flag = setting("moe_a2a_overlap")
    if w.framework.name != "megatron":
        raise LmcalcError(f"{flag} is Megatron-Core's ({setting('framework')} megatron); {w.framework.label} has none")
    if w.model.moe is None:
        raise LmcalcError(f"{flag} overlaps the expert all-to-alls: {w.model.name} is dense")
    if w.recompute == "full" or w.recompute == "selective" and "moe" in w.recompute_modules:
        raise LmcalcError(f"{flag} runs without full recomputation and without the MoE layer recomputed")
    if w.precision.param_bytes != 2:
        raise LmcalcError(f"{flag} needs a 16-bit model (Megatron-Core's bf16 or fp16)")
    if layout.ep == 1:
        raise LmcalcError(f"{flag} overlaps the expert all-to-alls: it needs EP > 1")
    if layout.pp > 1 and layout.split.chunks == 1:
        raise LmcalcError(f"{flag} with PP={layout.pp} needs the interleaved schedule ({setting('virtual_stages')} 2+)")


def check_expert_grid(model: ModelSpec, layout: Layout) -> None:
    """The experts' grid must tile the stage's TP·CP·DP GPUs (Megatron-Core, parallel_state.py: the world size
    divisible by ETP·EP·PP), and ETP must split each expert's matrices evenly. With ETP = TP that leaves EP
    dividing DP·CP; folding (ETP ≠ TP) lets EP span attention's TP and CP ranks too, which only sequence
    parallelism can feed: the experts' TP group gathers the tokens TP split (Megatron-Core refuses MoE training
    with TP > 1 and no sequence parallelism, moe_layer.py)."""
    assert model.moe is not None
    etp, gpus = layout.expert_tp, layout.dp * layout.cp * layout.tp
    if gpus % (etp * layout.ep):
        what = f"EP={layout.ep} must divide DP·CP = {layout.data_replicas}" if not layout.folded else ""
        what = what or f"ETP·EP = {etp}·{layout.ep} must divide DP·CP·TP = {gpus}"
        raise LmcalcError(
            f"{what} (the experts are laid out over a stage's data-, context- and tensor-parallel GPUs"
            + (f"; {setting('etp')} 1 folds EP over TP too" if not layout.folded and layout.tp > 1 else "")
            + ")"
        )
    if model.moe.expert_ffn_size % etp:
        raise LmcalcError(
            f"ETP={etp} does not divide the experts' {model.moe.expert_ffn_size} FFN width of {model.name}"
        )
    if layout.folded and layout.tp > 1 and not layout.sequence_parallel:
        raise LmcalcError(
            f"ETP={etp} with TP={layout.tp} needs sequence parallelism (the experts' grid gathers the tokens TP "
            "splits; Megatron-Core refuses MoE with TP > 1 and no sequence parallelism)"
        )


MTP_FRAMEWORKS = ("megatron", "idealised")
"""The profiles that train multi-token-prediction modules: Megatron-Core's, and lmcalc's framework-neutral one."""


def check_mtp(w: Workload, layers: int) -> None:
    """Multi-token-prediction modules as Megatron-Core trains them, with what it refuses beside them
    (megatron/training/arguments.py, transformer_config.py, megatron/core/transformer/multi_token_prediction.py)."""
    flag, model = setting("mtp_layers"), w.model
    if w.method.kind != "full":
        raise LmcalcError(f"{flag} is for full training; a {w.method.kind} fine-tune trains none")
    if w.framework.name not in MTP_FRAMEWORKS:
        raise LmcalcError(f"{flag}: Megatron-Core trains MTP modules; the {w.framework.name} profile has none "
                          f"(use {setting('framework')} megatron)")  # fmt: skip
    if model.position_embedding not in ("rope", "none"):
        raise LmcalcError(f"{flag}: Megatron-Core's MTP needs rotary or no position embeddings; {model.name} has "
                          f"{model.position_embedding} positions")  # fmt: skip
    if model.hyper_connections and not model.hyper_connections.mixing:
        raise LmcalcError(f"{flag}: Megatron-Core's MTP takes mHC's streams (DeepSeek-V4's), not {model.name}'s "
                          "hyper-connections without mixing (iHC), which it has none of")  # fmt: skip
    if w.recompute == "full" and (w.recompute_method == "block" or w.recompute_num_layers > 1):
        raise LmcalcError(f"{flag} with full recomputation: Megatron-Core checkpoints each MTP module whole under "
                          f"the uniform method at {setting('recompute_num_layers')} 1 and refuses more; lmcalc does "
                          "not model the block method's leaving them out")  # fmt: skip
    if w.moe_a2a_overlap and layers > 1:
        raise LmcalcError(f"{setting('moe_a2a_overlap')} takes at most one MTP layer (Megatron-Core asserts it), "
                          f"not {layers}")  # fmt: skip
