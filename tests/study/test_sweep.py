"""fedforge sweep: the space format, the validation split trials are scored on, a parallel
grid over two keys of two algorithms whose trials are run folders, and a sweep killed with
kill -9 that resumes without re-running its finished trials."""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from fedforge.cli import app
from fedforge.study.sweep import (
    SweepError,
    make_sampler,
    overrides,
    parse_space,
    validation_key,
    validation_mask,
)

pytestmark = pytest.mark.skipif(importlib.util.find_spec("optuna") is None,
                                reason="optuna is not installed (pip install 'fedforge[sweep]')")
REPO = Path(__file__).resolve().parents[2]
QUICK = REPO / "examples" / "quickstart.toml"
TINY = ["rounds=2", "eval.every=1", "client.local_steps=1", "client.local_epochs=null",
        "checkpoint.every=1", "engine.name=loop"]
SPACE = 'algorithm.name = ["fedavg", "fedprox"]\nalgorithm.local_lr = [0.01, 0.3]\n'


def test_space_lists_are_choices_and_tables_ranges():
    params = parse_space({"algorithm": {"local_lr": {"log_uniform": [1e-3, 1]},
                                        "name": ["fedavg", "fedprox"]},
                          "client": {"local_steps": {"int": [1, 5]}}})
    assert [(p.key, p.kind) for p in params] == [
        ("algorithm.local_lr", "log_uniform"), ("algorithm.name", "choice"),
        ("client.local_steps", "int")]
    assert params[1].choices == ("fedavg", "fedprox")
    assert overrides({"algorithm.name": "fedprox", "algorithm.local_lr": 0.1}) == [
        'algorithm.name="fedprox"', "algorithm.local_lr=0.1"]


@pytest.mark.parametrize(("table", "message"), [
    ({"algorithm": {"local_lr": {"log_uniform": [0, 1]}}}, "sweep.algorithm.local_lr.log_uniform"),
    ({"algorithm": {"local_lr": {"uniform": [0, 1], "step": 2}}}, "one of {uniform"),
    ({"seed": []}, "sweep.seed: an empty list"),
    ({"seed": 3}, "sweep.seed: expected a list"),
    ({"client": {"local_steps": {"int": [1.5, 3]}}}, "integer bounds"),
])
def test_a_bad_space_is_one_line_naming_the_key(table, message):
    with pytest.raises(SweepError, match=message) as err:
        parse_space(table)
    assert "\n" not in str(err.value)


def test_grid_needs_lists():
    with pytest.raises(SweepError, match="sweep.algorithm.local_lr: --sampler grid"):
        make_sampler("grid", parse_space({"algorithm": {"local_lr": {"uniform": [0, 1]}}}), 0)


def test_validation_is_held_out_of_each_clients_training_samples():
    groups = np.repeat([0, 1, 2], [10, 40, 1])
    mask = validation_mask(len(groups), groups, 0.2, seed=0)
    assert [int(mask[groups == g].sum()) for g in (0, 1, 2)] == [2, 8, 0]  # one sample: kept
    assert np.array_equal(mask, validation_mask(len(groups), groups, 0.2, seed=0))
    assert validation_mask(100, None, 0.25, seed=1).sum() == 25
    assert validation_key("data.options.alpha") == "data.options.options.alpha"
    assert validation_key("algorithm.local_lr") == "algorithm.local_lr"


def _rows(out: Path) -> list[dict]:
    with (out / "table.csv").open() as f:
        return list(csv.DictReader(f))


