"""What a PEFT LoRA model keeps for backward, against ``--framework transformers --method lora``.

Each case builds a real transformers model in bf16 on the CPU (``scripts/hf_saved.py``'s small cases, two layers),
injects PEFT's LoRA adapters in place (bf16, as the ``bf16-pure`` recipe keeps them; every other weight frozen),
runs the forward and the loss as ``Trainer`` does, and counts the distinct storages autograd keeps, as
tests/test_framework_transformers.py does for full training. lmcalc's figure for the same config must be within
5 % of it. What the method changes, each part exercised here:

* a frozen linear layer keeps no input, a frozen norm no normalised value, a frozen head no input;
* each adapter keeps the rank-r output of A that B reads, and with ``lora_dropout`` its dropout mask and its own
  copy of its input (the dropout's output);
* the lowest layer's input needs no gradient: what lies before its first adapter keeps nothing;
* with gradient checkpointing, each layer's input and one rebuilt layer.

Not compared: LoRA on Mixtral's routed experts (transformers 5 stores them as 3-D parameters, which PEFT adapts
with ``ParamWrapper``, differently from per-expert ``nn.Linear`` adapters: lmcalc counts the latter), and GPT-2's
eager attention, whose bf16 softmax the transformers profile counts in fp32 (test_framework_transformers.py).
"""

from __future__ import annotations

import functools

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

import hf_saved  # noqa: E402  (scripts/, on sys.path by conftest.py)

from lmcalc.engine.finetune.method import Method, parse_targets  # noqa: E402
from lmcalc.engine.memory.gpu_memory import stage_activations  # noqa: E402
from lmcalc.engine.parallel.layout import Layout  # noqa: E402
from lmcalc.engine.workload import Workload, dropout_mask_bytes  # noqa: E402
from lmcalc.hf_config import model_from_hf_config  # noqa: E402
from lmcalc.presets import framework_profile, resolve_optimizer, resolve_precision  # noqa: E402
from lmcalc.specs import ModelSpec  # noqa: E402

pytestmark = pytest.mark.torch

TOLERANCE = 0.05  # the target
PRECISION = resolve_precision("bf16-pure").spec  # bf16 weights, adapters and activations; no fp32 copies
ATTENTION = {"sdpa": "flash", "eager": "eager"}
RANK = 8

TARGETS = {
    "llama-small": ("all-linear", "q_proj,v_proj", "gate_proj,up_proj,down_proj"),
    "qwen2-small": ("all-linear", "k_proj,o_proj"),
    "mistral-small": ("all-linear",),
    "mixtral-small": ("q_proj,k_proj,v_proj,o_proj",),
    "gpt2-small": ("all-linear", "c_attn", "c_fc"),
    "gemma4-small": ("all-linear", "q_proj,v_proj"),  # a global layer at its own widths, with no v_proj (K = V)
    "gemma4-moe-small": ("q_proj,k_proj,v_proj,o_proj",),  # the attention of a layer with the MoE block beside
    "gemma4-e-small": ("all-linear", "q_proj,v_proj"),  # layers that reuse K and V, and per-layer inputs
    "gemma3n-small": ("all-linear", "q_proj,v_proj"),  # AltUp's streams (PEFT adapts its linear layers too), LAuReL
    "recurrent-gemma-small": ("all-linear", "linear_y,linear_x,linear_out"),  # its recurrent block's, then alone
    "rwkv-small": ("all-linear",),  # the time mix's four projections, the channel mix's three
}
CASES = [
    (name, targets, dropout, checkpointing, attention)
    for name, target_sets in TARGETS.items()
    for targets in target_sets
    for dropout in ((0.0,) if name == "mixtral-small" else (0.0, 0.1))
    for checkpointing in (False, True)
    for attention in (("sdpa",) if name == "gpt2-small" else hf_saved.CASES[name].attentions)
]


@functools.cache
def model_spec(name: str) -> ModelSpec:
    case = hf_saved.CASES[name]
    fields = model_from_hf_config(case.config(0.0 if case.dropout_knobs else None).to_dict(), name, name)
    fields["dropout"] = False  # GPT-2's own dropout is set to 0 below: only the adapters' dropout is on
    return ModelSpec.model_validate(fields)


def measured(name: str, targets: str, dropout: float, checkpointing: bool, attention: str) -> int:
    lora = {"r": RANK, "lora_alpha": 2 * RANK, "lora_dropout": dropout}
    lora["target_modules"] = targets if targets == "all-linear" else targets.split(",")
    gpt2_dropout = 0.0 if hf_saved.CASES[name].dropout_knobs else None
    m = hf_saved.measure(name, attention, 128, 2, checkpointing, dropout=gpt2_dropout, use_cache=False, lora=lora)
    return m.total_bytes + m.closure_bytes + m.rebuild_new_bytes


def predicted(name: str, targets: str, dropout: float, checkpointing: bool, attention: str) -> float:
    w = Workload(
        model_spec(name),
        PRECISION,
        resolve_optimizer("adamw").spec,
        128,
        2,
        ATTENTION[attention],
        "full" if checkpointing else "none",
        mask_bytes=dropout_mask_bytes("cpu", PRECISION),
        framework=framework_profile("transformers"),
        method=Method("lora", RANK, parse_targets(targets), dropout, fp32_adapters=False),
    )
    return stage_activations(w, Layout(), 0).with_rebuilt


