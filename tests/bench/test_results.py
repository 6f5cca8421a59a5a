"""Result records and the page made from them: the committed page is the generated one, a
new measurement replaces its table, and each table says where it was measured."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fedforge.bench import results as res
from fedforge.cli import app

REPO = Path(__file__).resolve().parents[2]
MACHINE = {"arch": "x86_64", "model": "AMD EPYC", "physical_cores": 2, "logical_cores": 4,
           "features": {"amx_bf16": False, "amx_tile": None, "avx512_bf16": True,
                        "avx2": True}, "device": "cpu", "threads": 4}


def test_the_committed_page_is_generated_from_the_committed_records():
    records = res.load_records(REPO / "benchmarks" / "results")
    assert (REPO / "benchmarks" / "RESULTS.md").read_text(encoding="utf-8") == \
        res.render(records), "run `fedforge bench results` from the checkout's root"


@pytest.fixture
def here(monkeypatch):
    """This machine and its load made fixed: (1, 2, 3) before, (0.5, 0.25, 0.75) after."""
    monkeypatch.setattr(res, "machine", lambda device="cpu": dict(MACHINE))
    monkeypatch.setattr(os, "getloadavg", lambda: (0.5, 0.25, 0.75))
    return res.run_info("cpu", (1.0, 2.0, 3.0), "fedforge bench w1 --model cnn",
                        {"pfl": "0.6.0"})


def test_a_new_measurement_replaces_its_table_and_says_where_it_ran(tmp_path, here):
    res.record_results(tmp_path, "w1", "cnn", "W1 (cnn)", ["engine", "updates/s"],
                       [["loop", 5.691], ["plain", 12.34]], here, ["a note"])
    res.record_results(tmp_path, "w1", "cnn", "W1 (cnn)", ["engine", "updates/s"],
                       [["loop", 7.5]], here)
    res.record_results(tmp_path, "async-cost", None, "Async", ["n"], [[10]], here)
    res.record_results(tmp_path, "zeta", None, "Zeta", ["n"], [[1]], here)
    record = json.loads((tmp_path / "w1-cnn.json").read_text())
    assert record["rows"] == [["loop", 7.5]] and record["notes"] == []
    run = record["runs"][0]
    assert run["load"]["before"] == [1.0, 2.0, 3.0] and run["load"]["after"] == [0.5, 0.25, 0.75]
    assert run["versions"]["pfl"] == "0.6.0" and "torch" in run["versions"]
    page = (tmp_path / "RESULTS.md").read_text()
    assert page.count("### W1 (cnn)") == 1 and "| loop | 7.50 |" in page and "5.69" not in page
    # the sections in their order (not the alphabet's), a workload without one last
    assert page.index("## W1 throughput") < page.index("## Asynchronous engine cost") < \
        page.index("## zeta")
    assert "- CPU features: AMX-BF16 no, AMX-TILE unknown, AVX-512-BF16 yes, AVX2 yes" in page
    assert "- load average (1, 5, 15 min): before 1.00/2.00/3.00, after 0.50/0.25/0.75" in page
    assert "x86_64 CPU (AMD EPYC), 4 logical cores (2 physical), 4 torch threads" in page
    assert "- command: `fedforge bench w1 --model cnn`" in page


def test_rows_from_several_runs_name_their_run(tmp_path, here):
    old = {**here, "date": "2026-11-23", "load": {"before": None, "after": None,
                                                   "note": "quiet (≈ 1)"}}
    record = {"workload": "w1", "variant": "mlp", "title": "W1 (mlp)", "notes": [],
              "columns": ["engine", "measured"], "rows": [["loop", "[1]"], ["auto", "[2]"]],
              "runs": [old, here]}
    text = res.render_record(record)
    assert "- CPU features" not in text  # no single run to put beside the table
    first, second = text.split("names each row's run):")[1].strip().splitlines()
    assert first.startswith("1. 2026-11-23 · ") and "load average (1, 5, 15 min): quiet (≈ 1)" \
        in first
    assert second.startswith(f"2. {here['date']} · ") and "before 1.00/2.00/3.00" in second


def test_the_page_command_regenerates_and_refuses_a_foreign_file(tmp_path, here):
    res.record_results(tmp_path, "w1", "cnn", "W1 (cnn)", ["a"], [[1]], here)
    res.record_results(tmp_path, "w1", "mlp", "W1 (mlp)", ["a"], [[2]], here)
    (tmp_path / "w1-mlp.json").unlink()
    out = CliRunner().invoke(app, ["bench", "results", "--results", str(tmp_path)])
    assert out.exit_code == 0, out.output
    assert "W1 (mlp)" not in (tmp_path / "RESULTS.md").read_text()
    (tmp_path / "notes.json").write_text('{"workload": "w1"}')
    out = CliRunner().invoke(app, ["bench", "results", "--results", str(tmp_path)])
    assert out.exit_code == 2 and len(out.output.strip().splitlines()) == 1, out.output
    assert "notes.json: not a result record (no 'title')" in out.output
    with pytest.raises(ValueError, match="'W1 text-cnn'"):
        res.record_name("W1 text", "cnn")


def test_a_keyed_table_keeps_the_rows_a_new_run_did_not_measure(tmp_path, here):
    cols = ["engine", "cohort", "updates/s"]
    first, second = ({**here, "date": d} for d in ("2026-11-01", "2026-11-02"))
    (tmp_path / "w1-cnn.json").write_text(json.dumps({
        "workload": "w1", "variant": "cnn", "title": "W1 (cnn)", "notes": ["old note"],
        "columns": cols + ["measured"], "runs": [first, second],
        "rows": [["loop", 10, 1.0, "[1]"], ["plain", 10, 2.0, "[2]"],
                 ["vmap", 100, 3.0, "[2]"]]}))
    res.record_results(tmp_path, "w1", "cnn", "W1 (cnn)", cols,
                       [["plain", 10, 4.0], ["auto", 1000, 5.0]], here, key=(1, 0))
    record = json.loads((tmp_path / "w1-cnn.json").read_text())
    # plain at 10 re-measured (run 3); loop from run 1 and vmap from run 2 stay; by cohort
    assert record["rows"] == [["loop", 10, 1.0, "[1]"], ["plain", 10, 4.0, "[3]"],
                              ["vmap", 100, 3.0, "[2]"], ["auto", 1000, 5.0, "[3]"]]
    assert [r["date"] for r in record["runs"]] == ["2026-11-01", "2026-11-02", here["date"]]
    assert record["notes"] == ["old note"]
    # a run that re-measures every row of run 1 drops it and numbers the rest again
    res.record_results(tmp_path, "w1", "cnn", "W1 (cnn)", cols, [["loop", 10, 6.0]], here,
                       key=(1, 0))
    record = json.loads((tmp_path / "w1-cnn.json").read_text())
    assert [r["date"] for r in record["runs"]] == ["2026-11-02", here["date"], here["date"]]
    assert record["rows"][0] == ["loop", 10, 6.0, "[3]"] and record["rows"][2][-1] == "[1]"
    # other columns: the old table is replaced whole
    res.record_results(tmp_path, "w1", "cnn", "W1 (cnn)", ["engine", "cohort"],
                       [["loop", 10]], here, key=(1, 0))
    assert json.loads((tmp_path / "w1-cnn.json").read_text())["rows"] == [["loop", 10]]


@pytest.mark.parametrize("argv0, expected", [
    ("/venv/bin/fedforge", "fedforge bench lora"),
    ("/site-packages/fedforge/__main__.py", "fedforge bench lora"),
    ("/repo/benchmarks/pfl_run.py", "python pfl_run.py bench lora"),
])
def test_a_table_records_the_command_a_user_types(monkeypatch, argv0, expected):
    from fedforge.bench.report import command_line
    monkeypatch.setattr("sys.argv", [argv0, "bench", "lora"])
    assert command_line() == expected
