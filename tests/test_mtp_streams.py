"""A multi-token-prediction module trained beside a model with mHC's n streams (DeepSeek-V4), as Megatron-LM
cae55c1f09 builds it (``megatron/core/transformer/multi_token_prediction.py``, ``MultiTokenPredictionLayer`` with
``enable_hyper_connections``): ``enorm`` on the next tokens' embedding and ``hnorm`` on each of the decoder's n
streams, ``e_proj`` (h → h) on the embedding and ``h_proj`` (h → h) on each stream, their outputs added (the
embedding's broadcast over the streams) into the module's layer, then ``learned_output_contract`` collapses the layer's
streams with ``hc_head_fn`` (n × n·h), ``hc_head_base`` (n) and ``hc_head_scale`` (1) before the final norm and the
shared head. Every figure below is counted by hand from those modules."""

import pytest

import lmcalc
from lmcalc.engine.memory.gpu_memory import stage_outside_bytes
from lmcalc.engine.model.params import layer_params, mtp_params, mtp_term
from lmcalc.engine.parallel.layout import Grid, Layout
from lmcalc.engine.parallel.pipeline import PipelineSplit, StageLayers
from lmcalc.engine.time.kernels import stage_work
from lmcalc.engine.workload import Workload
from lmcalc.errors import LmcalcError
from lmcalc.hf_config import model_from_hf_config
from lmcalc.presets import framework_profile, resolve_model, resolve_optimizer, resolve_precision
from lmcalc.specs import ModelSpec

pytestmark = pytest.mark.fast

SEQ = 128
V4 = resolve_model("deepseek-v4-flash").spec
H, N, VOCAB = 4096, 4, 129280
BF16 = 2


def workload(recompute: str = "none") -> Workload:
    precision, adamw = resolve_precision("bf16-mixed").spec, resolve_optimizer("adamw").spec
    return Workload(V4, precision, adamw, SEQ, 1, "flash", recompute, framework=framework_profile("megatron"))


def test_the_preset_is_the_shape_counted_here():
    assert (V4.hidden_size, V4.vocab_size, V4.hyper_connections.streams, V4.hyper_connections.mixing) == (
        H, VOCAB, N, True)  # fmt: skip


def test_its_parameters_are_the_projections_norms_layer_and_collapse():
    # enorm, hnorm, final_layernorm: 3·h; e_proj and h_proj: 2·h·h; hc_head_fn n·(n·h), hc_head_base n, scale 1
    layer = layer_params(V4, V4.is_moe_layer(V4.num_layers - 1))
    assert mtp_params(V4) == 3 * H + 2 * H * H + layer + N * N * H + N + 1
    assert N * N * H + N + 1 == 65_541
    term = mtp_term(V4.model_copy(update={"mtp_modules": 1}))
    assert "n·n·h + n + 1" in term.formula and "65,541" in term.substituted


def test_its_gemms_project_the_embedding_and_each_stream():
    # forward, per token: e_proj 2·h·h, h_proj 2·n·h·h; each runs again for its input's and its weight's gradient
    module = stage_work(workload(), Grid(), StageLayers(0, 0, False, False, 1, 0))
    assert module.gemm_flops == pytest.approx(3 * 2 * SEQ * H * H * (1 + N), rel=1e-12)
    # its head: the collapse's projection 2·(n·h)·n and the shared head 2·h·V, three GEMMs each
    head = stage_work(workload(), Grid(), StageLayers(0, 0, False, False, 0, 1))
    assert head.gemm_flops == pytest.approx(3 * 2 * SEQ * (N * H * N + H * VOCAB), rel=1e-12)


def test_its_element_wise_work_is_counted_by_hand():
    # where it is built, over s·b·h: the lookup (R h W h, and its gradient back), two fused norms over 1 + n rows of h
    # (2ε forward, 3ε backward), the projections' outputs added, the embedding's broadcast (R h + n·h, W n·h), its
    # gradient summed back over the streams (R n·h, W h); and the embedding copy's dense gradient zeroed (V·h·ε)
    elements = SEQ * H
    module = stage_work(workload(), Grid(), StageLayers(0, 0, False, False, 1, 0))
    assert module.memory_forward == pytest.approx((2 + 2 * (1 + N) + 1 + 2 * N) * BF16 * elements, rel=1e-12)
    assert module.memory_backward == pytest.approx(
        (2 + 3 * (1 + N) + N + 1) * BF16 * elements + VOCAB * H * BF16, rel=1e-12
    )


def test_its_collapse_runs_in_fp32_op_by_op_on_the_last_stage():
    # learned_output_contract, forward: .to(fp32) R n·h·ε W 4n·h; square R 4n·h W 4n·h; mean R 4n·h; the weights
    # times the streams R 4n·h W 4n·h; their sum R 4n·h W 4h; .to(bf16) R 4h W h·ε; backward twice the forward; the
    # rest of the head's work (final norm, loss) is the model head's
    w = workload()
    no_layers = stage_work(w, Grid(), StageLayers(0, 0, False, False))
    mtp_head = stage_work(w, Grid(), StageLayers(0, 0, False, False, 0, 1))
    model_head = stage_work(w, Grid(), StageLayers(0, 0, False, True))
    collapse = SEQ * ((BF16 + 28) * N * H + (BF16 + 8) * H)
    head_alone = model_head.memory_forward - no_layers.memory_forward
    assert mtp_head.memory_forward - no_layers.memory_forward == pytest.approx(head_alone + collapse, rel=1e-9)


def test_it_saves_its_norms_projection_inputs_and_its_own_collapse():
    # Megatron's fused RMSNorm keeps its input and an fp32 1/rms a row: enorm over s·b rows, hnorm over n·s·b; e_proj
    # keeps its h-wide input, h_proj its n·h-wide one; the head side is the model's but its collapse: the model's fused
    # one keeps the streams (n·h·ε) and 1 + 2n fp32 factors a token, the module's (learned_output_contract) an fp32
    # copy of the streams, 1/rms and 4 n-wide fp32 tensors (the projection, its scaled form, the sigmoid, the weights)
    w = workload()
    plain, trained = Layout(), Layout(split=PipelineSplit(mtp_layers=1))
    t = SEQ
    module = (t * H * BF16 + 4 * t) + (N * t * H * BF16 + 4 * N * t) + t * H * BF16 + N * t * H * BF16
    fused_collapse = N * t * H * BF16 + 4 * t * (1 + 2 * N)
    own_collapse = 4 * N * t * H + 4 * t + 4 * 4 * N * t
    _, head = stage_outside_bytes(w, plain, 0)
    _, with_mtp = stage_outside_bytes(w, trained, 0)
    assert with_mtp - head == pytest.approx(module + head - fused_collapse + own_collapse, rel=1e-12)


def test_deepseek_v4_trains_with_an_mtp_module_and_hy_v4s_ihc_is_refused():
    settings = dict(gpus="8xB200", framework="megatron", tp=1, cp=1, ep=8, seq=4096, micro_batch=1, zero=1)
    plain, trained = (lmcalc.memory(model="deepseek-v4-flash", grad_accum=8, mtp_layers=m, **settings) for m in (0, 1))
    assert trained.total > plain.total
    hy = ModelSpec.model_validate(model_from_hf_config({"model_type": "hy_v4"}, "hy", "test"))
    with pytest.raises(LmcalcError, match="hyper-connections without mixing"):
        lmcalc.memory(model=hy, gpus="8xB200", framework="megatron", mtp_layers=1)
