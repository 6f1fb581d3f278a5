"""The saved-bytes and step-peak harnesses compute bf16 matrix products in fp32 below autograd
(``hf_saved._Fp32Products``, ``hf_saved.fp32_product``), since a CPU without native bf16 runs torch's bf16 GEMM
10-100 times slower. That must not change what it measures: autograd has to keep the very same tensors as with
torch's own bf16 kernels. Each case here measures a small model both ways and compares every kept storage (its node,
module, shape, dtype and bytes), the per-layer totals and, checkpointed, the rebuilt layer. Mixtral's routing decides
how many tokens each expert keeps, so a product rounded differently would show there first."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import hf_saved  # noqa: E402  (scripts/, on sys.path by conftest.py)
import hf_step_peak  # noqa: E402
import torch  # noqa: E402

pytestmark = pytest.mark.torch

CASES = [
    ("llama-small", "sdpa", False),
    ("llama-small", "sdpa", True),
    ("mixtral-small", "sdpa", False),
    ("gpt2-small", "eager", True),
]


def kept(tensors: list[hf_saved.Kept]) -> list[tuple]:
    return sorted((k.node, k.attr, k.module, k.shape, k.dtype, k.bytes) for k in tensors)


@pytest.mark.parametrize(("name", "attention", "checkpointing"), CASES)
def test_fp32_products_keep_what_bf16_kernels_keep(name: str, attention: str, checkpointing: bool):
    native = hf_saved.measure(name, attention, 128, 2, checkpointing, use_cache=False, fp32_products=False)
    fast = hf_saved.measure(name, attention, 128, 2, checkpointing, use_cache=False, fp32_products=True)
    assert native.total_bytes > 0
    assert kept(fast.tensors) == kept(native.tensors)
    assert fast.per_layer_bytes == native.per_layer_bytes
    assert fast.closure_bytes == native.closure_bytes
    assert (fast.rebuild_new_bytes, kept(fast.rebuild)) == (native.rebuild_new_bytes, kept(native.rebuild))


def test_products_are_computed_in_fp32_and_rounded_once():
    """The mode's product equals the fp32 product rounded to bf16, and autograd under it saves bf16 operands."""
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(16, 32, generator=generator).bfloat16().requires_grad_()
    b = torch.randn(32, 8, generator=generator).bfloat16()
    packed: list[torch.Tensor] = []
    with (
        torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t) or t, lambda t: t),
        hf_saved._Fp32Products(),
    ):
        out = a @ b
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, (a.detach().float() @ b.float()).bfloat16())
    assert packed and all(t.dtype == torch.bfloat16 for t in packed)


@pytest.mark.parametrize(("name", "checkpointing"), [("llama-small", True), ("mixtral-small", False)])
def test_the_step_logs_the_same_storages_with_fp32_products(name: str, checkpointing: bool):
    # the step-peak harness computes the products inside its own dispatch handler, where their fp32 copies are not
    # logged: the peak, the phase it falls in and the gradients' bytes equal those of torch's bf16 kernels
    native = hf_step_peak.measure(name, 128, 2, checkpointing, fp32_products=False)
    fast = hf_step_peak.measure(name, 128, 2, checkpointing, fp32_products=True)
    assert native.peak > 0
    assert fast == native
