"""Doge's CDMoE (``is_moe``; ``specs.RetrievalExpertsSpec``, docs/formulas.md §2.27.1): beside the SwiGLU, its shared
expert, E single-neuron experts, rows of down_embed and up_embed, retrieved by product keys. Its parameters, FLOPs,
saved tensors and step transients by hand at DogeConfig's defaults; then against transformers 5.24 on the CPU: the
parameters on the meta device, the FLOPs under FlopCounterMode, the bytes saved for backward (``scripts/hf_saved.py``'s
doge-moe) within 5 % and the step's peak (``scripts/hf_step_peak.py``: doge-moe, doge-moe-wide) within 3 %, with and
without gradient checkpointing, fully trained and under PEFT's LoRA on every linear layer (router_gate included; the
two nn.Embedding tables are not Linear, and stay frozen)."""

from __future__ import annotations

import json
from dataclasses import replace
from functools import partial

import pytest
from saved_compare import assert_refused_in_one_line, hf_spec, takes_memory_lora_and_plan, transformers_workload

from lmcalc import api
from lmcalc.engine.finetune.method import Method, adapted_modules, parse_targets
from lmcalc.engine.memory.activations import layer_saved_tensors
from lmcalc.engine.memory.retrieval_experts import retrieval_backward_peak, retrieval_forward_peak
from lmcalc.engine.model import flops as fl
from lmcalc.engine.model.params import count_params
from lmcalc.errors import LmcalcError

MOE = {"model_type": "doge", "is_moe": True}  # DogeConfig's defaults: E = 16,384 experts, k = 64 a token
DENSE = {"model_type": "doge"}
H, L, E, KEYS, K, F = 1024, 32, 16384, 128, 64, 2048  # √E = 128 keys a half
LORA = Method("lora", 8, parse_targets("all-linear"), fp32_adapters=False)

spec_of = partial(hf_spec, model_type="doge")


def test_parameters_by_hand():
    # a layer's CDMoE: router_gate 2·√E × h (no bias) and two tables of E × h, beside the dense Doge's 403,055,872
    # (tests/test_doge.py); transformers' count on the meta device (docs/hf-types.md, doge moe)
    layer = 2 * KEYS * H + 2 * E * H
    assert layer == 262_144 + 33_554_432
    assert count_params(spec_of(MOE)).total == 403_055_872 + L * layer == 1_485_186_304
    # a token uses the router and k rows of each table: 2·√E·h + 2·k·h a layer
    assert count_params(spec_of(MOE)).active == 403_055_872 + L * (2 * KEYS * H + 2 * K * H) == 415_638_784
    # E need not be a square: √E is floored (math.floor(math.sqrt(num_experts))), the tables keep E rows
    odd = spec_of(MOE | {"num_experts": 1000, "num_experts_per_tok": 7})
    assert count_params(odd).total == 403_055_872 + L * (2 * 31 * H + 2 * 1000 * H)


def test_flops_by_hand():
    # per token and layer, forward: router_gate 2·(2·√E·h), the two products 2·k·h each ((k × h)·x, then
    # (1 × k)·(k × h)); backward twice that (both operands of each product carry gradients): 6·(2·√E·h + 2·k·h)
    extra = 6 * (2 * KEYS * H + 2 * K * H) * L
    assert extra == 75_497_472
    for convention in ("full", "causal"):
        moe, dense = (fl.step_flops(spec_of(c), 4096, convention=convention).model for c in (MOE, DENSE))
        assert moe - dense == extra


