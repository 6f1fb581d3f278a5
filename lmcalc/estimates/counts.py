"""Counting: the parameters of a model, the FLOPs of its training, the bytes of a tensor, the number formats."""

from __future__ import annotations

from dataclasses import dataclass, replace

from lmcalc.engine.choices import ATTN_CONVENTIONS, RECOMPUTE_MODES, AttnConvention, Recompute
from lmcalc.engine.model import flops as fl
from lmcalc.engine.model.numerics import FORMATS, dtype_bytes, tensor_elements
from lmcalc.engine.model.palm import napkin_section, palm_section
from lmcalc.engine.model.params import ParamCount, count_params, params_section
from lmcalc.errors import flag
from lmcalc.estimates.inputs import (
    Given,
    ModelLike,
    checked,
    choice,
    context_note,
    model_input,
    model_notes,
    resolve_model,
    seq_given,
    tokens_given,
)
from lmcalc.estimates.settings import Count
from lmcalc.estimates.shown import Estimate
from lmcalc.hf_meta import MetaParams, UnreadType, meta_params, transformers_installed
from lmcalc.presets import Resolved
from lmcalc.result import Input, Result, Section, Term
from lmcalc.specs import ModelSpec
from lmcalc.units import GB, GiB, check_shape, format_quantity, group, parse_shape

COUNTED_ONLY_NOTE = (
    "lmcalc counts this model's parameters, FLOPs, training time at an MFU and serving memory (params, flops, "
    "train-time, memory --inference); its training memory, fine-tuning and the planner are not modelled yet"
)


@dataclass(frozen=True)
class ParamsEstimate(Estimate):
    """The exact parameter count of ``model``, by tensor group (``counts.by_group``)."""

    model: ModelSpec
    counts: ParamCount

    @property
    def total(self) -> int:
        return self.counts.total

    @property
    def active(self) -> int | None:
        """Parameters one token uses: all of them for a dense model, the routed experts it visits for MoE; None
        where an MoE model's top-k is null."""
        return self.counts.active


def params(*, model: ModelLike) -> ParamsEstimate | MetaParams:
    """The exact parameter count, tensor group by tensor group. A config.json of a transformers type lmcalc does not
    read yet is counted by transformers on the meta device where it is installed (``hf_meta``), and said so."""
    try:
        return params_estimate(resolve_model(model, counting="params"))
    except UnreadType as unread:
        if not transformers_installed():
            raise
        return meta_params(unread)


def params_estimate(resolved: Resolved) -> ParamsEstimate:
    spec = resolved.spec
    report = Result(
        "params",
        f"Parameters of {spec.label}",
        (model_input(spec, resolved.note),),
        (params_section(spec),),
        # what the preset or the config.json reader says of the count, and what else lmcalc estimates of the model
        (*model_notes(spec, resolved.note), *spec.notes, *([COUNTED_ONLY_NOTE] if spec.counted_only else [])),
    )
    total = report.term("params.total")
    report = replace(report, headline=(f"{spec.label}: {group(total.value)} parameters ({total.text})",))
    return ParamsEstimate(report, spec, count_params(spec))


@dataclass(frozen=True)
class FlopsEstimate(Estimate):
    """Training FLOPs of ``model`` on ``tokens`` tokens of ``seq_len``: per token in ``step`` (the detailed count
    in the chosen attention convention), and in total."""

    model: ModelSpec
    tokens: float
    seq_len: int
    step: fl.StepFlops

    @property
    def napkin_flops(self) -> float:
        """6·N·D."""
        return self.value("napkin.total")

    @property
    def model_flops(self) -> float:
        """The detailed count of the whole run: what MFU is measured against."""
        return self.step.model * self.tokens

    @property
    def hardware_flops(self) -> float:
        """With recomputation: what the GPUs execute."""
        return self.value("detailed.hardware_flops")


def flops(
    *,
    model: ModelLike,
    tokens: Count | None = None,
    seq: Count | None = None,
    attn_flops: str = "causal",
    recompute: str = "none",
) -> FlopsEstimate:
    """Training FLOPs: 6·N·D, the detailed matmul count (causal or full attention), and PaLM's convention."""
    resolved = resolve_model(model, counting="flops")
    spec = resolved.spec
    return flops_estimate(
        resolved,
        tokens_given(tokens, spec),
        seq_given(seq, spec),
        choice(attn_flops, ATTN_CONVENTIONS, "attn_flops"),
        choice(recompute, RECOMPUTE_MODES, "recompute"),
    )


