"""Compute-optimal model size and training tokens for a FLOP budget (Hoffmann et al. 2022, "Chinchilla").

Hoffmann et al. 2022, "Training Compute-Optimal Large Language Models" (arXiv:2203.15556), ask: given C
training FLOPs, spent as C = 6·N·D (flops.py), which N parameters and D tokens give the lowest loss?
lmcalc reports two of their answers side by side:

* The rule of thumb D = 20·N. The paper states no fixed ratio; 20 is how its results are usually read:
  its Table 3 projects about 20 tokens per parameter at every model size (Approach 1), Chinchilla itself
  is 70B parameters on 1.4T tokens (Table 1), and the paper concludes (abstract, §3) that N and D
  should be scaled equally. Then C = 6·N·20·N, so N = √(C/120) and D = 20·N.
* Approach 3 (§3.3): the fitted parametric loss L̂(N, D) = E + A/N^α + B/D^β (eq. 2), minimised along
  C = 6·N·D, which gives the power-law frontier N_opt = G·(C/6)^a, D_opt = G⁻¹·(C/6)^b (eq. 4).

The two disagree, and showing both is the point: Besiroglu et al. 2024 ("Chinchilla Scaling: A
replication attempt", arXiv:2404.10102) find that the published, rounded Approach 3 constants used here
are inconsistent with the paper's Approaches 1 and 2 and imply far more than 20 tokens per parameter at
Chinchilla's budget. The fitted law predicts the loss of the paper's models on the paper's data: it
compares allocations with each other, not with a loss measured on another dataset or tokenizer.

The budget may instead come from a cluster and a deadline: C = GPUs · dense peak · MFU · seconds, the
inverse of time.py's days = C / (GPUs · peak · MFU), computed with time.py's ``RunTime``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lmcalc.engine.model.flops import FLOPS_PER_PARAM_PER_TOKEN
from lmcalc.engine.run.cost import RunTime, check_mfu, peak_for, time_terms
from lmcalc.errors import LmcalcError, setting
from lmcalc.recipe_specs import PrecisionRecipe
from lmcalc.result import Section, Term
from lmcalc.specs import Cluster
from lmcalc.units import SECONDS_PER_DAY, sci

TOKENS_PER_PARAM = 20
"""Compute-optimal training tokens per parameter, the rule of thumb read from Hoffmann et al. 2022 Table 3
(Approach 1 projections) and Chinchilla's 70B parameters on 1.4T tokens (Table 1). The paper does not
state it as a constant; the user may override it."""

HOFFMANN_SOURCE = "Hoffmann et al. 2022 (arXiv:2203.15556)"


@dataclass(frozen=True)
class Allocation:
    """A split of a compute budget into N parameters and D training tokens."""

    params: float
    tokens: float

    @property
    def tokens_per_param(self) -> float:
        return self.tokens / self.params

    @property
    def flops(self) -> float:
        """Training FLOPs 6·N·D: the budget the allocation spends."""
        return FLOPS_PER_PARAM_PER_TOKEN * self.params * self.tokens


@dataclass(frozen=True)
class ParametricLoss:
    """L̂(N, D) = E + A/N^α + B/D^β, N parameters and D tokens (Hoffmann et al. 2022 §3.3 eq. 2).

    E is the loss of an ideal model (the entropy of natural text); A/N^α is what a model of N parameters
    falls short of it, B/D^β what training on D tokens (not to convergence) falls short of that.
    """

    E: float
    A: float
    B: float
    alpha: float
    beta: float
    source: str

    def loss(self, params: float, tokens: float) -> float:
        return self.E + self.A / params**self.alpha + self.B / tokens**self.beta

    @property
    def params_exponent(self) -> float:
        """a = β/(α+β) of N_opt ∝ C^a (eq. 4)."""
        return self.beta / (self.alpha + self.beta)

    @property
    def tokens_exponent(self) -> float:
        """b = α/(α+β) of D_opt ∝ C^b (eq. 4)."""
        return self.alpha / (self.alpha + self.beta)

    @property
    def frontier_scale(self) -> float:
        """G = (α·A / (β·B))^(1/(α+β)) of eq. 4."""
        return (self.alpha * self.A / (self.beta * self.B)) ** (1 / (self.alpha + self.beta))

    def frontier(self, compute: float) -> Allocation:
        """The N and D that minimise L̂ with 6·N·D = C (eq. 4): N_opt = G·(C/6)^a, D_opt = G⁻¹·(C/6)^b.

        Setting dL̂/dN = 0 along D = C/(6N) balances the two terms, α·A/N^α = β·B/D^β, whose solution
        is eq. 4. Because a + b = 1, 6·N_opt·D_opt = C exactly.
        """
        per_flop = compute / FLOPS_PER_PARAM_PER_TOKEN
        g = self.frontier_scale
        return Allocation(g * per_flop**self.params_exponent, per_flop**self.tokens_exponent / g)


CHINCHILLA_FIT = ParametricLoss(
    E=1.69,
    A=406.4,
    B=410.7,
    alpha=0.34,
    beta=0.28,
    # The values as printed in the body of the paper, in Appendix D (quoted elsewhere as its eq. 10; the
    # equation number was not re-checked against the PDF). Besiroglu et al. 2024 quote the same five
    # values and note that the paper's TeX source holds less rounded ones, which lmcalc does not use.
    source=f"{HOFFMANN_SOURCE} Approach 3 fit: E = 1.69, A = 406.4, B = 410.7, α = 0.34, β = 0.28",
)
"""Hoffmann et al. 2022's fitted parametric loss (Approach 3), N in parameters and D in tokens."""


