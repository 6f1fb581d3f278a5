"""Training memory of the Byte Latent Transformer (``engine.memory.byte_latent``): beyond its local decoder's layers,
the hash embeddings' indices, the local encoder's layers over the s bytes, the patch reduction, the encoder's
cross-attention of P·k patch queries over the bytes, the global transformer's layers over P = s + 1 patches, the
decoder's patch projection and its cross-attention of the bytes over P·k patch keys before each of its layers; the
entropy model frozen and keeping nothing. Derived by hand at ``scripts/hf_saved.py``'s blt-small, then against
transformers 5.24 on the CPU (blt-small and blt-wide, built in bf16, and once in fp32; eager attention and SDPA): the
bytes saved for backward within 5 % (the whole, and under checkpointing the forward and the rebuilt layer apart),
the step's peak (``scripts/hf_step_peak.py``) within 3 %, with and without gradient checkpointing, fully trained and
under PEFT's LoRA on every linear layer (without checkpointing: transformers 5.24 cannot run BLT's LoRA
checkpointed, ``test_transformers_cannot_checkpoint_a_lora_step``)."""

from __future__ import annotations

import pytest
from saved_compare import (
    SAVED_TOLERANCE,
    assert_refused_in_one_line,
    error,
    hf_spec,
    takes_memory_lora_and_plan,
    transformers_workload,
)

from lmcalc import api
from lmcalc.engine.finetune.method import Method, frozen_params, trained_params
from lmcalc.engine.memory.activations import layer_kept_tensors, layer_saved_tensors
from lmcalc.engine.memory.byte_latent import (
    byte_latent_saved,
    byte_latent_tables,
    encoder_workload,
    global_workload,
    rebuilt_stack_layers,
)
from lmcalc.engine.memory.gpu_memory import largest_layer_bytes, stage_activations
from lmcalc.engine.memory.outside_layers import layer_checkpoint, model_saved_tensors
from lmcalc.engine.model.params import weight_tensors
from lmcalc.engine.parallel.layout import Layout
from lmcalc.errors import LmcalcError

SMALL = dict(model_type="blt", vocab_size=260, cross_attn_k=2, local_attention_window_len=64,
             encoder_hash_byte_group_size=[3, 4], encoder_hash_byte_group_vocab=512,
             encoder_config=dict(hidden_size=128, num_attention_heads=4, num_hidden_layers=1, intermediate_size=384),
             decoder_config=dict(hidden_size=128, num_attention_heads=4, num_hidden_layers=2, intermediate_size=384,
                                 hidden_size_global=256),
             global_config=dict(hidden_size=256, num_attention_heads=4, num_hidden_layers=2, intermediate_size=512),
             patcher_config=dict(hidden_size=64, num_attention_heads=2, num_hidden_layers=1,
                                 intermediate_size=128))  # fmt: skip
"""scripts/hf_saved.py's blt-small: bytes 128 wide (one encoder layer, two decoder layers, 4 heads of 32, SwiGLUs of
384), two global layers of 256 (4 heads of 64, SwiGLUs of 512) over the patches, k = 2, two hash tables of 512 rows,
an entropy model of one layer of 64."""


def total(tensors) -> float:
    return sum(t.bytes for t in tensors)


def whole(tensor) -> float:
    """A tensor's bytes on one GPU at TP = CP = 1."""
    return tensor.bytes