@pytest.mark.parametrize(("name", "targets", "dropout", "checkpointing", "attention"), CASES)
def test_bytes_kept_for_backward_match_a_peft_lora_model(name, targets, dropout, checkpointing, attention):
    whole = measured(name, targets, dropout, checkpointing, attention)
    ours = predicted(name, targets, dropout, checkpointing, attention)
    assert abs(ours / whole - 1) < TOLERANCE, f"measured {whole:,} B, lmcalc {ours:,.0f} B ({ours / whole - 1:+.2%})"


MIXED = resolve_precision("bf16-mixed").spec  # the adapters are the master copy: fp32
FP32_CASES = [
    ("llama-small", t, d, c) for t in ("all-linear", "q_proj,v_proj") for d in (0.0, 0.1) for c in (False, True)
]


@pytest.mark.parametrize(("name", "targets", "dropout", "checkpointing"), FP32_CASES)
def test_fp32_adapters_under_autocast_keep_their_own_input_copies(name, targets, dropout, checkpointing):
    # PEFT's default keeps the adapters in fp32 on a bf16 base; Trainer's bf16 autocast then casts each adapter's
    # input back to bf16 for its matmul, and that copy is what A keeps: one per adapter (the bf16-mixed recipe's
    # rule). With lora_dropout the dropout runs on PEFT's fp32 copy, whose mask PyTorch's CPU dropout keeps in fp32
    # (a bool on CUDA): mask_bytes 4 here.
    lora = {"r": RANK, "lora_alpha": 2 * RANK, "lora_dropout": dropout}
    lora["target_modules"] = targets if targets == "all-linear" else targets.split(",")
    m = hf_saved.measure(name, "sdpa", 128, 2, checkpointing, use_cache=False, lora=lora, fp32_adapters=True)
    whole = m.total_bytes + m.closure_bytes + m.rebuild_new_bytes
    w = Workload(
        model_spec(name), MIXED, resolve_optimizer("adamw").spec, 128, 2, "flash",
        "full" if checkpointing else "none", mask_bytes=4, framework=framework_profile("transformers"),
        method=Method("lora", RANK, parse_targets(targets), dropout, fp32_adapters=False),
    )  # fmt: skip
    ours = stage_activations(w, Layout(), 0).with_rebuilt
    assert abs(ours / whole - 1) < TOLERANCE, f"measured {whole:,} B, lmcalc {ours:,.0f} B ({ours / whole - 1:+.2%})"


def test_lora_keeps_less_than_full_training():
    # The mechanism, by hand, for the small Llama (h 256, f 896, s·b = 256 tokens, bf16): a frozen layer drops the
    # normalised values of its two norms (2·s·b·h·2 B) and the inputs of Q/K/V, gate/up and down kept only for
    # their weights; with all-linear adapters and no dropout the adapters read those same inputs, so only the
    # norms' values go, and seven rank-8 outputs come: 7·s·b·8·2 B.
    spec = model_spec("llama-small")
    profile, adamw = framework_profile("transformers"), resolve_optimizer("adamw").spec
    full = Workload(spec, PRECISION, adamw, 128, 2, framework=profile)
    lora = Workload(
        spec,
        PRECISION,
        adamw,
        128,
        2,
        framework=profile,
        method=Method("lora", 8, ("all-linear",), fp32_adapters=False),
    )
    from lmcalc.engine.memory.activations import layer_saved_tensors

    per_layer = sum(t.bytes for t in layer_saved_tensors(full, False)) - sum(
        t.bytes for t in layer_saved_tensors(lora, False)
    )
    tokens = 256
    assert per_layer == 2 * tokens * 256 * 2 - 7 * tokens * 8 * 2


DORA_CASES = [(t, d, c) for t in ("all-linear", "q_proj,v_proj") for d in (0.0, 0.1) for c in (False, True)]


@pytest.mark.parametrize(("targets", "dropout", "checkpointing"), DORA_CASES)
def test_dora_keeps_both_products_for_the_magnitude(targets, dropout, checkpointing):
    # PEFT's DoRA: (m/‖W + s·B·A‖ − 1)·(W·x) + m/‖W + s·B·A‖·(s·B·A·x); the magnitude's gradient needs W·x and
    # s·B·A·x, each s·b·out per adapted module, and the norm and two scales, out each
    lora = {"r": RANK, "lora_alpha": 2 * RANK, "lora_dropout": dropout, "use_dora": True}
    lora["target_modules"] = targets if targets == "all-linear" else targets.split(",")
    m = hf_saved.measure("llama-small", "sdpa", 128, 2, checkpointing, use_cache=False, lora=lora)
    whole = m.total_bytes + m.closure_bytes + m.rebuild_new_bytes
    w = Workload(
        model_spec("llama-small"), PRECISION, resolve_optimizer("adamw").spec, 128, 2, "flash",
        "full" if checkpointing else "none", mask_bytes=dropout_mask_bytes("cpu", PRECISION),
        framework=framework_profile("transformers"),
        method=Method("lora", RANK, parse_targets(targets), dropout, dora=True, fp32_adapters=False),
    )  # fmt: skip
    ours = stage_activations(w, Layout(), 0).with_rebuilt
    assert abs(ours / whole - 1) < TOLERANCE, f"measured {whole:,} B, lmcalc {ours:,.0f} B ({ours / whole - 1:+.2%})"
