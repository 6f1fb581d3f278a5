"""Megatron-FSDP's own buffers: ZeRO-2 and ZeRO-3 under the megatron profile (``--use-megatron-fsdp`` with
``--data-parallel-sharding-strategy optim_grads`` or ``optim_grads_params``), read from NVIDIA/Megatron-LM core_v0.16.1
(55ac7082), megatron/core/distributed/fsdp/src/megatron_fsdp/megatron_fsdp.py and param_and_grad_buffer.py.

The counts below are derived by hand from those files' rules:
* the suggested communication unit C = max(10⁹, 2 · a TransformerLayer's parameters) under ZeRO-3 and
  max(10⁹, bucket size) under ZeRO-2, with Megatron-LM's bucket size max(4·10⁷, 10⁶ · DP·CP);
* the all-gather prefetches whole layers while less than C/2 elements are in flight beyond the one in use; the
  embedding, final norm and output layer are not units and stay gathered;
* a gradient bucket is made unsharded; when it is reduced, the queue before it is freed from the oldest while it
  holds more than C, and it joins the queue.
"""

from __future__ import annotations

import pytest

from lmcalc.engine.memory.fsdp_buffers import NO_QUEUE
from lmcalc.engine.memory.gpu_memory import most_loaded_gpu
from lmcalc.engine.memory.phases import step_phases
from lmcalc.engine.parallel.layout import Layout
from lmcalc.engine.workload import Workload
from lmcalc.estimates.training import bf16_gradient_buffer
from lmcalc.presets import framework_profile, resolve_model, resolve_optimizer, resolve_precision

# Llama 3 8B (h 4096, f 14336, 8 KV heads of 128, V 128256, 32 layers), parameters by hand
H, F, KV, V = 4096, 14_336, 8 * 128, 128_256
LAYER = H * (H + 2 * KV) + H * H + 3 * H * F + 2 * H  # fused QKV, output projection, gated MLP, two norms
assert LAYER == 218_112_000
EMBEDDING = V * H  # 525,336,576
HEAD = V * H + H  # the output layer and the final norm: one bucket
CHECKPOINT = 8192 * H * 2  # under full recomputation a layer keeps its bf16 input, freed by its backward


def gpu(layout: Layout, recompute: str = "none", profile=None, model: str = "llama-3-8b"):
    bf16, adamw = resolve_precision("bf16-mixed").spec, resolve_optimizer("adamw").spec
    profile = profile or framework_profile("megatron")
    w = Workload(resolve_model(model).spec, bf16, adamw, 8192, 1, "flash", recompute, framework=profile)
    return most_loaded_gpu(w, layout)


def test_zero3_gathers_the_layer_in_use_the_prefetched_ones_and_the_modules_outside():
    # C = max(1e9, 2·218,112,000) = 1e9; prefetch while less than 5e8 is in flight: ⌈5e8 / 218,112,000⌉ = 3 layers
    assert gpu(Layout(dp=8, zero=3)).zero3_buffers == (1 + 3) * LAYER * 2 + (EMBEDDING + HEAD) * 2


def test_a_layer_over_half_the_floor_sets_the_unit():
    # Llama 3 70B (h 8192, f 28672): a layer of 855,654,400 > 5e8, so C = 2u and one layer is prefetched
    h, f = 8192, 28_672
    layer = h * (h + 2 * KV) + h * h + 3 * h * f + 2 * h
    assert layer == 855_654_400
    outside = (V * h) * 2 + h  # untied embedding and output layer, and the final norm
    assert gpu(Layout(dp=8, zero=3), model="llama-3-70b").zero3_buffers == (1 + 1) * layer * 2 + outside * 2


def test_zero3_gradient_buckets_queue_behind_the_reduce_scatter():
    u = LAYER
    queue = gpu(Layout(dp=8, zero=3)).kept.queue
    # the head's bucket (525.3M) waits while the queue holds at most 1e9: it is freed when the fourth layer's
    # bucket is reduced (H + 3u = 1,179.7M > 1e9); from then on the queue keeps 4u and makes one more: 5u, then 6u
    hand = [HEAD + u, HEAD + 2 * u, HEAD + 3 * u, HEAD + 4 * u, 5 * u] + [6 * u] * 27
    assert queue.head == HEAD * 4  # fp32 gradient buffers (--bf16 forces accumulation in fp32)
    assert queue.layers == tuple(alive * 4 for alive in hand)
    assert queue.embedding == (5 * u + EMBEDDING) * 4


def test_the_buckets_add_their_most_beyond_what_the_layers_above_freed():
    g = gpu(Layout(dp=8, zero=3), recompute="full")
    assert g.held.first_layer == CHECKPOINT
    without = step_phases(g.held, g.transients, g.kept.step_transient, g.kept.grads)
    # the fourth layer from the top: H + 4u alive, three checkpoints freed; then 5u and 6u gain less than they free
    added = g.phases.layer_backward - without.layer_backward
    assert added == pytest.approx((HEAD + 4 * LAYER) * 4 - 3 * CHECKPOINT)
    assert g.phases.norm_backward - without.norm_backward == HEAD * 4
    assert g.phases.binding == "a layer's backward"


def test_zero2_buckets_cut_at_the_bucket_size():
    # ZeRO-2 has no units: buckets of max(4e7, 1e6·8) = 4e7 elements; a layer in ⌈218,112,000 / 4e7⌉ = 6 of p each
    p = LAYER / 6
    queue = gpu(Layout(dp=8, zero=2)).kept.queue
    # the head waits until H + 14p > 1e9 (H + 13p = 997.9M does not), so the third layer's 15th piece sees H + 15p;
    # then the queue grows to 28p (27p = 981.5M ≤ 1e9) and each piece after sees 29p
    hand = [HEAD + 6 * p, HEAD + 12 * p, HEAD + 15 * p, 24 * p] + [29 * p] * 28
    assert queue.layers == pytest.approx(tuple(alive * 4 for alive in hand))
    assert gpu(Layout(dp=8, zero=2)).zero3_buffers == 0  # the 16-bit weights stay whole under ZeRO-2


def test_bf16_gradients_halve_the_buckets():
    fp32 = gpu(Layout(dp=8, zero=3)).kept.queue
    bf16 = gpu(Layout(dp=8, zero=3), profile=bf16_gradient_buffer(framework_profile("megatron"))).kept.queue
    assert bf16.layers == tuple(alive / 2 for alive in fp32.layers)


def test_only_sharded_replicas_and_only_megatron():
    assert gpu(Layout(dp=8, zero=1)).kept.queue is NO_QUEUE  # the distributed optimizer's whole buffer
    one = gpu(Layout(tp=8, zero=3))  # one replica: Megatron-FSDP shards nothing (is_data_distributed is False)
    assert one.kept.queue is NO_QUEUE and one.zero3_buffers == 0
    titan = gpu(Layout(dp=8, zero=3), profile=framework_profile("torchtitan"))
    assert titan.kept.queue is NO_QUEUE


def test_explain_shows_the_window(lmcalc_run):
    argv = ["memory", "-m", "llama-3-8b", "--gpus", "8xH100", "--zero", "3", "--framework", "megatron",
            "--recompute", "full", "--json"]  # fmt: skip
    total = lmcalc_run(argv).json["results"]["total"]
    assert "⌈500,000,000 / 218,112,000⌉ = 4 layers" in total["zero3_buffers"]["substituted"]
    assert "unsharded gradient buckets in flight" in total["transient"]["substituted"]
