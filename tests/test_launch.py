"""Launch configs as their projects publish them (tests/data/launch, sources in its SOURCES.md), read into lmcalc's
settings. Each expected value is read off the file by hand, with the line it is on; a setting lmcalc cannot express
must be named by the file's own key, never dropped."""

from __future__ import annotations

from pathlib import Path

import pytest

from lmcalc.errors import LmcalcError
from lmcalc.launch import read
from lmcalc.specs import ModelSpec

DATA = Path(__file__).parent / "data" / "launch"

EXPECTED = {
    # megatron/llama3-8b-h100-fp8.sh: TP_SIZE=1 (l. 33), CP_SIZE=1, SEQ_LENGTH=8192 (l. 40), MICRO_BATCH_SIZE=1,
    # GLOBAL_BATCH_SIZE=128, --sequence-parallel (l. 120), --use-distributed-optimizer (l. 126): ZeRO-1,
    # DTYPE="fp8" (l. 39) adds "--fp8-format hybrid" (l. 108) with the default delayed recipe,
    # --train-samples 1953125000 × 8192 tokens = 16.0 T tokens
    "megatron/llama3-8b-h100-fp8.sh": {
        "framework": "megatron", "tp": 1, "cp": 1, "seq": 8192, "micro_batch": 1, "sequence_parallel": True,
        "zero": 1, "precision": "fp8-mixed", "fp8_param_gather": True, "grad_reduce_in_bf16": True,
        "global_batch": 128 * 8192, "tokens": 1_953_125_000 * 8192,
    },
    # megatron/gpt3-175b-distributed.sh: TP 8, PP 16 (l. 56-57), --fp16 (l. 47), micro-batch 1, global batch 1536
    # sequences of 2048 (l. 32-39), --train-iters 500000 (l. 41)
    "megatron/gpt3-175b-distributed.sh": {
        "framework": "megatron", "tp": 8, "pp": 16, "precision": "fp16-mixed", "seq": 2048, "micro_batch": 1,
        "global_batch": 1536 * 2048, "tokens": 500_000 * 1536 * 2048,
    },
    # megatron/mixtral-8x7b-distributed.sh: TP 1, PP 4, EP 8 (l. 83-85), the distributed optimizer (l. 86), bf16,
    # 256 sequences of 4096 a step for 500,000 steps, the alltoall dispatcher (l. 56)
    "megatron/mixtral-8x7b-distributed.sh": {
        "framework": "megatron", "tp": 1, "pp": 4, "ep": 8, "zero": 1, "precision": "bf16-mixed", "seq": 4096,
        "micro_batch": 1, "global_batch": 256 * 4096, "tokens": 500_000 * 256 * 4096, "moe_dispatcher": "alltoall",
    },
    # megatron/deepseek-v3-megatron-fsdp-sbatch.sh: TP=${TP:-1}, EP=${EP:-8}, MBS=${MBS:-4} (l. 24), GBS=${GBS:-2048}
    # (l. 25), selective recomputation of mlp moe mla_up_proj layernorm (l. 48-49), --train-samples 585937500;
    # USE_MEGATRON_FSDP=${USE_MEGATRON_FSDP:-1} (l. 17) adds --use-megatron-fsdp with the sharding strategy
    # optim_grads_params (l. 18, 142-143): parameters, gradients and optimizer state sharded, ZeRO-3; the flex
    # dispatcher with the HybridEP backend (l. 93-94)
    "megatron/deepseek-v3-megatron-fsdp-sbatch.sh": {
        "framework": "megatron", "tp": 1, "ep": 8, "cp": 1, "zero": 3, "micro_batch": 4, "seq": 4096,
        "recompute": "selective", "recompute_modules": "mlp,moe,mla_up_proj,layernorm",
        "global_batch": 2048 * 4096, "tokens": 585_937_500 * 4096, "precision": "bf16-mixed",
        "moe_dispatcher": "hybridep",
    },
    # deepspeed/axolotl-zero3-bf16-cpuoffload-all.json: stage 3, optimizer and parameters to the CPU, bf16 enabled
    "deepspeed/axolotl-zero3-bf16-cpuoffload-all.json": {
        "framework": "deepspeed", "zero": 3, "offload": "optimizer+params", "offload_device": "cpu",
        "precision": "bf16-mixed",
    },
    # deepspeed/axolotl-zero2.json: stage 2 with the optimizer offloaded to the CPU; bf16 and fp16 "auto"
    "deepspeed/axolotl-zero2.json": {"framework": "deepspeed", "zero": 2, "offload": "optimizer",
                                     "offload_device": "cpu"},  # fmt: skip
    # deepspeed/deepspeedexamples-pipeline-parallelism.json: train_micro_batch_size_per_gpu 8, an Adam optimizer
    "deepspeed/deepspeedexamples-pipeline-parallelism.json": {"framework": "deepspeed", "micro_batch": 8,
                                                              "optimizer": "adamw"},  # fmt: skip
    # torchtitan/llama3-70b.toml: llama3 70B, local_batch_size 8, seq_len 8192, FSDP over the rest (-1: ZeRO-3),
    # TP 8 (l. 41, with sequence parallelism, as torchtitan's TP plan shards the norms), full checkpointing (l. 54)
    "torchtitan/llama3-70b.toml": {
        "framework": "torchtitan", "tp": 8, "pp": 1, "cp": 1, "sequence_parallel": True, "zero": 3, "seq": 8192,
        "micro_batch": 8, "recompute": "full", "model": "llama-3.1-70b",
    },
    # torchtitan/llama3-405b.toml: as the 70B's with local_batch_size 2 and converters = ["float8"] (tensorwise)
    "torchtitan/llama3-405b.toml": {
        "framework": "torchtitan", "tp": 8, "pp": 1, "cp": 1, "sequence_parallel": True, "zero": 3, "seq": 8192,
        "micro_batch": 2, "recompute": "full", "precision": "fp8-current", "model": "llama-3.1-405b",
    },
    # torchtitan/llama3-8b.toml: local_batch_size 1, FSDP alone, selective checkpointing
    "torchtitan/llama3-8b.toml": {
        "framework": "torchtitan", "tp": 1, "pp": 1, "cp": 1, "zero": 3, "seq": 8192, "micro_batch": 1,
        "recompute": "selective", "model": "llama-3.1-8b",
    },
    # axolotl/llama3-8b-qlora.yml: adapter qlora, load_in_4bit, lora_r 32, lora_target_linear, sequence_len 4096,
    # micro_batch_size 2, gradient_accumulation_steps 4, optimizer paged_adamw_32bit, gradient checkpointing
    "axolotl/llama3-8b-qlora.yml": {
        "framework": "transformers", "method": "qlora", "lora_rank": 32, "lora_dropout": 0.05,
        "lora_targets": "all-linear", "seq": 4096, "micro_batch": 2, "grad_accum": 4, "optimizer": "paged-adamw",
        "recompute": "full", "precision": "bf16-mixed", "model": "llama-3-8b",
    },
    # llamafactory/qwen3-4b-qlora-sft-otfq.yaml: quantization_bit 4 over finetuning_type lora, lora_rank 8,
    # lora_target all, cutoff_len 2048, per-device batch 1, accumulation 8, bf16; gradient checkpointing, which
    # LLaMA-Factory turns on unless disable_gradient_checkpointing (hparams/model_args.py)
    "llamafactory/qwen3-4b-qlora-sft-otfq.yaml": {
        "framework": "transformers", "method": "qlora", "lora_rank": 8, "lora_targets": "all-linear", "seq": 2048,
        "micro_batch": 1, "grad_accum": 8, "precision": "bf16-mixed", "model": "qwen3-4b", "recompute": "full",
    },
    # trainer/zephyr-7b-sft-qlora.yaml: load_in_4bit with use_peft, lora_r 16 on seven projections,
    # max_seq_length 2048, per-device batch 4, accumulation 2, gradient checkpointing, bf16, Mistral 7B v0.1
    "trainer/zephyr-7b-sft-qlora.yaml": {
        "framework": "transformers", "method": "qlora", "lora_rank": 16, "lora_dropout": 0.05,
        "lora_targets": "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj", "seq": 2048, "micro_batch": 4,
        "grad_accum": 2, "recompute": "full", "precision": "bf16-mixed", "model": "mistral-7b",
    },
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_a_published_config_reads_as_its_lines_say(name):
    launch = read(str(DATA / name))
    found = launch.keywords()
    expected = EXPECTED[name]
    if isinstance(found.get("model"), ModelSpec):
        found["model"] = "built"
    assert {k: found.get(k) for k in expected} == expected
    # a key read is attributed to the file's own name for it
    for keyword in expected:
        assert launch.key_of(keyword), keyword


def test_every_published_config_is_read_without_a_manual_step():
    files = sorted(p for p in DATA.rglob("*") if p.is_file() and p.name != "SOURCES.md")
    assert len(files) >= 10  # the target: ten or more real configs across the kinds
    kinds = set()
    for path in files:
        launch = read(str(path))
        kinds.add(launch.kind)
        assert launch.settings, path
        said = " ".join(launch.notes())
        for unexpressed in launch.unexpressed:
            assert unexpressed.key in said  # every setting it could not express, by its own name
    assert kinds == {"megatron", "deepspeed", "torchtitan", "trainer", "axolotl", "llamafactory"}


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("megatron/llama3-8b-h100-fp8.sh", "--overlap-grad-reduce"),
        ("megatron/deepseek-v3-megatron-fsdp-sbatch.sh", "--multi-latent-attention"),
        ("deepspeed/axolotl-zero2.json", "bf16.enabled"),  # "auto": the Trainer fills it
        ("torchtitan/llama3-405b.toml", "parallelism.enable_async_tensor_parallel"),
        ("torchtitan/deepseek-v3-16b.toml", "model.name, model.flavor"),  # no preset of the 16B flavor
        ("axolotl/llama3-8b-lora-8bit.yml", "load_in_8bit"),
        ("axolotl/llama3.1-8b-alst-deepspeed-500k.yaml", "tiled_mlp"),
    ],
)
def test_what_lmcalc_cannot_express_is_named(name, key):
    launch = read(str(DATA / name))
    assert key in {u.key for u in launch.unexpressed}


