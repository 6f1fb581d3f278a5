"""lmcalc against PyTorch itself: nn.Module parameters, FlopCounterMode, bytes saved for backward."""

import json
import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from torch.utils import checkpoint  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from lmcalc import measure  # noqa: E402
from lmcalc import validate as val  # noqa: E402
from lmcalc.engine import clear_caches  # noqa: E402
from lmcalc.engine.memory.gpu_memory import gpu_memory  # noqa: E402
from lmcalc.engine.model import flops as fl  # noqa: E402
from lmcalc.engine.model.params import count_params  # noqa: E402
from lmcalc.engine.parallel.layout import Layout  # noqa: E402
from lmcalc.engine.parallel.pipeline import PipelineSplit, stage_layer_counts, stage_layers  # noqa: E402
from lmcalc.engine.parallel.sharding import stage_part  # noqa: E402
from lmcalc.engine.time.steptime import stage_step_flops  # noqa: E402
from lmcalc.engine.workload import Workload  # noqa: E402
from lmcalc.presets import builtin_dir, framework_profile, resolve_model, resolve_optimizer, resolve_precision  # noqa: E402
from lmcalc.specs import ModelSpec  # noqa: E402

pytestmark = pytest.mark.torch

PRESETS = sorted(
    p.stem for p in (builtin_dir() / "models").glob("*.yaml") if not resolve_model(p.stem).spec.counted_only
)
"""The presets lmcalc models whole; a counted-only one is checked against transformers instead. Those the reference
model cannot build (hybrids, DeepSeek-V4, JetMoE) skip the PyTorch comparison and are checked against transformers in
their own tests."""
META_SEQ = 256


def meta_seq(spec) -> int:
    """256 tokens, or the least multiple of 256 whose tokens × k the meta device spreads evenly over the experts
    (DeepSeek-V2: 160 experts, top-6, so multiples of 80: 1,280)."""
    if spec.moe is None:
        return META_SEQ
    unit = spec.moe.num_experts // math.gcd(spec.moe.num_experts, spec.moe.experts_per_token)
    return math.lcm(META_SEQ, unit)


META_LAYERS = 12  # every kind of layer a preset has (dense and MoE, local and global) appears within 12


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_matches_pytorch_params_and_flops(name):
    # Rows 1 and 2 on the meta device, every tensor at its full width: the module's parameter count equals the
    # engine's, and FlopCounterMode's count of one forward + backward equals the engine's full-attention count.
    # Past 12 layers the model is cut to 12 (DeepSeek-V3's 3 dense and 9 MoE layers, Gemma 3's 5:1 and Llama 4's
    # 3:1 local:global, Maverick's alternate MoE): the count is a sum over layers, each kind already in the 12.
    spec = resolve_model(name).spec
    if spec.hybrid:
        pytest.skip("the reference model has no state-space or linear-attention layers: hybrids are checked against "
                    "transformers (tests/test_deltanet.py, tests/test_mamba2.py)")  # fmt: skip
    if spec.compressed_attention or spec.hyper_connections:
        pytest.skip("the reference model has no compressed attention or hyper-connections: DeepSeek-V4 is checked "
                    "against transformers (tests/test_deepseek_v4.py, tests/test_compressed_memory.py)")  # fmt: skip
    if spec.attention_output_gate:
        pytest.skip("the reference model has no gate on the attention output: Trinity's AFMoE is checked against "
                    "transformers (tests/hf_tiny.py's afmoe, tests/test_framework_transformers.py)")  # fmt: skip
    if spec.moe and spec.moe.attention_experts:
        pytest.skip("the reference model has no mixture of attention heads: JetMoE is checked against transformers "
                    "(tests/test_validate_hf.py runs its tiny model)")  # fmt: skip
    if spec.num_layers > META_LAYERS:  # MiMo-V2-Flash's global layers by index: those among the 12 (0, 5 and 11)
        ids = [i for i in spec.global_layer_ids if i < META_LAYERS]
        spec = spec.model_copy(update={"num_layers": META_LAYERS, "global_layer_ids": ids})
    seq = meta_seq(spec)
    model = measure.build(spec, "flash", seq, "meta")
    assert measure.parameter_count(model) == count_params(spec).total
    engine = fl.step_flops(spec, seq, convention="full").model * seq  # a sparse-attention indexer runs forward only
    assert measure.training_step_flops(model, seq, 1) == pytest.approx(engine, rel=1e-3)


