"""Absurd sizes and odd files (issue #32 items 10 to 14): each is one line naming what was wrong and what is accepted,
exit 2, at once; never an internal error, never a hang. The bounds are spec_base's (MAX_LAYERS, MAX_DIMENSION,
MAX_WHOLE_NUMBER), checked where a preset is validated, so every command has them."""

import json
from pathlib import Path

import pytest

from lmcalc import errors
from lmcalc.spec_base import MAX_DIMENSION, MAX_LAYERS
from lmcalc.units import group, parse_shape

TINY = """\
name: tiny
vocab_size: 1000
hidden_size: 64
num_layers: 4
num_heads: 4
ffn_size: 256
ffn_kind: swiglu
norm_kind: rmsnorm
tied_embeddings: false
position_embedding: rope
max_seq_len: 2048
"""
ROOT = Path(__file__).resolve().parent.parent


def model_file(tmp_path: Path, text: str = TINY, file: str = "m.yaml", **fields: str) -> Path:
    """TINY with ``fields`` set (a field TINY has is replaced, another added), written to ``tmp_path / file``."""
    lines = [line for line in text.splitlines() if line.split(":")[0] not in fields]
    path = tmp_path / file
    path.write_text("\n".join([*lines, *(f"{key}: {value}" for key, value in fields.items())]) + "\n")
    return path


def refused(lmcalc_run, argv: list[str]) -> str:
    """The one line a refused command prints (exit 2), without its ``lmcalc: error:`` prefix."""
    run = lmcalc_run(argv)
    assert (run.code, run.out) == (2, ""), run.err
    assert len(run.err.splitlines()) == 1 and run.err.startswith("lmcalc: error: "), run.err
    assert "internal error" not in run.err
    return run.err.removeprefix("lmcalc: error: ").rstrip("\n")


# --------------------------------------------------------------------------- 11: absurd sizes, bounded where read


def test_a_billion_layers_is_refused_before_any_layer_is_walked(tmp_path, lmcalc_run):
    # the per-layer walks (which layers attend, each stage's share) once ran 10^9 times: a hang
    path = model_file(tmp_path, num_layers="1000000000")
    assert refused(lmcalc_run, ["params", "-m", str(path)]) == (
        f"{path}: num_layers: must be at most {MAX_LAYERS:,}, not 1000000000"
    )


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("1e+308", "1e+308"),  # read as the whole number 10^308: an OverflowError in a float formula, once
        (str(2**62), str(2**62)),
        (".inf", "inf"),
        ("1073741825", "1073741825"),  # MAX_DIMENSION + 1
    ],
)
def test_a_dimension_past_its_bound_is_refused_naming_the_bound(tmp_path, lmcalc_run, value, shown):
    path = model_file(tmp_path, hidden_size=value)
    message = refused(lmcalc_run, ["params", "-m", str(path)])
    assert message.startswith(f"{path}: hidden_size: must be ")
    assert message.endswith(shown) or "an integer" in message
    if value != ".inf":
        assert f"at most {MAX_DIMENSION:,}" in message


def test_an_integer_of_thousands_of_digits_is_one_line(tmp_path, lmcalc_run):
    # Python refuses to read an integer of more than 4,300 digits (a ValueError): YAML's and JSON's readers stop first
    path = model_file(tmp_path, vocab_size="9" * 4301)
    assert refused(lmcalc_run, ["params", "-m", str(path)]) == (
        f"{path}:11: YAML error: an integer of 4,301 digits, more than any field takes (at most 100)"
    )
    config = tmp_path / "config.json"
    config.write_text('{"model_type": "llama", "vocab_size": ' + "9" * 4301 + "}")
    assert "an integer of 4,301 digits" in refused(lmcalc_run, ["params", "-m", str(config)])


@pytest.mark.parametrize("tagged", ["!!float abc", "!!bool abc", "!!timestamp abc", "!!int 0x1F", "!!set 5"])
def test_an_explicit_yaml_tag_that_cannot_be_read_is_one_line(tmp_path, lmcalc_run, tagged):
    path = model_file(tmp_path, vocab_size=tagged)
    assert refused(lmcalc_run, ["params", "-m", str(path)]).startswith(f"{path}")


def test_a_float_field_takes_no_infinity_and_no_nan(tmp_path, lmcalc_run):
    path = model_file(tmp_path, qkv_clip=".nan")
    assert refused(lmcalc_run, ["params", "-m", str(path)]) == f"{path}: qkv_clip: must be a finite number, not nan"


