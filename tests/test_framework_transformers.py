"""The transformers framework profile against what Hugging Face transformers 5.24 really keeps for backward.

Each case builds a real transformers model (Llama, Qwen2, Mistral, Mixtral, GPT-2 small; Llama, Qwen2, Mixtral and
GPT-2 also at a released model's width cut to two layers; and small two-layer Gemma 2, Gemma 3, GPT-NeoX, Falcon,
Cohere, Qwen2-MoE, gpt-oss, Phi-3 and StarCoder2) in bf16 on the CPU, runs the forward and the loss the way
``Trainer`` does, and counts the distinct storages autograd keeps, with saved-tensor hooks (``scripts/hf_saved.py``).
lmcalc's figure for the same model, read from the very config the model was built from, must be within 5 % of it:

* without checkpointing: every byte the forward keeps (lmcalc's activations), and each decoder layer's share
  (lmcalc's layer of its kind, dense or MoE; layer 0 also holds the rotary tables, first packed there, which lmcalc
  counts outside the layers; a model with sliding and global layers is one average layer to lmcalc);
* with transformers' gradient checkpointing (non-reentrant): the forward's bytes plus what the checkpoints' closures
  hold (the layers' keyword arguments: rotary cos/sin, position ids, eager attention's mask), which lmcalc's total
  less its rebuilt layer is; the largest of the layers replayed standalone, less what is already alive (its input,
  the shared tables), which lmcalc's rebuilt layer is; and the peak, their sum.

The profile follows each model's own code where the spec says how it is written: the GELU its MLP calls (the spec's
``gelu``: GPT-2's gelu_new op by op, torch's kernel for GPT-NeoX, Falcon and StarCoder2) and where its RMSNorm
multiplies by the weight (``norm_weight_fp32``: in fp32 for Gemma 2/3 and gpt-oss). Where a model keeps what the
spec does not say, the cases are expected to fail (strict), with the measured figures in the reason
(``NOT_MODELLED``).

``use_cache=False`` is passed as under ``Trainer`` with checkpointing (without it GPT-2 keeps concatenated K/V
copies, which the profile lists as not modelled). Dropout is off except in the GPT-2 cases that name it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, replace

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import hf_saved  # noqa: E402  (scripts/, put on sys.path by conftest.py; imports torch and transformers)

from lmcalc.engine.memory.activations import layer_saved_tensors, lowest_layer_unkept  # noqa: E402
from lmcalc.engine.memory.blocks import block_kind  # noqa: E402
from lmcalc.engine.memory.gpu_memory import StageActivations, stage_activations  # noqa: E402
from lmcalc.engine.memory.masks import kinds_differ  # noqa: E402
from lmcalc.engine.memory.outside_layers import model_saved_tensors  # noqa: E402
from lmcalc.engine.memory.sdpa_math import sdpa_math_path  # noqa: E402
from lmcalc.engine.memory.ssm import MixerKind  # noqa: E402
from lmcalc.engine.parallel.layout import Layout  # noqa: E402
from lmcalc.engine.workload import Workload, dropout_mask_bytes  # noqa: E402
from lmcalc.framework_specs import FrameworkProfile
from lmcalc.hf_config import model_from_hf_config  # noqa: E402
from lmcalc.presets import framework_profile, resolve_optimizer, resolve_precision  # noqa: E402
from lmcalc.specs import ModelSpec  # noqa: E402

pytestmark = pytest.mark.torch

TOLERANCE = 0.05  # |predicted / measured − 1|, the target
PRECISION = resolve_precision("bf16-pure").spec  # the models are cast to bf16: weights, activations, no master copy
ATTENTION = {"sdpa": "flash", "eager": "eager"}  # transformers' attn_implementation -> lmcalc's attention kernel

SMALL = ("llama-small", "qwen2-small", "mistral-small", "mixtral-small", "gpt2-small")
# Real widths, two layers. Mixtral keeps 4 of its 8 experts (top-2 still, every width real): 8 would double the
# 3.5 GB of weights to build, and what is kept follows the tokens' top-2 assignments, not the number of experts.
# At real width one point each, SDPA alone (a real-width case takes 5 to 25 s on two CPU cores; the suite stays under
# 15 minutes): the sequence and micro-batch grid and eager attention run on the small models (and on GPT-2 at real
# width with dropout), and Mistral's real width (Llama 3 8B's with a window beyond these sequences) and every real
# model's eager attention are measured by scripts/memory_accuracy.py (docs/memory-accuracy.md).
REAL = ("llama-real", "qwen2-real", "mixtral-real-4e", "gpt2-real")
SMALL_GRID = [(128, 1), (128, 2), (256, 1), (256, 2)]  # (sequence length, micro-batch)
REAL_GRID = [(128, 2)]  # checkpointed too, but Qwen2 (Llama's layer with QKV biases, which a checkpoint does not
# keep): a checkpointed layer keeps its input alone at any width, and Llama and Mixtral measure it at real width
# The other architectures lmcalc reads, h 128 and two layers; each with the attention transformers runs it with
# (hf_saved.Case.attentions: Gemma 2 and gpt-oss eager only, Falcon SDPA only). Their sliding windows (64 tokens)
# are shorter than both sequences.
STEP_MEASURED = ("deepseek-v32-small", "minimax-small", "axk1-small", "flint-small", "laguna-small", "lfm3-small",
                 "beam-small", "modernbert-decoder-small", "mimo-v2-flash-small",
                 "minimax-m3-small", "longcat-flash-small", "axk2-small", "jetmoe-small", "gemma4-small",
                 "gemma4-moe-small", "gemma4-e-small", "gemma3n-small", "recurrent-gemma-small",
                 "rwkv-small")  # fmt: skip
"""The small models of the types read since issue #31 whose step peak tests/test_step_phases.py measures too."""
OTHERS = (
    "gemma2-small",
    "gemma3-small",
    "gpt-neox-small",
    "falcon-small",
    "falcon-7b-small",
    "cohere-small",
    "qwen2-moe-small",
    "gpt-oss-small",
    "phi3-small",
    "starcoder2-small",
    "olmo3-small",
    "exaone4-small",
    "helium-small",
    "stablelm-small",
    "granitemoe-small",
    "ministral3-small",
    "glm-small",
    "cwm-small",
    "arcee-small",
    "nemotron-small",
    "minimax-m2-small",
    "hyperclovax-small",
    "gptj-small",
    "olmo-small",
    "nanochat-small",
    "jais2-small",
    "hunyuan-dense-small",
    "exaone-moe-small",
    "opt-small",
    "biogpt-small",
    "gpt-neo-small",
    "mpt-small",
    "dbrx-small",
    "apertus-small",
    "hunyuan-moe-small",
    "cohere2-moe-small",
    "afmoe-small",
    "lfm2-small",
    "lfm2-moe-small",
    "nemotron-h-small",
    "nemotron-h-latent-small",
    "bitnet-small",
    "openai-gpt-small",
    "ctrl-small",
    "xglm-small",
    "diffllama-small",
    "emu3-small",
    "seed-oss-small",
    "gpt-neox-japanese-small",
    *STEP_MEASURED,
)
OTHERS_GRID = [(128, 1), (256, 2)]
TYPES_GRID = [(256, 2)]  # the types measured since 2026-12-06 (hf_saved.TYPES): one point each, the suite's time


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


