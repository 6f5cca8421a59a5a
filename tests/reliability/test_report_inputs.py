"""Hostile or careless inputs to the commands that read run folders and write results: a
hand-edited ``table.json`` or ``partition.json``, a mathtext algorithm name, a malformed or
foreign divergence marker, an empty ``--out``. Each is one line naming the file or option,
never a traceback; and the one writer refuses links however it is reached."""

from __future__ import annotations

import html
import json
import os
import shutil
from pathlib import Path

import click
import pytest
import typer
from typer.testing import CliRunner

from fedforge import cli
from fedforge.experiment.rundir import (
    RunDirError,
    append_text,
    save_figure,
    subfolder,
    write_text,
)
from fedforge.reproduce import REPRODUCTIONS
from fedforge.reproduce.grid import condition_configs, run_grid
from tests.reliability.test_run_safety import _one_line_error
from tests.reproduce.test_reproduce import ROOT, tiny_spec


def _copy(run: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "run"
    shutil.copytree(run, dst)
    return dst


# --------------------------------------------------------------------------- report

@pytest.mark.parametrize("table", [
    [{"algorithm": "x", "seeds": "3", "final_acc": {"mean": [1], "n": 2, "ci_high": "a"}}],
    [{"final_acc": {"mean": 0.5, "n": 2, "ci_high": "a", "ci_low": 0.1}}],
    [{"final_acc": {"mean": 0.5, "n": "2"}, "seeds": 3}],
    [1, 2], {"algorithm": "x"}, "text", 5,
], ids=["list-mean", "text-interval", "text-n", "not-objects", "object", "string", "number"])
def test_report_refuses_a_hostile_table_json(quickstart_run, tmp_path, table):
    run = _copy(quickstart_run, tmp_path)
    (run / "table.json").write_text(json.dumps(table))
    _one_line_error(CliRunner().invoke(cli.app, ["report", str(run)]), "table.json")
    assert not (run / "report.html").exists()


@pytest.mark.parametrize("change", [
    {"sizes": ["a", None, {}]}, {"sizes": "30"}, {"sizes": [1.5, 2]}, {"sizes": [-1]},
    {"sizes": [True, False]}, {"num_clients": "thirty"},
    {"label_counts": [[1, 2], [3]]}, {"label_counts": [["a"]]}, None,
], ids=["mixed", "string", "floats", "negative", "bools", "num-clients", "ragged",
        "text-counts", "not-an-object"])
def test_report_refuses_partition_numbers_that_are_not_counts(quickstart_run, tmp_path, change):
    run = _copy(quickstart_run, tmp_path)
    part = json.loads((run / "partition.json").read_text())
    (run / "partition.json").write_text(json.dumps([1, 2] if change is None
                                                   else {**part, **change}))
    _one_line_error(CliRunner().invoke(cli.app, ["report", str(run)]), "partition.json")


@pytest.mark.parametrize("name", ["$\\frac{$", "$x$ and $", "$\\undefined{1}$", "a$b$c"])
def test_mathtext_algorithm_names_are_drawn_as_plain_text(quickstart_run, tmp_path, name):
    run = _copy(quickstart_run, tmp_path)
    cfg = run / "config.resolved.toml"
    cfg.write_text(cfg.read_text().replace('name = "fedavg"', f"name = {json.dumps(name)}"))
    result = CliRunner().invoke(cli.app, ["report", str(run)])
    assert result.exit_code == 0, result.output
    assert html.escape(name) in (run / "report.html").read_text()
    result = CliRunner().invoke(cli.app, ["plot", str(run), "-o", str(tmp_path / "p.png")])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "p.json").read_text())["curves"][0]["label"].startswith(name)


# ------------------------------------------------------------------------ reproduce

@pytest.fixture
def tiny_data(tmp_path, monkeypatch, quickstart_run) -> Path:
    """``tmp_path`` as the repository root: committed metrics for every tiny run."""
    monkeypatch.setitem(REPRODUCTIONS, "tiny", tiny_spec)
    monkeypatch.chdir(tmp_path)
    data = tmp_path / "docs" / "data" / "tiny"
    for cond in ("fast", "slow"):
        for seed in (0, 1):
            (data / cond).mkdir(parents=True, exist_ok=True)
            shutil.copyfile(quickstart_run / "metrics.jsonl", data / cond / f"seed{seed}.jsonl")
    return data


