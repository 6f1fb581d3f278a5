"""One GPU's memory as terms, each with its formula and source: the model states, the activations, the whole.

``engine.memory.gpu_memory`` finds the bytes; this module says how they were found, for the tables, ``--json`` and
``--explain`` alike.
"""

from __future__ import annotations

from typing import NamedTuple

from lmcalc.engine.memory.activations import layer_kept_tensors
from lmcalc.engine.memory.buffer_terms import buffer_terms
from lmcalc.engine.memory.finetune_terms import method_section
from lmcalc.engine.memory.gpu_memory import GpuMemory, bytes_on_gpu, split_by_tp
from lmcalc.engine.memory.outside_pool import outside_pool_terms
from lmcalc.engine.memory.phases import step_phases
from lmcalc.engine.memory.saved import SavedTensor, saved_formula
from lmcalc.engine.parallel.layout import Layout
from lmcalc.engine.parallel.pipeline import interleaved_passes_held, stage_chunk_mixes, stage_layer_counts, stage_layers
from lmcalc.engine.parallel.sharding import (
    ModelState,
    StageParams,
    gathered_to_backward,
    stage_params,
    trained_precision,
    zero_shards,
)
from lmcalc.engine.parallel.states import matrix_params, state_formula, trained_params
from lmcalc.engine.workload import Workload
from lmcalc.result import Section, Term
from lmcalc.specs import HardwareSpec, ModelSpec
from lmcalc.units import GB, group


class Capacity(NamedTuple):
    """A GPU's memory in bytes, how the spec sheet words it (``h100-sxm: 80 GB HBM3, 79.19 GiB to CUDA``) and where
    the figure comes from."""

    bytes: float
    label: str
    source: str = ""

    @classmethod
    def of(cls, hardware: HardwareSpec) -> Capacity:
        """The memory of one of ``hardware`` (CUDA's total where measured, else the label's bytes), labelled with the
        preset and its wording."""
        source = hardware.sources.get("cuda_memory" if hardware.cuda_memory_bytes else "memory", "")
        return cls(hardware.capacity_bytes, f"{hardware.name}: {hardware.capacity_label}", source)


def overhead_term(value: float, what: str = "CUDA context, workspaces, fragmentation") -> Term:
    return Term(
        "overhead",
        "Overhead allowance",
        value,
        "bytes",
        what,
        source="lmcalc allowance (not measured), change with --overhead",
    )


def capacity_terms(total: float, capacity: Capacity, utilisation: bool = True) -> tuple[Term, ...]:
    """The GPU's memory, what is left of it (negative: does not fit) and, unless not wanted, the fraction used."""
    terms = (
        Term("capacity", "GPU memory", capacity.bytes, "bytes", capacity.label, source=capacity.source),
        Term(
            "headroom",
            "Headroom",
            capacity.bytes - total,
            "bytes",
            "capacity − total",
            note="negative: does not fit" if total > capacity.bytes else "",
        ),
    )
    if not utilisation:
        return terms
    return (
        *terms,
        Term("utilisation", "Fraction of memory used", 100 * total / capacity.bytes, "%", "total / capacity"),
    )


def memory_sections(
    w: Workload, layout: Layout, gpu: GpuMemory, capacity: Capacity, gpus_per_node: int = 1
) -> tuple[Section, ...]:
    """The memory of one GPU (``gpu``, of its stage) as terms: model states (with, under a fine-tuning method or
    offload, what is trained, frozen and offloaded), activations, and the whole."""
    method = method_section(w, layout, gpu, gpus_per_node)
    return (
        _states_section(w, layout, gpu),
        *((method,) if method else ()),
        _activations_section(w, layout, gpu),
        _total_section(w, layout, gpu, capacity),
    )


