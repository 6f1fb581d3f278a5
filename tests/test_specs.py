"""Specs are values (lmcalc/specs.py): equal specs hash and compare equal, so they can key the engine's caches; a
spec's hash is computed once and kept in ``_HASHES`` by ``id`` only while the spec lives; and nothing in a spec can
change after its hash is taken."""

import functools
import gc
from pathlib import Path

import pytest
from pydantic import ValidationError

from lmcalc import spec_base
from lmcalc.presets import resolve_hardware, resolve_model, resolve_optimizer, resolve_precision
from lmcalc.recipe_specs import OptimizerSpec, PrecisionRecipe
from lmcalc.specs import HardwareSpec, ModelSpec

PRESETS = Path(__file__).resolve().parent.parent / "presets"


def test_equal_specs_hash_equal():
    llama = resolve_model("llama-3.1-8b").spec
    first, second = llama.model_copy(), llama.model_copy()
    assert first is not second and first == second and hash(first) == hash(second) == hash(llama)
    # read from its file twice: two objects validated apart, one value (DeepSeek-V3: nested MoE and MLA specs)
    path = str(PRESETS / "models" / "deepseek-v3.yaml")
    one, other = resolve_model(path).spec, resolve_model(path).spec
    assert one is not other and one == other and hash(one) == hash(other)
    assert one.moe is not None and one.mla is not None
    # and rebuilt from its own fields
    rebuilt = ModelSpec.model_validate(llama.model_dump())
    assert rebuilt is not llama and rebuilt == llama and hash(rebuilt) == hash(llama)


def test_a_changed_spec_hashes_differently():
    llama = resolve_model("llama-3.1-8b").spec
    deeper = ModelSpec.model_validate({**llama.model_dump(), "num_layers": llama.num_layers + 1})  # validated
    assert deeper != llama and hash(deeper) != hash(llama)
    # a nested spec's change reaches its parent's hash
    deepseek = resolve_model("deepseek-v3").spec
    assert deepseek.moe is not None
    dumped = deepseek.model_dump()
    more_shared = ModelSpec.model_validate(
        {**dumped, "moe": {**dumped["moe"], "shared_experts": deepseek.moe.shared_experts + 1}}
    )
    assert more_shared != deepseek and hash(more_shared) != hash(deepseek)


def test_a_dead_specs_hash_is_forgotten():
    # _HASHES is keyed by id(): the entry must go with the spec, before its id can be given to another object
    spec = resolve_model("llama-3.1-8b").spec.model_copy()  # a fresh object no cache holds
    key = id(spec)
    assert key not in spec_base._HASHES
    hash(spec)
    assert key in spec_base._HASHES
    del spec
    gc.collect()
    assert key not in spec_base._HASHES


def test_a_spec_cannot_change_under_its_hash():
    llama = resolve_model("llama-3.1-8b").spec
    hash(llama)
    with pytest.raises(ValidationError):
        llama.num_layers = 1  # frozen
    # sequences are tuples, even when the preset file (or a caller) gives lists: none can be appended to
    given_lists = ModelSpec.model_validate({**llama.model_dump(), "aliases": ["a", "b"], "notes": ["n"]})
    assert given_lists.aliases == ("a", "b") and given_lists.notes == ("n",)
    adafactor = resolve_optimizer("adafactor").spec
    assert type(adafactor.states) is tuple and adafactor.states
    presets = (llama, resolve_hardware("H100").spec, resolve_precision("bf16-mixed").spec, adafactor)
    for spec in presets:
        for name, value in spec:
            assert not isinstance(value, list | set), f"{type(spec).__name__}.{name} is a {type(value).__name__}"


@pytest.mark.parametrize(
    ("kind", "name"),
    [(ModelSpec, "llama-3.1-8b"), (HardwareSpec, "H100"), (PrecisionRecipe, "bf16-mixed"), (OptimizerSpec, "adamw")],
)
def test_every_kind_of_spec_keys_a_dict_and_a_cache(kind, name):
    resolve = {
        ModelSpec: resolve_model,
        HardwareSpec: resolve_hardware,
        PrecisionRecipe: resolve_precision,
        OptimizerSpec: resolve_optimizer,
    }[kind]
    spec = resolve(name).spec
    assert isinstance(spec, kind)
    copy = spec.model_copy()
    assert {spec: "found"}[copy] == "found"

    calls = []

    @functools.lru_cache(maxsize=16)  # bounded, as the engine's caches are
    def cached(value):
        calls.append(value)
        return value.name

    # the engine memoises on specs: an equal spec is a hit, a different one a miss
    assert cached(spec) == cached(copy) == spec.name
    assert calls == [spec] and cached.cache_info().hits == 1
    other = kind.model_validate({**spec.model_dump(), "name": spec.name + "-other"})
    cached(other)
    assert len(calls) == 2