def rule_of_thumb(compute: float, tokens_per_param: float = TOKENS_PER_PARAM) -> Allocation:
    """D = r·N with C = 6·N·D: N = √(C / (6·r)), D = r·N (r = 20: N = √(C/120)). Refused where r leaves less than
    one parameter or one token (r above C/6, or below 6/C): a split of the budget, not an answer."""
    params = math.sqrt(compute / (FLOPS_PER_PARAM_PER_TOKEN * tokens_per_param))
    tokens = tokens_per_param * params
    if not (1 <= params < math.inf and 1 <= tokens < math.inf):
        raise LmcalcError(
            f"{setting('tokens_per_param')} {tokens_per_param:g} splits {sci(compute, 4)} FLOPs into "
            f"{params:.3g} parameters and {tokens:.3g} tokens; give a ratio from 6/C to C/6 "
            f"({FLOPS_PER_PARAM_PER_TOKEN / compute:.3g} to {compute / FLOPS_PER_PARAM_PER_TOKEN:.3g}), which leaves "
            "at least one of each"
        )
    return Allocation(params, tokens)


def compute_budget(gpus: float, peak_flops_per_gpu: float, mfu: float, days: float) -> float:
    """FLOPs a cluster delivers in ``days``: GPUs · dense peak · MFU · seconds (time.py's rate, inverted)."""
    return RunTime(0.0, gpus, peak_flops_per_gpu, mfu, 0.0).achieved_flops_per_s * days * SECONDS_PER_DAY


def _check_compute(compute: float) -> None:
    if not math.isfinite(compute) or compute <= 0:
        raise LmcalcError(f"the compute budget must be a positive number of FLOPs, got {compute!r}")


def budget_section(
    cluster: Cluster, precision: PrecisionRecipe, mfu: float, days: float, price_per_gpu_hour: float | None = None
) -> Section:
    """The compute budget of ``cluster`` for ``days`` at ``mfu``, its GPU-hours and (with a price) its cost;
    its ``compute`` term feeds ``optimal_sections``. Any allocation of that budget takes the deadline."""
    mfu = check_mfu(mfu)
    if not math.isfinite(days) or days <= 0:
        raise LmcalcError(f"the deadline must be a positive number of days, got {days!r}")
    peak = peak_for(cluster.hardware, precision)
    compute = compute_budget(cluster.count, peak, mfu, days)
    run = RunTime(compute, cluster.count, peak, mfu, 0.0)
    rate = {t.key: t for t in time_terms(run, cluster.hardware, precision, price_per_gpu_hour)}
    seconds = days * SECONDS_PER_DAY
    return Section(
        "budget",
        f"Compute budget of {cluster.label} for {days:g} days",
        (
            rate["peak_per_gpu"],
            rate["achieved"],
            Term("seconds", "Deadline (seconds)", seconds, "s", "days · 86,400", f"{days:g} × 86400"),
            Term(
                "compute",
                "Compute budget C",
                compute,
                "FLOPs",
                "GPUs · peak · MFU · seconds",
                f"{cluster.count:g} × {sci(peak, 4)} × {mfu:g} × {sci(seconds, 4)}",
                note="what the optimal allocation below spends",
            ),
            *(rate[key] for key in ("gpu_hours", "cost") if key in rate),
        ),
    )


ALLOCATION_LABELS = {"rule_of_thumb": "Rule of thumb", "parametric_fit": "Fitted frontier"}
"""Short names of the two allocations ``optimal_sections`` returns, by section key."""


def throughput_section(allocations: tuple[Section, ...], cluster: Cluster, days: float) -> Section:
    """The tokens per second each allocation needs to train its D tokens by the deadline."""
    seconds = days * SECONDS_PER_DAY
    terms = []
    for section in allocations:
        tokens = section.term("tokens").value
        terms.append(
            Term(
                section.key,
                ALLOCATION_LABELS[section.key],
                tokens / seconds,
                "tokens/s",
                "D / deadline seconds",
                f"{sci(tokens, 4)} / {sci(seconds, 4)}",
                note=f"{tokens / seconds / cluster.count:,.0f} tokens/s per GPU",
            )
        )
    return Section("throughput", f"Throughput each allocation needs on {cluster.label}", tuple(terms))


