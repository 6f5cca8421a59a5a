"""The committed reproduction pages are what their generator writes from docs/data, the CLI
writes beside the user (never into the package), and the verdicts state their correction
and their censoring."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import matplotlib
import pytest
from PIL import Image
from typer.testing import CliRunner

import fedforge
from fedforge import cli
from fedforge.reproduce import (
    REPRODUCTIONS,
    Comparison,
    Condition,
    Reproduction,
    get_reproduction,
    papers,
    reproduce,
)
from fedforge.reproduce.report import RunSummary, headline, judge, write_report

ROOT = Path(__file__).resolve().parents[2]
DOCS, DATA = ROOT / "docs", ROOT / "docs" / "data"
assert papers  # importing it registers every built-in reproduction
NAMES = sorted(REPRODUCTIONS)


def test_every_committed_page_has_a_registered_generator():
    committed = sorted(p.stem for p in (DOCS / "reproductions").glob("*.md"))
    assert committed == NAMES


def _same_renderer(png: Path) -> bool:
    """PNG bytes are compared only when the committed file was drawn by this matplotlib:
    other versions rasterise (and stamp the version) differently."""
    return matplotlib.__version__ in Image.open(png).info.get("Software", "")


@pytest.mark.parametrize("name", NAMES)
def test_committed_page_equals_its_generator(name, tmp_path):
    """Regenerate from the committed raw metrics into a scratch folder and diff."""
    spec = get_reproduction(name)
    page = write_report(spec, DATA, tmp_path, command=f"fedforge reproduce {name}")
    committed = DOCS / "reproductions" / f"{name}.md"
    assert page.read_text(encoding="utf-8") == committed.read_text(encoding="utf-8"), (
        f"docs/reproductions/{name}.md is stale: run `fedforge reproduce {name} "
        "--report-only --out docs` from the repository root")
    fresh = sorted(p.name for p in (tmp_path / "img").glob("*.png"))
    assert fresh == sorted(p.name for p in (DOCS / "img").glob(f"{name}_*.png"))
    for png in fresh:
        if _same_renderer(DOCS / "img" / png):
            assert (tmp_path / "img" / png).read_bytes() == (DOCS / "img" / png).read_bytes(), (
                f"docs/img/{png} is stale")


# --------------------------------------------------------------------------- where to

def _files(folder: Path) -> dict[str, int]:
    """The reproduction's own outputs below ``folder`` (other files change as modules are
    compiled or edited, so only these are watched)."""
    return {str(p): p.stat().st_mtime_ns for p in folder.rglob("fedast*") if p.is_file()}


def test_report_only_writes_below_the_current_folder_by_default(tmp_path, monkeypatch):
    """``--out`` defaults to ./reproductions/NAME: nothing lands in the package or in the
    repository's docs, which only ``--out docs`` rewrites."""
    package = Path(fedforge.__file__).resolve().parent
    before = _files(package), _files(DOCS)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli.app, ["reproduce", "fedast", "--report-only", "-q",
                                          "--data", str(DATA)])
    assert result.exit_code == 0, result.output
    out = tmp_path / "reproductions" / "fedast"
    assert (out / "reproductions" / "fedast.md").is_file()
    assert {p.name for p in (out / "img").iterdir()} == {"fedast_accuracy.png",
                                                          "fedast_diagnostics.png"}
    assert (_files(package), _files(DOCS)) == before
    assert "incomplete" not in (out / "reproductions" / "fedast.md").read_text()


