"""lmcalc bench on the CPU: matmuls, a model's shapes, bandwidth, saved results and the measured peak."""

import json
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from lmcalc.bench import matmul, results  # noqa: E402
from lmcalc.bench.device import FLOPS_PER_CYCLE, cpu_clock_hz, detect  # noqa: E402
from lmcalc.bench.dtypes import DTYPES  # noqa: E402
from lmcalc.bench.timing import Stats, time_calls  # noqa: E402
from lmcalc.cli import main  # noqa: E402
from lmcalc.errors import LmcalcError  # noqa: E402
from lmcalc.presets import resolve_model  # noqa: E402

pytestmark = pytest.mark.torch


def run(args, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    out, err = capsys.readouterr()
    return exit_info.value.code, out, err


@pytest.fixture(autouse=True)
def data_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))  # never write to the real ~/.local/share
    return tmp_path


def test_matmul_measures_and_checks_against_float64():
    meas = matmul.measure((128, 64, 96), matmul.MatmulSettings("fp32", warmup=1, repeats=5), detect("cpu"))
    assert (meas.m, meas.n, meas.k, meas.dtype, meas.tf32) == (128, 64, 96, "fp32", False)
    assert meas.relative_error < 1e-5 and meas.stats.repeats == 5


def test_matmul_rate_by_hand():
    # A (128 × 96) @ (96 × 64) product is 2·m·n·k = 2 × 128 × 64 × 96 = 1,572,864 FLOPs. At a median call
    # of 1 ms that is 1.572864 GFLOP/s, and at the fastest call, 0.5 ms, 3.145728 GFLOP/s.
    meas = matmul.MatmulMeasurement(128, 64, 96, "fp32", Stats(1e-3, 5e-4, 2e-3, 5), 0.0, False)
    assert meas.flops == 1_572_864
    assert meas.flops_per_s == pytest.approx(1.572864e9, rel=1e-12)
    assert meas.best_flops_per_s == pytest.approx(3.145728e9, rel=1e-12)


def test_each_shape_is_measured_once_and_progress_is_told():
    told = []
    shapes = [(32, 32, 32), (64, 32, 16), (32, 32, 32)]
    settings = matmul.MatmulSettings("fp32", warmup=0, repeats=1)
    measured = matmul.measure_shapes(shapes, settings, detect("cpu"), lambda done, total: told.append((done, total)))
    assert [(m.m, m.n, m.k) for m in measured] == [(32, 32, 32), (64, 32, 16)]
    assert told == [(0, 2), (1, 2), (2, 2)]


def test_a_wrong_fast_kernel_is_a_failure(monkeypatch):
    monkeypatch.setattr(matmul, "_product", lambda dtype, device: lambda a, b: torch.zeros(a.shape[0], b.shape[1]))
    with pytest.raises(LmcalcError, match="is wrong"):
        matmul.measure((64, 64, 64), matmul.MatmulSettings("fp32", warmup=0, repeats=2), detect("cpu"))


def test_fp8_without_support_is_one_clear_message():
    with pytest.raises(LmcalcError, match="fp8 matmuls need torch._scaled_mm"):
        matmul.measure((64, 64, 64), matmul.MatmulSettings("fp8", warmup=0, repeats=1), detect("cpu"))


@pytest.mark.parametrize("name", list(DTYPES))
def test_the_dtype_table_agrees_with_torch(name):
    # One table (lmcalc.bench.dtypes) names the torch dtype of each --dtype; its bytes and epsilon come from
    # lmcalc.engine.model.numerics. TF32 is stored as fp32 (4 bytes) but rounds to a 10-bit fraction, so only its
    # bytes are torch's.
    dtype = DTYPES[name]
    info = torch.finfo(dtype.torch())
    assert info.bits // 8 == dtype.bytes
    if name != "tf32":
        assert info.eps == dtype.eps


