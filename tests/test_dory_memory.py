"""Training memory of Dory's looped nGPT layers (``engine.memory.ngpt``): each run of a held layer keeps its own
tensors, with nGPT's L2 norms, sub-norms, scales and interpolating residual; outside the layers, the loop's norms and
the logit scale. Derived by hand at DoryConfig's defaults, then against transformers 5.24 on the CPU
(``scripts/hf_saved.py``'s dory-small and dory-wide: an input layer, a recurrent section of two run twice, an output
layer; built in bf16, which transformers trains on the CPU, and once in fp32): the bytes saved for backward within 5 %
(the whole, the checkpointed forward and the rebuilt layer), the step's peak (``scripts/hf_step_peak.py``) within 3 %,
with and without gradient checkpointing, and under PEFT's LoRA."""

from __future__ import annotations

from dataclasses import replace
from functools import partial

import pytest
from saved_compare import assert_refused_in_one_line, hf_spec, takes_memory_lora_and_plan, transformers_workload

from lmcalc import api
from lmcalc.engine.finetune.method import Method, parse_targets
from lmcalc.engine.memory.gpu_memory import layer_bytes, stage_activations
from lmcalc.engine.parallel.layout import Grid, Layout
from lmcalc.engine.parallel.pipeline import StageLayers
from lmcalc.engine.time.kernels import stage_work
from lmcalc.errors import LmcalcError

DEFAULTS = {"model_type": "dory"}  # 36 layers: 8 input, 20 recurrent run twice, 8 output (56 runs); h 2,560, f 7,168
FULL = DEFAULTS | {"layer_types": ["full_attention"] * 36}  # every layer full: no window's mask to derive

spec_of = partial(hf_spec, model_type="dory")
workload = partial(transformers_workload, attention="flash")  # a fused kernel unless a test says eager


def test_a_run_and_the_loop_by_hand():
    # DoryConfig's defaults, every layer full attention, s = 2,048, b = 1, bf16 (2 B), a fused kernel. 16 heads of
    # d = 256 (H·d = 4,096) over 4 KV heads. Every norm is DoryL2Norm: an fp32 copy of its input and 1/‖x‖ a row.
    s, h, f, H, Hkv, d = 2048, 2560, 7168, 16, 4, 256
    sb, sbh, sbf, sbq, sbk = s, s * h, s * f, s * H * d, s * Hkv * d
    norms = 4 * (4 * sbh + 4 * sb)  # the four sandwich norms, over h
    # fmt: off
    attention = (
        2 * sbh  # Q/K/V/gate's input (the input norm's output)
        + (4 * sbq + 4 * s * H) + (4 * sbk + 4 * s * Hkv)  # the Q and K norms, a row a head
        + 2 * sbq + 2 * sbq  # Q after RoPE (for s_qk's gradient) and Q · s_qk² (the kernel's)
        + 2 * 2 * sbk + 4 * H * s  # K and V, the log-sum-exp
        + 3 * 2 * sbq  # the kernel's output, gate_proj's output (for s_gate's gradient), the sigmoid's output
        + (4 * sbq + 4 * sb) + 2 * sbq  # attn_sub_norm on the gated product, o_proj's input (its output)
    )
    mlp = (
        2 * sbh  # gate and up's input (the pre-MLP norm's output)
        + 5 * 2 * sbf  # gate and up outputs, each scaled (s_u, s_v), SiLU's output
        + (4 * sbf + 4 * sb) + 2 * sbf  # ffn_sub_norm on the product, down_proj's input (its output)
    )
    # fmt: on
    residuals = 2 * 2 * sbh  # y − h at each interpolation, for α's gradient
    scales = 2 * (4 * H * d + 4 * h + 2 * f)  # s_qk², s_gate², |α| and their inputs, s_u·√h, s_v·√h
    run = norms + attention + mlp + residuals + scales
    assert run == 24 * sbh + 24 * sb + 20 * sbq + 8 * sbk + 8 * s * H + 4 * s * Hkv + 16 * sbf + scales
    assert run == 545_685_504
    w = workload(spec_of(FULL), s, 1)
    assert layer_bytes(w, 1, False, 1, False) == run
    # outside the runs: the input section's output normalised once and each of the 2 loops' input (3 norms), the
    # rotary tables, the final norm, the head's input, the loss's fp32 logits and the logit scale's (and its V scales)
    V = 131_072
    outside = 16 * sb + 3 * (4 * sbh + 4 * sb) + 2 * s * d * 2 + (4 * sbh + 4 * sb) + 2 * sbh + 2 * 4 * sb * V + 4 * V
    assert stage_activations(w, Layout(), 0).total == 56 * run + outside
    # checkpointed: each of the 56 runs keeps its input (2·s·b·h); one run is rebuilt, its first norm's fp32 copy new
    ck = stage_activations(workload(spec_of(FULL), s, 1, True), Layout(), 0)
    assert (ck.total, ck.rebuilt) == (56 * 2 * sbh + outside, run)


