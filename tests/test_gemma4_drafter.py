"""Gemma 4's drafters for speculative decoding (issue #31; transformers' Gemma4UnifiedAssistantForCausalLM and
Gemma4AssistantForCausalLM): a Gemma 4 text model whose every layer attends with its backbone's K and V, between
projections from and to the backbone's width. Parameters by hand at the class defaults; a training step's FLOPs
against FlopCounterMode on transformers' own forward on the CPU (the backbone's hidden state and K and V given, a loss
on the logits), with the whole head and with the vocabulary's clusters; what serving holds; what lmcalc refuses,
training memory among it, because transformers defines no training step for a drafter."""

from __future__ import annotations

import json
import warnings

import pytest

from lmcalc import api
from lmcalc.engine.model import flops as fl
from lmcalc.engine.model.params import count_params
from lmcalc.errors import LmcalcError
from lmcalc.hf_config import model_from_hf_config
from lmcalc.specs import DRAFTER_COUNTED_ONLY, ModelSpec

DEFAULTS = {"model_type": "gemma4_unified_assistant"}  # its class defaults: a drafter for a backbone of 3,840


def spec_of(config: dict) -> ModelSpec:
    return ModelSpec.model_validate(model_from_hf_config(config, "drafter", "test"))


def tiny_drafter(transformers, ordered: bool = False):
    """A drafter of 4 layers of 64 (4 heads of 16, the global layer's of 512) for a backbone of 32, eager, training."""
    text = dict(vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, sliding_window=16, pad_token_id=0, bos_token_id=2,
                eos_token_id=1)  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = transformers.Gemma4UnifiedAssistantConfig(
            text_config=transformers.Gemma4UnifiedTextConfig(**text), backbone_hidden_size=32,
            use_ordered_embeddings=ordered, num_centroids=8, centroid_intermediate_top_k=2)  # fmt: skip
        return config, transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").train()


def test_class_defaults_by_hand():
    # 30 layers of 2,304, every sixth global: 8 heads of 256 (512 in the global layers), no K or V of their own;
    # an MLP of 9,216, four norms a layer; the embedding (262,144 rows, the tied head), the final norm; the
    # projections 2 × 3,840 → 2,304 and 2,304 → 3,840
    h, f, V = 2304, 9216, 262144
    local = 2 * h * 8 * 256 + 256 + 3 * h * f + 4 * h  # q and o, the q norm
    global_ = 2 * h * 8 * 512 + 512 + 3 * h * f + 4 * h
    total = 25 * local + 5 * global_ + V * h + h + 2 * 3840 * h + h * 3840
    assert count_params(spec_of(DEFAULTS)).total == total == 2_872_140_800  # transformers' meta-device count


@pytest.mark.torch
@pytest.mark.parametrize("ordered", [False, True])
def test_a_step_equals_flopcountermode_on_transformers_forward(ordered):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from torch.utils.flop_counter import FlopCounterMode

    config, model = tiny_drafter(transformers, ordered)
    if ordered:  # the clusters' rows of the vocabulary
        with torch.no_grad():
            model.masked_embedding.token_ordering.copy_(torch.randperm(512))
    spec = spec_of(json.loads(json.dumps(config.to_dict())))
    s = 24  # the backbone's hidden state beside the token's embedding, and its K and V: its three local layers' of
    # 2 heads of 16, its global layer's of 2 heads of 512
    shared = {"sliding_attention": (torch.randn(1, 2, s, 16), torch.randn(1, 2, s, 16)),
              "full_attention": (torch.randn(1, 2, s, 512), torch.randn(1, 2, s, 512))}  # fmt: skip
    with FlopCounterMode(display=False) as counter:
        out = model(inputs_embeds=torch.randn(1, s, 64), shared_kv_states=shared, position_ids=torch.arange(s)[None])
        torch.nn.functional.cross_entropy(out.logits.float()[0], torch.randint(0, 512, (s,))).backward()
    assert fl.step_flops(spec, s, convention="full").model * s == counter.get_total_flops()


def test_serving_holds_weights_alone_and_training_memory_is_refused(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(DEFAULTS))
    served = api.inference(model=str(path), context=8192).memory
    assert served.kv_cache == 0  # every layer reads the backbone's cache
    assert served.params == 2_872_140_800
    with pytest.raises(LmcalcError, match="Gemma 4's drafters"):
        api.memory(model=str(path))


@pytest.mark.torch
def test_validate_against_transformers_refuses_a_drafter_in_one_line():
    pytest.importorskip("transformers")
    from lmcalc.validate_hf import transformers_check

    with pytest.raises(LmcalcError, match="a drafter's step reads its backbone's hidden state"):
        transformers_check(DEFAULTS, 32)


def test_a_drafter_of_a_text_model_its_class_rejects_is_refused():
    # Gemma4AssistantConfig's own default text config (Gemma 4 E2B's, with per-layer inputs) fails its check
    with pytest.raises(LmcalcError, match="a Gemma 4 drafter's text model has no per-layer inputs"):
        spec_of({"model_type": "gemma4_assistant"})


def test_training_memory_fine_tuning_and_the_plan_refuse_a_drafter_with_the_reason(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(DEFAULTS))
    assert spec_of(DEFAULTS).counted_only == DRAFTER_COUNTED_ONLY
    for estimate in (
        lambda: api.memory(model=str(path), seq=4096),
        lambda: api.memory(model=str(path), seq=4096, method="lora"),
        lambda: api.plan(model=str(path), gpus="8xh100", seq=4096, global_batch=4096 * 64, tokens=1e9),
    ):
        with pytest.raises(LmcalcError, match="transformers 5.24 defines no training step") as refused:
            estimate()
        assert "\n" not in str(refused.value)


@pytest.mark.torch
def test_transformers_defines_no_training_step_for_a_drafter():
    # what DRAFTER_COUNTED_ONLY rests on, in transformers' own Gemma4UnifiedAssistantForCausalLM: labels are taken and
    # dropped (no loss), and over several positions every one attends to all the backbone's K and V, later ones too
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    _, model = tiny_drafter(transformers)
    s = 8
    shared = {"sliding_attention": (torch.randn(1, 2, s, 16), torch.randn(1, 2, s, 16)),
              "full_attention": (torch.randn(1, 2, s, 512), torch.randn(1, 2, s, 512))}  # fmt: skip
    inputs = dict(inputs_embeds=torch.randn(1, s, 64), position_ids=torch.arange(s)[None])
    with torch.no_grad():
        out = model(**inputs, shared_kv_states=shared, labels=torch.zeros(1, s, dtype=torch.long))
        assert "loss" not in out
        later = {kind: (k, v.clone()) for kind, (k, v) in shared.items()}
        later["full_attention"][1][:, :, s // 2 :] += 1.0  # the values of the later half of the backbone's positions
        changed = model(**inputs, shared_kv_states=later).logits[0, 0]
    assert not torch.allclose(out.logits[0, 0], changed)  # the first position reads them
