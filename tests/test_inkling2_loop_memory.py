"""Training memory of Inkling 2's looped model (``engine.memory.inkling2_loop``; transformers 5.24's
`inkling2_loop_text`): each pass of the looped section after the first restarts from the section's input and reads the
previous pass's messages, four a run, mixed into Q's, K's, V's and the MLP's inputs by four gates. Derived by hand at
Inkling2LoopTextConfig's defaults, then against transformers on the CPU (``scripts/hf_saved.py``'s inkling2-loop-small:
layers 0 and 1, a section of layers 2 and 3 run twice, layer 4; eager; bf16, and once fp32): the bytes saved for
backward within 5 % (to the byte but the harness's Python scalars; under PEFT's LoRA +0.37 %; the checkpointed
forward +0.75 %), the step's peak (``scripts/hf_step_peak.py``) within 3 % without checkpointing; checkpointed it
binds in a later pass's backward, 7 % to 9 % above lmcalc's (strict xfails)."""

from __future__ import annotations

from functools import partial

import pytest
from saved_compare import hf_spec, takes_memory_lora_and_plan, transformers_workload

from lmcalc.engine.memory.inkling2 import final_residual_saved, message_residual_saved
from lmcalc.engine.memory.inkling2_loop import block_storages, gates_saved, message_states, run_variants

DEFAULTS = {"model_type": "inkling2_loop_text"}  # 24 layers, a section of 6 to 17 run in 3 passes: 48 runs
spec_of = partial(hf_spec, model_type="inkling2_loop_text")


def test_the_loop_by_hand():
    # Inkling2LoopTextConfig's defaults, s = 2,048, b = 1, bf16 (2 B): h 2,304, the gates' rank r 64, blocks of 6
    s, h, r = 2048, 2304, 64
    T = s
    spec = spec_of(DEFAULTS)
    w = transformers_workload(spec, s, 1)
    variants = run_variants(spec)
    assert variants.count("plain") == 12 and variants.count("first") == 12 and variants.count("later") == 24
    # a gate: the forget tanh, 1 − it and the message tanh (fp32), two 1/rms, down's input (2·h, cast) and output (r)
    gate = 3 * 4 * T * h + 2 * 4 * T + 2 * 2 * T * h + 4 * T * r
    # beside the four gates: the MLP gate's output (the MLP norm's input now), and the Q, K and V gates' inputs that
    # the norms kept in the first pass: a local layer's one block-residual output, a global one's three
    assert sum(t.bytes for t in gates_saved(w, "local")) == 4 * gate + 4 * T * h + 4 * T * h == 341_901_312
    assert sum(t.bytes for t in gates_saved(w, "global")) == 4 * gate + 4 * T * h + 3 * 4 * T * h == 379_650_048
    # each later run's message residual: four queries over the previous pass's blocks 12 (its section opens blocks at
    # 6 and 12; the one at 6 is the section's input, skipped) and its output: m = 2; then its four messages (fp32)
    m = 2
    assert message_states(spec) == m
    residual = 4 * T * m * h + 4 * T * m + 4 * T * m * h + 4 * T * 4 * m
    assert sum(t.bytes for t in message_residual_saved(w)) == 24 * (residual + 4 * 4 * T * h) == 3_625_844_736
    # the final block residual reads the held layers' 4 blocks and the last output, not the 48 runs'
    assert sum(t.bytes for t in final_residual_saved(w)) == 8 * T * 5 * h + 4 * T * 5 + 4 * T * 5
    # checkpointed, the stacks of blocks the runs read: 1 (layers 1-6), 2 and 3 in each of the 3 passes (each its own
    # torch.cat from the stack before the section), 3 read again and 4 after the section: 20 states of s·h
    assert block_storages(spec) == 1 + 3 * (2 + 3) + 4 == 20


def test_memory_lora_and_plan_take_it(tmp_path):
    # twelve layers, a section of 6 to 11 run twice, 16 experts
    _, best = takes_memory_lora_and_plan(tmp_path, "inkling2_loop_text", 2048,
                                         {"num_hidden_layers": 12, "loop_layer_index_end": 12, "loop_num_passes": 2,
                                          "n_routed_experts": 16})  # fmt: skip
    assert (best.layout.tp, best.layout.cp) == (1, 1)


