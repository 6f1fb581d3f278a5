"""The gradient accumulation a launch's global batch makes once the cluster is known: Megatron-LM and torchtitan give
the global batch in sequences (``--global-batch-size``), lmcalc's training step takes the micro-batches per step.
As Megatron-LM computes it (``megatron/core/num_microbatches_calculator.py``): global batch / (micro-batch · DP)."""

from __future__ import annotations

from typing import Any

from lmcalc.errors import LmcalcError


def grad_accum_of(global_batch: int, settings: dict[str, Any]) -> int:
    """Micro-batches per step for ``global_batch`` sequences on the cluster and layout ``settings`` give (``gpus``,
    ``tp``, ``pp``, ``cp``, ``dp``, ``micro_batch``)."""
    from lmcalc.presets import parse_cluster

    gpus = parse_cluster(settings["gpus"]).count
    model_parallel = int(settings.get("tp") or 1) * int(settings.get("pp") or 1) * int(settings.get("cp") or 1)
    dp = int(settings.get("dp") or gpus // model_parallel or 1)
    micro = int(settings.get("micro_batch") or 1)
    if global_batch % (micro * dp):
        raise LmcalcError(
            f"the global batch of {global_batch} sequences does not split into micro-batches of {micro} over "
            f"{dp} data-parallel replicas; give --grad-accum"
        )
    return max(1, global_batch // (micro * dp))
