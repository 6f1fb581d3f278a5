"""Hostile model files and hostile numbers on every command (issue #32 item 16): whatever a file or a flag says, the
answer is output or one line naming what was wrong (exit 2), never an internal error, a traceback or a hang.

Model files: every dimension from 0 up to 2^62, floats (1e+308, .inf, .nan), integers of thousands of digits, text,
nulls; layer counts up to 10^9; empty files and odd top levels; hybrids whose layer patterns attend everywhere,
nowhere or beyond the last layer; MoE and sliding-window layer lists. Flags: every option of the accounting commands
given numbers of every size and form. Each run has 10 s (``HANG_SECONDS``); the examples are derandomized, so a run in
CI tries exactly the examples a run here did. The cheap commands run in the fast tier (a few seconds); memory, fit,
plan, max-params, train-time's detailed count and report run in the slow tier.

The failures the first runs found are each a test of their own below, with the fix named."""

import math
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lmcalc.cli import main
from lmcalc.spec_base import MAX_LAYERS

HANG_SECONDS = 10


class Hang(BaseException):
    """Raised by the alarm: a BaseException, so that the command line's handler of internal errors does not take it."""


@contextmanager
def hang_alarm(seconds: float = HANG_SECONDS) -> Iterator[None]:
    def ring(signum, frame):
        raise Hang

    previous = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def answered(argv: list[str], capsys) -> tuple[int, str]:
    """Run ``lmcalc argv`` in this process: its exit code and stderr, once it is clear that it answered as a command
    should (output, or one line naming the problem; no internal error, no hang)."""
    try:
        with hang_alarm(), pytest.raises(SystemExit) as exit_info:
            main(argv)
    except Hang:
        pytest.fail(f"no answer in {HANG_SECONDS} s: lmcalc {' '.join(a[:60] for a in argv)}")
    _, err = capsys.readouterr()
    code = exit_info.value.code
    assert "internal error" not in err and "Traceback" not in err, (argv, err[:2000])
    if code != 0:
        assert code == 2, (argv, err[:2000])
        assert err.startswith("lmcalc: error: ") and len(err.splitlines()) == 1, (argv, err[:2000])
        assert len(err) < 1200, (argv, err[:2000])  # what it echoes of the input is cut to about 100 characters
    return code, err


# ----------------------------------------------------------------------------------------------- model files


def huge_integer(digits: int) -> str:
    return "9" * digits


NUMBER_TEXTS = st.one_of(
    st.integers(min_value=-2, max_value=2**62).map(str),
    st.sampled_from(["0", "1", "2", "3", "4", "7", "8", "64", "4096", "4097", str(2**30), str(2**30 + 1), str(2**53),
                     str(2**53 + 1), "1000000000", "1e+308", "1.5", "80e9", ".inf", "-.inf", ".nan", "1_000",
                     huge_integer(101), huge_integer(4301), "null", "true", "'768'", "[]", "{}"]),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
)  # fmt: skip
POWERS_OF_TWO = st.integers(min_value=0, max_value=30).map(lambda k: str(2**k))  # valid, up to MAX_DIMENSION
DIMENSIONS = st.one_of(POWERS_OF_TWO, POWERS_OF_TWO, POWERS_OF_TWO, NUMBER_TEXTS)  # mostly valid, some hostile
SMALL_WHOLE = st.sampled_from(["1", "2", "4", "8", "16", "64", "128"])
LAYER_LISTS = st.one_of(
    st.just("[]"),
    st.lists(st.integers(min_value=0, max_value=3), max_size=4, unique=True).map(lambda ids: str(sorted(ids))),
    st.lists(st.integers(min_value=-1, max_value=5000), max_size=6).map(lambda ids: f"[{', '.join(map(str, ids))}]"),
    st.sampled_from(["[0, 1, 2, 3]", "[0, 0]", "[3]", "[4]", "[1e+308]", "[0.5]", "['a']", "null"]),
)


