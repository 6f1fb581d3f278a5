"""Megatron-Core's expert all-to-all overlap (``--moe-a2a-overlap``, engine.time.ep_overlap): the three phases of a
paired forward and backward, the passes the schedule leaves unpaired, and the settings Megatron-Core refuses it with.
The schedule is read from NVIDIA/Megatron-LM (combined_1f1b.py, model_chunk_schedule_plan.py, schedules.py); each
figure below is derived by hand from it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from lmcalc.engine.parallel.layout import Layout
from lmcalc.engine.parallel.layout_checks import check_layout
from lmcalc.engine.parallel.pipeline import PipelineSplit
from lmcalc.engine.search.plan import Pins, plan
from lmcalc.engine.time import rates
from lmcalc.engine.time.ep_overlap import MOE_LAYER, MoePhases, paired_exposure, unpaired_micro_batches
from lmcalc.engine.time.kernels import kernel_workload
from lmcalc.engine.time.microbatch import layer_times, moe_phases, unit_kernel_times
from lmcalc.engine.time.steptime import step_time
from lmcalc.engine.workload import Workload
from lmcalc.errors import LmcalcError
from lmcalc.presets import framework_profile, resolve_hardware, resolve_model, resolve_optimizer, resolve_precision
from lmcalc.specs import Cluster

BF16, FP32 = resolve_precision("bf16-mixed").spec, resolve_precision("fp32").spec
ADAMW = resolve_optimizer("adamw").spec
QWEN3_30B = resolve_model("qwen3-30b-a3b").spec
B200 = resolve_hardware("b200").spec
NODE = Cluster(hardware=B200, count=8, gpus_per_node=8)
TWO_NODES = Cluster(hardware=B200, count=16, gpus_per_node=8)
INTERLEAVED = PipelineSplit(schedule="interleaved", virtual_stages=12)


def qwen(mb: int = 4, overlap: bool = True, **changes) -> Workload:
    w = Workload(QWEN3_30B, BF16, ADAMW, 4096, mb, framework=framework_profile("megatron"), moe_a2a_overlap=overlap)
    return replace(w, **changes)


def test_a_pair_of_moe_layers_exposes_in_each_phase_the_longer_stream_less_the_compute():
    # phase 1: the backward's combine (a) beside the forward's attention side (F_o); phase 2: two dispatches (2a)
    # beside both passes' routed experts (E_f + E_b); phase 3: the forward's combine (a) beside the backward's
    # attention side (B_o)
    phases = MoePhases(outer_forward=3.0, outer_backward=7.0, experts_forward=1.0, experts_backward=2.0)
    assert paired_exposure(phases, 1.5) == 0.0  # every stream shorter than the computation beside it
    assert paired_exposure(phases, 4.0) == (4 - 3) + (8 - 3) + 0  # 1 in phase 1, 5 in phase 2, none in phase 3
    assert paired_exposure(phases, 10.0) == (10 - 3) + (20 - 3) + (10 - 7)


def test_the_unpaired_passes_are_the_first_forward_and_last_backward_or_the_warm_up_and_cool_down():
    # no pipeline: micro-batch 0's forward and the last one's backward run alone, one micro-batch's worth
    assert unpaired_micro_batches(Layout(dp=8, ep=8, grad_accum=16), 0) == 1
    # interleaved, p 4, v 12, m 64 (Megatron-Bridge's Qwen3 235B on GB300): warm-up chunks (p − rank − 1)·2 +
    # (v − 1)·p + 1, over v chunks a micro-batch
    layout = Layout(dp=64, pp=4, ep=32, grad_accum=64, split=INTERLEAVED)
    assert unpaired_micro_batches(layout, 0) == (3 * 2 + 11 * 4 + 1) / 12
    assert unpaired_micro_batches(layout, 3) == (0 * 2 + 11 * 4 + 1) / 12
    # fewer chunks than the warm-up asks: every pass unpaired (p 8, v 4, m 2: 39 warm-up chunks of 8)
    few = Layout(dp=4, pp=8, ep=4, grad_accum=2, split=PipelineSplit(schedule="interleaved", virtual_stages=4))
    assert unpaired_micro_batches(few, 0) == 2


def test_the_phases_split_one_moe_layer_and_its_routed_experts_run_three_gemms_a_weight():
    w = kernel_workload(qwen())
    grid = Layout(dp=8, ep=8).grid
    phases = moe_phases(w, grid, B200, rates.CALIBRATION)
    layer, _ = unit_kernel_times(w, grid, MOE_LAYER, B200, rates.CALIBRATION)
    assert sum(phases) == pytest.approx(layer.total, rel=1e-12)  # the four parts are the layer, nothing more
    # the routed experts' backward is an input- and a weight-gradient GEMM of each forward one's FLOPs
    assert phases.experts_backward == pytest.approx(2 * phases.experts_forward, rel=0.15)
    # and their forward, 3 GEMMs of 2·d·f FLOPs per routed row (T·k rows on each of the EP GPUs, balanced), runs
    # below the chip's matmul rate: d 2048, f 768, k 8, T = 4 · 4096
    moe = QWEN3_30B.moe
    flops = 3 * 2 * QWEN3_30B.hidden_size * moe.expert_ffn_size * (4 * 4096 * moe.k)
    assert (QWEN3_30B.hidden_size, moe.expert_ffn_size, moe.k) == (2048, 768, 8)
    assert flops / phases.experts_forward < rates.matmul_rate(B200, "bf16").flops_per_s


def test_the_step_hides_the_paired_all_to_alls_and_exposes_the_unpaired_ones():
    """step(overlap) = step(exposed) − m·A + m·X + e·(A − X), A one micro-batch's all-to-alls, X what its paired
    passes leave exposed (the three phases, per MoE layer), e the unpaired micro-batches: the schedule of
    combined_1f1b.py, over two nodes so that the all-to-alls cross the network."""
    layout = Layout(dp=16, ep=16, grad_accum=8)
    plain, over = step_time(qwen(overlap=False), layout, TWO_NODES), step_time(qwen(), layout, TWO_NODES)
    lt = layer_times(kernel_workload(qwen()), layout.grid, rates.Machine(TWO_NODES))
    moe_layers, m = QWEN3_30B.num_layers, 8
    a2a = 4 * moe_layers * lt.ep_one  # one micro-batch's, exposed whole
    paired = moe_layers * paired_exposure(lt.moe_phases, lt.ep_one)
    assert plain.ep == pytest.approx(m * a2a)
    assert over.ep == pytest.approx(m * paired + 1 * (a2a - paired))
    assert 0 < over.ep < plain.ep
    assert over.total == pytest.approx(plain.total - plain.ep + over.ep)
    assert over.tokens_per_s > plain.tokens_per_s


@pytest.mark.parametrize(
    "w,layout,message",
    [
        (qwen(), Layout(dp=8, grad_accum=8), "it needs EP > 1"),
        (qwen(), Layout(dp=4, pp=2, ep=4, grad_accum=8), "needs the interleaved schedule"),
        (qwen(recompute="full"), Layout(dp=8, ep=8), "without full recomputation"),
        (qwen(recompute="selective", recompute_modules=("moe",)), Layout(dp=8, ep=8), "MoE layer recomputed"),
        (qwen(framework=framework_profile("torchtitan")), Layout(dp=8, ep=8), "is Megatron-Core's"),
        (qwen(precision=FP32), Layout(dp=8, ep=8), "needs a 16-bit model"),
        (
            replace(qwen(), model=resolve_model("llama-3.1-8b").spec),
            Layout(dp=8),
            "llama-3.1-8b is dense",
        ),
    ],
)
def test_megatron_core_refuses_the_overlap_where_its_config_does(w, layout, message):
    with pytest.raises(LmcalcError, match=message):
        check_layout(w, layout, NODE)
    check_layout(qwen(), Layout(dp=4, pp=2, ep=4, grad_accum=24, split=INTERLEAVED), NODE)  # interleaved: runs


def test_a_search_with_the_overlap_tries_only_what_megatron_core_runs():
    found = plan(qwen(mb=1), NODE, 64, Pins(max_micro_batch=2))
    assert found.fitting
    for c in found.fitting:
        assert c.recompute != "full" and c.ep > 1 and (c.pp == 1 or c.layout.split.chunks > 1)
    with pytest.raises(LmcalcError, match="without full recomputation"):
        plan(qwen(mb=1), NODE, 64, Pins(recompute="full"))


def test_full_recomputation_as_a_lever_turns_the_overlap_off():
    from lmcalc.estimates.levers import fully_recomputed, unpulled

    changes, w = fully_recomputed(qwen())
    assert changes == (("recompute", "full"), ("moe_a2a_overlap", False))
    assert w.recompute == "full" and not w.moe_a2a_overlap
    check_layout(w, Layout(dp=8, ep=8), NODE)  # a run Megatron-Core launches
    assert "--recompute full --no-moe-a2a-overlap" in [lever.text for lever in unpulled(qwen(), Layout(dp=8, ep=8))]
    assert fully_recomputed(qwen(overlap=False))[0] == (("recompute", "full"),)
