"""How a method looks in every figure, and figure text that fits: one place for all artefacts.

A method's colour, marker and line style depend on its name alone (not on the order of the
runs, nor on what else the algorithm registry holds), so ``fedavg`` looks the same in
``accuracy.png``, in ``report.html``, in a sweep's figure and in a reproduction page, and
registering a new algorithm moves no line of a figure drawn before. fedforge's own
algorithms take the fixed slots of :data:`BUILTIN_SLOTS`; any other name (a named variant,
a plugin) takes the slot a SHA-256 of the name picks among all :data:`SLOTS`, which unlike
Python's ``hash()`` is the same in every process. Within one figure two lines never share a
slot (:func:`styles_for`).
"""

from __future__ import annotations

import hashlib
import textwrap
from collections.abc import Iterable
from typing import Any, NamedTuple

# Okabe & Ito's colour-blind-safe palette, darkest first (yellow last: weak on white)
PALETTE = ("#0072b2", "#d55e00", "#009e73", "#cc79a7", "#e69f00", "#56b4e9", "#000000",
           "#f0e442")
COLORS = PALETTE[:7]  # method colours: the yellow is left out, it is hard to see on white
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
LINESTYLES = ("-", "--", "-.", ":", (0, (5, 1)), (0, (3, 1, 1, 1, 1, 1)), (0, (1, 2)),
              (0, (8, 2, 2, 2)))
# 7 colours and 8 markers: slot i -> (colour i mod 7, marker i mod 8), 56 distinct pairs
SLOTS = len(COLORS) * len(MARKERS)
BAND_STYLES = ("alpha", "off", "panels")
LEGEND_PLACES = ("best", "outside", "off")


class MethodStyle(NamedTuple):
    """What tells one method's line from another's, also in greyscale."""

    color: str
    marker: str
    linestyle: Any


BUILTIN_SLOTS: dict[str, int] = {
    "fedavg": 0, "fedavg_server_momentum": 1, "fedprox": 2, "scaffold": 3, "fedadam": 4,
    "fedyogi": 5, "fedadagrad": 6, "fedams": 7, "fedexp": 8, "fadamgc": 9, "fa_nt": 10,
    "localadam": 11, "fedavg_global_momentum": 12, "scaffold_m": 13, "feddyn": 14,
    "feddc": 15, "fedptr": 16, "fedptr_s": 17, "safl": 18, "fetchsgd": 19, "topk_ef": 20,
    "onebit_adam": 21, "marina": 22, "local_only": 23, "fedavg_ft": 24, "ditto": 25,
    "fedper": 26, "fedrep": 27, "fedbabu": 28, "lg_fedavg": 29, "apfl": 30, "pfedme": 31,
    "per_fedavg_fo": 32, "per_fedavg_hf": 33, "fedrod": 34, "fedala": 35, "fedbn": 36,
    "fednova": 37, "qffl": 38, "fedproto": 39, "afl": 40,
    "moon": 41, "ifca": 42, "cfl": 43, "fedgen": 44, "flora": 45,
}
"""fedforge's own algorithms and their fixed slots: written out, not counted from the
registry, so that no figure changes when an algorithm is added. The first seven take the
seven colours with their own markers. An entry is never renumbered or removed; a new
built-in algorithm is appended with the lowest unused slot (a test fails until it has one)."""


def style_for(method: str) -> MethodStyle:
    """The style of ``method`` (an algorithm name or a line's label), fixed by the name."""
    return slot_style(preferred_slot(method))


def slot_style(slot: int) -> MethodStyle:
    """Slot ``i`` -> (colour i mod 7, marker and line style i mod 8): 56 distinct looks."""
    return MethodStyle(COLORS[slot % len(COLORS)], MARKERS[slot % len(MARKERS)],
                       LINESTYLES[slot % len(LINESTYLES)])


def styles_for(methods: Iterable[str]) -> dict[str, MethodStyle]:
    """Styles of the methods drawn together. Each keeps :func:`style_for`'s style unless a
    line settled before it holds that slot, or, for a name without a fixed slot, that colour:
    then it moves to the next slot (upwards, wrapping) with a free colour, or with a free
    slot once the colours run out. Built-in names are settled first and keep their slots
    (only an alias drawn beside its own algorithm moves), then the others in sorted order;
    so the result depends on the set of methods, never on the run order, and no two lines
    share a (colour, marker, line style) up to :data:`SLOTS` lines."""
    names = sorted(set(methods), key=lambda m: (not _fixed(m), m))
    slots: dict[str, int] = {}
    for name in names:  # fixed slots first, so that nothing moved takes one of them
        if _fixed(name) and preferred_slot(name) not in slots.values():
            slots[name] = preferred_slot(name)
    for name in names:
        if name not in slots:
            slots[name] = _free_slot(preferred_slot(name), set(slots.values()))
    return {name: slot_style(slots[name]) for name in names}


def _free_slot(start: int, taken: set[int]) -> int:
    """The first slot from ``start`` upwards (wrapping) whose colour no taken slot has, else
    the first free slot; ``start`` itself past :data:`SLOTS` lines (looks repeat)."""
    order = [(start + k) % SLOTS for k in range(SLOTS)]
    colours = {slot_style(s).color for s in taken}
    for slot in order:
        if slot not in taken and slot_style(slot).color not in colours:
            return slot
    for slot in order:
        if slot not in taken:
            return slot
    return start


def preferred_slot(method: str) -> int:
    """The slot of ``method`` before any clash in a figure: its :data:`BUILTIN_SLOTS` entry,
    else the first 8 bytes of the SHA-256 of the name, modulo :data:`SLOTS`."""
    name = _canonical(method)
    if name in BUILTIN_SLOTS:
        return BUILTIN_SLOTS[name]
    digest = int.from_bytes(hashlib.sha256(method.encode("utf-8")).digest()[:8], "big")
    return digest % SLOTS


def _fixed(method: str) -> bool:
    return _canonical(method) in BUILTIN_SLOTS


def _canonical(method: str) -> str:
    from fedforge.algorithms import canonical_name  # noqa: PLC0415 (imports torch)

    return canonical_name(method)


def wrap_to_width(fig: Any, text: str, width_px: float, **text_kw: Any) -> str:
    """``text`` broken into lines that each fit ``width_px`` when drawn on ``fig`` with
    ``text_kw`` (measured, not guessed): first at `` · `` separators, then at spaces."""
    renderer = fig.canvas.get_renderer()
    probe = fig.text(0, 0, "", **text_kw)

    def fits(line: str) -> bool:
        probe.set_text(line)
        return probe.get_window_extent(renderer).width <= width_px

    try:
        lines: list[str] = []
        for part in text.split(" · "):
            joined = f"{lines[-1]} · {part}" if lines else part
            if lines and fits(joined):
                lines[-1] = joined
            else:
                lines.extend(_wrap_words(part, fits))
        return "\n".join(lines)
    finally:
        probe.remove()


def _wrap_words(text: str, fits: Any) -> list[str]:
    """``text`` wrapped at spaces at the widest width whose every line fits."""
    for width in range(len(text), 0, -1):
        lines = textwrap.wrap(text, width, break_long_words=True) or [""]
        if all(fits(line) for line in lines):
            return lines
    return [text]