def test_a_step_of_blt_small_by_hand():
    # s = 128 bytes, b = 1, bf16 (2 B), eager; P = s + 1 = 129 patches, k = 2: P·k = 258 patch queries or keys.
    # A Llama layer (transformers' RMSNorm: an fp32 copy, 1/rms, the normalised value in bf16) over n rows of h, H
    # heads, an MLP of f: two norms 2·(4nh + 4n + 2nh), the Q/K/V input 2nh, Q, K and V 6nh, the fp32 softmax and its
    # cast 6·H·n², o_proj's input 2nh, the MLP's input 2nh, SwiGLU's gate, its SiLU, up and down's input 8nf:
    # 24nh + 8n + 6Hn² + 8nf
    s, P, Pk, h, H, d, f, hg, fg = 128, 129, 258, 128, 4, 32, 384, 256, 512

    def layer(n: int, h: int, f: int) -> int:
        return 24 * n * h + 8 * n + 6 * H * n * n + 8 * n * f

    def cross(q: int, kv: int) -> int:  # a cross-attention of q query rows over kv key rows, h wide, eager
        norms = (6 * q * h + 4 * q) + (6 * kv * h + 4 * kv)  # each norm: fp32 copy, 1/rms, normalised value
        return norms + 2 * q * h + 2 * kv * h + 2 * q * H * d + 4 * kv * H * d + 6 * H * q * kv + 2 * q * H * d

    encoder = layer(s, h, f)
    assert encoder == 393_216 + 1_024 + 393_216 + 393_216 == 1_180_672
    latent = layer(P, hg, fg)
    assert latent == 792_576 + 1_032 + 399_384 + 528_384 == 1_721_376
    assert cross(Pk, s) == cross(s, Pk) == 1_387_016
    # beyond the decoder's layers: 2 hash tables' indices (int64); the encoder's layer; the patch reduction's zeros,
    # index (int64), source (the encoder's output) and result (P·h, s, s·h, P·h); the encoder's cross-attention; two
    # global layers; the decoder projection's input (P·h_g); two decoder cross-attentions
    reduction = 2 * P * h + 8 * s + 2 * s * h + 2 * P * h
    blt = 2 * 8 * s + encoder + reduction + cross(Pk, s) + 2 * latent + 2 * P * hg + 2 * cross(s, Pk)
    assert blt == 2_048 + 1_180_672 + 99_840 + 1_387_016 + 3_442_752 + 66_048 + 2_774_032 == 8_952_408
    w = transformers_workload(hf_spec(SMALL, "blt"), s, 1)
    assert total(byte_latent_saved(w)) == blt
    # the encoder's and the global transformer's rotary tables, cos and sin at their head sizes (32 and 64)
    assert total(byte_latent_tables(w)) == 2 * 2 * s * d + 2 * 2 * P * (hg // H) == 16_384 + 33_024
    # the step: two decoder layers as the encoder's, the token ids and targets (int64), the decoder's tables, the
    # final norm, the head's input and the loss's fp32 log-probabilities of V = 260
    assert total(layer_saved_tensors(w, False)) == encoder
    outside = 2 * 8 * s + 2 * 2 * s * d + (6 * s * h + 4 * s) + 2 * s * h + 4 * s * 260
    step = blt + 49_408 + 2 * encoder + outside
    assert step == 11_646_296
    assert stage_activations(w, Layout(), 0).total == step  # transformers keeps 11,646,308 B (its padded labels)
    assert total(model_saved_tensors(w)) == step - 2 * encoder


def test_checkpointed_the_stacks_keep_their_inputs_and_a_global_layer_is_rebuilt():
    # under checkpointing an encoder layer keeps its s·h input, a global layer its P·h_g, the cross-attentions all
    # they keep; the largest layer rebuilt is a global one (1,721,376 B, by hand above), and when it is rebuilt the
    # backward has freed the decoder's side: its layers' inputs, its cross-attentions and projection's input
    s, P, h, hg = 128, 129, 128, 256
    w = transformers_workload(hf_spec(SMALL, "blt"), s, 1, checkpointing=True)
    plain = transformers_workload(hf_spec(SMALL, "blt"), s, 1)
    layers = [t for t in byte_latent_saved(plain) if t.label.startswith(("encoder ", "global "))]
    inputs = 2 * s * h + 2 * 2 * P * hg
    assert total(byte_latent_saved(w)) == total(byte_latent_saved(plain)) - total(
        t for t in layers if not t.label.startswith("encoder cross")) + inputs  # fmt: skip
    encoder_layer, global_layer = rebuilt_stack_layers(w, whole, False, freed=False)
    assert global_layer == 1_721_376
    decoder_side = 2 * 2 * s * h + 2 * 1_387_016 + 2 * P * hg
    assert rebuilt_stack_layers(w, whole, False)[1] == 1_721_376 - decoder_side
    assert largest_layer_bytes(w, Layout().activation_layout, False) == 1_180_672  # a decoder layer's, at the top


def test_the_entropy_model_is_frozen_whatever_the_method():
    spec = hf_spec(SMALL, "blt")
    # the entropy model: its embedding and head (260 × 64 each), its norm (64), one layer (4·64² + 3·64·128 + 2·64)
    patcher = 2 * 260 * 64 + 64 + 4 * 64 * 64 + 3 * 64 * 128 + 2 * 64
    assert patcher == 33_280 + 64 + 16_384 + 24_576 + 128 == 74_432
    assert frozen_params(spec, Method("full")) == patcher
    assert trained_params(spec, Method("full")) == sum(t.total for t in weight_tensors(spec)) - patcher


def test_memory_lora_and_plan_take_it_and_what_it_does_not_model_is_refused(tmp_path):
    path, best = takes_memory_lora_and_plan(tmp_path, "blt", 4096)
    assert best.layout.pp == best.layout.tp == best.layout.cp == 1
    assert_refused_in_one_line(path, 4096, {
        "tp": "TP=2 would split .*'s encoder, global transformer and cross-attention",
        "cp": "CP=2 would split .*'s encoder, global transformer and cross-attention",
        "pp": "cross-attention are modelled on one pipeline stage, not pp 2",
    })  # fmt: skip
    for method, more in (("qlora", {}), ("freeze", {"freeze_layers": 1})):
        with pytest.raises(LmcalcError, match=f"method {method} on .*: lmcalc does not model") as refused:
            api.memory(model=path, gpus="1xh100", seq=4096, method=method, **more)
        assert "\n" not in str(refused.value)


pytest.importorskip("torch")
pytest.importorskip("transformers")

import hf_saved  # noqa: E402  (scripts/, on sys.path by conftest.py; imports torch and transformers)
import hf_step_peak  # noqa: E402
import torch  # noqa: E402
from saved_compare import LORA, assert_peak_match, harness_workload  # noqa: E402

from lmcalc.engine.memory.gpu_memory import gpu_memory  # noqa: E402

SAVED = [("blt-small", "eager", 128, 1, False, False, torch.bfloat16),
         ("blt-small", "eager", 256, 2, False, False, torch.bfloat16),
         ("blt-small", "eager", 256, 2, True, False, torch.bfloat16),
         ("blt-small", "eager", 256, 2, False, True, torch.bfloat16),
         ("blt-small", "eager", 128, 1, False, False, torch.float32),
         ("blt-small", "eager", 128, 1, True, False, torch.float32),
         ("blt-small", "sdpa", 256, 2, False, False, torch.bfloat16),
         ("blt-small", "sdpa", 256, 2, True, False, torch.bfloat16),
         ("blt-small", "sdpa", 128, 1, False, True, torch.bfloat16),
         ("blt-wide", "eager", 256, 2, False, False, torch.bfloat16),
         ("blt-wide", "eager", 256, 2, True, False, torch.bfloat16)]  # fmt: skip
"""Measured, bytes saved against lmcalc's: every case within 0.02 % (the loss's padded labels and scalar; under
LoRA, a few adapters' A·x rows)."""


@pytest.mark.torch
@pytest.mark.parametrize(("name", "attention", "seq", "batch", "checkpointing", "lora", "dtype"), SAVED)
def test_bytes_kept_for_backward_match_transformers(name, attention, seq, batch, checkpointing, lora, dtype):  # noqa: PLR0913
    if lora:  # a model once checkpointed makes its embedding's output require gradients (enable_input_require_grads)
        hf_saved.release_models()
    m = hf_saved.measure(name, attention, seq, batch, checkpointing, dtype=dtype, use_cache=False,
                         lora=LORA if lora else None)  # fmt: skip
    w = harness_workload("blt", name, seq, batch, checkpointing, attention, lora, dtype == torch.float32)
    acts = stage_activations(w, Layout(), 0)
    if not checkpointing:
        assert abs(error(acts.total, m.total_bytes)) < SAVED_TOLERANCE, (m.total_bytes, acts.total)
        return
    # the forward with the checkpoints' closures, and the layer the harness rebuilds: the one that adds the most, a
    # global layer here (lmcalc's held.rebuilt is what a rebuilt layer adds beyond what the backward freed before)
    assert abs(error(acts.total, m.total_bytes + m.closure_bytes)) < SAVED_TOLERANCE, (m.total_bytes, acts.total)
    fp32 = dtype == torch.float32  # a rebuilt layer's first norm's fp32 copy is then its checkpointed input, kept
    rebuilt = max(total(layer_kept_tensors(stack, False)) - (layer_checkpoint(stack).bytes if fp32 else 0)
                  for stack in (w, encoder_workload(w), global_workload(w)))  # fmt: skip
    assert abs(error(rebuilt, m.rebuild_new_bytes)) < SAVED_TOLERANCE, (m.rebuild_new_bytes, rebuilt)


PEAKS = [("blt-small", "eager", False, False), ("blt-small", "eager", True, False),
         ("blt-small", "eager", False, True), ("blt-small", "sdpa", False, False), ("blt-small", "sdpa", True, False),
         ("blt-wide", "eager", False, False), ("blt-wide", "eager", True, False),
         ("blt-wide", "eager", False, True)]  # fmt: skip
"""s 256, b 2. Unchecked, the forward's end binds (BltModel's locals: the masks, the entropy model's logits and,
under LoRA, the graph its adapters record); checkpointed, a layer's backward in lmcalc, a checkpointed decoder layer's
forward at its softmax in transformers (blt-small: -2.1 %)."""


@pytest.mark.torch
@pytest.mark.parametrize(("name", "attention", "checkpointing", "lora"), PEAKS)
def test_the_step_peak_matches_transformers(name, attention, checkpointing, lora):
    hf_saved.release_models()
    m = hf_step_peak.measure(name, 256, 2, checkpointing, attention, lora=LORA if lora else None, fp32_adapters=False)
    assert_peak_match(m, gpu_memory(harness_workload("blt", name, 256, 2, checkpointing, attention, lora), Layout(), 0))


@pytest.mark.torch
def test_transformers_cannot_checkpoint_a_lora_step():
    # gradient checkpointing on a model with frozen embeddings makes the embedding's output a leaf that requires
    # gradients (enable_input_require_grads), and compute_hash_embeddings adds the hash embeddings to it in place
    hf_saved.release_models()
    with pytest.raises(RuntimeError, match="a leaf Variable that requires grad is being used in an in-place operation"):
        hf_saved.measure("blt-small", "eager", 64, 1, True, use_cache=False, lora=LORA)
    hf_saved.release_models()
