"""What a run prints: a bar naming algorithm, seed and round in a terminal, one flushed line per
evaluation without one; TensorBoard scalars of every round through tensorboard's own writer."""

from __future__ import annotations

import importlib.util
import io
import re
from pathlib import Path

import numpy as np
import pytest

from fedforge.experiment.config import load_config
from fedforge.experiment.metrics import evaluated
from fedforge.experiment.partition_stats import load_partition_stats
from fedforge.experiment.progress import RoundProgress, run_position
from fedforge.experiment.runner import run_experiment

REPO = Path(__file__).resolve().parents[2]
QUICK = REPO / "examples" / "quickstart.toml"
SHORT = ["rounds=4", "eval.every=2", "client.local_steps=1", "client.local_epochs=null",
         "seed=3"]


class _File(io.StringIO):
    """A redirected stdout (not a terminal) that counts flushes."""

    def __init__(self, tty: bool = False) -> None:
        super().__init__()
        self.tty, self.flushes = tty, 0

    def isatty(self) -> bool:
        return self.tty

    def flush(self) -> None:
        self.flushes += 1
        super().flush()


def _records() -> list[tuple[int, dict | None]]:
    """Rounds 1 and 3 not evaluated; ``None``: a rank that writes no records."""
    return [(1, {"round": 1, "train_loss": 2.0, "wall_s": 1.5}),
            (2, {"test_accuracy": 0.5, "test_loss": 1.25, "wall_s": 3.0}),
            (3, None), (4, {"test_accuracy": 0.75, "test_loss": 0.5, "wall_s": 6.04})]


def test_without_a_terminal_one_flushed_line_per_evaluation():
    out = _File()
    with run_position("run 2/6"), RoundProgress(4, label="fedavg seed 3", stream=out) as bar:
        for t, rec in _records():
            flushes = out.flushes
            bar.advance(t, rec)
            if rec is not None and "test_accuracy" in rec:  # out before the next round
                assert out.flushes > flushes
                assert out.getvalue().endswith("\n")
    assert out.getvalue().splitlines() == [
        "fedavg seed 3 [run 2/6]: rounds 1-4",
        "fedavg seed 3 [run 2/6]: round 2/4 accuracy 0.5000 loss 1.2500 wall 3.0s",
        "fedavg seed 3 [run 2/6]: round 4/4 accuracy 0.7500 loss 0.5000 wall 6.0s"]


def test_a_finished_run_resumed_says_its_rounds_are_done():
    out = _File()
    with RoundProgress(8, start=9, label="fedavg seed 0", stream=out):
        pass
    assert out.getvalue().splitlines() == ["fedavg seed 0: all 8 rounds already done"]


def test_in_a_terminal_the_bar_names_algorithm_seed_and_round():
    out = _File(tty=True)
    with RoundProgress(4, label="scaffold seed 1", stream=out) as bar:
        assert not bar.lines
        for t, rec in _records():
            bar.advance(t, rec)
    text = out.getvalue()
    assert "scaffold seed 1" in text and "round 4/4" in text and "accuracy 0.7500" in text
    assert "rounds 1-4" not in text  # no plain lines in a terminal


def test_disabled_progress_prints_nothing():
    out = _File()
    with RoundProgress(4, enabled=False, label="x", stream=out) as bar:
        for t, rec in _records():
            bar.advance(t, rec)
    assert out.getvalue() == ""


def test_a_run_names_its_algorithm_and_seed(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("fedforge.engine.threads.os.getloadavg", lambda: (0.0, 0.0, 0.0))
    # a quiet CPU: the busy-CPU hint (tested in tests/engine/test_threads.py) is left out
    run_experiment(load_config(QUICK, SHORT), tmp_path / "run", progress=True)
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("fedavg")]
    sizes = load_partition_stats(tmp_path / "run")["sizes"]
    assert len(sizes) == 30 and lines[0].startswith(
        f"fedavg seed 3: rounds 1-4; synthetic: 30 clients, {sum(sizes)} training samples; "
        f"per client: min {min(sizes)}, median {np.median(sizes):g}, max {max(sizes)}; ")
    assert re.search(r"; threads \d+ \(.+\)$", lines[0])  # the engine's threads, and why
    assert [ln.split(" accuracy")[0] for ln in lines[1:]] == [
        "fedavg seed 3: round 2/4", "fedavg seed 3: round 4/4"]