def test_megatron_builds_the_model_from_its_shape_with_the_padded_vocabulary():
    # the Llama 3 script's shape (l. 57-71) is Llama 3 8B's, --vocab-size 128256 (l. 139/159), TP 1: a multiple of
    # 128 already, so the count is the preset's, 8,030,261,248 (HF meta-llama/Meta-Llama-3-8B)
    import lmcalc

    llama = read(str(DATA / "megatron/llama3-8b-h100-fp8.sh")).keywords()["model"]
    assert llama.vocab_size == 128256 and lmcalc.params(model=llama).total == 8_030_261_248
    # GPT-3 175B: GPT-2's 50,257 tokens padded to a multiple of 128 · TP 8 = 1,024: ⌈50257 / 1024⌉ · 1024 = 51,200
    gpt = read(str(DATA / "megatron/gpt3-175b-distributed.sh")).keywords()["model"]
    assert gpt.vocab_size == 51200
    # 96 layers of 12·h² + 13·h (h = 12,288), the padded embedding and 2,048 positions, the final norm: ≈ 174.6 B
    h, layers = 12288, 96
    by_hand = layers * (12 * h * h + 13 * h) + 51200 * h + 2048 * h + 2 * h
    assert lmcalc.params(model=gpt).total == by_hand


def test_a_tp_other_than_the_files_pads_the_vocabulary_for_it():
    # Megatron pads by the TP it runs with: under TP 4, ⌈50257 / 512⌉ · 512 = 99 · 512 = 50,688 (TP 1: 50,304)
    launch = read(str(DATA / "megatron/gpt3-175b-distributed.sh"))
    assert launch.model_for(4).vocab_size == 50688 and launch.model_for(1).vocab_size == 50304
    assert launch.model_for(8) is launch.keywords()["model"]  # the file's own TP: the model read
    assert "50,257 padded to 50,688 (a multiple of 128 × TP 4" in " ".join(launch.notes(4))
    assert launch.model_for(4).display_name == "gpt3-175b-distributed (Megatron-LM's shape flags)"


