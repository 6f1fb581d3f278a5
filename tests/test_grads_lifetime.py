"""When a transformers step holds its gradients, measured whole: the parameters, AdamW's states and every storage the
step makes, the gradients with them, against lmcalc's transformers profile.

transformers' Trainer frees the gradients after each optimizer step (``model.zero_grad()``, set_to_none=True), so a
step of one micro-batch begins its backward with none: autograd makes each ``.grad`` as the backward reaches its
weight, and the loss's backward, where the step peaks, runs beside no gradient at all. With gradient accumulation the
second micro-batch's backward runs beside every gradient of the first. The harness runs a real model (two layers,
bf16, on the CPU, ``scripts/hf_saved.py``) through two such steps with ``torch.optim.AdamW(fused=True)``, the
Trainer's default, and counts every live storage of the second (``lmcalc.measure.StorageTracker``); the H200 rows are
the same steps of Llama 3.2 1B measured with ``torch.cuda.max_memory_allocated`` (docs/bench-results.md).
"""

from __future__ import annotations

import functools

import pytest

from lmcalc.api import memory
from lmcalc.engine.memory.gpu_memory import gpu_memory
from lmcalc.engine.parallel.layout import Layout
from lmcalc.presets import resolve_model
from lmcalc.specs import ModelSpec
from lmcalc.units import GB

TOLERANCE = 0.03

# benchmarks/gpu_truth.py transformers on one NVIDIA H200, torch 2.11.0+cu130, transformers 5.17.0, peft 0.21.0,
# 2026-12-04 (docs/bench-results.md): LlamaForCausalLM built from Llama 3.2 1B's config (tied), and from Llama 3.1 8B's
# widths cut to four layers (untied), random weights in bf16, SDPA, fused AdamW; LoRA r 16 on every linear layer but
# the head (PEFT's fp32 adapters, alpha 32, no dropout). The second step's torch.cuda.max_memory_allocated less the
# rotary table (128 bytes), in bytes: the two cuBLAS workspaces are in it.
H200_STEPS = [  # model, s, b, gradient checkpointing, gradient accumulation steps, LoRA rank, measured bytes
    ("llama-3.2-1b", 512, 1, False, 1, 0, 11_010_669_440),
    ("llama-3.2-1b", 1024, 1, False, 1, 0, 11_010_673_536),
    ("llama-3.2-1b", 2048, 2, False, 1, 0, 20_979_407_744),
    ("llama-3.2-1b", 2048, 2, False, 2, 0, 23_452_085_120),
    ("llama-3.2-1b", 2048, 2, True, 1, 0, 14_125_390_720),
    ("llama-3.2-1b", 2048, 2, True, 2, 0, 16_597_019_520),
    ("llama-3.2-1b", 2048, 2, False, 1, 16, 19_403_167_616),
    ("llama-3.2-1b", 2048, 2, True, 1, 16, 9_281_787_776),
    ("llama-3.2-1b", 4096, 4, True, 2, 16, 29_145_651_072),
    ("llama-3.1-8b-4-layers", 256, 1, False, 1, 0, 15_454_231_808),
    ("llama-3.1-8b-4-layers", 1024, 1, False, 1, 0, 15_460_529_408),
    ("llama-3.1-8b-4-layers", 4096, 2, False, 1, 0, 31_065_720_064),
    ("llama-3.1-8b-4-layers", 4096, 2, False, 2, 0, 34_911_970_560),
    ("llama-3.1-8b-4-layers", 4096, 2, True, 1, 0, 24_753_059_072),
]


def h200_model(name: str) -> ModelSpec:
    if name == "llama-3.1-8b-4-layers":
        return resolve_model("llama-3.1-8b").spec.model_copy(update={"name": name, "num_layers": 4})
    return resolve_model(name).spec


@pytest.mark.parametrize(("model", "seq", "batch", "checkpointing", "accumulate", "rank", "measured"), H200_STEPS)
def test_a_transformers_step_on_an_h200(model, seq, batch, checkpointing, accumulate, rank, measured):
    lora = {"method": "lora", "lora_rank": rank, "lora_targets": "all-linear"} if rank else {}
    estimate = memory(
        model=h200_model(model), gpus="1xH200", framework="transformers", precision="bf16-pure", seq=seq,
        micro_batch=batch, recompute="full" if checkpointing else "none", grad_accum=accumulate, **lora,
    )  # fmt: skip
    allocated = estimate.value("total.allocated")
    assert abs(allocated / measured - 1) < 0.005, f"lmcalc {allocated / GB:.4g} GB, measured {measured / GB:.4g} GB"


