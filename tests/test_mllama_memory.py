"""Llama 3.2 Vision's text model (MllamaForCausalLM) trained on text, against transformers 5.24 and PEFT on the CPU.

A step of text skips the cross-attention layers (MllamaTextModel runs one only with image states or their cache): they
keep no activations, and autograd makes no gradient for their weights, nor, under LoRA, for their adapters; PyTorch's
AdamW makes states only for a parameter with a gradient. The weights are held all the same. ``scripts/hf_saved.py``'s
``mllama-small`` (a self-attention layer, a cross-attention layer, a self-attention layer; h 128) is measured four
ways, each against the transformers profile:

* the bytes autograd keeps for backward (saved-tensor hooks), with and without checkpointing, fully trained and under
  PEFT's LoRA: within 5 %;
* the step's peak beyond the model states (the storage timeline of ``scripts/hf_step_peak.py``): within 3 %;
* the model states after a real ``torch.optim.AdamW`` step: weights, gradients and the optimizer's two moments, to the
  byte.
"""

from __future__ import annotations

import functools

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

import hf_saved  # noqa: E402  (scripts/, on sys.path by conftest.py)
import hf_step_peak  # noqa: E402
import torch  # noqa: E402

from lmcalc.engine.finetune.method import FULL, Method, parse_targets  # noqa: E402
from lmcalc.engine.memory.gpu_memory import gpu_memory, stage_activations  # noqa: E402
from lmcalc.engine.parallel.layout import Layout  # noqa: E402
from lmcalc.engine.workload import Workload  # noqa: E402
from lmcalc.hf_config import model_from_hf_config  # noqa: E402
from lmcalc.presets import resolve_precision  # noqa: E402
from lmcalc.specs import ModelSpec  # noqa: E402

pytestmark = pytest.mark.torch

CASE = "mllama-small"
SAVED_TOLERANCE = 0.05  # issue #31's targets
PEAK_TOLERANCE = 0.03
PRECISION = resolve_precision("bf16-pure").spec
RANK = 8
POINTS = [(128, 1), (256, 2)]  # (sequence length, micro-batch)


@functools.cache
def spec() -> ModelSpec:
    config = hf_saved.CASES[CASE].config()
    return ModelSpec.model_validate(model_from_hf_config(config.to_dict(), CASE, f"hf_saved.CASES[{CASE!r}]"))


def workload(seq: int, batch: int, checkpointing: bool, attention: str = "sdpa", method: Method = FULL) -> Workload:
    return hf_step_peak.harness_workload(spec(), PRECISION, seq, batch, checkpointing, attention, method)


def lora(targets: str) -> dict:
    return {"r": RANK, "lora_alpha": 2 * RANK, "lora_dropout": 0.0,
            "target_modules": targets if targets == "all-linear" else targets.split(",")}  # fmt: skip


def test_the_small_model_is_two_self_attention_layers_and_an_idle_one():
    # the premise: lmcalc's layers are the two that attend to the text, the cross-attention one held apart
    assert spec().num_layers == 2 and spec().cross_attention is not None and spec().cross_attention.layers == 1


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("checkpointing", [False, True], ids=["nockpt", "ckpt"])
@pytest.mark.parametrize("point", POINTS, ids=[f"s{s}-b{b}" for s, b in POINTS])
def test_bytes_kept_for_backward_match_transformers(point, checkpointing, attention):
    # hf_saved measures four layers, the skipped one keeping nothing; lmcalc's two layers are the ones that ran
    seq, batch = point
    m = hf_saved.measure(CASE, attention, seq, batch, checkpointing, use_cache=False)
    assert 1 not in m.per_layer_bytes  # the cross-attention layer kept nothing: it never ran
    acts = stage_activations(workload(seq, batch, checkpointing, attention), Layout(), 0)
    measured = m.total_bytes + m.closure_bytes + m.rebuild_new_bytes
    assert abs(acts.with_rebuilt / measured - 1) < SAVED_TOLERANCE, (
        f"measured {measured:,}, lmcalc {acts.with_rebuilt:,}"
    )
    if checkpointing:
        assert abs(acts.rebuilt / m.rebuild_new_bytes - 1) < SAVED_TOLERANCE


