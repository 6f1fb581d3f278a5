"""Where a plain PyTorch AdamW step peaks, phase by phase: the engine's figures against the CUDA allocator's.

For several models and shapes, one bf16 AdamW step (after a first one that creates the optimizer
states) is run with ``torch.cuda.memory_allocated`` / ``max_memory_allocated`` read between its phases,
and set beside ``lmcalc.engine.memory.step_peak``: weights + states, activations saved by the forward pass,
gradients, the backward pass's peak, the optimizer step's peak, and the step's peak, the module's
buffers (rotary tables, causal mask) and cuBLAS's workspaces taken off the measured figures. Prints
the ratio engine / measured for each. Needs CUDA; a minute or so on one H200. The JSON is rewritten
after every case, so a case that fails (recorded with its error) or a time limit loses nothing before it.
    python benchmarks/step_memory_phases.py [--out FILE.json]
"""

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from lmcalc.atomic import write_atomic
from lmcalc.measure import measured_step, step_parts
from lmcalc.presets import resolve_model
from lmcalc.result import json_safe

CASES = (  # model, s, b, recompute; Mixtral is cut to the layers that fit (measure.model_that_fits)
    ("llama-3.2-1b", 1024, 1, "none"),
    ("llama-3.2-1b", 2048, 2, "none"),
    ("llama-3.2-1b", 2048, 2, "full"),
    ("llama-3.2-3b", 4096, 1, "none"),
    ("gpt2-124m", 1024, 8, "none"),
    ("mixtral-8x7b", 1024, 1, "none"),
)


def parts(predicted, measured) -> list[tuple[str, float, float]]:
    """Engine and allocator, part by part (``measure.step_parts``), then the forward's and the step's peak;
    the module's buffers and cuBLAS's workspaces (not model state) come off the measured figures."""
    outside = measured.outside_model
    return [
        *((what, engine, actual) for _, what, engine, actual, _ in step_parts(predicted, measured)),
        ("forward peak", float("nan"), measured.peak_forward - outside),
        ("step peak", predicted.peak, measured.peak - outside),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="also write every figure as JSON here")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("step_memory_phases: needs CUDA (torch.cuda.is_available() is False)")
    rows = []
    print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    print(f"{'case':<60} {'part':<18} {'engine GB':>10} {'measured GB':>12} {'ratio':>7}")
    for name, seq, batch, recompute in CASES:
        spec = resolve_model(name).spec
        start = time.perf_counter()
        try:
            predicted, measured, detail = measured_step(spec, seq, batch, recompute, "cuda")
        except Exception as exc:  # keep the other cases' figures; say what failed
            detail = f"{name}, s={seq}, b={batch}, recompute {recompute}"
            print(f"{detail:<60} FAILED: {type(exc).__name__}: {exc}")
            rows.append({"case": detail, "error": f"{type(exc).__name__}: {exc}"})
            torch.cuda.empty_cache()
            write(args.out, rows)
            continue
        seconds = time.perf_counter() - start
        for part, engine, actual in parts(predicted, measured):
            print(f"{detail:<60} {part:<18} {engine / 1e9:>10.3f} {actual / 1e9:>12.3f} {engine / actual:>7.3f}")
        rows.append(
            {
                "case": detail,
                "seconds": seconds,
                "engine": {
                    **predicted.phases,
                    "peak": predicted.peak,
                    "peak_phase": predicted.peak_phase,
                    **{t.key: t.value for t in predicted.terms()},
                },
                "measured": {**vars(measured), "peak": measured.peak},
            }
        )
        torch.cuda.empty_cache()
        write(args.out, rows)


def write(path: str | None, rows: list[dict]) -> None:
    """Every case so far as strict JSON (a figure that is not available is null), written atomically."""
    if path:
        data = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "cases": rows}
        write_atomic(Path(path), json.dumps(json_safe(data), indent=1, allow_nan=False))


if __name__ == "__main__":
    main()
