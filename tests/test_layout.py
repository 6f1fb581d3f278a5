"""Memory per GPU under DP/ZeRO/TP/SP/PP/CP/EP, against the papers' closed forms (derived by hand)."""

import pytest

from lmcalc.engine import layout as ly
from lmcalc.errors import LmcalcError
from lmcalc.presets import parse_cluster, resolve_model, resolve_optimizer, resolve_precision

MIXED = resolve_precision("bf16-mixed").spec
ADAMW = resolve_optimizer("adamw").spec


def gpt3():
    return resolve_model("gpt3-175b").spec


def one_layer(model, layout, s, b, attention="eager", recompute="none"):
    """Bytes of one layer's saved tensors on one GPU (1 layer per stage, 1 micro-batch in flight)."""
    tensors = ly.layer_saved_tensors(model, s, b, 2, attention, False, recompute, 1)
    return sum(ly._split(t, layout) for t in tensors if not (recompute == "selective" and t.attention_core))


@pytest.mark.parametrize("t", [1, 2, 4, 8])
def test_tensor_parallel_is_korthikanti_eq2(t):
    # Korthikanti et al. 2022 eq. (2): sbh(10 + 24/t + 5as/(ht)) per layer with TP and no SP,
    # + the LayerNorm statistics (2 norms · 2 · 4 bytes · s·b, replicated), which the paper leaves out.
    m, s, b = gpt3(), 2048, 1
    h, a = m.hidden_size, m.num_heads
    expected = s * b * h * (10 + 24 / t + 5 * a * s / (h * t)) + 16 * s * b
    assert one_layer(m, ly.Layout(tp=t), s, b) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("t", [2, 4, 8])
def test_sequence_parallel_is_korthikanti_eq4(t):
    # Eq. (4): with sequence parallelism every term is divided by t: (sbh/t)(34 + 5as/h).
    m, s, b = gpt3(), 2048, 1
    h, a = m.hidden_size, m.num_heads
    expected = (s * b * h * (34 + 5 * a * s / h) + 16 * s * b) / t
    assert one_layer(m, ly.Layout(tp=t, sequence_parallel=True), s, b) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("t", [2, 8])
def test_selective_with_sequence_parallel_is_34sbh_over_t(t):
    # Table 2: TP + SP + selective recomputation keeps sbh·34/t per layer.
    m, s = gpt3(), 2048
    expected = (34 * s * m.hidden_size + 16 * s) / t
    got = one_layer(m, ly.Layout(tp=t, sequence_parallel=True), s, 1, recompute="selective")
    assert got == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("p", [2, 4, 8])
def test_first_stage_holds_all_layers_worth_under_1f1b(p):
    # Eq. (5): the first stage holds p micro-batches through L/p layers: L layers' worth whatever p,
    # plus, per micro-batch, the embedding dropout mask (the paper's extra term sbhp/t, 1 byte) and
    # the int64 token ids and targets (2 · 8 · s·b bytes, not split).
    m = gpt3()
    s, h, t = 2048, m.hidden_size, 8
    layout = ly.Layout(pp=p, tp=t, sequence_parallel=True, grad_accum=64)
    acts, in_flight, _ = ly.stage_activation_bytes(m, layout, 0, s, 2, "eager", "none")
    assert in_flight == p
    expected = m.num_layers * one_layer(m, layout, s, 1) + p * (s * h / t + 2 * 8 * s)
    assert acts == pytest.approx(expected, rel=1e-12)


def test_interleaving_factor():
    # Korthikanti §4.2.3: the interleaved schedule multiplies the first stage's activations by 1 + (p−1)/(p·m).
    m = gpt3()
    plain = ly.Layout(pp=8, tp=8, sequence_parallel=True, grad_accum=64)
    interleaved = ly.Layout(pp=8, tp=8, sequence_parallel=True, grad_accum=64, schedule="interleaved", virtual_stages=4)
    n_plain = ly.stage_activation_bytes(m, plain, 0, 2048, 2, "flash", "none").in_flight
    n_inter = ly.stage_activation_bytes(m, interleaved, 0, 2048, 2, "flash", "none").in_flight
    assert n_inter / n_plain == pytest.approx(1 + 7 / (8 * 4))


def test_tensor_parallel_splits_llama_weights_by_hand():
    # Llama 3 8B at TP=8: embedding and head split by vocabulary; q, k, v, o, gate, up, down split;
    # the 2 RMSNorms per layer and the final norm are replicated.
    m = resolve_model("llama-3.1-8b").spec
    V, h, L, f, kv = 128256, 4096, 32, 14336, 1024
    per_gpu = 2 * V * h / 8 + L * (2 * h * h + 2 * h * kv + 3 * h * f) / 8 + L * 2 * h + h
    held = ly.stage_params(m, ly.Layout(tp=8), 0)
    assert held.dense == pytest.approx(per_gpu) and held.experts == 0