def _states_section(w: Workload, layout: Layout, gpu: GpuMemory) -> Section:
    held = stage_params(w, layout, gpu.stage)
    return Section(
        "state",
        f"Model states per GPU ({layout.label})",
        (
            _params_held_term(layout, gpu, held.total),
            *_weight_and_gradient_terms(w, layout, gpu, held),
            *_master_and_optimizer_terms(w, layout, gpu, held),
            Term(
                "total",
                "Model states",
                gpu.states,
                "bytes",
                "params + grads + master + optimizer",
                source="Rajbhandari et al. 2020 (ZeRO) §3.1, §5.1",
            ),
        ),
    )


def _params_held_term(layout: Layout, gpu: GpuMemory, n_stage: float) -> Term:
    """The parameters one GPU of the stage holds before ZeRO: what TP, PP and EP leave it."""
    on_gpu = f"one GPU of stage {gpu.stage + 1} of {layout.pp}" if layout.pp > 1 else "each GPU"
    states_formula = (
        f"N_gpu = {group(round(n_stage))} parameters on {on_gpu} "
        f"(TP={layout.tp} splits the matrices, PP={layout.pp} the layers"
        + (f", EP={layout.ep} the experts" if layout.ep > 1 else "")
        + (f", ETP={layout.expert_tp} each expert" if layout.folded else "")
        + ")"
    )
    return Term("params_per_gpu", "Parameters held (before ZeRO)", n_stage, "params", states_formula,
                source="Shoeybi et al. 2019 (Megatron-LM) tensor-parallel split")  # fmt: skip


def _trained_symbol(w: Workload) -> str:
    """What has gradients and optimizer states: every parameter held, or the trained ones."""
    return "N_gpu" if w.method.kind == "full" else "N_train"


def _updated_symbol(w: Workload) -> str:
    """What has gradients and optimizer states: ``_trained_symbol``'s, less the weights no step computes where
    autograd makes the gradients (Llama 3.2 Vision's cross-attention layers on text: ``stage_states``)."""
    idle = w.model.cross_attention is not None and w.framework.states.grads_lifetime == "step"
    return f"({_trained_symbol(w)} − N_idle)" if idle else _trained_symbol(w)


IDLE_NOTE = (
    "N_idle: the cross-attention layers' weights (their adapters under LoRA), which a step of text skips: held, but "
    "autograd makes them no gradient and the optimizer no state"
)


def _shard_text(state: ModelState, layout: Layout, held: StageParams) -> str:
    """How ZeRO divides ``state`` over the data-parallel replicas (the experts over fewer of them), if it does."""
    (rep_d, rep_e), groups = layout.state_shards.shards_of(state), layout.hsdp
    if not zero_shards(state, layout.zero) or rep_d == 1 and rep_e == 1:
        return ""
    where = "across" if layout.hsdp_shard_optimizer and state in ("master", "optimizer") else "within each of"  # HFSDP
    hsdp = f", {where} HSDP's {groups} groups" if groups > 1 else ""
    if held.experts:
        return f", dense / {rep_d} and experts / {rep_e} (ZeRO-{layout.zero}{hsdp})"
    return f" / {rep_d} (ZeRO-{layout.zero} over DP·CP{hsdp})"


def _weight_and_gradient_terms(w: Workload, layout: Layout, gpu: GpuMemory, held: StageParams) -> tuple[Term, ...]:
    """The weights the passes read (frozen ones too), the gradients of what is trained, and those the busiest phase
    holds where it holds fewer."""
    precision, n = trained_precision(w), _trained_symbol(w)
    frozen = "frozen weights + " if w.method.kind != "full" else ""
    grad_bytes = w.framework.states.grad_bytes or precision.grad_bytes
    fp32_adapters = " (PEFT's fp32 adapters)" if precision is not w.precision else ""
    return (
        Term(
            "params",
            "Parameters",
            gpu.params,
            "bytes",
            f"{frozen}{n} · {precision.param_bytes:g} B{fp32_adapters}{_shard_text('params', layout, held)}"
            + (" (offloaded: 0 on the GPU)" if w.offload.params else "")
            + (", less the layers' weights, kept in fp8 (FP8 weights)" if w.framework.fp8.primary_weights else "")
            if w.framework.states.weights == "recipe"
            else f"{frozen}{n} · {precision.param_bytes:g} B: each layer's 16-bit weights gathered in its forward, "
            "kept to its backward (FSDP's ZeRO-2: no resharding after forward)"
            if gathered_to_backward(w, layout.zero)
            else "0: only the master copy persists; the 16-bit weights are gathered a layer at a time",
            source=f"precision recipe {w.precision.name}",
        ),
        Term(
            "grads",
            "Gradients",
            gpu.grads,
            "bytes",
            f"{_updated_symbol(w)} · {grad_bytes:g} B{_shard_text('grads', layout, held)}"
            + (" (offloaded: 0 on the GPU)" if w.offload.params else ""),
            source=w.framework.states.source if w.framework.states.grad_bytes else "",
            note=IDLE_NOTE if _updated_symbol(w) != n else "",
        ),
        *_grads_at_peak_terms(w, gpu),
    )