def grid(
    names: tuple[str, ...], points: list[tuple[int, int]], gpt2_dropout: float = 0.0, attentions: tuple[str, ...] = ()
) -> list[Case]:
    """Every point, case-major so that each model is built once (the harness keeps the last one built); with
    ``attentions``, those of each model's alone."""
    return [
        Case(name, attention, checkpointing, s, b, gpt2_dropout if name.startswith("gpt2") else None)
        for name in names
        for attention in hf_saved.CASES[name].attentions
        if not attentions or attention in attentions
        for checkpointing in ((False, True) if hf_saved.CASES[name].checkpointable else (False,))
        for s, b in points
    ]


# GPT-2 with its default dropout 0.1: with dropout, transformers' SDPA call runs PyTorch's math path in fp32 on the
# CPU (its fused kernel has no dropout; CUDA's flash kernel has), which the harness's profile counts (cpu_profile)
DROPOUT_CASES = grid(("gpt2-small", "gpt2-real"), [(128, 1), (256, 2)], 0.1)
CASES = (
    grid(SMALL, SMALL_GRID)
    + [c for c in grid(REAL, REAL_GRID, attentions=("sdpa",)) if c.name != "qwen2-real" or not c.checkpointing]
    + DROPOUT_CASES
    + grid(OTHERS, OTHERS_GRID)
    + grid(tuple(hf_saved.TYPES), TYPES_GRID)
)
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


@functools.cache
def cpu_profile() -> FrameworkProfile:
    """The transformers profile as the harness runs it, on the CPU: attention dropout sends SDPA to PyTorch's math
    path, the CPU's flash kernel taking no dropout (``attention.dropout_math``; CUDA's flash kernel takes it, so the
    preset leaves it off). Only the models that drop attention under SDPA see it (GPTBigCode, GPT-2 with dropout)."""
    profile = framework_profile("transformers")
    return profile.model_copy(update={"attention": profile.attention.model_copy(update={"dropout_math": True})})


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
        framework=profile or cpu_profile(),
    )


