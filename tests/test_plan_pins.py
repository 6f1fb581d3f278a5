"""The planner's pins for every layout field (DP, the schedule, the virtual stages, sequence parallelism) and its
micro-batches beyond powers of two, through the engine, the Python API and the command line."""

import pytest

import lmcalc
from lmcalc.cli import main
from lmcalc.cli.training import plan as plan_command
from lmcalc.engine.memory.gpu_memory import most_loaded_gpu
from lmcalc.engine.parallel.layout_checks import check_layout
from lmcalc.engine.search.plan import MAX_MICRO_BATCH, VIRTUAL_STAGES, Pins, layouts, plan
from lmcalc.engine.workload import Workload
from lmcalc.errors import LmcalcError
from lmcalc.presets import framework_profile, parse_cluster, resolve_model, resolve_optimizer, resolve_precision

BF16 = resolve_precision("bf16-mixed").spec
ADAMW = resolve_optimizer("adamw").spec


def llama_8b(seq: int = 4096) -> Workload:
    return Workload(
        resolve_model("llama-3.1-8b").spec, BF16, ADAMW, seq, overhead_bytes=0.0, framework=framework_profile()
    )


def searched(cluster: str, global_batch: int, pins: Pins, seq: int = 4096):
    """Every (layout, micro-batch) the search tries for Llama 3.1 8B."""
    found = layouts(llama_8b(seq), parse_cluster(cluster), global_batch, pins)
    return [(layout, workloads[0].micro_batch) for layout, workloads in found]


