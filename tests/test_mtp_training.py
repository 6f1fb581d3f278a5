"""Multi-token-prediction modules trained with the model (DeepSeek-V3 §2.2; Megatron-Core's ``--mtp-num-layers``,
lmcalc's ``mtp_layers``). Read from NVIDIA/Megatron-LM d98e8a64: ``megatron/core/transformer/multi_token_prediction.py``
``MultiTokenPredictionLayer`` builds two RMSNorms (enorm, hnorm), ``eh_proj`` (a column-parallel 2h → h linear, no
bias), one transformer layer of the decoder's spec and a final norm; ``megatron/core/models/gpt/gpt_model.py`` builds
the word embedding on every stage that runs MTP (``pre_process or mtp_process``) and computes the MTP logits with the
output layer on the last stage. Every figure below is counted by hand from those modules."""

from dataclasses import replace

import pytest

import lmcalc
from lmcalc.engine.memory.gpu_memory import stage_outside_bytes
from lmcalc.engine.parallel.layout import Grid, Layout, ModelSplit
from lmcalc.engine.parallel.pipeline import PipelineSplit, StageLayers, stage_layers
from lmcalc.engine.parallel.sharding import trained_held
from lmcalc.engine.time import rates
from lmcalc.engine.time.kernels import stage_work
from lmcalc.engine.time.microbatch import layer_times, micro_batch_time
from lmcalc.engine.workload import Workload
from lmcalc.errors import LmcalcError
from lmcalc.presets import framework_profile, parse_cluster, resolve_optimizer, resolve_precision
from lmcalc.specs import ModelSpec

SEQ, BATCH, H, V, TP = 64, 2, 64, 256, 2
MOE = ModelSpec(
    name="moe-like", vocab_size=V, hidden_size=H, num_layers=4, num_heads=4, num_kv_heads=2, ffn_size=160,
    max_seq_len=256, ffn_kind="swiglu", norm_kind="rmsnorm", position_embedding="rope", tied_embeddings=False,
    moe=dict(num_experts=4, experts_per_token=2, expert_ffn_size=96),
)  # fmt: skip
FP32 = 4  # bytes an activation: the fp32 recipe


def workload(spec: ModelSpec = MOE, recompute: str = "none") -> Workload:
    fp32, adamw = resolve_precision("fp32").spec, resolve_optimizer("adamw").spec
    return Workload(spec, fp32, adamw, SEQ, BATCH, "flash", recompute, framework=framework_profile("megatron"))


def test_the_last_stage_builds_the_mtp_layer_and_runs_its_head():
    # 4 MoE layers on 2 stages, 2 each; one MTP module: one more MoE layer (the last layer's kind) on stage 1, its
    # projection there and its pass through the head on the same stage (the last)
    layout = Layout(pp=2, grad_accum=2, split=PipelineSplit(mtp_layers=1))
    assert stage_layers(MOE, layout, 0) == StageLayers(0, 2, True, False, 0, 0)
    assert stage_layers(MOE, layout, 1) == StageLayers(0, 3, False, True, 1, 1)


def test_its_gemms_are_the_projection_and_a_second_head():
    # per MTP module on one GPU of TP 2, forward: eh_proj 2·(s·b)·(2h)·(h/TP), the head 2·(s·b)·h·(V/TP); each runs
    # again for its input's gradient and its weight's: 3 GEMMs a weight
    tokens = SEQ * BATCH
    grid = Grid(TP, 1, 1, False, TP)
    module, heads = (stage_work(workload(), grid, StageLayers(0, 0, False, False, *unit)) for unit in ((1, 0), (0, 1)))
    assert module.gemm_flops == pytest.approx(3 * 2 * tokens * 2 * H * H / TP)
    assert heads.gemm_flops == pytest.approx(3 * 2 * tokens * H * V / TP)