@pytest.mark.parametrize("targets", ["all-linear", "q_proj,v_proj"])
@pytest.mark.parametrize("checkpointing", [False, True], ids=["nockpt", "ckpt"])
def test_peft_lora_keeps_what_lmcalc_counts(targets, checkpointing):
    # PEFT puts adapters on the cross-attention layer's projections too (its q_proj ... down_proj): they never run
    hf_saved.release_models()  # a model built afresh: an earlier checkpointed run leaves its embedding's output
    # requiring a gradient (transformers' enable_input_require_grads), and the lowest norm then keeps its input
    m = hf_saved.measure(CASE, "sdpa", 256, 2, checkpointing, use_cache=False, lora=lora(targets))
    method = Method("lora", RANK, parse_targets(targets), fp32_adapters=False)  # bf16 adapters, as measured
    measured = m.total_bytes + m.closure_bytes + m.rebuild_new_bytes
    ours = stage_activations(workload(256, 2, checkpointing, method=method), Layout(), 0).with_rebuilt
    assert abs(ours / measured - 1) < SAVED_TOLERANCE, f"measured {measured:,} B, lmcalc {ours:,.0f} B"


@pytest.mark.parametrize("mode", [None, *hf_step_peak.LORA_MODES])
@pytest.mark.parametrize("checkpointing", [False, True], ids=["nockpt", "ckpt"])
def test_the_step_peaks_where_lmcalc_says(mode, checkpointing):
    fp32_adapters, autocast, _ = hf_step_peak.LORA_MODES[mode] if mode else (True, False, "")
    hf_saved.release_models()  # afresh, as above
    m = hf_step_peak.measure(CASE, 256, 2, checkpointing, "sdpa", hf_step_peak.LORA if mode else None, None,
                             fp32_adapters, autocast)  # fmt: skip
    ours, phase = hf_step_peak.lmcalc_peak(CASE, 256, 2, checkpointing, "sdpa", mode)
    assert abs(ours / m.peak - 1) < PEAK_TOLERANCE, f"measured {m.peak:,} B ({m.phase}), lmcalc {ours:,.0f} ({phase})"


def torch_states(targets: str | None, fp32_adapters: bool) -> tuple[int, int, int]:
    """One real step of the small model (fully trained, or under PEFT's LoRA on ``targets``) and AdamW's step: bytes
    of the weights, of the gradients autograd made and of AdamW's exp_avg and exp_avg_sq."""
    model = hf_saved.build_model(CASE, "sdpa")
    if targets is not None:
        model = hf_saved._with_lora(model, lora(targets), fp32_adapters)
    try:
        trained = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(trained, lr=1e-4)
        ids = torch.randint(0, model.config.get_text_config().vocab_size, (1, 64))
        model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
        optimizer.step()
        weights = sum(p.numel() * p.element_size() for p in model.parameters())
        grads = sum(p.grad.numel() * p.grad.element_size() for p in trained if p.grad is not None)
        moments = sum(
            state[k].numel() * state[k].element_size()
            for state in optimizer.state.values()
            for k in ("exp_avg", "exp_avg_sq")
        )
        return weights, grads, moments
    finally:
        model.zero_grad(set_to_none=True)
        hf_saved.release_models()


@pytest.mark.parametrize(
    ("targets", "fp32_adapters"), [(None, False), ("all-linear", False), ("all-linear", True), ("q_proj,v_proj", True)]
)
def test_model_states_equal_pytorchs(targets, fp32_adapters):
    # the weights every layer holds; gradients and AdamW's moments for what the step computed alone
    weights, grads, moments = torch_states(targets, fp32_adapters)
    method = FULL if targets is None else Method("lora", RANK, parse_targets(targets), fp32_adapters=fp32_adapters)
    kept = gpu_memory(workload(64, 1, False, method=method), Layout(), 0).kept
    assert (kept.params, kept.grads, kept.optimizer) == (weights, grads, moments)
