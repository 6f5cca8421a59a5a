"""Sweeps own their folder: planted links to ``trials/`` or ``best/``, configs edited between
a sweep and its ``--resume``, a final run of another setting, a corrupt, hostile or emptied
``study.db``, a space key that is a path, and mathtext names in ``sweep.png``."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fedforge import cli

pytestmark = pytest.mark.skipif(importlib.util.find_spec("optuna") is None,
                                reason="optuna is not installed (pip install 'fedforge[sweep]')")
QUICK = str(Path("examples/quickstart.toml").resolve())
TINY = ["rounds=1", "eval.every=1", "client.local_steps=1", "client.local_epochs=null",
        "checkpoint.every=1", "engine.name=loop"]
SPACE = "algorithm.local_lr = [0.01, 0.3]\n"


def _sweep(space: Path, out: Path, *extra: str):
    return CliRunner().invoke(cli.app, ["sweep", QUICK, *TINY, "--space", str(space),
                                        "--sampler", "grid", "--jobs", "1", "--out", str(out),
                                        *extra])


def _one_line_error(result, *needles: str) -> str:
    assert result.exit_code == 2, (result.output, result.exception)
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def half_sweep(tmp_path_factory) -> Path:
    """A grid of two with one trial run (``--trials 1``) and its final run in ``best/``: a
    ``--resume`` (the whole grid) has one trial left to run. Copy it before changing it."""
    base = tmp_path_factory.mktemp("sweep")
    (base / "space.toml").write_text(SPACE)
    out = base / "out"
    result = _sweep(base / "space.toml", out, "--trials", "1")
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture
def sweep(half_sweep, tmp_path) -> Path:
    out = tmp_path / "out"
    shutil.copytree(half_sweep, out, symlinks=True)
    (tmp_path / "space.toml").write_text(SPACE)
    return out


def _resume(out: Path, *extra: str):
    return _sweep(out.parent / "space.toml", out, "--resume", *extra)


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name not in ("run.lock", "sweep.lock")}


# ------------------------------------------------------------------ S2: planted folder links

@pytest.mark.parametrize("name", ["trials", "best"])
def test_a_planted_trials_or_best_link_is_refused_and_nothing_is_written_outside(
        sweep, tmp_path, name):
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.rmtree(sweep / name)
    (sweep / name).symlink_to(outside, target_is_directory=True)
    _one_line_error(_resume(sweep), str(sweep / name), "outside")
    assert list(outside.iterdir()) == []


def test_a_planted_link_for_one_trial_fails_that_trial_only(sweep, tmp_path):
    from fedforge.study.sweep import TrialTask, run_trial

    outside = tmp_path / "outside"
    outside.mkdir()
    (sweep / "trials" / "1").symlink_to(outside, target_is_directory=True)
    task = TrialTask(1, 2, {"algorithm.local_lr": 0.3}, sweep, "val_accuracy", resume=True,
                     allow_plugins=False, prune=False)
    result = run_trial(task)
    assert result["state"] == "fail" and "leads outside" in result["error"], result
    assert list(outside.iterdir()) == []


# ------------------------------------------------------- S6, S7: configs edited before --resume

def test_a_plugin_added_to_validation_yaml_is_refused_on_resume(sweep, tmp_path, monkeypatch):
    marker = tmp_path / "imported"
    monkeypatch.syspath_prepend(str(tmp_path))  # importable, by the workers too
    (tmp_path / "planted_plugin.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('x')\n")
    path = sweep / "validation.yaml"
    path.write_text(path.read_text().replace("plugins:\n", "plugins:\n- planted_plugin\n"))
    assert "planted_plugin" in path.read_text()
    _one_line_error(_resume(sweep, "--allow-config-plugins"), str(path))
    assert not marker.exists()


@pytest.mark.parametrize("name", ["config.yaml", "validation.yaml"])
def test_an_edited_config_is_refused_on_resume(sweep, name):
    path = sweep / name
    text = path.read_text()
    assert "rounds: 1" in text
    path.write_text(text.replace("rounds: 1", "rounds: 3"))
    before = _files(sweep)
    _one_line_error(_resume(sweep), str(path))
    assert _files(sweep) == before  # no trial ran, best/ and the table are as they were


def test_best_is_never_replaced_by_another_setting(sweep):
    """An extended sweep that chooses another setting stops with one line; ``best/`` keeps
    its run (and its test score). The same setting resumes it, and runs nothing again."""
    from fedforge.study.sweep import SweepError, SweepSettings, run_final

    chosen = json.loads((sweep / "table.json").read_text())["best"]
    settings = SweepSettings(Path(QUICK), sweep, TINY, sweep.parent / "space.toml",
                             "grid", resume=True)
    metrics = (sweep / "best" / "metrics.jsonl").read_bytes()
    run_final(settings, chosen, log=lambda line: None)
    assert (sweep / "best" / "metrics.jsonl").read_bytes() == metrics
    before = _files(sweep / "best")
    other = {**chosen, "trial": 1,
             "algorithm.local_lr": 0.3 if chosen["algorithm.local_lr"] == 0.01 else 0.01}
    with pytest.raises(SweepError, match="best: holds the final run of another setting"):
        run_final(settings, other, log=lambda line: None)
    assert _files(sweep / "best") == before


# ------------------------------------------------------------------ study.db

def _text_trial_number(path: Path) -> None:
    with sqlite3.connect(path) as db:
        db.execute("UPDATE trials SET number = 'abc'")


@pytest.mark.parametrize("spoil", [
    lambda p: p.write_bytes(bytes(range(256)) * 64),
    _text_trial_number,
], ids=["random-bytes", "text-trial-number"])
def test_a_corrupt_or_hostile_study_is_one_line_naming_it(sweep, spoil):
    spoil(sweep / "study.db")
    _one_line_error(_resume(sweep), str(sweep / "study.db"))


def test_an_emptied_study_never_overwrites_the_finished_table(sweep):
    (sweep / "study.db").write_bytes(b"")
    table = (sweep / "table.csv").read_bytes()
    _one_line_error(_resume(sweep), str(sweep / "study.db"), "emptied")
    assert (sweep / "table.csv").read_bytes() == table
    assert not (sweep / "trials" / "1").exists()


# ------------------------------------------------------------------ the space and the figure

def test_a_space_key_that_is_a_path_is_an_unknown_config_key(tmp_path):
    space = tmp_path / "space.toml"
    space.write_text('"../../x" = [1, 2]\n')
    _one_line_error(_sweep(space, tmp_path / "out"), "unknown config key", "'../../x'")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", ["$\\alpha$", "a_b^c", "$\\frac{$", "$\\undefined{1}$"])
def test_mathtext_names_are_drawn_as_plain_text_in_sweep_png(tmp_path, name):
    from fedforge.study.sweep import Param, plot_sweep

    params = [Param("model.name", "choice", (name, "mlp"))]
    rows = [{"trial": i, "state": "complete", "model.name": v, name: 0.5 + i / 10}
            for i, v in enumerate((name, "mlp"))]
    path = plot_sweep(tmp_path, rows, params, name, rows[0])
    assert path.read_bytes().startswith(b"\x89PNG")
