"""The reproduction protocol's verdicts: families, the power rule, censored times, TOST.

Each comparison of a page belongs to a family: the paper's headline claims (*primary*) or
the controls, ablations and duplicate baselines (*exploratory*); Holm's correction runs
within each family separately (docs/reproducing.md, section 5). A comparison gets one
decisive p-value, the smaller of

* the test of a difference: the paired t-test of ``a − b = margin``, or, when a run never
  reached its target (its time is only a lower bound), the exact sign test on the pairs
  whose order is certain (:func:`~fedforge.reproduce.stats.censored_signs`): never a t-test
  on a time clipped at the budget;
* the test of equivalence (TOST) against the smallest effect that matters, or against the
  claim's margin for an "as good as" claim (none for censored times).

At most one of the two null hypotheses holds, so Holm over these p-values keeps the
family-wise error rate. The verdict is *reproduced*, *contradicted* (only where the paper
claims the direction), *equivalent* (no effect as large as the smallest that matters; for an
"as good as" claim, the claim itself), *differs* (a comparison the paper does not make) or
*inconclusive*. The power rule (:func:`~fedforge.reproduce.stats.seeds_needed`) gives the
seeds the comparison needs at its family's strictest level.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fedforge.reproduce.spec import Comparison, Reproduction
from fedforge.reproduce.stats import (
    CONTRADICTED,
    DIFFERS,
    EQUIVALENT,
    INCONCLUSIVE,
    MIN_PRIMARY_SEEDS,
    REPRODUCED,
    censored_signs,
    detectable_effect,
    holm,
    p_value,
    seeds_needed,
    sign_test_p,
    sign_test_seeds,
    tost_p,
)
from fedforge.study.stats import Interval, paired_difference

ALPHA = 0.05  # family-wise error rate of each family of a page's verdicts
TIMES = ("rounds", "sim_time")
PRIMARY, EXPLORATORY, SINGLE = "primary", "exploratory", "one family"


@dataclass(frozen=True)
class Evidence:
    """What the data say about one comparison, before any correction."""

    diff: Interval  # the paired difference (at the budget for censored runs)
    seeds: list[int]
    test: str  # "paired t" | "exact sign test" (censored times)
    p_diff: float  # the test of a difference (two-sided)
    p_eq: float  # the equivalence test (TOST); 1 when it does not apply
    signs: tuple[int, int, int] | None  # censored: (a < b, a > b, undetermined) pairs
    censored: str  # "FedAdam ≥ 150 in 3 of 3 seeds" or ""

    @property
    def p(self) -> float:
        return min(self.p_diff, self.p_eq)


@dataclass(frozen=True)
class Judgement:
    """One comparison as the page reports it, with everything its verdict rests on."""

    comp: Comparison
    diff: Interval
    family: str  # PRIMARY | EXPLORATORY | SINGLE
    family_size: int
    test: str
    p: float  # the decisive p-value, uncorrected
    p_holm: float  # Holm-adjusted within the family
    call: str  # at the family-wise level
    uncorrected: str  # the call at an uncorrected 5 %
    effect: float  # the smallest effect that matters (NaN: none stated)
    mde: float  # detectable at the family's strictest level α/m, 80 % power (t-tests)
    needed: int | None  # seeds the power rule asks for (None: no pilot spread yet)
    censored: str
    signs: tuple[int, int, int] | None

    @property
    def underpowered(self) -> bool:
        return self.needed is not None and self.diff.n < self.needed


def paired(runs: dict, comp: Comparison) -> tuple[Interval, list[int]]:
    """Paired difference over the seeds both conditions finished."""
    a, b = runs.get(comp.a, {}), runs.get(comp.b, {})
    seeds = sorted(set(a) & set(b))
    return paired_difference([getattr(a[s], comp.metric) for s in seeds],
                             [getattr(b[s], comp.metric) for s in seeds]), seeds


def _censoring(spec: Reproduction, runs: dict, comp: Comparison, seeds: list[int]) -> str:
    """``"FedAdam ≥ 150 in 3 of 3 seeds"``: the sides whose time is only a lower bound."""
    if comp.metric not in TIMES:
        return ""
    parts = []
    for side in (comp.a, comp.b):
        cut = [getattr(runs[side][s], comp.metric) for s in seeds if not runs[side][s].reached]
        if cut:
            bound = "/".join(f"{v:.3g}" if comp.metric == "sim_time" else f"{v:g}"
                             for v in sorted(set(cut)))
            parts.append(f"{spec.condition(side).title} ≥ {bound} in {len(cut)} of "
                         f"{len(seeds)} seeds")
    return "; ".join(parts)


def evidence(spec: Reproduction, runs: dict, comp: Comparison) -> Evidence:
    diff, seeds = paired(runs, comp)
    censored = _censoring(spec, runs, comp, seeds)
    if censored:
        a, b = runs[comp.a], runs[comp.b]
        signs = censored_signs([getattr(a[s], comp.metric) for s in seeds],
                               [a[s].reached for s in seeds],
                               [getattr(b[s], comp.metric) for s in seeds],
                               [b[s].reached for s in seeds])
        return Evidence(diff, seeds, "exact sign test", sign_test_p(*signs[:2], len(seeds)),
                        1.0, signs, censored)
    if comp.kind == "equivalence":  # a difference beyond the margin contradicts the claim
        beyond = abs(diff.mean) > comp.margin
        p_diff = p_value(diff, math.copysign(comp.margin, diff.mean)) if beyond else 1.0
        p_eq = tost_p(diff, comp.margin)
    else:
        effect = spec.effect(comp)
        p_diff = p_value(diff, comp.margin)
        p_eq = 1.0 if math.isnan(effect) else tost_p(diff, effect, centre=comp.margin)
    return Evidence(diff, seeds, "paired t", p_diff, p_eq, None, "")


def families(spec: Reproduction) -> dict[int, str]:
    """Each comparison's family: primary or exploratory once a spec names primary claims."""
    named = any(c.primary for c in spec.comparisons)
    return {i: (PRIMARY if c.primary else EXPLORATORY) if named else SINGLE
            for i, c in enumerate(spec.comparisons)}


