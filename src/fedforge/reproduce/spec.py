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

    ``primary``: named before the grid runs as the page's primary claim. When any comparison
    of a spec is primary, the primary ones form the corrected family (Holm) and the others
    are reported as exploratory; otherwise every comparison belongs to the family.
    """

    a: str
    b: str
    metric: str  # "rounds" | "sim_time" | "final_acc"
    expect: str = "<"
    margin: float = 0.0
    primary: bool = False

    def __post_init__(self) -> None:
        if self.expect not in ("<", ">"):
            raise ValueError(f"Comparison.expect: '<' or '>', got {self.expect!r}")


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
