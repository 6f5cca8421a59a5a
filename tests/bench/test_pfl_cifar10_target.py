"""fedforge bench pfl-cifar10 --target: the clock leaves evaluations out, the first evaluated
iteration at or above the target is the one reported, a row that never reached it is
censored ("≥ N"), the bf16 check, and a quick run that fills the two columns. No assertion
here reads a measured time: the clock is scripted, and the quick run's seconds are only
checked to be there."""

import json
import math
import sys

import pytest
from typer.testing import CliRunner

from fedforge.bench import pfl_cifar10_run
from fedforge.bench.pfl_cifar10 import (
    HEADER,
    TARGET_HEADER,
    Run,
    bf16_check,
    censored,
    header,
    run_pfl_cifar10,
    target_cells,
)
from fedforge.bench.pfl_cifar10_run import TargetClock


class FakeTime:
    """perf_counter that moves only when told to."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def fake(monkeypatch):
    clock = FakeTime()
    monkeypatch.setattr(pfl_cifar10_run.time, "perf_counter", clock)
    return clock


def scripted(fake: FakeTime, accuracies: list[float], eval_s: float = 10.0):
    """accuracy() callables that take ``eval_s`` fake seconds and return the next value."""
    todo = iter(accuracies)

    def accuracy() -> float:
        fake.now += eval_s
        return next(todo)  # StopIteration: evaluated once too often

    return accuracy


def run_iterations(clock: TargetClock, fake: FakeTime, seconds: list[float], accuracy):
    clock.stamp()
    clock.evaluate(accuracy)  # before the first iteration (Flower's round 0): never evaluated
    for s in seconds:
        fake.now += s
        clock.stamp()
        clock.evaluate(accuracy)


def test_evaluations_are_off_the_clock_and_stop_at_the_first_reaching(fake):
    clock = TargetClock(launched=0.0, target=0.5, every=1)
    run_iterations(clock, fake, [2.0, 3.0, 4.0, 1.0], scripted(fake, [0.2, 0.4, 0.6]))
    # each 10 s evaluation is excluded: the iterations keep their own seconds
    assert clock.result(warmup=1)["iteration_s"] == [3.0, 4.0, 1.0]
    assert clock.result(warmup=1)["first_s"] == 2.0
    got = clock.target_result()
    assert got["curve"] == [[1, 0.2], [2, 0.4], [3, 0.6]]  # none after the target
    assert got["iterations_to_target"] == 3 and got["s_to_target"] == 9.0
    assert got["iterations_run"] == 4 and got["trained_s"] == 10.0


def test_every_k_iterations_counting_the_warm_up_and_a_target_never_reached(fake):
    clock = TargetClock(launched=0.0, target=0.9, every=2)
    run_iterations(clock, fake, [1.0] * 5, scripted(fake, [0.3, 0.5]))
    got = clock.target_result()
    assert got["curve"] == [[2, 0.3], [4, 0.5]]
    assert got["iterations_to_target"] is None and got["s_to_target"] is None
    assert clock.result(warmup=1)["iteration_s"] == [1.0] * 4


def test_an_accuracy_exactly_at_the_target_reaches_it(fake):
    clock = TargetClock(launched=0.0, target=0.5, every=1)
    run_iterations(clock, fake, [1.0, 1.0], scripted(fake, [0.5]))
    assert clock.target_result()["iterations_to_target"] == 1


def test_without_a_target_nothing_is_evaluated(fake):
    clock = TargetClock(launched=0.0)
    run_iterations(clock, fake, [1.0, 2.0], scripted(fake, []))
    assert clock.target_result() == {} and clock.result(0)["iteration_s"] == [1.0, 2.0]


def test_other_torchrun_ranks_do_not_evaluate(fake, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    clock = TargetClock(launched=0.0, target=0.1)
    run_iterations(clock, fake, [1.0, 1.0], scripted(fake, []))
    assert clock.target_result()["curve"] == []


def _run(reached: int | None, s: float | None, run: int = 6, trained: float = 12.0) -> Run:
    return Run("x", to_target={"iterations_to_target": reached, "s_to_target": s,
                               "iterations_run": run, "trained_s": trained, "curve": []})


def test_a_row_that_never_reached_the_target_is_censored():
    assert censored(math.inf, 30) == "≥ 30" and censored(12, 30) == 12
    assert target_cells([_run(None, None), _run(None, None, trained=14.0)]) == ["≥ 6", "≥ 13.0"]
    # medians over the groups, a group that never reached it counting as more than any
    assert target_cells([_run(3, 1.5), _run(None, None), _run(5, 2.5)]) == [5, 2.5]
    assert target_cells([_run(None, None), _run(None, None), _run(5, 2.5)]) == ["≥ 6", "≥ 12.0"]
    assert target_cells([_run(3, 1.5), _run(4, 2.0)]) == [3.5, 1.75]
    assert header(True) == HEADER + TARGET_HEADER and header(False) == HEADER


def test_the_bf16_check():
    lines = bf16_check({"fedforge": 12, "fedforge:bf16": 12, "plain": 12, "plain:bf16": 10,
                        "fedforge:procs": 12, "fedforge:procs:bf16": 15, "pfl": 8,
                        "flower:bf16": 3})
    assert lines == ["bf16 iterations to target: fedforge 12 vs fp32 12 (not more)",
                     "bf16 iterations to target: plain 10 vs fp32 12 (not more)",
                     "bf16 iterations to target: fedforge:procs 15 vs fp32 12: MORE "
                     "iterations in bf16"]  # pfl and flower have one row each: no line
    assert bf16_check({"plain": "≥ 30", "plain:bf16": 20}) == [
        "bf16 iterations to target: plain 20 vs fp32 ≥ 30 (not more)"]
    assert bf16_check({"plain": 20, "plain:bf16": "≥ 30"})[0].endswith("MORE iterations in bf16")
    assert bf16_check({"plain": "≥ 30", "plain:bf16": "≥ 30"})[0].endswith(
        "neither reached the target, not compared")
    assert bf16_check({"plain:bf16": None, "plain": 4}) == [
        "bf16 iterations to target: plain: no bf16 result, not compared"]
    assert bf16_check({"plain:bf16": 4, "plain": None}) == [
        "bf16 iterations to target: plain: no fp32 result, not compared"]


@pytest.mark.parametrize("kwargs, option", [({"target": 1.5}, "--target"),
                                            ({"target": 0.5, "eval_every": 0}, "--eval-every")])
def test_a_bad_target_or_eval_every_is_refused_naming_the_option(tmp_path, kwargs, option):
    with pytest.raises(ValueError, match=option):
        run_pfl_cifar10(["plain"], tmp_path, quick=True, **kwargs)


def test_the_command_has_both_options():
    from fedforge.cli import app

    out = CliRunner().invoke(app, ["bench", "pfl-cifar10", "--help"], env={"COLUMNS": "200"},
                             terminal_width=200).output
    assert "--target" in out and "--eval-every" in out


def test_quick_run_with_a_target_fills_the_two_columns(tmp_path):
    """Target 0 is reached at the first evaluation whatever the weights, so the iterations
    to it are known: the second (every 2, the warm-up counted)."""
    names = ["fedforge", "plain", "plain:bf16"]
    rows, note, _ = run_pfl_cifar10(
        names, tmp_path / "out", data_root=tmp_path / "no-data", groups=1, warmup=1,
        iterations=2, quick=True, peer_python=sys.executable, target=0.0, eval_every=2)
    assert [r[0] for r in rows] == names and all(len(r) == len(header(True)) for r in rows)
    for row in rows:
        its, secs = row[len(HEADER):]
        assert its == 2 and isinstance(secs, float) and secs > 0, row
    out = json.loads((tmp_path / "out" / "plain.out").read_text())
    assert [it for it, _ in out["curve"]] == [2] and 0 <= out["curve"][0][1] <= 1
    assert len(out["iteration_s"]) == 2 and out["iterations_run"] == 3  # all still run
    assert out["s_to_target"] <= out["trained_s"]
    assert "Target: test accuracy 0.0, evaluated every 2 iterations" in note
    assert bf16_check({r[0]: r[len(HEADER)] for r in rows}) == [
        "bf16 iterations to target: plain 2 vs fp32 2 (not more)"]
