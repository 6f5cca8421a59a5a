"""What a reproduction is: a claim, a grid of conditions, seeds, a target and comparisons.

A :class:`Reproduction` is plain data. The grid runner (:mod:`.grid`) turns it into runs, and
the report (:mod:`.report`) turns the runs' ``metrics.jsonl`` into tables, figures and a
verdict. Every paper registers one spec under a short name (``fedforge reproduce NAME``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Condition:
    """One cell of the grid: an algorithm on the spec's config plus dotted overrides.

    The config's ``[compare.<algorithm>]`` table is merged in first (per-method learning
    rates), then ``algorithm.name``, the spec's overrides, then these."""

    name: str
    algorithm: str
    overrides: tuple[str, ...] = ()
    label: str | None = None
    config: str | None = None  # default: the spec's config

    @property
    def title(self) -> str:
        return self.label or self.name


@dataclass(frozen=True)
class Comparison:
    """``a - b`` on ``metric``, paired by seed; the paper claims ``a - b expect margin``.

    ``expect="<"``: a is lower (e.g. fewer rounds); ``">"``: a is higher. A non-zero
    ``margin`` turns a sign claim into a closeness claim: ``Comparison(full, compressed,
    "final_acc", "<", margin=0.02)`` reads "compression costs less than two points".

    ``primary``: one of the paper's headline claims. The primary comparisons form one Holm
    family, the others (controls, ablations, duplicate baselines) another, the exploratory
    one; a spec with no primary comparison is one family.

    ``kind``: what the paper claims. ``"direction"``: ``a − b expect margin``; the data can
    reproduce it, contradict it, or show it ``equivalent`` (no effect as large as
    ``effect``). ``"equivalence"``: ``|a − b| < margin`` ("as good as"), tested by two
    one-sided tests (TOST). ``"none"``: a comparison the paper does not make (a control or
    another regime): it is never "contradicted", only found to differ or not.

    ``effect``: the smallest difference that matters, in the metric's units; the default is
    the spec's ``effects[metric]`` (with its reason). The power rule sizes the seeds from it.
    ``note``: what the paper claims, when the row alone does not say (shown on the page).
    """

    a: str
    b: str
    metric: str  # "rounds" | "sim_time" | "final_acc" | "final_personal_acc" | "final_client_*"
    expect: str = "<"
    margin: float = 0.0
    primary: bool = False
    kind: str = "direction"
    effect: float | None = None
    note: str = ""

    def __post_init__(self) -> None:
        if self.expect not in ("<", ">"):
            raise ValueError(f"Comparison.expect: '<' or '>', got {self.expect!r}")
        if self.kind not in ("direction", "equivalence", "none"):
            raise ValueError(f"Comparison.kind: 'direction', 'equivalence' or 'none', got "
                             f"{self.kind!r}")
        if self.kind == "equivalence" and not self.margin > 0:
            raise ValueError("Comparison.margin: an equivalence claim needs a margin > 0")


@dataclass(frozen=True)
class Sweep:
    """A paired hyper-parameter sweep: at each value of ``parameter``, condition ``a``
    against condition ``b`` (e.g. with and without the method), same seeds. The report
    tables and plots the final metric of both and their paired difference per value."""

    title: str
    parameter: str  # the x axis, e.g. "λ (initial weight decay)"
    points: tuple[tuple[float, str, str], ...]  # (value, a, b), increasing values
    a_label: str = "a"
    b_label: str = "b"


