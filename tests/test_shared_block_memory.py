"""Training memory of models with shared blocks (Zamba, Zamba 2; issue #31): what each use of a block keeps for
backward, by hand and against transformers 5.24 on the CPU; the blocks' weights, gradients and optimizer states
counted once; what full recomputation keeps; and the layouts lmcalc refuses.

transformers runs a Zamba model's Mamba (Mamba-2) layers on the CPU with its PyTorch scan, which keeps far more than
mamba_ssm's fused kernels that lmcalc counts (``engine.memory.ssm``): those layers are left out of the comparison. A
use's tensors are the storages packed inside the shared block's modules and the use's linear layer
(``scripts/hf_saved.py`` names the module that packed each), and the step's peak is compared as a difference: the
model with its two uses against the same model with Mamba alone in every layer, measured (the profiler's memory
timeline, ``scripts/hf_step_peak.py``) and as lmcalc counts them."""

from __future__ import annotations

import functools
from dataclasses import replace

import pytest

from lmcalc import api
from lmcalc.engine.memory.gpu_memory import gpu_memory, stage_activations
from lmcalc.engine.memory.shared_block import shared_use_saved
from lmcalc.engine.model.params import count_params
from lmcalc.engine.parallel.layout import Layout
from lmcalc.engine.parallel.sharding import stage_params
from lmcalc.engine.workload import Workload, dropout_mask_bytes
from lmcalc.errors import LmcalcError
from lmcalc.hf_config import model_from_hf_config
from lmcalc.presets import framework_profile, resolve_optimizer, resolve_precision
from lmcalc.specs import ModelSpec

PRECISION = resolve_precision("bf16-pure").spec
SMALL_ZAMBA2 = {  # scripts/hf_saved.py's zamba2-small, as its config.json
    "model_type": "zamba2", "vocab_size": 2048, "hidden_size": 128, "num_attention_heads": 4,
    "num_key_value_heads": 4, "intermediate_size": 384, "num_hidden_layers": 3,
    "layers_block_type": ["mamba", "hybrid", "hybrid"], "n_mamba_heads": 4, "mamba_headdim": 64, "mamba_ngroups": 1,
    "mamba_d_state": 16, "adapter_rank": 8, "use_shared_attention_adapter": True, "max_position_embeddings": 1024,
    "tie_word_embeddings": True,
}  # fmt: skip


def spec_of(config: dict) -> ModelSpec:
    return ModelSpec.model_validate(model_from_hf_config(config, config["model_type"], "test"))


def workload(spec: ModelSpec, seq: int, batch: int, attention: str = "flash", recompute: str = "none") -> Workload:
    return Workload(
        spec,
        PRECISION,
        resolve_optimizer("adamw").spec,
        seq,
        batch,
        attention,
        recompute,
        mask_bytes=dropout_mask_bytes("cpu", PRECISION),
        framework=framework_profile("transformers"),
    )


@pytest.mark.fast
def test_one_use_by_hand():
    # zamba2-small at s = 256, b = 2 (s·b = 512 tokens), bf16, transformers' RMSNorm (an fp32 copy of its input, 1/rms,
    # the normalised value cast back), SDPA's fused kernel. h = 128, 2·h = 256, H·d = 4 · 64 = 256, f = 384, r = 8.
    # Bytes a token:
    #   input norm over 2·h: 4·256 + 4 + 2·256 = 1,540;  its output (Q, K, V and adapters read it): 2·256 = 512
    #   Q, K and V adapters' rank-r outputs: 3 · 2·8 = 48;  Q, K, V: 3 · 2·256 = 1,536
    #   log-sum-exp: 4·H = 16;  attention output (the output projection's input): 2·256 = 512
    #   MLP norm over h: 4·128 + 4 + 2·128 = 772;  its output: 2·128 = 256
    #   gate and up outputs (one fused storage), GELU's output, the product: 4 · 2·384 = 3,072
    #   MLP adapter's rank-r output: 2·8 = 16;  the use's linear layer's input: 2·128 = 256
    # 8,536 a token, 4,370,432 bytes a use: transformers keeps exactly that (hf_saved, zamba2-small, layer 1's
    # shared_transformer and linear modules)
    per_token = 1540 + 512 + 48 + 1536 + 16 + 512 + 772 + 256 + 3072 + 16 + 256
    use = shared_use_saved(workload(spec_of(SMALL_ZAMBA2), 256, 2))
    assert sum(t.bytes for t in use) == 512 * per_token == 4_370_432


