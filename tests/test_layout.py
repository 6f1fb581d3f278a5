"""Memory per GPU under DP/ZeRO/TP/SP/PP/CP/EP, against the papers' closed forms (derived by hand)."""

import re

import pytest

from lmcalc.cli.app import error_message
from lmcalc.engine.memory import activations, gpu_memory
from lmcalc.engine.memory.terms import Capacity, memory_sections
from lmcalc.engine.parallel import sharding
from lmcalc.engine.parallel.layout import Layout
from lmcalc.engine.parallel.layout_checks import check_layout
from lmcalc.engine.parallel.pipeline import PipelineSplit, stage_layer_counts, stage_layers
from lmcalc.engine.parallel.sharding import stage_params
from lmcalc.engine.search.plan import Pins
from lmcalc.engine.time import steptime
from lmcalc.engine.workload import Workload
from lmcalc.errors import LmcalcError
from lmcalc.presets import framework_profile, parse_cluster, resolve_model, resolve_optimizer, resolve_precision

MIXED = resolve_precision("bf16-mixed").spec
ADAMW = resolve_optimizer("adamw").spec


def gpt3():
    return resolve_model("gpt3-175b").spec


def workload(model, seq_len=4096, **settings):
    """A bf16-mixed AdamW workload with no overhead allowance (micro-batch 1, flash attention, no recompute unless
    given)."""
    defaults = {"overhead_bytes": 0.0, "framework": framework_profile()}
    return Workload(model, MIXED, ADAMW, seq_len, **{**defaults, **settings})


def interleaved(virtual_stages, **split):
    return PipelineSplit(schedule="interleaved", virtual_stages=virtual_stages, **split)


def one_layer(model, layout, s, b, attention="eager", recompute="none"):
    """Bytes of one layer's saved tensors on one GPU (1 layer per stage, 1 micro-batch in flight)."""
    w = workload(model, s, micro_batch=b, attention=attention, recompute=recompute)
    tensors = activations.layer_saved_tensors(w, False)
    return sum(
        gpu_memory.bytes_on_gpu(t, layout) for t in tensors if not (recompute == "selective" and t.attention_core)
    )


def refusal(w, layout, cluster=None):
    """The message ``check_layout`` refuses ``layout`` with, as the command line prints it (settings by flag)."""
    with pytest.raises(LmcalcError) as refused:
        check_layout(w, layout, cluster)
    return error_message(refused.value)


@pytest.mark.parametrize("t", [1, 2, 4, 8])
def test_tensor_parallel_is_korthikanti_eq2(t):
    # Korthikanti et al. 2022 eq. (2): sbh(10 + 24/t + 5as/(ht)) per layer with TP and no SP,
    # + the LayerNorm statistics (2 norms · 2 · 4 bytes · s·b, replicated), which the paper leaves out.
    m, s, b = gpt3(), 2048, 1
    h, a = m.hidden_size, m.num_heads
    expected = s * b * h * (10 + 24 / t + 5 * a * s / (h * t)) + 16 * s * b
    assert one_layer(m, Layout(tp=t), s, b) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("t", [2, 4, 8])
def test_sequence_parallel_is_korthikanti_eq4(t):
    # Eq. (4): with sequence parallelism every term is divided by t: (sbh/t)(34 + 5as/h).
    m, s, b = gpt3(), 2048, 1
    h, a = m.hidden_size, m.num_heads
    expected = (s * b * h * (34 + 5 * a * s / h) + 16 * s * b) / t
    assert one_layer(m, Layout(tp=t, sequence_parallel=True), s, b) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("t", [2, 8])
def test_selective_with_sequence_parallel_is_34sbh_over_t(t):
    # Table 2: TP + SP + selective recomputation keeps sbh·34/t per layer.
    m, s = gpt3(), 2048
    expected = (34 * s * m.hidden_size + 16 * s) / t
    got = one_layer(m, Layout(tp=t, sequence_parallel=True), s, 1, recompute="selective")
    assert got == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("p", [2, 4, 8])