def test_its_element_wise_work_is_counted_by_hand():
    # where it is built: the lookup (read and write a row: 2·4 bytes forward, its gradient added back 2·4), two norms
    # (fused: 2·4 forward, 3·4 backward each) and the concatenation (2·2h·4 each way), over s·b·h; and on a stage
    # without the model's embedding, the copy's dense gradient zeroed (V·h·4)
    elements = SEQ * BATCH * H
    module = stage_work(workload(), Grid(), StageLayers(0, 0, False, False, 1, 0))
    assert module.memory_forward == pytest.approx((2 + 2 * 2 + 2 * 2) * FP32 * elements)
    assert module.memory_backward == pytest.approx((2 + 2 * 3 + 2 * 2) * FP32 * elements + V * H * FP32)
    # on the last stage, its loss over the logits (read the logits, write and read the loss's fp32 copies: e + 3·L
    # forward, 2·L + e backward, L the bytes the profile's loss keeps a logit) and its final norm (fused: 2e, 3e)
    w = workload()
    loss = w.framework.loss.saved_bytes or FP32
    no_layers = stage_work(w, Grid(), StageLayers(0, 0, False, False))
    mtp_head = stage_work(w, Grid(), StageLayers(0, 0, False, False, 0, 1))
    logits, rows = SEQ * BATCH * V, SEQ * BATCH * H
    assert mtp_head.memory_forward - no_layers.memory_forward == pytest.approx(
        (FP32 + 3 * loss) * logits + 2 * FP32 * rows
    )
    assert mtp_head.memory_backward - no_layers.memory_backward == pytest.approx(
        (2 * loss + FP32) * logits + 3 * FP32 * rows
    )


def test_its_stage_holds_its_parameters_and_a_copy_of_the_embedding():
    # beyond its layer: enorm, hnorm and the final norm (3h), eh_proj (2h·h, split by TP) and the word embedding
    # (V·h / TP), which Megatron-Core builds on the stage that runs MTP: the last, or a stage of their own
    split = ModelSplit(TP, 1, TP)
    full = workload().method
    layer = trained_held(MOE, full, split, StageLayers(0, 1, False, False)).total
    for spec in (MOE, MOE.model_copy(update={"tied_embeddings": True})):  # tied: the output layer keeps its own too
        for with_mtp, without in (
            (StageLayers(0, 3, False, True, 1, 1), StageLayers(0, 2, False, True)),  # on the last stage
            (StageLayers(0, 3, False, False, 1, 0), StageLayers(0, 2, False, False)),  # a stage of their own
        ):
            extra = trained_held(spec, full, split, with_mtp).total - trained_held(spec, full, split, without).total
            assert extra - layer == pytest.approx(3 * H + 2 * H * H / TP + V * H / TP)
    one_stage = StageLayers(0, 5, True, True, 1, 1)  # the embedding is already there
    assert trained_held(MOE, full, split, one_stage).total - trained_held(
        MOE, full, split, StageLayers(0, 4, True, True)
    ).total == pytest.approx(layer + 3 * H + 2 * H * H / TP)


def test_it_saves_its_norms_inputs_projection_input_and_a_second_head_side():
    # Megatron's fused RMSNorm keeps its input and an fp32 1/rms a row; eh_proj keeps its 2h-wide input; the MTP's
    # head side is the model's (final norm, head input, the logits the loss keeps); TP 1, fp32
    w = workload()
    plain = Layout(pp=2, grad_accum=2)
    trained = Layout(pp=2, grad_accum=2, split=PipelineSplit(mtp_layers=1))
    tokens = SEQ * BATCH
    module = 2 * (tokens * H * FP32 + tokens * 4) + tokens * 2 * H * FP32
    _, head = stage_outside_bytes(w, plain, 1)
    _, with_mtp = stage_outside_bytes(w, trained, 1)
    assert with_mtp - head == pytest.approx(module + head)


def test_the_last_stage_holds_more_and_the_step_takes_longer():
    # DeepSeek-V3's 61 layers on 16 stages (4 each but the last three, 3): the MTP module's MoE layer, its projection
    # and its second pass through the head make the last stage the slowest, and only its memory grows
    settings = dict(model="deepseek-v3", gpus="32x8xH200", pp=16, ep=8, tp=1, cp=1, seq=4096, micro_batch=1, zero=1,
                    recompute="full")  # fmt: skip
    plain, trained = (lmcalc.memory(stages=True, grad_accum=64, mtp_layers=n, **settings) for n in (0, 1))
    assert trained.stages[-1].allocated > plain.stages[-1].allocated
    assert [s.allocated for s in trained.stages[:-1]] == [s.allocated for s in plain.stages[:-1]]
    faster, slower = (lmcalc.plan(global_batch=1024 * 4096, mtp_layers=n, **settings).layouts[0] for n in (0, 1))
    assert slower.tokens_per_s < faster.tokens_per_s


