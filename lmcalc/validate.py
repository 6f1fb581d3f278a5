"""``lmcalc validate``: the engine's figures side by side with PyTorch's own, with a verdict per row.

1. Parameters of the reference ``nn.Module`` (built on the meta device) vs the engine's exact count.
2. FLOPs of one training step counted by ``FlopCounterMode`` (meta device) vs the engine's detailed
   count in the same convention: full, non-causal attention, as the counter counts it.
3. Bytes saved for backward by a small model of the same architecture on the CPU (distinct storages,
   parameters and buffers excluded) vs the engine's activation formula, per attention kernel and
   recomputation mode.
4. The peak memory of a real AdamW step vs the engine's phase-by-phase peak (``engine.memory.step_peak``), with
   the parts it is made of set side by side: always on the small model on the CPU (live storages
   tracked), and with CUDA on the model itself on the GPU (the allocator's counters).

torch is imported only when a check runs, never by the accounting commands.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from lmcalc.engine.choices import ATTENTION_KERNELS, RECOMPUTE_MODES, Recompute
from lmcalc.engine.memory.gpu_memory import gpu_memory
from lmcalc.engine.memory.step_peak import StepPeak
from lmcalc.engine.model import flops as fl
from lmcalc.engine.model.params import count_params
from lmcalc.engine.parallel.layout import Layout
from lmcalc.engine.workload import Workload, dropout_mask_bytes
from lmcalc.errors import LmcalcError, setting
from lmcalc.estimates.inputs import ModelLike, choice, positive_int, resolve_model, seq_given
from lmcalc.presets import framework_profile, resolve_optimizer, resolve_precision
from lmcalc.result import Input, Result, Section, Term
from lmcalc.specs import ModelSpec

if TYPE_CHECKING:
    from lmcalc.measure import StepMemory

PARAM_TOLERANCE = 0.0  # the count is exact: any difference is a bug
FLOP_TOLERANCE = 1e-3  # 0.1 %
ACTIVATION_TOLERANCE = 0.05  # 5 %
PEAK_MEMORY_TOLERANCE = 0.10  # 10 %
SMALL_SEQ_CAP = 512  # the CPU model keeps eager attention's b·H·s² scores small
SMALL_HIDDEN, SMALL_HEADS, SMALL_LAYERS, SMALL_VOCAB = 64, 8, 2, 256
CPU_RECIPE = "fp32"  # the CPU check runs in fp32, with torch.optim.AdamW


def small_config(spec: ModelSpec) -> ModelSpec:
    """The same architecture at toy size: every kind of tensor is still there, in the same proportions."""
    h, heads = SMALL_HIDDEN, SMALL_HEADS
    ratio = spec.ffn_size / spec.hidden_size
    update: dict = {
        "name": f"{spec.name}-small",
        "display_name": "",
        "aliases": [],
        "family_aliases": [],
        "vocab_size": SMALL_VOCAB,
        "hidden_size": h,
        "num_heads": heads,
        "num_kv_heads": max(1, heads * spec.kv_heads // spec.num_heads) if not spec.mla else None,
        "local_kv_heads": max(1, heads * spec.local_kv_heads // spec.num_heads) if spec.local_kv_heads else None,
        "head_dim": None,
        "value_head_dim": SMALL_HIDDEN // heads // 2 if spec.value_head_dim else None,  # values half the keys' width
        "ffn_size": max(8, round(ratio * h)),
        "num_layers": SMALL_LAYERS,
        "max_seq_len": SMALL_SEQ_CAP,
        "published_params": None,
        "published_params_sig_figs": None,
    }
    if spec.mla:
        update["head_dim"] = 8
        update["mla"] = {
            "q_lora_rank": 32 if spec.mla.q_lora_rank else None,
            "kv_lora_rank": 24,
            "qk_nope_head_dim": 8,
            "qk_rope_head_dim": 8,
            "v_head_dim": 8,
        }
    if spec.moe:
        moe = spec.moe
        experts = min(moe.num_experts, 4)
        update["moe"] = moe.model_dump() | {
            "num_experts": experts,
            "experts_per_token": min(moe.k, experts // 2 or 1),
            "shared_experts": min(moe.shared_experts, 1),
            "expert_ffn_size": max(8, round(moe.expert_ffn_size / spec.hidden_size * h)),
            "dense_layers": min(moe.dense_layers, 1),
            "moe_every": min(moe.moe_every, SMALL_LAYERS),
            "dense_layer_ids": [],
            "shared_expert_ffn_size": None,
            "node_limit": None,
            "zero_experts": min(moe.zero_experts, experts // 2),  # LongCat-Flash's 2 to 1, real to pass-through
        }
    if spec.sliding_window:  # a window shorter than the check's sequences, one global layer of the two
        update["sliding_window"] = min(spec.sliding_window, 64)
        update["global_every"] = None if spec.global_every is None else SMALL_LAYERS
        update["global_layer_ids"] = [SMALL_LAYERS - 1] if spec.global_layer_ids else []
    return ModelSpec.model_validate({**spec.model_dump(), **update})


def cpu_fallback_reason(spec: ModelSpec, attention: str) -> str:
    """Why PyTorch's CPU ``scaled_dot_product_attention`` would not run a fused kernel, or ''."""
    if attention != "flash":
        return ""
    if spec.drops("attention"):
        return "CPU sdpa has no fused dropout: it falls back to the math kernel (scores materialised)"
    if spec.attention_sinks and spec.sink_scale:
        return "PyTorch's fused attention returns no row log-sum-exp, which Granite SWA's sinks scale the output by"
    if spec.qk_head_dim != spec.v_head_dim:
        differ = "MLA's differ" if spec.mla else "this model's values are narrower than its keys"
        return f"CPU sdpa needs equal Q/K and V head sizes for its fused kernel; {differ}"
    return ""


