"""Fine-tuning memory by hand and against bitsandbytes: frozen weights, 4-bit NF4 storage, adapters' states, offload.

The NF4 storage is compared with what bitsandbytes' own ``quantize_4bit`` returns on the CPU (packed weights, the
quantised absmax per 64-weight block, the fp32 scales per 256 blocks and the per-tensor constants), tensor by
tensor, for every shape a model quantises; the rest are hand derivations written out below.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from lmcalc.engine.finetune.method import (
    NF4_BITS_PER_WEIGHT,
    NF4_TENSOR_CONSTANTS,
    Method,
    adapter_tensors,
    nf4_bytes,
    parse_targets,
    quantised,
)
from lmcalc.engine.finetune.offload import Offload, offload_time
from lmcalc.engine.memory.activations import lowest_layer_unkept
from lmcalc.engine.memory.gpu_memory import most_loaded_gpu
from lmcalc.engine.model.params import count_params, weight_tensors
from lmcalc.engine.parallel.layout import Layout, ModelSplit
from lmcalc.engine.parallel.pipeline import StageLayers
from lmcalc.engine.parallel.sharding import frozen_held, trained_held
from lmcalc.engine.workload import Workload
from lmcalc.errors import LmcalcError
from lmcalc.presets import framework_profile, resolve_model, resolve_optimizer, resolve_precision

LLAMA = resolve_model("llama-3.1-8b").spec
BF16 = resolve_precision("bf16-mixed").spec
ADAMW = resolve_optimizer("adamw").spec
IDEALISED = framework_profile("idealised")
WHOLE = StageLayers(LLAMA.num_layers, 0, True, True)


def workload(method: Method | None = None, offload: Offload | None = None) -> Workload:
    return Workload(
        LLAMA, BF16, ADAMW, 2048, framework=IDEALISED, method=method or Method(), offload=offload or Offload()
    )


def test_nf4_is_4_127_bits_per_weight():
    # Dettmers et al. 2023 §3: 4 bits + an 8-bit absmax per 64 weights + a 32-bit scale per 256 absmaxes
    assert NF4_BITS_PER_WEIGHT == 4 + 8 / 64 + 32 / (64 * 256)  # exact in binary: 4.126953125
    assert round(NF4_BITS_PER_WEIGHT, 3) == 4.127


@pytest.mark.torch
@pytest.mark.parametrize("shape", [(4096, 4096), (1024, 4096), (14336, 4096), (300, 512), (100, 50), (7, 3)])
def test_nf4_bytes_equal_bitsandbytes_storage(shape):
    torch = pytest.importorskip("torch")
    functional = pytest.importorskip("bitsandbytes.functional")
    weight = torch.randn(*shape, dtype=torch.bfloat16)
    packed, state = functional.quantize_4bit(weight, blocksize=64, compress_statistics=True, quant_type="nf4")
    stored = [packed, state.absmax, state.offset, state.code, state.state2.absmax, state.state2.code]
    assert nf4_bytes(math.prod(shape)) == sum(t.numel() * t.element_size() for t in stored)


def test_qlora_frozen_bytes_by_hand():
    # Llama-3.1-8B under QLoRA: the 7 linear weights of each of the 32 layers in NF4 (their bytes from the formula
    # above, plus 1,092 B of constants each), the embedding, head and norms in fp32 (peft's kbit upcast).
    linear = [t for t in weight_tensors(LLAMA) if quantised(t)]
    assert {t.name for t in linear} == {f"{p}.weight" for p in ("attn.q", "attn.k", "attn.v", "attn.o")} | {
        f"mlp.{p}.weight" for p in ("gate", "up", "down")
    }
    n_linear = sum(t.total for t in linear)
    rest = count_params(LLAMA).total - n_linear
    expected = n_linear * NF4_BITS_PER_WEIGHT / 8 + 7 * 32 * NF4_TENSOR_CONSTANTS + 4 * rest
    assert frozen_held(LLAMA, Method("qlora"), 2, ModelSplit(), WHOLE).total == pytest.approx(expected, rel=1e-12)
    # without the upcast the rest stays in the recipe's 2 bytes
    plain = frozen_held(LLAMA, Method("qlora", kbit_upcast=False), 2, ModelSplit(), WHOLE).total
    assert plain == pytest.approx(expected - 2 * rest, rel=1e-12)


def test_lora_states_by_hand():
    # LoRA r=16 on every linear layer of Llama-3.1-8B (h 4096, KV 1024, f 14336, 32 layers):
    # 32 · 16 · [(4096+4096) + (4096+1024)·2 + (4096+4096) + (4096+14336)·2 + (14336+4096)] = 41,943,040 adapters.
    adapters = 32 * 16 * (8192 + 2 * 5120 + 8192 + 2 * 18432 + 18432)
    assert adapters == 41_943_040
    assert sum(t.total for t in adapter_tensors(LLAMA, Method("lora"))) == adapters
    gpu = most_loaded_gpu(workload(Method("lora")), Layout())
    # frozen base in bf16 (2 B), adapters as the recipe trains any weight: 2 + 2 + 4 master + 2·4 Adam = 16 B
    assert gpu.params == 2 * count_params(LLAMA).total + 2 * adapters
    assert gpu.grads == 2 * adapters
    assert gpu.master == 4 * adapters
    assert gpu.optimizer == 8 * adapters


@pytest.mark.parametrize(("fp32_adapters", "trained_bytes"), [(True, (4, 4, 8)), (False, (2, 2, 4))])
def test_peft_fp32_adapters_over_a_pure_bf16_model(fp32_adapters, trained_bytes):
    # PEFT's autocast_adapter_dtype (its default) keeps the adapters in fp32 over a bf16 model; without autocast's
    # mixed recipe torch.optim.AdamW then makes its two states in fp32 too: 4 + 4 + 2·4 bytes an adapter weight.
    # Cast to bf16, they follow the bf16-pure recipe: 2 + 2 + 2·2. The frozen base stays at 2 bytes either way.
    adapters = 41_943_040  # test_lora_states_by_hand
    pure = replace(workload(Method("lora", fp32_adapters=fp32_adapters)), precision=resolve_precision("bf16-pure").spec)
    gpu = most_loaded_gpu(pure, Layout())
    weight, grad, states = trained_bytes
    assert gpu.params == 2 * count_params(LLAMA).total + weight * adapters
    assert gpu.grads == grad * adapters
    assert gpu.master == 0
    assert gpu.optimizer == states * adapters


def test_freeze_trains_the_top_layers_and_the_head():
    method = Method("freeze", freeze_layers=24)
    trained = trained_held(LLAMA, method, ModelSplit(), WHOLE).total
    per_layer = (count_params(LLAMA).total - 2 * LLAMA.vocab_size * LLAMA.hidden_size - LLAMA.hidden_size) / 32
    assert trained == pytest.approx(8 * per_layer + LLAMA.hidden_size + LLAMA.vocab_size * LLAMA.hidden_size)
    # the bottom 24 layers keep no activations: 8 of 32 layers' worth, plus what lies outside the layers
    full = most_loaded_gpu(workload(), Layout()).activations
    frozen = most_loaded_gpu(workload(method), Layout()).activations
    assert frozen < full / 3


def test_optimizer_offload_by_hand():
    # ZeRO-Offload of full fine-tuning, one GPU: the GPU keeps 2 B weights + 2 B gradients per parameter; the host
    # the 4 B master, 8 B of Adam moments and a 4 B fp32 copy of the gradients (Ren et al. 2021 §4.1).
    n = count_params(LLAMA).total
    gpu = most_loaded_gpu(workload(offload=Offload("optimizer")), Layout())
    assert gpu.states == 4 * n
    assert gpu.offloaded == 16 * n
    # each step: 2 B of gradients down and 2 B of weights up per parameter at 25 GB/s; 1e9 parameters/s on the CPU
    cost = offload_time(Offload("optimizer"), n, 2, 2, 1)
    assert cost.transfers == pytest.approx(4 * n / 25e9)
    assert cost.cpu_optimizer == pytest.approx(n / 1e9)


def test_parameter_offload_needs_zero3_and_leaves_only_gathered_layers():
    from lmcalc.engine.parallel.layout_checks import check_layout

    w = workload(offload=Offload("optimizer+params"))
    with pytest.raises(LmcalcError, match="zero"):
        check_layout(w, Layout(dp=8, zero=1))
    gpu = most_loaded_gpu(w, Layout(dp=8, zero=3))
    assert gpu.params == gpu.grads == gpu.master == gpu.optimizer == 0
    assert gpu.zero3_buffers > 0  # the layers gathered for their forward and backward
    assert gpu.offloaded == pytest.approx((2 + 2 + 4 + 8 + 4) * count_params(LLAMA).total / 8)


@pytest.mark.parametrize(
    ("method", "message"),
    [
        (dict(kind="freeze"), "freeze_layers"),
        (dict(kind="lora", freeze_layers=2), "freeze method only"),
        (dict(kind="lora", lora_rank=0), "lora_rank"),
        (dict(kind="lora", lora_dropout=1.0), "lora_dropout"),
        (dict(kind="sgd"), "method"),
    ],
)
def test_bad_methods_are_refused(method, message):
    with pytest.raises(LmcalcError, match=message):
        Method(**method)


def test_a_target_the_model_lacks_is_named():
    gpt2 = resolve_model("gpt2-124m").spec
    with pytest.raises(LmcalcError, match="fused weight: target qkv"):
        Workload(gpt2, BF16, ADAMW, 512, method=Method("lora", lora_targets=("q", "v")), framework=framework_profile())


def test_the_lowest_layers_frozen_projections_keep_no_qk_norm():
    # the lowest layer's input (the frozen embedding's output) needs no gradient: under LoRA on Q and V, K is made
    # by a frozen k_proj from it and needs none either, so Qwen3's K-norm keeps nothing there (measured on Gemma 4,
    # tests/test_finetune_activations.py); Q's norm, fed by an adapted q_proj, keeps its tensors. Where Q, K and V are
    # one fused projection with an adapter, all three norms keep theirs
    spec = resolve_model("qwen3-0.6b").spec
    w = Workload(spec, resolve_precision("bf16-pure").spec, resolve_optimizer("adamw").spec, 128, 1, "flash", "none",
                 framework=framework_profile("transformers"),
                 method=Method("lora", 8, parse_targets("q_proj,v_proj")))  # fmt: skip
    unkept = {t.label for t in lowest_layer_unkept(w)}
    assert {"K-norm input (fp32 copy)", "K-norm 1/rms (fp32)"} <= unkept
    assert not any(label.startswith("Q-norm") for label in unkept)
    fused = replace(w, model=spec.model_copy(update={"fused_linears": ("qkv",)}),
                    method=Method("lora", 8, parse_targets("qkv")))  # fmt: skip
    assert not any(label.startswith(("Q-norm", "K-norm")) for label in (t.label for t in lowest_layer_unkept(fused)))
