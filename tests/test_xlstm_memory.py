"""Training memory of xLSTM's mLSTM layers (``engine.memory.recurrent.mlstm_saved``): a layer's bytes derived by hand
at xLSTM-7B's widths, then against transformers 5.24 on the CPU (``scripts/hf_saved.py``'s xlstm-small, xlstm-steps
and xlstm-wide, two layers, in fp32: transformers' kernels do not train in bf16): the bytes saved for backward within
5 % (the whole, each layer, the checkpointed forward and the rebuilt layer), the step's peak
(``scripts/hf_step_peak.py``) within 3 %, with and without gradient checkpointing, fully trained and under PEFT's
LoRA on every linear layer."""

from __future__ import annotations

from dataclasses import replace

import pytest
from saved_compare import assert_refused_in_one_line

from lmcalc import api
from lmcalc.engine.finetune.method import Method, parse_targets
from lmcalc.engine.memory.recurrent import mlstm_saved
from lmcalc.engine.workload import Workload
from lmcalc.errors import LmcalcError
from lmcalc.hf_config import model_from_hf_config
from lmcalc.presets import framework_profile, resolve_optimizer, resolve_precision
from lmcalc.specs import ModelSpec

DEFAULTS = {"model_type": "xlstm"}  # xLSTMConfig's defaults: xLSTM-7B's widths
FP32 = resolve_precision("fp32").spec


def spec_of(config: dict) -> ModelSpec:
    return ModelSpec.model_validate(model_from_hf_config(config, "xlstm", "test"))


def workload(spec: ModelSpec, seq: int, micro_batch: int, checkpointing: bool = False) -> Workload:
    return Workload(spec, FP32, resolve_optimizer("adamw").spec, seq, micro_batch, "eager",
                    "full" if checkpointing else "none", framework=framework_profile("transformers"))  # fmt: skip


def test_an_mlstm_layer_by_hand():
    # xLSTM-7B at s = 8,192, b = 1, fp32 (4 B): NH 8 heads, d_k 256 and d_v 512 a head (d_qk 2,048, d_v 4,096 over
    # all), chunks of L = 64: 128 whole chunks, no remainder. Per token: the two soft-capped gates' tanh (2·NH); the
    # copies of q, k and v (2·2,048 + 4,096), the decayed keys and the gated queries (2 × 2,048); D, QKᵀ and D ∘ QKᵀ
    # (3·NH·L); ten fp32 values a head (logsigmoid's input and buffer, two decays, the max's two arguments, the
    # denominator's |·| input and output, exp(−m), the divisor); the numerator (4,096); the kernel's output, the
    # per-head norm's centred input and normalised value, the output gate's sigmoid, the norm's output and out_proj's
    # input (6 × 4,096) and 1/std (NH). Per chunk: the C and n it starts from, and their copy the queries read,
    # 2 × NH × (256 × 512 + 256). Int64 indices of the max (NH a token, 8 B) and the 64 × 64 causal mask (bools).
    s, NH, L, d_qk, d_v, chunks = 8192, 8, 64, 2048, 4096, 128
    per_token = 2 * NH + (2 * d_qk + d_v) + 2 * d_qk + 3 * NH * L + 10 * NH + d_v + 6 * d_v + NH
    per_chunk = 2 * NH * (256 * 512 + 256)
    by_hand = 4 * (s * per_token + chunks * per_chunk) + 8 * s * NH + L * L
    assert by_hand == 4 * (8192 * 42_600 + 128 * 2_101_248) + 524_288 + 4_096 == 2_472_284_160
    assert sum(t.bytes for t in mlstm_saved(workload(spec_of(DEFAULTS), s, 1))) == by_hand


def test_the_steps_past_the_last_chunk_by_hand():
    # chunks of 64 at s = 100, b = 2 (h 128, NH 4, d_k 16, d_v 32): one chunk of 64 tokens, then 36 steps. A step
    # keeps C before it (cloned), k·vᵀ and C after it (3 × NH × 16 × 32), n before and after and the scaled query
    # (3 × 64), the numerator (128) and eight values a head; the copies of k and v (64 + 128) and of the two gates
    # (2·NH) past the chunk are the steps'. One chunk's products read the states' store in place: C and n twice for
    # the chunk, and once more for the state after it (the store holds both)
    spec = spec_of(DEFAULTS | {"hidden_size": 128, "num_heads": 4, "num_hidden_layers": 2, "vocab_size": 2048})
    w = workload(spec, 100, 2)
    steps = [t for t in mlstm_saved(w) if t.label.startswith("steps:")]
    rb, NH = 2 * 36, 4
    assert sum(t.bytes for t in steps) == 4 * rb * (3 * NH * 16 * 32 + 3 * 64 + 128 + 8 * NH + 64 + 128 + 2 * NH)
    states = [t for t in mlstm_saved(w) if t.label.startswith("chunks: C and n")]
    assert sum(t.bytes for t in states) == 4 * (1 + 2) * 2 * NH * (16 * 32 + 16)


