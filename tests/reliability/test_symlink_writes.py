"""Every command that writes files refuses to write through a link planted under any name it
writes (a symbolic link to a file outside its folder, or a dangling one).

The names come from the command itself: each command is run once into a fresh folder, the
files it created or changed are listed, and then, one at a time, each of those names is
planted as a link in a fresh copy of the setup. The command must fail with one line
(``error: ...``, exit code 2) and the file outside must keep its bytes. A file a command
starts writing later is therefore covered without changing this test.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from fedforge import cli
from tests.reliability.conftest import QUICK, SHORT

OUTSIDE = b"outside the folder: must keep these bytes\n"
REPO = Path(__file__).resolve().parents[2]  # its committed raw metrics are read, never written


@dataclass
class Command:
    """``setup(work) -> (argv, folder)``: prepares its inputs below ``work`` and names the
    folder whose written files are listed (every file below it that the run creates or
    changes); ``chdir``: run from ``work`` (reproduce writes below the current folder)."""

    name: str
    setup: Callable[[Path], tuple[list[str], Path]]
    chdir: bool = False


def _copy_run(base: Path, work: Path) -> Path:
    dst = work / "run"
    shutil.copytree(base, dst, symlinks=True)
    return dst


def _commands(base: Path) -> list[Command]:
    def report(work):
        run = _copy_run(base, work)
        return ["report", str(run)], run

    def plot(work):
        run = _copy_run(base, work)
        return ["plot", str(run), "--out", str(work / "fig" / "plot.png")], work / "fig"

    return [
        Command("run", lambda w: (["run", QUICK, *SHORT, "-q", "--out", str(w / "out")],
                                  w / "out")),
        Command("compare", lambda w: (["compare", QUICK, "-a", "fedavg", *SHORT, "-q",
                                       "--out", str(w / "out")], w / "out")),
        Command("pretrain", lambda w: (["pretrain", QUICK, "--max-steps", "1",
                                        "--out", str(w / "out")], w / "out")),
        Command("report", report),
        Command("plot", plot),
        Command("reproduce --report-only",
                lambda w: (["reproduce", "fedptr", "--report-only", "-q",
                            "--data", str(REPO / "docs" / "data")],
                           w / "reproductions" / "fedptr"),
                chdir=True),
    ]


COMMANDS = ["run", "compare", "pretrain", "report", "plot", "reproduce --report-only"]
# commands that print and write nothing, and writers tested elsewhere: bench (minutes per
# row) appends --results and writes --plot through the same writer
# (test_report_inputs.py::test_bench_results_and_scaling_plot_refuse_links); sweep's tables
# and figure use it too (its trials are run folders), and its study database is checked in
# test_sweep_study_refuses_a_planted_link
PRINT_ONLY = {"algorithms", "config", "datasets", "models"}
ELSEWHERE = {"bench", "sweep"}


def test_every_command_is_covered_or_classified():
    """A new command must join COMMANDS (it writes files) or say why not."""
    registered = set(typer.main.get_command(cli.app).commands)
    covered = {c.split()[0] for c in COMMANDS}
    assert registered - covered - PRINT_ONLY - ELSEWHERE == set()


def _snapshot(folder: Path) -> dict[str, tuple]:
    if not folder.exists():
        return {}
    out = {}
    for path in folder.rglob("*"):
        st = path.lstat()
        if not path.is_dir():
            out[path.relative_to(folder).as_posix()] = (st.st_ino, st.st_size, st.st_mtime_ns)
    return out


def _invoke(cmd: Command, work: Path, monkeypatch) -> tuple[list[str], Path]:
    work.mkdir(parents=True, exist_ok=True)
    argv, folder = cmd.setup(work)
    if cmd.chdir:
        monkeypatch.chdir(work)
    return argv, folder


def _written(cmd: Command, work: Path, monkeypatch) -> list[str]:
    """The files the command writes below its folder on a clean run."""
    argv, folder = _invoke(cmd, work, monkeypatch)
    before = _snapshot(folder)
    result = CliRunner().invoke(cli.app, argv)
    assert result.exit_code == 0, (cmd.name, result.output, result.exception)
    after = _snapshot(folder)
    return sorted(k for k, v in after.items() if before.get(k) != v)


def _plant(folder: Path, rel: str, target: Path) -> Path:
    planted = folder / rel
    if planted.exists() or planted.is_symlink():
        planted.unlink()  # an input the command rewrites (e.g. a report's own page)
    planted.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(target, planted)
    return planted


def _refused(result, where: str) -> None:
    assert result.exit_code == 2, (where, result.output, result.exception)
    assert "Traceback" not in result.output, where
    line = result.output.split("error:", 1)[1].strip()
    assert "\n" not in line, (where, line)


@pytest.mark.parametrize("name", COMMANDS)
def test_no_command_writes_through_a_planted_link(quickstart_run, tmp_path, monkeypatch, name):
    """One link to an outside file per written name, one run each; then every name at once
    as a dangling link (writing through one would create its target)."""
    cmd = next(c for c in _commands(quickstart_run) if c.name == name)
    written = _written(cmd, tmp_path / "clean", monkeypatch)
    assert written, f"{name}: wrote no file on a clean run"
    outside = tmp_path / "outside"
    outside.mkdir()
    for i, rel in enumerate(written):
        argv, folder = _invoke(cmd, tmp_path / f"plant{i}", monkeypatch)
        target = outside / str(i)
        target.write_bytes(OUTSIDE)
        planted = _plant(folder, rel, target)
        _refused(CliRunner().invoke(cli.app, argv), f"{name}: link planted at {rel}")
        assert target.read_bytes() == OUTSIDE, f"{name}: wrote through {rel}"
        assert planted.is_symlink(), rel  # the link itself is left as it was
    argv, folder = _invoke(cmd, tmp_path / "dangling", monkeypatch)
    targets = [outside / f"dangling{i}" for i in range(len(written))]
    for rel, target in zip(written, targets):
        _plant(folder, rel, target)
    _refused(CliRunner().invoke(cli.app, argv), f"{name}: dangling links")
    assert not any(t.exists() for t in targets), f"{name}: wrote through a dangling link"


@pytest.mark.parametrize("name", ["study.db", "study.db-journal"])
def test_sweep_study_refuses_a_planted_link(tmp_path, name):
    """The sweep's SQLite study is opened by path by SQLite itself: it and its side files
    are checked first, like every file a run writes."""
    pytest.importorskip("optuna", reason="fedforge sweep needs the sweep extra")
    from fedforge.experiment.rundir import RunDirError
    from fedforge.study.sweep import storage

    outside = tmp_path / "outside.db"
    outside.write_bytes(b"keep")
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / name).symlink_to(outside)
    with pytest.raises(RunDirError, match=name):
        storage(sweep)
    assert outside.read_bytes() == b"keep"