ONE_USE = SMALL_ZAMBA2 | {"layers_block_type": ["mamba", "mamba", "hybrid"]}  # the same block, used once


@pytest.mark.fast
def test_every_use_keeps_its_own_and_the_weights_count_once():
    # a second use of the one block: the layers keep a second use's tensors; the states hold the block once, and
    # the second use's own adapters and linear layer
    spec, once = spec_of(SMALL_ZAMBA2), spec_of(ONE_USE)
    w = workload(spec, 256, 2)
    use = sum(t.bytes for t in shared_use_saved(w))
    layers = stage_activations(w, Layout(), 0).total - stage_activations(workload(once, 256, 2), Layout(), 0).total
    assert layers == pytest.approx(use) == 4_370_432
    h, f, r = 128, 384, 8
    own = 3 * (2 * h * r + r * 2 * h) + h * r + r * 2 * f + h * h  # Q, K, V adapters, the MLP's, the linear layer
    assert count_params(spec).total - count_params(once).total == own == 35_840
    assert stage_params(w, Layout(), 0).total == count_params(spec).total  # held on the one stage, once
    assert gpu_memory(w, Layout(), 0).kept.params == 2 * count_params(spec).total  # bf16 weights, no more


@pytest.mark.fast
def test_full_recomputation_keeps_the_embedding_every_use_reads():
    # each layer's input (s·b·h) and, once, the embedding's copy every use concatenates with its input (transformers
    # passes it to every checkpointed layer); the backward rebuilds a layer that runs a use: its Mamba-2 and the use
    spec = spec_of(SMALL_ZAMBA2)
    w = workload(spec, 256, 2, recompute="full")
    kept = stage_activations(w, Layout(), 0)
    plain = stage_activations(replace(w, recompute="none"), Layout(), 0)
    layer_inputs, embedding_copy = 3 * 512 * 128 * 2, 512 * 128 * 2
    assert kept.total - kept.outside == layer_inputs
    assert kept.outside - plain.outside == embedding_copy
    mamba_layer = stage_activations(workload(spec_of(ONE_USE), 256, 2), Layout(), 0).total - plain.outside
    mamba_layer = (mamba_layer - 4_370_432) / 3  # the one-use model's layers less its use, over its three layers
    assert kept.rebuilt == pytest.approx(mamba_layer + 4_370_432)


@pytest.mark.fast
def test_memory_lora_and_plan_run_and_pipelines_are_refused(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"model_type": "zamba2"}')  # Zamba2-2.7B's shape
    full = api.memory(model=str(path), gpus="1xH100")
    assert full.gpu.activations > 0
    assert api.memory(model=str(path), gpus="1xH100", method="lora").gpu.activations > 0  # transformers' profile
    with pytest.raises(LmcalcError, match=r"TP=2 does not divide the 1 Mamba-2 groups"):  # MambaMixer's assertion
        api.memory(model=str(path), gpus="8xH100", tp=2)
    with pytest.raises(LmcalcError, match=r"shared blocks \(Zamba's\) are modelled on one pipeline stage, not PP=2"):
        api.memory(model=str(path), gpus="8xH100", pp=2)
    assert api.plan(model=str(path), gpus="8xH100").best.layout.pp == 1


# ---------------------------------------------------------------------------------------------------------------
# Against transformers on the CPU
# ---------------------------------------------------------------------------------------------------------------

TOLERANCE, PEAK_TOLERANCE = 0.05, 0.03  # issue #31's targets: bytes saved, the step's peak
CASES = [
    (name, attention, seq, batch)
    for name in ("zamba-small", "zamba2-small")
    for attention in ("sdpa", "eager")
    for seq, batch in ((128, 1), (256, 2))
]


