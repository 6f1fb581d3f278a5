"""Training memory of CPM-Ant (``engine.memory.prompt_prefix``): every layer over the prompt's P tokens and the text's
s, CpmAntAttention's two masked_fills and its probabilities kept twice, CpmAntLayerNorm's product with its input, the
score bias's bucket indices and its own bf16 loss; derived by hand at CpmAntConfig's defaults, then against
transformers 5.24 on the CPU (``scripts/hf_saved.py``'s cpmant-small and cpmant-wide, two layers, its own eager
attention, built in bf16, which transformers trains on the CPU, and once in fp32): the bytes saved for backward
within 5 % (the whole, a layer, the checkpointed forward and the rebuilt layer), the step's peak
(``scripts/hf_step_peak.py``) within 3 %, with and without gradient checkpointing (a checkpoint around each block,
which transformers' own class declines: ``hf_saved.checkpointable_blocks``), fully trained and under PEFT's LoRA."""

from __future__ import annotations

from functools import partial

import pytest
from saved_compare import (
    assert_eager_step_peak,
    assert_refused_in_one_line,
    hf_spec,
    takes_memory_lora_and_plan,
    transformers_workload,
)

from lmcalc import api
from lmcalc.engine.memory.activations import layer_saved_tensors
from lmcalc.engine.memory.outside_layers import model_saved_tensors
from lmcalc.errors import LmcalcError

spec_of = partial(hf_spec, model_type="cpmant")
DEFAULTS = {"model_type": "cpmant"}  # h 4,096, 32 heads of 128, f 10,240, P 32, V 30,720, 48 layers


def test_a_layer_and_the_rest_by_hand():
    # CpmAntConfig's defaults at s = 992, b = 1, bf16 (2 B), eager: S = s + P = 1,024 tokens in every layer.
    # Each CpmAntLayerNorm: pow keeps an fp32 copy (4·S·h), rsqrt's 1/rms (4·S), the product with 1/rms the bf16
    # input (2·S·h), the weight's product the normalised value (2·S·h). Attention: the projections' input (2·S·h),
    # Q, K and V copied by the batched matmuls (3 × 2·S·H·d, H·d = h), the softmax in bf16 (2·H·S²), the
    # probabilities masked again, which meet V (2·H·S²), the two masked_fills' booleans (2·S²), attention_out's input
    # (2·S·h). The GeGLU: its input (2·S·h), w_0's and w_1's outputs, GELU's output and their product (4 × 2·S·f).
    S, s, h, f, H, V = 1024, 992, 4096, 10240, 32, 30720
    norm = 4 * S * h + 4 * S + 2 * S * h + 2 * S * h
    attention = 2 * S * h + 3 * 2 * S * h + 2 * H * S * S + 2 * H * S * S + 2 * S * S + 2 * S * h
    ffn = 2 * S * h + 4 * 2 * S * f
    assert 2 * norm + attention + ffn == 28 * S * h + 8 * S + 8 * S * f + 4 * H * S * S + 2 * S * S == 337_649_664
    w = transformers_workload(spec_of(DEFAULTS), s, 1)
    assert sum(t.bytes for t in layer_saved_tensors(w, False)) == 337_649_664
    # outside: int32 token and segment ids over S (2·4·S), int64 targets over s (8·s), the bias's int32 buckets
    # (4·S²), the final norm over S, the head's input (one sequence: a view keeping the norm's S rows, 2·S·h) and the
    # log-probabilities in bf16 (2·s·V)
    outside = 8 * S + 8 * s + 4 * S * S + norm + 2 * S * h + 2 * s * V
    assert outside == 107_106_048
    assert sum(t.bytes for t in model_saved_tensors(w)) == outside
    # two sequences: the head reads a copy of the text's rows, 2·s·b·h, not the norm's S rows
    w2 = transformers_workload(spec_of(DEFAULTS), s, 2)
    head = next(t for t in model_saved_tensors(w2) if t.label == "output head input")
    assert head.bytes == 2 * s * 2 * h
    # in fp32 the norm's copy is its input (x.float() is x): 4·S·h + 4·S + 4·S·h a norm, no more
    fp32 = transformers_workload(spec_of(DEFAULTS), s, 1, precision="fp32")
    kept = [t for t in layer_saved_tensors(fp32, False) if t.label.startswith("attention norm")]
    assert sum(t.bytes for t in kept) == 8 * S * h + 4 * S


def test_memory_lora_and_plan_take_it_and_tp_cp_pp_are_refused(tmp_path):
    path, best = takes_memory_lora_and_plan(tmp_path, "cpmant", 2048)
    assert best.layout.tp == best.layout.cp == best.layout.pp == 1
    refusals = {"tp": "TP=2 would split", "cp": "CP=2 would split", "pp": "modelled on one pipeline stage"}
    assert_refused_in_one_line(path, 2048, refusals)
    with pytest.raises(LmcalcError, match="freeze on .*score bias"):
        api.memory(model=path, gpus="1xh100", seq=2048, method="freeze", freeze_layers=4)


pytest.importorskip("torch")
pytest.importorskip("transformers")

import hf_saved  # noqa: E402  (scripts/, on sys.path by conftest.py; imports torch and transformers)
import torch  # noqa: E402
from saved_compare import LORA, assert_saved_match, harness_workload  # noqa: E402

from lmcalc.engine.memory.gpu_memory import stage_activations  # noqa: E402
from lmcalc.engine.parallel.layout import Layout  # noqa: E402

workload_of = partial(harness_workload, "cpmant")  # scripts/hf_saved.py's cases, read as lmcalc reads them


SAVED = [("cpmant-small", 128, 1, False, False, torch.bfloat16), ("cpmant-small", 256, 2, True, True, torch.bfloat16)]
SAVED += [("cpmant-small", 256, 2, False, True, torch.bfloat16), ("cpmant-wide", 256, 2, True, False, torch.bfloat16)]
SAVED += [("cpmant-small", 256, 2, False, False, torch.float32)]


@pytest.mark.torch
@pytest.mark.parametrize(("name", "seq", "batch", "checkpointing", "lora", "dtype"), SAVED)
def test_bytes_kept_for_backward_match_transformers(name, seq, batch, checkpointing, lora, dtype):  # noqa: PLR0913
    m = hf_saved.measure(name, "eager", seq, batch, checkpointing, dtype=dtype, use_cache=False,
                         lora=LORA if lora else None)  # fmt: skip
    w = workload_of(name, seq, batch, checkpointing, lora=lora, fp32=dtype == torch.float32)
    layer = None if lora else sum(t.bytes for t in layer_saved_tensors(w, False))
    assert_saved_match(m, stage_activations(w, Layout(), 0), checkpointing, layer)


@pytest.mark.torch
@pytest.mark.parametrize(("name", "checkpointing", "lora"),
                         [("cpmant-small", False, False), ("cpmant-wide", False, False), ("cpmant-wide", True, False),
                          ("cpmant-wide", True, True)])  # fmt: skip
def test_the_step_peak_matches_transformers(name, checkpointing, lora):
    # s 256, b 2. cpmant-small's vocabulary binds at the loss's backward (its bf16 log-probabilities and their two
    # gradients); cpmant-wide's at the forward's end (measured) and the final norm's backward (lmcalc), or
    # checkpointed, at the first layer's backward, the bias's gradient beside it
    assert_eager_step_peak("cpmant", name, checkpointing, lora)
