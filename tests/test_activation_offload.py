"""Megatron-Core's CPU activation offloading: ``--cpu-offloading-num-layers N``.

Megatron-Core (megatron/core/transformer/transformer_block.py, Megatron-LM d98e8a64) wraps each layer's forward in
Transformer Engine's ``get_cpu_offload_context(enabled, num_layers=N, model_layers=L, ...)``, whose default schedule
keeps "(num_layers - num_offloaded_layers) * T" of activation memory for layers of T each
(transformer_engine/pytorch/cpu_offload.py, TransformerEngine d0067d0d); transformer_config.py refuses N ≥ L, pipeline
parallelism and recomputation beside it. The counts below are derived by hand from those two rules.
"""

from __future__ import annotations

import pytest

from lmcalc.engine.memory.gpu_memory import layer_bytes, stage_activations
from lmcalc.engine.parallel.layout import Layout
from lmcalc.engine.workload import Workload
from lmcalc.errors import LmcalcError
from lmcalc.presets import framework_profile, resolve_model, resolve_optimizer, resolve_precision

MEGATRON = framework_profile("megatron")


def workload(model: str, n: int, seq: int = 4096) -> Workload:
    bf16, adamw = resolve_precision("bf16-mixed").spec, resolve_optimizer("adamw").spec
    return Workload(resolve_model(model).spec, bf16, adamw, seq, 1, "flash", "none", framework=MEGATRON,
                    cpu_offloading_num_layers=n)  # fmt: skip


def test_the_offloaded_layers_leave_the_gpu():
    # Llama 3.1 8B, 32 dense layers: offloading 16 leaves the embedding and head sides and 16 layers on the GPU
    kept = stage_activations(workload("llama-3.1-8b", 0), Layout(), 0).total
    layer = layer_bytes(workload("llama-3.1-8b", 0), 1, False, 1, False)
    assert stage_activations(workload("llama-3.1-8b", 16), Layout(), 0).total == pytest.approx(kept - 16 * layer)
    # by hand, 4,096 tokens: a megatron-profile layer keeps 149,640 bytes a token (149,512 and the core's 4·32)
    assert layer == 4096 * 149_640


def test_the_first_layers_go_dense_then_moe():
    # DeepSeek-V3's first 3 layers are dense: offloading 5 takes 3 dense and 2 MoE layers off the GPU
    w0, w5 = workload("deepseek-v3", 0, 1024), workload("deepseek-v3", 5, 1024)
    dense, moe = layer_bytes(w0, 1, False, 1, False), layer_bytes(w0, 1, False, 1, True)
    before, after = stage_activations(w0, Layout(), 0).total, stage_activations(w5, Layout(), 0).total
    assert before - after == pytest.approx(3 * dense + 2 * moe)


def test_megatron_cores_refusals():
    with pytest.raises(LmcalcError, match="fewer than the model's layers"):
        workload("llama-3.1-8b", 32)
    from lmcalc.engine.parallel.layout_checks import check_layout

    with pytest.raises(LmcalcError, match="without pipeline parallelism"):
        check_layout(workload("llama-3.1-8b", 4), Layout(pp=2))


def test_the_flag(lmcalc_run):
    base = ["memory", "-m", "llama-3.1-8b", "--framework", "megatron", "--seq", "4096"]
    offloaded, plain = lmcalc_run([*base, "--cpu-offloading-num-layers", "16", "--json"]), lmcalc_run([*base, "--json"])
    assert offloaded.code == plain.code == 0
    activations = [r.json["results"]["activations"]["total"]["value"] for r in (plain, offloaded)]
    assert activations[0] - activations[1] == 16 * 4096 * 149_640
    recompute = offloaded.json["inputs"]["recompute"]["value"]
    assert recompute == "none; the first 16 layers' activations offloaded to the CPU"
    refused = lmcalc_run([*base, "--cpu-offloading-num-layers", "4", "--recompute", "full"])
    assert refused.code == 2 and "refuses the two together" in refused.err
    titan = ["memory", "-m", "llama-3.1-8b", "--framework", "transformers", "--cpu-offloading-num-layers", "4"]
    refused = lmcalc_run(titan)
    assert refused.code == 2 and "has none modelled" in refused.err and "Traceback" not in refused.err
