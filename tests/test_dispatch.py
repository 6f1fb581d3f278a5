"""An MoE layer's token dispatch (engine.time.dispatch, docs/formulas.md §8.4.1): NCCL's all-to-all of k copies, or
DeepEP's and HybridEP's one copy per GPU reached and one per node across nodes, derived here by hand."""

import itertools
import math

import pytest

from lmcalc.engine.time.comm import (
    INTER_NODE_LATENCY_S,
    INTRA_NODE_LATENCY_S,
    INTRA_NODE_STEP_S,
)
from lmcalc.engine.time.dispatch import NVLINK_EFFICIENCY, EpGroup, dispatch_time, reached
from lmcalc.engine.workload import Workload
from lmcalc.errors import LmcalcError
from lmcalc.presets import framework_profile, parse_cluster, resolve_model, resolve_optimizer, resolve_precision

pytestmark = pytest.mark.fast

TOKEN_BYTES = 4096 * 7168 * 2  # a micro-batch's tokens on one GPU, bf16, DeepSeek-V3's width


def test_the_gpus_a_token_reaches_by_enumeration():
    # 8 experts on 4 GPUs, 2 each, a token picks 2 of them: count the distinct GPUs over every pair
    pairs = list(itertools.combinations(range(8), 2))
    mean = sum(len({expert // 2 for expert in pair}) for pair in pairs) / len(pairs)
    assert reached(4, 2, 8, 2) == pytest.approx(mean, rel=1e-12)  # 52 / 28
    # with 2 zero-computation experts in the pool (never sent): 10 choose 2, counting only real experts' GPUs
    pairs = list(itertools.combinations(range(10), 2))
    mean = sum(len({expert // 2 for expert in pair if expert < 8}) for pair in pairs) / len(pairs)
    assert reached(4, 2, 10, 2) == pytest.approx(mean, rel=1e-12)
    # Qwen3 30B-A3B over EP 8: 16 experts a GPU, top 8 of 128
    assert reached(8, 16, 128, 8) == pytest.approx(8 * (1 - math.comb(112, 8) / math.comb(128, 8)), rel=1e-12)
    assert reached(1, 128, 128, 8) == 1  # one GPU holds them all


def _group(ep: int, node_limit: int | None = None) -> EpGroup:
    return EpGroup(ep, 1, 256, 256, 8, node_limit)  # DeepSeek-V3: 256 experts, top 8


def test_nccls_all_to_all_sends_every_copy_whatever_the_node_limit():
    h100 = parse_cluster("8x8xH100")
    # within a node: α + α_step + (n − 1)/n · k · bytes / the NVLink ring's bus bandwidth (367.2 GB/s, h100-sxm.yaml)
    ring = INTRA_NODE_LATENCY_S + INTRA_NODE_STEP_S + 7 / 8 * 8 * TOKEN_BYTES / 367.2e9
    assert dispatch_time("alltoall", _group(8), TOKEN_BYTES, 8, 1.0, h100) == pytest.approx(ring, rel=1e-12)
    # over 8 nodes: 7/8 of the 8 copies leave the node over the 47 GB/s NIC, with DeepSeek-V3's node limit or not
    remote = 56 / 64 * 8 * TOKEN_BYTES / 47e9 + INTER_NODE_LATENCY_S
    for limit in (None, 4):
        assert dispatch_time("alltoall", _group(64, limit), TOKEN_BYTES, 8, 1.0, h100) == pytest.approx(remote)


def test_deepep_sends_a_copy_per_gpu_reached_at_its_kernels_rate():
    h100 = parse_cluster("8x8xH100")
    ranks = 8 * (1 - math.comb(224, 8) / math.comb(256, 8))  # 32 experts a GPU
    received = ranks * TOKEN_BYTES  # its own tokens' copy included, as DeepEP counts the bytes a GPU receives
    expected = INTRA_NODE_LATENCY_S + received / (NVLINK_EFFICIENCY["deepep"] * 450e9)
    assert dispatch_time("deepep", _group(8), TOKEN_BYTES, 8, 1.0, h100) == pytest.approx(expected, rel=1e-12)
    hybrid = INTRA_NODE_LATENCY_S + received / (NVLINK_EFFICIENCY["hybridep"] * 450e9)
    assert dispatch_time("hybridep", _group(8), TOKEN_BYTES, 8, 1.0, h100) == pytest.approx(hybrid, rel=1e-12)


def test_across_nodes_a_token_crosses_once_per_node_within_the_limit():
    h100 = parse_cluster("8x8xH100")
    # EP 64 over 8 nodes of 32 experts each. Limited to 4 nodes, a token's 8 experts are drawn from those 4 nodes'
    # 128; 7/8 of the nodes it visits are another node's, over the NIC
    visited = 4 * (1 - math.comb(96, 8) / math.comb(128, 8))
    remote = INTER_NODE_LATENCY_S + 56 / 64 * visited * TOKEN_BYTES / 47e9
    ranks = 64 * (1 - math.comb(252, 8) / math.comb(256, 8))
    near = INTRA_NODE_LATENCY_S + ranks * TOKEN_BYTES / (NVLINK_EFFICIENCY["deepep"] * 450e9)
    limited = dispatch_time("deepep", _group(64, 4), TOKEN_BYTES, 8, 1.0, h100)
    assert limited == pytest.approx(max(remote, near), rel=1e-12)
    assert remote > near  # the NIC binds
    # without the limit the 8 experts spread over all 8 nodes
    anywhere = 8 * (1 - math.comb(224, 8) / math.comb(256, 8))
    free = INTER_NODE_LATENCY_S + 56 / 64 * anywhere * TOKEN_BYTES / 47e9
    assert dispatch_time("deepep", _group(64), TOKEN_BYTES, 8, 1.0, h100) == pytest.approx(max(free, near))
    # against NCCL's 8 copies a token, 7/8 of them off the node
    assert dispatch_time("alltoall", _group(64, 4), TOKEN_BYTES, 8, 1.0, h100) / limited == pytest.approx(
        (INTER_NODE_LATENCY_S + 7 * TOKEN_BYTES / 47e9) / remote, rel=1e-12
    )


def test_an_nvl72_domain_is_one_nvlink_domain_for_the_dispatch():
    # GB200's trays hold 4 GPUs, its NVLink domain 72 (gb200.yaml scale_up_gpus): EP 64 stays on NVLink
    gb200 = parse_cluster("16x4xGB200")
    ranks = 64 * (1 - math.comb(252, 8) / math.comb(256, 8))
    nvlink = INTRA_NODE_LATENCY_S + ranks * TOKEN_BYTES / (NVLINK_EFFICIENCY["hybridep"] * 900e9)
    assert dispatch_time("hybridep", _group(64), TOKEN_BYTES, 8, 1.0, gb200) == pytest.approx(nvlink, rel=1e-12)


def test_deepep_with_padded_capacity_is_refused_in_a_line():
    moe = resolve_model("qwen3-30b-a3b").spec
    args = (moe, resolve_precision("bf16-mixed").spec, resolve_optimizer("adamw").spec, 4096)
    with pytest.raises(LmcalcError, match="deepep does not pad"):
        Workload(*args, framework=framework_profile("megatron"), capacity_factor=1.0, moe_dispatcher="deepep")
    Workload(*args, framework=framework_profile("megatron"), capacity_factor=1.0, pad_to_capacity=False,
             moe_dispatcher="deepep")  # fmt: skip
    with pytest.raises(LmcalcError, match="moe_dispatcher"):
        Workload(*args, framework=framework_profile("megatron"), moe_dispatcher="nccl")  # type: ignore[arg-type]