def decide(comp: Comparison, ev: Evidence, p: float, alpha: float = ALPHA) -> str:
    """The verdict once the (corrected) decisive p-value is known."""
    if ev.diff.n < 2 or p > alpha:
        return INCONCLUSIVE
    if ev.p_eq <= ev.p_diff:
        return EQUIVALENT
    if comp.kind == "equivalence":
        return CONTRADICTED
    if comp.kind == "none":
        return DIFFERS
    if ev.signs is not None:
        below = ev.signs[0] > ev.signs[1]
    else:
        below = ev.diff.mean < comp.margin
    return REPRODUCED if below == (comp.expect == "<") else CONTRADICTED


def _power(spec: Reproduction, comp: Comparison, ev: Evidence, family: str,
           size: int) -> tuple[float, float, int | None]:
    """(smallest effect that matters, detectable effect, seeds needed) at level α/size."""
    effect = spec.effect(comp)
    minimum = MIN_PRIMARY_SEEDS if family == PRIMARY else 2
    if ev.signs is not None:
        return effect, math.nan, sign_test_seeds(size, ALPHA, minimum)
    mde = detectable_effect(ev.diff, level=1 - ALPHA / size)
    needed = seeds_needed(ev.diff.sd, effect, size, alpha=ALPHA,
                          equivalence=comp.kind == "equivalence", minimum=minimum)
    if needed is None and (ev.diff.sd == 0.0 or 0 < ev.diff.n < minimum):
        needed = minimum  # no spread yet (one seed): at least the claim's minimum
    return effect, mde, needed


def judge(spec: Reproduction, runs: dict, alpha: float = ALPHA) -> list[Judgement]:
    """Every comparison of the page, Holm-corrected within its family."""
    fams = families(spec)
    evs = [evidence(spec, runs, c) for c in spec.comparisons]
    adjusted: dict[int, float] = {}
    for name in set(fams.values()):
        members = [i for i, f in fams.items() if f == name]
        adjusted.update(zip(members, holm([evs[i].p for i in members]), strict=True))
    sizes = {name: sum(f == name for f in fams.values()) for name in set(fams.values())}
    out = []
    for i, (comp, ev) in enumerate(zip(spec.comparisons, evs, strict=True)):
        size = sizes[fams[i]]
        effect, mde, needed = _power(spec, comp, ev, fams[i], size)
        test = ev.test if ev.p_diff <= ev.p_eq else "TOST"
        out.append(Judgement(comp, ev.diff, fams[i], size, test, ev.p, adjusted[i],
                             decide(comp, ev, adjusted[i], alpha),
                             decide(comp, ev, ev.p, alpha), effect, mde, needed,
                             ev.censored, ev.signs))
    return out


def claim_text(comp: Comparison) -> str:
    """What the paper claims, in the table's terms: ``a − b < 0``, ``|a − b| < 0.02``."""
    if comp.kind == "none":
        text = "none"
    elif comp.kind == "equivalence":
        text = f"\\|a − b\\| < {comp.margin:g}"
    else:
        text = f"a − b {comp.expect} {comp.margin:g}"
    return f"{text} ({comp.note})" if comp.note else text


def correction_note(spec: Reproduction, alpha: float = ALPHA) -> str:
    """The sentences that state the families, their correction and the power rule."""
    fams = list(families(spec).values())
    m = len(fams)
    pct = f"{alpha:.0%}".replace("%", " %")
    noun = "comparison" if m == 1 else "comparisons"
    rule = (f"The power rule asks for the seeds with which a paired t-test detects the "
            f"smallest effect that matters at the family's strictest Holm level "
            f"{alpha:g}/m with 80 % power (never fewer than {MIN_PRIMARY_SEEDS} for a primary "
            "claim); a censored time is judged by an exact sign test, which needs at least "
            "log₂(2m/α) seeds for any call.")
    if SINGLE in fams:
        return (f"{m} {noun}, one family; Holm-corrected at family-wise {pct}: a verdict "
                f"needs a Holm-adjusted p ≤ {alpha:g}. " + rule)
    k = fams.count(PRIMARY)
    text = (f"{m} {noun}: {k} primary (the paper's headline claims) and {m - k} exploratory "
            f"(controls, ablations, other regimes, duplicate baselines). Holm's correction "
            f"runs within each family separately, at family-wise {pct}. " + rule)
    return text + (f" {spec.families_note.strip()}" if spec.families_note else "")
