"""The kernel inventory (engine.time.kernels) and the rooflines that time it (engine.time.rates), against PyTorch itself
and against hand derivations written out here."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace

import pytest

from lmcalc.engine.model.flops import forward_flops_per_token
from lmcalc.engine.parallel.layout import Grid, Layout
from lmcalc.engine.parallel.pipeline import StageLayers, stage_layers
from lmcalc.engine.time import rates
from lmcalc.engine.time.kernels import FLASH_BACKWARD_TO_FORWARD, Gemm, StageWork, stage_work
from lmcalc.engine.time.microbatch import kernel_times
from lmcalc.engine.workload import Workload
from lmcalc.errors import LmcalcError
from lmcalc.presets import framework_profile, resolve_hardware, resolve_model, resolve_optimizer, resolve_precision
from lmcalc.specs import ModelSpec

PRECISION = resolve_precision("bf16-mixed").spec
ADAMW = resolve_optimizer("adamw").spec
H100 = resolve_hardware("h100-sxm").spec


def llama(kv: int = 2, layers: int = 2) -> ModelSpec:
    return ModelSpec(
        name="tiny-llama",
        vocab_size=96,
        hidden_size=64,
        num_layers=layers,
        num_heads=8,
        num_kv_heads=kv,
        ffn_size=176,
        ffn_kind="swiglu",
        norm_kind="rmsnorm",
        tied_embeddings=False,
        position_embedding="rope",
        max_seq_len=32,
    )


def gpt(layers: int = 2) -> ModelSpec:
    return ModelSpec(
        name="tiny-gpt",
        vocab_size=80,
        hidden_size=48,
        num_layers=layers,
        num_heads=4,
        ffn_size=192,
        ffn_kind="gelu_mlp",
        norm_kind="layernorm",
        attention_bias="all",
        mlp_bias=True,
        tied_embeddings=True,
        position_embedding="learned",
        max_seq_len=32,
    )


def whole(model: ModelSpec, seq: int, batch: int, attention: str = "flash", tp: int = 1, framework: str = "megatron"):
    w = Workload(model, PRECISION, ADAMW, seq, batch, attention=attention, framework=framework_profile(framework))
    return w, stage_work(w, Grid(tp, 1, 1, tp > 1), stage_layers(model, Layout(), 0))


def _recorded_matmuls(model: ModelSpec, seq: int, batch: int) -> tuple[Counter, Counter]:
    """(m, n, k) of every 2-D matmul PyTorch runs in a forward pass, and in the backward pass, of the reference
    model built on the meta device."""
    torch = pytest.importorskip("torch")
    from torch.utils._python_dispatch import TorchDispatchMode

    from lmcalc.reference_model import ReferenceModel, loss

    class Record(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.shapes: Counter = Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            name = func.overloadpacket.__name__
            if name in ("mm", "addmm"):
                a, b = (args[1], args[2]) if name == "addmm" else (args[0], args[1])
                self.shapes[(a.shape[0], b.shape[1], a.shape[1])] += 1
            return func(*args, **kwargs)

    reference = ReferenceModel(model, attention="flash", max_seq=seq, device="meta")
    tokens = torch.zeros(batch, seq, dtype=torch.long, device="meta")
    with Record() as forward:
        value = loss(reference, tokens)
    with Record() as backward:
        value.backward()
    return forward.shapes, backward.shapes


@pytest.mark.torch
@pytest.mark.parametrize("model", [llama(kv=2), gpt()], ids=["llama-gqa", "gpt-gelu"])
def test_gemm_shapes_are_the_matmuls_pytorch_runs(model):
    """Every GEMM of the inventory, forward (m, n, k), input gradient (m, k, n) and weight gradient (n, k, m), is a
    matmul the reference model really runs on the meta device, as many times."""
    seq, batch = 16, 3
    forward, backward = _recorded_matmuls(model, seq, batch)
    _, work = whole(model, seq, batch)
    ours_forward: Counter = Counter()
    ours_backward: Counter = Counter()
    for g in work.gemms + work.head:
        ours_forward[(int(g.m), int(g.n), int(g.k))] += int(g.count)
        ours_backward[(int(g.m), int(g.k), int(g.n))] += int(g.count)
        ours_backward[(int(g.n), int(g.k), int(g.m))] += int(g.count)
    assert ours_forward == forward
    assert ours_backward == backward


def test_tp_divides_column_and_row_parallel_gemms():
    """TP 4 on 8 query heads and 2 KV heads: Q, K, V, gate and up keep 1/4 of their outputs, O and down 1/4 of
    their inputs. With fewer KV heads than GPUs, Megatron-Core still splits the fused Q/K/V weight by TP (each GPU
    computes half a KV head's rows) and gathers whole heads afterwards (core_v0.16.1 attention.py)."""
    model = llama(kv=2)
    _, work = whole(model, 16, 1, tp=4)
    by_name = {g.name.rsplit(".", 2)[-2]: g for g in work.gemms}
    h, d, f = 64, 8, 176
    assert (by_name["q"].n, by_name["q"].k) == (8 * d / 4, h)
    assert (by_name["k"].n, by_name["v"].n) == (2 * d / 4, 2 * d / 4)
    assert (by_name["o"].n, by_name["o"].k) == (h, 8 * d / 4)
    assert (by_name["gate"].n, by_name["up"].n, by_name["down"].k) == (f / 4, f / 4, f / 4)
    assert work.head[0].n == 96 / 4


def test_fused_attention_flops_are_causal_and_backward_two_and_a_half_times():
    """4·T·(s+1)/2·H·d forward per layer (scores and values over the causal half), 2.5× that backward."""
    model = llama(kv=2, layers=3)
    s, b = 16, 2
    _, work = whole(model, s, b)
    forward = 4 * (b * s) * (s + 1) / 2 * 8 * 8 * 3
    assert work.attention_forward == pytest.approx(forward)
    assert work.attention_backward == pytest.approx(FLASH_BACKWARD_TO_FORWARD * forward)


def test_eager_attention_is_batched_gemms_and_softmax_traffic():
    """Eager attention: a (s × d)·(d × s) and an (s × s)·(s × d) product per head and sequence, no fused kernel."""
    model = gpt(layers=2)
    s, b = 16, 3
    _, work = whole(model, s, b, attention="eager")
    scores, values = work.batched
    assert (scores.m, scores.n, scores.k, scores.count) == (s, s, 12, b * 4 * 2)
    assert (values.m, values.n, values.k, values.count) == (s, 12, s, b * 4 * 2)
    assert work.attention_forward == 0


def test_memory_bytes_of_a_fused_gelu_gpt_by_hand():
    """Megatron-LM's kernels on a GELU GPT (fused LayerNorm, fused bias-GELU, no dropout, learned positions, tied
    head, fp32 loss), e = 2 bytes, T tokens: per layer two norms (read and write h: 2e), two residual adds (read
    two, write one: 3e), the GELU over f (2e); the head's final norm (2e·h), the loss over V logits (read them,
    then three passes in fp32: e + 3·4), the embedding lookup (2e·h), and each copy of Q, K or V beyond the first
    that the profile says the framework makes (read and written: 2e per element). Forward only."""
    model = gpt(layers=2)
    s, b, e = 16, 3, 2
    T, h, f, V, L = s * b, 48, 192, 80, 2
    w, work = whole(model, s, b)
    rule = w.framework.attention
    copies = (rule.q_copies - 1) + (rule.k_copies - 1) + (rule.v_copies - 1)  # multi-head: Q, K and V are h wide
    per_layer = 2 * 2 * e * h + 2 * 3 * e * h + 2 * e * f + 2 * e * h * copies
    expected = T * (L * per_layer + 2 * e * h + (e + 3 * 4) * V + 2 * e * h)
    assert work.memory_forward == pytest.approx(expected)


def test_unfused_norms_and_gated_mlp_move_more_bytes():
    """The transformers profile's unfused RMSNorm and SwiGLU and rotary tables move more bytes than Megatron's
    fused kernels on the same model, and launch more kernels."""
    model = llama()
    _, fused = whole(model, 16, 2, framework="megatron")
    _, unfused = whole(model, 16, 2, framework="transformers")
    assert unfused.memory_forward > fused.memory_forward
    assert unfused.memory_kernels > fused.memory_kernels


def test_a_norm_kept_in_fp32_is_timed_as_unfused_kernels():
    """Under the transformers profile a bias-free LayerNorm (Cohere's, written in PyTorch: upcast, mean, variance,
    normalise, weight, cast) keeps fp32 centred values (activations.norm_keeps) and runs as element-wise kernels
    one after another; torch.nn.LayerNorm is one fused kernel. Per norm: 6 + 10 kernels forward and backward
    against 2, on each of the L layers' two norms."""
    fused_model = gpt(layers=2)
    centred = fused_model.model_copy(update={"norm_kind": "layernorm_nobias", "norm_weight_fp32": True})
    _, fused = whole(fused_model, 16, 2, framework="transformers")
    _, unfused = whole(centred, 16, 2, framework="transformers")
    assert unfused.memory_kernels - fused.memory_kernels == 2 * 2 * (16 - 2)
    assert unfused.memory_forward > fused.memory_forward


def test_wave_quantisation_by_hand():
    """H100 (132 SMs), 128 × 128 tiles: a 4096 × 4096 output is 1,024 tiles, 8 waves of 132 slots: 1024/1056.
    With fewer tiles than SMs split-K fills the GPU."""
    assert H100.compute_units == 132
    assert rates.wave_efficiency(H100, 4096, 4096) == pytest.approx(1024 / 1056)
    assert rates.wave_efficiency(H100, 128, 128 * 100) == 1.0


def test_a_skinny_gemm_is_memory_bound():
    """One token through a 8192 × 8192 weight: 134 MB of bf16 weight read at η·3.35 TB/s, far longer than its
    134 MFLOP at the matmul rate."""
    cal = rates.CALIBRATION
    rate = rates.matmul_rate(H100, "bf16").flops_per_s
    t = rates.gemm_seconds(H100, rate, (1, 8192, 8192), 2)
    moved = 2 * (8192 + 8192 * 8192 + 8192)
    assert t == pytest.approx(moved / (3.35e12 * cal.hbm_efficiency) + cal.kernel_overhead_s)


def test_an_fp8_gemm_reads_one_byte_operands_and_writes_bf16():
    """The same skinny GEMM in fp8 through ``kernel_times``, the path every step takes: one-byte operands (its weight,
    67 MB) and a bf16 output (Transformer Engine's fp8 GEMMs write the activation dtype), a frozen weight so that the
    backward is the input gradient's GEMM alone, the transpose, read and written the same way."""
    cal = rates.CALIBRATION
    gemm = Gemm("w", 1, 8192, 8192, 1.0, weight_grad=0.0)
    work = StageWork((gemm,), (), (), 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1)
    times = kernel_times(work, H100, "fp8", "flash3", 2, cal)
    moved = 1 * (8192 + 8192 * 8192) + 2 * 8192  # x and W in fp8, y in bf16
    one = moved / (3.35e12 * cal.hbm_efficiency) + cal.kernel_overhead_s
    assert times.gemm_forward == pytest.approx(one)
    assert times.gemm_input_grad == pytest.approx(one)  # dy (1 x 8192) by W^T (8192 x 8192), dx in bf16
    assert times.gemm_weight_grad == 0.0


def test_deepseek_v4s_indexers_and_mhc_projections_are_timed():
    """DeepSeek-V4 Flash, one sequence of 4,096: the 21 CSA layers' indexers score H_I·d_I = 64·128 a key over the
    entries gone by, Σ⌊j/4⌋ / s = (4·1024·1023/2 + 1024·4) / 4096 = 512.5 − 0.75 a query; each layer's two mHC
    projections (n·h → (2+n)·n, 16,384 → 24) train as any weight. Under transformers the indexers run forward only
    (no loss trains them); under Megatron-Core's fused kernels they train on their KL loss over detached inputs
    (csa.py at cae55c1f09): their projections' weight gradients and no input gradients, and the scores' gradients over
    the top 512 entries a query keeps, Σ min(⌊j/4⌋, 512) / s: ⌊j/4⌋ = q four times for q = 1..511 (j < 2,048), then
    512 for j = 2,048..4,096, (4·511·512/2 + 512·2,049) / 4,096 = 383.875 a query; a GEMM for its queries' gradient
    and one for its keys'."""
    spec = resolve_model("deepseek-v4-flash").spec
    for profile, trained in (("transformers", 0.0), ("megatron", 1.0)):
        w = Workload(spec, resolve_precision("bf16-mixed").spec, ADAMW, 4096, 1, framework=framework_profile(profile))
        gemms = {g.name: g for g in stage_work(w, Grid(ep=64), StageLayers(0, 43, True, True)).gemms}
        scores = gemms["indexer.scores"]
        assert (scores.m, scores.n, scores.k, scores.count) == (4096, 511.75, 64 * 128, 21)
        assert scores.input_grad == scores.weight_grad == gemms["indexer.q_b.weight"].input_grad == 0
        assert gemms["indexer.q_b.weight"].weight_grad == trained
        if trained:
            kept = (4 * 511 * 512 // 2 + 512 * 2049) / 4096
            assert kept == 383.875
            grad = gemms["indexer.scores_grad"]
            assert (grad.m, grad.n, grad.k, grad.count, grad.passes) == (4096, kept, 64 * 128, 21, 2.0)
        else:
            assert "indexer.scores_grad" not in gemms
        mhc = gemms["attn_hc.fn"]
        assert (mhc.n, mhc.k, mhc.count, mhc.weight_grad) == (24, 16384, 43, 1.0)


def test_a_large_gemm_runs_at_the_sustained_matmul_rate():
    """8192³ on H100: compute-bound at φ · 794.5 TFLOP/s (stas00's MAMF best shape) and full waves."""
    cal = rates.CALIBRATION
    rate = rates.matmul_rate(H100, "bf16")
    assert rate.measured and rate.flops_per_s == pytest.approx(794.5e12)
    t = rates.gemm_seconds(H100, rate.flops_per_s, (8192, 8192, 8192), 2)
    w = rates.wave_efficiency(H100, 8192, 8192)
    assert t == pytest.approx(2 * 8192**3 / (cal.gemm_fraction_for(H100) * 794.5e12 * w) + cal.kernel_overhead_s)


def test_an_unmeasured_chip_states_its_assumed_matmul_rate():
    h800 = resolve_hardware("h800").spec
    assert "bf16" not in h800.matmul_tflops
    rate = rates.matmul_rate(h800, "bf16")
    assert not rate.measured and "assumed" in rate.source
    assert rate.flops_per_s == pytest.approx(rates.UNMEASURED_MATMUL_FRACTION * h800.peak_flops("bf16"))


def test_a_dtype_the_chip_lacks_is_refused():
    with pytest.raises(LmcalcError, match="no fp8 peak"):
        rates.matmul_rate(resolve_hardware("a100-80gb").spec, "fp8")


def test_attention_rates_are_the_papers_fractions():
    """FlashAttention-3 on H100 at 0.63/0.50 of the dense peak (Shah et al. 2024); FlashAttention-2 on A100 at
    0.60/0.50 (Dao 2023); FlashAttention-3 on an A100 falls back to FlashAttention-2's figures; all scaled by the
    fitted attention_fraction (the kernels alone run faster than inside a training step)."""
    scale = rates.CALIBRATION.attention_fraction
    matmul = rates.matmul_rate(H100, "bf16")
    fa3 = rates.attention_rate(H100, "flash3", "bf16", matmul)
    assert (fa3.forward, fa3.backward) == pytest.approx((0.63 * 989.5e12 * scale, 0.50 * 989.5e12 * scale))
    a100 = resolve_hardware("a100-80gb").spec
    fa2 = rates.attention_rate(a100, "flash3", "bf16", rates.matmul_rate(a100, "bf16"))
    assert (fa2.forward, fa2.backward) == pytest.approx((0.60 * 312e12 * scale, 0.50 * 312e12 * scale))


def test_full_recomputation_reruns_the_layers_forward_not_the_head():
    model = llama(layers=2)
    w, plain = whole(model, 16, 2)
    again = stage_work(replace(w, recompute="full"), Grid(), stage_layers(model, Layout(), 0))
    layers = sum(g.flops for g in plain.gemms)
    assert again.gemm_flops - plain.gemm_flops == pytest.approx(layers)
    assert again.attention_recomputed == plain.attention_forward
    assert math.isclose(again.memory_backward - plain.memory_backward, plain.memory_forward)


@pytest.mark.parametrize(
    "name", ["deepseek-v2-lite", "mixtral-8x7b", "qwen3-next-80b-a3b", "lfm2-1.2b", "nemotron-nano-9b-v2"]
)
def test_the_gemms_are_the_models_matmuls(name: str):
    """One stage's GEMMs, forward, do the model's matmul FLOPs (engine.model.flops, which FlopCounterMode checks):
    DeepSeek-V2-Lite's two shared experts a layer both (one was timed before), a hybrid's mixers at their share of the
    layers, Nemotron-H's single blocks each alone."""
    model = resolve_model(name).spec
    _, work = whole(model, 512, 1)
    flops = forward_flops_per_token(model, 512)
    assert sum(g.flops for g in work.gemms + work.head) == pytest.approx(
        512 * (flops.projections + flops.mlp + flops.logits), rel=1e-12
    )