def predicted(case: Case, profile: FrameworkProfile | None = None) -> StageActivations:
    return stage_activations(workload(case, profile), Layout(), 0)  # the whole model on one CPU


def peak_kept(m: hf_saved.Measurement) -> int:
    """Bytes alive for backward at the peak: what the forward keeps, plus (checkpointed) the closures' keyword
    arguments and one rebuilt layer's new tensors."""
    return m.total_bytes + m.closure_bytes + m.rebuild_new_bytes


def error(predicted_bytes: float, measured_bytes: int) -> float:
    return predicted_bytes / measured_bytes - 1


def with_rules(**rules: dict) -> FrameworkProfile:
    """The harness's transformers profile (``cpu_profile``) with some rules changed:
    ``with_rules(norm={"rmsnorm": "fp32_normalised"})``."""
    profile = cpu_profile()
    return profile.model_copy(update={name: getattr(profile, name).model_copy(update=r) for name, r in rules.items()})


NOT_MODELLED: dict[str, str] = {}
"""Models that keep what their spec does not say (none now). Falcon-7B's one K/V head, which its own SDPA call passes
without enable_gqa, runs PyTorch's math path (engine.memory.sdpa_math, the profile's broadcast_kv_math): within
0.07 % a layer and 0.06 % the whole, was −32.6 % to −55.0 % a layer and −13.2 % to −36.2 % the whole before it was
counted; checkpointed, the forward's part is −1.4 % (the boolean mask the closures hold, always made). Falcon's own
attention in the 40B/180B layout (falcon-small: Q, K and V copied out of the fused output by indexing and K and V
broadcast to all H heads, not views as fused_qkv_view counts them, and its mask always made,
allow_is_causal_skip=False, so SDPA keeps it in every layer) is not modelled (the profile's not_modelled), but at
falcon-small's points its differences cancel within the tolerance: measured a layer −2.7 % to +3.3 % (−2.9 % to
+3.5 % rebuilt), the whole −1.8 % to +1.6 %."""


GAPS_BY_CASE: dict[str, str] = {}
"""Single cases of the models issue #31 added whose layers keep what lmcalc does not model (xfail, strict): none now.
GPT-Neo's one eager mask under checkpointing (its local layers mask their window from a buffer: ``window_buffer``;
the forward's part was +5.16 % at s = 256, b = 2) and its fp32 Q and K (``eager_fp32_scores``; a layer was −3.5 % to
−4.5 %) are counted, within 0.07 %; so is ModernBERT's first layer without an attention norm
(``activations.lowest_layer_unkept``; layer 0 was +5.5 % at s = 128, b = 1), within 0.1 % at s = 128."""


def params(cases: list[Case]) -> list:
    """The cases as pytest params; the models in NOT_MODELLED and the cases in GAPS_BY_CASE expected to fail, by what
    they keep that the profile cannot know."""
    marks: dict[Case, list] = {}
    for c in cases:
        if c.name in NOT_MODELLED:
            marks[c] = [pytest.mark.xfail(strict=True, reason=NOT_MODELLED[c.name])]
        if c.id in GAPS_BY_CASE:
            marks[c] = [pytest.mark.xfail(strict=True, reason=GAPS_BY_CASE[c.id])]
    return [pytest.param(c, id=c.id, marks=marks.get(c, [])) for c in cases]


def layer_kinds(w: Workload, layers: int) -> list[bool]:
    """Whether each of the model's ``layers`` routes to experts."""
    return [w.model.is_moe_layer(i) for i in range(layers)]


def mixer_kind(w: Workload, layer: int) -> MixerKind:
    """A hybrid's layer as lmcalc counts one of its kind (LFM2's convolutions, its attention), or a single block
    (Nemotron-H's attention alone, an FFN alone); any other's: the average layer."""
    if w.model.local_attention_differs:  # a global or a local layer, one that reuses K and V apart (Gemma 4)
        return block_kind(w.model, layer)
    if kinds_differ(w) and not w.model.hybrid and not w.model.single_blocks:  # a global or a local layer
        return "local" if w.model.is_local_layer(layer) else "global"
    if not w.model.hybrid and not w.model.single_blocks:
        return "average"
    return block_kind(w.model, layer)


