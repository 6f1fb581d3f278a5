"""Training memory of Inkling 2's looped model (``engine.memory.inkling2_loop``; transformers 5.24's
`inkling2_loop_text`): each pass of the looped section after the first restarts from the section's input and reads the
previous pass's messages, four a run, mixed into Q's, K's, V's and the MLP's inputs by four gates. Derived by hand at
Inkling2LoopTextConfig's defaults, then against transformers on the CPU (``scripts/hf_saved.py``'s inkling2-loop-small:
layers 0 and 1, a section of layers 2 and 3 run twice, layer 4; eager; bf16, and once fp32): the bytes saved for
backward within 5 % (to the byte but the harness's Python scalars; under PEFT's LoRA +0.37 %; the checkpointed
forward +0.75 %; a later pass's rebuilt layer, replayed on its own call, to the byte), the step's peak
(``scripts/hf_step_peak.py``) within 3 %: without checkpointing at the loss's backward, checkpointed in the rebuild of
the last pass's last run, every message residual alive (+0.44 %, LoRA −0.62 %)."""

from __future__ import annotations

from functools import partial

import pytest
from saved_compare import assert_eager_step_peak, hf_spec, takes_memory_lora_and_plan, transformers_workload

from lmcalc.engine.memory.inkling2 import final_residual_saved, message_residual_saved
from lmcalc.engine.memory.inkling2_loop import (
    block_storages,
    freed_before_later_runs,
    gates_saved,
    last_later_run,
    message_states,
    run_variants,
)

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
    # the backward rebuilds the last pass's last run (41: layer 17, global) first of the later ones; by then the six
    # layers after the section have freed their inputs and the stack of 4 blocks only they read
    assert last_later_run(spec) == 6 + 3 * 12 - 1 == 41 and spec.is_local_layer(41) is False
    assert block_storages(spec, 41) == 16 and freed_before_later_runs(spec) == 6 + 4


def test_memory_lora_and_plan_take_it(tmp_path):
    # twelve layers, a section of 6 to 11 run twice, 16 experts
    _, best = takes_memory_lora_and_plan(tmp_path, "inkling2_loop_text", 2048,
                                         {"num_hidden_layers": 12, "loop_layer_index_end": 12, "loop_num_passes": 2,
                                          "n_routed_experts": 16})  # fmt: skip
    assert (best.layout.tp, best.layout.cp) == (1, 1)


pytest.importorskip("torch")
pytest.importorskip("transformers")

import hf_saved  # noqa: E402  (scripts/, on sys.path by conftest.py; imports torch and transformers)
import torch  # noqa: E402
from saved_compare import LORA, assert_saved_match, harness_workload  # noqa: E402

from lmcalc.engine.memory.activations import layer_saved_tensors  # noqa: E402
from lmcalc.engine.memory.gpu_memory import gpu_memory, stage_activations  # noqa: E402
from lmcalc.engine.parallel.layout import Layout  # noqa: E402

workload_of = partial(harness_workload, "inkling2_loop_text")  # scripts/hf_saved.py's case, read as lmcalc reads it


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
    ("inkling2-loop-small", True, False),
    ("inkling2-loop-small", True, True),
]
"""Without checkpointing the step binds at the loss's backward: +0.15 %, LoRA +0.51 %. Checkpointed it binds as the
backward rebuilds the second pass's layer 3, at its experts' fp32 combine, every message residual alive: measured
31,457,064 B, lmcalc 31,596,304 (+0.44 %: the token ids, which the log does not see, and the section's input, which
both passes share and lmcalc counts a run); LoRA 29,202,216 B, lmcalc 29,021,968 (−0.62 %)."""


@pytest.mark.torch
@pytest.mark.parametrize(("name", "checkpointing", "lora"), PEAKS)
def test_the_step_peak_matches_transformers(name, checkpointing, lora):
    assert_eager_step_peak("inkling2_loop_text", name, checkpointing, lora)


def test_the_later_rebuild_by_hand():
    # inkling2-loop-small checkpointed, s 256, b 2, bf16: T = s·b = 512, h 128, 4 experts top 2, kernel 4; runs 0, 1,
    # 2, 3, 2', 3', 4 (blocks of two: layers 0, 2 and 4 open one). The backward rebuilds 3' (global) after layer 4:
    T, h, k, E, b, s, K = 512, 128, 2, 4, 2, 256, 4
    w = workload_of("inkling2-loop-small", s, b, True, "eager")
    t = gpu_memory(w, Layout(), 0).transients
    # held past the head: both later runs' message residuals, one state each (the first pass's output), four queries:
    # the fp32 stack, 1/rms, the normalised stack, the probabilities, and the four fp32 messages; less layer 4's
    # checkpointed input, freed (no stack of blocks is layer 4's alone: it reads 3's)
    residual = 4 * T * h + 4 * T + 4 * T * h + 4 * T * 4
    assert t.held == 2 * (residual + 4 * 4 * T * h) - 2 * T * h == 3_035_136
    # at the experts' combine: the weighted outputs and their copy in the tokens' order (2 × 4·k·T·h), the router's
    # logits (4·T·E), the scaled weights, the sorted ids and their fp32 copy (16·k·T), the MoE's input (2·T·h), the
    # fp32 residual (4·T·h); layer 3 opens no block
    assert t.forward == 2 * 4 * k * T * h + 4 * T * E + 16 * k * T + 2 * T * h + 4 * T * h == 1_466_368
    # the gradients alive: of the stack of 2 blocks that 3' and layer 4 read (d_a), two fp32 copies of the output's,
    # and the MLP-output convolution's padded to s + K − 1
    assert t.output_gradient == 2 * 2 * T * h + 2 * 4 * T * h + 4 * b * h * (s + K - 1) == 1_051_648


def _replayed_calls(layers: tuple[int, ...]) -> dict[int, list[int]]:
    """Bytes each call of the small model's ``layers`` keeps, each replayed standalone on that call's own arguments
    (``hf_saved._rebuild_layer``, which ``hf_saved.measure`` runs on a layer's first call alone), new beside them."""
    model = hf_saved.build_model("inkling2-loop-small", "eager", torch.bfloat16)
    decoder = hf_saved._decoder_layers(model)
    calls: dict[int, list[dict]] = {i: [] for i in layers}
    hooks = [decoder[i].register_forward_pre_hook(lambda _m, a, kw, i=i: calls[i].append({"args": a, "kwargs": kw}),
                                                  with_kwargs=True) for i in layers]  # fmt: skip
    ids = torch.randint(0, 2000, (2, 256), generator=torch.Generator().manual_seed(1))
    try:
        with hf_saved._Fp32Products():
            model(input_ids=ids, labels=ids, use_cache=False)
            for hook in hooks:
                hook.remove()
            exclude = hf_saved._exclude(model)
            return {i: [hf_saved._rebuild_layer(model, decoder[i], call, exclude)[2] for call in calls[i]]
                    for i in layers}  # fmt: skip
    finally:
        for hook in hooks:
            hook.remove()


@pytest.mark.torch
def test_a_later_pass_rebuilt_layer_matches_transformers():
    # the layer lmcalc rebuilds is the largest run, a later pass's global one: layer 3's second call, its messages
    # alive already (the message residual made them outside the layer); a later local one is layer 2's second call
    hf_saved.release_models()
    w = workload_of("inkling2-loop-small", 256, 2, True, "eager")
    replayed = _replayed_calls((2, 3))
    assert replayed[3][1] == stage_activations(w, Layout(), 0).rebuilt == 22_622_992
    assert replayed[2][1] == sum(t.bytes for t in layer_saved_tensors(w, True, "local")) == 19_317_520
