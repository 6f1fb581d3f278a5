"""Properties that must hold for any valid input (hypothesis): monotone, consistent units, finite."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lmcalc.engine.memory.gpu_memory import gpu_memory
from lmcalc.engine.parallel import layout as ly
from lmcalc.engine.parallel.pipeline import PipelineSplit
from lmcalc.engine.run.cost import RunTime, gpus_for_deadline
from lmcalc.engine.time.steptime import step_time
from lmcalc.engine.workload import Workload
from lmcalc.presets import framework_profile, registry, resolve_hardware, resolve_optimizer, resolve_precision
from lmcalc.specs import Cluster
from lmcalc.units import SECONDS_PER_DAY, SECONDS_PER_HOUR

MODELS = sorted(name for name, spec in registry("models").specs.items() if not spec.counted_only)
"""The presets whose memory and step time lmcalc models (a counted-only one, DeepSeek-V4-Flash's, refuses them)."""
MIXED = resolve_precision("bf16-mixed").spec
ADAMW = resolve_optimizer("adamw").spec
model_names = st.sampled_from(MODELS)


def spec(name):
    return registry("models").spec(name)


def workload(model, seq, micro_batch=1, attention="flash", recompute="none"):
    """bf16-mixed (2-byte activations), AdamW, no overhead allowance: the properties concern states and
    activations alone."""
    return Workload(
        model, MIXED, ADAMW, seq, micro_batch, attention, recompute, overhead_bytes=0.0, framework=framework_profile()
    )


@settings(max_examples=200, deadline=None)
@given(
    flops=st.floats(1e15, 1e27),
    gpus=st.integers(1, 1 << 20),
    extra=st.integers(1, 1 << 10),
    peak=st.floats(1e12, 1e16),
    mfu=st.floats(0.01, 1.0),
    tokens=st.floats(1e6, 1e15),
)
def test_more_gpus_never_slow_the_napkin_time(flops, gpus, extra, peak, mfu, tokens):
    fewer, more = RunTime(flops, gpus, peak, mfu, tokens), RunTime(flops, gpus + extra, peak, mfu, tokens)
    assert more.seconds <= fewer.seconds
    for run in (fewer, more):  # unit consistency and no NaN/inf, up to 1e27 FLOPs
        assert math.isfinite(run.seconds) and run.seconds > 0
        assert run.days * SECONDS_PER_DAY == pytest.approx(run.seconds)
        assert run.gpu_hours * SECONDS_PER_HOUR == pytest.approx(run.gpus * run.seconds)
        assert math.isfinite(run.tokens_per_s) and run.tokens_per_s > 0
    needed = gpus_for_deadline(flops, fewer.days, peak, mfu)
    assert needed == pytest.approx(gpus)  # the deadline solver inverts the time


@settings(max_examples=60, deadline=None)
@given(name=model_names, dp=st.sampled_from([1, 2, 8, 64, 1024]), seq=st.sampled_from([512, 2048, 8192]))
def test_more_zero_sharding_never_increases_state_memory(name, dp, seq):
    model = spec(name)
    states = [gpu_memory(workload(model, seq), ly.Layout(dp=dp, zero=z), 0).states for z in (0, 1, 2, 3)]
    assert states == sorted(states, reverse=True)
    assert all(math.isfinite(s) and s > 0 for s in states)


@settings(max_examples=60, deadline=None)
@given(
    name=model_names,
    seq=st.integers(1, 16384),
    longer=st.integers(1, 16384),
    batch=st.integers(1, 16),
    attention=st.sampled_from(["flash", "eager"]),
    recompute=st.sampled_from(["none", "selective", "full"]),
)
def test_longer_sequences_never_shrink_activations(name, seq, longer, batch, attention, recompute):
    model = spec(name)
    if model.mlstm:  # whole chunks: transformers runs an mLSTM's tokens past the last whole chunk one step at a time,
        # each keeping its own state for backward, so xLSTM-7B keeps more at 63 tokens than at 64 (one chunk of L = 64)
        chunk = model.mlstm.chunk
        seq, longer = -(-seq // chunk) * chunk, -(-longer // chunk) * chunk
    # the whole model on one GPU (the trivial layout)
    short = gpu_memory(workload(model, seq, batch, attention, recompute), ly.Layout(), 0).activations
    long = gpu_memory(workload(model, seq + longer, batch, attention, recompute), ly.Layout(), 0).activations
    assert 0 < short <= long and math.isfinite(long)


@settings(max_examples=60, deadline=None)
@given(name=model_names, tp=st.sampled_from([1, 2, 4, 8]), sp=st.booleans(), seq=st.sampled_from([1024, 4096]))
def test_tensor_parallelism_never_increases_a_gpus_share(name, tp, sp, seq):
    model = spec(name)
    if model.num_heads % tp or (not model.mla and model.kv_heads % tp):
        return
    one = gpu_memory(workload(model, seq), ly.Layout(), 0)
    split = gpu_memory(workload(model, seq), ly.Layout(tp=tp, sequence_parallel=sp), 0)
    assert split.states <= one.states and split.activations <= one.activations


@settings(max_examples=80, deadline=None)
@given(
    name=model_names,
    pp=st.sampled_from([1, 2, 3, 4, 8, 16]),
    first=st.sampled_from([None, 1, 2]),
    seq=st.sampled_from([512, 2048, 8192]),
    recompute=st.sampled_from(["none", "selective", "full"]),
)
def test_the_slowest_stage_is_never_faster_than_an_even_split(name, pp, first, seq, recompute):
    # The pipeline waits for its slowest stage, which holds at least the average share of the work: the step is
    # never shorter than the whole step's FLOPs spread evenly over every GPU (timed as FLOPs at one fraction of
    # the peak, so that the FLOPs decide), and its compute equals that with one stage. (The stage that sets the
    # pace is the one with the longest step, communication included, which need not be the one with most FLOPs.)
    model, h100 = spec(name), resolve_hardware("H100").spec
    if pp > model.num_layers or (first is not None and (pp == 1 or model.num_layers - first < pp - 1)):
        return
    layout = ly.Layout(pp=pp, grad_accum=pp, split=PipelineSplit(first_stage_layers=first))
    w = Workload(
        model,
        resolve_precision("bf16-mixed").spec,
        ADAMW,
        seq,
        recompute=recompute,
        overhead_bytes=0.0,
        framework=framework_profile(),
    )
    cluster = Cluster(hardware=h100, count=layout.gpus, gpus_per_node=8)
    efficiency = 0.6  # any fraction: timed as FLOPs at one fraction of the peak, the FLOPs alone decide
    t = step_time(w, layout, cluster, efficiency=efficiency)
    even = t.hardware_flops / (pp * h100.peak_flops("bf16") * efficiency)
    assert math.isfinite(t.total) and t.total >= even * (1 - 1e-12)
    if pp == 1:
        assert t.compute == pytest.approx(even, rel=1e-12)
