"""``lmcalc bench step``: real AdamW steps of a tiny model on the CPU, and the figures derived from them."""

import json
import math
from dataclasses import asdict, replace

import pytest

torch = pytest.importorskip("torch")

from lmcalc import measure  # noqa: E402
from lmcalc.bench import step  # noqa: E402
from lmcalc.bench.device import Device, detect  # noqa: E402
from lmcalc.bench.step import StepSetup  # noqa: E402
from lmcalc.errors import LmcalcError  # noqa: E402
from lmcalc.presets import resolve_model  # noqa: E402
from lmcalc.specs import ModelSpec  # noqa: E402

pytestmark = pytest.mark.torch

# A llama-like toy: h = 64, L = 2, H = 4 heads of d = 16, SwiGLU f = 128, V = 256, untied head, no biases.
TINY = ModelSpec(
    name="tiny",
    vocab_size=256,
    hidden_size=64,
    num_layers=2,
    num_heads=4,
    ffn_size=128,
    ffn_kind="swiglu",
    norm_kind="rmsnorm",
    position_embedding="rope",
    tied_embeddings=False,
    max_seq_len=256,
)
SEQ, BATCH, WARMUP, REPEATS = 32, 2, 2, 5


@pytest.fixture(scope="module")
def measured():
    return step.run_steps(StepSetup(TINY, SEQ, BATCH, "fp32", "flash", "none", WARMUP, REPEATS), detect("cpu"))


# A device with a 1 GFLOP/s fp32 peak (0.001 TFLOP/s), and five timed steps of 0.40, 0.16, 0.32, 0.20 and
# 0.25 s: sorted 0.16, 0.20, 0.25, 0.32, 0.40, so the median is 0.25 s, the spread (0.40 − 0.16) / 0.25 = 96 %.
GFLOP_CPU = Device(torch.device("cpu"), "test CPU", None, {"fp32": 0.001}, "test peak")
STEP_TIMES = (0.40, 0.16, 0.32, 0.20, 0.25)


def _timed(measured, recompute="none"):
    """The real measurement's prediction and losses, with the chosen device and step times."""
    setup = replace(measured.setup, recompute=recompute)
    return replace(measured, setup=setup, device=GFLOP_CPU, seconds=STEP_TIMES)


def test_the_optimizer_really_steps(measured):
    # One fixed batch: AdamW at lr 1e-3 lowers the loss at every step (about 0.15 nats each here).
    losses = measured.losses
    assert len(losses) == WARMUP + REPEATS
    assert all(later < earlier for earlier, later in zip(losses, losses[1:], strict=False))
    assert losses[-1] < losses[0] - 0.3


def test_the_loss_is_next_token():
    # Scoring each position against its own token, a tied model would start at a loss of ~0 (its logits are
    # the input embedding dotted with itself); against the next random token it starts near ln V or above.
    tied = TINY.model_copy(update={"tied_embeddings": True})
    m = step.run_steps(StepSetup(tied, SEQ, BATCH, "fp32", warmup=0, repeats=1), detect("cpu"))
    assert m.losses[0] > math.log(TINY.vocab_size) / 2


def test_tokens_per_second_is_batch_times_seq_over_median(measured):
    assert len(measured.seconds) == REPEATS
    # b·s = 2 × 32 = 64 tokens per step over the 0.25 s median step: 256 tokens/s.
    m = _timed(measured)
    assert (m.stats.median, m.stats.fastest, m.stats.slowest) == (0.25, 0.16, 0.40)
    assert m.tokens_per_s == 256.0
    result = step.step_result(m)
    assert result.value("time.tokens_per_s") == 256.0
    assert result.value("time.spread") == pytest.approx(96.0, rel=1e-12)


def test_flops_per_step_closed_form(measured):
    # Forward FLOPs per token, full attention (every query against all s = 32 keys):
    #   Q, K, V, O projections   2 · 4h² · L       = 2 · 4 · 64² · 2        = 65,536
    #   SwiGLU gate, up, down    2 · 3·h·f · L     = 2 · 3 · 64 · 128 · 2   = 98,304
    #   scores QKᵀ               2 · L · s · H · d = 2 · 2 · 32 · 4 · 16    =  8,192
    #   values AV                2 · L · s · H · d                          =  8,192
    #   logits                   2 · h · V         = 2 · 64 · 256           = 32,768
    #                                                                 total = 212,992
    # A step is 3 × forward (backward = 2 × forward) over b·s = 64 tokens: 3 × 212,992 × 64 = 40,894,464.
    h, L, H, d, f, V = 64, 2, 4, 16, 128, 256
    forward = L * (8 * h * h + 6 * h * f + 4 * SEQ * H * d) + 2 * h * V
    assert forward == 212_992
    assert measured.model_flops == 3 * forward * BATCH * SEQ == 40_894_464
    assert measured.hardware_flops == measured.model_flops  # no recomputation
    # over the 0.25 s median step: 40,894,464 / 0.25 = 163,577,856 FLOP/s
    assert _timed(measured).achieved_flops_per_s == 163_577_856


