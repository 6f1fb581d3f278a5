"""torchtitan's per-operator selective activation checkpointing against PyTorch's own selective checkpoint.

torchtitan's ``SelectiveAC`` (pytorch/torchtitan b5bcd76c, torchtitan/distributed/activation_checkpoint.py) wraps each
block in ``torch.utils.checkpoint`` with ``create_selective_checkpoint_contexts`` and a policy: the outputs of the
compute-intensive operators (``mm``, the attention kernels, ``topk``) are saved, but every second ``mm``/``linear`` in
the order the block runs them, and every other operator is recomputed. The policy below is that rule, written here
(the CPU's flash attention operator stands in for CUDA's, which the policy lists). PyTorch runs it on a block written
as torchtitan's Llama 3 block is (fused QKV or three projections, RoPE, SDPA with grouped KV heads, SwiGLU), with the
reference model's RMSNorm, which keeps its input and 1/rms as the fused kernel the profile describes does; the
storages live after the forward pass, what the backward's rerun saves, and the FLOPs the backward runs again are
counted and set beside ``engine.memory.op_checkpoint`` and ``engine.model.op_policy``.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402
import torch.utils._pytree as pytree  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from lmcalc.engine.memory.gpu_memory import selective_rebuilt  # noqa: E402
from lmcalc.engine.memory.op_checkpoint import op_checkpoint_kept  # noqa: E402
from lmcalc.engine.model import flops as fl  # noqa: E402
from lmcalc.engine.model.op_policy import selective_redone  # noqa: E402
from lmcalc.engine.parallel.layout import Layout  # noqa: E402
from lmcalc.engine.workload import Workload  # noqa: E402
from lmcalc.measure import StorageTracker  # noqa: E402
from lmcalc.presets import framework_profile, resolve_optimizer, resolve_precision  # noqa: E402
from lmcalc.reference_model import RMSNorm  # noqa: E402
from lmcalc.specs import ModelSpec  # noqa: E402

pytestmark = pytest.mark.torch

aten = torch.ops.aten
SAVED_OPS = {
    aten.mm.default,
    aten.addmm.default,
    aten.bmm.default,
    aten._scaled_dot_product_flash_attention.default,
    aten._scaled_dot_product_efficient_attention.default,
    aten._scaled_dot_product_cudnn_attention.default,
    aten._scaled_dot_product_flash_attention_for_cpu.default,  # the CPU's form of the CUDA kernels listed above
    aten.topk.default,
}
MATMULS = (aten.mm.default, aten.linear.default)

# h 256 (not the token count, so that no activation has a weight's size), 8 heads of 32, 2 KV heads, SwiGLU f 688
SPEC = ModelSpec(
    name="titan-block",
    vocab_size=512,
    hidden_size=256,
    num_layers=2,
    num_heads=8,
    num_kv_heads=2,
    head_dim=32,
    ffn_size=688,
    ffn_kind="swiglu",
    norm_kind="rmsnorm",
    position_embedding="rope",
    tied_embeddings=False,
    max_seq_len=4096,
)
SEQ, BATCH = 96, 2


def titan_policy():
    """torchtitan's SelectiveAC policy: save the listed operators' outputs but every second matmul, counted apart in
    the forward and in the recomputation."""
    counts = {False: 0, True: 0}

    def rule(ctx, func, *args, **kwargs) -> CheckpointPolicy:
        if func in MATMULS:
            counts[ctx.is_recompute] += 1
        if func in SAVED_OPS and not (func in MATMULS and counts[ctx.is_recompute] % 2 == 0):
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return rule


class TitanBlock(nn.Module):
    """A Llama 3 block as torchtitan writes it: Q, K and V from one matmul (split into contiguous copies) or three,
    RoPE, SDPA over grouped KV heads, w2(silu(w1(x)) · w3(x)). ``norm``: the RMSNorm module (by default the
    reference model's, which keeps its input and fp32 1/rms as CUDA's fused kernel does)."""

    def __init__(self, spec: ModelSpec, fused_qkv: bool, norm: Callable[[int], nn.Module] = RMSNorm):
        super().__init__()
        h, d, f = spec.hidden_size, spec.head_dim, spec.ffn_size
        self.widths = [spec.num_heads * d, spec.kv_heads * d, spec.kv_heads * d]
        self.attention_norm, self.ffn_norm = norm(h), norm(h)
        if fused_qkv:
            self.wqkv = nn.Linear(h, sum(self.widths), bias=False)
        else:
            self.wq, self.wk, self.wv = (nn.Linear(h, width, bias=False) for width in self.widths)
        self.wo = nn.Linear(spec.num_heads * d, h, bias=False)
        self.w1, self.w3 = nn.Linear(h, f, bias=False), nn.Linear(h, f, bias=False)
        self.w2 = nn.Linear(f, h, bias=False)
        self.fused, self.d = fused_qkv, d

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        n = self.attention_norm(x)
        if self.fused:
            q, k, v = (t.contiguous() for t in self.wqkv(n).split(self.widths, -1))
        else:
            q, k, v = self.wq(n), self.wk(n), self.wv(n)
        q, k, v = (t.view(b, s, -1, self.d).transpose(1, 2) for t in (q, k, v))
        out = F.scaled_dot_product_attention(rope(q, cos, sin), rope(k, cos, sin), v, is_causal=True, enable_gqa=True)
        x = x + self.wo(out.transpose(1, 2).reshape(b, s, -1))
        n = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(n)) * self.w3(n))


def rope(t, cos, sin):
    half = t.shape[-1] // 2
    return torch.cat([t[..., :half] * cos - t[..., half:] * sin, t[..., half:] * cos + t[..., :half] * sin], -1)


def tables(seq: int, d: int):
    angles = torch.arange(seq)[:, None] * (10000.0 ** (-torch.arange(d // 2) / (d // 2)))
    return angles.cos().to(torch.bfloat16), angles.sin().to(torch.bfloat16)


def workload_for(spec: ModelSpec, seq: int, batch: int, fused_qkv: bool) -> Workload:
    """The torchtitan profile's selective checkpointing of ``spec``, with Q, K and V from one matmul or three."""
    profile = framework_profile("torchtitan")
    profile = profile.model_copy(update={"recompute": profile.recompute.model_copy(update={"fused_qkv": fused_qkv})})
    bf16, adamw = resolve_precision("bf16-pure").spec, resolve_optimizer("adamw").spec
    return Workload(spec, bf16, adamw, seq, batch, "flash", "selective", framework=profile)


