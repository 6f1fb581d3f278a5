"""The kernels one GPU runs for one micro-batch of a pipeline stage: the work the step-time model times.

Three kinds of kernel, as a profiler shows them:

* **GEMMs**, one per weight matrix the stage's layers use (``params.weight_tensors``), with the shape one GPU
  sees: m tokens through a (k × n) weight, n or k divided by TP for column- or row-parallel weights
  (Megatron-LM's split, ``sharding.tp_divisor``; with TP larger than the KV heads Megatron-Core still splits the
  fused Q/K/V weight by TP and gathers the K and V heads after the GEMM). Routed experts see the tokens routed
  to them:
  with balanced routing each of the E/EP experts on a GPU gets m = T·k·EP/E tokens. The backward pass of each
  GEMM is two GEMMs of the same FLOPs: the input gradient (m × n)·(n × k) and the weight gradient
  (k × m)·(m × n) (Narayanan et al. 2021 §5.1). Eager attention's score and value products are batched GEMMs.
* **Fused attention** (FlashAttention): 4·T·keys·d FLOPs per head forward (scores and values), and 2.5 times
  that backward, which recomputes the scores (FlashAttention-2's benchmark convention, Dao 2023).
* **Memory-bound kernels**, counted in bytes read and written per element: norms, residual adds, rotary
  embeddings, the MLP activation, dropout, layout copies, eager softmax, MoE permutation, the loss over the
  logits, the embedding's gradient, the per-micro-batch accumulation of gradients, and with fp8 GEMMs the casts
  of their operands (a fused cast and transpose per operand: Transformer Engine, torchao's float8). Which of them are
  fused, and so how many bytes they move, is the framework profile's (the same rules that decide what they
  keep for backward: ``framework_specs.NormRule``, ``MlpRule``, ``RotaryRule``, ``AttentionRule``, ``LossRule``).

Byte counts of an element-wise kernel: it reads each input and writes each output once. A fused kernel does the
whole operation in one pass; an unfused PyTorch form pays one pass per operation (an upcast, a square, a mean,
a multiply, a downcast...). The backward pass of an element-wise operation reads the saved input and the
output's gradient and writes the input's gradient.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

from lmcalc.engine.finetune.method import Method, adapted_modules, in_layer
from lmcalc.engine.model.flops import attended_keys
from lmcalc.engine.model.params import weight_tensors
from lmcalc.engine.model_code import gelu_ops_kept, norm_keeps
from lmcalc.engine.parallel.layout import Grid
from lmcalc.engine.parallel.pipeline import StageLayers
from lmcalc.engine.parallel.sharding import tp_divisor
from lmcalc.engine.workload import Workload
from lmcalc.specs import ModelSpec

FLASH_BACKWARD_TO_FORWARD = 2.5
"""A fused attention kernel's backward pass does five of the forward's two matmuls' worth of work (it recomputes
the scores): 2.5 × the forward FLOPs (FlashAttention-2's benchmark convention, Dao 2023)."""

FP32 = 4
LAYER_GROUPS = ("attention", "ssm", "mlp", "router", "experts", "shared_experts")
HYBRID = ("L_attn", "L_ssm")  # a hybrid's attention and state-space tensors, in some of its layers only


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

    @property
    def gemm_flops(self) -> float:
        layers = sum(g.flops * (g.passes + self.recomputed_gemms) for g in self.gemms + self.batched)
        return layers + sum(g.flops * g.passes for g in self.head)

    @property
    def operations(self) -> float:
        """GPU operations the host issues for the micro-batch: GEMMs (three per weight, forward and both
        gradients, fewer for frozen weights), attention, memory-bound kernels and collectives."""
        gemms = sum(g.count * (g.passes + self.recomputed_gemms) for g in self.gemms + self.batched)
        gemms += sum(g.count * g.passes for g in self.head)
        attention = 2 * self.layers if self.attention_forward else 0
        return gemms + attention + self.memory_kernels + self.tp_collectives


def _layer_gemms(model: ModelSpec, tp: int, ep: int, tokens: float, moe: bool) -> list[Gemm]:
    """The GEMMs of one dense or MoE layer for ``tokens`` tokens on one GPU (all of the TP group's tokens: with
    sequence parallelism they are gathered before the GEMM)."""
    gemms = []
    for t in weight_tensors(model):
        if not t.matmul or t.group not in LAYER_GROUPS:
            continue
        if moe and t.group == "mlp" or not moe and t.group in ("router", "experts", "shared_experts"):
            continue
        out, inp = t.shape
        if tp_divisor(t, model, tp) > 1:
            leaf = t.name.rsplit(".", 2)[-2]
            if leaf in ("o", "proj", "down"):
                inp = inp // tp
            else:
                out = out // tp
        if t.group == "experts":
            assert model.moe is not None
            local = model.moe.num_experts / ep
            gemms.append(Gemm(t.name, tokens * model.moe.experts_per_token / local, out, inp, local))
        else:  # a hybrid's attention and state-space GEMMs: in their share of the layers
            gemms.append(Gemm(t.name, tokens, out, inp, t.count / model.num_layers if t.count_symbol in HYBRID else 1))
    return gemms


def _live_shares(model: ModelSpec, method: Method) -> dict[str, float]:
    """Of the model's dense and of its MoE layers, the share a gradient flows through: all of them but under the
    freeze method, whose frozen bottom layers (the dense ones first) run forward only. A stage is timed layer by
    layer (``microbatch.stage_kernel_times``), so each layer carries its kind's share; the freeze method runs on one
    stage (``layout.check_layout``), where the shares add up to the frozen layers exactly."""
    if method.kind != "freeze":
        return {"dense": 1.0, "moe": 1.0}
    dense, moe = model.dense_ffn_layers, model.moe_layers
    frozen = min(method.freeze_layers, model.num_layers)
    frozen_moe = model.moe_layers_in(0, frozen)  # the frozen layers are the lowest ones
    return {
        "dense": (dense - (frozen - frozen_moe)) / dense if dense else 1.0,
        "moe": (moe - frozen_moe) / moe if moe else 1.0,
    }


def _adapter_gemms(w: Workload, ep: int, tokens: float, moe: bool) -> list[Gemm]:
    """One layer's LoRA GEMMs: for each adapted module, A (r × in) and B (out × r) over the tokens it sees, each
    with both gradients (lmcalc keeps the adapters whole on every tensor-parallel rank); with DoRA, its weight
    norm's product and, under dropout, the base product PEFT makes again."""
    gemms = []
    r = w.method.lora_rank
    for m in adapted_modules(w.model, w.method):
        if not in_layer(m, moe):
            continue
        if m.group == "experts" and w.model.moe:
            local = w.model.moe.num_experts / ep
            rows, count = tokens * w.model.moe.experts_per_token / local, local
        elif m.group == "shared_experts" and w.model.moe:
            rows, count = tokens, w.model.moe.shared_experts
        else:
            rows, count = tokens, 1
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


@functools.lru_cache(maxsize=1 << 14)
def stage_work(w: Workload, grid: Grid, built: StageLayers) -> StageWork:
    """The kernels of one micro-batch on one GPU of a stage that builds ``built``, with TP, CP and EP (``grid``)
    splitting them."""
    tp, cp, ep, sequence_parallel = grid
    model, profile, e = w.model, w.framework, w.precision.activation_bytes
    h, d = model.hidden_size, model.head_size
    tokens = w.micro_batch * w.seq_len / cp  # through each GEMM of the TP group
    hidden_tokens = tokens / tp if sequence_parallel and tp > 1 else tokens  # element-wise work on h
    heads = model.num_heads / tp
    kv_heads = max(1.0, (model.num_heads if model.mla else model.kv_heads) / tp)  # whole KV heads after the gather

    gemms: list[Gemm] = []
    method = w.method
    live_share = _live_shares(model, method)  # of each kind of layer, the share a gradient flows through
    for kind, count in (("dense", built.dense), ("moe", built.moe)):
        if count:
            live = live_share[kind]
            trained = live if method.kind in ("full", "freeze") else 0.0
            for g in _layer_gemms(model, tp, ep, tokens, kind == "moe"):
                gemms.append(Gemm(g.name, g.m, g.n, g.k, g.count * count, live, trained))
            gemms += [replace(g, count=g.count * count) for g in _adapter_gemms(w, ep, tokens, kind == "moe")]
    head_trained = method.kind == "full" or (method.kind == "freeze" and not model.tied_embeddings)
    head = (Gemm("lm_head", tokens, model.vocab_size / tp, h, 1, 1.0, float(head_trained)),) if built.head else ()

    layers = built.layers
    # attention core
    keys = attended_keys(model, w.seq_len, "causal")  # what a causal (windowed) kernel computes
    core = 2 * tokens * keys * heads * (model.qk_head_dim + model.v_head_dim) * layers * model.attention_share
    batched: list[Gemm] = []
    attention_forward = attention_backward = 0.0
    score_elements = w.micro_batch * heads * (w.seq_len / cp) * w.seq_len * layers * model.attention_share
    memory_forward = memory_backward = kernels = 0.0
    live = (built.dense * live_share["dense"] + built.moe * live_share["moe"]) / layers if layers else 1.0
    if w.attention == "flash":
        attention_forward, attention_backward = core, FLASH_BACKWARD_TO_FORWARD * core * live
    else:
        sq, sk, per = w.seq_len / cp, w.seq_len, w.micro_batch * heads * layers
        batched = [Gemm("scores", sq, sk, model.qk_head_dim, per), Gemm("values", sq, model.v_head_dim, sk, per)]
        softmax = FP32 if profile.attention.eager_softmax == "fp32" else e
        forward = 2 * e + e + softmax + (softmax + e if softmax != e else 0)  # scale and mask, softmax, cast
        if model.dropout:
            forward += 2 * e + 1
        memory_forward += forward * score_elements
        memory_backward += 2 * forward * score_elements
        kernels += 6 * layers

    # norms: one to four per layer on h; any fp32 form (activations.norm_keeps: Hugging Face's RMSNorm, Cohere's
    # centred LayerNorm) is PyTorch's element-wise kernels one after another, timed as the upcasting RMSNorm's
    unfused_norm = norm_keeps(w) != "input"
    norm_forward = 28 + 4 * e if unfused_norm else 2 * e
    norms = model.norms_per_layer
    norm_elements = norms * layers * hidden_tokens * h
    memory_forward += norm_forward * norm_elements
    memory_backward += (2 * norm_forward if unfused_norm else 3 * e) * norm_elements
    kernels += norms * layers * ((6 + 10) if unfused_norm else 2)

    # residual adds (and dropout on both branches)
    residual_elements = 2 * layers * hidden_tokens * h
    memory_forward += 3 * e * residual_elements
    memory_backward += 3 * e * residual_elements
    kernels += 4 * layers
    if model.dropout:
        memory_forward += (2 * e + 1) * residual_elements
        memory_backward += (2 * e + 1) * residual_elements
        kernels += 4 * layers

    # rotary on Q and K
    if model.position_embedding == "rope" or model.mla:
        rope_dim = model.mla.qk_rope_head_dim if model.mla else d
        rope_elements = tokens * (heads + (heads if model.mla else kv_heads)) * rope_dim * layers
        per = 9 * e if profile.rotary.tables else 2 * e
        memory_forward += per * rope_elements
        memory_backward += per * rope_elements
        kernels += layers * (2 * 11 if profile.rotary.tables else 4)

    # copies of Q, K and V the framework makes to lay them out for the kernel
    rule = profile.attention
    copy_elements = (
        tokens * d * layers * (heads * (rule.q_copies - 1) + kv_heads * (rule.k_copies - 1 + rule.v_copies - 1))
    )
    memory_forward += 2 * e * copy_elements
    memory_backward += 2 * e * copy_elements
    kernels += 2 * layers * (rule.q_copies + rule.k_copies + rule.v_copies - 3)

    # the MLP activation, per element of its inner width on this GPU
    moe = model.moe
    dense_width = built.dense * tokens * model.ffn_size / tp
    moe_width = 0.0
    if moe and built.moe:
        inner = moe.expert_ffn_size * moe.experts_per_token + moe.shared_width * moe.shared_experts
        moe_width = built.moe * tokens * inner / tp
    width = dense_width + moe_width
    if model.ffn_kind == "gelu_mlp":
        fused = not gelu_ops_kept(w)  # one kernel, or the model's GELU written op by op (engine.model_code)
        memory_forward += (2 * e if fused else 20 * e) * width
        memory_backward += (3 * e if fused else 30 * e) * width
        kernels += layers * (2 if fused else 20)
    else:
        fused = profile.mlp.gated == "fused"
        memory_forward += (3 * e if fused else 5 * e) * width
        memory_backward += (5 * e if fused else 9 * e) * width
        kernels += layers * (2 if fused else 5)

    # MoE: permute the routed tokens to their experts and back, forward and backward
    if moe and built.moe:
        routed = hidden_tokens * moe.experts_per_token * h * built.moe
        memory_forward += 2 * 2 * e * routed
        memory_backward += 2 * 2 * e * routed
        kernels += 12 * built.moe

    # the loss over this GPU's share of the logits, forward and backward: about five passes in its dtype
    if built.head:
        logits = tokens * model.vocab_size / tp
        loss_bytes = profile.loss.saved_bytes or e
        memory_forward += (e + 3 * loss_bytes) * logits
        memory_backward += (2 * loss_bytes + e) * logits
        kernels += 8
        memory_forward += 2 * e * hidden_tokens * h  # the final norm
        memory_backward += 3 * e * hidden_tokens * h
        kernels += 2
    if built.embedding:
        vocab_rows = model.vocab_size / tp
        memory_forward += 2 * e * hidden_tokens * h  # the lookup
        memory_backward += e * vocab_rows * h + 2 * e * hidden_tokens * h  # a dense gradient, zeroed, then added into
        kernels += 3

    # gradients: the weight-gradient GEMM accumulates into fp32 (fused), or each micro-batch's gradients are
    # added into the accumulated ones by a separate pass
    grad_bytes = w.grad_bytes
    weight_elements = sum(g.n * g.k * g.count * g.weight_grad for g in gemms + list(head))
    if built.embedding and not (built.head and model.tied_embeddings):
        weight_elements += model.vocab_size / tp * h
    fused_accumulation = profile.speed.fused_grad_accumulation
    accumulation = 0.0 if fused_accumulation else (w.precision.param_bytes + 2 * grad_bytes) * weight_elements
    if not fused_accumulation:
        kernels += sum(g.count for g in gemms) + len(head)

    # fp8 GEMMs: separately, each GEMM's input, output gradient and weight are cast to fp8 with a transposed copy
    # for the weight gradient (a cast-transpose kernel: read 2 bytes, write 1 + 1); fused into the producers, only
    # the transposes (read 1, write 1) remain
    fp8_cast = 0.0
    if w.precision.compute_dtype == "fp8":
        every = gemms + list(head)
        if profile.speed.fp8_casts == "fused":  # the transposes of the input and of the output gradient only
            fp8_cast = sum(2 * (g.m * g.k + g.m * g.n) * g.count for g in every)
            kernels += 2 * (sum(g.count for g in gemms) + len(head))
        else:
            fp8_cast = sum(4 * (g.m * g.k + g.m * g.n + g.n * g.k) * g.count for g in every)
            kernels += 3 * (sum(g.count for g in gemms) + len(head))

    collectives = 0.0  # tensor-parallel collectives the host issues: four a layer (two more recomputed), the count
    if tp > 1:  # the host time per operation was fitted with (sequence parallelism issues them in halves)
        collectives = layers * (4 + (2 if w.recompute == "full" else 0))
    recompute_full = w.recompute == "full"
    return StageWork(
        gemms=tuple(gemms),
        head=head,
        batched=tuple(batched),
        recomputed_gemms=1.0 if recompute_full else 0.0,
        attention_forward=attention_forward,
        attention_backward=attention_backward,
        attention_recomputed=attention_forward if recompute_full else 0.0,
        memory_forward=memory_forward,
        memory_backward=(memory_backward + (memory_forward if recompute_full else 0.0)) * live,
        memory_kernels=kernels * (1.5 if recompute_full else 1.0),
        accumulation_bytes=accumulation,
        wgrad_accumulator_bytes=2 * grad_bytes if fused_accumulation and grad_bytes > e else 0.0,
        fp8_cast_bytes=fp8_cast * (1.5 if recompute_full else 1.0),
        tp_collectives=collectives,
        tp_collective_bytes=tokens * h * e,
        layers=layers,
    )


@functools.lru_cache(maxsize=256)
def kernel_workload(w: Workload) -> Workload:
    """``w`` as its kernels see it. Of recomputation, ``stage_work`` reads only whether it is full: selective
    recomputation redoes attention's core, which fused attention never saved, so no kernel runs again. Figures
    of the kernels cached under this workload serve both the selective mode and none."""
    return replace(w, recompute="none") if w.recompute == "selective" else w