def test_time_calls_runs_the_hook_before_each_timed_call_only():
    # Warm-up calls get no hook; each timed call is preceded by it (the barrier of a collective), untimed.
    events = []
    seconds = time_calls(lambda i: events.append(f"call {i}"), torch.device("cpu"), 2, 3, lambda: events.append("hook"))
    assert len(seconds) == 3 and all(t >= 0 for t in seconds)
    assert events == ["call 0", "call 1", "hook", "call 2", "hook", "call 3", "hook", "call 4"]


def test_time_calls_leaves_the_hook_out_of_the_times():
    # A 20 ms hook before each call that does nothing: the hook ran once per timed call, and no sample holds
    # its 20 ms (10 ms leaves room for a loaded machine).
    hooks = []

    def hook():
        hooks.append(None)
        time.sleep(0.02)

    seconds = time_calls(lambda i: None, torch.device("cpu"), 1, 5, hook)
    assert len(hooks) == 5 and len(seconds) == 5
    assert all(0 <= t < 0.01 for t in seconds), seconds


def test_cpu_peak_is_labelled_an_estimate():
    cpu = detect("cpu")
    if not cpu.peak_tflops:
        pytest.skip("no vector unit or clock readable on this CPU")
    # peak = cores × clock × FLOPs/cycle (reference: hardware_facts.yaml methods.cpu_peak_fp32)
    assert cpu.peak_is_estimate and "estimate" in cpu.peak_source
    per_cycle = [v for k, v in FLOPS_PER_CYCLE.items() if f"({k})" in cpu.peak_source][0]
    cores = torch.cpu.get_capabilities()["num_physical_cores"]
    # the clock is read again here and may have moved a little since; a wrong FLOPs/cycle would be off by 2×
    assert cpu.peak("fp32") == pytest.approx(cores * cpu_clock_hz() * per_cycle, rel=0.1)


def test_model_shapes_cover_every_weight_matmul():
    # Forward, input-grad and weight-grad matmuls of every weight: 3 × 2 × (matmul weights) FLOPs per token
    # (Kaplan et al. 6·N·D without the embedding lookup), here for Llama 3.2 1B (tied head, GQA 32/8).
    spec = resolve_model("llama-3.2-1b").spec
    h, L, f, V, kv = 2048, 16, 8192, 128256, 8 * 64
    weights = L * (2 * h * h + 2 * h * kv + 3 * h * f) + V * h
    tokens = 512
    assert sum(mm.flops for mm in matmul.model_matmuls(spec, tokens)) == 6 * weights * tokens
    split = matmul.model_matmuls(spec, tokens, tp=2)
    assert sum(mm.flops for mm in split) == 6 * weights * tokens / 2
    with pytest.raises(LmcalcError, match="does not divide"):
        matmul.model_matmuls(spec, tokens, tp=3)


def test_flop_weighted_rate_is_total_flops_over_total_time():
    class Fake:
        def __init__(self, rate):
            self.flops_per_s = rate

    a, b = matmul.ModelMatmul("a", 1, 1, 1, 3), matmul.ModelMatmul("b", 1, 1, 1, 1)  # 6 and 2 FLOPs
    assert matmul.flop_weighted_rate([(a, Fake(6.0)), (b, Fake(1.0))]) == pytest.approx(8 / (1 + 2))


def test_bench_command_saves_results_atomically(capsys, tmp_path):
    path = tmp_path / "results" / "bench.json"  # folders made as needed
    args = ["--device", "cpu", "--repeats", "3", "--save", str(path), "--json"]
    code, out, err = run(["bench", "--shape", "64x64x64", *args], capsys)
    assert code == 0, err
    data = json.loads(out)
    assert data["results"]["matmul"]["achieved"]["unit"] == "FLOP/s"
    assert data["notes"][-1] == f"saved to {path}"
    saved = results.load(path)
    assert saved[0].kind == "matmul" and saved[0].figures["shape"] == [64, 64, 64]
    run(["bench", "matmul", "--shape", "32x32x32", *args], capsys)
    assert len(results.load(path)) == 2  # appended, nothing lost
    assert not list(path.parent.glob("*.tmp"))


def no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)