def test_first_stage_holds_all_layers_worth_under_1f1b(p):
    # Eq. (5): the first stage holds p micro-batches through L/p layers: L layers' worth whatever p,
    # plus, per micro-batch, the embedding dropout mask (the paper's extra term sbhp/t, 1 byte) and
    # the int64 token ids and targets (2 · 8 · s·b bytes, not split).
    m = gpt3()
    s, h, t = 2048, m.hidden_size, 8
    layout = Layout(pp=p, tp=t, sequence_parallel=True, grad_accum=64)
    held = gpu_memory.stage_activations(workload(m, s, attention="eager"), layout, 0)
    acts, in_flight = held.total, held.in_flight
    assert in_flight == p
    expected = m.num_layers * one_layer(m, layout, s, 1) + p * (s * h / t + 2 * 8 * s)
    assert acts == pytest.approx(expected, rel=1e-12)


def test_interleaving_factor():
    # Korthikanti §4.2.3: the interleaved schedule multiplies the first stage's activations by 1 + (p−1)/(p·m).
    m = gpt3()
    w = workload(m, 2048, attention="flash")
    plain = Layout(pp=8, tp=8, sequence_parallel=True, grad_accum=64)
    interleaved_layout = Layout(pp=8, tp=8, sequence_parallel=True, grad_accum=64, split=interleaved(4))
    n_plain = gpu_memory.stage_activations(w, plain, 0).in_flight
    n_inter = gpu_memory.stage_activations(w, interleaved_layout, 0).in_flight
    assert n_inter / n_plain == pytest.approx(1 + 7 / (8 * 4))


def test_tensor_parallel_splits_llama_weights_by_hand():
    # Llama 3 8B at TP=8: embedding and head split by vocabulary; q, k, v, o, gate, up, down split;
    # the 2 RMSNorms per layer and the final norm are replicated.
    m = resolve_model("llama-3.1-8b").spec
    V, h, L, f, kv = 128256, 4096, 32, 14336, 1024
    per_gpu = 2 * V * h / 8 + L * (2 * h * h + 2 * h * kv + 3 * h * f) / 8 + L * 2 * h + h
    held = stage_params(workload(m), Layout(tp=8), 0)
    assert held.dense == pytest.approx(per_gpu) and held.experts == 0


def test_uneven_pipeline_stages_put_the_extra_layers_first():
    # Llama 3 405B: 126 layers on 16 stages -> 14 stages of 8 and 2 of 7 (the paper trims first and last;
    # lmcalc gives the extra layers to the first stages, the most loaded one is what matters).
    m = resolve_model("llama-3.1-405b").spec
    counts = [stage_layers(m, Layout(pp=16), s).layers for s in range(16)]
    assert sum(counts) == 126 and max(counts) == 8 and min(counts) == 7


def test_pipeline_stages_split_layers_embedding_first_head_last():
    m = resolve_model("llama-3.1-8b").spec
    V, h, f, kv = 128256, 4096, 14336, 1024
    layer = 2 * h * h + 2 * h * kv + 3 * h * f + 2 * h  # 32 layers, 8 per stage
    layout, w = Layout(pp=4), workload(m)
    assert stage_params(w, layout, 0).dense == V * h + 8 * layer
    assert stage_params(w, layout, 1).dense == 8 * layer
    assert stage_params(w, layout, 3).dense == 8 * layer + h + V * h


def test_expert_parallel_splits_routed_experts_only():
    # Mixtral 8x7B at EP=8: each GPU holds 1 of 8 experts per layer; attention, router, norms are whole.
    m = resolve_model("mixtral-8x7b").spec
    h, f, L = 4096, 14336, 32
    w = workload(m)
    held = stage_params(w, Layout(dp=8, ep=8), 0)
    assert held.experts == L * 3 * h * f
    full = stage_params(w, Layout(dp=8), 0)
    assert held.dense == full.dense and full.experts == 8 * held.experts


def test_zero_shards_experts_over_their_own_replicas():
    # With EP=8 over DP=8 every expert exists once: ZeRO has nothing to shard it over (DP·CP/EP = 1).
    m = resolve_model("mixtral-8x7b").spec
    w = workload(m, 4096, attention="flash", recompute="none")
    layout = Layout(dp=8, ep=8, zero=1)
    gpu = gpu_memory.gpu_memory(w, layout, 0)
    held = stage_params(w, layout, 0)
    assert gpu.master == pytest.approx(4 * (held.dense / 8 + held.experts))


