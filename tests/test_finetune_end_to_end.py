"""A fine-tune from end to end (issue #32, item 7): ``train-time`` takes ``--offload`` as ``memory`` and ``plan`` do,
``plan`` says when its answer is offloaded, and the inputs table says what a fine-tune stores for the frozen base
and for what it trains, not the full-training recipe."""

import pytest

from lmcalc import api

pytestmark = pytest.mark.fast

LORA = ["-m", "llama-3.1-8b", "--gpus", "1xH100", "--method", "lora", "--dataset-tokens", "100M"]


def test_train_time_takes_offload_and_says_the_mfu_carries_it(lmcalc_run):
    plain = lmcalc_run(["train-time", *LORA, "--json"]).json
    offloaded = lmcalc_run(["train-time", *LORA, "--offload", "optimizer", "--json"])
    assert offloaded.code == 0, offloaded.err
    doc = offloaded.json
    # the time is FLOPs / (GPUs · peak · MFU): an offload changes none of them, so the days are the same
    assert doc["results"]["time"]["days"]["value"] == plain["results"]["time"]["days"]["value"]
    assert doc["inputs"]["offload"]["value"] == "optimizer to CPU"
    assert any(note.startswith("--offload optimizer: the FLOPs are the same") for note in doc["notes"])
    assert not any("--offload" in note for note in plain["notes"])


def test_train_time_refuses_an_unknown_offload_in_one_line(lmcalc_run):
    run = lmcalc_run(["train-time", *LORA, "--offload", "gpu"])
    assert run.code == 2 and len(run.err.strip().splitlines()) == 1
    assert "offload" in run.err and "optimizer" in run.err


def test_plan_says_its_answer_is_offloaded():
    common = dict(model="llama-3.1-8b", gpus="1xH100", seq=2048, global_batch="64K", method="lora", dataset_tokens="1M")
    offloaded = api.plan(**common, offload="optimizer")
    assert offloaded.report.headline[0].endswith(", with the optimizer offloaded to the CPU")
    assert "offloaded" not in api.plan(**common).report.headline[0]


def precision_origin(**settings) -> str:
    found = api.memory(model="llama-3.1-8b", gpus="1xH100", seq=2048, **settings)
    return next(i.origin for i in found.report.inputs if i.key == "precision")


def test_qlora_inputs_say_what_the_frozen_base_and_the_adapters_store():
    # NF4 (Dettmers et al. 2023 §3): 4 bits a weight, one 8-bit scale per block of 64, one fp32 constant per 256
    # blocks: 4 + 8/64 + 32/(64·256) = 4.1270 bits = 0.5159 B; the unquantised weights upcast to fp32 (PEFT's
    # prepare_model_for_kbit_training); the adapters under bf16-mixed: 2 + 2 + 4 + 2·4 B
    assert precision_origin(method="qlora") == (
        "frozen base: 0.5159 B a quantised weight (NF4 and its block scales), 4 B the others, nothing more; "
        "adapters: 2 B weights + 2 B grads + 4 B master + 4 B per optimizer state; matmuls at the bf16 peak"
    )
    # a pure bf16 model: the base in 2 B, PEFT's adapters in fp32 (weights, grads and AdamW's states alike)
    assert precision_origin(method="lora", precision="bf16-pure").startswith(
        "frozen base: 2 B a weight, nothing more; adapters: 4 B weights + 4 B grads + 0 B master + 4 B per"
    )
    assert precision_origin(method="full").startswith("2 B weights + 2 B grads + 4 B master")