@pytest.mark.parametrize(
    ("args", "first_line"),
    [
        ([], "No GPU found; CPU measured: Matmul throughput on "),
        (["--device", "cpu"], "CPU (--device cpu), not a GPU: Matmul throughput on "),
        (["memory", "--size", "1MiB"], "No GPU found; CPU measured: Memory bandwidth on "),
    ],
)
def test_bench_without_a_gpu_says_so_first_and_keeps_the_default_file_for_gpus(args, first_line, capsys, monkeypatch):
    # issue 18 item 8: the first line says the CPU was measured, and a CPU result is not written into the default
    # results file (the one --peak measured reads) unless asked, by --save PATH
    no_gpu(monkeypatch)
    shape = [] if args[:1] == ["memory"] else ["--shape", "32x32x32"]
    code, out, err = run(["bench", *args, *shape, "--repeats", "2"], capsys)
    assert code == 0, err
    assert out.splitlines()[0].startswith(first_line)
    assert not results.default_path().exists()
    code, out, _ = run(["bench", *args, *shape, "--repeats", "2", "--json"], capsys)
    data = json.loads(out)
    assert data["title"].startswith(first_line) and not results.default_path().exists()
    asked = f"--save {results.default_path()}"
    assert data["notes"][-1] == f"not saved: a CPU result goes to the default results file only when asked ({asked})"
    code, out, _ = run(["bench", *args, *shape, "--repeats", "2", "--save", str(results.default_path())], capsys)
    assert code == 0 and len(results.load(results.default_path())) == 1  # asked: saved


def test_bench_comm_on_cpu_processes_says_so_and_keeps_the_default_file(capsys, monkeypatch):
    from lmcalc.bench import comm
    from lmcalc.bench.comm.measurement import CommMeasurement

    no_gpu(monkeypatch)
    gloo = CommMeasurement(
        "all-reduce", 2**20, 2**20, 2, "gloo", "spawn", "cpu", "fp32", 0, 1, 1e-3, 1e-3, 1e-3, 1e-3, (1e-3, 1e-3), 0.0
    )
    monkeypatch.setattr(comm, "run_collectives", lambda settings, world_size, backend: [gloo])
    code, out, err = run(["bench", "comm", "--sizes", "1M"], capsys)
    assert code == 0, err
    assert out.splitlines()[0].startswith("No GPU found; CPU measured: Collective bandwidth")
    assert not results.default_path().exists()
    code, out, _ = run(["bench", "comm", "--sizes", "1M", "--backend", "gloo", "--json"], capsys)
    assert json.loads(out)["title"].startswith("CPU (--backend gloo), not a GPU: ")
    # a GPU, but fewer than the ranks: auto falls back to gloo on the CPU, and the CPU result is not saved either
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    code, out, _ = run(["bench", "comm", "--sizes", "1M", "--json"], capsys)
    data = json.loads(out)
    assert data["title"].startswith("CPU (fewer GPUs than ranks), not a GPU: ")
    assert data["notes"][-1].startswith("not saved: a CPU result") and not results.default_path().exists()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "is not valid JSON (Expecting property name enclosed in double quotes at line 1, column 2)"),
        ('{"records": []}', 'is not an lmcalc benchmark file (expected "lmcalc_bench": 1)'),
        (
            '{"lmcalc_bench": 1, "records": [{"kind": "matmul", "device": "x", "hardware": null, "dtype": "fp32", '
            '"figures": {"flops_per_s": 0}}]}',
            "record 1 (matmul): figures.flops_per_s must be a positive finite number; got 0",
        ),
    ],
)
def test_a_malformed_save_target_is_refused_before_measuring(content, message, tmp_path, capsys, monkeypatch):
    # issue 18 item 14: the file --save names is read and checked first, so a long measurement is not lost to a file
    # that cannot take it; the file is left as it was
    def measured(*args, **kwargs):
        raise AssertionError("measured before the save target was checked")

    monkeypatch.setattr(matmul, "measure", measured)
    path = tmp_path / "bench.json"
    path.write_text(content)
    code, out, err = run(["bench", "--device", "cpu", "--shape", "32x32x32", "--save", str(path)], capsys)
    assert (code, out) == (2, "") and err == f"lmcalc: error: {path} {message}\n".replace(
        f"{path} record", f"{path}: record"
    )
    assert path.read_text() == content