def test_a_config_json_of_a_billion_layers_is_refused_before_its_layer_types_are_listed(tmp_path, lmcalc_run):
    # Gemma 3's reader lists a layer type for each layer (10^9 of them) before the spec is validated
    config = json.loads((ROOT / "tests" / "data" / "hf" / "llama-3.1-8b" / "config.json").read_text())
    config.update(model_type="gemma3_text", num_hidden_layers=10**9)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert refused(lmcalc_run, ["params", "-m", str(path)]) == (
        f"{path}: config.json num_hidden_layers must be at most 4,096, not 1000000000"
    )


def test_a_user_preset_of_absurd_size_is_left_out_of_the_list_with_a_warning(user_presets, lmcalc_run):
    model_file(user_presets / "models", file="huge.yaml", hidden_size="1e+308")
    run = lmcalc_run(["presets", "list", "models", "--json"])
    assert run.code == 0, run.err
    assert "llama-3.1-8b" in {row["name"] for row in run.json["models"]}
    assert run.err == (
        f"lmcalc: warning: {user_presets}/models/huge.yaml: hidden_size: must be at most 1,073,741,824, not 1e+308; "
        "left out\n"
    )


def test_a_tensor_past_what_a_machine_addresses_is_refused(lmcalc_run):
    big = "x".join(["1" + "0" * 100] * 4)  # 10^400 elements: an OverflowError in the bytes, once
    assert refused(lmcalc_run, ["tensor", big]).endswith("has more than 2^64 elements (1.8e19), more than a 64-bit "
                                                          "machine can address")  # fmt: skip
    assert refused(lmcalc_run, ["tensor", "9" * 5000]).startswith("shape '9999")
    assert parse_shape("4x4") == (4, 4) and parse_shape(f"{2**32}x{2**32}") == (2**32, 2**32)
    assert group(10**400) == "1e+400" and group(12_345) == "12,345"


def test_a_deadline_too_short_to_count_its_gpus_is_refused(lmcalc_run):
    argv = ["train-time", "-m", "llama-3-8b", "--tokens", "1e12", "--gpu", "H100", "--days", "1e-308"]
    assert refused(lmcalc_run, argv).startswith("--days 1e-308 is too short: it needs more than 2^53 GPUs")


@pytest.mark.parametrize("ratio", ["1e308", "1e-308"])
def test_a_tokens_per_param_that_leaves_no_parameter_or_token_is_refused(lmcalc_run, ratio):
    message = refused(lmcalc_run, ["optimal", "--compute", "1e21", "--tokens-per-param", ratio])
    assert message.startswith(f"--tokens-per-param {float(ratio):g} splits 1.000e+21 FLOPs into ")
    assert message.endswith("give a ratio from 6/C to C/6 (6e-21 to 1.67e+20), which leaves at least one of each")


def test_validate_refuses_a_sequence_the_meta_device_cannot_hold_before_importing_torch(lmcalc_run):
    # torch's "Storage size calculation overflowed" for GPT-2's 12 x 10^9 x 10^9 scores, once (a fast test
    # imports no torch: the check comes first)
    message = refused(lmcalc_run, ["validate", "-m", "gpt2-124m", "--seq", "1e9"])
    assert message.startswith("--seq 1000000000 with micro-batch 1 makes tensors of gpt2-124m too large for PyTorch")
    assert message.endswith("the FLOP check runs --seq up to 290589904")  # 12·s² + 59,985·s ≤ 2^60


def test_a_pinned_pipeline_far_deeper_than_the_model_is_refused_at_once(lmcalc_run):
    # the planner split 2^31 stages' layers before it checked the layout
    argv = ["plan", "-m", "gpt2-124m", "--gpus", "8xH100", "--tokens", "1e9", "--pp", str(2**31)]
    assert refused(lmcalc_run, argv) == f"PP={2**31} exceeds the 12 layers: each stage's chunk builds at least one"


def test_zero2_buckets_of_a_layer_wider_than_any_are_not_simulated_one_by_one(tmp_path, lmcalc_run):
    # h = 2^30: a layer of some 10^19 parameters, cut into some 10^11 gradient buckets that were reduced one by one
    path = model_file(tmp_path, hidden_size=str(2**30), num_heads="8", ffn_size="8", vocab_size="128")
    argv = ["memory", "-m", str(path), "--gpus", "8xH100", "--zero", "2", "--framework", "megatron", "--json"]
    run = lmcalc_run(argv)
    assert run.code == 0, run.err
    assert run.json["results"]["total"]["states"]["value"] > 1e18  # some 10^19 parameters


# ------------------------------------------------------------- 12: a directory where a preset file belongs


