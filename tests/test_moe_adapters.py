"""LoRA and QLoRA on the MoE types of transformers 5.24, against PEFT and bitsandbytes themselves.

transformers 5 stores an MoE layer's routed experts as 3-D tensors (``*Experts``: ``gate_up_proj``, ``down_proj``),
and most routers as a bare weight. PEFT's ``all-linear`` matches ``nn.Linear`` modules only, and reaches the experts
through ``target_parameters`` where its MoE conversion maps the type's transformers-4 names onto them: then each
expert's gate and up get one adapter of rank 2r, down and the router one of rank r, and under Qwen2-MoE's names the
``nn.Linear`` layers called gate_proj, up_proj and down_proj (dense layers, shared experts) get none. lmcalc reads
which of this applies from the type (``lmcalc/hf_moe_storage.py``). Every MoE type lmcalc fine-tunes is built here on
the meta device at its tiny config (tests/hf_tiny.py) and wrapped by PEFT; the trainable parameters must be equal.

bitsandbytes' 4-bit loading replaces ``nn.Linear`` modules alone (transformers' ``replace_with_bnb_linear``), so the
routed experts stay in the compute dtype under QLoRA (bitsandbytes issue #1849): loaded in 4 bits on the CPU, a tiny
Mixtral keeps its experts in bf16, which lmcalc's QLoRA storage counts.
"""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from hf_tiny import TINY, tiny_config, transformers_model  # noqa: E402

from lmcalc.engine.finetune.method import (  # noqa: E402
    Method,
    adapted_modules,
    adapter_tensors,
    frozen_bytes_per_element,
    quantised,
)
from lmcalc.engine.model.params import weight_tensors  # noqa: E402
from lmcalc.errors import LmcalcError  # noqa: E402
from lmcalc.hf_config import model_from_hf_config  # noqa: E402
from lmcalc.specs import ModelSpec  # noqa: E402

pytestmark = pytest.mark.torch

RANK = 4
PEFT_REFUSES = {"nemotron_h": "PEFT refuses LoRA on Mamba's out_proj (its kernel reads the weight directly)"}


def _spec(kind: str) -> ModelSpec | None:
    try:
        return ModelSpec.model_validate(model_from_hf_config(tiny_config(kind), kind, kind))
    except (LmcalcError, ValueError):
        return None


MOE_TYPES = [k for k in TINY if (s := _spec(k)) and s.moe and not s.counted_only and k not in PEFT_REFUSES]


def peft_trainable(kind: str, **lora: object) -> int:
    model = transformers_model(tiny_config(kind))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        wrapped = peft.get_peft_model(model, peft.LoraConfig(r=RANK, **lora))
    return wrapped.get_nb_trainable_parameters()[0]


def lmcalc_adapters(kind: str, targets: tuple[str, ...] = ("all-linear",)) -> int:
    spec = _spec(kind)
    assert spec is not None
    return sum(t.total for t in adapter_tensors(spec, Method("lora", RANK, targets)))


def test_every_moe_type_lmcalc_fine_tunes_is_compared():
    """The list is the tiny configs' MoE types that training memory takes, not a hand-kept one: at least the 50 of
    2026-12-06, with the families people fine-tune among them."""
    assert len(MOE_TYPES) >= 50
    assert {"mixtral", "qwen3_moe", "deepseek_v3", "gpt_oss", "llama4_text", "olmoe", "qwen3_next"} <= set(MOE_TYPES)


@pytest.mark.parametrize("kind", MOE_TYPES)
def test_all_linear_adapters_equal_pefts(kind: str):
    assert lmcalc_adapters(kind) == peft_trainable(kind, target_modules="all-linear")


def test_mixtral_by_hand():
    """The tiny Mixtral (tests/hf_tiny.py): h = 64, 4 experts of f = 96, 8 query and 4 KV heads of 8 over 2 layers...
    read off its spec, and PEFT's adapters written out per layer at r = 4: q and o r·(h + h), k and v r·(h + 32); the
    router r·(h + E); the experts' fused gate and up 2r·E·(h + 2f), their down r·E·(f + h)."""
    spec = _spec("mixtral")
    assert spec is not None and spec.moe is not None
    h, f, e, kv = spec.hidden_size, spec.moe.expert_ffn_size, spec.moe.num_experts, spec.kv_heads * spec.head_size
    r = RANK
    per_layer = 2 * r * (h + h) + 2 * r * (h + kv) + r * (h + e) + 2 * r * e * (h + 2 * f) + r * e * (f + h)
    assert lmcalc_adapters("mixtral") == spec.num_layers * per_layer
    assert peft_trainable("mixtral", target_modules="all-linear") == spec.num_layers * per_layer


