"""What torchtitan's MoE layer keeps for its backward, measured on the CPU: the research measurement behind the
torchtitan profile's MoE rule (presets/frameworks/torchtitan.yaml) and ``tests/test_titan_moe.py``.

torchtitan is not a dependency of lmcalc or of its tests. To run this, install it beside the dev install, without
its dependencies (they pull a CUDA build of torch), and the two small ones its MoE module imports:

    pip install --no-deps torchtitan==0.3.0 spmd_types tyro
    python scripts/titan_moe_saved.py

The layer is torchtitan 0.3.0's ``MoE`` (torchtitan/models/common/moe.py), built by its own config helpers
(``make_moe_config``), in bf16, over 2 sequences of 128 tokens of width 256 (8 experts of hidden width 128, 2 a
token). Its forward runs under saved-tensor hooks, which count each storage once, parameters excluded. Two things are
made to run as they do on a GPU:

- the router's gate: ``torch.autocast(dtype=float32)`` is refused on the CPU (a warning, then no autocast), so the
  gate is run as CUDA's fp32 autocast runs a linear layer: both operands cast to fp32, ``F.linear`` on the copies;
- the minimal async EP dispatcher's module, which imports Triton, is replaced by an empty module: the layer runs
  without expert parallelism and never calls it.
"""

from __future__ import annotations

import sys
import types

CASES = {
    "qwen3": dict(score="softmax", route_norm=True),  # torchtitan's Qwen3 MoE router, no shared expert
    "deepseek": dict(score="sigmoid", route_norm=True, groups=4, limited=2, shared=1),  # DeepSeek-V3's, scaled down
    "plain": dict(score="softmax", route_norm=False, coefficient=None),  # no route_norm, no expert bias
}
TOKENS, DIM, HIDDEN, EXPERTS, TOP_K = 256, 256, 128, 8, 2


def _stub_async_ep() -> None:
    stub = types.ModuleType("torchtitan.distributed.minimal_async_ep")
    for name in ("combine_op", "dispatch_op", "init_buffer", "MinimalAsyncEPDispatchMetadata"):
        setattr(stub, name, object)
    sys.modules["torchtitan.distributed.minimal_async_ep"] = stub


def kept_bytes(case: dict) -> tuple[int, list[tuple[tuple[int, ...], str, int]]]:
    """The bytes one MoE layer's forward keeps for backward, and each storage kept: (shape, dtype, bytes)."""
    import torch
    import torch.nn.functional as F
    from torchtitan.models.common.config_utils import (
        make_ffn_config,
        make_moe_config,
        make_routed_experts_config,
        make_router_config,
    )

    init = {"weight": lambda t: torch.nn.init.normal_(t, std=0.02)}
    shared = case.get("shared", 0)
    config = make_moe_config(
        num_experts=EXPERTS,
        router=make_router_config(
            dim=DIM, num_experts=EXPERTS, gate_param_init=init, top_k=TOP_K, score_func=case["score"],
            route_norm=case["route_norm"], num_expert_groups=case.get("groups"),
            num_limited_groups=case.get("limited"),
        ),
        routed_experts=make_routed_experts_config(
            dim=DIM, hidden_dim=HIDDEN, num_experts=EXPERTS, top_k=TOP_K, param_init=init, comm_backend="standard"
        ),
        shared_experts=(
            make_ffn_config(dim=DIM, hidden_dim=HIDDEN * shared, w1_param_init=init, w2w3_param_init=init)
            if shared else None
        ),
        load_balance_coeff=case.get("coefficient", 1e-3),
    )  # fmt: skip
    torch.manual_seed(0)
    layer = config.build()
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_(0, 0.02)
    layer = layer.to(torch.bfloat16).train()
    gate = layer.router.gate
    gate.forward = lambda x: F.linear(x.float(), gate.weight.float())  # CUDA's fp32 autocast of a linear layer

    parameters = {p.untyped_storage().data_ptr() for p in layer.parameters()}
    seen: dict[int, int] = {}
    kept: list[tuple[tuple[int, ...], str, int]] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in parameters and storage.data_ptr() not in seen:
            seen[storage.data_ptr()] = storage.nbytes()
            kept.append((tuple(t.shape), str(t.dtype).removeprefix("torch."), storage.nbytes()))
        return t

    x = torch.randn(2, TOKENS // 2, DIM, dtype=torch.bfloat16, requires_grad=True)  # 0.3.0's MoE takes (B, L, D)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = layer(x)
    out.float().sum().backward()
    return sum(seen.values()), kept


def main() -> None:
    import warnings
    from importlib.metadata import version

    _stub_async_ep()
    warnings.filterwarnings("ignore", message="In CPU autocast")  # the router's own autocast, replaced above
    print(f"torchtitan {version('torchtitan')}, torch {version('torch')}")
    for name, case in CASES.items():
        total, kept = kept_bytes(case)
        print(f"{name}: {total:,} bytes kept")
        for shape, dtype, size in kept:
            print(f"  {dtype:>9} {str(shape):<16} {size:>9,}")


if __name__ == "__main__":
    main()
