"""Megatron's full recomputation over some layers: ``--recompute-method uniform|block --recompute-num-layers N``.

Megatron-Core (megatron/core/recompute.py, NVIDIA/Megatron-LM d98e8a64) checkpoints, under ``uniform``, every unit of
N consecutive layers of a model chunk (the unit's input is kept; the backward rebuilds the whole unit), and under
``block`` only the first N layers of each chunk, one by one, the chunk's other layers keeping everything. The
reference model runs those exact units on the CPU (``ReferenceModel.forward``'s ``units``), and autograd's saved
tensors, counted storage by storage, are set beside lmcalc's activations and the unit it rebuilds.
"""

from __future__ import annotations

import pytest

from lmcalc.engine.memory.gpu_memory import gpu_memory
from lmcalc.engine.parallel.layout import Layout
from lmcalc.engine.parallel.pipeline import PipelineSplit, block_recomputed
from lmcalc.engine.workload import Workload
from lmcalc.presets import framework_profile, resolve_model, resolve_optimizer, resolve_precision
from lmcalc.specs import ModelSpec


def test_block_takes_the_first_layers_of_each_chunk():
    # 32 layers over PP 2 with 4 chunks a stage: 8 slices of 4 layers; stage 0 holds slices 0, 2, 4, 6. N = 3
    # recomputes 3 of each of its 4 chunks, 12 layers; N = 5 all 4 of each, 16
    llama = resolve_model("llama-3.1-8b").spec
    layout = Layout(pp=2, grad_accum=8, split=PipelineSplit("interleaved", virtual_stages=4))
    assert block_recomputed(llama, layout, 0, 3) == (12, 0)
    assert block_recomputed(llama, layout, 1, 5) == (16, 0)
    # DeepSeek-V3: 61 layers, the first 3 dense; PP 4 (1F1B): stage 0 holds layers 0-15, so N = 5 recomputes the
    # 3 dense layers and 2 MoE layers
    assert block_recomputed(resolve_model("deepseek-v3").spec, Layout(pp=4), 0, 5) == (3, 2)


def test_the_methods_bound_what_none_and_full_recomputation_keep(lmcalc_run):
    # Llama 3.1 8B, 8 H100s, ZeRO-1, 4,096 tokens: block over every layer is full recomputation; block over none of
    # them is no recomputation in what the layers keep; uniform units of 2 keep half the inputs of N = 1
    base = ["memory", "-m", "llama-3.1-8b", "--gpus", "8xH100", "--zero", "1", "--seq", "4096", "--json"]

    def activations(*flags: str) -> float:
        run = lmcalc_run([*base, *flags])
        assert run.code == 0, run.err
        return run.json["results"]["activations"]["total"]["value"]

    full, none = activations("--recompute", "full"), activations("--recompute", "none")
    assert activations("--recompute", "full", "--recompute-method", "block", "--recompute-num-layers", "32") == full
    half = activations("--recompute", "full", "--recompute-method", "block", "--recompute-num-layers", "16")
    layer_input = 4096 * 4096 * 2  # s·h bf16 bytes, each checkpointed layer's input
    outside = full - 32 * layer_input  # the embedding and head sides, the same in every mode
    assert half == pytest.approx(outside + 16 * layer_input + (none - outside) / 2, rel=1e-12)
    pairs = activations("--recompute", "full", "--recompute-num-layers", "2")
    assert pairs == pytest.approx(outside + 16 * layer_input, rel=1e-12)


def test_the_flags_need_full_recomputation(lmcalc_run):
    run = lmcalc_run(["memory", "-m", "llama-3.1-8b", "--recompute-num-layers", "4"])
    assert run.code == 2 and "need --recompute full (got none)" in run.err and "Traceback" not in run.err
    run = lmcalc_run(["memory", "-m", "llama-3.1-8b", "--recompute", "full", "--recompute-method", "blocks"])
    assert run.code == 2 and "--recompute-method must be one of uniform, block" in run.err


def test_block_recomputation_redoes_only_its_layers_forward():
    # one GPU: block over 16 of 32 layers redoes half the layers' forward GEMMs, uniform (any N) all of them
    from lmcalc.engine.time.steptime import step_time
    from lmcalc.presets import resolve_hardware
    from lmcalc.specs import Cluster

    llama = resolve_model("llama-3.1-8b").spec
    cluster = Cluster(hardware=resolve_hardware("h100-sxm").spec, count=1, gpus_per_node=1)
    precision, adamw = resolve_precision("bf16-mixed").spec, resolve_optimizer("adamw").spec

    def recompute_gemms(**fields) -> float:
        w = Workload(llama, precision, adamw, 4096, 1, "flash", "full", framework=framework_profile("megatron"),
                     **fields)  # fmt: skip
        return step_time(w, Layout(), cluster).slowest.micro_batch.kernels.gemm_recompute

    full = recompute_gemms()
    assert recompute_gemms(recompute_method="block", recompute_num_layers=16) == pytest.approx(full / 2, rel=1e-12)
    assert recompute_gemms(recompute_num_layers=4) == pytest.approx(full, rel=1e-12)


pytest.importorskip("torch")

import test_validate as models  # noqa: E402  (tests/, on sys.path: its architectures)
import torch  # noqa: E402

from lmcalc import measure  # noqa: E402

pytestmark = pytest.mark.torch

LAYERS = 6
CASES = [  # the architectures CPU SDPA runs fused; which layers of a mixed model block takes is counted above
    (arch, method, n)
    for arch in ("llama-like (GQA, SwiGLU, RMSNorm)", "olmo2-like (QK-norm)", "mixtral-like (MoE)")
    for method, n in (("uniform", 2), ("uniform", 4), ("block", 2), ("block", 5))
]


def units(method: str, n: int) -> tuple[tuple[int, int], ...]:
    """Megatron-Core's checkpointed ranges of one chunk of ``LAYERS`` layers."""
    if method == "block":
        return tuple((i, i + 1) for i in range(min(n, LAYERS)))
    return tuple((i, min(i + n, LAYERS)) for i in range(0, LAYERS, n))


@pytest.mark.parametrize(("arch", "method", "n"), CASES)
def test_megatrons_units_keep_what_lmcalc_counts(arch: str, method: str, n: int):
    spec = ModelSpec(name="arch", **{**models.BASE, **models.ARCHITECTURES[arch], "num_layers": LAYERS})
    seq, batch = 64, 2
    model = measure.build(spec, "flash", seq, "cpu")
    torch.manual_seed(0)
    tokens = torch.randint(0, spec.vocab_size, (batch, seq))
    chosen = units(method, n)
    held = measure.saved_for_backward(model, tokens, "full", units=chosen).bytes
    rebuilt = max(measure.saved_for_backward(model, tokens, layer=a, end=b).bytes for a, b in chosen)
    fp32, adamw = resolve_precision("fp32").spec, resolve_optimizer("adamw").spec
    w = Workload(spec, fp32, adamw, seq, batch, "flash", "full", mask_bytes=4, framework=framework_profile(),
                 recompute_method=method, recompute_num_layers=n)  # fmt: skip
    engine = gpu_memory(w, Layout(), 0).held
    assert engine.total == pytest.approx(held, rel=1e-3)  # exact but for a few bytes of RNG state
    assert engine.rebuilt == pytest.approx(rebuilt, rel=1e-3)
