"""Training memory of GIT (``engine.memory.image_prefix``): a step reads one image a sequence, which the trained CLIP
image encoder turns into P tokens before the text's; the decoder layers compute the s + P tokens and the head all
of their positions, the loss the text's. Derived by hand at GitConfig's defaults, then against transformers 5.24 on
the CPU (``scripts/hf_saved.py``'s git-small and git-wide: two decoder and two encoder layers, built in bf16, which
transformers trains on the CPU, and once in fp32; GIT has its own eager attention alone): the bytes saved for
backward within 5 % (the whole, the checkpointed forward and the rebuilt layer), the step's peak
(``scripts/hf_step_peak.py``) within 3 %, with and without gradient checkpointing, fully trained and under PEFT's LoRA
on the decoder's linear layers (without checkpointing: transformers 5.24 cannot run GIT's LoRA checkpointed)."""

from __future__ import annotations

from dataclasses import replace
from functools import partial

import pytest
from saved_compare import hf_spec, takes_memory_lora_and_plan, transformers_workload

from lmcalc import api
from lmcalc.engine.finetune.method import Method, parse_targets
from lmcalc.engine.memory.activations import layer_saved_tensors
from lmcalc.engine.memory.image_prefix import image_encoder_saved
from lmcalc.engine.memory.outside_layers import layer_checkpoint, model_saved_tensors
from lmcalc.engine.memory.phases import backward_transients
from lmcalc.engine.parallel.layout import Layout
from lmcalc.engine.parallel.pipeline import stage_layers
from lmcalc.engine.parallel.sharding import stage_params
from lmcalc.engine.workload import Workload, dropout_mask_bytes
from lmcalc.errors import LmcalcError

DEFAULTS = {"model_type": "git"}  # GitConfig's: h 768, 6 layers, 12 heads, f 3,072, V 30,522; ViT-B/16 at 224 pixels

spec_of = partial(hf_spec, model_type="git")
workload = transformers_workload  # eager: GIT's own attention, the only one transformers gives it


def total(tensors) -> float:
    return sum(t.bytes for t in tensors)


def test_the_image_encoder_the_layers_and_the_head_by_hand():
    # GitConfig's defaults at s = 512, b = 1, bf16 (2 B), eager, dropout masks of 1 B (a GPU's). The image: 224 pixels
    # in patches of 16, n = 14² + 1 = 197 tokens, P = 197; the encoder v = 768, f_v = 3,072, 12 heads, 12 layers.
    s, n, v, fv, Hv, Lv, h, f, H, V = 512, 197, 768, 3072, 12, 12, 768, 3072, 12, 30522
    nv, stats = n * v, 2 * n * 4  # a LayerNorm keeps its input and two fp32 values a row
    pixels = 3 * 224 * 224 * 2  # the patch convolution's input, cast to bf16
    # an encoder layer: two norms, the projections' input, Q, K and V, the softmax (fp32) and its cast, the output
    # projection's input, the MLP's input, quick GELU's input and sigmoid, fc2's input
    layer = 2 * (2 * nv + stats) + 2 * nv + 3 * 2 * nv + Hv * n * n * (4 + 2) + 2 * nv + 2 * nv + 3 * 2 * n * fv
    # the pre- and post-norms, the projection's input (v wide) and its norm (h wide)
    encoder = pixels + Lv * layer + 2 * (2 * nv + stats) + 2 * nv + (2 * n * h + stats)
    assert layer == 608_336 + 302_592 + 907_776 + 2_794_248 + 605_184 + 3_631_104 == 8_849_240
    assert encoder == 301_056 + 12 * 8_849_240 + 608_336 + 302_592 + 304_168 == 107_707_032
    w = workload(spec_of(DEFAULTS), s, 1)
    assert total(image_encoder_saved(w)) == encoder
    # a decoder layer over S = s + P = 709 tokens (GitLayer, post-norm): the Q/K/V input, Q, K and V, the softmax
    # (bf16: GitSelfAttention's), the dropout's mask (1 B) and output, the output projection's input, a residual
    # dropout mask (1 B), the norm after the residual add (input and stats); the MLP's input, GELU's input, fc2's
    # input, a residual dropout mask and its norm
    S = s + n
    decoder = 2 * S * h + 6 * S * h + H * S * S * (2 + 1 + 2) + 2 * S * h + S * h + (2 * S * h + 8 * S)
    decoder += 2 * S * h + 2 * S * f + 2 * S * f + S * h + (2 * S * h + 8 * S)
    assert decoder == 18 * S * h + 5 * H * S * S + 4 * S * f + 16 * S == 9_801_216 + 30_160_860 + 8_712_192 + 11_344
    assert total(layer_saved_tensors(w, False)) == decoder
    # the head reads all S positions (S·h at 2 B); the loss keeps its fp32 log-probabilities of the text (4·s·V)
    head = [t for t in model_saved_tensors(w) if t.block == "head"]
    assert total(head) == 2 * S * h + 4 * s * V == 1_089_024 + 62_509_056
    # checkpointed: a decoder layer keeps its S·h input, an encoder layer its n·v input
    ck = workload(spec_of(DEFAULTS), s, 1, checkpointing=True)
    assert layer_checkpoint(ck).bytes == 2 * S * h
    assert total(image_encoder_saved(ck)) == encoder - Lv * layer + Lv * 2 * nv
    # the loss's transient: transformers' 8·s·V (bf16 logits and fp32 copy, or two fp32 gradients) and the image
    # positions' logits, which the head computes and the loss slices away, 2·P·V
    built = stage_layers(w.model, Layout(), 0)
    assert backward_transients(w, 1, 1, built).loss == 8 * s * V + 2 * n * V
    # the states: the image encoder's and projection's parameters on the GPU that embeds, as GitModel builds them
    # (the class token, patch convolution, positions, norms, 12 layers, the projection and its norm)
    encoder_params = v + 3 * 16 * 16 * v + n * v + 4 * v + Lv * (4 * (v * v + v) + 4 * v + 2 * v * fv + fv + v)
    encoder_params += v * h + 3 * h
    assert encoder_params == spec_of(DEFAULTS).vision_params == 86_391_552
    text_only = w.model.model_copy(update={"image_prefix": None})
    assert stage_params(w, Layout(), 0).dense - stage_params(replace(w, model=text_only), Layout(), 0).dense == (
        encoder_params
    )


