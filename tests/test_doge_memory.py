"""Training memory of Doge's dynamic mask attention and residual scales (``engine.memory.dynamic_mask``): the terms
derived by hand at DogeConfig's defaults, then against transformers 5.24 on the CPU (``scripts/hf_saved.py``'s
doge-small, doge-mha and doge-wide, two layers, eager attention, built in bf16, which transformers trains on the CPU):
the bytes saved for backward within 5 % (the whole, a layer, the checkpointed forward and the rebuilt layer), the
step's peak (``scripts/hf_step_peak.py``) within 3 %, with and without gradient checkpointing, fully trained and
under PEFT's LoRA on every linear layer (dt_proj included)."""

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

from lmcalc.engine.memory.dynamic_mask import dynamic_mask_saved, residual_scale_saved
from lmcalc.presets import resolve_precision

DEFAULTS = {"model_type": "doge"}  # DogeConfig's defaults: h 1024, 8 heads of 128 and 8 KV heads, k = 2,048
BF16 = resolve_precision("bf16-pure").spec  # the harness builds the model in bf16: no fp32 copies


spec_of = partial(hf_spec, model_type="doge")
workload = transformers_workload


def test_the_mask_and_the_residual_scales_by_hand():
    # DogeConfig's defaults at s = 4,096, b = 1, bf16 (2 B), eager: H = H_kv = 8, d = 128, k = 2,048 < s.
    # dt = exp(A·softplus(dt_proj(V))): softplus's input and exp's output (2·s·b·H_kv), softplus's output for A's
    # gradient (s·b·H_kv); masked_fill keeps the causal mask's booleans (b·s², 1 B) and, s being past k, those of the
    # keys outside each query's top k (b·H_kv·s²). dt_proj's input is V itself (every head its own KV head, one
    # sequence: eager attention's V is a view of v_proj's output). Each residual scale keeps its half's input, which
    # the bf16 norm does not (it keeps an fp32 copy): 2 × s·b·h.
    s, h, Hkv = 4096, 1024, 8
    mask = 2 * (2 * s * Hkv) + 2 * (s * Hkv) + s * s + Hkv * s * s
    residuals = 2 * (2 * s * h)
    assert mask == 131_072 + 65_536 + 16_777_216 + 134_217_728 == 151_191_552
    w = workload(spec_of(DEFAULTS), s, 1)
    assert sum(t.bytes for t in dynamic_mask_saved(w)) == mask
    assert sum(t.bytes for half in ("attention", "mlp") for t in residual_scale_saved(w, half)) == residuals
    # two sequences: eager attention folds the batch into the heads and copies V, so dt_proj keeps v_proj's output,
    # s·b·H_kv·d = 8,192 × 1,024 at 2 B, beside twice the rest
    w2 = workload(spec_of(DEFAULTS), s, 2)
    assert sum(t.bytes for t in dynamic_mask_saved(w2)) == 2 * mask + 2 * (2 * s * Hkv * 128)
    # a fused kernel (SDPA) is given the mask as a bias of every head, which it keeps: b·H·s² at 2 B
    fused = workload(spec_of(DEFAULTS), s, 1, attention="flash")
    assert sum(t.bytes for t in dynamic_mask_saved(fused)) == mask + 2 * 8 * s * s
    # within the window no key is dropped: no top-k booleans
    assert sum(t.bytes for t in dynamic_mask_saved(workload(spec_of(DEFAULTS), 2048, 1))) == (
        2 * 3 * 2048 * Hkv + 2048 * 2048
    )
    # in fp32 the norm's copy is the input itself (x.float() is x): the residual scales keep nothing more
    fp32 = workload(spec_of(DEFAULTS), s, 1, precision="fp32")
    assert residual_scale_saved(fp32, "attention") == []


def test_memory_lora_and_plan_take_it_and_tp_cp_are_refused(tmp_path):
    path, _ = takes_memory_lora_and_plan(tmp_path, "doge", 4096)
    assert_refused_in_one_line(path, 4096, {"tp": "TP=2 would split", "cp": "CP=2 would split"})


pytest.importorskip("torch")
pytest.importorskip("transformers")

import hf_saved  # noqa: E402  (scripts/, on sys.path by conftest.py; imports torch and transformers)
import torch  # noqa: E402
from saved_compare import LORA, assert_saved_match, harness_workload  # noqa: E402

from lmcalc.engine.memory.activations import layer_saved_tensors  # noqa: E402
from lmcalc.engine.memory.gpu_memory import stage_activations  # noqa: E402
from lmcalc.engine.parallel.layout import Layout  # noqa: E402

workload_of = partial(harness_workload, "doge")  # scripts/hf_saved.py's cases, read as lmcalc reads them


SAVED = [("doge-small", 128, 1, ck, False, torch.bfloat16) for ck in (False, True)]
SAVED += [("doge-small", 256, 2, ck, lora, torch.bfloat16) for ck in (False, True) for lora in (False, True)]
SAVED += [("doge-mha", 128, 1, False, False, torch.bfloat16), ("doge-small", 256, 2, False, False, torch.float32)]
"""doge-small keeps 64 keys a query (top-k at s 128 and 256), 2 KV heads of 4; doge-mha's window is past the sequence
and each head its own KV head (one sequence: dt_proj reads the V attention keeps)."""


@pytest.mark.torch
@pytest.mark.parametrize(("name", "seq", "batch", "checkpointing", "lora", "dtype"), SAVED)
def test_bytes_kept_for_backward_match_transformers(name, seq, batch, checkpointing, lora, dtype):  # noqa: PLR0913
    m = hf_saved.measure(name, "eager", seq, batch, checkpointing, dtype=dtype, use_cache=False,
                         lora=LORA if lora else None)  # fmt: skip
    w = workload_of(name, seq, batch, checkpointing, lora=lora, fp32=dtype == torch.float32)
    acts = stage_activations(w, Layout(), 0)
    # without checkpointing a layer above the lowest too (not under LoRA: its lowest keeps less, counted outside)
    layer = None if lora else sum(t.bytes for t in layer_saved_tensors(w, False))
    assert_saved_match(m, acts, checkpointing, layer)


@pytest.mark.torch
@pytest.mark.parametrize(("name", "checkpointing", "lora"),
                         [("doge-small", False, False)]
                         + [("doge-wide", ck, lora) for ck in (False, True) for lora in (False, True)])  # fmt: skip
def test_the_step_peak_matches_transformers(name, checkpointing, lora):
    # s 256, b 2: doge-small's wide vocabulary binds at the loss's backward, doge-wide's final norm or, checkpointed,
    # a layer's backward. Each model is built afresh: one a checkpointed measurement ran is otherwise reused
    assert_eager_step_peak("doge", name, checkpointing, lora)