def test_saved_tensors_by_hand():
    # s = 4,096, b = 1, bf16 (2 B), N = s·b tokens: topk's int64 indices over each half's √E keys (2·N·√E) and
    # over the √E² sums (N·k); the routing weights (N·k); the experts' int64 ids (N·k, for both tables' backward);
    # the retrieved rows of down_embed and up_embed (N·k·h each); SiLU's input and output and the weighted
    # activations (N·k each). x itself is the SwiGLU's input, counted there.
    N = 4096
    full = 8 * (2 * N * KEYS + N * K) + 2 * N * K + 8 * N * K + 2 * (2 * N * K * H) + 3 * 2 * N * K
    assert full == 1_088_421_888

    def cdmoe(w):
        return sum(t.bytes for t in layer_saved_tensors(w, False) if t.label.startswith("CDMoE"))

    w = transformers_workload(spec_of(MOE), N, 1)
    assert cdmoe(w) == full
    # LoRA: PEFT adapts router_gate (an nn.Linear) and not the tables: no ids, no weighted activations (the
    # products keep only what the other operand's gradient needs)
    assert "router" in {m.leaf for m in adapted_modules(w.model, LORA)}
    assert cdmoe(replace(w, method=LORA)) == full - 8 * N * K - 2 * N * K == 1_085_800_448
    # PEFT's name for it reads as lmcalc's router: LoRA on it alone adapts the one 2·√E × h layer a layer
    only_router = Method("lora", 8, parse_targets("router_gate"), fp32_adapters=False)
    assert [(m.leaf, m.outputs, m.inputs) for m in adapted_modules(w.model, only_router)] == [("router", 2 * KEYS, H)]


def test_transients_by_hand():
    N, act = 4096, 2
    w = transformers_workload(spec_of(MOE), N, 1)
    # the second product's backward: the up_embed rows' gradient (N·k·h), the weighted activations' (N·k) and x's
    # gradient from the SwiGLU (N·h), whose four saved tensors of N·f (gate and up outputs, SiLU's output, their
    # product) are freed by then
    assert retrieval_backward_peak(w) == act * (N * K * H + N * K + N * H - 4 * N * F) == 478_674_944
    assert retrieval_backward_peak(replace(w, method=LORA)) == 0  # up_embed frozen: its rows get no gradient
    # the layer's forward at its last add: the √E² sums (bf16) and their int64 ids, the router's logits and the two
    # halves' top √E (2·N·√E each), the top k's values, the experts' output, the SwiGLU's and their sum
    forward = N * KEYS**2 * (act + 8) + 4 * N * KEYS * act + N * K * act + 3 * N * H * act
    assert retrieval_forward_peak(w) == forward == 700_973_056
    # LoRA: the ids and weighted activations (N·k each), no longer kept, and the layer's residual (N·h, its scale
    # frozen) are live still; the adapted down projection's W·x, B·A·x and scaled copy make a fourth N·h
    lora = forward + N * K * (8 + act) + N * H * act + N * H * act
    assert retrieval_forward_peak(replace(w, method=LORA)) == lora == 720_371_712


def test_every_estimate_takes_it_and_refuses_what_it_cannot_split(tmp_path):
    path, _ = takes_memory_lora_and_plan(tmp_path, "doge", 4096, {"is_moe": True})
    assert_refused_in_one_line(path, 4096, {"tp": "TP=2 would split", "cp": "CP=2 would split",
                                            "ep": "EP=2 would split .*CDMoE experts"})  # fmt: skip
    # serving: the CDMoE caches nothing; K and V as the dense Doge's, 8 heads of 128 in each of 32 layers, bf16
    assert api.inference(model=path, context=4096).memory.kv_cache == 4096 * 32 * 2 * 8 * 128 * 2


def test_norm_topk_prob_is_counted_and_its_training_refused(tmp_path):
    # transformers' DogeCDMoE divides softmax's output in place with norm_topk_prob: autograd refuses its backward
    path = tmp_path / "config.json"
    path.write_text(json.dumps(MOE | {"norm_topk_prob": True}))
    assert api.params(model=str(path)).total == 1_485_186_304
    assert api.flops(model=str(path), tokens=1e9, seq=4096).model_flops > 0
    for more in ({}, {"method": "lora"}):
        with pytest.raises(LmcalcError, match="cannot train with norm_topk_prob true") as refused:
            api.memory(model=str(path), seq=4096, **more)
        assert "\n" not in str(refused.value)