def test_memory_lora_and_plan_take_it_and_tp_cp_are_refused():
    full = api.memory(model="xlstm-7b", gpus="1xh200", seq=2048, micro_batch=1, precision="fp32")
    lora = api.memory(model="xlstm-7b", gpus="1xh200", seq=2048, micro_batch=1, precision="fp32", method="lora")
    assert 0 < lora.gpu.kept.optimizer < full.gpu.kept.optimizer and lora.gpu.activations > 0
    assert api.plan(model="xlstm-7b", gpus="8xh100", seq=4096, global_batch=4096 * 64, tokens=1e9).best is not None
    assert_refused_in_one_line("xlstm-7b", 2048, {"tp": "TP=2 would split", "cp": "CP=2 splits the sequence"})


def test_the_padded_mode_transformers_cannot_train_is_refused(tmp_path):
    # mode train_with_padding: xLSTMLayer unpacks (h, state) from a kernel that returns h alone, so transformers 5.24
    # fails on the first step (b = 1: "not enough values to unpack"); lmcalc counts it for params and FLOPs alone
    path = tmp_path / "config.json"
    path.write_text('{"model_type": "xlstm", "mode": "train_with_padding", "return_last_states": false}')
    assert api.flops(model=str(path), tokens=1e9, seq=4096).model_flops > 0
    with pytest.raises(LmcalcError, match="cannot train in it"):
        api.memory(model=str(path), gpus="1xh200", seq=4096)


pytest.importorskip("torch")
pytest.importorskip("transformers")

import hf_saved  # noqa: E402  (scripts/, on sys.path by conftest.py; imports torch and transformers)
import hf_step_peak  # noqa: E402
import torch  # noqa: E402
from saved_compare import assert_peak_match, assert_saved_match  # noqa: E402

from lmcalc.engine.memory.activations import layer_saved_tensors  # noqa: E402
from lmcalc.engine.memory.gpu_memory import gpu_memory, stage_activations  # noqa: E402
from lmcalc.engine.parallel.layout import Layout  # noqa: E402

LORA = {"r": 8, "lora_alpha": 16, "lora_dropout": 0.0, "target_modules": "all-linear"}


def harness_workload(name: str, seq: int, micro_batch: int, checkpointing: bool, lora: bool = False) -> Workload:
    """lmcalc's workload for the harness's model, read from the very config it builds the model from."""
    config = hf_saved.CASES[name].config().to_dict()
    w = workload(spec_of(config), seq, micro_batch, checkpointing)
    return replace(w, method=Method("lora", 8, parse_targets("all-linear"))) if lora else w


SAVED = [(name, s, b, ckpt) for name in ("xlstm-small", "xlstm-steps") for s, b in ((128, 1), (256, 2), (100, 2))
         for ckpt in (False, True)]  # fmt: skip
"""Chunks of 64 (xlstm-small: s 128 and 256 whole chunks, 100 one chunk and 36 steps) and of 48 (xlstm-steps: 32,
16 and 4 steps past the chunks)."""


@pytest.mark.torch
@pytest.mark.parametrize(
    ("name", "seq", "batch", "checkpointing", "lora"),
    [(*c, False) for c in SAVED] + [("xlstm-small", 256, 2, ck, True) for ck in (False, True)],
)
def test_bytes_kept_for_backward_match_transformers(name, seq, batch, checkpointing, lora):  # noqa: PLR0913
    m = hf_saved.measure(name, "eager", seq, batch, checkpointing, dtype=torch.float32, use_cache=False,
                         fp32_products=False, lora=LORA if lora else None)  # fmt: skip
    w = harness_workload(name, seq, batch, checkpointing, lora)
    acts = stage_activations(w, Layout(), 0)
    # without checkpointing a layer above the lowest too (not under LoRA: its lowest keeps less, counted outside)
    layer = None if lora else sum(t.bytes for t in layer_saved_tensors(w, False))
    assert_saved_match(m, acts, checkpointing, layer)


@pytest.mark.torch
@pytest.mark.parametrize(("name", "checkpointing", "lora"),
                         [(name, ck, False) for name in ("xlstm-small", "xlstm-wide") for ck in (False, True)]
                         + [("xlstm-wide", ck, True) for ck in (False, True)])  # fmt: skip
def test_the_step_peak_matches_transformers(name, checkpointing, lora):
    # s 256, b 2: xlstm-small's wide vocabulary binds at the loss's backward, xlstm-wide's layer at its own
    m = hf_step_peak.measure(name, 256, 2, checkpointing, "eager", lora=LORA if lora else None, fp32_adapters=False,
                             fp32_products=False, dtype=torch.float32)  # fmt: skip
    gpu = gpu_memory(harness_workload(name, 256, 2, checkpointing, lora), Layout(), 0)
    assert_peak_match(m, gpu)
