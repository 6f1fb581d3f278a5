"""A published checkpoint's stored tensors, rebuilt from lmcalc's count: what the count includes, what it leaves
out and why must add up to the publisher's totals exactly."""

from __future__ import annotations

from math import ceil

from lmcalc.engine.model.params import count_params, mtp_params, weight_tensors
from lmcalc.presets import resolve_model

FP8_BLOCK = 128  # DeepSeek-V3 §3.3.2: FP8 weights with one fp32 scale per 128 × 128 block


def test_deepseek_v3_checkpoint_equals_the_count_plus_what_it_leaves_out():
    """deepseek-ai/DeepSeek-V3's safetensors metadata (the Hub's ``?expand=safetensors``): 684,531,386,000 stored
    elements: BF16 3,918,786,560, F8_E4M3 680,571,043,840, F32 41,555,600. lmcalc counts 671.03B (the report's
    671B) and the MTP module apart; the checkpoint adds the MTP module with its own copies of the embedding and
    head, the router's balancing biases (fp32; a buffer, not a parameter) and one fp32 scale per FP8 block."""
    spec = resolve_model("deepseek-v3").spec
    moe = spec.moe
    assert moe is not None and spec.mtp_modules == 1
    h, V = spec.hidden_size, spec.vocab_size
    # FP8: the linear weights of the layers (the MTP module's MoE layer too); not the routers, embedding or head
    linears = [t for t in weight_tensors(spec) if t.matmul and t.group not in ("router", "head")]

    def mtp_copies(t) -> int:  # copies in one MoE layer; the MTP layer has no dense MLP
        if t.count_symbol.startswith("L_moe"):
            return t.count // spec.moe_layers
        return t.count // spec.num_layers if t.count_symbol == "L" else 0

    stored = {t.name: t.count + mtp_copies(t) for t in linears}
    fp8 = sum(t.numel * stored[t.name] for t in linears)
    scales = sum(ceil(t.shape[0] / FP8_BLOCK) * ceil(t.shape[1] / FP8_BLOCK) * stored[t.name] for t in linears)
    routing_biases = (spec.moe_layers + spec.mtp_modules) * moe.num_experts
    total = count_params(spec).total + mtp_params(spec) + 2 * V * h + routing_biases + scales

    assert total == 684_531_386_000
    assert scales + routing_biases == 41_555_600  # F32
    assert fp8 == 680_571_043_840  # F8_E4M3
    assert total - fp8 - scales - routing_biases == 3_918_786_560  # BF16: embeddings, head, norms, routers, eh_proj
