"""The ``muon`` optimizer preset (Jordan et al. 2024; Liu et al. 2025, "Muon is Scalable for LLM Training"): one
momentum buffer for each 2-D weight other than the embedding and the head, AdamW's two moments for every other
weight, and 5 Newton-Schulz iterations on each matrix's update a step. The states are checked against
torch.optim.Muon beside torch.optim.AdamW after one step of a small Llama, the iterations' FLOPs against
FlopCounterMode on torch.optim.Muon's step, and the memory and time by hand on Llama 3.1 8B."""

from __future__ import annotations

import pytest

from lmcalc import api
from lmcalc.engine.model.params import count_params
from lmcalc.engine.parallel.states import matrix_params, optimizer_state_bytes
from lmcalc.engine.time import rates
from lmcalc.engine.time.newton_schulz import matrix_flops, seconds_per_param
from lmcalc.errors import LmcalcError
from lmcalc.hf_config import model_from_hf_config
from lmcalc.presets import resolve_hardware, resolve_model, resolve_optimizer, resolve_precision
from lmcalc.specs import ModelSpec

# Llama 3.1 8B: 8,030,261,248 weights; the embedding and the untied head are 2 × 128,256 × 4,096 and the 65 norms
# 65 × 4,096, which keep AdamW's moments; the other 6,979,321,856, all in 2-D projections, one momentum each
N, EMBEDDING_AND_HEAD, NORMS = 8_030_261_248, 2 * 128_256 * 4_096, 65 * 4_096
MATRICES = N - EMBEDDING_AND_HEAD - NORMS


@pytest.mark.fast
def test_the_states_of_llama_3_1_8b_by_hand():
    assert MATRICES == 6_979_321_856
    model = resolve_model("llama-3.1-8b").spec
    assert matrix_params(model) == MATRICES
    precision, muon = resolve_precision("bf16-mixed").spec, resolve_optimizer("muon").spec
    assert optimizer_state_bytes(model, precision, muon) == MATRICES * 4 + (N - MATRICES) * 2 * 4  # fp32 states
    estimate = api.memory(model="llama-3.1-8b", gpus="8xH100", optimizer="muon", zero=1, seq=4096)
    assert estimate.report.term("state.optimizer").value == (MATRICES * 4 + (N - MATRICES) * 8) / 8  # ZeRO-1, DP 8


@pytest.mark.fast
def test_an_iteration_costs_4m2n_plus_2m3_flops_whichever_way_the_matrix_lies():
    # X·Xᵀ (m×n by n×m), A·A (m×m by m×m), B·X (m×m by m×n): 2m²n + 2m³ + 2m²n, with m the shorter side
    assert matrix_flops(64, 256, 1) == 2 * 64 * 64 * 256 + 2 * 64**3 + 2 * 64 * 64 * 256
    assert matrix_flops(256, 64, 5) == matrix_flops(64, 256, 5) == 5 * (4 * 64 * 64 * 256 + 2 * 64**3)


@pytest.mark.fast
def test_orthogonalising_llama_3_1_8b_takes_its_flops_at_the_gemm_rate():
    # a layer's matrices (h 4,096, 8 KV heads of 128, f 14,336): q and o 4,096², k and v 1,024 × 4,096, gate, up and
    # down 14,336 × 4,096; at these sizes the GEMMs are compute-bound, so their time is their FLOPs at the fraction
    # of the measured bf16 rate, and at most 5 % more for the last wave's idle SMs (an output of 4,096 × 4,096 makes
    # 1,024 tiles of 128 × 128, 7.76 waves of H100's 132 SMs run as 8: 3 % idle)
    layer = 2 * matrix_flops(4096, 4096, 5) + 2 * matrix_flops(1024, 4096, 5) + 3 * matrix_flops(14336, 4096, 5)
    # q, o: 5 · 6 · 4096³; k, v: 5 · (4 · 1024² · 4096 + 2 · 1024³); gate, up, down: 5 · (4 · 4096² · 14336 + 2 · 4096³)
    assert layer == 2 * 2_061_584_302_080 + 2 * 96_636_764_160 + 3 * 5_497_558_138_880 == 20_809_116_549_120
    h100 = resolve_hardware("h100").spec
    cal = rates.CALIBRATION
    rate = cal.gemm_fraction_for(h100) * rates.matmul_rate(h100, "bf16").flops_per_s
    per_dense, per_expert = seconds_per_param(resolve_model("llama-3.1-8b").spec, _full(), 5, h100, cal)
    assert per_expert == 0.0
    assert 32 * layer / rate < per_dense * N < 32 * layer / rate / 0.95


