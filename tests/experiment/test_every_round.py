"""``metrics.jsonl`` and ``Experiment.history`` hold every round; the test metrics only the
evaluated ones. Readers get evaluations through ``evaluated`` and read files from before
every round was recorded (evaluations only) exactly as before."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from fedforge.bench.time_to_accuracy import first_reaching
from fedforge.experiment.config import load_config
from fedforge.experiment.metrics import evaluated, is_evaluated
from fedforge.experiment.runner import Experiment, run_experiment
from fedforge.reproduce.report import summarize
from fedforge.study.compare import rounds_to_target, sim_time_to_target
from fedforge.study.labels import without_wall_clock
from fedforge.study.plots import curves, load_run_list
from fedforge.study.privacy_plots import final_record
from fedforge.study.report import render

REPO = Path(__file__).resolve().parents[2]
QUICK = REPO / "examples" / "quickstart.toml"
FIVE = ["rounds=5", "eval.every=2", "client.local_steps=2", "client.local_epochs=null",
        "checkpoint.every=100", "seed=1"]
PER_ROUND = ["round", "train_loss", "bytes_up", "bytes_down", "client_state_bytes_per_client",
             "bytes_up_round", "bytes_down_round", "sim_time_s", "wall_s"]
TEST = ["test_accuracy", "test_loss", "client_mean_accuracy"]  # natural split: per client


def test_five_rounds_every_two_records_every_round_and_evaluates_2_4_5(tmp_path):
    exp = Experiment.from_config(load_config(QUICK, FIVE), tmp_path / "api")
    first = exp.run(2)  # the last round of a call is evaluated: 2 is evaluated anyway
    rest = exp.run(3)
    history = exp.history
    assert [r["round"] for r in first] == [1, 2] and [r["round"] for r in rest] == [3, 4, 5]
    assert history == first + rest
    assert [r["round"] for r in history] == [1, 2, 3, 4, 5]
    assert [r["round"] for r in evaluated(history)] == [2, 4, 5]
    assert history[1]["engine_auto"] == "vmap chunk auto conv native"  # once, at the 1st eval
    assert history[1]["client_store_auto"] == "memory"  # the store auto chose, likewise
    for rec in history:
        if rec["round"] in (2, 4, 5):  # the evaluated record's keys, in today's order
            keys = [k for k in rec if not k.startswith(("engine_auto", "client_store_auto"))]
            assert keys == [*PER_ROUND[:2], *TEST, *PER_ROUND[2:]]
        else:
            assert list(rec) == PER_ROUND and not is_evaluated(rec)
    per_round = history[0]["bytes_up_round"]  # FedAvg, a fixed cohort: the same each round
    assert per_round > 0
    assert [r["bytes_up"] for r in history] == [t * per_round for t in range(1, 6)]

    # one uninterrupted run writes the same records, and evaluating every round changes
    # nothing but which records carry test metrics
    whole = run_experiment(load_config(QUICK, FIVE), tmp_path / "whole", progress=False)
    every = run_experiment(load_config(QUICK, [*FIVE, "eval.every=1"]), tmp_path / "every",
                           progress=False)
    assert _strip(whole) == _strip(history)
    assert _strip(evaluated(history)) == _strip(r for r in every if r["round"] in (2, 4, 5))
    assert [{k: r[k] for k in PER_ROUND[:2]} for r in history] == [
        {k: r[k] for k in PER_ROUND[:2]} for r in every]


def _strip(records) -> list[dict]:
    return [without_wall_clock(r) for r in records]


# rounds 1..6 evaluated every 2: the file of an older version holds rounds 2, 4, 6 only
EVALS = [{"round": t, "train_loss": 2.0 / t, "test_accuracy": acc, "test_loss": 1.0 - acc,
          "bytes_up": 100 * t, "sim_time_s": 1.5 * t, "wall_s": 0.25 * t, "dp_epsilon": 0.5 * t}
         for t, acc in ((2, 0.4), (4, 0.7), (6, 0.6))]


def _every_round() -> list[dict]:
    """The same run as this version writes it, still training: every round, test metrics
    on 2, 4 and 6, round 7 not evaluated (yet)."""
    by_round = {r["round"]: r for r in EVALS}
    return [by_round.get(t, {"round": t, "train_loss": 2.0 / t, "bytes_up": 100 * t,
                             "sim_time_s": 1.5 * t, "wall_s": 0.25 * t}) for t in range(1, 8)]


def _folder(path: Path, records: list[dict]) -> Path:
    path.mkdir(parents=True)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.fixture
def old_and_new(tmp_path) -> tuple[Path, Path]:
    return (_folder(tmp_path / "old" / "run", EVALS),
            _folder(tmp_path / "new" / "run", _every_round()))


def test_evaluated_keeps_old_files_whole():
    assert evaluated(EVALS) == EVALS
    assert evaluated(_every_round()) == EVALS
    assert evaluated(_every_round(), "dp_epsilon") == EVALS


def test_compare_and_bench_read_both_files_alike():
    for history in (EVALS, _every_round()):
        assert rounds_to_target(history, 0.65) == 4
        assert sim_time_to_target(history, 0.65) == 6.0
        assert rounds_to_target(history, 0.8) is None
        assert first_reaching(history, 0.65) == EVALS[1]


def test_reproduce_summary_reads_both_files_alike():
    old, new = (summarize(h, 0, 0.65, "test_accuracy") for h in (EVALS, _every_round()))
    for run in (old, new):
        assert (run.rounds, run.sim_time, run.reached) == (4.0, 6.0, True)
        assert run.final_acc == pytest.approx((0.4 + 0.7 + 0.6) / 3)
        assert run.sim_per_round == pytest.approx(1.5)


def test_plot_curves_read_both_files_alike(old_and_new):
    old, new = (load_run_list([d]) for d in old_and_new)
    (acc_old,), (acc_new,) = curves(old, "test_accuracy"), curves(new, "test_accuracy")
    assert acc_old.x == acc_new.x == [2, 4, 6]
    assert acc_old.mean == acc_new.mean == pytest.approx([0.4, 0.7, 0.6])
    (loss_new,) = curves(new, "train_loss")  # recorded every round now
    assert loss_new.x == [1, 2, 3, 4, 5, 6, 7]


def test_report_table_reads_both_files_alike(old_and_new):
    """The final row is the last evaluation's, not round 7's time and bytes."""
    tables = [re.search(r'<table id="final">.*?</table>', render(d.parent), re.S).group(0)
              for d in old_and_new]
    assert tables[0] == tables[1]
    assert ">0.6<" in tables[0] and ">9<" in tables[0] and ">600<" in tables[0]


def test_report_of_a_run_without_an_evaluation_yet(tmp_path):
    folder = _folder(tmp_path / "run", _every_round()[:1])
    assert "No evaluated round yet." in render(folder)


def test_privacy_table_takes_the_last_evaluation_of_a_stopped_run(old_and_new, tmp_path):
    stopped = _folder(tmp_path / "stopped", _every_round()[:5])  # killed after round 5
    assert final_record(old_and_new[0]) == final_record(old_and_new[1]) == EVALS[-1]
    assert final_record(stopped) == EVALS[1]
    with pytest.raises(ValueError, match="no evaluated records"):
        final_record(_folder(tmp_path / "early", _every_round()[:1]))