# Numbers and booleans are read strictly, field by field (issue #18, item 10): lax pydantic read the string "false"
# as False and true as 1, and a YAML file's yes, no and 1:30 reached it as booleans and 90


@pytest.mark.parametrize(
    ("kind", "name", "field", "wrong"),
    [
        (ModelSpec, "llama-3.1-8b", "num_layers", True),
        (ModelSpec, "llama-3.1-8b", "num_layers", "32"),
        (ModelSpec, "llama-3.1-8b", "mlp_bias", "false"),
        (ModelSpec, "llama-3.1-8b", "mlp_bias", 0),
        (ModelSpec, "llama-3.1-8b", "norms_per_layer", True),  # 1 (with parallel_block below)
        (ModelSpec, "llama-3.1-8b", "training_tokens", "15e12"),
        (HardwareSpec, "H100", "memory_bytes", "85899345920"),
        (HardwareSpec, "H100", "gpus_per_node", True),
        (PrecisionRecipe, "bf16-mixed", "param_bytes", True),
        (OptimizerSpec, "adamw", "states", [{"name": "m", "factored": "no"}]),
    ],
    ids=[
        "int-true",
        "int-text",
        "bool-text",
        "bool-int",
        "literal-true",
        "float-text",
        "bytes-text",
        "gpus-true",
        "float-true",
        "nested-bool-text",
    ],  # fmt: skip
)
def test_a_number_or_flag_of_the_wrong_type_is_refused(kind, name, field, wrong):
    spec = {ModelSpec: resolve_model, HardwareSpec: resolve_hardware, PrecisionRecipe: resolve_precision,
            OptimizerSpec: resolve_optimizer}[kind](name).spec  # fmt: skip
    with pytest.raises(ValidationError):
        kind.model_validate(
            {**spec.model_dump(), field: wrong} | ({"parallel_block": True} if kind is ModelSpec else {})
        )


def test_a_framework_profiles_counts_and_flags_are_strict_too():
    from lmcalc.framework_specs import FrameworkProfile
    from lmcalc.presets import resolve_framework

    megatron = resolve_framework("megatron").spec.model_dump()
    FrameworkProfile.model_validate(megatron)
    for rule, field, wrong in [("attention", "q_copies", True), ("attention", "q_copies", "2"),
                               ("rotary", "tables", "false"), ("buffers", "gathered_layers", 1.5)]:  # fmt: skip
        with pytest.raises(ValidationError):
            FrameworkProfile.model_validate({**megatron, rule: {**megatron[rule], field: wrong}})


def test_strict_fields_still_take_lists_and_whole_floats():
    # a file writes a tuple as a list and a big count as 80e9: neither is a type error
    h100 = resolve_hardware("H100").spec
    read = HardwareSpec.model_validate({**h100.model_dump(), "aliases": ["x"], "memory_bytes": 80e9, "notes": []})
    assert read.aliases == ("x",) and read.memory_bytes == 80_000_000_000 and type(read.memory_bytes) is int


def test_global_layers_by_index_where_no_period_says_them():
    # Flint's pattern at 12 layers: global in layers 0 and 1, every fourth from 5, and the last (i < 2 or i % 4 == 1 or
    # i == L − 1): 0, 1, 5, 9, 11; the other 7 attend over the window. At s = 256, w = 24 the causal convention's keys
    # average (5·(s+1)/2 + 7·k_w)/12 with k_w = (24·25/2 + 232·24)/256 (docs/formulas.md §3.6)
    from lmcalc.engine.model.flops import attended_keys

    fields = dict(name="flint-like", vocab_size=256, hidden_size=64, num_layers=12, num_heads=4, ffn_size=128,
                  max_seq_len=512, ffn_kind="swiglu", norm_kind="rmsnorm", tied_embeddings=False,
                  position_embedding="rope", sliding_window=24, global_layer_ids=[0, 1, 5, 9, 11])  # fmt: skip
    spec = ModelSpec.model_validate(fields)
    assert [i for i in range(12) if not spec.is_local_layer(i)] == [0, 1, 5, 9, 11]
    assert spec.local_layers == 7
    k_w = (24 * 25 / 2 + 232 * 24) / 256
    assert attended_keys(spec, 256, "causal") == pytest.approx((5 * 128.5 + 7 * k_w) / 12)
    with pytest.raises(ValidationError, match="global_every or global_layer_ids"):
        ModelSpec.model_validate(fields | {"global_every": 4})
    with pytest.raises(ValidationError, match="need a sliding_window"):
        ModelSpec.model_validate(fields | {"sliding_window": None})
