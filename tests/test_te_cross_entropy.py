"""Megatron-Core's loss fused in Transformer Engine (``--te-cross-entropy``: ``--cross-entropy-loss-fusion
--cross-entropy-fusion-impl te``, estimates.training.te_cross_entropy), derived here from Transformer Engine v2.8's
transformer_engine/pytorch/cross_entropy.py and triton/cross_entropy.py: ``CrossEntropyFunction`` saves the logits it
is given; ``cross_entropy_forward`` reads them in ``online_softmax_kernel`` (each row's maximum and sum) and again in
``cross_entropy_kernel``, which writes each logit's gradient into them in place; ``cross_entropy_backward`` scales
that gradient in place (``element_mul_kernel``) and returns it. The megatron profile's own count is Megatron-Core's
``_VocabParallelCrossEntropy``: an fp32 copy of the logits kept, the bf16 logits beside it."""

import pytest

from lmcalc.engine.parallel.layout import Grid
from lmcalc.engine.parallel.pipeline import StageLayers
from lmcalc.engine.time.memory_traffic import MemoryTraffic, _loss_traffic, stage_shape
from lmcalc.errors import LmcalcError
from lmcalc.estimates.memory import memory

pytestmark = pytest.mark.fast

S, V = 8192, 128_256  # Llama 3 8B at its context, micro-batch 1: s·b·V logits on the last stage
LOGITS = S * V


def _gpu(**settings):
    return memory(model="llama-3-8b", gpus="8xH100", framework="megatron", seq=S, zero=1, **settings).gpu


def test_the_bf16_logits_are_kept_and_nothing_else_a_logit():
    unfused, te = _gpu(), _gpu(te_cross_entropy=True)
    # kept for backward: the fp32 softmax copy (4 B a logit) becomes the bf16 logits, their gradient written in
    assert unfused.held.outside - te.held.outside == LOGITS * (4 - 2)
    # beyond the kept ones: the bf16 logits beside the fp32 copy, and the backward's new bf16 gradient (2 B a
    # logit) become nothing (the kept logits are the gradient)
    assert unfused.transients.loss == LOGITS * 2
    assert te.transients.loss == 0.0


def test_the_loss_moves_two_reads_and_a_write_forward_and_a_scaling_backward():
    def loss_traffic(**settings) -> MemoryTraffic:
        estimate = memory(model="llama-3-8b", gpus="1xH100", framework="megatron", seq=S, **settings)
        out = MemoryTraffic()
        _loss_traffic(stage_shape(estimate.workload, Grid(1, 1, 1, False, 1), StageLayers(32, 0, False, True)), out)
        return out

    te, unfused = loss_traffic(te_cross_entropy=True), loss_traffic()
    final_norm = S * 4096 * 2  # the final norm's read and write (2 B each), forward, and 3 reads and writes backward
    # forward: the online softmax reads the bf16 logits (2), the loss kernel reads them (2) and writes the
    # gradient in their place (2); backward: read and write them once (2 + 2)
    assert te.forward == pytest.approx(LOGITS * (2 + 2 + 2) + final_norm * 2, rel=1e-12)
    assert te.backward == pytest.approx(LOGITS * (2 + 2) + final_norm * 3, rel=1e-12)
    # unfused: the bf16 logits (ε = 2) and three passes over the fp32 copy (ℓ = 4), forward; two and one back
    assert unfused.forward == pytest.approx(LOGITS * (2 + 3 * 4) + final_norm * 2, rel=1e-12)
    assert unfused.backward == pytest.approx(LOGITS * (2 * 4 + 2) + final_norm * 3, rel=1e-12)
    assert te.kernels == unfused.kernels


def test_only_under_the_megatron_profile():
    with pytest.raises(LmcalcError, match="Megatron-Core's fused cross-entropy"):
        memory(model="llama-3-8b", gpus="8xH100", framework="torchtitan", te_cross_entropy=True)


def test_the_flag(lmcalc_run):
    argv = ["memory", "-m", "llama-3-8b", "--gpus", "8xH100", "--framework", "megatron", "--zero", "1",
            "--seq", str(S), "--te-cross-entropy", "--json"]  # fmt: skip
    data = lmcalc_run(argv).json
    assert data["inputs"]["framework"]["origin"].endswith("Transformer Engine's cross-entropy")
