"""The Python API: one keyword-only function per command, typed figures, and ``to_dict()`` equal to the command's
``--json`` document (the command line calls the same functions)."""

import json

import pytest

import lmcalc
from lmcalc.cli import main
from lmcalc.cli.app import error_message
from lmcalc.errors import LmcalcError
from lmcalc.presets import parse_cluster, resolve_model

LLAMA_8B = 8_030_261_248  # meta-llama/Llama-3.1-8B safetensors total
LLAMA_70B = 70_553_706_496


def cli_json(args: str, capsys) -> dict:
    with pytest.raises(SystemExit) as exit_info:
        main([*args.split(), "--json"])
    out, err = capsys.readouterr()
    assert exit_info.value.code == 0, err
    return json.loads(out)


SAME_AS_THE_COMMAND = [
    ("params --model deepseek-v3", lambda: lmcalc.params(model="deepseek-v3")),
    (
        "flops --model llama-3-70b --tokens 15T --seq 8K --recompute selective",
        lambda: lmcalc.flops(model="llama-3-70b", tokens="15T", seq="8K", recompute="selective"),
    ),
    (
        "train-time --model llama-3-70b --gpus 1024xH100 --tokens 15T --mfu 0.5",
        lambda: lmcalc.train_time(model="llama-3-70b", gpus="1024xH100", tokens="15T", mfu=0.5),
    ),
    (
        "train-time --model llama-3-70b --days 30 --gpu H100 --price-per-gpu-hour 2",
        lambda: lmcalc.train_time(model="llama-3-70b", days=30, gpu="H100", price_per_gpu_hour=2),
    ),
    (
        "memory --model llama-3-70b --gpus 4x8xH100 --tp 8 --pp 4 --sequence-parallel --grad-accum 8",
        lambda: lmcalc.memory(model="llama-3-70b", gpus="4x8xH100", tp=8, pp=4, sequence_parallel=True, grad_accum=8),
    ),
    (
        "memory --model llama-3.1-405b --gpus 16x8xH100 --tp 8 --pp 16 --grad-accum 16 --schedule interleaved "
        "--virtual-stages 2 --stages",
        lambda: lmcalc.memory(
            model="llama-3.1-405b",
            gpus="16x8xH100",
            tp=8,
            pp=16,
            grad_accum=16,
            schedule="interleaved",
            virtual_stages=2,
            stages=True,
        ),
    ),
    (
        "memory --model llama-3.1-8b --gpus 8xH100 --zero 3 --sweep seq=1k,4k",
        lambda: lmcalc.memory_sweep(model="llama-3.1-8b", gpus="8xH100", zero=3, sweep="seq=1k,4k"),
    ),
    (
        "memory --model llama-3.1-8b --inference --batch 32 --context 8K",
        lambda: lmcalc.inference(model="llama-3.1-8b", batch=32, context="8K"),
    ),
    (
        "fit --model llama-3.1-8b --gpus 8xH100 --zero 3 --seq 8192",
        lambda: lmcalc.fit(model="llama-3.1-8b", gpus="8xH100", zero=3, seq=8192),
    ),
    (
        "plan --model llama-3-70b --gpus 8x8xH100 --seq 4096 --tp 8 --zero 1 --top all",  # the API ranks them all
        lambda: lmcalc.plan(model="llama-3-70b", gpus="8x8xH100", seq=4096, tp=8, zero=1),
    ),
    ("max-params --gpus 8xH100", lambda: lmcalc.max_params(gpus="8xH100")),
    ("optimal --compute 1e24", lambda: lmcalc.optimal(compute="1e24")),
    (
        "optimal --gpus 1024xH100 --days 30 --mfu 0.5",
        lambda: lmcalc.optimal(gpus="1024xH100", days=30, mfu=0.5),
    ),
    ("tensor 12288x49152 --dtype bf16", lambda: lmcalc.tensor(shape="12288x49152", dtype="bf16")),
    ("dtypes", lambda: lmcalc.dtypes()),
]


@pytest.mark.parametrize(("command", "call"), SAME_AS_THE_COMMAND, ids=[c.split()[0] for c, _ in SAME_AS_THE_COMMAND])
def test_to_dict_is_the_commands_json(command, call, capsys):
    assert call().to_dict() == cli_json(command, capsys)