def test_uneven_pipeline_stages_put_the_extra_layers_first():
    # Llama 3 405B: 126 layers on 16 stages -> 14 stages of 8 and 2 of 7 (the paper trims first and last;
    # lmcalc gives the extra layers to the first stages, the most loaded one is what matters).
    m = resolve_model("llama-3.1-405b").spec
    counts = [sum(ly.stage_layers(m, ly.Layout(pp=16), s)) for s in range(16)]
    assert sum(counts) == 126 and max(counts) == 8 and min(counts) == 7


def test_pipeline_stages_split_layers_embedding_first_head_last():
    m = resolve_model("llama-3.1-8b").spec
    V, h, f, kv = 128256, 4096, 14336, 1024
    layer = 2 * h * h + 2 * h * kv + 3 * h * f + 2 * h  # 32 layers, 8 per stage
    layout = ly.Layout(pp=4)
    assert ly.stage_params(m, layout, 0).dense == V * h + 8 * layer
    assert ly.stage_params(m, layout, 1).dense == 8 * layer
    assert ly.stage_params(m, layout, 3).dense == 8 * layer + h + V * h


def test_expert_parallel_splits_routed_experts_only():
    # Mixtral 8x7B at EP=8: each GPU holds 1 of 8 experts per layer; attention, router, norms are whole.
    m = resolve_model("mixtral-8x7b").spec
    h, f, L = 4096, 14336, 32
    held = ly.stage_params(m, ly.Layout(dp=8, ep=8), 0)
    assert held.experts == L * 3 * h * f
    full = ly.stage_params(m, ly.Layout(dp=8), 0)
    assert held.dense == full.dense and full.experts == 8 * held.experts


def test_zero_shards_experts_over_their_own_replicas():
    # With EP=8 over DP=8 every expert exists once: ZeRO has nothing to shard it over (DP·CP/EP = 1).
    m = resolve_model("mixtral-8x7b").spec
    layout = ly.Layout(dp=8, ep=8, zero=1)
    gpu = ly.gpu_memory(m, layout, 0, MIXED, ADAMW, 4096, "flash", "none", 0)
    held = ly.stage_params(m, layout, 0)
    assert gpu.master == pytest.approx(4 * (held.dense / 8 + held.experts))


def test_zero3_matches_the_zero_paper_through_the_layout():
    # Rajbhandari et al. 2020 Figure 1 with Ψ = 8.03B: ZeRO-3 over 64 ranks keeps 16Ψ/64 bytes.
    m = resolve_model("llama-3.1-8b").spec
    gpu = ly.gpu_memory(m, ly.Layout(dp=64, zero=3), 0, MIXED, ADAMW, 4096, "flash", "none", 0)
    assert gpu.states == pytest.approx(16 * 8_030_261_248 / 64)


BAD_LAYOUTS = [
    ("llama-3.1-8b", "8xH100", dict(pp=8, schedule="interleaved", grad_accum=8), "needs --virtual-stages 2 or more"),
    ("llama-3.1-8b", "8xH100", dict(pp=8, virtual_stages=4, grad_accum=8), "applies to --schedule interleaved only"),
    ("llama-3.1-8b", "8xH100", dict(dp=8, schedule="interleaved", virtual_stages=2), "needs pipeline stages"),
    ("llama-3.1-8b", "3xH100", dict(tp=3), "TP=3 does not divide the 32 attention heads"),
    ("llama-3.1-8b", "16xH100", dict(tp=16), "TP=16 does not divide the 8 KV heads"),
    ("llama-2-7b", "2x8xH100", dict(tp=16), "TP=16 spans more than the 8 GPUs of a node"),
    ("llama-3.1-8b", "64xH100", dict(pp=64), "PP=64 exceeds the 32 layers"),
    (
        "llama-3.1-8b",
        "32xH100",
        dict(pp=32, schedule="interleaved", virtual_stages=2, grad_accum=32),
        "needs at least one layer per chunk",
    ),
    ("llama-3.1-8b", "8xH100", dict(dp=3), "does not equal the 8 GPUs"),
    ("llama-3.1-8b", "8xH100", dict(dp=8, ep=2), "needs a mixture-of-experts model"),
    ("mixtral-8x7b", "8xH100", dict(dp=8, ep=3), "EP=3 does not divide the 8 experts"),
    ("llama-3.1-8b", "3xH100", dict(cp=3), "CP=3 does not divide the sequence length 4096"),
    ("llama-3.1-8b", "8xH100", dict(dp=8, zero=4), "--zero must be 0, 1, 2 or 3"),
    (
        "llama-3.1-8b",
        "8xH100",
        dict(pp=8, schedule="interleaved", virtual_stages=2, grad_accum=4),
        "needs micro-batches",
    ),
]


