"""What a file says is read as it says it, or refused (issue #18, "nothing lost, nothing silently wrong"): numbers
and booleans are read strictly, a key is given once, a broken file among the user's presets affects only itself,
and an error names the file and the problem without copying the file's content."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lmcalc import preset_files, presets
from lmcalc.cli import main
from lmcalc.engine.model.params import count_params
from lmcalc.engine.model.published import matches_published
from lmcalc.errors import LmcalcError
from lmcalc.specs import ModelSpec

ROOT = Path(__file__).resolve().parent.parent
LLAMA = (ROOT / "presets" / "models" / "llama-3.1-8b.yaml").read_text()
GPT2_CONFIG = {"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257,
               "n_positions": 1024}  # fmt: skip


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    out, err = capsys.readouterr()
    return exit_info.value.code, out, err


def refused(argv: list[str], capsys) -> str:
    """The one line a refused command prints (exit 2, no traceback), without its ``lmcalc: error:`` prefix."""
    code, out, err = run(argv, capsys)
    assert (code, out) == (2, ""), err
    assert len(err.splitlines()) == 1 and err.startswith("lmcalc: error: "), err
    return err.removeprefix("lmcalc: error: ").rstrip("\n")


def llama_with(tmp_path: Path, old: str, new: str, file: str = "llama.yaml", **lines: str) -> Path:
    """Llama 3.1 8B's preset file with one line changed (and the lines of the fields given set anew)."""
    text = LLAMA.replace(old, new, 1)
    assert text != LLAMA
    for field, value in lines.items():
        text = re.sub(f"^{field}: .*$", f"{field}: {value}", text, count=1, flags=re.M)
    path = tmp_path / file
    path.write_text(text)
    return path


# ------------------------------------------------------------------------------------------- 10: lax types


def test_a_text_number_in_config_json_is_refused(tmp_path, capsys):
    # "768" * 4 is text repeated: n_embd "768" once counted 14 P parameters
    path = tmp_path / "config.json"
    path.write_text(json.dumps(GPT2_CONFIG | {"n_embd": "768"}))
    assert refused(["params", "-m", str(path)], capsys) == f"{path}: config.json n_embd must be an integer, not '768'"
    path.write_text(json.dumps(GPT2_CONFIG | {"tie_word_embeddings": "false"}))  # a true string in Python
    assert refused(["params", "-m", str(path)], capsys) == (
        f"{path}: config.json tie_word_embeddings must be true or false, not 'false'"
    )
    path.write_text(json.dumps(GPT2_CONFIG | {"n_layer": 12.0, "resid_pdrop": True}))
    assert "n_layer must be an integer, not 12.0" in refused(["params", "-m", str(path)], capsys)


