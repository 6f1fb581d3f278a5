"""Training memory of HRM's looped stacks (``engine.memory.looped``): the runs without gradients keep nothing, each run
that trains keeps a layer's tensors, and each trained stack run ends with a weightless norm of its own; derived by hand
at HrmTextConfig's defaults, then against transformers 5.24 on the CPU (``scripts/hf_saved.py``'s hrm-small and
hrm-wide: stacks of two layers, two cycles of two low-level runs; built in bf16, which transformers trains on the CPU,
and once in fp32): the bytes saved for backward within 5 % (the whole, the checkpointed forward and the rebuilt
layer), the step's peak (``scripts/hf_step_peak.py``) within 3 %, with and without gradient checkpointing."""

from __future__ import annotations

from functools import partial

import pytest
from saved_compare import hf_spec, takes_memory_lora_and_plan, transformers_workload

from lmcalc import api
from lmcalc.engine.memory.gpu_memory import layer_bytes, stage_activations
from lmcalc.engine.parallel.layout import Grid, Layout
from lmcalc.engine.parallel.pipeline import StageLayers
from lmcalc.engine.time.kernels import stage_work
from lmcalc.errors import LmcalcError

DEFAULTS = {"model_type": "hrm_text"}  # N 16, h 1,536, 12 heads of 128, f 4,096; 2 cycles of 3 low runs, L_bp [2]


spec_of = partial(hf_spec, model_type="hrm_text")
workload = partial(transformers_workload, attention="flash")  # a fused kernel unless a test says eager


def test_the_runs_without_gradients_and_the_stack_norms_by_hand():
    # HrmTextConfig's defaults at s = 2,048, b = 1, bf16 (2 B), a fused kernel. L_bp_cycles [2] is left-padded to
    # [1, 2]: cycle 0 runs 2 of its 3 low-level stack runs under no_grad, cycle 1 one; 3 stack runs of 16 layers, 48
    # of the 128 runs, keep nothing. A run keeps Llama's layer with a sigmoid output gate and weightless norms: each
    # norm an fp32 copy of its input and 1/rms (4·s·b·h + 4·s·b), Q/K/V's input, Q, K, V, the kernel's output (2·s·b·h
    # each) and log-sum-exp (4·b·H·s), the gate's sigmoid output and o_proj's input (2·s·b·h each); the MLP's input
    # (2·s·b·h), gate and up outputs, SiLU's output and down_proj's input (2·s·b·f each).
    s, h, f, H = 2048, 1536, 4096, 12
    sbh, sb, sbf = s * h, s, s * f
    layer = 2 * (4 * sbh + 4 * sb) + 2 * 4 * sbh + 2 * sbh + 4 * H * s + 2 * 2 * sbh + 2 * sbh + 4 * 2 * sbf
    assert layer == 24 * sbh + 8 * sb + 8 * sbf + 4 * H * s == 142_721_024
    # each of the 8 − 3 = 5 trained stack runs ends with the stack's norm; the last is the model's final norm, so 4 more
    norm = 4 * sbh + 4 * sb
    hrm = spec_of(DEFAULTS)
    assert len(hrm.layer_reuse.no_grad_runs) == 48 and hrm.num_layers == 128
    one_pass = hrm.model_copy(update={"layer_reuse": None})  # the same 128 layers, each its own and trained
    w, w_plain = workload(hrm, s, 1), workload(one_pass, s, 1)
    assert layer_bytes(w, 1, False, 1, False) == layer
    assert stage_activations(w, Layout(), 0).total - stage_activations(w_plain, Layout(), 0).total == (
        -48 * layer + 4 * norm
    )
    # checkpointed: the 80 trained runs keep their input (2·s·b·h) and the 4 stack norms theirs; one run rebuilt
    ck, ck_plain = workload(hrm, s, 1, True), workload(one_pass, s, 1, True)
    kept, kept_plain = stage_activations(ck, Layout(), 0), stage_activations(ck_plain, Layout(), 0)
    assert kept.total - kept_plain.total == -48 * 2 * sbh + 4 * norm
    assert kept.rebuilt == kept_plain.rebuilt