def workload(fused_qkv: bool) -> Workload:
    return workload_for(SPEC, SEQ, BATCH, fused_qkv)


def blocks(fused_qkv: bool) -> list[TitanBlock]:
    torch.manual_seed(0)
    return [TitanBlock(SPEC, fused_qkv).to(torch.bfloat16) for _ in range(SPEC.num_layers)]


def run_checkpointed(layers: list[TitanBlock], x, cos, sin):
    for layer in layers:
        x = checkpoint(layer, x, cos, sin, use_reentrant=False, preserve_rng_state=False,
                       context_fn=lambda: create_selective_checkpoint_contexts(titan_policy()))  # fmt: skip
    return x


@pytest.mark.parametrize("fused_qkv", [True, False], ids=["fused QKV", "three projections"])
def test_what_each_block_keeps_is_exact(fused_qkv):
    # the storages alive after the forward pass, beyond the weights and the output: the blocks' inputs (the first
    # made inside the count) and what the policy kept; the RNG state is not stashed (preserve_rng_state off)
    layers = blocks(fused_qkv)
    cos, sin = tables(SEQ, SPEC.head_dim)
    tracker = StorageTracker([p for layer in layers for p in layer.parameters()])
    with tracker:
        weights = tracker.allocated()
        x = torch.randn(BATCH, SEQ, SPEC.hidden_size, dtype=torch.bfloat16, requires_grad=True)
        out = run_checkpointed(layers, x, cos, sin)
        measured = tracker.allocated() - weights - out.untyped_storage().nbytes()
    kept = op_checkpoint_kept(workload(fused_qkv), False)
    assert measured == SPEC.num_layers * sum(k.tensor.bytes for k in kept)
    # by hand, per token: input 2h, the first matmul's output (fused: 2(H + 2H_kv)d; else Q's 2Hd, then V's 2H_kv·d),
    # the kernel's output 2Hd and fp32 log-sum-exp 4H, w1's output 2f, w2's 2h
    per_token = 2 * 256 + (2 * 384 if fused_qkv else 2 * 256 + 2 * 64) + 2 * 256 + 4 * 8 + 2 * 688 + 2 * 256
    assert measured == SPEC.num_layers * BATCH * SEQ * per_token