@pytest.mark.parametrize("where", ["models/x.yaml", "precisions.yaml", "optimizers.yaml", "hardware/h.yml"])
def test_a_directory_named_as_a_preset_file_is_left_out_with_a_warning(user_presets, lmcalc_run, where):
    (user_presets / where).mkdir(parents=True)
    run = lmcalc_run(["memory", "-m", "llama-3-8b", "--gpus", "8xH100", "--brief"])
    assert run.code == 0, run.err
    assert run.err == f"lmcalc: warning: {user_presets / where}: not a regular file; left out\n"


# ------------------------------------------------------------------------- 14: hybrids with one kind of layer


HYBRIDS = {
    "mamba": "mamba: {d_inner: 128, d_state: 16, d_conv: 4, dt_rank: 4, attention_every: 1}",
    "mamba2": "mamba2: {inner: 128, heads: 4, state: 16, conv_kernel: 4, attention_layer_ids: [0, 1, 2, 3]}",
    "deltanet": "deltanet: {key_heads: 2, value_heads: 2, key_head_dim: 16, value_head_dim: 16, conv_kernel: 4, "
    "attention_every: 1}",
    "short_conv": "short_conv: {conv_kernel: 3, attention_layer_ids: [0, 1, 2, 3]}",
    "mamba2 alone": "mamba2: {inner: 128, heads: 4, state: 16, conv_kernel: 4, attention_layer_ids: []}",
}


@pytest.mark.parametrize("command", ["plan", "report"])
@pytest.mark.parametrize("hybrid", HYBRIDS)
def test_a_hybrid_whose_layers_all_attend_or_none_is_planned(tmp_path, lmcalc_run, hybrid, command):
    # a pipeline stage's share of a tensor no layer holds was 0 / 0 (engine/parallel/sharding.py stage_part)
    path = tmp_path / "hybrid.yaml"
    path.write_text(TINY + HYBRIDS[hybrid] + "\n")
    argv = [command, "-m", str(path), "--gpus", "8xH100", "--tokens", "1e9", "--pp", "2", "--tp", "1", "--zero", "1"]
    if command == "report":
        argv += ["-o", str(tmp_path / "report.html")]
    run = lmcalc_run(argv)
    assert run.code == 0, run.err


@pytest.mark.parametrize(
    ("block", "field", "layer"),
    [
        ("mamba2: {inner: 128, heads: 4, state: 16, conv_kernel: 4, attention_layer_ids: [9]}",
         "mamba2.attention_layer_ids", 9),
        ("sliding_window: 128\nglobal_layer_ids: [4]", "global_layer_ids", 4),
        ("moe: {num_experts: 4, experts_per_token: 1, expert_ffn_size: 64, dense_layer_ids: [7]}",
         "moe.dense_layer_ids", 7),
    ],
)  # fmt: skip
def test_a_layer_list_naming_a_layer_the_model_lacks_is_refused(tmp_path, lmcalc_run, block, field, layer):
    path = tmp_path / "m.yaml"
    path.write_text(TINY + block + "\n")
    assert refused(lmcalc_run, ["params", "-m", str(path)]) == (
        f"{path}: (top level): {field} names layer {layer}, but the layers are 0 to 3 (num_layers 4)"
    )


def test_fit_full_on_a_mamba_hybrid_is_answered(lmcalc_run):
    # fit offered --method lora to a Mamba (v1) hybrid as a lever, which check_method refuses (issue #32 item 14)
    run = lmcalc_run(["fit", "-m", "jamba-1.5-mini", "--gpus", "8xH100", "--method", "full", "--brief"])
    assert run.code == 0, run.err
    assert "--method" not in run.out


# --------------------------------------------------------------- 10: an empty file, and input echoed at length


def test_an_empty_model_file_says_it_is_empty_and_what_it_should_hold(tmp_path, lmcalc_run):
    for text in ("", "# only a comment\n"):
        path = tmp_path / "empty.yaml"
        path.write_text(text)
        assert refused(lmcalc_run, ["params", "-m", str(path)]) == (
            f"{path}: the file is empty (or holds only comments); expected a model's fields, one per line "
            "(name: ..., and the rest)"
        )
    path.write_text("- a list\n")
    assert refused(lmcalc_run, ["params", "-m", str(path)]) == (
        f"{path}: expected a mapping of fields (name: ..., and the rest), not a list"
    )


