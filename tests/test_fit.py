"""The fit solvers against closed forms: memory is linear in the micro-batch and in 1/DP under ZeRO-3."""

import math

import pytest

from lmcalc.engine.memory.gpu_memory import most_loaded_gpu
from lmcalc.engine.parallel.layout import Layout
from lmcalc.engine.search import fit
from lmcalc.engine.workload import Workload
from lmcalc.presets import framework_profile, resolve_hardware, resolve_model, resolve_optimizer, resolve_precision

MIXED = resolve_precision("bf16-mixed").spec
ADAMW = resolve_optimizer("adamw").spec
H100 = resolve_hardware("H100").spec
OVERHEAD = 2 * 2**30


def setting(model, layout, seq, recompute="none"):
    workload = Workload(
        resolve_model(model).spec,
        MIXED,
        ADAMW,
        seq,
        attention="flash",
        recompute=recompute,
        overhead_bytes=OVERHEAD,
        framework=framework_profile(),
    )
    return fit.Setting(workload, layout, H100.memory_bytes)


def test_largest_micro_batch_is_the_linear_solution():
    # Every activation term is proportional to b, so b_max = ⌊(C − states − overhead) / activations(b=1)⌋.
    s = setting("gpt2-124m", Layout(), 1024)
    one = most_loaded_gpu(s.workload, s.layout)  # b = 1, s = 1024, flash, no recomputation, 2 GiB overhead
    expected = math.floor((H100.memory_bytes - one.states - OVERHEAD) / one.activations)
    limit = fit.largest_micro_batch(s)
    assert limit.value == expected
    assert limit.fits.total <= H100.memory_bytes < limit.beyond.total


def test_fewest_replicas_under_zero3_is_the_closed_form():
    # ZeRO-3: states 16·N/DP; activations, the two gathered layers and the overhead do not depend on DP
    # (for DP ≥ 2: with one replica there is nothing to gather).
    s = setting("llama-3.1-70b", Layout(zero=3), 4096, recompute="full")
    two = most_loaded_gpu(s.workload, Layout(dp=2, zero=3))  # s = 4096, flash, full recomputation, 2 GiB overhead
    fixed = two.phases.busiest + two.zero3_buffers + OVERHEAD  # the inputs saved, or the rebuilt layer beside them
    expected = math.ceil(16 * 70_553_706_496 / (H100.memory_bytes - fixed))
    assert fit.fewest_data_parallel(s).value == expected


def test_without_zero_more_gpus_do_not_help():
    limit = fit.fewest_data_parallel(setting("llama-3.1-70b", Layout(zero=0), 4096, "full"))
    assert limit.value is None and "model states" in limit.binding


def test_longest_sequence_is_the_edge():
    s = setting("llama-3.1-8b", Layout(dp=8, zero=3), 4096, recompute="full")
    limit = fit.longest_sequence(s)
    assert limit.value % 128 == 0
    assert limit.fits.total <= H100.memory_bytes < limit.beyond.total
    assert limit.beyond_value == limit.value + 128


def test_fit_command(capsys):
    from lmcalc.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(
            [
                "fit",
                "--model",
                "llama-3-70b",
                "--gpus",
                "8xH100",
                "--tp",
                "8",
                "--sequence-parallel",
                "--recompute",
                "full",
                "--seq",
                "8192",
                "--zero",
                "1",
                "--json",
            ]
        )
    import json

    data = json.loads(capsys.readouterr().out)
    assert exit_info.value.code == 0
    # TP=8 keeps 70.55B/8 parameters per GPU; ZeRO-1 over DP leaves 4 + 12/DP bytes each.
    assert data["results"]["dp"]["gpus"]["value"] == 8 * data["results"]["dp"]["value"]["value"]
    assert data["results"]["micro_batch"]["value"]["value"] == 0  # 16 B × 8.8B = 141 GB: nothing fits at DP=1


def test_learned_positions_bind_before_memory():
    # GPT-2 has 1024 learned positions: at 1024 tokens a 124M model uses a few GB of 80 (no memory limit).
    limit = fit.longest_sequence(setting("gpt2-124m", Layout(), 1024))
    assert limit.value == 1024 and "learned positions" in limit.binding and limit.fits.total < H100.memory_bytes / 4


@pytest.mark.parametrize("ep, cp, seq_step, dp_step", [(1, 1, 128, 1), (1, 3, 384, 1), (8, 2, 128, 4), (8, 8, 128, 1)])
def test_search_steps_keep_the_layout_valid(ep, cp, seq_step, dp_step):
    # CP must divide the sequence: 128 and 3 first meet at 384. EP must divide DP·CP: with EP 8 and CP 2 the
    # smallest DP is 4 (4·2 = 8), and every DP that works is a multiple of it; with CP 8 any DP does.
    layout = Layout(ep=ep, cp=cp)
    assert fit.sequence_step(layout) == seq_step and fit.data_parallel_step(layout) == dp_step
    assert all((dp * cp) % ep == 0 for dp in range(dp_step, 10 * dp_step, dp_step))
    assert not any((dp * cp) % ep == 0 for dp in range(1, dp_step))
