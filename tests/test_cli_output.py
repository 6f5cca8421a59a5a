"""What ``fedforge run`` prints when its output is not a terminal: the run folder on the
``done`` line whole (a pipe has no width, and rich used to wrap the path at 80 columns)."""

from __future__ import annotations

from typer.testing import CliRunner

from fedforge.cli import app


def test_the_done_line_holds_the_whole_run_folder(tmp_path):
    out = tmp_path / ("a_long_folder_name_for_a_run_" * 4) / "quickstart"
    result = CliRunner().invoke(app, ["run", "examples/quickstart.toml", "rounds=1",
                                      "eval.every=1", "engine.name=loop", "--out", str(out),
                                      "-q"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    done = [line for line in result.output.splitlines() if line.startswith("done")]
    assert len(done) == 1 and str(out) in done[0], result.output