def test_an_empty_user_preset_file_is_left_out_saying_so(user_presets, lmcalc_run):
    (user_presets / "models" / "empty.yaml").write_text("")
    (user_presets / "optimizers.yaml").write_text("# nothing yet\n")
    run = lmcalc_run(["memory", "-m", "llama-3-8b", "--gpus", "8xH100", "--brief"])
    assert run.code == 0, run.err
    assert run.err.splitlines() == [
        f"lmcalc: warning: {user_presets}/models/empty.yaml: the file is empty (or holds only comments); expected a "
        "model's fields; left out",
        f"lmcalc: warning: {user_presets}/optimizers.yaml: the file is empty (or holds only comments); expected a "
        "top-level list named 'optimizers'; left out",
    ]


LONG = "a" * 100_000


@pytest.mark.parametrize(
    "argv",
    [
        ["params", "-m", LONG],  # an unknown preset, with a close match looked for
        ["params", "-m", "llama-3-8b" + LONG],  # a known name with more after it
        ["memory", "-m", "llama-3-8b", "--gpus", f"8x{LONG}"],  # an unknown GPU
        ["memory", "-m", "llama-3-8b", "--gpus", LONG],  # not a cluster at all
        ["train-time", "-m", "llama-3-8b", "--gpus", "8xH100", "--tokens", LONG],
        ["memory", "-m", "llama-3-8b", "--gpus", "8xH100", "--overhead", LONG],
        ["tensor", LONG],
        ["flops", "-m", "llama-3-8b", "--tokens", "1e12", "--recompute", LONG],
        ["memory", "-m", "llama-3-8b", "--gpus", "8xH100", "--precision", "a b " * 25_000],
    ],
)
def test_input_echoed_in_an_error_is_cut_to_about_a_hundred_characters(lmcalc_run, argv):
    message = refused(lmcalc_run, argv)
    assert len(message) < 400, message[:500]
    assert "…" in message


def test_a_long_text_in_a_preset_is_never_echoed_whole(tmp_path, lmcalc_run):
    for field in ("name", "ffn_kind", "display_name"):
        path = model_file(tmp_path, **{field: "x" * 100_000})
        assert len(refused(lmcalc_run, ["params", "-m", str(path)])) < 300


def test_cut_echoes_keeps_a_short_message_as_it_is():
    short = "unknown model 'lama'; did you mean llama-3-8b?"
    assert errors.cut_echoes(short) == short
    assert errors.LmcalcError(f"unknown model '{LONG}'").message() == f"unknown model '{'a' * 88}…{'a' * 10}'"


def test_a_sliding_window_in_a_model_where_no_layer_attends_is_refused(tmp_path, lmcalc_run):
    # found by tests/test_fuzz_hostile.py: the causal FLOPs averaged the window over 0 attention layers (0 / 0)
    path = tmp_path / "m.yaml"
    path.write_text(TINY + "short_conv: {conv_kernel: 3, attention_layer_ids: []}\nsliding_window: 128\n")
    assert refused(lmcalc_run, ["flops", "-m", str(path), "--tokens", "1e12"]) == (
        f"{path}: (top level): sliding_window is attention's span, and no layer attends (drop it, or name the layers "
        "that attend)"
    )


def test_apostrophes_in_prose_are_not_a_quotation_to_cut():
    # "the model's … the framework's" held more than ECHO_LIMIT characters between two apostrophes, and was cut as if
    # it quoted the user's input
    from lmcalc.errors import ECHO_LIMIT, cut_echoes

    prose = "the model's layers " + "are many " * 20 + "under the framework's rule"
    assert prose.index("framework's") - prose.index("model's") > ECHO_LIMIT
    assert cut_echoes(prose) == prose
    quoted = "unknown model '" + "x" * 300 + "'"
    assert len(cut_echoes(quoted)) < 120


def test_a_tensor_of_huge_dimensions_given_to_the_api_is_refused():
    # the shape as a tuple skipped parse_shape's bound and overflowed a float
    from lmcalc import api
    from lmcalc.errors import LmcalcError

    with pytest.raises(LmcalcError, match="more than 2\\^64 elements"):
        api.tensor(shape=(10**100,) * 4)
    with pytest.raises(LmcalcError, match="must be a positive integer"):
        api.tensor(shape=(2.5, 4))
    assert api.tensor(shape=(4, 4)).bytes == 64


def test_a_framework_profile_keeps_a_few_copies_of_q_k_and_v_at_most():
    from pydantic import ValidationError

    from lmcalc.framework_specs import MAX_COPIES, AttentionRule

    required = {"source": "a test", "eager_softmax": "fp32"}
    assert AttentionRule(**required, q_copies=MAX_COPIES).q_copies == MAX_COPIES
    with pytest.raises(ValidationError, match="k_copies"):
        AttentionRule(**required, k_copies=10**12)
