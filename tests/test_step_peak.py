"""The phase-by-phase peak of a plain PyTorch step (engine.memory.step_peak), derived here by hand, and the
measurement that validate's row 4 sets beside it (measure.step_memory), exercised on the CPU."""

from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")

from lmcalc import measure  # noqa: E402
from lmcalc import validate as val  # noqa: E402
from lmcalc.engine.memory.gpu_memory import gpu_memory  # noqa: E402
from lmcalc.engine.memory.step_peak import plain_step_peak  # noqa: E402
from lmcalc.engine.model.params import count_params  # noqa: E402
from lmcalc.engine.parallel.layout import Layout  # noqa: E402
from lmcalc.engine.workload import Workload  # noqa: E402
from lmcalc.presets import framework_profile, resolve_model, resolve_optimizer, resolve_precision  # noqa: E402
from lmcalc.reference_model import ReferenceModel  # noqa: E402

pytestmark = pytest.mark.torch

N_LLAMA_1B = 1_235_814_400  # Llama 3.2 1B, exact (tied embeddings; shared/reference model shapes)
V_LLAMA_3 = 128_256
BF16, ADAMW = resolve_precision("bf16-pure").spec, resolve_optimizer("adamw").spec


def _workload(s: int, b: int, recompute: str = "none") -> Workload:
    return Workload(
        resolve_model("llama-3.2-1b").spec, BF16, ADAMW, s, b, "flash", recompute, framework=framework_profile()
    )


def _peak(s: int, b: int, recompute: str = "none"):
    return plain_step_peak(_workload(s, b, recompute))


def _activations(s: int, b: int) -> float:
    """Every activation the model saves, bf16 (2 bytes), flash, no recomputation: the whole model on one GPU."""
    return gpu_memory(_workload(s, b), Layout(), 0).activations


def test_short_sequence_peaks_at_the_optimizer_step():
    # bf16-pure AdamW: 2 B weights + 2 B gradients + 2 × 2 B states, and foreach AdamW's sqrt(v): 2 B more.
    p = _peak(1024, 1)
    n = N_LLAMA_1B
    assert p.weights == 2 * n and p.gradients == 2 * n and p.optimizer_states == 4 * n
    assert p.optimizer_temporary == 2 * n
    assert p.loss_backward == 2 * 4 * 1024 * V_LLAMA_3  # two fp32 s·b·V gradients
    a = _activations(1024, 1)
    assert p.phases["backward_start"] == 6 * n + a + 8 * 1024 * V_LLAMA_3  # 10.51e9
    assert p.phases["optimizer_step"] == 10 * n  # 12.36e9
    assert p.peak_phase == "optimizer_step" and p.peak == 10 * n
    # A SwiGLU layer's backward holds the gate and up gradients, 2·s·b·f in bf16 (f = 8192); at the end of
    # backward the tied matrix's two gradient parts, 2·V·h in bf16 (h = 2048), outweigh the first layer.
    assert p.first_layer.mlp == p.last_layer.mlp == 2 * 1024 * 8192 * 2
    assert p.phases["backward_end"] == 8 * n + 2 * V_LLAMA_3 * 2048 * 2  # 10.94e9


def test_a_recipe_with_a_master_copy_is_not_a_plain_loop():
    with pytest.raises(ValueError, match="master copy"):
        plain_step_peak(
            Workload(
                resolve_model("llama-3.2-1b").spec,
                resolve_precision("bf16-mixed").spec,
                ADAMW,
                1024,
                1,
                framework=framework_profile(),
            )
        )


def test_long_batch_peaks_when_backward_starts():
    p = _peak(2048, 2)
    a = _activations(2048, 2)
    start = 6 * N_LLAMA_1B + a + 8 * 2048 * 2 * V_LLAMA_3  # 7.41e9 + 8.18e9 + 4.20e9 ≈ 19.8e9
    assert p.peak_phase == "backward_start" and p.peak == start > 10 * N_LLAMA_1B


def test_full_recompute_keeps_layer_inputs_and_rebuilds_one_layer():
    spec = resolve_model("llama-3.2-1b").spec
    p, none = _peak(2048, 2, "full"), _peak(2048, 2)
    layer = none.first_layer.saved  # one layer's saved tensors without recomputation
    checkpoint = 2048 * 2 * spec.hidden_size * 2  # a layer's bf16 input
    assert p.first_layer.saved == checkpoint + layer  # its input and the rebuilt layer
    assert p.last_layer.saved == layer and none.last_layer.saved == 0  # beyond A: only a rebuilt layer
    outside = none.activations - spec.num_layers * layer  # embedding, final norm, head input, logits
    assert p.activations == spec.num_layers * checkpoint + outside  # the rebuilt layer comes later
    assert p.peak < none.peak


