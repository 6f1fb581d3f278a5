"""The flex dispatcher's buffers outside PyTorch's pool (engine.memory.dispatcher_buffers, docs/formulas.md §5.13):
HybridEP's against the worked example of its own implementation guide and, buffer by buffer, the allocations of
DeepEP's hybrid-ep branch (94a9f8f), derived here by hand; DeepEP's from its size hints."""

from dataclasses import replace

import pytest

from lmcalc import api
from lmcalc.engine.memory.gpu_memory import most_loaded_gpu
from lmcalc.engine.memory.outside_pool import dispatcher_buffers, domain_ranks, rank_tokens
from lmcalc.engine.parallel.layout import Layout
from lmcalc.engine.workload import Workload
from lmcalc.presets import framework_profile, resolve_model, resolve_optimizer, resolve_precision

pytestmark = pytest.mark.fast

H = 7168  # DeepSeek-V3's width; 256 routed experts


def _dsv3(seq: int = 4096, micro_batch: int = 1, **settings: object) -> Workload:
    spec = resolve_model("deepseek-v3").spec
    args = (spec, resolve_precision("bf16-mixed").spec, resolve_optimizer("adamw").spec, seq, micro_batch)
    return Workload(*args, framework=framework_profile("megatron"), **settings)  # type: ignore[arg-type]


def test_hybridep_on_one_nvlink_domain_is_its_guides_example():
    # docs/Hybrid-EP_Implementation.md §4.2, "MNNVL (64 ranks × 1 node)", EP64, 256 experts, BF16, 4,096 tokens a
    # rank: max_tokens 4096 · 64 = 262,144; the token buffer 262,144 · 7168 · 2 B (~3.5 GB), the probabilities
    # 262,144 · 256 · 4 B (~256 MB). intranode.cu also allocates the scaling factors, 262,144 · (7168 / 128) · 4 B,
    # in bf16 as in fp8, which the guide's table leaves out.
    w = _dsv3(moe_dispatcher="hybridep", nvlink_domain=72)
    buffers = dispatcher_buffers(w, Layout(dp=64, ep=64))
    max_tokens = 4096 * 64
    assert max_tokens * H * 2 == pytest.approx(3.5 * 2**30, rel=0.01)  # the guide's "~3.5 GB"
    assert buffers.nvlink == max_tokens * H * 2 + max_tokens * 256 * 4 + max_tokens * 56 * 4
    assert buffers.rdma == 0


def test_hybridep_across_eight_domains_allocates_its_rdma_buffers():
    # the guide's "RDMA (8 ranks × 8 nodes)": R = 8 of H100's NVLink domain, N = 8; the intra-node token buffer as
    # above, the probabilities for the domain's 32 experts. internode_doca.cu allocates, per rank, for the dispatch
    # the rank's own tokens (t·h·2), their probabilities for all 256 experts and scaling factors, and one group
    # buffer of tokens, probabilities (32 experts) and factors for each of the 7 other domains; for the combine a
    # reduction and a group buffer of tokens and probabilities for each (the guide's table names one of these four
    # token buffers, "RDMA token ~392 MB").
    w = _dsv3(moe_dispatcher="hybridep", nvlink_domain=8)
    buffers = dispatcher_buffers(w, Layout(dp=64, ep=64))
    t, others = 4096, 7
    assert buffers.nvlink == 4096 * 64 * (H * 2 + 32 * 4 + 56 * 4)
    dispatch = t * H * 2 + t * 256 * 4 + t * 56 * 4 + t * others * (H * 2 + 32 * 4 + 56 * 4)
    combine = 2 * t * others * (H * 2 + 32 * 4)
    assert t * others * H * 2 == pytest.approx(392 * 2**20, rel=0.01)  # the guide's "RDMA token"
    assert buffers.rdma == dispatch + combine