def run(args: str, capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(args.split())
    out, err = capsys.readouterr()
    return exit_info.value.code, out, err


# ------------------------------------------------------------------------------------------------ micro-batches


def test_every_micro_batch_that_divides_a_replicas_sequences_is_tried():
    # 8 GPUs, DP = 2 (TP 4), 96 sequences a step: 48 sequences a replica, whose divisors up to 16 are
    # 1, 2, 3, 4, 6, 8, 12 and 16; the powers of two alone would miss 3, 6 and 12.
    tried = {mb for layout, mb in searched("8xH100", 96, Pins(tp=4, pp=1, cp=1, zero=1))}
    assert tried == {1, 2, 3, 4, 6, 8, 12, 16}
    for layout, mb in searched("8xH100", 96, Pins(tp=4, pp=1, cp=1, zero=1)):
        assert layout.dp * mb * layout.grad_accum == 96


def test_the_largest_micro_batch_can_be_raised_or_lowered():
    # 48 sequences a replica: up to 24 adds 24; up to 5 leaves 1, 2, 3, 4. A pinned micro-batch ignores the limit.
    assert {mb for _, mb in searched("8xH100", 96, Pins(tp=4, pp=1, cp=1, zero=1, max_micro_batch=24))} == {
        1, 2, 3, 4, 6, 8, 12, 16, 24,
    }  # fmt: skip
    assert {mb for _, mb in searched("8xH100", 96, Pins(tp=4, pp=1, cp=1, zero=1, max_micro_batch=5))} == {1, 2, 3, 4}
    assert {mb for _, mb in searched("8xH100", 96, Pins(tp=4, pp=1, cp=1, zero=1, micro_batch=48))} == {48}
    assert MAX_MICRO_BATCH == 16


def test_the_search_skips_only_micro_batches_that_cannot_fit():
    # Once a micro-batch overflows, the larger ones of the same layout and recomputation are counted without their
    # memory being computed (memory does not fall as the micro-batch grows). Every candidate computed by brute
    # force: the same ones fit, the same one misses by least, and as many were evaluated.
    w, cluster = llama_8b(8192), parse_cluster("8xH100")
    pins = Pins(cp=1, zero=1, max_micro_batch=24)
    fits, misses, evaluated = set(), [], 0
    for layout, workloads in layouts(w, cluster, 48, pins):
        try:
            check_layout(workloads[0], layout, cluster)
        except LmcalcError:
            continue
        for one in workloads:
            evaluated += 1
            total = most_loaded_gpu(one, layout).total
            if total <= cluster.hardware.capacity_bytes:  # CUDA's total, where the preset measured it
                fits.add((layout, one))
            else:
                misses.append(total)
    found = plan(w, cluster, 48, pins)
    assert {(c.layout, c.workload) for c in found.fitting} == fits and found.evaluated == evaluated
    assert misses and len(fits) < evaluated  # some do not fit, so some were skipped
    closest = plan(w, cluster, 48, Pins(tp=1, pp=1, cp=1, zero=0, recompute="none")).closest
    assert closest is not None and closest.micro_batch == 1  # nothing fits without sharding: the smallest misses least


def test_the_command_states_the_default_largest_micro_batch():
    (option,) = [p for p in plan_command.__signature__.parameters.values() if p.name == "max_micro_batch"]
    assert f"(default {MAX_MICRO_BATCH})" in option.annotation.__metadata__[0].help


# -------------------------------------------------------------------------------------------------------- DP


def test_a_pinned_dp_keeps_only_its_layouts():
    found = searched("8xH100", 64, Pins(dp=2, cp=1, zero=1, micro_batch=1))
    assert found and {layout.dp for layout, _ in found} == {2}
    assert {layout.tp * layout.pp for layout, _ in found} == {4}


@pytest.mark.parametrize(
    "pins,message",
    [
        (Pins(dp=3), "DP=3 does not divide the 8 GPUs of 8xh100-sxm"),
        (Pins(dp=8), "DP=8 does not divide the global batch of 12 sequences"),
        (Pins(dp=2, tp=2, pp=1, cp=1), "DP·TP·PP·CP = 2·2·1·1 = 4 does not equal the 8 GPUs"),
    ],
)
def test_a_dp_no_layout_can_have_is_refused(pins, message):
    with pytest.raises(LmcalcError, match=message):
        plan(llama_8b(), parse_cluster("8xH100"), 12, pins)


# -------------------------------------------------------------------------------------- schedule, virtual stages


def test_the_schedule_pinned_interleaved_keeps_only_interleaved_layouts():
    found = searched("8xH100", 64, Pins(tp=1, cp=1, zero=1, micro_batch=1, schedule="interleaved"))
    assert found and all(layout.split.schedule == "interleaved" for layout, _ in found)
    assert {layout.split.virtual_stages for layout, _ in found} == set(VIRTUAL_STAGES)
    assert all(layout.pp > 1 for layout, _ in found)


def test_the_schedule_pinned_1f1b_keeps_only_1f1b_layouts():
    found = searched("8xH100", 64, Pins(tp=1, cp=1, zero=1, micro_batch=1, schedule="1f1b"))
    assert found and all(layout.split.chunks == 1 for layout, _ in found)
    assert {layout.pp for layout, _ in found} == {1, 2, 4, 8}


def test_pinned_virtual_stages_imply_the_interleaved_schedule():
    found = searched("8xH100", 64, Pins(tp=1, cp=1, zero=1, micro_batch=1, virtual_stages=4))
    assert found and {(layout.split.schedule, layout.split.virtual_stages) for layout, _ in found} == {
        ("interleaved", 4)
    }
    one = searched("8xH100", 64, Pins(tp=1, cp=1, zero=1, micro_batch=1, virtual_stages=1))
    assert one and all(layout.split.schedule == "1f1b" for layout, _ in one)


def test_a_pinned_interleaved_layout_that_cannot_exist_says_why():
    # Llama 3.1 8B has 32 layers: PP 16 × 3 virtual stages = 48 chunks would leave some without a layer.
    with pytest.raises(LmcalcError, match="needs at least one layer per chunk: 32 layers < PP × virtual stages = 48"):
        plan(llama_8b(), parse_cluster("2x8xH100"), 64, Pins(pp=16, virtual_stages=3))
    # 8 stages, one replica, 12 sequences: no number of micro-batches (12, 6, 4, 3, 2, 1) is divisible by 8.
    with pytest.raises(LmcalcError, match="divisible by PP=8"):
        plan(llama_8b(), parse_cluster("8xH100"), 12, Pins(pp=8, schedule="interleaved"))


@pytest.mark.parametrize(
    "settings,message",
    [
        ({"schedule": "gpipe"}, "schedule must be one of 1f1b, interleaved; got 'gpipe'"),
        ({"schedule": "1f1b", "virtual_stages": 2}, "virtual_stages applies to schedule interleaved only"),
        ({"schedule": "interleaved", "virtual_stages": 1}, "needs virtual_stages 2 or more"),
        ({"virtual_stages": 2, "pp": 1}, "the interleaved schedule needs pipeline stages: pp 2 or more"),
        ({"virtual_stages": 0}, "virtual_stages must be a positive integer, got 0"),
        ({"dp": 0}, "dp must be a positive integer, got 0"),
        ({"max_micro_batch": -1}, "max_micro_batch must be a positive integer, got -1"),
        ({"sequence_parallel": "yes"}, "sequence_parallel must be true or false"),
    ],
)
def test_pins_check_themselves(settings, message):
    with pytest.raises(LmcalcError) as error:
        Pins(**settings)
    assert message in str(error.value)


# ----------------------------------------------------------------------------------------- sequence parallelism


def test_sequence_parallelism_is_on_wherever_tp_splits_unless_pinned_off():
    on = searched("8xH100", 64, Pins(pp=1, cp=1, zero=1, micro_batch=1))
    assert {layout.tp for layout, _ in on} == {1, 2, 4, 8}
    assert all(layout.sequence_parallel == (layout.tp > 1) for layout, _ in on)
    off = searched("8xH100", 64, Pins(pp=1, cp=1, zero=1, micro_batch=1, sequence_parallel=False))
    assert {layout.tp for layout, _ in off} == {1, 2, 4, 8}
    assert not any(layout.sequence_parallel for layout, _ in off)


def test_without_sequence_parallelism_a_layout_needs_more_memory():
    # TP 8 without SP keeps the norms' and the linear layers' inputs whole on every rank (Korthikanti et al. eq. 2
    # against eq. 4): the same layout needs more memory, and the winner's label says no SP.
    pins = Pins(tp=8, pp=1, cp=1, zero=1, micro_batch=1, recompute="selective")
    with_sp = plan(llama_8b(8192), parse_cluster("8xH100"), 8, pins).fitting[0]
    without = plan(llama_8b(8192), parse_cluster("8xH100"), 8, Pins(**{**pins.__dict__, "sequence_parallel": False}))
    best = without.fitting[0]
    assert not best.layout.sequence_parallel and "SP" not in best.layout.label.split(", ")
    assert best.memory.activations > with_sp.memory.activations


# -------------------------------------------------------------------------------------------- API and command


def test_the_python_api_takes_every_pin():
    found = lmcalc.plan(
        model="llama-3.1-8b",
        gpus="2x8xH100",
        seq=4096,
        global_batch="192K",  # 48 sequences: 6 a replica at DP 8
        dp=8,
        tp=2,
        zero=1,
        schedule="1f1b",
        sequence_parallel=False,
        max_micro_batch=6,
        recompute="full",
    )
    assert {c.dp for c in found.layouts} == {8} and {c.tp for c in found.layouts} == {2}
    assert not any(c.layout.sequence_parallel for c in found.layouts)
    assert {c.micro_batch for c in found.layouts} == {1, 2, 3, 6}
    with pytest.raises(LmcalcError, match="schedule must be one of 1f1b, interleaved"):
        lmcalc.plan(model="llama-3.1-8b", gpus="8xH100", schedule="zb")


def test_the_command_takes_every_pin(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")  # each ranked layout on one line
    code, out, err = run(
        "plan -m llama-3.1-8b --gpus 2x8xH100 --seq 4096 --global-batch 256K --dp 4 --tp 2 --cp 1 --pp 2 --zero 1 "
        "--schedule interleaved --virtual-stages 2 --no-sequence-parallel --micro-batch 2 --recompute none --top 3",
        capsys,
    )
    assert code == 0, err
    ranked = [line for line in out.splitlines() if line[:3] in ("1. ", "2. ", "3. ")]
    # each row's layout code (docs/commands/plan.md): DP4 TP2 PP2 Z1, interleaved with 2 virtual stages, no SP
    assert ranked and all(line.split()[1:6] == ["DP4", "TP2", "PP2", "Z1", "v2"] for line in ranked)
    assert not any("SP" in line.split() for line in ranked)


@pytest.mark.parametrize(
    "flags,message",
    [
        ("--schedule gpipe", "--schedule must be one of 1f1b, interleaved; got 'gpipe'"),
        ("--virtual-stages 2 --schedule 1f1b", "--virtual-stages applies to --schedule interleaved only"),
        ("--schedule interleaved --pp 1", "the interleaved schedule needs pipeline stages: --pp 2 or more"),
        ("--dp 3", "DP=3 does not divide the 8 GPUs of 8xh100-sxm"),
        ("--max-micro-batch 0", "--max-micro-batch must be a positive integer, got 0"),
    ],
)
def test_a_bad_pin_is_one_line_naming_the_flag(flags, message, capsys):
    code, _, err = run(f"plan -m llama-3.1-8b --gpus 8xH100 --global-batch 256K {flags}", capsys)
    assert code == 2 and err == f"lmcalc: error: {message}\n"