def _grads_at_peak_terms(w: Workload, gpu: GpuMemory) -> tuple[Term, ...]:
    """Where the framework makes the gradients in each step's backward and a step is one micro-batch, those the
    busiest phase holds: none at the loss's backward."""
    if not gpu.grads_unmade:
        return ()
    share = gpu.grads_unmade / gpu.grads
    return (
        Term(
            "grads_at_peak",
            "Gradients at the peak",
            gpu.grads - gpu.grads_unmade,
            "bytes",
            "gradients − the share autograd has not made by the busiest phase",
            f"{gpu.grads / GB:.4g} GB − {share:.4g} × {gpu.grads / GB:.4g} GB",
            source=w.framework.states.source,
            note=f"binds at {gpu.phases.binding}; zero_grad(set_to_none=True) freed the last step's gradients and "
            "one micro-batch makes the step (--grad-accum 1)",
        ),
    )


def _master_and_optimizer_terms(w: Workload, layout: Layout, gpu: GpuMemory, held: StageParams) -> tuple[Term, Term]:
    """The fp32 master weights and the optimizer's states of what is trained (none on the GPU when offloaded)."""
    precision, optimizer, n = trained_precision(w), w.optimizer, _trained_symbol(w)
    opt_formula = " + ".join(state_formula(s, precision, _updated_symbol(w)) for s in optimizer.states) or "0"
    offloaded = " (offloaded: 0 on the GPU)" if w.offload.optimizer else ""
    optimizer_shard = _shard_text("optimizer", layout, held)
    return (
        Term(
            "master",
            "Master weights (fp32)",
            gpu.master,
            "bytes",
            f"{n} · {precision.master_bytes:g} B{_shard_text('master', layout, held)}{offloaded}",
        ),
        Term(
            "optimizer",
            f"Optimizer states ({optimizer.name})",
            gpu.optimizer,
            "bytes",
            (f"({opt_formula}){optimizer_shard}" if optimizer_shard else opt_formula) + offloaded,
            source="; ".join(optimizer.sources),
            note=_matrices_note(w),
        ),
    )


def _matrices_note(w: Workload) -> str:
    """Where an optimizer keeps states for some weights only (Muon's matrices, AdamW's others): their share."""
    if all(s.params == "all" for s in w.optimizer.states):
        return ""
    share = matrix_params(w.model, w.method) / trained_params(w.model, w.method)
    return (
        f"N_matrices: the 2-D weights other than the embedding and the head, {100 * share:.4g} % of the trained "
        "weights (Muon's); the others keep AdamW's moments"
    )


