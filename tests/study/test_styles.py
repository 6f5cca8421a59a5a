"""A label's look depends on the label alone: registering an algorithm moves no line of a
committed figure, two lines of one figure never look alike, and a label looks the same in
every figure it is drawn in (``fedforge.study.styles``)."""

from __future__ import annotations

import random

import pytest

import fedforge.algorithms as algorithms
from fedforge.algorithms import ALGORITHMS, ALIASES, canonical_name
from fedforge.study.styles import (
    BUILTIN_SLOTS,
    COLORS,
    SLOTS,
    preferred_slot,
    slot_style,
    style_for,
    styles_for,
)

OTHERS = ["fedavg [lr_small]", "fedavg [lr_large]", "my_plugin", "fedavg_nar", "fedavg_lo",
          "c10_fedptr", "fedavg (mean of 3 seeds)", "scaffold / task-a"]


def _builtin() -> list[str]:
    return [n for n, f in ALGORITHMS.items()
            if getattr(f, "__module__", "").startswith("fedforge.algorithms")]


def _named(slot: int, avoid: set[str] = frozenset()) -> str:
    """A name outside the registry whose hash picks ``slot``."""
    return next(f"plugin_{i}" for i in range(10_000)
                if f"plugin_{i}" not in avoid and preferred_slot(f"plugin_{i}") == slot)


def test_every_builtin_algorithm_has_its_own_fixed_slot():
    missing = [n for n in _builtin() if n not in BUILTIN_SLOTS]
    assert not missing, f"add {missing} to BUILTIN_SLOTS (lowest unused slots)"
    slots = list(BUILTIN_SLOTS.values())
    assert len(set(slots)) == len(slots) and all(0 <= s < SLOTS for s in slots)
    looks = {style_for(n) for n in BUILTIN_SLOTS}
    assert len(looks) == len(BUILTIN_SLOTS)
    # the first seven take the seven colours, in the order the table has always had
    first = ["fedavg", "fedavg_server_momentum", "fedprox", "scaffold", "fedadam", "fedyogi",
             "fedadagrad"]
    assert [style_for(n).color for n in first] == list(COLORS)
    assert style_for("fedavgm") == style_for("fedavg_server_momentum")  # an alias


def test_hashed_slots_are_pinned():
    # SHA-256 of the UTF-8 name, first 8 bytes big-endian, mod 56: changing the rule would
    # recolour every committed figure with a variant in it
    assert SLOTS == 56
    assert [preferred_slot(n) for n in ("my_plugin", "fedavg_lo", "fedavg_nar")] == [45, 38, 26]
    assert preferred_slot("fedavg_nar") == preferred_slot("fedavg_nar")  # not salted per run
    assert slot_style(57) == slot_style(1) and slot_style(8).color == COLORS[1]


LABELS = [*BUILTIN_SLOTS, *ALIASES, *OTHERS]
FIGURES = [tuple(random.Random(k).sample(LABELS, k)) for k in (2, 5, 9, 20, 40)]


def _looks() -> tuple[dict, dict]:
    return {n: style_for(n) for n in LABELS}, {f: styles_for(f) for f in FIGURES}


@pytest.mark.parametrize("where", ["first", "last"])
def test_registering_an_algorithm_moves_no_style(monkeypatch, where):
    before = _looks()

    def new_algorithm():  # a built-in to be, from fedforge's own package
        raise AssertionError

    new_algorithm.__module__ = "fedforge.algorithms.newcomer"
    grown = {"aaa_newcomer": new_algorithm, **ALGORITHMS} if where == "first" else \
        {**ALGORITHMS, "zzz_newcomer": new_algorithm}
    monkeypatch.setattr(algorithms, "ALGORITHMS", grown)
    monkeypatch.setitem(algorithms.ALIASES, "newcomer", next(iter(grown)))
    assert _looks() == before


def _check_distinct(names: list[str]) -> dict:
    styles = styles_for(names)
    pairs = [(s.color, str(s.linestyle)) for s in styles.values()]
    assert len(set(pairs)) == len(pairs) == len(set(names)), names
    builtin = {n for n in set(names) if canonical_name(n) in BUILTIN_SLOTS}  # aliases too
    fixed = {style_for(n).color: n for n in builtin}
    if len(set(names)) <= len(COLORS) and len(fixed) == len(builtin):
        # built-in names may share a colour (their markers differ); the others take free ones
        assert len({s.color for s in styles.values()}) == len(set(names)), names
    assert styles == styles_for(list(reversed(names)))  # never the run order
    return styles


@pytest.mark.parametrize("n", [2, 3, 7, 8, 20, 37, 56])
def test_no_two_lines_of_a_figure_share_colour_and_dash(n):
    rng = random.Random(n)
    pool = [*BUILTIN_SLOTS, *ALIASES, *OTHERS, *(f"variant_{i}" for i in range(60))]
    for _ in range(20):
        _check_distinct(rng.sample(pool, n))


def test_clashing_names_move_and_builtins_keep_their_slot():
    # a plugin hashed onto fedavg's slot, and one onto fedavg's colour with another dash
    onto = _named(BUILTIN_SLOTS["fedavg"])
    same_colour = _named(7)  # slot 7: colour 0 (fedavg's), dash 7
    styles = _check_distinct(["fedavg", onto, same_colour])
    assert styles["fedavg"] == style_for("fedavg")
    # settled in sorted order, each to the next slot up whose colour is still free
    first, second = sorted([onto, same_colour])
    want = {onto: 1, same_colour: 9} if first == onto else {same_colour: 8, onto: 2}
    assert {n: styles[n] for n in want} == {n: slot_style(s) for n, s in want.items()}
    # an alias beside its algorithm moves, and takes no fixed slot of a method drawn with it
    styles = _check_distinct(["fedavgm", "fedavg_server_momentum", "fedprox", "scaffold"])
    assert [styles[n] for n in ("fedavg_server_momentum", "fedprox", "scaffold")] == \
        [style_for(n) for n in ("fedavg_server_momentum", "fedprox", "scaffold")]
    # more lines than looks: all 56 looks used once, then they repeat
    many = [f"variant_{i}" for i in range(SLOTS + 1)]
    assert len({(s.color, str(s.linestyle)) for s in styles_for(many).values()}) == SLOTS


def test_a_label_looks_the_same_in_every_figure():
    rng = random.Random(1)
    pool = [*BUILTIN_SLOTS, *OTHERS]
    for name in BUILTIN_SLOTS:  # a built-in name never moves
        for _ in range(3):
            others = rng.sample([p for p in pool if p != name], rng.randint(0, 20))
            assert styles_for([name, *others])[name] == style_for(name)
    for name in OTHERS:  # another name keeps its look wherever nothing clashes with it
        free = [p for p in BUILTIN_SLOTS if style_for(p).color != style_for(name).color]
        one, two = styles_for([name, *free[:3]]), styles_for([name, *free[-4:], "fedavg"])
        if style_for("fedavg").color == style_for(name).color:
            two = styles_for([name, *free[-4:]])
        assert one[name] == two[name] == style_for(name)
