"""What a process holds outside PyTorch's pool: the CUDA context and cuBLAS's kernels, NCCL's communicator where the
run has peers, and the communication buffers of Megatron-Core's flex token dispatcher (docs/formulas.md §5.13).

DeepEP and HybridEP move tokens through buffers of their own that every rank of the dispatch group can reach (CUDA
IPC handles over NVLink, registered memory for RDMA), made once when the first MoE layer dispatches and held for the
run: ``torch.cuda.memory_allocated`` never sees them. Both backends come from DeepEP's ``hybrid-ep`` branch (94a9f8f),
which Megatron-Core's ``fused_a2a.py`` imports ``Buffer`` and ``HybridEPBuffer`` from. The group is Megatron-Core's
``tp_ep_group``: the expert TP × EP ranks (``MoEFlexTokenDispatcher``), each with the E/EP local experts.

* HybridEP sizes its buffers for the worst case, every token of the group routed to one rank (docs/
  Hybrid-EP_Implementation.md §4.2; csrc/hybrid_ep/buffer/intranode.cu and internode_doca.cu). With t tokens a rank
  dispatches (rounded up to 16, ``HybridEPBuffer.update_template_config``), G ranks, R of them in one NVLink domain
  and N = G/R domains, the NVLink buffers (dispatch and combine share them) hold the G·t tokens in bf16, their
  routing probabilities for the domain's experts in fp32 and a scaling factor per 128 values in fp32 (allocated in
  bf16 too); across domains the RDMA buffers add the rank's own t tokens, probabilities and factors, and for the
  other N − 1 domains one group buffer of tokens, probabilities and factors for the dispatch and a reduction and a
  group buffer of tokens and probabilities for the combine. Megatron-Bridge sets R to min(EP, 8) on eight-GPU
  boards and to EP on NVL72 racks (scripts/performance/perf_plugins.py ``NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN``):
  the EP ranks one NVLink domain holds.
* DeepEP's normal kernels size theirs by a chunk of tokens per channel, not by the batch (``Buffer.
  get_dispatch_config``/``get_combine_config``, csrc/config.hpp ``get_nvl_buffer_size_hint``/
  ``get_rdma_buffer_size_hint``; Megatron-Core ``fused_a2a.get_buffer`` takes the larger of the two configs'), with
  10 channels for Megatron-Core's 20 SMs, at most 8 NVLink peers, and a 32 MiB workspace (csrc/kernels/configs.cuh).

Not counted: the buffers' flags and counters (bytes), NVSHMEM's own heap and queue pairs beyond DeepEP's RDMA buffer.
"""

from __future__ import annotations

from typing import NamedTuple

from lmcalc.engine.model.tensors import Dim
from lmcalc.engine.parallel.layout import Layout
from lmcalc.engine.workload import Workload
from lmcalc.result import Term
from lmcalc.units import GB

TOKEN_BYTES = 2
"""The flex dispatcher sends bf16 tokens (Megatron-Core's HybridEP path refuses an fp8 dispatch)."""
SCALE_BLOCK = 128
"""HybridEP keeps an fp32 scaling factor per 128 values of a token."""
TOKEN_ALIGNMENT = 16
"""HybridEP rounds a rank's tokens up to a multiple of 16 (``update_template_config``)."""

DEEPEP_CHANNELS = 10
"""DeepEP's channels: half its SMs, 20 where Megatron-Core's ``moe_flex_dispatcher_num_sms`` is unset."""
DEEPEP_NVL_PEERS = 8
"""DeepEP's normal kernels reach at most 8 ranks over NVLink (``NUM_MAX_NVL_PEERS``); more go over RDMA."""
DEEPEP_TOPK, DEEPEP_SCALES, DEEPEP_META = 128, 128, 8
"""Per buffered token, room for 128 int64 expert indices, 128 fp32 weights and 128 fp32 scales, and an 8-byte
``SourceMeta`` (csrc/config.hpp, csrc/kernels/internode.cu)."""
DEEPEP_WORKSPACE = 32 * 1024 * 1024
"""DeepEP's workspace beside its buffers (csrc/kernels/configs.cuh ``NUM_WORKSPACE_BYTES``)."""
DEEPEP_CONFIGS: dict[int, tuple[tuple[int, int, int, int], tuple[int, int, int, int]]] = {
    2: ((24, 256, 6, 128), (10, 256, 6, 128)),
    4: ((6, 256, 6, 128), (9, 256, 6, 128)),
    8: ((6, 256, 6, 128), (4, 256, 6, 128)),
    16: ((36, 288, 20, 128), (4, 288, 12, 128)),
    24: ((8, 288, 32, 128), (1, 288, 8, 128)),
    32: ((32, 288, 32, 128), (1, 288, 8, 128)),
    64: ((20, 288, 28, 128), (1, 288, 20, 128)),
    128: ((20, 560, 32, 128), (1, 560, 12, 128)),
    144: ((32, 720, 12, 128), (2, 720, 8, 128)),
    160: ((28, 720, 12, 128), (2, 720, 8, 128)),
}
"""(dispatch, combine) chunk sizes by group size: NVLink send and receive tokens, RDMA send and receive tokens
(deep_ep/buffer.py). DeepEP refuses other group sizes; lmcalc takes the next listed one up and says so."""