def _activations_section(w: Workload, layout: Layout, gpu: GpuMemory) -> Section:
    model = w.model
    built = stage_layers(model, layout, gpu.stage)
    split_text = (
        f"TP={layout.tp}"
        + (" with SP" if layout.sequence_parallel else " without SP")
        + (f", CP={layout.cp}" if layout.cp > 1 else "")
    )
    terms = []
    for moe_layer, count in ((False, built.dense), (True, built.moe)):
        if not count:
            continue
        tensors = layer_kept_tensors(w, moe_layer)
        terms.append(
            Term(
                "moe_layer" if moe_layer else "dense_layer",
                ("One MoE layer" if moe_layer else "One dense layer" if model.moe else "One layer") + " on this GPU",
                sum(bytes_on_gpu(t, layout) for t in tensors),
                "bytes",
                _split_formula(tensors, layout),
                f"s={w.seq_len}, b={w.micro_batch}, h={model.hidden_size}, H={model.num_heads}, "
                f"H_kv={model.kv_heads}, f={model.ffn_size}{_widths_values(model)}; divided for {split_text}",
                "Korthikanti et al. 2022 §4.1 eq. (1)–(4), tensor by tensor",
                note=f"{w.attention} attention; recomputation: {w.recompute}",
            )
        )
    counts = stage_layer_counts(model, layout)
    if len(set(counts)) == 1:
        layers_formula, layers_numbers = "L / PP", f"{model.num_layers} / {layout.pp}"
    else:
        layers_formula = f"stage {gpu.stage + 1}'s share of the L layers (stages differ)"
        layers_numbers = f"{model.num_layers} = " + " + ".join(str(n) for n in counts)
    terms.append(Term("layers_on_gpu", "Layers on this GPU", built.layers, "layers", layers_formula, layers_numbers))
    terms.append(_in_flight_term(w, layout, gpu))
    terms.append(
        Term(
            "outside_layers",
            "Token ids, final norm, head input, logits",
            gpu.activations_outside,
            "bytes",
            "per micro-batch holding them: embedding side (first stage), head side (last stage)",
            source="Korthikanti et al. 2022 §4.3 (extra terms)",
        )
    )
    terms.append(
        Term(
            "total",
            "Activations",
            gpu.activations,
            "bytes",
            "in flight · layers · one layer (+ embedding on the first stage, head and logits on the last)"
            + _recomputed_text(w),
            note=f"the layer rebuilt in its backward, {gpu.activations_rebuilt / GB:.3g} GB"
            + (" (its larger kind: attention or its other mixer, not the average layer)" if model.hybrid else "")
            + (" (its largest block: a mixer or an FFN alone)" if model.single_blocks else "")
            + ", counts in that phase (the transient peak)"
            if gpu.activations_rebuilt
            else "",
        )
    )
    title = f"Activations per GPU (micro-batch {w.micro_batch} × {w.seq_len} tokens)"
    return Section("activations", title, tuple(terms))


def _recomputed_text(w: Workload) -> str:
    """What full recomputation keeps of the layers, or CPU offloading leaves on the GPU, as the activations' formula
    says it."""
    if w.offloaded_layers:
        n = w.offloaded_layers
        return (
            f" — the first {n} layer{'s' if n > 1 else ''}' activations offloaded to host memory, (L − {n}) layers on "
            "the GPU (Transformer Engine's CPU offload context)"
        )
    if w.offload_modules and w.recompute != "full":  # Megatron-Core's fine-grained offloading (module_offload)
        return (f" − (L_moe − 1) · the routed experts' tensors of ≥ {w.min_offloaded_tensor_size:,} elements in "
                f"{', '.join(w.offload_modules)}, offloaded to host memory")  # fmt: skip
    if w.recompute != "full":
        return ""
    n = w.recompute_num_layers
    if w.recompute_method == "block":
        return (
            f" — full recompute (block) keeps the input of the first {n} layers of each chunk, everything of the "
            "others (Megatron-Core megatron/core/recompute.py)"
        )
    if n > 1:
        return f" — full recompute keeps the input of each unit of {n} layers, rebuilt together in the backward"
    return " — full recompute keeps each layer's input"