def test_a_multimodal_configs_text_and_vision_fields_are_checked_too(tmp_path, capsys):
    text = {"model_type": "gemma3_text", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 1, "head_dim": 16, "intermediate_size": 128, "vocab_size": 256,
            "max_position_embeddings": 128}  # fmt: skip
    config = {"model_type": "gemma3", "text_config": text, "vision_config": {"hidden_size": 32}}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config | {"text_config": text | {"hidden_size": "64"}}))
    assert refused(["params", "-m", str(path)], capsys) == (
        f"{path}: config.json text_config.hidden_size must be an integer, not '64'"
    )
    path.write_text(json.dumps(config | {"vision_config": {"num_hidden_layers": "27"}}))
    assert refused(["params", "-m", str(path)], capsys) == (
        f"{path}: config.json vision_config.num_hidden_layers must be an integer, not '27'"
    )


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        # YAML 1.1 reads true as 1, 1:30 as 90 (base 60), 010 as 8 (octal) and no as false
        ("num_layers: 32", "num_layers: true", "num_layers: must be an integer, not true"),
        ("num_layers: 32", "num_layers: 1:30", "num_layers: must be an integer, not the text '1:30'"),
        ("num_layers: 32", "num_layers: 032", "num_layers: must be an integer, not the text '032'"),
        ("num_layers: 32", "num_layers: 32.5", "num_layers: must be an integer, not 32.5"),
        (
            "tied_embeddings: false",
            "tied_embeddings: no",
            "tied_embeddings: must be true or false, not the text 'no'",
        ),
        (
            "tied_embeddings: false",
            'tied_embeddings: "false"',
            "tied_embeddings: must be true or false, not the text 'false'",
        ),
        (
            "training_tokens: 15.0e12",
            "training_tokens: yes",
            "training_tokens: must be a number, not the text 'yes'",
        ),
        ("num_layers: 32", "num_layers: 32\nnorms_per_layer: true", "norms_per_layer: must be 1, 2 or 4, not true"),
    ],  # fmt: skip
    ids=["true", "sexagesimal", "octal", "fraction", "no", "quoted-false", "yes", "literal-true"],
)
def test_numbers_and_booleans_are_read_strictly(old, new, message, tmp_path, capsys):
    path = llama_with(tmp_path, old, new)
    assert refused(["params", "-m", str(path)], capsys) == f"{path}: {message}"
    code, out, _ = run(["presets", "check", str(path)], capsys)  # presets check passed them all
    assert code == 1 and out.startswith(f"FAIL {path}")


def test_a_choice_outside_its_list_names_the_field_the_choices_and_the_value(tmp_path, capsys):
    # lmcalc's words around the list of choices, whatever words pydantic's next release uses for it
    path = llama_with(tmp_path, "ffn_kind: swiglu", "ffn_kind: gelux")
    message = refused(["params", "-m", str(path)], capsys)
    assert message.startswith(f"{path}: ffn_kind: must be ") and message.endswith(", not the text 'gelux'")
    assert all(kind in message for kind in ("gelu_mlp", "swiglu", "geglu")), message


def test_a_duplicate_key_is_refused(tmp_path, capsys):
    # the last of two equal keys used to win: Llama 3.1 8B with 2 layers
    path = tmp_path / "llama.yaml"
    path.write_text(LLAMA + "num_layers: 2\n")
    line = LLAMA.splitlines().index("num_layers: 32") + 1
    assert refused(["params", "-m", str(path)], capsys) == (
        f"{path}:{len(LLAMA.splitlines()) + 1}: YAML error: duplicate key 'num_layers' (first on line {line})"
    )
    config = tmp_path / "config.json"
    config.write_text(json.dumps(GPT2_CONFIG)[:-1] + ', "n_layer": 2}')
    assert refused(["params", "-m", str(config)], capsys) == (
        f"{config}: JSON error: duplicate key 'n_layer' in one object"
    )
    code, out, _ = run(["presets", "check", str(path)], capsys)
    assert code == 1 and "duplicate key" in out


def test_numbers_written_as_people_write_them_still_read(tmp_path):
    # 15e12 and 1.5e+13 are floats; 80e9 and 540.35e9 are whole numbers, and an int field takes them; 1_000 is 1000
    data = yaml.load("a: 15e12\nb: 1.5e+13\nc: 80e9\nd: 1_000\ne: .5\nf: -2\ng: TRUE\nh: .inf\n", presets._Loader)
    assert data == {"a": 15e12, "b": 1.5e13, "c": 80e9, "d": 1000, "e": 0.5, "f": -2, "g": True, "h": float("inf")}
    path = llama_with(tmp_path, "published_params: 8030261248", "published_params: 8.030261248e9")
    assert presets.resolve_model(str(path)).spec.published_params == 8030261248
    # what is not a plain decimal number or true/false stays text, as YAML 1.2 reads it
    assert yaml.load("[1:30, 010, 0x10, yes, off, 1.2.3]", presets._Loader) == ["1:30", "010", "0x10", "yes", "off",
                                                                               "1.2.3"]  # fmt: skip


# ------------------------------------------------------------------------------------------- 13: user presets

