"""Issue #18 item 11: ``plan`` on GPUs without the precision's dtype (V100: no bf16; TPU v4: no fp8) gave
``internal error: KeyError: 'bf16'``; it must give the one-line message ``train-time`` gives, naming the dtypes the
spec sheet has."""

from __future__ import annotations

import pytest

from lmcalc.cli import main


@pytest.mark.parametrize(
    "args, message",
    [
        ("plan -m llama-3-8b --gpus 8xV100", "v100 has no bf16 peak on its spec sheet (it has: fp64, fp32, fp16)"),
        ("plan -m llama-3-8b --gpus 8xtpu-v4 --precision fp8-mixed", "tpu-v4 has no fp8 peak on its spec sheet"),
        ("train-time -m llama-3-8b --gpus 8xV100", "v100 has no bf16 peak on its spec sheet"),
    ],
)
def test_a_gpu_without_the_dtype_is_one_clear_line(args, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(args.split())
    err = capsys.readouterr().err
    assert exit_info.value.code != 0
    assert message in err and "internal error" not in err and "Traceback" not in err
    assert err.strip().count("\n") == 0