def test_without_accumulation_the_peak_holds_no_gradients_on_an_h200():
    # the measured difference between one micro-batch and two accumulated is the gradients: 2 bytes a parameter
    one = {(n, s, b, c): m for n, s, b, c, a, r, m in H200_STEPS if a == 1 and not r}
    two = {(n, s, b, c): m for n, s, b, c, a, r, m in H200_STEPS if a == 2 and not r}
    assert len(two) == 3
    for key, accumulated in two.items():
        params = 1_235_814_400 if key[0] == "llama-3.2-1b" else 4 * 218_112_000 + 2 * 128_256 * 4096 + 4096
        assert accumulated - one[key] == pytest.approx(2 * params, rel=0.001)


pytest.importorskip("torch")
pytest.importorskip("transformers")

import hf_saved  # noqa: E402  (scripts/, put on sys.path by conftest.py)
import torch  # noqa: E402
from test_framework_transformers import Case, workload  # noqa: E402

from lmcalc.measure import StorageTracker, optimizer_state_tensors  # noqa: E402

pytestmark = pytest.mark.torch


def _trainer_step(model, optimizer, ids, accumulate: int) -> None:
    """What the Trainer runs for one optimizer step: ``accumulate`` forwards and backwards, the step, zero_grad."""
    for _ in range(accumulate):
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        del loss
    optimizer.step()
    model.zero_grad()  # set_to_none=True, as the Trainer's


class _Fp32ProductsTracker(StorageTracker):
    """StorageTracker with bf16 products computed in fp32 inside its handler (``hf_saved.fp32_product``): their fp32
    copies are never tracked, and each product's one bf16 output is (tests/test_hf_saved_products.py)."""

    def run(self, func, args: tuple, kwargs: dict):
        return hf_saved.fp32_product(func, args, kwargs)


@functools.cache
def measured(case: Case, accumulate: int) -> int:
    """Bytes live at the second step's peak: parameters, AdamW's states and every storage the step makes."""
    model = hf_saved.build_model(case.name, case.attention, dropout=case.dropout)
    if case.checkpointing:
        hf_saved._enable_checkpointing(model)
    try:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
        torch.manual_seed(1)
        ids = torch.randint(0, model.config.get_text_config().vocab_size, (case.micro_batch, case.seq_len))
        _trainer_step(model, optimizer, ids, accumulate)  # makes AdamW's states
        tracker = _Fp32ProductsTracker([*model.parameters(), *optimizer_state_tensors(optimizer, torch.device("cpu"))])
        with tracker:
            _trainer_step(model, optimizer, ids, accumulate)
        return tracker.peak()
    finally:
        if case.checkpointing:
            hf_saved._disable_checkpointing(model)
        model.zero_grad()


def lmcalc_allocated(case: Case, accumulate: int) -> float:
    """lmcalc's allocated peak on one device, without the cuBLAS workspaces a CPU does not have."""
    w = workload(case)
    return gpu_memory(w, Layout(grad_accum=accumulate), 0).allocated - w.framework.buffers.workspace_bytes


CPU_CASES = [
    Case(name, "sdpa", checkpointing, 256, 2, 0.0 if name.startswith("gpt2") else None)
    for name in ("llama-small", "gpt2-small")  # RMSNorm and SwiGLU; LayerNorm, GELU, a fused QKV and a tied head
    for checkpointing in (False, True)
]


# Two micro-batches (10 to 16 s a case on two cores) on one checkpointing mode of each family: Llama without, GPT-2 with
ACCUMULATED = [(case, 1) for case in CPU_CASES] + [(CPU_CASES[0], 2), (CPU_CASES[3], 2)]


@pytest.mark.parametrize(("case", "accumulate"), ACCUMULATED, ids=lambda v: v.id if isinstance(v, Case) else str(v))
def test_a_transformers_step_holds_the_gradients_it_has_made(case: Case, accumulate: int):
    m, ours = measured(case, accumulate), lmcalc_allocated(case, accumulate)
    assert abs(ours / m - 1) < TOLERANCE, f"{case.id}, accumulate {accumulate}: {ours / m - 1:+.2%}"


@pytest.mark.parametrize("case", CPU_CASES[:2], ids=lambda c: c.id)
def test_counting_every_gradient_at_the_loss_would_be_off(case: Case):
    # the rule the measurement rejects: gradients there from the start of a one-micro-batch step's backward
    w = workload(case)
    gpu = gpu_memory(w, Layout(), 0)
    every_gradient = gpu.allocated + gpu.grads_unmade - w.framework.buffers.workspace_bytes
    assert gpu.grads_unmade == gpu.grads  # the loss's backward binds, before any gradient exists
    assert every_gradient / measured(case, 1) - 1 > 2 * TOLERANCE