def test_zero3_matches_the_zero_paper_through_the_layout():
    # Rajbhandari et al. 2020 Figure 1 with Ψ = 8.03B: ZeRO-3 over 64 ranks keeps 16Ψ/64 bytes.
    m = resolve_model("llama-3.1-8b").spec
    gpu = gpu_memory.gpu_memory(workload(m, 4096, attention="flash", recompute="none"), Layout(dp=64, zero=3), 0)
    assert gpu.states == pytest.approx(16 * 8_030_261_248 / 64)


BAD_LAYOUTS = [
    (
        "llama-3.1-8b",
        "8xH100",
        Layout(pp=8, grad_accum=8, split=PipelineSplit(schedule="interleaved")),
        "needs --virtual-stages 2 or more",
    ),
    (
        "llama-3.1-8b",
        "8xH100",
        Layout(pp=8, grad_accum=8, split=PipelineSplit(virtual_stages=4)),
        "applies to --schedule interleaved only",
    ),
    ("llama-3.1-8b", "8xH100", Layout(dp=8, split=interleaved(2)), "needs pipeline stages"),
    ("llama-3.1-8b", "3xH100", Layout(tp=3), "TP=3 does not divide the 32 attention heads"),
    ("qwen2.5-7b", "14xH100", Layout(tp=14), "TP=14 is not a multiple of the 4 KV heads"),
    ("llama-2-7b", "2x8xH100", Layout(tp=16), "TP=16 spans more than the 8 GPUs of a node"),
    ("llama-3.1-8b", "64xH100", Layout(pp=64), "PP=64 exceeds the 32 layers"),
    (
        "llama-3.1-8b",
        "32xH100",
        Layout(pp=32, grad_accum=32, split=interleaved(2)),
        "needs at least one layer per chunk",
    ),
    ("llama-3.1-8b", "8xH100", Layout(dp=3), "does not equal the 8 GPUs"),
    ("llama-3.1-8b", "8xH100", Layout(dp=8, ep=2), "needs a mixture-of-experts model"),
    ("mixtral-8x7b", "8xH100", Layout(dp=8, ep=3), "EP=3 does not divide the 8 experts"),
    ("llama-3.1-8b", "3xH100", Layout(cp=3), "CP=3 does not divide the sequence length 4096"),
    (
        "llama-3.1-8b",
        "8xH100",
        Layout(pp=8, grad_accum=4, split=interleaved(2)),
        "needs micro-batches",
    ),
]


@pytest.mark.parametrize("model,cluster,layout,message", BAD_LAYOUTS)
def test_impossible_layouts_name_the_constraint(model, cluster, layout, message):
    w = workload(resolve_model(model).spec, 4096, attention="flash")
    assert re.search(message, refusal(w, layout, parse_cluster(cluster)))


def test_a_layout_that_breaks_several_constraints_is_refused_for_the_first():
    # check_layout looks up what TP and CP must split once per (TP, CP): a layout that breaks one of those and an
    # earlier constraint is refused for the earlier one, whether or not that (TP, CP) was looked up before
    w, cluster = workload(resolve_model("llama-3.1-8b").spec, 4096, attention="flash"), parse_cluster("8xH100")
    bad_tp_and_gpus, bad_tp = Layout(tp=3, dp=2), Layout(tp=3, pp=2, grad_accum=2)  # 6 GPUs of 8; 6 too
    assert "does not equal the 8 GPUs" in refusal(w, bad_tp_and_gpus, cluster)
    assert "does not equal the 8 GPUs" in refusal(w, bad_tp, cluster)
    assert "TP=3 does not divide the 32 attention heads" in refusal(w, bad_tp, parse_cluster("6xH100"))
    # PP=64 past the 32 layers comes before CP=3 not dividing the sequence, each checked alone
    deep = Layout(pp=64, cp=3, grad_accum=64)
    assert "PP=64 exceeds the 32 layers" in refusal(w, deep, parse_cluster("192xH100"))
    assert "CP=3 does not divide the sequence length 4096" in refusal(w, Layout(cp=3), parse_cluster("3xH100"))