def test_a_ranks_tokens_follow_the_sequence_split_rounded_to_16():
    w = _dsv3(seq=4100, micro_batch=2, moe_dispatcher="hybridep")
    assert rank_tokens(w, Layout(dp=16, ep=16)) == 8208  # 8200 rounded up
    assert rank_tokens(w, Layout(tp=2, dp=8, ep=16, sequence_parallel=True)) == 4112  # 4100 rounded up
    assert rank_tokens(w, Layout(dp=8, cp=2, ep=16)) == 4112


def test_the_domain_holds_the_largest_divisor_of_the_group():
    # Megatron-Bridge (scripts/performance/perf_plugins.py): 8 on eight-GPU boards, EP itself on NVL72
    assert domain_ranks(16, 8) == 8
    assert domain_ranks(64, 72) == 64
    assert domain_ranks(4, 8) == 4
    assert domain_ranks(96, 72) == 48  # HybridEP requires R to divide the group


def test_deepep_sizes_its_buffers_by_chunks_not_tokens():
    # deep_ep/buffer.py for 64 ranks: dispatch (20, 288, 28, 128), combine (1, 288, 20, 128); csrc/config.hpp with
    # 20 SMs (10 channels), 8 NVLink peers, 8 RDMA ranks; a slot: 2h + 8 (SourceMeta) + 128·8 + 128·4 + 128·4
    slot = 2 * H + 8 + 1024 + 512 + 512
    nvl = 10 * 8 * (2 * 8 + 3) * 4 + 10 * 8 * 288 * slot
    recv = 140  # 128 rounded up to a multiple of 28 (dispatch) and of 20 (combine): 140 both
    rdma = 10 * 8 * (8 * 2 + 2) * 2 * 4 + 10 * 8 * recv * 2 * (slot + 16)
    for seq in (4096, 8192):  # the same for any batch
        buffers = dispatcher_buffers(_dsv3(seq=seq, moe_dispatcher="deepep"), Layout(dp=64, ep=64))
        assert buffers.nvlink == -(-nvl // 128) * 128 + 32 * 2**20  # and DeepEP's 32 MiB workspace
        assert buffers.rdma == -(-rdma // 128) * 128
    one_node = dispatcher_buffers(_dsv3(moe_dispatcher="deepep"), Layout(dp=8, ep=8))
    assert one_node.rdma == 0  # within 8 ranks DeepEP's normal kernels need no RDMA buffer
    assert "next one up" in dispatcher_buffers(_dsv3(moe_dispatcher="deepep"), Layout(dp=48, ep=48)).symbols


def test_nccls_all_to_all_and_a_group_of_one_hold_none():
    assert dispatcher_buffers(_dsv3(), Layout(dp=64, ep=64)).total == 0
    assert dispatcher_buffers(_dsv3(moe_dispatcher="hybridep"), Layout(dp=8)).total == 0


def test_the_buffers_add_to_the_gpus_total_outside_the_pool():
    layout = Layout(dp=64, ep=64, pp=4)
    nccl = most_loaded_gpu(_dsv3(nvlink_domain=72), layout)
    hybrid = most_loaded_gpu(_dsv3(moe_dispatcher="hybridep", nvlink_domain=72), layout)
    buffers = dispatcher_buffers(_dsv3(moe_dispatcher="hybridep", nvlink_domain=72), layout).total
    assert hybrid.reserved == nccl.reserved  # outside PyTorch's pool: no fragmentation on them
    assert hybrid.total - nccl.total == pytest.approx(buffers, rel=1e-12)
    assert replace(_dsv3(moe_dispatcher="hybridep"), nvlink_domain=72) == _dsv3(
        moe_dispatcher="hybridep", nvlink_domain=72
    )


def test_the_memory_estimate_shows_the_buffers_with_their_numbers():
    result = api.memory(
        model="deepseek-v3", gpus="64x4xgb200", framework="megatron", pp=4, ep=64, moe_dispatcher="hybridep"
    )
    term = result.report.term("total.dispatcher_buffers")
    assert term.formula.startswith("G·t·(2h")
    assert term.substituted.startswith("64·")  # one NVL72 domain: no RDMA buffers
    assert "R: the group's ranks in one NVLink domain" in term.note
    context = result.report.term("total.context")
    assert context.value >= term.value