class DispatcherBuffers(NamedTuple):
    """The flex dispatcher's buffers on one GPU: NVLink's and RDMA's bytes, and how they were found (the formula, its
    numbers substituted, what its symbols stand for)."""

    nvlink: float
    rdma: float
    formula: str
    numbers: str
    symbols: str
    source: str

    @property
    def total(self) -> float:
        return self.nvlink + self.rdma


NO_BUFFERS = DispatcherBuffers(0.0, 0.0, "", "", "", "")


def outside_pool(w: Workload, layout: Layout) -> float:
    """Bytes outside PyTorch's pool: the CUDA context and cuBLAS's kernels, a NCCL communicator's buffers where the
    layout spans more than one GPU, and the MoE flex dispatcher's (``dispatcher_buffers``)."""
    allocator = w.framework.allocator
    nccl = allocator.nccl_bytes if layout.gpus > 1 else 0.0
    return allocator.context_bytes + nccl + dispatcher_buffers(w, layout).total


def outside_pool_terms(w: Workload, layout: Layout, outside: float) -> tuple[Term, ...]:
    """``outside`` (``outside_pool``) as terms: the flex dispatcher's buffers with their formula, where it has any,
    then the whole."""
    allocator, flex = w.framework.allocator, dispatcher_buffers(w, layout)
    nccl = outside - allocator.context_bytes - flex.total
    parts = [(allocator.context_bytes, "CUDA context and cuBLAS kernels"),
             (nccl, "a NCCL communicator (more than one GPU)"),
             (flex.total, f"{w.moe_dispatcher}'s buffers")]  # fmt: skip
    shown = [part for i, part in enumerate(parts) if part[0] or not i]
    named = ["CUDA context", *(["NCCL"] if nccl else []), *([f"{w.moe_dispatcher}'s buffers"] if flex.total else [])]
    label = " and ".join(named) if len(named) < 3 else f"{named[0]}, {named[1]} and {named[2]}"
    context = Term("context", label, outside, "bytes", " + ".join(what for _, what in shown),
                   " + ".join(f"{b / GB:.4g} GB" for b, _ in shown), source=allocator.source,
                   note="outside PyTorch's pool")  # fmt: skip
    if not flex.total:
        return (context,)
    buffers = Term("dispatcher_buffers", f"MoE dispatcher buffers ({w.moe_dispatcher})", flex.total, "bytes",
                   flex.formula, flex.numbers, source=flex.source,
                   note=f"{flex.symbols}; held for the run, outside PyTorch's pool")  # fmt: skip
    return (buffers, context)


def dispatcher_buffers(w: Workload, layout: Layout) -> DispatcherBuffers:
    """The buffers Megatron-Core's flex dispatcher holds on each GPU of ``layout``; none for NCCL's all-to-all, a
    model without routed experts, or a dispatch group of one GPU."""
    moe, group = w.model.moe, layout.expert_tp * layout.ep
    if moe is None or w.moe_dispatcher == "alltoall" or group == 1:
        return NO_BUFFERS
    if w.moe_dispatcher == "hybridep":
        return _hybridep(w, layout, group)
    return _deepep(w.expert_width, group)  # the tokens' width as dispatched: h, or a latent MoE's l