@pytest.mark.slow  # ~20 s: spawned workers import torch
def test_parallel_grid_over_two_keys_of_two_algorithms(tmp_path):
    space = tmp_path / "space.toml"
    space.write_text(SPACE)
    out = tmp_path / "sweep"
    result = CliRunner().invoke(app, ["sweep", str(QUICK), *TINY, "--space", str(space),
                                      "--sampler", "grid", "--jobs", "2", "--out", str(out)])
    assert result.exit_code == 0, result.output
    rows = _rows(out)
    assert sorted((r["algorithm.name"], float(r["algorithm.local_lr"])) for r in rows) == [
        ("fedavg", 0.01), ("fedavg", 0.3), ("fedprox", 0.01), ("fedprox", 0.3)]
    assert {r["state"] for r in rows} == {"complete"}
    for row in rows:  # every trial is a normal run folder, scored on the validation split
        folder = out / row["folder"]
        resolved = (folder / "config.resolved.toml").read_text()
        assert 'dataset = "sweep_validation"' in resolved
        assert f'name = "{row["algorithm.name"]}"' in resolved
        records = [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines()]
        assert float(row["val_accuracy"]) == pytest.approx(records[-1]["test_accuracy"])
    table = json.loads((out / "table.json").read_text())
    best = max(rows, key=lambda r: float(r["val_accuracy"]))
    assert table["best"]["trial"] == int(best["trial"])
    assert table["selected_on"] == "the validation split (held out of the training data)"
    final = (out / "best" / "config.resolved.toml").read_text()  # the test split, once
    assert 'dataset = "synthetic"' in final and "sweep_validation" not in final
    assert table["test"]["test_accuracy"] > 0
    assert (out / "sweep.png").stat().st_size > 0
    assert "test score of the chosen setting, on the selection metric: test_accuracy" in \
        result.output
    assert table["final_score"]["metric"] == "test_accuracy"
    again = CliRunner().invoke(app, ["sweep", str(QUICK), *TINY, "--space", str(space),
                                     "--sampler", "grid", "--out", str(out)])
    assert again.exit_code == 2 and "--resume" in again.output


def test_a_bad_key_fails_before_any_trial(tmp_path):
    space = tmp_path / "space.toml"
    space.write_text("algorithm.lcoal_lr = [0.1, 0.2]\n")
    result = CliRunner().invoke(app, ["sweep", str(QUICK), *TINY, "--space", str(space),
                                      "--out", str(tmp_path / "s")])
    assert result.exit_code == 2 and "lcoal_lr" in result.output
    assert not (tmp_path / "s" / "trials").exists()


def _sweep_cmd(space: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "fedforge", "sweep", str(QUICK), "rounds=30", "eval.every=10",
            "client.local_steps=5", "client.local_epochs=null", "checkpoint.every=5",
            "--space", str(space), "--sampler", "grid", "--jobs", "1", "--no-final",
            "--out", str(out), *extra]


@pytest.mark.slow
def test_kill_9_mid_sweep_resumes_without_rerunning_finished_trials(tmp_path):
    space = tmp_path / "space.toml"
    space.write_text(SPACE)
    out = tmp_path / "sweep"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(_sweep_cmd(space, out), env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    while not (out / "trials" / "1").is_dir():  # trial 0 told, trial 1 started: kill
        assert proc.poll() is None and time.time() < deadline, "the sweep ended early"
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    first = out / "trials" / "0"
    stamps = {p: p.stat().st_mtime_ns for p in first.rglob("*") if p.is_file()
              and p.name != "run.lock"}
    done = subprocess.run(_sweep_cmd(space, out, "--resume"), env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 done, 1 to resume" in done.stdout
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps  # trial 0 was not re-run
    assert len((first / "config.history.jsonl").read_text().splitlines()) == 1
    rows = _rows(out)
    assert sorted(int(r["trial"]) for r in rows) == [0, 1, 2, 3]  # no trial twice
    assert {r["state"] for r in rows} == {"complete"}
    history = (out / "trials" / "1" / "config.history.jsonl").read_text().splitlines()
    assert [json.loads(h)["mode"] for h in history][-1] in ("resume", "fresh")


def test_sweep_trials_take_the_worker_pool_compare_takes(tmp_path, monkeypatch):
    """``fedforge sweep`` lets ``auto`` use the procs engine's workers, as ``fedforge compare``
    does; run_experiment's own default (no processes) stays for Python callers."""
    from types import SimpleNamespace

    from fedforge.experiment import runner
    from fedforge.study import sweep

    asked = []
    monkeypatch.setattr(sweep, "run_sweep", lambda s, log: asked.append(s)
                        or SimpleNamespace(best=None))
    result = CliRunner().invoke(app, ["sweep", str(QUICK), "--out", str(tmp_path / "s")])
    assert result.exit_code == 0, result.output
    assert asked[0].allow_processes and not sweep.SweepSettings(QUICK, tmp_path).allow_processes
    runs = []
    monkeypatch.setattr(runner, "run_experiment",
                        lambda cfg, out, **kw: runs.append(kw["allow_processes"]) or [])
    for allow in (True, False):
        task = sweep.TrialTask(0, 0, {}, tmp_path, "test_accuracy", False, False, False, allow)
        sweep._run(None, tmp_path / "trial", task)
    assert runs == [True, False]
