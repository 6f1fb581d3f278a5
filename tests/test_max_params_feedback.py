"""Issue #18 item 12: whatever ``max-params`` says fits must fit in ``memory``. Each answer (the largest shape of the
template's proportions, for each ZeRO strategy) is fed back to ``memory`` with the same GPUs, layout and settings,
which must find it fits, to the byte figure ``max-params`` reported; and one more layer at its width must not fit, so
the answer is the largest, not merely one that fits (issue #32: the depth is solved to the layer)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lmcalc import api
from lmcalc.engine.search.maxparams import with_layers

GPUS = ["H100", "A100-40GB", "RTX4090", "L4"]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    gpu=st.sampled_from(GPUS),
    count=st.sampled_from([1, 8, 64]),
    seq=st.sampled_from(["512", "2048", "8192"]),
    recompute=st.sampled_from(["none", "full"]),
    framework=st.sampled_from(["megatron", "deepspeed", "transformers"]),
)
def test_every_max_params_answer_fits_in_memory(gpu, count, seq, recompute, framework):
    gpus = f"{count}x{gpu}"
    common = dict(seq=seq, recompute=recompute, framework=framework)
    answer = api.max_params(gpus=gpus, **common)
    for row in answer.rows:
        if row.activation_shape is None:
            continue
        layout = dict(zero=row.zero_stage, dp=count)
        fed_back = api.memory(model=row.activation_shape, gpus=gpus, **common, **layout)
        assert fed_back.fits, (gpus, row.label, fed_back.total)
        assert fed_back.total == row.memory.total  # type: ignore[union-attr]
        larger = with_layers(row.activation_shape, row.activation_shape.num_layers + 1)
        assert not api.memory(model=larger, gpus=gpus, **common, **layout).fits