def hybrid_blocks(numbers: st.SearchStrategy[str]) -> st.SearchStrategy[str | None]:
    """A hybrid's block, its sizes drawn from ``numbers``, its layers that attend any pattern (or none at all)."""
    return st.one_of(
        st.none(),
        st.builds(
            "mamba: {{d_inner: {}, d_state: {}, d_conv: 4, dt_rank: {}, attention_every: {}, "
            "attention_offset: {}}}".format,
            numbers, SMALL_WHOLE, SMALL_WHOLE, st.sampled_from(["null", "1", "2", "8", "0", str(2**62)]),
            st.sampled_from(["0", "1", "7"]),
        ),
        st.builds(
            "mamba2: {{inner: {}, heads: {}, state: {}, conv_kernel: 4, attention_layer_ids: {}}}".format,
            st.sampled_from(["128", "64", str(2**30)]), st.sampled_from(["1", "4", "64"]), numbers, LAYER_LISTS,
        ),
        st.builds(
            "deltanet: {{key_heads: 2, value_heads: {}, key_head_dim: {}, value_head_dim: 16, conv_kernel: 4, "
            "{}}}".format,
            st.sampled_from(["2", "4", "3"]), numbers,
            st.one_of(st.sampled_from(["attention_every: 1", "attention_every: 4", "attention_every: 5000"]),
                      LAYER_LISTS.map("attention_layer_ids: {}".format)),
        ),
        st.builds("short_conv: {{conv_kernel: {}, attention_layer_ids: {}}}".format, numbers, LAYER_LISTS),
        st.builds("lightning: {{heads: 4, head_dim: {}, attention_layer_ids: {}}}".format, numbers, LAYER_LISTS),
    )  # fmt: skip


def other_blocks(numbers: st.SearchStrategy[str]) -> st.SearchStrategy[str | None]:
    """An MoE block, a sliding window or single blocks, sizes drawn from ``numbers`` (or none at all)."""
    top_k = st.sampled_from(["1", "2"] if numbers is POWERS_OF_TWO else ["1", "2", "null", "0"])
    return st.one_of(
        st.none(),
        st.builds(
            "moe: {{num_experts: {}, experts_per_token: {}, expert_ffn_size: {}, dense_layers: {}, "
            "dense_layer_ids: {}}}".format, numbers, top_k, numbers, st.sampled_from(["0", "1", "9"]), LAYER_LISTS,
        ),
        st.builds("sliding_window: {}\nglobal_layer_ids: {}".format, numbers, LAYER_LISTS),
        st.builds("sliding_window: {}\nglobal_every: {}".format, numbers, numbers),
        st.builds("mixer_only_layer_ids: {}\nffn_only_layer_ids: {}".format, LAYER_LISTS, LAYER_LISTS),
    )  # fmt: skip


FIELDS = ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim", "ffn_size",
          "max_seq_len", "sliding_window", "mtp_modules", "training_tokens", "qkv_clip", "name")  # fmt: skip


@st.composite
def model_files(draw, odd_files: bool = True, hostile: bool = True) -> str:
    """The text of a model file: a small model with some fields changed and a hybrid or MoE block, or (with
    ``odd_files``) a file that is not a model at all. The fields take hostile values too, or (``hostile`` false) only
    sizes within the bounds, from 1 to 2^30, which the heavy commands then run."""
    numbers = DIMENSIONS if hostile else POWERS_OF_TWO
    odd = draw(st.sampled_from([None] * 12 + ["", "# a comment alone\n", "- a list\n", "just text\n", "42\n", "~\n"]))
    if odd is not None and odd_files:
        return odd
    fields = {"name": "fz", "vocab_size": "256", "hidden_size": "64", "num_layers": "4", "num_heads": "4",
              "ffn_size": "128", "ffn_kind": "swiglu", "norm_kind": "rmsnorm", "tied_embeddings": "false",
              "position_embedding": "rope", "max_seq_len": "2048"}  # fmt: skip
    fields_drawn = FIELDS if hostile else tuple(f for f in FIELDS if f not in ("name", "num_layers", "qkv_clip"))
    if not hostile:
        fields["num_layers"] = draw(st.sampled_from(["1", "2", "4", "64", str(MAX_LAYERS)]))
    for field in draw(st.lists(st.sampled_from(fields_drawn), max_size=3, unique=True)):
        fields[field] = draw(numbers) if field != "name" else draw(st.sampled_from(['"x"', '""', "a" * 300]))
    if draw(st.booleans()) and hostile:
        fields["num_layers"] = draw(st.sampled_from(["1", "2", "3", "64", str(MAX_LAYERS), str(MAX_LAYERS + 1),
                                                     "1000000000", huge_integer(5000)]))  # fmt: skip
    blocks = [block for block in (draw(hybrid_blocks(numbers)), draw(other_blocks(numbers))) if block]
    return "".join(f"{key}: {value}\n" for key, value in fields.items()) + "".join(f"{b}\n" for b in blocks)


