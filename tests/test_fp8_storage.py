"""FP8 as Transformer Engine keeps it under the megatron profile (engine/memory/fp8_storage.py), read from
NVIDIA/TransformerEngine d0067d0d and Megatron-LM core_v0.16.1. The differences from bf16 are derived here by hand:

* TE's linear layers save their input quantised in one direction (module/linear.py, layernorm_linear.py: the
  columnwise copy only): the attention norm's output (QKV input), the MLP norm's output (fc1 input) and the SwiGLU
  product (fc2 input), 1 byte where bf16 keeps 2 (block and MXFP8 add a scale per 128 or 32 values);
* under delayed scaling attention's output projection saves a quantised copy of its input beside the bf16 tensor the
  attention kernel keeps; under current scaling it saves the bf16 one (Megatron-Core's save_original_input);
* each layer weight has a quantised copy for both uses: one byte and, on Hopper (TN-only fp8 GEMMs), its transpose;
* a layer's backward quantises fc1's output gradient (2f wide) for both uses beside the bf16 one.
"""

from __future__ import annotations

import pytest

from lmcalc.errors import LmcalcError
from lmcalc.estimates.memory import memory

S, H, F, L = 8192, 4096, 14_336, 32  # Llama 3 8B at its context, micro-batch 1
LAYER = H * (H + 2 * 1024) + H * H + 3 * H * F + 2 * H  # 218,112,000 parameters a layer
N = 8_030_261_248


def gpu(precision: str, gpus: str = "8xH100", **settings):
    settings = {"framework": "megatron", "zero": 1, **settings}
    return memory(model="llama-3-8b", gpus=gpus, precision=precision, **settings).gpu


def test_the_linear_layers_save_their_inputs_quantised():
    bf16 = gpu("bf16-mixed").activations
    # delayed: QKV and fc1 inputs (s·h each) and the fc2 input (s·f) drop a byte; the projection's copy adds one (s·h)
    assert bf16 - gpu("fp8-mixed").activations == L * (S * H + S * F)
    # current scaling: the projection keeps the kernel's bf16 output, no copy
    assert bf16 - gpu("fp8-current").activations == L * (2 * S * H + S * F)
    # block scaling: an fp32 scale per 128 values, 1.03125 bytes where bf16 keeps 2, no projection copy
    assert bf16 - gpu("fp8-blockwise").activations == pytest.approx(L * (2 * S * H + S * F) * (2 - 1.03125))


def test_each_layer_weight_has_a_quantised_copy():
    layers = L * LAYER  # the embedding and the output layer stay bf16, without a copy
    assert gpu("bf16-mixed").fp8_weights == 0
    assert gpu("fp8-mixed").fp8_weights == layers * 2  # one byte and its transpose on Hopper
    assert gpu("fp8-mixed", "8xB200").fp8_weights == layers * 1  # Blackwell's GEMMs read either layout
    assert gpu("fp8-blockwise").fp8_weights == pytest.approx(layers * 2 * (1 + 4 / 128**2))
    assert gpu("mxfp8", "8xB200").fp8_weights == pytest.approx(layers * 2 * (1 + 1 / 32))
    assert gpu("nvfp4", "8xB200").fp8_weights == pytest.approx(layers * 2 * (0.5 + 1 / 16))  # E2M1 + E4M3 per 16


def test_nvfp4_saves_half_a_byte_and_a_scale():
    bf16 = gpu("bf16-mixed", "8xB200").activations
    # the three linear inputs at 0.5 + 1/16 bytes where bf16 keeps 2; the projection keeps the kernel's bf16 output
    assert bf16 - gpu("nvfp4", "8xB200").activations == pytest.approx(L * (2 * S * H + S * F) * (2 - 0.5625))


def test_fp8_primary_weights_replace_the_bf16_ones():
    bf16, primary = gpu("fp8-current"), gpu("fp8-current", fp8_param_gather=True)
    assert primary.params == (N - L * LAYER) * 2  # only the embedding, output layer and norms stay bf16
    assert primary.fp8_weights == L * LAYER * 2  # one byte and its transpose, on Hopper the bf16 weight's size
    assert primary.master == bf16.master and primary.grads == bf16.grads  # the fp32 master copy stays


def test_the_backward_quantises_the_output_gradient():
    # fc1's output gradient, s·2f, quantised both ways: 1 byte and the transpose on Hopper, 1 byte on Blackwell
    assert gpu("fp8-mixed").transients.layer - gpu("bf16-mixed").transients.layer == S * 2 * F * 2
    assert gpu("fp8-mixed", "8xB200").transients.layer - gpu("bf16-mixed", "8xB200").transients.layer == S * 2 * F


def test_torchaos_float8_stores_what_bf16_does():
    # torchao/float8/float8_linear.py: save_for_backward(input_hp, weight_hp_t), the bf16 tensors; casts per GEMM
    bf16 = gpu("bf16-mixed", framework="torchtitan", zero=3)
    fp8 = gpu("fp8-mixed", framework="torchtitan", zero=3)
    assert fp8.activations == bf16.activations and fp8.fp8_weights == 0 and fp8.total == bf16.total


def test_refusals():
    for blackwell_only in ("mxfp8", "nvfp4"):  # Transformer Engine runs them on B200, B300, GB200 only
        with pytest.raises(LmcalcError, match="compute capability 10.x"):
            gpu(blackwell_only)
    with pytest.raises(LmcalcError, match="needs an fp8 recipe"):
        gpu("bf16-mixed", fp8_param_gather=True)
    with pytest.raises(LmcalcError, match="needs an fp8 recipe"):
        gpu("fp8-mixed", framework="torchtitan", fp8_param_gather=True)


def test_the_flag_and_the_term(lmcalc_run):
    argv = ["memory", "-m", "llama-3-8b", "--gpus", "8xH100", "--framework", "megatron", "--zero", "1",
            "--precision", "fp8-current", "--fp8-param-gather", "--json"]  # fmt: skip
    data = lmcalc_run(argv).json
    term = data["results"]["total"]["fp8_weights"]
    assert term["value"] == L * LAYER * 2
    assert "the layers' weights, kept in fp8" in term["formula"]
    assert data["inputs"]["framework"]["origin"].endswith("fp8 primary weights")