def test_every_phase_and_the_peak_explain_themselves():
    terms = {t.key: t for t in _peak(1024, 1).terms()}
    assert terms["peak"].value == 10 * N_LLAMA_1B  # bf16-pure AdamW at the optimizer step, by hand above
    assert "optimizer step" in terms["peak"].note
    assert terms["loss_backward"].substituted == "2 × 4 × 1.31334e+08"  # s·b·V = 1024 × 128,256 = 131,334,144


class Counter(measure.AllocatorStats):
    """Each read returns the next integer: the fields show in which order the phases were read."""

    def __init__(self):
        self.reads, self.resets = 0, []

    def allocated(self) -> int:
        self.reads += 1
        return self.reads

    def peak(self) -> int:
        self.reads += 1
        return 100 + self.reads

    def reset_peak(self) -> None:
        self.resets.append(self.reads)


def test_step_memory_reads_each_phase_in_order_and_counts_adamw_states():
    spec = val.small_config(resolve_model("llama-3.2-1b").spec)
    model = ReferenceModel(spec, "flash", max_seq=32)
    optimizer = torch.optim.AdamW(model.parameters())
    tokens = torch.randint(0, spec.vocab_size, (2, 32))
    stats = Counter()
    measure.step_memory(model, optimizer, tokens, "none", stats)
    m = measure.step_memory(model, optimizer, tokens, "none", Counter())
    assert (m.baseline, m.after_forward, m.peak_forward, m.after_backward, m.peak_backward) == (1, 2, 103, 4, 105)
    assert m.peak_optimizer == 106 and stats.resets == [1, 3, 5]  # reset before forward, backward, step
    weights = count_params(spec).total * 4  # lmcalc's count of the config, fp32
    assert m.weights == weights and m.optimizer_states == 2 * weights  # fp32 exp_avg and exp_avg_sq
    assert all(p.grad is None for p in model.parameters())  # zero_grad(set_to_none=True) ran


def _fake_cuda(monkeypatch, measured_peak: float):
    predicted = _peak(1024, 1)
    phases = predicted.phases
    measured = measure.StepMemory(
        weights=int(predicted.weights),
        optimizer_states=int(predicted.optimizer_states),
        buffers=0,
        baseline=int(predicted.weights + predicted.optimizer_states),
        after_forward=int(phases["backward_start"] - predicted.loss_backward),
        peak_forward=0,
        peak_backward=int(phases["backward_start"]),
        after_backward=int(predicted.weights + predicted.optimizer_states + predicted.gradients),
        peak_optimizer=int(measured_peak),
    )
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    real = measure.measured_step

    def on_a_fake_gpu(*args):
        return (predicted, measured, "llama-3.2-1b, bf16") if args[-1] == "cuda" else real(*args)

    monkeypatch.setattr(measure, "measured_step", on_a_fake_gpu)
    return predicted


@pytest.mark.parametrize("factor, ok", [(1.05, True), (1.2, False)])
def test_row_4_fails_when_the_measured_peak_is_far_off(monkeypatch, factor, ok):
    predicted = _fake_cuda(monkeypatch, factor * _peak(1024, 1).peak)
    rows = {s.key: s for s in val._peak_memory_rows(resolve_model("llama-3.2-1b").spec, 1024, 1, "none")}
    assert rows["peak_memory"].term("error").ok is ok
    assert rows["peak_memory"].term("pytorch").value == pytest.approx(factor * predicted.peak)
    parts = ("buffers", "states", "activations", "gradients", "backward", "optimizer")
    parts = [f"peak_memory_{part}" for part in parts]
    assert all(rows[key].term("error").ok is None for key in parts)  # what the difference is made of


