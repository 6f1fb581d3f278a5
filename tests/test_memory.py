"""Memory formulas against Korthikanti et al. 2022 and the ZeRO paper, derived by hand below."""

import pytest

from lmcalc.engine.memory.activations import layer_kept_tensors
from lmcalc.engine.memory.gpu_memory import gpu_memory
from lmcalc.engine.memory.outside_layers import model_saved_tensors
from lmcalc.engine.model.params import weight_tensors
from lmcalc.engine.parallel.layout import Layout
from lmcalc.engine.parallel.states import bytes_per_param, optimizer_state_bytes
from lmcalc.engine.workload import Workload
from lmcalc.presets import framework_profile, resolve_model
from lmcalc.recipe_specs import OptimizerSpec, OptimizerState, PrecisionRecipe
from lmcalc.specs import ModelSpec

# The ZeRO paper's mixed-precision Adam: 2 (fp16 weights) + 2 (fp16 grads) + 12 (fp32 master, m, v).
MIXED = PrecisionRecipe(
    name="mixed",
    description="test",
    compute_dtype="bf16",
    param_bytes=2,
    grad_bytes=2,
    master_bytes=4,
    optimizer_state_bytes=4,
    activation_bytes=2,
)
ADAM = OptimizerSpec(
    name="adam", description="test", states=[OptimizerState(name="exp_avg"), OptimizerState(name="exp_avg_sq")]
)


def gpt3() -> ModelSpec:
    return resolve_model("gpt3-175b").spec


def workload(spec: ModelSpec, s: int, b: int, attention: str = "flash", recompute: str = "none") -> Workload:
    """16-bit activations (MIXED keeps them in 2 bytes), bool dropout masks (1 byte), no overhead."""
    return Workload(spec, MIXED, ADAM, s, b, attention, recompute, overhead_bytes=0.0, framework=framework_profile())


def dense_layer_bytes(w: Workload) -> float:
    """What one dense layer keeps through its forward pass (selective: without the attention core)."""
    return sum(t.bytes for t in layer_kept_tensors(w, False))


@pytest.mark.parametrize("s,b", [(2048, 1), (2048, 4), (4096, 2)])
def test_gpt3_layer_is_korthikanti_eq1(s, b):
    # Korthikanti et al. 2022 eq. (1): sbh(34 + 5as/h) bytes per layer, 16-bit activations, dropout, no TP.
    m = gpt3()
    h, a = m.hidden_size, m.num_heads
    act = workload(m, s, b, attention="eager", recompute="none")
    # + the two LayerNorms' mean and 1/std in fp32 (2 · 2 · 4 · s·b bytes), which §4.1 leaves out
    assert dense_layer_bytes(act) == s * b * h * (34 + 5 * a * s / h) + 16 * s * b


def test_gpt3_worked_number_5as_over_h_is_80():
    # Korthikanti §4.1 worked number: GPT-3, a=96, s=2048, h=12288 -> 5as/h = 80.
    m = gpt3()
    act = workload(m, 2048, 1, attention="eager", recompute="none")
    assert (dense_layer_bytes(act) - 16 * 2048) / (2048 * 12288) == 34 + 80


def test_selective_recompute_is_korthikanti_table2():
    # Table 2 (t = 1): selective recomputation keeps sbh(10 + 24) = 34·sbh per layer.
    m = gpt3()
    act = workload(m, 2048, 1, attention="eager", recompute="selective")
    assert dense_layer_bytes(act) == 34 * 2048 * 12288 + 16 * 2048  # + LayerNorm statistics, as above


def test_selective_saves_about_70_percent_for_gpt3():
    # Korthikanti §5 "selective recomputation saves 70% of activation memory" for GPT-3 (34 vs 34 + 80).
    m = gpt3()
    none = dense_layer_bytes(workload(m, 2048, 1, attention="eager", recompute="none"))
    selective = dense_layer_bytes(workload(m, 2048, 1, attention="eager", recompute="selective"))
    assert 1 - selective / none == pytest.approx(0.70, abs=0.01)


def test_full_recompute_keeps_layer_inputs_and_rebuilds_one_layer():
    # Table 2: full recomputation stores 2sbh per layer; one layer is rebuilt at a time in backward.
    m = gpt3()
    s, b, h, L = 2048, 1, 12288, 96
    w = workload(m, s, b, attention="eager", recompute="full")
    full = gpu_memory(w, Layout(), 0)  # the whole model on one GPU
    layers_bytes = full.activations - sum(t.bytes for t in model_saved_tensors(w))  # less what lies outside the layers
    one_layer = s * b * h * (34 + 5 * 96 * s / h) + 16 * s * b
    # the rebuilt layer's first LayerNorm keeps its input, which is that layer's checkpoint (the same storage):
    # its 2sbh are not counted twice
    assert layers_bytes == L * 2 * s * b * h  # the forward pass leaves each layer's input saved
    assert full.activations_rebuilt == one_layer - 2 * s * b * h  # the layer rebuilt in its backward