def test_more_experts_a_token_than_products_is_refused():
    with pytest.raises(ValueError, match=r"top_k \(50\) is more than the 7² products"):
        spec_of(MOE | {"num_experts": 63, "num_experts_per_tok": 50})


pytest.importorskip("torch")
pytest.importorskip("transformers")

import hf_saved  # noqa: E402  (scripts/, on sys.path by conftest.py; imports torch and transformers)
import hf_step_peak  # noqa: E402
import torch  # noqa: E402
from hf_tiny import tiny_config, transformers_model  # noqa: E402
from saved_compare import LORA as PEFT_LORA  # noqa: E402
from saved_compare import assert_peak_match, assert_saved_match, harness_workload  # noqa: E402

from lmcalc import validate_hf  # noqa: E402
from lmcalc.engine.memory.gpu_memory import gpu_memory, stage_activations  # noqa: E402
from lmcalc.engine.parallel.layout import Layout  # noqa: E402
from lmcalc.validate import passed  # noqa: E402

workload_of = partial(harness_workload, "doge")


@pytest.mark.torch
@pytest.mark.parametrize("experts", [(64, 8), (70, 5)], ids=["square", "not-square"])
def test_parameters_and_flops_equal_transformers(experts):
    # tests/hf_tiny.py's Doge with its CDMoE, on the meta device: the parameters exact, the step's FLOPs equal to
    # FlopCounterMode's (router_gate, and the two batched products with both operands' gradients; topk, gather, the
    # embeddings' gathers and their backward's index_add count no FLOPs there, nor in lmcalc)
    config = tiny_config("doge") | {"is_moe": True, "num_experts": experts[0], "num_experts_per_tok": experts[1]}
    result = validate_hf.transformers_check(config, 32, 1, model=transformers_model(config))
    assert result.value("params.lmcalc") == result.value("params.pytorch")
    assert result.value("flops.error") == 0
    assert passed(result)


SAVED = [(128, 1, False, False), (256, 2, False, False), (256, 2, True, False), (256, 2, False, True),
         (256, 2, True, True)]  # fmt: skip
"""doge-moe at (s, b), checkpointed or not, LoRA or not: 256 experts (16 keys a half), 16 a token, bf16."""


@pytest.mark.torch
@pytest.mark.parametrize(("seq", "batch", "checkpointing", "lora"), SAVED)
def test_bytes_kept_for_backward_match_transformers(seq, batch, checkpointing, lora):
    hf_saved.release_models()  # a model built afresh: one a checkpointed measurement ran keeps its hooks otherwise
    m = hf_saved.measure("doge-moe", "eager", seq, batch, checkpointing, dtype=torch.bfloat16, use_cache=False,
                         lora=PEFT_LORA if lora else None)  # fmt: skip
    w = workload_of("doge-moe", seq, batch, checkpointing, lora=lora)
    layer = None if lora else sum(t.bytes for t in layer_saved_tensors(w, False))
    assert_saved_match(m, stage_activations(w, Layout(), 0), checkpointing, layer)


PEAKS = [(name, ck, lora) for name in ("doge-moe", "doge-moe-wide") for ck in (False, True) for lora in (False, True)]
"""s 256, b 2: doge-moe's vocabulary binds at the loss's backward, or checkpointed at its rebuilt layer's forward (the
√E² sums); doge-moe-wide's final norm, or checkpointed the second product's backward (LoRA: the rebuilt forward). Each
within 0.06 % (docs/formulas.md §2.27.1)."""


@pytest.mark.torch
@pytest.mark.parametrize(("name", "checkpointing", "lora"), PEAKS)
def test_the_step_peak_matches_transformers(name, checkpointing, lora):
    hf_saved.release_models()
    m = hf_step_peak.measure(name, 256, 2, checkpointing, "eager", lora=PEFT_LORA if lora else None,
                             fp32_adapters=False)  # fmt: skip
    assert_peak_match(m, gpu_memory(workload_of(name, 256, 2, checkpointing, lora=lora), Layout(), 0))