def _compare(
    key: str, title: str, engine: float, measured: float, unit: str, tolerance: float, note: str = "", source: str = ""
) -> Section:
    error = (engine - measured) / measured if measured else float(engine != measured)
    return Section(
        key,
        title,
        (
            Term("lmcalc", "lmcalc", engine, unit, note=note),
            Term("pytorch", "PyTorch", measured, unit, source=source),
            Term(
                "error",
                "Relative error",
                100 * error,
                "%",
                "(lmcalc − PyTorch) / PyTorch",
                note=f"tolerance {100 * tolerance:g} %",
                ok=abs(error) <= tolerance,
            ),
        ),
    )


def _not_run(key: str, title: str, engine: float, unit: str, reason: str) -> Section:
    return Section(
        key,
        title,
        (
            Term("lmcalc", "lmcalc", engine, unit),
            Term("pytorch", "PyTorch", float("nan"), unit, note=reason),
            Term("error", "Relative error", float("nan"), "%", note=f"not run: {reason}"),
        ),
    )


def reference_lacks(spec: ModelSpec) -> str:
    """What of ``spec`` the reference model does not build, in words ('' where it builds all of it)."""
    mla = spec.mla
    for lacks, what in (
        (spec.hybrid, "is a hybrid (state-space or linear layers)"),
        (spec.single_blocks, "has layers that are a mixer or an FFN alone"),
        (spec.attention_output_gate or spec.attention_head_gate != "none", "gates its attention's output"),
        (spec.gated_norm_rank, "gates its norms"),
        (mla and mla.q_latent_concat, "up-projects its queries from two latents"),
        (spec.moe and spec.moe.attention_experts, "routes its attention's heads to experts"),
    ):
        if lacks:
            return what
    return ""


