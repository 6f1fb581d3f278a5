"""The liger profile: transformers with Liger-Kernel's kernels (the Trainer's use_liger_kernel), read from
linkedin/Liger-Kernel at ead96b61 (its kernels are Triton's, which the CPU does not run, so these are derivations by
hand from the source, cited in presets/frameworks/liger.yaml)."""

import pytest

import lmcalc
from lmcalc.engine.memory.outside_layers import model_saved_tensors
from lmcalc.engine.memory.phases import backward_transients, fused_loss_chunk
from lmcalc.engine.parallel.pipeline import StageLayers
from lmcalc.engine.workload import Workload
from lmcalc.presets import framework_profile, resolve_model, resolve_optimizer, resolve_precision

LLAMA = resolve_model("llama-3.1-8b").spec  # h 4096, V 128,256, 32 layers
S = 4096
WHOLE = StageLayers(32, 0, True, True)


def workload(framework: str) -> Workload:
    precision, adamw = resolve_precision("bf16-mixed").spec, resolve_optimizer("adamw").spec
    return Workload(LLAMA, precision, adamw, S, 1, framework=framework_profile(framework))


@pytest.mark.parametrize(
    ("tokens", "hidden", "vocab", "rows"),
    [
        (4096, 4096, 128_256, 128),  # ⌈V/h⌉ = 32: ⌈4096 / 32⌉ = 128, a power of two
        (4 * 4096, 4096, 32_000, 2048),  # the source's own example: BT 16,384, V 32,000, h 4,096 -> chunk 2,048
        (1000, 4096, 128_256, 32),  # ⌈1000 / 32⌉ = 32
        (100, 4096, 2048, 100),  # V < h: one chunk of every token (the next power of two, 128, capped)
    ],
)
def test_the_fused_loss_chunk_is_liger_s(tokens, hidden, vocab, rows):
    # fused_linear_cross_entropy_forward: inc_factor = cdiv(V, H); chunk_size = next_power_of_2(cdiv(BT, inc_factor))
    assert fused_loss_chunk(tokens, hidden, vocab) == rows


def test_no_logits_are_kept_and_the_head_input_s_gradient_is():
    sb, h = S, LLAMA.hidden_size
    head = {t.label: t.bytes for t in model_saved_tensors(workload("liger")) if t.block == "head"}
    # LigerRMSNormFunction saves X (bf16) and RSTD (fp32 a row); the fused head and loss save grad_input (bf16), and
    # neither the head input nor any logits
    assert head == {
        "final norm input": 2 * sb * h,
        "final norm 1/rms (fp32)": 4 * sb,
        "head input's gradient (made in the forward)": 2 * sb * h,
    }
    plain = {t.label for t in model_saved_tensors(workload("transformers")) if t.block == "head"}
    assert {"output head input", "logits kept by the cross-entropy"} <= plain


def test_the_loss_holds_one_chunk_of_logits():
    liger = backward_transients(workload("liger"), 1, 1, WHOLE)
    assert liger.loss == 128 * LLAMA.vocab_size * 2  # one chunk of bf16 logits, its gradient made in place
    assert liger.norm == 0  # Liger's RMSNorm backward is one kernel, not transformers' fp32 ops
    transformers = backward_transients(workload("transformers"), 1, 1, WHOLE)
    assert transformers.loss == 8 * S * LLAMA.vocab_size  # nll_loss's and log_softmax's fp32 gradients


def test_liger_lets_a_qlora_fine_tune_take_a_longer_sequence():
    common = dict(model="llama-3.1-8b", gpus="1xRTX4090", method="qlora", recompute="full")
    plain = lmcalc.fit(**common, seq=2048)
    fused = lmcalc.fit(**common, seq=2048, framework="liger")
    assert fused.workload.framework.name == "liger"
    assert fused.seq.value > plain.seq.value  # the logits, not the layers, bound the plain one