def test_swiglu_gqa_flash_layer_by_hand():
    # Llama 3 8B, flash attention, no dropout, bf16, s=4096, b=1 (h=4096, H=32, H_kv=8, d=128, f=14336):
    # attention: norm in + qkv in + Q + K + V + O (the fused kernel's output, which the output projection
    #            reads as a view) = sb(h + h + h + h/4 + h/4 + h), + log-sum-exp 4·b·H·s bytes
    # MLP: norm in + gate/up in + 4·f (gate, up, silu(gate), product)
    # two RMSNorms keep 1/rms per row in fp32: 2 · 4·s·b bytes
    m = resolve_model("llama-3.1-8b").spec
    s, b, h, f = 4096, 1, 4096, 14336
    elements = s * b * (h + h + h + h // 4 + h // 4 + h) + s * b * (h + h + 4 * f)
    expected = 2 * elements + 4 * b * 32 * s + 2 * 4 * s * b
    act = workload(m, s, b, attention="flash", recompute="none")
    assert dense_layer_bytes(act) == expected


def test_flash_has_no_quadratic_term():
    m = resolve_model("llama-3.1-8b").spec
    short = dense_layer_bytes(workload(m, 4096, 1, "flash"))
    long = dense_layer_bytes(workload(m, 8192, 1, "flash"))
    assert long == 2 * short  # linear in s


@pytest.mark.parametrize("stage,published_gb", [(0, 120), (1, 31.4), (2, 16.6), (3, 1.88)])
def test_zero_paper_figure1(stage, published_gb):
    # Rajbhandari et al. 2020 Figure 1: Ψ = 7.5B, K = 12, N_d = 64 -> 120 GB, 31.4 GB, 16.6 GB, 1.88 GB.
    per_gpu = 7.5e9 * bytes_per_param(MIXED, 8, stage, 64)
    assert per_gpu / 1e9 == pytest.approx(published_gb, rel=0.005)


def test_state_memory_uses_exact_parameter_count():
    m = resolve_model("llama-3.1-8b").spec
    n = 8_030_261_248
    w = workload(m, 4096, 1)
    state = gpu_memory(w, Layout(dp=8, zero=3), 0)
    assert state.states == pytest.approx(16 * n / 8)
    assert gpu_memory(w, Layout(dp=8, zero=1), 0).params == 2 * n


def test_adafactor_factored_second_moment_by_hand():
    # Shazeer & Stern 2018: an r×c matrix keeps r + c statistics; vectors keep their full size.
    tiny = ModelSpec(
        name="tiny",
        vocab_size=10,
        hidden_size=4,
        num_layers=1,
        num_heads=1,
        ffn_size=8,
        ffn_kind="gelu_mlp",
        norm_kind="rmsnorm",
        tied_embeddings=True,
        position_embedding="none",
        max_seq_len=16,
    )
    factored = OptimizerSpec(name="adafactor", description="t", states=[OptimizerState(name="v", factored=True)])
    # embed 10×4 -> 14; q,k,v,o 4×4 -> 8 each; fc 8×4 -> 12; proj 4×8 -> 12; 3 norms of 4 -> 12
    elements = 14 + 4 * 8 + 12 + 12 + 12
    assert optimizer_state_bytes(tiny, MIXED, factored) == elements * 4


def test_eight_bit_adam_adds_one_scale_per_block():
    # Dettmers et al. 2022: two 1-byte states plus one fp32 absmax per 2048-element block of each tensor.
    m = resolve_model("gpt2-124m").spec
    n = 124_439_808
    adam8 = OptimizerSpec(
        name="adam8bit",
        description="t",
        states=[
            OptimizerState(name="m", bytes=1, quantization_block=2048),
            OptimizerState(name="v", bytes=1, quantization_block=2048),
        ],
    )
    # whole blocks per tensor: each of GPT-2's 196 weight and bias tensors rounds its last block up
    blocks = sum(t.count * -(-t.numel // 2048) for t in weight_tensors(m))
    assert blocks > n / 2048
    assert optimizer_state_bytes(m, MIXED, adam8) == 2 * n + 2 * blocks * 4
