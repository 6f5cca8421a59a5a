"""The verdict protocol of issue 55, by hand: the power rule, TOST and the "equivalent"
verdict, the exact sign test on censored times, what "contradicted" is kept for, the
refusal of an empty data folder, and the generated summary."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from scipy import stats as st
from typer.testing import CliRunner

from fedforge import cli
from fedforge.reproduce import (
    REPRODUCTIONS,
    Comparison,
    Condition,
    Reproduction,
    get_reproduction,
    papers,
    parse_seeds,
    reproduce,
)
from fedforge.reproduce.report import RunSummary, method_looks, seeds_line, write_report
from fedforge.reproduce.stats import (
    censored_signs,
    seeds_needed,
    sign_test_p,
    sign_test_seeds,
    tost_p,
)
from fedforge.reproduce.summary import write_summary
from fedforge.reproduce.verdicts import judge
from fedforge.study.stats import paired_difference

ROOT = Path(__file__).resolve().parents[2]
DOCS, DATA = ROOT / "docs", ROOT / "docs" / "data"
assert papers


# ------------------------------------------------------------------ the power rule

def _z(n: int, level: float, equivalence: bool = False) -> float:
    if equivalence:
        return st.t.ppf(1 - level, n - 1) + st.t.ppf(0.9, n - 1)
    return st.t.ppf(1 - level / 2, n - 1) + st.t.ppf(0.8, n - 1)


def test_seeds_needed_is_the_smallest_n_that_detects_the_effect():
    """sd = 1, δ = 1, one test: (t_.975,9 + t_.8,9) / √10 = (2.2622 + 0.8834) / 3.1623 = 0.9947
    ≤ 1, while n = 9 gives 1.06: 10 seeds. A family of 16 tests at α/16: 19 seeds."""
    assert _z(10, 0.05) / math.sqrt(10) == pytest.approx(0.9947, abs=1e-4)
    assert _z(9, 0.05) / math.sqrt(9) > 1.0
    assert seeds_needed(1.0, 1.0, 1) == 10
    assert _z(19, 0.05 / 16) / math.sqrt(19) <= 1.0 < _z(18, 0.05 / 16) / math.sqrt(18)
    assert seeds_needed(1.0, 1.0, 16) == 19
    # equivalence (TOST at a true difference 0): t_{1-α} + t_{0.9}
    n = seeds_needed(1.0, 1.0, 1, equivalence=True)
    assert _z(n, 0.05, True) / math.sqrt(n) <= 1.0 < _z(n - 1, 0.05, True) / math.sqrt(n - 1)
    assert n == 11
    assert seeds_needed(0.001, 1.0, 1, minimum=5) == 5  # never fewer than 5 for a primary
    assert seeds_needed(math.nan, 1.0, 1) is None  # no pilot spread yet


def test_the_page_prints_the_power_rule_beside_each_verdict():
    spec = _spec((Comparison("a", "b", "final_acc", ">", primary=True),))
    runs = _acc({"a": [0.80, 0.83, 0.81], "b": [0.79, 0.80, 0.80]})
    j, = judge(spec, runs)
    assert j.effect == 0.01 and j.needed == seeds_needed(j.diff.sd, 0.01, 1, minimum=5)
    assert j.underpowered and j.needed > 3


# ------------------------------------------------------------------ TOST, equivalent

def test_tost_p_by_hand():
    """d = [0.001, 0.002, 0.003]: mean 0.002, se = 0.001/√3; against ±0.02 the two one-sided
    t statistics are 0.022/se and 0.018/se, p = the larger of the two tails."""
    diff = paired_difference([0.801, 0.802, 0.803], [0.8, 0.8, 0.8])
    se = 0.001 / math.sqrt(3)
    want = max(st.t.sf(0.022 / se, 2), st.t.sf(0.018 / se, 2))
    assert tost_p(diff, 0.02) == pytest.approx(want, rel=1e-6)
    wide = paired_difference([0.80, 0.83, 0.77], [0.8, 0.8, 0.8])
    assert tost_p(wide, 0.02) > 0.05


def _spec(comparisons, **kw) -> Reproduction:
    conds = tuple(Condition(n, "fedavg", label=n.upper()) for n in "abc")
    return Reproduction(name="synthetic", claim="test only", config="x.toml", conditions=conds,
                        seeds=(0, 1, 2), target=None, comparisons=comparisons,
                        effects={"final_acc": (0.01, "one point, for the test")}, **kw)


def _acc(values: dict[str, list[float]]) -> dict:
    return {n: {s: RunSummary(s, 1.0, 1.0, v, True, 1.0, []) for s, v in enumerate(vs)}
            for n, vs in values.items()}


@pytest.mark.parametrize("a, call", [
    ([0.8005, 0.8012, 0.7998], "equivalent"),  # within ±0.02 for sure
    ([0.80, 0.83, 0.77], "inconclusive"),  # too spread to say either way
    ([0.85, 0.86, 0.855], "contradicted"),  # beyond the margin: the claim fails
])
def test_an_as_good_as_claim_is_judged_by_tost(a, call):
    spec = _spec((Comparison("a", "b", "final_acc", kind="equivalence", margin=0.02),))
    j, = judge(spec, _acc({"a": a, "b": [0.8, 0.8, 0.8]}))
    assert j.call == call


def test_no_effect_that_matters_is_equivalent_not_inconclusive():
    """A direction claim whose difference lies within ± its smallest effect (0.01): the
    data show no effect that matters."""
    spec = _spec((Comparison("a", "b", "final_acc", ">"),))
    j, = judge(spec, _acc({"a": [0.8001, 0.8003, 0.7999], "b": [0.8, 0.8, 0.8]}))
    assert (j.call, j.test) == ("equivalent", "TOST")


def test_contradicted_is_kept_for_claims_the_paper_makes():
    """b clearly above a: a direction claim "a > b" is contradicted; a row the paper does
    not claim only differs."""
    runs = _acc({"a": [0.70, 0.71, 0.705], "b": [0.80, 0.805, 0.81]})
    claimed, none = judge(_spec((Comparison("a", "b", "final_acc", ">"),
                                 Comparison("a", "b", "final_acc", ">", kind="none"))), runs)
    assert claimed.call == "contradicted" and none.call == "differs"


# ----------------------------------------------------------- censored: the sign test

@pytest.mark.parametrize("a, ar, b, br, signs", [
    ([10, 20], [True, True], [15, 15], [True, True], (1, 1, 0)),
    ([10], [True], [150], [False], (1, 0, 0)),  # observed a below b's budget: a < b
    ([30], [True], [20], [False], (0, 0, 1)),  # observed a above b's (shorter) budget
    ([150], [False], [150], [False], (0, 0, 1)),  # both censored: unknown
    ([12], [False], [23], [True], (0, 0, 1)),  # a censored below b's time: unknown
    ([150], [False], [120], [True], (0, 1, 0)),  # a censored above b's time: a > b
])
def test_censored_signs_order_only_the_pairs_whose_order_is_certain(a, ar, b, br, signs):
    assert censored_signs(a, ar, b, br) == signs


def test_the_exact_sign_test_by_hand():
    assert sign_test_p(3, 0, 3) == pytest.approx(0.25)  # 2 / 2³: the floor with 3 seeds
    assert sign_test_p(5, 0, 5) == pytest.approx(2 / 32)
    assert sign_test_p(4, 0, 5) == pytest.approx(2 * 6 / 32)  # P(X ≥ 4) = 6/32
    assert sign_test_p(0, 0, 3) == 1.0
    assert sign_test_seeds(1) == 6 and sign_test_seeds(16) == 10  # 2/2ⁿ ≤ α/m


# --------------------------------------------------------- the command and the pages

def test_report_only_refuses_a_data_folder_with_no_runs_in_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli.app, ["reproduce", "fedast", "--report-only", "-q"])
    assert result.exit_code != 0
    lines = [x for x in result.output.splitlines() if x.strip()]
    assert len(lines) == 1 and "no runs of 'fedast'" in lines[0], result.output
    assert not (tmp_path / "reproductions").exists()
    with pytest.raises(ValueError, match="--data .*: no runs of 'fedast'"):
        reproduce("fedast", data=tmp_path, report_only=True, progress=False)


def test_report_all_writes_a_page_for_a_grid_not_run_yet_and_refuses_an_empty_folder(tmp_path):
    from fedforge.reproduce import report_all

    data = tmp_path / "data"
    (data / "fedast").mkdir(parents=True)
    with pytest.raises(ValueError, match="--data .*: no runs of 'baselines'"):
        report_all(data, tmp_path / "out")
    seed = DATA / "fadamgc"
    first = sorted(seed.glob("*/seed*.jsonl"))[0]
    target = data / "fadamgc" / first.parent.name / first.name
    target.parent.mkdir(parents=True)
    target.write_bytes(first.read_bytes())
    report_all(data, tmp_path / "out")
    page = (tmp_path / "out" / "reproductions" / "fedast.md").read_text(encoding="utf-8")
    spec = get_reproduction("fedast")
    assert f"**incomplete: 0 of {len(spec.conditions) * len(spec.seeds)} runs**" in page


def test_help_lists_every_reproduction():
    result = CliRunner().invoke(cli.app, ["reproduce", "--help"], terminal_width=200)
    assert all(name in result.output for name in REPRODUCTIONS), result.output


def test_parse_seeds():
    assert parse_seeds("0-4,7") == (0, 1, 2, 3, 4, 7)
    assert parse_seeds("2,2,1") == (2, 1)
    with pytest.raises(ValueError, match="--seeds"):
        parse_seeds("4-1")


def test_extra_seeds_in_the_data_folder_join_the_report(tmp_path):
    """A power-rule rerun adds seed3.jsonl, seed4.jsonl: the page reads them (5 seeds)."""
    spec = _spec((Comparison("a", "b", "final_acc", ">", primary=True),))
    for cond, acc in (("a", 0.8), ("b", 0.7)):
        for seed in range(5):
            path = tmp_path / "data" / "synthetic" / cond / f"seed{seed}.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f'{{"round": 1, "test_accuracy": {acc + 0.001 * seed}}}\n')
    page = write_report(spec, tmp_path / "data", tmp_path / "out").read_text()
    assert "5 / 5" in page and "not run yet" in page  # c has no runs
    assert "Seeds 0, 1, 2, and more in the settings whose seeds column lists them" in page


def test_the_seeds_line_names_the_spec_s_seeds_when_no_setting_has_more():
    spec = _spec(())
    assert seeds_line(spec, _acc({"a": [0.8] * 3, "b": [0.7] * 2})) == "Seeds 0, 1, 2"
    assert "and more" in seeds_line(spec, _acc({"a": [0.8] * 4}))


def test_pfl_figures_keep_a_method_s_colour_across_settings():
    spec = get_reproduction("pfl")
    names = [n for _, ns in spec.panels for n in ns]
    looks = method_looks(spec, names)
    assert looks["c10_dir_fedavg"] == looks["c10_pat_fedavg"] == looks["fem_pat_fedavg"]
    assert looks["c10_dir_fedbabu_official"] == looks["fem_pat_fedbabu_official"]
    assert looks["c10_dir_fedbabu_official"] != looks["c10_dir_fedbabu"]


def test_the_committed_summary_equals_its_generator(tmp_path):
    """docs/reproductions.md is written from the same raw metrics and verdicts as the
    pages, so it cannot drift from them."""
    specs = [get_reproduction(n) for n in sorted(REPRODUCTIONS)]
    fresh = write_summary(specs, DATA, tmp_path).read_text(encoding="utf-8")
    assert fresh == (DOCS / "reproductions.md").read_text(encoding="utf-8"), (
        "docs/reproductions.md is stale: run `fedforge reproduce all --report-only --out docs` "
        "from the repository root")
    assert "Not run yet\n" not in fresh and "{#pfl}" in fresh