@pytest.mark.parametrize(
    ("kind", "hf_targets", "ours"),
    [
        ("mixtral", ["w1", "w3", "w2"], ("gate", "up", "down")),  # the experts alone, gate and up fused at 2r
        ("qwen3_moe", ["gate_proj", "up_proj", "down_proj"], ("gate", "up", "down")),
        ("deepseek_v3", ["gate_proj", "up_proj", "down_proj"], ("gate", "up", "down")),  # not its shared experts
        ("deepseek_v3", ["q_a_proj", "kv_b_proj"], ("q_a", "kv_b")),
        ("gpt_oss", ["q_proj", "v_proj"], ("q", "v")),
        ("qwen2_moe", ["gate_proj", "up_proj", "down_proj"], ("gate", "up", "down")),  # its shared expert alone
    ],
)
def test_named_targets_equal_pefts(kind: str, hf_targets: list[str], ours: tuple[str, ...]):
    assert lmcalc_adapters(kind, ours) == peft_trainable(kind, target_modules=hf_targets)


def test_half_of_a_fused_pair_is_refused_as_peft_refuses_it():
    with pytest.raises(ValueError, match="without also targeting"):
        peft_trainable("qwen3_moe", target_modules=["gate_proj", "down_proj"])
    with pytest.raises(LmcalcError, match="target both or neither"):
        lmcalc_adapters("qwen3_moe", ("gate", "down"))


def test_experts_only_targets_where_peft_cannot_reach_them_are_refused():
    """gpt-oss's experts are 3-D tensors PEFT does not convert: its targets match nothing there (PEFT: no module
    found), and lmcalc says so in one line."""
    with pytest.raises(ValueError):
        peft_trainable("gpt_oss", target_modules=["gate_up_proj", "down_proj"])
    with pytest.raises(LmcalcError, match="stores outside nn.Linear"):
        lmcalc_adapters("gpt_oss", ("gate", "up", "down"))


def test_dora_on_fused_experts_is_refused_as_peft_refuses_it():
    with pytest.raises(ValueError, match="use_dora"):
        peft_trainable("mixtral", target_modules="all-linear", use_dora=True)
    spec = _spec("mixtral")
    assert spec is not None
    with pytest.raises(LmcalcError, match="DoRA"):
        adapted_modules(spec, Method("lora", RANK, dora=True))


def test_qlora_leaves_fused_experts_unquantised_as_bitsandbytes_does(tmp_path, monkeypatch):
    """A tiny Mixtral saved in bf16 and loaded in 4 bits on the CPU: the attention's linear weights become
    Params4bit, the router and the 3-D experts stay bf16 Parameters, and peft.prepare_model_for_kbit_training casts
    them to fp32. lmcalc's ``quantised`` picks the same tensors, and its QLoRA bytes per element are 4 for the
    experts (``kbit_upcast``, the default) and the recipe's 2 without the cast."""
    pytest.importorskip("bitsandbytes")
    tqdm = pytest.importorskip("tqdm")
    # transformers' save and load bars would start tqdm's monitor thread, which outlives the test (and a later
    # search refuses to fork beside other threads: tests/test_plan_workers.py)
    monkeypatch.setattr(tqdm.tqdm, "monitor_interval", 0)
    config = transformers.AutoConfig.for_model(**tiny_config("mixtral"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        transformers.AutoModelForCausalLM.from_config(config).to(torch.bfloat16).save_pretrained(tmp_path)
        quantization = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                                       bnb_4bit_use_double_quant=True)  # fmt: skip
        loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, quantization_config=quantization,
                                                                   device_map="cpu")  # fmt: skip
    four_bit = {
        name.split("layers.0.")[-1]
        for name, p in loaded.named_parameters()
        if "layers.0." in name and type(p).__name__ == "Params4bit"
    }
    assert four_bit == {f"self_attn.{p}_proj.weight" for p in "qkvo"}
    experts = [p for name, p in loaded.named_parameters() if name.endswith(("gate_up_proj", "down_proj"))]
    assert {p.dtype for p in experts} == {torch.bfloat16}
    prepared = peft.prepare_model_for_kbit_training(loaded)
    experts = [p for name, p in prepared.named_parameters() if name.endswith(("gate_up_proj", "down_proj"))]
    assert {p.dtype for p in experts} == {torch.float32}
    spec = _spec("mixtral")
    assert spec is not None
    ours = {t.name for t in weight_tensors(spec) if quantised(t)}
    assert ours == {f"attn.{p}.weight" for p in "qkvo"}
    routed = [t for t in weight_tensors(spec) if t.group == "experts"]
    assert {frozen_bytes_per_element(Method("qlora"), t, 2.0) for t in routed} == {4.0}
    assert {frozen_bytes_per_element(Method("qlora", kbit_upcast=False), t, 2.0) for t in routed} == {2.0}
