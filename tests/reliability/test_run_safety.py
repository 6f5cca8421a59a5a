"""Run folders: a run reads and writes only inside its own ``--out``, never replaces an earlier
run by accident, never shares its folder with a second run, and resumes only the run that was
started. Driven through the real runner and CLI on the embedded quickstart config."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from fedforge import cli
from fedforge.experiment.config import load_config
from fedforge.experiment.rundir import (
    HISTORY_NAME,
    LOCK_NAME,
    RunDirError,
    claim_run_dir,
    config_differences,
    read_config_history,
)
from fedforge.experiment.runner import read_metrics, run_experiment

QUICK = "examples/quickstart.toml"
SHORT = ["rounds=2", "checkpoint.every=1", "eval.every=1", "eval.per_client=false"]


def _cfg(*extra: str):
    return load_config(QUICK, [*SHORT, *extra])


def _cli(*args: str):
    return CliRunner().invoke(cli.app, ["run", QUICK, *SHORT, "-q", *args])


def _one_line_error(result, *needles: str) -> str:
    assert result.exit_code == 2, (result.output, result.exception)
    assert "Traceback" not in result.output
    line = result.output.split("error:", 1)[1].strip()
    assert "\n" not in line, line
    for needle in needles:
        assert needle in line, line
    return line


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """Two rounds of the quickstart with a checkpoint after each (keep 2)."""
    out = tmp_path_factory.mktemp("base") / "run"
    run_experiment(_cfg(), out, progress=False)
    return out


def _copy(run: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "run"
    shutil.copytree(run, dst, symlinks=True)
    (dst / LOCK_NAME).unlink(missing_ok=True)
    return dst


# ---------------------------------------------------------- hostile checkpoint metadata (1)

def _plant_latest(ck: Path, target: Path) -> None:
    (ck / "latest.json").write_text(json.dumps({"checkpoint": str(target)}))


def _plant_latest_dotdot(ck: Path, target: Path) -> None:
    (ck / "latest.json").write_text(json.dumps({"checkpoint": f"../../{target.name}"}))


def _plant_tensors(ck: Path, target: Path) -> None:
    meta = json.loads((ck / "round_00002.json").read_text())
    (ck / "round_00002.json").write_text(json.dumps({**meta, "tensors": str(target)}))


def _plant_tensors_dotdot(ck: Path, target: Path) -> None:
    meta = json.loads((ck / "round_00002.json").read_text())
    (ck / "round_00002.json").write_text(json.dumps({**meta, "tensors": f"../../{target.name}"}))


def _plant_tensor_link(ck: Path, target: Path) -> None:
    (ck / "round_00002.safetensors").unlink()
    (ck / "round_00002.safetensors").symlink_to(target)


def _plant_latest_link(ck: Path, target: Path) -> None:
    (ck / "latest.json").unlink()
    (ck / "latest.json").symlink_to(target)


def _plant_folder_link(ck: Path, target: Path) -> None:
    shutil.move(ck, target.parent / "moved_checkpoints")
    ck.symlink_to(target.parent / "moved_checkpoints")


def _plant_metrics_link(ck: Path, target: Path) -> None:
    (ck.parent / "metrics.jsonl").unlink()
    (ck.parent / "metrics.jsonl").symlink_to(target)


def _plant_metrics_hardlink(ck: Path, target: Path) -> None:
    (ck.parent / "metrics.jsonl").unlink()
    os.link(target, ck.parent / "metrics.jsonl")


def _plant_old_round(ck: Path, target: Path) -> None:
    """An older checkpoint that the resumed run prunes (the original delete-anything bug)."""
    (ck / "round_00001.json").write_text(json.dumps({"round": 1, "tensors": str(target)}))


REFUSED = {"latest-absolute": _plant_latest, "latest-dotdot": _plant_latest_dotdot,
           "tensors-absolute": _plant_tensors, "tensors-dotdot": _plant_tensors_dotdot,
           "tensor-symlink": _plant_tensor_link, "latest-symlink": _plant_latest_link,
           "checkpoints-symlink": _plant_folder_link, "metrics-symlink": _plant_metrics_link,
           "metrics-hardlink": _plant_metrics_hardlink}


@pytest.mark.parametrize("plant", [*REFUSED, "pruned-old-round"])
def test_hostile_checkpoint_metadata_touches_nothing_outside(finished_run, tmp_path, plant):
    out = _copy(finished_run, tmp_path)
    outside = tmp_path / "precious.json"  # a plausible target: valid JSON next to the run
    outside.write_text('{"checkpoint": "round_00001.json", "round": 1}\n')
    before = (outside.read_bytes(), outside.stat().st_mtime_ns)
    REFUSED.get(plant, _plant_old_round)(out / "checkpoints", outside)
    result = _cli("rounds=3", "--resume", "--out", str(out))
    if plant == "pruned-old-round":
        assert result.exit_code == 0, result.output  # resumed; round 1 pruned by its name
        assert not (out / "checkpoints/round_00001.json").exists()
    else:
        _one_line_error(result, str(out))
    assert outside.is_file() and (outside.read_bytes(), outside.stat().st_mtime_ns) == before


# ------------------------------------------------------------- an existing run folder (2)

def test_fresh_run_into_existing_run_is_refused(finished_run, tmp_path):
    out = _copy(finished_run, tmp_path)
    metrics = (out / "metrics.jsonl").read_bytes()
    with pytest.raises(RunDirError, match="holds an earlier run; pass --resume"):
        run_experiment(_cfg(), out, progress=False)
    _one_line_error(_cli("--out", str(out)), "--resume", "--overwrite")
    assert (out / "metrics.jsonl").read_bytes() == metrics
    with pytest.raises(RunDirError, match="one of --resume and --overwrite"):
        run_experiment(_cfg(), out, resume=True, overwrite=True, progress=False)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_a_start_that_failed_before_any_result_needs_no_flag(tmp_path):
    out = tmp_path / "run"
    with pytest.raises(ValueError, match="engine.device"):
        run_experiment(_cfg("engine.device=cuda"), out, progress=False)  # fails after claiming
    assert (out / "config.resolved.toml").is_file()
    run_experiment(_cfg(), out, progress=False)
    assert [h["mode"] for h in read_config_history(out)] == ["fresh", "fresh"]


def test_overwrite_replaces_only_the_runs_own_files(tmp_path):
    out = tmp_path / "run"
    run_experiment(_cfg("rounds=4"), out, progress=False)  # checkpoints 3 and 4 remain
    (out / "notes.txt").write_text("mine")
    (out / "checkpoints" / "README").write_text("mine too")
    (out / "events.jsonl").symlink_to(tmp_path / "elsewhere.txt")
    (tmp_path / "elsewhere.txt").write_text("not the run's")
    hist = run_experiment(_cfg(), out, overwrite=True, progress=False)
    assert [r["round"] for r in hist] == [r["round"] for r in read_metrics(out)] == [1, 2]
    names = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert names == ["README", "latest.json", "round_00001.json", "round_00001.safetensors",
                     "round_00002.json", "round_00002.safetensors"]
    assert (out / "notes.txt").read_text() == "mine"
    assert (tmp_path / "elsewhere.txt").read_text() == "not the run's"
    assert [h["mode"] for h in read_config_history(out)] == ["overwrite"]


# ------------------------------------------------------------------- one writer at a time (3)

def _env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def test_second_run_into_a_running_folder_fails_and_a_killed_run_does_not_block(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "fedforge", "run", QUICK, "rounds=100000", "eval.every=1",
           "checkpoint.every=5", "eval.per_client=false", "-q", "--out", str(out)]
    first = subprocess.Popen(cmd, env=_env(), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 240
        while not (out / "checkpoints" / "latest.json").is_file():
            assert first.poll() is None, "the first run ended early"
            assert time.monotonic() < deadline, "the first run never wrote a checkpoint"
            time.sleep(0.2)
        second = subprocess.run([*cmd, "--overwrite"], env=_env(), capture_output=True,
                                text=True, timeout=240)
        assert second.returncode == 2, second.stderr
        assert "another run is writing this folder" in second.stderr
        assert "Traceback" not in second.stderr and second.stderr.strip().count("\n") == 0
        assert first.poll() is None  # the first run carries on, its folder intact
        assert (out / "checkpoints" / "latest.json").is_file()
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=60)
    # the kernel dropped the killed run's lock: resuming works at once
    result = _cli("rounds=1", "--resume", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert read_metrics(out)


def test_lock_is_held_only_while_the_run_writes(tmp_path):
    out = tmp_path / "run"
    with claim_run_dir(out, lambda p: p.write_text('rounds = 1\n')):
        with pytest.raises(RunDirError, match="another run is writing"):
            run_experiment(_cfg(), out, overwrite=True, progress=False)
    run_experiment(_cfg(), out, overwrite=True, progress=False)
    run_experiment(_cfg("rounds=3"), out, resume=True, progress=False)


# ----------------------------------------------------------- resume checks the config (4)

@pytest.mark.parametrize("change,keys", [
    (["seed=5"], "seed"), (["algorithm.local_lr=0.5"], "algorithm.local_lr"),
    (["algorithm.name=fedprox", "algorithm.mu=0.1"],
     "algorithm.local_momentum, algorithm.mu, algorithm.name"),
    (["model.name=mlp"], "model.name"), (["engine.precision=bf16"], "engine.precision")])
def test_resume_with_changed_settings_is_refused(finished_run, tmp_path, change, keys):
    out = _copy(finished_run, tmp_path)
    saved = {p: (out / p).read_bytes() for p in ("config.resolved.toml", HISTORY_NAME,
                                                  "metrics.jsonl")}
    with pytest.raises(RunDirError, match=f"cannot resume with a different config: {keys} "):
        run_experiment(_cfg("rounds=3", *change), out, resume=True, progress=False)
    assert {p: (out / p).read_bytes() for p in saved} == saved
    if change == ["model.name=mlp"]:  # used to be a traceback from the state-dict load
        _one_line_error(_cli("rounds=3", *change, "--resume", "--out", str(out)), keys)


def test_resume_with_more_rounds_keeps_the_first_config_in_the_history(finished_run, tmp_path):
    out = _copy(finished_run, tmp_path)
    hist = run_experiment(_cfg("rounds=3", "checkpoint.every=3", "eval.every=3",
                               "engine.chunk_size=2"), out, resume=True, progress=False)
    assert [r["round"] for r in hist] == [1, 2, 3]
    history = read_config_history(out)
    assert [h["mode"] for h in history] == ["fresh", "resume"]
    assert [h["config"]["rounds"] for h in history] == [2, 3]
    assert "rounds = 3" in (out / "config.resolved.toml").read_text()


def test_differences_list_nested_and_list_keys():
    a = {"seed": 0, "tasks": [{"eval_every": 2, "seed": 1}], "eval": {"every": 1}}
    b = {"seed": 0, "tasks": [{"eval_every": 4, "seed": 2}], "eval": {"every": 9}}
    assert config_differences(a, b, ("eval", "tasks.*.eval_every")) == ["tasks.0.seed"]


MULTITASK = """
method = "fedast"
max_updates = 30
[system]
num_clients = 20
[async]
requests = 4
rb_ratio = 2
variance_window = 2
[checkpoint]
every = 10
[[tasks]]
data = {dataset = "synthetic", partition = "natural", num_clients = 20}
model = {name = "logreg"}
algorithm = {name = "fedavg", local_lr = 0.1, server_lr = 0.5}
client = {batch_size = 10, local_steps = 2}
eval_every = 2
"""


def test_multitask_resume_checks_the_config(tmp_path):
    from fedforge.experiment.config import load_config
    from fedforge.experiment.runner import run_experiment

    path = tmp_path / "mt.toml"
    path.write_text(MULTITASK)
    out = tmp_path / "mt"
    run_experiment(load_config(path), out, progress=False)
    with pytest.raises(RunDirError, match="holds an earlier run"):
        run_experiment(load_config(path), out, progress=False)
    with pytest.raises(RunDirError, match=r"config: seed, tasks\.0\.algorithm\.local_lr "):
        run_experiment(load_config(path, ["seed=3", "tasks.0.algorithm.local_lr=0.2"]), out,
                       resume=True, progress=False)
    run_experiment(load_config(path, ["max_updates=40", "tasks.0.eval_every=3"]), out,
                   resume=True, progress=False)
    assert [h["config"]["max_updates"] for h in read_config_history(out)] == [30, 40]
    assert json.loads((out / "summary.json").read_text())["updates"] == 40


# ------------------------------------------------------------- unusable --out folders (7)

def test_out_that_is_a_file_is_one_line_error(tmp_path):
    path = tmp_path / "file.txt"
    path.write_text("x")
    _one_line_error(_cli("--out", str(path)), str(path), "not a folder")
    _one_line_error(_cli("--out", str(path / "sub")), str(path / "sub"))
    assert path.read_text() == "x"


def test_unlockable_folder_is_one_line_error(tmp_path):
    out = tmp_path / "run"
    (out / LOCK_NAME).mkdir(parents=True)  # the OS refuses to open it as the lock file
    _one_line_error(_cli("--out", str(out)), str(out), "cannot lock")


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0,
                    reason="needs POSIX permissions that bind (root may write anywhere)")
def test_read_only_folder_is_one_line_error(tmp_path):
    out = tmp_path / "ro"
    out.mkdir()
    out.chmod(0o500)
    try:
        _one_line_error(_cli("--out", str(out)), str(out))
        _one_line_error(_cli("--out", str(out / "sub")), str(out / "sub"))
    finally:
        out.chmod(0o700)


# ------------------------------------------------------------------------ compare (2)

def test_compare_into_an_existing_folder_resumes_or_overwrites(tmp_path):
    from fedforge.study.compare import comparison_configs, run_comparison

    cfgs = comparison_configs(QUICK, ["fedavg"], SHORT)
    rows, _ = run_comparison(cfgs, tmp_path / "cmp", progress=False)
    again, _ = run_comparison(cfgs, tmp_path / "cmp", progress=False)  # finished: reused
    assert again[0]["final_acc"] == rows[0]["final_acc"]
    changed = comparison_configs(QUICK, ["fedavg"], [*SHORT, "algorithm.local_lr=0.5"])
    with pytest.raises(RunDirError, match="algorithm.local_lr"):
        run_comparison(changed, tmp_path / "cmp", progress=False)
    run_comparison(changed, tmp_path / "cmp", progress=False, overwrite=True)
    assert [h["mode"] for h in read_config_history(tmp_path / "cmp" / "fedavg")] == [
        "overwrite"]


# ------------------------------------------------------------ divergence messages (8)

def test_divergence_at_round_one_says_no_checkpoint_yet(tmp_path):
    from fedforge.robust.divergence import DivergenceError

    with pytest.raises(DivergenceError, match="no checkpoint yet") as err:
        run_experiment(_cfg("algorithm.local_lr=1e300"), tmp_path / "run", progress=False)
    assert "round 1" in str(err.value) and "checkpoints" not in str(err.value)
    assert not (tmp_path / "run" / "checkpoints").exists()
