"""What issue #34 asks of a GPU beyond ``scripts/gpu_check.sh``: four measurements, one part per process.

* ``context``: the CUDA context's memory outside PyTorch's pool (the driver's used memory, from ``nvidia-smi``
  before the process touches the GPU, against ``torch.cuda.mem_get_info`` after), then with cuBLAS's kernels
  loaded, then with a one-rank NCCL process group that has run an all-reduce. One GPU holds one NCCL rank, so
  the buffers NCCL keeps per peer (two or more ranks) are not measured here.
* ``overhead``: ``lmcalc bench``'s matmul rate against a bare ``torch.matmul`` (``torch._scaled_mm`` for fp8)
  loop on the same shape, in rounds whose order reverses each time; the ratio of the medians (target: at least
  0.97). The bare loop also runs rotating through as many inputs as lmcalc does (which keeps them out of the L2
  cache), and so again with each call between its own two events, as lmcalc times them: what each difference costs.
* ``fragmentation``: ``torch.cuda.max_memory_reserved`` against ``max_memory_allocated`` over each of three plain
  AdamW steps of lmcalc's reference model, the cases ``benchmarks/step_memory_phases.py`` measures (lmcalc's
  profiles assume 5 %).
* ``transformers``: a Hugging Face ``LlamaForCausalLM`` (Llama 3.2 1B's shape, random weights, bf16, SDPA)
  trained as ``Trainer`` does a step (fused AdamW, ``zero_grad`` setting the gradients to None), with and without
  gradient checkpointing, at two micro-batches and with two accumulated; ``max_memory_allocated`` (less the rotary
  table) and ``max_memory_reserved`` against lmcalc's transformers profile, which counts one cuBLAS workspace
  (what PyTorch allocates before the model is recorded beside it).

Each part writes ``OUT/<part>.json`` and prints a table. Needs CUDA (and transformers for the last part).
    python benchmarks/gpu_truth.py PART --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import torch

GIB = 2**30
ROUNDS = 6
DEVICE = "cuda"  # a rehearsal on the CPU sets "cpu" (with the allocator's counters stubbed)


def _driver_used() -> int | None:
    """The GPU's used memory as the driver reports it (MiB resolution), or None without nvidia-smi."""
    try:
        text = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout  # fmt: skip
        return int(text.split()[0]) * 2**20
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def _outside_pool() -> int:
    """Device memory in use that PyTorch's caching allocator does not hold."""
    free, total = torch.cuda.mem_get_info()
    return total - free - torch.cuda.memory_reserved()


def context() -> dict:
    before = _driver_used()  # before this process makes its CUDA context
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    rows = {"driver_used_before": before, "after_init": _outside_pool()}
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    (a @ a).sum().backward()  # cuBLAS's handle, workspaces and kernels, forward and backward
    torch.cuda.synchronize()
    rows["after_cublas"] = _outside_pool()
    del a
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    t = torch.ones(2**20, device="cuda")
    dist.all_reduce(t)
    torch.cuda.synchronize()
    rows["after_nccl_all_reduce"] = _outside_pool()
    dist.destroy_process_group()
    rows["context_alone"] = None if before is None else rows["after_init"] - before
    rows["nccl_one_rank"] = rows["after_nccl_all_reduce"] - rows["after_cublas"]
    for key, value in rows.items():
        print(f"{key:<24} {'n/a' if value is None else f'{value / GIB:.3f} GiB'}")
    return rows