def test_context_parallel_needs_fused_attention():
    with pytest.raises(LmcalcError, match="needs fused attention"):
        check_layout(
            workload(resolve_model("llama-3.1-8b").spec, 4096, attention="eager"), Layout(cp=2), parse_cluster("2xH100")
        )


@pytest.mark.parametrize(
    "layout",
    [
        Layout(),
        Layout(tp=8),
        Layout(tp=8, sequence_parallel=True),
        Layout(tp=4, cp=2, sequence_parallel=True),
        Layout(tp=2, cp=4),
    ],
    ids=["single", "tp8", "tp8-sp", "tp4-cp2-sp", "tp2-cp4"],
)
@pytest.mark.parametrize("attention", ["eager", "flash"])
def test_one_layer_formula_evaluates_to_its_value(layout, attention):
    # The memory table's formula for one layer, with the shape substituted, must give the figure it sits
    # beside: the TP and CP divisors included (a formula without them would be 8× too large at TP = 8).
    model, s, b = resolve_model("llama-3-70b").spec, 4096, 1
    w = workload(model, s, micro_batch=b, attention=attention, recompute="none")
    gpu = gpu_memory.most_loaded_gpu(w, layout)
    sections = memory_sections(w, layout, gpu, Capacity(80e9, "80 GB"))
    term = next(t for section in sections for t in section.terms if t.key == "dense_layer")
    symbols = {
        "H_kv": model.kv_heads,
        "d_v": model.head_dim,
        "TP": layout.tp,
        "CP": layout.cp,
        "s": s,
        "b": b,
        "h": model.hidden_size,
        "H": model.num_heads,
        "d": model.head_dim,
        "f": model.ffn_size,
    }
    python = re.sub(r"H_kv|d_v|TP|CP|[sbhHdf]", lambda m: str(symbols[m.group()]), term.formula)
    value = eval(python.replace("·", "*").replace("²", "**2"))  # noqa: S307 - our own formula text
    assert value == pytest.approx(term.value, rel=1e-12)
    assert ("/TP" in term.formula or "TP·" in term.formula) == (layout.tp > 1)


def test_uneven_first_and_last_stages_split_the_rest_evenly():
    # Llama 3 405B as Dubey et al. 2024 §3.3.2 ran it: one layer fewer on the first and last of 16 stages,
    # so 126 = 7 + 14 × 8 + 7.
    llama405 = resolve_model("llama-3.1-405b").spec
    uneven = Layout(pp=16, split=PipelineSplit(first_stage_layers=7, last_stage_layers=7))
    assert stage_layer_counts(llama405, uneven) == [7, *[8] * 14, 7]
    # without the flags, the first 14 stages take the 2 layers 16 does not divide: 14 × 8 + 2 × 7
    assert stage_layer_counts(llama405, Layout(pp=16)) == [8] * 14 + [7] * 2
    # Llama 3 70B, 80 layers, first stage 6: 74 over 7 stages = 10 rest 4, so four stages of 11
    llama70 = resolve_model("llama-3-70b").spec
    first6 = Layout(pp=8, split=PipelineSplit(first_stage_layers=6))
    assert stage_layer_counts(llama70, first6) == [6, 11, 11, 11, 11, 10, 10, 10]


