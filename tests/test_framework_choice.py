"""Which framework profile an estimate runs under, and the layouts a framework cannot launch (issue #29 item 4).

With no ``--framework``, the settings choose: LoRA and QLoRA are trained with transformers and PEFT; ZeRO-2 or
ZeRO-3 over data parallelism alone is a transformers model under DeepSpeed (the Trainer's way); everything else,
tensor, pipeline, context and expert parallelism among it, is Megatron-LM's, whose ZeRO-2 and ZeRO-3 are
Megatron-FSDP. A profile refuses what its framework cannot run: DeepSpeed's pipeline engine asserts ZeRO below 2
(deepspeed/runtime/pipe/engine.py), and ``plan`` never offers such a layout.
"""

import pytest

import lmcalc
from lmcalc.errors import LmcalcError


@pytest.mark.parametrize(
    ("settings", "framework"),
    [
        ({}, "megatron"),
        ({"zero": 1}, "megatron"),
        ({"zero": 2}, "deepspeed"),
        ({"zero": 3}, "deepspeed"),
        ({"zero": 3, "tp": 2}, "megatron"),  # Megatron-FSDP beside tensor parallelism
        ({"method": "lora"}, "transformers"),
        ({"method": "qlora", "zero": 3}, "transformers"),
        ({"zero": 3, "framework": "megatron"}, "megatron"),  # a named profile is kept
    ],
)
def test_the_settings_choose_the_profile(settings, framework):
    estimate = lmcalc.memory(model="llama-3.1-8b", gpus="8xH100", seq=2048, **settings)
    assert estimate.workload.framework.name == framework
    assumed = any("costed as" in line for line in estimate.report.headline)
    assert assumed == (framework == "deepspeed")  # the first lines say so where the layout chose it


def test_deepspeed_refuses_zero_2_and_3_beside_pipeline_parallelism():
    for zero in (2, 3):
        with pytest.raises(LmcalcError, match=f"does not run ZeRO-{zero} with pipeline parallelism \\(PP=2\\)"):
            lmcalc.memory(model="llama-3.1-8b", gpus="8xH100", framework="deepspeed", pp=2, zero=zero)
    assert lmcalc.memory(model="llama-3.1-8b", gpus="8xH100", framework="deepspeed", pp=2, zero=1).workload


def test_plan_offers_only_what_the_framework_runs():
    found = lmcalc.plan(model="llama-3.1-8b", gpus="16xH100", framework="deepspeed", seq=4096, global_batch="2M",
                        max_micro_batch=2)  # fmt: skip
    piped = [c.layout for c in found.layouts if c.layout.pp > 1]
    assert piped and all(layout.zero <= 1 for layout in piped)
    assert any(c.layout.zero == 3 for c in found.layouts if c.layout.pp == 1)  # ZeRO-3 stays where it runs


def test_a_lever_names_the_framework_that_runs_it():
    # deepspeed named, pipeline parallel: ZeRO-3 is not DeepSpeed's there, so the lever says what runs it
    fit = lmcalc.fit(model="llama-3.1-70b", gpus="8xH100", framework="deepspeed", pp=2)
    levers = [t.label for s in fit.report.sections if s.key == "levers" for t in s.terms]
    sharded = [label for label in levers if label.startswith("--zero 3") and "--tp" not in label]
    assert sharded and all("--framework megatron" in label for label in sharded)


def test_a_plan_that_searches_the_degrees_keeps_megatron():
    # --zero 3 pinned, TP/PP/CP/EP left to the search: they may not stay 1, so the layout is Megatron's (FSDP);
    # pinned to 1 they are data parallelism alone, a transformers model under DeepSpeed
    common = dict(model="llama-3.1-8b", gpus="16xH100", zero=3, seq=4096, global_batch="1M", max_micro_batch=2)
    searched = lmcalc.plan(**common)
    assert searched.best.layout.zero == 3
    pinned = lmcalc.plan(**common, tp=1, pp=1, cp=1, ep=1)
    assert searched.report.headline[-1].startswith("costed as") is False
    assert pinned.report.headline[-1].startswith("costed as deepspeed runs it")