def within_tolerance(case: Case, profile: FrameworkProfile | None = None, extra: Callable | None = None) -> None:
    """lmcalc's bytes (with ``profile``, else the transformers profile) within TOLERANCE of the measured ones: the
    whole, and every layer (no checkpointing) or the forward's part and the rebuilt layer (checkpointing).
    ``extra(w, moe_layer)``: bytes a layer keeps beyond lmcalc's count, added to it (a gap pinned down)."""
    m = measured(case)
    w = workload(case, profile)
    acts = predicted(case, profile)
    unit = w.model.sublayers  # lmcalc's layers in each of the model code's (LongCat-Flash: 2)
    beyond = [extra(w, moe) if extra else 0.0 for moe in layer_kinds(w, m.layers * unit)]
    total = acts.total + (acts.rebuilt + max(beyond) if case.checkpointing else sum(beyond))
    whole = peak_kept(m)
    report = f"{case.id}: measured {whole:,} B, lmcalc {total:,.0f} B ({error(total, whole):+.2%})"
    if case.checkpointing:
        forward, rebuilt = m.total_bytes + m.closure_bytes, m.rebuild_new_bytes
        kept, layer = acts.total, acts.rebuilt + max(beyond)
        report += (
            f"; forward + closures {forward:,} vs {kept:,.0f} ({error(kept, forward):+.2%})"
            f"; rebuilt layer {rebuilt:,} vs {layer:,.0f} ({error(layer, rebuilt):+.2%})"
        )
        assert abs(error(kept, forward)) < TOLERANCE, report
        assert abs(error(layer, rebuilt)) < TOLERANCE, report
    else:
        # the first layer that attends also holds the rotary tables, first packed there, and the first global one
        # the global layers' own (Gemma 4's): lmcalc counts them outside the layers
        # and Gemma 4's per-layer inputs, whose d_p slices each layer reads, are packed in the first
        outside = model_saved_tensors(w)
        tables = [t for t in outside if t.block == "tables" or t.label.startswith("per-layer inputs")]
        own = sum(t.bytes for t in tables if t.symbol == "s·d_g")
        attending = [i for i in range(m.layers * unit) if w.model.is_attention_layer(i)]
        first = attending[0] // unit if attending else None  # RWKV's layers attend nowhere: no tables
        first_global = next((i // unit for i in attending if not w.model.is_local_layer(i)), None) if own else None
        unkept = sum(t.bytes for t in lowest_layer_unkept(w))  # the lowest layer's own (ModernBERT's missing norm)
        for i in range(m.layers):
            packed = (sum(t.bytes for t in tables) - own if i == first else 0) + (own if i == first_global else 0)
            kept = m.per_layer_bytes[i] - packed + (unkept if i == 0 else 0)
            layer = sum(
                sum(t.bytes for t in layer_saved_tensors(w, w.model.is_moe_layer(j), mixer_kind(w, j))) + beyond[j]
                for j in range(i * unit, (i + 1) * unit)
            )
            report += f"; layer {i} {kept:,} vs {layer:,.0f} ({error(layer, kept):+.2%})"
            assert abs(error(layer, kept)) < TOLERANCE, report
        if case.attention == "sdpa":  # the premise: SDPA ran the fused kernel, or the math path where lmcalc says so
            fused = "ScaledDotProductFlashAttentionForCpuBackward0" in m.attn_nodes
            assert fused != sdpa_math_path(w) and fused != ("SafeSoftmaxBackward0" in m.attn_nodes), m.attn_nodes
    assert abs(error(total, whole)) < TOLERANCE, report


@pytest.mark.parametrize("case", params(CASES))
def test_bytes_kept_for_backward_match_transformers(case: Case):
    within_tolerance(case)


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in GPT2_EAGER if not c.checkpointing])
def test_gpt2_eager_softmax_is_the_models_own(case: Case):
    # GPT-2's eager attention keeps its softmax once, in bf16: the model spec's eager_softmax, which the transformers
    # profile reads (its rule: model). Under Llama's rule, softmax(dtype=float32) kept and its bf16 cast kept by the
    # matmul with V, lmcalc is 4·b·H·s² bytes a layer too high: measured +11 % to +25 % a layer before this was read.
    within_tolerance(case)
    with pytest.raises(AssertionError):
        within_tolerance(case, with_rules(attention={"eager_softmax": "fp32"}))


PARTIAL_ROTARY = [
    c
    for c in CASES
    if c.name in ("glm-small", "stablelm-small", "nemotron-small") and (c.seq_len, c.attention) == (128, "sdpa")
    and c.id != "stablelm-small-sdpa-nockpt-s128-b1"  # 4.2 % short without the copy: within 5 % either way
]  # fmt: skip