def test_counting_the_embedding_and_the_loss_as_layers_makes_the_same_split():
    # Megatron-LM's --account-for-embedding/loss-in-pipeline-split: 126 layers + the embedding + the loss = 128
    # units, 8 on each of 16 stages, so the first and the last build 7 layers: Llama 3's split, and now with the
    # interleaved schedule too (128 chunks of one unit at 8 virtual stages; 126 layers alone make too few).
    llama405 = resolve_model("llama-3.1-405b").spec
    both = Layout(pp=16, split=PipelineSplit(embedding_in_split=True, loss_in_split=True))
    assert stage_layer_counts(llama405, both) == [7, *[8] * 14, 7]
    # one of them alone: Llama 3 8B's 32 layers + 1 = 33 = 3 × 11, so the stage that counts it builds 10
    llama8 = resolve_model("llama-3-8b").spec
    assert stage_layer_counts(llama8, Layout(pp=3, split=PipelineSplit(loss_in_split=True))) == [11, 11, 10]
    assert stage_layer_counts(llama8, Layout(pp=3, split=PipelineSplit(embedding_in_split=True))) == [10, 11, 11]
    common = dict(dp=64, tp=8, pp=16, zero=2, sequence_parallel=True, grad_accum=32)
    w = workload(llama405, 8192, attention="flash", recompute="none")
    check_layout(w, Layout(**common, split=interleaved(8, embedding_in_split=True, loss_in_split=True)), None)
    with pytest.raises(LmcalcError, match="126 layers < PP × virtual stages = 128"):
        check_layout(w, Layout(**common, split=interleaved(8)), None)
    # the same memory as the same split given by hand (a path that never counts units), stage by stage
    by_hand = Layout(**common, split=PipelineSplit(first_stage_layers=7, last_stage_layers=7))
    counted = Layout(**common, split=PipelineSplit(embedding_in_split=True, loss_in_split=True))
    for stage in (0, 1, 15):
        a, b = (gpu_memory.gpu_memory(w, lay, stage) for lay in (by_hand, counted))
        assert a.total == b.total and a.activations == b.activations


@pytest.mark.parametrize(
    ("layout", "message"),
    [
        (Layout(split=PipelineSplit(first_stage_layers=7)), "needs pipeline stages: --pp 2 or more"),
        (Layout(split=PipelineSplit(loss_in_split=True)), "--account-for-loss-in-pipeline-split needs pipeline stages"),
        (
            Layout(pp=16, split=PipelineSplit(first_stage_layers=7, loss_in_split=True)),
            "give one or the other",
        ),
        (
            Layout(pp=16, split=PipelineSplit(loss_in_split=True)),
            r"126 layers \+ 1 = 127 must divide evenly over PP=16",
        ),
        (
            Layout(pp=16, grad_accum=16, split=interleaved(3, loss_in_split=True, embedding_in_split=True)),
            r"128 must divide evenly over PP × virtual stages = 48",
        ),
        (
            Layout(pp=16, grad_accum=16, split=interleaved(2, last_stage_layers=7)),
            "split evenly over its 2 chunks .*: --last-stage-layers 7 and the other 15 stages' 119 layers do not",
        ),
        (
            Layout(pp=16, split=PipelineSplit(first_stage_layers=100, last_stage_layers=20)),
            "leave 6 of the 126 layers",
        ),
        (
            Layout(pp=16, split=PipelineSplit(last_stage_layers=127)),
            "asks for 127 layers; llama-3.1-405b has 126",
        ),
        (
            Layout(pp=2, split=PipelineSplit(first_stage_layers=126)),
            "leaves 0 of the 126 layers for the other stage, which needs",
        ),
        (
            Layout(pp=2, split=PipelineSplit(first_stage_layers=60, last_stage_layers=60)),
            "must add up to the 126 layers of llama-3.1-405b, not 120",
        ),
    ],
)
def test_impossible_stage_splits_are_refused(layout, message):
    w = workload(resolve_model("llama-3.1-405b").spec, 8192, attention="flash")
    assert re.search(message, refusal(w, layout, None))


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Layout(dp=8, zero=4), "--zero must be 0, 1, 2 or 3, got 4"),
        (lambda: Layout(tp=0), "--tp must be a positive integer, got 0"),
        (lambda: Layout(grad_accum=0), "--grad-accum must be a positive integer, got 0"),
        (lambda: Layout(dp=True), "--dp must be a positive integer, got True"),
        (lambda: PipelineSplit(first_stage_layers=0), "--first-stage-layers must be a positive integer, got 0"),
        (lambda: PipelineSplit(virtual_stages=0), "--virtual-stages must be a positive integer, got 0"),
        (lambda: PipelineSplit(schedule="zb"), "--schedule must be one of 1f1b, interleaved; got 'zb'"),
        (lambda: Pins(zero=5), "--zero must be 0, 1, 2 or 3, got 5"),
        (lambda: Pins(max_pp=0), "--max-pp must be a positive integer, got 0"),
        (lambda: Pins(recompute="some"), "--recompute must be one of none, selective, full; got 'some'"),
        (lambda: workload(gpt3(), 0), "--seq must be a positive integer, got 0"),
        (lambda: workload(gpt3(), micro_batch=True), "--micro-batch must be a positive integer, got True"),
        (lambda: workload(gpt3(), attention="sdpa"), "--attention must be one of flash, eager; got 'sdpa'"),
        (lambda: workload(gpt3(), overhead_bytes=-1), "--overhead must be zero or a positive number of bytes, got -1"),
    ],
)
def test_values_check_themselves_when_made(make, message):
    # a Layout, a PipelineSplit, the planner's Pins and a Workload refuse what they cannot hold the moment they
    # are made, whoever makes them (the command line, the Python API, a test): the engine never sees them
    with pytest.raises(LmcalcError) as raised:
        make()
    assert error_message(raised.value) == message