@pytest.mark.parametrize("target", ["folder", "read-only file", "read-only folder"])
def test_an_unwritable_save_target_is_refused_before_measuring(target, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(matmul, "measure", lambda *a, **k: pytest.fail("measured before the target was checked"))
    path = tmp_path / "bench.json"
    if target == "folder":
        path.mkdir()
        expected = f"{path} is a folder, not a benchmark results file"
    else:  # os.access says what the user may do (chmod does not stop root, who runs some CI)
        denied = path if target == "read-only file" else tmp_path
        if target == "read-only file":
            results.save(path, [])
        real_access = results.os.access
        monkeypatch.setattr(results.os, "access", lambda p, mode: Path(p) != denied and real_access(p, mode))
        expected = (
            f"cannot save to {path}: the file is read-only"
            if target == "read-only file"
            else f"cannot save to {path}: the folder {tmp_path} is not writable"
        )
    code, _, err = run(["bench", "--device", "cpu", "--shape", "32x32x32", "--save", str(path)], capsys)
    assert (code, err) == (2, f"lmcalc: error: {expected}\n")


def test_bench_model_and_sweep_and_memory(capsys, monkeypatch):
    code, out, err = run(
        [
            "bench",
            "--device",
            "cpu",
            "--model",
            "gpt2",
            "--seq",
            "64",
            "--repeats",
            "2",
            "--warmup",
            "0",
            "--no-save",
            "--json",
        ],
        capsys,
    )
    assert code == 0, err
    assert json.loads(out)["results"]["model"]["achieved"]["value"] > 0
    monkeypatch.setattr(matmul, "sweep_shapes", lambda device: [(32, 32, 32), (64, 64, 64)])
    code, out, _ = run(["bench", "--device", "cpu", "--sweep", "--repeats", "2", "--no-save"], capsys)
    assert code == 0 and "Sweep of 2 shapes" in out
    code, out, err = run(
        ["bench", "memory", "--device", "cpu", "--size", "8MiB", "--repeats", "3", "--no-save", "--json"], capsys
    )
    assert code == 0, err
    assert json.loads(out)["results"]["memory"]["achieved"]["unit"] == "GB/s"


def test_measured_peak_feeds_train_time(tmp_path, capsys):
    path = tmp_path / "bench.json"
    results.save(
        path,
        [
            results.Record(
                "matmul", "NVIDIA H100 80GB HBM3", "h100-sxm", "bf16", {"shape": [8192] * 3, "flops_per_s": 7.9e14}
            )
        ],
    )
    code, out, _ = run(
        [
            "train-time",
            "--model",
            "llama-3-70b",
            "--gpus",
            "1024xH100",
            "--tokens",
            "15T",
            "--mfu",
            "0.5",
            "--calibration",
            str(path),
            "--json",
        ],
        capsys,
    )
    data = json.loads(out)
    assert code == 0 and data["results"]["time"]["peak_per_gpu"]["value"] == 7.9e14
    # 6·N·D / (1024 · 790 TFLOP/s · 0.5) instead of the spec sheet's 989.5
    expected = 6 * 70_553_706_496 * 15e12 / (1024 * 7.9e14 * 0.5 * 86_400)
    assert data["results"]["time"]["days"]["value"] == pytest.approx(expected)
    assert any("measured" in n for n in data["notes"])
    code, _, err = run(["train-time", "--model", "llama-3-70b", "--gpus", "8xA100", "--calibration", str(path)], capsys)
    assert code == 2 and "has no bf16 measurement for a100-80gb" in err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_matmul_matches_a_preset():
    gpu = detect("cuda")
    meas = matmul.measure((4096, 4096, 4096), matmul.MatmulSettings("bf16", warmup=5, repeats=20), gpu)
    peak = gpu.peak("bf16")
    # below the spec sheet's dense peak, and above half of it (an H200 reached 78 % on 2026-12-04)
    assert gpu.hardware is not None and peak is not None and 0.5 * peak < meas.flops_per_s < peak
