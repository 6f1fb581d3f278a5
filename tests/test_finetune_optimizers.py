"""The optimizers fine-tuners use, under LoRA, against the states the real optimizers allocate.

A small Llama is wrapped with PEFT's LoRA adapters (fp32, so that every optimizer keeps its own dtype), one step is
taken with the real optimizer on the CPU, and the bytes of every tensor it then holds per adapter (its ``step``
counter aside, as lmcalc's presets leave scalar bookkeeping out) must equal lmcalc's ``optimizer_state_bytes`` for
the same model, method and optimizer preset: bitsandbytes' 8-bit AdamW (1-byte states, an fp32 absmax per block of
256, a 256-entry fp32 map, and fp32 states for tensors under 4096 elements), its paged variants (paging is a CPU
fallback here; the bytes are the same), its 32-bit paged AdamW and Lion, and torch's Adafactor and AdamW. Two ranks
put the adapters on both sides of bitsandbytes' 4096-element threshold.
"""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
bnb = pytest.importorskip("bitsandbytes")

from lmcalc.engine.finetune.method import Method  # noqa: E402
from lmcalc.engine.parallel.states import optimizer_state_bytes  # noqa: E402
from lmcalc.hf_config import model_from_hf_config  # noqa: E402
from lmcalc.presets import resolve_optimizer, resolve_precision  # noqa: E402
from lmcalc.specs import ModelSpec  # noqa: E402

pytestmark = pytest.mark.torch

CONFIG = dict(vocab_size=512, hidden_size=256, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
              intermediate_size=512)  # fmt: skip
FP32 = resolve_precision("fp32").spec  # fp32 adapters: states in the optimizer's own dtype
OPTIMIZERS = {
    "adam-8bit": lambda p: bnb.optim.AdamW8bit(p, lr=1e-3),
    "paged-adamw-8bit": lambda p: bnb.optim.PagedAdamW8bit(p, lr=1e-3),
    "paged-adamw": lambda p: bnb.optim.PagedAdamW(p, lr=1e-3),
    "lion": lambda p: bnb.optim.Lion(p, lr=1e-4),
    "adafactor": lambda p: torch.optim.Adafactor(p, lr=1e-3),
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-3),
}


def held_by_the_optimizer(name: str, rank: int) -> int:
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(transformers.LlamaConfig(**CONFIG))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = peft.get_peft_model(model, peft.LoraConfig(r=rank, target_modules="all-linear"))
        trained = [p for p in model.parameters() if p.requires_grad]
        optimizer = OPTIMIZERS[name](trained)
        ids = torch.randint(0, CONFIG["vocab_size"], (1, 16))
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
    return sum(
        t.numel() * t.element_size()
        for state in optimizer.state.values()
        for key, t in state.items()
        if torch.is_tensor(t) and key != "step"
    )


@pytest.mark.parametrize("rank", [8, 64])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_optimizer_states_under_lora_equal_the_real_optimizers(name: str, rank: int):
    model = ModelSpec.model_validate(model_from_hf_config(transformers.LlamaConfig(**CONFIG).to_dict(), "llama", "x"))
    ours = optimizer_state_bytes(model, FP32, resolve_optimizer(name).spec, Method("lora", rank))
    assert ours == held_by_the_optimizer(name, rank)