def test_under_full_recomputation_the_module_keeps_its_checkpoint():
    # Megatron-Core checkpoints the projection and the layer whole: it keeps the hidden state (the layer's checkpoint,
    # counted with the stage's layers) and the next tokens' embedding, s·b·h
    w = workload(recompute="full")
    trained = Layout(pp=2, grad_accum=2, split=PipelineSplit(mtp_layers=1))
    _, head = stage_outside_bytes(w, Layout(pp=2, grad_accum=2), 1)
    _, with_mtp = stage_outside_bytes(w, trained, 1)
    assert with_mtp - head == pytest.approx(SEQ * BATCH * H * FP32 + head)


@pytest.mark.parametrize(
    ("settings", "said"),
    [
        ({"method": "lora"}, "is for full training; a lora fine-tune trains none"),
        ({"framework": "torchtitan"}, "the torchtitan profile has none"),
        ({"recompute": "full", "recompute_num_layers": 2}, "uniform method at recompute_num_layers 1"),
        ({"model": "gpt2-124m"}, "gpt2-124m has learned positions"),
    ],
)
def test_what_megatron_core_refuses_beside_mtp_is_one_line(settings, said):
    given = {"model": "llama-3.1-8b", "gpus": "1xH100", "framework": "megatron", "mtp_layers": 1, **settings}
    with pytest.raises(LmcalcError, match=said):
        lmcalc.memory(**given)


@pytest.mark.torch
@pytest.mark.parametrize(
    ("layout", "pp"),
    [
        ("Et*30|t*31mL", 2),
        ("Et*30|t*31m|L", 3),
        ("Et*30|t*31m||L", 2),
        ("Et*3|(tt|)*29,m|L", 16),
        ("Et*15|t*15|mt*16|t*15L", 4),
    ],
)
def test_the_layouts_megatron_core_accepts_are_those_lmcalc_accepts(layout, pp):
    from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout

    try:
        PipelineParallelLayerLayout(layout, pp).validate_layer_layout(61, 1)
        theirs = None
    except AssertionError as refusal:
        theirs = refusal
    settings = dict(model="deepseek-v3", gpus=f"{pp * 8}xH200", pp=pp, ep=8, framework="megatron", mtp_layers=1,
                    grad_accum=2 * pp)  # fmt: skip
    if theirs is None:
        lmcalc.memory(pipeline_layout=layout, **settings)
    else:
        with pytest.raises(LmcalcError):
            lmcalc.memory(pipeline_layout=layout, **settings)


@pytest.mark.parametrize(("sequence_parallel", "forward", "backward"), [(True, 1.5, 2.5), (False, 0.5, 2.0)])
def test_its_projection_gathers_and_reduces_over_tp(sequence_parallel, forward, backward):
    # eh_proj is column-parallel and its h/TP-wide output is gathered (multi_token_prediction.py _concat_embeddings),
    # counted in all-reduces of an h-wide activation (an all-gather or a reduce-scatter of it moves half one): with SP
    # the 2h input gathered (1) and the output gathered (0.5) forward; backward the sequence scatter's gather (0.5),
    # the input gathered again for the weight's gradient (1) and the input's gradient reduce-scattered (1); without SP
    # the output gathered (0.5) forward and the 2h input's gradient all-reduced (2) backward. No overlap here.
    base = workload()
    speed = base.framework.speed.model_copy(update={"tp_overlap": "none"})
    w = replace(base, framework=base.framework.model_copy(update={"speed": speed}))
    machine = rates.Machine(parse_cluster("8xH100"))
    grid = Grid(TP, 1, 1, sequence_parallel, TP)
    tp_one = layer_times(w, grid, machine).tp_one
    assert tp_one > 0
    with_mtp, without = (micro_batch_time(w, grid, StageLayers(0, 0, False, False, n, 0), machine) for n in (1, 0))
    assert with_mtp.tp - without.tp == pytest.approx((forward + backward) * tp_one)