DROPOUT_MATH = [c for c in CASES if c.attention == "sdpa" and not c.checkpointing and c.seq_len == 256
                and (c.name == "gpt-bigcode-small" or c.name == "gpt2-small" and c.dropout)]  # fmt: skip


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in DROPOUT_MATH])
def test_cpu_sdpa_with_dropout_runs_the_math_path(case: Case):
    # GPTBigCode (attn_pdrop 0.1 by default; transformers passes enable_gqa for its one K/V head, which the CPU's flash
    # kernel takes) and GPT-2 with dropout: the CPU's flash kernel has no dropout, so SDPA runs PyTorch's math path,
    # which keeps fp32 Q, K, V, the softmax, the dropout's mask and its output. Under the preset's GPU rule (CUDA's
    # flash kernel takes dropout) lmcalc counts the fused kernel: GPTBigCode's layer was −75.9 % and the whole −60.5 %
    within_tolerance(case)
    with pytest.raises(AssertionError):
        within_tolerance(case, framework_profile("transformers"))


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in PARTIAL_ROTARY])
def test_a_partial_rotarys_output_copy_is_counted(case: Case):
    # RoPE on part of each head (GLM, Nemotron 0.5; StableLM 0.25): transformers' apply_rotary_pos_emb concatenates
    # the rotated and passed parts after the heads are transposed, so Q, and the fused kernel's output, are laid out
    # (b, H, s, d), and o_proj reads a copy of the output (the profile's partial_rotary_cat). Without it lmcalc is one
    # s·b·H·d short a layer: 5.1 % to 7.5 % in these cases, once strict xfails (Nemotron's "not yet explained")
    within_tolerance(case)
    with pytest.raises(AssertionError):
        within_tolerance(case, with_rules(attention={"partial_rotary_cat": False}))


@pytest.mark.parametrize(
    "case", [pytest.param(c, id=c.id) for c in CASES if c.name == "gpt-oss-small" and not c.checkpointing]
)
def test_gpt_oss_needs_its_clamped_swiglu(case: Case):
    # gpt-oss's experts keep seven f_e-wide tensors an assignment (gate_up, the clamped gate, σ(α·g), g·σ, up + 1 and
    # the product) where SwiGLU keeps four: counted as SwiGLU, lmcalc misses what transformers keeps (it was −7.0 % to
    # −10.6 % of the whole, −14.5 % to −16.3 % a layer, before ModelSpec.swiglu_limit)
    m = measured(case)
    plain = workload(case)
    plain = replace(plain, model=plain.model.model_copy(update={"swiglu_limit": None}))
    assert error(stage_activations(plain, Layout(), 0).total, peak_kept(m)) < -TOLERANCE


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in LLAMA_REAL])
def test_profile_matters_for_llama_at_real_width(case: Case):
    # The textbook count (the idealised profile: RMSNorm keeping its bf16 input, not transformers' fp32 upcast; no
    # rotary tables; the eager softmax kept once, in bf16) misses what transformers keeps by more than the tolerance.
    m = measured(case)
    idealised = predicted(case, framework_profile("idealised")).total
    assert abs(error(idealised, peak_kept(m))) > TOLERANCE, f"{case.id}: {idealised:,.0f} vs {peak_kept(m):,}"


def comparison_table(names: tuple[str, ...] = OTHERS, point: tuple[int, int] = OTHERS_GRID[-1]) -> list[str]:
    """The cases of ``names`` at one (sequence, micro-batch) point as a Markdown table: measured bytes and lmcalc's
    with the transformers profile, NOT_MODELLED's marked (docs/memory-accuracy.md:
    ``PYTHONPATH=.:scripts python tests/test_framework_transformers.py``)."""
    rows = [
        "| case | attention | checkpointing | measured bytes | lmcalc bytes | error | |",
        "|---|---|---|---|---|---|---|",
    ]
    for case in [c for c in CASES if c.name in names and (c.seq_len, c.micro_batch) == point]:
        whole = peak_kept(measured(case))
        acts = predicted(case)
        lmcalc = acts.total + (acts.rebuilt if case.checkpointing else 0)  # the forward's part and one rebuilt layer
        note = "not modelled" if case.name in NOT_MODELLED else ""
        ckpt = "on" if case.checkpointing else "off"
        rows.append(
            f"| {case.name} | {case.attention} | {ckpt} | {whole:,} | {lmcalc:,.0f} | {error(lmcalc, whole):+.1%} "
            f"| {note} |"
        )
    return rows


if __name__ == "__main__":
    print("\n".join(comparison_table()))