def test_figures_are_typed_attributes():
    # Llama 3 70B on 1024 H100s, 15T tokens at MFU 0.5: 6 · N · D / (1024 · 989.5e12 FLOP/s · 0.5) seconds
    # (H100 SXM dense bf16: 1,979 TFLOP/s with sparsity / 2 = 989.5).
    time = lmcalc.train_time(model="llama-3-70b", gpus="1024xH100", tokens="15T", mfu=0.5)
    seconds = 6 * LLAMA_70B * 15e12 / (1024 * 989.5e12 * 0.5)
    assert time.days == pytest.approx(seconds / 86_400, rel=1e-12)
    assert time.gpu_hours == pytest.approx(1024 * seconds / 3600, rel=1e-12)
    assert lmcalc.params(model="llama-3.1-8b").total == LLAMA_8B
    # ZeRO-3 over 64 GPUs with mixed-precision AdamW: 16 bytes per parameter, sharded 64 ways (ZeRO §5.1); Megatron
    # keeps fp32 gradients (main_grad): 2 + 4 + 4 + 8 = 18 bytes, the 18 of its theoretical_memory_usage.py.
    memory = lmcalc.memory(model="llama-3.1-8b", gpus="64xH100", zero=3, framework="idealised")
    assert memory.gpu.states == pytest.approx(16 * LLAMA_8B / 64, rel=1e-12)
    memory = lmcalc.memory(model="llama-3.1-8b", gpus="64xH100", zero=3, framework="megatron")
    assert memory.workload.framework.name == "megatron"
    assert memory.gpu.states == pytest.approx(18 * LLAMA_8B / 64, rel=1e-12)
    assert memory.layout.dp == 64 and memory.workload.seq_len == 8192  # min(context 131,072, 8192)
    assert memory.fits and memory.total == memory.value("total.total")
    # no framework named: ZeRO-3 over data parallelism alone is a transformers model under DeepSpeed, whose bf16
    # gradients make it the 16 bytes of ZeRO §5.1 again
    assumed = lmcalc.memory(model="llama-3.1-8b", gpus="64xH100", zero=3)
    assert assumed.workload.framework.name == "deepspeed"
    assert assumed.gpu.states == pytest.approx(16 * LLAMA_8B / 64, rel=1e-12)
    assert "costed as deepspeed runs it" in assumed.report.headline[1]


def test_a_plans_layouts_are_objects_in_rank_order():
    found = lmcalc.plan(model="llama-3-70b", gpus="8x8xH100", seq=4096, tp=8, zero=1)
    speeds = [c.tokens_per_s for c in found.layouts]
    assert speeds == sorted(speeds, reverse=True)
    assert all(c.tp == 8 and c.zero == 1 and c.dp * c.tp * c.pp * c.cp == 64 for c in found.layouts)
    # the first row of the report is the best layout, by its label
    assert found.report.sections[0].title.startswith(f"1. {found.best.layout.code} mb{found.best.micro_batch} ")
    # every layout is ranked: a row each, or among the ties of a row (issue #32)
    assert len(found.layouts) == sum(1 + len(dict(s.details)["tied"]) for s in found.report.sections)


def test_specs_are_taken_as_they_are():
    spec, cluster = resolve_model("llama-3.1-8b").spec, parse_cluster("8xH100")
    by_name = lmcalc.memory(model="llama-3.1-8b", gpus="8xH100", zero=3)
    by_spec = lmcalc.memory(model=spec, gpus=cluster, zero=3)
    assert by_spec.total == by_name.total


def test_errors_name_the_keyword_and_the_command_line_names_the_flag():
    with pytest.raises(LmcalcError) as raised:
        lmcalc.memory(model="llama-3-70b", gpus="8x8xH100", tp=8, pp=4, grad_accum=16, schedule="interleaved")
    assert str(raised.value) == "the interleaved schedule needs virtual_stages 2 or more (1 is plain 1F1B)"
    assert error_message(raised.value) == "the interleaved schedule needs --virtual-stages 2 or more (1 is plain 1F1B)"
    with pytest.raises(LmcalcError) as raised:
        lmcalc.memory(model="llama-3.1-405b", gpus="16xH100", pp=16, account_for_loss_in_pipeline_split=True)
    assert str(raised.value).startswith("with account_for_loss_in_pipeline_split, the 126 layers + 1 = 127")
    assert error_message(raised.value).startswith("with --account-for-loss-in-pipeline-split, the 126 layers")
    with pytest.raises(LmcalcError, match="did you mean llama-3-70b"):
        lmcalc.flops(model="lama-3-70b")


def test_the_package_loads_the_api_only_when_asked():
    with pytest.raises(AttributeError, match="no attribute 'estimate'"):
        lmcalc.estimate  # noqa: B018 - the argv-building wrapper is gone


MISSPELT = [
    ("memory", dict(model="llama-3.1-8b", gpus="8xH100", zeros=3), "zeros"),
    ("memory", dict(model="llama-3.1-8b", gpus="8xH100", zerro=3), "zerro"),
    ("fit", dict(model="llama-3.1-8b", tensor_parallel=2), "tensor_parallel"),
    ("fit", dict(model="llama-3.1-8b", zerro=3), "zerro"),
    ("memory_sweep", dict(model="llama-3.1-8b", sweep="seq=1k,2k", zerro=3), "zerro"),
    ("plan", dict(model="llama-3.1-8b", gpus="8xH100", zerro=3), "zerro"),
    # plan takes the pipeline split as **split: a layout setting it searches instead is refused like a misspelling
    ("plan", dict(model="llama-3.1-8b", gpus="8xH100", grad_accum=4), "grad_accum"),
    ("report", dict(model="llama-3.1-8b", gpus="8xH100", zerro=3), "zerro"),
]


@pytest.mark.parametrize(("function", "kwargs", "misspelt"), MISSPELT, ids=[f"{f}-{m}" for f, _, m in MISSPELT])
def test_a_misspelt_setting_is_refused_as_python_refuses_it(function, kwargs, misspelt):
    # memory, memory_sweep, fit, plan and report take their workload, layout or split settings as **settings: a
    # keyword none of them has must not be dropped silently, and is refused in Python's own words
    with pytest.raises(TypeError) as raised:
        getattr(lmcalc, function)(**kwargs)
    assert str(raised.value) == f"{function}() got an unexpected keyword argument '{misspelt}'"
