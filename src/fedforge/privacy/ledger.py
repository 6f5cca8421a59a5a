"""The privacy ledger: the mechanism actually applied in every round, kept in the checkpoint.

ε is the composition of what was spent, not of what the current config would spend: a
resume that changes σ (a new ``rounds`` total re-calibrates it) must still charge the
earlier rounds at the σ they ran with. Each entry is a span of consecutive rounds with one
mechanism (mode, σ, q, Gaussian steps per round); the spans cover rounds 1..k of the
checkpoint of round k exactly. No ``dp-accounting`` import here: the accountant composes
the entries (:func:`fedforge.privacy.accountant.ledger_event`).
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

MODES = ("central", "local", "sample")
KEY = "privacy"  # the checkpoint meta's table: {"ledger": [span, ...]}


@dataclass(frozen=True)
class Span:
    """Rounds ``first..last`` run with one mechanism (one ledger entry)."""

    first: int
    last: int
    mode: str  # central | local | sample
    sigma: float  # the noise multiplier applied (and charged); 0: no noise, ε infinite
    rate: float  # q: Poisson client sampling rate (central); 1 otherwise
    steps: int  # Gaussian mechanisms per round per protected unit

    @property
    def rounds(self) -> int:
        return self.last - self.first + 1

    def same_mechanism(self, other: Span) -> bool:
        return (self.mode, self.sigma, self.rate, self.steps) == (
            other.mode, other.sigma, other.rate, other.steps)


Ledger = tuple[Span, ...]


def ledger_rounds(ledger: Ledger) -> int:
    """Rounds the ledger covers (its spans are contiguous from round 1)."""
    return ledger[-1].last if ledger else 0


def append(ledger: Ledger, span: Span) -> Ledger:
    """``ledger`` with ``span`` after it, merged into the last span when the mechanism is the
    same (so an uninterrupted run and a resumed one keep the same ledger)."""
    if span.rounds <= 0:
        return ledger
    if ledger and ledger[-1].same_mechanism(span) and ledger[-1].last + 1 == span.first:
        last = ledger[-1]
        return (*ledger[:-1], Span(last.first, span.last, last.mode, last.sigma, last.rate,
                                   last.steps))
    return (*ledger, span)


def truncate(ledger: Ledger, rounds: int) -> Ledger:
    """The spans of rounds ``1..rounds`` only."""
    out: list[Span] = []
    for s in ledger:
        if s.first > rounds:
            break
        last = min(s.last, rounds)
        out.append(Span(s.first, last, s.mode, s.sigma, s.rate, s.steps))
    return tuple(out)


def to_meta(ledger: Ledger) -> dict:
    """The checkpoint meta's ``privacy`` table."""
    return {"ledger": [asdict(s) for s in ledger]}


def from_meta(meta: dict, path: Path | str) -> Ledger:
    """The ledger of the checkpoint ``meta`` read from ``path``, refused in one line naming
    the file when it is missing or malformed, or does not cover rounds 1..round exactly."""
    table = meta.get(KEY)
    raw = table.get("ledger") if isinstance(table, dict) else None
    if not isinstance(raw, list):
        raise ValueError(f"{path}: checkpoint field 'privacy.ledger' is missing or not a list; "
                         f"the privacy spent by its rounds is unknown")
    ledger: Ledger = ()
    for i, item in enumerate(raw):
        span = _span(item, f"{path}: checkpoint field 'privacy.ledger[{i}]'")
        if span.first != ledger_rounds(ledger) + 1:
            raise ValueError(f"{path}: checkpoint field 'privacy.ledger[{i}]' starts at round "
                             f"{span.first}, not {ledger_rounds(ledger) + 1}")
        ledger = (*ledger, span)
    if ledger_rounds(ledger) != meta.get("round"):
        raise ValueError(f"{path}: checkpoint field 'privacy.ledger' covers rounds 1-"
                         f"{ledger_rounds(ledger)}, not the checkpoint's rounds 1-"
                         f"{meta.get('round')}")
    return ledger