def _bare_rate(dtype: str, m: int, n: int, k: int, pairs: int = 1, calls: int = 20, per_call: bool = False) -> float:
    """FLOP/s of ``calls`` back-to-back products of random inputs, between two CUDA events (``per_call``: each between
    its own two); ``pairs``: how many input pairs the calls rotate through (one: the inputs stay in the L2 cache
    where they fit)."""
    if dtype == "fp8":
        a = [torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn) for _ in range(pairs)]
        b = [torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn).t() for _ in range(pairs)]
        one = torch.ones((), device="cuda")

        def product(i):
            return torch._scaled_mm(a[i % pairs], b[i % pairs], scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    else:
        a = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for _ in range(pairs)]
        b = [torch.randn(k, n, device="cuda", dtype=torch.bfloat16) for _ in range(pairs)]

        def product(i):
            return torch.matmul(a[i % pairs], b[i % pairs])

    for i in range(5):
        product(i)
    if per_call:  # each call between its own two events, as lmcalc times them: the median call
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(calls)]
        for i, (start, end) in enumerate(events):
            start.record()
            product(i)
            end.record()
        torch.cuda.synchronize()
        return 2 * m * n * k / (statistics.median(a.elapsed_time(b) for a, b in events) / 1e3)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for i in range(calls):
        product(i)
    end.record()
    end.synchronize()
    return 2 * m * n * k * calls / (start.elapsed_time(end) / 1e3)


def overhead() -> dict:
    from lmcalc.bench import matmul
    from lmcalc.bench.device import detect

    gpu = detect("cuda")
    rows = []
    shapes = {"bf16": [(8192, 8192, 8192), (4096, 2048, 8192), (2048, 2048, 2048)], "fp8": [(8192, 8192, 8192)]}
    variants = {  # how each loop times the same shape: lmcalc's harness, and the bare loop three ways
        "lmcalc": lambda dtype, m, n, k, sets: matmul.measure((m, n, k), settings_of[dtype], gpu).flops_per_s,
        "bare": lambda dtype, m, n, k, sets: _bare_rate(dtype, m, n, k),
        "cold": lambda dtype, m, n, k, sets: _bare_rate(dtype, m, n, k, pairs=sets),
        "per_call": lambda dtype, m, n, k, sets: _bare_rate(dtype, m, n, k, pairs=sets, per_call=True),
    }
    settings_of = {dtype: matmul.MatmulSettings(dtype, warmup=5, repeats=20) for dtype in shapes}
    print(f"{'dtype':<5} {'m×n×k':<15}" + "".join(f"{name:>9}" for name in variants) + f"{'ratio':>7}{'of peak':>8}")
    for dtype, dtype_shapes in shapes.items():
        for m, n, k in dtype_shapes:
            sets = matmul._operands(m, n, k, dtype, gpu)[0]  # how many input sets lmcalc rotates through
            rounds: dict[str, list[float]] = {name: [] for name in variants}
            for r in range(ROUNDS):  # the order reversed every other round, so that the clocks' drift cancels
                for name in list(variants)[:: 1 if r % 2 == 0 else -1]:
                    rounds[name].append(variants[name](dtype, m, n, k, sets))
            row = {
                "dtype": dtype, "shape": f"{m}x{n}x{k}", "sets": sets, "peak": gpu.peak(dtype), "rounds": rounds,
                **{name: statistics.median(rates) for name, rates in rounds.items()},
            }  # fmt: skip
            rows.append(row)
            print(
                f"{dtype:<5} {row['shape']:<15}"
                + "".join(f"{row[name] / 1e12:>9.1f}" for name in variants)
                + f"{row['lmcalc'] / row['bare']:>7.3f}{row['lmcalc'] / row['peak']:>8.1%}"
            )
    print(
        "TFLOP/s, medians of the rounds; bare: one input pair back to back; cold: rotating through as many input "
        "sets as lmcalc; per_call: the same, each call between its own events; ratio: lmcalc / bare"
    )
    return {"rows": rows}


FRAGMENTATION_CASES = (
    ("llama-3.2-1b", 1024, 1, "none"),
    ("llama-3.2-1b", 2048, 2, "none"),
    ("llama-3.2-1b", 2048, 2, "full"),
    ("llama-3.2-3b", 4096, 1, "none"),
    ("gpt2-124m", 1024, 8, "none"),
)


