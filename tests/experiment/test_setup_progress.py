"""A set-up step that takes longer than a few seconds says what it is doing."""

import io
import time
from pathlib import Path

from typer.testing import CliRunner

from fedforge.cli import app
from fedforge.experiment import progress
from fedforge.experiment.progress import setup_step

QUICK = Path(__file__).resolve().parents[2] / "examples" / "quickstart.toml"


def test_a_slow_step_says_what_it_does_and_how_long_it_took():
    out = io.StringIO()
    with setup_step("building 100000 clients", stream=out, after=0.05):
        deadline = time.monotonic() + 60  # the step lasts until it has said so, however slow
        while not out.getvalue() and time.monotonic() < deadline:
            time.sleep(0.01)
    first, last = out.getvalue().splitlines()
    assert first == "building 100000 clients ..."
    assert last.startswith("building 100000 clients: done in ") and last.endswith(" s")


def test_a_quick_step_prints_nothing():
    out = io.StringIO()
    with setup_step("quick", stream=out, after=3600.0):  # sooner however loaded the machine
        pass
    time.sleep(0.05)
    assert out.getvalue() == ""


def test_a_run_shows_its_slow_set_up(tmp_path, monkeypatch):
    monkeypatch.setattr(progress, "SLOW_STEP_S", 0.0)
    result = CliRunner().invoke(app, ["run", str(QUICK), "rounds=1", "--out",
                                      str(tmp_path / "r")])
    assert result.exit_code == 0, result.output
    assert "synthetic: loading and partitioning the data" in result.output
