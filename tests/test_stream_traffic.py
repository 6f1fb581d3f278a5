"""The step-time model's hyper-connection kernels (DeepSeek-V4's mHC, HY V4's iHC): the bytes and kernels of the
streams' collapse, spread and mixing, in place of the residual adds (engine.time.memory_traffic._stream_traffic,
docs/formulas.md §8.5). Each figure is derived here from the code it models, pass by pass."""

import pytest

from lmcalc.engine.parallel.layout import Grid
from lmcalc.engine.parallel.pipeline import StageLayers
from lmcalc.engine.time.memory_traffic import MemoryTraffic, _residual_traffic, stage_shape
from lmcalc.engine.workload import Workload
from lmcalc.hf_config import model_from_hf_config
from lmcalc.presets import framework_profile, resolve_model, resolve_optimizer, resolve_precision
from lmcalc.specs import ModelSpec

pytestmark = pytest.mark.fast

TOKENS, LAYERS = 4096, 10


def _hy_v4() -> ModelSpec:
    """HY V4 at HYV4Config's defaults (iHC: streams without mixing), as transformers' config writes them."""
    return ModelSpec.model_validate(model_from_hf_config({"model_type": "hy_v4"}, "hy", "test"))


def _tally(model: str | ModelSpec, profile: str) -> MemoryTraffic:
    """The residual rule's tally on one GPU of a stage of ``LAYERS`` MoE layers, one sequence of ``TOKENS``."""
    spec = resolve_model(model).spec if isinstance(model, str) else model
    w = Workload(spec, resolve_precision("bf16-mixed").spec, resolve_optimizer("adamw").spec, TOKENS, 1,
                 framework=framework_profile(profile))  # fmt: skip
    out = MemoryTraffic()
    _residual_traffic(stage_shape(w, Grid(), StageLayers(0, LAYERS, False, False)), out)
    return out


def test_megatron_cores_fused_mhc_moves_what_its_kernels_read_and_write():
    # DeepSeek-V4-Flash: n = 4 streams of h = 4,096, bf16 (2 B). A sub-layer, a token, in values of h:
    # forward   h_aggregate R n·h W h; h_post_bda R n·h + h W n·h                       -> 3n·h + 2h = 14h
    # backward  h_post_bda R 2n·h + h W n·h + h; h_aggregate R h + n·h W n·h;
    #           fused_add_3 R 3n·h W n·h                                                 -> 9n·h + 3h = 39h
    # (the projection's reads are its GEMM's); 3 kernels forward (Sinkhorn, collapse, spread), 4 backward.
    h, sublayers = 4096, 2 * LAYERS
    out = _tally("deepseek-v4-flash", "megatron")
    assert out.forward == pytest.approx(sublayers * TOKENS * 14 * h * 2, rel=1e-12)
    assert out.backward == pytest.approx(sublayers * TOKENS * 39 * h * 2, rel=1e-12)
    assert out.kernels == sublayers * 7


def test_transformers_runs_the_eager_mhc_op_by_op():
    # DeepseekV4HyperConnection and the decoder layer, forward, a token, bf16 streams (N = n·h = 4h):
    # .float() R 2N W 4N; square R 4N W 4N; mean R 4N; x·rsqrt R 4N W 4N; pre·streams R 2N W 4N; sum R 4N W 4h;
    # .to(bf16) R 4h W 2h; post·output R 2h W 2N; comb matmul R 2N W 2N; add R 4N W 2N
    # = 16N + 32N (bf16 passes 8·2 B, fp32 32 B) + 12h (4 + 4 + 2 + 2) = 48·4h + 12h = 204h;
    # the backward twice; 144 kernels forward: 1 cast, 6 for the norm, 4 each for pre, post and comb, 117 for
    # Sinkhorn (39 passes of sum, add, divide), 3 for the collapse, 2 for post, 2 for comb, 1 add; 288 backward.
    h, sublayers = 4096, 2 * LAYERS
    out = _tally("deepseek-v4-flash", "transformers")
    forward = sublayers * TOKENS * 204 * h
    assert out.forward == pytest.approx(forward, rel=1e-12)
    assert out.backward == pytest.approx(2 * forward, rel=1e-12)
    assert out.kernels == sublayers * (144 + 288)
    assert 1 + 6 + 3 * 4 + 3 * (2 * 20 - 1) + 3 + 2 + 2 + 1 == 144


def test_hy_v4s_ihc_runs_in_fp32_op_by_op():
    # HYV4HyperConnection (autocast off) and the decoder layer's spread, a token, bf16 streams (N = n·h):
    # flatten.float() R 2N W 4N; square R 4N W 4N; mean R 4N; pre·streams R 2N W 4N; sum R 4N W 4h; .to R 4h W 2h;
    # output.float() R 2h W 4h; post·output R 4h W 4N; residual.float() R 2N W 4N; add R 8N W 4N; .to R 4N W 2N
    # = 8N + 48N + (16 + 4)h = 56N + 20h
    model = _hy_v4()
    hc, h, sublayers = model.hyper_connections, model.hidden_size, 2 * LAYERS
    assert hc is not None and not hc.mixing
    out = _tally(model, "transformers")
    forward = sublayers * TOKENS * (56 * hc.streams * h + 20 * h)
    assert out.forward == pytest.approx(forward, rel=1e-12)
    assert out.backward == pytest.approx(2 * forward, rel=1e-12)
    assert out.kernels == sublayers * (23 + 46)


def test_a_model_without_streams_keeps_its_residual_adds():
    # Qwen3-30B-A3B: two residual adds a layer, each R 2h W h in bf16, forward and backward alike, 2 kernels each
    h = resolve_model("qwen3-30b-a3b").spec.hidden_size
    out = _tally("qwen3-30b-a3b", "megatron")
    assert out.forward == out.backward == pytest.approx(2 * LAYERS * TOKENS * 3 * 2 * h, rel=1e-12)
    assert out.kernels == 2 * 2 * LAYERS
