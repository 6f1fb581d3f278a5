"""FLOPs of a fine-tuning step against ``FlopCounterMode`` on a real PEFT model.

Each case builds a small Hugging Face model on the CPU (fp32, eager attention, whose score and value products
``FlopCounterMode`` counts as matmuls: the full convention), freezes what the method freezes and adds PEFT's LoRA
adapters, runs one forward and backward of the loss under ``FlopCounterMode``, and compares the total with
``engine.finetune.flops`` for the same config: equal to rounding. Full training is the check that the count reduces to
3 × forward; the freeze cases freeze the embedding and the bottom layers by ``requires_grad_(False)``.
"""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from hf_small import lmcalc_model as model_of  # noqa: E402
from hf_small import small_config  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from lmcalc.engine.finetune.flops import method_step_flops  # noqa: E402
from lmcalc.engine.finetune.method import Method, parse_targets  # noqa: E402
from lmcalc.specs import ModelSpec  # noqa: E402

pytestmark = pytest.mark.torch

ARCHS = ("llama", "qwen2", "olmo2", "gpt2", "mixtral")
LAYERS = 3
LORA = {
    "llama": ["all-linear", "q_proj,v_proj", "gate_proj,up_proj,down_proj", "o_proj"],
    "qwen2": ["all-linear", "k_proj"],
    "olmo2": ["all-linear"],
    "gpt2": ["all-linear", "c_attn", "c_fc"],
    "mixtral": ["q_proj,k_proj,v_proj,o_proj", "v_proj"],
}
SEQ, BATCH = 64, 2
CASES = (
    [(arch, Method("lora", 8, parse_targets(t))) for arch, sets in LORA.items() for t in sets]
    + [(arch, Method()) for arch in ARCHS]
    + [(arch, Method("freeze", freeze_layers=n)) for arch in ("llama", "gpt2", "mixtral") for n in (1, 2)]
    # DoRA: B·A built from an identity every forward; with dropout PEFT recomputes W·dropout(x)
    + [
        (a, Method("lora", 8, parse_targets(t), d, dora=True))
        for a, t in (("llama", "all-linear"), ("llama", "q_proj,v_proj"), ("qwen2", "k_proj"))
        for d in (0.0, 0.1)
    ]  # fmt: skip
)


def counted(arch: str, method: Method, targets: str | None) -> float:
    torch.manual_seed(0)
    config = small_config(arch, LAYERS)
    config._attn_implementation = "eager"
    kwargs = {"experts_implementation": "eager"} if arch == "mixtral" else {}  # a loop of F.linear: counted
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager", **kwargs)
    if method.kind == "freeze":
        model.get_input_embeddings().requires_grad_(False)
        for name, p in model.named_parameters():
            parts = name.split(".")
            for i, part in enumerate(parts[:-1]):
                if part in ("layers", "h") and parts[i + 1].isdigit() and int(parts[i + 1]) < method.freeze_layers:
                    p.requires_grad_(False)
            if "wpe" in name:  # GPT-2's learned positions belong to the embedding
                p.requires_grad_(False)
    if method.adapters:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            modules = "all-linear" if targets == "all-linear" else targets.split(",")
            lora = peft.LoraConfig(
                r=method.lora_rank, target_modules=modules, lora_dropout=method.lora_dropout, use_dora=method.dora
            )
            model = peft.get_peft_model(model, lora)
    model.train()
    ids = torch.randint(0, config.vocab_size, (BATCH, SEQ))
    with FlopCounterMode(display=False) as counter:
        model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
    return counter.get_total_flops()


def lmcalc_model(arch: str) -> ModelSpec:
    return model_of(small_config(arch, LAYERS))


@pytest.mark.parametrize(("arch", "method"), CASES, ids=[f"{a}-{m.label}" for a, m in CASES])
def test_step_flops_equal_flop_counter_mode(arch: str, method: Method):
    targets = None
    if method.adapters:
        targets = next(t for t in LORA[arch] if parse_targets(t) == method.lora_targets)
    ours = method_step_flops(lmcalc_model(arch), method, SEQ, "none", "full", BATCH).model * SEQ * BATCH
    assert ours == pytest.approx(counted(arch, method, targets), rel=1e-12)


def test_lora_needs_about_two_thirds_of_full_training():
    # Hand derivation, Llama-3.1-8B shapes at s = 2048, LoRA r = 16 on every linear layer. Base matmuls: forward 2·N'
    # and input gradient 2·N' per token (N' = the 6.98e9 weights of the layers, plus the 2·h·V logits), no weight
    # gradient; attention 2·L·s·H·(d + d) forward, twice that backward; adapters 6·r·Σ(in + out). Full training:
    # 3 × (2·N' + 2·h·V + attention). The ratio is about (4·N' + ...)/(6·N' + ...) ≈ 0.69, below the 6N → 4N rule's
    # 0.667 by the attention core, which LoRA does not shrink.
    from lmcalc.engine.model.flops import step_flops
    from lmcalc.presets import resolve_model

    llama = resolve_model("llama-3.1-8b").spec
    lora = method_step_flops(llama, Method("lora", 16), 2048).model
    full = step_flops(llama, 2048).model
    layers = 32 * (2 * 4096 * (4096 + 1024 + 1024 + 4096) + 3 * 2 * 4096 * 14336)
    logits = 2 * 4096 * 128256
    attention = 32 * 2 * 2048 * 32 * 256
    adapters = 32 * 16 * 2 * ((4096 + 4096) * 2 + (4096 + 1024) * 2 + 2 * (4096 + 14336) + (14336 + 4096))
    # layer 0's Q, K, V and A-of-QKV take no input gradient: their input is the frozen embedding's output
    lowest = 2 * 4096 * (4096 + 1024 + 1024) + 16 * 2 * 4096 * 3
    expected = 2 * layers + logits * 2 + 3 * attention + 3 * adapters - lowest
    assert lora == pytest.approx(expected, rel=1e-12)
    assert 0.68 < lora / full < 0.70