def _personal(accuracy: list[float], held_out: list[bool], samples: list[int]) -> dict:
    from fedforge.experiment.client_metrics import ClientColumns
    from fedforge.experiment.metrics import PER_CLIENT

    return {"test_accuracy": 0.5, "personal_accuracy_mean": 0.61234,
            "personal_accuracy_p10": 0.25, "personal_accuracy_worst": 0.125,
            PER_CLIENT: ClientColumns({
                "client": np.arange(len(accuracy)), "held_out": np.asarray(held_out),
                "samples": np.asarray(samples), "personal_accuracy": np.asarray(accuracy)})}


def test_a_personalised_evaluation_shows_the_per_client_accuracy():
    out = _File()
    record = _personal([0.9, 0.125, 0.5, 0.75], [False, False, True, False], [4, 8, 3, 0])
    with RoundProgress(1, label="ditto seed 0", stream=out) as bar:
        bar.advance(1, record)
    # the summaries as recorded; each client's own value, neither the held-out client 2 nor
    # client 3, which has no test samples (the summaries leave both out too)
    assert out.getvalue().splitlines()[-1] == (
        "ditto seed 0: round 1/1 accuracy 0.5000 personal mean 0.6123 p10 0.2500 worst 0.1250 "
        "clients 0:0.90 1:0.12")
    many = _personal([0.5] * 11, [False] * 11, [1] * 11)
    out = _File()
    with RoundProgress(1, stream=out) as bar:
        bar.advance(1, many)
    assert out.getvalue().splitlines()[-1].endswith("worst 0.1250")  # 11 clients: no list


def test_a_personalised_run_prints_each_clients_accuracy_and_logs_it_apart(tmp_path, capsys):
    from fedforge.experiment.client_metrics import FILE, read_columns

    records = run_experiment(load_config(QUICK, [*SHORT, "rounds=2", "data.num_clients=4",
                                                 "server.clients_per_round=2",
                                                 "eval.personal=true"]),
                             tmp_path / "run", progress=True)
    line = [ln for ln in capsys.readouterr().out.splitlines() if "round 2/2" in ln][0]
    columns = read_columns(tmp_path / "run" / FILE)
    last = columns["round"] == 2
    shown = " ".join(f"{c}:{a:.2f}" for c, a in zip(columns["client"][last].tolist(),
                                                     columns["personal_accuracy"][last].tolist(),
                                                     strict=True))
    record = evaluated(records)[-1]
    assert (f"personal mean {record['personal_accuracy_mean']:.4f} p10 "
            f"{record['personal_accuracy_p10']:.4f} worst "
            f"{record['personal_accuracy_worst']:.4f} clients {shown} wall ") in line
    assert all("per_client" not in r for r in records)  # the log's records hold none
    assert '"per_client"' not in (tmp_path / "run" / "metrics.jsonl").read_text()


@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None,
                    reason="tensorboard is not installed (pip install 'fedforge[tensorboard]')")
def test_tensorboard_scalars_match_the_metrics(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from fedforge.study.plots import read_metrics

    run = tmp_path / "run"
    run_experiment(load_config(QUICK, [*SHORT, "logging.tensorboard=true"]), run,
                   progress=False)
    acc = EventAccumulator(str(run / "tensorboard"))
    acc.Reload()
    records = read_metrics(run / "metrics.jsonl")
    evals = evaluated(records)
    events = acc.Scalars("test_accuracy")
    assert [e.step for e in events] == [2, 4] == [r["round"] for r in evals]
    assert [e.value for e in events] == pytest.approx([r["test_accuracy"] for r in evals],
                                                      abs=1e-6)
    losses = acc.Scalars("train_loss")  # every round, like metrics.jsonl
    assert [e.step for e in losses] == [1, 2, 3, 4] == [r["round"] for r in records]
    assert [e.value for e in losses] == pytest.approx([r["train_loss"] for r in records],
                                                      abs=1e-6)