class PolicyOutputs(TorchDispatchMode):
    """The storages the policy would keep, recorded while the block runs without a checkpoint."""

    def __init__(self):
        super().__init__()
        self.rule, self.outputs = titan_policy(), []  # held, so that no later tensor takes a kept one's address

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        ctx = type("Context", (), {"is_recompute": False})()
        if self.rule(ctx, func, *args) == CheckpointPolicy.MUST_SAVE:
            self.outputs += [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
        return out

    @property
    def kept(self) -> set[int]:
        return {t.untyped_storage().data_ptr() for t in self.outputs}


def rerun_saved_bytes(layer: nn.Module, x, cos, sin) -> int:
    """What ``layer`` saves when it runs without a checkpoint, storage by storage, beyond the storages the policy
    keeps and its input: what the rerun in the backward pass adds. The RoPE tables are the model's, as torchtitan's
    cached freqs_cis is, and not counted."""
    weights = {t.untyped_storage().data_ptr() for t in (*layer.parameters(), cos, sin)}
    saved: dict[int, int] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in weights:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    policy = PolicyOutputs()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), policy:
        out = layer(x, cos, sin)  # held while counting: the graph keeps every saved storage at its address
    reused = policy.kept | {x.untyped_storage().data_ptr()}
    assert out.requires_grad
    return sum(size for ptr, size in saved.items() if ptr not in reused)


@pytest.mark.parametrize("fused_qkv", [True, False], ids=["fused QKV", "three projections"])
def test_what_the_rerun_adds_is_exact(fused_qkv):
    # run again in the backward pass, the block saves what it saves without a checkpoint; of that, the policy's kept
    # outputs and the block's input are the same storages (taken from the cache), the rest is new
    cos, sin = tables(SEQ, SPEC.head_dim)
    x = torch.randn(BATCH, SEQ, SPEC.hidden_size, dtype=torch.bfloat16, requires_grad=True)
    new = rerun_saved_bytes(blocks(fused_qkv)[0], x, cos, sin)
    # the CPU's flash kernel lays its output out (b, H, s, d), so the output projection reads a copy, 2·H·d_v bytes
    # a token; CUDA's lays it out (b, s, H, d) and the projection reads a view (the H200 phases in
    # docs/bench-results.md), which is what lmcalc counts
    cpu_copy = BATCH * SEQ * SPEC.num_heads * SPEC.head_dim * 2
    assert new == selective_rebuilt(workload(fused_qkv), Layout().activation_layout, False) + cpu_copy


@pytest.mark.parametrize("fused_qkv", [True, False], ids=["fused QKV", "three projections"])
def test_the_backward_reruns_every_second_matmul(fused_qkv):
    # FlopCounterMode over a checkpointed step less a plain one: the forward matmuls the backward runs again
    layers = blocks(fused_qkv)
    cos, sin = tables(SEQ, SPEC.head_dim)
    x = torch.randn(BATCH, SEQ, SPEC.hidden_size, dtype=torch.bfloat16, requires_grad=True)

    def step_flops(checkpointed: bool) -> int:
        with FlopCounterMode(display=False) as counter:
            out = run_checkpointed(layers, x, cos, sin) if checkpointed else _plain(layers, x, cos, sin)
            out.sum().backward()
        return counter.get_total_flops()

    measured = step_flops(True) - step_flops(False)
    redone = selective_redone(SPEC, workload(fused_qkv).framework.recompute, ("core_attn",))
    per_token = fl.step_flops(SPEC, SEQ, "selective", "full", redone=redone).recomputed
    assert measured == pytest.approx(per_token * BATCH * SEQ, rel=1e-12)
    # by hand: fused, matmuls 2 and 4 (the output projection, w3), 2·(Hd·h + h·f) a token a layer; three
    # projections, 2, 4 and 6 (K, the output projection, w3), 2·(h·H_kv·d + Hd·h + h·f)
    by_hand = 2 * (256 * 256 + 256 * 688) + (0 if fused_qkv else 2 * 256 * 64)
    assert measured == SPEC.num_layers * BATCH * SEQ * by_hand


def _plain(layers, x, cos, sin):
    for layer in layers:
        x = layer(x, cos, sin)
    return x