@functools.cache
def harness():
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import hf_saved  # scripts/, on sys.path by conftest.py
    import hf_step_peak

    for name in hf_saved.SHARED_BLOCKS:  # the same model with Mamba alone in every layer, for the peak's difference
        case = hf_saved.CASES[name]
        alone = {"layers_block_type": ["mamba"] * case.kwargs["num_hidden_layers"]}
        hf_saved.CASES[f"{name}-mamba"] = replace(case, name=f"{name}-mamba", kwargs=case.kwargs | alone)
    return hf_saved, hf_step_peak


def harness_workload(name: str, attention: str, seq: int, batch: int, checkpointing: bool = False) -> Workload:
    hf_saved, _ = harness()
    config = hf_saved.CASES[name].config().to_dict()
    return workload(spec_of(config), seq, batch, {"sdpa": "flash", "eager": "eager"}[attention],
                    "full" if checkpointing else "none")  # fmt: skip


def uses_measured(m) -> int:
    """Bytes packed inside the shared block's modules (Zamba's ``shared_transf``, Zamba 2's ``shared_transformer``)
    and the uses' linear layers."""
    return sum(k.bytes for k in m.tensors if ".shared_transf" in k.module or k.module.endswith(".linear"))


@pytest.mark.torch
@pytest.mark.parametrize(("name", "attention", "seq", "batch"), CASES)
def test_each_use_keeps_what_transformers_keeps(name: str, attention: str, seq: int, batch: int):
    hf_saved, _ = harness()
    m = hf_saved.measure(name, attention, seq, batch, False, use_cache=False)
    w = harness_workload(name, attention, seq, batch)
    assert w.model.shared_block is not None
    ours = w.model.shared_block.uses * sum(t.bytes for t in shared_use_saved(w))
    measured = uses_measured(m)
    assert abs(ours / measured - 1) < TOLERANCE, f"{name}: measured {measured:,} B, lmcalc {ours:,.0f} B"


# Zamba's Mamba-1 scan, replayed layer by layer under the harness's hooks, takes about 2 minutes and 10.7 GB at
# (128, 1) and more than 20 GB at (256, 2) on the CPU; it passed at (128, 1) when run alone (2026-12-06), and is left
# out of the suite, which the check of each use above and Zamba 2's checkpointed forward cover between them
CHECKPOINTED = [c for c in CASES if c[1] == "sdpa" and c[0] == "zamba2-small"]


@pytest.mark.torch
@pytest.mark.parametrize(("name", "attention", "seq", "batch"), CHECKPOINTED)
def test_checkpointed_forward_keeps_what_transformers_keeps(name: str, attention: str, seq: int, batch: int):
    # under gradient checkpointing the forward keeps each layer's input and the closures' arguments (the embedding's
    # copy the uses read, the position ids): no Mamba scan is kept, so the whole forward compares
    hf_saved, _ = harness()
    m = hf_saved.measure(name, attention, seq, batch, True, use_cache=False)
    ours = stage_activations(harness_workload(name, attention, seq, batch, True), Layout(), 0).total
    measured = m.total_bytes + m.closure_bytes
    assert abs(ours / measured - 1) < TOLERANCE, f"{name}: measured {measured:,} B, lmcalc {ours:,.0f} B"


@pytest.mark.torch
@pytest.mark.parametrize(("name", "attention", "seq", "batch"), [c for c in CASES if c[1] == "sdpa"])
def test_the_uses_add_to_the_step_peak_what_transformers_adds(name: str, attention: str, seq: int, batch: int):
    hf_saved, hf_step_peak = harness()
    hf_saved.release_models()  # built afresh: a model an earlier checkpointed measurement ran is not reused
    measured = [hf_step_peak.measure(n, seq, batch, False, attention).peak for n in (name, f"{name}-mamba")]
    ours = [hf_step_peak.lmcalc_peak(n, seq, batch, False, attention)[0] for n in (name, f"{name}-mamba")]
    added, counted = measured[0] - measured[1], ours[0] - ours[1]
    assert abs(counted / added - 1) < PEAK_TOLERANCE, f"{name}: measured +{added:,} B, lmcalc +{counted:,.0f} B"