def test_a_setting_only_the_engine_has_is_named_by_its_field():
    # the bytes of a dropout-mask element are the engine's (1 on CUDA, 4 on a CPU): no flag sets them
    with pytest.raises(LmcalcError, match="^mask_bytes must be a positive number of bytes, got 0$"):
        workload(gpt3(), mask_bytes=0)


def test_a_lighter_first_stage_moves_the_peak_to_the_second():
    # 1F1B keeps PP − stage micro-batches in flight: the first stage 16 × 7 = 112 layer-activations, the second
    # 15 × 8 = 120. The second stage is now the most loaded; its activations are 120 layers' worth.
    model = resolve_model("llama-3.1-405b").spec
    layout = Layout(
        dp=64,
        tp=8,
        pp=16,
        zero=2,
        sequence_parallel=True,
        grad_accum=32,
        split=PipelineSplit(first_stage_layers=7, last_stage_layers=7),
    )
    gpu = gpu_memory.most_loaded_gpu(workload(model, 8192, attention="flash", recompute="none"), layout)
    per_layer = one_layer(model, layout, 8192, 1, attention="flash")
    assert gpu.stage == 1
    assert gpu.activations == pytest.approx(15 * 8 * per_layer, rel=1e-12)


def test_memoised_figures_belong_to_their_own_layout_and_workload():
    # the planner evaluates thousands of layouts through the engine's memoised functions, which share figures
    # between layouts (activations across ZeRO and EP, a stage's parameters across DP, CP and ZeRO): whichever is
    # evaluated first, each case's memory and step time must be what a cleared memo gives
    from lmcalc.engine import clear_caches
    from lmcalc.presets import resolve_hardware
    from lmcalc.specs import Cluster

    llama, mixtral, gpt = (resolve_model(name).spec for name in ("llama-3.1-405b", "mixtral-8x7b", "gpt3-175b"))
    common = dict(dp=64, tp=8, pp=16, zero=2, sequence_parallel=True, grad_accum=32)
    moe = dict(dp=16, tp=2, pp=2, grad_accum=8)
    cases = [  # (workload, layout): each differs from another in one thing only
        *((workload(llama, 8192), Layout(**common, split=split)) for split in (
            PipelineSplit(),
            PipelineSplit(embedding_in_split=True, loss_in_split=True),
            PipelineSplit(first_stage_layers=6, last_stage_layers=8),
            interleaved(2),
            interleaved(4),
        )),
        (workload(llama, 8192), Layout(**{**common, "grad_accum": 16}, split=interleaved(4))),  # m = p
        *((workload(mixtral), Layout(**moe, zero=zero)) for zero in (0, 1, 2, 3)),
        *((workload(mixtral), Layout(**moe, ep=ep)) for ep in (2, 8)),
        (workload(mixtral), Layout(**{**moe, "dp": 8}, cp=2)),
        (workload(mixtral), Layout(**moe, sequence_parallel=True)),
        *((workload(mixtral, micro_batch=b, recompute=mode), Layout(**moe)) for b, mode in (
            (2, "none"), (1, "selective"), (1, "full"),
        )),
        (workload(mixtral, 2048), Layout(**moe)),
        *((workload(gpt, 2048, attention="eager", mask_bytes=mask), Layout(tp=8, pp=8, grad_accum=8))
          for mask in (1, 4)),  # GPT-3 trains with dropout: the masks' bytes count
    ]  # fmt: skip
    hardware = resolve_hardware("H100").spec

    def figures(case):
        w, layout = case
        memory = gpu_memory.most_loaded_gpu(w, layout)
        time = steptime.step_time(w, layout, Cluster(hardware=hardware, count=layout.gpus, gpus_per_node=8))
        return memory.total, memory.states, memory.activations, memory.stage, time.total

    def fresh_figures(case):
        clear_caches()
        return figures(case)

    fresh = [fresh_figures(case) for case in cases]
    assert len(set(fresh)) == len(cases)  # every case its own answer
    for order in (cases, cases[::-1]):
        clear_caches()
        assert {case: figures(case) for case in order} == dict(zip(cases, fresh, strict=True))
    # and the memo was shared, not bypassed: figures computed for one case served another
    assert gpu_memory._activation_peaks.cache_info().hits > 0 and sharding.trained_held.cache_info().hits > 0


