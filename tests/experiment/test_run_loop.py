"""The one run loop: ``RunState`` owns the counters and refuses a reshaped checkpoint, the
loop is one short function, and any object that follows the ``Driver`` protocol runs
through it with checkpoints and a resume that continues exactly."""

from __future__ import annotations

import ast
import inspect
import json
from contextlib import contextmanager
from dataclasses import fields, replace
from pathlib import Path

import pytest
import torch

from fedforge.experiment import runner
from fedforge.experiment.config import load_config
from fedforge.experiment.drivers import RunFolder
from fedforge.experiment.state import UPDATES, RunState

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src" / "fedforge"
QUICK = REPO / "examples" / "quickstart.toml"
WHERE = Path("run") / "checkpoints"

ROUNDS_STATE = RunState(round=4, wall_s=1.25, seed=3, bytes_up=40, bytes_down=80,
                        sim_time_s=2.5, prep_s=0.0, lr_scale=0.5, rollbacks=1,
                        sim_clock={"now": 1.0, "busy_until": [0.0, 2.0]},
                        engine={"choice": "loop"}, privacy={"ledger": []})


# --- RunState ------------------------------------------------------------------------------
def test_round_trip_of_a_run_of_rounds():
    meta = {**ROUNDS_STATE.to_meta(), "round": 4}  # the checkpoint writer adds the round
    assert set(meta) == {"round", "wall_s", "bytes_up", "bytes_down", "seed", "prep_s",
                         "sim_time_s", "sim_clock", "lr_scale", "rollbacks", "engine",
                         "privacy", "rng"}
    assert RunState.from_meta(json.loads(json.dumps(meta)), WHERE) == ROUNDS_STATE
    plain = replace(ROUNDS_STATE, privacy=None, sim_clock=None)
    assert "privacy" not in plain.to_meta()  # written only by private runs
    assert RunState.from_meta({**plain.to_meta(), "round": 4}, WHERE) == plain


def test_round_trip_of_a_multitask_run():
    state = RunState(round=7, wall_s=2.0, seed=1, driver={"c": 7, "clock": {}}, unit=UPDATES)
    meta = state.to_meta()
    assert set(meta) == {"driver", "wall_s", "seed"}
    assert RunState.from_meta({**meta, "round": 7}, WHERE, UPDATES) == state
    assert state.covers({"updates": 7}) and not state.covers({"updates": 8})


@pytest.mark.parametrize(("edit", "message"), [
    (lambda m: m.pop("bytes_up"), "'bytes_up' is missing or not an integer (None)"),
    (lambda m: m.update(bytes_up="40"), "'bytes_up' is missing or not an integer ('40')"),
    (lambda m: m.update(rollbacks=True), "'rollbacks' is missing or not an integer (True)"),
    (lambda m: m.update(wall_s=[1.0]), "'wall_s' is missing or not a number ([1.0])"),
    (lambda m: m.pop("round"), "'round' is missing or not an integer (None)"),
    (lambda m: m.update(sim_clock=[1.0]), "'sim_clock' is not a table ([1.0])"),
    (lambda m: m.update(engine="loop"), "'engine' is not a table ('loop')"),
    (lambda m: m.update(lr_scale=0), "'lr_scale' must be a positive, finite number, got 0"),
])
def test_a_missing_or_reshaped_field_is_refused_naming_the_checkpoint(edit, message):
    meta = {**ROUNDS_STATE.to_meta(), "round": 4}
    edit(meta)
    with pytest.raises(ValueError) as err:
        RunState.from_meta(meta, WHERE)
    assert str(err.value) == f"{WHERE}: checkpoint field {message}"


def test_a_multitask_checkpoint_needs_its_scheduler_state():
    with pytest.raises(ValueError, match=r"^run/checkpoints: checkpoint field 'driver' is "
                                         r"missing \(None\)$"):
        RunState.from_meta({"round": 3, "wall_s": 1.0, "seed": 0}, WHERE, UPDATES)


# --- the loop and where the counters are listed ---------------------------------------------
def test_the_run_loop_is_one_short_function():
    lines = inspect.getsource(runner.drive).splitlines()
    assert len(lines) < 100, f"drive() is {len(lines)} lines"
    assert not hasattr(runner, "_run_experiment") and not hasattr(runner, "check_meta")
    assert not (SRC / "experiment" / "async_runner.py").exists()


COUNTERS = {f.name for f in fields(RunState)} - {"round", "unit"}  # round: the file's name
# names only a checkpoint holds ("engine" and "privacy" are also config sections: the
# config's key order lists them, so they cannot tell a counter listing apart)
STATE_ONLY = {"lr_scale", "rollbacks", "sim_clock", "driver", "store"}