def flops_estimate(
    resolved: Resolved,
    tokens: Given,
    seq_len: Given,
    convention: AttnConvention = "causal",
    recompute: Recompute = "none",
) -> FlopsEstimate:
    model, note, seq = resolved.spec, resolved.note, int(seq_len.value)
    napkin = napkin_section(model, tokens.value)
    detailed = fl.detailed_section(model, tokens.value, seq, convention, recompute)
    palm = palm_section(model, tokens.value, seq)
    compare = _compare_section(model, tokens.value, seq, convention, (napkin, detailed, palm))
    inputs = (
        model_input(model, note),
        Input("tokens", "Training tokens D", tokens.value, "tokens", tokens.origin),
        Input("seq_len", "Sequence length s", seq, "tokens", seq_len.origin),
        Input("attention_convention", "Attention FLOPs convention", convention, origin=flag("attn_flops")),
        Input("recompute", "Activation recomputation", recompute, origin=flag("recompute")),
    )
    notes = (*model_notes(model, note), *context_note(model, seq))
    headline = (
        f"{model.label} on {format_quantity(tokens.value, 'tokens')}: {napkin.term('total').text} by 6·N·D; "
        f"{detailed.term('model_flops').text} counted matmul by matmul ({convention} attention, s = {seq:,})",
    )
    report = checked(
        Result(
            "flops",
            f"Training FLOPs of {model.label}",
            inputs,
            (napkin, detailed, palm, compare),
            notes,
            headline=headline,
        )
    )
    step = fl.step_flops(model, seq, recompute, convention)
    return FlopsEstimate(report, model, tokens.value, seq, step)


def _compare_section(
    model: ModelSpec, tokens: float, seq: int, convention: AttnConvention, counts: tuple[Section, Section, Section]
) -> Section:
    """The conventions side by side: the detailed count and PaLM's over the napkin's, and the detailed count with
    the other attention convention (what another tool's MFU may count)."""
    napkin, detailed, palm = counts
    other: AttnConvention = "full" if convention == "causal" else "causal"
    other_model = fl.detailed_section(model, tokens, seq, other, "none").term("model_flops")
    return Section(
        "compare",
        "Conventions compared",
        (
            Term(
                "detailed_over_napkin",
                "Detailed / napkin",
                detailed.term("model_flops").value / napkin.term("total").value,
                "ratio",
                "detailed model FLOPs / 6·N·D",
            ),
            Term(
                "model_flops_other_convention",
                f"Detailed model FLOPs ({other} attention)",
                other_model.value,
                "FLOPs",
                other_model.formula,
                other_model.substituted,
                note="the other attention convention, for comparing MFU figures across tools",
            ),
            Term(
                "palm_over_napkin",
                "PaLM / napkin",
                palm.term("total").value / napkin.term("total").value,
                "ratio",
                "(6N + 12·L·H·Q·T)·D / 6·N·D",
            ),
        ),
    )


@dataclass(frozen=True)
class TensorEstimate(Estimate):
    shape: tuple[int, ...]
    dtype: str

    @property
    def bytes(self) -> float:
        return self.value("tensor.bytes")


def tensor(*, shape: str | tuple[int, ...], dtype: str = "fp32") -> TensorEstimate:
    """Bytes of one tensor: elements × bytes per element."""
    dims = parse_shape(shape) if isinstance(shape, str) else check_shape(tuple(shape), str(tuple(shape)))
    elements = tensor_elements(dims)
    per = dtype_bytes(dtype)
    total = elements * per
    written = " × ".join(str(d) for d in dims)
    report = Result(
        "tensor",
        f"Memory of a {'x'.join(map(str, dims))} {dtype} tensor",
        (Input("shape", "Shape", "x".join(map(str, dims))), Input("dtype", "dtype", dtype)),
        (
            Section(
                "tensor",
                "Tensor",
                (
                    Term("elements", "Elements", elements, "elements", "product of the dimensions", written),
                    Term("bytes_per_element", "Bytes per element", per, "bytes", f"bits of {dtype} / 8"),
                    Term(
                        "bytes", "Size", total, "bytes", "elements × bytes per element", f"{group(elements)} × {per:g}"
                    ),
                    Term("gb", "Size (decimal GB)", total / GB, "GB", "bytes / 1e9"),
                    Term("gib", "Size (binary GiB)", total / GiB, "GiB", "bytes / 2^30"),
                ),
            ),
        ),
        headline=(f"A {' × '.join(map(str, dims))} {dtype} tensor: {format_quantity(total, 'bytes')}",),
    )
    return TensorEstimate(report, dims, dtype)


def dtypes() -> Estimate:
    """Floating-point formats: bits, largest value, smallest normal, machine epsilon."""
    sections = []
    for f in FORMATS.values():
        sections.append(
            Section(
                f.name,
                f.name,
                (
                    Term(
                        "bits",
                        "Bits",
                        f.bits,
                        "bits",
                        "1 + e + m",
                        f"1 + {f.exponent_bits} + {f.fraction_bits}",
                        f.source,
                    ),
                    Term("exponent_bits", "Exponent bits", f.exponent_bits, "bits"),
                    Term("fraction_bits", "Fraction bits", f.fraction_bits, "bits"),
                    Term(
                        "max",
                        "Largest finite",
                        f.max,
                        "",
                        "(2 − 2·2^−m)·2^(2^e − 1 − bias)" if f.finite_only else "(2 − 2^−m)·2^(2^e − 2 − bias)",
                    ),
                    Term(
                        "smallest_normal", "Smallest normal", f.smallest_normal, "", "2^(1 − bias)", f"2^{1 - f.bias}"
                    ),
                    Term("eps", "Machine epsilon", f.eps, "", "2^−m", f"2^-{f.fraction_bits}"),
                ),
            )
        )
    report = Result(
        "dtypes",
        "Floating-point formats",
        (),
        tuple(sections),
        ("bias = 2^(e−1) − 1; fp8-e4m3 is the E4M3FN variant (no inf, max 448)",),
        layout="grid",
    )
    return Estimate(report)
