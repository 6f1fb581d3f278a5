"""Issue #18 item 4, help for a user who is stuck: ``memory --inference`` says the fewest of ``--gpus`` the
weights and the cache fit (issue #32: it answers for the GPUs given), and ``--sweep`` sweeps the ZeRO stage and the
parallel degrees."""

from __future__ import annotations

import pytest

from lmcalc import api
from lmcalc.cli import main
from lmcalc.errors import LmcalcError
from lmcalc.estimates.memory import memory_sweep
from lmcalc.estimates.serving import inference
from lmcalc.units import GB


def test_inference_names_the_fewest_gpus_the_weights_fit():
    # Llama 3 70B in bf16: 141.1 GB of weights; with the 2 GiB allowance, TP=1 needs 143.3 GB > 80 GB, TP=2 needs
    # 70.6 + 2.1 + the cache of one 8K sequence (80 · 2 · 4 · 128 · 2 B · 8,192 = 1.34 GB) = 74.0 GB <= 80 GB: two
    # of the eight. Since issue #32 the answer is for the eight GPUs given, and the fewest is its last line.
    served = inference(model="llama-3-70b", gpus="8xH100")
    assert served.serving.tp == 8
    assert served.report.headline[-1] == "it would fit on as few as 2 GPUs (TP=2), 74.04 GB per GPU"
    assert 141.1 * GB / 2 < 80 * GB < 141.1 * GB
    assert (
        inference(model="llama-3.1-8b", gpus="8xH100")
        .report.headline[-1]
        .startswith("it would fit on as few as one GPU")
    )
    assert inference(model="llama-3.1-405b", gpus="8xH100", weights_dtype="fp8").serving.tp == 8


def test_an_explicit_tp_is_kept_and_one_gpu_still_says_by_how_much(capsys):
    with pytest.raises(LmcalcError, match="the weights alone do not fit"):
        inference(model="llama-3-70b", gpus="8xH100", tp=1)
    with pytest.raises(SystemExit):
        main(["memory", "-m", "llama-3-70b", "--inference", "--gpus", "1xH100"])
    # 70,553,706,496 bf16 weights (141.11 GB) + the 2 GiB allowance − an H100's 85,028,896,768 bytes as CUDA gives them
    short = 2 * 70_553_706_496 + 2 * 2**30 - 85_028_896_768
    assert f"short by {short / 1e9:.2f} GB" in capsys.readouterr().err and f"{short / 1e9:.2f}" == "58.23"


def test_sweep_over_zero_stages_equals_memory_at_each():
    swept = memory_sweep(sweep="zero=0,1,2,3", model="llama-3-8b", gpus="8xH100")
    for value, row in swept.rows:
        alone = api.memory(model="llama-3-8b", gpus="8xH100", zero=int(value))
        assert row.total == alone.total
    totals = [row.total for _, row in swept.rows]
    assert totals == sorted(totals, reverse=True)  # every stage shards more


def test_sweep_over_tp():
    swept = memory_sweep(sweep="tp=1,2,4,8", model="llama-3-70b", gpus="8xH100")
    assert [row.layout.tp for _, row in swept.rows] == [1, 2, 4, 8]


@pytest.mark.parametrize("text", ["zero=4", "zero=-1", "tp=0", "layers=1,2"])
def test_a_bad_sweep_is_one_line(text, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["memory", "-m", "llama-3-8b", "--gpus", "8xH100", "--sweep", text])
    err = capsys.readouterr().err
    assert exit_info.value.code != 0 and err.count("\n") == 1 and "--sweep" in err


def test_train_time_days_takes_the_gpu_type_from_gpus():
    by_gpus = api.train_time(model="llama-3-8b", days=10, gpus="H100")
    by_gpu = api.train_time(model="llama-3-8b", days=10, gpu="H100")
    assert by_gpus.to_dict() == by_gpu.to_dict()
    with pytest.raises(LmcalcError, match="the GPU count is what is solved for"):
        api.train_time(model="llama-3-8b", days=10, gpus="8xH100")


@pytest.mark.parametrize(
    "args, suggestion",
    [
        ("memory -m llama-3-8b --gpus 8xH100-80GB", "did you mean h100?"),  # not a100-80gb, which spells alike
        ("params -m qwen3-9b", "did you mean qwen3-8b?"),  # no such size: the closest
        ("params -m lama-3-8b", "did you mean llama-3-8b?"),  # a misspelling still finds its match
    ],
)
def test_did_you_mean_finds_the_name_said_first(args, suggestion, capsys):
    with pytest.raises(SystemExit):
        main(args.split())
    assert suggestion in capsys.readouterr().err
