"""Training memory of DeepSeek-V4's compressed attention and the hyper-connections of DeepSeek-V4 and HY V4
(``engine.memory.compressed``): one term derived by hand, then what transformers 5.24 keeps for backward on the CPU
(``scripts/hf_saved.py``'s deepseek-v4-small and hy-v4-small, three layers, eager attention, the only one their
models take) within 5 %, and the step's peak (``scripts/hf_step_peak.py``) within 3 %."""

from __future__ import annotations

import pytest

from lmcalc.engine.memory.compressed import SINKHORN_ITERATIONS, compressed_attention_saved, streams_saved
from lmcalc.engine.workload import Workload
from lmcalc.hf_config import model_from_hf_config
from lmcalc.presets import framework_profile, resolve_optimizer, resolve_precision
from lmcalc.specs import ModelSpec

FLASH = {"model_type": "deepseek_v4"}  # DeepseekV4Config's defaults: V4-Flash's widths


def workload(config: dict, seq: int, micro_batch: int) -> Workload:
    spec = ModelSpec.model_validate(model_from_hf_config(config, "v4", "test"))
    return Workload(spec, resolve_precision("bf16-pure").spec, resolve_optimizer("adamw").spec, seq, micro_batch,
                    "eager", "none", framework=framework_profile("transformers"))  # fmt: skip


def test_an_mhc_sublayer_by_hand():
    # V4-Flash at s = 4,096, b = 1: h 4,096, n 4 streams, T = 20 Sinkhorn iterations, bf16 activations. A sub-layer's
    # mHC keeps the streams in bf16 (2·t·n·h), their fp32 copy and its normed copy (2 × 4·t·n·h), 1/rms (4·t), the
    # projection's (2+n)·n outputs, the two sigmoids, the softmax and the collapse weights in fp32 (4·t·(24 + 8 + 16
    # + 4)), 2T − 1 = 39 Sinkhorn divisions each keeping an n × n dividend and n sums (4·t·39·(16 + 4)), and the
    # mixing matrix, the spread weights and the sub-layer's output cast (2·t·(16 + 4 + h))
    t, h, n = 4096, 4096, 4
    by_hand = t * (2 * n * h + 2 * 4 * n * h + 4 + 4 * (24 + 8 + 16 + 4) + 4 * 39 * (16 + 4) + 2 * (16 + 4 + h))
    assert by_hand == 4096 * 175_404 == 718_454_784  # 718 MB a sub-layer, 1.44 GB a layer
    w = workload(FLASH, 4096, 1)
    assert SINKHORN_ITERATIONS == 20
    attention_half = [x for x in streams_saved(w) if x.block == "attention"]
    assert sum(x.bytes for x in attention_half) == by_hand
    assert sum(x.bytes for x in streams_saved(w)) == 2 * by_hand


def test_a_csa_layers_scores_by_hand():
    # V4-Flash's layer 3 (CSA, m 4) at s = 4,096, b = 1: each of the 64 heads scores the 4,096 tokens and the 1,024
    # entries (transformers concatenates them, masking what a query may not read), plus the sink: the fp32 softmax
    # keeps 64 × 4,096 × 5,121 × 4 bytes, its cast 64 × 4,096 × 5,120 × 2, the row maxima 64 × 4,096 × 8
    w = workload(FLASH, 4096, 1)
    c = w.model.compressed_attention
    assert c is not None and 3 in c.csa_layer_ids
    core = sum(x.bytes for x in compressed_attention_saved(w, 3) if x.attention_core)
    assert core == 64 * 4096 * (5121 * 4 + 5120 * 2 + 8) == 8_056_209_408


pytest.importorskip("torch")
pytest.importorskip("transformers")

import hf_step_peak  # noqa: E402  (scripts/, on sys.path by conftest.py; imports torch and transformers)
from test_framework_transformers import Case, free_models, within_tolerance  # noqa: E402, F401
from test_step_phases import measured, predicted_peak  # noqa: E402

NAMES = ("deepseek-v4-small", "hy-v4-small")
SAVED = [Case(name, "eager", ckpt, s, b) for name in NAMES for ckpt in (False, True) for s, b in ((128, 1), (256, 2))]
PEAK_NOT_MODELLED = {
    "hy-v4-small-eager-ckpt-s256-b2": "under checkpointing HY V4's step peaks in a rebuilt layer's backward, "
    "25,536,520 B, where lmcalc binds at the indexer's scores in a layer's forward, 22,775,569 B (−10.8 %); the "
    "saved tensors agree (the forward and closures −4.8 %, the rebuilt layer −2.5 %): the backward of its fp32 iHC "
    "and the sink's fp32 softmax is not in lmcalc's layer transients yet",
}


@pytest.mark.torch
@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in SAVED])
def test_bytes_kept_for_backward_match_transformers(case: Case):
    within_tolerance(case)


@pytest.mark.torch
@pytest.mark.parametrize(
    "case",
    [
        pytest.param(
            c,
            id=c.id,
            marks=[pytest.mark.xfail(strict=True, reason=PEAK_NOT_MODELLED[c.id])] if c.id in PEAK_NOT_MODELLED else [],
        )
        for c in (Case(name, "eager", ckpt, 256, 2) for name in NAMES for ckpt in (False, True))
    ],
)
def test_the_step_peak_matches_transformers(case: Case):
    m = measured(case)
    peak, phase = predicted_peak(case)
    assert abs(peak / m.peak - 1) < 0.03, f"{case.id}: measured {m.peak:,} B, lmcalc {peak:,.0f} B at {phase}"
    hf_step_peak.hf_saved.release_models()
