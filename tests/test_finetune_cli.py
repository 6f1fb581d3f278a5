"""Fine-tuning from the command line: the three questions the tutorial answers, the flags, and bad input."""

from __future__ import annotations

import json

import pytest

from lmcalc.cli import main


def run(args: str, capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(args.split())
    out, err = capsys.readouterr()
    return exit_info.value.code, out, err


def run_json(args: str, capsys) -> dict:
    code, out, err = run(args + " --json", capsys)
    assert code == 0, err
    return json.loads(out)


def value(doc: dict, section: str, term: str) -> float:
    return doc["results"][section][term]["value"]


def test_qlora_on_a_24gb_card_fits_with_checkpointing(capsys):
    doc = run_json("fit --model llama-3.1-8b --method qlora --gpus 1xRTX4090 --seq 2048", capsys)
    assert doc["inputs"]["framework"]["value"] == "transformers"  # adapters default to the PEFT stack
    longest = value(doc, "checkpointed", "seq")
    batch = value(doc, "checkpointed", "micro_batch")
    assert longest >= 2048 and batch >= 1
    # the answer holds in 'memory': the longest sequence with checkpointing fits, 128 tokens more does not
    at = run_json(
        f"memory -m llama-3.1-8b --method qlora --gpus 1xRTX4090 --recompute full --seq {int(longest)}", capsys
    )
    beyond = run_json(
        f"memory -m llama-3.1-8b --method qlora --gpus 1xRTX4090 --recompute full --seq {int(longest) + 128}", capsys
    )
    rtx_4090 = 25_250_627_584  # what CUDA gives a process on an RTX 4090 under Linux: deviceQuery's 24081 MBytes
    assert value(at, "total", "total") <= rtx_4090 < value(beyond, "total", "total")


def test_memory_of_lora_qlora_and_full_fine_tuning(capsys):
    base = "memory -m llama-3.1-8b --gpus 1xA100 --seq 2048 --framework idealised"
    full = run_json(base, capsys)
    lora = run_json(base + " --method lora", capsys)
    qlora = run_json(base + " --method qlora", capsys)
    # full fine-tuning: 16 B per parameter; LoRA: 2 B of frozen weights and 16 B per adapter parameter; QLoRA: about
    # half a byte per quantised weight
    assert value(full, "state", "total") == pytest.approx(16 * 8_030_261_248)
    assert value(lora, "state", "total") == pytest.approx(2 * 8_030_261_248 + 16 * 41_943_040)
    assert value(qlora, "state", "total") < value(lora, "state", "total") / 1.8
    assert value(lora, "method", "method") == 41_943_040


def test_full_fine_tuning_with_zero_offload(capsys):
    doc = run_json("memory -m llama-3.1-8b --gpus 8xA100 --zero 3 --offload optimizer --seq 2048", capsys)
    assert value(doc, "state", "master") == value(doc, "state", "optimizer") == 0
    assert value(doc, "method", "offloaded_per_node") == pytest.approx(8 * value(doc, "method", "offloaded"))


def test_fine_tune_time_counts_dataset_tokens_times_epochs(capsys):
    doc = run_json("train-time -m llama-3.1-8b --gpus 1xH100 --method lora --dataset-tokens 100M --epochs 3", capsys)
    assert doc["inputs"]["tokens"]["value"] == 3e8
    # 4·N + 6·N_adapters per token (engine.finetune.flops.napkin_method_flops)
    assert value(doc, "flops", "training_flops") == pytest.approx((4 * 8_030_261_248 + 6 * 41_943_040) * 3e8)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ("train-time -m llama-3.1-8b --gpus 1xH100 --method lora", "--dataset-tokens"),
        ("memory -m llama-3.1-8b --method lora --lora-targets c_attn", "matches no linear layer"),
        ("memory -m llama-3.1-8b --method lora --lora-targets wq", "unknown LoRA target 'wq'"),
        ("memory -m llama-3.1-8b --method freeze", "--freeze-layers"),
        ("memory -m llama-3.1-8b --method freeze --freeze-layers 32", "at least one of the 32"),
        ("memory -m llama-3.1-8b --offload optimizer+params", "--zero 3"),
        ("memory -m llama-3.1-8b --method dora", "--method must be one of"),
        ("max-params --gpus 1xH100 --method freeze --freeze-layers 4", "freeze"),
    ],
)
def test_bad_fine_tuning_input_is_one_clear_line(args, message, capsys):
    code, out, err = run(args, capsys)
    assert code == 2
    assert message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_plan_and_max_params_take_the_method(capsys):
    plan = run_json(
        "plan -m llama-3.1-8b --gpus 8xA100 --method qlora --dataset-tokens 50M --global-batch 64K --top 1", capsys
    )
    assert plan["results"]
    limits = run_json("max-params --gpus 1xRTX4090 --method qlora --seq 1024", capsys)
    full = run_json("max-params --gpus 1xRTX4090 --seq 1024", capsys)
    assert value(limits, "zero0", "with_activations") > 4 * value(full, "zero0", "with_activations")


def test_qlora_on_an_moe_says_its_experts_stay_unquantised(capsys):
    # Qwen3-30B-A3B's routed experts by hand: 48 layers × 128 experts × 3 matrices of 2,048 × 768 =
    # 28,991,029,248 weights, which bitsandbytes leaves out of its 4-bit loading (transformers 5 stores them as 3-D
    # tensors; tests/test_moe_adapters.py) and prepare_model_for_kbit_training casts to fp32: 4 B each, 115.96 GB;
    # in NF4 they would take 4.127 bits each, 14.96 GB. The note says so in memory and in fit, and the model states
    # hold them at 4 B.
    experts = 48 * 128 * 3 * 2048 * 768
    assert experts == 28_991_029_248
    for command in ("memory", "fit"):
        doc = run_json(f"{command} -m qwen3-30b-a3b --method qlora --gpus 1xRTX4090 --seq 1024", capsys)
        note = next(n for n in doc["notes"] if n.startswith("QLoRA on an MoE"))
        assert "28,991,029,248" in note and "116.0 GB" in note and "15.0 GB" in note
    doc = run_json("memory -m qwen3-30b-a3b --method qlora --gpus 1xRTX4090 --seq 1024 --no-kbit-upcast", capsys)
    assert "58.0 GB" in next(n for n in doc["notes"] if n.startswith("QLoRA on an MoE"))
    dense = run_json("memory -m llama-3.1-8b --method qlora --gpus 1xRTX4090 --seq 1024", capsys)
    assert not [n for n in dense["notes"] if n.startswith("QLoRA on an MoE")]


def test_qlora_on_an_moe_offers_its_experts_in_the_compute_dtype(capsys):
    # the lever --no-kbit-upcast keeps the unquantised experts at 2 B, not fp32's 4: what memory says with that flag
    fit = run_json("fit -m qwen3-30b-a3b --method qlora --gpus 1xRTX4090 --seq 2048", capsys)
    levers = {t["label"]: t["value"] for t in fit["results"]["levers"].values()}
    assert "--no-kbit-upcast" in levers
    memory = run_json("memory -m qwen3-30b-a3b --method qlora --gpus 1xRTX4090 --seq 2048 --no-kbit-upcast", capsys)
    assert levers["--no-kbit-upcast"] == memory["results"]["total"]["total"]["value"]
    code, out, _ = run("memory -m qwen3-30b-a3b --method qlora --gpus 1xRTX4090 --seq 2048", capsys)
    assert "try --no-kbit-upcast" in " ".join(out.split())
