"""One JSON-lines writer for metrics and event logs: whole lines, truncation on resume."""

import json

from fedforge.experiment.metrics import MetricsWriter


def _lines(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_fresh_log_is_emptied_and_appended(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"round": 1}\n')
    w = MetricsWriter(path)
    assert w.records == [] and path.read_text() == ""
    w.write({"round": 1, "acc": 0.5})
    w.write_many([{"round": 2}, {"round": 3}])
    w.write_many([])
    assert _lines(path) == [{"round": 1, "acc": 0.5}, {"round": 2}, {"round": 3}]
    assert w.records == _lines(path)


def test_resume_by_round_drops_later_rounds_and_a_torn_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"round": 1}\n{"round": 2}\n{"round": 3}\n{"round": 4, "tor')
    w = MetricsWriter(path, truncate_after=2)
    assert w.records == [{"round": 1}, {"round": 2}] == _lines(path)
    assert not (tmp_path / "metrics.jsonl.tmp").exists()


def test_resume_by_predicate_and_without_remembering(tmp_path):
    """The multi-task runner keeps metrics by update count and the first n events."""
    path = tmp_path / "events.jsonl"
    path.write_text("".join(json.dumps({"job": i}) + "\n" for i in range(5)))
    w = MetricsWriter(path, keep=lambda rec, kept: kept < 3, remember=False)
    assert w.records == [{"job": 0}, {"job": 1}, {"job": 2}]
    w.write_many({"job": i} for i in (10, 11))
    assert len(w.records) == 3  # written records are not held in memory
    assert [r["job"] for r in _lines(path)] == [0, 1, 2, 10, 11]