# Row 4's CPU twin: the same timeline on small models in fp32, every live storage counted by
# measure.StorageTracker. Two shapes × the recomputation modes × three architectures × both attention
# kernels, so a phase formula that fits one point fails elsewhere. (MLA is left out: CPU sdpa runs its
# unequal head sizes unfused. Fused attention's selective recomputation differs from none only by the
# log-sum-exp, so it is left out.)
CPU_CASES = [
    (name, s, b, recompute, attention)
    for name in ("llama-3.2-1b", "gpt2-124m", "mixtral-8x7b")
    for s, b in ((128, 1), (512, 2))
    for attention, modes in (("flash", ("none", "full")), ("eager", ("none", "selective", "full")))
    for recompute in modes
]
# measured: within 0.1 % (fused, none), 0.4 % (eager, none), 0.8 % (full), 1.4 % (eager, selective)
PEAK_TOLERANCE = {
    ("flash", "none"): 0.002,
    ("eager", "none"): 0.005,
    ("eager", "selective"): 0.02,
    ("flash", "full"): 0.01,
    ("eager", "full"): 0.01,
}


def _small(name: str):
    return val.small_config(resolve_model(name).spec).model_copy(update={"dropout": False})


@pytest.mark.parametrize("name, s, b, recompute, attention", CPU_CASES)
def test_step_timeline_matches_live_storages_on_the_cpu(name, s, b, recompute, attention):
    predicted, m, _ = measure.measured_step(_small(name), s, b, recompute, "cpu", attention)
    assert predicted.weights + predicted.optimizer_states == m.baseline - m.buffers  # exact
    assert predicted.gradients == pytest.approx(m.gradients, abs=8)  # the loss scalar is still alive
    assert predicted.activations == pytest.approx(m.activations, rel=0.005)  # measured: within 0.4 %
    assert predicted.phases["optimizer_step"] == pytest.approx(m.peak_optimizer - m.buffers, rel=1e-5)
    backward = predicted.backward_peak
    tolerance = PEAK_TOLERANCE[(attention, recompute)]
    assert backward == pytest.approx(m.peak_backward - m.buffers, rel=tolerance)
    assert predicted.peak == pytest.approx(m.peak - m.buffers, rel=tolerance)


def test_a_large_tied_vocabulary_peaks_as_its_two_gradient_parts_are_summed():
    # The small models above have V = 256, too small for the tied term to matter. With V = 32,768 and h = 64
    # at s = 64, under full recomputation (so that the saved activations stay small), the end of the
    # backward pass is set by the shared matrix: the head's gradient (V·h, fp32), waiting since the backward
    # began, and the embedding's, summed into a third out of place, on top of every other gradient:
    # G + 2·V·h·4 B. That is where the engine puts the peak, and where PyTorch has it.
    spec = _small("llama-3.2-1b").model_copy(update={"vocab_size": 32768})
    assert spec.tied_embeddings
    predicted, m, _ = measure.measured_step(spec, 64, 1, "full")
    assert predicted.backward_end_extra == 2 * 32768 * 64 * 4
    assert predicted.peak_phase == "backward_end"
    assert predicted.peak == pytest.approx(m.peak - m.buffers, rel=1e-4)


def test_the_cpu_timeline_check_can_fail(monkeypatch):
    # Llama's small model at s=512, b=2 peaks as the backward starts, with the cross-entropy's two fp32
    # s·b·V gradients (or a layer's 2·s·b·f, the same here: V = f = 256) on top of the activations:
    # without them the engine falls 12 % short of what PyTorch holds, and validate's CPU row says so.
    real = measure.plain_step_peak

    def without_transients(*args, **kwargs):
        peak = real(*args, **kwargs)
        return replace(peak, loss_backward=0.0, last_layer=replace(peak.last_layer, mlp=0.0, attention=0.0))

    monkeypatch.setattr(measure, "plain_step_peak", without_transients)
    rows = {sec.key: sec for sec in val._cpu_step_rows(_small("llama-3.2-1b"), 512, 2, "none")}
    assert rows["peak_memory_cpu"].term("error").ok is False
    assert rows["peak_memory_cpu"].term("error").value < -10