def test_out_names_the_folder_and_the_api_defaults_alike(tmp_path, monkeypatch):
    result = CliRunner().invoke(cli.app, ["reproduce", "fedast", "--report-only", "-q",
                                          "--data", str(DATA), "--out", str(tmp_path / "x")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "x" / "reproductions" / "fedast.md").is_file()
    monkeypatch.chdir(tmp_path)
    page = reproduce("fedast", data=DATA, report_only=True, progress=False)
    assert page == tmp_path / "reproductions" / "fedast" / "reproductions" / "fedast.md"


# ------------------------------------------------------------- censoring and Holm

def _spec(comparisons: tuple[Comparison, ...]) -> Reproduction:
    conds = tuple(Condition(n, "fedavg", label=n.upper()) for n in ("a", "b", "c", "d", "e"))
    return Reproduction(name="synthetic", claim="test only", config="x.toml",
                        conditions=conds, seeds=(0, 1, 2), target=0.8,
                        comparisons=comparisons)


def _runs(rounds: dict[str, list[float]], budget: float = 150.0) -> dict:
    """Rounds to target per seed; a run at the budget never reached the target."""
    return {name: {s: RunSummary(s, r, r, 0.8, r < budget, 1.0, [])
                   for s, r in enumerate(values)} for name, values in rounds.items()}


def test_a_censored_baseline_is_tested_as_censored_not_by_a_t_test():
    """b never reaches the target in 3 seeds: the t-test on the clipped times says
    p < 0.001 (a − b = -110 ± 5), but the times are only bounds. The exact sign test sees
    3 of 3 pairs ordered, which with 3 seeds cannot go below p = 0.25: inconclusive."""
    from fedforge.reproduce.stats import p_value

    spec = _spec((Comparison("a", "b", "rounds", "<"),))
    runs = _runs({"a": [40.0, 45.0, 35.0], "b": [150.0] * 3})
    j, = judge(spec, runs)
    assert p_value(j.diff) < 0.001  # what a t-test on the clipped values would claim
    assert j.test == "exact sign test" and j.signs == (3, 0, 0)
    assert j.p == pytest.approx(0.25) and j.call == "inconclusive"
    line, = headline(spec, runs)
    assert "B ≥ 150 in 3 of 3 seeds, censored" in line
    assert "cannot go below p = 0.25" in line
    five = _runs({"a": [40.0, 45.0, 35.0, 50.0, 42.0, 44.0], "b": [150.0] * 6})
    j, = judge(replace(spec, seeds=tuple(range(6))), five)
    assert j.p == pytest.approx(2 / 2 ** 6) and j.call == "reproduced"


def test_a_censored_run_below_the_other_time_leaves_its_pair_undetermined():
    """a's seed 2 stopped at 12 simulated seconds without reaching the target, below b's
    23: that pair's order is unknown, so only 2 of 3 pairs count and p = 1."""
    spec = _spec((Comparison("a", "b", "sim_time", "<"),))

    def run(seed, t, reached):
        return RunSummary(seed, 10.0, t, 0.8, reached, 1.0, [])

    runs = {"a": {0: run(0, 10.0, True), 1: run(1, 11.0, True), 2: run(2, 12.0, False)},
            "b": {0: run(0, 20.0, True), 1: run(1, 22.0, True), 2: run(2, 23.0, True)}}
    j, = judge(spec, runs)
    assert j.signs == (2, 0, 1) and j.p == 1.0 and j.call == "inconclusive"
    line, = headline(spec, runs)
    assert "A ≥ 12 in 1 of 3 seeds, censored" in line and "→ inconclusive" in line


def test_the_page_states_its_comparisons_and_applies_holm(tmp_path):
    """Four comparisons with a − b = [-10, -7, -13] (p = 0.029 each): every one passes
    alone, none after Holm (4 · 0.029 > 0.05)."""
    comps = tuple(Comparison("a", x, "rounds", "<") for x in "bcde")
    runs = _runs({"a": [40.0, 50.0, 60.0], **{x: [50.0, 57.0, 73.0] for x in "bcde"}})
    judged = judge(_spec(comps), runs)
    assert [j.uncorrected for j in judged] == ["reproduced"] * 4
    assert [j.call for j in judged] == ["inconclusive"] * 4
    assert all(j.p_holm == pytest.approx(min(1.0, 4 * j.p)) for j in judged)
    line = headline(_spec(comps), runs)[0]
    assert "Holm-adjusted" in line and "reproduced before the correction" in line


def test_primary_and_exploratory_families_are_corrected_separately():
    """The primary claim alone is its family (Holm p = p, reproduced); the three others form
    the exploratory family (Holm over 3), and each row names its family."""
    from fedforge.reproduce.verdicts import families

    comps = (Comparison("a", "b", "rounds", "<", primary=True),
             *(Comparison("a", x, "rounds", "<") for x in "cde"))
    spec = _spec(comps)
    assert families(spec) == {0: "primary", 1: "exploratory", 2: "exploratory",
                              3: "exploratory"}
    runs = _runs({"a": [40.0, 50.0, 60.0], **{x: [50.0, 57.0, 73.0] for x in "bcde"}})
    judged = judge(spec, runs)
    assert judged[0].call == "reproduced" and judged[0].p_holm == judged[0].p
    assert [j.family_size for j in judged] == [1, 3, 3, 3]
    assert all(j.p_holm == pytest.approx(min(1.0, 3 * j.p)) for j in judged[1:])
    assert [j.call for j in judged[1:]] == ["inconclusive"] * 3  # 3 · 0.029 > 0.05
    assert "[exploratory]" in headline(spec, runs)[1]
    # wrong variant: one family over all four would lose the primary call (4 · 0.029)
    assert judge(_spec(tuple(replace(c, primary=False) for c in comps)), runs)[0].call == \
        "inconclusive"


def test_every_registered_spec_names_primary_claims_and_their_smallest_effect():
    for name in NAMES:
        spec = get_reproduction(name)
        assert any(c.primary for c in spec.comparisons), name
        for c in spec.comparisons:
            assert spec.effect(c) > 0, (name, c)
        for metric, (_, why) in spec.effects.items():
            assert len(why) > 20, (name, metric)  # a sentence saying why
        assert spec.scale and spec.title, name


def test_the_page_says_how_many_comparisons_and_which_correction(tmp_path, monkeypatch):
    from fedforge.reproduce.report import correction_note

    comps = tuple(Comparison("a", x, "rounds", "<") for x in "bcde")
    assert correction_note(_spec(comps)).startswith(
        "4 comparisons, one family; Holm-corrected at family-wise 5 %")
    primary = (Comparison("a", "b", "rounds", "<", primary=True), *comps[1:])
    assert "1 primary" in correction_note(_spec(primary))
    assert "3 exploratory" in correction_note(_spec(primary))
    text = (DOCS / "reproductions" / "fadamgc.md").read_text(encoding="utf-8")
    assert "16 comparisons: 6 primary" in text
    assert "underpowered: needs" in text and "smallest effect that matters" in text