def test_a_vocabulary_divisor_below_one_is_refused(tmp_path):
    script = tmp_path / "args.sh"
    script.write_text("--num-layers 2 --hidden-size 64 --num-attention-heads 4 --make-vocab-size-divisible-by 0\n")
    with pytest.raises(LmcalcError, match="--make-vocab-size-divisible-by is 0; a whole number from 1"):
        read("megatron:" + str(script))


def test_a_config_that_points_to_a_deepspeed_config_reads_it(tmp_path):
    (tmp_path / "ds.json").write_text((DATA / "deepspeed/axolotl-zero3-bf16-cpuoffload-all.json").read_text())
    (tmp_path / "qlora.yml").write_text(
        "base_model: meta-llama/Llama-3.1-8B\nmicro_batch_size: 1\ndeepspeed: ds.json\n"
    )
    found = read(str(tmp_path / "qlora.yml")).keywords()
    assert found["zero"] == 3 and found["offload"] == "optimizer+params" and found["framework"] == "deepspeed"


def test_a_kind_can_be_named_and_text_read_from_standard_input():
    launch = read("deepspeed:-", text='{"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": 4}')
    assert launch.kind == "deepspeed" and launch.keywords()["zero"] == 2 and launch.source == "standard input"
    launch = read("megatron:-", text="--tensor-model-parallel-size 4 --micro-batch-size 2 --bf16")
    assert launch.keywords()["tp"] == 4 and launch.keywords()["precision"] == "bf16-mixed"


def test_megatrons_loss_fused_in_transformer_engine_takes_both_flags():
    # --cross-entropy-fusion-impl chooses the fused loss's kernel (megatron/training/arguments.py: native, the
    # default, or te); it runs only with --cross-entropy-loss-fusion, and native keeps the fp32 copy the profile counts
    both = read("megatron:-", text="--cross-entropy-loss-fusion --cross-entropy-fusion-impl te --bf16").keywords()
    assert both["te_cross_entropy"] is True
    for text in ("--cross-entropy-fusion-impl te --bf16", "--cross-entropy-loss-fusion --bf16",
                 "--cross-entropy-loss-fusion --cross-entropy-fusion-impl native --bf16"):  # fmt: skip
        assert "te_cross_entropy" not in read("megatron:-", text=text).keywords()