@pytest.mark.parametrize("marker", ["", "{", "[1]", '{"round": "2", "budget": 2}',
                                    '{"round": 0, "budget": 2}', '{"budget": 2}', "\xff"],
                         ids=["empty", "torn", "list", "text-round", "round-0", "no-round",
                              "not-utf8"])
def test_report_only_refuses_a_malformed_divergence_marker(tiny_data, marker):
    path = tiny_data / "fast" / "seed0.diverged.json"
    path.write_bytes(marker.encode("latin-1"))
    result = CliRunner().invoke(cli.app, ["reproduce", "tiny", "--report-only", "-q"])
    _one_line_error(result, "seed0.diverged.json")


def test_report_only_reads_a_valid_marker(tiny_data):
    (tiny_data / "fast" / "seed0.diverged.json").write_text('{"round": 2, "budget": 2}')
    result = CliRunner().invoke(cli.app, ["reproduce", "tiny", "--report-only", "-q"])
    assert result.exit_code == 0, result.output
    assert "0†2" in Path("reproductions/tiny/reproductions/tiny.md").read_text()


class _Ran(Exception):
    pass


def _grid_runs(monkeypatch, data: Path) -> list[str]:
    """The conditions the grid would run (its runner records and stops at the first)."""
    import fedforge.reproduce.grid as grid

    ran: list[str] = []

    def run(cfg, out, **kw):
        ran.append(f"{out.parent.name}/{out.name}")
        raise _Ran

    monkeypatch.setattr(grid, "run_experiment", run)
    try:
        run_grid(tiny_spec(), root=ROOT, runs=data.parent / "runs", data=data.parent,
                 progress=False, log=lambda _: None)
    except _Ran:
        pass
    return ran


def test_a_marker_that_merely_exists_does_not_mark_a_run_committed(tiny_data, monkeypatch):
    """Before, any file named ``seed<k>.diverged.json`` made the grid skip the run."""
    (tiny_data / "slow" / "seed0.jsonl").unlink()  # the grid's first run: not committed
    (tiny_data / "slow" / "seed0.diverged.json").touch()
    with pytest.raises(ValueError, match="seed0.diverged.json"):
        _grid_runs(monkeypatch, tiny_data)


def test_a_marker_of_another_budget_or_without_metrics_is_not_trusted(tiny_data, monkeypatch):
    rounds = condition_configs(tiny_spec(), tiny_spec().condition("slow"), ROOT)[0].rounds
    slow = tiny_data / "slow"
    (slow / "seed0.jsonl").unlink()
    (slow / "seed0.diverged.json").write_text(json.dumps({"round": 1, "budget": rounds}))
    assert _grid_runs(monkeypatch, tiny_data) == ["slow/seed0"]  # no metrics kept with it
    (slow / "seed0.jsonl").write_text("")
    (slow / "seed0.diverged.json").write_text(json.dumps({"round": 1, "budget": rounds + 5}))
    assert _grid_runs(monkeypatch, tiny_data) == ["slow/seed0"]  # another budget's run
    (slow / "seed0.diverged.json").write_text(json.dumps({"round": 1, "budget": rounds}))
    assert _grid_runs(monkeypatch, tiny_data) == []  # this very run diverged: committed


# ---------------------------------------------------------------------- empty --out

def _commands(group, prefix: str = "") -> dict[str, click.Command]:
    """Every command by its words (``run``, ``bench w1``), sub-commands included."""
    found = {}
    for name in group.list_commands(None):
        command = group.get_command(None, name)
        if isinstance(command, click.Group):
            found.update(_commands(command, f"{prefix}{name} "))
        else:
            found[f"{prefix}{name}"] = command
    return found