def _total_section(w: Workload, layout: Layout, gpu: GpuMemory, capacity: Capacity) -> Section:
    where = f"stage {gpu.stage + 1} of {layout.pp}" if layout.pp > 1 else "every GPU"
    rules = w.framework
    total = gpu.total
    terms = (
        Term(
            "states",
            "Model states" + (" at the peak" if gpu.grads_unmade else ""),
            gpu.states_at_peak,
            "bytes",
            "weights + gradients at the peak + master + optimizer states" if gpu.grads_unmade else "",
        ),
        Term("activations", "Activations", gpu.activations, "bytes"),
        *buffer_terms(w, layout, gpu),
        _transient_term(w, gpu),
        *_allocator_terms(w, layout, gpu),
        overhead_term(gpu.overhead, "a flat allowance (--overhead) beside what the profile counts"),
        Term(
            "total",
            "Total",
            total,
            "bytes",
            "reserved + CUDA context + overhead allowance",
            note=f"framework profile: {rules.name}",
        ),
    )
    return Section("total", f"Most loaded GPU ({where})", (*terms, *capacity_terms(total, capacity)))


def _transient_term(w: Workload, gpu: GpuMemory) -> Term:
    """What the busiest phase of the step adds to the saved activations, and which phase that is."""
    rules, held, t = w.framework, gpu.held, gpu.transients
    queue = gpu.kept.queue
    phases = step_phases(held, t, gpu.step_transient, queue=queue)  # every gradient counted with the states
    rebuilt = f" + rebuilt layer {held.rebuilt / GB:.3g}" if held.rebuilt else ""
    buckets = f" + gradient buckets {queue.layer_peak(held.first_layer) / GB:.3g}" if queue.layers else ""
    unmade = held.unmade
    not_made = (
        f"; less the gradients not made by then: loss {unmade.loss * gpu.grads / GB:.4g} GB, norm "
        f"{unmade.norm * gpu.grads / GB:.4g} GB, layer {unmade.layer * gpu.grads / GB:.4g} GB, first layer "
        f"{unmade.first_layer * gpu.grads / GB:.4g} GB"
        if gpu.grads_unmade
        else ""
    )
    return Term(
        "transient",
        "Transient peak",
        gpu.transient,
        "bytes",
        (
            "the step's busiest phase − activations"
            + (" + the gradients it does not hold yet" if gpu.grads_unmade else "")
        )
        if rules.transients or held.rebuilt
        else f"none: the {rules.name} profile counts no transients",
        f"loss {phases.loss_backward / GB:.4g} GB; norm {phases.norm_backward / GB:.4g} GB; layer "
        f"{held.total / GB:.4g} − {held.head / GB:.3g}{rebuilt} + {t.layer / GB:.3g}{buckets} = "
        f"{phases.layer_backward / GB:.4g} GB; first layer {phases.first_layer_backward / GB:.4g} GB; embedding "
        f"{phases.embedding_backward / GB:.4g} GB; optimizer step {phases.optimizer_step / GB:.4g} GB"
        + (
            f"; a layer's forward at its indexer's scores or CDMoE's key sums, or the forward's end "
            f"(+{t.forward / GB:.4g}) "
            f"{phases.layer_forward / GB:.4g} GB"
            if phases.layer_forward
            else ""
        )
        + not_made
        + queue.numbers(held.first_layer),
        source=f"{rules.loss.source}; {rules.optimizer_step.source}",
        note=f"binds at {gpu.phases.binding}: PyTorch frees a node's saved tensors once it has run, so the logits' "
        "gradients, a rebuilt layer and the optimizer's temporaries never live together"
        if rules.transients or held.rebuilt
        else f"none: the {rules.name} profile counts no transients",
    )


def _allocator_terms(w: Workload, layout: Layout, gpu: GpuMemory) -> tuple[Term, ...]:
    """From what is allocated at the peak to what the process holds: the allocator's fragmentation, then the CUDA
    context outside PyTorch's pool."""
    rules = w.framework
    return (
        Term(
            "framework_buffers",
            "Framework buffers, all",
            gpu.framework_buffers,
            "bytes",
            "ZeRO-3 gathered parameters + DDP gradient buckets + framework buffers",
        ),
        Term(
            "allocated", "Allocated at the peak", gpu.allocated, "bytes", "states + buffers + activations + transient"
        ),
        Term(
            "fragmentation",
            "Allocator fragmentation",
            gpu.fragmentation,
            "bytes",
            "fragmentation fraction · allocated",
            f"{rules.allocator.fragmentation:g} × {gpu.allocated / GB:.4g} GB",
            source=rules.allocator.source,
        ),
        Term("reserved", "Reserved by PyTorch", gpu.reserved, "bytes", "allocated + fragmentation"),
        *outside_pool_terms(w, layout, gpu.context),
    )


