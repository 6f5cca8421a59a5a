"""Small promises of the command line: a benchmark run outside the checkout writes its
record and page in its own folder, never to ``benchmarks/`` of the folder it happens to
run in (the measuring itself is stubbed here: each run takes well under a
second)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

import fedforge
from fedforge.bench import pfl_speed, throughput
from fedforge.bench import population as pop
from fedforge.cli import app

REPO = Path(__file__).resolve().parents[2]
THEIRS = "# the results of someone else's project\n"


def _stub_workloads(monkeypatch) -> None:
    """Each workload returns one row at once, in the shape its table takes."""
    monkeypatch.setattr(throughput, "run_w1", lambda *a, **k: [[2, "loop", 1.0, 2.0, 3.0]])
    monkeypatch.setattr(pfl_speed, "run_pfl_ditto", lambda out, *a, **k: (
        [[2, "fedforge", "loop", 0.5, 4.0, 60, 0.1, 0.1, 1.0, 1.0, "yes (0.0e+00)"]], "note"))
    monkeypatch.setattr(pop, "run_population", lambda work, out: [
        [100, "scaffold", "disk", 400.0, 20.5, 1.2, 0.1, ""]])
    monkeypatch.setattr(pop, "plot_population", lambda rows, out: out / "population.png")


@pytest.mark.parametrize(("workload", "options", "row"), [
    ("w1", [], "| 2 | loop |"), ("pfl-ditto", ["--quick"], "| 2 | fedforge |"),
    ("population", ["--quick"], "| 100 | scaffold |")])
def test_a_bench_outside_the_checkout_writes_to_its_own_folder(tmp_path, monkeypatch,
                                                                 workload, options, row):
    _stub_workloads(monkeypatch)
    monkeypatch.chdir(tmp_path)
    theirs = tmp_path / "benchmarks" / "RESULTS.md"
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    theirs.write_text(THEIRS)
    result = CliRunner().invoke(app, ["bench", workload, *options])
    assert result.exit_code == 0, result.output
    assert theirs.read_text() == THEIRS
    assert not any((tmp_path / "benchmarks" / "results").iterdir())
    folder = tmp_path / "runs" / f"bench_{workload.replace('-', '_')}" / "results"
    assert row in (folder / "RESULTS.md").read_text()
    assert len(list(folder.glob("*.json"))) == 1


def test_a_bench_writes_where_results_says(tmp_path, monkeypatch):
    _stub_workloads(monkeypatch)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["bench", "population", "--quick", "--out", "mine",
                                      "--results", "notes/speed"])
    assert result.exit_code == 0, result.output
    assert "| 100 | scaffold |" in (tmp_path / "notes" / "speed" / "RESULTS.md").read_text()
    assert (tmp_path / "notes" / "speed" / "population-quick.json").is_file()
    assert (tmp_path / "mine" / "population.md").is_file()
    assert not (tmp_path / "mine" / "results").exists()


def test_from_the_checkout_the_default_is_its_benchmarks_folder(tmp_path, monkeypatch):
    if Path(fedforge.__file__).resolve().parents[2] != REPO:
        pytest.skip("fedforge is not installed from this checkout")
    from fedforge.bench.report import default_results
    from fedforge.bench.results import page_path

    monkeypatch.chdir(REPO)
    assert default_results(Path("runs/bench_w1")) == Path("benchmarks/results")
    assert page_path(Path("benchmarks/results")) == Path("benchmarks/RESULTS.md")
    monkeypatch.chdir(REPO / "docs")  # not the checkout's root: its own folder
    assert default_results(Path("runs/bench_w1")) == Path("runs/bench_w1/results")
    assert page_path(Path("benchmarks/results")) == Path("benchmarks/results/RESULTS.md")
