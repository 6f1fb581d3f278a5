"""Inkling 2's looped text model (issue #31; transformers 5.24's `inkling2_loop_text`): Inkling 2's layers, a section
of them run in several passes, each pass after the first restarting from the section's input and reading the
previous pass through learned queries and gates. Parameters and the loop's FLOPs by hand at a tiny size, the class
defaults and a released file's loop_config against transformers, the step's FLOPs against FlopCounterMode at the
class defaults cut to twelve layers (the tiny config's run in tests/test_validate_hf.py), the cache against
transformers', what lmcalc refuses, and that training memory takes it (tests/test_inkling2_loop_memory.py)."""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import pytest

from lmcalc import api
from lmcalc.engine.model.branch_convs import block_flops
from lmcalc.engine.model.params import count_params
from lmcalc.errors import LmcalcError
from lmcalc.hf_config import model_from_hf_config
from lmcalc.specs import ModelSpec

sys.path.insert(0, str(Path(__file__).parent))

LAYERS = dict(vocab_size=512, unpadded_vocab_size=500, hidden_size=64, num_hidden_layers=6, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, swa_num_attention_heads=4, swa_num_key_value_heads=2, swa_head_dim=16,
              sliding_window_size=16, rel_extent=32, moe_intermediate_size=32, n_routed_experts=4,
              num_experts_per_tok=2, n_layers_per_attn_res_block=2, layer_types=["hybrid_sliding", "hybrid"] * 3,
              pad_token_id=0, bos_token_id=1, eos_token_id=2)  # fmt: skip
"""Six of Inkling 2's tiny layers (tests/test_inkling2.py's), local and global by turns, blocks of two."""
LOOP = dict(loop_layer_index_start=2, loop_layer_index_end=4, loop_num_passes=3, loop_gate_rank=8)
TINY = {"model_type": "inkling2_loop_text", **LAYERS, **LOOP}
"""Layers 2 (local) and 3 (global) run in three passes; the later two read the previous pass through gates of rank 8
(tests/hf_tiny.py's, whose experts are as wide as its BASE's intermediate_size, which this class reads as theirs)."""


def spec_of(config: dict) -> ModelSpec:
    return ModelSpec.model_validate(model_from_hf_config(config, str(config["model_type"]), "test"))


def test_the_loop_holds_its_layers_once_and_its_messages_by_hand():
    h, r = 64, 8
    spec = spec_of(TINY)
    # ten runs: layers 0 and 1, then 2 and 3 three times, then 4 and 5; the weights of the six alone
    assert spec.num_layers == 10 and spec.layer_reuse is not None and spec.layer_reuse.held == 6
    layers = count_params(spec_of({"model_type": "inkling2_text", **LAYERS})).total  # the same six layers, unlooped
    gates = 2 * 4 * (2 * h * r + r * h + r * h)  # each looped layer's four gates: 2·h → r, then r → h twice
    queries = 2 * 4 * h  # and its four message queries
    assert count_params(spec).total == layers + gates + queries == 368_256


def test_class_defaults_and_a_released_loop_config_equal_transformers():
    # 24 layers of 2,304, layers 6 to 17 run three times: transformers' count on the meta device (docs/hf-types.md)
    assert count_params(spec_of({"model_type": "inkling2_loop_text"})).total == 26_068_156_416
    released = {"model_type": "inkling2_loop_text", **LAYERS,
                "loop_config": {"core_start": 2, "core_end": 4, "num_passes": 3, "gate_rank": 8}}  # fmt: skip
    assert count_params(spec_of(released)).total == 368_256


def test_the_block_residuals_and_the_messages_by_hand():
    # each run reads the blocks of its held layer's place (a pass restarts them): held layers 0 to 5 read, before
    # attention and the MLP, 0·1 + 2, 3·2 + 2, 1·2 + 3, 3·3 + 3, 1·3 + 4 and 3·4 + 4 query-states, layers 2 and 3 three
    # times; the final input 4 (three blocks and the partial one). 2·2·m·h a query over m states
    h = 64
    residuals = 2 + 8 + 3 * (5 + 12) + 7 + 16 + 4
    # the four runs after a looped layer's first: four queries over the previous pass's m = 2/2 = 1 states (its one
    # block past the shared first, none here, and its output)
    messages = 4 * 4 * 1
    assert block_flops(spec_of(TINY)) == 4 * h * (residuals + messages) == 26_624


def test_the_cache_equals_transformers_by_hand(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY))
    # every run caches its own: 10 runs of K and V (2 heads of 16, 7 tokens) and four convolutions' last 4 inputs
    # (32, 32, 64, 64), fp32, 2 sequences
    expected = 10 * 2 * (7 * 2 * 2 * 16 + (32 + 32 + 64 + 64) * 4) * 4
    assert api.inference(model=str(path), context=7, batch=2, kv_dtype="fp32").memory.kv_cache == expected == 97_280


@pytest.mark.torch
def test_the_count_and_the_cache_held_by_transformers():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    with warnings.catch_warnings():  # fp32, as tests/test_inkling2.py's
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**TINY)).eval()
    with torch.no_grad():
        cache = model(input_ids=torch.randint(1, 512, (2, 7)), use_cache=True).cache
    assert sum(p.numel() for p in model.parameters()) == 368_256
    assert len(cache.layers) == 10  # a copy of the looped layers' caches for each later pass
    held = sum(t.numel() * t.element_size() for layer in cache.layers
               for t in (layer.keys, layer.values, *layer.conv_states.values()))  # fmt: skip
    assert held == 97_280


@pytest.mark.torch
def test_class_defaults_cut_to_twelve_layers_equal_flop_counter_mode():
    transformers = pytest.importorskip("transformers")
    from hf_tiny import transformers_model

    from lmcalc import validate_hf

    # layers 6 to 11 (one global) three times, at the full widths: 128 experts of 1,152, top 8; eager attention
    config = transformers.Inkling2LoopTextConfig(num_hidden_layers=12, loop_layer_index_end=12).to_diff_dict()
    result = validate_hf.transformers_check(config, 64, 1, model=transformers_model(config))
    assert result.value("params.lmcalc") == result.value("params.pytorch") == 13_496_126_976
    assert result.value("flops.lmcalc") == result.value("flops.pytorch")


def test_a_loop_its_class_refuses_is_one_line():
    with pytest.raises(LmcalcError, match="must be multiples of n_layers_per_attn_res_block"):
        spec_of(TINY | {"loop_layer_index_end": 3})


def test_params_flops_serving_and_training_memory_work(tmp_path):  # training memory: test_inkling2_loop_memory.py
    from lmcalc import api

    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY))
    assert api.params(model=str(path)).total == 368_256
    assert api.flops(model=str(path), tokens=1e9, seq=32).model_flops > 0
    assert api.inference(model=str(path), context=64).memory.kv_cache > 0
    assert api.memory(model=str(path), gpus="1xh100", seq=64, micro_batch=1).gpu.activations > 0
