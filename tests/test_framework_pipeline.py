"""A framework that cannot pipeline is offered no pipeline (issue #32, item 6: "offer no layout the framework cannot
run"). The Trainer trains through Accelerate, whose ParallelismConfig has no pipeline stages: under the transformers
and liger profiles, plan searches PP 1 only, and memory and a pinned plan refuse PP > 1 in the profile's words."""

import pytest

from lmcalc import api
from lmcalc.errors import LmcalcError
from lmcalc.presets import framework_profile

pytestmark = pytest.mark.fast

LORA = dict(model="llama-3.1-8b", gpus="8xH100", method="lora", dataset_tokens="100M")


@pytest.mark.parametrize(
    "name,pipelines",
    [("transformers", False), ("liger", False), ("megatron", True), ("deepspeed", True), ("torchtitan", True),
     ("nanotron", True)],
)  # fmt: skip
def test_which_profiles_pipeline(name, pipelines):
    assert framework_profile(name).parallelism.pipeline is pipelines


def test_plan_under_transformers_searches_no_pipeline():
    found = api.plan(**LORA)
    assert found.best.workload.framework.name == "transformers"
    assert {c.layout.pp for c in found.layouts} == {1}
    # the same search under a framework that pipelines tries stages too
    assert max(c.layout.pp for c in api.plan(**LORA, framework="deepspeed").layouts) > 1


def test_a_pinned_pipeline_is_refused_in_the_profiles_words():
    for call in (lambda: api.plan(**LORA, pp=2), lambda: api.memory(model="llama-3.1-8b", gpus="8xH100",
                                                                      method="lora", pp=2)):  # fmt: skip
        with pytest.raises(LmcalcError, match="trains without pipeline stages \\(pp 1\\)"):
            call()