def _in_flight_term(w: Workload, layout: Layout, gpu: GpuMemory) -> Term:
    """How many micro-batches the stage holds at its busiest (``held_in_flight``), with the schedule's count."""
    p, v, m, i = layout.pp, layout.split.chunks, layout.grad_accum, gpu.stage
    source = "Narayanan et al. 2021 §2.2 (1F1B)"
    if v == 1:
        formula, numbers = "min(PP − i, micro-batches per step), stage i counted from 0", f"min({p} − {i}, {m})"
        note = "under 1F1B the first stage holds one micro-batch per pipeline stage"
    else:
        passes = interleaved_passes_held(layout, i)
        chunks = " + ".join(str(dense + moe) for dense, moe in stage_chunk_mixes(w.model, layout)[i])
        formula = "forward passes through a chunk held by stage i (from 0): min(m·v, 2·(p − 1 − i) + (v − 1)·p + 1)"
        numbers = f"min({m}·{v}, 2·({p} − 1 − {i}) + ({v} − 1)·{p} + 1) = {passes} passes; layers per chunk {chunks}"
        source += "; Megatron-LM's interleaved warm-up + 1 (Korthikanti et al. 2022 §4.2.3 on the first stage)"
        note = (
            "counted in passes through all the stage's layers, at the stage's busiest moment (with uneven chunks it "
            "can come after the first backward pass)"
        )
    return Term("in_flight", "Micro-batches in flight", gpu.micro_batches_in_flight, "micro-batches", formula, numbers,
                source=source, note=note)  # fmt: skip


def _split_formula(tensors: tuple[SavedTensor, ...], layout: Layout) -> str:
    """``saved_formula`` with each group of tensors over what splits it on one GPU: ``(…)/(TP·CP) + (…)/CP``."""
    groups: dict[str, list[SavedTensor]] = {}
    for tensor in tensors:
        by_tp = layout.tp > 1 and split_by_tp(tensor, layout)
        factors = [name for name, applies in (("TP", by_tp), ("CP", layout.cp > 1)) if applies]
        divisor = f"({'·'.join(factors)})" if len(factors) > 1 else "".join(factors)
        groups.setdefault(divisor, []).append(tensor)
    if list(groups) == [""]:
        return saved_formula(tensors)
    return " + ".join(
        f"({saved_formula(group)})/{divisor}" if divisor else saved_formula(group) for divisor, group in groups.items()
    )


def _widths_values(model: ModelSpec) -> str:
    """The values of the widths the layers count in beyond Korthikanti et al.'s symbols: an MoE's E, k and f_e (its
    shared experts' E_shared and f_s, a latent MoE's l); Gemma's a head's d, a global layer's d_g and H_kv,g, the
    per-layer inputs' d_p, AltUp's n streams and LAuReL's rank r_L."""
    g, ple, altup, moe = model.global_attention, model.per_layer_input, model.altup, model.moe
    values = [("d", model.head_size if g or altup else None), ("d_g", g.head_dim if g else None),
              ("H_kv,g", g.kv_heads if g else None), ("d_p", ple.width if ple else None),
              ("n", altup.streams if altup else None), ("r_L", altup.laurel_rank if altup else None)]  # fmt: skip
    if moe and moe.experts_per_token:
        values += [("E", moe.num_experts), ("k", moe.k), ("f_e", moe.expert_ffn_size), ("l", moe.latent_size),
                   ("E_shared", moe.shared_experts), ("f_s", moe.shared_expert_ffn_size)]  # fmt: skip
    return "".join(f", {symbol}={value}" for symbol, value in values if value)