def num_experts(text: str) -> float:
    """The model file's MoE expert count as written (0 where it has none, inf where it is not a plain number)."""
    for line in text.splitlines():
        if line.startswith("moe: {num_experts: "):
            written = line.removeprefix("moe: {num_experts: ").split(",")[0]
            return float(written) if written.lstrip("-").replace(".", "", 1).isdigit() else math.inf
    return 0.0


FUZZ = dict(derandomize=True, database=None, deadline=None,
            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])  # fmt: skip


@pytest.fixture
def model_path(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz") / "model.yaml"


@settings(max_examples=120, **FUZZ)
@given(text=model_files())
def test_a_model_file_is_counted_or_refused_in_one_line(text, model_path, capsys):
    model_path.write_text(text)
    code, _ = answered(["params", "-m", str(model_path)], capsys)
    if code == 0:
        answered(["flops", "-m", str(model_path), "--tokens", "1e12", "--json"], capsys)


HEAVY = [
    ["memory", "--gpus", "8xH100", "--brief"],
    ["memory", "--gpus", "64xH100", "--pp", "4", "--zero", "2", "--framework", "megatron", "--brief"],
    ["memory", "--gpus", "8xH100", "--inference", "--brief"],
    ["fit", "--gpus", "8xH100", "--brief"],
    ["plan", "--gpus", "8xH100", "--tokens", "1e9", "--brief"],
    ["train-time", "--gpus", "8xH100", "--tokens", "1e12", "--flops-basis", "detailed", "--brief"],
]


@pytest.mark.slow
@settings(max_examples=200, **FUZZ)
@given(
    text=model_files(odd_files=False, hostile=False),
    commands=st.lists(st.sampled_from(range(len(HEAVY))), min_size=1, max_size=3, unique=True),
)
def test_a_model_file_is_planned_or_refused_in_one_line(text, commands, model_path, capsys):
    model_path.write_text(text)
    code, _ = answered(["params", "-m", str(model_path)], capsys)
    if code != 0:
        return  # a refused file is refused alike by every command (the same validation), and the fast tier saw it
    for index in commands:
        command, *rest = HEAVY[index]
        if command == "plan" and num_experts(text) > 2**16:  # test_plan_of_a_model_of_a_billion_experts_answers
            continue
        answered([command, "-m", str(model_path), *rest], capsys)


@pytest.mark.slow
def test_a_report_of_a_hostile_model_is_written_or_refused(tmp_path, capsys):
    # report runs the whole search and writes a page: a few hybrids of one kind of layer only, not a property
    for block in ("mamba: {d_inner: 128, d_state: 16, d_conv: 4, dt_rank: 4, attention_every: 1}",
                  "short_conv: {conv_kernel: 3, attention_layer_ids: []}", "sliding_window: 1073741824"):  # fmt: skip
        path = tmp_path / "m.yaml"
        path.write_text(f"name: fz\nvocab_size: 256\nhidden_size: {2**30}\nnum_layers: 4\nnum_heads: 4\n"
                        "ffn_size: 128\nffn_kind: swiglu\nnorm_kind: rmsnorm\ntied_embeddings: false\n"
                        f"position_embedding: rope\nmax_seq_len: 2048\n{block}\n")  # fmt: skip
        argv = [
            "report",
            "-m",
            str(path),
            "--gpus",
            "8xH100",
            "--tokens",
            "1e9",
            "--pp",
            "2",
            "-o",
            str(tmp_path / "r.html"),
            "--force",
        ]
        answered(argv, capsys)


# ----------------------------------------------------------------------------------------------- numeric flags


FLAG_VALUES = st.one_of(
    st.sampled_from(["0", "-1", "1", "7", "4096", "2147483648", "1e30", "1e308", "1e-308", "1e999", "nan", "inf",
                     "-inf", "1.5", "0.5", "-0.1", "15T", "300B", "4M", "8K", "2GiB", "1e-30", huge_integer(25),
                     huge_integer(400), huge_integer(4400), "", "abc", "1" * 100_000]),
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.floats().map(repr),
)  # fmt: skip
BASES = {
    "train-time": ["-m", "gpt2-124m", "--gpus", "8xH100", "--tokens", "1e9"],
    "flops": ["-m", "gpt2-124m", "--tokens", "1e9"],
    "optimal": ["--compute", "1e21"],
    "params": ["-m", "gpt2-124m"],
    "tensor": ["4x4"],
    "max-params": ["--gpus", "8xH100"],
    "memory": ["-m", "gpt2-124m", "--gpus", "8xH100"],
    "fit": ["-m", "gpt2-124m", "--gpus", "8xH100"],
    "plan": ["-m", "gpt2-124m", "--gpus", "8xH100", "--tokens", "1e9", "--tp", "1"],
}
CHEAP = ("train-time", "flops", "optimal", "params", "tensor")
NOT_NUMBERS = {"--model", "-m", "--output", "-o", "--plot", "--save", "--calibration", "--like", "--framework",
               "--precision", "--optimizer", "--gpu", "--lora-targets"}  # fmt: skip
"""Options that name a file or a preset, not a number: a number there is an unknown name (paths are not written)."""


def numeric_options(command: str) -> list[tuple[str, bool]]:
    """Every option of ``command`` that takes a value, with whether typer reads it as a number itself."""
    import typer
    from typer.core import TyperOption

    from lmcalc.cli import app

    click_command = typer.main.get_command(app).commands[command]  # type: ignore[attr-defined]
    return [
        (p.opts[0], getattr(p.type, "name", "") in ("int", "integer", "float"))
        for p in click_command.params
        if isinstance(p, TyperOption) and not p.is_flag and not set(p.opts) & NOT_NUMBERS
    ]


@st.composite
def flag_runs(draw, commands: tuple[str, ...]) -> list[str]:
    command = draw(st.sampled_from(commands))
    options = numeric_options(command)
    argv = [command, *BASES[command]]
    chosen = draw(st.lists(st.sampled_from(options), min_size=1, max_size=3, unique=True)) if options else []
    for option, _ in chosen:
        value = draw(FLAG_VALUES)
        argv += [option, value]
    return argv


@settings(max_examples=150, **FUZZ)
@given(argv=flag_runs(CHEAP))
def test_a_cheap_command_answers_any_number_in_one_line(argv, capsys):
    answered(argv, capsys)


@pytest.mark.slow
@settings(max_examples=300, **FUZZ)
@given(argv=flag_runs(tuple(command for command in BASES if command not in CHEAP)))
def test_a_planning_command_answers_any_number_in_one_line(argv, capsys):
    answered(argv, capsys)


def test_the_options_fuzzed_are_every_numeric_option():
    # a new option is fuzzed as it comes: the options are read from the commands, not listed here
    assert {"--days", "--mfu", "--seq"} <= {option for option, _ in numeric_options("train-time")}
    assert {"--pp", "--top", "--micro-batch"} <= {option for option, _ in numeric_options("plan")}


# ------------------------------------------------------------------------------ what the first runs found


# space.py's _expert_degrees walked every divisor of the expert count where EP must also tile the GPUs: 2^30 experts
# never answered
@pytest.mark.slow  # it waits out HANG_SECONDS when it fails
def test_plan_of_a_model_of_a_billion_experts_answers(tmp_path, capsys):
    path = tmp_path / "m.yaml"
    moe = "moe: {num_experts: 1073741824, experts_per_token: 2, expert_ffn_size: 64}"
    path.write_text("name: fz\nvocab_size: 8\nhidden_size: 128\nnum_layers: 2\nnum_heads: 1\nffn_size: 8\n"
                    "ffn_kind: swiglu\nnorm_kind: rmsnorm\ntied_embeddings: false\nposition_embedding: rope\n"
                    f"max_seq_len: 8\n{moe}\n")  # fmt: skip
    with hang_alarm(HANG_SECONDS):
        try:
            answered(["plan", "-m", str(path), "--gpus", "8xH100", "--tokens", "1e9"], capsys)
        except Hang:
            pytest.fail("no answer")


def test_fit_of_a_micro_batch_too_large_for_any_sequence_answers(capsys):
    answered(["fit", "-m", "gpt2-124m", "--gpus", "8xH100", "--micro-batch", "2147483648"], capsys)


def test_a_top_of_thousands_of_digits_is_one_line(capsys):
    answered(["plan", "-m", "gpt2-124m", "--gpus", "8xH100", "--tokens", "1e9", "--top", huge_integer(4400)], capsys)


def test_an_integer_flag_of_thousands_of_digits_echoes_a_short_value(capsys):
    _, err = answered(["memory", "-m", "gpt2-124m", "--gpus", "8xH100", "--tp", "1" * 100_000], capsys)
    assert len(err) < 300


def test_a_calibration_file_name_too_long_is_one_line(capsys):
    answered(["train-time", "-m", "gpt2-124m", "--gpus", "8xH100", "--tokens", "1e9", "--calibration", "1" * 300],
             capsys)  # fmt: skip