def test_memory_lora_and_plan_take_it_and_pp_and_freeze_are_refused(tmp_path):
    path, best = takes_memory_lora_and_plan(tmp_path, "hrm_text", 2048)
    assert best.layout.pp == 1
    with pytest.raises(LmcalcError, match="looped layers are modelled on one pipeline stage, not PP=2") as refused:
        api.memory(model=path, gpus="2xh100", seq=2048, pp=2)
    assert "\n" not in str(refused.value)
    with pytest.raises(LmcalcError, match="the freeze method on .*'s looped layers: its bottom runs share"):
        api.memory(model=path, gpus="1xh100", seq=2048, method="freeze", freeze_layers=4)


def test_the_runs_without_gradients_are_timed_forward_only():
    # 48 of the 128 runs run under no_grad: their GEMMs run once, the other 80 three times (the input's and the
    # weight's gradients), so the layers' GEMM FLOPs are (1 + 2 · 80/128) / 3 = 3/4 of the same layers all trained
    hrm = spec_of(DEFAULTS)
    one_pass = hrm.model_copy(update={"layer_reuse": None})
    stage = StageLayers(hrm.num_layers, 0, False, False)
    looped, plain = (stage_work(workload(spec, 2048, 1), Grid(), stage) for spec in (hrm, one_pass))
    assert looped.gemm_flops == pytest.approx(plain.gemm_flops * (1 + 2 * 80 / 128) / 3)
    assert looped.attention_backward == pytest.approx(plain.attention_backward * 80 / 128)


pytest.importorskip("torch")
pytest.importorskip("transformers")

import hf_saved  # noqa: E402  (scripts/, on sys.path by conftest.py; imports torch and transformers)
import hf_step_peak  # noqa: E402
import torch  # noqa: E402
from saved_compare import assert_peak_match, assert_saved_match, harness_workload  # noqa: E402

from lmcalc.engine.memory.gpu_memory import gpu_memory  # noqa: E402

workload_of = partial(harness_workload, "hrm_text")  # scripts/hf_saved.py's cases, read as lmcalc reads them


SAVED = [("hrm-small", 128, 1, ck, att, torch.bfloat16) for ck in (False, True) for att in ("eager", "sdpa")]
SAVED += [("hrm-small", 256, 2, ck, "eager", torch.bfloat16) for ck in (False, True)]
SAVED += [("hrm-wide", 256, 2, False, "sdpa", torch.bfloat16), ("hrm-small", 256, 2, False, "eager", torch.float32)]
"""hrm-small runs 4 of its 12 layer runs under no_grad; hrm-wide trains every run (L_bp_cycles [2])."""


@pytest.mark.torch
@pytest.mark.parametrize(("name", "seq", "batch", "checkpointing", "attention", "dtype"), SAVED)
def test_bytes_kept_for_backward_match_transformers(name, seq, batch, checkpointing, attention, dtype):  # noqa: PLR0913
    m = hf_saved.measure(name, attention, seq, batch, checkpointing, dtype=dtype, use_cache=False)
    acts = stage_activations(
        workload_of(name, seq, batch, checkpointing, attention, fp32=dtype == torch.float32), Layout(), 0
    )
    assert_saved_match(m, acts, checkpointing)


@pytest.mark.torch
@pytest.mark.parametrize(
    ("name", "checkpointing"), [("hrm-small", False), ("hrm-small", True), ("hrm-wide", False), ("hrm-wide", True)]
)
def test_the_step_peak_matches_transformers(name, checkpointing):
    # s 256, b 2, eager. A held layer's weights get a gradient from each run, which autograd sums before .grad takes
    # it: every_gradient leaves all of them out with the parameters' gradients (model state, as lmcalc counts them).
    # hrm-small's vocabulary binds at the loss's backward; hrm-wide's final norm, or checkpointed, a run's backward
    hf_saved.release_models()
    m = hf_step_peak.measure(name, 256, 2, checkpointing, "eager", every_gradient=True)
    gpu = gpu_memory(workload_of(name, 256, 2, checkpointing, "eager"), Layout(), 0)
    assert_peak_match(m, gpu)