def fragmentation() -> dict:
    from lmcalc.measure import build
    from lmcalc.presets import resolve_model
    from lmcalc.reference_model import loss

    rows = []
    print(f"{'case':<48} {'allocated GiB':>14} {'reserved GiB':>13} {'reserved/alloc':>15}")
    for name, seq, batch, recompute in FRAGMENTATION_CASES:
        spec = resolve_model(name).spec
        torch.manual_seed(0)
        model = build(spec, "flash", seq, "cuda", torch.bfloat16)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, foreach=True)
        tokens = torch.randint(0, spec.vocab_size, (batch, seq), device="cuda")
        peaks = []
        for _ in range(3):  # the first step makes AdamW's states; the peaks of each step, read apart
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            loss(model, tokens, recompute).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            peaks.append((torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()))
        stats = torch.cuda.memory_stats()
        detail = f"{name}, s={seq}, b={batch}, recompute {recompute}"
        allocated, reserved = peaks[-1]
        rows.append(
            {
                "case": detail, "steps": peaks, "max_allocated": allocated, "max_reserved": reserved,
                "alloc_retries": stats.get("num_alloc_retries"), "segments": stats.get("segment.all.current"),
            }
        )  # fmt: skip
        print(f"{detail:<48} {allocated / GIB:>14.3f} {reserved / GIB:>13.3f} {reserved / allocated - 1:>+15.2%}")
        del model, optimizer, tokens
        torch.cuda.empty_cache()
    return {"rows": rows}


LLAMA_32_1B = {  # meta-llama/Llama-3.2-1B's config.json, the fields that shape the model
    "model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 128256,
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": True,
    "hidden_act": "silu", "attention_bias": False, "mlp_bias": False, "torch_dtype": "bfloat16",
}  # fmt: skip


LLAMA_31_8B_4_LAYERS = {  # meta-llama/Llama-3.1-8B's widths, untied, cut to four layers to fit beside its vocabulary
    **LLAMA_32_1B, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 4, "head_dim": 128,
    "tie_word_embeddings": False,
}  # fmt: skip
TRANSFORMERS_CASES = (  # s, b, gradient checkpointing, gradient accumulation steps, LoRA rank (0: full training)
    (512, 1, False, 1, 0),
    (1024, 1, False, 1, 0),
    (2048, 2, False, 1, 0),
    (2048, 2, False, 2, 0),
    (2048, 2, True, 1, 0),
    (2048, 2, True, 2, 0),
    (2048, 2, False, 1, 16),
    (2048, 2, True, 1, 16),
    (4096, 4, True, 2, 16),
)
UNTIED_CASES = ((256, 1, False, 1, 0), (1024, 1, False, 1, 0), (4096, 2, False, 1, 0), (4096, 2, False, 2, 0),
                (4096, 2, True, 1, 0))  # fmt: skip
CONFIGS = {
    "llama-3.2-1b": (LLAMA_32_1B, TRANSFORMERS_CASES),
    "llama-3.1-8b-4-layers": (LLAMA_31_8B_4_LAYERS, UNTIED_CASES),
}
LORA_DROPOUT = 0.0


def lmcalc_transformers(
    seq: int, batch: int, checkpointing: bool, accumulate: int = 1, lora_rank: int = 0, config: str = "llama-3.2-1b"
):
    """lmcalc's transformers profile for the same config on one GPU, bf16-pure AdamW (PEFT's LoRA on every linear
    layer but the head, fp32 adapters, where ``lora_rank``): its GpuMemory."""
    from lmcalc.engine.finetune.method import FULL, Method, parse_targets
    from lmcalc.engine.memory.gpu_memory import gpu_memory
    from lmcalc.engine.parallel.layout import Layout
    from lmcalc.engine.workload import Workload, dropout_mask_bytes
    from lmcalc.hf_config import model_from_hf_config
    from lmcalc.presets import framework_profile, resolve_optimizer, resolve_precision
    from lmcalc.specs import ModelSpec

    precision = resolve_precision("bf16-pure").spec
    method = FULL
    if lora_rank:
        method = Method("lora", lora_rank, parse_targets("all-linear"), LORA_DROPOUT, fp32_adapters=True)
    w = Workload(
        ModelSpec.model_validate(
            model_from_hf_config(CONFIGS[config][0], f"{config} (hf)", f"gpu_truth.CONFIGS[{config!r}]")
        ),
        precision,
        resolve_optimizer("adamw").spec,
        seq,
        batch,
        "flash",
        "full" if checkpointing else "none",
        mask_bytes=dropout_mask_bytes("cuda", precision),
        framework=framework_profile("transformers"),
        method=method,
    )
    return gpu_memory(w, Layout(grad_accum=accumulate), 0)