def test_flops_per_step_match_pytorch_flop_counter():
    # FlopCounterMode counts attention full too: the convention MFU is quoted in.
    model = measure.build(TINY, "flash", SEQ, "meta")
    assert measure.training_step_flops(model, SEQ, BATCH) == step.model_flops_per_step(TINY, SEQ, BATCH)


def test_selective_recompute_counts_attention_again_in_hfu_only():
    # Selective recomputation redoes the scores and values: 2 × 8,192 per token, once more, over b·s = 64 tokens
    # 1,048,576 FLOPs a step: 40,894,464 + 1,048,576 = 41,943,040.
    assert step.hardware_flops_per_step(TINY, SEQ, BATCH, "selective") == 41_943_040


def test_mfu_is_achieved_over_peak(measured):
    # PaLM (Chowdhery et al. 2022 App. B): MFU = model FLOPs per step / (step time × peak). With the 0.25 s
    # median step and a 1 GFLOP/s peak: 40,894,464 / (0.25 × 1e9) = 0.163577856, 16.3577856 %.
    m = _timed(measured)
    assert m.peak_flops_per_s == 1e9
    assert m.mfu == pytest.approx(0.163577856, rel=1e-12)
    assert m.hfu == pytest.approx(0.163577856, rel=1e-12)  # no recomputation: HFU = MFU
    result = step.step_result(m)
    assert result.value("flops.mfu") == pytest.approx(16.3577856, rel=1e-12)
    # Causal attention: each query meets (s + 1)/2 = 16.5 keys, so scores and values take 2 · 2 · 16.5 · 4 · 16
    # = 4,224 FLOPs each per token instead of 8,192; forward = 65,536 + 98,304 + 2 × 4,224 + 32,768 = 205,056,
    # a step 3 × 205,056 × 64 = 39,370,752 FLOPs, and 39,370,752 / (0.25 × 1e9) = 15.7483008 %.
    assert result.value("flops.mfu_causal") == pytest.approx(15.7483008, rel=1e-12)
    (record,) = step.records(m)
    assert record.figures["mfu"] == pytest.approx(0.163577856, rel=1e-12)
    assert record.figures["tokens_per_s"] == 256.0


def test_hfu_counts_recomputation(measured):
    # Selective recomputation adds the scores and values once more, 2 × 8,192 × 64 = 1,048,576 FLOPs a step:
    # HFU = (40,894,464 + 1,048,576) / (0.25 × 1e9) = 0.16777216, while MFU stays 0.163577856.
    m = _timed(measured, recompute="selective")
    assert m.hfu == pytest.approx(0.16777216, rel=1e-12)
    assert m.mfu == pytest.approx(0.163577856, rel=1e-12)


@pytest.mark.parametrize(
    "device,dtype",
    [(Device(torch.device("cpu"), "test CPU", None, {}, "no peak"), "fp32"), (None, "bf16")],
    ids=["no peak at all", "bf16 on a CPU with only an fp32 estimate"],
)
def test_no_peak_means_no_mfu(measured, device, dtype):
    device = device or Device(torch.device("cpu"), "test CPU", None, {"fp32": 1.0})
    m = replace(measured, device=device, setup=replace(measured.setup, dtype=dtype))
    assert m.peak_flops_per_s is None and m.mfu is None and m.hfu is None
    result = step.step_result(m)
    assert math.isnan(result.value("flops.mfu")) and math.isnan(result.value("flops.peak"))
    assert "not available" in result.term("flops.mfu").note
    assert result.value("time.tokens_per_s") == m.tokens_per_s  # the rest is still reported