@pytest.mark.parametrize("model,cluster,changes,message", BAD_LAYOUTS)
def test_impossible_layouts_name_the_constraint(model, cluster, changes, message):
    with pytest.raises(LmcalcError, match=message):
        ly.check_layout(resolve_model(model).spec, ly.Layout(**changes), parse_cluster(cluster), 4096, "flash")


def test_context_parallel_needs_fused_attention():
    with pytest.raises(LmcalcError, match="needs fused attention"):
        ly.check_layout(resolve_model("llama-3.1-8b").spec, ly.Layout(cp=2), parse_cluster("2xH100"), 4096, "eager")


@pytest.mark.parametrize(
    "layout",
    [
        ly.Layout(),
        ly.Layout(tp=8),
        ly.Layout(tp=8, sequence_parallel=True),
        ly.Layout(tp=4, cp=2, sequence_parallel=True),
        ly.Layout(tp=2, cp=4),
    ],
    ids=["single", "tp8", "tp8-sp", "tp4-cp2-sp", "tp2-cp4"],
)
@pytest.mark.parametrize("attention", ["eager", "flash"])
def test_one_layer_formula_evaluates_to_its_value(layout, attention):
    # The memory table's formula for one layer, with the shape substituted, must give the figure it sits
    # beside: the TP and CP divisors included (a formula without them would be 8× too large at TP = 8).
    import re

    model, s, b = resolve_model("llama-3-70b").spec, 4096, 1
    gpu = ly.most_loaded_gpu(model, layout, resolve_precision("bf16-mixed").spec, ADAMW, s, attention, "none", 0.0)
    sections = ly.memory_sections(
        model, layout, gpu, resolve_precision("bf16-mixed").spec, ADAMW, s, attention, "none", 80e9, "80 GB"
    )
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
    assert ly.stage_layer_counts(llama405, ly.Layout(pp=16, first_stage_layers=7, last_stage_layers=7)) == [
        7,
        *[8] * 14,
        7,
    ]
    # without the flags, the first 14 stages take the 2 layers 16 does not divide: 14 × 8 + 2 × 7
    assert ly.stage_layer_counts(llama405, ly.Layout(pp=16)) == [8] * 14 + [7] * 2
    # Llama 3 70B, 80 layers, first stage 6: 74 over 7 stages = 10 rest 4, so four stages of 11
    llama70 = resolve_model("llama-3-70b").spec
    assert ly.stage_layer_counts(llama70, ly.Layout(pp=8, first_stage_layers=6)) == [6, 11, 11, 11, 11, 10, 10, 10]


def test_counting_the_embedding_and_the_loss_as_layers_makes_the_same_split():
    # Megatron-LM's --account-for-embedding/loss-in-pipeline-split: 126 layers + the embedding + the loss = 128
    # units, 8 on each of 16 stages, so the first and the last build 7 layers: Llama 3's split, and now with the
    # interleaved schedule too (128 chunks of one unit at 8 virtual stages; 126 layers alone make too few).
    llama405 = resolve_model("llama-3.1-405b").spec
    both = ly.Layout(pp=16, embedding_in_split=True, loss_in_split=True)
    assert ly.stage_layer_counts(llama405, both) == [7, *[8] * 14, 7]
    # one of them alone: Llama 3 8B's 32 layers + 1 = 33 = 3 × 11, so the stage that counts it builds 10
    llama8 = resolve_model("llama-3-8b").spec
    assert ly.stage_layer_counts(llama8, ly.Layout(pp=3, loss_in_split=True)) == [11, 11, 10]
    assert ly.stage_layer_counts(llama8, ly.Layout(pp=3, embedding_in_split=True)) == [10, 11, 11]
    interleaved = dict(dp=64, tp=8, pp=16, zero=2, sequence_parallel=True, grad_accum=32, schedule="interleaved")
    ly.check_layout(llama405, ly.Layout(**interleaved, virtual_stages=8, embedding_in_split=True, loss_in_split=True),
                    None, 8192, "flash")  # fmt: skip
    with pytest.raises(LmcalcError, match="126 layers < PP × virtual stages = 128"):
        ly.check_layout(llama405, ly.Layout(**interleaved, virtual_stages=8), None, 8192, "flash")
    # the same memory as the same split given by hand (a path that never counts units), stage by stage
    precision = resolve_precision("bf16-mixed").spec
    by_hand = ly.Layout(**{**interleaved, "schedule": "1f1b"}, first_stage_layers=7, last_stage_layers=7)
    counted = ly.Layout(**{**interleaved, "schedule": "1f1b"}, embedding_in_split=True, loss_in_split=True)
    for stage in (0, 1, 15):
        a, b = (
            ly.gpu_memory(llama405, lay, stage, precision, ADAMW, 8192, "flash", "none", 0.0)
            for lay in (by_hand, counted)
        )
        assert a.total == b.total and a.activations == b.activations


