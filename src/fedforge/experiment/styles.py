"""How a method looks in every figure, and figure text that fits: one place for all artefacts.

A method's colour, marker and line style depend on its name alone (not on the order of the
runs), so ``fedavg`` looks the same in ``accuracy.png``, in ``report.html``, in a sweep's
figure and in a reproduction page. fedforge's own algorithms take fixed slots in the order
of the algorithm registry; any other name (a named variant, a plugin) takes a slot drawn from
a SHA-256 of the name, which unlike Python's ``hash()`` is the same in every process.
"""

from __future__ import annotations

import hashlib
import textwrap
from collections.abc import Iterable
from functools import cache
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


def style_for(method: str) -> MethodStyle:
    """The style of ``method`` (an algorithm name or a line's label), fixed by the name."""
    return slot_style(_preferred_slot(method))


def slot_style(slot: int) -> MethodStyle:
    return MethodStyle(COLORS[slot % len(COLORS)], MARKERS[slot % len(MARKERS)],
                       LINESTYLES[slot % len(LINESTYLES)])


def styles_for(methods: Iterable[str]) -> dict[str, MethodStyle]:
    """Styles of the methods drawn together: each keeps :func:`style_for`'s style, except a
    name outside the registry whose colour another line already has, which moves to the
    next slot with a free colour (free pair, once the colours run out). Names are settled
    in sorted order, so the result depends on the set of methods, never on the run order."""
    names = sorted(set(methods), key=lambda m: (not _builtin(m), m))
    taken: dict[int, str] = {}
    out: dict[str, MethodStyle] = {}
    for name in names:
        slot = _preferred_slot(name)
        if not _builtin(name):
            slot = _free_slot(slot, taken)
        taken.setdefault(slot, name)
        out[name] = slot_style(slot)
    return out


def _free_slot(start: int, taken: dict[int, str]) -> int:
    first = len(builtin_algorithms())
    span = max(1, SLOTS - first)
    order = [first + (start - first + k) % span for k in range(span)]
    colours = {slot_style(s).color for s in taken}
    for want_colour in (True, False):
        for slot in order:
            if slot not in taken and (not want_colour or slot_style(slot).color not in colours):
                return slot
    return start  # more than 56 lines: pairs repeat


def _preferred_slot(method: str) -> int:
    known = builtin_algorithms()
    name = _canonical(method)
    if name in known:
        return known.index(name)
    digest = int.from_bytes(hashlib.sha256(method.encode("utf-8")).digest()[:8], "big")
    first = len(known)
    return first + digest % max(1, SLOTS - first)


def _builtin(method: str) -> bool:
    return _canonical(method) in builtin_algorithms()


def _canonical(method: str) -> str:
    from fedforge.algorithms import canonical_name  # noqa: PLC0415 (imports torch)

    return canonical_name(method)


@cache
def builtin_algorithms() -> tuple[str, ...]:
    """fedforge's own algorithms in registry order; plugins are left out, so a figure drawn
    with a plugin loaded colours the built-in methods as one drawn without it."""
    from fedforge.algorithms import ALGORITHMS  # noqa: PLC0415

    return tuple(name for name, factory in ALGORITHMS.items()
                 if getattr(factory, "__module__", "").startswith("fedforge.algorithms"))


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
