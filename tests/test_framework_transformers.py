"""The transformers framework profile against what Hugging Face transformers 5.24 really keeps for backward.

Each case builds a real transformers model (Llama, Qwen2, Mistral, Mixtral, GPT-2; small, and at a released model's
width cut to two layers) in bf16 on the CPU, runs the forward and the loss the way ``Trainer`` does, and counts the
distinct storages autograd keeps, with saved-tensor hooks (``scripts/hf_saved.py``). lmcalc's figure for the same
model, read from the very config the model was built from, must be within 5 % of it:

* without checkpointing: every byte the forward keeps (lmcalc's activations), and the last decoder layer's share
  (lmcalc's one layer; layer 0 also holds the rotary tables, which lmcalc counts outside the layers);
* with transformers' gradient checkpointing (non-reentrant): the forward's bytes plus what the checkpoints' closures
  hold (the layers' keyword arguments: rotary cos/sin, position ids, eager attention's mask), which lmcalc's total
  less its rebuilt layer is; the rebuilt layer replayed standalone, less what is already alive (its input, the
  shared tables), which lmcalc's rebuilt layer is; and the peak, their sum.

``use_cache=False`` is passed as under ``Trainer`` with checkpointing (without it GPT-2 keeps concatenated K/V
copies, which the profile lists as not modelled). Dropout is off except in the GPT-2 cases that name it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import hf_saved  # noqa: E402  (scripts/, put on sys.path by conftest.py; imports torch and transformers)

from lmcalc.engine.activations import layer_saved_tensors  # noqa: E402
from lmcalc.engine.gpu_memory import StageActivations, stage_activations  # noqa: E402
from lmcalc.engine.layout import Layout  # noqa: E402
from lmcalc.engine.workload import Workload, dropout_mask_bytes, framework_profile  # noqa: E402
from lmcalc.framework_specs import FrameworkProfile
from lmcalc.hf_config import model_from_hf_config  # noqa: E402
from lmcalc.presets import resolve_optimizer, resolve_precision  # noqa: E402
from lmcalc.specs import ModelSpec  # noqa: E402

TOLERANCE = 0.05  # |predicted / measured − 1|, the target
PRECISION = resolve_precision("bf16-pure").spec  # the models are cast to bf16: weights, activations, no master copy
ATTENTION = {"sdpa": "flash", "eager": "eager"}  # transformers' attn_implementation -> lmcalc's attention kernel

SMALL = ("llama-small", "qwen2-small", "mistral-small", "mixtral-small", "gpt2-small")
# Real widths, two layers. Mixtral keeps 4 of its 8 experts (top-2 still, every width real): 8 would double the
# 3.5 GB of weights to build, and what is kept follows the tokens' top-2 assignments, not the number of experts.
REAL = ("llama-real", "qwen2-real", "mistral-real", "mixtral-real-4e", "gpt2-real")
SMALL_GRID = [(128, 1), (128, 2), (256, 1), (256, 2)]  # (sequence length, micro-batch)
REAL_GRID = [(128, 1), (128, 2)]

GPT2_EAGER_SOFTMAX = (
    "transformers' GPT-2 eager attention keeps its softmax once, in bf16 (b·H·s² elements), where the profile's "
    "rule, read from the Llama family's eager_attention_forward (softmax(dtype=float32), then a bf16 cast), counts "
    "it in fp32 and in bf16: lmcalc is 4·b·H·s² bytes a layer too high, measured +11 % to +25 % on a layer "
    "(+14 % to +29 % on the rebuilt one under checkpointing) and +3 % to +20 % on the whole; the profile lists it as "
    "not modelled, and test_gpt2_eager_matches_with_a_bf16_softmax shows it is the whole gap"
)


@dataclass(frozen=True)
class Case:
    name: str  # a hf_saved case
    attention: str  # "sdpa" or "eager"
    checkpointing: bool
    seq_len: int
    micro_batch: int
    dropout: float | None = None  # GPT-2's resid/embd/attn dropout; None: the case's config has none

    @property
    def id(self) -> str:
        ckpt = "ckpt" if self.checkpointing else "nockpt"
        drop = "" if not self.dropout else f"-dropout{self.dropout:g}"
        return f"{self.name}-{self.attention}-{ckpt}-s{self.seq_len}-b{self.micro_batch}{drop}"


def grid(names: tuple[str, ...], points: list[tuple[int, int]], gpt2_dropout: float = 0.0) -> list[Case]:
    """Every point, case-major so that each model is built once (the harness keeps the last one built)."""
    return [
        Case(name, attention, checkpointing, s, b, gpt2_dropout if name.startswith("gpt2") else None)
        for name in names
        for attention in ("sdpa", "eager")
        for checkpointing in (False, True)
        for s, b in points
    ]


# GPT-2 with its default dropout 0.1, eager attention only: with dropout, transformers' SDPA call falls back on the
# CPU to the math path in fp32 (the fused CPU kernel has no dropout), which no GPU run takes; not compared.
DROPOUT_CASES = [c for c in grid(("gpt2-small", "gpt2-real"), [(128, 1), (256, 2)], 0.1) if c.attention == "eager"]
CASES = grid(SMALL, SMALL_GRID) + grid(REAL, REAL_GRID) + DROPOUT_CASES
GPT2_EAGER = [c for c in CASES if c.name.startswith("gpt2") and c.attention == "eager"]
LLAMA_REAL = [c for c in CASES if c.name == "llama-real"]


@functools.cache
def measured(case: Case) -> hf_saved.Measurement:
    return hf_saved.measure(
        case.name,
        case.attention,
        case.seq_len,
        case.micro_batch,
        case.checkpointing,
        dropout=case.dropout,
        use_cache=False,
    )


@functools.cache
def model_spec(name: str, dropout: float | None) -> ModelSpec:
    """lmcalc's model, read by lmcalc's own config.json reader from the config the harness builds the model from.
    That reader takes GPT-2 as trained with dropout whatever its p; here the config's p decides."""
    harness_case = hf_saved.CASES[name]
    config = harness_case.config(dropout)
    fields = model_from_hf_config(config.to_dict(), name, f"hf_saved.CASES[{name!r}]")
    if harness_case.dropout_knobs:
        fields["dropout"] = any(getattr(config, knob) > 0 for knob in harness_case.dropout_knobs)
    return ModelSpec.model_validate(fields)