def _listings(tree: ast.AST) -> list[int]:
    """Lines that list counters: a literal holding two checkpoint-only names, or a checkpoint
    ``meta`` read by key."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Dict, ast.Tuple, ast.List, ast.Set)):
            items = node.keys if isinstance(node, ast.Dict) else node.elts
            names = {k.value for k in items if isinstance(k, ast.Constant)}
            if len(names & STATE_ONLY) >= 2:
                found.append(node.lineno)
        key = None
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
            key, owner = node.slice, node.value.id
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "get" and isinstance(node.func.value, ast.Name)
              and node.args):
            key, owner = node.args[0], node.func.value.id
        if (key is not None and owner == "meta" and isinstance(key, ast.Constant)
                and key.value in COUNTERS):
            found.append(node.lineno)
    return found


def test_run_state_is_the_only_place_the_counters_are_listed():
    state = SRC / "experiment" / "state.py"
    assert _listings(ast.parse(state.read_text()))  # the check sees the one real listing
    others = {str(p.relative_to(SRC)): lines for p in sorted(SRC.rglob("*.py")) if p != state
              if (lines := _listings(ast.parse(p.read_text())))}
    assert others == {}


# --- a toy driver through the loop -----------------------------------------------------------
class Crash(RuntimeError):
    pass


class Sum:
    """A three-step driver: step t adds t to a tensor; it may crash before a step."""

    def __init__(self, out: Path, crash_at: int | None = None) -> None:
        self.folder = RunFolder(out, out / "checkpoints", keep=2)
        self.device, self.state, self.crash_at = torch.device("cpu"), RunState(), crash_at
        self.total, self.shown, self.calls = torch.zeros(()), [], []

    def start(self) -> None:
        self.calls.append(("start", self.state.round))

    def step(self) -> list[dict]:
        t = self.state.round + 1
        if t == self.crash_at:
            raise Crash(f"killed before step {t}")
        self.total = self.total + t
        self.state = replace(self.state, round=t, bytes_up=self.state.bytes_up + 10 * t)
        return [{"round": t, "total": float(self.total)}]

    def finished(self) -> bool:
        return self.state.round >= 3

    def checkpoint_due(self) -> bool:
        return True

    def state_dict(self) -> tuple[dict, RunState]:
        return {"total": self.total}, replace(self.state, wall_s=0.0)

    def checkpointed(self) -> None:
        self.calls.append(("checkpointed", self.state.round))

    def load_state_dict(self, tensors: dict, state: RunState) -> None:
        self.calls.append(("load", state.round))
        self.total, self.state = tensors["total"], state

    def rollback(self, error) -> bool:
        return False

    @contextmanager
    def progress(self):
        yield self.shown.extend

    def summarise(self) -> None:
        (self.folder.out / "summary.json").write_text(json.dumps({"total": float(self.total)}))

    def __enter__(self) -> Sum:
        return self

    def __exit__(self, *exc: object) -> None:
        self.calls.append(("exit", self.state.round))


def test_a_toy_driver_runs_checkpoints_and_resumes_exactly(tmp_path):
    cfg = load_config(QUICK, [])
    whole = Sum(tmp_path / "whole")
    records = runner.drive(cfg, whole.folder, lambda: whole)
    assert records == whole.shown == [{"round": t, "total": s} for t, s in
                                      [(1, 1.0), (2, 3.0), (3, 6.0)]]
    assert json.loads((tmp_path / "whole" / "summary.json").read_text()) == {"total": 6.0}
    meta = json.loads((tmp_path / "whole" / "checkpoints" / "round_00003.json").read_text())
    assert meta["round"] == 3 and meta["bytes_up"] == 60 and meta["lr_scale"] == 1.0

    crashed = Sum(tmp_path / "parts", crash_at=3)
    with pytest.raises(Crash):
        runner.drive(cfg, crashed.folder, lambda: crashed)
    assert crashed.calls[-1] == ("exit", 2)  # the driver was released on the way out
    resumed = Sum(tmp_path / "parts")
    again = runner.drive(cfg, resumed.folder, lambda: resumed, resume=True)
    assert resumed.calls[:2] == [("load", 2), ("start", 2)]
    assert again == records and resumed.shown == records[2:]
    assert runner.read_metrics(tmp_path / "parts") == records
    assert RunState.from_meta(
        json.loads((tmp_path / "parts" / "checkpoints" / "round_00003.json").read_text()),
        WHERE) == RunState.from_meta(meta, WHERE)
