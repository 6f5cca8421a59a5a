"""The FedAST reproduction: its grid builds, and a tiny multi-task grid runs and reports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedforge.reproduce import (
    REPRODUCTIONS,
    Comparison,
    Condition,
    Reproduction,
    get_reproduction,
    reproduce,
)
from fedforge.reproduce.grid import grid_plan
from fedforge.reproduce.report import gains, summarize_multitask
from fedforge.study.multitask_diagnostics import idle_share, requests_over_time, time_to_target

ROOT = Path(__file__).resolve().parents[2]

TINY = """\
name = "tiny-mt"
seed = 0
method = "fedast"
max_updates = 200
[system]
num_clients = 20
available_fraction = 0.5
[async]
requests = 4
rb_ratio = 2
min_requests = 2
max_batch = 16
[sync]
k = 3
[checkpoint]
every = 200
[[tasks]]
name = "a"
data.dataset = "synthetic"
data.partition = "natural"
data.options = {alpha = 0.0, beta = 0.0, num_clients = 10}
model = {name = "logreg"}
algorithm = {name = "fedavg", local_lr = 0.05}
client = {batch_size = 5, local_steps = 2, drop_last = true}
target = 0.3
eval_every = 1
[[tasks]]
name = "b"
data.dataset = "synthetic"
data.partition = "natural"
data.options = {alpha = 0.5, beta = 0.5, num_clients = 10}
model = {name = "logreg"}
algorithm = {name = "fedavg", local_lr = 0.05}
client = {batch_size = 5, local_steps = 2}
step_time = 2.0
target = 0.3
eval_every = 1
"""


def test_fedast_spec_grid_builds_every_condition():
    spec = get_reproduction("fedast")
    plan = grid_plan(spec, ROOT, Path("/nonexistent"))
    assert len(plan) == len(spec.conditions) * len(spec.seeds)
    assert [c.name for c, _, _ in plan[:3]] == ["fedast", "fedast_code", "sync_st"]
    cfgs = {(c.name, cfg.seed): cfg for c, cfg, _ in plan}
    code = cfgs["fedast_code", 1]
    assert code.method == "fedast" and code.async_.allocation == "code" and code.seed == 1
    sync = cfgs["sync_st", 0]
    assert sync.method == "sync_st"
    assert [t.algorithm.hparams["server_lr"] for t in sync.tasks] == [1.0] * 4
    assert cfgs["fedast", 0].async_.allocation == "paper"
    assert [t.target for t in cfgs["sync_st", 2].tasks] == [0.91, 0.62, 0.40, 0.33]
    assert [t.target for t in cfgs["sync_st_hi", 2].tasks] == [0.92, 0.65, 0.42, 0.34]
    assert cfgs["sync_st_x2", 0].system.num_clients == 400
    assert {t.model.name for t in sync.tasks} == {"mlp", "lenet5", "cnn", "char_lstm"}


def test_diagnostics_by_hand():
    """Two clients of capacity 2 over 10 s, busy 4 s and 3 s (the second clipped at 10):
    idle 1 - 7/20 = 0.65. Task b first reaches 0.5 at t = 3."""
    ev = [{"start": 0.0, "finish": 4.0}, {"start": 7.0, "finish": 12.0}]
    assert idle_share(ev, 2, 10.0) == pytest.approx(0.65)
    recs = [{"task": "a", "task_index": 0, "sim_time_s": 1.0, "test_accuracy": 0.2,
             "requests": [3, 5]},
            {"task": "b", "task_index": 1, "sim_time_s": 3.0, "test_accuracy": 0.5,
             "requests": [2, 6]}]
    assert time_to_target(recs, {"a": 0.4, "b": 0.5}) == {"a": None, "b": 3.0}
    assert requests_over_time(recs) == {"a": ([1.0, 3.0], [3, 2]), "b": ([1.0, 3.0], [5, 6])}
    s = summarize_multitask(recs, {"time_all_tasks": None, "sim_time_s": 9.0, "updates": 30,
                                   "time_to_target": {"a": None, "b": 3.0},
                                   "idle_share": 0.25}, 0, "test_accuracy")
    assert (s.sim_time, s.reached, s.final_acc, s.idle) == (9.0, False, 0.35, 0.25)
    base = {0: s}
    faster = {0: summarize_multitask(recs, {"time_all_tasks": 6.0, "sim_time_s": 6.0,
                                            "updates": 20}, 0, "test_accuracy")}
    assert gains(base, faster).mean == pytest.approx((9.0 - 6.0) / 9.0)


def test_tiny_multitask_reproduction_end_to_end(tmp_path, monkeypatch):
    (tmp_path / "tiny.toml").write_text(TINY)

    def spec() -> Reproduction:
        return Reproduction(
            name="tinymt", claim="test only", config="tiny.toml",
            conditions=(Condition("fedast", "fedast"),
                        Condition("fedast_code", "fedast", ("async.allocation=code",)),
                        Condition("sync_st", "sync_st", ("tasks.algorithm.server_lr=1.0",))),
            seeds=(0,), target=None, multitask=True, gain_baseline="sync_st",
            comparisons=(Comparison("fedast", "sync_st", "sim_time", "<"),))

    monkeypatch.setitem(REPRODUCTIONS, "tinymt", spec)
    runs, data, docs = tmp_path / "runs", tmp_path / "data", tmp_path / "docs"
    page = reproduce("tinymt", root=tmp_path, runs=runs, data=data, out=docs, progress=False)
    for cond in ("fedast", "fedast_code", "sync_st"):
        summary = json.loads((data / "tinymt" / cond / "seed0.summary.json").read_text())
        assert set(summary["time_to_target"]) == {"a", "b"}
        assert 0.0 <= summary["idle_share"] <= 1.0
    records = [json.loads(x) for x in (data / "tinymt" / "fedast" / "seed0.jsonl")
               .read_text().splitlines()]
    assert all(len(r["requests"]) == 2 for r in records)
    text = page.read_text()
    assert "gain vs sync_st" in text and "T a" in text and "idle share" in text
    assert (docs / "img" / "tinymt_accuracy.png").is_file()
    assert (docs / "img" / "tinymt_diagnostics.png").is_file()