def test_a_layout_sent_to_another_process_is_the_same_layout():
    """A search's worker sends its layouts back pickled (``Layout.__reduce__``), restored without their checks and
    their views made when asked: equal, hashing equal, with the same views as the layout made by hand."""
    import pickle

    split = PipelineSplit("interleaved", 2)
    made = Layout(dp=8, tp=4, pp=4, cp=2, ep=8, etp=1, zero=1, sequence_parallel=True, grad_accum=16, split=split)
    spelt_out = Layout(dp=8, tp=4, pp=4, cp=2, ep=8, etp=4, zero=1, sequence_parallel=True, grad_accum=16, split=split)
    for layout in (made, spelt_out):
        copy = pickle.loads(pickle.dumps(layout))
        assert copy == layout and hash(copy) == hash(layout) and copy is not layout
        assert copy.etp == layout.etp  # ETP = TP is spelt as None in both
        assert (copy.activation_layout, copy.grid, copy.state_shards, copy.stages) == (
            (4, True, 2, 4, 16, split),
            (4, 2, 8, True, layout.expert_tp),
            (4, 8, 1, 16, layout.expert_tp, 1, False),
            (4, split),
        )
    assert spelt_out.etp is None and made.etp == 1


def test_a_layout_the_search_makes_is_the_layout_made_by_hand():
    """The planner makes its layouts with ``checked_layout`` (no checks, no keyword ``__init__``): each must be the
    layout ``Layout(...)`` makes from the same fields, field for field and to the hash (the engine's caches key on
    both), ETP = TP spelt as None by the caller."""
    from lmcalc.engine.parallel.layout import checked_layout

    for split in (PipelineSplit(), PipelineSplit("interleaved", 3), PipelineSplit(last_stage_layers=5)):
        for dp, tp, pp, cp, ep, etp, zero, sp, accum, hsdp, hfsdp in (
            (1, 1, 1, 1, 1, None, 0, False, 1, 1, False),
            (8, 4, 4, 2, 8, 1, 1, True, 16, 1, False),
            (32, 2, 8, 1, 16, None, 3, True, 60, 1, False),
            (32, 2, 8, 1, 16, None, 3, True, 60, 4, False),
            (32, 2, 8, 1, 16, None, 3, True, 60, 4, True),
        ):
            by_hand = Layout(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, etp=etp, zero=zero, sequence_parallel=sp,
                             grad_accum=accum, split=split, hsdp=hsdp, hsdp_shard_optimizer=hfsdp)  # fmt: skip
            searched = checked_layout((dp, tp, pp, cp, ep, zero, sp, accum, etp, split, hsdp, hfsdp))
            assert searched == by_hand and hash(searched) == hash(by_hand)
            assert (searched.etp, searched.expert_tp, searched.label) == (by_hand.etp, by_hand.expert_tp, by_hand.label)
            assert (searched.activation_layout, searched.grid, searched.state_shards, searched.stages) == (
                by_hand.activation_layout, by_hand.grid, by_hand.state_shards, by_hand.stages)  # fmt: skip
    with pytest.raises(AttributeError):  # frozen as any layout
        searched.dp = 2  # type: ignore[misc]