pytest.importorskip("torch")
pytest.importorskip("transformers")

import hf_saved  # noqa: E402  (scripts/, on sys.path by conftest.py; imports torch and transformers)
import hf_step_peak  # noqa: E402
import torch  # noqa: E402
from saved_compare import LORA, assert_peak_match, assert_saved_match, harness_workload  # noqa: E402

from lmcalc.engine.memory.gpu_memory import gpu_memory, stage_activations  # noqa: E402
from lmcalc.engine.parallel.layout import Layout  # noqa: E402

workload_of = partial(harness_workload, "inkling2_loop_text")  # scripts/hf_saved.py's case, read as lmcalc reads it


@pytest.fixture(scope="module", autouse=True)
def free_models():
    yield
    hf_saved.release_models()


SAVED = [
    ("inkling2-loop-small", 128, 1, False, False, torch.bfloat16),
    ("inkling2-loop-small", 256, 2, False, True, torch.bfloat16),
    ("inkling2-loop-small", 256, 2, False, False, torch.float32),
]
"""Each layer to the byte (layers 2 and 3 both runs); the message residuals and messages outside them to the byte."""


@pytest.mark.torch
@pytest.mark.parametrize(("name", "seq", "batch", "checkpointing", "lora", "dtype"), SAVED)
def test_bytes_kept_for_backward_match_transformers(name, seq, batch, checkpointing, lora, dtype):  # noqa: PLR0913
    hf_saved.release_models()
    m = hf_saved.measure(name, "eager", seq, batch, checkpointing, dtype=dtype, use_cache=False,
                         lora=LORA if lora else None)  # fmt: skip
    w = workload_of(name, seq, batch, checkpointing, "eager", lora, dtype == torch.float32)
    assert_saved_match(m, stage_activations(w, Layout(), 0), checkpointing)


@pytest.mark.torch
def test_the_checkpointed_forward_matches_transformers():
    # the harness replays a layer's first call, a first pass's; lmcalc's rebuilt layer is a later pass's (the first
    # pass's and the gates', each to the byte in the runs above), so the forward alone is compared: +0.75 %, the
    # section's input, which every pass starts from, counted once a run (d_a·s·b·h a later pass)
    hf_saved.release_models()
    m = hf_saved.measure("inkling2-loop-small", "eager", 128, 1, True, use_cache=False)
    acts = stage_activations(workload_of("inkling2-loop-small", 128, 1, True, "eager"), Layout(), 0)
    assert acts.total - (m.total_bytes + m.closure_bytes) == pytest.approx(2 * 128 * 128, abs=16)


PEAKS = [
    ("inkling2-loop-small", False, False),
    ("inkling2-loop-small", False, True),
    pytest.param("inkling2-loop-small", True, False, marks=pytest.mark.xfail(strict=True, reason=(
        "measured 31,457,064 B in the backward, lmcalc 29,216,528 B (-7.12 %): what a later pass's backward holds "
        "beside its rebuilt layer (its messages' and the previous pass's gradients) is not modelled"))),
    pytest.param("inkling2-loop-small", True, True, marks=pytest.mark.xfail(strict=True, reason=(
        "measured 29,202,216 B in the backward, lmcalc 26,642,192 B (-8.77 %), as the checkpointed step without "
        "LoRA"))),
]  # fmt: skip
"""Without checkpointing the step binds at the loss's backward: +0.15 %, LoRA +0.51 %."""


@pytest.mark.torch
@pytest.mark.parametrize(("name", "checkpointing", "lora"), PEAKS)
def test_the_step_peak_matches_transformers(name, checkpointing, lora):
    hf_saved.release_models()
    m = hf_step_peak.measure(name, 256, 2, checkpointing, "eager", lora=LORA if lora else None, fp32_adapters=False)
    assert_peak_match(m, gpu_memory(workload_of(name, 256, 2, checkpointing, "eager", lora), Layout(), 0))