def validate(*, model: ModelLike, seq: str | int = 1024, micro_batch: int = 1, recompute: str | None = None) -> Result:
    """``lmcalc validate``: the engine against PyTorch for ``model``, in one ``recompute`` mode or all three."""
    resolved = resolve_model(model)
    lacks = reference_lacks(resolved.spec)
    if lacks:
        raise LmcalcError(
            f"{resolved.spec.label} {lacks}, which lmcalc's PyTorch reference model does not build; check it against "
            f"transformers ({setting('against')} transformers)"
        )
    modes = RECOMPUTE_MODES if recompute is None else (choice(recompute, RECOMPUTE_MODES, "recompute"),)
    seq_len, micro_batch = int(seq_given(seq).value), positive_int(micro_batch, "micro_batch")
    check_meta_sizes(resolved.spec, seq_len, micro_batch)
    try:
        import torch  # noqa: F401
    except ImportError:
        raise LmcalcError("validate needs PyTorch: pip install 'lmcalc[bench]'") from None
    return validate_result(resolved.spec, seq_len, micro_batch, modes, resolved.note)


META_ELEMENT_LIMIT = 2**60
"""The most elements the FLOP check lets one tensor of the model built on PyTorch's meta device have. torch refuses
a tensor whose bytes pass 2⁶³ ("Storage size calculation overflowed"); 2⁶⁰ elements of up to 8 bytes stay below."""


def check_meta_sizes(spec: ModelSpec, seq_len: int, micro_batch: int) -> None:
    """Refuse a sequence whose largest tensor in the FLOP check passes ``META_ELEMENT_LIMIT``, naming the longest
    that runs: the check builds the model itself, at the full sequence (the CPU check caps its own at 512). The
    largest is the attention scores, b·H·s² (twice under differential attention), or a row of b·s per logit, FFN or
    hidden channel; the bound takes their sum, so every tensor stays below it."""
    heads = spec.num_heads * spec.attention_calls + (spec.indexer.heads if spec.indexer else 0)
    widths = spec.vocab_size + 2 * spec.ffn_size + 4 * spec.hidden_size + _expert_width(spec)
    largest = micro_batch * seq_len * (heads * seq_len + widths)
    if largest > META_ELEMENT_LIMIT:
        longest = _longest_sequence(heads * micro_batch, widths * micro_batch)
        raise LmcalcError(
            f"{setting('seq')} {seq_len} with micro-batch {micro_batch} makes tensors of {spec.name} too large for "
            f"PyTorch to build even on the meta device (over 2^60 elements); the FLOP check runs {setting('seq')} "
            f"up to {longest}"
        )


def _expert_width(spec: ModelSpec) -> int:
    """The widest a token's routed and shared experts make a row: k + shared experts of their inner size."""
    if not spec.moe:
        return 0
    routed = spec.moe.experts_per_token or spec.moe.num_experts
    return 2 * (routed * spec.moe.expert_ffn_size + spec.moe.shared_experts * spec.moe.shared_width)


