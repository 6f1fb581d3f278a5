"""The CLI as a user meets it: the documented commands, their figures, JSON, and bad input."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from lmcalc.cli import main

ISSUE_COMMANDS = [
    "train-time --model llama-3-70b --gpus 1024xH100 --tokens 15T --mfu 0.5",
    "train-time --model llama-70b --gpus 1024xH100",
    "max-params --gpus 8xH100 --optimizer adamw",
    "flops --model gpt-3 --tokens 300B",
    "memory --model llama-3-8b --seq 4096 --micro-batch 1 --gpus 8xH100 --zero 3",
    "presets list",
    "presets list models",
    "presets list hardware",
    "presets list precisions",
    "presets list optimizers",
    "presets show llama-3-70b",
    "presets show H100",
    "presets check",
    "train-time --model llama-3-70b --tokens 15T --days 30 --gpu H100",
    "tensor 12288x49152 --dtype fp32",
    "dtypes",
    "params --model deepseek-v3",
]


def run(args: str | list[str], capsys) -> tuple[int, str, str]:
    argv = args.split() if isinstance(args, str) else args
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    out, err = capsys.readouterr()
    return exit_info.value.code, out, err


def _not_json(constant: str):
    raise AssertionError(f"--json printed {constant}, which is not JSON")


def run_json(args: str, capsys) -> dict:
    """Run with --json and parse strictly: NaN and Infinity are not JSON, and strict parsers refuse them."""
    code, out, err = run(args + " --json", capsys)
    assert code == 0, err
    return json.loads(out, parse_constant=_not_json)


def test_a_figure_that_is_not_available_is_json_null():
    from lmcalc.render import to_json
    from lmcalc.result import Result, Section, Term

    result = Result("x", "x", (), (Section("s", "s", (Term("a", "a", float("nan"), "%"),)),), ())
    assert json.loads(to_json(result), parse_constant=_not_json)["results"]["s"]["a"]["value"] is None


@pytest.mark.parametrize("command", ISSUE_COMMANDS)
def test_documented_commands_run(command, capsys):
    code, out, err = run(command, capsys)
    assert code == 0, err
    assert out.strip()


@pytest.mark.parametrize("command", [c for c in ISSUE_COMMANDS if not c.startswith("presets")])
def test_explain_prints_the_derivation(command, capsys):
    code, out, _ = run(command + " --explain", capsys)
    assert code == 0
    assert "derivation" in out and "= " in out


def test_lecture_144_days(capsys):
    # Lecture: 6 · 70e9 · 15e12 / (1024 · 989.5e12 · 0.5 · 86,400 s) ≈ 143.9 days for a 70B model.
    # With the preset's exact N = 70,553,706,496 the answer scales by N / 70e9.
    data = run_json("train-time --model llama-3-70b --gpus 1024xH100 --tokens 15T --mfu 0.5", capsys)
    days = data["results"]["time"]["days"]["value"]
    lecture = 6 * 70e9 * 15e12 / (1024 * 989.5e12 * 0.5 * 86_400)
    assert lecture == pytest.approx(143.9, abs=0.05)
    assert days == pytest.approx(lecture * 70_553_706_496 / 70e9, rel=1e-9)


def test_family_name_says_which_member(capsys):
    data = run_json("train-time --model llama-70b --gpus 1024xH100", capsys)
    assert any("llama-3.1-70b" in note and "family" in note for note in data["notes"])
    assert data["inputs"]["tokens"]["origin"].startswith("preset")
    assert data["inputs"]["mfu"]["origin"].startswith("assumption")


def test_default_tokens_fall_back_to_chinchilla(capsys):
    # mistral-7b has no published token count: 20 tokens per parameter (Hoffmann et al. 2022).
    data = run_json("train-time --model mistral-7b --gpus 64xH100", capsys)
    assert data["inputs"]["tokens"]["value"] == 20 * 7_241_732_096
    assert "20 tokens/parameter" in data["inputs"]["tokens"]["origin"]


def test_deadline_solver_inverts_the_time(capsys):
    data = run_json("train-time --model llama-3-70b --tokens 15T --mfu 0.5 --days 30 --gpu H100", capsys)
    exact = data["results"]["deadline"]["gpus_exact"]["value"]
    # 6·N·D / (30 days · 86,400 s · 989.5e12 · 0.5)
    assert exact == pytest.approx(6 * 70_553_706_496 * 15e12 / (30 * 86_400 * 989.5e12 * 0.5), rel=1e-12)
    assert data["results"]["deadline"]["gpus"]["value"] == -(-exact // 1)
    assert data["results"]["time"]["days"]["value"] <= 30


def test_cost_and_throughput(capsys):
    data = run_json(
        "train-time --model llama-3-70b --gpus 1024xH100 --tokens 15T --mfu 0.5 --price-per-gpu-hour 2", capsys
    )
    time = data["results"]["time"]
    assert time["cost"]["value"] == pytest.approx(2 * time["gpu_hours"]["value"])
    assert time["tokens_per_s_per_gpu"]["value"] * 1024 == pytest.approx(time["tokens_per_s"]["value"])


def test_max_params_lecture_figures(capsys):
    # Lecture: 8 × 80 GB / 16 bytes per parameter ≈ 40B fully sharded; 80 GB / 16 B = 5B replicated. An H100 gives
    # CUDA 85,028,896,768 bytes (deviceQuery's 81090 MBytes), not the label's 80 × 10⁹: 42.5B and 5.3B.
    data = run_json("max-params --gpus 8xH100 --optimizer adamw --framework idealised", capsys)
    assert data["results"]["zero3"]["states_only"]["value"] == pytest.approx(8 * 85_028_896_768 / 16)
    assert data["results"]["zero0"]["states_only"]["value"] == pytest.approx(85_028_896_768 / 16)
    for key in ("zero0", "zero1", "zero2", "zero3"):
        row = data["results"][key]
        assert row["with_activations"]["value"] < row["with_overhead"]["value"] < row["states_only"]["value"]


def test_flops_gpt3(capsys):
    # GPT-3 Table D.1: 3.14e23 FLOPs.
    data = run_json("flops --model gpt-3 --tokens 300B", capsys)
    assert data["results"]["napkin"]["total"]["value"] == pytest.approx(3.14e23, rel=0.005)
    assert data["results"]["napkin"]["total"]["unit"] == "FLOPs"


def test_memory_zero3_shards_states(capsys):
    command = "memory --model llama-3-8b --seq 4096 --micro-batch 1 --gpus 8xH100 --zero 3"
    data = run_json(command + " --framework idealised", capsys)
    state = data["results"]["state"]
    # bf16-mixed AdamW: 16 bytes per parameter, divided over 8 GPUs by ZeRO-3.
    assert state["total"]["value"] == pytest.approx(16 * 8_030_261_248 / 8)
    # torchtitan's FSDP2 keeps the fp32 shard (the master copy), fp32 gradients and Adam's two fp32 states, and
    # gathers the bf16 weights a layer at a time: 4 + 4 + 4 + 4 bytes per parameter, divided over 8 GPUs.
    data = run_json(command + " --framework torchtitan", capsys)
    assert data["results"]["state"]["params"]["value"] == 0
    assert data["results"]["state"]["total"]["value"] == pytest.approx(16 * 8_030_261_248 / 8)
    assert data["results"]["total"]["capacity"]["value"] == 85_028_896_768  # an H100's, as CUDA gives it
    assert "81090 MBytes" in data["results"]["total"]["capacity"]["source"]  # and where that figure comes from


def test_tensor_json_has_units(capsys):
    data = run_json("tensor 4x8 --dtype fp32", capsys)
    assert data["results"]["tensor"]["bytes"] == {
        "value": 128,
        "unit": "bytes",
        "label": "Size",
        "formula": "elements × bytes per element",
        "substituted": "32 × 4",
    }


def test_version(capsys):
    code, out, _ = run("--version", capsys)
    assert code == 0 and out.startswith("lmcalc ")


BAD_INPUT = [
    ("train-time --model lama-3-70b --gpus 8xH100", "unknown model 'lama-3-70b'; did you mean llama-3-70b?"),
    ("train-time --model llama-3-70b --gpus 8xH1000", "unknown hardware 'H1000'"),
    ("train-time --model llama-3-70b --gpus eightH100", "cannot read cluster"),
    ("train-time --model llama-3-70b --gpus 0xH100", "must be positive"),
    ("train-time --model llama-3-70b --gpus 8xH100 --mfu 1.5", "--mfu must be in (0, 1]"),
    ("train-time --model llama-3-70b --gpus 8xH100 --mfu 0", "--mfu must be in (0, 1]"),
    ("train-time --model llama-3-70b --gpus 8xH100 --tokens -5T", "--tokens must be a positive number"),
    ("train-time --model llama-3-70b --gpus 8xH100 --tokens lots", "cannot read --tokens"),
    ("train-time --model llama-3-70b", "give --gpus"),
    ("train-time --model llama-3-70b --days 30", "--days needs the GPU type"),
    ("memory --model llama-3-8b --micro-batch 0", "--micro-batch must be a positive integer"),
    ("memory --model llama-3-8b --zero 5", "--zero must be 0, 1, 2 or 3"),
    ("memory --model llama-3-8b --recompute sometimes", "--recompute must be one of none, selective, full"),
    ("max-params --gpus 8xH100 --optimizer adamx", "unknown optimizer 'adamx'; did you mean adam"),
    ("tensor 12x0", "must be a positive integer"),
    ("tensor 4x8 --dtype fp12", "unknown dtype 'fp12'"),
    ("flops --model llama-3-8b --nonsense", "unknown option --nonsense"),
    ("memory -m llama-3-8b --zerro 3", "unknown option --zerro; did you mean --zero? (see 'lmcalc memory --help')"),
    ("params", "missing option --model (-m) (see 'lmcalc params --help')"),
    ("tensor", "missing argument SHAPE"),
    ("presets show nothing-like-this", "unknown preset"),
    ("optimal --compute 1e24 --precision fp8-mixed", "--precision applies to a cluster"),
    ("optimal --compute 1e24 --mfu 0.5 --price-per-gpu-hour 2", "--mfu, --price-per-gpu-hour apply to a cluster"),
    pytest.param("bench --device cpu --shape 8x8x8 --warmup -1", "--warmup must be 0 or more", marks=pytest.mark.torch),
    # one step of 1e30 tokens is more than the 15T the preset trains on; 1M more than --tokens 100K
    ("plan --model llama-3.1-8b --gpus 8xH100 --global-batch 1e30", "more than the 15,000,000,000,000 training tokens"),
    (
        "plan --model llama-3.1-8b --gpus 8xH100 --global-batch 1M --tokens 100K",
        "1,048,576 tokens is more than the 100,000",
    ),
]


@pytest.mark.parametrize("command,message", BAD_INPUT)
def test_bad_input_is_one_line(command, message, capsys):
    code, out, err = run(command, capsys)
    assert code != 0
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("lmcalc: error: ")
    assert message in lines[0]


def test_unknown_preset_exits_2(capsys):
    code, _, _ = run("flops --model lama-3-70b", capsys)
    assert code == 2


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_yaml_syntax_error_names_file_and_line(tmp_path, capsys):
    path = _write(
        tmp_path,
        "broken.yaml",
        """\
        name: broken
        vocab_size: 1000
        hidden_size: [64
        """,
    )
    code, _, err = run(["flops", "--model", path], capsys)
    assert code == 2 and f"{path}:" in err and "YAML syntax error" in err and len(err.strip().splitlines()) == 1


def test_validation_error_names_field(tmp_path, capsys):
    path = _write(
        tmp_path,
        "bad.yaml",
        """\
        name: bad
        vocab_size: 1000
        hidden_size: 100
        num_layers: 2
        num_heads: 3
        ffn_size: 400
        ffn_kind: swiglu
        norm_kind: rmsnorm
        tied_embeddings: false
        position_embedding: rope
        max_seq_len: 128
        """,
    )
    code, _, err = run(["flops", "--model", path], capsys)
    assert code == 2 and "hidden_size 100 is not divisible by num_heads 3" in err


def test_kv_heads_must_divide_heads(tmp_path, capsys):
    path = _write(
        tmp_path,
        "gqa.yaml",
        """\
        name: gqa
        vocab_size: 1000
        hidden_size: 128
        num_layers: 2
        num_heads: 8
        num_kv_heads: 3
        ffn_size: 400
        ffn_kind: swiglu
        norm_kind: rmsnorm
        tied_embeddings: false
        position_embedding: rope
        max_seq_len: 128
        """,
    )
    code, _, err = run(["flops", "--model", path], capsys)
    assert code == 2 and "num_kv_heads 3 does not divide num_heads 8" in err


def test_negative_size_in_file(tmp_path, capsys):
    path = _write(tmp_path, "neg.yaml", "name: neg\nvocab_size: -5\n")
    code, _, err = run(["flops", "--model", path], capsys)
    assert code == 2 and "vocab_size" in err and len(err.strip().splitlines()) == 1


def test_unreadable_file(tmp_path, capsys):
    code, _, err = run(["flops", "--model", str(tmp_path / "missing.yaml")], capsys)
    assert code == 2 and "no such file" in err


def test_user_preset_directory(tmp_path, monkeypatch, capsys):
    from lmcalc import presets

    (tmp_path / "models").mkdir()
    _write(
        tmp_path / "models",
        "mini.yaml",
        """\
        name: mini
        vocab_size: 1000
        hidden_size: 64
        num_layers: 2
        num_heads: 4
        ffn_size: 256
        ffn_kind: gelu_mlp
        norm_kind: layernorm
        tied_embeddings: true
        position_embedding: learned
        max_seq_len: 128
        """,
    )
    monkeypatch.setenv(presets.PRESET_PATH_ENV, str(tmp_path))
    presets.registry.cache_clear()
    try:
        data = run_json("params --model mini", capsys)
        # V·h + s·h + L·(4h² + 4h + 2·h·f + f + h + 4h) + 2h, LayerNorm with biases, biases off by default:
        # embed 64000 + pos 8192 + 2·(4·4096 + 2·64·256 + 4·64) + 2·64
        assert (
            data["results"]["params"]["total"]["value"] == 64000 + 8192 + 2 * (4 * 4096 + 2 * 64 * 256 + 4 * 64) + 128
        )
    finally:
        presets.registry.cache_clear()


@pytest.mark.cli
def test_accounting_commands_never_import_torch_or_matplotlib(tmp_path):
    from lmcalc.bench import results

    bench = tmp_path / "bench.json"  # a measured step, read by plan --calibration without torch
    figures = {"model": "llama-3-8b", "hfu": 0.5, "hardware_flops_per_step": 1e14}
    results.save(bench, [results.Record("step", "NVIDIA H100 80GB HBM3", "h100-sxm", "bf16", figures)])
    code = textwrap.dedent(f"""
        import sys
        from lmcalc.cli import main
        for argv in (["train-time", "--model", "llama-3-70b", "--gpus", "1024xH100"],
                     ["plan", "--model", "llama-3-8b", "--gpus", "8xH100", "--calibration", {str(bench)!r}],
                     ["memory", "--model", "llama-3-8b", "--gpus", "8xH100", "--zero", "3"],
                     ["memory", "--model", "llama-3-8b", "--inference", "--batch", "4"],
                     ["plan", "--model", "llama-3-8b", "--gpus", "8xH100", "--explain"],
                     ["fit", "--model", "llama-3-8b", "--gpus", "8xH100"],
                     ["optimal", "--gpus", "8xH100", "--days", "7"],
                     ["max-params", "--gpus", "8xH100"], ["flops", "--model", "gpt-3"], ["dtypes"]):
            try:
                main(argv)
            except SystemExit as e:
                assert e.code == 0, argv
        print("torch" in sys.modules, "matplotlib" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "False False"


@pytest.mark.cli
def test_python_dash_m_works():
    out = subprocess.run([sys.executable, "-m", "lmcalc", "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.startswith("lmcalc")


def test_presets_check_fails_on_a_wrong_published_count(tmp_path, capsys):
    path = _write(
        tmp_path,
        "wrong.yaml",
        """\
        name: wrong
        vocab_size: 1000
        hidden_size: 64
        num_layers: 2
        num_heads: 4
        ffn_size: 256
        ffn_kind: gelu_mlp
        norm_kind: layernorm
        tied_embeddings: true
        position_embedding: none
        max_seq_len: 128
        published_params: 12345
        """,
    )
    code, out, _ = run(["presets", "check", path], capsys)
    assert code == 1
    assert "FAIL" in out and "!= published 12,345" in out


def test_presets_check_reports_schema_errors(tmp_path, capsys):
    path = _write(tmp_path, "schema.yaml", "name: x\nvocab_size: 10\nhidden_size: 8\n")
    code, out, _ = run(["presets", "check", path, "--json"], capsys)
    report = json.loads(out)
    assert code == 1 and report["ok"] is False and "num_layers" in report["files"][0]["message"]


def test_memory_layout_flags(capsys):
    # Llama 3 70B on 64 GPUs, TP=8 × PP=4 leaves DP=2; the most loaded GPU is reported.
    data = run_json(
        "memory --model llama-3-70b --gpus 8x8xH100 --tp 8 --pp 4 --sequence-parallel --zero 1 "
        "--grad-accum 16 --seq 8192 --recompute selective",
        capsys,
    )
    assert data["inputs"]["layout"]["value"].startswith("DP=2, TP=8, PP=4")
    assert data["results"]["activations"]["in_flight"]["value"] == 4  # 1F1B: PP micro-batches on stage 1
    assert data["results"]["activations"]["layers_on_gpu"]["value"] == 20


def test_memory_sweep_grows_activations_only(capsys):
    data = run_json("memory --model llama-3-8b --gpus 8xH100 --zero 3 --sweep seq=1k,4k,16k", capsys)
    rows = [data["results"][f"seq={v}"] for v in ("1k", "4k", "16k")]
    acts = [r["activations"]["value"] for r in rows]
    assert acts[0] < acts[1] < acts[2]
    assert len({r["states"]["value"] for r in rows}) == 1
    code, out, _ = run("memory --model llama-3-8b --gpus 8xH100 --zero 3 --sweep micro-batch=1,2", capsys)
    assert code == 0 and "micro-batch=2" in out and "█" in out


def test_memory_stages_shows_every_stage_under_1f1b(capsys):
    # Llama 3.1 8B on 4 stages of 8 layers, 8 micro-batches: under 1F1B stage i holds 4 − i micro-batches
    # (Narayanan et al. 2021 §2.2.1), so its layers' activations are (4 − i) · 8 layers; the first stage adds the
    # int64 token ids and targets once per micro-batch (2 · 8 · s bytes), the last, once, the final norm's and the
    # head's bf16 inputs (2 · 2 · s·h), the norm's fp32 1/rms (4 · s) and the fp32 logits (4 · s·V).
    command = "memory --model llama-3.1-8b --gpus 8xH100 --pp 4 --grad-accum 8 --seq 4096"
    one = run_json(command, capsys)
    layer = one["results"]["activations"]["dense_layer"]["value"]
    data = run_json(command + " --stages", capsys)
    rows = [data["results"][f"stage{i}"] for i in (1, 2, 3, 4)]
    assert [r["in_flight"]["value"] for r in rows] == [4, 3, 2, 1]
    assert [r["layers_on_gpu"]["value"] for r in rows] == [8, 8, 8, 8]
    s, h, vocab = 4096, 4096, 128256
    head_side = 2 * 2 * s * h + 4 * s + 4 * s * vocab
    expected = [4 * 8 * layer + 4 * 2 * 8 * s, 3 * 8 * layer, 2 * 8 * layer, 8 * layer + head_side]
    assert [r["activations"]["value"] for r in rows] == pytest.approx(expected, rel=1e-12)
    # the most loaded row is what plain `memory` reports
    heaviest = max(rows, key=lambda r: r["total"]["value"])
    assert heaviest["total"]["value"] == one["results"]["total"]["total"]["value"]
    assert data["notes"][0].startswith("most loaded: stage 1")
    code, _, err = run(command + " --stages --sweep seq=1k,2k", capsys)
    assert code == 2 and "give --sweep or --stages, not both" in err
    code, _, err = run("memory --model llama-3.1-8b --inference --stages", capsys)
    assert code == 2 and "--stages describes training" in err


def test_bad_sweep_and_layout(capsys):
    code, _, err = run("memory --model llama-3-8b --sweep heads=1,2", capsys)
    assert code == 2 and "cannot read --sweep" in err
    code, _, err = run("memory --model llama-3-8b --gpus 8xH100 --tp 3", capsys)
    assert code == 2 and "TP·PP·CP = 3 does not divide the 8 GPUs" in err


@pytest.mark.parametrize("kind", ["models", "hardware", "precisions", "optimizers"])
def test_presets_schema_describes_the_files(kind, capsys):
    code, out, _ = run(["presets", "schema", kind], capsys)
    schema = json.loads(out)
    assert code == 0 and schema["$schema"].startswith("https://json-schema.org/")
    if kind in ("models", "hardware"):
        assert schema["additionalProperties"] is False and "name" in schema["required"]
    else:
        assert schema["required"] == [kind] and schema["properties"][kind]["type"] == "array"


@pytest.mark.parametrize("name, file", [("H100", "hardware/h100-sxm.yaml"), ("tpu-v4", "hardware/tpu-v4.yaml")])
def test_presets_show_prints_the_file_as_written(name, file, capsys):
    # The file is the record: 'presets show' must give back its values as written (67 stays 67, not 67.0;
    # a list stays a list), whichever way the spec holds them.
    import yaml

    from lmcalc.presets import builtin_dir

    written = yaml.safe_load((builtin_dir() / file).read_text())
    shown = run_json(f"presets show {name}", capsys)
    for key, value in written.items():
        assert shown[key] == value and type(shown[key]) is type(value), key
        if isinstance(value, dict):
            assert all(type(shown[key][k]) is type(v) for k, v in value.items()), key


def test_inference_memory(capsys):
    # Llama 3.1 8B in bf16: 131,072 bytes of KV cache per token (2 · 32 layers · 8 KV heads · 128 · 2 B);
    # the largest batch at 8192 tokens is ⌊(C − weights − 2 GiB) / (8192 · 131,072)⌋, C the H100's memory as CUDA
    # gives it (deviceQuery's 81090 MBytes, 85,028,896,768 bytes).
    data = run_json("memory --model llama-3.1-8b --inference --batch 32 --context 8K", capsys)
    per_gpu = data["results"]["per_gpu"]
    budget = 85_028_896_768 - 8_030_261_248 * 2 - 2 * 2**30
    assert per_gpu["max_batch"]["value"] == budget // (8192 * 131_072)
    assert data["results"]["kv_cache"]["per_token"]["value"] == 131_072
    code, _, err = run("memory --model llama-3.1-70b --inference --weights-dtype fp32", capsys)
    assert code == 2 and "do not fit" in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ("--inference --seq 4K --zero 3", "--seq and --zero describe training, not serving: drop them"),
        ("--inference --micro-batch 2", "--micro-batch describes training, not serving: drop it"),
        ("--batch 4 --kv-dtype fp8", "--batch and --kv-dtype describe serving: add --inference"),
    ],
)
def test_memory_refuses_flags_of_the_other_mode(args, message, capsys):
    # a flag that does not apply is refused, never silently ignored (--inference --seq 4K used to run at 8K)
    code, _, err = run(f"memory --model llama-3.1-8b {args}", capsys)
    assert code == 2 and message in err


def test_inference_context_keeps_its_origin(capsys):
    inputs = run_json("memory --model llama-3.1-8b --inference", capsys)["inputs"]
    assert inputs["context"] == {"value": 8192, "unit": "tokens", "origin": "default: min(model context 131072, 8192)"}
    code, _, err = run("memory --model llama-3.1-8b --inference --context 1000.5", capsys)
    assert code == 2 and "--context must be a whole number of tokens" in err


def test_optimal_command(capsys):
    # Hoffmann et al. 2022 rule: C = 6·N·(20·N) -> N = sqrt(C/120); at 1e24 FLOPs N = 91.29B.
    data = run_json("optimal --compute 1e24", capsys)
    assert data["results"]["rule_of_thumb"]["params"]["value"] == pytest.approx((1e24 / 120) ** 0.5)
    data = run_json("optimal --gpus 1024xH100 --days 30 --mfu 0.4", capsys)
    # C = 1024 GPUs · 989.5e12 FLOP/s · 0.4 · 30 · 86,400 s
    assert data["results"]["budget"]["compute"]["value"] == pytest.approx(1024 * 989.5e12 * 0.4 * 30 * 86_400)
    code, _, err = run("optimal --days 30", capsys)
    assert code == 2 and "give --compute" in err


def test_memory_bar_says_does_not_fit_only_when_the_bytes_overflow():
    from rich.text import Text

    from lmcalc.render import BAR_WIDTH, _bar
    from lmcalc.result import Term

    def drawn(*gigabytes: float) -> str:
        bar = _bar([Term(f"part{i}", f"part {i}", g * 1e9, "bytes") for i, g in enumerate(gigabytes)], 80e9)
        return Text.assemble(bar).plain

    # 79.36 GB of 80 GB is 99.2 %: the bar is full when rounded to 60 cells, yet it fits (headroom 0.64 GB)
    nearly_full = drawn(70.0, 9.36)
    assert "does not fit" not in nearly_full and nearly_full.endswith("│")
    assert nearly_full.count("█") == BAR_WIDTH
    # 80.5 GB overflows by 0.5 GB, although it too rounds to 60 cells
    assert "101 % of capacity: does not fit" in drawn(70.0, 10.5)
    half = drawn(40.0)  # half the capacity: 30 filled cells, 30 free
    assert half.count("█") == 30 and half.count("·") == 30
    # over only by the allocator's fragmentation: tight, as the verdict says (GpuMemory.verdict)
    fragmented = Text.assemble(
        _bar([Term("part", "part", 78e9, "bytes"), Term("total.fragmentation", "fragmentation", 5e9, "bytes")], 80e9)
    ).plain
    assert fragmented.endswith("104 % of capacity: tight")
    over = _bar([Term("part", "part", 81e9, "bytes"), Term("total.fragmentation", "fragmentation", 2e9, "bytes")], 80e9)
    assert Text.assemble(over).plain.endswith("104 % of capacity: does not fit")


def test_memory_advice_gives_what_each_lever_would_need(capsys):
    base = "memory -m llama-3.1-8b --gpus 8xH100 --seq 4096"
    notes = run_json(base, capsys)["notes"]
    advice = next(n for n in notes if n.startswith("does NOT fit"))
    # each lever's figure is what `memory` itself gives with that flag
    zero3 = run_json(base + " --zero 3", capsys)["results"]["total"]["total"]["value"]
    full = run_json(base + " --recompute full", capsys)["results"]["total"]["total"]["value"]
    assert f"--zero 3 ({zero3 / 1e9:.1f} GB, fits)" in advice
    assert f"--recompute full ({full / 1e9:.1f} GB)" in advice
    assert advice.index("--zero 3") < advice.index("--recompute full")  # the larger saving first
    # FlashAttention never stores the s² scores, so selective recomputation is not offered with it
    assert "selective" not in advice
    eager = next(n for n in run_json(base + " --attention eager", capsys)["notes"] if n.startswith("does NOT"))
    assert "--recompute selective (" in eager
