"""What would make a training run fit when nothing does, in one place: each lever a change of settings (``Lever``,
keyword and value), with the workload and layout it gives and the memory of the most loaded GPU it then needs
(``lmcalc memory``'s figure).

``fit`` lists each lever pulled alone from the user's layout, at one sequence per micro-batch (``levers_section``):
a higher ZeRO stage, full recomputation, tensor or pipeline parallelism within the same GPUs (DP shrinks to keep
their count), LoRA or QLoRA instead of full training, the memory levers together, and more GPUs under ZeRO-3. A
lever that cannot apply (a TP that does not divide the heads, a PP the layers cannot take) is left out. ``memory``'s
verdict names the levers the user has not pulled (``fit_advice``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

from lmcalc.engine.finetune.method import Method, check_method
from lmcalc.engine.memory.gpu_memory import most_loaded_gpu
from lmcalc.engine.parallel.layout import Layout
from lmcalc.engine.parallel.layout_checks import check_layout, framework_runs
from lmcalc.engine.workload import Workload
from lmcalc.errors import LmcalcError, flag
from lmcalc.estimates.inputs import framework_of
from lmcalc.estimates.settings import DEFAULT_FRAMEWORK, FINE_TUNING_FRAMEWORK
from lmcalc.estimates.training import default_framework
from lmcalc.result import Section, Term
from lmcalc.specs import Cluster
from lmcalc.units import GB

MOST_GPUS = 1 << 16  # the search for more GPUs stops here


@dataclass(frozen=True)
class Lever:
    """A change the user can make: the settings it changes (keyword and value, in the order the user would give
    them) and, on more GPUs, how many; with the workload and the layout it gives (None: it cannot apply)."""

    changes: tuple[tuple[str, object], ...]
    workload: Workload
    layout: Layout | None
    gpus: int | None = None

    @property
    def text(self) -> str:
        """The change as the command line writes it, as the inputs table names origins: ``--zero 3``,
        ``--tp 4 --sequence-parallel`` (a setting turned on is its flag alone); ``64 GPUs with --zero 3 ...``."""
        given = " ".join(_flagged(name, value) for name, value in self.changes)
        return f"{self.gpus} GPUs with {given}" if self.gpus else given

    def memory(self) -> float:
        """The memory of the most loaded GPU it gives (``lmcalc memory``'s figure)."""
        assert self.layout is not None
        return most_loaded_gpu(self.workload, self.layout).total


def _flagged(name: str, value: object) -> str:
    """One change as the command line writes it: a setting turned on is its flag alone, one turned off its --no-."""
    if value is True:
        return flag(name)
    return f"--no-{flag(name)[2:]}" if value is False else f"{flag(name)} {value}"


def fully_recomputed(w: Workload) -> tuple[tuple[tuple[str, object], ...], Workload]:
    """Full recomputation as a lever: the change and the workload. Megatron-Core runs its all-to-all overlap without
    it, so where the overlap is on the lever turns it off too."""
    if w.moe_a2a_overlap:
        return (("recompute", "full"), ("moe_a2a_overlap", False)), replace(w, recompute="full", moe_a2a_overlap=False)
    return (("recompute", "full"),), replace(w, recompute="full")


def _unquantised_experts(w: Workload, layout: Layout) -> Iterator[Lever]:
    """QLoRA on an MoE: the routed experts bitsandbytes leaves unquantised kept in the compute dtype, not cast to fp32
    (``--no-kbit-upcast``), which halves the largest part of such a run's memory (``method.quantised``)."""
    if w.method.kind == "qlora" and w.method.kbit_upcast and w.model.moe is not None:
        yield Lever((("kbit_upcast", False),), replace(w, method=replace(w.method, kbit_upcast=False)), layout)


def _run_of(w: Workload, layout: Layout, named: bool) -> tuple[tuple[tuple[str, object], ...], Workload]:
    """The framework a lever's layout runs under, as ``memory`` would cost that layout: with no framework named, the
    one ``default_framework`` picks for it (DeepSpeed for ZeRO-2/3 without model parallelism); a named one where
    it runs the layout, else the default's, named among the lever's changes (a lever is a run someone can launch)."""
    degrees = {"zero": layout.zero, "tp": layout.tp, "pp": layout.pp, "cp": layout.cp, "ep": layout.ep}
    if named and framework_runs(w, layout.zero, layout.pp):
        return (), w
    name = default_framework(w.method, degrees)[0]
    changes: tuple[tuple[str, object], ...] = (("framework", name),) if named else ()
    return changes, w if name == w.framework.name else replace(w, framework=framework_of(name))


def _regrouped(layout: Layout, **degrees: int) -> Layout | None:
    """``layout`` with new TP or PP degrees on the same GPUs (DP takes what is left), or None if they do not divide."""
    others = layout.tp * layout.pp * layout.cp
    new = degrees.get("tp", layout.tp) * degrees.get("pp", layout.pp) * layout.cp
    if (layout.dp * others) % new:
        return None
    tp, pp = degrees.get("tp", layout.tp), degrees.get("pp", layout.pp)
    return replace(layout, dp=layout.dp * others // new, tp=tp, pp=pp)


def _layout_lever(changes: tuple[tuple[str, object], ...], w: Workload, layout: Layout | None, named: bool) -> Lever:
    """A lever that changes the layout, run under the framework that ``memory`` would cost that layout with
    (``_run_of``); None as the layout: it cannot apply."""
    if layout is None:
        return Lever(changes, w, None)
    framework, run = _run_of(w, layout, named)
    return Lever((*changes, *framework), run, layout)


def _candidates(w: Workload, layout: Layout, cluster: Cluster, named: bool) -> Iterator[Lever]:
    """``fit``'s levers: each alone from the layout, then the memory levers together."""
    for zero in (1, 2, 3):
        if zero > layout.zero and layout.data_replicas > 1:
            yield _layout_lever((("zero", zero),), w, replace(layout, zero=zero), named)
    if w.recompute != "full":
        yield Lever(*fully_recomputed(w), layout)
    yield from _unquantised_experts(w, layout)
    for tp in (2, 4, 8):
        if layout.tp < tp <= cluster.gpus_per_node:
            regrouped = _regrouped(layout, tp=tp)
            sp = regrouped and replace(regrouped, sequence_parallel=True)
            yield _layout_lever((("tp", tp), ("sequence_parallel", True)), w, sp, named)
    for pp in (2, 4, 8):
        if pp > layout.pp:
            regrouped = _regrouped(layout, pp=pp)
            piped = regrouped and replace(regrouped, grad_accum=max(layout.grad_accum, pp))
            yield _layout_lever((("pp", pp),), w, piped, named)
    if w.method.kind == "full":
        # an adapter method runs under transformers unless another framework was chosen (training_setup's rule)
        default = not named or w.framework.name == DEFAULT_FRAMEWORK
        fine_tuning = framework_of(FINE_TUNING_FRAMEWORK) if default else w.framework
        for method in (Method("lora"), Method("qlora")):
            if _takes(w, method):  # a Mamba (v1) hybrid takes no adapters
                yield Lever((("method", method.kind),), replace(w, method=method, framework=fine_tuning), layout)
    for tp in (8, 4, 2, 1):  # the memory levers together, at the widest TP the model and a node take
        regrouped = _regrouped(layout, tp=tp) if tp <= cluster.gpus_per_node else None
        if regrouped is not None and (tp > 1 or regrouped.data_replicas > 1):  # else: --recompute full alone
            together = replace(regrouped, zero=3, sequence_parallel=tp > 1)
            recomputed, full = fully_recomputed(w)
            changes = (("zero", 3), *recomputed, ("tp", tp), *((("sequence_parallel", True),) if tp > 1 else ()))
            yield _layout_lever(changes, full, together, named)


def _takes(w: Workload, method: Method) -> bool:
    """Whether the model can be trained by ``method`` (``check_method``): a lever offers only what would run."""
    try:
        check_method(w.model, method)
    except LmcalcError:
        return False
    return True


def _more_gpus(w: Workload, layout: Layout, capacity: float, named: bool) -> tuple[Lever, float] | None:
    """The fewest GPUs (DP doubled, TP, PP and CP kept) that fit under ZeRO-3 with full recomputation (more GPUs
    shard the states, not one sequence's activations), and what they need; None when the GPUs at hand do."""
    recomputed, full = fully_recomputed(w)
    here = _layout_lever((("zero", 3), *recomputed), full, replace(layout, zero=3), named)
    if here.memory() <= capacity:
        return None
    dp = layout.dp
    while dp * layout.tp * layout.pp * layout.cp < MOST_GPUS:
        dp *= 2
        more = replace(layout, dp=dp, zero=3)
        lever = replace(_layout_lever((("zero", 3), *recomputed), full, more, named), gpus=more.gpus)
        total = lever.memory()
        if total <= capacity:
            return lever, total
    return None


def lever_order(lever: Lever, total: float, capacity: float) -> tuple[bool, bool, bool, int, float]:
    """How the levers are listed: those that fit first; of them, the ones that keep the job (not a fine-tuning
    method instead) and the GPUs at hand; then the fewest settings changed; then the least memory."""
    changed = dict(lever.changes)
    return total > capacity, "method" in changed, lever.gpus is not None, len(changed), total


def levers_section(w: Workload, layout: Layout, cluster: Cluster, capacity: float, named: bool) -> Section:
    """Each lever alone, at micro-batch 1, with the memory it gives, in ``lever_order``. ``named``: whether the user
    named the framework (else each lever's layout chooses it, as ``memory`` would)."""
    w = replace(w, micro_batch=1)
    tried: list[tuple[Lever, float]] = []
    for lever in _candidates(w, layout, cluster, named):
        if lever.layout is None:
            continue
        try:
            check_layout(lever.workload, lever.layout, cluster)
            tried.append((lever, lever.memory()))
        except LmcalcError:  # a lever that cannot apply to this model
            continue
    more = _more_gpus(w, layout, capacity, named)
    if more:
        tried.append(more)
    terms = tuple(
        Term(
            f"lever{i}",
            lever.text,
            total,
            "bytes",
            "fits" if total <= capacity else f"does not fit: over by {(total - capacity) / 1e9:,.1f} GB",
        )
        for i, (lever, total) in enumerate(sorted(tried, key=lambda t: lever_order(t[0], t[1], capacity)), start=1)
    )
    return Section("levers", "What would make it fit (from the layout above, at micro-batch 1; memory per GPU)", terms)


def unpulled(w: Workload, layout: Layout, named: bool = True) -> list[Lever]:
    """``memory``'s levers: those the user has not pulled, each alone. Selective recomputation is offered only with
    eager attention: with FlashAttention the s² scores it drops are never stored."""
    levers = []
    if layout.zero < 3 and layout.data_replicas > 1:
        levers.append(_layout_lever((("zero", 3),), w, replace(layout, zero=3), named))
    if layout.tp > 1 and not layout.sequence_parallel:
        levers.append(Lever((("sequence_parallel", True),), w, replace(layout, sequence_parallel=True)))
    if w.recompute == "none" and w.attention == "eager":
        levers.append(Lever((("recompute", "selective"),), replace(w, recompute="selective"), layout))
    if w.recompute != "full":
        levers.append(Lever(*fully_recomputed(w), layout))
    if w.micro_batch > 1:
        levers.append(Lever((("micro_batch", 1),), replace(w, micro_batch=1), layout))
    levers += _unquantised_experts(w, layout)
    return levers


def fit_advice(w: Workload, layout: Layout, capacity: float, named: bool = True) -> str:
    """The levers the user has not pulled (``unpulled``), each with what the GPU would then need, most effective
    first; then more GPUs."""
    tried = []
    for lever in unpulled(w, layout, named):
        total = lever.memory()
        tried.append((total, f"{lever.text} ({total / GB:,.1f} GB{', fits' if total <= capacity else ''})"))
    advice = [text for _, text in sorted(tried)]
    advice.append("more GPUs" if layout.zero else f"more GPUs with {flag('zero')}")
    return "; try " + ", ".join(advice)
