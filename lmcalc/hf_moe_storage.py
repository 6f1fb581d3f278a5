"""How transformers 5.24 stores each MoE type's router and routed experts, as PEFT 0.21 and bitsandbytes meet them.

transformers 5 keeps a layer's routed experts as 3-D tensors (its ``*Experts`` modules, ``gate_up_proj`` and
``down_proj`` of E × out × in), not as an ``nn.Linear`` per expert, and most routers as a bare weight (``*TopKRouter``).
LoRA's ``all-linear`` in PEFT takes ``nn.Linear`` modules only, and bitsandbytes' 4-bit loading replaces only them
(transformers' ``replace_with_bnb_linear``; bitsandbytes issue #1849), so the routed experts stay in the compute
dtype under QLoRA. PEFT reaches them through ``target_parameters`` where it maps a type's transformers-4 names onto
them (``peft/utils/transformers_weight_conversion.py``, ``_convert_peft_config_moe``). Both sets below were read off
PEFT 0.21.2 and transformers 5.24 on the meta device, a tiny model of each type (tests/test_moe_adapters.py checks
every one against PEFT's own count).
"""

from __future__ import annotations

MIXTRAL_NAMES = ("mixtral", "minimax", "minimax_m2")
QWEN2_MOE_NAMES = ("qwen3_moe", "qwen3_next", "deepseek_v2", "deepseek_v3", "deepseek_v32", "sarvam_mla", "glm4_moe",
                   "glm4_moe_lite", "glm_moe_dsa", "olmoe", "flex_olmo", "dots1", "ernie4_5_moe", "mellum",
                   "solar_open", "exaone_moe", "hunyuan_v1_moe", "cohere2_moe", "beam", "afmoe",
                   "longcat_flash")  # fmt: skip
PEFT_V4_NAMES = dict.fromkeys(MIXTRAL_NAMES, "mixtral") | dict.fromkeys(QWEN2_MOE_NAMES, "qwen2_moe")
"""The types whose experts and router PEFT's LoRA adapts, and whose transformers-4 names it maps them by: those its
MoE conversion covers (not qwen2_moe, whose own name its table lacks, nor types that reuse another's code under a
name of their own, as sarvam_moe)."""

ROUTER_LINEAR = frozenset(("llama4_text", "phimoe", "dbrx", "afmoe", "longcat_flash", "jetmoe", "gemma4_text", "zaya"))
"""The types whose router is an ``nn.Linear`` (Llama4Router, PhimoeRouter, DbrxRouter's layer, AFMoE's and LongCat's
gate and classifier, JetMoE's gating layer, Gemma 4's router projection)."""


def moe_storage(kind: str) -> dict[str, str | bool | None]:
    """The ``MoESpec`` fields that say how ``kind``'s reference implementation stores its router and experts."""
    return {"peft_v4_names": PEFT_V4_NAMES.get(kind), "router_linear": kind in ROUTER_LINEAR}
