"""FSDP's ZeRO-2: FSDP2 without resharding after forward (``fully_shard(reshard_after_forward=False)``, torchtitan's
``parallelism.fsdp_reshard_after_forward = "never"`` and its default under pipeline parallelism, FSDP1's
SHARD_GRAD_OP) keeps each layer's gathered 16-bit weights from its forward to its backward. Under torchtitan's
profile, whose only persistent copy of the weights is the fp32 shard, lmcalc's ZeRO-2 is that; FSDP has no ZeRO-1.

The mechanism is checked against PyTorch's own FSDP2 on the CPU (one gloo rank); the figures by hand from Llama 3.1
8B's count (8,030,261,248 parameters, 32 layers; HF meta-llama/Llama-3.1-8B) on 8 GPUs.
"""

from __future__ import annotations

import socket
from dataclasses import replace

import pytest

import lmcalc
from lmcalc.engine.parallel.layout import Layout
from lmcalc.engine.parallel.pipeline import StageLayers
from lmcalc.engine.time.comm import group_time
from lmcalc.engine.time.rates import Machine
from lmcalc.engine.time.state_traffic import state_traffic
from lmcalc.engine.workload import Workload
from lmcalc.errors import LmcalcError
from lmcalc.presets import framework_profile, parse_cluster, resolve_model, resolve_optimizer, resolve_precision

N, LAYERS = 8_030_261_248, 32
SETTINGS = {"model": "llama-3.1-8b", "gpus": "8xH100", "seq": 4096, "framework": "torchtitan"}


@pytest.fixture(scope="module")
def one_rank():
    torch = pytest.importorskip("torch")
    import torch.distributed as dist

    with socket.socket() as s:  # a free port for the one-rank group's store
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield torch
    dist.destroy_process_group()


def _gathered_after_forward(torch, reshard: bool) -> tuple[int, int]:
    """The bytes of every layer's gathered weights still held after the forward, and the layers' parameters."""
    from torch import nn
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    h, layers = 64, 4
    model = nn.Sequential(*(nn.Sequential(nn.Linear(h, 4 * h, bias=False), nn.GELU(), nn.Linear(4 * h, h, bias=False))
                            for _ in range(layers)))  # fmt: skip
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model:
        fully_shard(layer, mp_policy=policy, reshard_after_forward=reshard)
    fully_shard(model, mp_policy=policy, reshard_after_forward=reshard)
    out = model(torch.randn(8, h))
    held = sum(
        p._unsharded_param.untyped_storage().size()
        for layer in model
        for p in layer._get_fsdp_state()._fsdp_param_group.fsdp_params
        if hasattr(p, "_unsharded_param")
    )
    out.float().sum().backward()
    return held, layers * 2 * 4 * h * h


@pytest.mark.torch
def test_fsdp2_without_resharding_keeps_every_layers_bf16_weights_to_the_backward(one_rank):
    held, params = _gathered_after_forward(one_rank, reshard=False)
    assert held == 2 * params  # every layer's weights, 2 bytes each, whole at the start of the backward
    held, _ = _gathered_after_forward(one_rank, reshard=True)
    assert held == 0  # resharded: each layer's gathered again in its backward (ZeRO-3)


def test_zero2_holds_the_bf16_weights_whole_and_reduce_scatters_a_layer():
    gpu = lmcalc.memory(zero=2, dp=8, **SETTINGS).gpu
    assert gpu.params == 2 * N  # 16.06 GB: the 16-bit weights, unsharded
    assert gpu.grads == 4 * N / 8 and gpu.master == 4 * N / 8 and gpu.optimizer == 8 * N / 8  # fp32 shards
    assert gpu.zero3_buffers == N / LAYERS * (2 + 4)  # one layer's bf16 gradients and their fp32 reduce-scatter input
    sharded = lmcalc.memory(zero=3, dp=8, **SETTINGS).gpu
    assert sharded.params == 0 and sharded.grads == gpu.grads  # ZeRO-3: only the master copy persists


def test_zero2_gathers_the_weights_once_a_micro_batch_where_zero3_gathers_twice():
    cluster = parse_cluster("8xH100")
    model = resolve_model("llama-3.1-8b").spec
    w = Workload(model, resolve_precision("bf16-mixed").spec, resolve_optimizer("adamw").spec, 4096, 1, "flash",
                 "full", framework=framework_profile("torchtitan"))  # fmt: skip
    built = StageLayers(LAYERS, 0, True, True)
    zero2 = state_traffic(w, Layout(dp=8, zero=2).state_shards, 1, built, Machine(cluster))
    zero3 = state_traffic(w, Layout(dp=8, zero=3).state_shards, 1, built, Machine(cluster))
    gather = group_time("all-gather", N * 2, 8, 1, cluster, False)
    scatter = group_time("reduce-scatter", N * 4, 8, 1, cluster, False)  # fp32 gradients (the profile's 4 B)
    assert zero2.zero3 == pytest.approx(gather + scatter, rel=1e-12)
    assert zero3.zero3 == pytest.approx(2 * gather + scatter, rel=1e-12)
    assert zero2.reduce == zero2.gather == 0.0  # not DeepSpeed's reduce and gather once a step
    megatron = replace(w, framework=framework_profile("megatron"))  # keeps its bf16 weights: ZeRO-2 as DeepSpeed's
    assert state_traffic(megatron, Layout(dp=8, zero=2).state_shards, 1, built, Machine(cluster)).zero3 == 0.0


def test_fsdp_has_no_zero1():
    with pytest.raises(LmcalcError, match=r"does not run ZeRO-1 \(zero 0, 2 or 3\)"):
        lmcalc.memory(zero=1, dp=8, **SETTINGS)