BROKEN_USER_PRESETS = r"""
import os, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))  # a read of /dev/zero stops here, not in swap
sys.argv = ["lmcalc", *sys.argv[1:]]
from lmcalc.cli import main
main()
"""


@pytest.mark.cli
def test_a_broken_user_preset_affects_only_itself(user_presets):
    models = user_presets / "models"
    os.mkfifo(models / "fifo.yaml")  # opening it would wait for a writer forever
    (models / "zero.yaml").symlink_to("/dev/zero")  # would be read until memory ran out
    (models / "bad.yaml").write_text("name: [unclosed\n")
    (models / "latin1.yaml").write_bytes("name: caf\xe9\n".encode("latin-1"))
    (models / "nameless.yaml").write_text("vocab_size: 1\n")
    (models / "huge.yaml").write_text("# " + "x" * (presets.PRESET_FILE_LIMIT) + "\n")
    llama_with(models, "name: llama-3.1-8b", "name: my-llama", "mine.yaml", aliases="[]", family_aliases="[]")

    def lmcalc(*args: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-c", BROKEN_USER_PRESETS, *args]
        return subprocess.run(command, capture_output=True, text=True, timeout=120, env=os.environ, cwd=ROOT)

    built_in = lmcalc("params", "-m", "llama-3-8b", "--json")
    assert built_in.returncode == 0, built_in.stderr
    assert json.loads(built_in.stdout)["results"]["params"]["total"]["value"] == 8030261248
    bad, *others = sorted(built_in.stderr.splitlines())
    # the problem after "YAML syntax error:" is libyaml's, in its words: the file, line and kind are lmcalc's
    assert bad.startswith(f"lmcalc: warning: {models}/bad.yaml:2: YAML syntax error: ") and bad.endswith("; left out")
    assert others == [
        f"lmcalc: warning: {models}/fifo.yaml: not a regular file; left out",
        f"lmcalc: warning: {models}/huge.yaml: larger than 1 MiB, more than any preset or config.json; left out",
        f"lmcalc: warning: {models}/latin1.yaml: not UTF-8 text (byte 0xe9 at offset 9); left out",
        f"lmcalc: warning: {models}/nameless.yaml: a preset needs a 'name' field; left out",
        f"lmcalc: warning: {models}/zero.yaml: not a regular file; left out",
    ]
    mine = lmcalc("params", "-m", "my-llama", "--json")
    assert mine.returncode == 0 and json.loads(mine.stdout)["inputs"]["model"]["value"] == "my-llama"
    checked = lmcalc("presets", "check")  # every file is reported, the broken ones as FAIL
    assert checked.returncode == 1 and checked.stdout.count("FAIL") == 6


def test_an_invalid_user_preset_is_named_when_used_and_left_out_of_the_list(user_presets, capsys):
    llama_with(
        user_presets / "models",
        "num_layers: 32",
        "num_lyers: 32",
        "m.yaml",
        name="mine",
        aliases="[]",
        family_aliases="[]",
    )
    path = user_presets / "models" / "m.yaml"
    message = f"{path}: num_lyers: unknown field; did you mean num_layers? (and 1 more)"  # and num_layers is missing
    assert refused(["params", "-m", "mine"], capsys) == message
    code, out, err = run(["presets", "list", "models", "--json"], capsys)
    listed = {row["name"] for row in json.loads(out)["models"]}
    assert code == 0 and "mine" not in listed and "llama-3.1-8b" in listed
    assert err == f"lmcalc: warning: {message}; left out\n"


def test_a_user_alias_that_takes_a_built_in_name_is_warned_of(user_presets, capsys):
    models = user_presets / "models"
    llama_with(models, "name: llama-3.1-8b", "name: x", "alias.yaml", aliases="[llama-3-70b]", family_aliases="[]")
    code, _, err = run(["params", "-m", "llama-3-70b", "--json"], capsys)
    assert code == 0 and err == (
        f"lmcalc: warning: {models}/alias.yaml: 'llama-3-70b' of x shadows the built-in model llama-3-70b (to "
        "replace a built-in, give your preset its name)\n"
    )
    # a preset with a built-in's own name replaces it, as docs/presets.md says: no warning
    (models / "alias.yaml").unlink()
    llama_with(models, "num_layers: 32", "num_layers: 2", "replace.yaml")
    presets.registry.cache_clear()
    code, out, err = run(["params", "-m", "llama-3.1-8b", "--json"], capsys)
    assert code == 0 and err == "" and json.loads(out)["results"]["params"]["attention"]["substituted"].startswith("2×")


# ------------------------------------------------------------------------------------------- 15: clean errors


def test_an_unreadable_model_file_is_one_line(tmp_path, capsys):
    latin1 = tmp_path / "model.yaml"
    latin1.write_bytes(b"name: caf\xe9\n")
    assert refused(["params", "-m", str(latin1)], capsys) == f"{latin1}: not UTF-8 text (byte 0xe9 at offset 9)"
    assert refused(["params", "-m", str(tmp_path)], capsys) == f"{tmp_path} is a directory without a config.json"
    deep = tmp_path / "config.json"
    deep.write_text("[" * 100_000)  # json's recursion gives up with a RecursionError
    assert refused(["params", "-m", str(deep)], capsys) == f"{deep}: JSON nested too deeply"


@pytest.mark.cli
def test_deeply_nested_yaml_is_refused_before_libyaml_overflows_its_stack(tmp_path):
    # libyaml's composer recurses in C: 50,000 levels killed Python with SIGSEGV (run apart, so a crash is a failure)
    deep = tmp_path / "model.yaml"
    deep.write_text("[" * 50_000)
    command = [sys.executable, "-m", "lmcalc", "params", "-m", str(deep)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=ROOT)
    # What a user relies on: exit 2 (not a crash's -11), one line that names the file and its first line. The words
    # after that are lmcalc's own check where PyYAML parses on, or PyYAML's (6.0.4 refuses deep nesting itself).
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"lmcalc: error: {deep}:1: ") and result.stderr.count("\n") == 1, result.stderr
    assert "Traceback" not in result.stderr and not result.stdout


