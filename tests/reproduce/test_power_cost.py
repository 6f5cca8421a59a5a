"""An underpowered page says what its missing seeds would cost: per condition, the seeds
short of the power rule's count times the median wall time of its committed runs."""

from __future__ import annotations

import pytest

from fedforge.reproduce.report import RunSummary, missing_hours


def _runs(*walls: float) -> dict[int, RunSummary]:
    return {s: RunSummary(seed=s, rounds=10, sim_time=1.0, final_acc=0.5, reached=True,
                          sim_per_round=0.1, history=[{"round": 10, "wall_s": w}])
            for s, w in enumerate(walls)}


def test_missing_seeds_cost_their_conditions_median_wall_time():
    runs = {"a": _runs(3600, 7200, 36000), "b": _runs(1800, 1800), "c": _runs(900)}
    # a: 5 - 3 = 2 seeds at the median 7200 s (not the mean 15600); b: 1 at 1800; c: none
    assert missing_hours(runs, {"a": 5, "b": 3, "c": 1}) == pytest.approx(4.5)


def test_a_condition_without_wall_times_or_runs_adds_nothing():
    runs = {"a": {0: RunSummary(0, 1, 1.0, 0.5, True, 0.1, [{"round": 1}])}}
    assert missing_hours(runs, {"a": 9, "missing": 9}) == 0.0
