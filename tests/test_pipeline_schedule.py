"""Micro-batches in flight on every pipeline stage, 1F1B and interleaved, against the schedules step by step."""

import dataclasses
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lmcalc.cli.app import error_message
from lmcalc.engine.memory.gpu_memory import most_loaded_gpu, stage_activations, stage_outside_bytes
from lmcalc.engine.parallel.layout import Layout
from lmcalc.engine.parallel.layout_checks import check_layout
from lmcalc.engine.parallel.pipeline import PipelineSplit, held_in_flight, stage_chunk_mixes
from lmcalc.engine.workload import Workload
from lmcalc.errors import LmcalcError
from lmcalc.presets import framework_profile, resolve_model, resolve_optimizer, resolve_precision

MIXED = resolve_precision("bf16-mixed").spec
ADAMW = resolve_optimizer("adamw").spec


def workload(model, seq_len):
    """bf16-mixed (2-byte activations), AdamW, micro-batch 1, flash attention, no recompute, no overhead."""
    return Workload(
        model,
        MIXED,
        ADAMW,
        seq_len,
        attention="flash",
        recompute="none",
        overhead_bytes=0.0,
        framework=framework_profile(),
    )


def interleaved(p, v, m):
    return Layout(pp=p, grad_accum=m, split=PipelineSplit(schedule="interleaved", virtual_stages=v))


