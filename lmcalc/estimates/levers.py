"""What would make a training run fit when nothing does: each lever pulled alone from the user's layout, at one
sequence per micro-batch, with the memory of the most loaded GPU it then needs (``lmcalc memory``'s figure).

The levers are the ones a user has: a higher ZeRO stage, full recomputation, tensor or pipeline parallelism within
the same GPUs (DP shrinks to keep their count), LoRA or QLoRA instead of full training, and more GPUs under ZeRO-3.
A lever that cannot apply (a TP that does not divide the heads, a PP the layers cannot take) is left out.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

from lmcalc.engine.finetune.method import Method
from lmcalc.engine.memory.gpu_memory import most_loaded_gpu
from lmcalc.engine.parallel.layout import Layout, check_layout
from lmcalc.engine.workload import Workload
from lmcalc.errors import LmcalcError
from lmcalc.estimates.inputs import DEFAULT_FRAMEWORK, FINE_TUNING_FRAMEWORK, framework_of
from lmcalc.result import Section, Term
from lmcalc.specs import Cluster

MOST_GPUS = 1 << 16  # the search for more GPUs stops here


def _regrouped(layout: Layout, **degrees: int) -> Layout | None:
    """``layout`` with new TP or PP degrees on the same GPUs (DP takes what is left), or None if they do not divide."""
    others = layout.tp * layout.pp * layout.cp
    new = degrees.get("tp", layout.tp) * degrees.get("pp", layout.pp) * layout.cp
    if (layout.dp * others) % new:
        return None
    tp, pp = degrees.get("tp", layout.tp), degrees.get("pp", layout.pp)
    return replace(layout, dp=layout.dp * others // new, tp=tp, pp=pp)


def _candidates(w: Workload, layout: Layout, cluster: Cluster) -> Iterator[tuple[str, Workload, Layout | None]]:
    for zero in (1, 2, 3):
        if zero > layout.zero and layout.data_replicas > 1:
            yield f"--zero {zero}", w, replace(layout, zero=zero)
    if w.recompute != "full":
        yield "--recompute full", replace(w, recompute="full"), layout
    for tp in (2, 4, 8):
        if layout.tp < tp <= cluster.gpus_per_node:
            regrouped = _regrouped(layout, tp=tp)
            yield f"--tp {tp} --sequence-parallel", w, regrouped and replace(regrouped, sequence_parallel=True)
    for pp in (2, 4, 8):
        if pp > layout.pp:
            regrouped = _regrouped(layout, pp=pp)
            yield f"--pp {pp}", w, regrouped and replace(regrouped, grad_accum=max(layout.grad_accum, pp))
    if w.method.kind == "full":
        # an adapter method runs under transformers unless another framework was chosen (training_setup's rule)
        framework = framework_of(FINE_TUNING_FRAMEWORK) if w.framework.name == DEFAULT_FRAMEWORK else w.framework
        for kind in ("lora", "qlora"):
            yield f"--method {kind}", replace(w, method=Method(kind), framework=framework), layout
    for tp in (8, 4, 2, 1):  # the memory levers together, at the widest TP the model and a node take
        regrouped = _regrouped(layout, tp=tp) if tp <= cluster.gpus_per_node else None
        if regrouped is not None and (tp > 1 or regrouped.data_replicas > 1):  # else: --recompute full alone
            together = replace(regrouped, zero=3, sequence_parallel=tp > 1)
            yield (
                f"--zero 3 --recompute full --tp {tp}" + (" --sequence-parallel" if tp > 1 else ""),
                replace(w, recompute="full"),
                together,
            )


def _more_gpus(w: Workload, layout: Layout, capacity: float) -> tuple[str, float] | None:
    """The fewest GPUs (DP doubled, TP, PP and CP kept) that fit under ZeRO-3 with full recomputation (more GPUs
    shard the states, not one sequence's activations), and what they need; None when the GPUs at hand do."""
    dp, full = layout.dp, replace(w, recompute="full")
    if most_loaded_gpu(full, replace(layout, zero=3)).total <= capacity:
        return None
    while dp * layout.tp * layout.pp * layout.cp < MOST_GPUS:
        dp *= 2
        more = replace(layout, dp=dp, zero=3)
        total = most_loaded_gpu(full, more).total
        if total <= capacity:
            return f"{more.gpus} GPUs with --zero 3 --recompute full", total
    return None


def lever_order(flags: str, total: float, capacity: float) -> tuple[bool, bool, bool, int, float]:
    """How the levers are listed: those that fit first; of them, the ones that keep the job (not a fine-tuning
    method instead) and the GPUs at hand; then the fewest flags changed; then the least memory."""
    return total > capacity, "--method" in flags, "GPUs with" in flags, flags.count("--"), total


def levers_section(w: Workload, layout: Layout, cluster: Cluster, capacity: float) -> Section:
    """Each lever alone, at micro-batch 1, with the memory it gives, in ``lever_order``."""
    w = replace(w, micro_batch=1)
    tried: list[tuple[str, float]] = []
    for flags, changed_w, changed_layout in _candidates(w, layout, cluster):
        if changed_layout is None:
            continue
        try:
            check_layout(changed_w, changed_layout, cluster)
            tried.append((flags, most_loaded_gpu(changed_w, changed_layout).total))
        except LmcalcError:  # a lever that cannot apply to this model
            continue
    more = _more_gpus(w, layout, capacity)
    if more:
        tried.append(more)
    terms = tuple(
        Term(
            f"lever{i}",
            flags,
            total,
            "bytes",
            "fits" if total <= capacity else f"does not fit: over by {(total - capacity) / 1e9:,.1f} GB",
        )
        for i, (flags, total) in enumerate(sorted(tried, key=lambda t: lever_order(t[0], t[1], capacity)), start=1)
    )
    return Section("levers", "What would make it fit (from the layout above, at micro-batch 1; memory per GPU)", terms)