def test_under_lora_the_image_encoder_is_frozen_and_keeps_nothing():
    w = workload(spec_of(DEFAULTS), 512, 1)
    lora = replace(w, method=Method("lora", 8, parse_targets("all-linear")))
    assert image_encoder_saved(lora) == []


def test_memory_lora_and_plan_take_it_and_what_it_does_not_model_is_refused(tmp_path):
    path, best = takes_memory_lora_and_plan(tmp_path, "git", 512)
    assert best.layout.pp == best.layout.tp == best.layout.cp == 1
    refusals = (
        ({"tp": 2}, "TP=2 would split .*'s image encoder"),
        ({"cp": 2}, "CP=2 would split .*'s image encoder"),
        ({"pp": 2}, "image encoder is modelled on one pipeline stage, not pp 2"),
        ({"method": "qlora"}, "method qlora on .*: lmcalc does not model how it treats the image encoder"),
    )
    for settings, message in refusals:
        gpus = "1xh100" if "method" in settings else "2xh100"
        with pytest.raises(LmcalcError, match=message) as refused:
            api.memory(model=path, gpus=gpus, seq=512, **settings)
        assert "\n" not in str(refused.value)


pytest.importorskip("torch")
pytest.importorskip("transformers")

import hf_saved  # noqa: E402  (scripts/, on sys.path by conftest.py; imports torch and transformers)
import hf_step_peak  # noqa: E402
import torch  # noqa: E402
from saved_compare import assert_peak_match, assert_saved_match, harness_workload  # noqa: E402

from lmcalc.engine.memory.gpu_memory import gpu_memory, stage_activations  # noqa: E402

LORA = {"r": 8, "lora_alpha": 16, "lora_dropout": 0.0, "target_modules": ["query", "key", "value", "dense"]}
"""PEFT's LoRA on the decoder's linear layers, lmcalc's all-linear for GIT (the image encoder frozen)."""


def workload_of(name: str, seq: int, micro_batch: int, checkpointing: bool, lora: bool = False,
                fp32: bool = False) -> Workload:  # fmt: skip
    """The harness's workload (``saved_compare.harness_workload``) with PyTorch's CPU dropout, which keeps its
    masks in the activation dtype."""
    w = harness_workload("git", name, seq, micro_batch, checkpointing, lora=lora, fp32=fp32)
    return replace(w, mask_bytes=dropout_mask_bytes("cpu", w.precision))


SAVED = [("git-small", 128, 1, False, False, torch.bfloat16), ("git-small", 128, 1, False, False, torch.float32)]
SAVED += [("git-small", 256, 2, ck, lora, torch.bfloat16) for ck, lora in ((False, False), (True, False), (False, True))
          ]  # fmt: skip
"""git-small's image is 17 tokens (git-wide's 65: its checkpointed step below)."""


@pytest.mark.torch
@pytest.mark.parametrize(("name", "seq", "batch", "checkpointing", "lora", "dtype"), SAVED)
def test_bytes_kept_for_backward_match_transformers(name, seq, batch, checkpointing, lora, dtype):  # noqa: PLR0913
    if lora:  # a model once checkpointed makes its embedding's output require gradients (enable_input_require_grads)
        hf_saved.release_models()  # which GitEmbeddings' in-place position add refuses on a frozen embedding
    m = hf_saved.measure(name, "eager", seq, batch, checkpointing, dtype=dtype, use_cache=False,
                         lora=LORA if lora else None)  # fmt: skip
    w = workload_of(name, seq, batch, checkpointing, lora, dtype == torch.float32)
    assert_saved_match(m, stage_activations(w, Layout(), 0), checkpointing)


PEAKS = [("git-small", False, False), ("git-small", False, True), ("git-wide", True, False)]


@pytest.mark.torch
@pytest.mark.parametrize(("name", "checkpointing", "lora"), PEAKS)
def test_the_step_peak_matches_transformers(name, checkpointing, lora):
    # s 256, b 2: the loss binds (the image positions' logits beside the text's), but git-wide checkpointed, whose
    # rebuilt layer's backward does
    hf_saved.release_models()
    m = hf_step_peak.measure(name, 256, 2, checkpointing, "eager", lora=LORA if lora else None, fp32_adapters=False)
    assert_peak_match(m, gpu_memory(workload_of(name, 256, 2, checkpointing, lora), Layout(), 0))


@pytest.mark.torch
def test_the_wide_lora_step_peak():
    # +2.1 % at a layer's backward (transformers' peak is the loss's): +3.4 % until bc6f566 stopped counting the frozen
    # embedding norm's output under LoRA
    hf_saved.release_models()
    m = hf_step_peak.measure("git-wide", 256, 2, False, "eager", lora=LORA, fp32_adapters=False)
    assert_peak_match(m, gpu_memory(workload_of("git-wide", 256, 2, False, True), Layout(), 0))
