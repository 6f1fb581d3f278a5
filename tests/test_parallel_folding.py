"""MoE parallel folding: the routed experts laid out over a stage's TP·CP·DP GPUs in a grid of their own (expert TP,
EP, expert DP), as NVIDIA/Megatron-LM core_v0.16.1 (55ac7082) builds it: megatron/core/parallel_state.py makes
``expert_decoder_rank_generator`` with tp = expert_tensor_parallel_size (TP unless set), ep, and
dp = world / (ETP·EP·PP), and refuses a world size that ETP·EP·PP does not divide; the all-to-all dispatcher
(megatron/core/transformer/moe/token_dispatcher.py, MoEAlltoAllTokenDispatcher) sends each GPU's routed tokens over
the EP group, then gathers them over the expert TP group (``gather_from_sequence_parallel_region`` with
``self.tp_group = pg_collection.expt_tp``), and reduce-scatters them back before the combine.

Every figure below is derived by hand from Qwen3-235B-A22B's shapes (h 4096, 128 experts of width 1536, top-8, 94
layers, no shared expert; presets/models/qwen3-235b-a22b.yaml) and the rules above.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from lmcalc.engine.memory.gpu_memory import most_loaded_gpu
from lmcalc.engine.parallel.layout import Layout
from lmcalc.engine.parallel.layout_checks import check_layout
from lmcalc.engine.parallel.pipeline import StageLayers
from lmcalc.engine.parallel.sharding import stage_params
from lmcalc.engine.search.plan import Pins, plan
from lmcalc.engine.time import microbatch
from lmcalc.engine.time.comm import group_time
from lmcalc.engine.time.kernels import stage_work
from lmcalc.engine.time.rates import Machine
from lmcalc.engine.time.state_traffic import state_traffic
from lmcalc.engine.workload import Workload
from lmcalc.errors import LmcalcError
from lmcalc.presets import framework_profile, parse_cluster, resolve_model, resolve_optimizer, resolve_precision

H, E, F_E, K, L = 4096, 128, 1536, 8, 94
EXPERT = 3 * H * F_E  # gate, up and down of one SwiGLU expert: 18,874,368
CLUSTER = parse_cluster("32x8xH100")
# the published DGX-H100 layout of Megatron-Bridge 26.02's Qwen3-235B-A22B row: TP 2, PP 8, EP 32, ETP 1, DP 16
FOLDED = Layout(dp=16, tp=2, pp=8, ep=32, etp=1, sequence_parallel=True, zero=1, grad_accum=8)


def workload(seq: int = 4096, micro_batch: int = 1) -> Workload:
    bf16, adamw = resolve_precision("bf16-mixed").spec, resolve_optimizer("adamw").spec
    model = resolve_model("qwen3-235b-a22b").spec
    return Workload(model, bf16, adamw, seq, micro_batch, "flash", "full", framework=framework_profile("megatron"))


def test_ep_past_dp_needs_the_experts_folded_over_tp():
    w = workload()
    unfolded = replace(FOLDED, etp=None)  # ETP = TP = 2: EP must tile DP·CP = 16, and 32 does not
    with pytest.raises(LmcalcError, match=r"EP=32 must divide DP·CP = 16 .*1 folds EP over TP too"):
        check_layout(w, unfolded, CLUSTER)
    check_layout(w, FOLDED, CLUSTER)  # ETP·EP = 32 tiles DP·CP·TP = 32


def test_the_experts_grid_must_tile_the_stage():
    w = workload()
    with pytest.raises(LmcalcError, match=r"ETP·EP = 1·64 must divide DP·CP·TP = 32"):
        check_layout(w, replace(FOLDED, ep=64), CLUSTER)
    with pytest.raises(LmcalcError, match="needs sequence parallelism"):
        check_layout(w, replace(FOLDED, sequence_parallel=False), CLUSTER)
    with pytest.raises(LmcalcError, match="ETP=5 does not divide the experts' 1536 FFN width"):
        check_layout(w, Layout(dp=5, etp=5))  # ETP·EP = 5 tiles the 5 GPUs, but 1536 = 2⁹·3
    with pytest.raises(LmcalcError, match="ETP=2 needs a mixture-of-experts model"):
        bf16, adamw = resolve_precision("bf16-mixed").spec, resolve_optimizer("adamw").spec
        dense = Workload(resolve_model("llama-3-8b").spec, bf16, adamw, 4096, framework=framework_profile())
        check_layout(dense, Layout(dp=8, etp=2), parse_cluster("8xH100"))


def test_etp_equal_to_tp_is_the_default_layout():
    assert Layout(tp=2, etp=2) == Layout(tp=2)
    assert hash(Layout(tp=2, etp=2)) == hash(Layout(tp=2))
    assert Layout(tp=2, etp=1) != Layout(tp=2)
    assert FOLDED.code == "DP16 TP2 PP8 EP32 ETP1 Z1 SP"


def test_whole_experts_on_each_gpu_and_their_states_sharded_over_expert_dp():
    w = workload()
    # stage 1 builds 94/8 → 12 layers (the first six stages 12, the last two 11); EP 32 leaves 128/32 = 4 whole experts
    # of each layer on a GPU (ETP 1), where ETP = TP = 2 with EP 16 leaves 8 experts split in half: the same bytes
    held = stage_params(w, FOLDED, 0)
    assert held.experts == 12 * 4 * EXPERT
    unfolded = Layout(dp=16, tp=2, pp=8, ep=16, zero=1, sequence_parallel=True)
    assert stage_params(w, unfolded, 0).experts == held.experts
    # ZeRO-1 shards the experts' optimizer states over EDP = TP·CP·DP / (ETP·EP) = 32 / 32 = 1 copy: not at all;
    # the dense ones over DP·CP = 16
    memory = most_loaded_gpu(w, FOLDED)
    assert FOLDED.state_shards.expert_replicas == 1
    states = memory.kept
    adam = 8  # exp_avg, exp_avg_sq in fp32
    assert states.optimizer == pytest.approx(adam * (held.dense / 16 + held.experts / 1), rel=1e-12)


def test_expert_gemms_take_the_tokens_of_their_expert_tp_group():
    w = workload(seq=4096, micro_batch=1)
    built = StageLayers(0, 1, False, False)
    # ETP 1: a GPU's own tokens, T / TP = 2048 under SP; with balanced routing each of its 4 experts gets
    # m = 2048 · 8 · 32 / 128 = 4096 rows of whole width (1536 up, 4096 down)
    folded = {g.name: g for g in stage_work(w, FOLDED.grid, built).gemms if g.name.startswith("experts.")}
    assert {(g.m, g.n, g.k, g.count) for g in folded.values()} == {
        (4096, F_E, H, 4),  # gate, up: (m × h)·(h × f_e)
        (4096, H, F_E, 4),  # down
    }
    # ETP = TP = 2, EP 8: the expert TP group gathers both GPUs' tokens, 4096; 16 experts get 4096 · 8 · 8 / 128 =
    # 2048 rows each, of half the width
    split = Layout(dp=16, tp=2, pp=8, ep=8, sequence_parallel=True).grid
    halves = {(g.m, g.n, g.k, g.count) for g in stage_work(w, split, built).gemms if g.name.startswith("experts.")}
    assert halves == {(2048, F_E // 2, H, 16), (2048, H, F_E // 2, 16)}


def test_collectives_of_the_experts_grid():
    w = workload()
    layer = microbatch.layer_times(w, FOLDED.grid, Machine(CLUSTER))
    routed = 2048 * H * 2 * K  # a GPU's tokens under SP, k copies, bf16
    assert layer.etp_one == 0.0  # whole experts: nothing to gather
    # the EP group's 32 GPUs lie ETP = 1 apart: four nodes of 8; no node-limited routing for Qwen3
    assert layer.ep_one == group_time("all-to-all", routed, 32, 1, CLUSTER)
    split = Layout(dp=16, tp=2, pp=8, ep=8, sequence_parallel=True).grid
    unfolded = microbatch.layer_times(w, split, Machine(CLUSTER))
    gathered = 2 * routed  # the expert TP group's two GPUs' routed tokens
    assert unfolded.etp_one == group_time("all-gather", gathered, 2, 1, CLUSTER) + group_time(
        "reduce-scatter", gathered, 2, 1, CLUSTER
    )
    assert unfolded.ep_one == group_time("all-to-all", routed, 8, 2, CLUSTER)  # its GPUs TP = 2 apart


def test_expert_gradients_reduce_over_expert_dp():
    w = replace(workload(), micro_batch=1, recompute="none")
    built = StageLayers(0, 12, True, False)
    layout = Layout(dp=16, tp=2, pp=8, ep=8, etp=1, sequence_parallel=True, zero=0, grad_accum=8)
    held = stage_params(w, layout, 0)
    traffic = state_traffic(w, layout.state_shards, 1, built, Machine(CLUSTER))
    grad = w.grad_bytes
    # dense gradients over DP·CP = 16 copies TP·CP = 2 apart; the experts' over EDP = 32 / 8 = 4 copies ETP·EP = 8 apart
    dense = group_time("all-reduce", held.dense * grad, 16, 2, CLUSTER)
    experts = group_time("all-reduce", held.experts * grad, 4, 8, CLUSTER)
    assert traffic.reduce == pytest.approx(dense + experts, rel=1e-12)


def test_plan_searches_the_folded_layouts():
    w = workload()
    found = plan(w, CLUSTER, 512, Pins(tp=2, pp=8, ep=32, micro_batch=1, zero=1, recompute="full", schedule="1f1b"))
    assert found.fitting or found.closest
    best = found.fitting[0] if found.fitting else found.closest
    assert best.layout.etp == 1 and best.layout.ep == 32
    with pytest.raises(LmcalcError, match="EP=32 must divide DP·CP = 16"):
        plan(w, CLUSTER, 512, Pins(tp=2, pp=8, ep=32, etp=2, micro_batch=1, zero=1, recompute="full"))
