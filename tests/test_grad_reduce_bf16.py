"""Megatron-LM's ``--grad-reduce-in-bf16`` (Megatron-Bridge's ``grad_reduce_in_fp32 = False``, set by its performance
recipes): megatron/core/distributed/param_and_grad_buffer.py keeps the gradient buffer in the parameters' bf16 instead
of fp32 main_grad, and the distributed optimizer (megatron/core/optimizer/distrib_optimizer.py) casts its shard of it to
fp32 at the step. Counts derived by hand."""

from __future__ import annotations

import pytest

from lmcalc.engine.memory.gpu_memory import most_loaded_gpu
from lmcalc.engine.parallel.layout import Layout
from lmcalc.engine.workload import Workload
from lmcalc.errors import LmcalcError
from lmcalc.estimates.training import bf16_gradient_buffer
from lmcalc.presets import framework_profile, resolve_model, resolve_optimizer, resolve_precision

N = 8_030_261_248  # Llama 3 8B's parameters


def gpu(profile):
    bf16, adamw = resolve_precision("bf16-mixed").spec, resolve_optimizer("adamw").spec
    w = Workload(resolve_model("llama-3-8b").spec, bf16, adamw, 8192, 1, "flash", "none", framework=profile)
    return most_loaded_gpu(w, Layout(dp=4, cp=2, zero=1))


def test_the_buffer_halves_and_the_step_casts_its_shard():
    fp32, bf16 = gpu(framework_profile("megatron")), gpu(bf16_gradient_buffer(framework_profile("megatron")))
    assert fp32.grads == N * 4 and bf16.grads == N * 2  # the buffer whole on every rank under ZeRO-1
    # the step's fp32 copy of this GPU's shard of the gradients, over DP·CP = 8 replicas
    assert bf16.step_transient - fp32.step_transient == pytest.approx(N * 4 / 8)


def test_only_megatrons_buffer():
    with pytest.raises(LmcalcError, match="Megatron-LM's gradient buffer"):
        bf16_gradient_buffer(framework_profile("torchtitan"))


def test_the_flag(lmcalc_run):
    argv = ["memory", "-m", "llama-3-8b", "--gpus", "8xH100", "--dp", "4", "--cp", "2", "--zero", "1", "--seq", "8192",
            "--framework", "megatron", "--grad-reduce-in-bf16", "--json"]  # fmt: skip
    data = lmcalc_run(argv).json
    assert data["results"]["state"]["grads"]["value"] == N * 2
    assert data["inputs"]["framework"]["origin"].endswith("gradients reduced in bf16")
