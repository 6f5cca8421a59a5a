"""``--profile`` writes its trace and table through the run folder's writer."""

import json

import pytest
import torch

from fedforge.bench.profiling import profiled
from fedforge.experiment.rundir import RunDirError


def test_profile_writes_trace_and_table(tmp_path):
    with profiled(tmp_path, "p"):
        torch.ones(4) @ torch.ones(4)
    assert "traceEvents" in json.loads((tmp_path / "p.trace.json").read_text())
    assert (tmp_path / "p.top.txt").read_text().strip()


@pytest.mark.parametrize("name", ["p.trace.json", "p.top.txt"])
def test_profile_refuses_a_planted_link(tmp_path, name):
    outside = tmp_path / "outside.txt"
    outside.write_text("keep")
    run = tmp_path / "run"
    run.mkdir()
    (run / name).symlink_to(outside)
    with pytest.raises(RunDirError, match=name), profiled(run, "p"):
        torch.ones(4) @ torch.ones(4)
    assert outside.read_text() == "keep"