def _trainer_step(model, optimizer, ids: torch.Tensor, accumulate: int) -> None:
    """What ``Trainer`` runs for one optimizer step: ``accumulate`` forwards and backwards, the step, zero_grad."""
    for _ in range(accumulate):
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        del loss
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def transformers_steps() -> dict:
    from lmcalc.measure import cuda_workspaces

    workspaces = cuda_workspaces(DEVICE)
    rows = []
    print(f"{'case':<48} {'measured GiB':>13} {'lmcalc GiB':>11} {'error':>8} {'reserved GiB':>13} {'lmcalc':>8}")
    for config in CONFIGS:
        rows += _transformers_config(config, workspaces)
    return {"transformers": __import__("transformers").__version__, "rows": rows}


def _transformers_config(name: str, workspaces: int) -> list[dict]:
    from transformers import LlamaConfig, LlamaForCausalLM

    fields, cases = CONFIGS[name]
    config = LlamaConfig(**{k: v for k, v in fields.items() if k not in ("model_type", "torch_dtype")})
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(device=DEVICE, dtype=torch.bfloat16).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)  # the Trainer's adamw_torch_fused
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    rows = []
    for seq, batch, checkpointing, accumulate, lora_rank in cases:
        if lora_rank and not hasattr(model, "peft_config"):  # the LoRA cases come last: the base is frozen from here
            from peft import LoraConfig, get_peft_model

            del optimizer
            lora = LoraConfig(
                r=lora_rank, lora_alpha=2 * lora_rank, lora_dropout=LORA_DROPOUT, target_modules="all-linear"
            )
            model = get_peft_model(model, lora)  # fp32 adapters: PEFT's autocast_adapter_dtype=True
            trained = [p for p in model.parameters() if p.requires_grad]
            optimizer = torch.optim.AdamW(trained, lr=1e-5, fused=True)
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_disable()
        ids = torch.randint(0, config.vocab_size, (batch, seq), device=DEVICE)
        _trainer_step(model, optimizer, ids, accumulate)  # the first step makes AdamW's states
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        _trainer_step(model, optimizer, ids, accumulate)
        torch.cuda.synchronize()
        allocated = torch.cuda.max_memory_allocated() - buffers  # lmcalc counts cuBLAS's workspace
        reserved = torch.cuda.max_memory_reserved()
        ours = lmcalc_transformers(seq, batch, checkpointing, accumulate, lora_rank, name)
        case = f"{name}, s={seq}, b={batch}, ckpt {'on' if checkpointing else 'off'}, accum {accumulate}"
        case += f", LoRA r={lora_rank}" if lora_rank else ""
        rows.append(
            {
                "case": case, "config": name, "measured_allocated": allocated, "measured_reserved": reserved,
                "workspaces": workspaces, "buffers": buffers, "lmcalc_allocated": ours.allocated,
                "lmcalc_reserved": ours.reserved, "lmcalc_parts": ours.parts,
                "lmcalc_binding_phase": ours.phases.binding,
            }
        )  # fmt: skip
        print(
            f"{case:<48} {allocated / GIB:>13.3f} {ours.allocated / GIB:>11.3f} "
            f"{ours.allocated / allocated - 1:>+8.2%} {reserved / GIB:>13.3f} {ours.reserved / GIB:>8.3f}"
        )
        torch.cuda.empty_cache()
    del model, optimizer
    torch.cuda.empty_cache()
    return rows


PARTS = {"context": context, "overhead": overhead, "fragmentation": fragmentation, "transformers": transformers_steps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("part", choices=PARTS)
    parser.add_argument("--out", required=True, help="a folder for PART.json")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("gpu_truth: needs CUDA (torch.cuda.is_available() is False)")
    print(f"{args.part}: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}")
    data = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "cuda": torch.version.cuda}
    data.update(PARTS[args.part]())
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / f"{args.part}.json").write_text(json.dumps(data, indent=1, default=str))


if __name__ == "__main__":
    main()