def check_rerun(spent: Ledger, sigma: float, metrics: Path) -> None:
    """Refuse to re-run rounds released after the last checkpoint at a different σ.

    Such rounds (a crash after them, before their checkpoint) drew their noise from
    (seed, round), and a re-run draws the same noise: at the same σ it releases the same
    outputs again (free), at another σ the two outputs together reveal the noiseless sum.
    Their σ is the ``dp_noise_multiplier`` of their records, else the ledger's last σ."""
    done = ledger_rounds(spent)
    lost = [r for r in _records(metrics) if r["round"] > done]
    if not lost:
        return
    ran = {float(r["dp_noise_multiplier"]) for r in lost
           if _is_number(r.get("dp_noise_multiplier"))} or {spent[-1].sigma if spent else sigma}
    if ran != {sigma}:
        last = max(r["round"] for r in lost)
        raise ValueError(f"{metrics}: rounds {done + 1}-{last} were released after the last "
                         f"checkpoint at noise_multiplier {sorted(ran)}, and re-running them "
                         f"at {sigma} with the same noise would reveal their sums; resume "
                         f"with the rounds total they ran under first")


def check_spent(spent: Ledger, run: Mapping[str, object], source: Path | str,
                metrics: Path) -> None:
    """Refuse a checkpoint ledger that is not the record of this run: a forged or mixed-up
    folder would otherwise have its rounds charged at a σ or q they never ran with, and ε
    under-reported. Every span's fields named in ``run`` (the config's mode, rate and
    steps, and σ where the config fixes it) must have its values, and its σ must be the
    ``dp_noise_multiplier`` that ``metrics`` recorded for each of its rounds."""
    for i, span in enumerate(spent):
        for name, want in run.items():
            if getattr(span, name) != want:
                raise ValueError(f"{source}: checkpoint field 'privacy.ledger[{i}].{name}' is "
                                 f"{getattr(span, name)!r}, but this run's config gives "
                                 f"{want!r}")
    starts = [s.first for s in spent]
    for r in _records(metrics):
        t, ran = r["round"], r.get("dp_noise_multiplier")
        i = bisect.bisect_right(starts, t) - 1  # the span of round t, if any
        if i >= 0 and t <= spent[i].last and _is_number(ran) and ran != spent[i].sigma:
            raise ValueError(f"{source}: checkpoint field 'privacy.ledger[{i}].sigma' is "
                             f"{spent[i].sigma}, but {metrics} records dp_noise_multiplier "
                             f"{ran} for round {t}")


def last_epsilon(metrics: Path) -> tuple[int, float] | None:
    """The round and ``dp_epsilon`` of the last record of ``metrics`` that has one (ε may
    be infinite: a run without noise), or None: what a resume must not report less than."""
    found = [(r["round"], float(r["dp_epsilon"])) for r in _records(metrics)
             if _is_number(r.get("dp_epsilon")) or r.get("dp_epsilon") == math.inf]
    return found[-1] if found else None


def _records(metrics: Path) -> list[dict]:
    """The records of ``metrics.jsonl`` that have an integer round (others are skipped)."""
    if not metrics.is_file():
        return []
    out = []
    for line in metrics.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and _is_int(record.get("round")):
            out.append(record)
    return out


def _span(item: object, where: str) -> Span:
    """One ledger entry, checked field by field."""
    fields = ("first", "last", "mode", "sigma", "rate", "steps")
    if not isinstance(item, dict) or set(item) != set(fields):
        raise ValueError(f"{where}: expected a table with exactly {list(fields)}, got {item!r}")
    first, last, steps = item["first"], item["last"], item["steps"]
    sigma, rate = item["sigma"], item["rate"]
    if not all(_is_int(v) and v >= 1 for v in (first, last, steps)) or last < first:
        raise ValueError(f"{where}: 'first', 'last' and 'steps' must be integers >= 1 with "
                         f"first <= last, got {item!r}")
    if item["mode"] not in MODES:
        raise ValueError(f"{where}: 'mode' must be one of {list(MODES)}, got {item['mode']!r}")
    if not (_is_number(sigma) and sigma >= 0) or not (_is_number(rate) and 0 < rate <= 1):
        raise ValueError(f"{where}: 'sigma' must be a finite number >= 0 and 'rate' in (0, 1], "
                         f"got {sigma!r} and {rate!r}")
    return Span(first, last, item["mode"], float(sigma), float(rate), steps)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))