def _longest_sequence(quadratic: int, linear: int) -> int:
    """The largest s with quadratic·s² + linear·s at most ``META_ELEMENT_LIMIT``."""
    s = math.isqrt(META_ELEMENT_LIMIT // max(quadratic, 1))
    while s > 1 and quadratic * s * s + linear * s > META_ELEMENT_LIMIT:
        s = s * 15 // 16
    return max(s, 1)


def validate_result(
    spec: ModelSpec, seq_len: int, micro_batch: int, recompute_modes: tuple[Recompute, ...], note: str = ""
) -> Result:
    import torch

    _check_even_routing(spec, seq_len, micro_batch)
    sections = _reference_rows(spec, seq_len, micro_batch)
    small = small_config(spec)
    s = min(seq_len, SMALL_SEQ_CAP)
    sections += _activation_rows(small, s, micro_batch, recompute_modes)
    step_mode = recompute_modes[0] if len(recompute_modes) == 1 else "none"
    sections += _cpu_step_rows(small, s, micro_batch, step_mode)
    sections += _peak_memory_rows(spec, seq_len, micro_batch, step_mode)
    inputs = (
        Input("model", "Model", spec.name, origin=note or spec.label),
        Input("seq_len", "Sequence length (rows 1–2)", seq_len, "tokens", "--seq"),
        Input("micro_batch", "Micro-batch", micro_batch, "sequences", "--micro-batch"),
        Input(
            "small",
            "Small model (row 3)",
            f"h={small.hidden_size}, H={small.num_heads}, "
            f"H_kv={small.kv_heads}, L={small.num_layers}, V={small.vocab_size}, fp32, CPU",
        ),
    )
    failed = [sec.title for sec in sections for t in sec.terms if t.ok is False]
    not_run = [f"{sec.title}: not run, {sec.term('pytorch').note}" for sec in sections if sec.term("pytorch").note]
    verdict = "FAILED: " + "; ".join(failed) if failed else "every check that ran passed"
    notes = [verdict, *not_run, f"torch {torch.__version__}"]
    title = f"{spec.label}: lmcalc vs PyTorch"
    return Result(
        "validate", title, inputs, tuple(sections), tuple(notes), layout="grid", headline=(f"{title}: {verdict}",)
    )


def _check_even_routing(spec: ModelSpec, seq_len: int, micro_batch: int) -> None:
    """On meta the tokens are spread evenly over an MoE model's experts: every expert must get the same number."""
    if spec.moe:
        unit = spec.moe.num_experts // math.gcd(spec.moe.num_experts, spec.moe.k)
        if (seq_len * micro_batch) % unit:
            raise LmcalcError(
                f"the FLOP check spreads tokens evenly over {spec.name}'s experts: micro-batch × {setting('seq')} "
                f"must be a multiple of {unit} (e.g. {setting('seq')} {max(unit, seq_len // unit * unit)})"
            )


def _reference_rows(spec: ModelSpec, seq_len: int, micro_batch: int) -> list[Section]:
    """Rows 1 and 2, on the model itself built on the meta device: its parameters, and one step's FLOPs."""
    from lmcalc import measure

    reference = measure.build(spec, "flash", seq_len, "meta")
    params = _compare(
        "params",
        "Parameters (meta device)",
        count_params(spec).total,
        measure.parameter_count(reference),
        "params",
        PARAM_TOLERANCE,
        source="sum(p.numel() for p in module.parameters())",
    )
    engine_flops = fl.step_flops(spec, seq_len).model * seq_len * micro_batch
    causal = fl.step_flops(spec, seq_len, convention="causal").model * seq_len * micro_batch
    flops = _compare(
        "flops",
        f"FLOPs of one step, full attention (b={micro_batch}, s={seq_len})",
        engine_flops,
        measure.training_step_flops(reference, seq_len, micro_batch),
        "FLOPs",
        FLOP_TOLERANCE,
        note=f"causal convention: {causal:.4e} FLOPs",
        source="torch.utils.flop_counter.FlopCounterMode",
    )
    return [params, flops]


def _activation_rows(
    small: ModelSpec, s: int, micro_batch: int, recompute_modes: tuple[Recompute, ...]
) -> list[Section]:
    """Row 3, on the small model on the CPU: the bytes saved for backward, per attention kernel and recomputation
    mode (not run where CPU sdpa would fall back to another kernel than the one named)."""
    import torch

    from lmcalc import measure

    torch.manual_seed(0)
    tokens = torch.randint(0, small.vocab_size, (micro_batch, s))
    fp32, adamw = resolve_precision(CPU_RECIPE).spec, resolve_optimizer("adamw").spec
    sections: list[Section] = []
    for attention in sorted(ATTENTION_KERNELS):  # eager, then flash
        model = measure.build(small, attention, s, "cpu")
        for recompute in recompute_modes:
            key = f"activations_{attention}_{recompute}"
            title = f"Activations, {attention} attention, recompute {recompute} (small model, s={s})"
            mask = dropout_mask_bytes("cpu", fp32)
            workload = Workload(
                small, fp32, adamw, s, micro_batch, attention, recompute, mask, framework=framework_profile()
            )
            engine = gpu_memory(workload, Layout(), 0).held.with_rebuilt  # the whole model on one device
            reason = cpu_fallback_reason(small, attention)
            if reason:
                sections.append(_not_run(key, title, engine, "bytes", reason))
                continue
            sections.append(
                _compare(
                    key,
                    title,
                    engine,
                    measure.peak_saved_bytes(model, tokens, recompute),
                    "bytes",
                    ACTIVATION_TOLERANCE,
                    source="torch.autograd.graph.saved_tensors_hooks, by storage",
                )
            )
    return sections


def _peak_memory_rows(spec: ModelSpec, seq_len: int, micro_batch: int, recompute: str) -> list[Section]:
    """Row 4 and what its difference is made of; without CUDA it says so instead of pretending."""
    import torch

    title = "Peak memory of an AdamW step (CUDA)"
    if not torch.cuda.is_available():
        return [_not_run("peak_memory", title, float("nan"), "bytes", "CUDA is not available on this machine")]
    from lmcalc import measure

    seq = min(seq_len, measure.CUDA_CHECK_SEQ)
    predicted, measured, detail = measure.measured_step(spec, seq, micro_batch, recompute, "cuda")  # type: ignore[arg-type]
    return _step_rows("peak_memory", f"Peak memory of an AdamW step (CUDA, {detail})", predicted, measured)


def _cpu_step_rows(small: ModelSpec, seq_len: int, micro_batch: int, recompute: str) -> list[Section]:
    """The same timeline on the small model on the CPU, its live storages tracked (row 4's CPU twin)."""
    from lmcalc import measure

    spec, dropout_note = small, ""
    if small.dropout:  # CPU sdpa has no fused dropout: run the timeline without it (row 3 checks the masks)
        spec, dropout_note = small.model_copy(update={"dropout": False}), ", dropout off"
    title = f"Peak memory of an AdamW step (small model, s={seq_len}, fp32, CPU{dropout_note})"
    reason = cpu_fallback_reason(spec, "flash")
    if reason:
        return [_not_run("peak_memory_cpu", title, float("nan"), "bytes", reason)]
    predicted, measured, _ = measure.measured_step(spec, seq_len, micro_batch, recompute, "cpu")  # type: ignore[arg-type]
    return _step_rows("peak_memory_cpu", title, predicted, measured, tracked=True)


def _step_rows(key: str, title: str, predicted: StepPeak, measured: StepMemory, tracked: bool = False) -> list[Section]:
    """The step's peak, judged, then its parts side by side (not judged): what a difference is made of.
    The module's buffers (rotary tables, causal mask) and, on CUDA, cuBLAS's workspaces are not model
    state: they are taken off the measured figures, and shown."""
    from lmcalc import measure

    extra = measured.outside_model
    counter = (
        "measure.StorageTracker (live storages)" if tracked else "torch.cuda.memory_allocated / max_memory_allocated"
    )
    return [
        _compare(
            key,
            title,
            predicted.peak,
            measured.peak - extra,
            "bytes",
            PEAK_MEMORY_TOLERANCE,
            note=f"phase by phase, the largest at the {predicted.peak_phase.replace('_', ' ')} "
            "(engine.memory.step_peak)",
            source=f"{counter}, peak of the step − module buffers{'' if tracked else ' − cuBLAS workspaces'}",
        ),
        _part(
            f"{key}_buffers",
            "… module buffers" + ("" if tracked else " + cuBLAS workspaces") + " (not model state)",
            0.0,
            extra,
            "Σ bytes of module.buffers()"
            + ("" if tracked else " + allocated before the model (measure.cuda_workspaces)"),
        ),
        *(
            _part(f"{key}_{part}", f"… {what}", engine, actual, f"{counter}, {when}")
            for part, what, engine, actual, when in measure.step_parts(predicted, measured)
        ),
    ]


def _part(key: str, title: str, engine: float, measured: float, source: str) -> Section:
    """A component of row 4: compared, not judged (the peak is the check). An engine figure of 0 is
    one the engine leaves out by design: no error is computed for it."""
    error = (engine - measured) / measured if measured and engine else math.nan
    return Section(
        key,
        title,
        (
            Term("lmcalc", "lmcalc", engine, "bytes"),
            Term("pytorch", "PyTorch", measured, "bytes", source=source),
            Term("error", "Relative error", 100 * error, "%", "(lmcalc − PyTorch) / PyTorch", note="not judged"),
        ),
    )


def passed(result: Result) -> bool:
    return all(t.ok is not False for section in result.sections for t in section.terms)