def test_nesting_is_bounded_by_lmcalc_whatever_pyyaml_allows(tmp_path, monkeypatch):
    # lmcalc's own bound, apart from the parser's: 1,001 levels refused, 1,000 read (a list of lists of … of 1)
    monkeypatch.setattr(preset_files.yaml, "parse", _parse_events_without_a_bound)
    deep = tmp_path / "deep.yaml"
    deep.write_text("[" * 1001 + "1" + "]" * 1001)
    with pytest.raises(LmcalcError, match=rf"^{re.escape(str(deep))}:1: YAML nested deeper than 1000 levels$"):
        preset_files.read_yaml(deep)
    deep.write_text("[" * 1000 + "1" + "]" * 1000)
    assert preset_files.read_yaml(deep) is not None


_parse = yaml.parse


def _parse_events_without_a_bound(text, Loader):  # noqa: N803 (PyYAML's keyword)
    """PyYAML's events from its pure-Python parser, which bounds no nesting (libyaml 0.2.6 stops at 1,000 itself)."""
    return _parse(text, Loader=yaml.SafeLoader)


# ------------------------------------------------------------------------------------------- 16: messages


def test_a_published_count_is_compared_at_its_own_precision(tmp_path, capsys):
    # PaLM 540B (Chowdhery et al. 2022, Table 1: 540.35B): 118 layers of h = 18,432, 48 heads of 256 sharing one K/V
    # head, a SwiGLU MLP of 73,728 in a parallel block with one bias-free LayerNorm, and a tied 256K vocabulary
    palm = tmp_path / "palm.yaml"
    palm.write_text(
        "name: palm-540b\nvocab_size: 256000\nhidden_size: 18432\nnum_layers: 118\nnum_heads: 48\nnum_kv_heads: 1\n"
        "head_dim: 256\nffn_size: 73728\nffn_kind: swiglu\nnorm_kind: layernorm_nobias\nnorms_per_layer: 1\n"
        "parallel_block: true\ntied_embeddings: true\nposition_embedding: rope\nmax_seq_len: 2048\n"
        "published_params: 540.35e9\npublished_params_sig_figs: 3\n"
    )
    spec = presets.resolve_model(str(palm)).spec
    # V·h + L·(2·h·H·d + 2·h·d + 3·h·f + h) + h = 4,718,592,000 + 118 × 4,539,260,928 + 18,432
    assert count_params(spec).total == 540_356_474_880
    assert matches_published(spec, 540_356_474_880)  # 540 B both, to 3 significant figures
    assert matches_published(spec.model_copy(update={"published_params": 540_000_000_000}), 540_356_474_880)
    assert not matches_published(spec, 541_000_000_000) and not matches_published(spec, 539_000_000_000)
    code, out, _ = run(["presets", "check", str(palm)], capsys)
    assert code == 0 and " ".join(out.split()).startswith(f"ok {palm}: valid; 540,356,474,880 params = published to 3")