def rank_tokens(w: Workload, layout: Layout) -> int:
    """t: the tokens one rank hands the dispatcher in a micro-batch, b·s/(CP·TP) under sequence parallelism
    (b·s/CP without it), rounded up to HybridEP's 16."""
    split = layout.cp * (layout.tp if layout.sequence_parallel else 1)
    tokens = -(-w.tokens // split)
    return -(-tokens // TOKEN_ALIGNMENT) * TOKEN_ALIGNMENT


def domain_ranks(group: int, nvlink_domain: int) -> int:
    """R: the group's ranks in one NVLink domain, the largest divisor of the group the domain holds (HybridEP
    requires R to divide the group)."""
    return max(r for r in range(1, min(group, nvlink_domain) + 1) if group % r == 0)


def _hybridep(w: Workload, layout: Layout, group: int) -> DispatcherBuffers:
    moe, h, x = w.model.moe, int(w.expert_width.size), w.expert_width.symbol  # as dispatched: h, or latent l
    assert moe is not None
    t, local = rank_tokens(w, layout), moe.num_experts // layout.ep
    r = domain_ranks(group, w.nvlink_domain)
    n, scales = group // r, h // SCALE_BLOCK
    token = h * TOKEN_BYTES + scales * 4  # a token and its scaling factors
    probs = local * r * 4  # its routing probabilities for the domain's experts, fp32
    nvlink = group * t * (token + probs)
    rdma = t * (token + local * group * 4) + t * (n - 1) * (3 * (h * TOKEN_BYTES + probs) + scales * 4) if n > 1 else 0
    formula, numbers = f"G·t·(2{x} + 4·⌊{x}/128⌋ + 4·E_l·R)", f"{group}·{t}·(2·{h} + 4·{scales} + 4·{local}·{r})"
    if n > 1:
        formula += f" + t·(2{x} + 4·⌊{x}/128⌋ + 4·E_l·G) + t·(N − 1)·(3·(2{x} + 4·E_l·R) + 4·⌊{x}/128⌋)"
        numbers += (
            f" + {t}·(2·{h} + 4·{scales} + 4·{local}·{group}) + {t}·{n - 1}·(3·(2·{h} + 4·{local}·{r}) + 4·{scales})"
        )
    symbols = (
        "G: the dispatch group's ranks (ETP·EP); t: a rank's tokens a micro-batch, rounded up to 16; E_l: its experts; "
        + ("l: the latent width the tokens are dispatched at; " if x == "l" else "")
        + f"R: the group's ranks in one NVLink domain, N = G/R domains (here {n}): the NVLink buffers"
        + (", then the RDMA buffers" if n > 1 else "")
    )
    source = "DeepEP hybrid-ep 94a9f8f docs/Hybrid-EP_Implementation.md §4.2, csrc/hybrid_ep/buffer"
    return DispatcherBuffers(float(nvlink), float(rdma), formula, numbers, symbols, source)


def _deepep(width: Dim, group: int) -> DispatcherBuffers:
    hidden = int(width.size)
    listed = min((g for g in DEEPEP_CONFIGS if g >= group), default=max(DEEPEP_CONFIGS))
    dispatch, combine = DEEPEP_CONFIGS[listed]
    peers, rdma_ranks, c = min(group, DEEPEP_NVL_PEERS), max(group // DEEPEP_NVL_PEERS, 1), DEEPEP_CHANNELS
    slot = hidden * TOKEN_BYTES + DEEPEP_META + DEEPEP_TOPK * 8 + DEEPEP_TOPK * 4 + DEEPEP_SCALES * 4
    chunk = max(dispatch[1], combine[1])  # NVLink receive tokens (the two configs agree)
    nvlink = _align(c * peers * (2 * rdma_ranks + 3) * 4 + c * peers * chunk * slot) + DEEPEP_WORKSPACE
    formula = f"C·P·c_nvl·(2{width.symbol} + 2,056) + 32 MiB"
    numbers = f"{c}·{peers}·{chunk}·(2·{hidden} + 2,056) + 32 MiB"
    rdma = 0
    if group > DEEPEP_NVL_PEERS:  # RDMA receive tokens, rounded up to a multiple of the send chunk
        rdma_chunk = max(-(-config[3] // config[2]) * config[2] for config in (dispatch, combine))
        heads = c * rdma_ranks * (2 * DEEPEP_NVL_PEERS + 2) * 2 * 4
        rdma = _align(heads + c * rdma_ranks * rdma_chunk * 2 * (slot + 16))
        formula += f" + C·(G/8)·c_rdma·2·(2{width.symbol} + 2,072)"
        numbers += f" + {c}·{rdma_ranks}·{rdma_chunk}·2·(2·{hidden} + 2,072)"
    symbols = (
        ("l: the latent width the tokens are dispatched at; " if width.symbol == "l" else "")
        + "C: 10 channels (Megatron-Core's 20 SMs); P: NVLink peers, min(G, 8); c_nvl, c_rdma: the chunks DeepEP lists "
        f"for G = {listed} ranks"
        + (f" (it lists no group of {group}: taken from the next one up)" if listed != group else "")
        + "; a token's slot holds its bf16 values, 128 int64 indices, 128 fp32 weights and scales, and its metadata"
    )
    source = "DeepEP hybrid-ep 94a9f8f deep_ep/buffer.py, csrc/config.hpp; Megatron-Core fused_a2a.get_buffer"
    return DispatcherBuffers(float(nvlink), float(rdma), formula, numbers, symbols, source)


def _align(n: int) -> int:
    return -(-n // 128) * 128