def test_a_model_too_large_for_the_gpu_check_keeps_its_layer_shapes():
    budget = 0.25 * 141e9 / 8  # a quarter of an H200 at 8 bytes per parameter of bf16-pure AdamW states
    small = resolve_model("llama-3.2-1b").spec
    assert measure.model_that_fits(small, budget) is small
    # Llama 3 70B: 80 layers of 0.869 B parameters; embedding and output head 1.05 B each (untied).
    llama = resolve_model("llama-3-70b").spec
    cut = measure.model_that_fits(llama, budget)
    assert (cut.num_layers, cut.hidden_size, cut.ffn_size) == (2, 8192, 28672)  # 2.10 + 2 × 0.869 ≤ 4.41 B
    assert count_params(cut).total <= budget < count_params(cut.model_copy(update={"num_layers": 3})).total
    # Mixtral 8x7B: embedding and head 2 × 32,000 × 4096 = 0.262 B; a layer 1.451 B (8 experts × 3 × 4096 × 14,336
    # = 1.409 B, attention 2·4096² + 2·4096·1024 = 0.042 B), so 0.262 + 2 × 1.451 ≤ 4.41 B < 0.262 + 3 × 1.451
    mixtral = measure.model_that_fits(resolve_model("mixtral-8x7b").spec, budget)
    assert mixtral.moe is not None and mixtral.moe.num_experts == 8 and mixtral.num_layers == 2


def test_gpu_check_says_what_it_needs_without_cuda(tmp_path):
    import subprocess
    from pathlib import Path

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the script would run")
    script = Path(__file__).resolve().parent.parent / "scripts" / "gpu_check.sh"
    run = subprocess.run(["bash", str(script), str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "needs torch with CUDA" in run.stdout
    assert (tmp_path / "summary.txt").read_text().startswith("gpu_check: needs torch with CUDA")


FAKE_PYTHON = r"""#!/usr/bin/env bash
# stands in for a CUDA machine's python3: canned answers, except the script's own summariser
case "$1" in
  -) exec python3 "$@" ;;
  -c) [[ $2 == *get_device_properties* ]] && echo "device: fake"; exit 0 ;;
esac
if [[ " $* " == *" validate "* ]]; then
  cat <<'JSON'
{"results": {
  "params": {"lmcalc": {"value": 1235814400, "unit": "params"}, "pytorch": {"value": 1235814400, "unit": "params"},
             "error": {"value": 0.0, "unit": "%", "pass": true}},
  "peak_memory": {"lmcalc": {"value": 12.0e9, "unit": "bytes"}, "pytorch": {"value": 14.0e9, "unit": "bytes"},
                  "error": {"value": -14.3, "unit": "%", "pass": false}},
  "peak_memory_buffers": {"lmcalc": {"value": 0.0, "unit": "bytes"}, "pytorch": {"value": 6.7e7, "unit": "bytes"},
                          "error": {"value": null, "unit": "%"}}},
 "notes": ["1 check failed: peak_memory"]}
JSON
  exit 1
fi
if [[ " $* " == *" 8192x8192x8192 "* ]]; then
  echo '{"results": {"matmul": {"achieved": {"value": 7.8e14, "unit": "FLOP/s"}, "mfu": {"value": null, "unit": ""}}}}'
  exit 0
fi
echo "lmcalc: error: simulated failure" >&2
exit 2
"""


def test_gpu_check_summary_reads_nulls_failures_and_validates_verdict(tmp_path):
    # the script's bookkeeping, run with a stand-in interpreter: a null figure prints as n/a, validate's exit 1
    # (a check failed) still gives its judged rows, a failing step shows its own error, and the run exits 1
    import os
    import subprocess
    from pathlib import Path

    fake = tmp_path / "python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    script = Path(__file__).resolve().parent.parent / "scripts" / "gpu_check.sh"
    out = tmp_path / "out"
    env = {**os.environ, "PYTHON": str(fake)}
    run = subprocess.run(["bash", str(script), str(out)], capture_output=True, text=True, timeout=120, env=env)
    summary = (out / "summary.txt").read_text()
    assert run.returncode == 1, summary
    assert "matmul_bf16_8192 (" in summary and "matmul.achieved=7.8e+14 FLOP/s; matmul.mfu=n/a" in summary
    validate = next(line for line in summary.splitlines() if line.startswith("validate_llama_1b"))
    assert "exit 1" in validate and "params: lmcalc 1.236e+09 params, pytorch 1.236e+09 params, ok" in validate
    assert "peak_memory: lmcalc 1.2e+10 bytes, pytorch 1.4e+10 bytes, FAIL" in validate
    assert "peak_memory_buffers" not in validate and "1 check failed: peak_memory" in validate
    assert "sweep_bf16 FAILED after" in summary and "(exit 2): lmcalc: error: simulated failure" in summary
    assert summary.rstrip().endswith("with failures")