BASE = dict(vocab_size=256, hidden_size=64, num_layers=2, num_heads=4, ffn_size=160, max_seq_len=256)
GPT_BLOCK = dict(ffn_kind="gelu_mlp", norm_kind="layernorm", attention_bias="all", mlp_bias=True)
"""The GPT family's block: a two-matrix MLP, LayerNorms with biases, biases everywhere."""
LLAMA_BLOCK = dict(num_kv_heads=2, ffn_kind="swiglu", norm_kind="rmsnorm", position_embedding="rope")
"""Llama's block: grouped-query attention, a SwiGLU MLP, RMSNorms, RoPE, no biases."""
ARCHITECTURES = {
    "gpt2-like (learned positions, biases, a head bias, dropout, tied)": GPT_BLOCK
    | dict(position_embedding="learned", tied_embeddings=True, dropout=True, head_bias=True),
    "opt-like (ReLU MLP, positions offset by two, biases, dropout on the residual alone)": GPT_BLOCK
    | dict(
        activation="relu",
        position_embedding="learned",
        position_offset=2,
        tied_embeddings=True,
        dropout=True,
        dropout_at=("residual",),
    ),
    "gpt1-like (a norm after each residual add, none before the head)": GPT_BLOCK
    | dict(position_embedding="learned", tied_embeddings=True, post_norm=True),
    "ctrl-like (sinusoidal positions, a ReLU MLP, a head bias)": GPT_BLOCK
    | dict(activation="relu", position_embedding="sinusoidal", tied_embeddings=True, head_bias=True),
    "neox-japanese-like (a bias on the last layer's attention output alone)": GPT_BLOCK
    | dict(
        attention_bias="none", mlp_bias=False, position_embedding="rope", last_layer_out_bias=True, tied_embeddings=True
    ),
    "nemotron-like (squared ReLU)": GPT_BLOCK
    | dict(activation="relu2", position_embedding="rope", tied_embeddings=False),
    "gemma2-like (soft-capped scores and logits)": dict(
        num_kv_heads=2,
        ffn_kind="geglu",
        activation="gelu_pytorch_tanh",
        norm_kind="rmsnorm",
        position_embedding="rope",
        tied_embeddings=True,
        attention_softcap=50.0,
        final_softcap=30.0,
    ),
    "llama-like (GQA, SwiGLU, RMSNorm)": LLAMA_BLOCK | dict(tied_embeddings=False),
    "bitnet-like (sub-norms before o and down, a squared-ReLU gate)": LLAMA_BLOCK
    | dict(activation="relu2", sub_norms=True, tied_embeddings=True),
    "diffllama-like (differential attention, GQA)": LLAMA_BLOCK
    | dict(differential_attention=True, tied_embeddings=False),
    "xglm-like (sinusoidal positions, the masked scores clamped)": GPT_BLOCK
    | dict(position_embedding="sinusoidal", tied_embeddings=True, eager_score_clamp=True),
    "olmo2-like (QK-norm)": dict(
        ffn_kind="swiglu", norm_kind="rmsnorm", position_embedding="rope", qk_norm="full", tied_embeddings=False
    ),
    "olmo-like (weightless LayerNorms, q, k and v clamped)": dict(
        ffn_kind="swiglu",
        norm_kind="layernorm",
        norm_weight=False,
        qkv_clip=8.0,
        position_embedding="rope",
        tied_embeddings=False,
    ),
    "nanochat-like (weightless RMSNorms, the embedding's and QK too, squared ReLU)": GPT_BLOCK
    | dict(
        norm_kind="rmsnorm",
        norm_weight=False,
        attention_bias="none",
        mlp_bias=False,
        activation="relu2",
        qk_norm="per_head",
        embedding_norm=True,
        position_embedding="rope",
        final_softcap=15.0,
        tied_embeddings=False,
    ),
    "mixtral-like (MoE)": LLAMA_BLOCK
    | dict(tied_embeddings=False, moe=dict(num_experts=4, experts_per_token=2, expert_ffn_size=96)),
    "deepseek-like (MLA, shared expert, dense first layer)": dict(
        ffn_kind="swiglu",
        norm_kind="rmsnorm",
        position_embedding="rope",
        tied_embeddings=False,
        head_dim=16,
        mla=dict(q_lora_rank=32, kv_lora_rank=24, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16),
        moe=dict(
            num_experts=4, experts_per_token=2, shared_experts=1, expert_ffn_size=48, dense_layers=1, router_bias=True
        ),
    ),
}