def test_an_error_names_the_file_never_its_content(tmp_path, capsys):
    # /etc/shadow reads as a mapping whose keys are its lines: the error quoted the first line, a password hash
    shadow = tmp_path / "shadow"
    shadow.write_text("root:$6$s4lt$h4shsecret:19000:0:99999:7:::\ndaemon:*:19000:0:99999:7:::\n")
    assert refused(["params", "-m", str(shadow)], capsys) == f"{shadow}: a key that is not a field name (and 12 more)"
    # a key that is a name is shown, with the field it may have meant
    typo = llama_with(tmp_path, "num_layers: 32", "num_layer: 32")
    assert refused(["params", "-m", str(typo)], capsys) == (
        f"{typo}: num_layer: unknown field; did you mean num_layers? (and 1 more)"
    )
    # a value in a message is a short, quoted token
    config = tmp_path / "config.json"
    config.write_text(json.dumps(GPT2_CONFIG | {"model_type": "x" * 5000}))
    message = refused(["params", "-m", str(config)], capsys)
    assert message.startswith(f"{config}: config.json model_type 'xxx") and "x" * 50 not in message


def test_every_spec_reads_its_numbers_and_flags_strictly():
    llama = presets.resolve_model("llama-3.1-8b").spec.model_dump()
    for field, value in [("hidden_size", "4096"), ("hidden_size", True), ("hidden_size", 4096.5),
                         ("tied_embeddings", "false"), ("tied_embeddings", 0), ("training_tokens", "15e12"),
                         ("training_tokens", True)]:  # fmt: skip
        with pytest.raises(LmcalcError, match=field):
            presets.validate(ModelSpec, {**llama, field: value}, "llama")
    # lists still read as the tuples a spec keeps, and a whole float as an int
    spec = presets.validate(ModelSpec, {**llama, "aliases": ["a"], "hidden_size": 4096.0}, "llama")
    assert spec.aliases == ("a",) and type(spec.hidden_size) is int


def test_a_published_figure_cut_down_is_compared_cut_down():
    # dots.llm1's report prints 142B for a count of 142,774,373,888: rounded, that is 143B; cut down, 142B
    spec = presets.resolve_model("llama-3.1-8b").spec.model_copy(
        update={"published_params": 142_000_000_000, "published_params_sig_figs": 3}
    )
    assert not matches_published(spec, 142_774_373_888)  # 1.43e11 to 3 figures, rounded
    cut = spec.model_copy(update={"published_params_rounding": "down"})
    assert matches_published(cut, 142_774_373_888)  # 142 | 774,373,888 cut off
    assert matches_published(cut, 142_999_999_999) and not matches_published(cut, 143_000_000_000)
    assert not matches_published(cut, 141_999_999_999)