def _path_options() -> list[tuple[str, str, list[str]]]:
    """(command, option, the other arguments it needs) for every command with a path
    option that names where results go (``--out``, ``--runs``)."""
    found = []
    for name, command in _commands(typer.main.get_command(cli.app)).items():
        required = []
        for param in command.params:
            if param.required:
                required += ["x"] if param.param_type_name == "argument" else [
                    param.opts[0], "x"]
        for param in command.params:
            opt = next((o for o in param.opts if o in ("--out", "--runs")), None)
            if opt:
                found.append((name, opt, required))
    return found


def test_the_empty_out_check_covers_every_command_that_writes():
    names = {name.split()[0] for name, _, _ in _path_options()}
    assert {"run", "compare", "pretrain", "plot", "report", "bench", "reproduce"} <= names


@pytest.mark.parametrize("command,option,required", _path_options(),
                         ids=[f"{c} {o}" for c, o, _ in _path_options()])
def test_empty_out_is_one_line_error(tmp_path, monkeypatch, command, option, required):
    """``--out ''`` was the current folder: a run landed beside the user's files."""
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli.app, [*command.split(), *required, option, ""])
    _one_line_error(result, option, "empty")
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------- the one writer

def test_writer_refuses_hard_links_folder_links_and_dangling_links(tmp_path):
    folder, outside = tmp_path / "folder", tmp_path / "outside"
    folder.mkdir()
    outside.mkdir()
    (outside / "f").write_text("keep")
    os.link(outside / "f", folder / "hard.txt")
    os.symlink(outside, folder / "sub")
    os.symlink(outside / "new", folder / "dangling.txt")
    for name, problem in (("hard.txt", "hard links"), ("sub/x.txt", "leads outside"),
                          ("dangling.txt", "symbolic link")):
        for write in (write_text, append_text):
            with pytest.raises(RunDirError, match=problem):
                write(folder, name, "bad")
    with pytest.raises(RunDirError, match="leads outside"):
        subfolder(folder, "sub")
    assert (outside / "f").read_text() == "keep"
    assert sorted(p.name for p in outside.iterdir()) == ["f"]
    assert sorted(p.name for p in folder.iterdir()) == ["dangling.txt", "hard.txt", "sub"]


def test_writer_replaces_atomically_and_appends(tmp_path):
    path = write_text(tmp_path, "a/b.txt", "one")
    assert path == tmp_path / "a" / "b.txt" and path.read_text() == "one"
    write_text(tmp_path, "a/b.txt", "two")
    append_text(tmp_path, "a/b.txt", "+three")
    assert path.read_text() == "two+three"
    assert oct(path.stat().st_mode & 0o777) == oct(0o666 & ~_umask())
    assert sorted(p.name for p in path.parent.iterdir()) == ["b.txt"]  # no temporary left


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_bench_results_and_scaling_plot_refuse_links(tmp_path):
    """``fedforge bench`` writes its record and page to --results and --plot: through the
    writer."""
    from fedforge.bench import record_results, run_info
    from fedforge.bench.report import plot_scaling

    target = tmp_path / "outside.md"
    target.write_text("keep")
    os.symlink(target, tmp_path / "w1.json")
    os.symlink(target, tmp_path / "scaling.png")
    with pytest.raises(RunDirError, match="symbolic link"):
        record_results(tmp_path, "w1", None, "T", ["a"], [[1]], run_info())
    (tmp_path / "w1.json").unlink()
    os.symlink(target, tmp_path / "RESULTS.md")
    with pytest.raises(RunDirError, match="symbolic link"):
        record_results(tmp_path, "w1", None, "T", ["a"], [[1]], run_info())
    with pytest.raises(RunDirError, match="symbolic link"):
        plot_scaling([["loop", 2, 3.0]], tmp_path / "scaling.png", "t")
    assert target.read_text() == "keep"


def test_save_figure_writes_the_format_of_its_suffix(tmp_path):
    import matplotlib.pyplot as plt

    fig, _ = plt.subplots()
    save_figure(tmp_path, "f.png", fig)
    save_figure(tmp_path, "f.pdf", fig)
    plt.close(fig)
    assert (tmp_path / "f.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "f.pdf").read_bytes()[:4] == b"%PDF"