def test_megatrons_token_dispatcher_is_read_as_costed():
    # megatron/core/transformer/transformer_config.py: moe_token_dispatcher_type allgather (the default), alltoall or
    # flex, whose moe_flex_dispatcher_backend is deepep by default; --moe-enable-deepep, deprecated, means flex + deepep
    def dispatcher(text: str) -> object:
        return read("megatron:-", text=f"{text} --bf16").keywords().get("moe_dispatcher")

    assert dispatcher("--moe-token-dispatcher-type alltoall") == "alltoall"
    assert dispatcher("--moe-token-dispatcher-type flex") == "deepep"
    assert dispatcher("--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend hybridep") == "hybridep"
    assert dispatcher("--moe-token-dispatcher-type flex --moe-enable-deepep") == "deepep"
    assert dispatcher("--moe-flex-dispatcher-backend hybridep") is None  # the alltoall default is not its flex
    allgather = read("megatron:-", text="--moe-token-dispatcher-type allgather --bf16")
    assert "moe_dispatcher" not in allgather.keywords()
    assert "--moe-token-dispatcher-type" in {u.key for u in allgather.unexpressed}


@pytest.mark.parametrize(
    ("name", "text", "said"),
    [
        ("bad.json", '{"zero_optimization": {"stage": 3,}', "not JSON: Expecting property name"),
        ("bad.yaml", "base_model: x\n  adapter: [lora\n", "not YAML"),
        ("bad.toml", "[training]\nseq_len = = 3\n", "not TOML"),
        ("what.yaml", "colour: blue\n", "cannot tell which framework's config"),
        ("empty.json", "   \n", "is empty"),
        ("stage.json", '{"zero_optimization": {"stage": "three"}}', "a whole number belongs there"),
    ],
)
def test_a_malformed_config_is_one_line(tmp_path, name, text, said):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(LmcalcError) as error:
        read(str(path))
    assert said in str(error.value) and "\n" not in str(error.value)
    if name.startswith("bad.") and name != "bad.toml":
        assert "line" in str(error.value)


def test_a_file_that_is_not_there_or_too_large(tmp_path):
    with pytest.raises(LmcalcError, match="no such file"):
        read(str(tmp_path / "missing.json"))
    big = tmp_path / "big.json"
    big.write_text("{" + " " * (1024 * 1024) + "}")
    with pytest.raises(LmcalcError, match="at most 1,048,576"):
        read(str(big))


def test_what_the_frameworks_do_by_default_and_what_is_off():
    # axolotl's FSDP example with Liger's plugin: Liger's profile stays, and fsdp_config's fsdp_offload_params: true
    # offloads the parameters (and so the optimizer) to the CPU
    launch = read(str(DATA / "axolotl/llama3.1-8b-fft-liger-fsdp.yaml"))
    found = launch.keywords()
    assert found["framework"] == "liger" and found["zero"] == 3 and found["offload"] == "optimizer+params"
    # its lora_modules_to_save trains embed_tokens and lm_head in full: said, not dropped
    assert "lora_modules_to_save" in {u.key for u in read(str(DATA / "axolotl/llama3-8b-lora-8bit.yml")).unexpressed}
    # torchtitan's llama3-70b.toml says compile.enable = false: nothing to model, left alone
    titan = read(str(DATA / "torchtitan/llama3-70b.toml"))
    assert "compile.enable" not in {u.key for u in titan.unexpressed} and "compile.enable" in titan.ignored


def test_a_deepspeed_config_without_a_precision_trains_in_fp32():
    # DeepSpeedExamples' pipeline config has neither bf16 nor fp16: DeepSpeed trains in fp32
    assert read(str(DATA / "deepspeed/deepspeedexamples-pipeline-parallelism.json")).keywords()["precision"] == "fp32"


def test_lora_target_parameters_are_said_not_dropped(tmp_path):
    # axolotl's gpt-oss recipes name the experts' 3-D tensors with lora_target_parameters (PEFT's target_parameters);
    # lmcalc adapts the experts only as PEFT's module targets reach them (formulas §12.2), and says it leaves these out
    config = tmp_path / "gpt-oss-lora.yml"
    config.write_text(
        "base_model: openai/gpt-oss-20b\nadapter: lora\nlora_r: 8\nlora_target_modules: all-linear\n"
        'lora_target_parameters: ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]\nsequence_len: 2048\n'
    )
    launch = read(str(config))
    assert launch.keywords()["lora_targets"] == "all-linear"
    assert "lora_target_parameters" in {u.key for u in launch.unexpressed}
