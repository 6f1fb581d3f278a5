"""torchtitan's per-operator selective checkpointing on a GPU, against lmcalc (docs/formulas.md §5.5).

tests/test_op_checkpoint.py checks the mechanism on the CPU, where RMSNorm has no fused kernel and the flash kernel
lays its output out (b, H, s, d). Here the same policy runs on CUDA with torch.nn.RMSNorm (``_fused_rms_norm``) and
SDPA's flash kernel, at Llama 3.2 1B's widths: the bytes the blocks keep after the forward pass
(``torch.cuda.memory_allocated``), what a block's rerun saves beyond them (saved-tensor hooks, storage by storage),
and the rise of the allocated peak through one block's backward, each beside lmcalc's figure.

    python benchmarks/op_checkpoint_gpu.py [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from test_op_checkpoint import (  # noqa: E402
    MATMULS,
    SAVED_OPS,
    TitanBlock,
    rerun_saved_bytes,
    run_checkpointed,
    workload_for,
)
from torch import nn  # noqa: E402

from lmcalc.engine.memory.gpu_memory import selective_rebuilt  # noqa: E402
from lmcalc.engine.memory.op_checkpoint import op_checkpoint_kept  # noqa: E402
from lmcalc.engine.memory.phases import backward_transients  # noqa: E402
from lmcalc.engine.parallel.layout import Layout  # noqa: E402
from lmcalc.engine.parallel.pipeline import StageLayers  # noqa: E402
from lmcalc.presets import resolve_model  # noqa: E402


def rms_norm(width: int) -> nn.Module:
    """torch.nn.RMSNorm: CUDA's fused kernel (``_fused_rms_norm``), which keeps its input and fp32 1/rms."""
    return nn.RMSNorm(width, eps=1e-5)


SPEC = resolve_model("llama-3.2-1b").spec.model_copy(update={"num_layers": 4})  # four blocks at its widths


def measure(seq: int, batch: int, device: torch.device) -> dict:
    torch.manual_seed(0)
    blocks = [TitanBlock(SPEC, True, rms_norm).to(device, torch.bfloat16) for _ in range(SPEC.num_layers)]
    angles = torch.arange(seq, device=device)[:, None] * (10000.0 ** (-torch.arange(32, device=device) / 32))
    cos, sin = angles.cos().to(torch.bfloat16), angles.sin().to(torch.bfloat16)
    w = workload_for(SPEC, seq, batch, fused_qkv=True)
    layout = Layout().activation_layout
    kept_lmcalc = sum(k.tensor.bytes for k in op_checkpoint_kept(w, False))

    # 1. what the blocks keep through the forward pass
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    x = torch.randn(batch, seq, SPEC.hidden_size, device=device, dtype=torch.bfloat16, requires_grad=True)
    out = run_checkpointed(blocks, x, cos, sin)
    torch.cuda.synchronize()
    kept = (torch.cuda.memory_allocated() - before - out.untyped_storage().nbytes()) / SPEC.num_layers

    # 2. the rise of the allocated peak through the top block's backward, its weights' gradients made beforehand
    for p in blocks[-1].parameters():
        p.grad = torch.zeros_like(p)
    grad = torch.ones_like(out)
    torch.cuda.synchronize()
    level = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    torch.autograd.backward(out, grad, inputs=[*blocks[-1].parameters()])
    torch.cuda.synchronize()
    rise = torch.cuda.max_memory_allocated() - level
    del out, grad

    # 3. what a block saves when it runs again, beyond the policy's kept storages and its input
    y = torch.randn(batch, seq, SPEC.hidden_size, device=device, dtype=torch.bfloat16, requires_grad=True)
    rerun = rerun_saved_bytes(blocks[0], y, cos, sin)

    rebuilt = selective_rebuilt(w, layout, False)
    transients = backward_transients(w, 1, 1, StageLayers(SPEC.num_layers, 0, False, False))
    return {
        "seq": seq,
        "batch": batch,
        "kept_per_layer": {"measured": kept, "lmcalc": kept_lmcalc},
        "rerun_saved": {"measured": rerun, "lmcalc": rebuilt},
        "backward_rise": {
            "measured": rise,
            "lmcalc": rebuilt + transients.layer,
            "note": "lmcalc: the rerun's saved tensors + the layer's activation gradients (transients.layer); the "
            "measured rise also holds one weight gradient at a time and the kernels' workspaces",
        },
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("op_checkpoint_gpu: needs a CUDA GPU (the CPU's check is tests/test_op_checkpoint.py)")
    device = torch.device("cuda")
    results = {
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "saved_ops": sorted(str(op) for op in SAVED_OPS),
        "matmuls": [str(op) for op in MATMULS],
        "cases": [measure(seq, batch, device) for seq, batch in ((2048, 2), (4096, 1), (8192, 1))],
    }
    for case in results["cases"]:
        for key in ("kept_per_layer", "rerun_saved", "backward_rise"):
            m, p = case[key]["measured"], case[key]["lmcalc"]
            shape = f"s={case['seq']} b={case['batch']}"
            print(f"{shape} {key:15s} measured {m:>14,.0f}  lmcalc {p:>14,.0f}  {p / m - 1:+.2%}")
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