def _rule_terms(compute: float, alloc: Allocation, tokens_per_param: float, law: ParametricLoss) -> tuple[Term, ...]:
    k, r = FLOPS_PER_PARAM_PER_TOKEN, tokens_per_param
    source = f"{HOFFMANN_SOURCE} Table 3 and Table 1 (Chinchilla: 70B on 1.4T tokens)"
    return (
        Term(
            "params",
            "Parameters N",
            alloc.params,
            "params",
            f"√(C / ({k}·{r:g}))",
            f"√({sci(compute, 4)} / ({k} × {r:g}))",
            source,
            note=f"from C = {k}·N·D with D = {r:g}·N",
        ),
        Term(
            "tokens", "Training tokens D", alloc.tokens, "tokens", f"{r:g}·N", f"{r:g} × {sci(alloc.params, 5)}", source
        ),
        *_ratio_and_flops_terms(
            alloc,
            "",
            "the rule's input" + ("" if r == TOKENS_PER_PARAM else ", set by the user"),
            "equals the budget C",
        ),
        _loss_term(alloc, law, "the fitted law's loss at this allocation, never below the frontier's"),
    )


def _frontier_terms(compute: float, alloc: Allocation, law: ParametricLoss) -> tuple[Term, ...]:
    k = FLOPS_PER_PARAM_PER_TOKEN
    al, be = law.alpha, law.beta
    a, b, g = law.params_exponent, law.tokens_exponent, law.frontier_scale
    eq4 = f"{HOFFMANN_SOURCE} §3.3 eq. 4"
    return (
        Term("exponent_a", "Exponent a (N_opt ∝ C^a)", a, "ratio", "β / (α + β)", f"{be:g} / ({al:g} + {be:g})", eq4),
        Term("exponent_b", "Exponent b (D_opt ∝ C^b)", b, "ratio", "α / (α + β)", f"{al:g} / ({al:g} + {be:g})", eq4),
        Term(
            "scale_g",
            "Frontier coefficient G",
            g,
            "",
            "(α·A / (β·B))^(1/(α+β))",
            f"({al:g} × {law.A:g} / ({be:g} × {law.B:g}))^(1/({al:g} + {be:g}))",
            eq4,
        ),
        Term(
            "params",
            "Parameters N_opt",
            alloc.params,
            "params",
            f"G·(C/{k})^a",
            f"{g:.4f} × ({sci(compute, 4)} / {k})^{a:.4f}",
            eq4,
        ),
        Term(
            "tokens",
            "Training tokens D_opt",
            alloc.tokens,
            "tokens",
            f"G⁻¹·(C/{k})^b",
            f"({sci(compute, 4)} / {k})^{b:.4f} / {g:.4f}",
            eq4,
        ),
        *_ratio_and_flops_terms(alloc, "_opt", "grows with C as C^(b−a)", "equals the budget C (a + b = 1)"),
        _loss_term(alloc, law, "the lowest loss the fitted law allows for this budget"),
    )


def _ratio_and_flops_terms(alloc: Allocation, opt: str, ratio_note: str, flops_note: str) -> tuple[Term, Term]:
    """D/N and k·N·D of an allocation (``opt``: the symbols' subscript, "" or "_opt")."""
    k, n, d = FLOPS_PER_PARAM_PER_TOKEN, sci(alloc.params, 5), sci(alloc.tokens, 5)
    return (
        Term(
            "tokens_per_param",
            "Tokens per parameter",
            alloc.tokens_per_param,
            "ratio",
            f"D{opt} / N{opt}",
            f"{d} / {n}",
            note=ratio_note,
        ),
        Term(
            "flops", "Training FLOPs", alloc.flops, "FLOPs", f"{k}·N{opt}·D{opt}", f"{k} × {n} × {d}", note=flops_note
        ),
    )


def _loss_term(alloc: Allocation, law: ParametricLoss, note: str) -> Term:
    return Term(
        "predicted_loss",
        "Loss predicted by the fitted law",
        law.loss(alloc.params, alloc.tokens),
        "nats/token",
        "E + A/N^α + B/D^β",
        f"{law.E:g} + {law.A:g} / ({sci(alloc.params, 5)})^{law.alpha:g}"
        f" + {law.B:g} / ({sci(alloc.tokens, 5)})^{law.beta:g}",
        law.source + " (§3.3 eq. 2)",
        note=note + "; comparable only with losses on the paper's data and tokenizer",
    )


def optimal_sections(
    compute: float, tokens_per_param: float = TOKENS_PER_PARAM, law: ParametricLoss = CHINCHILLA_FIT
) -> tuple[Section, ...]:
    """N, D, tokens per parameter and predicted loss for ``compute`` FLOPs, by the 20-tokens rule and by
    the fitted Approach 3 frontier."""
    _check_compute(compute)
    if not math.isfinite(tokens_per_param) or tokens_per_param <= 0:
        raise LmcalcError(f"tokens per parameter must be a positive number, got {tokens_per_param!r}")
    rule, fit = rule_of_thumb(compute, tokens_per_param), law.frontier(compute)
    return (
        Section(
            "rule_of_thumb",
            f"Rule of thumb: {tokens_per_param:g} tokens per parameter",
            _rule_terms(compute, rule, tokens_per_param, law),
        ),
        Section(
            "parametric_fit",
            "Fitted loss frontier (Hoffmann et al. 2022 Approach 3)",
            _frontier_terms(compute, fit, law),
        ),
    )