def megatron_step(p, v, m, stage, chunk_bytes):
    """Run one stage of Megatron-LM's interleaved schedule pass by pass and return the most bytes it holds.

    Its k-th forward pass takes micro-batch (k // (p·v))·p + k mod p through chunk (k // p) mod v (groups of p
    micro-batches, chunk after chunk); its k-th backward pass takes the same micro-batch back through chunk
    v − 1 − that chunk. It runs 2·(p − 1 − stage) + (v − 1)·p forward passes first (all of them if that is
    no fewer), then one forward and one backward in turn, then the remaining backward passes."""
    total = m * v

    def forward(k):
        return ((k // (p * v)) * p + k % p, (k // p) % v)

    def backward(k):
        micro_batch, chunk = forward(k)
        return micro_batch, v - 1 - chunk

    warm_up = min(total, 2 * (p - 1 - stage) + (v - 1) * p)
    held, most, done_forward, done_backward = set(), 0.0, 0, 0

    def run_forward():
        nonlocal done_forward, most
        held.add(forward(done_forward))
        done_forward += 1
        most = max(most, sum(chunk_bytes[chunk] for _, chunk in held))

    def run_backward():
        nonlocal done_backward
        pair = backward(done_backward)
        assert pair in held, f"backward of {pair} before its forward"
        held.remove(pair)
        done_backward += 1

    for _ in range(warm_up):
        run_forward()
    while done_forward < total:
        run_forward()
        run_backward()
    while done_backward < total:
        run_backward()
    assert not held
    return most


def test_interleaved_counts_follow_narayanan_figure_4():
    # Narayanan et al. 2021 Figure 4 (bottom): 4 devices, 2 chunks each, 8 micro-batches. Device 1 runs
    # micro-batches 1-4 through chunk 1, 1-4 through chunk 2, then 5 and 6 through chunk 1 before its first
    # backward pass; in Megatron-LM's steady state the forward pass of 7 comes before that backward pass. So at
    # its busiest it holds 11 chunk passes: 7 through chunk 1, 4 through chunk 2. Device 4 runs 1-4 through chunk
    # 1 and 1 through chunk 2, whose backward pass follows at once: 5 passes, 4 and 1.
    layout = interleaved(4, 2, 8)
    assert held_in_flight(layout, 0, (1.0, 1.0)) == (11.0, (7, 4))
    assert held_in_flight(layout, 3, (1.0, 1.0)) == (5.0, (4, 1))
    # between them each device holds two passes fewer than the one before (it starts its backward passes
    # two steps earlier: one for its own forward, one for the gradient to come back)
    assert [held_in_flight(layout, i, (1.0, 1.0))[0] for i in range(4)] == [11, 9, 7, 5]


def test_first_stage_is_korthikanti_interleaving_factor_and_later_stages_are_not_scaled():
    # GPT-3 175B on 8 stages × 3 chunks (Korthikanti et al. 2022's 175B run): 96 layers, 4 per chunk.
    # First stage: L·(1 + (p − 1)/(p·v)) = 96 · (1 + 7/24) = 124 layers of activations (§4.2.3), i.e.
    # 31 chunk passes of 4 layers = 2·7 + 2·8 + 1. The last stage: (v − 1)·p + 1 = 17 chunk passes, 68 layers;
    # scaling 1F1B's count instead, 1 · (1 + 7/24) micro-batches of 12 layers, would give 15.5 layers.
    m = resolve_model("gpt3-175b").spec
    w = workload(m, 2048)
    layout = Layout(
        pp=8, tp=8, sequence_parallel=True, grad_accum=64, split=PipelineSplit(schedule="interleaved", virtual_stages=3)
    )
    one = stage_activations(w, Layout(pp=96, tp=8, sequence_parallel=True), 1)
    first = stage_activations(w, layout, 0)
    last = stage_activations(w, layout, 7)
    assert first.in_flight == pytest.approx(124 / 12)
    assert first.total - first.outside == pytest.approx(124 * one.total)
    assert last.in_flight == pytest.approx(68 / 12)
    assert last.total - last.outside == pytest.approx(68 * one.total)


def test_as_many_micro_batches_as_stages_runs_every_forward_pass_first_on_early_stages():
    # m = p: the first stage's warm-up, 2·(p − 1) + (v − 1)·p, is at least m·v, so current Megatron-LM runs every
    # forward pass before the first backward (its all-warm-up case, `num_warmup_microbatches >= total`), and the
    # stage holds all p micro-batches through all its layers, no more: the interleaving factor does not apply.
    # p = 4, v = 2: 6 + 4 = 10 ≥ 8. The last stage's warm-up, (v − 1)·p = 4 < 8, is not all of them, so it still
    # alternates: 5 passes. (Older releases ran every stage's forward passes first whenever m = p.)
    layout = interleaved(4, 2, 4)
    assert held_in_flight(layout, 0, (1.0, 1.0)) == (8.0, (4, 4))
    assert held_in_flight(layout, 3, (1.0, 1.0)) == (5.0, (4, 1))


def test_llama3_split_with_embedding_and_loss_counted_holds_most_on_the_second_stage():
    # Llama 3 405B, 16 stages × 8 chunks with the embedding and the loss counted as layers: every chunk is one
    # layer, except the first stage's first (the embedding alone) and the last stage's last (the loss alone).
    m = resolve_model("llama-3.1-405b").spec
    w = workload(m, 8192)
    layout = Layout(
        dp=64, tp=8, pp=16, zero=2, sequence_parallel=True, grad_accum=32,
        split=PipelineSplit(schedule="interleaved", virtual_stages=8, embedding_in_split=True, loss_in_split=True),
    )  # fmt: skip
    chunks = stage_chunk_mixes(m, layout)
    assert [d + e for d, e in chunks[0]] == [0, 1, 1, 1, 1, 1, 1, 1]
    assert [d + e for d, e in chunks[15]] == [1, 1, 1, 1, 1, 1, 1, 0]
    one = stage_activations(w, Layout(pp=126, tp=8, sequence_parallel=True), 1)
    # stage 1: 2·14 + 7·16 + 1 = 141 passes of one layer each
    second = stage_activations(w, layout, 1)
    assert second.total == pytest.approx(141 * one.total)
    # stage 0: 2·15 + 7·16 + 1 = 143 passes; 16 + 15 of them through the embedding chunk, which holds no layer
    first = stage_activations(w, layout, 0)
    embedding_side, _ = stage_outside_bytes(w, layout, 0)
    assert first.total == pytest.approx(112 * one.total + 31 * embedding_side)
    # the last stage: 7·16 + 1 = 113 passes: 16 through each of its 7 layers, 1 through the loss. Then each
    # steady step runs a forward pass and a backward pass: 15 more through the loss and back; at the 16th the
    # forward pass takes micro-batch 17 into the first chunk (a layer) while the backward pass frees the loss
    # chunk (the head side), so the stage then holds 113 layers and no head side. Which is more depends on a
    # layer (642 MB) against the head side (the fp32 logits, 525 MB, and the head's inputs).
    last = stage_activations(w, layout, 15)
    _, head_side = stage_outside_bytes(w, layout, 15)
    assert head_side < one.total
    assert last.total == pytest.approx(113 * one.total)
    # so the second stage is the most loaded, and the search over stages finds it
    assert second.total > max(first.total, last.total)
    heaviest = most_loaded_gpu(w, layout)
    assert heaviest.stage == 1 and heaviest.activations == second.total


def test_interleaved_chunks_take_the_model_layers_in_megatron_order():
    # DeepSeek-V3: 61 layers, the first 3 dense. 16 stages × 2 chunks = 32 slices: 61 = 32 + 29, so slices 0-28
    # hold 2 layers and 29-31 one. Slice g is chunk g // 16 of stage g mod 16: stage 0's first chunk holds
    # layers 0-1 (dense), stage 1's first chunk layers 2-3 (one dense, one MoE), and stage 0's second chunk is
    # slice 16, layers 32-33. Under 1F1B stage 0 holds layers 0-3, the 3 dense and one MoE.
    m = resolve_model("deepseek-v3").spec
    chunks = stage_chunk_mixes(m, interleaved(16, 2, 16))
    assert chunks[0] == ((2, 0), (0, 2)) and chunks[1] == ((1, 1), (0, 2)) and chunks[15] == ((0, 2), (0, 1))
    assert stage_chunk_mixes(m, Layout(pp=16))[0] == ((3, 1),)


@settings(max_examples=150, deadline=None)
@given(
    p=st.integers(2, 8),
    v=st.integers(2, 4),
    groups=st.integers(1, 4),
    stage_at=st.floats(0, 1, exclude_max=True),
    sizes=st.lists(st.integers(0, 5), min_size=4, max_size=4),
)
def test_held_in_flight_is_the_schedule_run_pass_by_pass(p, v, groups, stage_at, sizes):
    # the closed-form counts and the one-period scan against the schedule run pass by pass and held set by set, for
    # any chunk sizes (an empty embedding chunk, a heavy head, dense and MoE chunks), any stage, m a multiple of p
    m, stage, chunk_bytes = groups * p, int(stage_at * p), tuple(float(x) for x in sizes[:v])
    most, _ = held_in_flight(interleaved(p, v, m), stage, chunk_bytes)
    assert most == megatron_step(p, v, m, stage, chunk_bytes)


@pytest.mark.parametrize(("p", "m", "held"), [(4, 8, [4, 3, 2, 1]), (4, 2, [2, 2, 2, 1]), (1, 3, [1])])
def test_1f1b_holds_p_minus_i_micro_batches(p, m, held):
    # Narayanan et al. 2021 §2.2.1 and Figure 4 (top, p = 4, m = 8): device 1 runs micro-batches 1-4 forward
    # before its first backward pass, device 4 runs 1 and then its backward: 4, 3, 2, 1 held. With m = 2 < p no
    # stage can hold more than the step's 2; with one stage, one.
    layout = Layout(pp=p, grad_accum=m)
    assert [held_in_flight(layout, i, (1.0,))[1] for i in range(p)] == [(n,) for n in held]


def test_uneven_stages_under_the_interleaved_schedule_split_evenly_over_their_chunks():
    # Llama 3 70B, 80 layers on 4 stages × 2 chunks with 18 layers on the first and the last stage: the middle two
    # take 22 each; every stage's share splits in two (9 + 9, 11 + 11). Stage 1 runs 2·2 + 1·4 + 1 = 9 chunk passes
    # of 11 layers at its busiest: 99 layers, as many as the first stage's 2·3 + 4 + 1 = 11 passes of 9 layers.
    m = resolve_model("llama-3-70b").spec
    w = workload(m, 4096)
    layout = Layout(
        pp=4,
        grad_accum=8,
        split=PipelineSplit(schedule="interleaved", virtual_stages=2, first_stage_layers=18, last_stage_layers=18),
    )
    check_layout(w, layout, None)
    chunks = stage_chunk_mixes(m, layout)
    assert [[dense for dense, _ in stage] for stage in chunks] == [[9, 9], [11, 11], [11, 11], [9, 9]]
    one = stage_activations(w, Layout(pp=80), 1).total
    assert stage_activations(w, layout, 1).total == pytest.approx(99 * one)
    first = stage_activations(w, layout, 0)
    assert first.total - first.outside == pytest.approx(99 * one)
    # 19 on the first stage does not split over 2 chunks
    uneven = dataclasses.replace(layout.split, first_stage_layers=19, last_stage_layers=17)
    with pytest.raises(LmcalcError) as refused:
        check_layout(w, dataclasses.replace(layout, split=uneven), None)
    assert re.search("--first-stage-layers 19 .* do not", error_message(refused.value))
