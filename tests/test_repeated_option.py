"""An option given twice (issue #32, item 9): click kept the last value without a word, so ``--gpus 1024xH100
--gpus 1024xB200`` answered for the B200s alone. Two different values are refused in one line; the same value twice
says one thing and runs."""

import pytest

pytestmark = pytest.mark.fast


@pytest.mark.parametrize(
    "argv,first,second,option",
    [
        (["train-time", "-m", "llama-3-8b", "--gpus", "1024xH100", "--gpus", "1024xB200"], "--gpus 1024xH100",
         "--gpus 1024xB200", "--gpus"),
        (["memory", "-m", "llama-3-8b", "--model", "llama-3-70b"], "-m llama-3-8b", "--model llama-3-70b", "--model"),
        (["memory", "-m", "llama-3-8b", "--tp=2", "--tp", "4"], "--tp 2", "--tp 4", "--tp"),
        (["plan", "-m", "llama-3-8b", "--gpus", "8xH100", "--sequence-parallel", "--no-sequence-parallel"],
         "--sequence-parallel", "--no-sequence-parallel", "--sequence-parallel"),
    ],
)  # fmt: skip
def test_two_values_of_one_option_are_refused(lmcalc_run, argv, first, second, option):
    run = lmcalc_run(argv)
    assert run.code == 2 and run.out == ""
    assert run.err.strip() == (
        f"lmcalc: error: {first} and {second}: {option} is given twice; give it once (to compare two answers, "
        "run the command twice)"
    )


def test_the_same_value_twice_runs(lmcalc_run):
    once = lmcalc_run(["train-time", "-m", "llama-3-8b", "--gpus", "8xH100", "--brief"])
    twice = lmcalc_run(["train-time", "-m", "llama-3-8b", "--gpus", "8xH100", "--gpus", "8xH100", "--brief"])
    assert twice.code == once.code == 0 and twice.out == once.out


def test_a_value_that_looks_like_an_option_is_a_value(lmcalc_run):
    # --model's value is read as a value, not as the second of two --gpus: the error is the model's, not a repeat
    run = lmcalc_run(["memory", "--gpus", "8xH100", "--model", "--gpus"])
    assert "given twice" not in run.err and run.code == 2