@dataclass(frozen=True)
class Reproduction:
    """A falsifiable claim and the grid that tests it (see docs/reproducing.md)."""

    name: str
    claim: str  # the claim, with its citation (table or figure)
    config: str  # base config, relative to the repository root
    conditions: tuple[Condition, ...]
    seeds: tuple[int, ...]
    target: float | None  # threshold on ``metric`` for rounds / time to target
    comparisons: tuple[Comparison, ...] = ()
    overrides: tuple[str, ...] = ()  # applied to every condition (the CPU scale)
    metric: str = "test_accuracy"
    diagnostics: tuple[str, ...] = ()  # metrics.jsonl keys plotted per condition
    curves: tuple[str, ...] = ()  # conditions in the accuracy figure (default: all)
    # the accuracy figure as one panel per (title, conditions), e.g. one per regime
    panels: tuple[tuple[str, tuple[str, ...]], ...] = ()
    x_axis: str = "round"  # the accuracy figure's x: "round" or a metrics key (log scale)
    paper: dict[str, str] = field(default_factory=dict)  # condition -> the paper's number
    paper_title: str = "paper"  # the column title of ``paper`` (setting, metric)
    # other targets for a post-hoc sensitivity table of the rounds comparisons (never the
    # verdict: that uses ``target``, fixed before the comparison)
    sensitivity: tuple[float, ...] = ()
    notes: str = ""  # scale, target choice, caveats (markdown, shown above the tables)
    paper_commands: tuple[str, ...] = ()  # what a GPU run at the paper's scale would execute
    paper_compute: str = ""  # the estimate printed with --scale paper
    ablations: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (title, conditions) tables
    sweeps: tuple[Sweep, ...] = ()  # paired sweeps: a table and a figure each
    # execution order: each stage's conditions for every seed, stage after stage (the
    # claim's core first); conditions in no stage run last
    stages: tuple[tuple[str, ...], ...] = ()
    # multi-task runs (a config with [[tasks]]; each condition's algorithm is the method):
    # time to every task's target is the metric, gains are paired against ``gain_baseline``
    multitask: bool = False
    gain_baseline: str | None = None
    # runs once before the grid with the repository root, e.g. pre-training the checkpoint
    # the fine-tuning conditions start from; it must skip work that is already done
    prepare: Callable[[Path], None] | None = None
    # the smallest effect that matters per comparison metric: (value, why), see Comparison
    effects: dict[str, tuple[float, str]] = field(default_factory=dict)
    title: str = ""  # the summary's section title (default: the name)
    # the summary's scale table: (quantity, ours, the paper's), e.g. ("model parameters",
    # "17.9 k", "11.2 M (ResNet-18)")
    scale: tuple[tuple[str, str, str], ...] = ()
    caveats: tuple[str, ...] = ()  # one sentence each, in the summary beside the verdicts
    families_note: str = ""  # when and why the families were declared (shown on the page)

    def effect(self, comp: Comparison) -> float:
        """The smallest effect that matters for ``comp`` (NaN when the spec states none)."""
        if comp.effect is not None:
            return comp.effect
        if comp.kind == "equivalence":
            return comp.margin
        return self.effects.get(comp.metric, (float("nan"), ""))[0]

    def condition(self, name: str) -> Condition:
        for c in self.conditions:
            if c.name == name:
                return c
        raise KeyError(f"{self.name}: no condition {name!r}")

    def __post_init__(self) -> None:
        names = [c.name for c in self.conditions]
        if len(set(names)) != len(names):
            raise ValueError(f"{self.name}: duplicate condition names")
        for comp in self.comparisons:
            for side in (comp.a, comp.b):
                if side not in names:
                    raise ValueError(f"{self.name}: comparison names unknown condition {side!r}")
        for sweep in self.sweeps:
            for _, a, b in sweep.points:
                for side in (a, b):
                    if side not in names:
                        raise ValueError(f"{self.name}: sweep {sweep.title!r} names unknown "
                                         f"condition {side!r}")
        if self.gain_baseline is not None and self.gain_baseline not in names:
            raise ValueError(f"{self.name}: gain_baseline names unknown condition "
                             f"{self.gain_baseline!r}")


REPRODUCTIONS: dict[str, Callable[[], Reproduction]] = {}


def register(name: str) -> Callable:
    """Decorator: register a zero-argument function building the spec under ``name``."""

    def wrap(fn: Callable[[], Reproduction]) -> Callable[[], Reproduction]:
        REPRODUCTIONS[name] = fn
        return fn

    return wrap