def test_lora_keeps_nothing_for_the_frozen_scales():
    # under LoRA the scales are frozen: of a run, Q before s_qk², gate_proj's output, the gate and up projections'
    # outputs before their scales, the residuals' y − h and half the scales' products go; outside, the fp32 logits
    # the logit scale kept. The adapters keep A·x, r = 8 wide, for each of the 8 adapted projections (gate_proj too)
    s, h, f, H, d, r = 2048, 2560, 7168, 16, 256, 8
    sbq = s * H * d
    full = workload(spec_of(FULL), s, 1)
    lora = replace(full, method=Method("lora", r, parse_targets("all-linear"), fp32_adapters=False))
    dropped = 2 * 2 * sbq + 2 * 2 * s * f + 2 * 2 * s * h + 2 * (2 * H * d + 2 * h)
    assert layer_bytes(full, 1, False, 1, False) - layer_bytes(lora, 1, False, 1, False) == dropped - 8 * 2 * s * r


def test_each_run_is_timed_as_a_layer_of_its_own():
    # the 20 recurrent layers run twice: the step's layer GEMMs and attention are those of 56 layers, each trained
    dory = spec_of(DEFAULTS)
    one_pass = dory.model_copy(update={"layer_reuse": None})
    stage = StageLayers(dory.num_layers, 0, False, False)
    looped, plain = (stage_work(workload(spec, 2048, 1), Grid(), stage) for spec in (dory, one_pass))
    assert dory.num_layers == 8 + 2 * 20 + 8
    assert looped.gemm_flops == pytest.approx(plain.gemm_flops)
    assert looped.attention_backward == pytest.approx(plain.attention_backward)


def test_memory_lora_and_plan_take_it_and_tp_cp_pp_and_freeze_are_refused(tmp_path):
    path, best = takes_memory_lora_and_plan(tmp_path, "dory", 2048)
    assert (best.layout.tp, best.layout.cp, best.layout.pp) == (1, 1, 1)
    nGPT = "would split .*'s nGPT layers, which lmcalc counts"
    assert_refused_in_one_line(path, 2048, {"tp": f"TP=2 {nGPT}", "cp": f"CP=2 {nGPT}"})
    with pytest.raises(LmcalcError, match="looped layers are modelled on one pipeline stage, not PP=2"):
        api.memory(model=path, gpus="2xh100", seq=2048, pp=2)
    with pytest.raises(LmcalcError, match="the freeze method on .*'s looped layers"):
        api.memory(model=path, gpus="1xh100", seq=2048, method="freeze", freeze_layers=4)


pytest.importorskip("torch")
pytest.importorskip("transformers")

import hf_saved  # noqa: E402  (scripts/, on sys.path by conftest.py; imports torch and transformers)
import hf_step_peak  # noqa: E402
import torch  # noqa: E402
from saved_compare import LORA, assert_peak_match, assert_saved_match, harness_workload  # noqa: E402

from lmcalc.engine.memory.activations import layer_saved_tensors  # noqa: E402
from lmcalc.engine.memory.gpu_memory import gpu_memory  # noqa: E402

workload_of = partial(harness_workload, "dory")  # scripts/hf_saved.py's cases, read as lmcalc reads them


SAVED = [
    ("dory-small", 128, 1, False, "eager", False, torch.bfloat16),
    ("dory-small", 128, 1, True, "sdpa", False, torch.bfloat16),
]
SAVED += [("dory-small", 128, 1, ck, "eager", True, torch.bfloat16) for ck in (False, True)]
SAVED += [("dory-small", 128, 1, True, "sdpa", False, torch.float32)]
"""dory-small's sliding layers attend over a window of 64, shorter than the sequence; its 6 runs hold 4 layers."""


@pytest.mark.torch
@pytest.mark.parametrize(("name", "seq", "batch", "checkpointing", "attention", "lora", "dtype"), SAVED)
def test_bytes_kept_for_backward_match_transformers(name, seq, batch, checkpointing, attention, lora, dtype):  # noqa: PLR0913
    m = hf_saved.measure(name, attention, seq, batch, checkpointing, dtype=dtype, use_cache=False,
                         lora=LORA if lora else None)  # fmt: skip
    w = workload_of(name, seq, batch, checkpointing, attention, lora, dtype == torch.float32)
    acts = stage_activations(w, Layout(), 0)
    # without checkpointing the output layer too (full attention, no rotary tables of its own): measured layer 3
    layer = None if lora or checkpointing else sum(t.bytes for t in layer_saved_tensors(w, False))
    if layer is not None:
        m.per_layer_bytes[1] = m.per_layer_bytes[3]  # assert_saved_match compares layer 1, which runs twice here
    assert_saved_match(m, acts, checkpointing, layer)


PEAKS = [("dory-wide", True, False)]
"""dory-wide checkpointed: a run's MLP sub-norm backward binds (dory-small's vocabulary binds at the loss's, and LoRA
measured the same way, -0.00 % to +0.05 %: docs/memory-accuracy.md; left out to keep the tier short)."""


@pytest.mark.torch
@pytest.mark.parametrize(("name", "checkpointing", "lora"), PEAKS)
def test_the_step_peak_matches_transformers(name, checkpointing, lora):
    # s 256, b 2, eager. A held layer's weights get a gradient from each run, which autograd sums before .grad takes
    # it: every_gradient leaves all of them out with the parameters' gradients (model state, as lmcalc counts them)
    hf_saved.release_models()
    m = hf_step_peak.measure(name, 256, 2, checkpointing, "eager", lora=LORA if lora else None, fp32_adapters=False,
                             every_gradient=True)  # fmt: skip
    gpu = gpu_memory(workload_of(name, 256, 2, checkpointing, "eager", lora), Layout(), 0)
    assert_peak_match(m, gpu)