@pytest.mark.parametrize("tied", [True, False])
def test_a_head_bias_is_one_tensor_of_the_vocabulary_tied_or_not(tied):
    # GPT-J's, CodeGen's and Phi-2's output head has a bias (nn.Linear(h, V)), which stays when the weight is tied
    plain = ModelSpec(
        name="arch", **{**BASE, **ARCHITECTURES["gpt2-like (learned positions, biases, a head bias, dropout, tied)"]}
    )
    plain = plain.model_copy(update={"tied_embeddings": tied, "head_bias": False})
    biased = plain.model_copy(update={"head_bias": True})
    model = measure.build(biased, "flash", 64, "meta")
    assert (
        measure.parameter_count(model) == count_params(biased).total == count_params(plain).total + BASE["vocab_size"]
    )


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
@pytest.mark.parametrize("attention", ["eager", "flash"])
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
@pytest.mark.parametrize("seq,batch", [(64, 1), (64, 2), (128, 1), (128, 2)])
def test_activation_formula_matches_saved_tensors(arch, attention, recompute, seq, batch):
    # Row 3: at two sequence lengths and two micro-batch sizes, so a formula fitted to one point fails.
    spec = ModelSpec(name="arch", **{**BASE, **ARCHITECTURES[arch]})
    if val.cpu_fallback_reason(spec, attention):
        pytest.skip(val.cpu_fallback_reason(spec, attention))
    model = measure.build(spec, attention, seq, "cpu")
    torch.manual_seed(0)
    tokens = torch.randint(0, spec.vocab_size, (batch, seq))
    measured = measure.peak_saved_bytes(model, tokens, recompute)
    fp32, adamw = resolve_precision("fp32").spec, resolve_optimizer("adamw").spec  # fp32: 4-byte activations
    w = Workload(spec, fp32, adamw, seq, batch, attention, recompute, mask_bytes=4, framework=framework_profile())
    engine = gpu_memory(w, Layout(), 0).held.with_rebuilt  # the whole model on one device
    assert engine == pytest.approx(measured, rel=val.ACTIVATION_TOLERANCE)


def test_flash_saves_no_quadratic_scores():
    # The fused kernel keeps O(s) per head; doubling s doubles the saved bytes of a layer (no s² term).
    spec = ModelSpec(name="arch", **{**BASE, **ARCHITECTURES["llama-like (GQA, SwiGLU, RMSNorm)"]})
    model = measure.build(spec, "flash", 256, "cpu")
    short = measure.saved_for_backward(model, torch.zeros(1, 64, dtype=torch.long), layer=0).bytes
    long = measure.saved_for_backward(model, torch.zeros(1, 128, dtype=torch.long), layer=0).bytes
    assert long == 2 * short


@pytest.mark.filterwarnings("ignore:.*attention:UserWarning")
def test_the_fused_kernels_pinned_on_cuda_refuse_rather_than_fall_back_to_math():
    # reference_model pins these on CUDA; the same pin on the CPU's kernels shows its effect: a case the
    # fused kernel takes runs, one it does not (unequal Q/K and V head sizes) raises instead of running math
    from torch.nn.attention import sdpa_kernel

    from lmcalc.reference_model import FUSED_CUDA_KERNELS

    q = k = torch.randn(1, 4, 16, 8)
    with sdpa_kernel(FUSED_CUDA_KERNELS):
        torch.nn.functional.scaled_dot_product_attention(q, k, torch.randn(1, 4, 16, 8), is_causal=True)
        with pytest.raises(RuntimeError):
            torch.nn.functional.scaled_dot_product_attention(q, k, torch.randn(1, 4, 16, 4), is_causal=True)
    torch.nn.functional.scaled_dot_product_attention(q, k, torch.randn(1, 4, 16, 4), is_causal=True)  # math, unpinned