def test_memory_recipe_follows_the_dtype():
    # fp32 model + fp32 AdamW: 4 + 4 + 2 × 4 = 16 bytes per parameter; bf16 model + bf16 AdamW: 2 + 2 + 2 × 2 = 8.
    fp32 = step.predict_memory(StepSetup(TINY, SEQ, BATCH, "fp32"), "cpu")
    bf16 = step.predict_memory(StepSetup(TINY, SEQ, BATCH, "bf16"), "cuda")
    assert (fp32.recipe, fp32.bytes_per_param) == ("fp32", 16)
    assert (bf16.recipe, bf16.bytes_per_param) == ("bf16-pure", 8)
    assert fp32.states == 16 * fp32.params and bf16.states == 8 * bf16.params
    # TINY's exact parameter count: embedding and untied head 2 × V·h = 2 × 256 × 64 = 32,768; a layer's Q, K, V, O
    # 4·h² = 16,384, SwiGLU gate, up, down 3·h·f = 3 × 64 × 128 = 24,576, two RMSNorms 2·h = 128, so 41,088 a layer
    # and 82,176 for L = 2; the final norm h = 64. N = 32,768 + 82,176 + 64 = 115,008: states 16·N = 1,840,128 B
    # (fp32) and 8·N = 920,064 B (bf16).
    assert fp32.params == bf16.params == 115_008
    assert (fp32.states, bf16.states) == (1_840_128, 920_064)
    # Activations at the recipe's 2 bytes (logits, norm statistics and token ids stay fp32/int64); TINY has no
    # dropout, so no masks (bool on CUDA) at all. b·s = 64 tokens, h = 64, H = 4 heads of d = 16, f = 128, V = 256:
    #   a layer's attention half: norm input, 1/rms (fp32), QKV input, Q, K, V (after RoPE), attention output
    #     = 6 × 64·64 × 2 B + 64 × 4 B + log-sum-exp b·H·s = 256 × 4 B        = 49,152 + 256 + 1,024 =  50,432
    #   its MLP half: norm input, 1/rms (fp32), MLP input, then gate, up, SiLU(gate), product (4 · s·b·f)
    #     = 2 × 64·64 × 2 B + 64 × 4 B + 4 × 64·128 × 2 B                      = 16,384 + 256 + 65,536 =  82,176
    #   two layers: 2 × 132,608                                                                       = 265,216
    #   outside the layers: token ids and targets 2·s·b int64 = 1,024; final norm input 8,192 and 1/rms 256;
    #     head input 8,192; fp32 logits s·b·V × 4 B = 64 × 256 × 4 = 65,536                           =  83,200
    #   total                                                                                         = 348,416
    assert bf16.activations == 348_416


def test_result_carries_units_inputs_and_conventions(measured):
    result = step.step_result(measured)
    assert result.command == "bench-step"
    units = {t.key: t.unit for s in result.sections for t in s.terms}
    assert units["median"] == "s" and units["tokens_per_s"] == "tokens/s"
    assert units["achieved"] == "FLOP/s" and units["mfu"] == "%" and units["predicted"] == "bytes"
    assert {i.key for i in result.inputs} >= {
        "model",
        "seq_len",
        "micro_batch",
        "device",
        "dtype",
        "attention",
        "recompute",
        "repeats",
    }
    assert result.value("flops.model_flops") == 40_894_464
    assert result.value("memory.predicted") == measured.predicted.total
    # the CPU's peak comes from live storages over one more step: the tiny model has no dropout, so the
    # fused kernel runs and the phases hold (docs/formulas.md §5.8)
    assert result.value("memory.measured") == pytest.approx(measured.predicted.total, rel=1e-4)
    assert not any("not measured" in n for n in result.notes)
    assert any("full (non-causal)" in n for n in result.notes)
    json.loads(json.dumps(result.as_json()))


def test_records(measured):
    (record,) = step.records(measured)
    assert record.kind == "step" and record.dtype == "fp32"
    assert record.figures["repeats"] == REPEATS and record.figures["median_s"] == measured.stats.median
    assert record.figures["model_flops_per_step"] == 40_894_464
    assert record.figures["flop_convention"] == "full"
    assert record.software["torch"] == torch.__version__
    json.dumps(asdict(record))


def test_refuses_a_model_too_large_for_this_machine():
    spec = resolve_model("llama-3.1-405b").spec
    with pytest.raises(LmcalcError) as refused:
        step.run_steps(StepSetup(spec, 128, 1, "fp32", warmup=1, repeats=1), detect("cpu"))
    message = str(refused.value)
    assert "\n" not in message
    assert "llama-3.1-405b" in message and "llama-3.2-1b" in message and "gpt2-124m" in message
    assert "16 bytes" in message  # 4 (weights) + 4 (grads) + 8 (two fp32 AdamW states)


def test_limit_without_meminfo_is_4_gb(monkeypatch):
    monkeypatch.setattr(step.predict, "MEMINFO", "/nonexistent/meminfo")
    limit, why = step.memory_limit(detect("cpu"))
    assert limit == 4e9 and "4 GB" in why


def test_refuses_bad_dtype_and_too_long_sequence():
    with pytest.raises(LmcalcError, match="^dtype must be one of fp32, bf16 for a training step"):
        StepSetup(TINY, SEQ, BATCH, "fp16")
    with pytest.raises(LmcalcError, match="context"):
        StepSetup(TINY, 512, 1)
    with pytest.raises(LmcalcError, match="threads must be at least 1"):
        StepSetup(TINY, SEQ, BATCH, threads=0)


def test_threads_are_set_for_the_run_and_restored():
    before = torch.get_num_threads()
    m = step.run_steps(StepSetup(TINY, SEQ, BATCH, "fp32", warmup=0, repeats=1, threads=1), detect("cpu"))
    assert m.threads == 1 and torch.get_num_threads() == before
