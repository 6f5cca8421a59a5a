"""The privacy ledger on its own (fedforge.privacy.ledger): merges, truncation, the checkpoint
table and every refusal of a malformed one, and the checks of a ledger against the config and
the recorded metrics. Pure Python and fast: the mutation run of ledger.py uses this file."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from fedforge.privacy.ledger import (
    Span,
    append,
    check_rerun,
    check_spent,
    from_meta,
    last_epsilon,
    ledger_rounds,
    to_meta,
    truncate,
)

Q = 1 / 3


def _c(first: int, last: int, sigma: float, rate: float = Q, steps: int = 1,
       mode: str = "central") -> Span:
    return Span(first, last, mode, sigma, rate, steps)


def _metrics(tmp_path: Path, *records: dict, raw: bytes = b"") -> Path:
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(raw + b"".join(json.dumps(r).encode() + b"\n" for r in records))
    return path


def _item(**changes) -> dict:
    return {"first": 1, "last": 2, "mode": "central", "sigma": 1.5, "rate": 0.25, "steps": 1,
            **changes}


# --- Span, ledger_rounds ---------------------------------------------------------------
def test_span_rounds_and_mechanism():
    assert _c(3, 5, 1.0).rounds == 3 and _c(4, 4, 1.0).rounds == 1
    span = _c(1, 2, 1.0)
    assert span.same_mechanism(_c(7, 9, 1.0))  # the rounds are not the mechanism
    for other in (_c(1, 2, 1.5), _c(1, 2, 1.0, rate=0.5), _c(1, 2, 1.0, steps=2),
                  _c(1, 2, 1.0, mode="local")):
        assert not span.same_mechanism(other) and not other.same_mechanism(span)


def test_ledger_rounds_is_the_last_round_covered():
    assert ledger_rounds(()) == 0
    assert ledger_rounds((_c(1, 2, 1.0), _c(3, 7, 2.0))) == 7


# --- append ------------------------------------------------------------------------------
def test_append_merges_a_same_sigma_resume_into_the_last_span_and_keeps_the_earlier_ones():
    """σ 0.9 for rounds 1-2, 2.5 for 3-4, then a resume at 2.5: the first span stays (a merge
    that dropped it charged ε 0.54 instead of 3.00)."""
    ledger = (_c(1, 2, 0.9), _c(3, 4, 2.5))
    assert append(ledger, _c(5, 6, 2.5)) == (_c(1, 2, 0.9), _c(3, 6, 2.5))
    three = (_c(1, 1, 0.7), _c(2, 3, 0.9), _c(4, 4, 2.5))
    assert append(three, _c(5, 8, 2.5)) == (_c(1, 1, 0.7), _c(2, 3, 0.9), _c(4, 8, 2.5))


def test_append_merges_into_a_single_span_with_its_mechanism():
    merged = append((_c(1, 3, 1.1, rate=0.5, steps=2, mode="sample"),),
                    _c(4, 4, 1.1, rate=0.5, steps=2, mode="sample"))
    assert merged == (_c(1, 4, 1.1, rate=0.5, steps=2, mode="sample"),)


def test_append_keeps_other_mechanisms_and_gaps_as_their_own_spans():
    ledger = (_c(1, 2, 0.9),)
    assert append(ledger, _c(3, 4, 2.5)) == (_c(1, 2, 0.9), _c(3, 4, 2.5))
    assert append(ledger, _c(4, 5, 0.9)) == (_c(1, 2, 0.9), _c(4, 5, 0.9))  # not adjacent
    assert append(ledger, _c(3, 3, 0.9, rate=0.5)) == (_c(1, 2, 0.9), _c(3, 3, 0.9, rate=0.5))
    assert append((), _c(1, 2, 0.9)) == (_c(1, 2, 0.9),)


def test_append_keeps_a_one_round_span_and_drops_an_empty_one():
    ledger = (_c(1, 2, 0.9),)
    assert append(ledger, _c(3, 3, 2.5)) == (_c(1, 2, 0.9), _c(3, 3, 2.5))
    assert append(ledger, _c(3, 2, 2.5)) == ledger  # rounds 3..2: nothing ran
    assert append(ledger, _c(3, 1, 0.9)) == ledger
    assert append((), _c(1, 0, 0.9)) == ()


def test_a_wrong_merge_changes_epsilon():
    """The ledger of a σ change followed by a same-σ resume, through the accountant."""
    pytest.importorskip("dp_accounting", reason="needs the privacy extra (dp-accounting)")
    from fedforge.privacy.accountant import spent_epsilon  # noqa: PLC0415 (optional extra)

    ledger = append((_c(1, 2, 0.9), _c(3, 4, 2.5)), _c(5, 6, 2.5))
    expected = spent_epsilon((_c(1, 2, 0.9), _c(3, 6, 2.5)), 1e-5, "rdp")
    assert spent_epsilon(ledger, 1e-5, "rdp") == pytest.approx(expected, rel=1e-12)
    assert expected > 2 * spent_epsilon((_c(3, 6, 2.5),), 1e-5, "rdp")


# --- truncate ------------------------------------------------------------------------------
def test_truncate_keeps_the_spans_of_the_first_rounds():
    ledger = (_c(1, 2, 0.9), _c(3, 5, 2.5, rate=0.5, steps=3, mode="sample"))
    assert truncate(ledger, 5) == ledger
    assert truncate(ledger, 9) == ledger
    assert truncate(ledger, 4) == (_c(1, 2, 0.9), _c(3, 4, 2.5, rate=0.5, steps=3,
                                                     mode="sample"))
    assert truncate(ledger, 3) == (_c(1, 2, 0.9), _c(3, 3, 2.5, rate=0.5, steps=3,
                                                     mode="sample"))
    assert truncate(ledger, 2) == (_c(1, 2, 0.9),)
    assert truncate(ledger, 1) == (_c(1, 1, 0.9),)
    assert truncate(ledger, 0) == ()
    assert truncate((), 3) == ()


# --- the checkpoint table ----------------------------------------------------------------
def test_to_meta_and_from_meta_round_trip():
    ledger = (_c(1, 2, 0.9), _c(3, 3, 0.0, rate=1.0, steps=2, mode="sample"),
              _c(4, 6, 2.5, rate=1.0, mode="local"))
    table = to_meta(ledger)
    assert table == {"ledger": [
        {"first": 1, "last": 2, "mode": "central", "sigma": 0.9, "rate": Q, "steps": 1},
        {"first": 3, "last": 3, "mode": "sample", "sigma": 0.0, "rate": 1.0, "steps": 2},
        {"first": 4, "last": 6, "mode": "local", "sigma": 2.5, "rate": 1.0, "steps": 1}]}
    meta = json.loads(json.dumps({"round": 6, "privacy": table}))
    assert from_meta(meta, "x.json") == ledger
    assert from_meta({"round": 0, "privacy": to_meta(())}, "x.json") == ()


def test_from_meta_reads_numbers_as_floats_and_a_one_round_span():
    span = from_meta({"round": 1, "privacy": {"ledger": [_item(last=1, sigma=2, rate=1)]}},
                     "x.json")[0]
    assert span == Span(1, 1, "central", 2.0, 1.0, 1)
    assert type(span.sigma) is float and type(span.rate) is float


@pytest.mark.parametrize("meta", [
    {"round": 2},
    {"round": 2, "privacy": None},
    {"round": 2, "privacy": [_item()]},
    {"round": 2, "privacy": {}},
    {"round": 2, "privacy": {"ledger": {"0": _item()}}},
    {"round": 2, "privacy": {"ledger": None}},
])
def test_a_missing_ledger_is_refused_naming_the_file(meta):
    with pytest.raises(ValueError, match=r"^ck/round_00002.json: checkpoint field "
                                         r"'privacy.ledger' is missing or not a list; the "
                                         r"privacy spent by its rounds is unknown$"):
        from_meta(meta, Path("ck/round_00002.json"))


@pytest.mark.parametrize(("ledger", "round_", "message"), [
    ([_item(first=2)], 2, r"'privacy.ledger\[0\]' starts at round 2, not 1$"),
    ([_item(), _item(first=4, last=5)], 5, r"'privacy.ledger\[1\]' starts at round 4, not 3$"),
    ([_item(), _item(first=2, last=5)], 5, r"'privacy.ledger\[1\]' starts at round 2, not 3$"),
    ([_item()], 3, r"'privacy.ledger' covers rounds 1-2, not the checkpoint's rounds 1-3$"),
    ([_item()], 1, r"'privacy.ledger' covers rounds 1-2, not the checkpoint's rounds 1-1$"),
    ([], 2, r"'privacy.ledger' covers rounds 1-0, not the checkpoint's rounds 1-2$"),
    ([_item()], None, r"'privacy.ledger' covers rounds 1-2, not the checkpoint's rounds "
                      r"1-None$"),
])
def test_a_ledger_not_covering_the_checkpoint_is_refused(ledger, round_, message):
    with pytest.raises(ValueError, match=r"^x.json: checkpoint field " + message):
        from_meta({"round": round_, "privacy": {"ledger": ledger}}, "x.json")


FIELDS = r"expected a table with exactly \['first', 'last', 'mode', 'sigma', 'rate', 'steps'\]"
ROUNDS = r"'first', 'last' and 'steps' must be integers >= 1 with first <= last, got "
NUMBERS = r"'sigma' must be a finite number >= 0 and 'rate' in \(0, 1\], got "


@pytest.mark.parametrize(("item", "message"), [
    ([1, 2], rf"{FIELDS}, got \[1, 2\]$"),
    (None, rf"{FIELDS}, got None$"),
    ({k: v for k, v in _item().items() if k != "steps"}, rf"{FIELDS}, got \{{"),
    (_item(extra=0), rf"{FIELDS}, got \{{.*'extra': 0\}}$"),
    (_item(first=0), ROUNDS + r"\{'first': 0,"),
    (_item(first=-1), ROUNDS),
    (_item(first=1.0), ROUNDS),
    (_item(first=True), ROUNDS),
    (_item(last="2"), ROUNDS),
    (_item(last=0, first=1), ROUNDS),
    (_item(first=3, last=2), ROUNDS),
    (_item(steps=0), ROUNDS),
    (_item(steps=False), ROUNDS),
    (_item(steps=1.5), ROUNDS),
    (_item(mode="none"), r"'mode' must be one of \['central', 'local', 'sample'\], got 'none'$"),
    (_item(mode=None), r"'mode' must be one of .*, got None$"),
    (_item(sigma=-0.5), NUMBERS + r"-0.5 and 0.25$"),
    (_item(sigma="1.0"), NUMBERS + r"'1.0' and 0.25$"),
    (_item(sigma=math.inf), NUMBERS + r"inf and 0.25$"),
    (_item(sigma=math.nan), NUMBERS + r"nan and 0.25$"),
    (_item(sigma=True), NUMBERS + r"True and 0.25$"),
    (_item(sigma=None), NUMBERS),
    (_item(rate=0), NUMBERS + r"1.5 and 0$"),
    (_item(rate=-0.1), NUMBERS),
    (_item(rate=1.5), NUMBERS + r"1.5 and 1.5$"),
    (_item(rate=1.0000001), NUMBERS),
    (_item(rate=math.nan), NUMBERS),
    (_item(rate=math.inf), NUMBERS),
    (_item(rate=True), NUMBERS),
    (_item(rate="0.5"), NUMBERS),
])
def test_a_malformed_span_is_refused_naming_its_index(item, message):
    meta = {"round": 4, "privacy": {"ledger": [_item(), item]}}
    with pytest.raises(ValueError, match=r"^x.json: checkpoint field 'privacy.ledger\[1\]': "
                                         + message) as err:
        from_meta(meta, "x.json")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(("sigma", "rate"), [(0, 1), (0.0, 0.5), (1e-9, 1e-9), (3, 1.0)])
def test_edge_values_are_accepted(sigma, rate):
    """σ = 0 is a span without noise (ε is then infinite, and reported so), not a malformed
    one; q may be anything in (0, 1]; a span may be a single round."""
    meta = {"round": 3, "privacy": {"ledger": [_item(sigma=sigma, rate=rate),
                                               _item(first=3, last=3, steps=4)]}}
    assert from_meta(meta, "x.json") == (Span(1, 2, "central", float(sigma), float(rate), 1),
                                         Span(3, 3, "central", 1.5, 0.25, 4))


# --- checks against the run ------------------------------------------------------------------
RUN = {"mode": "central", "rate": Q, "steps": 1}
TWO = (_c(1, 2, 0.9), _c(3, 4, 2.5))


def test_check_spent_accepts_the_runs_own_ledger(tmp_path):
    metrics = _metrics(tmp_path, {"round": 0, "dp_noise_multiplier": 5.0},  # no such round
                       {"round": -1, "dp_noise_multiplier": 5.0},
                       {"round": 1, "dp_noise_multiplier": 0.9},
                       {"round": 2, "train_loss": 1.0},  # not evaluated: no σ recorded
                       {"round": 3, "dp_noise_multiplier": "2.5"},  # not a number: skipped
                       {"round": 4, "dp_noise_multiplier": 2.5},
                       {"round": 5, "dp_noise_multiplier": 7.0})  # after the checkpoint
    check_spent(TWO, RUN, "x.json", metrics)
    check_spent((_c(1, 4, 1),), {**RUN, "sigma": 1.0}, "x.json",
                _metrics(tmp_path, {"round": 4, "dp_noise_multiplier": 1}))
    check_spent((), {**RUN, "sigma": 1.0}, "x.json", tmp_path / "absent.jsonl")


@pytest.mark.parametrize(("run", "message"), [
    ({**RUN, "mode": "local"}, r"\[0\].mode' is 'central', but this run's config gives 'local'$"),
    ({**RUN, "rate": 0.5}, r"\[0\].rate' is 0.3333333333333333, but this run's config gives "
                           r"0.5$"),
    ({**RUN, "steps": 3}, r"\[0\].steps' is 1, but this run's config gives 3$"),
    ({**RUN, "sigma": 2.5}, r"\[0\].sigma' is 0.9, but this run's config gives 2.5$"),
    ({**RUN, "sigma": 0.9}, r"\[1\].sigma' is 2.5, but this run's config gives 0.9$"),
])
def test_check_spent_refuses_a_span_the_config_does_not_give(tmp_path, run, message):
    with pytest.raises(ValueError, match=r"^x.json: checkpoint field 'privacy.ledger" + message):
        check_spent(TWO, run, "x.json", tmp_path / "absent.jsonl")


@pytest.mark.parametrize(("t", "index"), [(1, 0), (2, 0), (3, 1), (4, 1)])
def test_check_spent_refuses_a_sigma_the_records_contradict(tmp_path, t, index):
    metrics = _metrics(tmp_path, *({"round": r, "dp_noise_multiplier": 9.5 if r == t else s}
                                   for r, s in ((1, 0.9), (2, 0.9), (3, 2.5), (4, 2.5))))
    sigma = TWO[index].sigma
    with pytest.raises(ValueError, match=rf"^x.json: checkpoint field 'privacy.ledger\[{index}\]"
                                         rf".sigma' is {sigma}, but {re.escape(str(metrics))} "
                                         rf"records dp_noise_multiplier 9.5 for round {t}$"):
        check_spent(TWO, RUN, "x.json", metrics)


def test_check_spent_reads_the_records_not_every_round(tmp_path):
    """A forged span of 10^12 rounds is checked at the recorded rounds only (no loop over
    its rounds), in the order of the log."""
    metrics = _metrics(tmp_path, {"round": 10**12, "dp_noise_multiplier": 2.0},
                       {"round": 5, "dp_noise_multiplier": 3.0})
    with pytest.raises(ValueError, match=r"\[0\].sigma' is 1.0, but .* dp_noise_multiplier "
                                         r"2.0 for round 1000000000000$"):
        check_spent((_c(1, 10**12, 1.0),), RUN, "x.json", metrics)


def test_last_epsilon_is_the_last_record_that_has_one(tmp_path):
    assert last_epsilon(tmp_path / "absent.jsonl") is None
    assert last_epsilon(_metrics(tmp_path, {"round": 1, "train_loss": 0.5})) is None
    found = last_epsilon(_metrics(tmp_path, {"round": 1, "dp_epsilon": 0.5},
                                  {"round": 2, "dp_epsilon": 3},
                                  {"round": 3, "train_loss": 1.0},
                                  {"round": 4, "dp_epsilon": "9"},
                                  {"round": 5, "dp_epsilon": True},
                                  {"round": 6, "dp_epsilon": math.nan},
                                  {"round": 7, "dp_epsilon": -math.inf}))
    assert found == (2, 3.0) and type(found[1]) is float
    assert last_epsilon(_metrics(tmp_path, {"round": 1, "dp_epsilon": 0.5},
                                 {"round": 2, "dp_epsilon": math.inf})) == (2, math.inf)


def test_records_skip_what_is_not_a_record_of_a_round(tmp_path):
    """Torn or foreign lines are skipped, and bytes that are not UTF-8 do not stop reading."""
    lines = [b'{"round": 1, "dp_epsilon": 1.0}', b'{"round": 2, "dp_eps', b"not json",
             b'{"round": "3", "dp_epsilon": 8}', b'{"round": true, "dp_epsilon": 8}',
             b'{"dp_epsilon": 8}', b"[4, 5]", b'{"round": 4, "dp_epsilon": 2.0, "n": "\xff"}',
             b'{"round": 5, "dp_epsilon": 3.0}', b'{"round": 6, "dp_eps']
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    assert last_epsilon(path) == (5, 3.0)
    path.write_bytes(b"\n".join(lines[:8]) + b"\n")
    assert last_epsilon(path) == (4, 2.0)


# --- check_rerun ------------------------------------------------------------------------------
def test_check_rerun_accepts_rounds_rerun_at_their_sigma(tmp_path):
    spent = (_c(1, 2, 0.9), _c(3, 4, 2.5))
    check_rerun(spent, 7.0, tmp_path / "absent.jsonl")
    check_rerun(spent, 7.0, _metrics(tmp_path, {"round": 4, "dp_noise_multiplier": 2.5}))
    lost = _metrics(tmp_path, {"round": 4, "dp_noise_multiplier": 2.5},
                    {"round": 5, "dp_noise_multiplier": 3.5}, {"round": 6, "train_loss": 1.0})
    check_rerun(spent, 3.5, lost)
    check_rerun(spent, 2.5, _metrics(tmp_path, {"round": 5, "train_loss": 1.0}))
    three = (_c(1, 1, 0.7), _c(2, 2, 0.9), _c(3, 4, 2.5))  # the last span's σ, not another's
    check_rerun(three, 2.5, _metrics(tmp_path, {"round": 5, "train_loss": 1.0}))
    check_rerun((), 1.5, _metrics(tmp_path, {"round": 1, "train_loss": 1.0}))


@pytest.mark.parametrize(("records", "sigma", "ran"), [
    ([{"round": 5, "dp_noise_multiplier": 3.5}, {"round": 6, "train_loss": 1.0}], 2.5, r"\[3.5\]"),
    ([{"round": 5, "train_loss": 1.0}, {"round": 6, "dp_noise_multiplier": "x"}], 0.9, r"\[2.5\]"),
    ([{"round": 5, "dp_noise_multiplier": 3.5}, {"round": 6, "dp_noise_multiplier": 1}], 3.5,
     r"\[1.0, 3.5\]"),
])
def test_check_rerun_refuses_rounds_rerun_at_another_sigma(tmp_path, records, sigma, ran):
    metrics = _metrics(tmp_path, {"round": 4, "dp_noise_multiplier": 2.5}, *records)
    with pytest.raises(ValueError, match=rf"^{re.escape(str(metrics))}: rounds 5-6 were released "
                                         rf"after the last checkpoint at noise_multiplier {ran}, "
                                         rf"and re-running them at {sigma} with the same noise "
                                         r"would reveal their sums; resume with the rounds "
                                         r"total they ran under first$"):
        check_rerun((_c(1, 1, 0.7), _c(2, 2, 0.9), _c(3, 4, 2.5)), sigma, metrics)