def workload(case: Case, profile: FrameworkProfile | None = None) -> Workload:
    return Workload(
        model_spec(case.name, case.dropout),
        PRECISION,
        resolve_optimizer("adamw").spec,
        case.seq_len,
        case.micro_batch,
        ATTENTION[case.attention],
        "full" if case.checkpointing else "none",
        mask_bytes=dropout_mask_bytes("cpu", PRECISION),  # PyTorch's CPU dropout keeps its mask in bf16
        framework=profile or framework_profile("transformers"),
    )


def predicted(case: Case, profile: FrameworkProfile | None = None) -> StageActivations:
    return stage_activations(workload(case, profile), Layout(), 0)  # the whole model on one CPU


def peak_kept(m: hf_saved.Measurement) -> int:
    """Bytes alive for backward at the peak: what the forward keeps, plus (checkpointed) the closures' keyword
    arguments and one rebuilt layer's new tensors."""
    return m.total_bytes + m.closure_bytes + m.rebuild_new_bytes


def error(predicted_bytes: float, measured_bytes: int) -> float:
    return predicted_bytes / measured_bytes - 1


def params(cases: list[Case]) -> list:
    """The cases as pytest params; GPT-2's eager ones are expected to fail, by the bf16 softmax."""
    softmax = pytest.mark.xfail(strict=True, reason=GPT2_EAGER_SOFTMAX)
    return [pytest.param(c, id=c.id, marks=[softmax] if c in GPT2_EAGER else []) for c in cases]


def bf16_eager_softmax() -> FrameworkProfile:
    """The transformers profile with GPT-2's eager softmax: kept once, in the activation dtype."""
    profile = framework_profile("transformers")
    attention = profile.attention.model_copy(update={"eager_softmax": "activation"})
    return profile.model_copy(update={"attention": attention})


def within_tolerance(case: Case, profile: FrameworkProfile | None = None) -> None:
    """lmcalc's bytes (with ``profile``, else the transformers profile) within TOLERANCE of the measured ones: the
    whole, and the last layer (no checkpointing) or the forward's part and the rebuilt layer (checkpointing)."""
    m = measured(case)
    w = workload(case, profile)
    acts = predicted(case, profile)
    whole = peak_kept(m)
    report = f"{case.id}: measured {whole:,} B, lmcalc {acts.total:,.0f} B ({error(acts.total, whole):+.2%})"
    if case.checkpointing:
        forward, rebuilt = m.total_bytes + m.closure_bytes, m.rebuild_new_bytes
        kept = acts.total - acts.rebuilt
        report += (
            f"; forward + closures {forward:,} vs {kept:,.0f} ({error(kept, forward):+.2%})"
            f"; rebuilt layer {rebuilt:,} vs {acts.rebuilt:,.0f} ({error(acts.rebuilt, rebuilt):+.2%})"
        )
        assert abs(error(kept, forward)) < TOLERANCE, report
        assert abs(error(acts.rebuilt, rebuilt)) < TOLERANCE, report
    else:
        last = m.per_layer_bytes[m.layers - 1]
        layer = sum(t.bytes for t in layer_saved_tensors(w, moe_layer=w.model.moe is not None))
        report += f"; last layer {last:,} vs {layer:,.0f} ({error(layer, last):+.2%})"
        if case.attention == "sdpa":  # the premise: transformers' SDPA ran the fused kernel, not the math path
            assert "ScaledDotProductFlashAttentionForCpuBackward0" in m.attn_nodes, m.attn_nodes
        assert abs(error(layer, last)) < TOLERANCE, report
    assert abs(error(acts.total, whole)) < TOLERANCE, report


@pytest.fixture(scope="module", autouse=True)
def free_models():
    """The harness keeps the last model built (up to 3.5 GB at real width): free it for the tests that follow."""
    yield
    hf_saved.release_models()


@pytest.mark.parametrize("case", params(CASES))
def test_bytes_kept_for_backward_match_transformers(case: Case):
    within_tolerance(case)


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in GPT2_EAGER])
def test_gpt2_eager_matches_with_a_bf16_softmax(case: Case):
    # The xfail above, pinned down: with the softmax kept once in bf16, GPT-2 eager (with and without dropout) is
    # within the tolerance, so the softmax is the whole gap.
    within_tolerance(case, bf16_eager_softmax())


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in LLAMA_REAL])
def test_profile_matters_for_llama_at_real_width(case: Case):
    # The textbook count (the idealised profile: RMSNorm keeping its bf16 input, not transformers' fp32 upcast; no
    # rotary tables; the eager softmax kept once, in bf16) misses what transformers keeps by more than the tolerance.
    m = measured(case)
    idealised = predicted(case, framework_profile("idealised")).total
    assert abs(error(idealised, peak_kept(m))) > TOLERANCE, f"{case.id}: {idealised:,.0f} vs {peak_kept(m):,}"
