"""Random arguments to every command: the answer is output or one clear line, never a traceback."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lmcalc.cli import main

pytestmark = pytest.mark.slow

NUMBERS = st.sampled_from(
    ["seq=1k,4k", "micro-batch=1,2", "seq=", "1f1b", "interleaved"]
    + [
        "0",
        "-1",
        "1",
        "7",
        "4096",
        "1e30",
        "1e999",
        "nan",
        "inf",
        "1.5",
        "15T",
        "300B",
        "4M",
        "abc",
        "",
        "2GiB",
        "0.5",
        "-0.1",
        "1e-30",
        "99999999999999999999",
    ]
)
NAMES = st.sampled_from(
    [
        "llama-3-70b",
        "llama-70b",
        "gpt-3",
        "deepseek-v3",
        "mixtral-8x7b",
        "lama",
        "H100",
        "8xH100",
        "1024xH100",
        "128x8xH100",
        "0xH100",
        "8x",
        "x",
        "8xnothing",
        "adamw",
        "sgd",
        "adafactor",
        "fp32",
        "bf16-mixed",
        "tf32",
        "fp8-mixed",
        "/nonexistent.yaml",
        "flash",
        "eager",
        "full",
        "causal",
        "selective",
        "none",
        "A100",
        "V100",
        "tpu-v5p",
        "12x8",
    ]
)
VALUES = st.one_of(NUMBERS, NAMES, st.text(max_size=12))

COMMANDS = {
    "train-time": [
        "--model",
        "--gpus",
        "--tokens",
        "--mfu",
        "--precision",
        "--days",
        "--gpu",
        "--flops-basis",
        "--seq",
        "--price-per-gpu-hour",
    ],
    "max-params": [
        "--gpus",
        "--optimizer",
        "--precision",
        "--seq",
        "--micro-batch",
        "--attention",
        "--recompute",
        "--overhead",
        "--like",
    ],
    "flops": ["--model", "--tokens", "--seq", "--attn-flops", "--recompute"],
    "memory": [
        "--model",
        "--gpus",
        "--seq",
        "--micro-batch",
        "--zero",
        "--precision",
        "--optimizer",
        "--attention",
        "--recompute",
        "--overhead",
        "--dp",
        "--tp",
        "--pp",
        "--cp",
        "--ep",
        "--grad-accum",
        "--schedule",
        "--virtual-stages",
        "--sweep",
        "--sequence-parallel",
    ],
    "validate": ["--model", "--seq", "--micro-batch", "--recompute"],
    "optimal": ["--compute", "--gpus", "--days", "--mfu", "--tokens-per-param", "--precision"],
    "fit": ["--model", "--gpus", "--seq", "--tp", "--pp", "--zero", "--recompute", "--micro-batch"],
    "plan": ["--model", "--gpus", "--seq", "--global-batch", "--tp", "--zero", "--max-pp", "--efficiency"],
    "params": ["--model"],
    "tensor": [],
    "dtypes": [],
}


@st.composite
def argv(draw):
    command = draw(st.sampled_from(sorted(COMMANDS)))
    args = [command]
    if command == "tensor":
        args.append(draw(st.sampled_from(["4x8", "12288x49152", "0x3", "axb", "1e3x2", "7", ""])))
    for flag in draw(st.lists(st.sampled_from(COMMANDS[command] or ["--json"]), max_size=6, unique=True)):
        args += [flag, draw(VALUES)]
    if draw(st.booleans()):
        args.append(draw(st.sampled_from(["--json", "--explain"])))
    return args


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(args=argv())
def test_no_traceback_ever_escapes(args, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    _, err = capsys.readouterr()
    assert "Traceback" not in err
    assert "internal error" not in err, (args, err)
    if exit_info.value.code != 0:
        assert len(err.strip().splitlines()) == 1, (args, err)
        assert err.startswith("lmcalc: error: "), (args, err)