def test_no_fused_kernel_is_a_clear_error(monkeypatch):
    # what PyTorch raises when the pinned kernels all refuse a case becomes one line that says what to do
    from lmcalc import reference_model
    from lmcalc.errors import LmcalcError

    def refuse(*args, **kwargs):
        raise RuntimeError("No available kernel. Aborting execution.")

    monkeypatch.setattr(reference_model.F, "scaled_dot_product_attention", refuse)
    spec = ModelSpec(name="arch", **{**BASE, **ARCHITECTURES["llama-like (GQA, SwiGLU, RMSNorm)"]})
    model = measure.build(spec, "flash", 16, "cpu")
    with pytest.raises(LmcalcError, match="no fused attention kernel .* takes float32, head size .* grouped-query"):
        model(torch.zeros(1, 16, dtype=torch.long))


def test_validate_passes_and_reports_every_row(capsys):
    from lmcalc.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["validate", "--model", "llama-3.2-1b", "--seq", "256", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert exit_info.value.code == 0
    rows = data["results"]
    assert rows["params"]["error"]["pass"] and rows["flops"]["error"]["pass"]
    assert all(
        rows[f"activations_{a}_{r}"]["error"]["pass"] for a in ("eager", "flash") for r in ("none", "selective", "full")
    )
    if not torch.cuda.is_available():
        assert "pass" not in rows["peak_memory"]["error"]
        assert any("CUDA is not available" in note for note in data["notes"])


def test_perturbed_flops_make_the_check_fail(monkeypatch):
    # Drop the attention term from the engine: the FlopCounterMode row must catch it.
    original = fl.forward_flops_per_token

    def without_attention(spec, seq_len, convention="causal", part=None):
        f = original(spec, seq_len, convention, part)
        return fl.ForwardFlops(f.projections, f.mlp, 0.0, 0.0, f.logits)

    monkeypatch.setattr(fl, "forward_flops_per_token", without_attention)
    result = val.validate_result(resolve_model("gpt2-124m").spec, 256, 1, ("none",))
    assert result.term("flops.error").ok is False
    assert not val.passed(result)


def test_perturbed_activations_make_the_check_fail(monkeypatch):
    # Forget the softmax output (eager attention's s² term): the saved-tensor row must catch it.
    from lmcalc.engine.memory import activations

    original = activations.layer_saved_tensors

    def without_softmax(*args, **kwargs):
        return tuple(t for t in original(*args, **kwargs) if t.label != "softmax output")

    monkeypatch.setattr(activations, "layer_saved_tensors", without_softmax)
    clear_caches()  # the engine memoises activation bytes, and validate's own test above ran this very workload
    try:
        result = val.validate_result(resolve_model("llama-3.2-1b").spec, 256, 1, ("none",))
    finally:
        clear_caches()  # and the tests that follow must not see the perturbed figures
    assert result.term("activations_eager_none.error").ok is False
    assert result.term("activations_flash_none.error").ok is True


def test_validation_doc_covers_every_preset():
    # docs/validation.md's table is generated by scripts/validation_table.py: a new preset needs a rerun.
    table = (Path(__file__).resolve().parent.parent / "docs" / "validation.md").read_text().split("| model |")[1]
    missing = [name for name in PRESETS if f"| {name} |" not in table]
    assert not missing, f"rerun python scripts/validation_table.py (missing: {missing})"
    assert "FAIL" not in table


def _stage_flops_by_pytorch(
    model: torch.nn.Module, counts: list[int], stage: int, s: int, checkpointed: bool = False
) -> tuple[int, int]:
    """FlopCounterMode's counts of one pipeline stage's forward and backward passes: its blocks, and on the last
    stage the final norm and the output head, run on a hidden state of the stage's input shape (meta device),
    then the backward from its output to its weights and to its input (which the stage before needs).
    ``checkpointed``: every block is wrapped in ``torch.utils.checkpoint`` and rerun whole in the backward (early
    stop off, which would skip the ops after the last saved tensor), as full recomputation does."""
    first = sum(counts[:stage])
    x = torch.zeros(1, s, model.spec.hidden_size, device="meta", requires_grad=True)
    cos, sin = model.cos[:s], model.sin[:s]
    with FlopCounterMode(display=False) as forward, checkpoint.set_checkpoint_early_stop(False):
        y = x
        for block in model.layers[first : first + counts[stage]]:
            if checkpointed:
                y = checkpoint.checkpoint(block, y, cos, sin, model.causal_bias, use_reentrant=False)
            else:
                y = block(y, cos, sin, model.causal_bias)
        if stage == len(counts) - 1:
            head = model.lm_head.weight if hasattr(model, "lm_head") else model.embed.weight
            y = torch.nn.functional.linear(model.final_norm(y), head)
    with FlopCounterMode(display=False) as backward:
        y.backward(torch.ones_like(y))
    return forward.get_total_flops(), backward.get_total_flops()


@pytest.mark.parametrize(
    ("name", "pp", "first", "last"),
    [("llama-3.1-8b", 4, None, 7), ("mixtral-8x7b", 4, 6, None), ("gpt2", 3, None, None)],
)
def test_each_pipeline_stages_flops_match_pytorch(name, pp, first, last):
    # The step time paces the pipeline by its slowest stage (docs/formulas.md §8.10); each stage's FLOPs, forward
    # and backward, must be what PyTorch counts for exactly the blocks (and head) that stage runs, uneven splits
    # included.
    spec, s = resolve_model(name).spec, 64  # 64 tokens × top-2 spread evenly over Mixtral's 8 experts on meta
    layout = Layout(pp=pp, split=PipelineSplit(first_stage_layers=first, last_stage_layers=last))
    model = measure.build(spec, "flash", s)
    counts = stage_layer_counts(spec, layout)
    precision, adamw = resolve_precision("bf16-mixed").spec, resolve_optimizer("adamw").spec
    plain, full = (
        Workload(spec, precision, adamw, s, recompute=r, framework=framework_profile()) for r in ("none", "full")
    )
    for stage in range(pp):
        built = stage_layers(spec, layout, stage)
        part = stage_part(spec, built)  # the stage's layers and, last, the logits
        engine = fl.forward_flops_per_token(spec, s, "full", part).total * s
        forward, backward = _stage_flops_by_pytorch(model, counts, stage, s)
        assert forward == pytest.approx(engine, rel=1e-9)
        # stage_step_flops, what the step time times each stage with: the forward, forward + backward, and
        # with full recomputation what the GPUs execute, each block's forward twice (the head's once)
        step = stage_step_flops(plain, built)
        assert step.forward.total * s == pytest.approx(forward, rel=1e-9)
        assert step.model * s == pytest.approx(forward + backward, rel=1e-9)
        assert step.hardware == step.model  # nothing recomputed
        redone = stage_step_flops(full, built)
        assert redone.model == step.model
        rerun = sum(_stage_flops_by_pytorch(model, counts, stage, s, checkpointed=True))
        assert redone.hardware * s == pytest.approx(rerun, rel=1e-9)


@pytest.mark.parametrize(
    ("update", "said"),
    [
        ({"attention_output_gate": True}, "gates its attention's output"),
        ({"gated_norm_rank": 16}, "gates its norms"),
    ],
)
def test_what_the_reference_model_does_not_build_is_refused(update, said):
    # validate builds lmcalc's own PyTorch model: a spec with a part it lacks is sent to transformers in one line
    from lmcalc.validate import reference_lacks

    spec = resolve_model("llama-3.2-1b").spec
    assert reference_lacks(spec) == ""
    assert reference_lacks(spec.model_copy(update=update)) == said