@pytest.mark.fast
def test_the_step_orthogonalises_a_share_of_the_matrices_under_zero_1_and_all_of_them_without():
    muon = resolve_optimizer("muon").spec
    unorthogonalised = muon.model_copy(update={"newton_schulz_steps": 0})  # the same states, no iterations

    def optimizer_seconds(zero: int, optimizer: object, model: str = "llama-3.1-8b") -> float:
        found = api.plan(model=model, gpus="8xH100", optimizer=optimizer, seq=4096, dp=8, zero=zero, micro_batch=1,
                         recompute="full", global_batch=4 * 2**20, tokens=1e9)  # fmt: skip
        return found.best.time.optimizer

    per_dense, _ = seconds_per_param(resolve_model("llama-3.1-8b").spec, _full(), 5, _h100(), rates.CALIBRATION)
    # each of the 8 GPUs holds the whole model (PP 1, TP 1): ZeRO-1 gives it the states, and the matrices, of N / 8
    iterations = optimizer_seconds(1, muon) - optimizer_seconds(1, unorthogonalised)
    assert iterations == pytest.approx(per_dense * N / 8, rel=1e-9)
    assert 0.1479 < iterations < 0.1479 / 0.95  # 32 layers' 2.0809e13 FLOPs / 8 at 0.708 × 794.5 TFLOP/s, and waves
    # ZeRO-0 (Llama 3.2 1B, which fits without it): every GPU orthogonalises every matrix
    small = resolve_model("llama-3.2-1b").spec
    per_dense, _ = seconds_per_param(small, _full(), 5, _h100(), rates.CALIBRATION)
    iterations = optimizer_seconds(0, muon, "llama-3.2-1b") - optimizer_seconds(0, unorthogonalised, "llama-3.2-1b")
    assert iterations == pytest.approx(per_dense * count_params(small).total, rel=1e-9)


@pytest.mark.fast
def test_zero_2_and_3_are_refused_and_the_planner_keeps_to_zero_0_and_1():
    refusal = r"muon orthogonalises each matrix whole: lmcalc models it at .*zero.* 0 or 1 .*not ZeRO-3"
    with pytest.raises(LmcalcError, match=refusal):
        api.memory(model="llama-3.1-8b", gpus="8xH100", optimizer="muon", zero=3, seq=4096)
    found = api.plan(model="llama-3.1-8b", gpus="8xH100", optimizer="muon", seq=4096, tokens=1e9)
    assert {c.layout.zero for c in found.layouts} <= {0, 1}


def _full():
    from lmcalc.engine.finetune.method import FULL

    return FULL


def _h100():
    return resolve_hardware("h100").spec


# ---------------------------------------------------------------------------------------------------------------
# Against PyTorch on the CPU
# ---------------------------------------------------------------------------------------------------------------

CONFIG = dict(vocab_size=512, hidden_size=128, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
              intermediate_size=384)  # fmt: skip


@pytest.mark.torch
def test_the_states_equal_torch_muon_beside_adamw():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(**CONFIG)
    model = transformers.AutoModelForCausalLM.from_config(config)  # fp32: the states in their own dtype
    matrices = [p for n, p in model.named_parameters() if p.dim() == 2 and "embed" not in n and "lm_head" not in n]
    taken = {id(p) for p in matrices}
    others = [p for p in model.parameters() if id(p) not in taken]
    optimizers = [torch.optim.Muon(matrices, lr=0.02), torch.optim.AdamW(others, lr=1e-3)]
    ids = torch.randint(0, CONFIG["vocab_size"], (1, 16))
    model(input_ids=ids, labels=ids).loss.backward()
    for optimizer in optimizers:
        optimizer.step()
    held = sum(
        t.numel() * t.element_size()
        for optimizer in optimizers
        for state in optimizer.state.values()
        for key, t in state.items()
        if torch.is_tensor(t) and key != "step"
    )
    spec = ModelSpec.model_validate(model_from_hf_config(config.to_dict(), "llama", "x"))
    fp32, muon = resolve_precision("fp32").spec, resolve_optimizer("muon").spec
    assert optimizer_state_bytes(spec, fp32, muon) == held
    assert matrix_params(spec) == sum(p.numel() for p in matrices)


@pytest.mark.torch
@pytest.mark.parametrize("shape", [(64, 256), (256, 64), (96, 96)])
def test_newton_schulz_flops_equal_flopcountermode_on_torch_muon(shape):
    torch = pytest.importorskip("torch")
    from torch.utils.flop_counter import FlopCounterMode

    weight = torch.nn.Parameter(torch.randn(shape))
    weight.grad = torch.randn(shape)
    optimizer = torch.optim.Muon([weight], lr=0.02)
    with FlopCounterMode(display=False) as counter:
        optimizer.step()
    assert counter.get_total_flops() == matrix_flops(*shape, resolve_optimizer("muon").spec.newton_schulz_steps)