@pytest.mark.parametrize(
    ("layout", "message"),
    [
        (ly.Layout(first_stage_layers=7), "needs pipeline stages: --pp 2 or more"),
        (ly.Layout(loss_in_split=True), "--account-for-loss-in-pipeline-split needs pipeline stages"),
        (ly.Layout(pp=16, first_stage_layers=7, loss_in_split=True), "give one or the other"),
        (ly.Layout(pp=16, loss_in_split=True), r"126 layers \+ 1 = 127 must divide evenly over PP=16"),
        (
            ly.Layout(
                pp=16,
                schedule="interleaved",
                virtual_stages=3,
                grad_accum=16,
                loss_in_split=True,
                embedding_in_split=True,
            ),
            r"128 must divide evenly over PP × virtual stages = 48",
        ),
        (
            ly.Layout(pp=16, schedule="interleaved", virtual_stages=2, grad_accum=16, last_stage_layers=7),
            "split evenly over its 2 chunks .*: --last-stage-layers 7 and the other 15 stages' 119 layers do not",
        ),
        (ly.Layout(pp=16, first_stage_layers=0), "positive integer"),
        (ly.Layout(pp=16, first_stage_layers=100, last_stage_layers=20), "leave 6 of the 126 layers"),
        (ly.Layout(pp=16, last_stage_layers=127), "asks for 127 layers; llama-3.1-405b has 126"),
        (ly.Layout(pp=2, first_stage_layers=126), "leaves 0 of the 126 layers for the other stage, which needs"),
        (
            ly.Layout(pp=2, first_stage_layers=60, last_stage_layers=60),
            "must add up to the 126 layers of llama-3.1-405b, not 120",
        ),
    ],
)
def test_impossible_stage_splits_are_refused(layout, message):
    with pytest.raises(LmcalcError, match=message):
        ly.check_layout(resolve_model("llama-3.1-405b").spec, layout, None, 8192, "flash")


def test_a_lighter_first_stage_moves_the_peak_to_the_second():
    # 1F1B keeps PP − stage micro-batches in flight: the first stage 16 × 7 = 112 layer-activations, the second
    # 15 × 8 = 120. The second stage is now the most loaded; its activations are 120 layers' worth.
    model, precision = resolve_model("llama-3.1-405b").spec, resolve_precision("bf16-mixed").spec
    layout = ly.Layout(
        dp=64, tp=8, pp=16, zero=2, sequence_parallel=True, grad_accum=32, first_stage_layers=7, last_stage_layers=7
    )
    gpu = ly.most_loaded_gpu(model, layout, precision, ADAMW, 8192, "flash", "none", 0.0)
    per_layer = one_layer(model, layout, 8192, 1, attention="flash")
    assert gpu.stage == 1
    assert gpu.activations == pytest.approx(15 * 8 * per_layer, rel=1e-12)


def test_a_shared_cache_gives_every_layout_its_own_figures():
    # the planner keeps one cache for thousands of layouts: whichever is evaluated first, each layout's memory
    # and step time must be what a fresh cache gives
    from lmcalc.engine.steptime import step_time
    from lmcalc.presets import resolve_hardware

    model, precision = resolve_model("llama-3.1-405b").spec, resolve_precision("bf16-mixed").spec
    common = dict(dp=64, tp=8, pp=16, zero=2, sequence_parallel=True, grad_accum=32)
    layouts = [
        ly.Layout(**common),
        ly.Layout(**common, embedding_in_split=True, loss_in_split=True),
        ly.Layout(**common, first_stage_layers=6, last_stage_layers=8),
        ly.Layout(**common, schedule="interleaved", virtual_stages=2),
        ly.Layout(**common, schedule="interleaved", virtual_stages=4),
        ly.Layout(**{**common, "grad_accum": 16}, schedule="interleaved", virtual_stages=4),  # m = p: fewer in flight
    ]
    hardware = resolve_hardware("H100").spec

    def figures(layout, cache):
        memory = ly.most_loaded_gpu(model, layout, precision, ADAMW, 8192, "flash", "none", 0.0, cache=cache)
        time = step_time(model, layout, 8192, precision, hardware, 8, "none", cache=cache)
        return memory.total, memory.stage, time.total

    fresh = [figures(layout, {}) for layout in layouts]
    assert len(set(fresh)) == len(layouts)  # six different layouts, six different answers
    for order in (layouts, layouts[::-1]):
        shared: dict = {}
        assert {layout: figures(layout, shared) for layout in order} == dict(zip(layouts, fresh, strict=True))
