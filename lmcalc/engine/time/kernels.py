"""The kernels one GPU runs for one micro-batch of a pipeline stage: the work the step-time model times.

Three kinds of kernel, as a profiler shows them:

* **GEMMs**, one per weight matrix the stage's layers use (``params.weight_tensors``), with the shape one GPU
  sees: m tokens through a (k × n) weight, n or k divided by TP for column- or row-parallel weights
  (Megatron-LM's split, ``sharding.tp_divisor``; with TP larger than the KV heads Megatron-Core still splits the
  fused Q/K/V weight by TP and gathers the K and V heads after the GEMM). Routed experts: the expert TP group
  (ETP GPUs, splitting each expert) gathers its T_e = ETP·T/TP tokens, and each of a GPU's E/EP experts gets
  m = T_e·k·EP/E of their k copies under balanced routing (Megatron-Core's all-to-all dispatcher). The backward
  of each GEMM is two GEMMs of the same FLOPs: the input gradient (m × n)·(n × k) and the weight gradient
  (k × m)·(m × n) (Narayanan et al. 2021 §5.1). Eager attention's score and value products are batched GEMMs.
* **Fused attention** (FlashAttention): 4·T·keys·d FLOPs per head forward (scores and values), and 2.5 times
  that backward, which recomputes the scores (FlashAttention-2's benchmark convention, Dao 2023).
* **Scans**: a state-space or linear-attention mixer's core beyond its projections (Mamba-2's chunked SSD, Gated
  DeltaNet's chunked delta rule: ``mixer_flops.ssm_flops``) on this GPU's tokens, its heads split by TP, and twice
  that backward (each product's two operand gradients), as the fine-tuning FLOPs count it.
* **Memory-bound kernels**, counted in bytes read and written per element (``engine.time.memory_traffic``, with
  the stage's shape): norms, residual adds, rotary embeddings, the MLP activation, dropout, layout copies, MoE
  permutation, the loss and the embedding's gradient; here, eager softmax, the per-micro-batch accumulation of
  gradients, and with fp8 or fp4 GEMMs the casts of their operands (a fused cast and transpose per operand:
  Transformer Engine, torchao's float8).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import NamedTuple

from lmcalc.engine.finetune.method import Method, adapted_modules, in_layer
from lmcalc.engine.model.byte_latent import byte_latent_flops
from lmcalc.engine.model.compressed_attention import entries_read, indexer_keys
from lmcalc.engine.model.flops import attended_keys
from lmcalc.engine.model.mixer_flops import scan_recomputed_flops, ssm_flops
from lmcalc.engine.model.op_policy import Redone, selective_redone
from lmcalc.engine.model.params import copies_per_layer, layers_averaged, weight_tensors
from lmcalc.engine.model_code import eager_softmax
from lmcalc.engine.parallel.layout import Grid
from lmcalc.engine.parallel.pipeline import StageLayers
from lmcalc.engine.parallel.sharding import tp_divisor
from lmcalc.engine.time.memory_traffic import MemoryTraffic, StageShape, memory_bound_traffic, stage_shape
from lmcalc.engine.time.rates import LOW_PRECISION_OPERAND_BYTES
from lmcalc.engine.workload import Workload, canonical
from lmcalc.specs import ModelSpec

FLASH_BACKWARD_TO_FORWARD = 2.5
"""A fused attention kernel's backward pass does five of the forward's two matmuls' worth of work (it recomputes
the scores): 2.5 × the forward FLOPs (FlashAttention-2's benchmark convention, Dao 2023)."""

SCAN_BACKWARD_TO_FORWARD = 2.0
"""A scan's backward: each of its products' two operand gradients, twice the forward's FLOPs; beyond them, what it
recomputes rather than saved (Mamba-2's chunk products and states: ``mixer_flops.scan_recomputed_flops``).
``engine.finetune.flops`` counts its backward as twice the forward."""

FP32 = 4
LAYER_GROUPS = (
    "attention",
    "ssm",
    "mlp",
    "router",
    "latent_moe",
    "experts",
    "shared_experts",
    "shared_attention",
    "shared_mlp",
    "hyper_connections",  # mHC's and iHC's projections, in every layer (hc_head's once)
)
MOE_ONLY = ("router", "latent_moe", "experts", "shared_experts")  # an MoE layer's


@dataclass(frozen=True)
class Gemm:
    """``count`` GEMMs of an (m × k) by (k × n) product in one micro-batch's forward pass on one GPU."""

    name: str
    m: float
    n: float
    k: float
    count: float
    input_grad: float = 1.0  # the share of the copies that compute the input's gradient in backward
    weight_grad: float = 1.0  # the share that compute the weight's (0 for a frozen weight)

    @property
    def flops(self) -> float:
        return 2 * self.m * self.n * self.k * self.count

    @property
    def passes(self) -> float:
        """GEMMs run per forward GEMM, backward included: 3 when the weight trains and its input needs a gradient."""
        return 1 + self.input_grad + self.weight_grad


@dataclass(frozen=True)
class StageWork:
    """What one GPU of a pipeline stage does for one micro-batch, before it is timed."""

    gemms: tuple[Gemm, ...]  # the layers' forward GEMMs; each has an input- and a weight-gradient GEMM in backward
    head: tuple[Gemm, ...]  # the output layer's (never recomputed)
    batched: tuple[Gemm, ...]  # eager attention's score and value products (no weight gradient)
    recomputed_gemms: float  # how many times the layers' forward GEMMs run again in backward (full recompute)
    attention_forward: float  # fused attention FLOPs
    attention_backward: float
    attention_recomputed: float  # fused attention forward FLOPs redone by full recomputation
    memory_forward: float  # bytes moved by memory-bound kernels
    memory_backward: float
    memory_kernels: float  # memory-bound kernels launched, forward and backward
    accumulation_bytes: float  # adding this micro-batch's gradients into the accumulated ones (unfused)
    wgrad_accumulator_bytes: float  # per weight element: the fp32 accumulator the fused weight-gradient GEMM updates
    fp8_cast_bytes: float  # fp8 GEMMs: casting (and transposing) their operands to fp8 and back
    tp_collectives: float  # activation-sized collectives per micro-batch, forward (recompute included) + backward
    tp_collective_bytes: float  # bytes of one
    layers: int
    scan_forward: float = 0.0  # FLOPs of the state-space or linear-attention mixers' scans (chunked SSD, delta rule)
    scan_backward: float = 0.0
    scan_recomputed: float = 0.0  # redone by full recomputation
    scan_layers: float = 0.0  # the stage's layers that run one (a hybrid's share of them)

    @property
    def gemm_flops(self) -> float:
        layers = sum(g.flops * (g.passes + self.recomputed_gemms) for g in self.gemms + self.batched)
        return layers + sum(g.flops * g.passes for g in self.head)

    @property
    def operations(self) -> float:
        """GPU operations the host issues for the micro-batch: GEMMs (three per weight, fewer for frozen ones),
        attention, memory-bound kernels and collectives."""
        gemms = sum(g.count * (g.passes + self.recomputed_gemms) for g in self.gemms + self.batched)
        gemms += sum(g.count * g.passes for g in self.head)
        attention = 2 * self.layers if self.attention_forward else 0
        return gemms + attention + 2 * self.scan_layers + self.memory_kernels + self.tp_collectives


def _layer_gemms(w: Workload, grid: Grid, tokens: float, expert_tokens: float, moe: bool) -> list[Gemm]:
    """The GEMMs of one dense or MoE layer on one GPU for the TP group's ``tokens`` (gathered under SP), the routed
    experts' for ``expert_tokens`` (the expert TP group's) at k·ρ rows a token (``Workload.routed_copies``), their
    matrices split by ETP."""
    model, gemms = w.model, []
    # a looped model's run computes one held layer: L_w held layers' tensors over L runs, each run all of its layer's
    runs = model.num_layers / model.layer_reuse.held if model.layer_reuse else 1.0
    for t in weight_tensors(model):
        if not t.matmul or t.group not in LAYER_GROUPS:
            continue
        dense_only = ("mlp", "shared_attention", "shared_mlp")  # an MoE layer's FFN is its experts; no use routes
        if moe and t.group in dense_only or not moe and t.group in MOE_ONLY:
            continue
        if len(t.shape) == 3:  # block-diagonal weights (RecurrentGemma's gates): one product per block, TP 1 only
            blocks, out, inp = t.shape
            gemms.append(Gemm(t.name, tokens, out, inp, copies_per_layer(model, t) * blocks))
            continue
        if len(t.shape) == 1:  # Doge's CDMoE: a token's k retrieved rows of h, as a (1 × h)·(h × k) product
            gemms.append(Gemm(t.name, tokens, t.active / model.num_layers, t.shape[0], 1.0))
            continue
        out, inp = t.shape
        tp = grid.etp if t.group == "experts" else grid.tp
        if tp_divisor(t, model, tp) > 1:
            leaf = t.name.rsplit(".", 2)[-2]
            if leaf in ("o", "proj", "down"):
                inp = inp // tp
            else:
                out = out // tp
        if t.group == "experts":
            assert model.moe is not None
            local = model.moe.num_experts / grid.ep
            gemms.append(Gemm(t.name, expert_tokens * w.routed_copies / local, out, inp, local))
        elif t.group == "latent_moe":  # duplicated on every TP rank (Megatron-Core), each its own share of the tokens
            own = tokens / grid.tp if grid.sequence_parallel else tokens
            gemms.append(Gemm(t.name, own, out, inp, copies_per_layer(model, t) * runs))
        elif t.group in ("shared_attention", "shared_mlp"):  # a shared block's: run by its G uses, G/L a layer
            gemms.append(Gemm(t.name, tokens, out, inp, t.active / model.num_layers))
        else:  # a hybrid's attention and state-space GEMMs in their share of the layers, each shared expert's
            gemms.append(Gemm(t.name, tokens, out, inp, copies_per_layer(model, t) * runs))
    return gemms


def _live_shares(model: ModelSpec, method: Method) -> dict[str, float]:
    """Of the model's dense and of its MoE layers, the share a gradient flows through: all of them but under the
    freeze method, whose frozen bottom layers (the dense ones first) run forward only, and in a looped model whose
    runs under ``torch.no_grad`` (HRM's) run forward only. A stage is timed layer by layer
    (``microbatch.stage_kernel_times``), so each layer carries its kind's share; both run on one stage
    (``layout_checks.check_layout``), where the shares add up to the frozen layers or the runs exactly."""
    reuse = model.layer_reuse
    if reuse is not None and reuse.no_grad_runs:  # every run alike (model_rules), the freeze method refused
        live = 1 - len(reuse.no_grad_runs) / model.num_layers
        return {"dense": live, "moe": live}
    if method.kind != "freeze":
        return {"dense": 1.0, "moe": 1.0}
    dense, moe = model.dense_ffn_layers, model.moe_layers
    frozen = min(method.freeze_layers, model.num_layers)
    frozen_moe = model.moe_layers_in(0, frozen)  # the frozen layers are the lowest ones
    return {
        "dense": (dense - (frozen - frozen_moe)) / dense if dense else 1.0,
        "moe": (moe - frozen_moe) / moe if moe else 1.0,
    }


def _adapter_gemms(w: Workload, s: StageShape, moe: bool) -> list[Gemm]:
    """One layer's LoRA GEMMs: for each adapted module, A (r × in) and B (out × r) over the tokens it sees, each
    with both gradients (lmcalc keeps the adapters whole on every tensor-parallel rank); with DoRA, its weight
    norm's product and, under dropout, the base product PEFT makes again."""
    gemms = []
    for m in adapted_modules(w.model, w.method):
        if not in_layer(m, moe):
            continue
        r = w.method.lora_rank * m.rank_scale
        if m.group == "experts" and w.model.moe:
            local = w.model.moe.num_experts / s.grid.ep
            rows, count = s.expert_tokens * w.routed_copies / local, local
        elif m.group == "shared_experts" and w.model.moe:
            rows, count = s.tokens, w.model.moe.shared_experts
        else:  # a hybrid's attention's adapters in A of its L layers, its other mixer's in the rest
            rows, count = s.tokens, m.count / layers_averaged(w.model, m.count_symbol)
        gemms += [
            Gemm(f"{m.name}.lora_A", rows, r, m.inputs, count),
            Gemm(f"{m.name}.lora_B", rows, m.outputs, r, count),
        ]
        if w.method.dora:  # B·A built from an in × in identity for the weight norm, forward only (dora_forward)
            gemms += [
                Gemm(f"{m.name}.dora_A", m.inputs, r, m.inputs, count, 0.0, 0.0),
                Gemm(f"{m.name}.dora_B", m.inputs, m.outputs, r, count, 0.0, 0.0),
            ]
        if w.method.dora and w.method.lora_dropout:  # PEFT recomputes W·dropout(x) for DoRA's base term
            gemms.append(Gemm(f"{m.name}.dora_base", rows, m.outputs, m.inputs, count, 1.0, 0.0))
    return gemms


class _AttentionWork(NamedTuple):
    """The attention core of a micro-batch: a fused kernel's FLOPs, or eager attention's batched GEMMs."""

    forward: float
    backward: float
    batched: tuple[Gemm, ...]


@functools.lru_cache(maxsize=1 << 14)
def stage_work(w: Workload, grid: Grid, built: StageLayers) -> StageWork:
    """The kernels of one micro-batch on one GPU of a stage that builds ``built``, with TP, CP and EP (``grid``)
    splitting them."""
    s = stage_shape(w, grid, built)
    model, e = w.model, s.act_bytes
    live_share = _live_shares(model, w.method)  # of each kind of layer, the share a gradient flows through
    gemms = _stage_gemms(s, live_share)
    head = _head_gemms(s)
    layers = built.layers
    live = (built.dense * live_share["dense"] + built.moe * live_share["moe"]) / layers if layers else 1.0
    traffic = MemoryTraffic()
    attention = _attention_work(s, live, traffic)
    scan_layers = layers * model.other_mixer_share
    scan = scan_layers * ssm_flops(model, w.seq_len) * s.tokens / grid.tp if scan_layers else 0.0
    scan_redone = scan_layers * scan_recomputed_flops(model, w.seq_len) * s.tokens / grid.tp if scan_layers else 0.0
    memory_bound_traffic(s, traffic)
    accumulation = _accumulation_bytes(s, gemms, head, traffic)
    fp8_cast = _fp8_cast_bytes(w, gemms, head, traffic)
    recompute_full = w.recompute == "full"
    # the shares of the layers' forward GEMMs and memory-bound kernels run again: all under full recomputation; under
    # selective, the matmuls the framework's rule redoes, with every memory-bound kernel between them per operator
    # (torchtitan) or the redone modules' own, taken at their matmuls' share (Megatron; engine.model.op_policy)
    redone = 1.0 if recompute_full else workload_redone(w).matmuls
    per_operator = w.framework.recompute.selective == "matmuls"
    kernels_redone = 1.0 if recompute_full or (redone and per_operator) else redone
    return StageWork(
        gemms=tuple(gemms),
        head=head,
        batched=attention.batched,
        recomputed_gemms=redone,
        attention_forward=attention.forward,
        attention_backward=attention.backward,
        attention_recomputed=attention.forward if recompute_full else 0.0,
        memory_forward=traffic.forward,
        memory_backward=(traffic.backward + traffic.forward * kernels_redone) * live,
        memory_kernels=traffic.kernels * (1 + kernels_redone / 2),
        accumulation_bytes=accumulation,
        wgrad_accumulator_bytes=_wgrad_accumulator_bytes(w),
        fp8_cast_bytes=fp8_cast * (1 + redone / 2),
        tp_collectives=_tp_collectives(w, grid.tp, layers),
        tp_collective_bytes=s.tokens * model.hidden_size * e,
        layers=layers,
        scan_forward=scan,
        scan_backward=(SCAN_BACKWARD_TO_FORWARD * scan + scan_redone) * live,
        scan_recomputed=scan if recompute_full else 0.0,
        scan_layers=scan_layers,
    )


def _stage_gemms(s: StageShape, live_share: dict[str, float]) -> list[Gemm]:
    """The forward GEMMs of the stage's layers, the LoRA adapters' with them: each kind of layer's, times its
    layers, with the share of them a gradient flows through (and trains the weight)."""
    w, built, method = s.w, s.built, s.w.method
    gemms: list[Gemm] = []
    for kind, count in (("dense", built.dense), ("moe", built.moe)):
        if count:
            live = live_share[kind]
            trained = live if method.kind in ("full", "freeze") else 0.0
            for g in _layer_gemms(w, s.grid, s.tokens, s.expert_tokens, kind == "moe"):
                gemms.append(Gemm(g.name, g.m, g.n, g.k, g.count * count, live, trained))
            gemms += [replace(g, count=g.count * count) for g in _adapter_gemms(w, s, kind == "moe")]
    return gemms + _indexer_gemms(s) + _byte_latent_gemms(s)


def _byte_latent_gemms(s: StageShape) -> list[Gemm]:
    """BLT's work beyond its decoder's layers, on the stage that embeds (one: ``layout_checks.check_layout``), timed as
    GEMMs of its FLOPs (``engine.model.byte_latent.byte_latent_flops``: the encoder's and the global transformer's
    layers, the cross-attention and patch projections, differentiated; the entropy model forward only), h wide; its
    attention cores and memory-bound kernels are not timed apart."""
    w, model = s.w, s.w.model
    if model.byte_latent is None or not s.built.embedding:
        return []
    trained, forward_only = byte_latent_flops(model, w.seq_len, "causal")
    h, full = model.hidden_size, float(w.method.kind == "full")
    return [Gemm("byte_latent", s.tokens, h, trained / (2 * h), 1.0, 1.0, full),
            Gemm("byte_forward_only", s.tokens, h, forward_only / (2 * h), 1.0, 0.0, 0.0)]  # fmt: skip


def _indexer_gemms(s: StageShape) -> list[Gemm]:
    """A sparse-attention indexer's GEMMs in the stage's layers that run one: its projections, whole on every TP rank,
    and its key scores over the causal keys, 2·H_I·(d_I + 1) a key (flops.indexer_scores), timed as one GEMM;
    DeepSeek-V4's CSA indexers over the compressed entries gone by, 2·H_I·d_I a key (compressed_attention.
    indexer_flops). Forward only, where no gradient flows into it (transformers: no indexer loss). Under
    Megatron-Core's fused kernels a V4 indexer trains on its KL loss (csa.py at cae55c1f09: ``FusedDSAIndexerLoss``
    over detached inputs): its projections' weight gradients, and the scores' gradients (its queries' and keys')
    over the top k_I entries each query keeps (``dsa_indexer_use_sparse_loss``). DeepSeek's fp8 indexer kernel is not
    modelled apart."""
    w, model = s.w, s.w.model
    c = model.compressed_attention
    ix = c.indexer if c is not None and c.csa_layer_ids else model.indexer
    if ix is None or not s.built.layers:
        return []
    indexed = len(c.csa_layer_ids) if c is not None else model.indexer_layers
    layers = s.built.layers * indexed / model.num_layers
    trained = float(c is not None and w.framework.attention.compressed_kernels == "fused" and w.method.kind == "full")
    gemms = [
        Gemm(t.name, s.tokens, t.shape[0], t.shape[1], layers, 0.0, trained)
        for t in weight_tensors(model)
        if t.group == "indexer" and t.matmul
    ]
    if c is None:
        return [*gemms, Gemm("indexer.scores", s.tokens, (w.seq_len + 1) / 2, ix.heads * (ix.head_dim + 1), layers,
                             0.0, 0.0)]  # fmt: skip
    width = ix.heads * ix.head_dim
    gemms.append(Gemm("indexer.scores", s.tokens, indexer_keys(model, w.seq_len, "causal"), width, layers, 0.0, 0.0))
    if trained:  # the loss's gradient into the kept scores: its queries' (dS·K) and its keys' (dSᵀ·Q), top k_I a query
        kept = entries_read(w.seq_len, c.csa_rate, ix.top_k) / w.seq_len
        gemms.append(Gemm("indexer.scores_grad", s.tokens, kept, width, layers, 1.0, 0.0))
    return gemms


def _head_gemms(s: StageShape) -> tuple[Gemm, ...]:
    """The output layer's GEMM, on the stage that holds the head: trained unless frozen (or tied to a frozen
    embedding); and each trained multi-token-prediction module's projection of [hidden; next embedding] (2h → h,
    column-parallel; with mHC, the embedding's h → h and each stream's h → h) and its own pass through the shared
    head, after the collapse of its layer's streams with mHC (DeepSeek-V3 §2.2; Megatron-Core's
    ``MultiTokenPredictionLayer``)."""
    model, method, built = s.w.model, s.w.method, s.built
    head_trained = method.kind == "full" or (method.kind == "freeze" and not model.tied_embeddings)
    h, logits = model.hidden_size, model.vocab_size / s.grid.tp
    head = (Gemm("lm_head", s.tokens, logits, h, 1, 1.0, float(head_trained)),) if built.head else ()
    hc = model.hyper_connections
    if not built.mtp:
        projection: tuple[Gemm, ...] = ()
    elif hc is not None:  # mHC: the embedding's h → h and the streams' h → h, stream by stream (cae55c1f09)
        n = hc.streams
        projection = (Gemm("mtp.e_proj", s.tokens, h / s.grid.tp, h, built.mtp),
                      Gemm("mtp.h_proj", n * s.tokens, h / s.grid.tp, h, built.mtp))  # fmt: skip
    else:
        projection = (Gemm("mtp.eh_proj", s.tokens, h / s.grid.tp, 2 * h, built.mtp),)
    if not built.mtp_heads:
        return head + projection
    collapse = (Gemm("mtp.hc_head", s.hidden_tokens, hc.streams, hc.streams * h, built.mtp_heads),) if hc else ()
    return head + projection + collapse + (Gemm("mtp.lm_head", s.tokens, logits, h, built.mtp_heads),)


def _attention_work(s: StageShape, live: float, traffic: MemoryTraffic) -> _AttentionWork:
    """The attention core: a fused kernel's FLOPs (its backward where a gradient flows), or eager attention's
    score and value products with the scale, mask, softmax (and dropout) over the scores."""
    w, model, e = s.w, s.w.model, s.act_bytes
    cp, layers = s.grid.cp, s.built.layers
    keys = attended_keys(model, w.seq_len, "causal")  # what a causal (windowed) kernel computes
    # differential attention: two kernels a layer; a shared block's: one at each of its uses (attention_uses)
    calls = layers * model.attention_uses / model.num_layers * model.attention_calls
    core = 2 * s.tokens * keys * s.heads * (model.qk_head_dim + model.v_head_dim) * calls
    if w.attention == "flash":
        return _AttentionWork(core, FLASH_BACKWARD_TO_FORWARD * core * live, ())
    score_elements = w.micro_batch * s.heads * (w.seq_len / cp) * w.seq_len * calls
    sq, sk, per = w.seq_len / cp, w.seq_len, w.micro_batch * s.heads * layers * model.attention_calls
    batched = (Gemm("scores", sq, sk, model.qk_head_dim, per), Gemm("values", sq, model.v_head_dim, sk, per))
    softmax = FP32 if eager_softmax(w) == "fp32" else e
    forward = 2 * e + e + softmax + (softmax + e if softmax != e else 0)  # scale and mask, softmax, cast
    if model.drops("attention"):
        forward += 2 * e + 1
    traffic.add(forward * score_elements, 2 * forward * score_elements, 6 * layers)
    return _AttentionWork(0.0, 0.0, batched)


def _accumulation_bytes(s: StageShape, gemms: list[Gemm], head: tuple[Gemm, ...], traffic: MemoryTraffic) -> float:
    """Gradients: the weight-gradient GEMM accumulates into fp32 (fused, nothing here), or each micro-batch's
    gradients are added into the accumulated ones by a separate pass, a kernel per weight."""
    w, model = s.w, s.w.model
    if w.framework.speed.fused_grad_accumulation:
        return 0.0
    weight_elements = sum(g.n * g.k * g.count * g.weight_grad for g in gemms + list(head))
    if s.built.embedding and not (s.built.head and model.tied_embeddings):
        weight_elements += model.vocab_size / s.grid.tp * model.hidden_size
    traffic.launch(sum(g.count for g in gemms) + len(head))
    return (w.precision.param_bytes + 2 * w.grad_bytes) * weight_elements


def _fp8_cast_bytes(w: Workload, gemms: list[Gemm], head: tuple[Gemm, ...], traffic: MemoryTraffic) -> float:
    """fp8/fp4 GEMMs: each GEMM's input, output gradient and weight cast with a transposed copy (read 2, write q + q:
    ``LOW_PRECISION_OPERAND_BYTES``); fused into the producers, only the transposes (read q, write q) remain, but for
    the routed experts' operands, which no producer casts (``_routed_quantize_bytes``)."""
    q = LOW_PRECISION_OPERAND_BYTES.get(w.precision.compute_dtype)
    if q is None:
        return 0.0
    every = gemms + list(head)
    if w.framework.speed.fp8_casts == "fused":  # the transposes of the input and of the output gradient only
        traffic.launch(2 * (sum(g.count for g in gemms) + len(head)))
        transposes = sum(2 * q * (g.m * g.k + g.m * g.n) * g.count for g in every)
        return transposes + _routed_quantize_bytes(w, gemms)
    traffic.launch(3 * (sum(g.count for g in gemms) + len(head)))
    return sum((2 + 2 * q) * (g.m * g.k + g.m * g.n + g.n * g.k) * g.count for g in every)


def _routed_quantize_bytes(w: Workload, gemms: list[Gemm]) -> float:
    """Where the casts are fused into their producers, what the routed experts' casts read beyond that: their inputs
    come from the token permutation and the experts' activation, their output gradients from the combine's backward,
    and the grouped GEMM module quantises each itself (Transformer Engine's ``GroupedLinear``: ``tex.split_quantize``
    of its input in forward, of the output gradient in backward), reading it in the activation dtype before writing
    what the fused casts' transposes count. One read, e bytes an element, of each tensor quantised: the experts' first
    projections' shared input once (gate and up read one input), the down projection's input, and every output
    gradient. docs/formulas.md §8.13.1."""
    routed = routed_names(w.model)
    first = down = gradients = 0.0
    for g in gemms:
        if g.name not in routed:
            continue
        if g.name.rsplit(".", 2)[-2] == "down":
            down += g.m * g.k * g.count
        else:
            first = max(first, g.m * g.k * g.count)
        gradients += g.m * g.n * g.count
    return w.precision.activation_bytes * (first + down + gradients)


@functools.lru_cache(maxsize=64)
def routed_names(model: ModelSpec) -> frozenset[str]:
    """The names of the routed experts' weights, as ``stage_work``'s GEMMs carry them."""
    return frozenset(t.name for t in weight_tensors(model) if t.group == "experts")


def _wgrad_accumulator_bytes(w: Workload) -> float:
    """Per weight element: the fp32 accumulator a fused weight-gradient GEMM reads and writes, where the
    gradients are kept in fewer bytes than it."""
    grad_bytes = w.grad_bytes
    fused_accumulation = w.framework.speed.fused_grad_accumulation
    return 2 * grad_bytes if fused_accumulation and grad_bytes > w.precision.activation_bytes else 0.0


@functools.lru_cache(maxsize=256)
def workload_redone(w: Workload) -> Redone:
    """What the workload's recomputation runs again beyond its full mode: selective recomputation's attention core
    and share of the layers' matmuls, under the framework's rule (``op_policy.selective_redone``); nothing else."""
    if w.recompute != "selective":
        return Redone(False, 0.0)
    return selective_redone(w.model, w.framework.recompute, w.recompute_modules)


def _tp_collectives(w: Workload, tp: int, layers: int) -> float:
    """Tensor-parallel collectives the host issues: four a layer (two more recomputed), the count the host time
    per operation was fitted with (sequence parallelism issues them in halves)."""
    if tp > 1:
        return layers * (4 + (2 if w.recompute == "full" else 0))
    return 0.0


@functools.lru_cache(maxsize=256)
def kernel_workload(w: Workload) -> Workload:
    """``w`` as its kernels see it. Of recomputation, ``stage_work`` reads whether it is full, or per operator:
    selective recomputation of attention's core alone, which fused attention never saved, runs no kernel again, and
    figures of the kernels cached under this workload serve both that mode and none."""
    core_only = w.recompute == "selective" and not workload_redone(w).matmuls
    return canonical(replace(w, recompute="none") if core_only else w)
